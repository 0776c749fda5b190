# -*- coding: utf-8 -*-
"""``python -m cluster_preflight history``: what the run history says, per node, for one cluster.

Controller layer only.  Reads the database :mod:`cluster_preflight.outputs.history` writes (read-only) and prints,
per node, its timeline (each run's status with its first finding), the flaky nodes, the bus bandwidth trend
per node and per pair, and the last run that passed; ``--json`` prints the same as one JSON object.  Only the
runs of one cluster (``-i``, ``--cluster``; by default the newest run's) and of the real kinds (a dry-run
bring-up only with ``--kind bringup-check``), unless asked otherwise.
"""

from __future__ import annotations

import json
import os

from cluster_preflight.outputs import history

# Exit codes of this command (the verdict's meanings do not apply: it judges no node).
EXIT_OK = 0
EXIT_NO_HISTORY = 3
EXIT_USAGE = 4


def add_parser(commands, root):
    """The ``history`` subcommand on ``commands`` (an argparse subparsers object)."""
    sub = commands.add_parser("history", help="what the run history says: timelines, flaky nodes, busbw trends",
                              description="Per node its runs (with the first finding), the flaky nodes, the bus "
                                          "bandwidth trend per node and pair, the last run that passed. Exit 0, "
                                          "3 when there is no history to read, 4 on bad arguments.",
                              allow_abbrev=False)
    sub.add_argument("--db", default=os.path.join(root, "results", history.DB_FILE),
                     help="the history database (default results/history.sqlite; preflight_history_db moves it)")
    which = sub.add_mutually_exclusive_group()
    which.add_argument("-i", "--inventory", metavar="INVENTORY",
                       help="the cluster this inventory describes (its preflight_cluster, else its path)")
    which.add_argument("--cluster", metavar="NAME", help="the cluster of this name (preflight_cluster) or inventory path")
    which.add_argument("--all-clusters", action="store_true", help="every cluster's runs together")
    sub.add_argument("--kind", action="append", choices=history.ALL_KINDS, metavar="KIND",
                     help="only runs of this kind (repeatable: %s; default: every kind but %s)" % (
                         ", ".join(history.ALL_KINDS), history.CHECK_KIND))
    sub.add_argument("--node", help="only this node")
    sub.add_argument("--since", help="only runs finished since then: an ISO date or time, or an age (24h, 7d)")
    sub.add_argument("--limit", type=int, default=10, help="runs per node in the timeline (default 10)")
    sub.add_argument("--window", type=int, default=10, help="runs per node the flaky count looks at (default 10)")
    sub.add_argument("--json", action="store_true", help="one JSON object instead of text")
    return sub


def collect(db, node=None, since=None, limit=10, window=10, cluster=None, kinds=None):
    """Everything the command shows, as plain data (HistoryError when the database cannot be read), of
    ``cluster`` (None: every cluster) and ``kinds`` (None: the real kinds)."""
    scope = {"cluster": cluster, "kinds": kinds}
    rows = history.timeline(db, node=node, since=since, limit=limit, **scope)
    timelines = {}
    for row in rows:
        timelines.setdefault(row["node"], []).append(
            {key: row[key] for key in ("run_id", "kind", "finished", "status", "summary")})
    nodes = sorted(timelines) if node is None else [node]
    flaky = [item for item in history.flaky(db, window=window, **scope) if node is None or item["node"] == node]
    trends, where = {}, scope
    for scope in ("node", "pair"):
        for subject in history.subjects(db, scope, **where):
            if node is not None and node not in subject.split("+"):
                continue
            points = [point for point in history.busbw_trend(db, subject, scope=scope, **where)
                      if since is None or point["finished"] >= since]
            if points:
                trends.setdefault(scope, {})[subject] = [
                    {key: point[key] for key in ("run_id", "finished", "size_bytes", "busbw_gbps")} for point in points]
    return {"db": db, "since": since, "cluster": cluster, "kinds": list(kinds or history.REAL_KINDS),
            "timelines": timelines, "flaky": flaky, "busbw": trends,
            "last_pass": {name: history.last_pass(db, name, **where) for name in nodes},
            "last_run_pass": history.last_pass(db, **where)}


def text_lines(data):
    """The command's text output."""
    lines = ["History %s%s" % (data["db"], " since %s" % data["since"] if data["since"] else "")]
    lines.append("Cluster: %s; runs: %s" % (data.get("scope") or data.get("cluster") or "every cluster",
                                            ", ".join(data.get("kinds") or history.REAL_KINDS)))
    last = data["last_run_pass"]
    lines.append("Last run that passed: %s" % ("%s %s (%s)" % (last["kind"], last["run_id"], last["finished"])
                                               if last else "none"))
    lines.append("")
    lines.append("Timelines (newest first):")
    if not data["timelines"]:
        lines.append("  no run recorded%s" % (" since then" if data["since"] else ""))
    for node, runs in sorted(data["timelines"].items()):
        good = data["last_pass"].get(node)
        lines.append("  %s (last pass: %s)" % (node, good["run_id"] if good else "never"))
        for run in runs:
            lines.append("    %s %-11s %-10s %s" % (run["finished"], run["kind"], run["status"], run["summary"]))
    lines.append("")
    lines.append("Flaky nodes:")
    lines += ["  " + item["text"] for item in data["flaky"]] or ["  none"]
    for scope, title in (("node", "per node"), ("pair", "per pair")):
        trends = data["busbw"].get(scope) or {}
        if not trends:
            continue
        lines.append("")
        lines.append("Bus bandwidth %s (GB/s, oldest first):" % title)
        for subject, points in sorted(trends.items()):
            lines.append("  %s: %s" % (subject, " ".join("%.3f" % point["busbw_gbps"] for point in points)))
    return lines


def which_cluster(args, db):
    """``(cluster key or None, how it was chosen)`` for ``args``: ``-i``, ``--cluster``, ``--all-clusters``, else the
    cluster of the newest run in ``db``."""
    if args.all_clusters:
        return None, "every cluster (--all-clusters)"
    if args.cluster:
        return args.cluster, args.cluster
    if args.inventory:
        from cluster_preflight.outputs.cluster_names import inventory_key  # pylint: disable=import-outside-toplevel

        key = inventory_key(args.inventory)
        return key, "%s (of -i %s)" % (key, args.inventory)
    key = history.latest_cluster(db)
    if key is None:
        return None, "every cluster (the newest run names none)"
    return key, ("%s (the newest run's; -i INVENTORY or --cluster NAME for another, --all-clusters for every one)"
                 % key)


def run(args, out):
    """The ``history`` command: ``out(text, stream=None)`` prints; returns the exit code."""
    try:
        since = history.parse_since(args.since) if args.since else None
    except ValueError as exc:
        out("history: %s" % exc, "stderr")
        return EXIT_USAGE
    db = os.path.abspath(args.db)
    try:
        cluster, scope = which_cluster(args, db)
        data = collect(db, node=args.node, since=since, limit=args.limit, window=args.window, cluster=cluster,
                       kinds=args.kind)
        data["scope"] = scope
    except history.HistoryError as exc:
        out("UNKNOWN: %s" % exc, "stderr")
        return EXIT_NO_HISTORY
    if args.json:
        out(json.dumps(data, indent=2, sort_keys=True))
    else:
        for line in text_lines(data):
            out(line)
    return EXIT_OK
