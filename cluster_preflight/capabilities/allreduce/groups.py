# -*- coding: utf-8 -*-
"""Group rounds: the node whose fault shows only in a large group, when every pair passed.

Controller-side and pure, like ``cluster_preflight/capabilities/allreduce/localize.py``;
``cluster_preflight/stages/localization.py`` runs
them after the pair rounds.  A pair cannot show a fault that needs more than one peer: a node that refuses
connections past a count, an incast its switch port cannot take, a NIC out of queue pairs.  When the pair
rounds proved every node good but the all-node run failed or was slow, the gate bisects by substitution, one
step per round, every group as large as the one that failed:

* **round 1**: the nodes in two halves (inventory order), each run as one group, both at once.  Both pass: the
  fault needs more than half the cluster (or it was transient); both fail: more than one node carries it, or it
  shows in smaller groups.  Either way the groups stop there and name nobody (the confirmation run over every
  node then decides: a pass is a transient fault, a failure leaves every node unverified).  One fails: its nodes
  are the suspects, the other half's are proven at that size.
* **each later round**: the suspects in two halves, each padded with proven nodes up to the size of the group
  that failed, both at once.  The group that fails holds the node; the other half joins the proven nodes.  Both
  pass or both fail: the groups stop, nobody named.
* **one suspect left**: it was in every group that failed, and every group without it passed.  It is retested
  once before it is named: one more group of that size, with it and proven nodes other than its last group's.
  It fails again: named, kind ``group``.  It passes: not named (a transient fault).

Rounds: 1 + ⌈log₂ ⌈N/2⌉⌉, then the retest (4 at 8 nodes, 15 at 10,000), two launches a round.  A launch
is ``allreduce`` over its group, the all-node plan's shape
(:func:`cluster_preflight.capabilities.allreduce.localize.group_args`), graded
against the absolute floor like every launch of the rounds.
"""

from __future__ import annotations

import math

from cluster_preflight.capabilities.allreduce import localize
from preflight_node.checks import failed, passed

KIND = "group"
# Groups are halves of the cluster: fewer nodes make halves that are pairs, which the pair rounds ran already.
MIN_NODES = 6
EXPECTED = ("every node completes an all-reduce in groups as large as the one that failed, as it does in pairs "
            "and alone")


def applies(hosts, summary):
    """Whether the group rounds follow the pair rounds' conclusion ``summary``: every node of ``hosts`` proven
    good (nobody named, lost or unproven) while the all-node run failed or was slow, and enough nodes for halves
    larger than a pair."""
    return (len(hosts) >= MIN_NODES and not summary.get("bad") and not summary.get("lost")
            and not summary.get("unproven") and sorted(summary.get("good") or []) == sorted(hosts))


