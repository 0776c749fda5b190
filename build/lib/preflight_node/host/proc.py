# -*- coding: utf-8 -*-
"""Bounded process runs for probes that launch long-lived process trees.

``AnsibleModule.run_command`` cannot bound wall-clock time nor reach a tree
whose members start their own sessions (torchrun starts every worker with
``start_new_session=True``), so the gate launches with ``subprocess`` here:
argv lists only, a marker in the environment of the whole tree, and a kill
that finds every member by parentage *and* by marker, so nothing survives a
timeout, not even workers re-parented to init.

The tree is killed however the caller ends:

* normal return, timeout, or an exception: :func:`run_bounded` kills it on
  the way out;
* SIGTERM or SIGHUP: :func:`interruptible` turns the signal into
  :class:`Interrupted`, which unwinds through :func:`run_bounded`;
* SIGKILL (what Ansible's async_wrapper sends to the module's process group
  when the task's ``async`` time runs out; no handler can run): a
  :class:`Guard` in its own session notices that the caller is gone and kills
  the tree by its marker and removes the caller's scratch directory.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

from . import reap

MARKER_ENV = "PREFLIGHT_RUN_MARKER"
# Seconds between SIGTERM and SIGKILL when a tree is torn down, and at most after SIGKILL.
KILL_GRACE = 3.0
KILL_SETTLE = 1.0
# Seconds run_bounded may spend after the kill reaping the launcher.
REAP_TIMEOUT = 5.0


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
    return pids_with_env(MARKER_ENV, marker, proc_root)


def pids_with_env(name, value, proc_root="/proc"):
    """Processes whose environment carries ``name=value``."""
    needle = ("%s=%s" % (name, value)).encode()
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


def socket_owners(proc_root, pids, inodes, deadline=None):
    """``(owners, denied)``: ``{inode: [pid, ...]}`` of the processes among ``pids`` holding one of the socket
    ``inodes`` (their ``<proc_root>/<pid>/fd`` links ``socket:[<inode>]``), and how many processes' descriptors
    could not be read (not root).  Stops at ``deadline`` (a ``time.monotonic()`` value) when given."""
    wanted = {"socket:[%s]" % inode: inode for inode in inodes}
    owners, denied = {}, 0
    for pid in pids:
        if deadline is not None and time.monotonic() > deadline:
            break
        fd_dir = os.path.join(proc_root, str(pid), "fd")
        try:
            fds = os.listdir(fd_dir)
        except PermissionError:
            denied += 1
            continue
        except OSError:  # the process is gone
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target in wanted:
                owners.setdefault(wanted[target], []).append(int(pid))
                break
    return owners, denied


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


def kill_tree(root_pid, marker=None, grace=KILL_GRACE, proc_root="/proc"):
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
    # SIGKILL is not instant either; a caller that checks right after should find nothing.
    deadline = time.monotonic() + KILL_SETTLE
    while time.monotonic() < deadline and any(_alive(pid, proc_root) for pid in survivors):
        time.sleep(0.05)
    return sorted(members | set(survivors))


class Interrupted(BaseException):
    """The process was asked to stop (SIGTERM, SIGHUP) while it ran a tree.

    A BaseException, like KeyboardInterrupt, so that no ``except Exception``
    on the way swallows a request to stop."""

    def __init__(self, signum):
        self.signum = signum
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = "signal %d" % signum
        self.signal_name = name
        super().__init__("interrupted by %s" % name)


@contextlib.contextmanager
def interruptible(signals=(signal.SIGTERM, signal.SIGHUP)):
    """Within the block, the first of ``signals`` raises :class:`Interrupted`.

    The exception unwinds through :func:`run_bounded` (which kills the tree)
    and the caller's own clean-up; later signals are ignored so that clean-up
    is not cut short.  Handlers can only be installed in the main thread;
    elsewhere this does nothing.
    """
    state = {"raised": False}

    def handler(signum, _frame):
        if not state["raised"]:
            state["raised"] = True
            raise Interrupted(signum)

    previous = {}
    try:
        for sig in signals:
            previous[sig] = signal.signal(sig, handler)
    except ValueError:
        pass
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# The guard runs as its own program: module_utils are not importable from a
# separate process started by an AnsiballZ payload, so it repeats the marker
# kill of kill_tree() in a few lines.
_GUARD_SOURCE = r"""
import os, shutil, signal, sys, time
marker_env, marker, grace, paths = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
# Blocks until the caller closes its end of the pipe: on purpose, or by dying.
if sys.stdin.buffer.read() == b"done":
    sys.exit(0)
