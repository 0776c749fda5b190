"""Localisation at scale: the rounds stay bounded at 1,000 and 4,000 nodes.

A failed all-node run over a large synthetic cluster is localised through the action's own state machine
(cluster_preflight/stages/localization.py: start, then advance after every step, the retest before blame included)
and cluster_preflight/capabilities/allreduce/localize.py's round planner, a fake cluster answering every planned launch
from a fault
model (tests/localize_helpers.py: a node fault fails every run of the node, alone over lo too; a network fault
fails its pairs only).  Counted, never timed: the pair rounds, the node calls (one per step that has a launch),
and who is named.  docs/scale.md says how this compares with group testing."""

import pytest

from cluster_preflight.capabilities.allreduce import groups
from cluster_preflight.plays import stage_results
from cluster_preflight.stages.view import ClusterView
from localize_helpers import action_module, answer, hosts, ranks, task_vars

STEPS = {None: (stage_results.LOCALIZE_FIRST, stage_results.LOCALIZE_SECOND), "nodes": (stage_results.LOCALIZE_FIRST,
                                                                                stage_results.LOCALIZE_SECOND),
         "groups": (stage_results.LOCALIZE_FIRST, stage_results.LOCALIZE_SECOND),
         "retest": (stage_results.RETEST_FIRST, stage_results.RETEST_SECOND)}


def drive(names, fault):
    """The localisation of a failed all-node run over ``names`` under ``fault``, to its conclusion:
    ``(outcome, node calls)``."""
    action = action_module()
    # Every rank of the all-node run failed alike (a peer reset the connection): no node named by its own evidence.
    variables = task_vars(names, {host: {"ranks": ranks(ok=False)} for host in names})
    outcome = action.start(ClusterView(variables))
    calls = 0
    while outcome["needed"] and not outcome["done"]:
        planned = outcome["state"]["planned"]
        answers = [{}, {}]
        for launch in planned["launches"]:
            answers[launch["step"]].update(answer(launch, planned["round"], fault))
        calls += sum(1 for step in answers if step)
        for host in names:
            registered = variables["hostvars"][host]
            registered[stage_results.LOCALIZE] = outcome
            for step, name in enumerate(STEPS[outcome["state"].get("phase")]):
                result = answers[step].get(host)
                registered[name] = {"skipped": True} if result is None else result if isinstance(result, dict) \
                    else {"unreachable": True, "msg": result}
        outcome = action.advance(ClusterView(variables), outcome)
    return outcome, calls


def spread(count, number):
    """``number`` node indexes spread over ``count`` nodes (never in one round-1 pair)."""
    return [1 + 2 * (index * (count // 2) // number) for index in range(number)]


CASES = [(count, bad) for count in (1000, 4000) for bad in (
    [count // 2],  # one bad node
    spread(count, 3),  # a few, far apart
    [10, 11],  # two in the same round-1 pair: neither can prove the other
)]


@pytest.mark.parametrize("count,bad", CASES, ids=["%d-nodes-%d-bad%s" % (count, len(bad), "-paired" if bad == [10, 11]
                                                                         else "") for count, bad in CASES])
def test_a_node_fault_is_named_in_two_rounds_whatever_the_size(count, bad):
    names = hosts(count)
    named = sorted(names[index] for index in bad)
    done, calls = drive(names, {"hosts": named, "kind": "node"})
    summary = done["localize"]
    # Round 1 pairs every node; round 2 retests each suspect with a node proven good, then runs it alone over lo.
    assert summary["rounds_run"] == 2
    # Round 1: one step; round 2: two.  Its runs returned wrong data, which is never retested (a hardware finding).
    assert calls == 3 and summary["retest"]["hosts"] == []
    assert summary["bad"] == named and set(summary["kinds"].values()) == {"node"}
    # Every healthy node is proven good, none blamed, none left unproven.
    healthy = [host for host in names if host not in named]
    assert summary["good"] == sorted(healthy) and summary["unproven"] == [] and summary["lost"] == []
    statuses = {host: done["checks_by_host"][host]["allreduce"]["localize"]["status"] for host in names}
    assert [host for host in names if statuses[host] == "fail"] == named
    assert all(statuses[host] == "pass" for host in healthy)
    # The confirmation run is planned over the healthy nodes alone.
    assert sorted(done["confirm_args_by_host"]) == sorted(healthy)


@pytest.mark.parametrize("count,kind", [(count, kind) for count in (1000, 4000) for kind in ("network", "slow")])
def test_a_link_fault_is_named_within_three_rounds(count, kind):
    # A link that fails or is slow with its peers and passes alone over lo (the bed's throttled node).
    names = hosts(count)
    done, calls = drive(names, {"hosts": [names[7]], "kind": kind})
    summary = done["localize"]
    assert summary["rounds_run"] <= 3 and calls <= 2 * 3 + 2
    assert summary["bad"] == [names[7]] and summary["kinds"] == {names[7]: "network"}
    assert summary["good"] == sorted(host for host in names if host != names[7]) and summary["unproven"] == []
    if kind == "slow":
        # Slow, not wrong: retested once with a node proven good before it is named.
        assert summary["retest"]["failed"] == [names[7]]


def test_the_round_plan_grows_with_the_nodes_and_the_rounds_do_not():
    # The launches per round grow with the cluster (round 1 pairs every node, at once); the number of rounds and
    # of steps does not.
    small, small_calls = drive(hosts(1000), {"hosts": ["n500"], "kind": "node"})
    large, large_calls = drive(hosts(4000), {"hosts": ["n500"], "kind": "node"})
    launches = [[len(item["launches"]) for item in done["localize"]["rounds"]] for done in (small, large)]
    assert launches == [[500, 4], [2000, 4]]  # round 2: two pairs with a node proven good, two runs alone
    assert small_calls == large_calls


@pytest.mark.parametrize("count", [8, 1000])
def test_a_fault_only_a_group_shows_is_named_by_the_group_rounds(count):
    # Every pair passes (a node that fails only with two peers or more): round 1 proves every node good, then the
    # group rounds halve the suspects, every group as large as the half that failed.
    names = hosts(count)
    done, calls = drive(names, {"hosts": [names[5]], "kind": "group"})
    summary = done["localize"]
    assert summary["rounds_run"] == 1 and summary["bad"] == [names[5]] and summary["kinds"] == {names[5]: "group"}
    assert summary["groups"]["named"] == names[5] and summary["groups"]["rounds_run"] <= groups.max_rounds(count)
    assert calls == 1 + summary["groups"]["rounds_run"]
    assert summary["good"] == sorted(host for host in names if host != names[5])
    assert done["checks_by_host"][names[5]]["allreduce"]["localize"]["status"] == "fail"
    assert sorted(done["confirm_args_by_host"]) == sorted(host for host in names if host != names[5])
    # The include runs enough iterations for the pair rounds and the group rounds.
    assert action_module().start(ClusterView(task_vars(names, {host: {"ranks": ranks(ok=False)} for host in names}))
                                 )["steps_max"] >= 1 + groups.max_rounds(count)
