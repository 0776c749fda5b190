# -*- coding: utf-8 -*-
"""The verdict: every targeted node accounted for (``accounting``, ``task_start``), written as JSON (``json_text``)
with text others control made printable (``printable``), read back only when it can be trusted (``file``) and as a
typed value with its exit code (``value``)."""
