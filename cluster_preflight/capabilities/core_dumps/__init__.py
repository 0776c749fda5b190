# -*- coding: utf-8 -*-
"""Capability ``core_dumps``, the controller half: validate the inputs, the node call arguments and the checks.

The reader and the crash probe (``read``, ``probe``) are the node half,
``module_utils/preflight_node/capabilities/core_dumps.py``; the role ``roles/core_dumps`` holds the variables and the
bring-up writers.  Here: ``validate`` (controller), ``read_args`` / ``probe_args`` (what the node calls
get), ``decide`` (pure: facts and probe result -> checks) and ``probe_check`` (the crash probe's
result -> the ``core_probe`` check); ``decide`` judges the pattern and the limits with
the same deciders the writers use (``module_utils/preflight_node/sysctl/write.py``,
``module_utils/preflight_node/limits/write.py``).
"""

from __future__ import annotations

from typing import Optional

import os
import re


from preflight_node.cores import pattern as corepattern
from preflight_node.limits import session as limits
from preflight_node.limits import write as limits_write
from preflight_node.sysctl import values as sysctl
from preflight_node.sysctl import write as sysctl_write
from preflight_node.checks import blocked, check, failed, not_applicable, passed, skipped, warned
from preflight_node.capabilities import core_dumps as node_half
from preflight_node.capabilities.core_dumps_probe import PROBE
from preflight_node.privilege import BECOME_FIX, assumed, block_refused, needs_root

from ..common import Args, Checks, Facts, Node, Problems, Settings, switched_on

CAPABILITY = node_half.CAPABILITY

# Check names (the verdict prefixes them with ``core_dumps.``); PROBE is the node half's.
ENABLED = "enabled"  # the one check when core_dumps_enabled is false
PATTERN = "core_pattern"
CORE_DIR = "core_dir"
LIMITS = "core_limits"
SESSION = "core_limits_session"

LIMIT_TYPES = ("soft", "hard")
EXAMPLE_PATTERN = "/tmp/core-%e.%p.%h.%t"
_MODE = re.compile(r"^0?[0-7]{3,4}$")
_NAME = re.compile(r"^[^\s:/]+$")


# ---------------------------------------------------------------------------------------------
# validate (controller)


def _problem(name, found, expected, fix):
    return {"name": name, "found": str(found), "expected": str(expected), "fix": str(fix)}


def _absolute_path_problem(settings, name):
    value = settings[name]
    if not isinstance(value, str) or not value.startswith("/"):
        return _problem(name, value, "an absolute path", "set %s to an absolute path such as /" % name)
    return None


def validate(settings: Settings) -> Problems:
    """Problems with the core_dumps inputs (beyond types and choices), each
    ``{name, found, expected, fix}``."""
    pattern = str(settings["core_dumps_pattern"])
    return (_pattern_problems(pattern) + _dir_problems(settings, pattern) + _dropin_problems(settings)
            + _probe_and_path_problems(settings))


def _pattern_problems(pattern):
    problems = []
    if corepattern.is_pipe(pattern):
        dest = corepattern.destination(pattern)
        problems.append(_problem(
            "core_dumps_pattern",
            "%r pipes cores to a program (%s): %s, out of a job user's reach" % (
                pattern, dest["program"] or "?", dest["where"]),
            "a file pattern (core(5)) such as %s" % EXAMPLE_PATTERN,
            "set core_dumps_pattern to a path such as %s" % EXAMPLE_PATTERN))
    else:
        for error in corepattern.validate_desired(pattern):
            problems.append(_problem("core_dumps_pattern", error, "one non-empty line of at most %d bytes"
                                     % corepattern.MAX_PATTERN_LENGTH,
                                     "set core_dumps_pattern to a path such as %s" % EXAMPLE_PATTERN))
        if corepattern.dir_has_specifier(pattern):
            problems.append(_problem(
                "core_dumps_pattern",
                "%r has a specifier in its directory part (%s); the kernel does not create directories, so "
                "the directory would not exist for most processes" % (pattern, corepattern.pattern_dir(pattern)),
                "specifiers in the file name only",
                "move the specifiers into the file name, e.g. /var/cores/core-%u.%e.%p.%t"))
    return problems


