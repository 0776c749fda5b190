#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: choose the interface the collectives use on every node."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nic_select
short_description: Choose the network interface for NCCL/gloo and the master's address on it
description:
  - "Runs on the controller (C(delegate_to: localhost), C(run_once: true)) over the
    C(preflight_nics) fact that M(nic_facts) set on every node."
  - Candidates are interface names present on every node, UP, with an IPv4
    address (not loopback or link-local) and not reported unreachable. Names are
    matched exactly; a fabric named C(ib0) on one node and C(ib1) on another is
    not matched, only reported.
  - "Ranking: fabric (infiniband, roce, efa, opa, slingshot) before ethernet
    before veth before other virtual links; loopback, bridges (docker0, virbr0,
    cni0, ...) and container devices are never chosen unless named by
    I(override). Within a tier a management interface (C(eth0), the one with a
    default route, or the one holding I(mgmt_addr_by_host)) comes after data
    interfaces, then the higher speed (the slowest node counts), then an
    interface whose addresses share one subnet on all nodes, then the name."
  - "Returns check results per node: C(nic_common_interface), C(nic_override),
    C(nic_fabric_consistency), C(nic_mtu_consistency), C(nic_link). Findings never
    fail the task; only bad arguments do."
version_added: "1.0.0"
author:
  - Cluster preflight maintainers
options:
  nics_by_host:
    description: Host name -> that host's C(preflight_nics) fact.
    type: dict
    required: true
  master:
    description: Host whose address on the chosen interface becomes C(master_addr). Default is the first host of I(nics_by_host).
    type: str
  override:
    description:
      - Exact interface name(s) to use instead of the ranking (a comma-separated
        string is split). Each must exist, be UP and carry an IPv4 address on
        every node, else C(nic_override) fails naming the node.
    type: list
    elements: str
  reachability:
    description:
      - >-
        Optional probe results, C(false) meaning "could not connect". Keys are
        C(src->dst); nest them under an interface name (C({ib0: {"n1->n2": false}}))
        to speak of that interface. In a flat key, a C(dst) that is an IPv4
        address speaks of the interface holding it; a C(dst) that is a host name
        speaks of the node as a whole (every interface).
      - An interface with a failed probe is not a candidate ("isolated").
    type: dict
  mgmt_addr_by_host:
    description: Host -> the address Ansible connects to (ansible_host). The interface holding it is treated as management.
    type: dict
  rdma_by_host:
    description:
      - Host -> C(preflight_rdma_devices) fact. Lets C(nic_fabric_consistency) see
        RDMA devices without a netdev of their own, such as AWS EFA.
    type: dict
  fabric_mismatch:
    description: Status of C(nic_fabric_consistency) on a node that lacks a fabric other nodes have.
    type: str
    choices: [fail, warn]
    default: fail
attributes:
  check_mode:
    support: full
    description: Pure computation; check mode returns the same decision.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
"""

EXAMPLES = r"""
- name: Collect the interfaces of every node.
  nic_facts:

- name: Choose the interface the all-reduce uses.
  nic_select:
    nics_by_host: "{{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, 'preflight_nics'))) }}"
    rdma_by_host: "{{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, 'preflight_rdma_devices'))) }}"
    mgmt_addr_by_host: "{{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, 'ansible_host'))) }}"
    master: "{{ ansible_play_hosts | first }}"
    override: "{{ preflight_nic_override | default(omit) }}"
  delegate_to: localhost
  run_once: true
  register: preflight_nic_choice

- name: Publish the findings of each node.
  ansible.builtin.set_fact:
    preflight_nic_checks: "{{ preflight_nic_choice.checks[inventory_hostname] }}"
"""

RETURN = r"""
ifname:
  description: Chosen interface (first of the override), or null when none is usable on every node.
  returned: always
  type: str
  sample: ib0
ifnames:
  description: All chosen interfaces (several only with a list override).
  returned: always
  type: list
  elements: str
nccl_socket_ifname:
  description: Value for NCCL_SOCKET_IFNAME, exact-match form (C(=ib0)); null when none.
  returned: always
  type: str
  sample: "=ib0"
gloo_socket_ifname:
  description: Value for GLOO_SOCKET_IFNAME (comma list of exact names); null when none.
  returned: always
  type: str
  sample: ib0
addr_by_host:
  description: Host -> IPv4 address on the chosen interface (a shared subnet preferred).
  returned: always
  type: dict
  sample: {node1: 198.18.1.11, node2: 198.18.1.12}
master:
  description: The master host.
  returned: always
  type: str
master_addr:
  description: The master's IPv4 on the chosen interface (MASTER_ADDR); null when it has none.
  returned: always
  type: str
  sample: 198.18.1.11
reason:
  description: Why this interface (or why none).
  returned: always
  type: str
candidates:
  description: Every interface name seen, usable ones first in rank order, each with class, speed_mbps, management, same_subnet, subnet, rank, eligible, problems and why.
  returned: always
  type: list
  elements: dict
checks:
  description: Host -> {check name -> check result (status, found, expected, fix)}.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_nic import select_interface


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nics_by_host=dict(type="dict", required=True),
            master=dict(type="str"),
            override=dict(type="list", elements="str"),
            reachability=dict(type="dict"),
            mgmt_addr_by_host=dict(type="dict"),
            rdma_by_host=dict(type="dict"),
            fabric_mismatch=dict(type="str", default="fail", choices=["fail", "warn"]),
        ),
        supports_check_mode=True,
    )
    params = module.params
    bad = sorted(str(h) for h, nics in params["nics_by_host"].items() if not isinstance(nics, dict))
    if bad:
        module.fail_json(msg="nics_by_host values must be preflight_nics dicts (run nic_facts on every node "
                             "first); not a dict for: %s" % ", ".join(bad))
    try:
        decision = select_interface(
            params["nics_by_host"],
            master=params["master"],
            override=params["override"],
            reachability=params["reachability"],
            mgmt_addr_by_host=params["mgmt_addr_by_host"],
            rdma_by_host=params["rdma_by_host"],
            fabric_mismatch=params["fabric_mismatch"],
        )
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **decision)


if __name__ == "__main__":
    main()
