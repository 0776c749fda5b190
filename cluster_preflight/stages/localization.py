# -*- coding: utf-8 -*-
"""The localisation rounds of a failed or slow all-reduce: a state machine the controller steps between node calls.

:func:`step` is what ``action_plugins/preflight_localize.py`` runs (its documentation: ``library/preflight_localize.py``):
called once with ``start`` after the all-node run was collected, then once after each round
(``roles/allreduce/tasks/localize.yml``), it folds the round's results (registered as ``allreduce_localize_first``
and ``allreduce_localize_second``) into the rounds so far and plans the next round, or concludes with
``checks_by_host`` for the verdict.  Before it concludes, the nodes named for a slow or failed run are retested once
(``cluster_preflight/capabilities/allreduce/retest.py``; registers ``allreduce_retest_first`` and
``allreduce_retest_second``); when every pair passed, group rounds follow
(``cluster_preflight/capabilities/allreduce/groups.py``); a node named for a node fault gets GPU pair rounds
(``gpu_pairs.py``); then one confirmation run over the nodes left (``confirm``).  The planning and judging are the
pure functions of ``cluster_preflight/capabilities/allreduce/``; this module reads what the nodes registered and
keeps the state between the steps.  Never raises: what it finds is a check on a node.
"""

from __future__ import annotations

import time
import traceback

from cluster_preflight import capabilities
from cluster_preflight.capabilities.allreduce import gpu_pairs, groups, localize, retest
from cluster_preflight.capabilities.allreduce.outcome import own_faults
from cluster_preflight.plays import stage_results
from cluster_preflight.stages.run_lock import round_lock
from cluster_preflight.stages.view import ClusterView, outcome as localize_outcome, without_gc
from preflight_node.checks import error

REGISTER = stage_results.LOCALIZE
STEP_REGISTERS = (stage_results.LOCALIZE_FIRST, stage_results.LOCALIZE_SECOND)
GPU_REGISTER = stage_results.LOCALIZE_GPU
RETEST_REGISTERS = (stage_results.RETEST_FIRST, stage_results.RETEST_SECOND)
CONFIRM_REGISTER = stage_results.CONFIRM
# Steps of the rounds at least: three node rounds, the retest's two, three GPU rounds.
STEPS_MAX = localize.MAX_ROUNDS + 2 + localize.MAX_ROUNDS


def _node_result(view, host, register, pick=None):
    """A node's ``allreduce`` result from ``register``, or why there is none (text)."""
    state, message = view.outcome(host, register)
    if state != "ok":
        return "%s while running the all-reduce: %s" % (state, message[:300])
    result = view.read(host, register) or {}
    if pick:
        result = result.get(pick) or {}
    if isinstance(result.get("ranks"), list):
        return result
    no_result = (result.get("checks") or {}).get("no_result") or {}
    return str(no_result.get("found") or result.get("msg") or "no rank results from %s" % host)[:300]


def start(view):
    first = view.hosts[0]
    gate = (view.read(first, stage_results.LAUNCH) or {}).get("gate") or {}
    if not gate.get("launch") or not gate.get("args_by_host"):
        return {"needed": False, "done": True, "why": "the all-reduce was not launched"}
    gate_hosts = [host for host in gate.get("hosts") or [] if host in gate["args_by_host"]]
    results = {host: _node_result(view, host, stage_results.PROBES, pick="job") for host in gate_hosts}
    settings = view.settings.get(gate_hosts[0], {}).get("allreduce") or {}
    run = view.settings.get(gate_hosts[0], {}).get(capabilities.RUN_ROLE) or {}
    # The floor the launch plan built for the all-node run (capabilities/allreduce floor()).
    floor = gate["floor"]
    outcome = localize.run_outcome(gate_hosts, results)
    needed, why = localize.all_node_trigger(outcome, floor)
    if not needed or len(gate_hosts) < 2 or not settings.get("allreduce_localize", True):
        return {"needed": False, "done": True, "why": why}
    excluded = {}
    for host in gate_hosts:
        state, message = view.outcome(host, stage_results.PROBES)
        if state != "ok":
            excluded[host] = "lost before the rounds (%s while collecting the all-reduce: %s)" % (state, message[:200])
    for host, reason in own_faults({host: result for host, result in results.items() if host not in excluded}).items():
        excluded[host] = "named by the all-node run itself: %s (allreduce.suspect_rank_*)" % reason
    hosts = [host for host in gate_hosts if host not in excluded]
    addr = dict(((view.read(first, stage_results.PLAN) or {}).get("nic") or {}).get("addr_by_host") or {})
    for host in hosts:
        addr.setdefault(host, view.nodes[host]["node_addr"])
    state = {"hosts": hosts, "excluded": excluded, "floor": floor, "trigger": why, "rounds": [],
             "base_args_by_host": {host: gate["args_by_host"][host] for host in hosts}, "addr_by_host": addr,
             "master_port": int(gate.get("master_port") or settings.get("allreduce_master_port") or 6000),
             "backend": gate.get("backend"), "gpu_pairs": bool(settings.get("allreduce_gpu_pairs", True)),
             "gpus_by_host": {host: (view.capability_facts("allreduce", [host]).get(host) or {}).get("gpus") or []
                              for host in hosts},
             "retest": bool(run.get("preflight_retest_allreduce", True)), "started": time.time()}
    # The most steps the rounds may take: the pair rounds, the retest and the GPU pairs, or the group rounds.
    return dict(plan_next(state, 1), steps_max=max(STEPS_MAX, localize.MAX_ROUNDS + groups.max_rounds(len(hosts))))


