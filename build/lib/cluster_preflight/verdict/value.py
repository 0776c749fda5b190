# -*- coding: utf-8 -*-
"""The verdict file of a run as a typed value, and the exit code it stands for.

The checks that decide whether a verdict file can be trusted are
``cluster_preflight/verdict/file.py``'s (the same ones ``scripts/verdict`` and the summary
callback use); this module only gives their result a type.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from .file import VerdictError, load, problems

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

__all__ = ["EXIT_PASS", "EXIT_WARN", "EXIT_FAIL", "EXIT_UNKNOWN", "EXIT_USAGE", "EXIT_INTERRUPTED", "EXIT_MEANING",
           "Finding", "Verdict", "VerdictError", "exit_code", "load_verdict", "verdict_from_dict"]

# Exit codes: 0-3 are scripts/verdict's (gcm's OK / WARN / CRITICAL / UNKNOWN); 4 and 130 are ours.
EXIT_PASS = 0
EXIT_WARN = 1  # only `verdict`, as scripts/verdict: a pass with warn nodes
EXIT_FAIL = 2
EXIT_UNKNOWN = 3
EXIT_USAGE = 4
EXIT_INTERRUPTED = 130
EXIT_MEANING = {
    EXIT_PASS: "pass",
    EXIT_WARN: "pass with warnings",
    EXIT_FAIL: "fail",
    EXIT_UNKNOWN: "unknown: no verdict, or one that cannot be trusted",
    EXIT_USAGE: "usage: bad arguments or invalid settings, no node was judged",
    EXIT_INTERRUPTED: "interrupted",
}
# The files preflight_outputs.py (and report.py: report.html) writes next to the verdict (found there when the run's
# task result is not at hand, as for `verdict PATH`).
OUTPUT_FILES = ("junit.xml", "preflight.prom", "hostfile", "hosts.txt", "hosts.csv", "report.html")
FINDING_STATUSES = ("fail", "warn")


class Finding(NamedTuple):
    """One check an operator has to look at: ``status`` is ``fail``, ``warn``, or ``unverified`` for a
    check blocked by another node or a cluster-wide problem (its node is then ``unverified``)."""

    host: str
    check: str
    status: str
    found: str
    expected: str
    fix: str


@dataclass(frozen=True)
class Verdict:
    """A validated verdict file (``verdict.json``, ``bringup.json`` or ``healthcheck.json``).

    ``status`` is ``pass`` or ``fail`` as the file says: ``pass`` only when every targeted node is
    ``pass`` or ``warn`` (and, for the gate, the all-reduce passed). ``raw`` is the whole file.
    """

    status: str
    path: str
    run_dir: str
    hosts: Tuple[str, ...]
    healthy_hosts: Tuple[str, ...]
    failed_hosts: Tuple[str, ...]
    unverified_hosts: Tuple[str, ...]
    unreachable_hosts: Tuple[str, ...]
    warn_hosts: Tuple[str, ...]
    findings: Tuple[Finding, ...]
    outputs: Dict[str, str]
    stopped: Optional[str]
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def exit_code(self, warnings: bool = False) -> int:
        return exit_code(self, warnings=warnings)


def findings_of(raw: Dict[str, Any]) -> List[Finding]:
    """Every ``fail``, ``warn`` and blocked check, node by node in the verdict's order, checks by name."""
    found = []
    for host in raw["hosts"]:
        for name, check in sorted(raw["nodes"][host]["checks"].items()):
            status = check["status"]
            if (check.get("details") or {}).get("blocked"):
                status = "unverified"
            elif status not in FINDING_STATUSES:
                continue
            found.append(Finding(host, name, status, str(check.get("found") or ""), str(check.get("expected") or ""),
                                 str(check.get("fix") or "")))
    return found


def verdict_from_dict(raw: Any, path: str = "", outputs: Optional[Dict[str, str]] = None) -> Verdict:
    """``raw`` as a :class:`Verdict`, or :class:`VerdictError` when it cannot be trusted."""
    found = problems(raw)
    if found:
        raise VerdictError("%s is not a valid verdict: %s" % (path or "the verdict", "; ".join(found[:5])))
    run_dir = str(raw.get("run_dir") or (os.path.dirname(path) if path else ""))
    if outputs is None:
        # Next to the file as it is found here (a copied run keeps the run_dir it was written in).
        where = os.path.dirname(path) if path else run_dir
        outputs = {name: os.path.join(where, name) for name in OUTPUT_FILES
                   if where and os.path.exists(os.path.join(where, name))}

    def hosts(key):
        return tuple(raw.get(key) or ())

    return Verdict(status=raw["status"], path=path, run_dir=run_dir, hosts=hosts("hosts"),
                   healthy_hosts=hosts("healthy_hosts"), failed_hosts=hosts("failed_hosts"),
                   unverified_hosts=hosts("unverified_hosts"), unreachable_hosts=hosts("unreachable_hosts"),
                   warn_hosts=hosts("warn_hosts"), findings=tuple(findings_of(raw)), outputs=dict(outputs),
                   stopped=raw.get("stopped") or None, raw=raw)


def load_verdict(path: str, outputs: Optional[Dict[str, str]] = None) -> Verdict:
    """The verdict at ``path`` (a run directory or a verdict file), or :class:`VerdictError` (one line:
    missing, unreadable, truncated, a key missing, a ``pass`` that contradicts its nodes)."""
    if os.path.isdir(path):
        path = os.path.join(path, "verdict.json")
    return verdict_from_dict(load(path), os.path.abspath(path), outputs)


def exit_code(verdict: Optional[Verdict], warnings: bool = False) -> int:
    """The documented exit code of ``verdict`` (``None``: there is none to trust).

    ``warnings`` gives a pass with warn nodes its own code 1, as ``scripts/verdict`` does; a run
    (gate, bring-up, health check) passes with 0 whatever the warnings, as ``ansible-playbook`` does.
    """
    if verdict is None:
        return EXIT_UNKNOWN
    if verdict.stopped:
        return EXIT_USAGE
    if verdict.status != "pass":
        return EXIT_FAIL
    return EXIT_WARN if warnings and verdict.warn_hosts else EXIT_PASS
