# -*- coding: utf-8 -*-
"""The check contract: one shape for every finding the preflight reports.

Used by the node-side modules, the controller-side action plugins and the
verdict alike, so a status means the same thing everywhere.

A check result is a dict ``{status, found, expected, fix}`` (plus optional
``details``).  Statuses, from best to worst:

* ``pass``            - found what was expected.
* ``not_applicable``  - the check cannot apply on this node; ``found`` says why
                        (for example no Yama LSM, so no ptrace_scope).
* ``skipped``         - not run because the operator switched it off or an
                        earlier check failed; ``found`` says which.
* ``warn``            - drift that does not block a job (policy decides).
* ``fail``            - the node must not take a job until fixed.

A check ``blocked`` by another node or a cluster-wide problem (``details.blocked``)
leaves its node ``unverified``: nothing wrong found there, nothing proven either.
Node status, worst first: ``fail``, ``unverified``, ``warn``, ``pass``.

Checks are grouped by capability (the role that owns them) and named
``<capability>.<name>`` in the verdict, so two roles can never overwrite each
other's findings: :func:`add` refuses a name that is already taken.  A result
that does not follow the contract (unknown status, missing field, a warn or
fail without a fix) is never dropped: :func:`normalize` turns it into a
``fail`` that says what was malformed.

A cross-node decision (interface choice, port mesh, all-reduce plan, known
hosts) returns a :func:`decision`: ``{ok, blockers, checks_by_host}`` where
``checks_by_host`` maps a node to ``{capability: {name: check}}``.
"""

from __future__ import annotations

import re

STATUSES = ("pass", "not_applicable", "skipped", "warn", "fail")
# A node's status, best first (see node_status).
NODE_STATUSES = ("pass", "warn", "unverified", "fail")
_RANK = {name: index for index, name in enumerate(STATUSES)}
FIELDS = ("status", "found", "expected", "fix")
# capability and check names: lower case words joined by underscores.
NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
# The capability that owns findings about the run itself (reachability, inputs of the run).
RUN = "preflight"


class CheckError(ValueError):
    """A check that breaks the contract (bad name, duplicate, bad status)."""


def check(status, found, expected, fix="", **details):
    """Build one check result; ``fix`` is required for warn and fail."""
    if status not in _RANK:
        raise CheckError("unknown check status %r, expected one of %s" % (status, ", ".join(STATUSES)))
    if status in ("warn", "fail") and not fix:
        raise CheckError("a %s result needs a fix" % status)
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


def blocked(found, expected="", fix=""):
    """Not run because of another node, a cluster-wide blocker or a privilege the run lacks: not this
    node's fault, not proven either.  ``fix`` says how to let it run (optional)."""
    return check("skipped", found, expected, fix, blocked=True)


def is_blocked(result):
    return bool((result.get("details") or {}).get("blocked"))


def error(capability, found, fix, expected=None, **details):
    """The ``<capability>.error`` finding: the capability could not give its result."""
    return failed(found, expected or "the %s checks run to completion on this node" % capability, fix, **details)


def normalize(result, where):
    """``result`` as a well-formed check, or a ``fail`` saying how it is malformed.

    ``where`` names the check for the message (``node1 / kernel_debug.ptrace_scope``).
    """
    clean = _well_formed(result)
    return clean if clean is not None else _malformed(result, where)


def _well_formed(result):
    """A copy of ``result`` with the contract's fields (and its ``details``), or None when it breaks the contract
    (:func:`_malformed` says how)."""
    if not isinstance(result, dict):
        return None
    status, found, expected, fix = (result.get("status"), result.get("found", ""), result.get("expected", ""),
                                    result.get("fix", ""))
    if status not in _RANK or not (isinstance(found, str) and isinstance(expected, str) and isinstance(fix, str)) \
            or (not fix and status in ("warn", "fail")):
        return None
    clean = {"status": status, "found": found, "expected": expected, "fix": fix}
    if result.get("details") is not None:
        clean["details"] = result["details"]
    return clean


