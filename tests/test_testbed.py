"""Tests of the multi-node test bed (tests/testbed.py) against real
namespaces, bridges and sshd: they need root and run in CI as root."""

import ipaddress
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import testbed as tb  # noqa: E402  pylint: disable=wrong-import-position

pytestmark = pytest.mark.skipif(tb.unavailable_reason() is not None,
                                reason=f"test bed unavailable: {tb.unavailable_reason()}")

PYTHON = sys.executable
PORT = 47001
BED_NET = ipaddress.ip_network("198.18.0.0/15")

LISTENER = r"""
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(__import__("sys").argv[1])))
s.listen(16)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(socket.gethostname().encode() + b"\n")
    c.close()
"""

CONNECT = r"""
import socket, sys
try:
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
    print(c.makefile().readline().strip())
except socket.timeout:
    print("timeout")
except ConnectionRefusedError:
    print("refused")
except OSError as exc:
    print("error", exc.errno)
"""


def _wait_line(stream, want, timeout):
    """Read lines from a pipe until one starts with `want` (bounded).

    Reads the raw descriptor, so lines already in a buffer are never missed
    by select(); the bytes after the matching line stay for the next call."""
    fd = stream.fileno()
    deadline = time.monotonic() + timeout
    seen = []
    while True:
        buf = _PENDING.get(stream, b"")
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            _PENDING[stream] = buf
            text = line.decode(errors="replace")
            seen.append(text)
            if text.startswith(want):
                return text, seen
        remaining = deadline - time.monotonic()
        ready = select.select([fd], [], [], max(0.0, remaining))[0] if remaining > 0 else []
        chunk = os.read(fd, 65536) if ready else b""
        if not chunk:
            raise AssertionError(f"no line starting {want!r} within {timeout}s; got {seen!r}")
        _PENDING[stream] = buf + chunk


_PENDING = {}  # keyed by the stream object: fd numbers are reused


def _connect_from(bed, node, addr, timeout=2.0):
    """Result of a TCP connect made inside `node`: a hostname, timeout, refused."""
    proc = bed.run(node, [PYTHON, "-c", CONNECT, addr, str(PORT), str(timeout)],
                   timeout=timeout + 15, check=True)
    return proc.stdout.strip()


def _leftovers(runid):
    netns = [n for n in tb._netns_list() if n.startswith(f"pft-{runid}-")]
    links = [n for n in tb._link_names() if n.startswith(f"pft{runid}")]
    return netns, links


def _live(pids):
    return [p for p in pids if tb._proc_state(p) not in (None, "Z", "X")]


def _procs_mentioning(text):
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and tb._proc_state(int(entry)) not in (None, "Z", "X"):
            found.append((int(entry), cmdline))
    return found


@pytest.fixture(scope="module")
def bed(request):
    return tb.testbed_fixture(
        request, nodes=3, fabric_rails=2, docker_bridge=True, down_iface=[1],
        isolate={3: ["fab1"]}, host_vars={1: {"testbed_extra": "one"}},
        group_vars={"testbed_group_var": 42})


@pytest.fixture(scope="module")
def listeners(bed):
    """A TCP listener on PORT in every node that answers with its hostname."""
    procs = []
    for node in bed.nodes:
        proc = bed.spawn(node, [PYTHON, "-c", LISTENER, str(PORT)])
        procs.append(proc)
        _wait_line(proc.stdout, "ready", 20)
    yield procs
    for node in bed.nodes:
        bed.run(node, ["pkill", "-f", f"{PORT}$"], timeout=10)
    for proc in procs:
        proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.timeout(120)
def test_nodes_have_distinct_hostnames_over_real_ssh(bed):
    names = []
    for node in bed.nodes:
        proc = bed.ssh(node, ["sh", "-c", "hostname; cat /etc/hostname"], check=True)
        live, etc = proc.stdout.split()
        assert live == etc == node.hostname
        names.append(live)
    assert names == ["pfn1", "pfn2", "pfn3"]
    # The same session through the fabric address, with the same host key.
    assert bed.ssh(bed.nodes[1], ["hostname"], address=bed.nodes[1].fabric_address,
                   check=True).stdout.strip() == "pfn2"


