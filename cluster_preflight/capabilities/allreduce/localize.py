# -*- coding: utf-8 -*-
"""Localisation of a failed or slow all-reduce: which node is bad, and why.

Controller-side and pure (used by ``cluster_preflight/stages/localization.py``).
When the all-node all-reduce fails, or its bus bandwidth is below the
backend's floor, the gate runs up to three rounds of small all-reduces, each
launch the ``allreduce`` module with its own hard timeout:

* **round 1**: disjoint node pairs at once (inventory order); with an odd
  count the node left over runs alone over ``lo`` (a loopback run).
* **round 2**: every suspect (a node in a failed or slow pair) and every node
  not yet proven good is paired with a node already proven good; a node left
  without a partner runs its loopback instead, and every suspect without a
  loopback run yet runs one after its pair (a second step of the round).
* **round 3**: only if still ambiguous, the same rule again.

A pair that fails or is slow makes both nodes suspects until one is proven
good elsewhere (a pair of its that passed).  A node is named bad only when it
fails again with a node proven good in an earlier round, or fails or is slow
with two different nodes proven good (retested against a good node; a single
slow pair never names a node, since a loaded machine makes one pair slow now
and then), or when its own loopback run fails: the loopback tells a **node**
fault (it fails alone too) from a **network** fault (it passes alone).  A node
that gives no result in a round is **lost** and named as such; its partner is
not blamed for it.  Nodes that end neither good nor bad are **unproven**
(blocked, never silently dropped).

Floors, both per backend run: an absolute minimum busbw
(``allreduce_floor_busbw_gbps_<backend>``, 0 disables) applied to the
all-node run, every pair and every loopback run; a relative floor
(``allreduce_floor_relative`` × the median busbw of the pairs that completed)
applied to pairs.  Either turns a working but slow link into a named node.
"""

from __future__ import annotations

from preflight_node.checks import blocked, failed, passed, warned

MAX_ROUNDS = 3
LOOPBACK_ADDR = "127.0.0.1"
LOOPBACK_IFNAME = "lo"
# Elements of the correctness all-reduce of a pair or single-node launch (256 KiB; the all-node and the
# confirmation runs check 4 MiB): still exact, and a throttled pair does not spend its round on it.
ROUND_CHECK_ELEMENTS = 1 << 16
# A round's launch is judged by how it ended (its ranks' status, busbw and error), never by its stacks, which
# nothing shows: it takes none, and a failed or slow one ends as soon as it is seen (the all-node and the
# confirmation runs keep their stack budget: their hung ranks' stacks are in the run directory).
ROUND_STACK_BUDGET = 0
EXPECTED = ("every node completes an all-reduce with a node proven good, and alone over lo, with busbw above the "
            "floors (absolute per backend, and relative to the median pair)")


# --------------------------------------------------------------------------
# Floors and run outcomes


def bandwidth_deadline(sizes, iters, warmup, world_size, floor_gbps, grace):
    """Seconds the bandwidth stage may take: every collective of the sweep (warm-up and timed, each size) at the
    floor busbw, plus ``grace`` seconds of start-up; 0 (no deadline) when the floor is 0.  busbw is nccl-tests'
    (bytes x 2(n-1)/n per second), so the time of one collective at the floor is its bus bytes / floor."""
    if not floor_gbps or floor_gbps <= 0:
        return 0
    factor = 2.0 * (world_size - 1) / world_size if world_size > 1 else 1.0
    bus_bytes = sum(size * factor * (iters + warmup) for size in sizes)
    return round(bus_bytes / (floor_gbps * 1e9) + float(grace or 0), 3)


def _deadline(args, world_size, floor):
    return bandwidth_deadline(args["sizes"], args["iters"], args["warmup"], world_size, floor.get("absolute", 0),
                              floor.get("grace", 0))


