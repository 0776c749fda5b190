# -*- coding: utf-8 -*-
"""Callback: a node x capability matrix of the verdict at the end of every preflight playbook."""

from __future__ import annotations

DOCUMENTATION = r"""
name: preflight_summary
type: aggregate
short_description: Node x capability matrix of the preflight verdict at the end of the run
description:
  - Remembers where the C(preflight_verdict) task wrote its report (the task's C(verdict_file), for
    C(preflight.yml), C(bringup.yml) and C(healthcheck.yml) alike, whether the verdict passed or
    failed), reads that file when the playbook ends and prints one line per node with each
    capability's outcome (C(pass), C(warn), C(fail), C(n/a), C(unverified); the capability is the
    part of a check's name before the dot), the all-reduce (status, world size, backend, bus
    bandwidth at the largest size) and the run directory.
  - An aggregate callback, not a stdout one, so it prints next to any stdout callback, including
    ansible-runner's C(awx_display). ansible-runner replaces E(ANSIBLE_CALLBACK_PLUGINS); a runner
    caller passes C(ANSIBLE_CALLBACK_PLUGINS=<project>/callback_plugins) and
    C(ANSIBLE_CALLBACKS_ENABLED=preflight_summary) in C(envvars).
  - A cell holds the worst outcome of the node's checks of that capability; C(n/a) when every one
    was C(not_applicable) or C(skipped); C(-) when the node has none. A capability that is C(n/a) on every
    node (the GPU and fabric checks on CPU nodes) is named in one line under the matrix instead of a
    column, and each header is split at its first underscore, so the matrix stays about 100 columns wide.
  - Under the matrix, a gate says which known-good profile each node was compared with (or that none
    was set) and how the host lists name the nodes; a bring-up says how many tasks changed (or, in
    check mode, would change) something on each node, Ansible's own count, which it also records in
    C(bringup.json) as C(changed).
requirements:
  - enable it with C(callbacks_enabled = preflight_summary) in C(ansible.cfg) (done in this project)
"""

import os

from ansible import constants as C
from ansible.plugins.callback import CallbackBase

from ansible.utils.display import Display

from cluster_preflight.verdict.printable import guard_display, printable
from cluster_preflight.verdict.accounting import FILE_MODE, atomic_write
from cluster_preflight.stages.view import without_gc
from cluster_preflight.verdict.json_text import indented
from cluster_preflight.outputs.summary import allreduce_line, notes
from cluster_preflight.verdict.file import VerdictError, load

VERDICT_ACTION = "preflight_verdict"
PLAYBOOKS = ("preflight.yml", "bringup.yml", "healthcheck.yml")
# The report file names the verdict action writes, and what the run was.
LABELS = {"verdict.json": "PREFLIGHT", "bringup.json": "BRING-UP", "healthcheck.json": "HEALTH CHECK"}
BRINGUP_FILE = "bringup.json"
# A node's row is coloured by its status, so a failed node stands out in a wide matrix.
COLORS = {"pass": C.COLOR_OK, "warn": C.COLOR_CHANGED, "unverified": C.COLOR_SKIP, "fail": C.COLOR_ERROR}
NOT_APPLICABLE = "n/a"
NONE = "-"


def capability_cell(checks):
    """The worst outcome among one capability's checks on one node, as the matrix shows it."""
    if not checks:
        return NONE
    statuses = [check.get("status") for check in checks]
    if "fail" in statuses or any(status not in ("pass", "not_applicable", "skipped", "warn") for status in statuses):
        return "fail"
    if any((check.get("details") or {}).get("blocked") for check in checks):
        return "unverified"
    if "warn" in statuses:
        return "warn"
    if "pass" in statuses:
        return "pass"
    return NOT_APPLICABLE


def capabilities(verdict):
    """Every capability with a check on some node: the run's own (``preflight``) first, then by name."""
    names = {name.split(".", 1)[0] for host in verdict["hosts"] for name in verdict["nodes"][host]["checks"]}
    return sorted(names, key=lambda name: (name != "preflight", name))


def _cells(verdict, columns):
    """``{host: [cell, ...]}`` in the order of ``columns``."""
    out = {}
    for host in verdict["hosts"]:
        by_capability = {}
        for name, check in verdict["nodes"][host]["checks"].items():
            by_capability.setdefault(name.split(".", 1)[0], []).append(check)
        out[host] = [capability_cell(by_capability.get(name)) for name in columns]
    return out


def _header(name):
    """A column's header on two lines, split at its first underscore (``core`` over ``dumps``), so a column is as
    wide as its longer word, not its whole name."""
    top, _sep, bottom = name.partition("_")
    return (top, bottom) if bottom else ("", name)


