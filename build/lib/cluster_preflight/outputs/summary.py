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

Group = collections.namedtuple("Group", "kind status title fix items")


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


def group_findings(raw):
    """``[Group(kind, status, title, fix, items)]``: the verdict's findings grouped by root cause (kind ``causes``,
    ``blocked``, ``same`` check and fix on several nodes, or ``one``), the worst first, in the verdict's order
    otherwise.  ``title`` and ``fix`` are empty for a group of one (its finding says it all)."""
    groups = collections.OrderedDict()
    generic = _Namer(raw["hosts"])
    for item in findings_of(raw):
        details = _details(raw, item)
        causes = [cause for cause in details.get("causes") or [] if isinstance(cause, dict) and cause.get("id")]
        if causes:
            key = ("causes",) + tuple(cause["id"] for cause in causes)
        elif details.get("blocked_by"):
            key = ("blocked", item.host) + tuple(details["blocked_by"])
        else:
            key = ("same", item.check, item.status, generic(item.fix))
        groups.setdefault(key, (causes, []))[1].append(item)
    out = []
    for key, (causes, items) in groups.items():
        status = min((item.status for item in items), key=lambda status: ORDER.get(status, 3))
        if len(items) == 1:
            out.append(Group("one", status, "", "", items))
        elif key[0] == "causes":
            out.append(Group("causes", status, "; ".join(cause.get("title") or cause["id"] for cause in causes),
                             " ".join(_sentence(cause.get("fix") or "") for cause in causes), items))
        elif key[0] == "blocked":
            out.append(Group("blocked", status, "%s: blocked by %s" % (key[1], ", ".join(key[2:])), items[0].fix,
                             items))
        else:
            out.append(Group("same", status, key[1], key[3], items))
    return sorted(out, key=lambda group: ORDER.get(group.status, 3))


def _sentence(text):
    """``text`` as a sentence: capitalised, one full stop."""
    text = text.strip().rstrip(".")
    return text[:1].upper() + text[1:] + "." if text else ""


def _cut(text, limit=EXAMPLE_LIMIT):
    return text if len(text) <= limit else text[:limit - 3] + "..."


def finding_lines(raw):
    """The findings as the summary prints them (see the module): a group of one as ``host check [status]: found``
    and its fix; a larger group as one line for the cause with its checks and nodes, one example and the fix."""
    lines = []
    for group in group_findings(raw):
        if len(group.items) == 1:
            item = group.items[0]
            lines.append("  %s %s [%s]: %s" % (item.host, item.check, item.status, item.found))
            if item.fix:
                lines.append("    fix: %s" % item.fix)
            continue
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
    gate = raw.get("allreduce") or {}
    if gate.get("status") == "skipped":
        lines.append("  all-reduce not run: %s" % gate.get("reason"))
    return lines


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


def changes_line(raw):
    """What a bring-up changed on each node (``changed``, from Ansible's own count), or in check mode would change;
    None for a run that counted none."""
    changed = raw.get("changed")
    if not isinstance(changed, dict):
        return None
    total = sum(int(changed.get(host) or 0) for host in raw["hosts"])
    each = ", ".join("%s %d" % (host, int(changed.get(host) or 0)) for host in raw["hosts"])
    if raw.get("check_mode"):
        if not total:
            return "check mode, nothing was written: nothing would change (changed=0 on every node)"
        return "check mode, nothing was written: %d change%s would be made (%s)" % (total, "" if total == 1 else "s",
                                                                                  each)
    if not total:
        return "changed=0 on every node: nothing needed changing"
    return "%d change%s made (%s)" % (total, "" if total == 1 else "s", each)


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