def _dir_problems(settings, pattern):
    """The core directory (it must be the pattern's) and its mode, owner and group."""
    problems = []
    core_dir = settings["core_dumps_dir"]
    core_dir = "" if core_dir is None else str(core_dir)
    if "%" in core_dir:
        problems.append(_problem(
            "core_dumps_dir",
            "%r has a core_pattern specifier in it; the kernel does not create directories, so this role "
            "cannot make it exist for every process" % core_dir,
            "a fixed directory",
            "keep specifiers in the file name only, e.g. core_dumps_pattern /var/cores/core-%u.%e.%p.%t"))
    elif core_dir and not core_dir.startswith("/"):
        problems.append(_problem("core_dumps_dir", core_dir, "an absolute directory, or empty for a relative "
                                 "core_dumps_pattern", "set core_dumps_dir to the directory of core_dumps_pattern"))
    elif not corepattern.is_pipe(pattern) and not corepattern.dir_has_specifier(pattern):
        wanted = os.path.normpath(corepattern.pattern_dir(pattern)) if pattern.startswith("/") else ""
        have = os.path.normpath(core_dir) if core_dir else ""
        if have != wanted:
            problems.append(_problem(
                "core_dumps_dir",
                "%r while core_dumps_pattern %r writes cores %s" % (
                    core_dir, pattern, "into %s" % wanted if wanted else "relative to each process's working "
                                                                          "directory"),
                "the directory of core_dumps_pattern (%s)" % (wanted or "empty for a relative pattern"),
                "set core_dumps_dir to %r, or leave it at its default (the pattern's dirname)" % wanted))

    mode = str(settings["core_dumps_dir_mode"])
    if not _MODE.match(mode):
        problems.append(_problem("core_dumps_dir_mode", mode, "an octal mode such as 1777",
                                 "set core_dumps_dir_mode to an octal string, e.g. \"1777\""))
    for name in ("core_dumps_dir_owner", "core_dumps_dir_group"):
        if not _NAME.match(str(settings[name] or "")):
            problems.append(_problem(name, settings[name], "a user or group name such as root",
                                     "set %s to a name without spaces, ':' or '/'" % name))
    return problems


def _dropin_problems(settings):
    """The sysctl drop-in and the limits (domains, value, drop-in)."""
    problems = []
    problem = sysctl_write.dropin_problem(settings["core_dumps_sysctl_dropin"], sysctl.DEFAULT_SYSCTL_DIRS)
    if problem:
        problems.append(_problem("core_dumps_sysctl_dropin", problem, "a *.conf file of its own in a sysctl.d "
                                 "directory", "set core_dumps_sysctl_dropin to a file of its own such as "
                                 "/etc/sysctl.d/60-preflight-core.conf"))

    domains = [str(domain).strip() for domain in settings["core_dumps_limits_domains"] or []]
    value = str(settings["core_dumps_limits_value"]).strip().lower()
    for error in limits_write.validate(domains, list(LIMIT_TYPES), "core", value):
        name = "core_dumps_limits_value" if error.startswith("value") else "core_dumps_limits_domains"
        problems.append(_problem(name, error, "limits.conf(5) domains (*, root, @group, a user) and a value "
                                 "(unlimited or a size in KiB)", "correct %s (%s)" % (name, limits_write.MAN)))
    problem = limits_write.path_problem(settings["core_dumps_limits_dropin"])
    if problem:
        problems.append(_problem("core_dumps_limits_dropin", problem, "a *.conf file of its own in %s"
                                 % limits.LIMITS_DIR, "set core_dumps_limits_dropin to a file of its own such as "
                                 "/etc/security/limits.d/90-preflight-core.conf"))
    return problems


def _probe_and_path_problems(settings):
    """The probe's and the task's timeouts, the probe user, the roots and the drift policy."""
    problems = []
    timeout = settings["core_dumps_probe_timeout"]
    try:
        timeout_ok = not isinstance(timeout, bool) and float(timeout) > 0
    except (TypeError, ValueError):
        timeout_ok = False
    if not timeout_ok:
        problems.append(_problem("core_dumps_probe_timeout", timeout, "a positive number of seconds",
                                 "set core_dumps_probe_timeout to e.g. 10"))
    task_timeout = settings["core_dumps_task_timeout"]
    if isinstance(task_timeout, bool) or not isinstance(task_timeout, int) or task_timeout < 1:
        problems.append(_problem("core_dumps_task_timeout", task_timeout, "a positive number of seconds",
                                 "set core_dumps_task_timeout to e.g. 60"))
    user = settings["core_dumps_probe_user"]
    if user not in (None, "") and not _NAME.match(str(user)):
        problems.append(_problem("core_dumps_probe_user", user, "a user name or uid, or empty for the connecting "
                                 "user", "set core_dumps_probe_user to a job user such as nobody"))

    for name in ("core_dumps_root", "core_dumps_proc_root"):
        problem = _absolute_path_problem(settings, name)
        if problem:
            problems.append(problem)
    if settings["core_dumps_drift_policy"] not in ("warn", "fail"):
        problems.append(_problem("core_dumps_drift_policy", settings["core_dumps_drift_policy"], "warn or fail",
                                 "set core_dumps_drift_policy to warn or fail"))
    return problems


