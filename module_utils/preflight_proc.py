# -*- coding: utf-8 -*-
"""Bounded process runs for probes that launch long-lived process trees.

``AnsibleModule.run_command`` cannot bound wall-clock time nor reach a tree
whose members start their own sessions (torchrun starts every worker with
``start_new_session=True``), so the gate launches with ``subprocess`` here:
argv lists only, a marker in the environment of the whole tree, and a kill
that finds every member by parentage *and* by marker, so nothing survives a
timeout, not even workers re-parented to init.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

MARKER_ENV = "PREFLIGHT_RUN_MARKER"


def _read(path, mode="r"):
    try:
        with open(path, mode) as handle:
            return handle.read()
    except (OSError, IOError):
        return None


def proc_stat(pid, proc_root="/proc"):
    """(state, ppid, comm) of ``pid`` or None if it is gone."""
    text = _read(os.path.join(proc_root, str(pid), "stat"))
    if not text:
        return None
    # comm is in parentheses and may itself contain spaces or ')'.
    comm = text[text.find("(") + 1:text.rfind(")")]
    fields = text[text.rfind(")") + 2:].split()
    return fields[0], int(fields[1]), comm


def all_pids(proc_root="/proc"):
    try:
        names = os.listdir(proc_root)
    except OSError:
        return []
    return [int(name) for name in names if name.isdigit()]


def descendants(root_pid, proc_root="/proc"):
    """Every pid whose ancestry leads to ``root_pid`` (not including it)."""
    children = {}
    for pid in all_pids(proc_root):
        stat = proc_stat(pid, proc_root)
        if stat:
            children.setdefault(stat[1], []).append(pid)
    found, queue = [], [root_pid]
    while queue:
        for child in children.get(queue.pop(), []):
            if child not in found:
                found.append(child)
                queue.append(child)
    return found


def pids_with_marker(marker, proc_root="/proc"):
    """Processes whose environment carries ``PREFLIGHT_RUN_MARKER=<marker>``."""
    needle = ("%s=%s" % (MARKER_ENV, marker)).encode()
    found = []
    for pid in all_pids(proc_root):
        environ = _read(os.path.join(proc_root, str(pid), "environ"), "rb")
        if environ and needle in environ.split(b"\0"):
            found.append(pid)
    return found


def environ_of(pid, proc_root="/proc"):
    raw = _read(os.path.join(proc_root, str(pid), "environ"), "rb") or b""
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def cmdline_of(pid, proc_root="/proc"):
    raw = _read(os.path.join(proc_root, str(pid), "cmdline"), "rb") or b""
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _alive(pid, proc_root="/proc"):
    stat = proc_stat(pid, proc_root)
    return stat is not None and stat[0] != "Z"


def kill_tree(root_pid, marker=None, grace=3.0, proc_root="/proc"):
    """SIGTERM the tree (and marked strays), then SIGKILL what survives ``grace``.

    Stopped processes (SIGSTOP) get SIGCONT so a pending SIGTERM is delivered.
    Returns the pids that were signalled.
    """
    members = set(descendants(root_pid, proc_root))
    if _alive(root_pid, proc_root):
        members.add(root_pid)
    if marker:
        members.update(pids_with_marker(marker, proc_root))
    members.discard(os.getpid())
    _signal_all(members, signal.SIGTERM)
    _signal_all(members, signal.SIGCONT)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(pid, proc_root) for pid in members):
        time.sleep(0.1)
    survivors = [pid for pid in members if _alive(pid, proc_root)]
    if marker:
        survivors += [pid for pid in pids_with_marker(marker, proc_root) if pid not in members]
    _signal_all(survivors, signal.SIGKILL)
    return sorted(members | set(survivors))


def run_bounded(argv, timeout, env=None, cwd=None, stdout_path=None, marker=None, on_timeout=None,
                poll=None, poll_interval=0.25):
    """Run ``argv`` in its own session for at most ``timeout`` seconds.

    Output (stdout and stderr together) goes to ``stdout_path`` when given.
    ``poll(pid)`` runs every ``poll_interval`` seconds while the tree lives (to
    catch the moment a rank fails while its peers are still there to inspect).
    On expiry ``on_timeout(pid)`` runs first (to collect stacks while the tree
    is still alive), then the whole tree is killed.  Returns
    ``(returncode, timed_out, elapsed_seconds)``; returncode is None on timeout.
    """
    env = dict(os.environ if env is None else env)
    if marker:
        env[MARKER_ENV] = marker
    out = open(stdout_path, "wb") if stdout_path else subprocess.DEVNULL
    start = time.monotonic()
    deadline = start + timeout
    try:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        rc, timed_out = None, False
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if on_timeout:
                    on_timeout(proc.pid)
                timed_out = True
                break
            try:
                rc = proc.wait(timeout=min(poll_interval, remaining) if poll else remaining)
                break
            except subprocess.TimeoutExpired:
                if poll:
                    poll(proc.pid)
        # Even a clean exit may leave strays (a worker that ignored SIGTERM).
        kill_tree(proc.pid, marker=marker, grace=3.0)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    finally:
        if stdout_path:
            out.close()
    return rc, timed_out, round(time.monotonic() - start, 3)


def py_spy_dump(pid, py_spy, timeout=15.0, native=False, nonblocking=False):
    """``py-spy dump`` of one process, bounded; returns the text or the reason it failed.

    ``nonblocking`` reads the stack without pausing the process through ptrace:
    py-spy cannot pause a process that is already stopped (SIGSTOP, a tracer),
    and such a process cannot change while it is read, so nothing is lost."""
    argv = [py_spy, "dump", "--pid", str(pid)]
    if native:
        argv.append("--native")
    if nonblocking:
        argv.append("--nonblocking")
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        return done.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired:
        return "py-spy dump timed out after %.0f s" % timeout
    except OSError as exc:
        return "py-spy could not run: %s" % exc
