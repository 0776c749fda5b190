# -*- coding: utf-8 -*-
"""Capability ``fabric``, the node half's probe (node layer, shipped in the ``preflight_probes`` call): the
RDMA port counters read again after the all-reduce, with the reader's own ``read_counters``
(``module_utils/preflight_node/capabilities/fabric.py``), so before (reader) and after (probe) are read alike.  The
``counters`` check built from the two is in ``cluster_preflight/capabilities/fabric/``.
"""

from __future__ import annotations

import os
import time

from .fabric import CAPABILITY, port_dir, rdma_base, read_counters

# Runs after the all-reduce was collected (``after_job`` in ``module_utils/preflight_node/registry.py``): the
# counters' "after".
__all__ = ["CAPABILITY", "probe"]


def _listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def probe(args, ops):
    """``{devices: {name: {ports: [{port, counters, counter_errors}]}}, read_at}``; args as the reader's."""
    sysfs_root = args.get("sysfs_root") or "/sys"
    counters, hw_counters = args.get("counters"), args.get("hw_counters")
    devices = {}
    for name in _listdir(rdma_base(sysfs_root)):
        ports = []
        for port in _listdir(os.path.join(rdma_base(sysfs_root), name, "ports")):
            values, errors = read_counters(port_dir(sysfs_root, name, port), counters, hw_counters)
            ports.append({"port": int(port) if port.isdigit() else port, "counters": values,
                          "counter_errors": errors})
        devices[name] = {"ports": ports}
    return {"devices": devices, "read_at": time.time()}
