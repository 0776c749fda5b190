"""The pre-job gate (preflight.yml) across real nodes of the namespace test bed,
with real faults: a firewalled rendezvous port, a node that stops answering, a
bad interface override, a DOWN or isolated fabric link, a rank killed or
stopped mid-collective, and a throttled link.

One bed serves the whole module (3 nodes, 2 fabric rails, a docker0 bridge
and an administratively DOWN eth1 in every node); every test undoes its fault
in a ``finally`` and the ``clean_bed`` guard checks that no rank, torchrun or
leftover fault survives a test, so later tests see a clean bed.  Every test
asserts on the verdict file the run wrote and that the run ended."""

import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest

from gate_helpers import (cmdline, send_signal, explain, gate_leftovers, gate_processes,
                          node_pid, proc_state, rank_processes, rank_stage)
from playbook import run_playbook
from testbed import testbed_fixture

pytestmark = pytest.mark.timeout(900)

NODES = 3
RANKS_PER_NODE = 2
# A bound on fault injection waits: the gate's ranks show up within this.
APPEAR_TIMEOUT = 300


def bring_up(bed, directory):
    """The gate audits node-to-node SSH trust too: bring the bed's nodes up with the real
    bringup.yml for that capability only (known host keys; the nodes share this machine's /root,
    so no cluster user key)."""
    inventory = bed.write_inventory(path=str(directory / "inventory.yml"))
    result = run_playbook(directory, playbook="bringup.yml", inventory=inventory, timeout=600,
                          extravars={"preflight_bringup_capabilities": ["ssh_trust"]})
    assert result.rc == 0, result.stdout[-3000:]


@pytest.fixture(scope="module")
def bed(request, tmp_path_factory):
    bed = testbed_fixture(request, nodes=NODES, fabric_rails=2, docker_bridge=True,
                          down_iface=True)
    bring_up(bed, tmp_path_factory.mktemp("bringup"))
    return bed


@pytest.fixture(autouse=True)
def clean_bed(bed):
    """After each test: no gate process left on any node, and no fault left behind."""
    yield
    leftovers = gate_leftovers(bed, 20)
    for procs in leftovers.values():
        for pid in procs:
            send_signal(pid, signal.SIGKILL)
    for node in bed.nodes:
        rules = bed.iptables(node, ["-S", "INPUT"]).stdout.split("\n")
        assert [r for r in rules if "DROP" in r] == [], f"{node.name}: firewall rule left behind"
        assert "tbf" not in bed.tc(node, ["qdisc", "show"]).stdout, f"{node.name}: qdisc left behind"
        links = {link["ifname"]: link for link in json.loads(bed.ip(node, ["-j", "link", "show"]).stdout)}
        assert "data0" not in links, f"{node.name}: test interface left behind"
        for ifname in ("eth0", "fab0", "fab1"):
            assert "UP" in links[ifname]["flags"], f"{node.name}: {ifname} left DOWN"
            cable = json.loads(subprocess.run(
                ["ip", "-j", "link", "show", node.interfaces[ifname]], capture_output=True, text=True,
                timeout=10, check=True).stdout)[0]
            assert cable.get("master"), f"{node.name}: {ifname} left detached from its bridge"
    assert not leftovers, f"gate processes left on the nodes: {leftovers}"


# --------------------------------------------------------------------------
# Helpers


def gate(bed, tmp_path, extravars=None, host_vars=None, group_vars=None):
    """Run preflight.yml against the bed; the run must end with a verdict file."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    inventory = bed.write_inventory(host_vars=host_vars, group_vars=group_vars,
                                    path=str(tmp_path / "inventory.yml"))
    result = run_playbook(tmp_path, inventory=inventory, extravars=extravars, timeout=800)
    assert result.status in ("successful", "failed"), (result.status, result.stdout[-3000:])
    assert result.verdict is not None, result.stdout[-3000:]
    return result


def failing(result, host):
    return {name: check for name, check in result.verdict["nodes"][host]["checks"].items()
            if check["status"] == "fail"}


class Watcher(threading.Thread):
    """A thread calling ``act()`` every 50 ms until it returns true, ``halt()`` or APPEAR_TIMEOUT;
    an exception it raises is kept in ``error``."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stop, self.error = threading.Event(), None

    def run(self):
        deadline = time.monotonic() + APPEAR_TIMEOUT
        try:
            while not self.stop.is_set() and time.monotonic() < deadline:
                if self.act():
                    return
                time.sleep(0.05)
        except Exception as exc:  # pylint: disable=broad-except
            self.error = exc

    def act(self):
        raise NotImplementedError

    def halt(self):
        self.stop.set()
        self.join(timeout=30)


