# -*- coding: utf-8 -*-
"""Sysctls: where a value comes from now and at the next boot (``values``), and planning and writing one
(``write``).  Ansible ships this file with every module call that imports one of its modules, so it stays empty."""
