# -*- coding: utf-8 -*-
"""The verdict: every targeted node accounted for, every capability's outcome aggregated.

Controller-side (used by ``cluster_preflight/outputs/finish.py``, the verdict task); pure
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
import errno
import os
import re
import shutil
import stat
import tempfile

from cluster_preflight import capabilities
from cluster_preflight.plays import stage_results
from preflight_node.checks import CheckError, RUN, add, blocked, failed, node_status, passed, warned
from cluster_preflight.stages.view import outcome
from cluster_preflight.verdict.json_text import indented
from cluster_preflight.stages.run_lock import lock_checks, lost_checks
from cluster_preflight.verdict.printable import printable
from cluster_preflight.verdict.task_start import node_said, start_fix
from cluster_preflight.verdict.file import RUN_OUTCOME_CHECKS

VERDICT_FILE = "verdict.json"
# A run's files name every node, its faults and its logs (a rank's environment can end up in
# them): the owner and the group may read them, nobody else.  Set explicitly, whatever the umask.
RUN_DIR_MODE = 0o750
FILE_MODE = 0o640
RESULTS_DIR_MODE = 0o750
HIDDEN = "its output is hidden (no_log)"
# A quoted key of a task result followed by ':' -- a rescue that printed ansible_failed_result
# whole (its arguments, environment and output) into a message.
_DUMPED_RESULT = re.compile(r"""['"](invocation|module_args|censored|_ansible_no_log|environment|env|stdout|"""
                            r"""stdout_lines|stderr|stderr_lines|module_stdout|module_stderr|results)['"]\s*:""")


def scrub(text):
    """``text`` without a task result dumped into it (a rescue that printed ``ansible_failed_result``
    whole): from the first ``{`` before the result's first key on, it is cut and the cut is said."""
    text = str(text)
    match = _DUMPED_RESULT.search(text)
    if not match:
        return text
    brace = text.find("{", 0, match.start())
    kept = text[:brace if brace != -1 else match.start()].rstrip()
    return " ".join(part for part in (kept, "[a task result in this message was left out of the verdict: see the "
                                             "play output]") if part)


def task_message(result, default="failed"):
    """What the verdict keeps of a failed or unreachable task: its ``msg`` and ``rc``.

    Never ``invocation``, module arguments, environment or output: Ansible registers a task's
    result whole (no_log or not; only ``invocation`` is dropped, and a rescue's
    ``ansible_failed_result`` keeps even that), and they may carry secrets.  A censored result
    gives nothing but that it was hidden.  ``result`` may also be a rescue's text record.  The one
    exception: a module that never started (rc 126/127, no JSON) did not print its output, the node's
    shell did, and that is the cause: its last characters are kept (``preflight_task_start``).
    """
    if result is None:
        return default
    if not isinstance(result, dict):
        return scrub(result)
    if "censored" in result or result.get("_ansible_no_log"):
        return HIDDEN
    msg = result.get("msg")
    if isinstance(msg, str) and msg.strip():
        text = scrub(msg).strip()
    else:
        text = "%s (no message: see the play output)" % default
    rc = result.get("rc")
    if isinstance(rc, int) and not isinstance(rc, bool):
        text += " (rc %d)" % rc
    said = node_said(result)
    if said:
        text += "; the node said: %s" % scrub(said)
    return text


def task_outcome(result):
    """``(state, message)`` of one registered task result (the states of ``preflight_cluster.outcome``),
    the message of a failed or unreachable task reduced by :func:`task_message`."""
    state, message = outcome(result)
    if state in ("failed", "unreachable"):
        return state, task_message(result, state)
    return state, message


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
    unknown = (settings_result or {}).get("input_warnings") or []
    if unknown:
        checks[(RUN, "unknown_variables")] = warned(
            "variables set on %s that no part of the preflight reads: %s" % (host, "; ".join(
                "%s (did you mean %s?)" % (item["name"], item["suggestion"]) if item.get("suggestion")
                else item["name"] for item in unknown)),
            "only variables the roles define (docs/variables.md)",
            "correct or remove them in the inventory or the -e options (preflight_unknown_variables: warn is on)")
    return checks


