"""Never drain a healthy node: one sick node, or a second gate on the same nodes, on the namespace test bed.

Each test is one run of ``preflight.yml`` (two at once for the collision) on one shared bed of four nodes,
with the fault injected while the gate runs:

* its link throttled (``tc tbf``) so hard that the all-node all-reduce cannot finish within the hard timeout:
  the bandwidth stage's deadline (the sizes at the floor busbw, plus start-up) ends it as *slow* long before,
  the pair rounds name the node, and one more all-node run over the other three proves them;
* every rank it starts held stopped (SIGSTOP), in the all-node run and in every round: the gate ends a run
  whose rank stays stopped, the node's own run over ``lo`` fails too (a node fault), the others are proven.

In both, only the sick node is in ``failed_hosts``; the others are healthy and are exactly the hostfile.

* two gates started a second apart: the first holds the nodes (its run lock) and passes, the second reports
  every node busy (which run, since when, from which controller) and fails none;
* a gate SIGKILLed while its ranks run (its whole process group): the next gate takes over the dead run's
  lock at once, ends what it left on the nodes, and passes.
"""

import os
import signal
import subprocess
import threading
import time

import pytest

from cluster_preflight.outputs import history
from gate_helpers import (assert_no_gate_processes, clear_throttles, explain, rank_processes, send_signal,
                          trusted_bed)
from playbook import run_playbook

pytestmark = pytest.mark.timeout(900)

NODES = 4
# Correctness (4 MiB) passes well within the collective timeout at 8 Mbit/s, but seven 4 MiB collectives do not
# finish within the hard timeout: only the bandwidth deadline (about 5 s at the 0.01 GB/s floor, plus 3 s) ends it.
HARD_THROTTLE = ["root", "tbf", "rate", "8mbit", "burst", "32kbit", "latency", "400ms"]
GATE = {"allreduce_sizes": [4194304], "allreduce_iters": 5, "allreduce_warmup": 2, "allreduce_timeout": 20,
        "allreduce_hard_timeout": 45, "allreduce_slow_grace": 3, "allreduce_floor_busbw_gbps_gloo": 0.01}
STOP_GATE = {"allreduce_sizes": [1048576], "allreduce_iters": 3, "allreduce_warmup": 1, "allreduce_timeout": 10,
             "allreduce_hard_timeout": 60, "allreduce_slow_grace": 3}


@pytest.fixture(scope="module")
def bed(request, tmp_path_factory):
    return trusted_bed(request, tmp_path_factory, nodes=NODES)


@pytest.fixture(autouse=True)
def clean_bed(bed):
    yield
    clear_throttles(bed)
    assert_no_gate_processes(bed)


def gate(bed, tmp_path, extravars):
    tmp_path.mkdir(parents=True, exist_ok=True)
    inventory = bed.write_inventory(path=str(tmp_path / "inventory.yml"))
    started = time.monotonic()
    result = run_playbook(tmp_path, inventory=inventory, extravars=extravars, timeout=800)
    assert result.verdict is not None, result.stdout[-3000:]
    assert "Traceback" not in result.stdout
    return result, time.monotonic() - started


def hostfile_hosts(verdict):
    with open(os.path.join(verdict["run_dir"], "hosts.txt"), encoding="utf-8") as handle:
        return [line.strip() for line in handle if line.strip()]


def assert_only_the_sick_node_fails(result, sick, names):
    verdict = result.verdict
    others = [name for name in names if name != sick]
    assert result.rc != 0 and verdict["status"] == "fail", explain(result)
    assert verdict["failed_hosts"] == [sick], explain(result)
    assert verdict["healthy_hosts"] == others and verdict["unverified_hosts"] == [], explain(result)
    assert hostfile_hosts(verdict) == others
    localize = verdict["localize"]
    # Named by the rounds, or by the all-node run's own evidence (a rank held stopped) and left out of them.
    assert localize["bad"] == [sick] or list(localize["excluded"]) == [sick], explain(result)
    assert localize["good"] == others, explain(result)
    assert localize["confirm"]["status"] == "pass" and localize["confirm"]["hosts"] == others, localize["confirm"]
    confirm = verdict["allreduce"]["confirm"]
    assert confirm["status"] == "pass" and confirm["world_size"] == len(others) * 2, confirm
    assert confirm["master_port"] == verdict["allreduce"]["master_port"], "the confirmation uses the run's port"
    for name in others:
        checks = verdict["nodes"][name]["checks"]
        assert checks["allreduce.first_run"]["status"] == "pass", checks["allreduce.first_run"]
        assert sick in checks["allreduce.first_run"]["found"]
        assert checks["allreduce.ranks"]["status"] == "pass" and checks["allreduce.localize"]["status"] == "pass"
        assert not [key for key in checks if key.startswith("allreduce.suspect_rank_")], checks.keys()
    if localize["bad"]:
        named = verdict["nodes"][sick]["checks"]["allreduce.localize"]
        assert named["status"] == "fail" and sick in named["found"] and named["fix"].startswith("drain %s" % sick)
    return verdict


