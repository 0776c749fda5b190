# -*- coding: utf-8 -*-
"""Capability ``kernel_debug``: kernel settings that let debuggers attach to a hung rank.

``kernel.yama.ptrace_scope`` (opt-in: 0 is a security relaxation) and any
``kernel_debug_extra_sysctls``, each now (``/proc/sys``), in a sysctl.d drop-in
of its own and at the next boot.  The interface is the one in
``preflight_capabilities.py``; the role ``roles/kernel_debug`` holds the
variables and the bring-up writer tasks (``sysctl_setting``), which read and
decide with the same functions as here (``preflight_sysctl.read_setting`` /
``decide_setting``).

Facts (``read``)::

    {"settings": {<check name>: preflight_sysctl.read_setting(...) facts, ...}}

keyed by check name (``ptrace_scope`` and each extra sysctl's ``check_name``).
"""

from __future__ import annotations

import os

from ansible.module_utils import preflight_sysctl as sysctl
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.module_utils.preflight_checks import NAME_RE, failed, skipped

CAPABILITY = "kernel_debug"
PTRACE = "ptrace_scope"
SUFFIXES = ("", "_persisted", "_boot")
# Keys another variable owns: a second writer of the same key would fight it.
OWNED_ELSEWHERE = {
    sysctl.PTRACE_SCOPE: "kernel_debug_ptrace_scope",
    sysctl.CORE_PATTERN: "core_dumps_pattern (role core_dumps)",
}
PTRACE_SCOPES = (0, 1, 2, 3)


def switched_on(value):
    """A switch as typed on the command line (``-e kernel_debug_ptrace_scope_enabled=false`` is "false")."""
    return boolean(value, strict=False)


def _problem(name, found, expected, fix):
    return {"name": name, "found": str(found), "expected": str(expected), "fix": str(fix)}


def _extra_check_name(item):
    if item.get("check_name"):
        return str(item["check_name"])
    return sysctl.normalize_key(str(item.get("name") or "")).split(".")[-1]


def wanted(settings):
    """The settings this capability keeps: ``[{check_name, key, value, dropin}]``
    (ptrace_scope first when it is switched on)."""
    result = []
    if switched_on(settings["kernel_debug_ptrace_scope_enabled"]):
        result.append({"check_name": PTRACE, "key": sysctl.PTRACE_SCOPE,
                       "value": str(settings["kernel_debug_ptrace_scope"]),
                       "dropin": os.path.normpath(settings["kernel_debug_ptrace_scope_dropin"])})
    for item in settings["kernel_debug_extra_sysctls"] or []:
        result.append({"check_name": _extra_check_name(item), "key": sysctl.normalize_key(str(item["name"])),
                       "value": sysctl.normalize_value(item["value"]),
                       "dropin": os.path.normpath(str(item["dropin"]))})
    return result


