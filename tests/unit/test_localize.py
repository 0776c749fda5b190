"""Localisation of a failed or slow all-reduce in pair rounds (cluster_preflight/capabilities/allreduce/localize.py).

A fake cluster answers every planned launch from a fault model (a node fault fails every run of the node,
a network fault fails its pairs but not its run alone over lo, a slow link completes at a low busbw, a lost
node gives no result); the rounds are driven the way cluster_preflight/stages/localization.py drives them.
The action's glue, its GPU rounds and the confirmation run are in test_localize_action.py."""

import pytest

from cluster_preflight.capabilities.allreduce import localize as loc
from localize_helpers import PORT, base_args, hosts, localise, ranks, status


# --------------------------------------------------------------------------
# One bad node among 2, 3, 4 and 8, named in at most three rounds.


CASES = [(count, bad, kind) for count in (3, 4, 8) for bad in sorted({0, 1, count - 1})
         for kind in ("node", "network")] + [(2, 0, "node"), (2, 1, "node")]


@pytest.mark.parametrize("count,bad,kind", CASES)
def test_one_bad_node_is_named_in_at_most_three_rounds(count, bad, kind):
    names = hosts(count)
    summary, checks, plans = localise(names, {"host": names[bad], "kind": kind})
    assert summary["bad"] == [names[bad]]
    assert summary["kinds"][names[bad]] == kind
    assert len(plans) <= 3 and summary["rounds_run"] == len(plans)
    check = checks[names[bad]]["allreduce"]["localize"]
    assert check["status"] == "fail" and names[bad] in check["found"] and check["fix"]
    # What each pair measured is in the finding.
    assert "pair" in check["found"] or "loopback" in check["found"]
    others = [host for host in names if host != names[bad]]
    if count > 2:
        assert summary["good"] == others
        assert all(status(checks, host) == "pass" for host in others)
    else:
        # Two nodes: the healthy one has no third node to be proven good against, so it stays blocked.
        assert status(checks, others[0]) == "unverified"
    assert set(checks) == set(names)


@pytest.mark.parametrize("count", [4, 8])
def test_one_bad_node_among_four_or_eight_takes_two_rounds(count):
    names = hosts(count)
    summary, _checks, plans = localise(names, {"host": names[1], "kind": "network"})
    assert summary["rounds_run"] == 2
    # Round 2 retests each suspect against a node proven good, then runs each suspect alone over lo.
    pairs = [launch["hosts"] for launch in plans[1]["launches"] if launch["kind"] == "pair"]
    assert sorted(pair[1] for pair in pairs) == ["n0", "n1"]
    assert all(pair[0] in summary["good"] for pair in pairs)


def test_a_suspect_is_retested_against_a_good_node_before_it_is_named():
    # n1's slow pair with n0 (round 1) names nobody; n0 is proven only in round 2, so n1 is retested in round 3.
    summary, checks, plans = localise(hosts(3), {"host": "n1", "kind": "slow"}, floor={"absolute": 0.01,
                                                                                        "relative": 0.7})
    assert summary["bad"] == ["n1"] and summary["rounds_run"] == 3
    assert [launch["hosts"] for launch in plans[2]["launches"]] == [["n2", "n1"]]
    assert "pair n2+n1 in round 3 was slow" in checks["n1"]["allreduce"]["localize"]["found"]


def test_two_nodes_with_a_network_fault_name_nobody():
    summary, checks, plans = localise(hosts(2), {"host": "n1", "kind": "network"})
    # Both pass alone over lo and there is no third node: neither can be named, neither is proven.
    assert summary["bad"] == [] and summary["unproven"] == ["n0", "n1"]
    assert all(status(checks, host) == "unverified" for host in ("n0", "n1"))
    assert len(plans) <= 3


def test_healthy_pairs_end_after_round_one():
    summary, checks, plans = localise(hosts(4), {})
    assert len(plans) == 1 and summary["good"] == hosts(4) and summary["bad"] == []
    assert all(status(checks, host) == "pass" for host in hosts(4))


