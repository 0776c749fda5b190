# -*- coding: utf-8 -*-
"""Node layer: the NVSwitches of a node and its NVIDIA fabric manager (read by ``gpu_health``).

An HGX/DGX baseboard (A100, H100, H200, B200) connects its GPUs through NVSwitch chips, and the GPUs can run no
CUDA work until the fabric manager (``nv-fabricmanager``, unit ``nvidia-fabricmanager``) has trained the NVLinks
and programmed the switches: without it every job fails with CUDA error 802 "system not yet initialized", while
the GPUs' own telemetry looks healthy.

What says a node is an NVSwitch system is its PCI bus: NVSwitches enumerate as NVIDIA (``0x10de``) devices of
class "bridge, other" (``0x0680``), next to the GPUs (display/3D class).  A node whose NVLink switches sit outside
it (a GB200 NVL72 compute tray, a VM given GPUs of an HGX board) has none on its bus: its GPUs' fabric state
(``nvidia-smi -q -x`` ``<fabric>``) is what tells there, read by the ``gpu_health`` reader with the rest of the XML.
The fabric manager's state is read by ``host/services.py``.
"""

from __future__ import annotations

import os

from ..host import services

NVIDIA = "0x10de"
BRIDGE_OTHER = 0x0680
FABRIC_MANAGER_UNIT = "nvidia-fabricmanager"
FABRIC_MANAGER_PROGRAM = "nv-fabricmanager"


def _hex_id(value):
    """``'0x10DE'`` / ``'10de'`` -> ``'0x10de'``; raises ValueError (TypeError for None) if not hex."""
    text = str(value).strip().lower()
    return "0x%04x" % int(text[2:] if text.startswith("0x") else text, 16)


def _attribute(device_dir, name):
    try:
        with open(os.path.join(device_dir, name)) as handle:
            return handle.read().strip()
    except (IOError, OSError):
        return None


def scan(sysfs_root):
    """``{devices: [{address, device}], error}``: the NVSwitches on the PCI bus (sorted by address)."""
    base = os.path.join(sysfs_root, "bus", "pci", "devices")
    try:
        addresses = sorted(os.listdir(base))
    except FileNotFoundError:
        return {"devices": [], "error": None}
    except OSError as exc:
        return {"devices": [], "error": "cannot list %s: %s" % (base, exc.strerror or exc)}
    devices = []
    for address in addresses:
        device_dir = os.path.join(base, address)
        vendor, device, code = (_attribute(device_dir, name) for name in ("vendor", "device", "class"))
        try:
            if _hex_id(vendor) != NVIDIA or int(code, 16) >> 8 != BRIDGE_OTHER:
                continue
            devices.append({"address": address, "device": _hex_id(device)})
        except (TypeError, ValueError):
            continue
    return {"devices": devices, "error": None}


def read(args, ops):
    """``{devices, error, service}``: the NVSwitches, and the fabric manager's state (:func:`services.read`) where
    there is one (None on a node without NVSwitch: nothing to manage)."""
    facts = scan(args.get("sysfs_root") or "/sys")
    facts["service"] = None
    if facts["devices"]:
        facts["service"] = services.read(ops, args.get("fabric_manager_unit") or FABRIC_MANAGER_UNIT,
                                         FABRIC_MANAGER_PROGRAM, args.get("proc_root") or "/proc",
                                         args.get("tool_timeout") or 10)
    return facts
