# -*- coding: utf-8 -*-
"""Capability ``nic_discovery``, the controller half: the interface the collectives use.

The reader (every netdev, RDMA device and address of a node) is the node half,
``module_utils/preflight_node/capabilities/nic_discovery.py``.

* ``validate`` / ``read_args`` (controller): the role's settings, and the reader's arguments.
* ``plan`` (controller): the interface every node has up with an address,
  fabric before Ethernet, management and virtual last
  (``select_interface`` in ``cluster_preflight/capabilities/nic_discovery/nic_select.py``), each node's address on it,
  and the
  findings (no common interface, fabric on some nodes only, MTU, link).
"""

from __future__ import annotations

import re

from preflight_node.capabilities.nic_discovery import CAPABILITY  # noqa: F401  (the registry reads it here)

from cluster_preflight.capabilities.nic_discovery.nic_select import parse_override, select_interface
from ..common import Args, Node, Problems, Settings

IFNAME_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")


def validate(settings: Settings) -> Problems:
    problems = []
    try:
        names = parse_override(settings.get("nic_discovery_override") or None)
    except ValueError as exc:
        names = []
        problems.append({"name": "nic_discovery_override", "found": settings.get("nic_discovery_override"),
                         "expected": "an interface name or a comma list of names", "fix": str(exc)})
    for name in names:
        if not IFNAME_RE.match(name):
            problems.append({"name": "nic_discovery_override", "found": name,
                             "expected": "interface names of at most 15 letters, digits, '_', '.', ':', '@', '-'",
                             "fix": "set preflight_socket_ifname to the interface name as `ip link` shows it"})
    for name in ("nic_discovery_sysfs_root", "nic_discovery_proc_root"):
        if not str(settings.get(name) or "").startswith("/"):
            problems.append({"name": name, "found": settings.get(name), "expected": "an absolute path",
                             "fix": "leave %s at its default" % name})
    return problems


def read_args(settings: Settings, node: Node) -> Args:
    return {"sysfs_root": settings["nic_discovery_sysfs_root"], "proc_root": settings["nic_discovery_proc_root"],
            "addr_source": "auto", "ip_json_file": None}


def plan(hosts, facts_by_host, settings_by_host, nodes):
    """The interface choice over the nodes that were read (in inventory order).

    Returns a decision (``ok``, ``blockers``, ``checks_by_host`` as
    ``{host: {name: check}}``) with ``ifname``, ``gloo_socket_ifname``,
    ``nccl_socket_ifname``, ``addr_by_host``, ``master``, ``reason``.
    """
    read_hosts = [host for host in hosts if facts_by_host.get(host) is not None]
    empty = {"ifname": None, "ifnames": [], "gloo_socket_ifname": None, "nccl_socket_ifname": None,
             "addr_by_host": {}, "master": None, "master_addr": None, "reason": "", "checks_by_host": {}}
    if not read_hosts:
        # A consequence, not a cause: each node's own finding (preflight.facts, preflight.reachable) says why.
        why = "no node's interfaces could be read: no node's facts came back (see preflight.facts or " \
              "preflight.reachable on each)"
        return dict(empty, ok=False, blockers=[why], reason=why)
    first = settings_by_host[read_hosts[0]]
    decision = select_interface(
        {host: facts_by_host[host]["nics"] for host in read_hosts},
        master=read_hosts[0],
        override=first.get("nic_discovery_override") or None,
        mgmt_addr_by_host={host: nodes[host]["ansible_host"] for host in read_hosts},
        rdma_by_host={host: facts_by_host[host].get("rdma_devices") or {} for host in read_hosts},
        fabric_mismatch=first.get("nic_discovery_fabric_mismatch", "fail"))
    lacking = [host for host in read_hosts if host not in decision["addr_by_host"]]
    blockers = []
    if not decision["ifname"] or lacking:
        blockers.append("no inter-node interface every node shares: %s%s (see the nic_discovery checks)" % (
            decision.get("reason") or "no selection",
            "; no address on it on %s" % ", ".join(lacking) if lacking and decision["ifname"] else ""))
    checks_by_host = decision.pop("checks")
    decision.pop("candidates", None)
    result = dict(empty)
    result.update(decision)
    result.update(ok=not blockers, blockers=blockers, checks_by_host=checks_by_host)
    return result