@pytest.mark.timeout(60)
def test_addresses_stay_in_the_benchmark_range(bed):
    for node in bed.nodes:
        for addr in [node.address] + node.fabric_addresses:
            assert ipaddress.ip_address(addr) in BED_NET
        assert node.port == 22
        assert node.fabric_address == node.fabric_addresses[0]
        assert all(len(name) <= 15 for name in node.interfaces.values())
        assert node.namespace in tb._netns_list()


@pytest.mark.timeout(60)
def test_host_key_checking_rejects_a_wrong_key(bed, tmp_path):
    with open(bed.known_hosts, encoding="ascii") as handle:
        lines = handle.read().splitlines()
    key_of_pfn2 = lines[1].split(" ", 1)[1]
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"{bed.nodes[0].address} {key_of_pfn2}\n", encoding="ascii")
    argv = bed.ssh_argv(bed.nodes[0], ["true"], options=[f"UserKnownHostsFile={wrong}"])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 255
    assert "Host key verification failed" in proc.stderr


@pytest.mark.timeout(60)
def test_sshd_is_pid_1_and_process_tables_are_private(bed):
    node1, node2 = bed.nodes[0], bed.nodes[1]
    assert bed.ssh(node1, ["ps", "-o", "comm=", "-p", "1"], check=True).stdout.strip() == "sshd"
    sleeper = bed.spawn(node1, ["sleep", "3600"])
    try:
        deadline = time.monotonic() + 10
        inner = ""
        while not inner and time.monotonic() < deadline:
            inner = bed.run(node1, ["pgrep", "-x", "sleep"]).stdout.strip()
        assert inner, "sleep did not show up in pfn1"
        assert bed.run(node2, ["pgrep", "-x", "sleep"]).stdout.strip() == ""
        host_side = [p for p in bed.host_pids(node1) if tb._nspid(p)[-1:] == [int(inner)]]
        assert host_side and not set(host_side) & set(bed.host_pids(node2))
        assert node1.host_pid in bed.host_pids(node1)
    finally:
        bed.run(node1, ["kill", inner])
        sleeper.wait(timeout=10)
        sleeper.stdout.close()
        sleeper.stderr.close()


@pytest.mark.timeout(120)
def test_tcp_between_nodes_over_mgmt_and_fabric(bed, listeners):
    assert len(listeners) == 3
    node1, node2, node3 = bed.nodes
    assert _connect_from(bed, node1, node2.address) == "pfn2"
    assert _connect_from(bed, node1, node2.fabric_addresses[0]) == "pfn2"
    assert _connect_from(bed, node1, node2.fabric_addresses[1]) == "pfn2"
    assert _connect_from(bed, node3, node1.fabric_addresses[0]) == "pfn1"
    # The controller reaches every node on the management network.
    with socket.create_connection((node3.address, PORT), timeout=5) as conn:
        assert conn.makefile().readline().strip() == "pfn3"


@pytest.mark.timeout(120)
def test_isolated_link_reaches_nobody(bed, listeners):
    assert listeners
    node1, _, node3 = bed.nodes
    link = bed.ip(node3, ["-j", "link", "show", "fab1"]).stdout
    assert "UP" in json.loads(link)[0]["flags"]
    assert _connect_from(bed, node3, node1.fabric_addresses[1], timeout=1.5) in (
        "timeout", "error 113")
    assert _connect_from(bed, node1, node3.fabric_addresses[1], timeout=1.5) in (
        "timeout", "error 113")