def max_rounds(count):
    """The group rounds (the retest included) ``count`` nodes can take."""
    return 2 + int(math.ceil(math.log(max(2, (count + 1) // 2), 2)))


def progress(hosts, rounds, floor):
    """Where the rounds stand: ``{suspects, proven, size, named, stop, lost}``.  ``named``: the one suspect left
    (before its retest); ``stop``: why the groups end without a name ("" while they go on); ``lost``: nodes that
    gave no result in a group round (the groups stop)."""
    state = {"suspects": list(hosts), "proven": [], "size": None, "named": None, "stop": "", "lost": []}
    launches, _median = localize.graded(rounds, floor)
    for number in sorted({launch["round"] for launch in launches}):
        mine = [launch for launch in launches if launch["round"] == number and not launch.get("retest")]
        if not mine:
            continue
        state["lost"] = sorted({host for launch in mine for host in launch.get("lost") or {}})
        failing = [launch for launch in mine if launch["verdict"] != "pass"]
        if state["lost"]:
            state["stop"] = "%s gave no result in group round %d" % (", ".join(state["lost"]), number)
        elif len(failing) != 1:
            state["stop"] = ("both groups of round %d %s: %s" % (number, "passed" if not failing else "failed", (
                "the fault needs a group larger than %d nodes to show, or it was transient" % max(
                    len(launch["hosts"]) for launch in mine)) if not failing else
                "more than one node carries it, or it shows in smaller groups too"))
        if state["stop"]:
            return state
        state["suspects"] = list(failing[0]["suspects"])
        state["proven"] = list(dict.fromkeys(state["proven"] + [host for launch in mine if launch["verdict"] == "pass"
                                                                for host in launch["hosts"]]))
        state["size"] = len(failing[0]["hosts"])
    if len(state["suspects"]) == 1 and rounds:
        state["named"] = state["suspects"][0]
    return state


def plan(hosts, rounds, base_args_by_host, addr_by_host, master_port, serial, floor):
    """The next group round over ``hosts`` given ``rounds`` (recorded, ``localize.record``): ``{round, launches,
    steps}`` (one step), or no launch once the groups concluded (named and retested, or stopped).  ``serial``:
    launches so far (the master ports go on from them)."""
    state = progress(hosts, rounds, floor)
    number = len(rounds) + 1
    if state["stop"] or any(launch.get("retest") for item in rounds for launch in item["launches"]):
        return {"round": number, "launches": [], "steps": [{}, {}]}
    if state["named"]:
        groups = [([state["named"]], _fillers(state, rounds, state["size"] - 1), 0)]
    elif not rounds:
        half = len(hosts) // 2
        groups = [(hosts[:half], [], 0), (hosts[half:], [], 0)]
    else:
        groups = _halves(state)
    launches = []
    for suspects, fillers, step in groups:
        members = list(suspects) + list(fillers)
        launches.append({"kind": KIND, "hosts": members, "suspects": list(suspects), "step": step,
                         "master_port": localize.derived_port(master_port, serial + len(launches)),
                         "master_addr": addr_by_host[members[0]], "retest": bool(state["named"])})
    steps = [{}, {}]
    for launch in launches:
        args = localize.group_args(base_args_by_host, launch["hosts"], launch["master_addr"], launch["master_port"],
                                   floor)
        steps[launch["step"]].update((host, dict(item, check_elements=localize.ROUND_CHECK_ELEMENTS,
                                                 stack_budget=localize.ROUND_STACK_BUDGET))
                                     for host, item in args.items())
    return {"round": number, "launches": launches, "steps": steps}


def _halves(state):
    """``[(suspects, fillers, step)]``: the suspects in two halves, each padded with proven nodes to the size of the
    group that failed; at once when the proven nodes suffice for both, else the second after the first (an odd
    cluster whose larger half failed), with the same fillers."""
    size, suspects = state["size"], state["suspects"]
    first, second = suspects[:len(suspects) // 2], suspects[len(suspects) // 2:]
    need = (size - len(first), size - len(second))
    pool = list(state["proven"])
    if need[0] + need[1] <= len(pool):
        return [(first, pool[:need[0]], 0), (second, pool[need[0]:need[0] + need[1]], 0)]
    return [(first, pool[:need[0]], 0), (second, pool[:need[1]], 1)]


def _fillers(state, rounds, count):
    """``count`` proven nodes for the retest's group, those of the named node's last group put last."""
    last = {host for launch in rounds[-1]["launches"] if state["named"] in launch["hosts"]
            for host in launch["hosts"]} if rounds else set()
    fresh = [host for host in state["proven"] if host not in last]
    return (fresh + [host for host in state["proven"] if host in last])[:count]


def conclude(hosts, rounds, floor):
    """``(summary, checks_by_host)``: the groups' conclusion for the verdict's ``localize.groups`` and the named
    node's ``allreduce.localize`` (only when one is named; the others keep what the pair rounds proved)."""
    state = progress(hosts, rounds, floor)
    launches, _median = localize.graded(rounds, floor)
    retest = [launch for launch in launches if launch.get("retest")]
    named = state["named"] if retest and retest[0]["verdict"] != "pass" else None
    text = "; ".join(_describe(launch) for launch in launches) or "no group ran"
    summary = {"rounds_run": len(rounds), "size": state["size"], "named": named, "stop": state["stop"],
               "lost": state["lost"], "retested": state["named"] if retest else None,
               "retest_passed": bool(retest) and retest[0]["verdict"] == "pass",
               "rounds": [{"round": item["round"], "launches": [
                   {key: launch.get(key) for key in ("kind", "hosts", "suspects", "retest", "step", "master_addr",
                                                     "master_port", "verdict", "busbw_gbps", "why")}
                   for launch in launches if launch["round"] == item["round"]]} for item in rounds]}
    checks = {}
    if named:
        checks[named] = failed(
            "%s is the bad node, a fault that shows only in a group: it passes in pairs and alone, and every group "
            "of %d nodes it is in fails while every group without it passes (retested once). Measured: %s" % (
                named, state["size"], text), EXPECTED,
            "drain %s; check what grows with its peers: connection and conntrack limits (iptables connlimit, "
            "nf_conntrack_max), the NIC's queue pairs and its switch port (incast, buffers)" % named,
            kind=KIND, launches=_plain(launches))
    elif summary["retest_passed"]:
        summary["stop"] = "%s failed in every group it was in, then passed on retest: a transient fault" % (
            state["named"])
    return summary, {host: {"allreduce": {"localize": check}} for host, check in checks.items()}


def _describe(launch):
    what = "%sgroup %s (suspects %s) in round %d" % ("retest " if launch.get("retest") else "",
                                                     "+".join(launch["hosts"]), "+".join(launch["suspects"]),
                                                     launch["round"])
    return localize.describe_outcome(what, launch, "lost a node")


def _plain(launches):
    return [{key: launch.get(key) for key in ("round", "kind", "hosts", "suspects", "retest", "verdict", "busbw_gbps",
                                              "why")} for launch in launches]


def with_groups(summary, checks_by_host, conclusion, group_checks):
    """The pair rounds' conclusion with the groups' folded in: the named node leaves ``good`` for ``bad`` (kind
    ``group``) and its ``allreduce.localize`` fails; ``summary["groups"]`` is the groups' conclusion."""
    summary = dict(summary, groups=conclusion)
    named = conclusion.get("named")
    if not named:
        return summary, checks_by_host
    summary.update(bad=sorted(list(summary["bad"]) + [named]), kinds=dict(summary["kinds"], **{named: KIND}),
                   good=[host for host in summary["good"] if host != named])
    checks_by_host = dict(checks_by_host)
    checks_by_host[named] = group_checks[named]
    return summary, checks_by_host
