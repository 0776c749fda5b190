"""Retest before blame (cluster_preflight/capabilities/allreduce/retest.py and its glue in
cluster_preflight/stages/localization.py): a node
the localisation rounds name for a slow or failed run is retested once (a pair with a node proven good, then
alone over lo) before it is named; a pass makes it a warn with both measurements, a second failure keeps it
failed with the retest in its details; wrong data and lost nodes are never retested; the bound counts it."""

import pytest

from cluster_preflight.capabilities.allreduce import localize as loc
from cluster_preflight.stages import bounds, localization
from cluster_preflight.capabilities.allreduce import retest
from cluster_preflight.stages.view import ClusterView
from localize_helpers import GOOD_BW, LOOP_BW, PORT, SLOW_BW, base_args, hosts, ranks

FLOOR = {"absolute": 0.01, "relative": 0.7, "grace": 10}
ACTION = localization


def _task_vars(names, jobs, retest_on=True):
    settings = {"allreduce_floor_busbw_gbps_gloo": 0.01, "allreduce_floor_relative": 0.7,
                "allreduce_master_port": PORT, "allreduce_localize": True}
    run = {"preflight_retest_allreduce": retest_on}
    gate = {"launch": True, "hosts": names, "backend": "gloo", "master_port": PORT, "args_by_host": base_args(names),
            "floor": FLOOR}
    hostvars = {host: {"preflight_settings": {"settings": {"allreduce": settings, "preflight": run},
                                              "node": {"name": host, "node_addr": "198.18.200.%d" % index}},
                       "preflight_launch": {"gate": gate}, "preflight_plan": {"nic": {"addr_by_host": {}}},
                       "preflight_probes": {"job": jobs[host]}}
                for index, host in enumerate(names)}
    return {"ansible_play_hosts_all": names, "hostvars": hostvars}


STEPS = (("first", "localize_first"), ("second", "localize_second"), ("retest_first", "retest_first"),
         ("retest_second", "retest_second"))


def _drive(names, answer, retest_on=True):
    """Run the action to its conclusion; ``answer(phase, launch_hosts, host)`` is a node's module result, phase
    ``round`` or ``retest``.  Returns ``(outcome, phases seen)``."""
    task_vars = _task_vars(names, {host: {"ranks": ranks(busbw=SLOW_BW)} for host in names}, retest_on)
    outcome, seen = ACTION.start(ClusterView(task_vars)), []
    while not outcome["done"]:
        phase = "retest" if outcome.get("retest_first_args_by_host") or outcome.get("retest_second_args_by_host") \
            else "round"
        seen.append(phase)
        for host in names:
            task_vars["hostvars"][host]["allreduce_localize"] = outcome
            for step, register in STEPS:
                by_host = outcome.get("%s_args_by_host" % step) or {}
                args = by_host.get(host)
                if args is None:
                    task_vars["hostvars"][host]["allreduce_%s" % register] = {"skipped": True}
                    continue
                launch = sorted(other for other, other_args in by_host.items()
                                if other_args["master_port"] == args["master_port"])
                task_vars["hostvars"][host]["allreduce_%s" % register] = answer(phase, launch, host)
        outcome = ACTION.advance(ClusterView(task_vars), outcome)
    return outcome, seen


def _throttled(sick, clears):
    """``sick``'s link is slow in every round; in the retest it is slow still, or cleared (``clears``)."""
    def answer(phase, launch, host):
        if len(launch) == 1:
            return {"ranks": ranks(busbw=LOOP_BW)}
        if sick in launch and not (phase == "retest" and clears):
            return {"ranks": ranks(busbw=SLOW_BW)}
        return {"ranks": ranks(busbw=GOOD_BW)}
    return answer


# --------------------------------------------------------------------------
# Who is retested, and how


def test_a_node_named_for_a_fault_that_cleared_is_a_warn_with_both_measurements_and_is_confirmed():
    names = hosts(4)
    done, seen = _drive(names, _throttled("n2", clears=True))
    # Its retest pair passed: its run alone follows, a step of its own.
    assert seen[-2:] == ["retest", "retest"] and seen.count("retest") == 2
    summary = done["localize"]
    assert summary["bad"] == [] and "n2" not in summary["kinds"] and summary["retest"]["passed"] == ["n2"]
    check = done["checks_by_host"]["n2"]["allreduce"]["localize"]
    assert check["status"] == "warn" and "n2 failed, then passed on retest" in check["found"]
    # Both measurements: the rounds' slow pairs and the retest's busbw.
    assert "%.4f GB/s" % SLOW_BW in check["found"] and "%.4f GB/s" % GOOD_BW in check["found"]
    assert "retest pair" in check["found"] and "alone over lo passed" in check["found"]
    assert check["details"]["first"] and [launch["kind"] for launch in check["details"]["retest"]] == [
        "pair", "loopback"]
    # It is not drained: it joins the nodes left, which the confirmation run still has to prove together.
    assert done["confirm_plan"]["hosts"] == names and set(done["confirm_args_by_host"]) == set(names)
    for host in ("n0", "n1", "n3"):
        assert done["checks_by_host"][host]["allreduce"]["localize"]["status"] == "pass"


