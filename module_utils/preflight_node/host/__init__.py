# -*- coding: utf-8 -*-
"""What every node call stands on: running commands (``ops``, ``proc``, ``reap``, ``jobs``), root's files and state
(``files``, ``safe_dir``, ``state_dir``, ``ownership``), the gate's run lock (``lock``) and the state of a system
service, with or without systemd (``services``).  Ansible ships this file with every module call that imports one of
its modules, so it stays empty."""