def _malformed(result, where):
    """The ``fail`` that says how ``result`` breaks the contract."""
    problems = []
    if not isinstance(result, dict):
        problems.append("not a dict but %s" % type(result).__name__)
        result = {}
    status = result.get("status")
    if status not in _RANK:
        problems.append("unknown status %r" % (status,))
    for field in FIELDS[1:]:
        if not isinstance(result.get(field, ""), str):
            problems.append("%s is %s, not text" % (field, type(result.get(field)).__name__))
    if status in ("warn", "fail") and not result.get("fix"):
        problems.append("a %s without a fix" % status)
    return failed(
        "malformed check %s (%s): %s" % (where, "; ".join(problems), str(result)[:300]),
        "a check with status in %s and text found/expected/fix" % "/".join(STATUSES),
        "this is a defect of the preflight itself: report it with the verdict file")


# (capability, name) -> "<capability>.<name>", of names already found well-formed (a verdict names the same few dozen
# checks on every node).
_QUALIFIED = {}


def qualify(capability, name):
    """``<capability>.<name>``; raises CheckError for names outside the contract."""
    if type(capability) is str and type(name) is str:
        key = _QUALIFIED.get((capability, name))
        if key is not None:
            return key
    for part in (capability, name):
        if not isinstance(part, str) or not NAME_RE.match(part):
            raise CheckError("check name %r.%r must be lower-case words joined by underscores"
                             % (capability, name))
    key = "%s.%s" % (capability, name)
    if type(capability) is str and type(name) is str and len(_QUALIFIED) < 4096:
        _QUALIFIED[(capability, name)] = key
    return key


def add(flat, capability, name, result, where=""):
    """Add one check to a flat ``{"cap.name": check}`` map, normalised; a taken name is an error."""
    key = qualify(capability, name)
    if key in flat:
        raise CheckError("two checks named %s%s" % (key, " on " + where if where else ""))
    clean = _well_formed(result)  # the message's name of the check is worded only for a malformed one
    flat[key] = clean if clean is not None else _malformed(result, "%s%s" % (where + " / " if where else "", key))
    return key


def flatten(by_capability, where=""):
    """``{capability: {name: check}}`` -> ``{"capability.name": check}`` (duplicates refused)."""
    flat = {}
    for capability in sorted(by_capability):
        for name in sorted(by_capability[capability] or {}):
            add(flat, capability, name, by_capability[capability][name], where)
    return flat


def worst(statuses):
    """The worst status among ``statuses`` (``pass`` when empty); unknown counts as fail."""
    result = "pass"
    for status in statuses:
        rank = _RANK.get(status, _RANK["fail"])
        if rank > _RANK[result]:
            result = STATUSES[rank]
    return result


def node_status(checks):
    """``fail`` if any check failed; ``unverified`` if a check was blocked by another node or a
    cluster-wide problem (nothing wrong found here, nothing proven either); ``warn`` if any warned;
    else ``pass``."""
    status = worst({result.get("status") for result in checks.values()})
    if status == "fail":
        return "fail"
    if any(is_blocked(result) for result in checks.values()):
        return "unverified"
    return status if status == "warn" else "pass"


def decision(ok=True, blockers=(), checks_by_host=None, **plan):
    """The shape every cross-node decision returns."""
    result = {"ok": bool(ok) and not blockers, "blockers": list(blockers), "checks_by_host": checks_by_host or {}}
    result.update(plan)
    return result


def put(checks_by_host, host, capability, checks):
    """Merge ``checks`` ({name: check}) of one capability into ``checks_by_host[host]``."""
    target = checks_by_host.setdefault(host, {}).setdefault(capability, {})
    for name, result in checks.items():
        if name in target:
            raise CheckError("two checks named %s on %s" % (qualify(capability, name), host))
        target[name] = result
    return checks_by_host


def describe(host, name, result):
    """A one-paragraph message in the found / expected / fix shape."""
    return "%s: %s %s on %s. Found: %s. Expected: %s. Fix: %s" % (
        result["status"].upper(), name, "failed" if result["status"] == "fail" else "needs attention",
        host, result["found"], result["expected"], result["fix"] or "-")