# ---------------------------------------------------------------------------------------------
# node call arguments (controller)

def _limit_entries(settings):
    return limits_write.entries_for(settings["core_dumps_limits_domains"], LIMIT_TYPES, "core",
                              settings["core_dumps_limits_value"])


def read_args(settings: Settings, node: Node) -> Args:
    """What ``read`` needs on ``node``; None when core_dumps_enabled is false."""
    if not switched_on(settings["core_dumps_enabled"]):
        return None
    return {
        "root": settings["core_dumps_root"],
        "proc_root": settings["core_dumps_proc_root"],
        "sysctl_dirs": list(sysctl.DEFAULT_SYSCTL_DIRS),
        "dropin": settings["core_dumps_sysctl_dropin"],
        "core_dir": settings["core_dumps_dir"] or "",
        "limits": {"path": settings["core_dumps_limits_dropin"], "limits_conf": limits.LIMITS_CONF,
                   "limits_dir": limits.LIMITS_DIR, "pam_dir": limits.PAM_DIR}
        if switched_on(settings["core_dumps_limits_enabled"]) else None,
    }


def probe_args(settings: Settings, node: Node, plan: Optional[dict] = None) -> Args:
    """What ``probe`` needs; None when core dumps or the probe are switched off."""
    if not switched_on(settings["core_dumps_enabled"]) or not switched_on(settings["core_dumps_probe_enabled"]):
        return None
    return {
        # The probe crashes a real process, so procfs is read as it is (not under core_dumps_root).
        "proc_root": settings["core_dumps_proc_root"],
        "timeout": float(settings["core_dumps_probe_timeout"]),
        "run_as": str(settings["core_dumps_probe_user"] or ""),
        "core_pattern": None,
        "core_uses_pid": None,
        "pipe_probe": False,
    }


# ---------------------------------------------------------------------------------------------
# decide (controller, pure)

def _on_node(host, checks):
    """Name the node in every warn/fail, so a fix read out of context says where to apply it."""
    if host:
        for result in checks.values():
            if result["status"] in ("warn", "fail") and not result["fix"].startswith("on %s:" % host):
                result["fix"] = "on %s: %s" % (host, result["fix"])
    return checks


def _no_facts(what):
    return failed("the core_dumps reader returned no %s" % what, "the %s read on the node" % what,
                  "see core_dumps.error for this node, fix what it names and run the preflight again")


def _dir_check(facts, settings, policy):
    core_dir = settings["core_dumps_dir"] or ""
    pattern = settings["core_dumps_pattern"]
    if not core_dir:
        return not_applicable("core_pattern %s is relative: each process writes its core into its own working "
                              "directory" % pattern, "no core directory to manage")
    mode, owner, group = str(settings["core_dumps_dir_mode"]), settings["core_dumps_dir_owner"], \
        settings["core_dumps_dir_group"]
    expected = "%s a directory with mode %s, owner %s, group %s" % (core_dir, mode, owner, group)
    fix = ("run the node bring-up (role core_dumps), or: mkdir -p %s && chmod %s %s && chown %s:%s %s"
           % (core_dir, mode, core_dir, owner, group, core_dir))
    facts = facts or {}
    if facts.get("error"):
        return check(policy, facts["error"], expected, fix)
    if not facts.get("exists"):
        return check(policy, "%s does not exist" % core_dir, expected, fix)
    if not facts.get("is_dir"):
        return check(policy, "%s is not a directory" % core_dir, expected, fix)
    have_owner = facts.get("owner") or str(facts.get("uid"))
    have_group = facts.get("group") or str(facts.get("gid"))
    found = "%s is a directory with mode %s, owner %s, group %s" % (core_dir, facts["mode"], have_owner, have_group)
    same = (int(facts["mode"], 8) == int(mode, 8) & 0o7777
            and owner in (facts.get("owner"), str(facts.get("uid")))
            and group in (facts.get("group"), str(facts.get("gid"))))
    return passed(found, expected) if same else check(policy, found, expected, fix)


