# -*- coding: utf-8 -*-
"""The outcome of one all-reduce run (controller layer, ``cluster_preflight/capabilities/allreduce/outcome.py``).

* ``summarize``: every node's rank results → the gate's outcome, the suspect
  ranks and nodes, collateral failures of healthy peers, the world size
  compared with the plan, and the known failure signatures found in each
  node's logs (``signatures``, see ``cluster_preflight/capabilities/allreduce/signatures.py``).
* ``find_suspects``, ``own_faults``: which ranks caused a failed run, and which
  nodes it names by their own evidence (read by ``cluster_preflight/stages/localization.py``).
* ``rendezvous_fault``: whose fault it is when no node reached the rendezvous store.

The capability's controller half (settings, readiness, the launch plan) is
``cluster_preflight/capabilities/allreduce/``; the node half is
``module_utils/preflight_node/capabilities/allreduce.py``.
"""

from __future__ import annotations

import re

from preflight_node.checks import check, failed, not_applicable, passed, warned, worst

from cluster_preflight.capabilities.nic_discovery.nic_select import usable_fabrics
from cluster_preflight.capabilities.allreduce.signatures import (
    expected as signature_expected, match as match_signatures, primary as signature_primary,
    transport as signature_transport)

# Exit codes of ranks that torchrun itself terminated after another rank failed.
TERMINATED_BY_AGENT = (-15, 143)
BARRIER_RE = re.compile(r"[Rr]anks?\s+([\d,\s]+?)\s+failed to pass monitoredBarrier")
PEER_LOST_RE = re.compile(r"Connection (closed|reset) by peer|Broken pipe|recv.*failed|closed by remote|"
                          r"Socket Timeout|timed out|Timeout", re.I)
STAGE_ORDER = ("not started", "start", "init", "correctness", "barrier", "bandwidth", "done")


def _peer_named_ranks(ranks):
    named = set()
    for entry in ranks:
        for match in BARRIER_RE.finditer(entry.get("error") or ""):
            named.update(int(part) for part in re.findall(r"\d+", match.group(1)))
    return named


