# -*- coding: utf-8 -*-
"""pam_limits: the limits a login session gets (``session``), and judging and writing drop-ins (``write``).  Ansible
ships this file with every module call that imports one of its modules, so it stays empty."""