def session_check(session, settings, policy):
    """``core_limits_session``: ``ulimit -c`` in the job user's login session, as a job will start."""
    wanted = str(settings["core_dumps_limits_value"])
    expected = "ulimit -c %s in a login session of the job user %s" % (wanted, session.get("user"))
    if session.get("not_run"):
        return blocked("not checked: %s" % session["error"], expected,
                       "see allreduce.job_user: name the job's account in preflight_job_user")
    if session.get("error"):
        return warned(session["error"], expected, "install util-linux (runuser), or check the job user's "
                      "login with: runuser -l %s -s /bin/sh -c 'ulimit -c'" % session.get("user"))
    found = "ulimit -c is %s (hard %s) in %s" % (session["soft"], session["hard"], session["how"])
    if limits_write.normalize_value(session["soft"]) == limits_write.normalize_value(wanted):
        return passed(found, expected)
    hard_blocks = session["hard"] != "unlimited" and limits_write.normalize_value(wanted) == "unlimited"
    fix = ("run bringup.yml (it writes %s), then start a new login session: limits apply at login, and a "
           "job's core dumps need the soft limit raised%s" % (
               settings["core_dumps_limits_dropin"],
               "; the hard limit %s caps it too" % session["hard"] if hard_blocks else
               "; or raise it in the job script with ulimit -c unlimited"))
    return (failed if policy == "fail" else warned)(found, expected, fix)


def decide(host: str, facts: Facts, settings: Settings, probe: Optional[dict] = None,
           cluster: Optional[dict] = None) -> Checks:
    """``{name: check}`` for core dumps on ``host``: ``core_pattern``,
    ``core_pattern_persisted``, ``core_pattern_boot``, ``core_pattern_pid``,
    ``core_dir``, ``core_limits``, ``core_limits_conflicts``, ``core_limits_pam``,
    ``core_probe``; with core dumps switched off only ``enabled`` (skipped)."""
    if not switched_on(settings["core_dumps_enabled"]):
        return {ENABLED: skipped("core_dumps_enabled is false on %s: core dumps are not checked" % host,
                                 "core pattern, directory, limits and crash probe checked once core_dumps_enabled "
                                 "is true")}
    policy = settings["core_dumps_drift_policy"]
    pattern = str(settings["core_dumps_pattern"])
    checks = {}
    if facts is None:
        checks[PATTERN] = _no_facts("kernel.core_pattern facts")
        checks[CORE_DIR] = _no_facts("core directory facts")
    else:
        checks.update(sysctl_write.decide_setting(facts["core_pattern"], pattern, policy, PATTERN))
        checks[CORE_DIR] = _dir_check(facts.get("core_dir"), settings, policy)

    if not switched_on(settings["core_dumps_limits_enabled"]):
        checks[LIMITS] = skipped("core_dumps_limits_enabled is false",
                                 "core limits managed once core_dumps_limits_enabled is true")
    elif facts is None or facts.get("limits") is None:
        checks[LIMITS] = _no_facts("limits facts")
    else:
        checks.update(limits_write.decide_limits(facts["limits"], _limit_entries(settings), policy, LIMITS))
        if facts.get("session") is not None:
            checks[SESSION] = session_check(facts["session"], settings, policy)
    checks = block_refused(checks, (facts or {}).get("needs_root"))

    if not switched_on(settings["core_dumps_probe_enabled"]):
        checks[PROBE] = skipped("core_dumps_probe_enabled is false",
                                "a crash probe once core_dumps_probe_enabled is true")
    elif probe is None:
        checks[PROBE] = skipped("no probe result for this run: the crash probe runs in the probe stage of "
                                "preflight.yml", "a core file from a crashed child")
    else:
        checks[PROBE] = probe_check(probe)
    return _on_node(host, checks)


def probe_check(result):
    """The ``core_probe`` check for a :func:`preflight_node.capabilities.core_dumps.probe` result.  A child that could
    not run as the user it
    should (no root to switch) proves nothing for that user: a core found is a warning naming who crashed
    instead, a core missing is blocked (``needs root``)."""
    checked = _probe_outcome(result)
    lacking = result.get("needs_root")
    if not lacking:
        return checked
    instead = "the child ran as %s, not as %s: switching users needs root" % (result.get("who"), lacking)
    if checked["status"] == "pass":
        return assumed(checked, instead, BECOME_FIX)
    if result.get("outcome") in ("no_dump", "not_found", "start_failed"):
        return needs_root("%s; %s" % (checked["found"], instead), checked["expected"])
    return checked


