# -*- coding: utf-8 -*-
"""The verdict: every targeted node accounted for, every capability's outcome aggregated.

Controller-side (used by ``action_plugins/preflight_verdict.py``); pure
functions of what the nodes registered and what the decisions returned, so
they are unit-tested without Ansible.

The verdict starts from the nodes the run targeted, not from those still
answering.  For each node: input problems (``<capability>.inputs``), whether
it answered at every stage (``preflight.reachable``) or a stage failed
(``preflight.<stage>``), every decision's checks, and for every capability
that applies but gave nothing, ``<capability>.no_result`` saying why.  Node
status: ``fail`` (drain it), ``unverified`` (nothing wrong found on it, but a
check could not run because of another node or a cluster-wide blocker),
``warn`` or ``pass``.  The run passes only when every targeted node is
``pass`` or ``warn`` and the all-reduce passed with the planned world size.
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile

from ansible.module_utils import preflight_capabilities as registry
from ansible.module_utils.preflight_checks import (CheckError, RUN, add, blocked, capability_of, failed, node_status,
                                                   passed)
from ansible.module_utils.preflight_cluster import outcome

VERDICT_FILE = "verdict.json"
REQUIRED_KEYS = ("status", "hosts", "nodes", "healthy_hosts", "failed_hosts", "unreachable_hosts")


def _input_checks(host, settings_result):
    """``<capability>.inputs`` fails from the settings stage, one per capability."""
    by_capability = {}
    for item in (settings_result or {}).get("errors") or []:
        by_capability.setdefault(item.get("capability") or RUN, []).append(item)
    checks = {}
    for capability, items in sorted(by_capability.items()):
        checks[(capability, "inputs")] = failed(
            "invalid setting(s) for %s on %s: %s" % (capability, host, "; ".join(
                "%s is %s" % (item["name"], item["found"]) for item in items)),
            "; ".join("%s: %s" % (item["name"], item["expected"]) for item in items),
            "; ".join(item["fix"] for item in items))
    return checks


def _stage_checks(host, records, stages):
    """``preflight.reachable`` and ``preflight.<stage>`` from the node's task results."""
    checks = {}
    unreachable = None
    for stage in stages:
        state, message = outcome(records.get(registry.STAGE_REGISTERS[stage]))
        what = registry.STAGE_WHAT[stage]
        if state == "unreachable" and unreachable is None:
            unreachable = (stage, message)
        elif state == "failed":
            checks[(RUN, stage)] = failed(
                "%s failed on %s while %s: %s" % (stage, host, what, message[:600]),
                "every preflight task completes on the node within its bound",
                "read the play output for %s; a timeout means the node is overloaded or hung (check it with "
                "uptime and dmesg); then re-run" % host)
    if unreachable:
        stage, message = unreachable
        checks[(RUN, "reachable")] = failed(
            "%s stopped answering over SSH while %s: %s" % (host, registry.STAGE_WHAT[stage], message[:400]),
            "the node answers over SSH at every stage of the run",
            "check that %s is up, its sshd runs, the inventory address is right and no firewall drops port 22; "
            "then re-run the preflight (its peers were not blamed)" % host)
    else:
        checks[(RUN, "reachable")] = passed("%s answered at every stage it took part in" % host,
                                            "the node answers over SSH at every stage of the run")
    return checks, unreachable is not None


def _why_nothing(host, records, capability, stages):
    """The first stage a capability depended on that did not deliver, as text."""
    for stage in ("facts",) + tuple(registry.DEPENDS.get(capability, ())):
        if stage not in stages:
            continue
        state, message = outcome(records.get(registry.STAGE_REGISTERS[stage]))
        if state in ("unreachable", "failed", "missing"):
            return "%s was %s while %s: %s" % (host, state, registry.STAGE_WHAT[stage], message[:300])
    return "no decision covered %s (a defect of the preflight)" % host


