# -*- coding: utf-8 -*-
"""The ``port_listen`` and ``port_reach_<peer>`` checks (node layer,
``module_utils/preflight_node/net/port_checks.py``).

Built on the node by the port probe (``module_utils/preflight_node/net/port_probe.py``) from its listen and
connect results; ``cluster_preflight/capabilities/port_mesh/mesh.py`` (the controller's view of the whole mesh) uses
:func:`reach_check` too.  The connect result names are in ``module_utils/preflight_node/net/arp.py``.
"""

from __future__ import annotations

from ..checks import failed, passed, skipped
from .port_holder import describe_holder


def listen_check(node, addr, port, listen):
    """The ``port_listen`` check from a probe's ``listen`` dict."""
    status = listen.get("status")
    expected = "%s can listen on %s:%d for the rendezvous" % (node, addr, port)
    if status == "ok":
        return passed("%s listens on %s:%d" % (node, addr, port), expected)
    if status == "disabled":
        return skipped("listening switched off on %s (listen: false)" % node, expected)
    if status == "in_use":
        holder = listen.get("holder") or {}
        if holder.get("pid") is not None:
            fix = ("stop pid %d (%s) on %s (ss -ltnp 'sport = :%d' shows it) or choose another "
                   "preflight_master_port" % (holder["pid"], holder.get("comm") or "?", node, port))
        else:
            fix = ("find the owner on %s as root (ss -ltnp 'sport = :%d') and stop it, or choose another "
                   "preflight_master_port" % (node, port))
        return failed("%s on %s" % (describe_holder(port, holder), node), expected, fix,
                      holder=listen.get("holder"))
    if status == "addr_not_available":
        return failed("%s is not an address of %s (EADDRNOTAVAIL)" % (addr, node), expected,
                      "set %s's inter-node address to one of its own addresses (ip -4 addr show on %s), "
                      "or bring up the interface that carries %s" % (node, node, addr))
    return failed("cannot listen on %s:%d on %s: %s" % (addr, port, node, listen.get("detail")), expected,
                  "fix the error on %s, or choose another preflight_master_port (ports below 1024 need root)"
                  % node)


def reach_check(result):
    """The ``port_reach_<peer>`` check from one outgoing probe result."""
    src, dst, addr, port = result["source"], result["destination"], result["addr"], result["port"]
    expected = "TCP connect from %s to %s on %d succeeds" % (src, dst, port)
    outcome = result["result"]
    open_it = ("open TCP %d inbound on %s: iptables -I INPUT -p tcp --dport %d -j ACCEPT on %s (and persist "
               "it in the node's firewall configuration), or allow TCP %d between the nodes in the cloud "
               "security group / network ACL" % (port, dst, port, dst, port))
    details = {"source": src, "destination": dst, "result": outcome}
    if outcome == "open":
        return passed("%s (%s:%d) answered %s in %.2f s" % (dst, addr, port, src, result["elapsed"]),
                      expected, **details)
    if outcome == "timeout":
        fix = open_it + "; also check that %s allows outbound TCP %d" % (src, port)
    elif outcome == "refused":
        fix = ("check %s's port_listen result (its probe must listen on %s:%d); if it listened, a REJECT rule "
               "on %s blocks the port: %s" % (dst, addr, port, dst, open_it))
    elif outcome == "no_route":
        fix = ("make %s reachable from %s: ip route get %s on %s, check that %s is up with %s on its "
               "inter-node interface; if a firewall on %s rejects with icmp-host-prohibited, %s"
               % (addr, src, addr, src, dst, addr, dst, open_it))
    elif outcome == "unreachable":
        fix = ("%s never answered ARP: check that %s's inter-node interface is up and cabled to the same "
               "segment/VLAN as %s (ip -br link and ip -br addr on %s; ip neigh show %s and arping %s on %s); if %s "
               "is on another network, the wrong interface was chosen: set preflight_socket_ifname to the interface "
               "both nodes share (see nic_discovery.common_interface). Not a firewall: firewalls do not block ARP"
               % (result.get("next_hop") or addr, dst, src, dst, result.get("next_hop") or addr,
                  result.get("next_hop") or addr, src, addr))
    elif outcome == "wrong_host":
        fix = ("fix the inter-node address of %s in the inventory: %s does not belong to %s (two nodes share "
               "it, or another program holds port %d on %s)" % (dst, addr, dst, port, dst))
    elif result.get("connected"):
        fix = ("another program holds port %d on %s and does not answer the probe: see %s's port_listen check "
               "(ss -ltnp 'sport = :%d' on %s), stop it or choose another preflight_master_port" % (
                   port, dst, dst, port, dst))
    else:
        fix = "fix the error on %s (%s), then re-run the preflight" % (src, result.get("errno") or "unknown")
    return failed(result["detail"], expected, fix, **details)
