"""Tests of the port mesh probe, continued from test_port_probe.py: unreachable vs firewall.

A peer whose ARP goes unanswered is unreachable, not firewalled: the next hop from fake
/proc/net/route, neighbour states from fake /proc/net/arp, and mesh summaries built on them
(module_utils/preflight_node/net/arp.py, net.py, port_probe.py; cluster_preflight/capabilities/port_mesh/mesh.py).
"""

import errno
import socket

import pytest

from cluster_preflight.capabilities.port_mesh import mesh
from preflight_node.net import arp, port_probe as node_probe
from port_probe_helpers import NODE1, _FailingSocket, row_for

pytestmark = pytest.mark.timeout(60)


# ---------------------------------------------------------------- unreachable vs firewall

ROUTE_HEADER = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
ARP_HEADER = "IP address       HW type     Flags       HW address            Mask     Device\n"


def _hex(addr):
    """198.18.1.0 -> '000112C6' (the host-order hex /proc/net/route prints)."""
    return "%08X" % int.from_bytes(socket.inet_aton(addr)[::-1], "big")


def _route(iface, dest, gateway, mask, flags=0x1, metric=0):
    return "%s\t%s\t%s\t%04X\t0\t0\t%d\t%s\t0\t0\t0\n" % (iface, _hex(dest), _hex(gateway), flags, metric, _hex(mask))


@pytest.fixture
def fake_net(tmp_path):
    """A proc root with a route table (198.18.1.0/24 on fab0, a default via 198.18.0.254 on eth0) and an ARP
    table where 198.18.1.2 answered, 198.18.1.3 never did and the gateway never did."""
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "route").write_text(
        ROUTE_HEADER + _route("eth0", "0.0.0.0", "198.18.0.254", "0.0.0.0", flags=0x3, metric=100)
        + _route("fab0", "198.18.1.0", "0.0.0.0", "255.255.255.0"))
    (tmp_path / "net" / "arp").write_text(
        ARP_HEADER
        + "198.18.1.2       0x1         0x2         52:54:00:12:34:56     *        fab0\n"
        + "198.18.1.3       0x1         0x0         00:00:00:00:00:00     *        fab0\n"
        + "198.18.0.254     0x1         0x0         00:00:00:00:00:00     *        eth0\n")
    return str(tmp_path)


def test_next_hop_longest_prefix_and_gateway(fake_net):
    assert arp.next_hop("198.18.1.3", fake_net) == ("198.18.1.3", "fab0")
    assert arp.next_hop("198.19.9.9", fake_net) == ("198.18.0.254", "eth0")
    assert arp.next_hop("not-an-address", fake_net) is None
    assert arp.next_hop("198.18.1.3", fake_net + "/missing") is None


def test_neighbour_states(fake_net):
    assert arp.neighbour("198.18.1.2", fake_net) == {"answered": True, "device": "fab0",
                                                     "hwaddr": "52:54:00:12:34:56"}
    assert arp.neighbour("198.18.1.3", fake_net)["answered"] is False
    assert arp.neighbour("198.18.1.9", fake_net) is None
    assert arp.unanswered_neighbour("198.18.1.2", fake_net) is None
    assert arp.unanswered_neighbour("198.18.1.9", fake_net) is None
    assert arp.unanswered_neighbour("198.18.1.3", fake_net) == {"next_hop": "198.18.1.3", "device": "fab0"}
    # Beyond a router: the gateway is what did not answer.
    assert arp.unanswered_neighbour("198.19.9.9", fake_net) == {"next_hop": "198.18.0.254", "device": "eth0"}


