# -*- coding: utf-8 -*-
"""``report.html``: one self-contained page of a run, written next to its verdict file.

Controller layer only (Jinja2, never shipped).  The page holds the node x capability matrix (failed
nodes first), every finding with found / expected / fix, the bus bandwidth per node and per pair as SVG
bars with their names and values written next to them, the localisation rounds when they ran, and each node's recent
runs from the history database as a
sparkline.  Inline CSS, inline SVG and a few lines of inline script (the filter box): no network, no file
beside it.  Everything taken from the verdict is escaped (``autoescape``): a node name is data, never markup.
"""

from __future__ import annotations

import os

import jinja2

from cluster_preflight.verdict.accounting import atomic_write
from cluster_preflight.outputs.history import (KINDS, HistoryError, busbw_rows, cluster_key, db_path, recent_statuses,
                                               record)
from cluster_preflight.outputs.formats import MODE
from cluster_preflight.verdict.value import findings_of

REPORT_FILE = "report.html"
TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
# Worst first: a node's cell for a capability takes the worst status of that capability's checks.
SEVERITY = ("fail", "unverified", "warn", "pass", "skipped", "not_applicable")
NODE_ORDER = {"fail": 0, "unverified": 1, "warn": 2, "pass": 3}
SPARK_RUNS = 10
# Horizontal bar charts: a row per node (denser above DENSE_ROWS nodes), the label column at most LABEL_MAX
# pixels wide, the longest bar BAR_LENGTH pixels, room for its value after it.
ROW_HEIGHT = 18
DENSE_ROWS = 200
DENSE_ROW_HEIGHT = 13
# Pixels per character of a label at the chart's font size (generous: a label is never cut).
CHAR_WIDTH = 8
LABEL_MAX = 260
BAR_LENGTH = 420
VALUE_WIDTH = 110

_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, trim_blocks=True,
                          lstrip_blocks=True)


def cell_status(checks):
    """The worst status of ``checks`` (a blocked check counts as ``unverified``)."""
    states = []
    for check in checks:
        status = check.get("status")
        if status != "fail" and (check.get("details") or {}).get("blocked"):
            status = "unverified"
        states.append(status if status in SEVERITY else "fail")
    return min(states, key=SEVERITY.index) if states else None


def matrix(verdict):
    """``(capabilities, rows)``: the capability names (check name prefixes) and one row per node, failed nodes
    first then unverified, warn, pass (the verdict's order within each): ``{node, status, cells}``, each cell
    ``{capability, status}`` (``None`` where no check of that capability ran on the node)."""
    capabilities = sorted({name.split(".", 1)[0] for host in verdict["hosts"]
                           for name in verdict["nodes"][host]["checks"]})
    rows = []
    for host in verdict["hosts"]:
        node = verdict["nodes"][host]
        grouped = {}
        for name, check in node["checks"].items():
            grouped.setdefault(name.split(".", 1)[0], []).append(check)
        rows.append({"node": host, "status": node["status"],
                     "cells": [{"capability": cap, "status": cell_status(grouped.get(cap, []))}
                               for cap in capabilities]})
    order = {host: index for index, host in enumerate(verdict["hosts"])}
    rows.sort(key=lambda row: (NODE_ORDER.get(row["status"], 0), order[row["node"]]))
    return capabilities, rows


def value_text(value):
    """A bar's visible value: GB/s with three significant decimals, or that it was not measured."""
    return "not measured" if value is None else "%.3f GB/s" % value


def bars(values, row=None):
    """``{width, height, bars, top}`` of a horizontal bar chart of ``[(label, value)]``, one row each: the label
    on the left, the bar scaled to the largest value, its value written after it (``None``: not measured, no bar),
    so that names and values are on the page itself, in a screenshot or on paper, not only in tooltips.  Each bar:
    ``{label, value, text, y, length, label_x, bar_x, text_x, text_y, h}``."""
    top = max([value for _label, value in values if value is not None] or [0]) or 1.0
    row = row or (ROW_HEIGHT if len(values) <= DENSE_ROWS else DENSE_ROW_HEIGHT)
    label_width = min(max([len(str(label)) for label, _value in values] or [1]) * CHAR_WIDTH + 8, LABEL_MAX)
    out = []
    for index, (label, value) in enumerate(values):
        length = 0 if value is None else round(BAR_LENGTH * value / top, 1)
        y = index * row
        out.append({"label": label, "value": value, "text": value_text(value), "y": y, "h": row - 2,
                    "length": length, "label_x": label_width - 6, "bar_x": label_width,
                    "text_x": label_width + length + 4, "text_y": y + row - 4})
    width = label_width + BAR_LENGTH + VALUE_WIDTH
    return {"width": width, "height": max(len(values) * row, 1), "bars": out, "top": top,
            "font": min(12, row - 5)}