# --------------------------------------------------------------------------
# Floors


@pytest.mark.parametrize("count,bad", [(4, 0), (4, 3), (8, 2), (8, 7)])
def test_slow_link_is_named_by_the_relative_floor(count, bad):
    names = hosts(count)
    summary, checks, plans = localise(names, {"host": names[bad], "kind": "slow"},
                                      floor={"absolute": 0, "relative": 0.7})
    assert summary["bad"] == [names[bad]] and summary["kinds"][names[bad]] == "network"
    assert len(plans) <= 3
    found = checks[names[bad]]["allreduce"]["localize"]["found"]
    assert "median pair" in found and "0.0020 GB/s" in found


def test_slow_link_is_named_by_the_absolute_floor():
    names = hosts(4)
    summary, checks, _plans = localise(names, {"host": "n2", "kind": "slow"}, floor={"absolute": 0.01, "relative": 0})
    assert summary["bad"] == ["n2"]
    assert "below the floor 0.0100 GB/s" in checks["n2"]["allreduce"]["localize"]["found"]


def test_floors_disabled_pass_a_slow_link():
    summary, _checks, _plans = localise(hosts(4), {"host": "n2", "kind": "slow"},
                                        floor={"absolute": 0, "relative": 0})
    assert summary["bad"] == [] and summary["good"] == hosts(4)


@pytest.mark.parametrize("outcome,floor,needed", [
    ({"status": "fail", "busbw_gbps": None, "reason": "rank 1 died"}, 0, True),
    ({"status": "lost", "busbw_gbps": None, "reason": "n1: unreachable"}, 0, True),
    ({"status": "done", "busbw_gbps": 0.002, "reason": ""}, 0.01, True),
    ({"status": "done", "busbw_gbps": 0.002, "reason": ""}, 0, False),
    ({"status": "done", "busbw_gbps": 0.1, "reason": ""}, 0.01, False),
])
def test_all_node_trigger(outcome, floor, needed):
    assert loc.all_node_trigger(outcome, {"absolute": floor, "relative": 0.7})[0] is needed


def test_the_floor_is_built_once_per_backend_from_the_role_s_settings():
    from capability_helpers import role_settings  # pylint: disable=import-outside-toplevel
    from cluster_preflight.capabilities import allreduce  # pylint: disable=import-outside-toplevel
    settings = role_settings("allreduce", allreduce_floor_busbw_gbps_gloo=0.01, allreduce_floor_busbw_gbps_nccl=1.0,
                             allreduce_floor_relative=0.7)
    assert allreduce.floor(settings, "nccl") == {"absolute": 1.0, "relative": 0.7, "grace": 10.0}
    assert allreduce.floor(settings, "gloo")["absolute"] == 0.01
    assert allreduce.floor(dict(settings, allreduce_slow_grace=3), "gloo")["grace"] == 3.0
    single = allreduce.floor(dict(settings, allreduce_floor_single_busbw_gbps_nccl=50), "nccl", single=True)
    assert single == {"absolute": 50.0, "relative": 0.0, "grace": 10.0}


def test_the_bandwidth_deadline_is_the_sweep_at_the_floor_plus_start_up():
    # 8 ranks: bus factor 2*7/8 = 1.75; 7 collectives of 16 MiB and 7 of 1 MiB at 0.01 GB/s, plus 10 s.
    sizes, mib = [1 << 20, 16 << 20], 1 << 20
    expected = (7 * 17 * mib * 1.75) / 1e7 + 10
    assert loc.bandwidth_deadline(sizes, 5, 2, 8, 0.01, 10) == pytest.approx(expected, abs=1e-3)
    # One rank: busbw is algbw (factor 1); no floor: no deadline.
    assert loc.bandwidth_deadline([mib], 1, 0, 1, 0.001, 0) == pytest.approx(mib / 1e6, abs=1e-3)
    assert loc.bandwidth_deadline(sizes, 5, 2, 8, 0, 10) == 0


