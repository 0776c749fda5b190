# -*- coding: utf-8 -*-
"""The diagnosis of a running job, written (the task ``preflight_diagnose``; its documentation lives in
``library/preflight_diagnose.py``): the ranks of every node grouped and the suspects named
(``cluster_preflight/stages/diagnosis.py``), then ``diagnose.json`` and one stacks file per node, with the
verdict's helpers (0750 directories, 0640 files, atomic).  :func:`write_diagnosis` returns the task's result.
"""

from __future__ import annotations

import json
import os

from ansible.module_utils.parsing.convert_bool import boolean

from cluster_preflight.plays import stage_results
from cluster_preflight.stages.view import ClusterView
from cluster_preflight.stages.diagnosis import diagnose, label
from cluster_preflight.verdict.printable import printable, printable_tree
from cluster_preflight.verdict.accounting import (atomic_write, node_file, node_name_problem, prepare_results_dir,
                                                  prepare_run_dir, run_place)

REPORT_FILE = "diagnose.json"


def node_results(view, register):
    """``{host: {ok, error, processes, core, py_spy}}`` from what each node's module call registered."""
    nodes = {}
    for host in view.hosts:
        state, message = view.outcome(host, register)
        result = view.result(host, register) or {}
        if state == "ok":
            nodes[host] = {"ok": True, "processes": result.get("processes") or [], "core": result.get("core"),
                           "py_spy": result.get("py_spy") or "", "hostname": result.get("hostname") or "",
                           "seconds": result.get("seconds"), "refused": result.get("refused") or []}
        else:
            nodes[host] = {"ok": False, "error": "%s: %s" % (state, message)}
    return nodes


def stacks_text(host, node):
    """One host's stacks file: every launcher and rank with who dumped it, then its py-spy text."""
    parts = []
    for entry in node.get("processes") or []:
        if entry.get("role") not in ("launcher", "rank"):
            continue
        parts.append("== %s (%s, state %s, py-spy as %s%s) ==\n%s\n%s" % (
            label(host, entry), entry.get("role"), entry.get("state"), entry.get("dump_user") or "?",
            ", native" if entry.get("dump_native") else "", entry.get("cmdline") or "",
            (entry.get("stack") or entry.get("dump_error") or "").rstrip()))
    core = node.get("core")
    if core and core.get("found"):
        parts.append("== newest core %s (%s) ==\n%s" % (core.get("path"), core.get("command") or "?",
                                                        core.get("backtrace") or core.get("error") or ""))
    return "\n\n".join(parts) + "\n"


def report_data(report, nodes, run_id):
    """diagnose.json: the grouping and suspects; the stack texts live in the per-host files."""
    def light(entry):
        return {key: value for key, value in entry.items() if key != "stack"}

    return {"run_id": run_id, "status": report["status"], "majority": report["majority"], "groups": report["groups"],
            "suspects": report["suspects"], "ranks": [light(entry) for entry in report["ranks"]],
            "launchers": [light(entry) for entry in report["launchers"]],
            "hosts": sorted(nodes), "failed_hosts": report["failed_hosts"],
            "hosts_without_ranks": report["hosts_without_ranks"],
            "cores": {host: {key: value for key, value in (node.get("core") or {}).items() if key != "backtrace"}
                      for host, node in sorted(nodes.items()) if node.get("core")},
            # Programs a node would not run as root (not root's alone): say so, with the fix.
            "refused": {host: node["refused"] for host, node in sorted(nodes.items()) if node.get("refused")},
            "lines": report["lines"]}


def write_diagnosis(task_vars: dict, args: dict) -> dict:
    """The diagnose task's result: the report of what every node registered (``args["register"]``), written under
    ``args`` ``results_dir``/``run_id``; failed when it could not be written, or when ``fail_on_suspect`` and a
    suspect was named."""
    result = {}
    view = ClusterView(task_vars or {})
    nodes = node_results(view, str(args.get("register") or stage_results.DIAGNOSE_STACKS))
    report = diagnose(nodes)
    report["lines"] = report["lines"] + [
        "%s: %s (install it with bringup.yml, role debug_tools, or name a root-owned one)" % (host, text)
        for host, node in sorted(nodes.items()) for text in node.get("refused") or []]
    # Frames and texts of the job's own processes never carry control codes to the terminal or the files.
    report = printable_tree(report)
    results_dir, run_id = run_place(args)
    if run_id == "latest" or "/" in run_id or run_id.startswith("."):
        result.update(failed=True, msg="Found run_id %r. Expected: one directory name inside %s (not latest, not "
                                       "starting with a dot). Fix: set diagnose_run_id to a plain name such as "
                                       "20260101T000000Z, or leave it empty." % (run_id, results_dir))
        return result
    run_dir = os.path.join(results_dir, run_id)
    path = os.path.join(run_dir, REPORT_FILE)
    try:
        notes = prepare_results_dir(results_dir)
        prepare_run_dir(run_dir)
        stacks_files = {}
        for host, node in sorted(nodes.items()):
            if node.get("ok") and (node.get("processes") or node.get("core")):
                # An inventory name is not a file name: one that would leave the run directory gets no file.
                problem = node_name_problem(host)
                if problem:
                    report["lines"].append("%s: its stacks were not written to a file: node %s (rename it in "
                                           "the inventory)" % (printable(host), printable(problem)))
                    continue
                stacks_files[host] = node_file(run_dir, host, ".stacks.txt")
                atomic_write(stacks_files[host], printable(stacks_text(host, node), lines=True))
        data = printable_tree(report_data(report, nodes, run_id))
        data["stacks_files"] = stacks_files
        # Last, so a report that is there is complete.
        atomic_write(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
    except OSError as exc:
        result.update(failed=True, lines=report["lines"], msg=(
            "Found: the diagnosis could not be written to %s on the controller: %s. Expected: a run directory "
            "the controller's user can create in %s. Fix: make %s writable by this user (or set "
            "diagnose_results_dir to a directory that is), then re-run. The diagnosis was:\n%s" % (
                path, exc.strerror or exc, results_dir, results_dir, "\n".join(report["lines"]))))
        return result
    if notes:
        result["warnings"] = list(notes)
    suspects = [suspect["id"] for suspect in report["suspects"]]
    result.update(changed=False, status=report["status"], suspects=suspects, majority=report["majority"],
                  lines=report["lines"] + ["report: %s" % path], report_file=path, run_dir=run_dir)
    result["msg"] = "%s; report %s" % (report["lines"][0], path)
    if suspects and boolean(args.get("fail_on_suspect", False), strict=False):
        result["failed"] = True
        result["msg"] = "DIAGNOSIS names suspects (diagnose_fail_on_suspect is on):\n%s" % "\n".join(
            "- " + line for line in report["lines"] if line.startswith(("DIAGNOSIS", "SUSPECT")))
    return result
