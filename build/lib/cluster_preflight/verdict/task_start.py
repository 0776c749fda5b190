# -*- coding: utf-8 -*-
"""A node module that could not even start: what the node's shell said, and the fix that matches it.

When the interpreter Ansible runs a module with cannot be executed (a Python under ``/root``, mode
0700, for an unprivileged login) or does not exist, the node's shell answers instead of the module:
rc 126 or 127, no JSON, and Ansible's message ("Module result deserialization failed: No start of
json char found") says nothing of the cause, which is only in the result's ``module_stderr``.  The
verdict keeps a bounded tail of it (never of a censored result) and a fix for that cause.
"""

from __future__ import annotations

import re

# How Ansible words a module that gave no JSON (2.19, and the older MODULE FAILURE).
NOT_STARTED = ("Module result deserialization failed", "MODULE FAILURE", "The module interpreter")
SAID_LIMIT = 300
_REFUSED = re.compile(r"(/[^\s:'\"]+): Permission denied")
_MISSING = re.compile(r"(/[^\s:'\"]+): (?:No such file or directory|not found|command not found)")
_QUOTED = re.compile(r"The module interpreter '([^']+)' was not found")


def _censored(result):
    return "censored" in result or bool(result.get("_ansible_no_log"))


def not_started(result):
    """Whether a failed task's ``result`` is a module that never ran (no JSON came back)."""
    if not isinstance(result, dict) or _censored(result):
        return False
    message = str(result.get("msg") or "")
    return message.startswith(NOT_STARTED) or (result.get("rc") in (126, 127) and "module_stderr" in result)


def node_said(result):
    """The end of what the node printed instead of JSON (stderr, else stdout) on one line, at most
    :data:`SAID_LIMIT` characters; "" for a censored result or a module that did start."""
    if not not_started(result):
        return ""
    for key in ("module_stderr", "module_stdout"):
        text = " ".join(str(result.get(key) or "").split())
        if text:
            return text[-SAID_LIMIT:]
    return ""


def start_fix(result, user=""):
    """The fix for a module that could not start (``user``: the login, from the inventory), or None when
    the cause is not one of these (the caller keeps its own fix)."""
    if not not_started(result):
        return None
    said = " ".join(str(result.get(key) or "") for key in ("module_stderr", "module_stdout", "msg"))
    login = "the login user %s" % user if user else "the login user"
    refused, missing, quoted = _REFUSED.search(said), _MISSING.search(said), _QUOTED.search(said)
    if refused or (result.get("rc") == 126 and not missing):
        interpreter = refused.group(1) if refused else "(see ansible_python_interpreter)"
        return ("%s cannot execute the interpreter %s on the node: set ansible_python_interpreter to a Python that "
                "user can run, or connect as root / set preflight_become: true" % (login, interpreter))
    if missing or quoted or result.get("rc") == 127:
        interpreter = (quoted or missing).group(1) if (quoted or missing) else "(see ansible_python_interpreter)"
        return ("no such interpreter %s on the node: set ansible_python_interpreter to a Python the node has (the "
                "training Python, or /usr/bin/python3), or install it there" % interpreter)
    return None
