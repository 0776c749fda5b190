# -*- coding: utf-8 -*-
"""What a run's summary says besides the node x capability matrix (controller layer; the summary callback and the
command line print it): the findings grouped by root cause, the profile each group was compared with, how the
host lists name the nodes, and what a bring-up changed (or would change, in check mode).

Findings are grouped so that one cause is read once: findings that name the same cause (``details.causes``: a
capability's shared cause, such as names that do not resolve on the nodes), findings of one node blocked by the
same failure (``details.blocked_by``), and the same check failing the same way on several nodes (its fix equal once
the node names are taken out).  A group of one reads as a single finding always has.
"""

from __future__ import annotations

import collections
import re

from cluster_preflight.verdict.value import findings_of

ORDER = {"fail": 0, "unverified": 1, "warn": 2}
NODE = "<node>"
# Nodes named in one line before "and N more".
NODES_SHOWN = 8
# Characters of a group's example finding.
EXAMPLE_LIMIT = 400

Group = collections.namedtuple("Group", "kind status title fix items consequences")


def node_list(hosts, every=None):
    """``gpu-node-1, gpu-node-2 and 7 more``, or ``all 3 nodes`` when ``hosts`` are ``every`` one of them."""
    hosts = list(dict.fromkeys(hosts))
    if every is not None and len(hosts) > 1 and set(hosts) == set(every):
        return "all %d nodes" % len(hosts)
    shown = ", ".join(hosts[:NODES_SHOWN])
    return shown + (" and %d more" % (len(hosts) - NODES_SHOWN) if len(hosts) > NODES_SHOWN else "")


# A run of characters a node name is made of, not preceded by one: where a name of the run may start.
_NAME_RUN = re.compile(r"(?<![\w.-])[\w.-]+")


class _Namer(object):
    """A text with every node name of the run replaced by ``<node>`` (the longest names first), for many texts of
    one run: the names are looked up in a set, each text read once (a
    cluster's every finding against its every name would grow with the square of its nodes)."""

    def __init__(self, hosts):
        names = set(hosts)
        # Names that are runs of word characters, dots and dashes are found by reading the runs; any other (an
        # IPv6 address) is replaced one by one, as before.
        self.others = sorted((name for name in names if not re.fullmatch(r"[\w.-]+", name)), key=len, reverse=True)
        self.names = names.difference(self.others)

    def __call__(self, text):
        text = _NAME_RUN.sub(self._run, text) if self.names else text
        for host in self.others:
            text = re.sub(r"(?<![\w.-])%s(?![\w-])" % re.escape(host), NODE, text)
        return text

    def _run(self, match):
        """The run with the longest name it starts with replaced: the whole run, or a part of it that ends
        before a dot (a name is followed by no word character or dash)."""
        run = match.group(0)
        if run in self.names:
            return NODE
        end = run.rfind(".")
        while end > 0:
            if run[:end] in self.names:
                return NODE + run[end:]
            end = run.rfind(".", 0, end)
        return run


def _details(raw, item):
    return (raw["nodes"][item.host]["checks"].get(item.check) or {}).get("details") or {}


def _causes_of(details):
    """The checks of the same node a finding is a consequence of: ``caused_by`` (a stage that did not deliver:
    ``preflight.facts``, ``preflight.reachable``), else ``blocked_by`` (a failure that kept it from running)."""
    return [str(name) for name in (details.get("caused_by") or details.get("blocked_by") or [])]