def bandwidth(verdict):
    """``(per node, per pair)`` charts: each node's slowest rank at the largest size of the all-node run (its
    loopback launch when it had no rank), each localisation pair's busbw."""
    sized, loopback, pairs = {}, {}, {}
    for scope, subject, size, value in busbw_rows(verdict):
        if scope == "node" and size is not None:
            best = sized.get(subject)
            if best is None or size > best[0]:
                sized[subject] = (size, value)
            elif size == best[0]:
                sized[subject] = (size, min(best[1], value))
        elif scope == "node":
            loopback[subject] = min(loopback.get(subject, value), value)
        elif scope == "pair":
            pairs[subject] = min(pairs.get(subject, value), value)
    by_node = dict(loopback)
    by_node.update((host, value) for host, (_size, value) in sized.items())
    # One bar per node (an unmeasured node's is empty and says so), or no chart when no node was measured.
    nodes = [(host, by_node.get(host)) for host in verdict["hosts"]] if by_node else []
    return bars(nodes), bars(sorted(pairs.items()))


def sparkline(statuses):
    """``[{x, status}]`` cells of a node's recent runs, oldest on the left."""
    return [{"x": index * 7, "status": status} for index, status in enumerate(statuses[-SPARK_RUNS:])]


def render(verdict, history=None, kind="gate"):
    """The page as text.  ``history``: ``{node: [status, ...]}`` oldest first (see
    :func:`cluster_preflight.outputs.history.recent_statuses`), or None when there is no database."""
    capabilities, rows = matrix(verdict)
    node_chart, pair_chart = bandwidth(verdict)
    findings = sorted(findings_of(verdict), key=lambda item: (
        {"fail": 0, "unverified": 1, "warn": 2}.get(item.status, 3), item.host, item.check))
    localize = verdict.get("localize") or {}
    return _ENV.get_template("report.html.j2").render(
        verdict=verdict, kind=kind, capabilities=capabilities, rows=rows, findings=findings,
        node_chart=node_chart, pair_chart=pair_chart, localize=localize,
        sparks={node: sparkline(statuses) for node, statuses in (history or {}).items()},
        counts={status: sum(1 for row in rows if row["status"] == status) for status in NODE_ORDER})


def write_report(verdict, run_dir, db_path=None, kind="gate"):
    """Write ``report.html`` into ``run_dir`` (0640, atomically) and return its path.  The sparklines come from
    ``db_path`` when it can be read, from the runs of this verdict's cluster that were no dry run; without it the
    page has none.  An OSError goes up naming the file."""
    history = None
    if db_path:
        try:
            history = recent_statuses(db_path, verdict["hosts"], limit=SPARK_RUNS,
                                      cluster=cluster_key(verdict.get("cluster")))
        except HistoryError:
            history = None
    path = os.path.abspath(os.path.join(run_dir, REPORT_FILE))
    atomic_write(path, render(verdict, history, kind), MODE)
    return path


def after_verdict(verdict, kind, run_dir, verdict_path, results_dir, history_setting="", started=None):
    """What follows a written verdict file: record it in the run history (``preflight_history_db``: empty for
    ``<results_dir>/history.sqlite``, "none" for no history), then write ``report.html`` next to it.

    Returns ``(outputs, warnings)``: ``{"report.html": path}`` when written, and the texts for the operator (a
    database that could not take the run, a page that could not be written).  Never raises and never changes
    the verdict: a run's status is its nodes', not its reports'."""
    warnings = []
    path = db_path(history_setting, results_dir)
    recorded = record(path, verdict, kind, verdict_path, started=started)
    if recorded["warning"]:
        warnings.append(recorded["warning"])
    try:
        report = write_report(verdict, run_dir, path if recorded["recorded"] else None, KINDS.get(kind, kind))
    except Exception as exc:  # pylint: disable=broad-except  # the verdict stands whatever the page does
        warnings.append("report.html not written. Found: %s. Expected: a page next to %s. Fix: fix what the error "
                        "names (space, permissions on %s); the verdict is unchanged." % (exc, verdict_path, run_dir))
        return {}, warnings
    return {REPORT_FILE: report}, warnings