def test_pairs_and_loopbacks_get_a_deadline_for_their_own_world_size():
    names = hosts(2)
    base = base_args(names)
    floor = {"absolute": 0.01, "relative": 0, "grace": 5}
    pair = loc.pair_args(base, names, "198.18.200.1", PORT + 1, floor)
    nproc = base["n1"]["nproc_per_node"]
    assert pair["n1"]["bandwidth_deadline"] == loc.bandwidth_deadline(
        base["n1"]["sizes"], base["n1"]["iters"], base["n1"]["warmup"], 2 * nproc, 0.01, 5)
    alone = loc.loopback_args(base["n1"], PORT + 2, floor)
    assert alone["bandwidth_deadline"] == loc.bandwidth_deadline(
        base["n1"]["sizes"], base["n1"]["iters"], base["n1"]["warmup"], nproc, 0.01, 5)
    assert alone["bandwidth_deadline"] < pair["n1"]["bandwidth_deadline"]
    # The rounds ask about speed: a smaller (still exact) correctness check than the all-node run's.
    assert pair["n1"]["check_elements"] == alone["check_elements"] == loc.ROUND_CHECK_ELEMENTS


def test_a_launch_ended_at_its_deadline_is_slow_at_the_busbw_it_reached():
    slow = {"deadline_seconds": 12.0, "elapsed_seconds": 12.1, "size_bytes": 1 << 20, "collectives_done": 3,
            "busbw_reached_gbps": 0.002}
    results = {"n1": {"ranks": [{"rank": 0, "status": "slow", "stage": "bandwidth", "slow": slow},
                                {"rank": 1, "status": "slow", "stage": "bandwidth", "slow": dict(slow, busbw_reached_gbps=0.003)}]},
               "n2": {"ranks": [{"rank": 2, "status": "error", "stage": "bandwidth", "error": "Connection reset by peer"},
                                {"rank": 3, "status": "slow", "stage": "bandwidth", "slow": slow}]}}
    outcome = loc.run_outcome(["n1", "n2"], results)
    assert outcome["status"] == "slow" and outcome["busbw_gbps"] == 0.002, outcome
    assert "deadline of 12.0 s" in outcome["reason"]
    needed, why = loc.all_node_trigger(outcome, {"absolute": 0.01, "relative": 0.7})
    assert needed and "was slow" in why
    launches, _median = loc.graded([{"round": 1, "launches": [dict(outcome, kind="pair", hosts=["n1", "n2"])]}],
                                   {"absolute": 0.01, "relative": 0.7})
    assert launches[0]["verdict"] == "slow" and "deadline" in launches[0]["why"]
    # Wrong data is never hidden behind slow.
    results["n2"]["ranks"][1] = {"rank": 3, "status": "wrong", "stage": "done", "correct": False}
    assert loc.run_outcome(["n1", "n2"], results)["status"] == "fail"


# --------------------------------------------------------------------------
# Loopback: node fault or network fault


@pytest.mark.parametrize("kind,why", [("node", "node fault"), ("network", "network fault")])
def test_loopback_tells_a_node_fault_from_a_network_fault(kind, why):
    summary, checks, _plans = localise(hosts(4), {"host": "n3", "kind": kind})
    assert summary["kinds"] == {"n3": kind}
    found = checks["n3"]["allreduce"]["localize"]["found"]
    assert why in found and "loopback of n3 over lo" in found


