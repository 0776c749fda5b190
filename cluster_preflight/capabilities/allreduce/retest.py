# -*- coding: utf-8 -*-
"""Retest before blame: a node the all-reduce localisation names for a transient-class reason is retested
once, in the same run, before it is named.

Controller-side and pure (used by ``cluster_preflight/stages/localization.py`` between the node rounds of
``cluster_preflight/capabilities/allreduce/localize.py`` and the GPU pairs / confirmation run).  Transient-class: the
node was
named because its pairs or its loopback run were slow, below a busbw floor, or failed or timed out.  Not
retested: a node lost (it gave no result), a node the all-node run named by its own evidence (a rank held
stopped; those never reach the rounds), and a run whose data was wrong (silent corruption is a hardware
finding).  Hardware (Xid, ECC, port down) and configuration findings are other capabilities' checks and
never come here.

The retest of a node is one more bounded step of the localisation, at the same sizes and floors: step 0 a
pair with a node proven good (a different one per node retested), step 1 its run alone over ``lo``, which the
action runs only for the nodes whose pair passed (a failed pair fails the retest whatever the run alone does).  It
passes when every launch passed (and, for a network or unknown fault, a pair with a node proven good was
among them).  A node that passes is not named: its ``allreduce.localize`` is a ``warn`` whose found text
says "failed, then passed on retest" with both measurements, and it joins the confirmation run over the
nodes left, which still has to pass for it to be healthy.  A node that fails again stays named (``fail``),
the retest's launches added to the finding's details.
"""

from __future__ import annotations

from cluster_preflight.capabilities.allreduce import localize
from preflight_node.checks import warned

# The retest's launches are recorded as one more round after the node rounds (graded like them).
RETEST_ROUND = localize.MAX_ROUNDS + 1
# Steps of the retest, each bounded like one localisation launch: the pair, then the loopback run.
STEPS = 2
PASSED = "failed, then passed on retest"


def candidates(hosts, rounds, floor, bad):
    """The nodes of ``bad`` (named by the rounds) that are retested: named for a slow or failed pair or loopback
    run, none of whose launches returned wrong data."""
    _states, evidence, _kinds, _launches = localize.judge(hosts, rounds, floor)
    out = []
    for host in bad:
        mine = evidence.get(host) or []
        if any(launch.get("corrupt") for launch in mine):
            continue
        if any(launch["verdict"] in ("fail", "slow") for launch in mine):
            out.append(host)
    return out


def plan(retested, good, base_args_by_host, addr_by_host, master_port, serial, floor):
    """The retest's launches over ``retested`` (``{round, launches, steps}``, the shape of
    :func:`cluster_preflight.capabilities.allreduce.localize.plan_round`): each node paired with its own node of
    ``good`` in step 0 and
    alone over lo in step 1; a node with no good partner left runs alone only (step 0).  ``serial``: launches so
    far (the master ports go on from them)."""
    launches, partners = [], list(good)
    for host in retested:
        partner = partners.pop(0) if partners else None
        if partner is not None:
            launches.append({"kind": "pair", "hosts": [partner, host], "step": 0,
                             "master_port": localize.derived_port(master_port, serial),
                             "master_addr": addr_by_host[partner]})
            serial += 1
        launches.append({"kind": "loopback", "hosts": [host], "step": 1 if partner is not None else 0,
                         "master_port": localize.derived_port(master_port, serial),
                         "master_addr": localize.LOOPBACK_ADDR})
        serial += 1
    steps = [{}, {}]
    for launch in launches:
        if launch["kind"] == "pair":
            steps[launch["step"]].update(localize.pair_args(base_args_by_host, launch["hosts"],
                                                            launch["master_addr"], launch["master_port"], floor))
        else:
            host = launch["hosts"][0]
            steps[launch["step"]][host] = localize.loopback_args(base_args_by_host[host], launch["master_port"],
                                                                 floor)
    return {"round": RETEST_ROUND, "launches": launches, "steps": steps}


