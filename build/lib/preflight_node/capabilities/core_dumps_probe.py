# -*- coding: utf-8 -*-
"""Capability ``core_dumps``, the node half's probe (``module_utils/preflight_node/capabilities/core_dumps_probe.py``,
shipped
in the ``preflight_probes`` and ``preflight_local`` calls): ``probe`` crashes a throw-away child with SIGSEGV
and finds (and removes) its core.

``probe_check`` (controller, ``cluster_preflight/capabilities/core_dumps/``) turns its result into the
``core_probe`` check.  The reader (``read``: the pattern, the core directory, the core limits) is
``module_utils/preflight_node/capabilities/core_dumps.py``; where a pattern puts a core is
``module_utils/preflight_node/cores/pattern.py``.
"""

from __future__ import annotations

import grp
import os
import pwd
import resource
import shutil
import signal
import stat
import subprocess
import tempfile
import time

from ..cores import pattern as corepattern
from .core_dumps import who
from ..host.ops import NO_JOB_USER, job_refused

CAPABILITY = "core_dumps"

# The check of the crash probe (the verdict prefixes it with ``core_dumps.``).
PROBE = "core_probe"

# The initial PID namespace always has this inode number (PROC_PID_INIT_INO).
INITIAL_PID_NS = "pid:[4026531836]"


def _read(path):
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def _limit_text(value):
    return "unlimited" if value == resource.RLIM_INFINITY else str(value)


def _writable_by(path, uid, gid):
    """Whether ``uid``/``gid`` may create a file in directory ``path``."""
    try:
        info = os.stat(path)
    except OSError:
        return False
    if uid == 0:
        return os.access(path, os.W_OK)
    if info.st_uid == uid:
        return bool(info.st_mode & stat.S_IWUSR and info.st_mode & stat.S_IXUSR)
    groups = {gid}
    try:
        name = pwd.getpwuid(uid).pw_name
        groups.update(group.gr_gid for group in grp.getgrall() if name in group.gr_mem)
    except KeyError:
        pass
    if info.st_gid in groups:
        return bool(info.st_mode & stat.S_IWGRP and info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IWOTH and info.st_mode & stat.S_IXOTH)


def _status_pids(proc_root, pid):
    """NSpid of a process (outermost first) from its status file; None if unreadable."""
    text = _read(os.path.join(proc_root, str(pid), "status"))
    if not text:
        return None
    for line in text.splitlines():
        if line.startswith("NSpid:"):
            return [int(value) for value in line.split()[1:]]
    return None


def _in_initial_pid_ns(proc_root):
    try:
        return os.readlink(os.path.join(proc_root, "self", "ns", "pid")) == INITIAL_PID_NS
    except OSError:
        return False


