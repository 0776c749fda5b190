"""Retest before blame (cluster_preflight/capabilities/allreduce/retest.py, roles/allreduce/tasks/localize_retest.yml)
on the namespace
test bed: 4 nodes shared by the file, one playbook run per test, one node's egress throttled to 20 Mbit/s with
tc tbf so that the all-node all-reduce is below the gloo floor and the pair rounds name that node.

* the fault clears before the retest: the qdisc is removed as the retest's first task starts (seen in the
  ansible-runner events), so the node's retest pair and its run alone pass: it ends ``warn`` "failed, then
  passed on retest" with both measurements, is proven by the confirmation run with the others, and no node fails.

The run's wall time stays within the verdict's ``bound_seconds`` (which counts the retest's steps).  A fault that
persists through the retest (the node stays the only failed one, the retest in its finding) is the gate bed's
throttled-link test (tests/multinode/test_gate_multinode.py)."""

import time

import pytest

from gate_helpers import clear_throttles, explain, trusted_bed
from playbook import run_playbook

pytestmark = pytest.mark.timeout(900)

NODES = 4
THROTTLE = ["root", "tbf", "rate", "20mbit", "burst", "32kbit", "latency", "400ms"]
SMALL_GATE = {"allreduce_sizes": [1048576], "allreduce_iters": 3, "allreduce_warmup": 1,
              "allreduce_floor_busbw_gbps_gloo": 0.01, "allreduce_floor_relative": 0.7}
RETEST_TASK = "Retest this node's pair with a node proven good"


@pytest.fixture(scope="module")
def bed(request, tmp_path_factory):
    return trusted_bed(request, tmp_path_factory, nodes=NODES)


@pytest.fixture(autouse=True)
def clean_bed(bed):
    yield
    clear_throttles(bed)


def gate(bed, tmp_path, event_handler=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    inventory = bed.write_inventory(path=str(tmp_path / "inventory.yml"))
    started = time.monotonic()
    result = run_playbook(tmp_path, inventory=inventory, extravars=SMALL_GATE, timeout=800,
                          event_handler=event_handler)
    wall = time.monotonic() - started
    assert result.verdict is not None, result.stdout[-3000:]
    assert "Traceback" not in result.stdout
    # The run's own worst case holds, the retest's steps included.
    assert wall <= result.verdict["bound_seconds"], (wall, result.verdict["bound_seconds"])
    return result, wall


def _retest_started(event):
    data = event.get("event_data") or {}
    return event.get("event") == "playbook_on_task_start" and str(data.get("task", "")).startswith(RETEST_TASK)


def _report(label, verdict, wall):
    localize = verdict["localize"]
    print("\n%s: verdict in %.1f s (bound %s s); %d round(s); retest %s" % (
        label, wall, verdict["bound_seconds"], localize["rounds_run"], "; ".join(
            "%s %s %s %s" % (launch["kind"], "+".join(launch["hosts"]), launch["verdict"], launch["busbw_gbps"])
            for launch in localize["retest"]["launches"])))


def test_a_fault_that_clears_before_the_retest_is_a_warn_not_a_drain(bed, tmp_path):
    sick = bed.nodes[2]
    names = [node.name for node in bed.nodes]
    cleared = []

    def clear(event):
        if not cleared and _retest_started(event):
            bed.tc(sick, ["qdisc", "del", "dev", "eth0", "root"], check=False)
            cleared.append(time.monotonic())
        return True

    bed.tc(sick, ["qdisc", "add", "dev", "eth0"] + THROTTLE)
    result, wall = gate(bed, tmp_path, event_handler=clear)
    verdict = result.verdict
    assert cleared, "the retest never started: %s" % explain(result)
    localize = verdict["localize"]
    assert localize["retest"]["passed"] == [sick.name] and localize["bad"] == [], (localize, explain(result))
    check = verdict["nodes"][sick.name]["checks"]["allreduce.localize"]
    assert check["status"] == "warn" and "failed, then passed on retest" in check["found"], check
    # Both measurements: the rounds' slow runs and the retest's busbw.
    assert "they measured" in check["found"] and "retest pair" in check["found"] and "GB/s" in check["found"]
    assert sick.name not in verdict["failed_hosts"] and verdict["failed_hosts"] == [], explain(result)
    # A pass is a promise: the confirmation run over every node (the retested one included) passed.
    assert localize["confirm"]["status"] == "pass" and sorted(localize["confirm"]["hosts"]) == sorted(names)
    assert sorted(verdict["healthy_hosts"]) == sorted(names) and verdict["unverified_hosts"] == [], explain(result)
    assert verdict["nodes"][sick.name]["checks"]["allreduce.first_run"]["status"] == "warn"
    for name in names:
        if name != sick.name:
            first_run = verdict["nodes"][name]["checks"]["allreduce.first_run"]
            assert first_run["status"] == "pass" and sick.name in first_run["found"], first_run
    _report("fault cleared", verdict, wall)