def test_a_node_throttled_so_hard_the_all_node_run_cannot_finish_fails_alone_and_fast(bed, tmp_path):
    sick = bed.nodes[1]
    names = [node.name for node in bed.nodes]
    bed.tc(sick, ["qdisc", "add", "dev", "eth0"] + HARD_THROTTLE)
    try:
        result, wall = gate(bed, tmp_path, GATE)
    finally:
        bed.tc(sick, ["qdisc", "del", "dev", "eth0", "root"], check=False)
    verdict = assert_only_the_sick_node_fails(result, sick.name, names)
    first = verdict["allreduce"]
    assert first["status"] == "fail" and {row["status"] for row in first["ranks"]} <= {"slow", "error", "hung"}
    slow = [row for row in first["ranks"] if row["status"] == "slow"]
    assert slow, explain(result)
    assert all(row["slow"]["busbw_reached_gbps"] < 0.01 for row in slow), slow
    assert verdict["localize"]["kinds"] == {sick.name: "network"}, verdict["localize"]
    assert "was slow" in verdict["localize"]["trigger"]
    print("\nhard throttle: verdict in %.1f s; %d round(s); localisation %s s; deadline %.1f s" % (
        wall, verdict["localize"]["rounds_run"], verdict["localize"]["elapsed_seconds"],
        slow[0]["slow"]["deadline_seconds"]))


class StopRanks(object):
    """Holds every rank ``node`` starts stopped (SIGSTOP) until :meth:`stop`: a sick node, in every run."""

    def __init__(self, bed, node):
        self.bed, self.node, self.stopped = bed, node, set()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while not self.done.is_set():
            for pid in rank_processes(self.bed, self.node).values():
                if pid not in self.stopped:
                    send_signal(pid, signal.SIGSTOP)
                    self.stopped.add(pid)
            time.sleep(0.05)

    def stop(self):
        self.done.set()
        self.thread.join(10)


def test_a_node_whose_every_rank_is_stopped_is_named_and_its_peers_are_proven(bed, tmp_path):
    sick = bed.nodes[2]
    names = [node.name for node in bed.nodes]
    stopper = StopRanks(bed, sick)
    try:
        result, wall = gate(bed, tmp_path, STOP_GATE)
    finally:
        stopper.stop()
    assert stopper.stopped, "no rank of %s was ever seen" % sick.name
    verdict = assert_only_the_sick_node_fails(result, sick.name, names)
    # Every rank of the node held stopped: the all-node run names it by that evidence, the rounds go over the rest.
    assert "process stopped" in verdict["localize"]["excluded"][sick.name], verdict["localize"]
    suspects = {item["host"] for item in verdict["allreduce"]["suspects"]}
    assert suspects == {sick.name}, verdict["allreduce"]["suspects"]
    stopped = [name for name, check in verdict["nodes"][sick.name]["checks"].items()
               if name.startswith("allreduce.suspect_rank_") and check["status"] == "fail"]
    assert stopped, explain(result)
    print("\nstopped ranks: verdict in %.1f s; %d round(s); %d rank(s) stopped" % (
        wall, verdict["localize"]["rounds_run"], len(stopper.stopped)))


