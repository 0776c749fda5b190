# -*- coding: utf-8 -*-
"""Node layer: what GPUDirect RDMA (a NIC reading and writing GPU memory directly) needs on a node with GPUs and
RDMA NICs, read by the ``fabric`` reader; the decisions are in ``cluster_preflight/capabilities/fabric/gpudirect.py``.

* **A way to register GPU memory with the NIC.**  Either the peer-memory kernel module (``nvidia_peermem``, shipped
  with the driver since R470; ``nv_peer_mem`` before it), loaded: ``/sys/module/<name>`` exists; or DMA-BUF, which
  NCCL (2.13+) uses by itself where the kernel has it (5.12+) and the GPU driver is the open kernel module of R515
  or later (its ``/sys/module/nvidia/taint`` lacks the ``P`` of a proprietary module).  Whether the peer-memory
  module is installed but not loaded is asked of ``modinfo``.
* **PCIe ACS off on the bridges between a GPU and a NIC.**  Which bridges those are comes from sysfs: a device's
  directory under ``/sys/devices`` lies below every bridge above it, so a GPU and a NIC whose paths share a bridge
  sit under one switch; the bridges from that shared one down to each of them carry their peer-to-peer traffic.
  Their ``ACSCtl`` is read from ``lspci -D -vvv`` (``lspci.py``), run only on a node that has such a pair.  The
  GPUs come from the ``iommu`` reader's scan of the PCI bus, which the ``fabric`` reader hands in.
"""

from __future__ import annotations

import os
import re

from . import lspci

PEER_MODULES = ("nvidia_peermem", "nv_peer_mem")
PEER_MODULE_FILES = ("nvidia-peermem", "nv_peer_mem")
LSPCI_ARGV = ["-D", "-vvv"]
_BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", re.IGNORECASE)


def pci_devices_dir(sysfs_root):
    return os.path.join(sysfs_root, "bus", "pci", "devices")


def _hex_id(value):
    """``'0x1000'`` / ``'1000'`` -> ``'1000'`` (no prefix, 4 digits); raises ValueError (TypeError for None)."""
    text = str(value).strip().lower()
    return "%04x" % int(text[2:] if text.startswith("0x") else text, 16)


def _read(path):
    try:
        with open(path, "r", encoding="ascii", errors="replace") as handle:
            return handle.read(256).strip()
    except OSError:
        return None


