"""A pass is a promise: every targeted node is accounted for, whatever happens during the run.

Faults strike a node *during* the run, at the moment the controller reports a given task on
it (ansible-runner's events): its sshd killed while its facts are read and after its ranks
started, all its traffic dropped while the probes run, a one-node run's node killed after its
facts call started the ranks; plus a capability that raises on one node, a run limited to some
nodes, fewer forks than nodes, a node whose sshd configuration cannot be found, and a bring-up
where one node's /etc is read-only.  Each test is one run of a playbook on one shared bed of
four nodes; every fault is undone in a ``finally`` and the bed
checked clean after each test.
"""

import json
import os
import threading
import time

import pytest

from playbook import newest_run_dir, run_playbook
from gate_helpers import explain, gate_leftovers, rank_processes
from testbed import testbed_fixture

pytestmark = pytest.mark.timeout(900)

NODES = 4
RANKS_PER_NODE = 2
FACTS_TASK = "Read every capability's facts on the node in one call."
LAUNCH_TASK = "Start this node's ranks of the all-reduce"
PROBES_TASK = "Run the probes that act"
# Short bounds, so a peer that waits for a lost node gives up quickly.
FAST = {"allreduce_timeout": 15, "allreduce_hard_timeout": 60, "allreduce_sizes": [1048576],
        "allreduce_iters": 2, "allreduce_warmup": 1}
APPEAR_TIMEOUT = 120

BRINGUP_SSH_TRUST = {"preflight_bringup_capabilities": ["ssh_trust"]}


@pytest.fixture(scope="module")
def bed(request, tmp_path_factory):
    # Private /root with a plain shell: a node killed mid-login must not leave a lock (pyenv's
    # rehash) that stalls every later login into the other nodes.
    bed = testbed_fixture(request, nodes=NODES, fabric_rails=1, private_dirs=("/etc", "/root"))
    for node in bed.nodes:
        bed.run(node, ["sh", "-c", 'printf "%s\\n" "$1" > /root/.bashrc && cp /root/.bashrc /root/.profile',
                       "plain-shell", "# test-bed node: a plain shell"], check=True)
    work = tmp_path_factory.mktemp("bringup")
    inventory = bed.write_inventory(path=str(work / "inventory.yml"))
    result = run_playbook(work, playbook="bringup.yml", inventory=inventory, extravars=BRINGUP_SSH_TRUST,
                          timeout=600)
    assert result.rc == 0, result.stdout[-3000:]
    return bed


@pytest.fixture(autouse=True)
def clean_bed(bed):
    """After each test: every node up, no firewall rule, no gate process left."""
    yield
    for node in bed.nodes:
        bed.start_sshd(node)
        bed.iptables(node, ["-F", "INPUT"])
    leftovers = gate_leftovers(bed, 30)
    assert not leftovers, f"gate processes left on the nodes: {leftovers}"


def run(bed, tmp_path, extravars=None, host_vars=None, **kwargs):
    tmp_path.mkdir(parents=True, exist_ok=True)
    inventory = bed.write_inventory(host_vars=host_vars, path=str(tmp_path / "inventory.yml"))
    result = run_playbook(tmp_path, inventory=inventory, extravars=extravars, timeout=800, **kwargs)
    assert result.status in ("successful", "failed"), (result.status, result.stdout[-3000:])
    assert result.verdict is not None, result.stdout[-3000:]
    assert "Traceback" not in result.stdout
    return result


def run_node_vars(bed, tmp_path, node, node_vars):
    """A gate run with ``node_vars`` set on ``node`` alone: the result and its verdict."""
    result = run(bed, tmp_path, host_vars={node.name: node_vars})
    return result, result.verdict


def run_struck(bed, tmp_path, strike, **kwargs):
    """A fast gate run with ``strike`` handling its events; the strike must have struck."""
    result = run(bed, tmp_path, extravars=FAST, event_handler=strike, **kwargs)
    strike.finish()
    return result


class Strike(object):
    """An ansible-runner event handler that strikes ``node`` once, when the controller reports
    ``event`` (runner_on_start, runner_on_ok) of the task whose name starts with ``task`` on it.
    ``fault(bed, node)`` runs in a thread so the run's events keep flowing."""

    def __init__(self, bed, node, task, event, fault):
        self.bed, self.node, self.task, self.event, self.fault = bed, node, task, event, fault
        self.thread = None
        self.error = None
        self.done = False

    def __call__(self, event):
        data = event.get("event_data") or {}
        if (self.thread is None and event.get("event") == self.event and data.get("host") == self.node.name
                and str(data.get("task", "")).startswith(self.task)):
            self.thread = threading.Thread(target=self._strike, daemon=True)
            self.thread.start()
        return True

    def _strike(self):
        try:
            self.fault(self.bed, self.node)
            self.done = True
        except Exception as exc:  # pylint: disable=broad-except
            self.error = exc

    def finish(self):
        assert self.thread is not None, f"{self.task} never reached {self.node.name}"
        self.thread.join(timeout=APPEAR_TIMEOUT + 30)
        assert self.error is None, self.error
        assert self.done, f"the fault on {self.node.name} did not happen"