def test_loopback_runs_alone_over_lo():
    names = hosts(3)
    planned = loc.plan_round(1, names, [], base_args(names), {h: h for h in names}, PORT,
                             {"absolute": 0, "relative": 0})
    args = planned["steps"][0]["n2"]
    assert args["nnodes"] == 1 and args["node_rank"] == 0 and args["master_addr"] == "127.0.0.1"
    assert args["socket_ifname"] == "lo" and args["stack_budget"] == 0
    assert args["env"] == {"A": "1", "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}


# --------------------------------------------------------------------------
# Plans: disjoint, bounded, distinct ports, the all-node arguments' shape


@pytest.mark.parametrize("count", [2, 3, 4, 5, 8, 9])
def test_rounds_are_disjoint_with_distinct_ports(count):
    names = hosts(count)
    _summary, _checks, plans = localise(names, {"host": names[-1], "kind": "network"})
    ports = []
    for planned in plans:
        for step in (0, 1):
            seen = [host for launch in planned["launches"] if launch["step"] == step for host in launch["hosts"]]
            assert len(seen) == len(set(seen)), "a host twice in one step"
        ports.extend(launch["master_port"] for launch in planned["launches"])
    assert len(ports) == len(set(ports)) and all(port > PORT for port in ports)


def test_pair_args_keep_the_all_node_shape():
    names = hosts(4)
    base = base_args(names)
    planned = loc.plan_round(1, names, [], base, {h: "198.18.200.%s" % h[1:] for h in names}, PORT,
                             {"absolute": 0, "relative": 0})
    first, second = planned["steps"][0]["n2"], planned["steps"][0]["n3"]
    assert set(first) == set(base["n2"])
    assert (first["nnodes"], first["node_rank"], second["node_rank"]) == (2, 0, 1)
    assert first["master_addr"] == second["master_addr"] == "198.18.200.2"
    assert first["master_port"] == second["master_port"] != PORT
    assert first["socket_ifname"] == "eth0" and first["env"] == {"A": "1"}
    # How a round's launch ended is what counts, never its stacks: it takes none and ends when seen failing.
    assert first["stack_budget"] == 0 and base["n2"]["stack_budget"] == 20


def test_the_confirmation_run_keeps_its_stack_budget():
    names = hosts(3)
    plan = loc.confirm_plan(names, base_args(names), {h: h for h in names}, PORT, {"absolute": 0, "relative": 0})
    assert {args["stack_budget"] for args in plan["args_by_host"].values()} == {20}


# --------------------------------------------------------------------------
# A node lost in a round is accounted, its partner not blamed


@pytest.mark.parametrize("lost_round", [1, 2])
def test_node_lost_in_a_round_is_named_and_its_partner_not_blamed(lost_round):
    names = hosts(4)
    # n1 breaks its pair (round 1), then stops answering in lost_round.
    summary, checks, plans = localise(names, {"host": "n1", "kind": "network", "lost": "n1",
                                              "lost_round": lost_round})
    assert summary["lost"] == ["n1"]
    check = checks["n1"]["allreduce"]["localize"]
    assert check["status"] == "fail" and "stopped answering during localisation round %d" % lost_round in check["found"]
    assert "n0" in summary["good"] and status(checks, "n0") == "pass"
    assert set(checks) == set(names) and len(plans) <= 3


def test_nodes_excluded_before_the_rounds_are_accounted():
    summary, checks = loc.conclude(["n0", "n1"], [], {"absolute": 0, "relative": 0}, "test",
                                   excluded={"n2": "lost before the rounds"})
    assert status(checks, "n2") == "unverified" and summary["excluded"] == {"n2": "lost before the rounds"}


def test_run_outcome():
    assert loc.run_outcome(["a", "b"], {"a": {"ranks": ranks()}, "b": "unreachable"})["status"] == "lost"
    assert loc.run_outcome(["a"], {"a": {"ranks": ranks(ok=False)}})["status"] == "fail"
    done = loc.run_outcome(["a", "b"], {"a": {"ranks": ranks(busbw=0.3)}, "b": {"ranks": ranks(busbw=0.2)}})
    assert done == {"status": "done", "busbw_gbps": 0.2, "lost": {}, "reason": ""}