class Injector(Watcher):
    """Sends ``sig`` to global rank ``rank`` in ``node`` once that rank has
    worked ``settle`` seconds in ``stage``, while the gate runs in the main thread."""

    def __init__(self, bed, node, rank, sig, stage="bandwidth", settle=1.0):
        super().__init__()
        self.bed, self.node, self.rank, self.sig, self.stage = bed, node, rank, sig, stage
        # Seconds to let the rank work in the stage first (it records a stage
        # before it starts it, so the signal would land in that write).
        self.settle = settle
        self.hit = None  # (host pid, stage seen) once signalled
        self.node_pid = None  # the same process's pid inside the node

    def act(self):
        pid = rank_processes(self.bed, self.node).get(self.rank)
        if pid:
            stage = rank_stage(pid, self.rank)
            if stage == self.stage:
                time.sleep(self.settle)
                self.node_pid = node_pid(pid)
                os.kill(pid, self.sig)
                self.hit = (pid, stage)
                return True
        return False

    def finish(self):
        self.halt()
        assert self.error is None, self.error
        assert self.hit, (f"rank {self.rank} on {self.node.name} was not seen in stage "
                          f"{self.stage} before the gate ended")


# --------------------------------------------------------------------------
# 1. A healthy cluster passes, on the fabric interface


def test_healthy_cluster_passes_on_the_fabric(bed, tmp_path):
    result = gate(bed, tmp_path)
    v = result.verdict
    assert result.rc == 0, explain(result)
    assert v["status"] == "pass"
    names = [node.name for node in bed.nodes]
    assert v["hosts"] == names and v["healthy_hosts"] == names
    assert v["failed_hosts"] == [] and v["unreachable_hosts"] == []

    ar = v["allreduce"]
    assert ar["launched"] is True and ar["status"] == "pass"
    assert ar["world_size"] == NODES * RANKS_PER_NODE
    assert ar["backend"] == "gloo" and ar["correct"] is True
    assert [row["rank"] for row in ar["ranks"]] == list(range(NODES * RANKS_PER_NODE))
    assert [row["host"] for row in ar["ranks"]] == [n for n in names for _ in range(RANKS_PER_NODE)]
    assert all(row["status"] == "ok" and row["stage"] == "done" for row in ar["ranks"])
    assert [row["size_bytes"] for row in ar["sizes"]] == [1048576, 4194304, 16777216]
    assert all(row["algbw_gbps"] > 0 and row["busbw_gbps"] > 0 for row in ar["sizes"])
    assert "localize" not in v, "a healthy run pays no rounds"

    # The fabric, not docker0 (same address on every node), eth1 (DOWN) or eth0 (management).
    master = bed.nodes[0]
    assert ar["socket_ifname"] == "fab0"
    assert ar["master"] == master.name and ar["master_addr"] == master.fabric_addresses[0]
    assert ar["master_port"] == 6000
    for node in bed.nodes:
        checks = v["nodes"][node.name]["checks"]
        assert checks["nic_discovery.common_interface"]["status"] == "pass"
        assert "fab0" in checks["nic_discovery.common_interface"]["found"]
        for name in ("preflight.reachable", "port_mesh.reach", "port_mesh.listen", "allreduce.torch",
                     "allreduce.ranks", "allreduce.correctness", "allreduce.bandwidth"):
            assert checks[name]["status"] == "pass", (node.name, name, checks[name])
        # CPU-only nodes without RDMA devices: the GPU and fabric checks do not apply, and say why (never a warning).
        hardware = {name: check for name, check in checks.items() if name.startswith(("gpu_health.", "fabric."))}
        assert {name.split(".")[0] for name in hardware} == {"gpu_health", "fabric"}, sorted(checks)
        assert all(check["status"] == "not_applicable" and check["found"] for check in hardware.values()), hardware
        assert "no GPU on the PCI bus and no nvidia-smi/amd-smi" in checks["gpu_health.count"]["found"]

    run_dir = os.path.join(result.results_dir, "latest")
    for node in bed.nodes:
        with open(os.path.join(run_dir, f"{node.name}.log"), encoding="utf-8") as handle:
            log = handle.read()
        prefixes = set(re.findall(r"^\[(pfn\d+):(\d+)\]:", log, re.M))
        assert prefixes, f"{node.name}.log has no [host:rank] lines"
        assert {host for host, _ in prefixes} == {node.name}
        assert {int(rank) for _, rank in prefixes} <= set(range(RANKS_PER_NODE))
    with open(os.path.join(run_dir, f"{master.name}.log"), encoding="utf-8") as handle:
        assert f"[{master.name}:0]:preflight: world_size=6 backend=gloo" in handle.read()
    assert not [f for f in os.listdir(run_dir) if f.endswith(".stacks.txt")]
    assert "PREFLIGHT PASS: 3/3 nodes healthy" in result.stdout


