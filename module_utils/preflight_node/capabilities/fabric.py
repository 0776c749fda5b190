# -*- coding: utf-8 -*-
"""Capability ``fabric``, the node half (node layer, shipped): the RDMA ports of a node and their error counters.

``read`` lists the RDMA devices and ports the way ``nic_discovery`` does (``gather_rdma`` of
``module_utils/preflight_node/net/interfaces.py``: state, physical state, rate, link layer) and adds, per port, the
counters the controller asked for, from ``<sysfs_root>/class/infiniband/<dev>/ports/<n>/counters/`` (the
InfiniBand port counters) and ``.../hw_counters/`` (driver counters, mlx5: ``out_of_buffer``, ...).
``read_counters`` is shared with the probe (``module_utils/preflight_node/capabilities/fabric_probe.py``), which reads
the
same counters again after the all-reduce, so the controller can tell which ones moved during the gate.

A counter file that cannot be read (missing, EINVAL on some devices and link layers, ``N/A (no PMA)`` on an
adapter without a performance management agent such as Intel's iWARP ``i40iw``) is a fact in ``counter_errors``,
never an exception; ``counters_present`` says whether the port has counter folders at all.  Each device's
``hca_type`` and ``board_id`` name its adapter type, so the controller compares a port's rate with ports of the
same kind.  A RoCE port (link layer Ethernet) also gets its GID table (``net/roce_gid.py``).  On a node with RDMA
devices the reader adds what GPUDirect RDMA needs (``net/gpudirect.py``: the peer-memory module or DMA-BUF, ACS on
the bridges between GPUs and NICs) and, with EFA devices, where NCCL would find its network plugin
(``net/nccl_plugin.py``).  What the controller decides from these facts is in
``cluster_preflight/capabilities/fabric/``.
"""

from __future__ import annotations

import os
import time

from ..net import gpudirect, nccl_plugin as net_plugin, roce_gid
from ..net.interfaces import gather_rdma
from .iommu import read_pci

CAPABILITY = "fabric"

# The InfiniBand port counters (``ports/<n>/counters/``: PortCounters and PortCountersExtended); every
# other counter name is looked up in ``ports/<n>/hw_counters/``.
PORT_COUNTERS = (
    "symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
    "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_discards",
    "port_xmit_constraint_errors", "port_rcv_constraint_errors", "local_link_integrity_errors",
    "excessive_buffer_overrun_errors", "VL15_dropped", "port_xmit_wait", "port_xmit_data", "port_rcv_data",
    "port_xmit_packets", "port_rcv_packets", "unicast_xmit_packets", "unicast_rcv_packets",
    "multicast_xmit_packets", "multicast_rcv_packets",
)
COUNTER_DIRS = ("counters", "hw_counters")


def rdma_base(sysfs_root):
    return os.path.join(sysfs_root, "class", "infiniband")


UNAVAILABLE = "N/A"


def _read_line(path):
    """The stripped text of a small sysfs file, None when it cannot be read."""
    try:
        with open(path, "r", encoding="ascii", errors="replace") as handle:
            return handle.read(256).strip() or None
    except OSError:
        return None


def _counter_value(path):
    """``(value, None)`` or ``(None, error text)`` for one counter file; a device that does not provide the counter
    writes ``N/A`` (``N/A (no PMA)``), and the error text then starts with :data:`UNAVAILABLE`."""
    try:
        with open(path, "r", encoding="ascii", errors="replace") as handle:
            text = handle.read().strip()
    except OSError as exc:
        return None, "%s: %s" % (path, exc.strerror or exc)
    if text.upper().startswith(UNAVAILABLE):
        return None, "%s: the device does not provide it (%s)" % (UNAVAILABLE, text[:40])
    try:
        return int(text), None
    except ValueError:
        return None, "%s: not a whole number: %r" % (path, text[:40])


def _names(port_dir, directory, wanted):
    """The counter names to read in ``directory``: ``wanted``, or every file there when ``wanted`` is None."""
    if wanted is not None:
        return list(wanted)
    try:
        return sorted(os.listdir(os.path.join(port_dir, directory)))
    except OSError:
        return []


def read_counters(port_dir, counters=None, hw_counters=None):
    """``(values, errors)`` of one port directory: ``{name: int}`` and ``{name: error text}``.

    ``counters`` are read from ``counters/``, ``hw_counters`` from ``hw_counters/``; None reads every
    file of that directory, an empty list none."""
    values, errors = {}, {}
    for directory, wanted in zip(COUNTER_DIRS, (counters, hw_counters)):
        for name in _names(port_dir, directory, wanted):
            value, problem = _counter_value(os.path.join(port_dir, directory, name))
            if problem is None:
                values[name] = value
            else:
                errors[name] = problem
    return values, errors


def port_dir(sysfs_root, device, port):
    return os.path.join(rdma_base(sysfs_root), device, "ports", str(port))


def _listing_error(base):
    """None when ``base`` lists, else why not (a missing directory is ``present: False``, not an error)."""
    try:
        os.listdir(base)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return "cannot list %s: %s" % (base, exc.strerror or exc)
    return None


def read(args, ops):
    """``{present, devices: {name: {kind, driver, pci, ports: [...]}}, error, read_at, gpudirect, net_plugin}``.

    ``args``: ``{sysfs_root, counters: [names], hw_counters: [names], lspci, tool_timeout, job_env}``.  File reads,
    and on a node with GPUs and RDMA devices ``modinfo`` and ``lspci`` through ``ops``."""
    sysfs_root = args.get("sysfs_root") or "/sys"
    base = rdma_base(sysfs_root)
    counters, hw_counters = args.get("counters"), args.get("hw_counters")
    devices = {}
    for name, device in gather_rdma(sysfs_root).items():
        ports = []
        for port in device["ports"]:
            folder = port_dir(sysfs_root, name, port["port"])
            values, errors = read_counters(folder, counters, hw_counters)
            ports.append({
                "port": port["port"], "state": port["state"], "phys_state": port["phys_state"],
                "rate": port["rate"], "rate_gbps": port["rate_gbps"], "link_layer": port["link_layer"],
                "counters": values, "counter_errors": errors,
                "counters_present": any(os.path.isdir(os.path.join(folder, sub)) for sub in COUNTER_DIRS),
                "gids": (roce_gid.read_gids(folder) if (port["link_layer"] or "").lower() == "ethernet" else None),
            })
        devices[name] = {"kind": device["kind"], "driver": device["driver"], "pci": device["pci"], "ports": ports,
                         "netdevs": device["netdevs"],
                         "hca_type": _read_line(os.path.join(base, name, "hca_type")),
                         "board_id": _read_line(os.path.join(base, name, "board_id"))}
    facts = {
        "present": bool(devices),
        "root": base,
        "devices": devices,
        "error": _listing_error(base),
        "read_at": time.time(),
        "gpudirect": None,
        "net_plugin": None,
    }
    if devices:
        facts["gpudirect"] = gpudirect.read_acs(args, ops, read_pci(sysfs_root),
                                                [device["pci"] for device in devices.values()])
        if facts["gpudirect"]["gpus"]["nvidia"]:
            facts["gpudirect"]["peer_memory"] = gpudirect.read_peer_memory(args, ops)
    if any(device["kind"] == "efa" for device in devices.values()):
        facts["net_plugin"] = net_plugin.read(args)
    return facts
