# -*- coding: utf-8 -*-
"""Core files: where ``kernel.core_pattern`` puts them (``pattern``), and the newest one with gdb's backtrace
(``newest``).  Ansible ships this file with every module call that imports one of its modules, so it stays empty."""