# --------------------------------------------------------------------------
# 2. A firewall on one node drops the rendezvous port


def test_dropped_rendezvous_port_names_the_node_before_launch(bed, tmp_path):
    node = bed.nodes[1]
    port = 29517
    rule = ["INPUT", "-p", "tcp", "--dport", str(port), "-j", "DROP"]
    bed.iptables(node, ["-I"] + rule)
    try:
        result = gate(bed, tmp_path, extravars={"preflight_master_port": port})
    finally:
        bed.iptables(node, ["-D"] + rule)
    v = result.verdict
    assert result.rc != 0 and v["status"] == "fail", explain(result)
    assert v["failed_hosts"] == [node.name], explain(result)
    assert sorted(v["healthy_hosts"]) == sorted(n.name for n in bed.nodes if n is not node)
    mesh = v["nodes"][node.name]["checks"]["port_mesh.reach"]
    assert mesh["status"] == "fail"
    assert node.name in mesh["found"] and str(port) in mesh["found"]
    assert "open" in mesh["fix"] and str(port) in mesh["fix"] and node.name in mesh["fix"]
    for other in bed.nodes:
        if other is not node:
            assert v["nodes"][other.name]["checks"]["port_mesh.reach"]["status"] != "fail"
    # The node the mesh blames is left out of the all-reduce; the others are still proven.
    ar = v["allreduce"]
    others = [n.name for n in bed.nodes if n is not node]
    assert ar["launched"] is True and ar["status"] == "pass" and ar["hosts"] == others, explain(result)
    assert ar["world_size"] == len(others) * RANKS_PER_NODE
    run = v["nodes"][node.name]["checks"]["allreduce.run"]
    assert run["status"] == "skipped" and "port mesh blames it" in run["found"]
    assert not os.path.exists(os.path.join(result.results_dir, "latest", f"{node.name}.log"))
    assert f"{node.name} / port_mesh.reach" in result.stdout


class DropWhenLaunched(Watcher):
    """Inserts an INPUT DROP for ``port`` in ``node`` once torchrun shows up there: after the port mesh
    proved the port open, before the rendezvous store listens (torchrun still imports torch)."""

    def __init__(self, bed, node, port):
        super().__init__()
        self.bed, self.node, self.rule = bed, node, ["INPUT", "-p", "tcp", "--dport", str(port), "-j", "DROP"]
        self.inserted = False

    def act(self):
        if any("torch.distributed.run" in " ".join(cmdline(pid)) for pid in gate_processes(self.bed, self.node)):
            self.bed.iptables(self.node, ["-I"] + self.rule)
            self.inserted = True
            return True
        return False

    def finish(self):
        self.halt()
        if self.inserted:
            self.bed.iptables(self.node, ["-D"] + self.rule)
        assert self.error is None, self.error
        assert self.inserted, f"torchrun never started on {self.node.name}"


