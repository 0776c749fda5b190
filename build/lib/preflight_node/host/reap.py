# -*- coding: utf-8 -*-
"""Killing a command and everything it started, and reaping it, within a bound (node layer).

A kill is not the end of a wait: a child that left its session (``setsid``) survives a kill of the
process group and keeps the output pipes open, and a process stuck in the kernel (state ``D``, the
classic sick-GPU symptom: a driver call that never returns) does not die from SIGKILL until the
kernel lets go, which may be never.  Waiting for either after a timeout holds the caller until
something above it (Ansible's task timeout, Slurm's health-check kill) ends it, and then every
result of the call is lost instead of one.

So every wait here has a bound: a command's members are found by session, by parentage *and* by a
marker in their environment (which a ``setsid`` does not drop), killed at once, and given
:data:`REAP_TIMEOUT` seconds to go.  One that is still there is described (:func:`describe`: its
state, what it waits on) and abandoned: a daemon thread reaps it whenever the kernel lets it die, and
the caller reports it as that command's finding.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid

# The environment variable that marks every process a bounded command started (one value per command).
COMMAND_MARKER_ENV = "PREFLIGHT_COMMAND_MARKER"
# Seconds a killed command (and what it started) may take to go before it is reported and abandoned.
REAP_TIMEOUT = 3.0
# Process states (proc(5)) and what they mean for a process that did not die.
STATE_WORDS = {
    "D": "uninterruptible sleep: stuck in the kernel (a driver or file system call that does not return)",
    "Z": "a zombie nobody reaped",
    "T": "stopped",
    "t": "stopped by a tracer",
    "R": "running",
    "S": "sleeping",
}


def new_marker():
    """A value for :data:`COMMAND_MARKER_ENV` that no other command carries."""
    return uuid.uuid4().hex


def _stat(pid, proc_root="/proc"):
    """``(state, ppid, session, comm)`` of ``pid``, or None when it is gone."""
    try:
        with open(os.path.join(proc_root, str(pid), "stat"), encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    comm = text[text.find("(") + 1:text.rfind(")")]
    fields = text[text.rfind(")") + 2:].split()
    try:
        return fields[0], int(fields[1]), int(fields[3]), comm
    except (IndexError, ValueError):
        return None


def _marked(marker, proc_root="/proc"):
    """Processes whose :data:`COMMAND_MARKER_ENV` holds ``marker`` (a space-separated list: a command run by a
    marked command carries both markers, so a kill of the outer one reaches it)."""
    prefix = ("%s=" % COMMAND_MARKER_ENV).encode()
    wanted = marker.encode()
    found = []
    for name in _pids(proc_root):
        try:
            with open(os.path.join(proc_root, name, "environ"), "rb") as handle:
                entries = handle.read().split(b"\0")
        except OSError:
            continue
        if any(entry.startswith(prefix) and wanted in entry[len(prefix):].split() for entry in entries):
            found.append(int(name))
    return found


def marked_environment(env, marker):
    """``env`` (a dict) with ``marker`` added to :data:`COMMAND_MARKER_ENV`, keeping the markers already there."""
    env = dict(env)
    env[COMMAND_MARKER_ENV] = " ".join((env.get(COMMAND_MARKER_ENV) or "").split() + [marker])
    return env


def _pids(proc_root="/proc"):
    try:
        return [name for name in os.listdir(proc_root) if name.isdigit()]
    except OSError:
        return []


def members(pid, marker=None, proc_root="/proc"):
    """Every live process of the command whose first process is ``pid`` (a session leader): ``pid``, its
    session, its descendants by parentage, and whatever carries ``marker`` (``setsid`` keeps the
    environment)."""
    table = {}
    for name in _pids(proc_root):
        stat = _stat(name, proc_root)
        if stat and stat[0] != "Z":
            table[int(name)] = stat
    found = {other for other, stat in table.items() if other == pid or stat[2] == pid}
    queue = list(found)
    while queue:
        parent = queue.pop()
        for other, stat in table.items():
            if stat[1] == parent and other not in found:
                found.add(other)
                queue.append(other)
    if marker:
        found.update(other for other in _marked(marker, proc_root) if other in table)
    found.discard(os.getpid())
    return found


def kill_now(pid, marker=None, proc_root="/proc"):
    """SIGKILL the command ``pid`` started (see :func:`members`); returns the pids signalled."""
    targets = members(pid, marker, proc_root)
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    for target in targets:
        try:
            os.kill(target, signal.SIGKILL)
        except OSError:
            pass
    return targets


def describe(pid, proc_root="/proc"):
    """``{pid, comm, state, meaning, wchan}`` of a process that did not die, or None when it is gone."""
    stat = _stat(pid, proc_root)
    if stat is None or stat[0] == "Z":
        return None
    try:
        with open(os.path.join(proc_root, str(pid), "wchan"), encoding="utf-8", errors="replace") as handle:
            wchan = handle.read().strip()
    except OSError:
        wchan = ""
    return {"pid": int(pid), "comm": stat[3], "state": stat[0], "meaning": STATE_WORDS.get(stat[0], "state %s" % stat[0]),
            "wchan": "" if wchan in ("", "0") else wchan}


def stuck_text(stuck, bound=None):
    """One sentence for the processes that did not die within ``bound`` seconds of their kill."""
    if not stuck:
        return ""
    bound = REAP_TIMEOUT if bound is None else bound
    parts = ["pid %d (%s) in state %s, %s%s" % (item["pid"], item["comm"], item["state"], item["meaning"],
                                                 ", waiting in %s" % item["wchan"] if item["wchan"] else "")
             for item in stuck[:5]]
    more = " and %d more" % (len(stuck) - 5) if len(stuck) > 5 else ""
    return "still there %g s after SIGKILL, abandoned: %s%s" % (bound, "; ".join(parts), more)


def abandon(proc):
    """Stop waiting for ``proc`` (a Popen): a daemon thread reaps it when the kernel lets it die."""
    thread = threading.Thread(target=proc.wait, name="reap-%d" % proc.pid, daemon=True)
    thread.start()


def wait_gone(pids, deadline, proc_root="/proc"):
    """Wait until none of ``pids`` is alive or ``deadline`` (monotonic) passed; returns :func:`describe` of
    those still alive."""
    alive = set(pids)
    while alive:
        alive = {pid for pid in alive if describe(pid, proc_root) is not None}
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return [item for item in (describe(pid, proc_root) for pid in sorted(alive)) if item]


def kill_and_reap(proc, marker=None, bound=None, proc_root="/proc"):
    """SIGKILL ``proc`` (a Popen started in a session of its own) and what it started, and reap it within
    ``bound`` seconds.  Returns :func:`describe` of every process that is still there then (empty when all
    went); ``proc`` itself, when among them, is abandoned (:func:`abandon`), never waited for again."""
    targets = kill_now(proc.pid, marker, proc_root)
    deadline = time.monotonic() + (REAP_TIMEOUT if bound is None else bound)
    try:
        proc.wait(timeout=max(deadline - time.monotonic(), 0.01))
    except subprocess.TimeoutExpired:
        abandon(proc)
    return wait_gone(targets | {proc.pid}, deadline, proc_root)


def _drain(stream, chunks):
    try:
        while True:
            chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
            if not chunk:
                break
            chunks.append(chunk)
    except (OSError, ValueError):
        pass


def _feed(stream, data):
    try:
        stream.write(data)
    except (OSError, ValueError):
        pass
    finally:
        try:
            stream.close()
        except OSError:
            pass


def capture(argv, timeout, env=None, cwd=None, data=None, merge=False, leftovers=False, bound=None, **popen):
    """Run ``argv`` in a session of its own, marked (:func:`marked_environment`), for at most ``timeout``
    seconds, with its output read by threads so that no wait depends on the command closing its pipes.

    Returns ``(rc, out, err, timed_out, stuck)`` (bytes; ``err`` is empty with ``merge``, where stderr goes
    into ``out``): ``rc`` None when it did not exit in time; ``stuck`` :func:`describe` of what survived
    the kill within ``bound`` seconds (default :data:`REAP_TIMEOUT`; abandoned).  The call returns within
    ``timeout`` + 2 x ``bound`` whatever the command does: a member that left the session and holds the
    pipes is killed by its marker; output read so far is kept.  ``leftovers``: also kill what it left running after an
    exit in time
    (a whole run's end).  ``popen``: more Popen arguments (``user``, ``group``, ...);
    OSError and ValueError from Popen go to the caller."""
    bound = REAP_TIMEOUT if bound is None else bound
    marker = new_marker()
    env = marked_environment(os.environ if env is None else env, marker)
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge else subprocess.PIPE,
                            cwd=cwd, env=env, start_new_session=True, **popen)
    out, err = [], []
    threads = [threading.Thread(target=_drain, args=(proc.stdout, out), daemon=True)]
    if not merge:
        threads.append(threading.Thread(target=_drain, args=(proc.stderr, err), daemon=True))
    if data is not None:
        threads.append(threading.Thread(target=_feed, args=(proc.stdin, data), daemon=True))
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + max(float(timeout), 0.1)
    rc, stuck = None, []
    try:
        rc = proc.wait(timeout=max(deadline - time.monotonic(), 0.01))
    except subprocess.TimeoutExpired:
        pass
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 0.01) if rc is not None else 0)
    if rc is None or any(thread.is_alive() for thread in threads):
        # Out of time, or exited while something it started still holds its output: kill them all, then
        # read what is left for at most ``bound`` more seconds.
        stuck = kill_and_reap(proc, marker, bound)
        # What did not die keeps its end of the pipes: read on only briefly then.
        reading = time.monotonic() + (0.2 if stuck else bound)
        for thread in threads:
            thread.join(max(reading - time.monotonic(), 0.01))
    elif leftovers:
        left = members(proc.pid, marker) - {proc.pid}
        if left:
            kill_now(proc.pid, marker)
            stuck = wait_gone(left, time.monotonic() + bound)
    return rc, b"".join(out), b"".join(err), rc is None, stuck
