# -*- coding: utf-8 -*-
"""Capability ``port_mesh``, the node half (node layer): only its name.

The mesh has no reader: each node's probe is the ``port_probe`` module (``library/port_probe.py``, its
logic in ``module_utils/preflight_node/net/port_probe.py``).  Who probes with what arguments and whom the
results blame is the controller half, ``cluster_preflight/capabilities/port_mesh/``.
"""

from __future__ import annotations

CAPABILITY = "port_mesh"