def test_rendezvous_port_dropped_after_the_mesh_check_names_the_master(bed, tmp_path):
    """The mesh passes, then the master's firewall starts dropping the rendezvous port: every rank times
    out reaching the store.  The verdict names the master and its port, and blames no other node."""
    master = bed.nodes[0]
    port = 29533
    injector = DropWhenLaunched(bed, master, port)
    injector.start()
    try:
        result = gate(bed, tmp_path, extravars={"preflight_master_port": port, "allreduce_timeout": 20})
    finally:
        injector.finish()
    v = result.verdict
    others = [n.name for n in bed.nodes if n is not master]
    assert result.rc != 0 and v["status"] == "fail", explain(result)
    assert v["allreduce"]["master_addr"] in (master.node_addr, *master.fabric_addresses), explain(result)
    for node in bed.nodes:
        assert v["nodes"][node.name]["checks"]["port_mesh.reach"]["status"] == "pass", explain(result)
    assert v["failed_hosts"] == [master.name], explain(result)
    # The others are not blamed: their all-node ranks never ran (unverified), and the pair rounds, on ports
    # of their own, prove them good.
    assert sorted(v["unverified_hosts"]) == sorted(others), explain(result)
    assert set(others) <= set((v.get("localize") or {}).get("good") or ()), v.get("localize")
    rendezvous = v["nodes"][master.name]["checks"]["allreduce.rendezvous"]
    assert rendezvous["status"] == "fail", rendezvous
    assert master.name in rendezvous["found"] and str(port) in rendezvous["found"], rendezvous
    assert "port mesh" in rendezvous["found"], rendezvous
    assert str(port) in rendezvous["fix"] and "iptables" in rendezvous["fix"], rendezvous
    for name in others:
        assert not failing(result, name), explain(result)
    assert v["bound_seconds"] and "Traceback" not in result.stdout


# --------------------------------------------------------------------------
# 3. A node stops answering over SSH


def test_unreachable_node_is_named_and_the_rest_still_get_a_verdict(bed, tmp_path):
    node = bed.nodes[2]
    bed.make_unreachable(node)
    try:
        result = gate(bed, tmp_path)
    finally:
        bed.make_reachable(node)
    v = result.verdict
    others = [n.name for n in bed.nodes if n is not node]
    assert result.rc != 0 and v["status"] == "fail", explain(result)
    assert v["unreachable_hosts"] == [node.name]
    assert v["failed_hosts"] == [node.name], explain(result)
    assert v["healthy_hosts"] == others, explain(result)
    checks = v["nodes"][node.name]["checks"]
    assert checks["preflight.reachable"]["status"] == "fail"
    assert node.name in checks["preflight.reachable"]["found"] and checks["preflight.reachable"]["fix"]
    assert v["nodes"][node.name]["reachable"] is False
    # The others were checked and gated among themselves.
    ar = v["allreduce"]
    assert ar["launched"] is True and ar["status"] == "pass", explain(result)
    assert ar["world_size"] == len(others) * RANKS_PER_NODE
    assert sorted({row["host"] for row in ar["ranks"]}) == others
    for name in others:
        assert v["nodes"][name]["checks"]["preflight.reachable"]["status"] == "pass"
        assert v["nodes"][name]["checks"]["allreduce.ranks"]["status"] == "pass"
    assert "Traceback" not in result.stdout


# --------------------------------------------------------------------------
# 4. An interface override that one node lacks


