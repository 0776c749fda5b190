# -*- coding: utf-8 -*-
"""Capability ``kernel_debug``, the controller half: validate the inputs, the node call arguments and the checks.

The reader (``kernel.yama.ptrace_scope`` and any ``kernel_debug_extra_sysctls``, each now, in its drop-in
and at the next boot) and the ptrace attach probe are the node half,
``module_utils/preflight_node/capabilities/kernel_debug.py``; the role ``roles/kernel_debug`` holds the variables and
the bring-up writer tasks (``sysctl_setting``), which decide with the same function as ``decide`` here
(``decide_setting`` in ``module_utils/preflight_node/sysctl/write.py``).
"""

from __future__ import annotations

from typing import Optional

import os


from preflight_node.capabilities import kernel_debug as node_half
from preflight_node.sysctl import values as sysctl
from preflight_node.sysctl import write as sysctl_write
from preflight_node.checks import NAME_RE, blocked, failed, passed, skipped
from preflight_node.privilege import block_refused, needs_root

from ..common import Args, Checks, Facts, Node, Problems, Settings, switched_on

CAPABILITY = node_half.CAPABILITY
PTRACE = "ptrace_scope"
SUFFIXES = ("", "_persisted", "_boot")
# Keys another variable owns: a second writer of the same key would fight it.
OWNED_ELSEWHERE = {
    sysctl.PTRACE_SCOPE: "kernel_debug_ptrace_scope",
    sysctl.CORE_PATTERN: "core_dumps_pattern (role core_dumps)",
}
PTRACE_SCOPES = (0, 1, 2, 3)
ATTACH = "ptrace_attach"



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


def validate(settings: Settings) -> Problems:
    """Problems with the kernel_debug inputs (beyond types and choices), each
    ``{name, found, expected, fix}``."""
    problems = []
    search = settings["kernel_debug_sysctl_dirs"] or []
    # Drop-ins are judged against the search list only when the list itself is sound: one root cause, one problem.
    search_ok = False
    if not search or not all(isinstance(entry, str) and entry.startswith("/") for entry in search):
        problems.append(_problem("kernel_debug_sysctl_dirs", search, "a list of absolute sysctl.d directories "
                                 "(and plain *.conf files)", "keep the default list, or list absolute paths only"))
    elif not sysctl_write.search_dirs(search):
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
    problem = search_ok and sysctl_write.dropin_problem(settings["kernel_debug_ptrace_scope_dropin"], search)
    if problem:
        problems.append(_problem("kernel_debug_ptrace_scope_dropin", problem,
                                 "a *.conf file of its own in a directory of kernel_debug_sysctl_dirs",
                                 "set kernel_debug_ptrace_scope_dropin to a file of its own such as "
                                 "/etc/sysctl.d/60-preflight-ptrace.conf"))
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
        problems += _extra_problems(item, "kernel_debug_extra_sysctls[%d]" % index, search, search_ok, dropins,
                                    taken)
    timeout = settings["kernel_debug_task_timeout"]
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
        problems.append(_problem("kernel_debug_task_timeout", timeout, "a positive number of seconds",
                                 "set kernel_debug_task_timeout to e.g. 60"))
    if settings["kernel_debug_drift_policy"] not in ("warn", "fail"):
        problems.append(_problem("kernel_debug_drift_policy", settings["kernel_debug_drift_policy"], "warn or fail",
                                 "set kernel_debug_drift_policy to warn or fail"))
    return problems


def _extra_problems(item, where, search, search_ok, dropins, taken):
    """Problems with one entry of kernel_debug_extra_sysctls; records its drop-in in ``dropins`` and its
    check names in ``taken`` (drop-in -> and check name -> who has it)."""
    problems = []
    if not isinstance(item, dict) or not all(item.get(field) not in (None, "") for field in ("name", "dropin")) \
            or item.get("value") is None:
        problems.append(_problem(where, item, "a dict with name, value and dropin (check_name optional)",
                                 "give %s a name, a value and a drop-in of its own" % where))
        return problems
    key = sysctl.normalize_key(str(item["name"]))
    problem = sysctl_write.key_problem(key)
    if problem:
        problems.append(_problem(where, problem, "a sysctl key such as kernel.panic_on_oops",
                                 "correct the name of %s" % where))
        return problems
    if key in OWNED_ELSEWHERE:
        problems.append(_problem(where, "%s is kept by %s" % (key, OWNED_ELSEWHERE[key]),
                                 "each key kept by one variable only",
                                 "remove %s from kernel_debug_extra_sysctls and set %s instead"
                                 % (key, OWNED_ELSEWHERE[key])))
        return problems
    value = str(item["value"])
    if not value.strip() or "\n" in value.strip():
        problems.append(_problem(where, "value %r for %s" % (value, key), "one non-empty line",
                                 "set the value of %s to what /proc/sys/%s takes" % (key, key.replace(".", "/"))))
    dropin = str(item["dropin"])
    problem = search_ok and sysctl_write.dropin_problem(dropin, search)
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
        return problems
    clash = [check_name + suffix for suffix in SUFFIXES if check_name + suffix in taken]
    if clash:
        problems.append(_problem(where, "check name %s is taken by %s" % (clash[0], taken[clash[0]]),
                                 "a check name of its own", "set check_name of %s to a name of its own" % where))
    for suffix in SUFFIXES:
        taken.setdefault(check_name + suffix, key)
    return problems


