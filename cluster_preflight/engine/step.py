# -*- coding: utf-8 -*-
"""One Slurm step of the srun engine: its ``srun`` line, its arguments, its run under a hard bound, its results.

A step runs the node code (``module_utils/preflight_node/srun_task.py``, from the archive) as ``tasks`` tasks on
each of its nodes.  Its arguments go to every task on standard input (srun's default): the values every node
shares once, and each node's own ones (:func:`payload`).  Every task prints its protocol lines (``PFR <node>
<local> ...``): a start, a heartbeat every few seconds, then its result in short chunks and a digest
(:class:`Collector` reassembles and checks them).

**One node speaks only for itself.**  What a line says about who printed it is the printer's word, and root on one
node can print anything.  So a line is bound to the task that printed it by Slurm, not by its text: ``srun
--label`` puts the task's number before every line (srun adds it from the task's own I/O stream; a task cannot
choose it), and ``srun --verbose`` says which task numbers it launched on which node (``srun: launching StepId=...
on host pfn2, 2 tasks: [2-3]``: Slurm orders a step's nodes its own way, not as ``--nodelist`` lists them).  A
line is the task's of that number on that node, whatever it names; a task whose lines name another node or task
has spoken for another (``spoke_for``): that is a finding on the printer, and the node it named keeps its own
result, heartbeats included.  srun's own words about a node (a failed launch) are read only from srun's own,
unlabelled lines.  What a task prints is bounded (``relay.py``: a share per task, its cut said), and a result is
read within :data:`RESULT_MAX_BYTES` once decompressed.

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
import collections
import shutil
import signal
import subprocess
import sys
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
# A task's line as srun --label gives it: the task's number (srun's, not the task's word), then the line.
LABELLED = re.compile(r"^\s*(\d+): (.*)$")
# srun --verbose: the task numbers it launches on a node (``0``, ``[0-1]``, ``[0,2-3]``).
LAUNCHING = re.compile(r"^srun: launching StepId=\S+ on host (\S+?), \d+ tasks?: \[?([0-9,-]+)\]?$")
# srun's own words only (a task's line starts with its label, never with ``srun:``).
LAUNCH_FAILED = re.compile(r"^srun: error: Task launch for StepId=\S+ failed on node (\S+?): (.*)$")
TASK_ERROR = re.compile(r"^srun: error: (\S+?): tasks? ([0-9,-]+): (.*)$")
# What srun --verbose says besides where it launches (its options, its plugins, each node's tasks started and
# ended): not kept among srun's words (a task's end without a result quotes the last of those).
VERBOSE = re.compile(r"^srun: (launch/|route/|defined options|-{4,}|end of defined options|jobid \d+: nodes|"
                     r"[\w(). -]+ +: )")
# The relay's word that a task's (or srun's) output passed its share (relay.py).
CUT = re.compile(r"^PFRCUT (\S+) (total )?(\d+)$")
# Bytes of one task's output kept per stream (the relay's share; a result is a few KiB to a few MiB), of srun's
# own lines, and of one result once decompressed.
PER_TASK_BYTES = 16 * 1024 * 1024
UNLABELLED_BYTES = 16 * 1024 * 1024
RESULT_MAX_BYTES = 64 * 1024 * 1024
# Bytes read from a step's file per look (the rest waits for the next one).
READ_CHUNK = 4 * 1024 * 1024
# Lines of a task number kept before srun said where it launched it.
PENDING_MAX = 256
RELAY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "relay.py")
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap.py"), encoding="utf-8") as _source:
    BOOTSTRAP = _source.read()


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


def srun_argv(nodes, call, python, archive, digest, tasks=1, bound=60, exclude=(), extra=(), srun="srun"):
    """The ``srun`` line of a step: ``tasks`` tasks on each of ``nodes``, the archive's ``call`` in each, started by
    the fixed bootstrap (``bootstrap.py``), which runs the archive only with the SHA-256 ``digest``."""
    argv = [srun, "--nodes=%d" % len(nodes), "--nodelist=%s" % hostlist.collect_hostlist(list(nodes)),
            "--ntasks-per-node=%d" % tasks, "--ntasks=%d" % (tasks * len(nodes)),
            # Steps share the allocation (the probes run while the ranks do); none waits for another's CPUs.
            "--overlap",
            # Every task reports its own failure; one task's exit never ends its peers (a peer's stack is the story).
            "--kill-on-bad-exit=0",
            # Slurm's backstop; the controller's own kill comes first.
            "--time=%d" % max(1, int(bound // 60) + 2),
            "--job-name=preflight-%s" % call, "--cpu-bind=none",
            "--export=PATH=%s,LANG=C,LC_ALL=C" % TASK_PATH,
            # Every line bound to the task that printed it (its number, srun's), and where each number runs.
            "--label", "--verbose"]
    if exclude:
        argv.append("--exclude=%s" % hostlist.collect_hostlist(list(exclude)))
    # Isolated and without site packages: nothing of the node's site directories or environment is imported (the
    # node layer needs the standard library only), and a task starts in a fraction of the time.  The program is
    # the bootstrap's text, never a file on the node: it checks the archive before any of it runs.
    return argv + list(extra) + [python, "-I", "-S", "-c", BOOTSTRAP, archive, digest, call]


def task_numbers(text):
    """The task numbers of ``0``, ``0-1``, ``0,2-3`` (srun's lists)."""
    numbers = []
    for part in text.split(","):
        first, _sep, last = part.partition("-")
        numbers.extend(range(int(first), int(last or first) + 1))
    return numbers


class Collector(object):
    """The protocol lines of one step's tasks, each bound to the task that printed it, reassembled into one result
    per task (``(node, local)``); see the module docstring."""

    def __init__(self, expected, clock=time.time):
        self.expected = set(expected)
        self.nodes = {node for node, _local in self.expected}
        self.clock = clock
        self.started = clock()
        # task number (srun's) -> (node, local); lines of a number not placed yet wait in ``pending``.
        self.layout, self.pending = {}, {}
        self.seen, self.chunks, self.results, self.damaged = {}, {}, {}, {}
        self.spoke_for, self.cut = {}, {}
        self.other = collections.deque(maxlen=20)
        self.stderr = collections.deque(maxlen=200)
        self.launch_failed, self.task_errors = {}, {}

    def feed_err(self, line):
        """One line of srun's standard error: srun's own words, or a task's (labelled)."""
        line = line.rstrip("\n")
        if self._cut_line(line):
            return
        labelled = LABELLED.match(line)
        if labelled:
            task = self.layout.get(int(labelled.group(1)))
            who = "%s:%d" % task if task else "task %s" % labelled.group(1)
            self.other.append("%s (stderr): %s" % (who, labelled.group(2)[:500]))
            return
        launching = LAUNCHING.match(line)
        if launching:
            if launching.group(1) in self.nodes:
                self._place(launching.group(1), task_numbers(launching.group(2)))
            return
        if not VERBOSE.match(line):
            self.stderr.append(line[:2000])
        match = LAUNCH_FAILED.match(line)
        if match:
            self.launch_failed.setdefault(match.group(1), match.group(2).strip())
            return
        match = TASK_ERROR.match(line.strip())
        if match:
            self.task_errors.setdefault(match.group(1), "task %s: %s" % (match.group(2), match.group(3).strip()))

    def _place(self, node, numbers):
        for local, number in enumerate(sorted(numbers)):
            self.layout[number] = (node, local)
            for text in self.pending.pop(number, []):
                self._protocol((node, local), text)

    def feed(self, line):
        """One line of srun's standard output: ``<task number>: <what the task printed>``."""
        line = line.rstrip("\n")
        if self._cut_line(line):
            return
        labelled = LABELLED.match(line)
        if not labelled:
            if line.strip():
                self.other.append(line[:500])
            return
        number, text = int(labelled.group(1)), labelled.group(2)
        task = self.layout.get(number)
        if task is None:
            waiting = self.pending.setdefault(number, [])
            if len(waiting) < PENDING_MAX:
                waiting.append(text)
            return
        self._protocol(task, text)

    def _protocol(self, task, text):
        match = LINE.match(text)
        if not match:
            if text.strip():
                self.other.append("%s:%d: %s" % (task[0], task[1], text[:500]))
            return
        named = (match.group(1), int(match.group(2)))
        if named != task:
            # A line naming another node (or task) than the one that printed it: the printer's finding, never the
            # named one's result or heartbeat.
            self.spoke_for.setdefault(task, "%s task %d" % named)
            return
        self.seen[task] = self.clock()
        if task in self.results or task in self.damaged:
            return
        if match.group(4) is not None:
            index, count = int(match.group(4)), int(match.group(5))
            parts = self.chunks.setdefault(task, {})
            parts["count"] = count
            if index < count:
                parts[index] = match.group(6)
        elif match.group(7) is not None:
            self._finish(task, match.group(7))

    def _cut_line(self, line):
        match = CUT.match(line)
        if not match:
            return False
        if match.group(1) == "srun":
            self.stderr.append("srun printed more than %d bytes; the rest was not kept" % UNLABELLED_BYTES)
            return True
        task = self.layout.get(int(match.group(1)))
        if task is None:
            return True
        count = int(match.group(3))
        if match.group(2):
            kept = self.cut.get(task, {}).get("kept", count)
            self.cut[task] = {"kept": kept, "printed": count}
        else:
            self.cut.setdefault(task, {"kept": count, "printed": None})
        self.chunks.pop(task, None)
        return True

    def _finish(self, task, digest):
        parts = self.chunks.pop(task, {})
        count = parts.pop("count", 0)
        if len(parts) != count:
            self.damaged[task] = "its result arrived incomplete (%d of %d parts)" % (len(parts), count)
            return
        text = "".join(parts[index] for index in range(count))
        if hashlib.sha256(text.encode("ascii")).hexdigest() != digest:
            self.damaged[task] = "its result arrived damaged (its digest does not match)"
            return
        try:
            inflate = zlib.decompressobj()
            data = inflate.decompress(base64.b64decode(text), RESULT_MAX_BYTES)
            if inflate.unconsumed_tail:
                self.damaged[task] = "its result is larger than %d bytes once decompressed: not read" % (
                    RESULT_MAX_BYTES)
                return
            self.results[task] = json.loads(data.decode("utf-8"))
        except (ValueError, zlib.error, RecursionError) as exc:
            self.damaged[task] = "its result could not be read: %s" % str(exc)[:300]

    def cut_text(self, task):
        """Whose output was cut, and how much: one sentence."""
        cut = self.cut[task]
        printed = "%d bytes" % cut["printed"] if cut["printed"] is not None else "more"
        return ("its task printed %s, more than the %d bytes a task may: its output was cut after %d bytes and its "
                "result not read" % (printed, PER_TASK_BYTES, cut["kept"]))

    def done(self, task):
        return task in self.results or task in self.damaged or task in self.spoke_for or task in self.cut

    def pending_tasks(self):
        return [task for task in self.expected if not self.done(task)]

    def silent(self, now=None):
        """``{task: why}`` of pending tasks lost by now: silent too long, or never started."""
        now = self.clock() if now is None else now
        lost = {}
        for task in self.pending_tasks():
            if task in self.seen and now - self.seen[task] > LOST_AFTER:
                lost[task] = "no word from its task for %.0f s (it beats every few seconds): the node or its " \
                             "slurmd stopped answering" % (now - self.seen[task])
            elif task not in self.seen and now - self.started > LAUNCH_GRACE:
                lost[task] = "its task did not start within %.0f s of srun's start" % LAUNCH_GRACE
        return lost


def srun_errors(lines):
    """``(launch failures {node: why}, task errors {node: text})`` from srun's own lines of standard error (a task's
    labelled line never matches: it starts with its number)."""
    collector = Collector([])
    for line in lines:
        collector.feed_err(line)
    return collector.launch_failed, collector.task_errors


def _start_ticks(pid):
    """The process's start time (clock ticks since boot): with its pid, who it is (pids are reused)."""
    try:
        with open("/proc/%d/stat" % pid, encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _running(pid, start):
    """Whether ``pid`` with the start time ``start`` still runs (not a zombie)."""
    ticks = _start_ticks(pid)
    if not ticks or ticks != start:
        return False
    try:
        with open("/proc/%d/stat" % pid, encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _alive(handle):
    """Whether the step's srun still runs (its pid with the start it had); a zombie child is reaped here."""
    proc = handle.get("proc")
    if proc is not None:
        return proc.poll() is None
    return _running(handle["pid"], handle["start"])


def _relay_running(handle):
    proc = handle.get("relay_proc")
    if proc is not None:
        return proc.poll() is None
    relay = handle.get("relay") or {}
    return bool(relay) and _running(relay["pid"], relay["start"])


def start(argv, data, directory, env=None):
    """Start one step's ``srun`` in the background: its standard input ``data`` (a file of ``directory``, root's
    alone), its output through the relay (``relay.py``: each task's share kept) into ``directory``.  The handle
    (``{pid, start, relay, dir, started}``, JSON) lets :func:`collect` follow it, in this process or a later one."""
    with open(os.path.join(directory, "stdin"), "wb") as handle:
        handle.write(data)
    with open(os.path.join(directory, "stdin"), "rb") as stdin:
        proc = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,  # pylint: disable=consider-using-with
                                start_new_session=True)
    try:
        relay = subprocess.Popen([sys.executable, "-I", "-S", RELAY, os.path.join(directory, "out"),  # pylint: disable=consider-using-with
                                  os.path.join(directory, "err"), str(PER_TASK_BYTES), str(UNLABELLED_BYTES),
                                  str(proc.stderr.fileno())], stdin=proc.stdout, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, pass_fds=(proc.stderr.fileno(),), start_new_session=True)
    except OSError:
        proc.kill()
        proc.wait()
        raise
    finally:
        proc.stdout.close()
        proc.stderr.close()
    return {"pid": proc.pid, "start": _start_ticks(proc.pid), "dir": directory, "started": time.time(),
            "relay": {"pid": relay.pid, "start": _start_ticks(relay.pid)}, "proc": proc, "relay_proc": relay}


def detached(handle):
    """The handle of a step followed by a later process (JSON: no process objects)."""
    return {key: value for key, value in handle.items() if key not in ("proc", "relay_proc")}


def stop(handle):
    """End a step's ``srun``: Ctrl-C twice (as Slurm's interface asks), then SIGKILL; waits a bounded time for it
    to go, never longer (a child is reaped; one started by an earlier process is init's to reap); then its relay."""
    for sig, grace in ((signal.SIGINT, 0.3), (signal.SIGINT, STOP_GRACE), (signal.SIGKILL, REAP_GRACE)):
        if not _alive(handle):
            break
        try:
            os.kill(handle["pid"], sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _alive(handle):
            time.sleep(0.05)
    _relay_end(handle)


def _relay_end(handle):
    """Once srun is gone the relay copies what is left and ends; a relay that does not is killed (bounded)."""
    deadline = time.monotonic() + REAP_GRACE
    while _relay_running(handle) and time.monotonic() < deadline:
        time.sleep(0.02)
    if _relay_running(handle):
        try:
            os.kill(handle["relay"]["pid"], signal.SIGKILL)
        except (OSError, KeyError):
            pass
    proc = handle.get("relay_proc")
    if proc is not None:
        try:
            proc.wait(timeout=REAP_GRACE)
        except subprocess.TimeoutExpired:
            pass


class _Tail(object):
    """Whole lines appended to a file since the last read, at most :data:`READ_CHUNK` bytes a look (a line still
    being written waits for its end)."""

    def __init__(self, path):
        self.path, self.offset, self.rest = path, 0, b""

    def lines(self, limit=READ_CHUNK):
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read(limit)
        except OSError:
            return []
        self.offset += len(data)
        parts = (self.rest + data).split(b"\n")
        self.rest = parts.pop()
        return [part.decode("utf-8", "replace") for part in parts]

    def all_lines(self):
        """Every line left (the relay has ended, so the file is bounded)."""
        found = []
        while True:
            more = self.lines()
            found.extend(more)
            if not more and not self._grew():
                return found

    def _grew(self):
        try:
            return os.path.getsize(self.path) > self.offset
        except OSError:
            return False


def _read(collector, out, err, everything=False):
    """Feed what the step's files gained (srun's standard error first: it says where each task runs)."""
    fresh = False
    for tail, feed in ((err, collector.feed_err), (out, collector.feed)):
        for line in (tail.all_lines() if everything else tail.lines()):
            feed(line)
            fresh = True
    return fresh


def collect(handle, expected, deadline, clock=time.time):
    """Follow the step ``handle`` (:func:`start`) until every task in ``expected`` (``(node, local)``) gave its
    result or is lost, or until ``deadline`` (epoch seconds), then stop it.  Returns ``{results, damaged, lost,
    launch_failed, task_errors, overdue, spoke_for, cut, rc, stderr, elapsed}``: ``lost`` ``{task: why}``,
    ``launch_failed`` ``{node: why}`` (Slurm could not start a task there), ``overdue`` the tasks still working at
    the deadline, ``spoke_for`` ``{task: the task it named}`` (a task that printed for another), ``cut`` ``{task:
    why}`` (a task past its share of output)."""
    collector = Collector(expected, clock)
    collector.started = handle["started"]
    out, err = _Tail(os.path.join(handle["dir"], "out")), _Tail(os.path.join(handle["dir"], "err"))
    lost, overdue = {}, []
    try:
        while collector.pending_tasks():
            fresh = _read(collector, out, err)
            lost.update(collector.silent())
            if not _alive(handle):
                _relay_end(handle)
                _read(collector, out, err, everything=True)
                break
            if all(task in lost for task in collector.pending_tasks()):
                break
            if clock() > deadline:
                overdue = [task for task in collector.pending_tasks() if task not in lost]
                break
            if not fresh:
                time.sleep(0.2)
    finally:
        stop(handle)
    _read(collector, out, err, everything=True)
    proc = handle.get("proc")
    return {"results": collector.results, "damaged": collector.damaged, "lost": lost,
            "launch_failed": collector.launch_failed, "task_errors": collector.task_errors, "overdue": overdue,
            "spoke_for": dict(collector.spoke_for), "cut": {task: collector.cut_text(task) for task in collector.cut},
            "rc": proc.poll() if proc is not None else None, "stderr": list(collector.stderr),
            "other": list(collector.other), "elapsed": round(clock() - handle["started"], 3)}


def run_step(argv, data, expected, bound, env=None):
    """One step in the foreground: :func:`start` it in a private directory, :func:`collect` it within ``bound``
    seconds, remove the directory."""
    directory = tempfile.mkdtemp(prefix="preflight-step-")
    try:
        handle = start(argv, data, directory, env)
        return collect(handle, expected, handle["started"] + bound)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


