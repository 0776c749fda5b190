#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Prove that a crashing process leaves a core file where kernel.core_pattern says."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: core_probe
short_description: Crash a throw-away child with SIGSEGV and find its core file
description:
  - "Starts C(sleep 30) with RLIMIT_CORE raised to unlimited (or to the hard limit when not root) in a
    fresh temporary working directory, kills it with SIGSEGV, waits for it (bounded by O(timeout)) and
    reads the wait status: C(WCOREDUMP) says whether the kernel dumped at all."
  - "Expands kernel.core_pattern the way the kernel does (C(%e) comm truncated to 15 characters, C(%p)
    and C(%i) the pid/tid in the child's PID namespace, C(%P) and C(%I) in the initial one, C(%h)
    hostname, C(%t) epoch seconds within the probe's time window, C(%u) C(%g) C(%s) C(%c) C(%d) C(%E)
    C(%f) C(%%); a relative pattern is relative to the child's working directory; without C(%p) and
    with kernel.core_uses_pid=1 the kernel appends .PID), finds the core file, removes it and reports
    pass or fail with found, expected and fix."
  - A pipe pattern (C(|program)) writes no file the probe could find; the probe then reports
    not_applicable with where the cores go (apport, systemd-coredump) and how to override it, without
    crashing anything unless O(pipe_probe) asks for it.
  - C(changed) is always false; the probe leaves nothing behind.
version_added: "1.0.0"
author: Cluster preflight maintainers
options:
  core_pattern:
    description: The pattern to expect. Defaults to the running C(<proc_root>/sys/kernel/core_pattern).
    type: str
  core_uses_pid:
    description: Whether the kernel appends .PID to a pattern without C(%p). Defaults to the running value.
    type: bool
  proc_root:
    description: Mount point of procfs.
    type: path
    default: /proc
  timeout:
    description: Seconds to wait for the child to die after SIGSEGV (writing a core takes a moment).
    type: float
    default: 10
  run_as:
    description:
      - User (name or uid) the child runs as, to prove a job user can write the core directory. Defaults
        to the user running the module.
      - Needs root; without root the child runs as the module's user and RV(note) says so.
    type: str
  pipe_probe:
    description:
      - With a pipe pattern, crash a child anyway and report whether the kernel handed a dump to the
        helper (C(WCOREDUMP)). The helper may keep a crash record (apport report, coredumpctl entry).
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description:
      - It is a probe, so it also runs in check mode. It starts one child process and kills it, and
        creates and removes one core file and one temporary directory. Nothing persists.
  diff_mode:
    support: none
notes:
  - Only the kernel side is proven (pattern, directory, dump permission); the limits a login session
    gets come from pam_limits (see the C(limits_dropin) module) and are returned as RV(session_rlimit_core)
    for the user the module runs as.
"""

EXAMPLES = r"""
- name: Prove that a crash leaves a core file.
  core_probe:
    timeout: 10
  check_mode: false
  register: core_probe_result

- name: Prove it for a job user.
  core_probe:
    run_as: nobody
"""

RETURN = r"""
checks:
  description: "C(core_probe): pass, fail (with fix) or not_applicable (pipe pattern, with where cores go)."
  returned: always
  type: dict
core_pattern:
  description: The pattern probed.
  returned: always
  type: str
wcoredump:
  description: Whether the wait status of the child had the core-dumped flag; null when no child was crashed.
  returned: always
  type: bool
expected_path:
  description: Where the core was expected, with <...> for the parts only known at dump time.
  returned: when the pattern is a file pattern
  type: str
core_file:
  description: The core file found (and removed).
  returned: when found
  type: str
core_removed:
  description: Whether the found core file was removed.
  returned: when found
  type: bool
destination:
  description: For a pipe pattern, the helper and where it keeps cores.
  returned: when the pattern is a pipe
  type: dict
session_rlimit_core:
  description: RLIMIT_CORE (soft, hard) of the module's own process, as the login session set it.
  returned: always
  type: dict
note:
  description: Why the child did not run as O(run_as), or empty.
  returned: always
  type: str
child_pid:
  description: The pid of the crashed child as seen by the module.
  returned: when a child was started
  type: int