def read_args(settings: Settings, node: Node) -> Args:
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


def probe_args(settings: Settings, node: Node, plan: Optional[dict] = None) -> Args:
    """What ``probe`` needs; None when the ptrace probe is switched off."""
    if not switched_on(settings["kernel_debug_ptrace_probe_enabled"]):
        return None
    return {"proc_root": settings["kernel_debug_proc_root"],
            "timeout": float(settings["kernel_debug_ptrace_probe_timeout"])}


def attach_check(host, probe_result):
    """``ptrace_attach``: whether the job user can attach py-spy/gdb to its own ranks without sudo."""
    expected = "the job user attaches py-spy or gdb to its own processes without sudo (the seeds' hang stacks)"
    scope = probe_result.get("yama_scope")
    yama = "no Yama LSM" if scope is None else "kernel.yama.ptrace_scope = %d" % scope
    who = "%s (uid %s)" % (probe_result.get("user"), probe_result.get("uid"))
    hang = probe_result.get("python_hang")
    if probe_result.get("unswitched"):
        return needs_root("the ptrace probe ran as %s, not as the job user %s (switching users needs root); %s" % (
            probe_result.get("user"), probe_result["unswitched"], "its answer proves nothing of the job user's view"),
            expected)
    if probe_result.get("not_run"):
        return blocked("not checked: %s" % probe_result["not_run"], expected,
                       "see allreduce.job_user on %s: name the job's account in preflight_job_user" % host)
    if probe_result.get("python_blocked"):
        return blocked("not checked: %s cannot run the training Python %s (allreduce.python)" % (
            probe_result.get("user"), probe_result.get("python")), expected,
            "see allreduce.python on %s: let the job user reach its training Python, then re-run" % host)
    if hang and hang.get("earlier"):
        return blocked("not checked: %s hung for %g s earlier (allreduce.python)" % (
            probe_result.get("python"), hang.get("seconds") or 0), expected,
            "fix allreduce.python on %s (the training Python must start), then re-run" % host)
    if hang:
        return failed("the training Python %s hung running the ptrace probe as %s on %s: no answer in %g s "
                      "(killed)" % (probe_result.get("python"), hang.get("user"), host, hang.get("seconds") or 0),
                      expected, "see allreduce.python on %s: find where %s waits at start-up (py-spy dump --pid), "
                      "or set preflight_training_python to an environment that starts"
                      % (host, probe_result.get("python")))
    if probe_result.get("attached") is None:
        return failed(probe_result.get("error") or "the ptrace probe gave no answer", expected,
                      "make the training Python runnable by %s, or set kernel_debug_ptrace_probe_enabled=false"
                      % probe_result.get("user"))
    if probe_result["attached"]:
        return passed("%s attached with ptrace to its own process that is not its child; %s" % (who, yama), expected)
    found = "%s cannot ptrace its own process that is not its child (%s: %s); %s" % (
        who, probe_result.get("errno"), probe_result.get("error"), yama)
    if scope == 3:
        fix = ("ptrace_scope 3 cannot be lowered until a reboot: set kernel_debug_ptrace_scope=0 and "
               "kernel_debug_ptrace_scope_enabled=true, run bringup.yml and reboot; until then take stacks with "
               "faulthandler (SIGUSR1) instead of py-spy")
    elif scope in (1, 2):
        fix = ("set kernel_debug_ptrace_scope_enabled=true (ptrace_scope 0, a documented relaxation) and run "
               "bringup.yml, or give py-spy CAP_SYS_PTRACE (setcap cap_sys_ptrace+ep on the py-spy binary)")
    else:
        fix = ("another LSM forbids ptrace (SELinux deny_ptrace: getsebool deny_ptrace; AppArmor; a container "
               "without CAP_SYS_PTRACE / seccomp): allow ptrace for the job user there")
    return failed(found, expected, "on %s: %s" % (host, fix))


def decide(host: str, facts: Facts, settings: Settings, probe: Optional[dict] = None,
           cluster: Optional[dict] = None) -> Checks:
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
        checks.update(sysctl_write.decide_setting(read_settings[name], item["value"], policy, name))
    checks = block_refused(checks, (facts or {}).get("needs_root"))
    if host:
        for result in checks.values():
            if result["status"] in ("warn", "fail"):
                result["fix"] = "on %s: %s" % (host, result["fix"])
    if not switched_on(settings["kernel_debug_ptrace_probe_enabled"]):
        checks[ATTACH] = skipped("kernel_debug_ptrace_probe_enabled is false",
                                 "the job user attaches to its own process once the probe is switched on")
    elif probe is None:
        checks[ATTACH] = skipped("no probe result for this run: the ptrace probe runs in the probe stage",
                                 "the job user attaches to its own process")
    else:
        checks[ATTACH] = attach_check(host, probe)
    return checks
