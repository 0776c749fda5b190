# -*- coding: utf-8 -*-
"""Reading a verdict file a scheduler can trust: complete, consistent, or refused.

Standard library only (as is the check contract it uses), so ``scripts/verdict`` can use it
without Ansible.
``load`` returns the verdict or raises :class:`VerdictError` with one line
that says what is wrong (missing, truncated, not JSON, a key missing, a
``pass`` that contradicts its own nodes, or, with ``max_age``, older than that).
"""

from __future__ import annotations

import calendar
import json
import os
import re
import time

from cluster_preflight.verdict.printable import printable
from preflight_node.checks import NODE_STATUSES, STATUSES as CHECK_STATUSES

VERDICT_FILE = "verdict.json"
# A verdict of 10 000 nodes is a few MiB; anything far larger is not one (and is not read whole).
MAX_BYTES = 256 << 20
STATUSES = ("pass", "fail")
HOST_LISTS = ("healthy_hosts", "failed_hosts", "unreachable_hosts")


# The all-reduce checks that judge a node's ranks in a run: a node the localisation proved good must not fail
# one of them (the port findings, allreduce.rendezvous and allreduce.master_port, are about a port, not the node).
RUN_OUTCOME_CHECKS = ("allreduce.ranks", "allreduce.correctness", "allreduce.bandwidth", "allreduce.world_size",
                      "allreduce.suspect_rank_", "allreduce.signatures", "allreduce.first_run", "allreduce.confirm")


class VerdictError(ValueError):
    """The verdict cannot be trusted; the message is one line."""


def problems(verdict):
    """Everything structurally wrong with ``verdict`` (empty when it can be trusted): every field a consumer
    reads (``scripts/verdict``, the CLI, the summary, ``slurm-drain``, the prolog) has the type it expects, so
    a malformed file is refused here, in one line, never a traceback there."""
    if not isinstance(verdict, dict):
        return ["the verdict is a %s, not an object" % type(verdict).__name__]
    found = []
    if verdict.get("status") not in STATUSES:
        found.append("status is %r, expected pass or fail" % (_short(verdict.get("status")),))
    hosts = verdict.get("hosts")
    if not _names(hosts) or not hosts or len(set(hosts)) != len(hosts):
        found.append("hosts is missing or not a non-empty list of distinct node names")
        hosts = []
    for key in HOST_LISTS + OPTIONAL_HOST_LISTS:
        value = verdict.get(key)
        if key in OPTIONAL_HOST_LISTS and value is None:
            continue
        if not _names(value) or not set(value) <= set(hosts):
            found.append("%s is missing or names nodes outside hosts" % key)
    for key in TEXT_FIELDS:
        if verdict.get(key) is not None and not isinstance(verdict[key], str):
            found.append("%s is a %s, not text" % (key, type(verdict[key]).__name__))
    nodes = verdict.get("nodes")
    if not isinstance(nodes, dict):
        found.append("nodes is missing")
        nodes = {}
    for host in hosts:
        found += _node_problems(host, nodes.get(host))
    found += _allreduce_problems(verdict.get("allreduce"))
    localize = verdict.get("localize")
    if localize is not None and (not isinstance(localize, dict) or not _names(localize.get("good") or [])):
        found.append("localize is not an object with a list of node names as good")
    if not found:
        found += contradictions(verdict, nodes)
    if verdict.get("status") == "pass" and not found:
        bad = [host for host in hosts if nodes[host]["status"] not in ("pass", "warn")]
        if bad or verdict.get("failed_hosts") or verdict.get("unreachable_hosts"):
            found.append("status pass contradicts nodes %s" % ", ".join(
                bad or verdict.get("failed_hosts") or verdict.get("unreachable_hosts")))
    return [printable(item) for item in found]


# Host lists a verdict may lack (older verdicts), and fields that are text when they are there.
OPTIONAL_HOST_LISTS = ("warn_hosts", "unverified_hosts", "busy_hosts")
TEXT_FIELDS = ("run_id", "run_dir", "finished", "stopped", "kind")
CHECK_TEXTS = ("found", "expected", "fix")


def _short(value):
    text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _names(value):
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _node_problems(host, node):
    """What is wrong with one node's entry: its status, its checks (status, texts, a fix for warn and fail)."""
    if not isinstance(node, dict) or node.get("status") not in NODE_STATUSES:
        return ["node %s has no result" % host]
    checks = node.get("checks")
    if not isinstance(checks, dict) or not checks:
        return ["node %s has no checks" % host]
    found = []
    for name, check in checks.items():
        if not isinstance(check, dict) or check.get("status") not in CHECK_STATUSES \
                or not all(isinstance(check.get(field, ""), str) for field in CHECK_TEXTS) \
                or not isinstance(check.get("details") or {}, dict):
            found.append("check %s of %s is malformed" % (_short(name), host))
        elif check["status"] in ("warn", "fail") and not (check.get("fix") or "").strip():
            found.append("check %s of %s is a %s without a fix" % (_short(name), host, check["status"]))
        if len(found) >= 5:
            break
    return found


