# -*- coding: utf-8 -*-
"""What every node call stands on: running commands (``ops``, ``proc``, ``reap``, ``jobs``), root's files and state
(``files``, ``safe_dir``, ``state_dir``, ``ownership``) and the gate's run lock (``lock``).  Ansible ships this file
with every module call that imports one of its modules, so it stays empty."""