def find_suspects(rank_rows, lost=()):
    """Which ranks caused a failed gate, and why.  ``rank_rows`` carry ``host``.

    Primary causes, strongest first: a node lost while its ranks ran; wrong
    data; a rank that died on its own (not terminated by torchrun after a peer
    failed); a stopped or hung process; ranks that peers name as missing from
    the monitored barrier; a node whose ranks never started.  Ranks that only
    lost their peer are collateral.
    """
    suspects = []
    if any(row["host"] in lost for row in rank_rows):
        # A node that went away explains its peers' failed rendezvous and collectives; only wrong
        # data or a stopped process elsewhere is a fault of its own.
        for row in rank_rows:
            if row["host"] in lost:
                reason = "gave no result: %s" % lost[row["host"]]
            elif row.get("status") == "wrong":
                reason = "returned wrong all-reduce data (%s wrong elements)" % (
                    (row.get("correctness") or {}).get("wrong"))
            elif str(row.get("process_state", "")).startswith("stopped"):
                reason = "process %s at stage %s" % (row["process_state"], row.get("stage"))
            else:
                continue
            suspects.append({"host": row["host"], "rank": row["rank"], "reason": reason})
        return suspects
    for row in rank_rows:
        reason = None
        if row.get("status") == "wrong":
            reason = "returned wrong all-reduce data (%s wrong elements)" % (row.get("correctness") or {}).get("wrong")
        elif row.get("status") == "died" and row.get("exitcode") not in TERMINATED_BY_AGENT:
            reason = "died at stage %s with exit code %s" % (row.get("stage"), row.get("exitcode"))
        elif str(row.get("process_state", "")).startswith("stopped"):
            reason = "process %s at stage %s" % (row["process_state"], row.get("stage"))
        elif row.get("status") == "missing" and row.get("stage") == "not started":
            reason = "never started (its node's torchrun did not launch it)"
        if reason:
            suspects.append({"host": row["host"], "rank": row["rank"], "reason": reason})
    if not suspects:
        for row in rank_rows:
            if row.get("status") == "slow" and row.get("slow"):
                suspects.append({"host": row["host"], "rank": row["rank"], "reason": (
                    "slow: the bandwidth stage outlived its deadline of %.1f s (the sizes at the floor busbw) at "
                    "busbw %.4f GB/s" % (row["slow"].get("deadline_seconds") or 0,
                                         row["slow"].get("busbw_reached_gbps") or 0))})
    if not suspects:
        named = _peer_named_ranks(rank_rows)
        for row in rank_rows:
            if row["rank"] in named:
                suspects.append({"host": row["host"], "rank": row["rank"],
                                 "reason": "named by its peers as missing from the monitored barrier"})
    if not suspects and any(row.get("status") == "error" for row in rank_rows):
        for row in rank_rows:
            if row.get("status") == "hung":
                suspects.append({"host": row["host"], "rank": row["rank"],
                                 "reason": "hung at stage %s while its peers timed out waiting for it (stack in "
                                           "%s.stacks.txt)" % (row.get("stage"), row["host"])})
    if not suspects:
        bad = [row for row in rank_rows if row.get("status") != "ok"]
        own = [row for row in bad if not PEER_LOST_RE.search(row.get("error") or "")]
        stages = [row.get("stage") for row in bad]
        if bad and own and len(own) < len(bad):
            bad = own
        elif bad and len(set(stages)) > 1:
            # Everyone failed the same way: the ranks that got least far are the likeliest cause.
            earliest = min(stages, key=lambda stage: STAGE_ORDER.index(stage) if stage in STAGE_ORDER else 0)
            bad = [row for row in bad if row.get("stage") == earliest]
        for row in bad:
            suspects.append({"host": row["host"], "rank": row["rank"],
                             "reason": "%s at stage %s: %s" % (row.get("status"), row.get("stage"),
                                                               (row.get("error") or "no error recorded")[:200])})
    return suspects


# Suspects the all-node run names by evidence of their own, which a later run cannot disprove: wrong data (a
# corruption may be intermittent), a rank that died by itself (an OOM kill, a crash), a rank held stopped.
OWN_FAULTS = ("returned wrong all-reduce data", "died at stage", "process stopped")


def own_faults(results_by_host):
    """``{host: reason}`` of the nodes the all-node run names by their own ranks' evidence (:data:`OWN_FAULTS`);
    ``results_by_host``: host -> the ``allreduce`` module's result.  Localisation leaves them out (they fail on
    that evidence) and proves the others."""
    rows = [dict(entry, host=host) for host, result in sorted(results_by_host.items()) if isinstance(result, dict)
            for entry in result.get("ranks") or [] if isinstance(entry, dict)]
    faults = {}
    for suspect in find_suspects(rows):
        if suspect["reason"].startswith(OWN_FAULTS):
            faults.setdefault(suspect["host"], "rank %s %s" % (suspect["rank"], suspect["reason"]))
    return faults


def _missing_rows(host, plan):
    """Rank rows for a node whose result never came back."""
    args = plan["args_by_host"][host]
    first = args["node_rank"] * args["nproc_per_node"]
    return [{"rank": first + local, "local_rank": local, "stage": "unknown", "status": "no_result",
             "host": host, "error": None} for local in range(args["nproc_per_node"])]


def node_fabrics(nic_facts):
    """The fabric kinds a node can use, from its ``nic_discovery`` facts (None: not read)."""
    if not isinstance(nic_facts, dict):
        return None
    return sorted(usable_fabrics(nic_facts.get("nics") or {}, nic_facts.get("rdma_devices") or {}))