def budget_check(elapsed, limit):
    """``preflight.budget``: the run's wall time, Ansible's start-up included, against its budget."""
    expected = "the whole run within %d s (a scheduler kills a health check at 60 s)" % limit
    if elapsed <= limit:
        return passed("finished in %.1f s of the %d s budget" % (elapsed, limit), expected)
    return failed("took %.1f s, over the %d s budget" % (elapsed, limit), expected,
                  "find the slow step in the play output (a hung mount or sysfs read, an overloaded node); raise "
                  "preflight_healthcheck_budget only if the scheduler allows it")


def build_verdict(hosts, records_by_host, decisions, capabilities, stages, run_id, run_dir, bound_seconds=None,
                  gate=True, budget=None):
    """The verdict dict.

    ``records_by_host``: host -> {registered variable -> result};
    ``decisions``: the ``preflight_decide`` results in order (each with
    ``checks_by_host``); ``capabilities``: the capabilities that apply to every
    node of this run; ``stages``: the node stages this playbook has;
    ``budget``: ``{elapsed, limit}`` seconds for a budgeted run (healthcheck.yml).
    """
    stopped = next((item for item in decisions if item.get("invalid_hosts")), None)
    nodes = {}
    unreachable_hosts = []
    for host in hosts:
        records = records_by_host.get(host) or {}
        flat, problems = {}, []

        def _add(capability, name, result):
            try:
                add(flat, capability, name, result, host)
            except CheckError as exc:
                problems.append(str(exc))

        settings_result = records.get(registry.STAGE_REGISTERS["settings"])
        inputs = _input_checks(host, settings_result)
        for (capability, name), result in inputs.items():
            _add(capability, name, result)
        if stopped and not inputs:
            _add(RUN, "inputs", blocked("not checked: the run stopped before touching any node because of invalid "
                                        "settings on %s" % ", ".join(stopped["invalid_hosts"]),
                                        "valid settings on every node"))
        for capability, message in sorted((records.get(registry.STAGE_REGISTERS["apply"]) or {}).items()):
            _add(capability, "error", failed(
                "%s could not be applied on %s: %s" % (capability, host, str(message)[:600]),
                "every capability of the bring-up applies on the node",
                "fix what the message names (a package mirror, a read-only /etc, a missing file), then re-run "
                "bringup.yml; the other capabilities were applied"))
        stage_checks, lost = _stage_checks(host, records, stages)
        if lost:
            unreachable_hosts.append(host)
        if not stopped:
            for (capability, name), result in stage_checks.items():
                _add(capability, name, result)
        for item in decisions:
            for capability, checks in sorted(((item.get("checks_by_host") or {}).get(host) or {}).items()):
                for name, result in sorted(checks.items()):
                    _add(capability, name, result)
        if not stopped:
            covered = {capability_of(key) for key in flat}
            for capability in capabilities:
                if capability not in covered:
                    _add(capability, "no_result", failed(
                        "no result from %s on %s: %s" % (capability, host,
                                                         _why_nothing(host, records, capability, stages)),
                        "every capability that applies gives its outcome on every targeted node",
                        "see preflight.reachable and the play output for %s, fix it, then re-run" % host))
        if budget is not None:
            _add(RUN, "budget", budget_check(budget["elapsed"], budget["limit"]))
        for problem in problems:
            flat.setdefault("%s.contract" % RUN, failed(
                problem, "unique, well-formed check names", "a defect of the preflight: report it with this file"))
        nodes[host] = {"status": node_status(flat), "reachable": not lost, "checks": flat}
    gate_summary = next((item["allreduce"] for item in reversed(decisions) if item.get("allreduce")), None)
    failed_hosts = [host for host in hosts if nodes[host]["status"] == "fail"]
    unverified = [host for host in hosts if nodes[host]["status"] == "unverified"]
    healthy = [host for host in hosts if nodes[host]["status"] in ("pass", "warn")]
    status = "pass" if hosts and len(healthy) == len(hosts) else "fail"
    if gate and (not gate_summary or gate_summary.get("status") != "pass"):
        status = "fail"
    verdict = {
        "status": status,
        "run_id": run_id,
        "run_dir": run_dir,
        "finished": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "hosts": list(hosts),
        "healthy_hosts": healthy,
        "failed_hosts": failed_hosts,
        "unverified_hosts": unverified,
        "warn_hosts": [host for host in hosts if nodes[host]["status"] == "warn"],
        "unreachable_hosts": unreachable_hosts,
        "nodes": nodes,
        "bound_seconds": bound_seconds,
    }
    if gate:
        verdict["allreduce"] = gate_summary or {"status": "skipped", "reason": "the all-reduce was not planned",
                                                "launched": False, "ranks": [], "suspects": []}
    if stopped:
        verdict["stopped"] = "invalid settings on %s" % ", ".join(stopped["invalid_hosts"])
    return verdict


