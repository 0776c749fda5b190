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


def discovered_interpreter(result):
    """The interpreter Ansible's discovery chose for this node call (``ansible_python_interpreter`` unset), or
    "" when it was set (Ansible reports what it discovered in the result's ``ansible_facts``)."""
    facts = result.get("ansible_facts") if isinstance(result, dict) else None
    found = (facts or {}).get("discovered_interpreter_python") if isinstance(facts, dict) else None
    return str(found) if isinstance(found, str) and found else ""


# What every Debian, Ubuntu, RHEL 8+ and SUSE node has; the value the example inventory names.
SYSTEM_PYTHON = "/usr/bin/python3"
SET_IT = ("set ansible_python_interpreter: %s (a Python every node has; any node's Python 3 that root can run "
          "will do) under the cluster group's vars: in the inventory, then re-run" % SYSTEM_PYTHON)


def start_fix(result, user="", host=""):
    """The fix for a module that could not start (``user``: the login, from the inventory; ``host``: the node),
    or None when the cause is not one of these (the caller keeps its own fix)."""
    if not not_started(result):
        return None
    said = " ".join(str(result.get(key) or "") for key in ("module_stderr", "module_stdout", "msg"))
    login = "the login user %s" % user if user else "the login user"
    on = " on %s" % host if host else " on the node"
    discovered = discovered_interpreter(result)
    if discovered:
        # Interpreter discovery picked the first Python on the login's PATH (a pyenv or conda shim on a root
        # PATH is the usual one); what the node said shows why it does not run.
        return ("Ansible's interpreter discovery chose %s%s (ansible_python_interpreter is not set) and it does "
                "not run there (rc %s): %s" % (discovered, on, result.get("rc"), SET_IT))
    refused, missing, quoted = _REFUSED.search(said), _MISSING.search(said), _QUOTED.search(said)
    if refused or (result.get("rc") == 126 and not missing):
        interpreter = refused.group(1) if refused else "(see ansible_python_interpreter)"
        return ("%s cannot execute the interpreter %s%s: set ansible_python_interpreter to a Python that "
                "user can run, or connect as root / set preflight_become: true" % (login, interpreter, on))
    if missing or quoted or result.get("rc") == 127:
        interpreter = (quoted or missing).group(1) if (quoted or missing) else "(see ansible_python_interpreter)"
        return ("no such interpreter %s%s: set ansible_python_interpreter to a Python the node has (%s, or "
                "the training Python), or install it there" % (interpreter, on, SYSTEM_PYTHON))
    return None
