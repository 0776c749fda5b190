# -*- coding: utf-8 -*-
"""The run's last step, made once on the controller (the task ``preflight_verdict``; its documentation lives in
``library/preflight_verdict.py``): every targeted node accounted for from what the stages registered
(``cluster_preflight/verdict/accounting.py``), the run directory written with the verdict file and what other tools
read (``formats.py``), then the run history and ``report.html`` (``report.py``).  :func:`finish` returns the task's
result: failed unless the verdict is ``pass`` (or ``fail`` is false), its message the findings.
"""

from __future__ import annotations

import errno
import getpass
import os
import time

from cluster_preflight import capabilities
from cluster_preflight.plays import stage_results
from cluster_preflight.stages.bounds import run_bound
from cluster_preflight.stages.view import ClusterView, without_gc
from cluster_preflight.outputs.formats import launch_names, write_outputs
from cluster_preflight.verdict.printable import printable_verdict
from cluster_preflight.outputs.report import after_verdict
from cluster_preflight.outputs.summary import cause_records
from cluster_preflight.verdict.accounting import build_verdict, failure_lines, run_place, summary_line, write_run_dir

KINDS = {
    # kind: (decisions in order, node stages, capabilities that apply, verdict file)
    "preflight": ((stage_results.INPUTS, stage_results.PLAN, stage_results.LAUNCH, stage_results.LOCALIZE,
                   stage_results.FINAL),
                  ("settings", "facts", "port_mesh", "port_mesh_wait", "single", "launch", "probes", "confirm"),
                  capabilities.NAMES, "verdict.json"),
    "bringup": ((stage_results.INPUTS, stage_results.FINAL), ("settings", "facts", "apply"),
                capabilities.BRINGUP_NAMES, "bringup.json"),
    "healthcheck": ((stage_results.INPUTS, stage_results.LOCAL), ("settings", "facts"), capabilities.LOCAL_NAMES,
                    "healthcheck.json"),
}
def _nearest_existing(path):
    while path and not os.path.exists(path):
        path = os.path.dirname(path.rstrip(os.sep)) or os.sep
    return path or os.sep


