# -*- coding: utf-8 -*-
"""The node registry of readers (``module_utils/preflight_node/readers.py``, node layer): capability name to the
node module holding its ``read(args, ops)``, for the ``preflight_facts`` and ``preflight_local`` calls
(``library/preflight_facts.py``, ``library/preflight_local.py``; run by ``module_utils/preflight_node/calls.py``).

Only reader modules are imported here, so a call that reads ships no probe code; the probes are registered in
``module_utils/preflight_node/probes.py``.  What the controller decides from the facts is in the
``cluster_preflight`` package, which never ships.
"""

from __future__ import annotations

from . import (allreduce, core_dumps, debug_tools, fabric, gpu_health, iommu, kernel_debug, nic_discovery, port_mesh,
               ssh_trust)

# Capability name -> the node module holding its ``read``.
READERS = {module.CAPABILITY: module for module in (
    nic_discovery, port_mesh, allreduce, gpu_health, fabric, kernel_debug, core_dumps, iommu, debug_tools, ssh_trust)}


def get(name):
    """The reader module of capability ``name``; KeyError names the known ones."""
    try:
        return READERS[name]
    except KeyError:
        raise KeyError("unknown capability %r; known: %s" % (name, ", ".join(sorted(READERS))))