def validate(settings):
    """Problems with the kernel_debug inputs (beyond types and choices), each
    ``{name, found, expected, fix}``."""
    problems = []
    search = settings["kernel_debug_sysctl_dirs"] or []
    # Drop-ins are judged against the search list only when the list itself is sound: one root cause, one problem.
    search_ok = False
    if not search or not all(isinstance(entry, str) and entry.startswith("/") for entry in search):
        problems.append(_problem("kernel_debug_sysctl_dirs", search, "a list of absolute sysctl.d directories "
                                 "(and plain *.conf files)", "keep the default list, or list absolute paths only"))
    elif not sysctl.search_dirs(search):
        problems.append(_problem("kernel_debug_sysctl_dirs", search, "at least one sysctl.d directory",
                                 "add /etc/sysctl.d to kernel_debug_sysctl_dirs"))
    else:
        search_ok = True
    for name in ("kernel_debug_sysctl_root", "kernel_debug_proc_root"):
        value = settings[name]
        if not isinstance(value, str) or not value.startswith("/"):
            problems.append(_problem(name, value, "an absolute path", "set %s to an absolute path" % name))

    scope = settings["kernel_debug_ptrace_scope"]
    try:
        scope_ok = not isinstance(scope, bool) and int(str(scope)) in PTRACE_SCOPES
    except ValueError:
        scope_ok = False
    if not scope_ok:
        problems.append(_problem("kernel_debug_ptrace_scope", scope, "one of 0, 1, 2, 3 (Yama: 0 classic, "
                                 "1 descendants only, 2 admin only, 3 none)",
                                 "set kernel_debug_ptrace_scope to 0 (debuggers attach without root) or 1"))
    dropins = {}
    taken = {}
    problem = search_ok and sysctl.dropin_problem(settings["kernel_debug_ptrace_scope_dropin"], search)
    if problem:
        problems.append(_problem("kernel_debug_ptrace_scope_dropin", problem,
                                 "a *.conf file of its own in a directory of kernel_debug_sysctl_dirs",
                                 "set kernel_debug_ptrace_scope_dropin to a file of its own such as "
                                 "/etc/sysctl.d/10-ptrace.conf"))
    else:
        dropins[os.path.normpath(settings["kernel_debug_ptrace_scope_dropin"])] = "kernel_debug_ptrace_scope_dropin"
    for suffix in SUFFIXES:
        taken[PTRACE + suffix] = "kernel.yama.ptrace_scope"

    extras = settings["kernel_debug_extra_sysctls"] or []
    if not isinstance(extras, list):
        problems.append(_problem("kernel_debug_extra_sysctls", extras, "a list of {name, value, dropin}",
                                 "set kernel_debug_extra_sysctls to a list, e.g. []"))
        extras = []
    for index, item in enumerate(extras):
        where = "kernel_debug_extra_sysctls[%d]" % index
        if not isinstance(item, dict) or not all(item.get(field) not in (None, "") for field in ("name", "dropin")) \
                or item.get("value") is None:
            problems.append(_problem(where, item, "a dict with name, value and dropin (check_name optional)",
                                     "give %s a name, a value and a drop-in of its own" % where))
            continue
        key = sysctl.normalize_key(str(item["name"]))
        problem = sysctl.key_problem(key)
        if problem:
            problems.append(_problem(where, problem, "a sysctl key such as kernel.panic_on_oops",
                                     "correct the name of %s" % where))
            continue
        if key in OWNED_ELSEWHERE:
            problems.append(_problem(where, "%s is kept by %s" % (key, OWNED_ELSEWHERE[key]),
                                     "each key kept by one variable only",
                                     "remove %s from kernel_debug_extra_sysctls and set %s instead"
                                     % (key, OWNED_ELSEWHERE[key])))
            continue
        value = str(item["value"])
        if not value.strip() or "\n" in value.strip():
            problems.append(_problem(where, "value %r for %s" % (value, key), "one non-empty line",
                                     "set the value of %s to what /proc/sys/%s takes" % (key, key.replace(".", "/"))))
        dropin = str(item["dropin"])
        problem = search_ok and sysctl.dropin_problem(dropin, search)
        if problem:
            problems.append(_problem(where, problem, "a drop-in of its own in a sysctl.d directory",
                                     "set the dropin of %s to e.g. /etc/sysctl.d/60-preflight-%s.conf"
                                     % (where, key.split(".")[-1].replace("_", "-"))))
        elif os.path.normpath(dropin) in dropins:
            problems.append(_problem(where, "drop-in %s is also used by %s" % (dropin, dropins[os.path.normpath(dropin)]),
                                     "a drop-in per key (each drop-in holds only its key)",
                                     "give %s a drop-in of its own" % where))
        else:
            dropins[os.path.normpath(dropin)] = where
        check_name = _extra_check_name(item)
        if not NAME_RE.match(check_name):
            problems.append(_problem(where, "check name %r (from %s)" % (
                check_name, "check_name" if item.get("check_name") else "the key's last component"),
                "lower-case words joined by underscores", "set check_name of %s, e.g. panic_on_oops" % where))
            continue
        clash = [check_name + suffix for suffix in SUFFIXES if check_name + suffix in taken]
        if clash:
            problems.append(_problem(where, "check name %s is taken by %s" % (clash[0], taken[clash[0]]),
                                     "a check name of its own", "set check_name of %s to a name of its own" % where))
        for suffix in SUFFIXES:
            taken.setdefault(check_name + suffix, key)
    timeout = settings["kernel_debug_task_timeout"]
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
        problems.append(_problem("kernel_debug_task_timeout", timeout, "a positive number of seconds",
                                 "set kernel_debug_task_timeout to e.g. 60"))
    if settings["kernel_debug_drift_policy"] not in ("warn", "fail"):
        problems.append(_problem("kernel_debug_drift_policy", settings["kernel_debug_drift_policy"], "warn or fail",
                                 "set kernel_debug_drift_policy to warn or fail"))
    return problems


def read_args(settings, node):
    """What ``read`` needs on ``node``; None when there is nothing to read
    (ptrace_scope switched off and no extra sysctls)."""
    items = wanted(settings)
    if not items:
        return None
    return {
        "root": settings["kernel_debug_sysctl_root"],
        "proc_root": settings["kernel_debug_proc_root"],
        "sysctl_dirs": list(settings["kernel_debug_sysctl_dirs"]),
        "settings": [{"check_name": item["check_name"], "key": item["key"], "dropin": item["dropin"]}
                     for item in items],
    }


def read(args, ops):
    """Each setting's running value, drop-in and boot order (pure reads)."""
    return {"settings": {
        item["check_name"]: sysctl.read_setting(args["root"], args["proc_root"], item["key"], item["dropin"],
                                                args["sysctl_dirs"])
        for item in args["settings"]}}


def decide(host, facts, settings, probe=None, cluster=None):
    """``{name: check}``: ``ptrace_scope``, ``ptrace_scope_persisted``,
    ``ptrace_scope_boot`` (only ``ptrace_scope``: skipped when switched off,
    not_applicable without Yama) and the same three for each extra sysctl,
    named by its ``check_name``."""
    policy = settings["kernel_debug_drift_policy"]
    checks = {}
    if not switched_on(settings["kernel_debug_ptrace_scope_enabled"]):
        checks[PTRACE] = skipped(
            "not managed: kernel_debug_ptrace_scope_enabled is false (the default; ptrace_scope 0 is a security "
            "relaxation you opt in to)",
            "kernel.yama.ptrace_scope = %s once kernel_debug_ptrace_scope_enabled is true"
            % settings["kernel_debug_ptrace_scope"])
    read_settings = (facts or {}).get("settings") or {}
    for item in wanted(settings):
        name = item["check_name"]
        if name not in read_settings:
            checks[name] = failed("the kernel_debug reader returned no facts for %s" % item["key"],
                                  "%s read on the node" % item["key"],
                                  "see kernel_debug.error for this node, fix what it names and run the preflight "
                                  "again")
            continue
        checks.update(sysctl.decide_setting(read_settings[name], item["value"], policy, name))
    if host:
        for result in checks.values():
            if result["status"] in ("warn", "fail"):
                result["fix"] = "on %s: %s" % (host, result["fix"])
    return checks
