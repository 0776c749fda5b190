# -*- coding: utf-8 -*-
"""Node-to-node ssh: key and known_hosts lines (``primitives``), the running sshd (``sshd``), a user's ~/.ssh
(``keys``, ``keys_write``), the known_hosts block (``known_hosts_plan``), the mesh (``mesh``) and the checks
shared by the gate and bring-up (``checks``).  Ansible ships this file with every module call that imports one of its
modules, so it stays empty."""
