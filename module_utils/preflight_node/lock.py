# -*- coding: utf-8 -*-
"""The per-node run lock of the gate: two runs on one node never collide, a dead run never blocks the next.

A gate holds every node it targets for the whole run with a **lease**, a small JSON file in the node's lock
directory (``/run/lock``, a tmpfs: gone at reboot) named after the node's own hostname::

    {run_id, controller, controller_pid, controller_start, user, since, expires}

It is written and removed only under ``flock`` on the file itself, which the kernel releases when the
process holding it dies, so a node call killed half-way never leaves a half-taken lock.  The facts call takes
it (:func:`acquire`) before it reads anything; the last node call of the run removes it (:func:`release`).
Another run finding a live lease reports the node **busy** (which run, since when, from which controller) and
touches nothing there.  A lease is **stale**, and is taken over, when it expired (``expires``: the run's own
bound) or when its run was started from this same controller and that ``ansible-playbook`` process no longer
exists (the controller sends the identities of its live runs, ``live_runs``): a SIGKILLed gate never blocks
the next one.  Taking over ends what the dead run left on the node: every process whose environment carries
its run id (:data:`RUN_ENV`: torchrun and its ranks), so its rendezvous port is free again.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time

from .proc import kill_tree, pids_with_env

RUN_ENV = "PREFLIGHT_RUN_ID"
LOCK_DIR = "/run/lock"
PREFIX = "cluster-preflight."
# Seconds a call waits for another run's call that holds the flock this very moment (it holds it for
# milliseconds: read, decide, write).
FLOCK_WAIT = 3.0


def lease_path(lock_dir, hostname=None):
    """The lease file of this node in ``lock_dir`` (the node's hostname in its name, so nodes that share a
    file system, such as a test bed's, keep leases of their own)."""
    name = (hostname or socket.gethostname()).split(".")[0] or "node"
    return os.path.join(lock_dir or LOCK_DIR, "%s%s.lease" % (PREFIX, name))


def _flocked(path, wait=FLOCK_WAIT):
    """An fd on ``path`` (created 0644) holding its exclusive flock, or None when another process held it for
    ``wait`` seconds.  The file may be replaced or removed while we wait: we lock what the path names now."""
    deadline = time.monotonic() + wait
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
                if exc.errno in (errno.EAGAIN, errno.EACCES):
                    return None
                raise
            time.sleep(0.05)
            continue
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        # Removed (released) between our open and our lock: lock the file that is there now.
        os.close(fd)


def _read(fd):
    os.lseek(fd, 0, os.SEEK_SET)
    data = b""
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    try:
        lease = json.loads(data.decode("utf-8")) if data.strip() else None
    except ValueError:
        return None
    return lease if isinstance(lease, dict) else None


def _write(fd, lease):
    data = json.dumps(lease, sort_keys=True).encode("utf-8")
    os.lseek(fd, 0, os.SEEK_SET)
    os.ftruncate(fd, 0)
    os.write(fd, data)
    os.fsync(fd)


def stale(lease, me, now=None):
    """Why ``lease`` (another run's) no longer holds the node, or "" while it does.  ``me``: this run's
    ``{run_id, controller, live_runs}`` (the identities of the runs alive on this run's controller)."""
    now = time.time() if now is None else now
    if float(lease.get("expires") or 0) <= now:
        return "its lease expired at %s (the run's own bound)" % _when(lease.get("expires"))
    if lease.get("controller") and lease.get("controller") == me.get("controller") \
            and lease.get("run_id") not in (me.get("live_runs") or ()):
        return "its ansible-playbook (pid %s on %s) no longer runs" % (lease.get("controller_pid"),
                                                                      lease.get("controller"))
    return ""


def _when(epoch):
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(epoch)))
    except (TypeError, ValueError):
        return "an unknown time"


def describe(lease):
    """Which run holds a node, in words (for the busy finding)."""
    return "run %s from controller %s (ansible-playbook pid %s, as %s), holding it since %s until at most %s" % (
        lease.get("run_id"), lease.get("controller"), lease.get("controller_pid"), lease.get("user") or "?",
        _when(lease.get("since")), _when(lease.get("expires")))


def end_run(run_id, proc_root="/proc"):
    """End every process of the run ``run_id`` on this node (torchrun and ranks carry :data:`RUN_ENV`):
    the pids signalled."""
    if not run_id:
        return []
    signalled = set()
    for pid in pids_with_env(RUN_ENV, run_id, proc_root):
        if pid not in signalled:
            signalled.update(kill_tree(pid, proc_root=proc_root))
    return sorted(signalled)


def acquire(args, now=None, proc_root="/proc"):
    """Take this node for the run ``args`` (``{dir, run_id, controller, controller_pid, controller_start,
    user, lease_seconds, live_runs}``).  Returns ``{state, path, ...}``: ``held`` (``took_over`` names a stale
    lease it replaced and ``ended`` the pids of that run it ended), ``busy`` (``lease``: who holds the node,
    ``why``), or ``error`` (``why``: the lock directory could not be used; the run goes on unprotected)."""
    now = time.time() if now is None else now
    path = lease_path(args.get("dir"))
    try:
        fd = _flocked(path)
    except OSError as exc:
        return {"state": "error", "path": path, "why": "%s: %s" % (path, exc.strerror or exc)}
    if fd is None:
        return {"state": "busy", "path": path, "lease": None,
                "why": "another process has held the lock file %s for %.0f s" % (path, FLOCK_WAIT)}
    try:
        lease = _read(fd)
        took_over, ended = None, []
        if lease and lease.get("run_id") != args.get("run_id"):
            why = stale(lease, args, now)
            if not why:
                return {"state": "busy", "path": path, "lease": lease, "why": describe(lease)}
            took_over = dict(lease, why=why)
            ended = end_run(lease.get("run_id"), proc_root)
        mine = {key: args.get(key) for key in ("run_id", "controller", "controller_pid", "controller_start", "user")}
        mine.update(since=(lease or {}).get("since") if (lease or {}).get("run_id") == args.get("run_id") else now,
                    expires=now + float(args.get("lease_seconds") or 3600))
        _write(fd, mine)
        return {"state": "held", "path": path, "lease": mine, "took_over": took_over, "ended": ended}
    except OSError as exc:
        return {"state": "error", "path": path, "why": "%s: %s" % (path, exc.strerror or exc)}
    finally:
        os.close(fd)


def release(args):
    """Remove this run's lease (``args``: ``{dir, run_id}``); another run's is left alone.  Returns
    ``{released, path, why}``."""
    path = lease_path(args.get("dir"))
    if not os.path.exists(path):
        return {"released": False, "path": path, "why": "no lease on this node"}
    try:
        fd = _flocked(path)
    except OSError as exc:
        return {"released": False, "path": path, "why": "%s: %s" % (path, exc.strerror or exc)}
    if fd is None:
        return {"released": False, "path": path, "why": "the lock file is held by another process"}
    try:
        lease = _read(fd)
        if not lease or lease.get("run_id") != args.get("run_id"):
            return {"released": False, "path": path,
                    "why": "the lease is %s's, not this run's" % (lease or {}).get("run_id")}
        # Unlinked while locked: a process waiting on the old file finds it gone and locks the new one.
        os.unlink(path)
        return {"released": True, "path": path, "why": ""}
    except OSError as exc:
        return {"released": False, "path": path, "why": "%s: %s" % (path, exc.strerror or exc)}
    finally:
        os.close(fd)
