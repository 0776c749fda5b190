# -*- coding: utf-8 -*-
"""Controller-side verdict: collect every node's findings, name the bad nodes, write the run directory.

Runs on the controller only (it reads ``hostvars``), so it is an action plugin;
its documentation lives in ``library/preflight_verdict.py``.  The decision
logic is plain functions below, unit-tested directly.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import tempfile

from ansible.plugins.action import ActionBase

STATUS_ORDER = ("pass", "not_applicable", "skipped", "warn", "fail")
# Exit codes of ranks that torchrun itself terminated after another rank failed.
TERMINATED_BY_AGENT = (-15, 143)
BARRIER_RE = re.compile(r"[Rr]anks?\s+([\d,\s]+?)\s+failed to pass monitoredBarrier")
PEER_LOST_RE = re.compile(r"Connection (closed|reset) by peer|Broken pipe|recv.*failed|closed by remote|"
                          r"Socket Timeout|timed out|Timeout", re.I)


def worst(statuses):
    result = "pass"
    for status in statuses:
        if STATUS_ORDER.index(status) > STATUS_ORDER.index(result):
            result = status
    return result


def check(status, found, expected, fix=""):
    return {"status": status, "found": found, "expected": expected, "fix": fix}


def node_checks(host, facts):
    """Merge every ``*_checks`` fact of one node, plus its reachability."""
    checks = {}
    ping = facts.get("preflight_ping")
    if not ping or ping.get("unreachable"):
        msg = (ping or {}).get("msg") or "no result: the node never answered"
        checks["ssh_reachable"] = check(
            "fail", "%s is unreachable: %s" % (host, str(msg).strip()[:400]),
            "the node answers over SSH within the connection timeout",
            "check that %s is up, sshd runs, the inventory address is right and its host key is in known_hosts "
            "(run bringup.yml); then re-run preflight" % host)
        return checks, False
    checks["ssh_reachable"] = check("pass", "%s answered over SSH" % host, "the node answers over SSH")
    for key in sorted(facts):
        if key.endswith("_checks") and isinstance(facts[key], dict):
            for name, result in facts[key].items():
                if isinstance(result, dict) and result.get("status") in STATUS_ORDER:
                    checks[name] = dict(result)
    return checks, True


def _peer_named_ranks(ranks):
    named = set()
    for entry in ranks:
        for match in BARRIER_RE.finditer(entry.get("error") or ""):
            named.update(int(part) for part in re.findall(r"\d+", match.group(1)))
    return named


def find_suspects(rank_rows):
    """Which ranks caused a failed gate, and why.  ``rank_rows`` carry ``host``.

    Primary causes, strongest first: wrong data; a rank that died on its own
    (not terminated by torchrun after a peer failed); a stopped or hung
    process; ranks that peers name as missing from the monitored barrier; a
    node whose ranks never started.  Ranks that only lost their peer are
    collateral.
    """
    suspects = []
    for row in rank_rows:
        reason = None
        if row.get("status") == "wrong":
            reason = "returned wrong all-reduce data (%s wrong elements)" % (row.get("correctness") or {}).get("wrong")
        elif row.get("status") == "died" and row.get("exitcode") not in TERMINATED_BY_AGENT:
            reason = "died at stage %s with exit code %s" % (row.get("stage"), row.get("exitcode"))
        elif row.get("process_state", "").startswith("stopped"):
            reason = "process %s at stage %s" % (row["process_state"], row.get("stage"))
        elif row.get("status") in ("missing",) and row.get("stage") == "not started":
            reason = "never started (its node's torchrun did not launch it)"
        if reason:
            suspects.append({"host": row["host"], "rank": row["rank"], "reason": reason})
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
        failed = [row for row in rank_rows if row.get("status") != "ok"]
        own = [row for row in failed if not PEER_LOST_RE.search(row.get("error") or "")]
        stages = [row.get("stage") for row in failed]
        if failed and own and len(own) < len(failed):
            failed = own
        elif failed and len(set(stages)) > 1:
            # Everyone failed the same way: the ranks that got least far are the likeliest cause.
            order = ("not started", "start", "init", "correctness", "barrier", "bandwidth", "done")
            earliest = min(stages, key=lambda stage: order.index(stage) if stage in order else 0)
            failed = [row for row in failed if row.get("stage") == earliest]
        for row in failed:
            suspects.append({"host": row["host"], "rank": row["rank"],
                             "reason": "%s at stage %s: %s" % (row.get("status"), row.get("stage"),
                                                               (row.get("error") or "no error recorded")[:200])})
    return suspects


def summarize_allreduce(hosts, facts_by_host):
    """The cluster-wide all-reduce result, and per-host gate findings to merge."""
    plan = {}
    results = {}
    for host in hosts:
        facts = facts_by_host.get(host, {})
        plan = plan or facts.get("allreduce_plan") or {}
        result = facts.get("allreduce_result")
        if isinstance(result, dict) and "ranks" in result:
            results[host] = result
    summary = {
        "launched": bool(results),
        "world_size": plan.get("world_size"),
        "backend": plan.get("backend"),
        "master": plan.get("master"),
        "master_addr": plan.get("master_addr"),
        "master_port": plan.get("master_port"),
        "socket_ifname": plan.get("socket_ifname"),
        "correct": None,
        "sizes": [],
        "versions": None,
        "ranks": [],
        "suspects": [],
    }
    extra = {}
    if not results:
        summary["status"] = "skipped"
        summary["reason"] = plan.get("skip_reason") or "the all-reduce was not launched"
        return summary, extra
    rows = []
    for host, result in results.items():
        for entry in result["ranks"]:
            row = dict(entry, host=host)
            row.pop("stack", None)
            rows.append(row)
    rows.sort(key=lambda row: row["rank"])
    summary["ranks"] = rows
    ok = all(row.get("status") == "ok" for row in rows) and len(rows) == (plan.get("world_size") or len(rows))
    summary["correct"] = all(row.get("correct") for row in rows) if rows else False
    rank0 = next((row for row in rows if row["rank"] == 0), rows[0] if rows else {})
    summary["versions"] = rank0.get("versions")
    summary["sizes"] = rank0.get("bandwidth") or []
    summary["status"] = "pass" if ok and summary["correct"] else "fail"
    if summary["status"] == "fail":
        suspects = find_suspects(rows)
        summary["suspects"] = suspects
        blamed = {item["host"] for item in suspects}
        for host in results:
            if host in blamed:
                continue
            names = ", ".join("rank %d on %s (%s)" % (s["rank"], s["host"], s["reason"]) for s in suspects)
            extra[host] = {"allreduce_ranks": check(
                "warn", "ranks on %s failed only because a peer failed: %s" % (host, names),
                "every rank completes", "fix the suspect node(s) and re-run; to confirm %s, run the gate with "
                "the suspect node(s) taken out of the inventory group" % host)}
        for item in suspects:
            extra.setdefault(item["host"], {})
            extra[item["host"]]["allreduce_suspect_rank_%d" % item["rank"]] = check(
                "fail", "rank %d on %s %s" % (item["rank"], item["host"], item["reason"]),
                "every rank completes the all-reduce with exact results",
                "drain %s; read %s.log and %s.stacks.txt in the run directory for its traceback or hang stack; "
                "re-run the gate with it taken out of the inventory group to confirm the rest"
                % (item["host"], item["host"], item["host"]))
    return summary, extra


def build_verdict(hosts, facts_by_host, run_id, run_dir):
    nodes = {}
    reached = {}
    for host in hosts:
        checks, reached[host] = node_checks(host, facts_by_host.get(host, {}))
        nodes[host] = {"checks": checks}
    allreduce, extra = summarize_allreduce(hosts, facts_by_host)
    for host, checks in extra.items():
        nodes[host]["checks"].update(checks)
    for host, node in nodes.items():
        status = worst(result["status"] for result in node["checks"].values())
        node["status"] = status if status in ("fail", "warn") else "pass"
        node["reachable"] = reached[host]
    failed = [host for host in hosts if nodes[host]["status"] == "fail"]
    # Healthy = may take a job: warnings (drift under a warn policy, a peer's
    # failure) do not stop a node; warn_hosts lists them.
    healthy = [host for host in hosts if nodes[host]["status"] != "fail"]
    status = "fail" if failed or allreduce["status"] == "fail" else "pass"
    if allreduce["status"] == "skipped" and status == "pass":
        # A gate that could not run is not a pass.
        status = "fail"
    return {
        "status": status,
        "run_id": run_id,
        "run_dir": run_dir,
        "finished": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "hosts": list(hosts),
        "healthy_hosts": healthy,
        "failed_hosts": failed,
        "warn_hosts": [host for host in hosts if nodes[host]["status"] == "warn"],
        "unreachable_hosts": [host for host in hosts if not reached[host]],
        "nodes": nodes,
        "allreduce": allreduce,
    }


def failure_lines(verdict):
    lines = []
    for host in verdict["hosts"]:
        for name, result in sorted(verdict["nodes"][host]["checks"].items()):
            if result["status"] == "fail":
                lines.append("%s / %s: found %s; expected %s; fix: %s" % (
                    host, name, result["found"], result["expected"], result["fix"]))
    if verdict["allreduce"]["status"] == "skipped":
        lines.append("all-reduce not run: %s" % verdict["allreduce"].get("reason"))
    return lines


def _atomic_write(path, text):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def write_run_dir(verdict, facts_by_host, results_dir, run_dir):
    os.makedirs(run_dir, exist_ok=True)
    for host in verdict["hosts"]:
        result = facts_by_host.get(host, {}).get("allreduce_result")
        if isinstance(result, dict) and "log" in result:
            _atomic_write(os.path.join(run_dir, "%s.log" % host), result.get("log") or "")
            stacks = ["== rank %s (pid %s, %s) at stage %s ==\n%s" % (
                entry["rank"], entry.get("pid"), entry.get("process_state"), entry.get("stage"), entry["stack"])
                for entry in result["ranks"] if entry.get("stack")]
            if stacks:
                _atomic_write(os.path.join(run_dir, "%s.stacks.txt" % host), "\n".join(stacks))
    _atomic_write(os.path.join(run_dir, "verdict.json"), json.dumps(verdict, indent=2, sort_keys=True) + "\n")
    latest = os.path.join(results_dir, "latest")
    tmp_link = os.path.join(results_dir, ".latest-%d" % os.getpid())
    if os.path.lexists(tmp_link):
        os.unlink(tmp_link)
    os.symlink(os.path.relpath(run_dir, results_dir), tmp_link)
    os.replace(tmp_link, latest)


def _plain(value):
    """Host variables as plain JSON data (drops templating wrappers)."""
    return json.loads(json.dumps(value, default=str))


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("hosts", "results_dir", "run_id", "fail"))
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        hosts = list(args.get("hosts") or [])
        results_dir = os.path.abspath(args.get("results_dir") or "results")
        run_id = args.get("run_id") or datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        run_dir = os.path.join(results_dir, run_id)
        hostvars = task_vars["hostvars"]
        wanted = ("preflight_ping", "allreduce_plan", "allreduce_result")
        facts_by_host = {}
        for host in hosts:
            facts = {}
            host_vars = hostvars.get(host) or {}
            for key in list(host_vars.keys()):
                if key in wanted or key.endswith("_checks"):
                    facts[key] = _plain(host_vars[key])
            facts_by_host[host] = facts
        verdict = build_verdict(hosts, facts_by_host, run_id, run_dir)
        write_run_dir(verdict, facts_by_host, results_dir, run_dir)
        lines = failure_lines(verdict)
        result.update(changed=False, verdict_status=verdict["status"], run_dir=run_dir,
                      verdict_file=os.path.join(run_dir, "verdict.json"),
                      healthy_hosts=verdict["healthy_hosts"], failed_hosts=verdict["failed_hosts"],
                      failures=lines)
        if verdict["status"] == "fail" and args.get("fail", True):
            result["failed"] = True
            result["msg"] = "PREFLIGHT FAILED (verdict %s):\n%s" % (
                os.path.join(run_dir, "verdict.json"), "\n".join("- " + line for line in lines))
        else:
            result["msg"] = "PREFLIGHT %s: %d/%d nodes healthy; verdict %s" % (
                verdict["status"].upper(), len(verdict["healthy_hosts"]), len(hosts),
                os.path.join(run_dir, "verdict.json"))
        return result
