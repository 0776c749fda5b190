# -*- coding: utf-8 -*-
"""Capability ``iommu``, the node half: the GPUs on the PCI bus, the grub defaults and the running kernel's
command line.

AMD Instinct GPUs hang or run collectives slowly with the IOMMU translating their DMA, so a node with one
boots with ``iommu=soft`` or ``amd_iommu=off``.  ``read`` gathers what the decision needs: the PCI scan
(sysfs), the grub defaults files and their drop-ins (``module_utils/preflight_node/grub/defaults.py``) and
``/proc/cmdline``.  The PCI scan also backs ``library/pci_gpus.py``.  What the controller decides from it
(validate, read_args, decide: the same findings the writer ``library/grub_cmdline.py`` reports in check
mode) is in ``cluster_preflight/capabilities/iommu/``.
"""

from __future__ import annotations

import os

from ..grub import defaults as preflight_grub
from ..privilege import file_errors, privileged, refused

CAPABILITY = "iommu"

GRUB_DEFAULT = "/etc/default/grub"
GRUB_DROPIN_DIR = "/etc/default/grub.d"
PROC_CMDLINE = "/proc/cmdline"

# --- PCI -----------------------------------------------------------------------------------------------

VENDORS = {"0x1002": "amd", "0x10de": "nvidia", "0x8086": "intel"}
DISPLAY_CLASS = 0x03  # base class: display controller (VGA, XGA, 3D, other)
ACCELERATOR_CLASS = 0x1200  # base 0x12 processing accelerator, subclass 0x00


def normalise_id(value):
    """``'0x74A1'``, ``'74a1'`` -> ``'0x74a1'``; raises ValueError if not hex."""
    text = str(value).strip().lower()
    if text.startswith("0x"):
        text = text[2:]
    return "0x%04x" % int(text, 16)


def is_gpu_class(code):
    return (code >> 16) == DISPLAY_CLASS or (code >> 8) == ACCELERATOR_CLASS


def _attribute(device_dir, name):
    try:
        with open(os.path.join(device_dir, name)) as handle:
            return handle.read().strip()
    except (IOError, OSError, ValueError):
        return None


def pci_devices_dir(sysfs_root):
    return os.path.join(sysfs_root, "bus", "pci", "devices")


def scan(sysfs_root, amd_device_ids=()):
    """The GPUs under ``sysfs_root``: ``{gpus, count, amd_gpus, nvidia_gpus, intel_gpus}``.

    Devices whose attributes cannot be read are left out; an unreadable bus raises OSError
    (:func:`read_pci` turns that into a fact).
    """
    base = pci_devices_dir(sysfs_root)
    wanted_amd = set(normalise_id(value) for value in amd_device_ids)
    gpus = []
    for address in sorted(os.listdir(base)):
        device_dir = os.path.join(base, address)
        raw_class = _attribute(device_dir, "class")
        vendor = _attribute(device_dir, "vendor")
        device = _attribute(device_dir, "device")
        if raw_class is None or vendor is None or device is None:
            continue
        try:
            code = int(raw_class, 16)
            vendor = normalise_id(vendor)
            device = normalise_id(device)
        except ValueError:
            continue
        if not is_gpu_class(code):
            continue
        vendor_name = VENDORS.get(vendor, "other")
        if vendor_name == "amd" and wanted_amd and device not in wanted_amd:
            continue
        driver_link = os.path.join(device_dir, "driver")
        driver = os.path.basename(os.readlink(driver_link)) if os.path.islink(driver_link) else None
        gpus.append({"address": address, "vendor": vendor, "vendor_name": vendor_name, "device": device,
                     "class": "0x%06x" % code, "driver": driver})
    summary = {"gpus": gpus, "count": len(gpus)}
    for name in ("amd", "nvidia", "intel"):
        summary["%s_gpus" % name] = sum(1 for gpu in gpus if gpu["vendor_name"] == name)
    return summary


def read_pci(sysfs_root, amd_device_ids=()):
    """:func:`scan` plus ``present`` (the PCI bus is visible), ``path``, ``error`` and ``notes``; never raises."""
    base = pci_devices_dir(sysfs_root)
    empty = {"gpus": [], "count": 0, "amd_gpus": 0, "nvidia_gpus": 0, "intel_gpus": 0}
    if not os.path.isdir(base):
        # A node without a PCI bus (some VMs, containers) has no GPU to find.
        return dict(empty, present=False, path=base, error=None,
                    notes=["%s does not exist: no PCI bus visible on this node" % base])
    for value in amd_device_ids:
        try:
            normalise_id(value)
        except ValueError:
            return dict(empty, present=True, path=base, notes=[],
                        error="amd device id %r is not a hexadecimal PCI device id (such as 0x74a1)" % (value,))
    try:
        summary = scan(sysfs_root, amd_device_ids)
    except (IOError, OSError) as exc:
        return dict(empty, present=True, path=base, error="cannot read %s: %s" % (base, exc), notes=[])
    return dict(summary, present=True, path=base, error=None, notes=[])


# --- reader --------------------------------------------------------------------------------------------


def read(args, ops):
    """``{pci, grub, cmdline}``: the PCI scan, the grub files and the running command line.

    ``grub`` is :func:`preflight_grub.read_files` (texts of the grub defaults and its
    ``*.cfg`` drop-ins, each a few hundred bytes); ``cmdline`` is ``{path, text, error}``.
    Reads files only; ``ops`` is not needed.
    """
    root = args.get("root") or "/"
    facts = {
        "pci": read_pci(args.get("sysfs_root") or "/sys", args.get("amd_device_ids") or []),
        "grub": preflight_grub.read_files(preflight_grub.rooted(root, args.get("grub_default") or GRUB_DEFAULT),
                                          preflight_grub.rooted(root, args.get("dropin_dir") or GRUB_DROPIN_DIR),
                                          errors="replace"),
        "cmdline": preflight_grub.read_cmdline(preflight_grub.rooted(root, args.get("proc_cmdline") or PROC_CMDLINE)),
        "privileged": privileged(),
    }
    # What a reader without root was refused (see preflight_privilege): the grub files, /proc/cmdline.
    facts["needs_root"] = refused(file_errors(facts["grub"]) + [(facts["cmdline"].get("path"),
                                                                 facts["cmdline"].get("error"))], facts["privileged"])
    return facts