def run_outcome(hosts, results_by_host):
    """One launch's outcome from its hosts' ``allreduce`` results.

    ``results_by_host``: host -> the module result (a dict with ``ranks``), or
    a string saying why there is none.  Returns ``{status, busbw_gbps, reason,
    lost}``: ``lost`` (a host gave no result), ``slow`` (ended at its bandwidth
    deadline; ``busbw_gbps`` is what it reached), ``fail`` (a rank did not finish
    with exact data) or ``done`` (the floors are applied later, by :func:`judge`).
    """
    lost = {}
    rows = []
    for host in hosts:
        result = results_by_host.get(host)
        if not isinstance(result, dict) or not isinstance(result.get("ranks"), list):
            lost[host] = result if isinstance(result, str) and result else "no result came back from %s" % host
            continue
        rows.extend(dict(row, host=host) for row in result["ranks"])
    if lost:
        return {"status": "lost", "busbw_gbps": None, "lost": lost,
                "reason": "; ".join("%s: %s" % item for item in sorted(lost.items()))}
    bad = [row for row in rows if row.get("status") != "ok" or not row.get("correct", True)]
    slow = [row for row in bad if row.get("status") == "slow" and row.get("slow")]
    if slow and not any(row.get("status") == "wrong" or row.get("correct") is False for row in rows):
        # Past its bandwidth deadline (the sizes at the floor): slow, at the busbw the slowest rank reached.  Ranks
        # that lost their peer when the slow run was ended are part of the same story.
        first = min(slow, key=lambda row: row["slow"].get("busbw_reached_gbps") or 0)
        return {"status": "slow", "busbw_gbps": first["slow"].get("busbw_reached_gbps"), "lost": {},
                "reason": "past its bandwidth deadline of %.1f s at busbw %.4f GB/s (rank %s on %s)" % (
                    first["slow"].get("deadline_seconds") or 0, first["slow"].get("busbw_reached_gbps") or 0,
                    first.get("rank"), first.get("host"))}
    if bad or not rows:
        first = bad[0] if bad else {}
        # Wrong data is a hardware-class finding (silent corruption): never retested
        # (cluster_preflight/capabilities/allreduce/retest.py).
        corrupt = any(row.get("status") == "wrong" or row.get("correct") is False for row in rows)
        return {"status": "fail", "busbw_gbps": None, "lost": {}, "corrupt": corrupt,
                "reason": "rank %s on %s %s at stage %s: %s" % (
                    first.get("rank"), first.get("host"), first.get("status", "gave no rank"), first.get("stage"),
                    str(first.get("error") or "no error recorded")[:200]) if bad else "no rank reported"}
    # The largest size's busbw (the sizes may be given in any order).
    largest = [max((size for size in row["bandwidth"] if isinstance(size, dict)),
                   key=lambda size: size.get("size_bytes") or 0, default=None)
               for row in rows if isinstance(row.get("bandwidth"), list)]
    last = [size["busbw_gbps"] for size in largest if size and size.get("busbw_gbps") is not None]
    return {"status": "done", "busbw_gbps": min(last) if last else None, "lost": {}, "reason": ""}


def all_node_trigger(outcome, floor):
    """Whether the all-node run needs localising: ``(needed, why)``."""
    if outcome["status"] in ("fail", "lost"):
        return True, "the all-node all-reduce failed: %s" % outcome["reason"]
    if outcome["status"] == "slow":
        return True, "the all-node all-reduce was slow: %s" % outcome["reason"]
    busbw = outcome.get("busbw_gbps")
    if floor["absolute"] and busbw is not None and busbw < floor["absolute"]:
        return True, "the all-node all-reduce ran at busbw %.4f GB/s, below the floor %.4f GB/s" % (
            busbw, floor["absolute"])
    return False, "the all-node all-reduce passed%s" % ("" if busbw is None else " at busbw %.4f GB/s" % busbw)


def _median(values):
    values = sorted(values)
    if not values:
        return None
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2.0


