"""Tests of the port mesh probe with real sockets on 127.0.0.0/8.

Distinct loopback addresses (127.0.0.2, 127.0.0.3, ...) stand for distinct
nodes: each node listens on its own address and the same port.  Every
network wait is bounded by the probe's window; pytest-timeout bounds each
test as a whole.  Unreachable vs firewall (fake /proc/net/route and arp) is in
test_port_probe_unreachable.py; shared helpers in tests/port_probe_helpers.py.
"""

import errno
import os
import pwd
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import port_probe
from cluster_preflight.capabilities.port_mesh import mesh
from preflight_node.net import arp, port_holder as net, port_probe as node_probe
from port_probe_helpers import NODE1, NODE2, NODE3, _FailingSocket, row_for

# A run's secret, as the plan makes one.
TOKEN = "0123456789abcdef0123456789abcdef"

pytestmark = pytest.mark.timeout(60)


# The probe promises to return within window + 2 s.
BOUND_SLACK = 2.0


def free_port():
    with socket.socket() as sock:
        sock.bind((NODE1, 0))
        return sock.getsockname()[1]


def can_listen_again(addr, port):
    """True when nothing listens on addr:port any more (TIME_WAIT allowed)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((addr, port))
        sock.listen(1)
        return True
    except OSError:
        return False
    finally:
        sock.close()


def run_nodes(*calls):
    """Run several probe() calls at the same time, as Ansible runs one task on all nodes."""
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(node_probe.probe, **kwargs) for kwargs in calls]
        return [future.result(timeout=30) for future in futures]




def timed(func, *args, **kwargs):
    clock = __import__("time").monotonic
    started = clock()
    value = func(*args, **kwargs)
    return value, clock() - started


@pytest.fixture
def dropping_peer():
    """An address:port whose SYNs are dropped: a listener whose accept queue is full."""
    listener = socket.socket()
    listener.bind(("127.0.0.9", 0))
    listener.listen(0)
    addr = listener.getsockname()
    fillers = []
    for _ in range(8):
        client = socket.socket()
        client.settimeout(0.3)
        try:
            client.connect(addr)
        except socket.timeout:
            client.close()
            break
        fillers.append(client)
    else:
        listener.close()
        pytest.skip("the accept queue never filled up on this kernel")
    yield addr
    for client in fillers:
        client.close()
    listener.close()


# ---------------------------------------------------------------- real mesh

def test_open_pair_both_directions_and_listener_closed():
    port = free_port()
    window = 5.0
    node1, node2 = run_nodes(
        dict(listen_addr=NODE1, port=port, node_name="node1", peers=[{"name": "node2", "addr": NODE2}],
             window=window, connect_timeout=1.0),
        dict(listen_addr=NODE2, port=port, node_name="node2", peers=[{"name": "node1", "addr": NODE1}],
             window=window, connect_timeout=1.0),
    )
    assert row_for(node1, "node2")["result"] == "open"
    assert row_for(node1, "node2")["answered_by"] == "node2"
    assert row_for(node2, "node1")["result"] == "open"
    assert node1["incoming"] == ["node2"] and node2["incoming"] == ["node1"]
    assert node1["listen"]["status"] == "ok"
    assert node1["checks"]["port_listen"]["status"] == "pass"
    assert node1["checks"]["port_reach_node2"]["status"] == "pass"
    assert node2["checks"]["port_reach_node1"]["expected"] == "TCP connect from node2 to node1 on %d succeeds" % port
    # Everyone was heard from, so the listener did not sit out the window.
    assert node1["elapsed"] < window and node2["elapsed"] < window
    assert can_listen_again(NODE1, port) and can_listen_again(NODE2, port)


def test_refused_when_the_peer_does_not_listen():
    port = free_port()
    node1, node2 = run_nodes(
        dict(listen_addr=NODE1, port=port, node_name="node1", peers=[{"name": "node2", "addr": NODE2}],
             window=1.5, connect_timeout=0.5),
        dict(listen_addr=NODE2, port=port, node_name="node2", peers=[{"name": "node1", "addr": NODE1}],
             window=1.5, connect_timeout=0.5, listen=False),
    )
    refused = row_for(node1, "node2")
    assert refused["result"] == "refused" and refused["errno"] == "ECONNREFUSED"
    # Refused is retried: the peer's listener may simply not be up yet.
    assert refused["attempts"] > 1
    assert row_for(node2, "node1")["result"] == "open"
    assert node2["listen"]["status"] == "disabled"
    assert node2["checks"]["port_listen"]["status"] == "skipped"
    check = node1["checks"]["port_reach_node2"]
    assert check["status"] == "fail"
    assert "refused" in check["found"] and "node2" in check["fix"]
    assert "iptables -I INPUT -p tcp --dport %d -j ACCEPT" % port in check["fix"]


def test_peer_that_starts_late_is_still_reached():
    port = free_port()
    late = {}

    def start_late():
        late["result"] = node_probe.probe(NODE2, port, "node2", [{"name": "node1", "addr": NODE1}],
                                          window=3.0, connect_timeout=0.5)

    timer = threading.Timer(0.6, start_late)
    timer.start()
    node1 = node_probe.probe(NODE1, port, "node1", [{"name": "node2", "addr": NODE2}], window=3.0,
                             connect_timeout=0.5)
    timer.join(10)
    assert row_for(node1, "node2")["result"] == "open"
    assert row_for(node1, "node2")["attempts"] > 1
    assert row_for(late["result"], "node1")["result"] == "open"


def test_listen_on_all_addresses_and_a_node_answering_for_another():
    port = free_port()
    node1, node2 = run_nodes(
        dict(listen_addr="0.0.0.0", port=port, node_name="node1", peers=[{"name": "node2", "addr": NODE2}],
             window=2.0, connect_timeout=0.5),
        dict(listen_addr=NODE2, port=port, node_name="node2", peers=[{"name": "node1", "addr": "127.0.0.5"}],
             window=2.0, connect_timeout=0.5, listen=False),
    )
    assert node1["listen"]["status"] == "ok"
    assert row_for(node2, "node1")["result"] == "open"
    # node1's wildcard listener also covers node2's address on this one
    # machine, so node1's own connection to "node2" reached node1.
    to_node2 = row_for(node1, "node2")
    assert to_node2["result"] == "wrong_host" and to_node2["answered_by"] == "node1"
    assert node1["incoming"] == ["node1", "node2"]
    assert node1["misdirected"] == [{"from": "node1", "to": "node2"}]
    assert can_listen_again("0.0.0.0", port)


def test_three_nodes_one_not_listening_is_named_by_mesh_summary():
    port = free_port()
    nodes = {"node1": NODE1, "node2": NODE2, "node3": NODE3}
    everyone = [{"name": name, "addr": addr} for name, addr in nodes.items()]
    results = run_nodes(*[
        dict(listen_addr=addr, port=port, node_name=name, peers=everyone, window=2.0, connect_timeout=0.5,
             listen=(name != "node3"))
        for name, addr in nodes.items()
    ])
    by_host = dict(zip(nodes, results))
    # The node's own entry in peers is ignored.
    assert [row["destination"] for row in by_host["node1"]["results"]] == ["node2", "node3"]
    summary = mesh.mesh_summary(by_host)
    assert summary["matrix"]["node1"] == {"node2": "open", "node3": "refused"}
    assert summary["matrix"]["node3"] == {"node1": "open", "node2": "open"}
    assert summary["suspect_nodes"] == ["node3"]
    assert "node3 refuses port %d from every peer" % port in summary["messages"][0]


def test_port_in_use_names_the_holder():
    port = free_port()
    holder = socket.socket()
    holder.bind((NODE1, port))
    holder.listen(1)
    try:
        result = node_probe.probe(NODE1, port, "node1", check_in_use_only=True, window=3.0)
    finally:
        holder.close()
    listen = result["listen"]
    assert listen["status"] == "in_use"
    assert listen["holder"]["pid"] == os.getpid()
    with open("/proc/self/comm") as handle:
        comm = handle.read().strip()
    assert listen["holder"]["comm"] == comm
    # Root's own listener: its account and command named, and a fail (root's program, the node's configuration).
    assert listen["detail"].startswith("port %d in use by pid %d (%s) of account %s: " % (
        port, os.getpid(), comm, pwd.getpwuid(os.geteuid()).pw_name))
    check = result["checks"]["port_listen"]
    assert check["status"] == "fail"
    assert "node1" in check["found"] and str(port) in check["found"]
    assert "stop pid %d (%s) on node1" % (os.getpid(), comm) in check["fix"]
    assert "preflight_master_port" in check["fix"]
    assert result["results"] == []


def test_port_held_on_all_addresses_blocks_a_specific_address_and_probing_goes_on():
    port = free_port()
    holder = socket.socket()
    holder.bind(("0.0.0.0", port))
    holder.listen(1)
    try:
        result = node_probe.probe(NODE1, port, "node1", [{"name": "node2", "addr": NODE2}], window=1.5,
                                  connect_timeout=0.5)
    finally:
        holder.close()
    assert result["listen"]["status"] == "in_use"
    assert result["listen"]["holder"]["pid"] == os.getpid()
    assert result["listen"]["holder"]["addr"] == "0.0.0.0"
    # The outgoing side still ran: node2 (127.0.0.3) is covered by the
    # wildcard holder, which accepts but never answers the greeting.
    row = row_for(result, "node2")
    assert row["result"] == "error" and row["connected"] is True and row["attempts"] == 1
    assert "no preflight answer" in row["detail"]
    assert "another program holds port %d on node2" % port in result["checks"]["port_reach_node2"]["fix"]


def test_address_not_on_this_node():
    addr = "198.19.255.254"
    with socket.socket() as sock:
        try:
            sock.bind((addr, 0))
            pytest.skip("%s is configured on this machine" % addr)
        except OSError as exc:
            assert exc.errno == errno.EADDRNOTAVAIL
    result = node_probe.probe(addr, free_port(), "node1", check_in_use_only=True, window=1.0)
    assert result["listen"]["status"] == "addr_not_available"
    check = result["checks"]["port_listen"]
    assert check["status"] == "fail" and "not an address of node1" in check["found"]


def test_timeout_when_syns_are_dropped(dropping_peer):
    addr, port = dropping_peer
    result = node_probe.probe(NODE1, port, "node1", [{"name": "node9", "addr": addr}], window=1.0,
                              connect_timeout=0.4, listen=False)
    row = row_for(result, "node9")
    assert row["result"] == "timeout"
    assert "%s:%d timed out after" % (addr, port) in row["detail"]
    assert "firewall" in row["detail"]
    check = result["checks"]["port_reach_node9"]
    assert check["status"] == "fail" and check["found"] == row["detail"]
    assert "on node9" in check["fix"] and "security group" in check["fix"]


def test_window_bounds_the_whole_probe(dropping_peer):
    addr, port = dropping_peer
    window = 1.0
    # connect_timeout larger than the window: the window still wins.
    result, took = timed(node_probe.probe, "127.0.0.10", port, "node1",
                         [{"name": "dropper", "addr": addr}, {"name": "silent", "addr": "127.0.0.11"}],
                         window=window, connect_timeout=5.0)
    assert took <= window + BOUND_SLACK
    assert row_for(result, "dropper")["result"] == "timeout"
    assert row_for(result, "silent")["result"] == "refused"
    # Nobody connected to us, so the listener waited out the window and was closed.
    assert result["incoming"] == []
    assert can_listen_again("127.0.0.10", port)


def test_wrong_host_is_detected():
    port = free_port()
    node1, node2 = run_nodes(
        # node1 also waits for node3, so its listener stays up for node2's second connection.
        dict(listen_addr=NODE1, port=port, node_name="node1",
             peers=[{"name": "node2", "addr": NODE2}, {"name": "node3", "addr": NODE3}],
             window=2.0, connect_timeout=0.5),
        # node2's inventory gives node3 the address of node1.
        dict(listen_addr=NODE2, port=port, node_name="node2",
             peers=[{"name": "node1", "addr": NODE1}, {"name": "node3", "addr": NODE1}],
             window=2.0, connect_timeout=0.5),
    )
    wrong = row_for(node2, "node3")
    assert wrong["result"] == "wrong_host"
    assert wrong["answered_by"] == "node1"
    assert wrong["detail"] == "%s:%d reached node1 instead of node3" % (NODE1, port)
    assert wrong["attempts"] == 1
    assert row_for(node2, "node1")["result"] == "open"
    assert {"from": "node2", "to": "node3"} in node1["misdirected"]
    assert "inventory" in node2["checks"]["port_reach_node3"]["fix"]


@pytest.mark.parametrize("error, expected, errno_name", [
    (socket.timeout("timed out"), "timeout", None),
    (OSError(errno.EHOSTUNREACH, "No route to host"), "no_route", "EHOSTUNREACH"),
    (OSError(errno.ENETUNREACH, "Network is unreachable"), "no_route", "ENETUNREACH"),
    (OSError(errno.EMFILE, "Too many open files"), "error", "EMFILE"),
])
def test_connect_failures_are_classified(monkeypatch, error, expected, errno_name):
    monkeypatch.setattr(_FailingSocket, "error", error)
    monkeypatch.setattr(node_probe.socket, "socket", _FailingSocket)
    result = node_probe.probe(NODE1, 6000, "node1", [{"name": "node2", "addr": "198.18.1.2"}], window=0.5,
                              connect_timeout=0.2, listen=False)
    row = row_for(result, "node2")
    assert row["result"] == expected and row["errno"] == errno_name
    check = result["checks"]["port_reach_node2"]
    assert check["status"] == "fail" and check["details"]["result"] == expected
    if expected == "no_route":
        assert "no route from node1 to 198.18.1.2:6000" in row["detail"]
        assert "ip route get 198.18.1.2" in check["fix"]
    if expected == "error":
        assert "EMFILE" in row["detail"]


# ---------------------------------------------------------------- module_utils

@pytest.mark.parametrize("exc, expected", [
    (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), ("refused", "ECONNREFUSED")),
    (socket.timeout("timed out"), ("timeout", None)),
    (TimeoutError(errno.ETIMEDOUT, "Connection timed out"), ("timeout", "ETIMEDOUT")),
    (OSError(errno.EHOSTUNREACH, "x"), ("no_route", "EHOSTUNREACH")),
    (OSError(errno.ENETUNREACH, "x"), ("no_route", "ENETUNREACH")),
    (OSError(errno.ECONNRESET, "x"), ("error", "ECONNRESET")),
])
def test_classify_errno(exc, expected):
    assert arp.classify_errno(exc) == expected


TCP_HEADER = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n")


def _tcp_line(slot, local, remote, state, inode):
    return ("  %3d: %s %s %s 00000000:00000000 00:00000000 00000000     0        0 %d 1 0000000000000000 "
            "100 0 0 10 0\n" % (slot, local, remote, state, inode))


@pytest.fixture
def fake_proc(tmp_path):
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "tcp").write_text(
        TCP_HEADER
        # 0.0.0.0:6000 LISTEN, inode 5555
        + _tcp_line(0, "00000000:1770", "00000000:0000", "0A", 5555)
        # 127.0.0.1:6000 -> 127.0.0.1:40000 TIME_WAIT, no owner
        + _tcp_line(1, "0100007F:1770", "0100007F:9C40", "06", 0)
        # 127.0.0.1:22 LISTEN
        + _tcp_line(2, "0100007F:0016", "00000000:0000", "0A", 1111)
        # 198.18.1.1:6003 LISTEN, owner not visible
        + _tcp_line(3, "010112C6:1773", "00000000:0000", "0A", 9999)
        + "garbage line\n")
    (tmp_path / "net" / "tcp6").write_text(
        TCP_HEADER
        # [::]:6001 LISTEN, inode 7777
        + _tcp_line(0, "00000000000000000000000000000000:1771", "00000000000000000000000000000000:0000",
                    "0A", 7777)
        # [::ffff:127.0.0.1]:6002 bound, not listening (CLOSE), inode 8888
        + _tcp_line(1, "0000000000000000FFFF00000100007F:1772", "00000000000000000000000000000000:0000",
                    "07", 8888))
    procs = {"1": ("systemd", {"3": "socket:[1111]"}),
             "4242": ("torchrun", {"0": "/dev/null", "7": "socket:[5555]"}),
             "4243": ("torchrun", {"7": "socket:[5555]"}),
             "5000": ("python3", {"4": "socket:[7777]", "5": "socket:[8888]"})}
    for pid, (comm, fds) in procs.items():
        (tmp_path / pid / "fd").mkdir(parents=True)
        (tmp_path / pid / "comm").write_text(comm + "\n")
        for fd, target in fds.items():
            os.symlink(target, str(tmp_path / pid / "fd" / fd))
    (tmp_path / "self").mkdir()
    return str(tmp_path)


def test_parse_proc_net_tcp_decodes_addresses(fake_proc):
    with open(os.path.join(fake_proc, "net", "tcp")) as handle:
        sockets = net.parse_proc_net_tcp(handle.read())
    assert sockets[0] == {"addr": "0.0.0.0", "port": 6000, "state": net.TCP_LISTEN, "inode": 5555}
    assert sockets[1]["addr"] == "127.0.0.1" and sockets[1]["state"] == net.TCP_TIME_WAIT
    assert sockets[3]["addr"] == "198.18.1.1" and sockets[3]["port"] == 6003
    assert len(sockets) == 4
    with open(os.path.join(fake_proc, "net", "tcp6")) as handle:
        six = net.parse_proc_net_tcp(handle.read())
    assert six[0]["addr"] == "::" and six[0]["port"] == 6001
    assert six[1]["addr"] == "127.0.0.1" and six[1]["state"] == net.TCP_CLOSE


def test_find_port_holder_in_fake_proc(fake_proc):
    holder = net.find_port_holder(6000, fake_proc)
    assert holder["pid"] == 4242 and holder["pids"] == [4242, 4243]
    assert holder["comm"] == "torchrun" and holder["state"] == "LISTEN" and holder["addr"] == "0.0.0.0"
    assert net.describe_holder(6000, holder) == "port 6000 in use by pid 4242 (torchrun)"
    v6 = net.find_port_holder(6001, fake_proc)
    assert (v6["pid"], v6["comm"], v6["addr"]) == (5000, "python3", "::")
    bound = net.find_port_holder(6002, fake_proc, addr="127.0.0.1")
    assert (bound["pid"], bound["state"]) == (5000, "CLOSE")
    hidden = net.find_port_holder(6003, fake_proc)
    assert hidden["pid"] is None and hidden["inode"] == 9999
    assert "not visible" in net.describe_holder(6003, hidden)
    assert net.find_port_holder(6004, fake_proc) is None


def test_mesh_summary_names_the_node_every_peer_times_out_on():
    def row(src, dst, result):
        return {"source": src, "destination": dst, "addr": "198.18.1.%s" % dst[-1], "port": 6000,
                "result": result, "detail": "%s -> %s %s" % (src, dst, result)}

    by_host = {
        "node1": {"results": [row("node1", "node2", "open"), row("node1", "node3", "timeout")]},
        "node2": {"results": [row("node2", "node1", "open"), row("node2", "node3", "timeout")]},
        "node3": [row("node3", "node1", "open"), row("node3", "node2", "open")],
    }
    summary = mesh.mesh_summary(by_host)
    assert summary["port"] == 6000
    assert summary["matrix"]["node2"] == {"node1": "open", "node3": "timeout"}
    assert [(f["source"], f["destination"]) for f in summary["failing"]] == [("node1", "node3"), ("node2", "node3")]
    assert summary["suspect_nodes"] == ["node3"]
    (suspect,) = summary["suspects"]
    assert suspect["direction"] == "inbound" and suspect["peers"] == {"node1": "timeout", "node2": "timeout"}
    assert suspect["message"].startswith("node3 drops port 6000 from every peer")
    assert summary["silent"] == []


def test_mesh_summary_outbound_suspect_and_silent_node():
    def row(src, dst, result):
        return {"source": src, "destination": dst, "addr": "198.18.1.9", "port": 6000, "result": result,
                "detail": ""}

    by_host = {
        "node1": [row("node1", "node2", "timeout"), row("node1", "node3", "timeout"), row("node1", "node4", "open")],
        "node2": [row("node2", "node1", "open"), row("node2", "node3", "open"), row("node2", "node4", "timeout")],
        "node3": [row("node3", "node1", "open"), row("node3", "node2", "open"), row("node3", "node4", "timeout")],
    }
    summary = mesh.mesh_summary(by_host)
    # node4 never reported, and only node1 reached it: nobody is "unreachable by all".
    assert summary["silent"] == ["node4"]
    assert summary["suspect_nodes"] == []
    by_host["node1"][2] = row("node1", "node4", "refused")
    summary = mesh.mesh_summary(by_host)
    assert summary["suspect_nodes"] == ["node1", "node4"]
    kinds = {(item["node"], item["direction"]) for item in summary["suspects"]}
    assert kinds == {("node1", "outbound"), ("node4", "inbound")}
    assert any("node4 returned no probe results" in message for message in summary["messages"])


def test_mesh_summary_two_nodes_one_direction_blames_only_the_destination():
    rows = {
        "node1": [{"source": "node1", "destination": "node2", "port": 6000, "result": "timeout"}],
        "node2": [{"source": "node2", "destination": "node1", "port": 6000, "result": "open"}],
    }
    summary = mesh.mesh_summary(rows)
    assert summary["suspect_nodes"] == ["node2"]
    assert "cannot be told apart from node1 blocking outbound" in summary["messages"][0]
    rows["node1"][0]["result"] = "open"
    summary = mesh.mesh_summary(rows)
    assert summary["suspects"] == [] and summary["failing"] == [] and summary["messages"] == []


# ---------------------------------------------------------------- module

def test_module_runs_in_check_mode(run_module):
    port = free_port()
    result, failed = run_module(port_probe, {
        "listen_addr": NODE1, "port": port, "node_name": "node1",
        "peers": [{"name": "node2", "addr": NODE2}], "window": 1.0, "connect_timeout": 0.3, "token": TOKEN,
    }, check_mode=True)
    assert not failed
    assert result["changed"] is False
    assert result["listen"]["status"] == "ok"
    assert result["checks"]["port_listen"]["status"] == "pass"
    assert result["results"][0]["result"] == "refused"
    assert result["checks"]["port_reach_node2"]["status"] == "fail"
    assert can_listen_again(NODE1, port)


def test_module_in_use_with_fake_proc_root(run_module, tmp_path):
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "tcp").write_text(TCP_HEADER)
    port = free_port()
    holder = socket.socket()
    holder.bind((NODE1, port))
    holder.listen(1)
    try:
        result, failed = run_module(port_probe, {
            "listen_addr": NODE1, "port": port, "node_name": "node1", "check_in_use_only": True,
            "proc_root": str(tmp_path), "window": 1.0, "token": TOKEN,
        }, check_mode=True)
    finally:
        holder.close()
    assert not failed
    # The fake proc root knows no socket on the port: the holder stays unnamed.
    assert result["listen"]["status"] == "in_use" and result["listen"]["holder"] is None
    assert result["checks"]["port_listen"]["status"] == "fail"
    assert "could not be identified" in result["checks"]["port_listen"]["found"]


@pytest.mark.parametrize("args, message", [
    ({"port": 70000}, "port 70000 is out of range"),
    ({"listen_addr": "node1.example"}, "is not an IPv4 address"),
    ({"peers": [{"name": "node2", "addr": "node2.example"}]}, "names are not resolved"),
    ({"peers": [{"name": "node2", "addr": NODE2}, {"name": "node2", "addr": NODE3}]}, "listed twice"),
    ({"window": 0}, "window 0.0 is out of range"),
    ({"connect_timeout": -1}, "connect_timeout"),
])
def test_module_rejects_bad_arguments(run_module, args, message):
    base = {"listen_addr": NODE1, "port": free_port(), "node_name": "node1", "window": 0.5, "token": TOKEN}
    base.update(args)
    result, failed = run_module(port_probe, base)
    assert failed and message in result["msg"]