"""

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

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_checks import failed, not_applicable, passed
from ansible.module_utils import preflight_corepattern as corepattern

# The initial PID namespace always has this inode number (PROC_PID_INIT_INO).
INITIAL_PID_NS = "pid:[4026531836]"
NAME = "core_probe"


def _read(path):
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def _limit_text(value):
    return "unlimited" if value == resource.RLIM_INFINITY else str(value)


def _resolve_user(module, run_as):
    """``(uid, gid, passwd entry or None, note)`` of the user the child runs as."""
    if run_as is None or run_as == "":
        return os.getuid(), os.getgid(), None, ""
    try:
        entry = pwd.getpwuid(int(run_as)) if run_as.isdigit() else pwd.getpwnam(run_as)
    except (KeyError, ValueError):
        module.fail_json(msg="run_as %r is not a user on this node" % run_as)
    if entry.pw_uid != os.getuid() and os.geteuid() != 0:
        # Without root the child can only be ourselves; say so instead of failing the audit.
        return os.getuid(), os.getgid(), None, " (ran as uid %d: run_as %s needs root)" % (os.getuid(), run_as)
    return entry.pw_uid, entry.pw_gid, entry, ""


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


def _pipe_result(module, pattern, result):
    dest = corepattern.destination(pattern)
    result["destination"] = dest
    reason = ("kernel.core_pattern %s pipes cores to a helper, so there is no core file to look for: %s. "
              "To get plain core files instead: %s" % (pattern, dest["where"], dest["override"]))
    if not module.params["pipe_probe"]:
        result["checks"] = {NAME: not_applicable(reason, "a core file written by the kernel")}
        result["msg"] = reason
        module.exit_json(**result)
    return reason


def main():
    module = AnsibleModule(
        argument_spec=dict(
            core_pattern=dict(type="str"),
            core_uses_pid=dict(type="bool"),
            proc_root=dict(type="path", default="/proc"),
            timeout=dict(type="float", default=10.0),
            run_as=dict(type="str"),
            pipe_probe=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    params = module.params
    proc_root = params["proc_root"]
    pattern = params["core_pattern"]
    if pattern is None:
        text = _read(os.path.join(proc_root, "sys", "kernel", "core_pattern"))
        if text is None:
            module.fail_json(msg="cannot read %s/sys/kernel/core_pattern" % proc_root)
        pattern = text.rstrip("\n")
    uses_pid = params["core_uses_pid"]
    if uses_pid is None:
        uses_pid = (_read(os.path.join(proc_root, "sys", "kernel", "core_uses_pid")) or "0").strip() == "1"
    if params["timeout"] <= 0:
        module.fail_json(msg="timeout must be a positive number of seconds")
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    result = dict(changed=False, core_pattern=pattern, wcoredump=None, note="",
                  session_rlimit_core={"soft": _limit_text(soft), "hard": _limit_text(hard)})
    if not pattern.strip():
        result["checks"] = {NAME: failed("kernel.core_pattern is empty: the kernel writes no core file",
                                         "a core file pattern", corepattern.OVERRIDE_HINT)}
        module.exit_json(**result)

    pipe_reason = _pipe_result(module, pattern, result) if corepattern.is_pipe(pattern) else None
    uid, gid, entry, note = _resolve_user(module, params["run_as"])
    result["note"] = note.strip(" ()")

    child_limit = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    if os.geteuid() != 0 and hard != resource.RLIM_INFINITY:
        child_limit = (hard, hard)
    if child_limit[0] == 0:
        result["checks"] = {NAME: failed(
            "the hard core limit of this session is 0, so no process started from it can dump core",
            "a hard core limit above 0 (unlimited)",
            "raise it in /etc/security/limits.d (limits_dropin module: '* hard core unlimited') and log in again")}
        module.exit_json(**result)

    sleep = module.get_bin_path("sleep", required=True)
    workdir = tempfile.mkdtemp(prefix="core-probe-")
    try:
        if entry is not None:
            os.chown(workdir, uid, gid)
        _probe(module, result, pattern, uses_pid, sleep, workdir, uid, gid, entry, child_limit, pipe_reason)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _start_child(sleep, workdir, uid, gid, entry, child_limit):
    def prepare():
        resource.setrlimit(resource.RLIMIT_CORE, child_limit)
        if entry is not None and uid != os.getuid():
            # The job user's own groups: they decide whether it may write the core directory.
            os.initgroups(entry.pw_name, gid)
            os.setgid(gid)
            os.setuid(uid)

    # A child that keeps running while we signal it needs Popen: run_command
    # only returns after the command has finished.  The argv is fixed; no shell.
    return subprocess.Popen([sleep, "30"], cwd=workdir, preexec_fn=prepare, close_fds=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


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


def _probe(module, result, pattern, uses_pid, sleep, workdir, uid, gid, entry, child_limit, pipe_reason):
    proc_root = module.params["proc_root"]
    child = _start_child(sleep, workdir, uid, gid, entry, child_limit)
    pid = child.pid
    result["child_pid"] = pid
    comm = (_read(os.path.join(proc_root, str(pid), "comm")) or os.path.basename(sleep)[:15]).strip()
    nspids = _status_pids(proc_root, pid)
    start = int(time.time())
    os.kill(pid, signal.SIGSEGV)
    status = _wait(pid, module.params["timeout"])
    if status is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        child.returncode = -signal.SIGKILL
        result["checks"] = {NAME: failed(
            "the child did not exit within %ss of SIGSEGV" % module.params["timeout"],
            "the child dumps core and exits",
            "check for a slow or full file system under the core directory, or a stuck pipe helper; "
            "raise timeout if the node is just slow")}
        module.exit_json(**result)
    child.returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    end = int(time.time()) + 1
    dumped = os.WIFSIGNALED(status) and os.WCOREDUMP(status)
    result["wcoredump"] = bool(dumped)
    expected = "a core file (WCOREDUMP set in the wait status)"

    if pipe_reason is not None:
        if dumped:
            result["checks"] = {NAME: not_applicable(
                "the kernel handed a dump to the pipe helper (WCOREDUMP set); " + pipe_reason, expected)}
        else:
            result["checks"] = {NAME: failed(
                "the kernel did not dump the child (no WCOREDUMP) with pipe pattern %s" % pattern, expected,
                result["destination"]["override"])}
        module.exit_json(**result)

    fields = _fields(proc_root, pid, nspids, comm, uid, gid, sleep, child_limit)
    fields["core_uses_pid"] = uses_pid
    absolute, regexes, shown = corepattern.component_regexes(pattern, fields)
    result["expected_path"] = shown if absolute else os.path.join(workdir, shown)
    matches = corepattern.find_matches(workdir, absolute, regexes, time_window=(start - 1, end + 1))
    core_dir = os.path.dirname(result["expected_path"])
    if matches:
        removed = True
        for path in matches:
            try:
                os.unlink(path)
            except OSError:
                removed = False
        result.update(core_file=matches[0], core_removed=removed)
        found = "%s written by a child running as %s (WCOREDUMP %s) and removed%s" % (
            matches[0], _who(uid, entry), "set" if dumped else "not set",
            " (%s)" % result["note"] if result["note"] else "")
        result["checks"] = {NAME: passed(found, "a core file matching %s" % result["expected_path"],
                                         core_file=matches[0], removed=removed)}
        result["msg"] = found
        module.exit_json(**result)

    who = _who(uid, entry)
    if not dumped:
        found, fix = _why_no_dump(proc_root, core_dir, uid, gid, who)
        found = "no core file: the kernel did not dump the child (no WCOREDUMP in the wait status); " + found
    else:
        listing = []
        try:
            listing = sorted(os.listdir(core_dir))[:10]
        except OSError:
            pass
        found = ("the kernel reports a core dump (WCOREDUMP) but no file matches %s; %s holds: %s"
                 % (result["expected_path"], core_dir, ", ".join(listing) or "nothing"))
        fix = ("compare kernel.core_pattern with what the node really writes (a second sysctl writer, a "
               "cleaner removing cores, or a file system that hides them)")
    if result["note"]:
        found += " (%s)" % result["note"]
    result["checks"] = {NAME: failed(found, "a core file matching %s" % result["expected_path"], fix)}
    result["msg"] = found
    module.exit_json(**result)


def _who(uid, entry):
    if entry is not None:
        return entry.pw_name
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "uid %d" % uid


def _fields(proc_root, pid, nspids, comm, uid, gid, sleep, child_limit):
    own_pid = nspids[-1] if nspids else pid
    global_pid = pid if _in_initial_pid_ns(proc_root) else None
    return {
        "p": own_pid, "i": own_pid, "P": global_pid, "I": global_pid,
        "u": uid, "g": gid, "s": int(signal.SIGSEGV), "h": os.uname().nodename,
        "e": comm[:15], "f": os.path.basename(os.path.realpath(sleep)),
        "E": os.path.realpath(sleep), "c": str(child_limit[0] if child_limit[0] != resource.RLIM_INFINITY
                                               else 2 ** 64 - 1),
        "d": None, "C": None, "t": None,
    }


def _why_no_dump(proc_root, core_dir, uid, gid, who):
    if not os.path.isdir(core_dir):
        return ("the core directory %s does not exist (the kernel does not create it)" % core_dir,
                "mkdir -p %s && chmod 1777 %s (the core_dumps role does this)" % (core_dir, core_dir))
    if not _writable_by(core_dir, uid, gid):
        mode = stat.S_IMODE(os.stat(core_dir).st_mode)
        return ("%s (mode %04o) is not writable by %s" % (core_dir, mode, who),
                "chmod 1777 %s so every job user can write cores there (the core_dumps role does this)"
                % core_dir)
    suid = (_read(os.path.join(proc_root, "sys", "fs", "suid_dumpable")) or "").strip()
    return ("%s exists and is writable by %s; fs.suid_dumpable is %s" % (core_dir, who, suid or "unknown"),
            "check free space and RLIMIT_FSIZE under %s, that the file system allows writes, and dmesg for "
            "'core dump' messages" % core_dir)


if __name__ == "__main__":
    main()