def plan_next(state, round_no):
    planned = localize.plan_round(round_no, state["hosts"], state["rounds"], state["base_args_by_host"],
                                  state["addr_by_host"], state["master_port"], state["floor"])
    if not planned["launches"] or (round_no > 1 and not localize.ambiguous(state["hosts"], state["rounds"],
                                                                           state["floor"])):
        return finish(state)
    state = dict(state, planned={"round": planned["round"], "launches": planned["launches"]})
    return {"needed": True, "done": False, "round": round_no, "first_args_by_host": planned["steps"][0],
            "second_args_by_host": planned["steps"][1], "gpu_slots_by_host": {}, "state": state}


def finish(state):
    summary, checks_by_host = localize.conclude(state["hosts"], state["rounds"], state["floor"], state["trigger"],
                                                state["excluded"], round(time.time() - state["started"], 1))
    summary["retest"] = {"enabled": bool(state.get("retest")), "hosts": [], "passed": [], "failed": [],
                         "launches": []}
    if state.get("retest") and "retest_round" not in state:
        # Before a node is named for a slow or failed run: one more bounded step, its pair with a node proven
        # good and its run alone over lo (cluster_preflight/capabilities/allreduce/retest.py).
        again = retest.candidates(state["hosts"], state["rounds"], state["floor"], summary["bad"])
        if again:
            return plan_retest(state, again, summary["good"])
    if state.get("retest_round"):
        verdicts = retest.judge(state["rounds"], state["retest_round"], state["floor"], summary["kinds"])
        summary, checks_by_host = retest.apply(summary, checks_by_host, state["hosts"], state["rounds"],
                                               state["floor"], verdicts)
        summary["retest"]["enabled"] = True
    if "group_rounds" not in state and groups.applies(state["hosts"], summary):
        # Every pair passed and yet the all-node run did not: a fault that shows only in a large group.
        return plan_groups(dict(state, group_rounds=[], node_conclusion=[summary, checks_by_host]))
    return after_nodes(state, summary, checks_by_host)


def plan_groups(state):
    """The next group round (``cluster_preflight/capabilities/allreduce/groups.py``), or the groups' conclusion folded
    into the pair
    rounds' (then the GPU pairs and the confirmation run follow, as after the pair rounds)."""
    serial = sum(len(item["launches"]) for item in state["rounds"] + state["group_rounds"] +
                 ([state["retest_round"]] if state.get("retest_round") else []))
    planned = groups.plan(state["hosts"], state["group_rounds"], state["base_args_by_host"], state["addr_by_host"],
                          state["master_port"], serial, state["floor"])
    if not planned["launches"]:
        summary, checks_by_host = groups.with_groups(*state["node_conclusion"], *groups.conclude(
            state["hosts"], state["group_rounds"], state["floor"]))
        summary["elapsed_seconds"] = round(time.time() - state["started"], 1)
        return after_nodes(dict(state, phase="nodes"), summary, checks_by_host)
    state = dict(state, phase="groups", planned={"round": planned["round"], "launches": planned["launches"]})
    return {"needed": True, "done": False, "round": planned["round"], "first_args_by_host": planned["steps"][0],
            "second_args_by_host": planned["steps"][1], "gpu_slots_by_host": {}, "state": state}