def _mount_point(path):
    path = os.path.realpath(_nearest_existing(path))
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def write_problem(exc, results_dir, run_dir):
    """``{found, expected, fix}`` for a run directory that could not be written.  ``write_run_dir`` left
    nothing of this run behind (and ``latest`` where it was), so no file of this run is named as if it
    were there: only the file it failed on, and the directory to fix."""
    where = exc.filename if isinstance(exc.filename, str) else results_dir
    directory = _nearest_existing(where if os.path.isdir(where) else os.path.dirname(where))
    try:
        user = "%s (uid %d)" % (getpass.getuser(), os.geteuid())
    except (KeyError, OSError):  # a uid without a passwd entry (a container)
        user = "uid %d" % os.geteuid()
    kept = ("%s was there before (the same run_id again) and was kept: it may mix files of both runs, use a new "
            "run_id" % run_dir if os.path.isdir(run_dir) else "nothing of this run was kept")
    if exc.errno == errno.ENOSPC:
        try:
            space = os.statvfs(directory)
            free = " (%d MiB free)" % (space.f_bavail * space.f_frsize // 2**20)
        except OSError:
            free = ""
        found = "no space left on the device holding %s%s while writing %s" % (directory, free, where)
        expected = "room for this run's logs and verdict under %s" % results_dir
        fix = ("free space on the file system mounted at %s (df -h %s), or set preflight_results_dir to a "
               "directory elsewhere, then re-run" % (_mount_point(directory), directory))
    elif exc.errno == errno.EDQUOT:
        found = "the disk quota of %s is used up on the device holding %s while writing %s" % (user, directory, where)
        expected = "room within %s's quota under %s" % (user, results_dir)
        fix = ("free space within the quota (quota -s), or set preflight_results_dir to a directory elsewhere, "
               "then re-run")
    elif exc.errno == errno.EROFS:
        found = "%s is on a read-only file system (mounted at %s)" % (directory, _mount_point(directory))
        expected = "a results directory on a writable file system"
        fix = ("set preflight_results_dir to a directory on a writable file system (or remount %s read-write), "
               "then re-run" % _mount_point(directory))
    elif exc.errno in (errno.EACCES, errno.EPERM):
        found = "%s may not write %s: %s" % (user, where, exc.strerror or "permission denied")
        expected = "a results directory %s can create files in" % user
        fix = ("make %s writable by %s (chown or chmod it), or set preflight_results_dir to a directory that is, "
               "then re-run" % (directory, user))
    else:
        found = "%s could not be written: %s" % (where, exc.strerror or exc)
        expected = "a run directory the controller's user %s can create in %s" % (user, results_dir)
        fix = "fix what the error names, or set preflight_results_dir to another directory, then re-run"
    return {"found": "the run directory %s could not be written on the controller: %s; %s, and %s was not moved"
                     % (run_dir, found, kept, os.path.join(results_dir, "latest")),
            "expected": expected, "fix": fix}


def run_annotations(view, first, task_vars, kind, check_mode):
    """What a verdict says of the run besides its nodes: its cluster (``preflight_cluster``, else the inventory's
    absolute paths), how its host lists name the nodes, and, for a bring-up, whether it was a dry run."""
    run = ((view.settings.get(first) or {}).get(capabilities.RUN_ROLE) or {}) if first else {}
    sources = [os.path.realpath(str(source)) for source in task_vars.get("ansible_inventory_sources") or []
               if "," not in str(source)]
    notes = {"cluster": {"name": str(run.get("preflight_cluster") or ""), "inventory": sources}}
    if kind == "bringup":
        notes["check_mode"] = bool(check_mode)
    notes["hostfile_mode"] = run.get("preflight_hostfile_names") or "auto"
    return notes


def finish(task_vars: dict, args: dict, check_mode: bool = False) -> dict:
    """The verdict task's result for a run of ``args["kind"]`` (``preflight``, ``bringup``, ``healthcheck``) over what
    the play registered (``task_vars``), its files written under ``args`` ``results_dir``/``run_id``; ``check_mode``:
    a bring-up run with ``--check``."""
    result = {}
    kind = args.get("kind") or "preflight"
    if kind not in KINDS:
        result.update(failed=True, msg="kind %r is not one of %s" % (kind, ", ".join(KINDS)))
        return result
    with without_gc():
        return _finish(result, args, task_vars, check_mode)


def _finish(result, args, task_vars, check_mode):
    kind = args.get("kind") or "preflight"
    decision_names, stages, applying, filename = KINDS[kind]
    view = ClusterView(task_vars or {})
    first = view.hosts[0] if view.hosts else None
    # Read in place: the verdict is made from them (printable_verdict copies their data), they stay as registered.
    decisions = [view.read(first, name) or {} for name in decision_names] if first else []
    loaded = (view.result(first, stage_results.SETTINGS) or {}).get("capabilities") if first else None
    if loaded:
        # Only what this run loaded applies (bring-up of a chosen few capabilities).
        applying = tuple(name for name in applying if name in loaded)
    # Read, never kept: the verdict is made of what the accounting writes from them.
    register_of = stage_results.STAGE_REGISTERS
    records = {host: {register_of[stage]: view.registered(host, register_of[stage]) for stage in stages}
               for host in view.hosts}
    results_dir, run_id = run_place(args)
    if not run_id or run_id == "latest" or "/" in run_id or run_id.startswith("."):
        # A directory of its own inside results_dir (under its modes), not latest nor a temporary.
        result.update(failed=True, msg="Found run_id %r. Expected: one directory name inside %s (not latest, not "
                                       "starting with a dot). "
                                       "Fix: set run_id to a plain name such as 20260101T000000Z, or leave it "
                                       "unset." % (run_id, results_dir))
        return result
    run_dir = os.path.join(results_dir, run_id)
    by_name = dict(zip(decision_names, decisions))
    budget = None
    if kind == "healthcheck" and first:
        loaded_settings = view.result(first, stage_results.SETTINGS) or {}
        budget = {"elapsed": time.time() - float(loaded_settings.get("started") or time.time()),
                  "limit": int(loaded_settings.get("healthcheck_budget") or 30)}
    # Texts of the nodes and the job (rank errors, log lines) never carry control codes into the outputs.
    verdict = printable_verdict(build_verdict(view.hosts, records, decisions, applying, stages, run_id, run_dir,
                                           bound_seconds=run_bound(view, by_name.get(stage_results.PLAN),
                                                                       by_name.get(stage_results.LAUNCH),
                                                                       by_name.get("allreduce_localize")),
                                           gate=kind == "preflight", budget=budget))
    notes = run_annotations(view, first, task_vars or {}, kind, check_mode is True)
    verdict.update((key, value) for key, value in notes.items() if key != "hostfile_mode")
    verdict["hostfile"] = launch_names(verdict, {host: (view.nodes.get(host) or {}).get("node_addr")
                                                 for host in view.hosts}, notes["hostfile_mode"])
    # The findings grouped by cause, each cause once with its consequences counted (what the summary prints).
    verdict["causes"] = cause_records(verdict)
    logs = (by_name.get(stage_results.FINAL) or {}).get("logs") or {}
    outputs = {}
    try:
        # A run id of its own (not given): two runs ending in the same second get two directories.
        notes = write_run_dir(verdict, logs, results_dir, run_dir, filename,
                              reports=lambda data, where: outputs.update(write_outputs(data, where, kind=kind)),
                              unique=not args.get("run_id"))
    except OSError as exc:
        problem = write_problem(exc, results_dir, run_dir)
        result.update(failed=True, verdict_status=verdict["status"], **problem)
        result["msg"] = "Found: %s. Expected: %s. Fix: %s. The nodes were: %s" % (
            problem["found"], problem["expected"], problem["fix"],
            summary_line(verdict, "not written", kind.upper()))
        return result
    run_dir = verdict["run_dir"]
    path = os.path.join(run_dir, filename)
    # The run history and report.html: their problems are warnings, never the verdict's status.
    run = ((view.settings.get(first) or {}).get(capabilities.RUN_ROLE) or {}) if first else {}
    extra, later = after_verdict(verdict, kind, run_dir, path, results_dir, run.get("preflight_history_db", ""))
    outputs.update(extra)
    notes = list(notes or []) + later
    if notes:
        result["warnings"] = list(notes)
    lines = failure_lines(verdict)
    result.update(changed=False, verdict_status=verdict["status"], run_dir=run_dir, verdict_file=path, outputs=outputs,
                  healthy_hosts=verdict["healthy_hosts"], failed_hosts=verdict["failed_hosts"],
                  unverified_hosts=verdict["unverified_hosts"],
                  unreachable_hosts=verdict["unreachable_hosts"], failures=lines)
    if verdict["status"] != "pass" and args.get("fail", True):
        result["failed"] = True
        result["msg"] = "PREFLIGHT %s (%s):\n%s" % (
            {"preflight": "FAILED", "bringup": "BRING-UP FAILED", "healthcheck": "HEALTH CHECK FAILED"}[kind], path,
            "\n".join("- " + line for line in lines) or "- see %s" % path)
    else:
        label = {"preflight": "PREFLIGHT", "bringup": "BRING-UP", "healthcheck": "HEALTH CHECK"}[kind]
        if verdict.get("check_mode"):
            label += " DRY RUN (check mode, nothing was written), the nodes as they are:"
        result["msg"] = summary_line(verdict, path, label)
    if later:
        result["msg"] += "".join("\nWARNING: " + text for text in later)
    return result
