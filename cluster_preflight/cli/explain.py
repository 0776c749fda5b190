# -*- coding: utf-8 -*-
"""``explain``: the cause of a failed job named from its log, at the operator's terminal.

The same diagnosis the gate runs over its own all-reduce's logs
(:mod:`cluster_preflight.capabilities.allreduce.signatures`) read over any job's log: a torchrun, NCCL, gloo or
nccl-tests output saved from a job that failed.  For each file it prints the cause the log names (the line that
says it, what it means, the fix), the gate's checks that catch the cause before the next job, and the other known
lines it saw.  Nothing runs on a node; nothing is written.

Exit codes: 0 no file names a known failure, 2 a file names one (a cause, or a symptom where no cause explains it),
4 a file could not be read (the others are still explained).
"""

from __future__ import annotations

import os
import sys

from ..capabilities.allreduce import signatures
from ..verdict.printable import printable
from ..verdict.value import EXIT_FAIL, EXIT_PASS, EXIT_USAGE

# What of a log is read: its last bytes (a job's failure is at its end; a log of many GB is not read whole).
READ_LIMIT = 32 * 1024 * 1024
FABRICS = ("infiniband", "roce", "efa")
STDIN = "-"


def add_parser(commands):
    """The ``explain`` subcommand on ``commands`` (an argparse subparsers object)."""
    text = ("name the cause of a failed job from its log (torchrun, NCCL, gloo or nccl-tests output): the line "
            "that says it, the fix, and the gate's checks that catch it before the next job")
    sub = commands.add_parser("explain", help=text, allow_abbrev=False, description=text + ". Exit 0 no known "
                              "failure in any log, 2 a log names one, 4 a log could not be read. Nothing is run "
                              "on a node. The whole table: docs/why-did-my-job-fail.md.")
    sub.add_argument("logs", nargs="+", metavar="LOG",
                     help="a log file of the job (one node's or all nodes' output; '-' reads standard input)")
    sub.add_argument("--fabric", choices=FABRICS, metavar="KIND",
                     help="the job's nodes have this RDMA fabric (%s): NCCL falling back to sockets is then a "
                          "fault, not the expected transport" % ", ".join(FABRICS))
    sub.add_argument("--nodes", type=_positive, metavar="N",
                     help="how many nodes the job spanned (a peer at a loopback address is a fault only across "
                          "nodes; default: not known)")
    return sub


def _positive(text):
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def read_log(path, stdin=None):
    """``(text, note)``: the log at ``path`` (``-``: ``stdin``, a binary stream), its last :data:`READ_LIMIT`
    bytes; ``note`` says what was left out, or is empty.  OSError when it cannot be read."""
    if path == STDIN:
        data = (stdin or sys.stdin.buffer).read()
        size = len(data)
        data = data[-READ_LIMIT:]
    else:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - READ_LIMIT))
            data = handle.read(READ_LIMIT)
    note = ""
    if size > len(data):
        note = "its first %d bytes were not read (the last %d are)" % (size - len(data), len(data))
    return data.decode("utf-8", errors="replace"), note


def explain(text, fabric=None, nodes=None):
    """``(cause, findings)``: the one cause the log names (a finding, or None) and every known line it has."""
    findings = signatures.match(text, fabric=[fabric] if fabric else False, nodes=nodes)
    return signatures.primary(findings), findings


def report(name, text, note, fabric=None, nodes=None):
    """``(lines, named)``: what ``explain`` prints for one log, and whether it names a failure."""
    cause, findings = explain(text, fabric, nodes)
    lines = []
    if cause is None:
        lines.append("%s: no known failure in %d lines" % (name, len(text.splitlines())))
        lines.extend("  seen: %s" % _seen(finding) for finding in findings)
        lines.append("  the table of what is known: docs/why-did-my-job-fail.md; the gate's own all-reduce on these "
                     "nodes: python -m cluster_preflight gate -i INVENTORY")
    else:
        lines.extend([
            "%s: %s %s/%s" % (name, cause["status"].upper(), cause["category"], cause["id"]),
            "  line:     %s" % cause["line"],
            "  cause:    %s" % cause["cause"],
            "  expected: %s" % signatures.expected(cause),
            "  fix:      %s" % (cause["fix"] or "-"),
            "  caught before the job by: %s" % (", ".join(cause["checks"]) or "no check of the gate (the job's "
                                                                               "own code or settings)"),
        ])
        if cause["ranks"]:
            lines.append("  ranks:    %s" % ", ".join(str(rank) for rank in cause["ranks"]))
        lines.extend("  also:     %s" % _seen(finding) for finding in findings if finding is not cause)
    if note:
        lines.append("  note:     %s" % note)
    return [printable(line) for line in lines], cause is not None


def _seen(finding):
    return "%s/%s (%s, %d line%s): %s" % (finding["category"], finding["id"], finding["status"], finding["count"],
                                          "" if finding["count"] == 1 else "s", finding["cause"])


def run(args, out):
    """Explain every log of ``args.logs``; ``out(text, stream=None)`` prints.  Returns the exit code."""
    code = EXIT_PASS
    unreadable = False
    for path in args.logs:
        try:
            text, note = read_log(path)
        except OSError as exc:
            out("%s: could not be read: %s" % (printable(path), printable(exc.strerror or exc)), True)
            unreadable = True
            continue
        lines, named = report("standard input" if path == STDIN else path, text, note, args.fabric, args.nodes)
        out("\n".join(lines))
        if named:
            code = EXIT_FAIL
    return EXIT_USAGE if unreadable else code