def advance_groups(view, state):
    """Fold a group round's results in (registered like a pair round's) and plan the next one."""
    planned = state["planned"]
    results_by_step = [{}, {}]
    for launch in planned["launches"]:
        for host in launch["hosts"]:
            results_by_step[launch["step"]][host] = _node_result(view, host, STEP_REGISTERS[launch["step"]])
    state = dict(state, group_rounds=state["group_rounds"] + [localize.record(planned, results_by_step)])
    state.pop("planned", None)
    return plan_groups(state)


def after_nodes(state, summary, checks_by_host):
    """After the node rounds (and the groups): the GPU pairs of a node named for a node fault, or the end."""
    # A node named for a node fault (it fails alone over lo too) with two GPUs or more: which GPU?
    nodes = [host for host in summary["bad"] if summary["kinds"].get(host) == "node"] if state.get("gpu_pairs") else []
    gpu = {host: {"gpus": state["gpus_by_host"].get(host) or [], "rounds": []} for host in nodes
           if gpu_pairs.applies(state.get("backend"), state["gpus_by_host"].get(host) or [])[0]}
    if gpu:
        serial = sum(len(item["launches"]) for item in state["rounds"])
        state = dict(state, phase="gpus", gpu=gpu, node_conclusion=[summary, checks_by_host],
                     gpu_master_port=localize.derived_port(state["master_port"], serial))
        return plan_gpus(state, 1)
    return _done(state, summary, checks_by_host)


def plan_retest(state, hosts, good):
    """The retest over ``hosts`` (named by the rounds for a slow or failed run), with nodes of ``good``: its first
    step (each node's pair with a node proven good; alone over lo where none was free).  Its run alone follows
    only where the pair passed (:func:`advance_retest`): a failed pair fails the retest whatever the run alone does."""
    serial = sum(len(item["launches"]) for item in state["rounds"])
    planned = retest.plan(hosts, good, state["base_args_by_host"], state["addr_by_host"], state["master_port"],
                          serial, state["floor"])
    state = dict(state, phase="retest", planned={"round": planned["round"], "launches": planned["launches"]},
                 retest_steps=[planned["steps"][0], planned["steps"][1]], retest_step=0)
    return {"needed": True, "done": False, "round": planned["round"], "first_args_by_host": {},
            "second_args_by_host": {}, "gpu_slots_by_host": {}, "retest_first_args_by_host": planned["steps"][0],
            "retest_second_args_by_host": {}, "state": state}


def advance_retest(view, state):
    """Fold a retest step's results in.  After the first, the runs alone of the nodes whose pair passed are the
    second step; the others' are dropped (their retest failed).  Then conclude (the GPU pairs and the confirmation
    run follow)."""
    planned, step = state["planned"], state.get("retest_step", 0)
    results = dict(state.get("retest_results") or {})
    for launch in planned["launches"]:
        if launch["step"] == step:
            for host in launch["hosts"]:
                results["%d:%s" % (step, host)] = _node_result(view, host, RETEST_REGISTERS[step])
    by_step = [{key.split(":", 1)[1]: value for key, value in results.items() if key.startswith("%d:" % index)}
               for index in (0, 1)]
    if step == 0:
        first = dict(planned, launches=[launch for launch in planned["launches"] if launch["step"] == 0])
        verdicts = retest.judge(state["rounds"], localize.record(first, by_step), state["floor"],
                                localize.judge(state["hosts"], state["rounds"], state["floor"])[2])
        due = [launch for launch in planned["launches"] if launch["step"] == 1
               and (verdicts.get(launch["hosts"][0]) or {}).get("passed")]
        planned = dict(planned, launches=[launch for launch in planned["launches"] if launch["step"] == 0] + due)
        if due:
            second = {launch["hosts"][0]: state["retest_steps"][1][launch["hosts"][0]] for launch in due}
            state = dict(state, planned=planned, retest_step=1, retest_results=results)
            return {"needed": True, "done": False, "round": planned["round"], "first_args_by_host": {},
                    "second_args_by_host": {}, "gpu_slots_by_host": {}, "retest_first_args_by_host": {},
                    "retest_second_args_by_host": second, "state": state}
    state = dict(state, phase="nodes", retest_round=localize.record(planned, by_step))
    for key in ("planned", "retest_steps", "retest_step", "retest_results"):
        state.pop(key, None)
    return finish(state)


