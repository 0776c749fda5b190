# -*- coding: utf-8 -*-
"""Diagnose a training job that runs or hangs now, the controller half: where is every rank stuck, and
which one is odd.

Each node's result comes from ``library/diagnose_stacks.py`` (the node half,
``module_utils/preflight_node/diagnose.py``: processes, stacks, the newest core).  Here, for
``cluster_preflight/outputs/diagnosis_report.py`` (the task ``preflight_diagnose``): :func:`diagnose` groups the ranks of every node by the
innermost frame of their main thread and names the suspects: a rank stopped (state T), in
uninterruptible sleep (D) or exited (Z), a rank whose stack could not be taken, a rank stuck somewhere
else than the majority, a node that did not answer; :func:`summary_lines` is what the operator reads.

Pure functions of the nodes' results so tables test them.
"""

from __future__ import annotations

from collections import Counter

from preflight_node.diagnose import SUSPECT_STATES


def label(host, entry):
    text = "%s:%s" % (host, entry.get("pid"))
    if entry.get("rank") is not None:
        text += " rank %s" % entry["rank"]
    elif entry.get("local_rank") is not None:
        text += " local rank %s" % entry["local_rank"]
    return text


def diagnose(nodes):
    """Group every rank of every node by where it is stuck and name the suspects.

    ``nodes``: ``{host: {"ok": bool, "error": why not (when not ok), "processes": [...]}}`` (the
    ``processes`` of :func:`read`).  Returns ``{status, ranks, launchers, groups, majority, suspects,
    hosts_without_ranks, failed_hosts, lines}``; ``status`` is ``suspect`` (someone is named),
    ``no_suspect`` (every rank in the same place, or no majority to tell the odd one), or
    ``no_ranks`` (no training process found on any node)."""
    ranks, launchers, failed, without = [], [], {}, []
    for host in sorted(nodes):
        node = nodes[host] or {}
        if not node.get("ok"):
            failed[host] = str(node.get("error") or "no result")
            continue
        mine = [dict(entry, host=host, id="%s:%s" % (host, entry.get("pid"))) for entry in node.get("processes") or []]
        ranks += [entry for entry in mine if entry.get("role") == "rank"]
        launchers += [entry for entry in mine if entry.get("role") == "launcher"]
        if not any(entry.get("role") == "rank" for entry in mine):
            without.append(host)
    counts = Counter(entry["frame"] for entry in ranks if entry.get("frame"))
    ordered = counts.most_common()
    majority = ""
    if ordered and ordered[0][1] >= 2 and (len(ordered) == 1 or ordered[0][1] > ordered[1][1]):
        majority = ordered[0][0]
    stacked = sum(counts.values())
    suspects = []
    for entry in ranks:
        reasons = []
        if entry.get("state") in SUSPECT_STATES:
            reasons.append(SUSPECT_STATES[entry["state"]])
        if not entry.get("frame") and stacked:
            reasons.append("no stack: %s" % (entry.get("dump_error") or "py-spy gave none"))
        elif majority and entry.get("frame") and entry["frame"] != majority:
            reasons.append("stuck in %s while %d of %d ranks wait in %s" % (entry["frame"], counts[majority],
                                                                           len(ranks), majority))
        if reasons:
            suspects.append({"host": entry["host"], "pid": entry["pid"], "id": entry["id"], "rank": entry.get("rank"),
                             "local_rank": entry.get("local_rank"), "state": entry.get("state"),
                             "frame": entry.get("frame") or "", "reasons": reasons})
    for host, why in failed.items():
        suspects.append({"host": host, "pid": None, "id": host, "rank": None, "local_rank": None, "state": "",
                         "frame": "", "reasons": ["the node gave no diagnosis: %s" % why[:300]]})
    groups = [{"frame": frame, "count": count, "members": [entry["id"] for entry in ranks if entry.get("frame") == frame]}
              for frame, count in ordered]
    if not ranks:
        status = "no_ranks"
    else:
        status = "suspect" if suspects else "no_suspect"
    report = {"status": status, "majority": majority, "groups": groups, "suspects": suspects,
              "ranks": ranks, "launchers": launchers, "hosts_without_ranks": without, "failed_hosts": sorted(failed)}
    report["lines"] = summary_lines(report, len(nodes))
    return report


def _where(entry):
    frame = entry.get("frame") or "(no stack: %s)" % (entry.get("dump_error") or "none")
    if entry.get("native_frame"):
        frame += " <- %s" % entry["native_frame"]
    return frame


def summary_lines(report, node_count):
    """What the operator reads: a headline, one line per process, the groups, the suspects."""
    ranks, suspects = report["ranks"], report["suspects"]
    hosts = sorted({entry["host"] for entry in ranks})
    head = "DIAGNOSIS: %d rank(s) on %d of %d node(s)" % (len(ranks), len(hosts), node_count)
    if report["majority"]:
        head += "; %d wait in %s" % (report["groups"][0]["count"], report["majority"])
    elif len(report["groups"]) > 1:
        head += "; no majority frame (%d different)" % len(report["groups"])
    if suspects:
        head += "; SUSPECT: %s" % ", ".join(label(s["host"], s) if s["pid"] is not None else s["host"]
                                             for s in suspects)
    elif not ranks:
        head += "; no training process found (set diagnose_pattern or diagnose_user to name the job)"
    else:
        head += "; no suspect"
    lines = [head]
    for entry in report["launchers"]:
        lines.append("%s:%s %s launcher [%s] %s" % (entry["host"], entry["pid"], entry.get("launcher") or "",
                                                   entry.get("state"), _where(entry)))
    for entry in ranks:
        lines.append("%s [%s] %s" % (label(entry["host"], entry), entry.get("state"), _where(entry)))
    for group in report["groups"]:
        lines.append("group of %d in %s: %s" % (group["count"], group["frame"], ", ".join(group["members"])))
    for suspect in suspects:
        lines.append("SUSPECT %s: %s" % (label(suspect["host"], suspect) if suspect["pid"] is not None
                                         else suspect["host"], "; ".join(suspect["reasons"])))
    for host in report["hosts_without_ranks"]:
        lines.append("%s: no rank found on this node" % host)
    return lines
