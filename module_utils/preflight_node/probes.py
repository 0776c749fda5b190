# -*- coding: utf-8 -*-
"""The node registry of probes (``module_utils/preflight_node/probes.py``, node layer): capability name to the
node module holding its ``probe(args, ops)``, for the ``preflight_probes`` and ``preflight_local`` calls
(``library/preflight_probes.py``, ``library/preflight_local.py``; run by ``module_utils/preflight_node/calls.py``).

Only probe modules are imported here, so a call that probes does not ship the readers (a probe may use a
reader's helper: the core probe reads the pattern as the core_dumps reader does); the readers are registered in
``module_utils/preflight_node/readers.py``.
"""

from __future__ import annotations

from . import core_dumps_probe, fabric_probe, kernel_debug_probe, ssh_trust_probe

# Capability name -> the node module holding its ``probe``.
PROBES = {module.CAPABILITY: module for module in (kernel_debug_probe, core_dumps_probe, ssh_trust_probe,
                                                   fabric_probe)}


def get(name):
    """The probe module of capability ``name``; KeyError names the known ones."""
    try:
        return PROBES[name]
    except KeyError:
        raise KeyError("unknown capability %r; known: %s" % (name, ", ".join(sorted(PROBES))))