def _done(state, summary, checks_by_host):
    """The conclusion, with the confirmation run over the nodes left (neither named bad nor lost) planned:
    one more all-node all-reduce on them, on the run's own master port, so a pass means "launch on these
    and it works"."""
    left = [host for host in state["hosts"] if host not in summary["bad"] and host not in summary["lost"]]
    confirm = localize.confirm_plan(left, state["base_args_by_host"], state["addr_by_host"], state["master_port"],
                                    state["floor"]) if left else None
    summary = dict(summary, confirm={"hosts": left, "status": "planned" if left else "skipped",
                                     "reason": "" if left else "no node is left to confirm"})
    return {"needed": True, "done": True, "round": len(state["rounds"]), "first_args_by_host": {},
            "second_args_by_host": {}, "gpu_slots_by_host": {}, "checks_by_host": checks_by_host,
            "localize": summary, "confirm_args_by_host": (confirm or {}).get("args_by_host") or {},
            "confirm_plan": confirm, "floor": state["floor"]}


def fold_confirm(view, previous):
    """The concluded localisation with the confirmation run's outcome folded in (register ``CONFIRM_REGISTER``):
    ``localize.confirm`` says whether the nodes left passed together, and a node the rounds could not prove is
    proven by it (``allreduce.localize`` passes) when it did.  The per-node checks of that run are the final
    stage's (``preflight_stages.stage_final``)."""
    plan = previous["confirm_plan"]
    results = {host: _node_result(view, host, CONFIRM_REGISTER) for host in plan["hosts"]}
    floor = previous.get("floor") or {}
    outcome = localize.run_outcome(plan["hosts"], results)
    graded = localize.graded([{"round": 0, "launches": [dict(outcome, kind="confirm", hosts=plan["hosts"])]}],
                             floor)[0][0]
    summary = dict(previous["localize"], confirm={
        "hosts": plan["hosts"], "status": graded["verdict"], "busbw_gbps": outcome.get("busbw_gbps"),
        "reason": graded.get("why") or "", "master_port": plan["master_port"], "lost": sorted(outcome["lost"])})
    checks_by_host = localize.confirm_localize_checks(previous.get("checks_by_host") or {}, summary["confirm"])
    return dict(previous, localize=summary, checks_by_host=checks_by_host, confirm_args_by_host={})


def plan_gpus(state, round_no):
    """GPU pair round ``round_no`` on every node in the GPU phase: its launches, one after another (slots)."""
    gpu, slots = dict(state["gpu"]), {}
    for host, item in gpu.items():
        if round_no > 1 and not gpu_pairs.ambiguous(item["gpus"], item["rounds"], state["floor"]):
            continue
        planned = gpu_pairs.plan_round(round_no, item["gpus"], item["rounds"], state["base_args_by_host"][host],
                                       state["gpu_master_port"], state["floor"])
        if planned["launches"]:
            gpu[host] = dict(item, planned={"round": round_no, "launches": planned["launches"]})
            slots[host] = planned["slots"]
    if not slots:
        return finish_gpus(dict(state, gpu=gpu))
    return {"needed": True, "done": False, "round": round_no, "first_args_by_host": {}, "second_args_by_host": {},
            "gpu_slots_by_host": slots, "state": dict(state, gpu=gpu, gpu_round=round_no)}


def finish_gpus(state):
    summary, checks_by_host = state["node_conclusion"]
    summary = dict(summary, gpus={})
    for host, item in state["gpu"].items():
        found, check = gpu_pairs.conclude(host, item["gpus"], item["rounds"], state["floor"],
                                          "%s is a node fault: its own all-reduce over lo failed or was slow" % host)
        summary["gpus"][host] = found
        checks_by_host.setdefault(host, {}).setdefault("allreduce", {})[gpu_pairs.CHECK_NAME] = check
    summary["elapsed_seconds"] = round(time.time() - state["started"], 1)
    return _done(state, summary, checks_by_host)


def advance_gpus(view, state):
    gpu = {}
    for host, item in state["gpu"].items():
        planned = item.get("planned")
        if not planned:
            gpu[host] = item
            continue
        state_, message = view.outcome(host, GPU_REGISTER)
        entries = (view.result(host, GPU_REGISTER) or {}).get("results") or []
        if state_ in ("unreachable", "missing", "skipped") or not entries:
            # The node itself stopped answering: every launch of the round is lost.
            entries = ["%s while running the GPU pairs: %s" % (state_, message[:300])] * len(planned["launches"])
        results = [_slot_result(entry) for entry in entries]
        gpu[host] = {"gpus": item["gpus"], "rounds": item["rounds"] + [gpu_pairs.record(planned, results)]}
    state = dict(state, gpu=gpu)
    if state["gpu_round"] >= localize.MAX_ROUNDS:
        return finish_gpus(state)
    return plan_gpus(state, state["gpu_round"] + 1)


