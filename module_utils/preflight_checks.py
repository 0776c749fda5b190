# -*- coding: utf-8 -*-
"""One shape for every finding the preflight reports.

A check result is a dict ``{status, found, expected, fix}`` (plus optional
``details``).  Roles publish them as a fact named ``<role>_checks`` mapping a
check name to a result; the verdict collects every ``*_checks`` fact of every
node.  Statuses, from best to worst:

* ``pass``            - found what was expected.
* ``not_applicable``  - the check cannot apply on this node; ``found`` says why
                        (for example no Yama LSM, so no ptrace_scope).
* ``skipped``         - not run because an earlier check failed or it was
                        switched off; ``found`` says which.
* ``warn``            - drift that does not block a job (policy decides).
* ``fail``            - the node must not take a job until fixed.
"""

from __future__ import annotations

STATUSES = ("pass", "not_applicable", "skipped", "warn", "fail")
_RANK = {name: index for index, name in enumerate(STATUSES)}


def check(status, found, expected, fix="", **details):
    """Build one check result; ``fix`` is required for warn and fail."""
    if status not in _RANK:
        raise ValueError("unknown check status %r, expected one of %s" % (status, ", ".join(STATUSES)))
    if status in ("warn", "fail") and not fix:
        raise ValueError("a %s result needs a fix" % status)
    result = {"status": status, "found": str(found), "expected": str(expected), "fix": str(fix)}
    if details:
        result["details"] = details
    return result


def passed(found, expected, **details):
    return check("pass", found, expected, **details)


def failed(found, expected, fix, **details):
    return check("fail", found, expected, fix, **details)


def warned(found, expected, fix, **details):
    return check("warn", found, expected, fix, **details)


def not_applicable(reason, expected="", **details):
    return check("not_applicable", reason, expected, **details)


def skipped(reason, expected="", **details):
    return check("skipped", reason, expected, **details)


def worst(statuses):
    """The worst status among ``statuses`` (``pass`` when empty)."""
    result = "pass"
    for status in statuses:
        if _RANK[status] > _RANK[result]:
            result = status
    return result


def node_status(checks):
    """``fail`` if any check failed, ``warn`` if any warned, else ``pass``."""
    status = worst(result["status"] for result in checks.values())
    return status if status in ("fail", "warn") else "pass"


def describe(host, name, result):
    """A one-paragraph message in the found / expected / fix shape."""
    return "%s: %s %s on %s. Found: %s. Expected: %s. Fix: %s" % (
        result["status"].upper(), name, "failed" if result["status"] == "fail" else "needs attention",
        host, result["found"], result["expected"], result["fix"] or "-")