def test_a_node_whose_fault_persists_stays_named_with_the_retest_in_its_details_and_its_peers_are_clean():
    names = hosts(4)
    done, seen = _drive(names, _throttled("n2", clears=False))
    # Its retest pair failed: the retest failed, its run alone would change nothing and does not run.
    assert seen.count("retest") == 1
    summary = done["localize"]
    assert summary["bad"] == ["n2"] and summary["retest"]["failed"] == ["n2"] and summary["retest"]["passed"] == []
    check = done["checks_by_host"]["n2"]["allreduce"]["localize"]
    assert check["status"] == "fail" and "Retested once: retest pair" in check["found"] and "was slow" in check["found"]
    assert check["fix"].startswith("drain n2") and check["details"]["retest"][0]["verdict"] == "slow"
    assert [launch["kind"] for launch in check["details"]["retest"]] == ["pair"]
    assert done["confirm_plan"]["hosts"] == ["n0", "n1", "n3"]
    for host in ("n0", "n1", "n3"):
        assert done["checks_by_host"][host]["allreduce"]["localize"]["status"] == "pass"


def test_the_retest_pairs_each_node_with_its_own_good_node_then_runs_it_alone():
    planned = retest.plan(["n2", "n3"], ["n0", "n1"], base_args(hosts(4)),
                          {host: "198.18.200.%d" % index for index, host in enumerate(hosts(4))}, PORT, 5, FLOOR)
    pairs = [launch for launch in planned["launches"] if launch["kind"] == "pair"]
    loops = [launch for launch in planned["launches"] if launch["kind"] == "loopback"]
    assert [launch["hosts"] for launch in pairs] == [["n0", "n2"], ["n1", "n3"]]
    assert {launch["step"] for launch in pairs} == {0} and {launch["step"] for launch in loops} == {1}
    assert [launch["hosts"] for launch in loops] == [["n2"], ["n3"]]
    ports = [launch["master_port"] for launch in planned["launches"]]
    assert len(set(ports)) == 4 and min(ports) == loc.derived_port(PORT, 5)
    assert set(planned["steps"][0]) == {"n0", "n1", "n2", "n3"} and set(planned["steps"][1]) == {"n2", "n3"}
    assert planned["steps"][1]["n2"]["socket_ifname"] == "lo" and planned["steps"][0]["n2"]["nnodes"] == 2
    # The same sizes and floors as the rounds: the all-node plan's sizes, a deadline from the floor.
    assert planned["steps"][0]["n2"]["sizes"] == base_args(hosts(4))["n2"]["sizes"]
    assert planned["steps"][0]["n2"]["bandwidth_deadline"] > 0
    # No good node free: alone over lo only, in the first step.
    alone = retest.plan(["n2"], [], base_args(hosts(4)), {}, PORT, 0, FLOOR)
    assert [(launch["kind"], launch["step"]) for launch in alone["launches"]] == [("loopback", 0)]


def _rounds(pairs):
    """One recorded round of pair launches ``[(hosts, ranks result)]``."""
    launches = []
    for index, (pair, result) in enumerate(pairs):
        launches.append(dict({"kind": "pair", "hosts": pair, "step": 0, "master_port": PORT + 1 + index},
                             **loc.run_outcome(pair, {host: result for host in pair})))
    return [{"round": 1, "launches": launches}]


def test_wrong_data_is_never_retested_a_timeout_or_a_slow_run_is():
    wrong = {"ranks": [{"rank": 0, "status": "wrong", "stage": "done", "correct": False}]}
    timed_out = {"ranks": [{"rank": 0, "status": "error", "stage": "init", "error": "Timed out", "correct": None}]}
    good = {"ranks": ranks(busbw=GOOD_BW)}
    names = hosts(4)
    rounds = _rounds([(["n0", "n1"], good), (["n2", "n3"], wrong)])
    assert rounds[0]["launches"][1]["corrupt"] is True
    assert retest.candidates(names, rounds, FLOOR, ["n3"]) == []
    rounds = _rounds([(["n0", "n1"], good), (["n2", "n3"], timed_out)])
    assert rounds[0]["launches"][1]["corrupt"] is False
    assert retest.candidates(names, rounds, FLOOR, ["n3"]) == ["n3"]
    rounds = _rounds([(["n0", "n1"], good), (["n2", "n3"], {"ranks": ranks(busbw=SLOW_BW)})])
    assert retest.candidates(names, rounds, FLOOR, ["n2", "n3"]) == ["n2", "n3"]


