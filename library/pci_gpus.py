#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""List the GPUs and accelerators of a node from sysfs (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: pci_gpus
short_description: List the GPUs, compute accelerators and NVSwitches of a node from sysfs
description:
  - Reads C(vendor), C(device) and C(class) of every device under C(<sysfs_root>/bus/pci/devices) and keeps
    the display controllers (PCI class C(0x03xxxx), for example C(0x030000) VGA and C(0x030200) 3D) and the
    processing accelerators (class C(0x1200xx)). AMD Instinct MI200/MI300 show as C(0x038000) or C(0x120000),
    NVIDIA data centre GPUs as C(0x030200).
  - Vendors are named for C(0x1002) (amd), C(0x10de) (nvidia) and C(0x8086) (intel); any other vendor (for
    example the ASPEED BMC VGA, C(0x1a03)) is listed as C(other) and counted in none of the vendor counts.
  - Changes nothing; runs the same in check mode. A node without a PCI bus in sysfs has no GPU (a note says so);
    a bus that exists but cannot be read fails the task, saying what to check.
  - The scan is the reader the preflight audit's C(iommu) capability runs (C(module_utils/preflight_node/capabilities/iommu.py)).
  - Also lists the NVSwitches (NVIDIA devices of class C(0x0680xx)) in RV(nvswitches), as the C(gpu_health) reader does
    (C(module_utils/preflight_node/gpu/nvswitch.py)); a node with NVSwitches needs the NVIDIA fabric manager.
version_added: "1.0.0"
extends_documentation_fragment: [preflight, preflight.no_change]
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
    description: Read-only; behaves the same in check mode.
  facts:
    support: full
    description: The summary (RV(gpus), RV(count) and the per-vendor counts) is also returned as the fact C(preflight_pci_gpus).
  platform:
    support: full
    platforms: linux
    description: Linux; reads the PCI devices in sysfs (O(sysfs_root)).
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
nvswitches:
  description: The NVSwitches on the PCI bus, sorted by address.
  returned: always
  type: list
  elements: dict
  sample:
    - address: "0000:05:00.0"
      device: "0x22a3"
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

from ansible.module_utils.basic import AnsibleModule
# The scan is the iommu capability's reader (module_utils/preflight_node/capabilities/iommu.py); this module is its face
# for roles and ad-hoc use.
from ansible.module_utils.preflight_node.capabilities.iommu import normalise_id, read_pci, scan  # noqa: F401 (scan: public name)
from ansible.module_utils.preflight_node.gpu.nvswitch import scan as scan_nvswitches


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
            module.fail_json(msg="amd_device_ids entry %r is not a hexadecimal PCI device id. Expected: an id such as "
                                 "0x74a1 or 74a1. Fix: use the id lspci -nn shows after 1002: (for example "
                                 "[1002:74a1] -> 0x74a1)" % value)
    found = read_pci(module.params["sysfs_root"], module.params["amd_device_ids"])
    if found["error"]:
        module.fail_json(msg="%s. Expected: a readable PCI bus in sysfs. Fix: check that sysfs is mounted at %s "
                             "(sysfs_root) and readable" % (found["error"], module.params["sysfs_root"]))
    summary = dict((key, found[key]) for key in ("gpus", "count", "amd_gpus", "nvidia_gpus", "intel_gpus"))
    switches = scan_nvswitches(module.params["sysfs_root"])
    module.exit_json(changed=False, notes=found["notes"], ansible_facts={"preflight_pci_gpus": summary},
                     nvswitches=switches["devices"], **summary)


if __name__ == "__main__":
    main()