def group_findings(raw):
    """``[Group(kind, status, title, fix, items, consequences)]``: the verdict's findings grouped by root cause
    (kind ``causes``, ``blocked``, ``same`` status and fix on several nodes or checks, or ``one``), the worst first,
    a cause with consequences before the rest of its status, in the verdict's order otherwise.

    A finding that is a consequence of another finding of its node (``details.caused_by`` or ``blocked_by``: a
    capability without a result because the node's facts could not be read, a field not measured because its check
    failed) is not a group of its own: it is counted under its cause's group (``consequences``).  ``title`` and
    ``fix`` are empty for a group of one (its finding says it all); a group's fix names its nodes (never a
    placeholder)."""
    generic = _Namer(raw["hosts"])
    items = list(findings_of(raw))
    present = {(item.host, item.check) for item in items}
    groups = collections.OrderedDict()
    folded = collections.OrderedDict()
    for item in items:
        details = _details(raw, item)
        causes = [cause for cause in details.get("causes") or [] if isinstance(cause, dict) and cause.get("id")]
        consequence_of = [name for name in _causes_of(details) if (item.host, name) in present
                          and name != item.check]
        if consequence_of and not causes:
            folded.setdefault((item.host, consequence_of[0]), []).append(item)
            continue
        if causes:
            key = ("causes",) + tuple(cause["id"] for cause in causes)
        elif details.get("blocked_by"):
            key = ("blocked", item.host) + tuple(details["blocked_by"])
        else:
            key = ("same", item.status, generic(item.fix))
        groups.setdefault(key, (causes, []))[1].append(item)
    where = {(item.host, item.check): key for key, (_causes, members) in groups.items() for item in members}
    # A consequence of a consequence (a chain) goes under the first cause up the chain that is a group.
    parent = {(item.host, item.check): cause for (_host, cause), members in folded.items() for item in members}
    attached = collections.defaultdict(list)
    for (host, cause), members in folded.items():
        seen, at = set(), (host, cause)
        while at not in where and at in parent and at not in seen:
            seen.add(at)
            at = (host, parent[at])
        if at in where:
            attached[where[at]].extend(members)
        else:
            groups.setdefault(("blocked", host, cause), ([], []))[1].extend(members)
    out = []
    for key, (causes, members) in groups.items():
        status = min((item.status for item in members), key=lambda status: ORDER.get(status, 3))
        hosts = [item.host for item in members]
        more = attached.get(key, [])
        if len(members) == 1:
            out.append(Group("one", status, "", "", members, more))
        elif key[0] == "causes":
            out.append(Group("causes", status, "; ".join(cause.get("title") or cause["id"] for cause in causes),
                             " ".join(_sentence(cause.get("fix") or "") for cause in causes), members, more))
        elif key[0] == "blocked":
            out.append(Group("blocked", status, "%s: blocked by %s" % (key[1], ", ".join(key[2:])),
                             members[0].fix, members, more))
        else:
            checks = ", ".join(dict.fromkeys(item.check for item in members))
            out.append(Group("same", status, checks, _named(key[2], hosts, raw["hosts"]), members, more))
    return sorted(out, key=lambda group: (ORDER.get(group.status, 3), not group.consequences))


def _named(fix, hosts, every):
    """A group's fix with the node placeholder replaced by the group's nodes (``on all 3 nodes: ...``; ``node <node>``
    reads ``all 3 nodes`` too)."""
    if NODE not in fix:
        return fix
    nodes = node_list(hosts, every)
    return fix.replace("node %s" % NODE, nodes if len(set(hosts)) > 1 else "node %s" % nodes).replace(NODE, nodes)


def _sentence(text):
    """``text`` as a sentence: capitalised, one full stop."""
    text = text.strip().rstrip(".")
    return text[:1].upper() + text[1:] + "." if text else ""


def _cut(text, limit=EXAMPLE_LIMIT):
    return text if len(text) <= limit else text[:limit - 3] + "..."


def consequence_line(group, every):
    """The one line a group's consequences take: how many, which checks, on which nodes; None without any."""
    if not group.consequences:
        return None
    checks = list(dict.fromkeys(item.check for item in group.consequences))
    shown = ", ".join(checks[:6]) + (" and %d more" % (len(checks) - 6) if len(checks) > 6 else "")
    count = len(group.consequences)
    return "+ %d consequence%s of it (not checked or no result, nothing more to fix): %s on %s" % (
        count, "" if count == 1 else "s", shown, node_list([item.host for item in group.consequences], every))