def graded(rounds, floor):
    """Every launch of ``rounds`` with its final ``verdict``: pass, slow, fail or lost (floors applied).

    The relative floor compares a pair with the median of round 1's pairs (of every pair that completed so
    far while round 1 has fewer than two), so it needs two pairs or more to mean anything."""
    launches = [dict(launch, round=item["round"]) for item in rounds for launch in item["launches"]]
    pair_bw = [launch["busbw_gbps"] for launch in launches
               if launch["kind"] == "pair" and launch["status"] == "done" and launch.get("busbw_gbps") is not None]
    # The reference is round 1's disjoint pairs when there are two or more: later rounds retest the suspects
    # again and again, and their slow pairs would drag the median down to them.
    first = [launch["busbw_gbps"] for launch in launches if launch["round"] == 1 and launch["kind"] == "pair"
             and launch["status"] == "done" and launch.get("busbw_gbps") is not None]
    pair_bw = first if len(first) >= 2 else pair_bw
    median = _median(pair_bw) if len(pair_bw) >= 2 else None
    relative = floor["relative"] * median if median and floor["relative"] else 0
    for launch in launches:
        verdict, why = launch["status"], launch.get("reason") or ""
        busbw = launch.get("busbw_gbps")
        if verdict == "slow":
            why = why or "past its bandwidth deadline"
        elif verdict == "done":
            verdict = "pass"
            if busbw is not None and floor["absolute"] and busbw < floor["absolute"]:
                verdict, why = "slow", "busbw %.4f GB/s below the floor %.4f GB/s" % (busbw, floor["absolute"])
            elif busbw is not None and launch["kind"] == "pair" and relative and busbw < relative:
                verdict, why = "slow", "busbw %.4f GB/s below %.2f x the median pair %.4f GB/s = %.4f GB/s" % (
                    busbw, floor["relative"], median, relative)
                # Weak evidence: on a loaded machine or a noisy fabric the pairs spread by 2x and more.
                launch["weak"] = True
        launch["verdict"], launch["why"] = verdict, why
    return launches, median


def judge(hosts, rounds, floor):
    """Each host's state after ``rounds``: ``good``, ``bad``, ``lost``, ``suspect`` or ``untested``.

    Returns ``(states, evidence, kinds, launches)``: ``evidence`` host -> the
    graded launches it took part in; ``kinds`` host -> node, network or unknown
    for the bad ones."""
    launches, _median_bw = graded(rounds, floor)
    # One pass over the launches (each names its few hosts): a scan of every launch per host would grow with the
    # square of the nodes, and the rounds of 4,000 nodes hold 2,000 launches each.
    evidence = {host: [] for host in hosts}
    for launch in launches:
        for host in dict.fromkeys(launch["hosts"]):
            if host in evidence:
                evidence[host].append(launch)
    states = {}
    for host in hosts:
        mine = evidence[host]
        if any(host in (launch.get("lost") or {}) for launch in mine):
            states[host] = "lost"
        elif any(launch["kind"] == "pair" and launch["verdict"] == "pass" for launch in mine):
            states[host] = "good"
        else:
            states[host] = None
    # The round each good node was first proven in: a pair only names its other node when it ran after that.
    proven = {host: min(launch["round"] for launch in evidence[host]
                        if launch["kind"] == "pair" and launch["verdict"] == "pass")
              for host in hosts if states[host] == "good"}
    kinds = {}
    for host in hosts:
        if states[host] is not None:
            continue
        loops = [launch for launch in evidence[host] if launch["kind"] == "loopback"]
        pairs = [launch for launch in evidence[host] if launch["kind"] == "pair"]
        loop_bad = any(launch["verdict"] in ("fail", "slow") for launch in loops)
        failing = [launch for launch in pairs if launch["verdict"] in ("fail", "slow")]
        # Retested: it failed outright with a node proven good in an earlier round, or it failed or was slow with
        # two different nodes proven good.  Slow alone is never named on one pair: a loaded machine or a noisy
        # link makes one pair slow now and then, and a healthy node must not be blamed for that.  Slow only
        # against the median pair (weak) counts only with a partner proven in an earlier round: two noisy pairs
        # in a row (round 1's partner proven later) must not name a healthy node.
        after_proof = [launch for launch in failing
                       if launch["round"] > proven.get(_partner(launch, host), MAX_ROUNDS + 1)]
        strong = [launch for launch in failing if not launch.get("weak")] + [
            launch for launch in after_proof if launch.get("weak")]
        retested = any(launch["verdict"] == "fail" for launch in after_proof) \
            or len({_partner(launch, host) for launch in strong} & set(proven)) >= 2
        if loop_bad or retested:
            states[host] = "bad"
            kinds[host] = "node" if loop_bad else ("network" if loops else "unknown")
        elif any(launch["verdict"] in ("fail", "slow") for launch in pairs):
            states[host] = "suspect"
        else:
            states[host] = "untested"
    # A suspect whose every failed pair had a bad or lost partner is explained by it: still to prove.
    for host in hosts:
        if states[host] == "suspect":
            failing = [launch for launch in evidence[host] if launch["kind"] == "pair"
                       and launch["verdict"] in ("fail", "slow", "lost")]
            if failing and all(states.get(_partner(launch, host)) in ("bad", "lost") for launch in failing):
                states[host] = "untested"
    return states, evidence, kinds, launches


