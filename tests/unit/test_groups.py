"""Group rounds (cluster_preflight/capabilities/allreduce/groups.py): the node whose fault shows only in a large group,
named when every
pair passed.  The fault model: a node that fails every launch where it has more than ``peers`` peers (a node that
refuses connections past a count), passes in pairs and alone."""

import pytest

from cluster_preflight.capabilities.allreduce import groups
from cluster_preflight.capabilities.allreduce import localize as loc
from localize_helpers import PORT, base_args, hosts, ranks

FLOOR = {"absolute": 0.01, "relative": 0.7}


def answer(launch, bad, peers, transient=False):
    """Each host's result for one launch: a group holding a node of ``bad`` with more than ``peers`` peers fails
    (unless ``transient`` and it is the retest)."""
    fails = bool(set(bad) & set(launch["hosts"])) and len(launch["hosts"]) - 1 > peers
    fails = fails and not (transient and launch.get("retest"))
    return {host: {"ranks": ranks(ok=not fails)} for host in launch["hosts"]}


def run(names, bad, peers=1, transient=False, lost=None):
    """Group rounds to their end: ``(summary, checks, plans)``."""
    base, addr = base_args(names), {host: "198.18.200.%d" % index for index, host in enumerate(names)}
    rounds, plans = [], []
    while len(rounds) <= groups.max_rounds(len(names)):
        serial = sum(len(item["launches"]) for item in rounds)
        planned = groups.plan(names, rounds, base, addr, PORT, serial, FLOOR)
        if not planned["launches"]:
            break
        plans.append(planned)
        results = [{}, {}]
        for launch in planned["launches"]:
            results[launch["step"]].update(answer(launch, bad, peers, transient))
            if lost in launch["hosts"]:
                results[launch["step"]][lost] = "unreachable while running the all-reduce: ssh timed out"
        rounds.append(loc.record(planned, results))
    summary, checks = groups.conclude(names, rounds, FLOOR)
    return summary, checks, plans


CASES = [(count, bad) for count in (6, 7, 8, 9, 16, 33, 1000) for bad in sorted({0, count // 2, count - 1})]


@pytest.mark.parametrize("count,bad", CASES)
def test_a_node_failing_only_with_two_peers_or_more_is_named(count, bad):
    names = hosts(count)
    summary, checks, plans = run(names, [names[bad]])
    assert summary["named"] == names[bad], summary
    assert list(checks) == [names[bad]] and checks[names[bad]]["allreduce"]["localize"]["status"] == "fail"
    found = checks[names[bad]]["allreduce"]["localize"]["found"]
    assert "only in a group" in found and "retest group" in found
    assert len(plans) <= groups.max_rounds(count)
    # Every group as large as the first that failed (half the cluster), the retest's too.
    assert {len(launch["hosts"]) for planned in plans[1:] for launch in planned["launches"]} == {summary["size"]}
    # A host at most once per step.
    for planned in plans:
        for step in (0, 1):
            seen = [host for launch in planned["launches"] if launch["step"] == step for host in launch["hosts"]]
            assert len(seen) == len(set(seen))


def test_eight_nodes_take_three_rounds_and_the_retest():
    names = hosts(8)
    summary, _checks, plans = run(names, ["n5"])
    assert [[launch["suspects"] for launch in planned["launches"]] for planned in plans] == [
        [["n0", "n1", "n2", "n3"], ["n4", "n5", "n6", "n7"]], [["n4", "n5"], ["n6", "n7"]], [["n4"], ["n5"]],
        [["n5"]]]
    assert summary["rounds_run"] == 4 and summary["size"] == 4
    # The retest's group: n5 with proven nodes other than those of its last group where it could.
    assert plans[-1]["launches"][0]["retest"] and plans[-1]["launches"][0]["hosts"][0] == "n5"


def test_a_fault_that_needs_more_than_half_the_cluster_names_nobody():
    summary, checks, plans = run(hosts(8), ["n5"], peers=4)
    assert summary["named"] is None and checks == {} and len(plans) == 1
    assert "both groups of round 1 passed" in summary["stop"] and "larger than 4 nodes" in summary["stop"]


def test_two_such_nodes_in_both_halves_name_nobody():
    summary, checks, _plans = run(hosts(8), ["n1", "n6"])
    assert summary["named"] is None and checks == {} and "both groups of round 1 failed" in summary["stop"]


def test_a_transient_fault_that_passes_its_retest_is_not_named():
    summary, checks, _plans = run(hosts(8), ["n5"], transient=True)
    assert summary["named"] is None and checks == {} and summary["retested"] == "n5" and summary["retest_passed"]
    assert "then passed on retest" in summary["stop"]


def test_a_node_lost_in_a_group_round_stops_the_groups():
    summary, checks, _plans = run(hosts(8), ["n5"], lost="n2")
    assert summary["named"] is None and checks == {} and summary["lost"] == ["n2"]


def test_an_odd_cluster_whose_larger_half_fails_runs_its_halves_one_after_another():
    names = hosts(7)
    summary, _checks, plans = run(names, ["n6"])
    assert summary["named"] == "n6"
    second = plans[1]["launches"]
    assert [launch["step"] for launch in second] == [0, 1] and len(second[0]["hosts"]) == len(second[1]["hosts"]) == 4


@pytest.mark.parametrize("summary,count,applies", [
    ({"bad": [], "lost": [], "unproven": [], "good": hosts(8)}, 8, True),
    ({"bad": ["n1"], "lost": [], "unproven": [], "good": hosts(8)[2:]}, 8, False),
    ({"bad": [], "lost": [], "unproven": ["n1"], "good": hosts(8)[2:]}, 8, False),
    ({"bad": [], "lost": [], "unproven": [], "good": hosts(4)}, 4, False),  # halves of four are pairs
])
def test_the_groups_follow_only_pair_rounds_that_proved_every_node(summary, count, applies):
    assert groups.applies(hosts(count), summary) is applies