@pytest.mark.timeout(60)
def test_nic_layout_for_selection_tests(bed):
    links = {e["ifname"]: e for e in json.loads(bed.ip(bed.nodes[0], ["-j", "addr"]).stdout)}
    assert {"lo", "eth0", "fab0", "fab1", "docker0", "vethdocker0", "eth1"} <= set(links)
    assert links["eth0"]["operstate"] == "UP"
    assert links["docker0"]["operstate"] == "UP"
    assert [a["local"] for a in links["docker0"]["addr_info"] if a["family"] == "inet"] == [
        "198.18.254.1"]
    assert "UP" not in links["eth1"]["flags"]
    assert [a["local"] for a in links["eth1"]["addr_info"] if a["family"] == "inet"] == [
        "198.18.253.1"]
    # down_iface was asked for node 1 only; /sys shows the node's own links.
    others = bed.run(bed.nodes[1], ["ls", "/sys/class/net"], check=True).stdout.split()
    assert "eth1" not in others and "fab1" in others and "docker0" in others
    route = bed.ip(bed.nodes[0], ["route", "get", bed.nodes[1].fabric_address]).stdout
    assert "dev fab0" in route


@pytest.mark.timeout(60)
def test_etc_is_private_per_node(bed):
    node1, node2 = bed.nodes[0], bed.nodes[1]
    rel = "sysctl.d/99-pft-probe.conf"
    bed.ssh(node1, f"echo kernel.pft_probe=1 > /etc/{rel}", check=True)
    with open(os.path.join(bed.etc_path(node1), rel), encoding="ascii") as handle:
        assert handle.read() == "kernel.pft_probe=1\n"
    assert bed.run(node1, ["cat", f"/etc/{rel}"], check=True).stdout == "kernel.pft_probe=1\n"
    assert bed.ssh(node2, ["test", "-e", f"/etc/{rel}"]).returncode == 1
    assert not os.path.exists(os.path.join(bed.etc_path(node2), rel))
    assert not os.path.exists(f"/etc/{rel}")
    hosts = bed.ssh(node2, ["getent", "hosts", "pfn3"], check=True).stdout.split()
    assert hosts == [bed.nodes[2].address, "pfn3"]
    ids = {bed.run(n, ["cat", "/etc/machine-id"], check=True).stdout for n in bed.nodes}
    assert len(ids) == 3


def test_a_name_no_node_knows_fails_at_once_instead_of_waiting_for_dns(bed):
    """The host's nameserver is out of the bridge's reach: a node's own resolver answers (fails) at once."""
    started = time.monotonic()
    found = bed.run(bed.nodes[0], ["getent", "ahosts", "no-such-node.invalid"])
    assert found.returncode == 2 and found.stdout == ""
    assert time.monotonic() - started < 5, "a lookup waited for an unreachable nameserver"


@pytest.mark.timeout(120)
def test_iptables_drop_in_one_node_blocks_tcp_with_a_timeout(bed, listeners):
    assert listeners
    node1, node2 = bed.nodes[0], bed.nodes[1]
    rule = ["INPUT", "-p", "tcp", "--dport", str(PORT), "-j", "DROP"]
    bed.iptables(node2, ["-I"] + rule)
    try:
        assert _connect_from(bed, node1, node2.address, timeout=1.5) == "timeout"
        assert _connect_from(bed, node1, node2.fabric_address, timeout=1.5) == "timeout"
        with pytest.raises(socket.timeout):
            socket.create_connection((node2.address, PORT), timeout=1.5)
        # Only pfn2's firewall changed: pfn3 still answers.
        assert _connect_from(bed, node1, bed.nodes[2].address) == "pfn3"
    finally:
        bed.iptables(node2, ["-D"] + rule)
    assert _connect_from(bed, node1, node2.address) == "pfn2"


@pytest.mark.timeout(60)
def test_tc_qdisc_in_a_node(bed):
    node = bed.nodes[0]
    bed.tc(node, ["qdisc", "add", "dev", "fab0", "root", "tbf", "rate", "100mbit",
                  "burst", "64kb", "latency", "50ms"])
    try:
        assert "tbf" in bed.tc(node, ["qdisc", "show", "dev", "fab0"]).stdout
        assert "tbf" not in bed.tc(bed.nodes[1], ["qdisc", "show", "dev", "fab0"]).stdout
    finally:
        bed.tc(node, ["qdisc", "del", "dev", "fab0", "root"])


@pytest.mark.timeout(120)
def test_training_python_with_torch_runs_inside_a_node(bed):
    proc = bed.ssh(bed.nodes[2], [tb.TRAINING_PYTHON, "-c",
                                  "import socket, torch; print(socket.gethostname(), "
                                  "torch.distributed.is_available())"],
                   timeout=90, check=True)
    assert proc.stdout.split() == ["pfn3", "True"]