def test_two_gates_at_once_one_passes_the_other_reports_the_nodes_busy_and_fails_none(bed, tmp_path):
    names = [node.name for node in bed.nodes]
    results = {}

    # Both runs record into one run history, finishing close together (WAL, one transaction per run).
    shared = str(tmp_path / "history.sqlite")

    def run(label, delay):
        time.sleep(delay)
        results[label] = gate(bed, tmp_path / label, dict(STOP_GATE, preflight_history_db=shared))[0]

    threads = [threading.Thread(target=run, args=(label, delay)) for label, delay in (("first", 0), ("second", 1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(900)
    first, second = results["first"].verdict, results["second"].verdict
    assert results["first"].rc == 0 and first["status"] == "pass", explain(results["first"])
    assert first["healthy_hosts"] == names and first["busy_hosts"] == []
    assert second["busy_hosts"] == names and second["unverified_hosts"] == names, explain(results["second"])
    assert first["failed_hosts"] == [] and second["failed_hosts"] == []
    for name in names:
        busy = second["nodes"][name]["checks"]["preflight.busy"]
        assert busy["details"]["blocked"] and "another preflight run holds it" in busy["found"], busy
        assert "from controller" in busy["found"] and "since" in busy["found"] and busy["fix"]
        assert first["nodes"][name]["checks"]["preflight.lock"]["status"] == "pass"
        assert not [key for key, check in second["nodes"][name]["checks"].items() if check["status"] == "fail"]
    assert second["allreduce"]["launched"] is False
    recorded = history.timeline(shared)
    assert sorted({row["run_id"] for row in recorded}) == sorted([first["run_id"], second["run_id"]])
    for name in names:
        assert sorted(row["status"] for row in recorded if row["node"] == name) == sorted(
            [first["nodes"][name]["status"], "unverified"])
    # The first run's leases went with it: the next run finds the nodes free.
    assert os.listdir(bed.lock_dir) == []


def _kill_gate_once_ranks_run(bed, node, label):
    """SIGKILL the whole ansible-playbook of the run whose inventory lives under ``label`` once ``node``'s ranks
    run: a gate that dies (the OOM killer, a scheduler's kill) in the middle of the all-reduce."""
    deadline = time.monotonic() + 120
    while len(rank_processes(bed, node)) < 2:
        assert time.monotonic() < deadline, "the ranks never appeared"
        time.sleep(0.05)
    listed = subprocess.run(["pgrep", "-f", "ansible-playbook.*%s" % label], capture_output=True, text=True,
                            check=False).stdout.split()
    assert listed, "the gate's ansible-playbook was not found"
    for pid in listed:
        try:
            os.killpg(os.getpgid(int(pid)), signal.SIGKILL)
        except ProcessLookupError:
            pass
    return listed


def test_a_gate_after_one_that_was_sigkilled_is_not_blocked(bed, tmp_path):
    names = [node.name for node in bed.nodes]
    label = "killed-%d" % os.getpid()
    killed = {}
    slow = dict(STOP_GATE, allreduce_iters=5000, allreduce_hard_timeout=120, allreduce_floor_busbw_gbps_gloo=0)

    def strike(event):
        data = event.get("event_data") or {}
        if not killed and event.get("event") == "runner_on_start" and str(data.get("task", "")).startswith(
                "Run the probes that act"):
            killed["thread"] = threading.Thread(target=lambda: killed.update(
                pids=_kill_gate_once_ranks_run(bed, bed.nodes[0], label)), daemon=True)
            killed["thread"].start()
        return True

    directory = tmp_path / label
    directory.mkdir(parents=True)
    inventory = bed.write_inventory(path=str(directory / "inventory.yml"))
    run_playbook(directory, inventory=inventory, extravars=slow, timeout=300, event_handler=strike)
    killed["thread"].join(150)
    assert killed.get("pids"), "the gate was never killed"
    leases = os.listdir(bed.lock_dir)
    assert len(leases) == len(names), "the killed run left its leases: %s" % leases
    result, wall = gate(bed, tmp_path / "after", STOP_GATE)
    verdict = result.verdict
    assert result.rc == 0 and verdict["status"] == "pass" and verdict["busy_hosts"] == [], explain(result)
    took = [verdict["nodes"][name]["checks"]["preflight.lock"]["found"] for name in names]
    assert all("took over the lease of run" in text and "no longer runs" in text for text in took), took
    assert any("ended 0 process" not in text for text in took), "the dead run's ranks were ended"
    print("\nafter a SIGKILLed gate: verdict in %.1f s; %s" % (wall, took[0]))