def judge(rounds, retest_round, floor, kinds):
    """``{host: {passed, launches, why}}`` of every node retested in ``retest_round`` (recorded by
    :func:`cluster_preflight.capabilities.allreduce.localize.record`), graded with the rounds (the same floors and
    median pair)."""
    launches = [launch for launch in localize.graded(list(rounds) + [retest_round], floor)[0]
                if launch["round"] == RETEST_ROUND]
    out = {}
    for launch in launches:
        host = launch["hosts"][-1]
        out.setdefault(host, []).append(launch)
    verdicts = {}
    for host, mine in out.items():
        paired = any(launch["kind"] == "pair" for launch in mine)
        all_passed = all(launch["verdict"] == "pass" for launch in mine)
        if all_passed and (paired or kinds.get(host) == "node"):
            why = ""
        elif all_passed:
            why = "no node proven good was free to pair it with, and a run alone cannot clear a network fault"
        else:
            why = "the retest failed too"
        verdicts[host] = {"passed": not why, "launches": mine, "why": why}
    return verdicts


def _what(launch, host):
    if launch["kind"] == "pair":
        return "retest pair %s" % "+".join(launch["hosts"])
    return "retest of %s alone over lo" % host


def describe(launches, host):
    """The retest's launches of ``host`` in words, with what each measured."""
    return "; ".join(localize.describe_outcome(_what(launch, host), launch, "lost a node") for launch in launches)


def _measured(evidence):
    """What the rounds measured on a node: its failing or slow launches (busbw and reason)."""
    failing = [launch for launch in evidence if launch["verdict"] in ("fail", "slow")] or evidence
    return "; ".join("%s %s in round %d (busbw %s)%s" % (
        launch["kind"], "+".join(launch["hosts"]), launch["round"],
        "unmeasured" if launch.get("busbw_gbps") is None else "%.4f GB/s" % launch["busbw_gbps"],
        ": %s" % launch["why"] if launch.get("why") else "") for launch in failing)


def _plain(launches):
    return [{key: launch.get(key) for key in ("round", "kind", "hosts", "verdict", "busbw_gbps", "why")}
            for launch in launches]


def apply(summary, checks_by_host, hosts, rounds, floor, verdicts):
    """The localisation's conclusion with the retest folded in: ``(summary, checks_by_host)``.

    A node whose retest passed leaves ``bad`` (and ``kinds``) and gets ``allreduce.localize`` ``warn`` with
    both measurements; a node whose retest failed keeps its ``fail``, the retest in its details and found
    text.  ``summary["retest"]`` says who was retested and how it went."""
    _states, evidence, _kinds, _launches = localize.judge(hosts, rounds, floor)
    summary = dict(summary, bad=list(summary["bad"]), kinds=dict(summary["kinds"]))
    checks_by_host = {host: {cap: dict(checks) for cap, checks in by_cap.items()}
                      for host, by_cap in checks_by_host.items()}
    passed_hosts, failed_hosts = [], []
    for host, verdict in sorted(verdicts.items()):
        retest_text = describe(verdict["launches"], host)
        first_text = _measured(evidence.get(host) or [])
        check = checks_by_host[host]["allreduce"]["localize"]
        if verdict["passed"]:
            passed_hosts.append(host)
            kind = summary["kinds"].pop(host, None)
            summary["bad"].remove(host)
            checks_by_host[host]["allreduce"]["localize"] = warned(
                "%s %s: the rounds named it (%s fault); they measured: %s. Retest: %s" % (
                    host, PASSED, kind, first_text, retest_text),
                localize.EXPECTED,
                "nothing to drain now; %s is proven by the confirmation run with the nodes left. If it repeats, "
                "check its interface (link speed, errors, qdisc/shaping) and load on %s" % (host, host),
                first=_plain(evidence.get(host) or []), retest=_plain(verdict["launches"]))
        else:
            failed_hosts.append(host)
            details = dict(check.get("details") or {}, retest=_plain(verdict["launches"]))
            checks_by_host[host]["allreduce"]["localize"] = dict(
                check, found="%s. Retested once: %s (%s)" % (check["found"], retest_text, verdict["why"]),
                details=details)
    summary["retest"] = dict(summary.get("retest") or {}, hosts=sorted(verdicts), passed=passed_hosts,
                             failed=failed_hosts, launches=[
                                 {key: launch.get(key) for key in ("kind", "hosts", "step", "master_port",
                                                                   "verdict", "busbw_gbps", "why")}
                                 for verdict in verdicts.values() for launch in verdict["launches"]])
    return summary, checks_by_host
