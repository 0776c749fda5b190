# -*- coding: utf-8 -*-
"""The gate's stages on the controller: the view of what every node registered (``view``), the run lock's
controller half (``run_lock``), every cross-node decision (``decisions``, run by ``action_plugins/preflight_decide.py``)
and the diagnosis of a running job (``diagnosis``)."""