REACH_FIX = {
    "over SSH": "check that %(host)s is up, its sshd runs, the inventory address is right and no firewall drops port "
                "22; then re-run the preflight (its peers were not blamed)",
    "to Slurm": "check that %(host)s is up and its slurmd answers (scontrol show node %(host)s; slurmd's log on the "
                "node), then re-run the preflight in a new allocation (its peers were not blamed)",
}


def _stage_checks(host, records, stages):
    """``preflight.reachable`` and ``preflight.<stage>`` from the node's task results; a node module
    that could not start gets the fix for its cause (``preflight_task_start``)."""
    login = ((records.get(stage_results.STAGE_REGISTERS["settings"]) or {}).get("node") or {}).get("user") or ""
    checks = {}
    unreachable = None
    for stage in stages:
        result = records.get(stage_results.STAGE_REGISTERS[stage])
        state, message = task_outcome(result)
        what = stage_results.STAGE_WHAT[stage]
        if state == "unreachable" and unreachable is None:
            # How the node was reached: over SSH (the ssh engine), or through Slurm (the srun engine's "via").
            unreachable = (stage, message, (result or {}).get("via") or "over SSH")
        elif state == "failed":
            # A node call that could not start (its interpreter) is the inventory's configuration, not the node's
            # health: the run history does not count it as a flaky node.  The srun engine says what to do about a
            # task it refused (``fix``).
            fix = start_fix(result, login, host)
            given = (result or {}).get("fix")
            checks[(RUN, stage)] = failed(
                "%s failed on %s while %s: %s" % (stage, host, what, message[:600]),
                "every preflight task completes on the node within its bound",
                fix or (given if isinstance(given, str) and given else None) or
                "read the play output for %s; a timeout means the node is overloaded or hung (check it with "
                "uptime and dmesg); then re-run" % host, **({"configuration": True} if fix else {}))
    if unreachable:
        stage, message, via = unreachable
        checks[(RUN, "reachable")] = failed(
            "%s stopped answering %s while %s: %s" % (host, via, stage_results.STAGE_WHAT[stage], message[:400]),
            "the node answers %s at every stage of the run" % via,
            (REACH_FIX.get(via) or REACH_FIX["over SSH"]) % {"host": host})
    else:
        checks[(RUN, "reachable")] = passed("%s answered at every stage it took part in" % host,
                                            "the node answers over SSH at every stage of the run")
    return checks, unreachable is not None


def _why_nothing(host, records, capability, stages):
    """``(text, cause)``: the first stage a capability depended on that did not deliver, and the check that names
    it on the node (``preflight.reachable``, ``preflight.<stage>``; None when no stage explains it)."""
    for stage in ("facts",) + tuple(capabilities.DEPENDS.get(capability, ())):
        if stage not in stages:
            continue
        state, _message = task_outcome(records.get(stage_results.STAGE_REGISTERS[stage]))
        if state in ("unreachable", "failed", "missing"):
            cause = "%s.%s" % (RUN, "reachable" if state == "unreachable" else stage)
            return "%s was %s while %s (%s says why)" % (host, state, stage_results.STAGE_WHAT[stage], cause), cause
    return "no decision covered %s (a defect of the preflight)" % host, None


def budget_check(elapsed, limit):
    """``preflight.budget``: the run's wall time, Ansible's start-up included, against its budget."""
    expected = "the whole run within %d s (a scheduler kills a health check at 60 s)" % limit
    if elapsed <= limit:
        return passed("finished in %.1f s of the %d s budget" % (elapsed, limit), expected)
    return failed("took %.1f s, over the %d s budget" % (elapsed, limit), expected,
                  "find the slow step in the play output (a hung mount or sysfs read, an overloaded node); raise "
                  "preflight_healthcheck_budget only if the scheduler allows it")