def test_a_node_lost_in_the_rounds_is_not_retested_and_stays_failed():
    names = hosts(4)

    def answer(phase, launch, host):
        if host == "n3" and len(launch) == 2:
            return {"unreachable": True, "msg": "ssh timed out"}
        return {"ranks": ranks(busbw=GOOD_BW if len(launch) == 2 else LOOP_BW)}
    done, seen = _drive(names, answer)
    assert "retest" not in seen and done["localize"]["lost"] == ["n3"]
    assert done["localize"]["retest"]["hosts"] == []
    assert done["checks_by_host"]["n3"]["allreduce"]["localize"]["status"] == "fail"


def test_a_network_fault_cleared_only_alone_is_not_cleared():
    verdicts = retest.judge([], {"round": retest.RETEST_ROUND, "launches": [dict(
        {"kind": "loopback", "hosts": ["n2"], "step": 0, "master_port": PORT + 9},
        **loc.run_outcome(["n2"], {"n2": {"ranks": ranks(busbw=LOOP_BW)}}))]}, FLOOR, {"n2": "network"})
    assert verdicts["n2"]["passed"] is False and "cannot clear a network fault" in verdicts["n2"]["why"]
    node = retest.judge([], {"round": retest.RETEST_ROUND, "launches": [dict(
        {"kind": "loopback", "hosts": ["n2"], "step": 0, "master_port": PORT + 9},
        **loc.run_outcome(["n2"], {"n2": {"ranks": ranks(busbw=LOOP_BW)}}))]}, FLOOR, {"n2": "node"})
    assert node["n2"]["passed"] is True


def test_switched_off_no_retest_runs_and_the_node_is_named():
    done, seen = _drive(hosts(4), _throttled("n2", clears=True), retest_on=False)
    assert "retest" not in seen and done["localize"]["bad"] == ["n2"]
    assert done["localize"]["retest"] == {"enabled": False, "hosts": [], "passed": [], "failed": [], "launches": []}
    assert done["checks_by_host"]["n2"]["allreduce"]["localize"]["status"] == "fail"


# --------------------------------------------------------------------------
# Reconciled with the all-node run and the confirmation run; the bound


def test_after_the_confirmation_the_retested_node_warns_and_its_peers_pass_naming_it():
    names = hosts(4)
    done, _seen = _drive(names, _throttled("n2", clears=True))
    summary = dict(done["localize"], confirm={"hosts": names, "status": "pass", "busbw_gbps": GOOD_BW})
    first = {host: {"ranks": {"status": "fail", "found": "slow", "expected": "x", "fix": "y", "details": {}}}
             for host in names}
    confirm_checks = {host: {"ranks": {"status": "pass", "found": "ok", "expected": "x", "details": {}}}
                      for host in names}
    out = loc.reconcile(first, summary, confirm_checks)
    assert out["n2"]["first_run"]["status"] == "warn" and "failed, then passed on retest" in out["n2"]["first_run"][
        "found"]
    for host in ("n0", "n1", "n3"):
        assert out[host]["first_run"]["status"] == "pass" and "n2 (failed, then passed on retest)" in out[host][
            "first_run"]["found"]
    # The confirmation run failing proves nothing: every node of it is held (unverified), none blamed.
    held = loc.reconcile(first, dict(summary, confirm=dict(summary["confirm"], status="fail", reason="x")),
                         confirm_checks)
    assert all(held[host]["first_run"]["details"]["blocked"] for host in names)


@pytest.mark.parametrize("enabled, extra", [(True, retest.STEPS), (False, 0)])
def test_the_bound_counts_the_retest_steps(enabled, extra):
    view = ClusterView({"ansible_play_hosts_all": ["n1"], "hostvars": {"n1": {"preflight_settings": {
        "facts_timeout": 60, "probes_timeout": 120}}}})
    launch = {"gate": {"args_by_host": {"n1": {"wait_timeout": 200}}}}
    without = bounds.run_bound(view, {}, launch, {"needed": True, "localize": {}})
    bound = bounds.run_bound(view, {}, launch, {"needed": True, "localize": {"retest": {"enabled": enabled}}})
    assert bound - without == extra * (200 + bounds.CONNECT_BOUND)
