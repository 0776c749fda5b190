# -*- coding: utf-8 -*-
"""Capability ``nic_discovery``, the node half: every interface of this node (node layer).

``read`` (node): every netdev from ``/sys/class/net`` and ``/sys/class/infiniband``
with its addresses (``ip -j -d addr``, or ``/proc`` when ip is missing), gathered by
``module_utils/preflight_node/net/interfaces.py``.  The interface the collectives use and the findings
about it are the controller half, ``cluster_preflight/capabilities/nic_discovery/``.
"""

from __future__ import annotations

import os

from ..net.interfaces import gather_nics, parse_ip_addr_json

CAPABILITY = "nic_discovery"
IP_TIMEOUT = 10


def _ip_links(args, ops):
    """(links, source) from ip_json_file or ``ip -j -d addr show``; (None, reason) to fall back."""
    if args.get("ip_json_file"):
        with open(args["ip_json_file"], "r", encoding="utf-8") as handle:
            return parse_ip_addr_json(handle.read()), "ip_json_file"
    ip = ops.which("ip")
    if not ip:
        return None, "ip is not installed"
    argv = [ip, "-j", "-d", "addr", "show"]
    rc, out, err = ops.run(argv, timeout=IP_TIMEOUT)
    if rc != 0:
        return None, "%s exited %d: %s" % (" ".join(argv), rc, (err or "").strip())
    try:
        return parse_ip_addr_json(out), "ip"
    except ValueError as exc:
        return None, "%s printed no JSON (iproute2 too old for -j?): %s" % (" ".join(argv), exc)


def read(args, ops):
    """``{nics, rdma_devices, warnings, addr_source}`` of this node."""
    live = os.path.normpath(args["sysfs_root"]) == "/sys" and os.path.normpath(args["proc_root"]) == "/proc"
    source = args.get("addr_source") or "auto"
    if args.get("ip_json_file"):
        source = "ip"
    elif source == "auto":
        source = "ip" if live else "proc"
    links, used, fallback = None, "proc", None
    if source == "ip":
        links, used = _ip_links(args, ops)
        if links is None:
            if args.get("addr_source") == "ip":
                raise ValueError("addr_source=ip but %s" % used)
            fallback = "Read addresses from %s instead of ip: %s" % (args["proc_root"], used)
            used = "proc"
    nics, rdma, warnings = gather_nics(args["sysfs_root"], args["proc_root"], links)
    if fallback:
        warnings.insert(0, fallback)
    return {"nics": nics, "rdma_devices": rdma, "warnings": warnings, "addr_source": used}