def finding_lines(raw):
    """The findings as the summary prints them (see the module): a group of one as ``host check [status]: found``
    and its fix; a larger group as one line for the cause with its checks and nodes, one example and the fix; the
    consequences of either counted in one line under it."""
    lines = []
    for group in group_findings(raw):
        if len(group.items) == 1:
            item = group.items[0]
            lines.append("  %s %s [%s]: %s" % (item.host, item.check, item.status, item.found))
            if item.fix:
                lines.append("    fix: %s" % item.fix)
        else:
            checks = list(dict.fromkeys(item.check for item in group.items))
            hosts = node_list([item.host for item in group.items], raw["hosts"])
            if group.kind == "same":
                lines.append("  [%s] %s on %s (%d findings)" % (group.status, group.title, hosts, len(group.items)))
            else:
                lines.append("  [%s] %s: %d findings (%s) on %s" % (group.status, group.title, len(group.items),
                                                                  ", ".join(checks), hosts))
            first = group.items[0]
            lines.append("    e.g. %s %s: %s" % (first.host, first.check, _cut(first.found)))
            if group.fix:
                lines.append("    fix: %s" % group.fix)
        folded = consequence_line(group, raw["hosts"])
        if folded:
            lines.append("    %s" % folded)
    gate = raw.get("allreduce") or {}
    if gate.get("status") == "skipped":
        lines.append("  all-reduce not run: %s" % gate.get("reason"))
    return lines


def cause_records(raw):
    """The grouped findings as data, as ``verdict.json``, ``bringup.json`` and ``healthcheck.json`` keep them
    (``causes``): one entry per cause, worst first, with its checks, nodes, one example, the fix and its
    consequences counted."""
    out = []
    for group in group_findings(raw):
        first = group.items[0]
        entry = {"status": group.status, "title": group.title or first.check,
                 "checks": list(dict.fromkeys(item.check for item in group.items)),
                 "nodes": list(dict.fromkeys(item.host for item in group.items)), "findings": len(group.items),
                 "example": {"node": first.host, "check": first.check, "found": _cut(first.found)},
                 "fix": group.fix or first.fix}
        if group.consequences:
            entry["consequences"] = {
                "count": len(group.consequences),
                "checks": list(dict.fromkeys(item.check for item in group.consequences)),
                "nodes": list(dict.fromkeys(item.host for item in group.consequences))}
        out.append(entry)
    return out


def allreduce_line(verdict):
    """The all-reduce in one line: status, world size, backend, busbw at the largest message size (the summary and
    report.html)."""
    gate = verdict.get("allreduce")
    if not gate:
        return "all-reduce: not part of this playbook"
    if gate.get("status") == "skipped":
        return "all-reduce: skipped (%s)" % (gate.get("reason") or "not launched")
    line = "all-reduce: %s, world size %s of %s planned, backend %s" % (
        gate.get("status"), gate.get("world_size"), gate.get("planned_world_size"), gate.get("backend"))
    sizes = gate.get("sizes") or []
    if sizes:
        largest = max(sizes, key=lambda row: row["size_bytes"])
        line += ", busbw %.3f GB/s (algbw %.3f GB/s) at %d bytes" % (
            largest["busbw_gbps"], largest["algbw_gbps"], largest["size_bytes"])
    suspects = gate.get("suspects") or []
    if suspects:
        line += "; suspects: %s" % ", ".join("rank %s on %s" % (item.get("rank"), item.get("host")) for item in suspects)
    return line


def counts_text(raw):
    """How many nodes are in which state, worded so that a pass never reads as an alarm: healthy nodes (``pass`` and
    ``warn``) are counted together, those with warnings said apart (``3 nodes: all 3 healthy, 3 with warnings to
    read``)."""
    statuses = [raw["nodes"][host]["status"] for host in raw["hosts"]]
    total, healthy = len(statuses), sum(1 for status in statuses if status in ("pass", "warn"))
    warned = statuses.count("warn")
    parts = []
    for status, word in (("fail", "failed"), ("unverified", "unverified")):
        if statuses.count(status):
            parts.append("%d %s" % (statuses.count(status), word))
    if healthy == total:
        parts.append("all %d healthy" % total if total > 1 else "healthy")
    else:
        parts.append("%d healthy" % healthy)
    if warned:
        parts.append("%d with warnings to read" % warned)
    return "%d node%s: %s" % (total, "" if total == 1 else "s", ", ".join(parts))