def _allreduce_problems(gate):
    """The all-reduce summary as the summary line reads it: text status and reason, sizes with numbers,
    suspects and ranks as objects."""
    if gate is None:
        return []
    if not isinstance(gate, dict) or not isinstance(gate.get("status"), str) \
            or not isinstance(gate.get("reason") or "", str):
        return ["allreduce is not an object with a text status"]
    for key in ("sizes", "suspects", "ranks"):
        rows = gate.get(key) or []
        if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
            return ["allreduce.%s is not a list of objects" % key]
    numbers = ("size_bytes", "busbw_gbps", "algbw_gbps", "time_us")
    for row in gate.get("sizes") or []:
        if not all(isinstance(row.get(key), (int, float)) and not isinstance(row.get(key), bool) for key in numbers):
            return ["allreduce.sizes has a row without the numbers %s" % ", ".join(numbers)]
    return []


def contradictions(verdict, nodes):
    """A node the localisation proved good that an all-reduce check fails: the verdict contradicts itself."""
    found = []
    for host in (verdict.get("localize") or {}).get("good") or []:
        checks = (nodes.get(host) or {}).get("checks") or {}
        failing = sorted(name for name, check in checks.items() if isinstance(check, dict)
                         and name.startswith(RUN_OUTCOME_CHECKS) and check.get("status") == "fail")
        if failing:
            found.append("node %s is proven good by the localisation and fails %s" % (host, ", ".join(failing)))
    return found


AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_age(text):
    """``24h`` (units s, m, h, d; a bare number is seconds) as seconds; ValueError with one line otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", str(text))
    if not match:
        raise ValueError("max age %r is not a number with a unit s, m, h or d (24h, 30m, 7d)" % (text,))
    return float(match.group(1)) * AGE_UNITS[match.group(2) or "s"]


def describe_age(seconds):
    """``2d 3h``, ``5h 12m``, ``40m``, ``12s``: an age for a message."""
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = ["%d%s" % (value, unit) for value, unit in ((days, "d"), (hours, "h"), (minutes, "m"), (secs, "s"))
             if value]
    return " ".join(parts[:2]) or "0s"


def age_problem(verdict, max_age, now=None):
    """Why ``verdict`` is too old to trust under ``max_age`` seconds (by its ``finished`` time), or dated in the
    future, or None."""
    if max_age is None:
        return None
    finished = verdict.get("finished")
    try:
        when = calendar.timegm(time.strptime(str(finished), "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return "it has no finished time (found %r), so its age is unknown and max age %s cannot be met" % (
            finished, describe_age(max_age))
    age = (time.time() if now is None else now) - when
    if age < 0:
        return "it finished at %s, %s in the future: a clock set wrong or a forged verdict, never fresh (run the " \
               "preflight again)" % (finished, describe_age(-age))
    if age > max_age:
        return "it finished at %s, %s ago, older than the max age of %s: treated as no verdict (run the " \
               "preflight again)" % (finished, describe_age(age), describe_age(max_age))
    return None


def load(path, max_age=None, now=None):
    """The verdict at ``path`` (a run directory or a verdict file), or VerdictError.  ``max_age``: seconds; a
    verdict that finished longer ago than that (``now``: seconds since the epoch, default the clock) is refused
    as if there were none."""
    if os.path.isdir(path):
        path = os.path.join(path, VERDICT_FILE)
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except PermissionError as exc:
        # Run directories are 0750 and verdicts 0640 (they name every node and its faults).
        raise VerdictError("cannot read the verdict at %s: %s (run directories are 0750, verdicts 0640: read it as "
                           "the user that ran the preflight or a member of its group)" % (path, exc.strerror or exc))
    except OSError as exc:
        raise VerdictError("no verdict at %s: %s" % (path, exc.strerror or exc))
    if len(data) > MAX_BYTES:
        raise VerdictError("%s is larger than %d MiB: not a verdict this project wrote" % (path, MAX_BYTES >> 20))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise VerdictError("%s is not UTF-8 text (byte %d): not a verdict this project wrote" % (path, exc.start))
    try:
        verdict = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise VerdictError("%s is not a complete verdict (%d bytes, %s)" % (path, len(text), printable(exc)))
    found = problems(verdict)
    if found:
        raise VerdictError("%s is not a valid verdict: %s" % (path, "; ".join(found[:5])))
    stale = age_problem(verdict, max_age, now)
    if stale:
        raise VerdictError("the verdict at %s is not fresh: %s" % (path, stale))
    return verdict