def _node_verdict(host, records, decisions, capabilities, stages, stopped, budget):
    """``(node entry, lost)`` of one targeted node: its inputs, stage, decision and ``no_result`` checks
    (see :func:`build_verdict`)."""
    flat, problems = {}, []

    def _add(capability, name, result):
        try:
            add(flat, capability, name, result, host)
        except CheckError as exc:
            problems.append(str(exc))

    settings_result = records.get(stage_results.STAGE_REGISTERS["settings"])
    inputs = _input_checks(host, settings_result)
    for (capability, name), result in inputs.items():
        _add(capability, name, result)
    if stopped and not inputs:
        _add(RUN, "inputs", blocked("not checked: the run stopped before touching any node because of invalid "
                                    "settings on %s" % ", ".join(stopped["invalid_hosts"]),
                                    "valid settings on every node"))
    for capability, message in sorted((records.get(stage_results.STAGE_REGISTERS["apply"]) or {}).items()):
        # A rescue's record: text, or the failed task's result (reduced to its message).
        _add(capability, "error", failed(
            "%s could not be applied on %s: %s" % (capability, host, task_message(message)[:600]),
            "every capability of the bring-up applies on the node",
            "fix what the message names (a package mirror, a read-only /etc, a missing file), then re-run "
            "bringup.yml; the other capabilities were applied"))
    stage_checks, lost = _stage_checks(host, records, stages)
    busy = lock_checks(host, records.get(stage_results.STAGE_REGISTERS["facts"]), stage_checks) \
        or lost_checks(host, records, stages, stage_checks)
    if not stopped:
        for (capability, name), result in stage_checks.items():
            _add(capability, name, result)
    for item in decisions:
        for capability, checks in sorted(((item.get("checks_by_host") or {}).get(host) or {}).items()):
            for name, result in sorted(checks.items()):
                _add(capability, name, result)
    if not stopped:
        _no_result_checks(host, records, capabilities, stages, busy, flat, _add)
    if budget is not None:
        _add(RUN, "budget", budget_check(budget["elapsed"], budget["limit"]))
    for problem in problems:
        flat.setdefault("%s.contract" % RUN, failed(
            problem, "unique, well-formed check names", "a defect of the preflight: report it with this file"))
    return {"status": node_status(flat), "reachable": not lost, "checks": flat}, lost


def _no_result_checks(host, records, capabilities, stages, busy, flat, _add):
    """``<capability>.no_result`` for every capability that applies but gave nothing on ``host``."""
    covered = {key.split(".", 1)[0] for key in flat}  # the capability of every key
    for capability in capabilities:
        if capability not in covered and busy:
            _add(capability, "no_result", blocked("not checked on %s: %s" % (host, busy), "a node this run "
                                                  "holds", "wait for that run to end, then re-run"))
        elif capability not in covered:
            why, cause = _why_nothing(host, records, capability, stages)
            if cause and cause in flat:
                # A consequence: its cause is a finding of this node with the error and the fix; the summary counts
                # this one under it (details.caused_by), and nothing here repeats the error.
                _add(capability, "no_result", failed(
                    "no result from %s on %s: %s" % (capability, host, why),
                    "every capability that applies gives its outcome on every targeted node",
                    "fix %s on %s (its finding says how), then re-run" % (cause, host), caused_by=[cause]))
            else:
                _add(capability, "no_result", failed(
                    "no result from %s on %s: %s" % (capability, host, why),
                    "every capability that applies gives its outcome on every targeted node",
                    "a defect of the preflight when no stage failed on %s: report it with this verdict file; "
                    "re-run meanwhile" % host if cause is None else
                    "find in the play output why the stage named did not run on %s (an error earlier in the play), "
                    "fix it, then re-run" % host))


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
        nodes[host], lost = _node_verdict(host, records_by_host.get(host) or {}, decisions, capabilities, stages,
                                          stopped, budget)
        if lost:
            unreachable_hosts.append(host)
    localize = next((item["localize"] for item in decisions if item.get("localize")), None)
    if gate and localize:
        hold_contradictions(nodes, localize)
    gate_summary = next((item["allreduce"] for item in reversed(decisions) if item.get("allreduce")), None)
    failed_hosts = [host for host in hosts if nodes[host]["status"] == "fail"]
    unverified = [host for host in hosts if nodes[host]["status"] == "unverified"]
    healthy = [host for host in hosts if nodes[host]["status"] in ("pass", "warn")]
    status = "pass" if hosts and len(healthy) == len(hosts) else "fail"
    # The gate passed when the all-node run did, or when the nodes left after localisation passed together.
    if gate and (not gate_summary or "pass" not in (gate_summary.get("status"),
                                                    (gate_summary.get("confirm") or {}).get("status"))):
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
        "busy_hosts": [host for host in hosts if "%s.busy" % RUN in nodes[host]["checks"]],
        "unreachable_hosts": unreachable_hosts,
        "nodes": nodes,
        "bound_seconds": bound_seconds,
    }
    if gate:
        verdict["allreduce"] = gate_summary or {"status": "skipped", "reason": "the all-reduce was not planned",
                                                "launched": False, "ranks": [], "suspects": []}
    if gate and localize:
        verdict["localize"] = localize
    if stopped:
        verdict["stopped"] = "invalid settings on %s" % ", ".join(stopped["invalid_hosts"])
    return verdict