def _log_texts(result):
    """``[(rank or None, text)]``: the torchrun log (its lines carry local ranks) and each rank's own log files."""
    logs = result.get("rank_logs") or []
    if isinstance(logs, dict):
        logs = list(logs.values())
    texts = [(None, result.get("log") or "")]
    for entry in logs:
        if isinstance(entry, dict):
            rank = entry.get("rank")
            texts.append((rank if isinstance(rank, int) and rank >= 0 else None, entry.get("text") or ""))
    return texts


def _where(host, finding, local_ranks):
    """``n2 rank 3`` / ``n2 ranks 2, 3`` / ``n2``: the node and the ranks whose lines the finding took."""
    ranks = set(finding.get("ranks") or ())
    ranks.update(local_ranks.get(local, local) for local in finding.get("local_ranks") or ())
    if not ranks:
        return host
    return "%s rank%s %s" % (host, "s" if len(ranks) > 1 else "", ", ".join(str(rank) for rank in sorted(ranks)))


def _described(host, finding, local_ranks):
    """The finding with its own found / expected / fix naming the node and the rank, and the checks that catch its
    cause before a job."""
    where = _where(host, finding, local_ranks)
    more = " and %d more line(s)" % (finding["count"] - 1) if finding["count"] > 1 else ""
    out = dict(finding, node=host, where=where)
    out["found"] = "%s: %s [%s%s]" % (where, finding["cause"], finding["line"], more)
    out["expected"] = signature_expected(finding)
    if finding["fix"]:
        named = any(name in finding["fix"] for name in finding["checks"])
        before = "; before the next job: %s" % ", ".join(finding["checks"]) if finding["checks"] and not named else ""
        out["fix"] = "for %s: %s%s" % (where, finding["fix"], before)
    return out


def signature_check(host, result, fabric, backend, full, nodes=None):
    """``signatures``: the known failure signatures in ``host``'s torchrun log and rank logs.

    ``full``: the all-reduce failed or a rank of ``host`` did not finish: every
    signature is looked for; otherwise only the NCCL transport (``nccl``).  The
    status is the worst of the matched signatures; the cause the logs name
    (``details.cause``, :func:`cluster_preflight.capabilities.allreduce.signatures.primary`) leads the
    text and the fix.  ``nodes``: how many nodes the run spans.  Nothing matched:
    None on a healthy gloo run (nothing to report), ``not_applicable`` saying so
    otherwise.
    """
    texts = _log_texts(result)
    findings = match_signatures(texts, fabric=fabric or False, categories=None if full else ("transport",),
                                nodes=nodes)
    if fabric:
        fabric_text = "fabric %s" % ", ".join(fabric)
    else:
        fabric_text = "no fabric" if fabric is not None else "fabric not read"
    expected = "no known failure signature in %s's torchrun and rank logs%s" % (
        host, "; NCCL on the fabric where the node has one" if backend == "nccl" else "")
    if not findings:
        lines = sum(len(text.splitlines()) for _rank, text in texts)
        if full:
            return not_applicable("no known failure signature in the %d log lines of %s (%s); read %s.log and its "
                                  "rank logs in the run directory" % (lines, host, fabric_text, host), expected)
        if backend != "nccl":
            return None
        return not_applicable("NCCL printed no transport line in the %d log lines of %s (NCCL_DEBUG is not INFO, "
                              "or the line fell out of the log tail)" % (lines, host), expected)
    local_ranks = {row.get("local_rank"): row.get("rank") for row in result.get("ranks") or []
                   if isinstance(row, dict) and row.get("local_rank") is not None}
    findings = [_described(host, finding, local_ranks) for finding in findings]
    used = signature_transport(findings)
    status = worst(finding["status"] for finding in findings)
    cause = signature_primary(findings)
    ordered = ([cause] if cause else []) + [finding for finding in findings if finding is not cause]
    found = "%s (%s)%s: %s" % (host, fabric_text, ", NCCL transport %s" % used if used else "", "; ".join(
        "%s%s: %s" % ("cause " if finding is cause else "", finding["id"], finding["found"]) for finding in ordered))
    fixes = []
    for finding in ordered:
        if finding["status"] in ("warn", "fail") and finding["fix"] not in fixes:
            fixes.append(finding["fix"])
    details = {"findings": findings, "transport": used, "fabric": fabric, "cause": cause["id"] if cause else None,
               "category": cause["category"] if cause else None, "checks": cause["checks"] if cause else []}
    return check(status, found, cause["expected"] if cause else expected, " | ".join(fixes), **details)