needle = ("%s=%s" % (marker_env, marker)).encode()
def marked():
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open("/proc/%s/environ" % name, "rb") as handle:
                    if needle in handle.read().split(b"\0"):
                        found.append(int(name))
            except OSError:
                pass
    return found
def send(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
pids = marked()
send(pids, signal.SIGTERM)
send(pids, signal.SIGCONT)
deadline = time.monotonic() + grace
while pids and time.monotonic() < deadline:
    time.sleep(0.1)
    pids = marked()
send(marked(), signal.SIGKILL)
for path in paths:
    shutil.rmtree(path, ignore_errors=True)
"""


class Guard(object):
    """A watcher, in its own session, that cleans up after a caller killed by SIGKILL.

    It holds the read end of a pipe whose write end only the caller has (file
    descriptors are not inherited by the tree).  :meth:`release` says the
    caller cleaned up itself; if the pipe closes without that, the caller died:
    the guard kills every process carrying ``marker`` and removes ``cleanup``
    (paths).  Use as a context manager around everything that creates them.
    """

    def __init__(self, marker, cleanup=(), grace=KILL_GRACE, python=None):
        self.marker = marker
        self.cleanup = [str(path) for path in cleanup]
        self.grace = grace
        self.python = python or sys.executable
        self.proc = None
        self.error = None

    def start(self):
        env = dict(os.environ)
        env.pop(MARKER_ENV, None)
        try:
            self.proc = subprocess.Popen([self.python, "-c", _GUARD_SOURCE, MARKER_ENV, self.marker, str(self.grace)]
                                         + self.cleanup, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, env=env, start_new_session=True)
        except OSError as exc:
            # A backstop only: the caller's own clean-up still runs.
            self.error = str(exc)
        return self

    def release(self):
        """The caller cleaned up: tell the guard to exit without doing anything."""
        if self.proc is None:
            return
        try:
            self.proc.stdin.write(b"done")
            self.proc.stdin.close()
            self.proc.wait(timeout=REAP_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
        self.proc = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.release()
        return False


def run_bounded(argv, timeout, env=None, cwd=None, stdout_path=None, marker=None, on_timeout=None,
                poll=None, poll_interval=0.25, credentials=None, stuck=None, stdout_fd=None):
    """Run ``argv`` in its own session for at most ``timeout`` seconds.

    Output (stdout and stderr together) goes to ``stdout_path`` when given.
    ``poll(pid)`` runs every ``poll_interval`` seconds while the tree lives (to
    catch the moment a rank fails while its peers are still there to inspect).
    On expiry ``on_timeout(pid)`` runs first (to collect stacks while the tree
    is still alive; it must bound itself), then the whole tree is killed.  The
    tree is killed too when anything raises on the way (an exception in a
    callback, :class:`Interrupted`).  Returns ``(returncode, timed_out,
    elapsed_seconds)``; returncode is None on timeout.  ``credentials`` (``user``, ``group``,
    ``extra_groups`` as ``preflight_node.as_user`` gives them) run the tree as another account.  The kill
    at the end is bounded too: a launcher that does not die from SIGKILL within :data:`REAP_TIMEOUT` is
    abandoned and described in ``stuck`` (a list, when given; see ``reap.describe``).
    ``stdout_fd``: an open descriptor for the output instead of ``stdout_path`` (left open: a file the caller
    made before handing a directory to another account is never opened by path again).
    """
    env = dict(os.environ if env is None else env)
    if marker:
        env[MARKER_ENV] = marker
    out = stdout_fd if stdout_fd is not None else open(stdout_path, "wb") if stdout_path else subprocess.DEVNULL
    start = time.monotonic()
    deadline = start + timeout
    proc = None
    try:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, **(credentials or {}))
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
    finally:
        try:
            # Even a clean exit may leave strays (a worker that ignored SIGTERM);
            # on an exception or a signal this is the only kill there is.
            if proc is not None:
                _kill_and_reap(proc, marker, stuck)
        finally:
            if stdout_path and stdout_fd is None:
                out.close()
    return rc, timed_out, round(time.monotonic() - start, 3)


def _kill_and_reap(proc, marker, stuck=None):
    """Kill the tree and reap its launcher within :data:`REAP_TIMEOUT`; a launcher that does not die even
    then (stuck in the kernel) is abandoned and described in ``stuck`` (a list), never waited for again."""
    try:
        kill_tree(proc.pid, marker=marker)
        try:
            proc.wait(timeout=REAP_TIMEOUT)
        except subprocess.TimeoutExpired:
            left = reap.kill_and_reap(proc, bound=REAP_TIMEOUT)
            if stuck is not None:
                stuck.extend(left)
    except Interrupted:
        # The signal cut this kill short; interruptible() ignores any further
        # signal, so this one runs to the end.
        kill_tree(proc.pid, marker=marker)
        raise


def _py_spy_argv(pid, py_spy, native=False, nonblocking=False):
    argv = [py_spy, "dump", "--pid", str(pid)]
    if native:
        argv.append("--native")
    if nonblocking:
        argv.append("--nonblocking")
    return argv


def py_spy_dump_all(targets, py_spy, budget, native=False, env=None, credentials=None):
    """``py-spy dump`` every pid of ``targets`` at once, all within ``budget`` seconds.

    ``targets`` maps a pid to whether to dump it ``nonblocking``: read the
    stack without pausing the process through ptrace.  py-spy cannot pause a
    process that is already stopped (SIGSTOP, a tracer), and such a process
    cannot change while it is read, so nothing is lost.  Returns ``{pid: (finished, text)}`` as soon as every
    dump is done or the budget is spent, whichever comes first: a dump still
    running then is killed and reported as not finished, never waited for.
    ``env`` is py-spy's environment (give it the run's marker so that a kill
    of the run also reaches a py-spy left by a caller that died).  ``credentials`` run py-spy as the
    account that owns the ranks (ptrace as that user, as a job's user would attach without sudo).
    """
    deadline = time.monotonic() + max(0.0, budget)
    lock = threading.Lock()
    state = {"closed": False}
    results, children = {}, {}

    def dump(pid, nonblocking):
        argv = _py_spy_argv(pid, py_spy, native, nonblocking)
        try:
            with lock:
                if state["closed"]:
                    return
                child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, **(credentials or {}))
                children[pid] = child
            try:
                output, _ = child.communicate(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                # Killed and reaped within a bound: a py-spy stuck on a rank in the kernel is left behind.
                reap.kill_and_reap(child)
                return
            outcome = (True, output.decode(errors="replace"))
        except OSError as exc:
            outcome = (True, "py-spy could not run: %s" % exc)
        with lock:
            if not state["closed"]:
                results[pid] = outcome

    threads = [threading.Thread(target=dump, args=(pid, nonblocking), name="py-spy-%d" % pid, daemon=True)
               for pid, nonblocking in targets.items()]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
    finally:
        with lock:
            state["closed"] = True
            finished = dict(results)
            late = [child for child in children.values() if child.poll() is None]
        for child in late:
            # A killed tracer detaches: the rank it was reading runs on.
            try:
                child.kill()
            except OSError:
                pass
    unfinished = "py-spy dump did not finish within the %g s stack budget" % budget
    return {pid: finished.get(pid, (False, unfinished)) for pid in targets}