def hold_contradictions(nodes, localize):
    """A node the localisation proved good must not fail an all-reduce check: if one does, the decisions
    contradict each other (a defect).  Never drain a node on a contradiction: the failing checks are blocked
    (the node ``unverified``) and ``preflight.contract`` says which, so the verdict stays self-consistent and
    the defect is reported."""
    for host in localize.get("good") or []:
        node = nodes.get(host)
        if not node:
            continue
        failing = sorted(name for name, check in node["checks"].items()
                         if name.startswith(RUN_OUTCOME_CHECKS) and check["status"] == "fail")
        if not failing:
            continue
        for name in failing:
            check = node["checks"][name]
            node["checks"][name] = blocked("%s (held: %s is proven good by the localisation)" % (
                check["found"], host), check.get("expected", ""), check.get("fix", ""))
        node["checks"]["%s.contract" % RUN] = blocked(
            "%s is proven good by the localisation and yet failed %s: the decisions contradict each other, so "
            "those failures were held (not drained)" % (host, ", ".join(failing)),
            "no node both proven good and failed by the all-reduce", "a defect of the preflight: report it with "
            "this verdict file")
        node["status"] = node_status(node["checks"])


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


def atomic_write(path, text, mode=FILE_MODE):
    """``text`` (str, written as UTF-8 whatever the controller's locale, or bytes) to ``path`` through a
    temp file in the same directory: never half a file, and never visible with more than ``mode``
    (mkstemp creates it 0600, the mode is set before the rename).  An OSError names ``path``: a failed
    write or fsync (ENOSPC) names no file, and mkstemp names its temp file, which is gone by then."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.errno and exc.filename != path:
            raise OSError(exc.errno, exc.strerror, path) from exc  # OSError(errno, ...) keeps the subclass
        raise


def run_place(args):
    """``(results_dir, run_id)`` from a controller action's arguments: ``results_dir`` made absolute
    (default ``results``), ``run_id`` the one given or the time now (UTC, ``%Y%m%dT%H%M%SZ``)."""
    results_dir = os.path.abspath(str(args.get("results_dir") or "results"))
    run_id = str(args.get("run_id") or datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ"))
    return results_dir, run_id


def prepare_results_dir(results_dir):
    """Create ``results_dir`` 0750, or tighten the one that is there; returns notes for the operator.

    An existing directory is the operator's: it may be shared with a group (a team, node_exporter), so
    only the bits for others are taken away, and only when it is ours (chmod on another user's
    directory fails, and is not ours to decide).  One we cannot tighten is reported; the run
    directories inside stay 0750 either way, so only the run ids are visible to others.
    """
    parent = os.path.dirname(results_dir.rstrip(os.sep)) or os.sep
    os.makedirs(parent, exist_ok=True)
    try:
        os.mkdir(results_dir, RESULTS_DIR_MODE)
    except FileExistsError:
        pass
    else:
        os.chmod(results_dir, RESULTS_DIR_MODE)  # mkdir's mode passes through the umask
        return []
    info = os.stat(results_dir)  # a symlink to a bigger disk is fine: its target is what others see
    others = stat.S_IMODE(info.st_mode) & 0o007
    if not others:
        return []
    if info.st_uid == os.geteuid():
        os.chmod(results_dir, stat.S_IMODE(info.st_mode) & ~0o007)
        return ["%s was open to every user (mode %04o); took that away (now %04o): the runs name every node "
                "and their faults" % (results_dir, stat.S_IMODE(info.st_mode), stat.S_IMODE(info.st_mode) & ~0o007)]
    return ["%s is open to every user (mode %04o) and owned by uid %d, not by this user, so it was left as it "
            "is; each run directory in it is 0750. Fix: chmod o-rwx %s (as its owner)"
            % (results_dir, stat.S_IMODE(info.st_mode), info.st_uid, results_dir)]


# A node's name as a file name in the run directory (``<node>.log``): no directory part, no leading dot, no
# space or control character; what an inventory host name, an IPv4/IPv6 address or a DNS name needs.
NODE_FILE_NAME = re.compile(r"[A-Za-z0-9_:][A-Za-z0-9_.:-]{0,252}")
# Suffixes tried after a run id whose directory exists already (two runs ending in the same second).
UNIQUE_TRIES = 100


def node_name_problem(name):
    """Why ``name`` cannot name a node's files in the run directory, or None."""
    if isinstance(name, str) and NODE_FILE_NAME.fullmatch(name):
        return None
    return ("%r is not usable as a file name in the run directory (letters, digits, '.', '_', ':', '-'; no '/', "
            "no leading '.', at most 253 characters)" % (name,))


