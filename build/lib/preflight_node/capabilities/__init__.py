# -*- coding: utf-8 -*-
"""The capability halves of the node layer: ``<name>.py`` holds a capability's ``read(args, ops)``,
``<name>_probe.py`` its ``probe(args, ops)`` (bound by ``readers.py`` and ``probes.py`` one level up).  Ansible ships
this file with every module call that imports one of its modules, so it stays empty."""