@pytest.mark.timeout(60)
def test_inventory_has_the_nodes_and_strict_host_keys(bed):
    yaml = pytest.importorskip("yaml")
    with open(bed.inventory_path, encoding="utf-8") as handle:
        inventory = yaml.safe_load(handle)
    group = inventory["all"]["children"]["cluster"]
    assert list(group["hosts"]) == ["pfn1", "pfn2", "pfn3"]
    assert group["vars"] == {"testbed_group_var": 42}
    for node in bed.nodes:
        hostvars = group["hosts"][node.name]
        assert hostvars["ansible_host"] == node.address
        assert hostvars["ansible_user"] == "root"
        assert hostvars["ansible_ssh_private_key_file"] == bed.ssh_key
        assert hostvars["ansible_ssh_common_args"] == (
            f"-o UserKnownHostsFile={bed.known_hosts} -o StrictHostKeyChecking=yes")
        assert hostvars["ansible_python_interpreter"] == tb.TRAINING_PYTHON
        assert hostvars["preflight_training_python"] == tb.TRAINING_PYTHON
        assert hostvars["preflight_node_addr"] == node.fabric_address
    assert group["hosts"]["pfn1"]["testbed_extra"] == "one"
    assert "testbed_extra" not in group["hosts"]["pfn2"]
    with open(bed.known_hosts, encoding="ascii") as handle:
        first = handle.readline().split()
    assert first[0].split(",")[:2] == ["pfn1", bed.nodes[0].address]