# Signatures of a node that could not reach the rendezvous store
# (cluster_preflight/capabilities/allreduce/signatures.py).
STORE_UNREACHED = ("store_connect_timeout", "connection_timed_out", "connection_refused", "no_route_to_host",
                   "network_unreachable")
RENDEZVOUS_EXPECTED = "every node's torchrun reaches the rendezvous store on the master and starts its ranks"


def rendezvous_fault(plan, rows, signatures, lost, mesh_reached=None):
    """When no rank started anywhere and the logs say the rendezvous store was out of reach: whose fault.

    ``signatures``: host -> its ``signatures`` check (``details.findings``).  Every node, the master
    included, failed to reach the store: the master's port is at fault (closed after the port mesh,
    taken by another program, or never served).  Only some nodes, not the master: those nodes (outbound
    firewall or routing).  Returns ``None`` when this is not a rendezvous fault or cannot be told, else
    ``{hosts, checks}`` with a ``rendezvous`` check per blamed host."""
    if lost or not rows or any(row.get("status") != "missing" or row.get("stage") != "not started" for row in rows):
        return None
    hosts, master = list(plan.get("hosts") or []), plan.get("master")
    addr, port = plan.get("master_addr"), plan.get("master_port")
    unreached = [host for host in hosts if any(
        finding.get("id") in STORE_UNREACHED
        for finding in ((signatures.get(host) or {}).get("details") or {}).get("findings") or [])]
    if not unreached or master not in hosts:
        return None
    endpoint = "%s:%s" % (addr, port)
    checks = {}
    if set(unreached) == set(hosts):
        mesh = ("; the port mesh reached %s on port %s before the launch, so the port was closed after that check "
                "(a firewall rule added during the run), another program took it, or %s's torchrun did not serve "
                "it" % (master, port, master)) if master in (mesh_reached or ()) else (
                    "; a firewall on %s drops the port, another program holds it, or %s's torchrun did not serve it"
                    % (master, master))
        found = ("%s hosts the rendezvous store at %s and no node reached it: %s timed out or failed connecting to "
                 "it, %s itself included, and no rank started%s" % (
                     master, endpoint, ", ".join(hosts), master, mesh))
        fix = ("on %s: look for a DROP or REJECT of TCP %s (iptables -S INPUT; nft list ruleset) and remove it, check "
               "that nothing else holds the port (ss -ltnp 'sport = :%s'), and read %s.log in the run directory for "
               "its torchrun's own error; then re-run the preflight" % (master, port, port, master))
        checks[master] = failed(found, RENDEZVOUS_EXPECTED, fix, endpoint=endpoint, unreached=unreached)
        return {"hosts": [master], "checks": checks}
    if master in unreached:
        return None
    reached = [host for host in hosts if host not in unreached]
    for host in unreached:
        checks[host] = failed(
            "%s could not reach the rendezvous store on %s at %s while %s did, and no rank started" % (
                host, master, endpoint, ", ".join(reached)), RENDEZVOUS_EXPECTED,
            "on %s: check outbound firewall rules and the route to %s (iptables -S OUTPUT; ip route get %s; "
            "nc -vz %s %s), then re-run the preflight" % (host, addr, addr, addr, port),
            endpoint=endpoint)
    return {"hosts": unreached, "checks": checks}