@pytest.mark.parametrize("peer, error, expected", [
    # ARP answered, SYNs unanswered: a DROP rule.
    ("198.18.1.2", socket.timeout("timed out"), "timeout"),
    # Nobody answers ARP: unreachable, whether the connect timed out or the kernel gave up first.
    ("198.18.1.3", socket.timeout("timed out"), "unreachable"),
    ("198.18.1.3", OSError(errno.EHOSTUNREACH, "No route to host"), "unreachable"),
    # An ICMP host-prohibited reject from a host that answers ARP stays a no_route.
    ("198.18.1.2", OSError(errno.EHOSTUNREACH, "No route to host"), "no_route"),
    # A refused connection is never reclassified.
    ("198.18.1.3", ConnectionRefusedError(errno.ECONNREFUSED, "refused"), "refused"),
])
def test_unanswered_arp_is_unreachable_not_a_firewall(monkeypatch, fake_net, peer, error, expected):
    monkeypatch.setattr(_FailingSocket, "error", error)
    monkeypatch.setattr(node_probe.socket, "socket", _FailingSocket)
    result = node_probe.probe(NODE1, 6000, "node1", [{"name": "node2", "addr": peer}], window=0.5,
                              connect_timeout=0.2, listen=False, proc_root=fake_net)
    row = row_for(result, "node2")
    assert row["result"] == expected
    check = result["checks"]["port_reach_node2"]
    assert check["status"] == "fail"
    if expected == "unreachable":
        assert row["next_hop"] == peer
        assert "never answered ARP on fab0" in row["detail"] and "firewall" in row["detail"]
        assert "not a firewall" in row["detail"]
        assert "preflight_socket_ifname" in check["fix"] and "arping" in check["fix"]
        assert "iptables" not in check["fix"]
    else:
        assert "next_hop" not in row


def test_mesh_summary_calls_an_isolated_node_unreachable_not_firewalled():
    def row(src, dst, result):
        return {"source": src, "destination": dst, "addr": "198.18.1.9", "port": 6000, "result": result,
                "detail": "x", "elapsed": 0.1}
    rows = {"n1": [row("n1", "n2", "open"), row("n1", "n3", "unreachable")],
            "n2": [row("n2", "n1", "open"), row("n2", "n3", "unreachable")],
            "n3": [row("n3", "n1", "unreachable"), row("n3", "n2", "unreachable")]}
    summary = mesh.mesh_summary(rows)
    assert summary["suspect_nodes"] == ["n3"]
    messages = " ".join(summary["messages"])
    assert "n3 is unreachable on port 6000 from every peer" in messages
    assert "wrong interface" in messages and "DROP" not in messages
    assert "outbound firewall" not in messages
    checks, _summary, ok = mesh.mesh_checks({host: {"results": value} for host, value in rows.items()},
                                           ["n1", "n2", "n3"])
    assert not ok
    assert checks["n3"]["port_mesh"]["status"] == "fail"
    assert checks["n1"]["port_mesh"]["status"] == "pass" and checks["n2"]["port_mesh"]["status"] == "pass"


def test_loopback_has_no_next_hop(fake_net):
    assert arp.next_hop("127.0.0.5", fake_net) is None


@pytest.mark.parametrize("answers, expected", [
    (True, None),  # the ARP question was answered: a firewall, not the link, dropped the SYNs
    (False, {"next_hop": "198.18.1.2", "device": "fab0", "how": "asked with ARP for 1.0 s"}),
    # Could not ask (not root): the kernel's table decides; 198.18.1.2's entry is complete.
    (None, None),
])
def test_link_layer_silent_asks_arp_first(monkeypatch, fake_net, answers, expected):
    asked = []
    monkeypatch.setattr(arp, "arp_answers", lambda target, device, timeout, sys_root: asked.append(
        (target, device)) or answers)
    assert arp.link_layer_silent("198.18.1.2", fake_net) == expected
    assert asked == [("198.18.1.2", "fab0")]


def test_link_layer_silent_falls_back_to_the_kernels_incomplete_entry(monkeypatch, fake_net):
    monkeypatch.setattr(arp, "arp_answers", lambda *args: None)
    assert arp.link_layer_silent("198.18.1.3", fake_net) == {
        "next_hop": "198.18.1.3", "device": "fab0", "how": "the kernel's ARP entry is incomplete"}


def test_arp_answers_cannot_ask_on_a_device_it_does_not_know(tmp_path):
    assert arp.arp_answers("198.18.1.2", "nosuchdev0", timeout=0.1, sys_root=str(tmp_path)) is None