def _slot_result(entry):
    """One GPU pair launch's ``allreduce`` result (a loop item), or why there is none."""
    if isinstance(entry, str):
        return entry
    state_, message = localize_outcome(entry)
    if state_ != "ok":
        return "%s while running a GPU pair: %s" % (state_, message[:300])
    return entry if isinstance(entry.get("ranks"), list) else "no rank results from the GPU pair"


def advance(view, previous):
    state = previous["state"]
    if state.get("phase") == "gpus":
        return advance_gpus(view, state)
    if state.get("phase") == "retest":
        return advance_retest(view, state)
    if state.get("phase") == "groups":
        return advance_groups(view, state)
    planned = state["planned"]
    results_by_step = [{}, {}]
    for launch in planned["launches"]:
        for host in launch["hosts"]:
            results_by_step[launch["step"]][host] = _node_result(view, host, STEP_REGISTERS[launch["step"]])
    state = dict(state, rounds=state["rounds"] + [localize.record(planned, results_by_step)])
    state.pop("planned", None)
    if planned["round"] >= localize.MAX_ROUNDS:
        return finish(state)
    return plan_next(state, planned["round"] + 1)


LAUNCH_KEYS = ("first_args_by_host", "second_args_by_host", "retest_first_args_by_host",
               "retest_second_args_by_host")


def with_round_lock(view, outcome):
    """``outcome`` with the lock every node the run holds renews for the round it plans: its launches carry it
    (the first renews it), and ``lock`` for the nodes with no launch in the round's first step, which renew it
    in a call of their own (``roles/allreduce/tasks/localize_round.yml``); unchanged once done, or without a run
    lock."""
    outcome = {key: value for key, value in outcome.items() if key != "lock"}
    if not view.hosts or not outcome.get("needed") or outcome.get("done"):
        return outcome
    lock = round_lock((view.result(view.hosts[0], stage_results.INPUTS) or {}).get("lock"), outcome)
    if not lock:
        return outcome
    outcome.update({key: {host: dict(args, lock=lock) for host, args in (outcome.get(key) or {}).items()}
                    for key in LAUNCH_KEYS if key in outcome})
    outcome["gpu_slots_by_host"] = {host: [dict(args, lock=lock) for args in slots or []]
                                    for host, slots in (outcome.get("gpu_slots_by_host") or {}).items()}
    return dict(outcome, lock=lock)


def counted(previous, outcome):
    """``outcome`` with the steps planned so far.  ``localize_round.yml`` includes itself until the localisation is
    done, so a plan past ``steps_max`` (a defect) ends it here, as an error every node is given: the run goes on to
    its verdict, never around in rounds."""
    steps = int(previous.get("steps") or 0) + 1
    limit = int(previous.get("steps_max") or STEPS_MAX)
    if not outcome.get("done") and steps >= limit:
        raise RuntimeError("the localisation planned more than its %d steps" % limit)
    return dict(outcome, steps=steps, steps_max=limit)


def step(task_vars: dict, start_round: bool = False, confirm: bool = False) -> dict:
    """The localisation's next state from what the nodes registered (``task_vars``: the play's ``hostvars`` and
    ``ansible_play_hosts_all``): the first round planned (``start_round``), the confirmation run folded in
    (``confirm``), or the round just run folded in and the next one planned.  A defect here never costs the
    verdict: every node gets it as ``allreduce.localize_error`` and the run goes on to its verdict."""
    try:
        with without_gc():
            view = ClusterView(task_vars)
            if not view.hosts:
                outcome = {"needed": False, "done": True, "why": "no node"}
            elif start_round:
                outcome = start(view)
            elif confirm:
                previous = view.result(view.hosts[0], REGISTER) or {}
                outcome = fold_confirm(view, previous) if previous.get("confirm_args_by_host") else previous
            else:
                previous = view.result(view.hosts[0], REGISTER) or {}
                outcome = previous if previous.get("done") or "state" not in previous else counted(
                    previous, advance(view, previous))
            outcome = with_round_lock(view, outcome)
    except Exception as exc:  # pylint: disable=broad-except
        found = "the localisation raised %s: %s" % (type(exc).__name__, exc)
        outcome = {"needed": False, "done": True, "checks_by_host": {host: {"allreduce": {
            "localize_error": error("allreduce", found, "a defect of the preflight: report it with the verdict "
                                    "file", traceback=traceback.format_exc()[-2000:])}}
            for host in task_vars.get("ansible_play_hosts_all") or []}}
    return {key: value for key, value in outcome.items() if key not in ("changed", "failed")}
