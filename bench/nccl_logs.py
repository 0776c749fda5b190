#!/usr/bin/env python3
"""Conformance over real failure logs: every log of a folder laid out like ``../shared/nccl-logs`` through the gate's
log diagnosis, exactly as the gate feeds a node's logs, and the cause it names compared with an expectation.

Each file is one node's log of a failed run: it goes into the ``allreduce`` module's result as the node's log and
through ``capabilities/allreduce/outcome.signature_check`` (every signature looked for, as after a failed all-reduce), which is
what the final decision does with each node's torchrun and rank logs.  The cause the check names (its primary
finding; with a diagnosis that has none, its first finding that warns or fails) is compared with the file's
expectation, ``<category>/<cause id>``: ``bench/nccl_logs_expected.py`` for ``../shared/nccl-logs``, or a JSON
file ``{"<file name>": "<category>/<cause id>"}`` for another folder (``--expected``), where ``healthy`` marks lines of
a run that did not fail (naming any cause there is wrong).

Prints one line per file (RIGHT, WRONG: another cause named, NOTHING: no cause named, NO-EXPECTATION) with the cause
named, then a summary line.  Exit status 0 only when every file is right.  Use the project's venv:
    .venv/bin/python bench/nccl_logs.py ../shared/nccl-logs [--expected FILE] [--verbose] [--fabric]
"""

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

# pylint: disable=wrong-import-position
from nccl_logs_expected import EXPECTED  # noqa: E402
from cluster_preflight.capabilities.allreduce.outcome import signature_check  # noqa: E402

HOST = "sample-node"
OUTCOMES = ("right", "wrong", "nothing", "no expectation")
TEXT_LIMIT = 160
HEALTHY = "healthy"


def logs(folder):
    """``[(file name, path)]``: the log files of the folder (``*.log``, ``*.txt``), in name order."""
    return [(name, os.path.join(folder, name)) for name in sorted(os.listdir(folder))
            if name.endswith((".log", ".txt")) and os.path.isfile(os.path.join(folder, name))]


def load_expected(path):
    """The expectations: the module's for no ``path``, else the JSON file's."""
    if not path:
        return dict(EXPECTED)
    with open(path) as handle:
        data = json.load(handle)
    if not isinstance(data, dict) or not all(isinstance(value, str) and ("/" in value or value == HEALTHY)
                                             for value in data.values()):
        raise SystemExit("%s: expected a JSON object {file name: \"<category>/<cause id>\" or \"healthy\"}" % path)
    return data


def named_cause(check):
    """``(category, cause id, finding)`` the check names, or ``(None, None, None)``."""
    if not check:
        return None, None, None
    details = check.get("details") or {}
    findings = details.get("findings") or []
    primary = details.get("cause")
    if primary is None:
        # A diagnosis without a primary cause: its first finding that warns or fails.
        primary = next((finding["id"] for finding in findings if finding.get("status") in ("warn", "fail")), None)
    for finding in findings:
        if finding["id"] == primary:
            return finding.get("category"), finding["id"], finding
    return None, None, None


def diagnose(path, fabric):
    """The ``signatures`` check of a node whose log is the file (a failed run: every signature looked for)."""
    with open(path, "rb") as handle:
        text = handle.read().decode(errors="replace")
    result = {"log": text, "rank_logs": [], "ranks": []}
    return signature_check(HOST, result, ["infiniband"] if fabric else None, "nccl", True)


def judge(expected, cause):
    """``right``, ``wrong``, ``nothing`` or ``no expectation``.  ``healthy``: lines of a run that did not fail
    (no cause may be named: one named is ``wrong``, none is ``right``)."""
    if expected is None:
        return "no expectation"
    if expected == HEALTHY:
        return "wrong" if cause else "right"
    if cause is None:
        return "nothing"
    return "right" if expected.split("/", 1)[1] == cause else "wrong"


def _clip(text):
    text = " ".join(str(text).split())
    return text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT] + "..."


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="a folder of failure logs (one node's log per file)")
    parser.add_argument("--expected", help="a JSON file {file name: \"<category>/<cause id>\"} (default: "
                                           "bench/nccl_logs_expected.py)")
    parser.add_argument("--fabric", action="store_true", help="judge the logs as from nodes with an RDMA fabric")
    parser.add_argument("--verbose", action="store_true", help="also print each check's found and fix")
    args = parser.parse_args(argv)
    expected = load_expected(args.expected)
    counts = dict.fromkeys(OUTCOMES, 0)
    for name, path in logs(os.path.abspath(args.folder)):
        check = diagnose(path, args.fabric)
        category, cause, finding = named_cause(check)
        want = expected.get(name)
        outcome = judge(want, cause)
        counts[outcome] += 1
        named = "%s/%s" % (category, cause) if cause else "-"
        print("%-14s %-40s expected %-45s named %s" % (outcome.upper().replace(" ", "-"), name, want or "-", named))
        if finding and (args.verbose or outcome != "right"):
            print("    cause: %s" % _clip(finding.get("cause")))
        if args.verbose and check:
            print("    found: %s" % _clip(check.get("found")))
            print("    fix:   %s" % _clip(check.get("fix")))
    total = sum(counts.values())
    print("SUMMARY logs %d, right %d, wrong %d, nothing %d, no expectation %d" % (
        total, counts["right"], counts["wrong"], counts["nothing"], counts["no expectation"]))
    return 0 if total and counts["right"] == total else 1


if __name__ == "__main__":
    sys.exit(main())