def _partner(launch, host):
    return next((other for other in launch["hosts"] if other != host), None)


# --------------------------------------------------------------------------
# Planning


def _args(base, **changes):
    args = dict(base)
    args.update(changes)
    return args


def group_args(base_args_by_host, hosts, master_addr, port, floor):
    """Every host's ``allreduce`` arguments for one launch over ``hosts`` (a pair, or the nodes left for the
    confirmation run), the all-node plan's shape with its own ranks, port and bandwidth deadline."""
    out = {}
    for rank, host in enumerate(hosts):
        base = base_args_by_host[host]
        out[host] = _args(base, nnodes=len(hosts), node_rank=rank, master_addr=master_addr, master_port=port,
                          min_busbw_gbps=0, selftest_fault="none", selftest_rank=-1,
                          bandwidth_deadline=_deadline(base, len(hosts) * base["nproc_per_node"], floor),
                          bandwidth_grace=float(floor.get("grace", 0)))
    return out


def pair_args(base_args_by_host, pair, master_addr, port, floor=None):
    """The two hosts' ``allreduce`` arguments for a pair launch (the all-node plan's shape)."""
    args = group_args(base_args_by_host, list(pair), master_addr, port, floor or {})
    return {host: dict(item, check_elements=ROUND_CHECK_ELEMENTS, stack_budget=ROUND_STACK_BUDGET)
            for host, item in args.items()}


def loopback_args(base, port, floor=None):
    """One host's ``allreduce`` arguments for its run alone over ``lo``."""
    env = dict(base.get("env") or {}, GLOO_SOCKET_IFNAME=LOOPBACK_IFNAME, NCCL_SOCKET_IFNAME=LOOPBACK_IFNAME)
    return _args(base, nnodes=1, node_rank=0, master_addr=LOOPBACK_ADDR, master_port=port,
                 socket_ifname=LOOPBACK_IFNAME, env=env, min_busbw_gbps=0, selftest_fault="none", selftest_rank=-1,
                 bandwidth_deadline=_deadline(base, base["nproc_per_node"], floor or {}),
                 bandwidth_grace=float((floor or {}).get("grace", 0)), check_elements=ROUND_CHECK_ELEMENTS,
                 stack_budget=ROUND_STACK_BUDGET)


def derived_port(master_port, serial):
    """Distinct master ports derived from the run's: above it, wrapping below it past 65535."""
    port = master_port + 1 + serial
    return port if port <= 65535 else master_port - 1 - serial


