"""The gate's ports belong to the allocation (docs/security.md, "Ports"): any local account can listen on the
rendezvous (port mesh) port first.  That is never the node's fault: the node is unverified (blocked) naming the
holder's pid, account and command, never failed, never drained, and its peers are not blamed.  And the gate's own
listener answers only its own run (a per-run token): another program's connection is never counted, and a
listener that does not know the token is never taken for the node.  Needs root (the listener runs as nobody)."""

import os
import pwd
import socket
import subprocess
import threading
import time

import pytest

from preflight_node.net import port_probe
from preflight_node.capabilities.allreduce import port_state
from preflight_node.checks import is_blocked, node_status

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a listener of another account needs root to start")

LISTEN = ("import socket, sys, time\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
          "s.bind(('0.0.0.0', int(sys.argv[1])))\ns.listen(8)\nprint('up', flush=True)\ntime.sleep(60)\n")


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def squatter():
    """``(port, pid)``: nobody listening on a free port first (a user's program, /usr/bin/python3)."""
    port = free_port()
    proc = subprocess.Popen(["runuser", "-u", "nobody", "--", "/usr/bin/python3", "-c", LISTEN, str(port)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    pid = int(subprocess.run(["pgrep", "-u", "nobody", "-f", "%s" % port], capture_output=True, text=True,
                             check=True).stdout.split()[0])
    yield port, pid
    proc.kill()
    proc.wait(10)


def test_a_port_another_account_listens_on_first_blocks_the_node_naming_pid_account_and_command(squatter):
    port, pid = squatter
    result = port_probe.probe("0.0.0.0", port, "n1", peers=[], window=1.0, connect_timeout=0.5)
    check = result["checks"]["port_listen"]
    assert check["status"] != "fail" and is_blocked(check), check
    assert node_status({"port_listen": check}) == "unverified"
    for word in ("pid %d" % pid, "nobody", "/usr/bin/python3 -c"):
        assert word in check["found"], check["found"]
    assert "allocation" in check["fix"] and "kill %d" % pid in check["fix"], check["fix"]


def test_the_master_s_port_held_by_another_account_blocks_the_launch_and_fails_no_node(squatter):
    from cluster_preflight.capabilities.allreduce import _master_port_check
    port, pid = squatter
    state = port_state(port, "/proc")
    assert not state["free"] and state["holder"]["user"] == "nobody" and state["holder"]["pid"] == pid
    checks, blockers = {}, []
    _master_port_check("n1", {"port": state}, {"allreduce_master_port": port}, checks, blockers)
    check = checks["n1"]["master_port"]
    assert check["status"] != "fail" and is_blocked(check) and "nobody" in check["found"], check
    assert blockers, "the launch cannot use the port"


def test_the_mesh_leaves_a_node_whose_port_another_account_holds_unverified_and_blames_no_peer():
    from cluster_preflight.capabilities import port_mesh
    holder = {"pid": 4321, "uid": 65534, "user": "nobody", "cmdline": "python3 -m http.server 6000", "foreign": True}
    listen = {"status": "in_use", "holder": holder, "detail": "held"}

    def probe(node, rows, listen_info=None):
        info = listen_info or {"status": "ok", "detail": "listening", "holder": None}
        return {"results": rows, "listen": info, "incoming": [],
                "checks": {"port_listen": port_probe.listen_check(node, "0.0.0.0", 6000, info)}}

    def row(src, dst, result):
        return {"source": src, "destination": dst, "addr": "198.19.0.%s" % dst[-1], "port": 6000, "result": result,
                "detail": "%s to %s: %s" % (src, dst, result), "connected": result != "timeout"}

    probes = {"n1": probe("n1", [row("n1", "n2", "error"), row("n1", "n3", "open")]),
              "n2": probe("n2", [row("n2", "n1", "open"), row("n2", "n3", "open")], listen),
              "n3": probe("n3", [row("n3", "n1", "open"), row("n3", "n2", "wrong_host")])}
    plan = {"run": True, "hosts": ["n1", "n2", "n3"]}
    report = port_mesh.report(plan, probes)
    assert report["ok"] and report["suspect_nodes"] == [], report
    assert report["held"] == {"n2": "its rendezvous port is held by another account (see port_mesh.listen)"}
    assert is_blocked(report["checks_by_host"]["n2"]["listen"]) and is_blocked(report["checks_by_host"]["n2"]["reach"])
    for peer in ("n1", "n3"):
        assert report["checks_by_host"][peer]["reach"]["status"] == "pass", report["checks_by_host"][peer]


def _listener(port, token, inbound):
    """The gate's probe on n1, listening for ``inbound`` with ``token``, in a thread: its result."""
    out = {}

    def run():
        out.update(port_probe.probe("127.0.0.1", port, "n1", peers=[], window=2.0, connect_timeout=0.5,
                                    inbound=inbound, token=token))
    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.3)
    return thread, out


def test_the_gate_s_listener_answers_only_connections_that_know_this_run_s_token():
    port = free_port()
    thread, out = _listener(port, "t0ken-of-this-run", ["n2"])
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        # What any local program could send: the old line, without the run's token.
        sock.sendall(b"PREFLIGHT n2 n1\n")
        sock.settimeout(2)
        answer = sock.recv(256)
    thread.join(5)
    assert b"OK" not in answer, answer
    assert out["incoming"] == [] and out["misdirected"] == [], out


def test_a_listener_that_does_not_know_the_token_is_never_taken_for_the_node():
    port = free_port()
    impostor = socket.socket()
    impostor.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    impostor.bind(("127.0.0.1", port))
    impostor.listen(4)

    def answer():
        conn, _addr = impostor.accept()
        conn.recv(256)
        conn.sendall(b"OK n2\n")
        conn.close()
    threading.Thread(target=answer, daemon=True).start()
    result = port_probe.probe("127.0.0.1", port, "n1", peers=[{"name": "n2", "addr": "127.0.0.1"}],
                              window=2.0, connect_timeout=1.0, listen=False, token="t0ken-of-this-run")
    impostor.close()
    [row] = result["results"]
    assert row["result"] != "open" and "token" in row["detail"], row
    # The gate's own listener and prober, with the same token, agree.
    port = free_port()
    thread, out = _listener(port, "t0ken-of-this-run", ["n2"])
    ours = port_probe.probe("127.0.0.1", port, "n2", peers=[{"name": "n1", "addr": "127.0.0.1"}], window=1.5,
                            connect_timeout=0.5, listen=False, token="t0ken-of-this-run")
    thread.join(5)
    assert ours["results"][0]["result"] == "open" and out["incoming"] == ["n2"], (ours, out)


def test_the_probe_refuses_to_run_without_a_token():
    problem = port_probe.params_problem({"listen_addr": "127.0.0.1", "port": 6000, "window": 2.0,
                                         "connect_timeout": 1.0, "node_name": "n1", "peers": [], "token": ""})
    assert "token" in problem