def profile_lines(raw):
    """``profile: ...`` lines of a gate: which profile file each node was compared with, or that none was set (the
    nodes were then compared with each other); nothing for a run without the profile capability's checks."""
    by_file, off = collections.OrderedDict(), []
    for host in raw["hosts"]:
        checks = raw["nodes"][host]["checks"]
        if "profile.summary" in checks:
            path = (checks["profile.summary"].get("details") or {}).get("profile") or ""
            by_file.setdefault(path, []).append(host)
        elif "profile.enabled" in checks:
            off.append(host)
        elif "profile.file" in checks:
            by_file.setdefault("(unusable) %s" % checks["profile.file"].get("found"), []).append(host)
    lines = []
    for path, hosts in by_file.items():
        nodes = node_list(hosts, raw["hosts"])
        if path:
            lines.append("profile: %s compared with %s" % (nodes, path))
        else:
            lines.append("profile: none set for %s (profile_file is empty): compared with each other, busbw with no "
                         "known-good value; record one: python -m cluster_preflight baseline -i INVENTORY "
                         "(docs/profile.md)" % nodes)
    if off:
        lines.append("profile: not compared on %s (profile_enabled: false)" % node_list(off, raw["hosts"]))
    return lines


# A bring-up applies nothing on a node where one of these failed (its facts were not read, or it did not answer).
NOT_APPLIED = ("preflight.facts", "preflight.reachable")


def not_applied(raw):
    """The nodes of a bring-up where nothing was applied: their facts could not be read, or they did not answer."""
    return [host for host in raw["hosts"] if any((raw["nodes"][host]["checks"].get(name) or {}).get("status") == "fail"
                                                 for name in NOT_APPLIED)]


def changes_line(raw):
    """What a bring-up changed on each node (``changed``, from Ansible's own count), or in check mode would change;
    None for a run that counted none.  Nodes where nothing could be applied are named: their zero is no "nothing
    needed changing"."""
    changed = raw.get("changed")
    if not isinstance(changed, dict):
        return None
    skipped = not_applied(raw)
    counted = [host for host in raw["hosts"] if host not in skipped]
    total = sum(int(changed.get(host) or 0) for host in counted)
    each = ", ".join("%s %d" % (host, int(changed.get(host) or 0)) for host in counted)
    tail = ("; nothing %s on %s: %s (see the findings)" % (
        "checked" if raw.get("check_mode") else "applied", node_list(skipped, raw["hosts"]),
        "its facts could not be read or it did not answer" if len(skipped) == 1 else
        "their facts could not be read or they did not answer")) if skipped else ""
    if raw.get("check_mode"):
        if not counted:
            return "check mode, nothing was written%s" % tail
        if not total:
            return "check mode, nothing was written: nothing would change (changed=0 on %s)%s" % (
                "every node" if not skipped else node_list(counted, raw["hosts"]), tail)
        return "check mode, nothing was written: %d change%s would be made (%s)%s" % (
            total, "" if total == 1 else "s", each, tail)
    if not counted:
        return "nothing was applied%s" % tail
    if not total:
        return "changed=0 on %s: nothing needed changing%s" % (
            "every node" if not skipped else node_list(counted, raw["hosts"]), tail)
    return "%d change%s made (%s)%s" % (total, "" if total == 1 else "s", each, tail)


def notes(raw):
    """The lines a summary adds under the matrix: the profile lines, the host lists' note, the bring-up's changes."""
    lines = profile_lines(raw) if "allreduce" in raw else []
    note = (raw.get("hostfile") or {}).get("note")
    if note and "allreduce" in raw:
        lines.append("host lists: %s" % note)
    change = changes_line(raw)
    if change:
        lines.append("changes: %s" % change)
    return lines