@pytest.mark.timeout(180)
def test_ansible_ping_reaches_every_node_over_ssh(bed):
    proc = subprocess.run(
        ["ansible", "-i", bed.inventory_path, "cluster", "-m", "ansible.builtin.ping"],
        cwd=tb.ROOT, env=bed.ansible_env(), capture_output=True, text=True, timeout=150,
        check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    answered = set(re.findall(r"^(\S+) \| SUCCESS", proc.stdout, re.M))
    assert answered == {"pfn1", "pfn2", "pfn3"}
    # ansible.cfg renders results as YAML; accept JSON too.
    assert len(re.findall(r'"?ping"?: "?pong"?', proc.stdout)) == 3


@pytest.mark.timeout(180)
def test_second_bed_coexists_and_teardown_leaves_nothing(bed):
    other = tb.Testbed(nodes=2, fabric=True, docker_bridge=True, down_iface=True)
    try:
        other.up()
        assert other.slot != bed.slot
        ours = {ipaddress.ip_network(f"{a}/24", strict=False)
                for n in bed.nodes for a in [n.address] + n.fabric_addresses}
        theirs = {ipaddress.ip_network(f"{a}/24", strict=False)
                  for n in other.nodes for a in [n.address] + n.fabric_addresses}
        assert not ours & theirs
        assert other.ssh(other.nodes[1], ["hostname"], check=True).stdout.strip() == "pfn2"

        # Faults: an unreachable node times out, a stopped one refuses.
        node1, node2 = other.nodes
        other.make_unreachable(node1)
        with pytest.raises(socket.timeout):
            socket.create_connection((node1.address, 22), timeout=1.5)
        other.make_reachable(node1)
        socket.create_connection((node1.address, 22), timeout=5).close()
        other.ssh(node2, "echo kept > /etc/pft-reboot-probe", check=True)
        old_init = node2.host_pid
        other.stop_sshd(node2)
        assert other.host_pids(node2) == []
        assert _live([old_init]) == []
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((node2.address, 22), timeout=5)
        other.start_sshd(node2)
        assert other.ssh(node2, ["cat", "/etc/pft-reboot-probe"],
                         check=True).stdout == "kept\n"

        # Leave a process inside a node and an ssh ControlPersist master behind.
        other.spawn(node1, ["sleep", "3600"], stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL)
        master = other.ssh_argv(node1, ["true"], options=[
            "ControlMaster=auto", f"ControlPath={other.cp_dir}/%C", "ControlPersist=120"])
        subprocess.run(master, capture_output=True, timeout=30, check=True)
        assert _procs_mentioning(other.cp_dir)
        runid, workdir, cp_dir = other.runid, other.workdir, other.cp_dir
        pids = other.host_pids(node1) + other.host_pids(node2)
        assert _leftovers(runid) != ([], [])
    finally:
        other.down()
    assert _leftovers(runid) == ([], [])
    assert _live(pids) == []
    assert _procs_mentioning(workdir) == [] and _procs_mentioning(cp_dir) == []
    assert not os.path.exists(workdir) and not os.path.exists(cp_dir)
    assert not os.path.exists(tb._state_path(runid))
    # The first bed is untouched by the second one's teardown.
    assert bed.ssh(bed.nodes[0], ["hostname"], check=True).stdout.strip() == "pfn1"


@pytest.mark.timeout(180)
def test_next_start_removes_the_bed_of_a_killed_run():
    cli = subprocess.Popen(  # pylint: disable=consider-using-with
        [PYTHON, os.path.join(tb.ROOT, "tests", "testbed.py"), "up", "--nodes", "2",
         "--fabric"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        line, seen = _wait_line(cli.stdout, "inventory:", 60)
        runid = next(s.split()[1] for s in seen if s.startswith("runid:"))
        with open(tb._state_path(runid), encoding="utf-8") as handle:
            state = json.load(handle)
        pids = [p for ns in state["namespaces"] for p in tb._netns_pids(ns)]
        assert pids
    finally:
        cli.kill()  # SIGKILL: no teardown runs
        cli.wait(timeout=10)
        cli.stdout.close()
    assert os.path.exists(line.split()[1])
    assert _leftovers(runid)[0], "the killed run's namespaces should still exist"
    status = subprocess.run([PYTHON, os.path.join(tb.ROOT, "tests", "testbed.py"), "status"],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    assert re.search(rf"^{runid}: .*DEAD", status, re.M)

    with tb.Testbed(nodes=1) as fresh:
        assert fresh.ssh(fresh.nodes[0], ["hostname"], check=True).stdout.strip() == "pfn1"
        assert _leftovers(runid) == ([], [])
        assert _live(pids) == []
        assert not os.path.exists(tb._state_path(runid))
        assert not os.path.exists(state["workdir"])
        fresh_runid = fresh.runid
    assert _leftovers(fresh_runid) == ([], [])


@pytest.mark.timeout(180)
def test_down_all_removes_a_bed_whose_owner_is_dead():
    stale = tb.Testbed(nodes=1)
    stale.up()
    runid, pids = stale.runid, stale.host_pids(stale.nodes[0])
    try:
        dead = subprocess.Popen(["true"])  # pylint: disable=consider-using-with
        dead.wait(timeout=10)
        path = tb._state_path(runid)
        with open(path, encoding="utf-8") as handle:
            state = json.load(handle)
        state["owner_pid"], state["owner_start"] = dead.pid, None
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(state, handle)
        out = subprocess.run([PYTHON, os.path.join(tb.ROOT, "tests", "testbed.py"), "down",
                              "--all"], capture_output=True, text=True, timeout=60,
                             check=True).stdout
        assert f"removed {runid}" in out
        assert _leftovers(runid) == ([], [])
        assert _live(pids) == []
    finally:
        stale.down()  # already gone: must not fail or touch anything else
    assert not os.path.exists(stale.workdir or "/nonexistent")


@pytest.mark.timeout(60)
def test_sigterm_makes_the_cli_tear_down():
    cli = subprocess.Popen(  # pylint: disable=consider-using-with
        [PYTHON, os.path.join(tb.ROOT, "tests", "testbed.py"), "up", "--nodes", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        _, seen = _wait_line(cli.stdout, "inventory:", 60)
        runid = next(s.split()[1] for s in seen if s.startswith("runid:"))
        cli.send_signal(signal.SIGTERM)
        _wait_line(cli.stdout, "down", 30)
        assert cli.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(timeout=10)
        cli.stdout.close()
    assert _leftovers(runid) == ([], [])
    assert not os.path.exists(tb._state_path(runid))