def plan_round(round_no, hosts, results_so_far, base_args_by_host, addr_by_host, master_port, floor):
    """The launches of round ``round_no`` (1-3) over ``hosts`` given the earlier ``results_so_far``.

    ``results_so_far``: the rounds already run (``[{round, launches}]``, each
    launch ``{kind, hosts, step, master_port, status, busbw_gbps, reason,
    lost}``).  Returns ``{round, launches, steps}``: ``launches`` without
    outcomes; ``steps`` is a list (step 0, step 1) of host -> ``allreduce``
    arguments, a host at most once per step.  No launch: nothing is ambiguous
    (or nothing can be tested), the caller concludes.
    """
    serial = sum(len(item["launches"]) for item in results_so_far)
    launches = []

    def add_pair(pair):
        nonlocal serial
        port = derived_port(master_port, serial)
        serial += 1
        launches.append({"kind": "pair", "hosts": list(pair), "step": 0, "master_port": port,
                         "master_addr": addr_by_host[pair[0]]})

    def add_loop(host, step):
        nonlocal serial
        port = derived_port(master_port, serial)
        serial += 1
        launches.append({"kind": "loopback", "hosts": [host], "step": step, "master_port": port,
                         "master_addr": LOOPBACK_ADDR})

    if round_no > MAX_ROUNDS:
        return {"round": round_no, "launches": [], "steps": [{}, {}]}
    if round_no == 1:
        for index in range(0, len(hosts) - 1, 2):
            add_pair(hosts[index:index + 2])
        if len(hosts) % 2:
            add_loop(hosts[-1], 0)
    else:
        states, evidence, _kinds, _launches = judge(hosts, results_so_far, floor)
        good = [host for host in hosts if states[host] == "good"]
        prove = [host for host in hosts if states[host] in ("suspect", "untested")]
        tried = {frozenset(launch["hosts"]) for item in results_so_far for launch in item["launches"]
                 if launch["kind"] == "pair"}
        looped = {host for host in hosts if any(launch["kind"] == "loopback" for launch in evidence[host])}
        busy, partners = set(), list(good)
        for host in prove:
            partner = next((other for other in partners if frozenset((host, other)) not in tried), None)
            if partner is not None:
                partners.remove(partner)
                busy.update((host, partner))
                add_pair([partner, host])
        left = [host for host in prove if host not in busy]
        # Nodes still to prove and without a good partner: pair them with each other (a new pair), else alone.
        while left:
            host = left.pop(0)
            other = next((peer for peer in left if frozenset((host, peer)) not in tried), None)
            if other is not None:
                left.remove(other)
                busy.update((host, other))
                add_pair([host, other])
            elif host not in looped:
                busy.add(host)
                add_loop(host, 0)
                looped.add(host)
        for host in prove:
            if states[host] == "suspect" and host not in looped:
                add_loop(host, 1 if host in busy else 0)
                looped.add(host)
    steps = [{}, {}]
    for launch in launches:
        if launch["kind"] == "pair":
            steps[launch["step"]].update(pair_args(base_args_by_host, launch["hosts"], launch["master_addr"],
                                                   launch["master_port"], floor))
        else:
            host = launch["hosts"][0]
            steps[launch["step"]][host] = loopback_args(base_args_by_host[host], launch["master_port"], floor)
    return {"round": round_no, "launches": launches, "steps": steps}


def confirm_plan(hosts, base_args_by_host, addr_by_host, master_port, floor):
    """The confirmation run over ``hosts`` (the nodes neither named bad nor lost): the all-node launch plan's
    shape (as ``cluster_preflight.capabilities.allreduce.outcome.summarize`` takes it), on the run's own master port and
    the
    first node as master, with a bandwidth deadline for its own world size."""
    args = group_args(base_args_by_host, hosts, addr_by_host[hosts[0]], master_port, floor)
    for host in hosts:
        # The gate's own minimum busbw applies, as it did to the all-node run (pairs leave it to the floors).
        args[host]["min_busbw_gbps"] = base_args_by_host[host].get("min_busbw_gbps", 0)
    first = args[hosts[0]]
    return {"launch": True, "hosts": list(hosts), "master": hosts[0], "master_addr": first["master_addr"],
            "master_port": master_port, "nproc_per_node": first["nproc_per_node"],
            "world_size": first["nproc_per_node"] * len(hosts), "backend": first.get("backend"),
            "socket_ifname": first.get("socket_ifname") or None, "args_by_host": args}


