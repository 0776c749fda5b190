# -*- coding: utf-8 -*-
"""One Slurm step of the srun engine: its ``srun`` line, its arguments, its run under a hard bound, its results.

A step runs the node code (``module_utils/preflight_node/srun_task.py``, from the archive) as ``tasks`` tasks on
each of its nodes.  Its arguments go to every task on standard input (srun's default): the values every node
shares once, and each node's own ones (:func:`payload`).  Every task prints its protocol lines (``PFR <node>
<local> ...``): a start, a heartbeat every few seconds, then its result in short chunks and a digest
(:class:`Collector` reassembles and checks them).

The controller bounds the step itself (:func:`run_step`): it ends when every task gave its result or is lost, or at
the step's bound, and then ``srun`` is stopped (Ctrl-C twice, as Slurm's own interface asks, then a kill), reaped
within a few seconds.  A task is **lost** when it falls silent for :data:`LOST_AFTER` seconds (its node died, or
its slurmd), or never starts; Slurm's own words about a node (``Task launch ... failed on node``) say why.  A
lost task is an unreachable node for the verdict, exactly as a node that stops answering over SSH.  ``--time`` is
Slurm's own backstop (it acts only every minute or so).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import zlib

import hostlist

# Seconds a started task may stay silent (it beats every 3 s: srun_task.HEARTBEAT) before it is lost.
LOST_AFTER = 20.0
# Seconds from srun's start within which every task must have started (a node whose slurmd does not answer
# makes srun report a failed launch after its own message timeout).
LAUNCH_GRACE = 60.0
# Seconds for srun to end after Ctrl-C twice, then after SIGKILL.
STOP_GRACE = 5.0
REAP_GRACE = 5.0
# The tasks' environment: nothing of the controller's (a login's PYTHONPATH, a venv) reaches root on a node.
TASK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LINE = re.compile(r"^PFR (\S+) (\d+) (\+|\.|r (\d+) (\d+) (\S*)|end ([0-9a-f]{64}))$")
LAUNCH_FAILED = re.compile(r"Task launch for StepId=\S+ failed on node (\S+?): (.*)$")
TASK_ERROR = re.compile(r"^srun: error: (\S+?): tasks? ([0-9,-]+): (.*)$")


def split_common(args_by_node):
    """``(common, own)``: the argument values every node shares, and each node's others (a node with none is left
    out: it takes ``common`` as it is)."""
    nodes = list(args_by_node)
    if not nodes:
        return {}, {}
    first = args_by_node[nodes[0]]
    common = {}
    for key, value in first.items():
        text = json.dumps(value, sort_keys=True, default=str)
        if all(key in args_by_node[node] and json.dumps(args_by_node[node][key], sort_keys=True, default=str) == text
               for node in nodes[1:]):
            common[key] = value
    own = {node: {key: value for key, value in args.items() if key not in common} for node, args in
           args_by_node.items()}
    return common, {node: args for node, args in own.items() if args}


def payload(call, args_by_node):
    """The bytes every task of a step reads: zlib-compressed ``{call, common, nodes}``."""
    common, own = split_common(args_by_node)
    text = json.dumps({"call": call, "common": common, "nodes": own}, sort_keys=True, default=str)
    return zlib.compress(text.encode("utf-8"), 6)


def srun_argv(nodes, call, python, archive, tasks=1, bound=60, exclude=(), extra=(), srun="srun"):
    """The ``srun`` line of a step: ``tasks`` tasks on each of ``nodes``, the archive's ``call`` in each."""
    argv = [srun, "--nodes=%d" % len(nodes), "--nodelist=%s" % hostlist.collect_hostlist(list(nodes)),
            "--ntasks-per-node=%d" % tasks, "--ntasks=%d" % (tasks * len(nodes)),
            # Steps share the allocation (the probes run while the ranks do); none waits for another's CPUs.
            "--overlap",
            # Every task reports its own failure; one task's exit never ends its peers (a peer's stack is the story).
            "--kill-on-bad-exit=0",
            # Slurm's backstop; the controller's own kill comes first.
            "--time=%d" % max(1, int(bound // 60) + 2),
            "--job-name=preflight-%s" % call, "--cpu-bind=none",
            "--export=PATH=%s,LANG=C,LC_ALL=C" % TASK_PATH]
    if exclude:
        argv.append("--exclude=%s" % hostlist.collect_hostlist(list(exclude)))
    # Isolated and without site packages: nothing of the node's site directories or environment is imported (the
    # node layer needs the standard library only), and a task starts in a fraction of the time.
    return argv + list(extra) + [python, "-I", "-S", archive, call]


class Collector(object):
    """The protocol lines of one step's tasks, reassembled into one result per task (``(node, local)``)."""

    def __init__(self, expected, clock=time.time):
        self.expected = set(expected)
        self.clock = clock
        self.started = clock()
        self.seen, self.chunks, self.results, self.damaged = {}, {}, {}, {}
        self.other = []

    def feed(self, line):
        match = LINE.match(line.rstrip("\n"))
        if not match:
            if line.strip():
                self.other.append(line.rstrip("\n")[:500])
            return
        task = (match.group(1), int(match.group(2)))
        self.seen[task] = self.clock()
        if match.group(4) is not None:
            index, count = int(match.group(4)), int(match.group(5))
            parts = self.chunks.setdefault(task, {})
            parts["count"] = count
            parts[index] = match.group(6)
        elif match.group(7) is not None:
            self._finish(task, match.group(7))

    def _finish(self, task, digest):
        parts = self.chunks.pop(task, {})
        count = parts.pop("count", 0)
        text = "".join(parts.get(index, "") for index in range(count))
        if len(parts) != count or hashlib.sha256(text.encode("ascii")).hexdigest() != digest:
            self.damaged[task] = "its result arrived incomplete (%d of %d parts) or damaged" % (len(parts), count)
            return
        try:
            self.results[task] = json.loads(zlib.decompress(base64.b64decode(text)).decode("utf-8"))
        except (ValueError, zlib.error) as exc:
            self.damaged[task] = "its result could not be read: %s" % exc

    def done(self, task):
        return task in self.results or task in self.damaged

    def pending(self):
        return [task for task in self.expected if not self.done(task)]

    def silent(self, now=None):
        """``{task: why}`` of pending tasks lost by now: silent too long, or never started."""
        now = self.clock() if now is None else now
        lost = {}
        for task in self.pending():
            if task in self.seen and now - self.seen[task] > LOST_AFTER:
                lost[task] = "no word from its task for %.0f s (it beats every few seconds): the node or its " \
                             "slurmd stopped answering" % (now - self.seen[task])
            elif task not in self.seen and now - self.started > LAUNCH_GRACE:
                lost[task] = "its task did not start within %.0f s of srun's start" % LAUNCH_GRACE
        return lost


def srun_errors(lines):
    """``(launch failures {node: why}, task errors {node: text})`` from srun's standard error."""
    launch, tasks = {}, {}
    for line in lines:
        match = LAUNCH_FAILED.search(line)
        if match:
            launch.setdefault(match.group(1), match.group(2).strip())
            continue
        match = TASK_ERROR.match(line.strip())
        if match:
            tasks.setdefault(match.group(1), "task %s: %s" % (match.group(2), match.group(3).strip()))
    return launch, tasks


def _start_ticks(pid):
    """The process's start time (clock ticks since boot): with its pid, who it is (pids are reused)."""
    try:
        with open("/proc/%d/stat" % pid, encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _alive(handle):
    """Whether the step's srun still runs (its pid with the start it had); a zombie child is reaped here."""
    proc = handle.get("proc")
    if proc is not None:
        return proc.poll() is None
    ticks = _start_ticks(handle["pid"])
    if not ticks or ticks != handle["start"]:
        return False
    try:
        with open("/proc/%d/stat" % handle["pid"], encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def start(argv, data, directory, env=None):
    """Start one step's ``srun`` in the background: its standard input ``data`` (a file of ``directory``, root's
    alone), its output into ``directory``.  The handle (``{pid, start, dir, started}``, JSON) lets
    :func:`collect` follow it, in this process or a later one."""
    with open(os.path.join(directory, "stdin"), "wb") as handle:
        handle.write(data)
    with open(os.path.join(directory, "stdin"), "rb") as stdin, \
            open(os.path.join(directory, "out"), "wb") as out, open(os.path.join(directory, "err"), "wb") as err:
        proc = subprocess.Popen(argv, stdin=stdin, stdout=out, stderr=err, env=env,  # pylint: disable=consider-using-with
                                start_new_session=True)
    return {"pid": proc.pid, "start": _start_ticks(proc.pid), "dir": directory, "started": time.time(),
            "proc": proc}


def stop(handle):
    """End a step's ``srun``: Ctrl-C twice (as Slurm's interface asks), then SIGKILL; waits a bounded time for it
    to go, never longer (a child is reaped; one started by an earlier process is init's to reap)."""
    for sig, grace in ((signal.SIGINT, 0.3), (signal.SIGINT, STOP_GRACE), (signal.SIGKILL, REAP_GRACE)):
        if not _alive(handle):
            return
        try:
            os.kill(handle["pid"], sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _alive(handle):
            time.sleep(0.05)


class _Tail(object):
    """Whole lines appended to a file since the last read (a line still being written waits for its end)."""

    def __init__(self, path):
        self.path, self.offset, self.rest = path, 0, b""

    def lines(self):
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return []
        self.offset += len(data)
        parts = (self.rest + data).split(b"\n")
        self.rest = parts.pop()
        return [part.decode("utf-8", "replace") for part in parts]


def collect(handle, expected, deadline, clock=time.time):
    """Follow the step ``handle`` (:func:`start`) until every task in ``expected`` (``(node, local)``) gave its
    result or is lost, or until ``deadline`` (epoch seconds), then stop it.  Returns ``{results, damaged, lost,
    launch_failed, task_errors, overdue, rc, stderr, elapsed}``: ``lost`` ``{task: why}``, ``launch_failed``
    ``{node: why}`` (Slurm could not start a task there), ``overdue`` the tasks still working at the deadline."""
    collector = Collector(expected, clock)
    collector.started = handle["started"]
    out = _Tail(os.path.join(handle["dir"], "out"))
    lost, overdue = {}, []
    try:
        while collector.pending():
            fresh = out.lines()
            for line in fresh:
                collector.feed(line)
            lost.update(collector.silent())
            if not _alive(handle):
                for line in out.lines():
                    collector.feed(line)
                break
            if all(task in lost for task in collector.pending()):
                break
            if clock() > deadline:
                overdue = [task for task in collector.pending() if task not in lost]
                break
            if not fresh:
                time.sleep(0.2)
    finally:
        stop(handle)
    for line in out.lines():
        collector.feed(line)
    try:
        with open(os.path.join(handle["dir"], "err"), "rb") as err:
            stderr = err.read()[-65536:].decode("utf-8", "replace").splitlines()
    except OSError:
        stderr = []
    proc = handle.get("proc")
    launch_failed, task_errors = srun_errors(stderr)
    return {"results": collector.results, "damaged": collector.damaged, "lost": lost, "launch_failed": launch_failed,
            "task_errors": task_errors, "overdue": overdue, "rc": proc.poll() if proc is not None else None,
            "stderr": stderr[-200:], "other": collector.other[-20:], "elapsed": round(clock() - handle["started"], 3)}


def run_step(argv, data, expected, bound, env=None):
    """One step in the foreground: :func:`start` it in a private directory, :func:`collect` it within ``bound``
    seconds, remove the directory."""
    directory = tempfile.mkdtemp(prefix="preflight-step-")
    try:
        handle = start(argv, data, directory, env)
        return collect(handle, expected, handle["started"] + bound)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