def summarize(plan, results_by_host, lost=None, nic_facts=None, mesh_reached=None):
    """The gate's outcome from every launched node's result.

    ``results_by_host``: host -> the ``allreduce`` module's result (``ranks``,
    ``checks``, ``log``, ``rank_logs``); a launched node missing from it gave no
    result.  ``lost``: ``{host: reason}`` of nodes that stopped answering after
    the launch.  ``nic_facts``: host -> its ``nic_discovery`` facts (whether it
    has a fabric, for the NCCL transport).  Returns ``(summary, checks_by_host)``.

    ``signatures`` (see :func:`signature_check`): on a failed all-reduce on
    every node with a result; on a passed one only the NCCL transport, so it is
    absent on a healthy gloo run.  A healthy peer's failed signatures in a
    failed run are collateral (``warn``, blocked) like its other checks.
    """
    lost = dict(lost or {})
    fabrics = {host: node_fabrics((nic_facts or {}).get(host)) for host in plan.get("hosts") or []}
    summary = {
        "launched": bool(plan.get("launch")), "world_size": plan.get("world_size"),
        "planned_world_size": plan.get("world_size"), "backend": plan.get("backend"),
        "hosts": list(plan.get("hosts") or []), "master": plan.get("master"),
        "master_addr": plan.get("master_addr"), "master_port": plan.get("master_port"),
        "socket_ifname": plan.get("socket_ifname"),
        "correct": None, "sizes": [], "versions": None, "ranks": [], "suspects": [],
    }
    if not plan.get("launch"):
        summary["status"] = "skipped"
        summary["reason"] = plan.get("skip_reason") or "the all-reduce was not launched"
        return summary, {}
    rows, checks_by_host = _collect_rows(plan, results_by_host, lost)
    summary["ranks"] = rows
    reported = len([row for row in rows if row.get("status") != "no_result"])
    summary["world_size"] = reported
    complete = reported == plan["world_size"]
    ok = complete and all(row.get("status") == "ok" for row in rows)
    summary["correct"] = bool(rows) and all(row.get("correct") for row in rows)
    rank0 = next((row for row in rows if row["rank"] == 0), rows[0] if rows else {})
    summary["versions"] = rank0.get("versions")
    summary["sizes"] = rank0.get("bandwidth") or []
    summary["status"] = "pass" if ok and summary["correct"] else "fail"
    rows_by_host = {}
    for row in rows:
        rows_by_host.setdefault(row["host"], []).append(row)
    _world_size_checks(plan, rows_by_host, reported, complete, lost, checks_by_host)
    healthy = summary["status"] == "pass"
    signatures = _signature_checks(plan, results_by_host, lost, rows_by_host, fabrics, healthy, checks_by_host)
    if healthy:
        return summary, checks_by_host
    suspects = _blame(plan, rows, signatures, lost, mesh_reached, summary, checks_by_host)
    summary["suspects"] = suspects
    _collateral(plan, suspects, signatures, checks_by_host)
    return summary, checks_by_host


def _collect_rows(plan, results_by_host, lost):
    """``(rank rows sorted by rank, checks_by_host)`` of the launched nodes; a node with no result gets
    ``no_result`` rows and is added to ``lost``."""
    checks_by_host = {}
    rows = []
    for host in plan["hosts"]:
        result = results_by_host.get(host)
        if not isinstance(result, dict) or not isinstance(result.get("ranks"), list):
            lost.setdefault(host, "no result came back from %s" % host)
            rows.extend(_missing_rows(host, plan))
            continue
        for entry in result["ranks"]:
            row = dict(entry, host=host)
            row.pop("stack", None)
            rows.append(row)
        checks_by_host[host] = dict(result.get("checks") or {})
    rows.sort(key=lambda row: row["rank"])
    return rows, checks_by_host