def node_file(run_dir, host, suffix):
    """``<run_dir>/<host><suffix>``; OSError (EINVAL) for a host name that would leave the run directory."""
    problem = node_name_problem(host)
    if problem:
        raise OSError(errno.EINVAL, "node %s" % problem, os.path.join(run_dir, "?" + suffix))
    return os.path.join(run_dir, host + suffix)


def unique_run_dir(results_dir, run_id):
    """Create this run's directory (0750) under a name no other run has: ``run_id``, else ``run_id-2``,
    ``run_id-3``, ... (two runs ending in the same second).  ``mkdir`` is the claim, so two runs never
    share one.  Returns ``(run_id, run_dir)``."""
    for index in range(1, UNIQUE_TRIES + 1):
        candidate = run_id if index == 1 else "%s-%d" % (run_id, index)
        run_dir = os.path.join(results_dir, candidate)
        if _new_run_dir(run_dir):
            return candidate, run_dir
    raise OSError(errno.EEXIST, "%d run directories named %s... exist already" % (UNIQUE_TRIES, run_id),
                  os.path.join(results_dir, run_id))


def prepare_run_dir(run_dir):
    """The run directory, 0750 whatever the umask; an existing one (the same run id again) is
    tightened too, but a symlink in its place is refused rather than written through.  Returns
    True when this call created it (so a failed write removes only what it made)."""
    if os.path.islink(run_dir):
        raise OSError(errno.EEXIST, "%s is a symlink (to %s), not a run directory; remove it or choose "
                      "another run_id" % (run_dir, os.readlink(run_dir)))
    if _new_run_dir(run_dir):
        return True
    os.chmod(run_dir, RUN_DIR_MODE)
    return False


def _new_run_dir(run_dir):
    """Create ``run_dir`` 0750 whatever the umask; False when it exists already (nothing changed then)."""
    try:
        os.mkdir(run_dir, RUN_DIR_MODE)
    except FileExistsError:
        return False
    try:
        os.chmod(run_dir, RUN_DIR_MODE)  # mkdir's mode passes through the umask
    except BaseException:
        os.rmdir(run_dir)
        raise
    return True