def test_override_naming_an_interface_one_node_lacks(bed, tmp_path):
    lacking = bed.nodes[2]
    having = [n for n in bed.nodes if n is not lacking]
    # A second data port "data0" on nodes 1 and 2 only (a veth pair inside the node).
    for node in having:
        bed.ip(node, ["link", "add", "data0", "type", "veth", "peer", "name", "data0p"])
    try:
        for node in having:
            bed.ip(node, ["addr", "add", f"198.18.252.{node.index}/24", "dev", "data0"])
            bed.ip(node, ["link", "set", "data0p", "up"])
            bed.ip(node, ["link", "set", "data0", "up"])
        result = gate(bed, tmp_path, group_vars={"preflight_socket_ifname": "data0"})
    finally:
        for node in having:
            bed.ip(node, ["link", "del", "data0"], check=False)
    v = result.verdict
    assert result.rc != 0 and v["status"] == "fail", explain(result)
    assert v["failed_hosts"] == [lacking.name], explain(result)
    override = v["nodes"][lacking.name]["checks"]["nic_discovery.override"]
    assert override["status"] == "fail"
    assert lacking.name in override["found"] and "data0" in override["found"]
    assert override["fix"]
    for node in having:
        assert v["nodes"][node.name]["checks"]["nic_discovery.override"]["status"] != "fail"
    ar = v["allreduce"]
    assert ar["launched"] is False and ar["status"] == "skipped"
    assert "data0" in ar["reason"] and lacking.name in ar["reason"]
    # The mesh never ran on an interface one node lacks; the others are unverified, not blamed.
    for node in bed.nodes:
        assert v["nodes"][node.name]["checks"]["port_mesh.reach"]["status"] == "skipped"
        assert not [name for name in v["nodes"][node.name]["checks"] if name.endswith(".error")]
    assert sorted(v["unverified_hosts"]) == sorted(node.name for node in having)
    assert f"{lacking.name} / nic_discovery.override" in result.stdout


# --------------------------------------------------------------------------
# 5. The first fabric link of one node is DOWN, or up but isolated


def test_down_first_fabric_link_is_skipped_and_the_gate_passes_on_the_next(bed, tmp_path):
    node = bed.nodes[1]
    bed.ip(node, ["link", "set", "fab0", "down"])
    try:
        result = gate(bed, tmp_path)
    finally:
        bed.ip(node, ["link", "set", "fab0", "up"])
    v = result.verdict
    assert result.rc == 0 and v["status"] == "pass", explain(result)
    ar = v["allreduce"]
    assert ar["socket_ifname"] == "fab1"
    assert ar["master_addr"] == bed.nodes[0].fabric_addresses[1]
    assert ar["world_size"] == NODES * RANKS_PER_NODE and ar["correct"] is True
    common = v["nodes"][node.name]["checks"]["nic_discovery.common_interface"]
    assert common["status"] == "pass" and "fab1" in common["found"]


def test_isolated_first_fabric_link_fails_the_mesh_naming_the_node(bed, tmp_path):
    """fab0 of one node is UP with its address but its cable leads nowhere.

    Interface selection reads only local link state, so it still picks fab0;
    the port mesh on fab0 is what catches it, naming the node, before any rank
    starts (the gate fails safe instead of moving on to fab1)."""
    node = bed.nodes[1]
    bed.detach(node, "fab0")
    try:
        result = gate(bed, tmp_path)
    finally:
        bed.attach(node, "fab0")
    v = result.verdict
    assert result.rc != 0 and v["status"] == "fail", explain(result)
    assert v["failed_hosts"] == [node.name], explain(result)
    mesh = v["nodes"][node.name]["checks"]["port_mesh.reach"]
    assert mesh["status"] == "fail" and mesh["found"].startswith(node.name)
    # Told apart from a firewall: nobody's ARP gets an answer from an isolated link, and firewalls pass ARP.
    assert "unreachable" in mesh["found"] and "wrong interface" in mesh["found"], mesh
    assert "firewall DROP" not in mesh["found"] and "not a firewall" in mesh["found"], mesh
    assert "preflight_socket_ifname" in mesh["fix"] and "iptables" not in mesh["fix"], mesh
    for other in bed.nodes:
        if other is not node:
            assert v["nodes"][other.name]["checks"]["port_mesh.reach"]["status"] != "fail"
    ar = v["allreduce"]
    others = [n.name for n in bed.nodes if n is not node]
    assert ar["socket_ifname"] == "fab0"
    assert ar["launched"] is True and ar["status"] == "pass" and ar["hosts"] == others, explain(result)


# --------------------------------------------------------------------------
# 6. SIGKILL of one rank mid-collective