def kill_node(bed, node):
    """The node's sshd is its PID 1: every process of the node dies with it."""
    bed.stop_sshd(node)


def kill_node_once_its_ranks_run(bed, node):
    deadline = time.monotonic() + APPEAR_TIMEOUT
    while len(rank_processes(bed, node)) < RANKS_PER_NODE:
        assert time.monotonic() < deadline, f"{node.name}'s ranks never appeared"
        time.sleep(0.05)
    bed.stop_sshd(node)


def drop_everything(bed, node):
    bed.iptables(node, ["-I", "INPUT", "!", "-i", "lo", "-j", "DROP"])


def names(bed, *exclude):
    return [node.name for node in bed.nodes if node not in exclude]


def assert_lost_and_named(result, node, while_doing):
    verdict = result.verdict
    assert result.rc != 0 and verdict["status"] == "fail", explain(result)
    assert verdict["unreachable_hosts"] == [node.name], explain(result)
    assert verdict["failed_hosts"] == [node.name], explain(result)
    reach = verdict["nodes"][node.name]["checks"]["preflight.reachable"]
    assert reach["status"] == "fail" and node.name in reach["found"], reach
    assert any(words in reach["found"] for words in while_doing), reach
    assert reach["fix"]
    assert verdict["nodes"][node.name]["reachable"] is False


# --------------------------------------------------------------------------


def test_node_killed_while_its_facts_are_read_is_named_and_the_rest_are_proven(bed, tmp_path):
    node = bed.nodes[1]
    result = run_struck(bed, tmp_path, Strike(bed, node, FACTS_TASK, "runner_on_start", kill_node))
    # Killed as its facts were read; at the latest the next node task finds it gone.
    assert_lost_and_named(result, node, ("while reading its facts", "while probing the rendezvous port"))
    verdict = result.verdict
    others = names(bed, node)
    assert verdict["healthy_hosts"] == others, explain(result)
    gate = verdict["allreduce"]
    assert gate["status"] == "pass" and gate["hosts"] == others, explain(result)
    assert gate["world_size"] == gate["planned_world_size"] == len(others) * RANKS_PER_NODE
    run_check = verdict["nodes"][node.name]["checks"].get("allreduce.run")
    assert run_check is None or run_check["status"] == "skipped"


def test_node_killed_after_its_ranks_started_is_the_suspect_and_its_peers_are_not_blamed(bed, tmp_path):
    node = bed.nodes[2]
    result = run_struck(bed, tmp_path, Strike(bed, node, LAUNCH_TASK, "runner_on_ok", kill_node_once_its_ranks_run))
    assert_lost_and_named(result, node, ("while running the probes", "while waiting for the all-reduce"))
    verdict = result.verdict
    gate = verdict["allreduce"]
    assert gate["launched"] and gate["status"] == "fail", explain(result)
    assert gate["planned_world_size"] == NODES * RANKS_PER_NODE
    assert gate["world_size"] == (NODES - 1) * RANKS_PER_NODE
    assert {item["host"] for item in gate["suspects"]} == {node.name}, explain(result)
    # The peers' ranks failed only because the node went away: not drained; the rounds and one more all-node
    # run over the three left prove them, so they are healthy and the hostfile lists them.
    assert verdict["healthy_hosts"] == names(bed, node), explain(result)
    assert verdict["localize"]["excluded"] and node.name in verdict["localize"]["excluded"]
    assert gate["confirm"]["status"] == "pass" and gate["confirm"]["hosts"] == names(bed, node)
    for other in names(bed, node):
        first_run = verdict["nodes"][other]["checks"]["allreduce.first_run"]
        assert first_run["status"] == "pass" and node.name in first_run["found"], first_run
        assert verdict["nodes"][other]["checks"]["allreduce.world_size"]["status"] == "pass"
    suspect = [name for name in verdict["nodes"][node.name]["checks"] if name.startswith("allreduce.suspect_rank_")]
    assert len(suspect) == RANKS_PER_NODE


SINGLE_TASK = "Run this node's single-node all-reduce"
SINGLE = dict(FAST, allreduce_single_node="always")