def _world_size_checks(plan, rows_by_host, reported, complete, lost, checks_by_host):
    """``world_size`` on every launched node: the ranks that reported against the plan."""
    expected_world = "world size %d: %d node(s) x %d rank(s), as planned" % (
        plan["world_size"], len(plan["hosts"]), plan["nproc_per_node"])
    for host in plan["hosts"]:
        mine = rows_by_host.get(host, [])
        seen = len([row for row in mine if row.get("status") != "no_result"])
        world = "%d of the %d planned ranks reported (%s from %s)" % (reported, plan["world_size"], seen, host)
        checks_by_host.setdefault(host, {})["world_size"] = (
            passed(world, expected_world) if complete else
            (failed(world, expected_world, "a node's ranks never reported: see the suspects and %s.log" % host)
             if host in lost else
             warned(world, expected_world, "ranks of another node never reported (see the suspects); "
                                           "re-run the gate once it is fixed", blocked=True)))


def _signature_checks(plan, results_by_host, lost, rows_by_host, fabrics, healthy, checks_by_host):
    """``signatures`` of every node with a result (:func:`signature_check`); ``{host: check}``."""
    signatures = {}
    for host in plan["hosts"]:
        result = results_by_host.get(host)
        if host in lost or not isinstance(result, dict):
            continue
        full = not healthy or any(row.get("status") != "ok" for row in rows_by_host.get(host, ()))
        found = signature_check(host, result, fabrics.get(host), plan.get("backend"), full,
                                nodes=len(plan.get("hosts") or ()) or None)
        if found is not None:
            signatures[host] = checks_by_host[host]["signatures"] = found
    return signatures


def _blame(plan, rows, signatures, lost, mesh_reached, summary, checks_by_host):
    """The suspects of a failed run: the rendezvous' culprits (:func:`rendezvous_fault`), else
    :func:`find_suspects`."""
    rendezvous = rendezvous_fault(plan, rows, signatures, lost, mesh_reached)
    if not rendezvous:
        return find_suspects(rows, lost)
    summary["rendezvous"] = {"blamed": rendezvous["hosts"], "endpoint": "%s:%s" % (
        plan.get("master_addr"), plan.get("master_port"))}
    for host, found in rendezvous["checks"].items():
        checks_by_host.setdefault(host, {})["rendezvous"] = found
    return [{"host": row["host"], "rank": row["rank"],
             "reason": "never started: its node could not bring up the rendezvous (see allreduce.rendezvous)"}
            for row in rows if row["host"] in rendezvous["hosts"]]


def _collateral(plan, suspects, signatures, checks_by_host):
    """A healthy peer's failures become collateral (``warn``, blocked); each suspect rank fails its node."""
    blamed = {item["host"] for item in suspects}
    names = ", ".join("rank %d on %s (%s)" % (s["rank"], s["host"], s["reason"]) for s in suspects)
    for host in plan["hosts"]:
        if host in blamed:
            continue
        # A healthy peer's own failure was caused by the suspect: collateral, not blame.
        own = checks_by_host[host]
        for name in ("ranks", "correctness", "bandwidth"):
            if own.get(name, {}).get("status") == "fail":
                own[name] = warned(
                    "%s (collateral: %s)" % (own[name]["found"], names or "a peer failed"),
                    own[name]["expected"],
                    "fix the suspect node(s) and re-run; to confirm %s, run the gate with the suspect node(s) "
                    "taken out of the inventory group" % host, blocked=True)
        mine = signatures.get(host)
        if mine and mine["status"] == "fail":
            own["signatures"] = warned(
                "%s (collateral: %s)" % (mine["found"], names or "a peer failed"), mine["expected"],
                "%s; fix the suspect node(s) first: these lines are likely a consequence" % mine["fix"],
                blocked=True, **mine.get("details", {}))
    for item in suspects:
        host = item["host"]
        checks_by_host.setdefault(host, {})["suspect_rank_%d" % item["rank"]] = failed(
            "rank %d on %s %s" % (item["rank"], host, item["reason"]),
            "every rank completes the all-reduce with exact results",
            "drain %s; read %s.log and %s.stacks.txt in the run directory for its traceback or hang stack; "
            "re-run the gate with it taken out of the inventory group to confirm the rest" % (host, host, host))