def _probe_outcome(result):
    outcome = result.get("outcome")
    pattern = result.get("core_pattern")
    note = " (%s)" % result["note"] if result.get("note") else ""
    expected = "a core file (WCOREDUMP set in the wait status)"
    if result.get("expected_path"):
        expected = "a core file matching %s" % result["expected_path"]
    if outcome == "found":
        found = "%s written by a child running as %s (WCOREDUMP %s) and removed%s" % (
            result["core_file"], result["who"], "set" if result["wcoredump"] else "not set", note)
        return passed(found, expected, core_file=result["core_file"], removed=result["core_removed"])
    if outcome in ("pipe", "pipe_dumped"):
        dest = result["destination"]
        reason = ("kernel.core_pattern %s pipes cores to a helper, so there is no core file to look for: %s. "
                  "To get plain core files instead: %s" % (pattern, dest["where"], dest["override"]))
        if outcome == "pipe_dumped":
            reason = "the kernel handed a dump to the pipe helper (WCOREDUMP set); " + reason
        return not_applicable(reason, "a core file written by the kernel")
    if outcome == "pipe_not_dumped":
        return failed("the kernel did not dump the child (no WCOREDUMP) with pipe pattern %s" % pattern,
                      expected, result["destination"]["override"])
    if outcome == "unreadable":
        return failed("kernel.core_pattern is unknown: %s" % result["error"], "a readable kernel.core_pattern",
                      "check that procfs is mounted at the probe's proc_root (core_dumps_proc_root)")
    if outcome == "empty_pattern":
        return failed("kernel.core_pattern is empty: the kernel writes no core file", "a core file pattern",
                      corepattern.OVERRIDE_HINT)
    if outcome == "no_job_user":
        return blocked("not checked: %s" % result.get("error"), "a crash as the job user leaves a core file",
                       "see allreduce.job_user: name the job's account in preflight_job_user, or set "
                       "core_dumps_probe_user to an account every node has")
    if outcome == "user_missing":
        return failed("the probe user %s does not exist on this node, so no child was crashed" % result["run_as"],
                      "a crash as the job user %s leaves a core file" % result["run_as"],
                      "create the user, or set core_dumps_probe_user to a user every node has (empty: the "
                      "connecting user)")
    if outcome == "hard_limit_zero":
        return failed("the hard core limit of this session is 0, so no process started from it can dump core",
                      "a hard core limit above 0 (unlimited)",
                      "raise it in /etc/security/limits.d (limits_dropin module: '* hard core unlimited') and log "
                      "in again")
    if outcome == "no_sleep":
        return failed("no sleep program on the search path: nothing to crash", "sleep (coreutils) installed",
                      "install coreutils")
    if outcome == "start_failed":
        return failed(result["error"], "a child the probe can crash", "check that %s may run programs (a noexec "
                      "or full /tmp, a missing home, limits on processes)" % result["who"])
    if outcome == "timeout":
        return failed("the child did not exit within %ss of SIGSEGV" % result["timeout"],
                      "the child dumps core and exits",
                      "check for a slow or full file system under the core directory, or a stuck pipe helper; "
                      "raise core_dumps_probe_timeout if the node is just slow")
    core_dir = result.get("core_dir") or "?"
    who = result.get("who") or "?"
    if outcome == "no_dump":
        if not result.get("core_dir_exists"):
            found = "the core directory %s does not exist (the kernel does not create it)" % core_dir
            fix = "mkdir -p %s && chmod 1777 %s (the core_dumps role does this)" % (core_dir, core_dir)
        elif not result.get("core_dir_writable"):
            found = "%s (mode %s) is not writable by %s" % (core_dir, result.get("core_dir_mode"), who)
            fix = ("chmod 1777 %s so every job user can write cores there (the core_dumps role does this)"
                   % core_dir)
        else:
            found = "%s exists and is writable by %s; fs.suid_dumpable is %s" % (
                core_dir, who, result.get("suid_dumpable") or "unknown")
            fix = ("check free space and RLIMIT_FSIZE under %s, that the file system allows writes, and dmesg "
                   "for 'core dump' messages" % core_dir)
        found = "no core file: the kernel did not dump the child (no WCOREDUMP in the wait status); " + found
        return failed(found + note, expected, fix)
    if outcome == "not_found":
        found = ("the kernel reports a core dump (WCOREDUMP) but no file matches %s; %s holds: %s" % (
            result["expected_path"], core_dir, ", ".join(result.get("core_dir_listing") or []) or "nothing"))
        return failed(found + note, expected,
                      "compare kernel.core_pattern with what the node really writes (a second sysctl writer, a "
                      "cleaner removing cores, or a file system that hides them)")
    return failed("the probe gave no known outcome (%r)" % (outcome,), "an outcome of the core probe",
                  "this is a defect of the preflight itself: report it with the verdict file")
