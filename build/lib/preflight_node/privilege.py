# -*- coding: utf-8 -*-
"""What a reader could not observe without root, and what a decider makes of it.

A preflight that connects as an unprivileged account (``ansible_user`` not root,
``preflight_become`` false) cannot read everything: root's process descriptors, files
mode 0600, another user's home.  That is a requirement of the check, not a fault of
the node, so it must never fail the node.  The reader records it as a fact
(``privileged: false`` and ``needs_root``: what it could not read and why); the decider
reports the check ``blocked`` with a found text starting ``needs root:`` and the fix
:data:`BECOME_FIX`, which leaves the node ``unverified`` (see ``preflight_checks``).

A comparison with a fallback source (the default sshd configuration because the running
sshd could not be found) is never a ``pass``: at most a ``warn`` naming the assumption
(:func:`assumed`).
"""

from __future__ import annotations

import errno
import os

from .checks import blocked, warned

NEEDS_ROOT = "needs root: "
BECOME_FIX = "set preflight_become: true (or connect as root)"
# How the kernel words a refusal (EACCES, EPERM): what a reader's error text carries.
_DENIED = (os.strerror(errno.EACCES), os.strerror(errno.EPERM))


def privileged():
    """Whether this process reads as root (the connection, or preflight_become)."""
    return os.geteuid() == 0


def denied(text):
    """Whether an error text is a permission refusal."""
    return any(word in str(text or "") for word in _DENIED)


def unprivileged(facts):
    """Whether ``facts`` were read without root; facts that do not say (older readers) count as root's."""
    return isinstance(facts, dict) and facts.get("privileged") is False


def refused(entries, is_privileged):
    """``[{path, error}]`` of the ``(path, error)`` pairs a reader without root was refused; ``[]`` as root
    (root refused is something else: an immutable file, a broken mount)."""
    if is_privileged:
        return []
    return [{"path": str(path), "error": str(error)} for path, error in entries if path and denied(error)]


def needs_root(found, expected=""):
    """The check that could not observe without root: blocked, never failed."""
    return blocked(NEEDS_ROOT + found, expected, BECOME_FIX)


def block_refused(checks, refusals):
    """``checks`` (``{name: check}``) with every warn or fail about a path in ``refusals`` (:func:`refused`)
    blocked instead: what it found is that the file could not be read, not that the node is wrong."""
    if not refusals:
        return checks
    paths = [item["path"] for item in refusals]
    result = {}
    for name, item in checks.items():
        if item.get("status") in ("warn", "fail") and any(path in item.get("found", "") for path in paths):
            item = needs_root("%s (read without root)" % item["found"], item.get("expected", ""))
        result[name] = item
    return result


def assumed(result, assumption, fix):
    """``result`` of a comparison with a fallback source, ``assumption`` naming it: a pass becomes a warn
    with ``fix``; any other status keeps its own and names the assumption too."""
    if result["status"] == "pass":
        return warned("%s; %s" % (result["found"], assumption), result["expected"], fix,
                      **(result.get("details") or {}))
    return dict(result, found="%s; %s" % (result["found"], assumption))


def file_errors(facts):
    """``(path, error)`` of every file a reader's facts say it could not read, in the shapes the shared
    readers give: a sysctl setting (``runtime_error``, ``dropin_error``, ``unreadable``), a limits or
    directory reading (``path`` + ``error``, ``unreadable``), the grub files (``errors``: path -> why)."""
    if not isinstance(facts, dict):
        return []
    pairs = [(facts.get(path), facts[error]) for path, error in (
        ("runtime_path", "runtime_error"), ("dropin", "dropin_error"), ("path", "error")) if facts.get(error)]
    pairs += [(item.get("path"), item.get("error")) for item in facts.get("unreadable") or []
              if isinstance(item, dict)]
    errors = facts.get("errors")
    if isinstance(errors, dict):
        pairs += sorted(errors.items())
    return pairs