def matrix(verdict):
    """``[(header line, None), ...] + [(row, node status)]``: one row per node, one column per capability that
    applies somewhere; a column is as wide as its header's longer word or its widest cell (about 100 characters
    for every capability).  ``not_applicable(verdict)`` names the columns left out (n/a on every node)."""
    every = capabilities(verdict)
    cells = _cells(verdict, every)
    keep = [index for index, _name in enumerate(every)
            if any(cells[host][index] not in (NOT_APPLICABLE, NONE) for host in verdict["hosts"])]
    columns = [every[index] for index in keep]
    headers = [_header(name) for name in columns]
    widths = [max([len(top), len(bottom)] + [len(cells[host][index]) for host in verdict["hosts"]])
              for (top, bottom), index in zip(headers, keep)]
    width = max([len("node")] + [len(host) for host in verdict["hosts"]])
    status_width = max([len("status")] + [len(verdict["nodes"][host]["status"]) for host in verdict["hosts"]])
    rows = []
    if any(top for top, _bottom in headers):
        rows.append(("  ".join([" " * width, " " * status_width] + [top.ljust(w) for (top, _b), w in
                                                                    zip(headers, widths)]).rstrip(), None))
    rows.append(("  ".join(["node".ljust(width), "status".ljust(status_width)] +
                           [bottom.ljust(w) for (_t, bottom), w in zip(headers, widths)]).rstrip(), None))
    for host in verdict["hosts"]:
        node = verdict["nodes"][host]
        row = [cells[host][index].ljust(w) for index, w in zip(keep, widths)]
        rows.append(("  ".join([host.ljust(width), node["status"].ljust(status_width)] + row).rstrip(),
                     node["status"]))
    return rows


def not_applicable(verdict):
    """The capabilities the matrix leaves out: not applicable (or without a check) on every node."""
    every = capabilities(verdict)
    cells = _cells(verdict, every)
    return [name for index, name in enumerate(every)
            if all(cells[host][index] in (NOT_APPLICABLE, NONE) for host in verdict["hosts"])
            and any(cells[host][index] == NOT_APPLICABLE for host in verdict["hosts"])]


def summary_lines(verdict, path):
    """``[(text, colour or None)]``: the title, the matrix, the all-reduce and where the run is."""
    label = LABELS.get(os.path.basename(path), "PREFLIGHT")
    title = "%s SUMMARY: %s%s, %d/%d nodes healthy" % (
        label, "DRY RUN (check mode, nothing was written), the nodes as they are: " if verdict.get("check_mode") else "",
        verdict["status"].upper(), len(verdict["healthy_hosts"]), len(verdict["hosts"]))
    lines = [(title, C.COLOR_OK if verdict["status"] == "pass" else C.COLOR_ERROR)]
    lines += [(text, COLORS.get(status)) for text, status in matrix(verdict)]
    left_out = not_applicable(verdict)
    if left_out:
        lines.append(("not applicable on any node (not shown): %s" % ", ".join(left_out), None))
    lines.append((allreduce_line(verdict), None))
    lines += [(text, None) for text in notes(verdict)]
    lines.append(("run directory: %s" % (verdict.get("run_dir") or os.path.dirname(path)), None))
    lines.append(("verdict: %s" % path, None))
    # Node names and texts come from the verdict file: no control codes reach the terminal from it.
    return [(printable(text), color) for text, color in lines]


def record_changes(path, verdict, changed):
    """A bring-up's report gets each node's count of changed tasks (Ansible's stats, known only once the play
    ended), written over it atomically with its mode; the verdict with it."""
    verdict = dict(verdict, changed={host: int(changed.get(host) or 0) for host in verdict["hosts"]})
    atomic_write(path, indented(verdict, end="\n"), FILE_MODE)
    return verdict


class CallbackModule(CallbackBase):
    """See DOCUMENTATION."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "preflight_summary"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, display=None):
        super().__init__(display=display)
        # A node's words reach Ansible's own display lines as the node wrote them: no escape sequence of theirs
        # reaches the operator's terminal (cluster_preflight/printable.py).
        guard_display(Display)
        self.verdict_files = []
        self.playbook = None

    def v2_playbook_on_start(self, playbook):
        self.playbook = os.path.basename(getattr(playbook, "_file_name", "") or "")

    def _remember(self, result):
        # The action's own name or a collection-qualified one (ansible.legacy.preflight_verdict).
        if result._task.action.rsplit(".", 1)[-1] != VERDICT_ACTION:
            return
        path = result._result.get("verdict_file")
        if path and path not in self.verdict_files:
            self.verdict_files.append(path)

    def v2_runner_on_ok(self, result):
        self._remember(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        # A verdict that is not pass fails its task: that is when the matrix matters most.
        self._remember(result)

    def v2_playbook_on_stats(self, stats):
        if not self.verdict_files:
            if self.playbook in PLAYBOOKS:
                self._display.display("PREFLIGHT SUMMARY: no verdict was written (the run stopped before its "
                                      "verdict task; see the errors above)", color=C.COLOR_ERROR)
            return
        for path in self.verdict_files:
            self._display.display("")
            try:
                # A large cluster's verdict is a big, short-lived heap (as in the decisions).
                with without_gc():
                    verdict = load(path)
                    if os.path.basename(path) == BRINGUP_FILE:
                        verdict = record_changes(path, verdict, getattr(stats, "changed", {}) or {})
                    lines = summary_lines(verdict, path)
            except (VerdictError, OSError) as exc:
                self._display.display("PREFLIGHT SUMMARY: %s" % printable(exc), color=C.COLOR_ERROR)
                continue
            for text, color in lines:
                self._display.display(text, color=color)
