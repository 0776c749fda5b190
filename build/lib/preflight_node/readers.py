# -*- coding: utf-8 -*-
"""The node registry of readers (``module_utils/preflight_node/readers.py``, node layer): capability name to the
node module holding its ``read(args, ops)``, for the ``preflight_facts`` and ``preflight_local`` calls
(``library/preflight_facts.py``, ``library/preflight_local.py``; run by ``module_utils/preflight_node/calls.py``).

Which capabilities have a reader is declared in ``module_utils/preflight_node/registry.py``; this file only binds
each to its module.  Only reader modules are imported here, so a call that reads ships no probe code; the probes
are bound in ``module_utils/preflight_node/probes.py``.  What the controller decides from the facts is in the
``cluster_preflight`` package, which never ships.
"""

from __future__ import annotations

from . import registry
# Every reader module, imported by name: Ansible ships with a module call only the modules it imports by name.
# tests/unit/test_registry.py fails when this line and the registry's readers disagree.
from .capabilities import (allreduce, core_dumps, debug_tools, fabric, gpu_health, iommu, kernel_debug, nic_discovery,  # noqa: F401
                           ssh_trust)

# Capability name -> the node module holding its ``read``, in verdict order.
READERS = registry.bind(registry.readers_for("preflight"), globals(), "", "readers.py")


def get(name):
    """The reader module of capability ``name``; KeyError names the known ones."""
    try:
        return READERS[name]
    except KeyError:
        raise KeyError("unknown capability %r; known: %s" % (name, ", ".join(sorted(READERS))))