def test_node_killed_while_its_single_node_all_reduce_runs_is_named_and_its_peers_are_proven(bed, tmp_path):
    node = bed.nodes[1]
    strike = Strike(bed, node, SINGLE_TASK, "runner_on_start", kill_node_once_its_ranks_run)
    result = run(bed, tmp_path, extravars=SINGLE, event_handler=strike)
    strike.finish()
    assert_lost_and_named(result, node, ("while running its single-node all-reduce",))
    verdict = result.verdict
    assert verdict["nodes"][node.name]["checks"]["allreduce.single_node"]["status"] == "fail"
    # Lost before the launch plan: the all-node run goes on without it and proves its peers.
    assert verdict["healthy_hosts"] == names(bed, node), explain(result)
    assert verdict["allreduce"]["status"] == "pass" and node.name not in verdict["allreduce"]["hosts"]
    for other in names(bed, node):
        assert verdict["nodes"][other]["checks"]["allreduce.single_node"]["status"] == "pass"


def test_a_node_whose_own_all_reduce_is_slow_fails_alone_on_a_passing_all_node_run(bed, tmp_path):
    """``tc tbf`` on the node's loopback: its ranks' traffic alone is slow, the all-node run (on the fabric) is
    not."""
    node = bed.nodes[2]
    bed.tc(node, ["qdisc", "add", "dev", "lo", "root", "tbf", "rate", "20mbit", "burst", "32kbit", "latency",
                  "400ms"])
    try:
        result = run(bed, tmp_path, extravars=dict(SINGLE, allreduce_slow_grace=3))
    finally:
        bed.tc(node, ["qdisc", "del", "dev", "lo", "root"], check=False)
    verdict = result.verdict
    assert verdict["failed_hosts"] == [node.name], explain(result)
    assert verdict["allreduce"]["status"] == "pass"
    single = verdict["nodes"][node.name]["checks"]["allreduce.single_node"]
    assert single["status"] == "fail" and node.name in single["found"], single
    # Throttled hard enough, its correctness stage already times out: failed, slow or below the floor, alone.
    assert any(words in single["found"] for words in ("below the floor", "is slow", "failed")), single
    for other in names(bed, node):
        assert verdict["nodes"][other]["checks"]["allreduce.single_node"]["status"] == "pass"
        assert verdict["nodes"][other]["status"] != "fail"
    assert os.path.exists(os.path.join(verdict["run_dir"], "%s.single.log" % node.name))
    # Left out of the all-node run, which proves the others without it.
    assert node.name not in verdict["allreduce"]["hosts"]
    assert "see allreduce.single_node" in verdict["nodes"][node.name]["checks"]["allreduce.run"]["found"]


def test_node_whose_traffic_is_dropped_while_the_probes_run_is_named(bed, tmp_path):
    node = bed.nodes[3]
    strike = Strike(bed, node, PROBES_TASK, "runner_on_start", drop_everything)
    try:
        result = run_struck(bed, tmp_path, strike)
    finally:
        bed.iptables(node, ["-F", "INPUT"])
    assert_lost_and_named(result, node, ("while running the probes", "while waiting for the all-reduce"))
    verdict = result.verdict
    assert verdict["allreduce"]["status"] == "fail"
    assert {item["host"] for item in verdict["allreduce"]["suspects"]} == {node.name}, explain(result)
    for other in names(bed, node):
        assert verdict["nodes"][other]["status"] != "fail", explain(result)
    # Its probes never came back: said so per capability, not dropped.
    assert verdict["nodes"][node.name]["checks"]["core_dumps.no_result"]["status"] == "fail"


def test_a_capability_that_raises_on_one_node_fails_that_node_only_and_its_gate_still_counts(bed, tmp_path):
    node = bed.nodes[1]
    result, verdict = run_node_vars(bed, tmp_path, node, {"preflight_selftest_error": "iommu"})
    assert result.rc != 0 and verdict["status"] == "fail", explain(result)
    assert verdict["failed_hosts"] == [node.name], explain(result)
    checks = verdict["nodes"][node.name]["checks"]
    error = checks["iommu.error"]
    assert error["status"] == "fail" and "self-test" in error["found"] and node.name in error["found"]
    # Every other capability still checked that node, its ranks included.
    assert checks["allreduce.ranks"]["status"] == "pass"
    assert checks["kernel_debug.ptrace_scope"]["status"] == "skipped"
    assert "core_dumps.core_probe" in checks and "ssh_trust.mesh" in checks
    gate = verdict["allreduce"]
    assert gate["status"] == "pass" and gate["world_size"] == NODES * RANKS_PER_NODE
    assert verdict["healthy_hosts"] == names(bed, node)


def test_limit_to_two_nodes_gives_a_verdict_over_exactly_those_and_exit_code_zero(bed, tmp_path):
    chosen = [bed.nodes[0].name, bed.nodes[2].name]
    result = run(bed, tmp_path, limit=",".join(chosen))
    verdict = result.verdict
    assert result.rc == 0 and verdict["status"] == "pass", explain(result)
    assert verdict["hosts"] == chosen and sorted(verdict["nodes"]) == sorted(chosen)
    assert verdict["allreduce"]["hosts"] == chosen
    assert verdict["allreduce"]["world_size"] == 2 * RANKS_PER_NODE


