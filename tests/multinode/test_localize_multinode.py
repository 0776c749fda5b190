"""Localisation of a slow all-reduce to the node that causes it (roles/allreduce/tasks/localize.yml), on
the namespace test bed: 4 nodes, one playbook run, one node's egress throttled to 20 Mbit/s with tc tbf.

The bed has no fabric rail, so the gate's collectives use the management interface eth0 (nic_discovery
chooses it; the verdict says which): that is the one throttled.  The all-node all-reduce completes but
below the gloo floor, the pair rounds name the throttled node (a network fault: it passes alone over lo),
and the other three nodes are proven good."""

import time

import pytest

from gate_helpers import explain, trusted_bed
from playbook import run_playbook

pytestmark = pytest.mark.timeout(900)

NODES = 4
THROTTLE = ["root", "tbf", "rate", "20mbit", "burst", "32kbit", "latency", "400ms"]
# 20 Mbit/s is 0.0025 GB/s on the wire; unthrottled, the bed's gloo ring moves 1 MiB all-reduces at
# around 0.05-0.1 GB/s busbw.  The floor sits between; a pair below 0.7 x the median pair is slow too.
SMALL_GATE = {"allreduce_sizes": [1048576], "allreduce_iters": 3, "allreduce_warmup": 1,
              "allreduce_floor_busbw_gbps_gloo": 0.01, "allreduce_floor_relative": 0.7}


@pytest.fixture(scope="module")
def bed(request, tmp_path_factory):
    return trusted_bed(request, tmp_path_factory, nodes=NODES)


def task_seconds(result, substring):
    """Wall seconds from the first start to the last end of the tasks whose name holds ``substring``."""
    starts, ends = [], []
    for event in result.events:
        data = event.get("event_data") or {}
        if substring not in data.get("task", ""):
            continue
        if event.get("event") == "playbook_on_task_start":
            starts.append(event.get("created"))
        elif event.get("event", "").startswith("runner_on_") and data.get("end"):
            ends.append(data["end"])
    if not starts or not ends:
        return None
    from datetime import datetime  # pylint: disable=import-outside-toplevel
    parse = lambda text: datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()  # noqa: E731
    return round(max(parse(end) for end in ends) - min(parse(start) for start in starts), 1)


def test_throttled_node_is_named_by_the_pair_rounds(bed, tmp_path):
    node = bed.nodes[2]
    names = [n.name for n in bed.nodes]
    tmp_path.mkdir(parents=True, exist_ok=True)
    inventory = bed.write_inventory(path=str(tmp_path / "inventory.yml"))
    bed.tc(node, ["qdisc", "add", "dev", "eth0"] + THROTTLE)
    started = time.monotonic()
    try:
        result = run_playbook(tmp_path, inventory=inventory, extravars=SMALL_GATE, timeout=800)
    finally:
        bed.tc(node, ["qdisc", "del", "dev", "eth0", "root"])
    wall = time.monotonic() - started
    verdict = result.verdict
    assert verdict is not None, result.stdout[-3000:]
    assert result.rc != 0 and verdict["status"] == "fail", explain(result)
    # The collectives used the interface that was throttled.
    assert verdict["allreduce"]["socket_ifname"] in (None, "eth0"), verdict["allreduce"]
    localize = verdict.get("localize")
    assert localize, explain(result)
    assert localize["bad"] == [node.name], (localize, explain(result))
    assert localize["kinds"] == {node.name: "network"}, localize
    assert localize["good"] == sorted(name for name in names if name != node.name), localize
    assert localize["lost"] == [] and localize["unproven"] == []
    assert 1 <= localize["rounds_run"] <= 3 and len(localize["rounds"]) == localize["rounds_run"]
    named = verdict["nodes"][node.name]["checks"]["allreduce.localize"]
    assert named["status"] == "fail" and node.name in named["found"] and "network fault" in named["found"]
    assert "GB/s" in named["found"], named
    for name in names:
        if name == node.name:
            continue
        assert verdict["nodes"][name]["checks"]["allreduce.localize"]["status"] == "pass", explain(result)
        assert "allreduce.localize" not in [key for key, check in verdict["nodes"][name]["checks"].items()
                                            if check["status"] == "fail"]
    # Only the throttled node fails: the other three are proven together by the confirmation run (on the run's
    # own port) and are exactly the nodes of the hostfile.
    others = sorted(name for name in names if name != node.name)
    assert verdict["failed_hosts"] == [node.name], explain(result)
    assert sorted(verdict["healthy_hosts"]) == others and verdict["unverified_hosts"] == [], explain(result)
    assert localize["confirm"]["status"] == "pass" and sorted(localize["confirm"]["hosts"]) == others
    with open(verdict["run_dir"] + "/hosts.txt", encoding="utf-8") as handle:
        assert sorted(line.strip() for line in handle if line.strip()) == others
    for name in others:
        assert verdict["nodes"][name]["checks"]["allreduce.first_run"]["status"] == "pass"
    all_node = task_seconds(result, "collect the all-reduce")
    print("\nlocalisation: %d round(s) in %s s (controller clock, first plan to conclusion); all-node run with "
          "the probes %s s; whole playbook %.1f s" % (localize["rounds_run"], localize["elapsed_seconds"], all_node,
                                                      wall))
    for item in localize["rounds"]:
        print("round %d: %s" % (item["round"], "; ".join(
            "%s %s step %d %s %s" % (launch["kind"], "+".join(launch["hosts"]), launch["step"], launch["verdict"],
                                     launch["busbw_gbps"]) for launch in item["launches"])))
