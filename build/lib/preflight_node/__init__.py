# -*- coding: utf-8 -*-
"""The node layer of cluster preflight: what runs on a node inside a module call.

At the top, the capability registry and the node calls' bodies (``registry``, ``readers``, ``probes``, ``calls``,
``srun_task``, ``diagnose``) and the check contract (``checks``, ``privilege``); the capability halves in
``capabilities/``; the helpers of one area each in ``net/``, ``gpu/``, ``grub/``, ``ssh/``, ``sysctl/``, ``limits/``,
``cores/``, ``allreduce_run/``; what every node call stands on in ``host/`` (the command runner ``ops``, processes,
root's files and state, the run lock). Modules in ``library/`` import it as
``ansible.module_utils.preflight_node.<name>`` and Ansible ships only what they import (docs/architecture.md says
what it follows); inside the package every import is relative, so the controller imports the same files as
``preflight_node.<name>``. Nothing here imports the controller package ``cluster_preflight``.
"""