def test_one_node_run_killed_while_its_ranks_run_is_named_not_passed(bed, tmp_path):
    """A run limited to one node; the node dies while its ranks run: the verdict fails it as lost, and
    nothing passes."""
    node = bed.nodes[1]
    strike = Strike(bed, node, LAUNCH_TASK, "runner_on_ok", kill_node_once_its_ranks_run)
    result = run_struck(bed, tmp_path, strike, limit=node.name)
    assert_lost_and_named(result, node, ("while running the probes", "while waiting for the all-reduce"))
    verdict = result.verdict
    assert verdict["hosts"] == [node.name] and verdict["healthy_hosts"] == []
    gate = verdict["allreduce"]
    assert gate["status"] == "fail" and {item["host"] for item in gate["suspects"]} == {node.name}
    assert verdict["nodes"][node.name]["checks"]["core_dumps.no_result"]["status"] == "fail"


def test_fewer_forks_than_nodes_still_pass_the_port_mesh_and_the_gate(bed, tmp_path):
    result = run(bed, tmp_path, forks=2)
    verdict = result.verdict
    assert result.rc == 0 and verdict["status"] == "pass", explain(result)
    assert verdict["healthy_hosts"] == names(bed)
    for node in bed.nodes:
        assert verdict["nodes"][node.name]["checks"]["port_mesh.reach"]["status"] == "pass"
    assert verdict["allreduce"]["world_size"] == NODES * RANKS_PER_NODE


def test_a_node_whose_sshd_configuration_cannot_be_found_is_a_finding_naming_it(bed, tmp_path):
    node = bed.nodes[3]
    result, verdict = run_node_vars(bed, tmp_path, node, {"ssh_trust_sshd_config": "/nonexistent/sshd_config"})
    assert result.rc != 0 and verdict["status"] == "fail", explain(result)
    assert verdict["failed_hosts"] == [node.name], explain(result)
    failing = {name: check for name, check in verdict["nodes"][node.name]["checks"].items()
               if check["status"] == "fail"}
    assert failing and all(name.startswith("ssh_trust.") for name in failing), failing
    finding = next(iter(failing.values()))
    assert node.name in finding["found"] and "ssh_trust_sshd_config" in finding["fix"]
    assert not any(name.endswith(".error") or name.endswith("no_result") for name in
                   verdict["nodes"][node.name]["checks"])
    assert verdict["allreduce"]["status"] == "pass"


def test_bringup_on_a_node_with_a_read_only_etc_records_it_there_and_applies_everywhere_else(bed, tmp_path):
    """One capability that cannot be applied on a node is that node's finding; the other nodes are
    brought up, and the node's other capabilities still ran."""
    node = bed.nodes[0]
    # core_pattern "core" is the kernel's default: the writer only has drop-in files to write, the
    # machine-wide sysctl stays as it is.
    extravars = {"preflight_bringup_capabilities": ["core_dumps", "ssh_trust"], "core_dumps_pattern": "core",
                 "core_dumps_dir": ""}
    bed.run(node, ["mount", "-o", "remount,ro", "/etc"], check=True)
    try:
        inventory = bed.write_inventory(path=str(tmp_path / "inventory.yml"))
        result = run_playbook(tmp_path, playbook="bringup.yml", inventory=inventory, extravars=extravars,
                              timeout=600)
    finally:
        bed.run(node, ["mount", "-o", "remount,rw", "/etc"], check=True)
    assert result.rc != 0, result.stdout[-3000:]
    run_dir = newest_run_dir(result.results_dir)
    with open(os.path.join(run_dir, "bringup.json"), encoding="utf-8") as handle:
        report = json.load(handle)
    assert report["failed_hosts"] == [node.name], report["failed_hosts"]
    error = report["nodes"][node.name]["checks"]["core_dumps.error"]
    assert error["status"] == "fail" and node.name in error["found"] and "Read-only" in error["found"], error
    # ssh_trust ran on that node too (its known hosts were already in place from the bed's bring-up).
    assert "ssh_trust.known_hosts" in report["nodes"][node.name]["checks"]
    for other in bed.nodes[1:]:
        assert report["nodes"][other.name]["status"] in ("pass", "warn"), report["nodes"][other.name]
        dropin = os.path.join(bed.etc_path(other), "security", "limits.d", "90-preflight-core.conf")
        assert os.path.exists(dropin), other.name
    assert not os.path.exists(os.path.join(bed.etc_path(node), "security", "limits.d", "90-preflight-core.conf"))