def _wait(pid, timeout):
    """waitpid with a deadline; returns the raw status or None on timeout."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return status
        if time.monotonic() >= deadline:
            return None
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def probe(args, ops):
    """Crash a throw-away ``sleep`` with SIGSEGV and find (and remove) its core.

    ``args``: ``proc_root``, ``timeout`` (seconds), ``run_as`` (user name or
    uid; empty: this process's user), ``core_pattern`` / ``core_uses_pid``
    (None: the running values), ``pipe_probe`` (crash even for a pipe pattern).
    Returns JSON-safe facts; ``outcome`` is one of ``found``, ``not_found``
    (dumped, no file), ``no_dump``, ``timeout``, ``pipe``, ``pipe_dumped``,
    ``pipe_not_dumped``, ``empty_pattern``, ``unreadable``, ``user_missing``,
    ``hard_limit_zero``, ``no_sleep``, ``start_failed``; ``probe_check`` (controller)
    turns it into the ``core_probe`` check.  What a node lacks is an outcome,
    never an exception; nothing is left behind.
    """
    proc_root = args.get("proc_root") or "/proc"
    timeout = float(args.get("timeout") or 10.0)
    # core_dumps_probe_user, else the job user: the directory must be writable for the job, not for root.
    run_as = str(args.get("run_as") or "") or (getattr(ops, "job_user", None) or "")
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    result = {
        "outcome": None, "core_pattern": args.get("core_pattern"), "core_uses_pid": args.get("core_uses_pid"),
        "run_as": run_as, "who": None, "uid": None, "note": "", "timeout": timeout, "wcoredump": None,
        "child_pid": None, "expected_path": None, "core_file": None, "core_removed": None, "core_dir": None,
        "core_dir_exists": None, "core_dir_writable": None, "core_dir_mode": None, "core_dir_listing": None,
        "suid_dumpable": None, "destination": None, "error": None,
        "session_rlimit_core": {"soft": _limit_text(soft), "hard": _limit_text(hard)},
        "needs_root": _unswitched(run_as, ops),
    }
    if _pattern_outcome(result, args, proc_root):
        return result
    if run_as == NO_JOB_USER:
        # No account may run job-side code here (allreduce.job_user): the child is not crashed as root instead.
        result.update(outcome="no_job_user", run_as="", error=job_refused(ops))
        return result

    entry = None
    uid, gid = os.getuid(), os.getgid()
    if run_as:
        try:
            entry = pwd.getpwuid(int(run_as)) if run_as.isdigit() else pwd.getpwnam(run_as)
        except (KeyError, ValueError):
            result["outcome"] = "user_missing"
            return result
        if entry.pw_uid != os.getuid() and os.geteuid() != 0:
            # Without root the child can only be ourselves; say so instead of failing the audit.
            result["note"] = "ran as uid %d: run_as %s needs root" % (os.getuid(), run_as)
            result["needs_root"] = "%s (core_dumps_probe_user)" % run_as
            entry = None
        else:
            uid, gid = entry.pw_uid, entry.pw_gid
    result.update(uid=uid, who=entry.pw_name if entry is not None else who(uid))

    child_limit = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    if os.geteuid() != 0 and hard != resource.RLIM_INFINITY:
        child_limit = (hard, hard)
    if child_limit[0] == 0:
        result["outcome"] = "hard_limit_zero"
        return result
    sleep = ops.which("sleep")
    if not sleep:
        result["outcome"] = "no_sleep"
        return result

    workdir = tempfile.mkdtemp(prefix="core-probe-")
    try:
        if entry is not None:
            _hand_over(workdir, uid, gid)
        _crash(result, args, proc_root, timeout, sleep, workdir, uid, gid, entry, child_limit)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def _hand_over(path, uid, gid):
    """Give the directory root just made to the child's user, through its descriptor."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchown(fd, uid, gid)
    finally:
        os.close(fd)


def _pattern_outcome(result, args, proc_root):
    """Fill in the running pattern (and core_uses_pid) where ``args`` left them None; the outcome when
    the pattern alone ends the probe (unreadable, empty, a pipe not to be crashed into), else None."""
    if result["core_pattern"] is None:
        path = os.path.join(proc_root, "sys", "kernel", "core_pattern")
        text = _read(path)
        if text is None:
            result.update(outcome="unreadable", error="cannot read %s" % path)
            return result["outcome"]
        result["core_pattern"] = text.rstrip("\n")
    pattern = result["core_pattern"]
    if result["core_uses_pid"] is None:
        result["core_uses_pid"] = (_read(os.path.join(proc_root, "sys", "kernel", "core_uses_pid")) or "0").strip() == "1"
    if not pattern.strip():
        result["outcome"] = "empty_pattern"
        return result["outcome"]
    if corepattern.is_pipe(pattern):
        result["destination"] = corepattern.destination(pattern)
        if not args.get("pipe_probe"):
            result["outcome"] = "pipe"
            return result["outcome"]
    return None


def _unswitched(run_as, ops):
    """Who the child should run as but cannot (a job user other than this login, and no root to switch),
    or ""."""
    job = getattr(ops, "job", None) or {}
    return "%s (the job user)" % job.get("name") if not run_as and job.get("how") == "cannot_switch" else ""


def _start_child(sleep, workdir, uid, gid, entry, child_limit):
    def prepare():
        resource.setrlimit(resource.RLIMIT_CORE, child_limit)
        if entry is not None and uid != os.getuid():
            # The job user's own groups: they decide whether it may write the core directory.
            os.initgroups(entry.pw_name, gid)
            os.setgid(gid)
            os.setuid(uid)

    # A child that keeps running while we signal it needs Popen: a run that
    # returns only after the command has finished cannot crash it.  Fixed argv, no shell.
    return subprocess.Popen([sleep, "30"], cwd=workdir, preexec_fn=prepare, close_fds=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _crash(result, args, proc_root, timeout, sleep, workdir, uid, gid, entry, child_limit):
    pattern = result["core_pattern"]
    try:
        child = _start_child(sleep, workdir, uid, gid, entry, child_limit)
    except (OSError, subprocess.SubprocessError) as exc:
        result.update(outcome="start_failed", error="%s could not be started as %s: %s" % (
            sleep, result["who"], exc))
        return
    pid = child.pid
    result["child_pid"] = pid
    comm = (_read(os.path.join(proc_root, str(pid), "comm")) or os.path.basename(sleep)[:15]).strip()
    nspids = _status_pids(proc_root, pid)
    start = int(time.time())
    os.kill(pid, signal.SIGSEGV)
    status = _wait(pid, timeout)
    if status is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        child.returncode = -signal.SIGKILL
        result["outcome"] = "timeout"
        return
    child.returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    end = int(time.time()) + 1
    dumped = bool(os.WIFSIGNALED(status) and os.WCOREDUMP(status))
    result["wcoredump"] = dumped
    if corepattern.is_pipe(pattern):
        result["outcome"] = "pipe_dumped" if dumped else "pipe_not_dumped"
        return

    own_pid = nspids[-1] if nspids else pid
    global_pid = pid if _in_initial_pid_ns(proc_root) else None
    fields = {
        "p": own_pid, "i": own_pid, "P": global_pid, "I": global_pid,
        "u": uid, "g": gid, "s": int(signal.SIGSEGV), "h": os.uname().nodename,
        "e": comm[:15], "f": os.path.basename(os.path.realpath(sleep)),
        "E": os.path.realpath(sleep),
        "c": str(child_limit[0] if child_limit[0] != resource.RLIM_INFINITY else 2 ** 64 - 1),
        "d": None, "C": None, "t": None, "core_uses_pid": result["core_uses_pid"],
    }
    absolute, regexes, shown = corepattern.component_regexes(pattern, fields)
    result["expected_path"] = shown if absolute else os.path.join(workdir, shown)
    matches = corepattern.find_matches(workdir, absolute, regexes, time_window=(start - 1, end + 1))
    core_dir = os.path.dirname(result["expected_path"])
    result["core_dir"] = core_dir
    if matches:
        removed = True
        for path in matches:
            try:
                os.unlink(path)
            except OSError:
                removed = False
        result.update(outcome="found", core_file=matches[0], core_removed=removed)
        return
    result["outcome"] = "not_found" if dumped else "no_dump"
    result["core_dir_exists"] = os.path.isdir(core_dir)
    if result["core_dir_exists"]:
        result["core_dir_writable"] = _writable_by(core_dir, uid, gid)
        result["core_dir_mode"] = "%04o" % stat.S_IMODE(os.stat(core_dir).st_mode)
        try:
            result["core_dir_listing"] = sorted(os.listdir(core_dir))[:10]
        except OSError:
            result["core_dir_listing"] = []
    result["suid_dumpable"] = (_read(os.path.join(proc_root, "sys", "fs", "suid_dumpable")) or "").strip() or None