def test_killed_rank_is_named_and_nothing_is_left(bed, tmp_path):
    node = bed.nodes[1]
    rank = RANKS_PER_NODE * 1 + 1  # node 2's second rank
    injector = Injector(bed, node, rank, signal.SIGKILL)
    injector.start()
    try:
        result = gate(bed, tmp_path, extravars={
            "allreduce_sizes": [16777216, 33554432], "allreduce_iters": 20, "allreduce_timeout": 20,
            "allreduce_hard_timeout": 120})
    finally:
        injector.finish()
    v = result.verdict
    assert result.rc != 0 and v["status"] == "fail", explain(result)
    ar = v["allreduce"]
    assert ar["launched"] is True and ar["status"] == "fail"
    assert [(s["host"], s["rank"]) for s in ar["suspects"]] == [(node.name, rank)], explain(result)
    assert "exit code -9" in ar["suspects"][0]["reason"]
    assert v["failed_hosts"] == [node.name], explain(result)
    suspect = v["nodes"][node.name]["checks"][f"allreduce.suspect_rank_{rank}"]
    assert suspect["status"] == "fail" and node.name in suspect["fix"]
    for other in bed.nodes:
        if other is not node:
            assert v["nodes"][other.name]["status"] != "fail"
    for other in bed.nodes:
        assert gate_processes(bed, other) == [], f"{other.name}: gate processes left"


# --------------------------------------------------------------------------
# 7. SIGSTOP of one rank: a hang, bounded, with the stopped rank's stack


def test_stopped_rank_is_named_with_its_state_and_stack(bed, tmp_path):
    node = bed.nodes[2]
    rank = RANKS_PER_NODE * 2  # node 3's first rank
    injector = Injector(bed, node, rank, signal.SIGSTOP)
    injector.start()
    try:
        result = gate(bed, tmp_path, extravars={
            "allreduce_sizes": [16777216, 33554432], "allreduce_iters": 20,
            "allreduce_timeout": 10, "allreduce_hard_timeout": 40})
    finally:
        injector.finish()
        if injector.hit and proc_state(injector.hit[0]) == "T":
            send_signal(injector.hit[0], signal.SIGKILL)
    v = result.verdict
    assert result.rc != 0 and v["status"] == "fail", explain(result)
    ar = v["allreduce"]
    assert [(s["host"], s["rank"]) for s in ar["suspects"]] == [(node.name, rank)], explain(result)
    assert "stopped" in ar["suspects"][0]["reason"]
    assert v["failed_hosts"] == [node.name], explain(result)
    row = next(r for r in ar["ranks"] if r["rank"] == rank)
    assert row["process_state"].startswith("stopped")
    with open(os.path.join(result.results_dir, "latest", f"{node.name}.stacks.txt"),
              encoding="utf-8") as handle:
        stacks = handle.read()
    header = re.search(rf"^== rank {rank} \(pid (\d+), (.*?)\) at stage (\w+) ==$", stacks, re.M)
    assert header, stacks[:3000]
    assert int(header.group(1)) == injector.node_pid  # the very process that was stopped
    assert header.group(2) == "stopped (SIGSTOP)" and header.group(3) == "bandwidth"
    # The stopped rank's own Python stack: stopped inside the timed all-reduce.
    section = stacks[header.end():].split("\n== rank ", 1)[0]
    frames = re.findall(r"^\s+(\S+) \(allreduce_worker\.py:\d+\)$", section, re.M)
    assert "measure" in frames and "main" in frames, section
    for other in bed.nodes:
        assert gate_processes(bed, other) == [], f"{other.name}: gate processes left"


# --------------------------------------------------------------------------
# 8. A throttled link on one node


THROTTLE = ["root", "tbf", "rate", "20mbit", "burst", "32kbit", "latency", "400ms"]
# 20 Mbit/s is 0.0025 GB/s on the wire; unthrottled, the bed's gloo ring moves
# 1 MiB all-reduces at around 0.1 GB/s busbw.  The minimum sits between.
SMALL_GATE = {"allreduce_sizes": [1048576], "allreduce_iters": 3, "allreduce_warmup": 1,
              "allreduce_min_busbw_gbps": 0.02}


