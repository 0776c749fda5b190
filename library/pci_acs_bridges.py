#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""List the PCIe bridges between the GPUs and the RDMA NICs of a node, and the kernel argument that clears their ACS
redirect at boot (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: pci_acs_bridges
short_description: List the PCIe bridges between a node's GPUs and RDMA NICs and the kernel argument for their ACS
description:
  - Finds, in sysfs, every GPU and RDMA NIC that sit under a shared PCIe bridge (a switch) and the bridges from that
    shared one down to each of them, as the preflight audit's C(fabric.pcie_acs) check does
    (C(module_utils/preflight_node/net/gpudirect.py)).
  - Returns RV(kernel_arg), the kernel's C(pci=disable_acs_redir=pci:VENDOR:DEVICE) for the bridges' PCI id, so the next
    boot clears their ACS P2P redirect bits (Request Redirect, Completion Redirect, Egress Control) and GPUDirect RDMA
    traffic stays inside the switch. The kernel takes one C(disable_acs_redir) list, and grub's configuration cannot
    carry the C(;) that separates entries, so bridges of more than one PCI id fail the task, naming them.
  - Changes nothing; runs the same in check mode.
version_added: "1.0.0"
extends_documentation_fragment: [preflight, preflight.no_change]
options:
  sysfs_root:
    description: Where sysfs is mounted; a fake tree for tests.
    type: path
    default: /sys
attributes:
  check_mode:
    support: full
    description: Read-only; behaves the same in check mode.
  platform:
    support: full
    platforms: linux
    description: Linux; reads the PCI devices and RDMA devices in sysfs (O(sysfs_root)).
"""

EXAMPLES = r"""
- name: Find the bridges between the GPUs and the NICs.
  pci_acs_bridges:
  register: bridges
"""

RETURN = r"""
bridges:
  description: The bridges between a GPU and an RDMA NIC (sysfs addresses), sorted.
  returned: always
  type: list
  elements: str
ids:
  description: Their PCI ids (C(VENDOR:DEVICE), hexadecimal without C(0x)).
  returned: always
  type: list
  elements: str
kernel_arg:
  description: The kernel argument that clears their ACS redirect at boot; null when there is no such bridge.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_node.capabilities.iommu import read_pci
from ansible.module_utils.preflight_node.net.gpudirect import bridge_ids, pairs
from ansible.module_utils.preflight_node.net.interfaces import gather_rdma


def main():
    module = AnsibleModule(argument_spec=dict(sysfs_root=dict(type="path", default="/sys")), supports_check_mode=True)
    root = module.params["sysfs_root"]
    pci = read_pci(root)
    if pci["error"]:
        module.fail_json(msg="%s. Expected: a readable PCI bus in sysfs. Fix: check that sysfs is mounted at %s" % (
            pci["error"], root))
    gpus = [gpu["address"] for gpu in pci["gpus"] if gpu["vendor_name"] in ("nvidia", "amd")]
    nics = sorted(set(device["pci"] for device in gather_rdma(root).values() if device["pci"]))
    bridges = sorted(set(bridge for pair in pairs(root, gpus, nics) for bridge in pair["bridges"]))
    ids = {}
    for bridge in bridges:
        ids.setdefault(bridge_ids(root, bridge), []).append(bridge)
    result = {"changed": False, "bridges": bridges, "ids": sorted(ids), "kernel_arg": None}
    if None in ids:
        module.fail_json(msg="cannot read the PCI id of %s. Expected: vendor and device files in sysfs. Fix: check "
                             "sysfs at %s" % (", ".join(ids[None]), root), **result)
    if len(ids) > 1:
        module.fail_json(msg="the bridges between the GPUs and the NICs are of %d PCI ids (%s): the kernel's "
                             "pci=disable_acs_redir cannot name them all from grub. Expected: one switch model. Fix: "
                             "disable ACS in the BIOS, or at each boot with setpci -s BRIDGE ECAP_ACS+0x6.w=0000 for %s"
                             % (len(ids), "; ".join("%s: %s" % (key, ", ".join(value)) for key, value in
                                                    sorted(ids.items())), ", ".join(bridges)), **result)
    if ids:
        result["kernel_arg"] = "pci=disable_acs_redir=pci:%s" % result["ids"][0]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
