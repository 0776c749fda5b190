# -*- coding: utf-8 -*-
"""The per-node run lock of the gate: two runs on one node never collide, a dead run never blocks the next.

A gate holds every node it targets with a **lease**, a small JSON file named after the node's own hostname in
the node's lock directory (``/run/cluster-preflight``: a tmpfs, gone at reboot)::

    {run_id, controller, controller_pid, controller_start, user, since, expires}

The directory is root's alone (``state_dir.private_dir``: created 0700, refused when another account owns it
or may write it or a directory above it) and the lease is opened with ``O_NOFOLLOW``, created 0600 and checked
with ``fstat`` (a regular file of ours, one link): no other account can plant a link there, forge a lease, or
hold its ``flock``.  A lease is written and removed only under ``flock`` on the file itself, which the kernel
releases when the process holding it dies, so a node call killed half-way never leaves a half-taken lock.

The facts call takes the lease (:func:`acquire`) before it reads anything; every later node call of the run
**renews** it (the same function with ``renewal``): ``expires`` becomes at least the call's start plus its
``lease_seconds``, the call's own bound plus the controller's slack (``cluster_preflight/stages/run_lock.py``).  So a
lease reaches only as far as the stage in flight: a run whose controller vanished, wherever it was, frees the
node that long after its last call, once the work that call started has ended.  The last node call of the run
removes it (:func:`release`).

Another run finding a live lease reports the node **busy** (which run, since when, until when, how to free it)
and touches nothing there; a renewing call that finds another run's live lease has **lost** the node and runs
nothing either.  A lease is **stale**, and is taken over, when it expired, when its run was started from this
same controller and that ``ansible-playbook`` process no longer exists (``live_runs``: a SIGKILLed gate never
blocks the next), when the operator named its run (``take_over``), or when it cannot be read as a lease at all.
Taking over ends what the dead run left on the node: every process whose environment carries its run id
(:data:`RUN_ENV`: torchrun and its ranks), so its rendezvous port is free again.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import socket
import stat
import time

from .proc import kill_tree, pids_with_env
from .state_dir import UnsafeState, private_dir

RUN_ENV = "PREFLIGHT_RUN_ID"
LOCK_DIR = "/run/cluster-preflight"
PREFIX = "cluster-preflight."
# Seconds a call waits for another call that holds the flock this very moment (a call of ours holds it for
# milliseconds: read, decide, write).
FLOCK_WAIT = 3.0
# A lease is a few hundred bytes; more is not one of ours.
MAX_LEASE_BYTES = 65536
DIR_FIX = ("run the gate as root (preflight_become: true), or set preflight_lock_dir to a directory of the "
           "connecting account's alone (mode 0700, in a directory no other account may write)")


def lease_path(lock_dir, hostname=None):
    """The lease file of this node in ``lock_dir`` (the node's hostname in its name, so nodes that share a
    file system, such as a test bed's, keep leases of their own)."""
    name = (hostname or socket.gethostname()).split(".")[0] or "node"
    return os.path.join(lock_dir or LOCK_DIR, "%s%s.lease" % (PREFIX, name))


class LockError(OSError):
    """The lock cannot be used on this node (its directory or file is not root's alone); one line."""


def _open(path):
    """An fd on the lease file, created 0600, never through a link; LockError when it is not a lease file of
    ours (another owner, another kind of file, more than one name)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    info = os.fstat(fd)
    problem = ""
    if not stat.S_ISREG(info.st_mode):
        problem = "is not a regular file"
    elif info.st_uid != os.geteuid():
        problem = "is owned by uid %d, not by this account (uid %d)" % (info.st_uid, os.geteuid())
    elif info.st_nlink != 1:
        problem = "has %d names (hard links)" % info.st_nlink
    if problem:
        os.close(fd)
        raise LockError(errno.EPERM, "the lease file %s %s" % (path, problem))
    if stat.S_IMODE(info.st_mode) != 0o600:
        os.fchmod(fd, 0o600)
    return fd


def _flocked(path, wait=FLOCK_WAIT):
    """An fd on ``path`` holding its exclusive flock, or None when another process held it for ``wait``
    seconds.  The file may be replaced or removed while we wait: we lock what the path names now."""
    deadline = time.monotonic() + wait
    while True:
        fd = _open(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
            continue
        try:
            same = os.fstat(fd).st_ino == os.lstat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        # Removed (released) between our open and our lock: lock the file that is there now.
        os.close(fd)


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def lease_problem(lease):
    """Why ``lease`` (parsed JSON) is not a lease this module wrote, or ""."""
    if not isinstance(lease, dict):
        return "it is a JSON %s, not an object" % type(lease).__name__
    if not isinstance(lease.get("run_id"), str) or not lease["run_id"]:
        return "its run_id is %r" % (lease.get("run_id"),)
    for key in ("since", "expires"):
        if not _number(lease.get(key)):
            return "its %s is %r, not a time" % (key, lease.get(key))
    for key in ("controller", "controller_start", "user"):
        if lease.get(key) is not None and not isinstance(lease.get(key), str):
            return "its %s is %r, not a name" % (key, lease.get(key))
    if lease.get("controller_pid") is not None and not _number(lease.get("controller_pid")):
        return "its controller_pid is %r" % (lease.get("controller_pid"),)
    return ""


def _read(fd):
    """``(lease, problem)``: the lease in the file (None when empty), or None and why it is not one."""
    os.lseek(fd, 0, os.SEEK_SET)
    data = os.read(fd, MAX_LEASE_BYTES + 1)
    if not data.strip():
        return None, ""
    if len(data) > MAX_LEASE_BYTES:
        return None, "it is larger than %d bytes" % MAX_LEASE_BYTES
    try:
        lease = json.loads(data.decode("utf-8"))
    except ValueError as exc:
        return None, "it is not JSON (%s)" % str(exc)[:120]
    problem = lease_problem(lease)
    return (None, problem) if problem else (lease, "")


def _write(fd, lease):
    data = json.dumps(lease, sort_keys=True).encode("utf-8")
    os.lseek(fd, 0, os.SEEK_SET)
    os.ftruncate(fd, 0)
    os.write(fd, data)
    os.fsync(fd)


def stale(lease, me, now=None):
    """Why ``lease`` (another run's, valid) no longer holds the node, or "" while it does.  ``me``: this run's
    ``{run_id, controller, live_runs, take_over}`` (``live_runs``: the identities of the runs alive on this
    run's controller; ``take_over``: run ids the operator declared dead)."""
    now = time.time() if now is None else now
    if lease["expires"] <= now:
        return "its lease expired at %s (the bound of its last call on the node)" % when(lease["expires"])
    if lease["run_id"] in (me.get("take_over") or ()):
        return "preflight_lock_take_over names it"
    if lease.get("controller") and lease.get("controller") == me.get("controller") \
            and lease["run_id"] not in (me.get("live_runs") or ()):
        return "its ansible-playbook (pid %s on %s) no longer runs" % (lease.get("controller_pid"),
                                                                      lease.get("controller"))
    return ""


def when(epoch):
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(epoch)))
    except (TypeError, ValueError, OverflowError, OSError):
        return "an unknown time"


def describe(lease):
    """Which run holds a node, in words (for the busy finding)."""
    return "run %s from controller %s (ansible-playbook pid %s, as %s), holding it since %s until at most %s" % (
        lease.get("run_id"), lease.get("controller"), lease.get("controller_pid"), lease.get("user") or "?",
        when(lease.get("since")), when(lease.get("expires")))


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


def _open_locked(args):
    """``(fd, path, refusal)``: the lease file under its flock, or None and the result that says why not."""
    path = lease_path(args.get("dir"))
    try:
        private_dir(args.get("dir") or LOCK_DIR, DIR_FIX)
        fd = _flocked(path)
    except UnsafeState as exc:
        return None, path, {"state": "error", "path": path, "why": "the lock directory %s" % exc}
    except OSError as exc:
        return None, path, {"state": "error", "path": path, "why": _os_why(path, exc)}
    if fd is None:
        # Only root can open a lease in root's directory: this is no run of ours (which holds the flock for
        # milliseconds), so it makes nothing busy; the run goes on without the lock's protection.
        return None, path, {"state": "error", "path": path,
                            "why": "another process has held the flock of %s for %.0f s" % (path, FLOCK_WAIT)}
    return fd, path, None


def _os_why(path, exc):
    if exc.errno == errno.ELOOP:
        return "%s is a symbolic link: refused, never followed" % path
    return str(exc) if isinstance(exc, LockError) else "%s: %s" % (path, exc.strerror or exc)


def acquire(args, now=None, proc_root="/proc"):
    """Take this node for the run ``args`` (``{dir, run_id, controller, controller_pid, controller_start,
    user, lease_seconds, live_runs, take_over, renewal}``), or renew this run's lease (``renewal``: a later
    call of a run that took it).  ``expires`` becomes at least now plus ``lease_seconds``.

    Returns ``{state, path, ...}``: ``held`` (``took_over`` names a stale lease it replaced, with ``why`` and
    ``unreadable`` when it was no lease at all, and ``ended`` the pids of that run it ended), ``busy``
    (``lease``: who holds the node, ``why``), ``lost`` (the same, found by a renewal: another run took the node
    over after this run's lease expired), or ``error`` (``why``: the lock cannot be used; the run goes on
    without its protection)."""
    now = time.time() if now is None else now
    fd, path, refusal = _open_locked(args)
    if refusal:
        return refusal
    try:
        lease, unreadable = _read(fd)
        ours = bool(lease) and lease["run_id"] == args.get("run_id")
        took_over, ended = None, []
        if unreadable:
            took_over = {"run_id": None, "why": "the lease there could not be read: %s" % unreadable,
                         "unreadable": True}
        elif lease and not ours:
            why = stale(lease, args, now)
            if not why:
                state = "lost" if args.get("renewal") else "busy"
                return {"state": state, "path": path, "lease": lease, "why": describe(lease)}
            took_over = dict(lease, why=why)
            ended = end_run(lease["run_id"], proc_root)
        mine = {key: args.get(key) for key in ("run_id", "controller", "controller_pid", "controller_start", "user")}
        expires = now + float(args.get("lease_seconds") or 3600)
        mine.update(since=lease["since"] if ours else now, expires=max(expires, lease["expires"]) if ours else expires)
        _write(fd, mine)
        return {"state": "held", "path": path, "lease": mine, "took_over": took_over, "ended": ended}
    except OSError as exc:
        return {"state": "error", "path": path, "why": _os_why(path, exc)}
    finally:
        os.close(fd)


def renew(args, now=None, proc_root="/proc"):
    """:func:`acquire` for a later call of the run: another run's live lease is ``lost``, not ``busy``."""
    return acquire(dict(args, renewal=True), now, proc_root)


def release(args):
    """Remove this run's lease (``args``: ``{dir, run_id}``); another run's is left alone.  Returns
    ``{released, path, why}``."""
    path = lease_path(args.get("dir"))
    if not os.path.lexists(path):
        return {"released": False, "path": path, "why": "no lease on this node"}
    fd, path, refusal = _open_locked(args)
    if refusal:
        return {"released": False, "path": path, "why": refusal["why"]}
    try:
        lease, _unreadable = _read(fd)
        if not lease or lease["run_id"] != args.get("run_id"):
            return {"released": False, "path": path,
                    "why": "the lease is %s's, not this run's" % (lease or {}).get("run_id")}
        # Unlinked while locked: a process waiting on the old file finds it gone and locks the new one.
        os.unlink(path)
        return {"released": True, "path": path, "why": ""}
    except OSError as exc:
        return {"released": False, "path": path, "why": _os_why(path, exc)}
    finally:
        os.close(fd)


def hold_for_call(module, args):
    """Renew this run's lease at the start of a node call (``args``: the call's ``lock`` option; empty: no
    lock) and return the result; when another run took the node over, ``fail_json`` (nothing of the call runs,
    ``lock`` says which run holds it)."""
    if not args:
        return None
    held = renew(args)
    if held["state"] == "lost":
        module.fail_json(msg="this run no longer holds %s: %s took it over after this run's lease expired; nothing "
                             "was run" % (socket.gethostname().split(".")[0], held["why"]), lock=held, busy=held)
    return held


# The preflight_lock module's options (library/preflight_lock.py): release this run's lease, or renew it.
MODULE_SPEC = dict(dir=dict(type="path"), run_id=dict(type="str"), renew=dict(type="dict"))


def module_main(module):
    """The preflight_lock module's body over ``module``: renew (``renew``) or release (``dir``, ``run_id``)."""
    if module.params["renew"]:
        held = renew(module.params["renew"])
        if held["state"] == "lost":
            module.fail_json(msg="the run lock on this node is another run's now: %s" % held["why"], lock=held,
                             released=False, path=held["path"], why=held["why"])
        module.exit_json(changed=False, lock=held, released=False, path=held["path"], why=held.get("why") or "")
    module.exit_json(changed=False, **release({"dir": module.params["dir"], "run_id": module.params["run_id"]}))