def confirm_localize_checks(checks_by_host, confirm):
    """``allreduce.localize`` after the confirmation run: a node the rounds left unproven is proven when the
    run over every node left passed; otherwise nothing changes (the final stage blocks what it did not prove)."""
    out = {host: {cap: dict(checks) for cap, checks in by_cap.items()} for host, by_cap in checks_by_host.items()}
    if confirm.get("status") != "pass":
        return out
    for host in confirm.get("hosts") or []:
        check = ((out.get(host) or {}).get("allreduce") or {}).get("localize")
        if check and (check.get("details") or {}).get("blocked"):
            out[host]["allreduce"]["localize"] = passed(
                "%s; proven by the confirmation run over %s (busbw %s)" % (
                    check["found"], ", ".join(confirm["hosts"]), _bw(confirm.get("busbw_gbps"))), EXPECTED)
    return out


def record(planned, results_by_step):
    """A planned round with each launch's outcome; ``results_by_step[step]``: host -> result or reason."""
    launches = []
    for launch in planned["launches"]:
        outcome = run_outcome(launch["hosts"], results_by_step[launch["step"]])
        launches.append(dict(launch, **outcome))
    return {"round": planned["round"], "launches": launches}


def ambiguous(hosts, rounds, floor):
    """Whether another round could still prove or name a node."""
    states = judge(hosts, rounds, floor)[0]
    return any(state in ("suspect", "untested") for state in states.values())


# --------------------------------------------------------------------------
# Conclusion


def _describe(launch, host):
    what = ("pair %s in round %d" % ("+".join(launch["hosts"]), launch["round"]) if launch["kind"] == "pair"
            else "loopback of %s over lo in round %d" % (host, launch["round"]))
    return describe_outcome(what, launch, "lost a node")


def describe_outcome(what, launch, lost):
    """``what`` (the launch in words) and how ``launch`` ended; ``lost`` says what a lost launch did
    (node pairs: "lost a node"; GPU pairs: "gave no result")."""
    if launch["verdict"] == "pass":
        return "%s passed at busbw %s" % (what, _bw(launch.get("busbw_gbps")))
    if launch["verdict"] == "slow":
        return "%s was slow: %s" % (what, launch["why"])
    if launch["verdict"] == "lost":
        return "%s %s: %s" % (what, lost, launch["why"])
    return "%s failed: %s" % (what, launch["why"])


def _bw(value):
    return "unmeasured" if value is None else "%.4f GB/s" % value


