"""Retest before blame in the node probes: an ssh of the ssh_trust mesh that timed out is tried once more
(module_utils/preflight_node/ssh/mesh.py, switched by preflight_retest_ssh through
cluster_preflight/stages/decisions.py),
one refused or denied never is; a port-mesh pair not connected within the window is tried once more after a
pause (module_utils/preflight_node/net/port_probe.py, preflight_retest_port_mesh), over real sockets on 127.0.0.x."""

import socket
import threading
import time

import pytest

from preflight_node.net import port_probe
from preflight_node.ssh import mesh as ssh_mesh
from preflight_node.capabilities import ssh_trust_probe
from fake_ops import FakeOps

PEERS = [{"node": "n2", "targets": ["n2"], "port": 22}]
TIMED_OUT = (124, "", "")
REFUSED = (255, "", "ssh: connect to host n2 port 22: Connection refused")


@pytest.fixture(autouse=True)
def no_pause(monkeypatch):
    monkeypatch.setattr(ssh_mesh, "RETRY_PAUSE", 0)


def _ops(*answers):
    queue = list(answers)

    def ssh(argv):
        return queue.pop(0) if len(queue) > 1 else queue[0]
    return FakeOps(programs={"ssh": "/usr/bin/ssh"}, commands={("/usr/bin/ssh", "-n"): ssh,
                                                               ("/usr/bin/ssh", "-G"): (0, "", "")})


def _probe(ops, retry):
    report = ssh_trust_probe.probe({"source": "n1", "peers": PEERS, "keyscan": False, "pdsh": "never",
                                    "retry_timeouts": retry}, ops)
    return report["results"][0], [call for call in ops.calls if call[1] == "-n"]


def test_a_timeout_that_clears_is_retried_once_and_passes_saying_so():
    row, calls = _probe(_ops(TIMED_OUT, (0, "", "")), retry=True)
    assert row["status"] == "ok" and len(calls) == 2
    assert row["retried"]["status"] == "timeout" and "retried once" in row["stderr"]


def test_a_timeout_that_persists_is_a_timeout_whose_finding_says_retried():
    row, calls = _probe(_ops(TIMED_OUT), retry=True)
    assert row["status"] == "timeout" and len(calls) == 2
    assert row["stderr"].splitlines()[-1].endswith("retried once after 0 s: timed out again")


def test_refused_is_never_retried_and_retry_off_tries_once():
    row, calls = _probe(_ops(REFUSED, (0, "", "")), retry=True)
    assert row["status"] == "refused" and len(calls) == 1 and "retried" not in row
    row, calls = _probe(_ops(TIMED_OUT, (0, "", "")), retry=False)
    assert row["status"] == "timeout" and len(calls) == 1 and "retried" not in row


@pytest.mark.parametrize("switch", [True, False])
def test_the_stages_hand_the_run_wide_switch_to_the_ssh_probe(switch):
    from capability_helpers import role_settings  # pylint: disable=import-outside-toplevel
    from cluster_preflight.stages import decisions as stages  # pylint: disable=import-outside-toplevel
    from cluster_preflight.stages.view import ClusterView  # pylint: disable=import-outside-toplevel
    names = ["n1", "n2"]
    hostvars = {host: {"preflight_settings": {"settings": {
        "ssh_trust": role_settings("ssh_trust"), "preflight": {"preflight_retest_ssh": switch}},
        "node": {"name": host, "node_addr": "198.18.0.%d" % index, "ssh_host": host, "aliases": []}},
        "preflight_facts": {"facts": {}, "errors": {}}} for index, host in enumerate(names)}
    view = ClusterView({"ansible_play_hosts_all": names, "hostvars": hostvars})
    args = stages._probe_args(view, names, {}, None)  # pylint: disable=protected-access
    assert args["n1"]["ssh_trust"]["retry_timeouts"] is switch
    assert args["n1"]["ssh_trust"]["peers"][0]["node"] == "n2"


# --------------------------------------------------------------------------
# The port mesh: a pair not connected within the window is tried once more, after a pause, before blame

WINDOW, CONNECT = 0.6, 0.3


def _free_port(addr):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((addr, 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def _late_listener(addr, port, name, delay):
    """A peer's listener that comes up only ``delay`` seconds from now and answers one preflight probe."""
    ready = threading.Event()

    def serve():
        time.sleep(delay)
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((addr, port))
        server.listen(4)
        server.settimeout(3)
        ready.set()
        try:
            conn, _peer = server.accept()
            # The gate's answer: its name and the proof that it knows the run's token (here the empty one).
            _word, sender, _to, nonce, _proof = conn.recv(256).decode("ascii").split()
            conn.sendall(("OK %s %s\n" % (name, port_probe.proof("", "answer", name, sender, nonce))).encode("ascii"))
            conn.close()
        except OSError:
            pass
        finally:
            server.close()
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread, ready


@pytest.mark.parametrize("retry", [True, False])
def test_a_peer_that_comes_up_just_after_the_window_is_reached_on_the_retry_only(retry):
    addr = "127.0.0.%d" % (60 + retry)
    port = _free_port(addr)
    thread, _ready = _late_listener(addr, port, "late", WINDOW + 0.1)
    started = time.monotonic()
    result = port_probe.probe("127.0.0.59", port, "node1", [{"name": "late", "addr": addr}], window=WINDOW,
                              connect_timeout=CONNECT, listen=False, retry=retry)
    took = time.monotonic() - started
    thread.join(5)
    row = result["results"][0]
    if retry:
        assert row["result"] == "open" and row["retried"]["result"] == "refused", row
        assert "retried once after" in row["detail"] and result["checks"]["port_reach_late"]["status"] == "pass"
        assert took <= WINDOW + port_probe.retry_slack(CONNECT) + 1.0
    else:
        assert row["result"] == "refused" and "retried" not in row and "retried" not in row["detail"]
        assert took <= WINDOW + 1.0


def test_a_pair_that_stays_closed_is_blamed_after_its_retry_saying_so():
    addr = "127.0.0.62"
    port = _free_port(addr)
    result = port_probe.probe("127.0.0.59", port, "node1", [{"name": "gone", "addr": addr}], window=WINDOW,
                              connect_timeout=CONNECT, listen=False, retry=True)
    row = result["results"][0]
    assert row["result"] == "refused" and row["retried"]["result"] == "refused"
    check = result["checks"]["port_reach_gone"]
    assert check["status"] == "fail" and "retried once after" in check["found"]


def test_the_mesh_plan_with_retry_waits_for_it():
    from cluster_preflight.stages import decisions as stages  # pylint: disable=import-outside-toplevel
    mesh = {"run": True, "wait_timeout": 38, "async_seconds": 38, "args_by_host": {
        "n1": {"connect_timeout": 2, "window": 8}, "n2": {"connect_timeout": 2, "window": 8}}}
    out = stages.mesh_with_retry(mesh)
    assert all(args["retry"] for args in out["args_by_host"].values())
    assert out["wait_timeout"] == 38 + 3 and out["async_seconds"] == out["wait_timeout"]
    assert "retry" not in mesh["args_by_host"]["n1"], "the plan it was given is left as it was"