def test_throttled_link_fails_the_bandwidth_check_and_the_pair_rounds_name_the_node(bed, tmp_path):
    """One node's fabric egress is throttled to 20 Mbit/s.

    The all-node all-reduce is one ring, so every rank sees the same slow collective and the bandwidth
    check fails on every node; the pair rounds that follow (allreduce.localize) then name the node whose
    link is slow, and only that one: the others pass one more all-node run together (the confirmation run,
    with the same minimum busbw), so their slow first run was collateral and only the named node fails."""
    # The healthy nodes' own all-node run (the confirmation run below) clears the minimum: it sits between.
    node = bed.nodes[1]
    bed.tc(node, ["qdisc", "add", "dev", "fab0"] + THROTTLE)
    try:
        started = time.monotonic()
        result = gate(bed, tmp_path / "throttled", extravars=SMALL_GATE)
        wall = time.monotonic() - started
    finally:
        bed.tc(node, ["qdisc", "del", "dev", "fab0", "root"])
    v = result.verdict
    # The run's own worst case holds, the rounds' and the retest's steps included.
    assert wall <= v["bound_seconds"], (wall, v["bound_seconds"])
    assert result.rc != 0 and v["status"] == "fail", explain(result)
    names = [n.name for n in bed.nodes]
    assert v["failed_hosts"] == [node.name], explain(result)
    assert v["healthy_hosts"] == [name for name in names if name != node.name], explain(result)
    ar = v["allreduce"]
    # The collective itself completed with exact results; only its speed fails.
    assert ar["launched"] is True and ar["status"] == "pass" and ar["correct"] is True
    assert ar["suspects"] == []
    assert ar["sizes"][-1]["busbw_gbps"] < 0.02
    assert ar["confirm"]["status"] == "pass" and ar["confirm"]["sizes"][-1]["busbw_gbps"] >= 0.02, ar["confirm"]
    for name in names:
        expected = {"allreduce.bandwidth", "allreduce.localize"} if name == node.name else set()
        assert failing(result, name).keys() == expected, explain(result)
        check = v["nodes"][name]["checks"]["allreduce.bandwidth"]
        assert name in check["found"] and "1048576 bytes" in check["found"]
        assert check["expected"] == "busbw >= 0.020 GB/s"
        busbw = float(re.search(r"busbw ([\d.]+) GB/s", check["found"]).group(1))
        # The named node keeps its slow all-node run; the others carry the confirmation run's measurement.
        assert (busbw < 0.02) is (name == node.name), check
        if name != node.name:
            first_run = v["nodes"][name]["checks"]["allreduce.first_run"]
            assert first_run["status"] == "pass" and "below" in first_run["found"], first_run
    named = v["nodes"][node.name]["checks"]["allreduce.localize"]
    assert node.name in named["found"] and named["fix"], named
    assert "network fault" in named["found"] and "GB/s" in named["found"], named
    # Retested once before the blame (a slow run), and the fault persisted: drained, never its peers.
    assert v["localize"]["retest"]["failed"] == [node.name], v["localize"]
    assert "Retested once: retest pair" in named["found"] and named["details"]["retest"], named
    assert named["fix"].startswith("drain %s" % node.name), named
    localize = v["localize"]
    assert 1 <= localize["rounds_run"] <= 3 and len(localize["rounds"]) == localize["rounds_run"], localize
    others = [name for name in names if name != node.name]
    # A network fault (it passes alone over lo), the others proven good, none lost or left unproven; the
    # confirmation run proved exactly them, and they are exactly the hostfile's nodes.
    assert localize["bad"] == [node.name] and localize["kinds"] == {node.name: "network"}, localize
    assert localize["good"] == others and localize["lost"] == [] and localize["unproven"] == [], localize
    assert localize["confirm"]["status"] == "pass" and sorted(localize["confirm"]["hosts"]) == others
    for name in others:
        assert v["nodes"][name]["checks"]["allreduce.localize"]["status"] == "pass", explain(result)
    with open(os.path.join(v["run_dir"], "hosts.txt"), encoding="utf-8") as handle:
        assert sorted(line.strip() for line in handle if line.strip()) == others