def conclude(hosts, rounds, floor, trigger, excluded=None, elapsed=None):
    """Per-host ``allreduce.localize`` checks and the localisation summary for the verdict.

    ``hosts``: the nodes the rounds were over; ``excluded``: ``{host: reason}``
    of nodes of the all-node run left out of the rounds (lost before them);
    ``trigger``: why the rounds ran.  Returns ``(summary, checks_by_host)``.
    """
    states, evidence, kinds, launches = judge(hosts, rounds, floor)
    _launches, median = graded(rounds, floor)
    checks = {}
    for host in hosts:
        mine = [launch for launch in evidence[host]]
        seen = "; ".join(_describe(launch, host) for launch in mine) or "no launch included it"
        state = states[host]
        if state == "bad":
            why = {"node": "a node fault: its own all-reduce over lo failed or was slow",
                   "network": "a network fault: it fails or is slow with a node proven good, but passes alone "
                              "over lo",
                   "unknown": "it fails or is slow with a node proven good (node or network: no loopback run)"}
            fix = ("drain %s; %s" % (host, {
                "node": "check its accelerators, driver and training environment (run the all-reduce on it alone)",
                "network": "check its interface (link speed, errors, MTU, qdisc/shaping, cabling, switch port) on the "
                           "path the collectives use",
                "unknown": "check its interface and its accelerators"}[kinds[host]]))
            checks[host] = failed("%s is the bad node, %s. Measured: %s" % (host, why[kinds[host]], seen), EXPECTED,
                                  fix, kind=kinds[host], launches=_plain(mine))
        elif state == "lost":
            reason = next(launch["lost"][host] for launch in mine if host in (launch.get("lost") or {}))
            checks[host] = failed("%s stopped answering during localisation round %d: %s" % (
                host, next(launch["round"] for launch in mine if host in (launch.get("lost") or {})), reason),
                EXPECTED, "check that %s is up and reachable (uptime, dmesg, sshd), then re-run the preflight"
                % host, launches=_plain(mine))
        elif state == "good":
            checks[host] = passed("%s proven good: %s" % (host, seen), EXPECTED)
        else:
            found = ("%s not proven: %s (no node proven good was left to test it against within %d rounds)" % (
                host, seen, MAX_ROUNDS))
            result = blocked(found, EXPECTED)
            result["details"]["launches"] = _plain(mine)
            checks[host] = result
    for host, reason in (excluded or {}).items():
        checks[host] = blocked("%s was not localised: %s" % (host, reason), EXPECTED)
    summary = {
        "trigger": trigger, "floor_busbw_gbps": floor["absolute"], "floor_relative": floor["relative"],
        "median_pair_busbw_gbps": median, "rounds_run": len(rounds),
        "bad": sorted(host for host in hosts if states[host] == "bad"),
        "kinds": kinds,
        "good": sorted(host for host in hosts if states[host] == "good"),
        "lost": sorted(host for host in hosts if states[host] == "lost"),
        "unproven": sorted(host for host in hosts if states[host] in ("suspect", "untested")),
        "excluded": dict(excluded or {}),
        "rounds": [{"round": item["round"], "launches": [
            {key: launch.get(key) for key in ("kind", "hosts", "step", "master_addr", "master_port", "verdict",
                                              "busbw_gbps", "why")}
            for launch in launches if launch["round"] == item["round"]]} for item in rounds],
        "elapsed_seconds": elapsed,
    }
    return summary, {host: {"allreduce": {"localize": check}} for host, check in checks.items()}


def _plain(launches):
    return [{key: launch.get(key) for key in ("round", "kind", "hosts", "verdict", "busbw_gbps", "why")}
            for launch in launches]


# --------------------------------------------------------------------------
# Reconciliation: the all-node run's findings against what the rounds and the confirmation run proved

# Checks of the confirmation run that stand when it failed: each names its cause from evidence of its own.
STANDING = ("rendezvous",)
FIRST_RUN_EXPECTED = "the all-node all-reduce passes, or its failure is explained by the nodes localisation names"
CONFIRM_EXPECTED = "the nodes left after localisation complete one all-node all-reduce together above the floor"


def _first_run_text(host, checks):
    bad = [check["found"] for check in checks.values() if check.get("status") in ("fail", "warn")]
    return "; ".join(bad)[:600] or "its own ranks reported no failure"


