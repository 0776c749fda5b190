#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: classify a node's network interfaces (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nic_facts
short_description: Find and classify a node's network interfaces for inter-node collectives
description:
  - Reads C(/sys/class/net/*) (operstate, carrier, mtu, speed, address, type, flags,
    device/driver, bridge/, brport/, bonding/, tun_flags, uevent DEVTYPE, iflink) and
    C(/sys/class/infiniband/*) (ports, state, rate, link_layer, GID netdevs, device/net)
    and classifies every interface as one of C(loopback), C(infiniband) (IPoIB),
    C(roce), C(efa), C(opa) (Omni-Path, driver hfi1), C(slingshot) (C(hsn*) or a
    cxi driver), C(ethernet), C(bridge), C(veth), C(container) (docker, CNI,
    flannel, calico, cilium, virbr, ... devices) or C(virtual) (tun/tap, dummy,
    vxlan, ...).
  - "IPv4/IPv6 addresses come from C(ip -j -d addr show) (which also names each
    software link's kind) or, without any external tool, from
    C(<proc_root>/net/fib_trie) and C(<proc_root>/net/route) (IPv4) and
    C(<proc_root>/net/if_inet6) (IPv6). The procfs path attributes an IPv4
    address to the interface of its directly connected route, so an address on
    a link that is down stays unattributed (reported as a warning)."
  - Without C(ip -d), a software Ethernet link whose C(iflink) names another
    device is taken for a veth (macvlan and ipvlan look the same).
  - Speed is C(null) when the kernel reports -1 or nothing; for IPoIB and RoCE
    it is then taken from the RDMA port rate (C(speed_source=rdma_rate)).
  - Changes nothing on the node.
version_added: "1.0.0"
author:
  - Cluster preflight maintainers
options:
  sysfs_root:
    description: Root of sysfs; a fake tree in tests.
    type: path
    default: /sys
  proc_root:
    description: Root of procfs (C(net/fib_trie), C(net/route), C(net/if_inet6), C(net/ipv6_route)).
    type: path
    default: /proc
  addr_source:
    description:
      - Where addresses come from.
      - C(auto) runs C(ip) when it exists and both roots are the live C(/sys) and
        C(/proc), otherwise reads procfs under I(proc_root) (so a fake tree is
        never mixed with this machine's addresses); a failing C(ip) falls back to
        procfs with a warning.
      - C(ip) requires C(ip) (or I(ip_json_file)); C(proc) never runs anything.
    type: str
    choices: [auto, ip, proc]
    default: auto
  ip_json_file:
    description:
      - A file holding saved C(ip -j -d addr show) output, read instead of running
        C(ip). For tests and for analysing a node offline. Implies C(addr_source=ip).
    type: path
  command_timeout:
    description: Seconds C(ip) may run (enforced with coreutils C(timeout) when present).
    type: int
    default: 10
attributes:
  check_mode:
    support: full
    description: Read-only; check mode returns the same facts.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
  facts:
    support: full
    description: Sets C(preflight_nics) and C(preflight_rdma_devices).
notes:
  - Selection of the interface the collectives use is done on the controller by
    M(nic_select) from every node's C(preflight_nics).
"""

EXAMPLES = r"""
- name: Find the network interfaces of every node.
  nic_facts:

- name: Classify a saved sysfs/procfs tree of a node.
  nic_facts:
    sysfs_root: /srv/captures/node7/sys
    proc_root: /srv/captures/node7/proc
    ip_json_file: /srv/captures/node7/ip-addr.json
  delegate_to: localhost
"""

RETURN = r"""
ansible_facts:
  description: Facts set on the node.
  returned: always
  type: dict
  contains:
    preflight_nics:
      description: Interface name -> facts (same shape as I(nics)).
      type: dict
    preflight_rdma_devices:
      description: RDMA device name -> facts (same shape as I(rdma_devices)).
      type: dict
nics:
  description: Interface name -> facts.
  returned: always
  type: dict
  sample:
    ib0:
      name: ib0
      operstate: up
      carrier: true
      mtu: 2044
      speed_mbps: 100000
      speed_source: sysfs
      mac: "00:00:10:87:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:5e:1a:2b"
      type: 32
      flags: "0x1003"
      ipv4: ["198.18.1.11/24"]
      ipv6: []
      driver: mlx5_core
      kind: null
      class: infiniband
      pci: "0000:3b:00.0"
      master: null
      bridge_port: false
      default_route: false
      rdma: [{device: mlx5_0, port: 1, state: ACTIVE, phys_state: LinkUp,
              rate: "100 Gb/sec (4X EDR)", link_layer: InfiniBand}]
      is_virtual: false
      is_up: true
  contains:
    class:
      description: One of loopback, infiniband, roce, efa, opa, slingshot, ethernet, bridge, veth, container, virtual.
      type: str
    is_up:
      description: Administratively up and operstate up (or unknown with carrier, as lo reports).
      type: bool
    carrier:
      description: Link detected; null when the kernel refuses to tell (link down).
      type: bool
    speed_mbps:
      description: Link speed in Mb/s; null when unknown.
      type: int
    driver:
      description: Driver of the interface's device, or the software link kind (veth, bridge, ...) when it has none.
      type: str
    kind:
      description: Software link kind (veth, bridge, vlan, bond, tun, tap, vxlan, dummy, ...); null for hardware.
      type: str
    is_virtual:
      description: The interface has no device (no C(device) link in sysfs).
      type: bool
    default_route:
      description: An IPv4 or IPv6 default route leaves through this interface.
      type: bool
    rdma:
      description: RDMA ports this netdev belongs to (from device/net or the port's GID netdevs).
      type: list
      elements: dict
rdma_devices:
  description: RDMA device name -> {name, driver, kind, pci, netdevs, ports[{port, state, phys_state, rate, rate_gbps, link_layer, netdevs}]}.
  returned: always
  type: dict
read_warnings:
  description: What could not be read or attributed (also shown as warnings).
  returned: always
  type: list
  elements: str
addr_source:
  description: Where the addresses came from (ip, ip_json_file or proc).
  returned: always
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_nic import gather_nics, parse_ip_addr_json


def _ip_links(module):
    """(links, source) from ip_json_file or by running ip; (None, reason) to fall back."""
    path = module.params["ip_json_file"]
    if path:
        try:
            with open(path, "r", encoding="utf-8") as handle:
                return parse_ip_addr_json(handle.read()), "ip_json_file"
        except (OSError, ValueError) as exc:
            module.fail_json(msg="ip_json_file %s is not readable ip -j addr output: %s" % (path, exc))
    ip = module.get_bin_path("ip")
    if not ip:
        return None, "ip is not installed"
    argv = [ip, "-j", "-d", "addr", "show"]
    timeout = module.get_bin_path("timeout")
    if timeout:
        argv = [timeout, str(module.params["command_timeout"])] + argv
    rc, out, err = module.run_command(argv, environ_update={"LANG": "C", "LC_ALL": "C"})
    if rc != 0:
        return None, "%s exited %d: %s" % (" ".join(argv), rc, err.strip())
    try:
        return parse_ip_addr_json(out), "ip"
    except ValueError as exc:
        return None, "%s printed no JSON (iproute2 too old for -j?): %s" % (" ".join(argv), exc)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            sysfs_root=dict(type="path", default="/sys"),
            proc_root=dict(type="path", default="/proc"),
            addr_source=dict(type="str", default="auto", choices=["auto", "ip", "proc"]),
            ip_json_file=dict(type="path"),
            command_timeout=dict(type="int", default=10),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if params["command_timeout"] <= 0:
        module.fail_json(msg="command_timeout must be positive, got %d" % params["command_timeout"])
    live = os.path.normpath(params["sysfs_root"]) == "/sys" and os.path.normpath(params["proc_root"]) == "/proc"
    source = params["addr_source"]
    if params["ip_json_file"]:
        source = "ip"
    elif source == "auto":
        source = "ip" if live else "proc"

    links, used, fallback_reason = None, "proc", None
    if source == "ip":
        links, used = _ip_links(module)
        if links is None:
            if params["addr_source"] == "ip":
                module.fail_json(msg="addr_source=ip but %s" % used)
            fallback_reason = "Read addresses from %s instead of ip: %s" % (params["proc_root"], used)
            used = "proc"

    try:
        nics, rdma, warnings = gather_nics(params["sysfs_root"], params["proc_root"], links)
    except Exception as exc:  # pylint: disable=broad-except
        module.fail_json(msg="reading interfaces under %s failed: %s" % (params["sysfs_root"], exc))
    if fallback_reason:
        warnings.insert(0, fallback_reason)
    for warning in warnings:
        module.warn(warning)
    module.exit_json(
        changed=False,
        read_warnings=warnings,
        ansible_facts={"preflight_nics": nics, "preflight_rdma_devices": rdma},
        nics=nics,
        rdma_devices=rdma,
        addr_source=used,
    )


if __name__ == "__main__":
    main()