def write_run_dir(verdict, logs_by_host, results_dir, run_dir, filename=VERDICT_FILE, reports=None, unique=False):
    """Node logs and stacks first, then ``reports(verdict, run_dir)`` (the files other tools read:
    JUnit, Prometheus, host lists), the verdict file last, then ``latest`` moves to this run (only
    for the gate's verdict: ``latest`` is what a scheduler reads), so whoever follows ``latest``
    finds every file.

    ``unique``: the run directory is this run's alone (:func:`unique_run_dir`): when ``run_dir`` exists, the
    run takes the next free name, and the verdict's ``run_id`` and ``run_dir`` say so.

    All or nothing: when a write fails (a full disk, a read-only or foreign directory) the run
    directory is removed if this call created it (the same run id again keeps its directory), a
    results directory it created is removed when empty, ``latest`` stays where it was, and the
    OSError goes up naming the file it was writing.  Once the verdict is written the run stays: a
    ``latest`` that cannot be moved to it is a note, never a reason to remove it.

    Logs and stacks are written :func:`printable` (a job's output may carry terminal escape sequences).
    The run directory is 0750 and every file in it 0640 (the results directory 0750 when created
    here; see :func:`prepare_results_dir`).  Returns notes for the operator (a results directory
    other users can read, a ``latest`` left where it was)."""
    new_results = not os.path.lexists(results_dir)
    created = False
    tmp_link = os.path.join(results_dir, ".latest-%d" % os.getpid())
    try:
        notes = prepare_results_dir(results_dir)
        if unique:
            run_id, run_dir = unique_run_dir(results_dir, os.path.basename(run_dir))
            created = True
            verdict.update(run_id=run_id, run_dir=run_dir)
        else:
            created = prepare_run_dir(run_dir)
        _write_logs(run_dir, logs_by_host)
        if reports is not None:
            reports(verdict, run_dir)
        atomic_write(os.path.join(run_dir, filename), indented(verdict, end="\n"))
    except BaseException:
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)
        if new_results:
            try:
                os.rmdir(results_dir)  # only when empty: nothing of anyone else's goes
            except OSError:
                pass
        raise
    if filename != VERDICT_FILE or (verdict.get("hosts") and verdict.get("busy_hosts") == verdict["hosts"]):
        # Not the gate's verdict, or one that checked nothing (every node held by another run): the last
        # verdict that says something about the nodes stays the one a scheduler reads.
        return notes
    latest = os.path.join(results_dir, "latest")
    try:
        if os.path.lexists(tmp_link):
            os.unlink(tmp_link)
        os.symlink(os.path.relpath(run_dir, results_dir), tmp_link)
        os.replace(tmp_link, latest)
    except OSError as exc:
        if os.path.lexists(tmp_link):
            os.unlink(tmp_link)
        notes.append("%s was not moved to this run (%s): it still shows %s. This run is complete in %s. Fix: "
                     "remove or rename %s (it should be a link this project moves), then read the run there"
                     % (latest, exc.strerror or exc, _shows(latest), run_dir, latest))
    return notes


def _shows(latest):
    try:
        return "the run %s" % os.readlink(latest) if os.path.islink(latest) else "what was there before"
    except OSError:
        return "what was there before"


def _write_logs(run_dir, logs_by_host):
    """Each node's log, torchrun's per-rank files and the hung ranks' stacks, as printable text."""
    for host, logs in sorted((logs_by_host or {}).items()):
        if logs.get("log") is not None:
            atomic_write(node_file(run_dir, host, ".log"), printable(logs.get("log") or "", lines=True))
        for entry in logs.get("rank_logs") or []:
            # torchrun's own per-rank files (rank1.stderr.log); the name is the module's, never a path.
            name = os.path.basename(str(entry.get("name") or ""))
            if name and not name.startswith("."):
                atomic_write(node_file(run_dir, host, "." + name), printable(entry.get("text") or "", lines=True))
        stacks = ["== rank %s (pid %s, %s) at stage %s ==\n%s" % (
            entry["rank"], entry.get("pid"), entry.get("process_state"), entry.get("stage"), entry["stack"])
            for entry in logs.get("ranks") or [] if entry.get("stack")]
        if stacks:
            atomic_write(node_file(run_dir, host, ".stacks.txt"), printable("\n".join(stacks), lines=True))