def failure_lines(verdict):
    """One line per failing or blocked check, node / check / found / expected / fix."""
    lines = []
    for host in verdict["hosts"]:
        for name, result in sorted(verdict["nodes"][host]["checks"].items()):
            if result["status"] == "fail" or (result.get("details") or {}).get("blocked"):
                lines.append("%s / %s: found %s; expected %s; fix: %s" % (
                    host, name, result["found"], result["expected"], result["fix"] or "see the failing node(s)"))
    gate = verdict.get("allreduce")
    if gate and gate.get("status") == "skipped":
        lines.append("all-reduce not run: %s" % gate.get("reason"))
    return lines


def summary_line(verdict, path, label="PREFLIGHT"):
    return "%s %s: %d/%d nodes healthy%s%s; verdict %s" % (
        label, verdict["status"].upper(), len(verdict["healthy_hosts"]), len(verdict["hosts"]),
        "; failed: %s" % ", ".join(verdict["failed_hosts"]) if verdict["failed_hosts"] else "",
        "; unverified: %s" % ", ".join(verdict["unverified_hosts"]) if verdict["unverified_hosts"] else "", path)


def atomic_write(path, text, mode=0o644):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_run_dir(verdict, logs_by_host, results_dir, run_dir, filename=VERDICT_FILE):
    """Node logs and stacks first, the verdict file last, then ``latest`` moves to this run
    (only for the gate's verdict: ``latest`` is what a scheduler reads)."""
    os.makedirs(run_dir, exist_ok=True)
    for host, logs in sorted((logs_by_host or {}).items()):
        if logs.get("log") is not None:
            atomic_write(os.path.join(run_dir, "%s.log" % host), logs.get("log") or "")
        for entry in logs.get("rank_logs") or []:
            # torchrun's own per-rank files (rank1.stderr.log); the name is the module's, never a path.
            name = os.path.basename(str(entry.get("name") or ""))
            if name:
                atomic_write(os.path.join(run_dir, "%s.%s" % (host, name)), entry.get("text") or "")
        stacks = ["== rank %s (pid %s, %s) at stage %s ==\n%s" % (
            entry["rank"], entry.get("pid"), entry.get("process_state"), entry.get("stage"), entry["stack"])
            for entry in logs.get("ranks") or [] if entry.get("stack")]
        if stacks:
            atomic_write(os.path.join(run_dir, "%s.stacks.txt" % host), "\n".join(stacks))
    atomic_write(os.path.join(run_dir, filename), json.dumps(verdict, indent=2, sort_keys=True) + "\n")
    if filename != VERDICT_FILE:
        return
    latest = os.path.join(results_dir, "latest")
    tmp_link = os.path.join(results_dir, ".latest-%d" % os.getpid())
    if os.path.lexists(tmp_link):
        os.unlink(tmp_link)
    os.symlink(os.path.relpath(run_dir, results_dir), tmp_link)
    os.replace(tmp_link, latest)