def reconcile(first_checks_by_host, localize_summary, confirm_checks_by_host):
    """The gate's per-node ``allreduce`` checks once localisation concluded.

    ``first_checks_by_host``: the all-node run's checks (``summarize``); ``localize_summary``: the rounds'
    conclusion with ``confirm`` (the confirmation run over the nodes left: ``hosts``, ``status`` graded
    against the floors); ``confirm_checks_by_host``: that run's checks (``summarize`` over it).  A node named
    bad or lost keeps the all-node run's findings.  A node of the confirmation run gets that run's checks
    instead, and ``first_run`` saying what the all-node run did there: ``pass`` when the nodes named explain
    it (collateral), ``warn`` when no node was named (it failed, then passed) and on a node named by the rounds
    that then passed its retest (``cluster_preflight/capabilities/allreduce/retest.py``; its peers' ``pass`` names it).
    When the
    confirmation run did
    not pass, every failure on its nodes is blocked: they are ``unverified``, never blamed and never healthy.
    Returns ``{host: {name: check}}`` (the ``allreduce`` capability's checks of the gate)."""
    confirm = localize_summary.get("confirm") or {}
    confirmed = set(confirm.get("hosts") or []) if confirm.get("status") not in (None, "planned", "skipped") else set()
    retested = list((localize_summary.get("retest") or {}).get("passed") or [])
    named = list(localize_summary.get("bad") or []) + list(localize_summary.get("lost") or []) + sorted(
        localize_summary.get("excluded") or {})
    explained = named + ["%s (failed, then passed on retest)" % host for host in retested]
    out = {}
    for host, checks in first_checks_by_host.items():
        if host not in confirmed:
            out[host] = dict(checks)
            continue
        first = _first_run_text(host, checks)
        mine = dict(confirm_checks_by_host.get(host) or {})
        if confirm["status"] == "pass":
            if host in retested:
                mine["first_run"] = warned(
                    "the all-node run failed or was slow (%s); on %s: %s; the rounds named %s, which failed, then "
                    "passed on retest and with the nodes left (%s): a transient fault" % (
                        localize_summary.get("trigger"), host, first, host, ", ".join(confirm["hosts"])),
                    FIRST_RUN_EXPECTED, "nothing to drain now; if it repeats, read its first run's log (%s.log), the "
                    "rounds in the verdict's localize and the interface's counters" % host)
            elif explained:
                mine["first_run"] = passed(
                    "the all-node run failed or was slow (%s), explained by %s (allreduce.localize); on %s it was "
                    "collateral (%s); %s then passed with the nodes left (%s)" % (
                        localize_summary.get("trigger"), ", ".join(explained), host, first, host,
                        ", ".join(confirm["hosts"])), FIRST_RUN_EXPECTED)
            else:
                mine["first_run"] = warned(
                    "the all-node run failed or was slow (%s) on %s (%s), no node was named, and the run over the "
                    "same nodes then passed: a transient fault" % (localize_summary.get("trigger"), host, first),
                    FIRST_RUN_EXPECTED, "nothing to do on %s now; if it repeats, read its first run's log (%s.log) "
                    "and the interfaces' error counters" % (host, host))
            out[host] = mine
            continue
        why = "the confirmation run over %s %s: %s" % (", ".join(confirm["hosts"]), confirm["status"],
                                                      confirm.get("reason") or "see its checks")
        # A finding that names its own cause stands (the master's rendezvous port out of reach in this run too:
        # the pair rounds ran on ports of their own and cannot disprove it); everything else proved nothing.
        held = {name: check if name in STANDING else _held(check, why) for name, check in mine.items()}
        held["first_run"] = blocked("%s not proven: the all-node run failed (%s; on %s: %s) and %s" % (
            host, localize_summary.get("trigger"), host, first, why), FIRST_RUN_EXPECTED,
            "fix what the named nodes' checks say, then re-run the gate")
        held["confirm"] = blocked("%s not proven: %s" % (host, why), CONFIRM_EXPECTED,
                                  "read the confirmation run's logs (<node>.confirm.log) and re-run the gate")
        out[host] = held
    return out


def _held(check, why):
    """A failure of a run that proved nothing: blocked (its node unverified), what it found kept."""
    if check.get("status") not in ("fail", "warn") or (check.get("details") or {}).get("blocked"):
        return check
    return blocked("%s (%s)" % (check["found"], why), check.get("expected", ""), check.get("fix", ""))
