#!/usr/bin/python
# -*- coding: utf-8 -*-
"""List the GPUs and accelerators of a node from sysfs (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: pci_gpus
short_description: List the GPUs and compute accelerators of a node from sysfs
description:
  - Reads C(vendor), C(device) and C(class) of every device under C(<sysfs_root>/bus/pci/devices) and keeps
    the display controllers (PCI class C(0x03xxxx), for example C(0x030000) VGA and C(0x030200) 3D) and the
    processing accelerators (class C(0x1200xx)). AMD Instinct MI200/MI300 show as C(0x038000) or C(0x120000),
    NVIDIA data centre GPUs as C(0x030200).
  - Vendors are named for C(0x1002) (amd), C(0x10de) (nvidia) and C(0x8086) (intel); any other vendor (for
    example the ASPEED BMC VGA, C(0x1a03)) is listed as C(other) and counted in none of the vendor counts.
  - Changes nothing; runs the same in check mode.
version_added: "1.0.0"
author:
  - Cluster preflight maintainers
options:
  sysfs_root:
    description: Where sysfs is mounted; a fake tree for tests.
    type: path
    default: /sys
  amd_device_ids:
    description:
      - When not empty, only AMD devices whose device id is in this list count as AMD GPUs; other AMD
        display devices (such as the integrated graphics of a workstation CPU) are left out.
      - Ids are hexadecimal, with or without C(0x) (C(0x74a1), C(74a1)).
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
    details: Read-only; behaves the same in check mode.
  diff_mode:
    support: none
  facts:
    support: full
  platform:
    platforms: linux
"""

EXAMPLES = r"""
- name: Detect the GPUs of the node.
  pci_gpus:
  register: gpus

- name: Count only MI300X as AMD GPUs.
  pci_gpus:
    amd_device_ids: ["0x74a1"]
"""

RETURN = r"""
gpus:
  description: The GPUs and accelerators found, sorted by PCI address.
  returned: always
  type: list
  elements: dict
  sample:
    - address: "0000:c1:00.0"
      vendor: "0x1002"
      vendor_name: amd
      device: "0x74a1"
      class: "0x120000"
      driver: amdgpu
  contains:
    address:
      description: PCI address (domain:bus:device.function).
      type: str
    vendor:
      description: PCI vendor id.
      type: str
    vendor_name:
      description: C(amd), C(nvidia), C(intel) or C(other).
      type: str
    device:
      description: PCI device id.
      type: str
    class:
      description: PCI class code (6 hex digits).
      type: str
    driver:
      description: Kernel driver bound to the device, null when none.
      type: str
count:
  description: Number of entries in RV(gpus).
  returned: always
  type: int
amd_gpus:
  description: Number of AMD GPUs.
  returned: always
  type: int
nvidia_gpus:
  description: Number of NVIDIA GPUs.
  returned: always
  type: int
intel_gpus:
  description: Number of Intel GPUs.
  returned: always
  type: int
notes:
  description: Remarks, such as no PCI bus being visible under O(sysfs_root).
  returned: always
  type: list
  elements: str
ansible_facts:
  description: The same data as fact C(preflight_pci_gpus) (keys gpus, count, amd_gpus, nvidia_gpus, intel_gpus).
  returned: always
  type: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule

VENDORS = {"0x1002": "amd", "0x10de": "nvidia", "0x8086": "intel"}
DISPLAY_CLASS = 0x03  # base class: display controller (VGA, XGA, 3D, other)
ACCELERATOR_CLASS = 0x1200  # base 0x12 processing accelerator, subclass 0x00


def normalise_id(value):
    """``'0x74A1'``, ``'74a1'`` -> ``'0x74a1'``; raises ValueError if not hex."""
    text = value.strip().lower()
    if text.startswith("0x"):
        text = text[2:]
    return "0x%04x" % int(text, 16)


def is_gpu_class(code):
    return (code >> 16) == DISPLAY_CLASS or (code >> 8) == ACCELERATOR_CLASS


def read_attribute(device_dir, name):
    try:
        with open(os.path.join(device_dir, name)) as handle:
            return handle.read().strip()
    except (IOError, OSError):
        return None


def scan(sysfs_root, amd_device_ids=()):
    """The GPUs under ``sysfs_root``; see RETURN for the shape."""
    base = os.path.join(sysfs_root, "bus", "pci", "devices")
    wanted_amd = set(normalise_id(value) for value in amd_device_ids)
    gpus = []
    for address in sorted(os.listdir(base)):
        device_dir = os.path.join(base, address)
        raw_class = read_attribute(device_dir, "class")
        vendor = read_attribute(device_dir, "vendor")
        device = read_attribute(device_dir, "device")
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


def main():
    module = AnsibleModule(
        argument_spec=dict(
            sysfs_root=dict(type="path", default="/sys"),
            amd_device_ids=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    for value in module.params["amd_device_ids"]:
        try:
            normalise_id(value)
        except ValueError:
            module.fail_json(msg="amd_device_ids entry %r is not a hexadecimal PCI device id (e.g. 0x74a1)" % value)
    base = os.path.join(module.params["sysfs_root"], "bus", "pci", "devices")
    notes = []
    if not os.path.isdir(base):
        # A node without a PCI bus (some VMs, containers) has no GPU to find.
        notes.append("%s does not exist: no PCI bus visible on this node" % base)
        summary = {"gpus": [], "count": 0, "amd_gpus": 0, "nvidia_gpus": 0, "intel_gpus": 0}
    else:
        try:
            summary = scan(module.params["sysfs_root"], module.params["amd_device_ids"])
        except (IOError, OSError) as exc:
            module.fail_json(msg="cannot read %s: %s" % (base, exc))
    module.exit_json(changed=False, notes=notes, ansible_facts={"preflight_pci_gpus": summary}, **summary)


if __name__ == "__main__":
    main()
