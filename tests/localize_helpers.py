"""Shared helpers of the all-reduce localisation unit tests (tests/unit/test_localize.py,
tests/unit/test_localize_action.py): a fake cluster that answers every planned launch of
cluster_preflight/capabilities/allreduce/localize.py from a fault model, and the rounds driven to their end.
Test-side, not shipped."""

from cluster_preflight.capabilities.allreduce import localize as loc
from cluster_preflight.stages import localization
from preflight_node.checks import node_status

GOOD_BW, SLOW_BW, LOOP_BW = 0.1, 0.002, 0.5
PORT = 6000
# The floor the launch plan carries for the all-node run (capabilities/allreduce floor()) with those settings.
RUN_FLOOR = {"absolute": 0.01, "relative": 0.7, "grace": 10.0}


def hosts(count):
    return ["n%d" % index for index in range(count)]


def base_args(names):
    return {host: {"python": "/usr/bin/python3", "nnodes": len(names), "node_rank": index, "nproc_per_node": 2,
                   "master_addr": "198.18.200.0", "master_port": PORT, "backend": "gloo", "timeout": 30,
                   "hard_timeout": 120, "stack_budget": 20, "sizes": [1048576], "iters": 3, "warmup": 1, "bandwidth_deadline": 0, "bandwidth_grace": 10.0, "check_elements": 0,
                   "min_busbw_gbps": 0, "socket_ifname": "eth0", "role": host, "run_as": "", "env": {"A": "1"},
                   "keep_scratch": False, "selftest_fault": "none", "selftest_rank": -1, "wait_timeout": 200}
            for index, host in enumerate(names)}


def ranks(ok=True, busbw=GOOD_BW):
    if not ok:
        return [{"rank": 0, "status": "error", "stage": "init", "error": "Connection reset by peer", "correct": False}]
    return [{"rank": rank, "status": "ok", "stage": "done", "correct": True,
             "bandwidth": [{"size_bytes": 1048576, "busbw_gbps": busbw, "algbw_gbps": busbw}]} for rank in (0, 1)]


def answer(launch, round_no, fault):
    """Each host's module result for one launch under ``fault`` {host (or hosts: several bad nodes), kind,
    lost_round}."""
    bad, kind = set(fault.get("hosts") or [fault.get("host")]), fault.get("kind")
    out = {}
    for host in launch["hosts"]:
        if fault.get("lost") == host and round_no >= fault.get("lost_round", 1):
            out[host] = "unreachable while running the all-reduce: ssh timed out"
            continue
        involved = bool(bad.intersection(launch["hosts"]))
        if kind == "group":
            # A node that fails only with two peers or more (it refuses connections past a count).
            out[host] = {"ranks": ranks(ok=not (involved and len(launch["hosts"]) > 2))}
        elif launch["kind"] == "loopback":
            out[host] = {"ranks": ranks(ok=not (involved and kind == "node"), busbw=LOOP_BW)}
        elif involved and kind in ("node", "network"):
            out[host] = {"ranks": ranks(ok=False)}
        elif involved and kind == "slow":
            out[host] = {"ranks": ranks(busbw=SLOW_BW)}
        elif involved and kind == "noisy" and launch["kind"] == "pair" and round_no == fault.get("noisy_round"):
            # A healthy node whose pair is slow once (a loaded machine), then fine.
            out[host] = {"ranks": ranks(busbw=GOOD_BW / 4)}
        else:
            out[host] = {"ranks": ranks()}
    return out


def localise(names, fault, floor=None):
    """Drive up to three rounds; ``(summary, checks_by_host, planned rounds)``."""
    floor = floor or {"absolute": 0.01, "relative": 0.7}
    addr = {host: "198.18.200.%d" % index for index, host in enumerate(names)}
    base = base_args(names)
    rounds, plans = [], []
    for round_no in range(1, loc.MAX_ROUNDS + 1):
        if round_no > 1 and not loc.ambiguous(names, rounds, floor):
            break
        planned = loc.plan_round(round_no, names, rounds, base, addr, PORT, floor)
        if not planned["launches"]:
            break
        plans.append(planned)
        results = [{}, {}]
        for launch in planned["launches"]:
            results[launch["step"]].update(answer(launch, round_no, fault))
        rounds.append(loc.record(planned, results))
    summary, checks = loc.conclude(names, rounds, floor, "test", elapsed=0)
    return summary, checks, plans


def status(checks, host):
    return node_status({"allreduce.localize": checks[host]["allreduce"]["localize"]})


def action_module():
    """The localisation's state machine (cluster_preflight/stages/localization.py), which the action
    preflight_localize steps."""
    return localization


def task_vars(names, jobs):
    """What the nodes registered up to the all-node run's collection (``jobs``: each node's result)."""
    settings = {"allreduce_floor_busbw_gbps_gloo": 0.01, "allreduce_floor_relative": 0.7,
                "allreduce_master_port": PORT, "allreduce_localize": True}
    gate = {"launch": True, "hosts": names, "backend": "gloo", "master_port": PORT, "args_by_host": base_args(names),
            "floor": RUN_FLOOR}
    hostvars = {host: {"preflight_settings": {"settings": {"allreduce": settings},
                                              "node": {"name": host, "node_addr": "198.18.200.%d" % index}},
                       "preflight_launch": {"gate": gate}, "preflight_plan": {"nic": {"addr_by_host": {}}},
                       "preflight_probes": {"job": jobs[host]}}
                for index, host in enumerate(names)}
    return {"ansible_play_hosts_all": names, "hostvars": hostvars}
