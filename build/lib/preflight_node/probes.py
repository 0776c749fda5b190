# -*- coding: utf-8 -*-
"""The node registry of probes (``module_utils/preflight_node/probes.py``, node layer): capability name to the
node module holding its ``probe(args, ops)``, for the ``preflight_probes`` and ``preflight_local`` calls
(``library/preflight_probes.py``, ``library/preflight_local.py``; run by ``module_utils/preflight_node/calls.py``).

Which capabilities have a probe, and which probe runs after the all-reduce, is declared in
``module_utils/preflight_node/registry.py``; this file only binds each to its module, ``<name>_probe.py``.  Only
probe modules are imported here, so a call that probes does not ship the readers (a probe may use a reader's
helper: the core probe reads the pattern as the core_dumps reader does); the readers are bound in
``module_utils/preflight_node/readers.py``.
"""

from __future__ import annotations

from . import registry
# Every probe module, imported by name: Ansible ships with a module call only the modules it imports by name.
# tests/unit/test_registry.py fails when this line and the registry's probes disagree.
from .capabilities import core_dumps_probe, fabric_probe, kernel_debug_probe, ssh_trust_probe  # noqa: F401

# Capability name -> the node module holding its ``probe``, in verdict order.
PROBES = registry.bind(registry.probes_for("preflight"), globals(), "_probe", "probes.py")


def get(name):
    """The probe module of capability ``name``; KeyError names the known ones."""
    try:
        return PROBES[name]
    except KeyError:
        raise KeyError("unknown capability %r; known: %s" % (name, ", ".join(sorted(PROBES))))
