# -*- coding: utf-8 -*-
"""Plan and conclude the localisation rounds of a failed or slow all-reduce, on the controller.

Its documentation lives in ``library/preflight_localize.py``; the logic is in
``module_utils/preflight_localize.py`` (pure functions, unit-tested).  Called
once with ``start: true`` after the all-node run was collected, then once after
each round (``roles/allreduce/tasks/localize.yml``): it folds the round's
results (registered as ``allreduce_localize_first`` and
``allreduce_localize_second``) into the rounds so far and plans the next
round, or concludes with ``checks_by_host`` for the verdict.  Never fails the
play: what it finds is a check on a node.
"""

from __future__ import annotations

import os
import time
import traceback

import ansible.module_utils
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.join(PROJECT, "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(os.path.join(PROJECT, "module_utils"))

# pylint: disable=wrong-import-position
from ansible.module_utils import preflight_localize as localize  # noqa: E402
from ansible.module_utils.preflight_checks import error  # noqa: E402
from ansible.module_utils.preflight_cluster import ClusterView, without_gc  # noqa: E402

REGISTER = "allreduce_localize"
STEP_REGISTERS = ("allreduce_localize_first", "allreduce_localize_second")


def _node_result(view, host, register, pick=None):
    """A node's ``allreduce`` result from ``register``, or why there is none (text)."""
    state, message = view.outcome(host, register)
    if state != "ok":
        return "%s while running the all-reduce: %s" % (state, message[:300])
    result = view.result(host, register) or {}
    if pick:
        result = result.get(pick) or {}
    if isinstance(result.get("ranks"), list):
        return result
    no_result = (result.get("checks") or {}).get("no_result") or {}
    return str(no_result.get("found") or result.get("msg") or "no rank results from %s" % host)[:300]


def start(view):
    first = view.hosts[0]
    gate = (view.result(first, "preflight_launch") or {}).get("gate") or {}
    if not gate.get("launch") or not gate.get("args_by_host"):
        return {"needed": False, "done": True, "why": "the all-reduce was not launched"}
    gate_hosts = [host for host in gate.get("hosts") or [] if host in gate["args_by_host"]]
    results = {host: _node_result(view, host, "preflight_probes", pick="job") for host in gate_hosts}
    settings = view.settings.get(gate_hosts[0], {}).get("allreduce") or {}
    floor = localize.floors(settings, gate.get("backend"))
    outcome = localize.run_outcome(gate_hosts, results)
    needed, why = localize.all_node_trigger(outcome, floor)
    if not needed or len(gate_hosts) < 2 or not settings.get("allreduce_localize", True):
        return {"needed": False, "done": True, "why": why}
    excluded = {}
    for host in gate_hosts:
        state, message = view.outcome(host, "preflight_probes")
        if state != "ok":
            excluded[host] = "lost before the rounds (%s while collecting the all-reduce: %s)" % (state, message[:200])
    hosts = [host for host in gate_hosts if host not in excluded]
    addr = dict(((view.result(first, "preflight_plan") or {}).get("nic") or {}).get("addr_by_host") or {})
    for host in hosts:
        addr.setdefault(host, view.nodes[host]["node_addr"])
    state = {"hosts": hosts, "excluded": excluded, "floor": floor, "trigger": why, "rounds": [],
             "base_args_by_host": {host: gate["args_by_host"][host] for host in hosts}, "addr_by_host": addr,
             "master_port": int(gate.get("master_port") or settings.get("allreduce_master_port") or 6000),
             "started": time.time()}
    return plan_next(state, 1)


def plan_next(state, round_no):
    planned = localize.plan_round(round_no, state["hosts"], state["rounds"], state["base_args_by_host"],
                                  state["addr_by_host"], state["master_port"], state["floor"])
    if not planned["launches"] or (round_no > 1 and not localize.ambiguous(state["hosts"], state["rounds"],
                                                                           state["floor"])):
        return finish(state)
    state = dict(state, planned={"round": planned["round"], "launches": planned["launches"]})
    return {"needed": True, "done": False, "round": round_no, "first_args_by_host": planned["steps"][0],
            "second_args_by_host": planned["steps"][1], "state": state}


def finish(state):
    summary, checks_by_host = localize.conclude(state["hosts"], state["rounds"], state["floor"], state["trigger"],
                                                state["excluded"], round(time.time() - state["started"], 1))
    return {"needed": True, "done": True, "round": len(state["rounds"]), "first_args_by_host": {},
            "second_args_by_host": {}, "checks_by_host": checks_by_host, "localize": summary}


def advance(view, previous):
    state = previous["state"]
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


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("start",))
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        try:
            with without_gc():
                view = ClusterView(task_vars)
                if not view.hosts:
                    outcome = {"needed": False, "done": True, "why": "no node"}
                elif boolean(self._task.args.get("start", False)):
                    outcome = start(view)
                else:
                    previous = view.result(view.hosts[0], REGISTER) or {}
                    outcome = previous if previous.get("done") or "state" not in previous else advance(
                        view, previous)
        except Exception as exc:  # pylint: disable=broad-except
            # A defect here must not cost the verdict: every node gets the error, the run goes on to it.
            found = "the localisation raised %s: %s" % (type(exc).__name__, exc)
            outcome = {"needed": False, "done": True, "checks_by_host": {host: {"allreduce": {
                "localize_error": error("allreduce", found, "a defect of the preflight: report it with the verdict "
                                        "file", traceback=traceback.format_exc()[-2000:])}}
                for host in task_vars.get("ansible_play_hosts_all") or []}}
        outcome = {key: value for key, value in outcome.items() if key not in ("changed", "failed")}
        result.update(outcome, changed=False)
        return result