def _version(text):
    """``"6.8.0-45-generic"`` -> ``(6, 8)``; None when it does not start with numbers."""
    match = re.match(r"\s*(\d+)\.(\d+)", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def _modinfo(ops, timeout):
    """``{module file name: path or None}`` from ``modinfo -F filename``; None when modinfo is not installed."""
    program = ops.which("modinfo")
    if not program:
        return None
    found = {}
    for name in PEER_MODULE_FILES:
        rc, out, _err = ops.run([program, "-F", "filename", name], timeout=timeout)
        found[name] = out.strip() if rc == 0 and out.strip() else None
    return found


def read_peer_memory(args, ops):
    """``{loaded, nvidia: {version, taint, open}, kernel, installed}``: the peer-memory modules loaded, the GPU
    driver's kernel module (its version and whether it is the open one), the running kernel, and (when none is
    loaded) where ``modinfo`` finds the peer-memory module (None: no modinfo)."""
    module_dir = os.path.join(args.get("sysfs_root") or "/sys", "module")
    loaded = [name for name in PEER_MODULES if os.path.isdir(os.path.join(module_dir, name))]
    taint = _read(os.path.join(module_dir, "nvidia", "taint"))
    nvidia = {"loaded": os.path.isdir(os.path.join(module_dir, "nvidia")),
              "version": _read(os.path.join(module_dir, "nvidia", "version")), "taint": taint,
              "open": None if taint is None else "P" not in taint}
    kernel = args.get("kernel_release") or os.uname()[2]
    return {"loaded": loaded, "nvidia": nvidia, "kernel": kernel, "kernel_version": _version(kernel),
            "installed": None if loaded else _modinfo(ops, args.get("tool_timeout") or 10)}


def _chain(sysfs_root, address):
    """The bridges above a PCI device, top first (``["0000:15:01.0", "0000:16:00.0", ...]``), from its sysfs path."""
    real = os.path.realpath(os.path.join(pci_devices_dir(sysfs_root), address))
    parts = [part for part in real.split(os.sep) if _BDF.match(part)]
    return parts[:-1] if parts and parts[-1].lower() == address.lower() else []


def pairs(sysfs_root, gpus, nics):
    """``[{gpu, nic, bridges}]``: each GPU and NIC under a shared bridge, with the bridges from the shared one down to
    each of them (sysfs form, top first)."""
    found = []
    for gpu in gpus:
        above_gpu = _chain(sysfs_root, gpu)
        for nic in nics:
            above_nic = _chain(sysfs_root, nic)
            shared = 0
            while shared < min(len(above_gpu), len(above_nic)) and above_gpu[shared] == above_nic[shared]:
                shared += 1
            if not shared:
                continue
            between = [above_gpu[shared - 1]] + above_gpu[shared:] + above_nic[shared:]
            found.append({"gpu": gpu, "nic": nic, "bridges": sorted(set(between), key=between.index)})
    return found


def _bridge_ids(sysfs_root, address):
    base = os.path.join(pci_devices_dir(sysfs_root), address)
    return {"vendor": _read(os.path.join(base, "vendor")), "device": _read(os.path.join(base, "device"))}


def bridge_ids(sysfs_root, address):
    """``"1000:c030"``: a device's PCI id as the kernel's ``pci:VENDOR:DEVICE`` names it; None when unreadable."""
    ids = _bridge_ids(sysfs_root, address)
    try:
        return "%s:%s" % tuple(_hex_id(ids[key]) for key in ("vendor", "device"))
    except (TypeError, ValueError):
        return None


def read_acs(args, ops, pci, nics):
    """``{gpus, pairs, bridges: {address: {vendor, device, name, acs, denied}}, lspci: {present, error}}``; ``pci``:
    the PCI bus's GPUs as the ``iommu`` reader scans them (``read_pci``), ``nics``: the RDMA devices' PCI addresses."""
    sysfs_root = args.get("sysfs_root") or "/sys"
    gpus = [gpu["address"] for gpu in pci.get("gpus") or [] if gpu.get("vendor_name") in ("nvidia", "amd")]
    facts = {"gpus": {"nvidia": pci.get("nvidia_gpus") or 0, "amd": pci.get("amd_gpus") or 0,
                      "error": pci.get("error")},
             "pairs": pairs(sysfs_root, gpus, sorted(set(nic for nic in nics if nic))),
             "bridges": {}, "lspci": {"present": None, "error": None}}
    if not facts["pairs"]:
        return facts
    wanted = sorted(set(bridge for pair in facts["pairs"] for bridge in pair["bridges"]))
    for bridge in wanted:
        facts["bridges"][bridge] = dict(_bridge_ids(sysfs_root, bridge), name=None, acs=None, denied=False,
                                        listed=False)
    program = ops.which(args.get("lspci") or "lspci")
    facts["lspci"]["present"] = bool(program)
    if not program:
        return facts
    argv = [program] + LSPCI_ARGV
    rc, out, err = ops.run(argv, timeout=args.get("tool_timeout") or 10)
    if rc != 0:
        facts["lspci"]["error"] = "%s exited %s: %s" % (" ".join(argv), rc, " ".join((err or out).split())[:200])
        return facts
    listed = lspci.parse(out)
    for bridge in wanted:
        entry = listed.get(bridge.lower())
        if entry is not None:
            facts["bridges"][bridge].update(entry, listed=True)
    return facts
