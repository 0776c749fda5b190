# -*- coding: utf-8 -*-
"""The controller's view of a run: what every targeted node reported so far.

Used by the action plugins ``preflight_decide`` and ``preflight_verdict`` (on
the controller only; no module ships it to a node).  Reads the results each
node task registered (``hostvars``) as plain data, and tells for each node
and stage whether it ran, was skipped, failed or found the node unreachable.
"""

from __future__ import annotations

import collections.abc
import contextlib
import gc
import json
import os
import socket
import time

from cluster_preflight import capabilities
from cluster_preflight import engine
from cluster_preflight.plays import stage_results


@contextlib.contextmanager
def without_gc():
    """The cyclic garbage collector off for one decision: a large cluster's view is a big, short-lived
    heap the collector would walk again and again (4000 nodes: a third of the time), and the
    controller's worker process ends with the task."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def run_started():
    """When this ``ansible-playbook`` started (epoch seconds), its start-up included: the parent of
    the worker process an action plugin runs in.  Now, where /proc cannot tell."""
    try:
        with open("/proc/%d/stat" % os.getppid()) as handle:
            ticks = int(handle.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as handle:
            uptime = float(handle.read().split()[0])
        return time.time() - (uptime - ticks / float(os.sysconf("SC_CLK_TCK")))
    except (OSError, ValueError, IndexError):
        return time.time()


def _start_ticks(pid, proc_root="/proc"):
    """A process's start time in clock ticks since boot (with its pid, its identity: pids are reused)."""
    with open("%s/%d/stat" % (proc_root, pid)) as handle:
        return handle.read().rsplit(")", 1)[1].split()[19]


def run_identity(proc_root="/proc"):
    """``(run_id, pid, start)`` of this ``ansible-playbook`` run: the controller's hostname, the pid of the
    parent of the worker an action plugin runs in, and its start tick; unique while the machine is up."""
    pid = os.getppid()
    try:
        start = _start_ticks(pid, proc_root)
    except (OSError, IndexError):
        start = "0"
    return "%s:%d:%s" % (socket.gethostname(), pid, start), pid, start


def live_runs(proc_root="/proc"):
    """The run ids (:func:`run_identity`) of every ``ansible-playbook`` alive on this controller now."""
    host, found = socket.gethostname(), []
    for name in os.listdir(proc_root):
        if not name.isdigit():
            continue
        try:
            with open("%s/%s/cmdline" % (proc_root, name), "rb") as handle:
                argv = handle.read().split(b"\0")
            if any(part.endswith(b"ansible-playbook") for part in argv[:2]):
                found.append("%s:%s:%s" % (host, name, _start_ticks(int(name), proc_root)))
        except (OSError, IndexError):
            continue
    return found


def outcome(result):
    """``(state, message)`` of one registered task result.

    ``state`` is ``missing`` (the task never ran for the node), ``unreachable``,
    ``skipped``, ``failed`` (including a task timeout) or ``ok``.
    """
    if result is None:
        return "missing", "no result recorded"
    if result.get("unreachable"):
        return "unreachable", str(result.get("msg") or "unreachable").strip()
    if result.get("skipped"):
        return "skipped", str(result.get("skip_reason") or result.get("false_condition") or "skipped")
    if result.get("failed"):
        return "failed", failure_message(result)
    return "ok", ""


def failure_message(result):
    """What a failed task says, reduced to its message: never its arguments, environment or output,
    nothing of a no_log task.  A module that crashed adds the last line of its stderr (the exception)."""
    if "censored" in result:
        return "its output is hidden (no_log)"
    message = str(result.get("msg") or "failed (no message: see the play output)").strip()
    if message.startswith("MODULE FAILURE") and result.get("module_stderr"):
        lines = [line for line in str(result["module_stderr"]).strip().splitlines() if line.strip()]
        if lines:
            message = "%s: %s" % (message.splitlines()[0], lines[-1].strip()[:300])
    return message


def plain(value):
    """Registered results as plain JSON data (drops templating wrappers): a copy, as a JSON round trip makes it.

    Data of JSON's own types (what the modules and the controller's decisions return) is copied directly, which
    is several times faster than the round trip a large cluster's view would pay for every node; anything else
    (a templating wrapper, a tuple, a key that is not text) goes through the round trip, so the copy is the
    same either way."""
    try:
        return _copy(value)
    except _NotPlain:
        return json.loads(json.dumps(value, default=str))


class _NotPlain(Exception):
    """A value :func:`_copy` leaves to the JSON round trip."""


_SCALARS = frozenset((str, int, float, bool, type(None)))


def _copy(value):
    kind = type(value)
    if kind is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _NotPlain()
            kind = type(item)
            out[key] = item if kind in _SCALARS else _copy(item)
        return out
    if kind is list:
        return [item if type(item) in _SCALARS else _copy(item) for item in value]
    if kind in _SCALARS:
        return value
    raise _NotPlain()


def by_capability(registered):
    """A node's settings or facts by capability (``{capability: its settings or facts}``), read in place: a
    decision reads a few capabilities of every node and never writes into them (tests/unit/
    test_decisions_read_only.py), and a copy of each would cost a large cluster more than the decision.  Only a
    value that is not a plain dict (a templating wrapper) is made plain data first (:func:`plain`)."""
    if type(registered) is dict:
        return registered
    return plain(registered) or {}


class ClusterView(object):
    """What the nodes of this run reported so far, read from ``hostvars``."""

    def __init__(self, task_vars):
        self.hosts = list(task_vars.get("ansible_play_hosts_all") or [])
        group = task_vars.get("preflight_group") or "cluster"
        self.all_hosts = list((task_vars.get("groups") or {}).get(group) or self.hosts)
        self.forks = int(task_vars.get("ansible_forks") or 5)
        self._hostvars = task_vars.get("hostvars") or {}
        self._cache, self._raw, self._facts = {}, {}, {}
        # host -> its variables as stored (registered results included), fetched once.
        self._vars = {}
        self.settings, self.nodes = {}, {}
        for host in self.hosts:
            self.settings[host] = by_capability(self.field(host, stage_results.SETTINGS, "settings", copy=False) or {})
            self.nodes[host] = self.field(host, stage_results.SETTINGS, "node") or capabilities.node_info(host, {})

    def result(self, host, name):
        """A node's registered result ``name`` as plain data (a copy of its own), or None."""
        key = (host, stage_results.known(name))
        if key not in self._cache:
            value = self.registered(host, name)
            self._cache[key] = plain(value) if value is not None else None
        return self._cache[key]

    def read(self, host, name):
        """A node's registered result ``name`` to be read only, or None: in place where it is a plain dict (a
        decision reads, never writes, what the nodes registered: see :func:`by_capability`), else :meth:`result`.
        A node's probes, its port mesh rows and the decisions before are each as large as a node's facts."""
        value = self.registered(host, name)
        return value if value is None or type(value) is dict else self.result(host, name)

    def registered(self, host, name):
        """The registered value itself (not copied: only to be read), or None.  What :meth:`outcome` and the
        verdict's accounting need is in its top-level keys, so a node's whole result (its settings, facts, the
        probes' rows) is copied only where a decision reads it (:meth:`result`).  A register that holds every
        node's result of one engine step (the srun engine's, cluster_preflight/engine) gives each node its own."""
        key = (host, stage_results.known(name))
        if key not in self._raw:
            value = self._stored(host, name)
            self._raw[key] = engine.node_result(value, host) if engine.is_by_node(value) else value
        return self._raw[key]

    def _stored(self, host, name):
        """What ``host`` registered as ``name`` (None: nothing), as it was stored.  A registered result is data a task
        returned, never a template, so it is read without rendering (``hostvars``' ``raw_get``): rendering a
        register that holds every node's result (the srun engine's) cost every decision a copy per node."""
        if host not in self._vars:
            raw_get = getattr(self._hostvars, "raw_get", None)
            try:
                found = raw_get(host) if raw_get is not None else self._hostvars[host]
            except KeyError:
                found = None
            self._vars[host] = found if isinstance(found, collections.abc.Mapping) else {}
        return self._vars[host].get(name)

    def field(self, host, name, key, copy=True):
        """One top-level field of a node's registered result ``name`` (a copy of its own unless ``copy`` is
        false: then the registered value itself, only to be read), or None."""
        value = self.registered(host, name)
        value = value.get(key) if isinstance(value, dict) else None
        return plain(value) if copy and value is not None else value

    def outcome(self, host, name):
        """``(state, message)`` of a node's registered result (see :func:`outcome`)."""
        return outcome(self.registered(host, name))

    def lost(self, stages):
        """``{host: reason}`` of nodes unreachable, or whose task failed or timed out, in ``stages``."""
        lost = {}
        for host in self.hosts:
            for stage in stages:
                register, what = stage_results.STAGE_REGISTERS[stage], stage_results.STAGE_WHAT[stage]
                state, message = self.outcome(host, register)
                if state in ("unreachable", "failed"):
                    lost[host] = "%s while %s: %s" % ("unreachable" if state == "unreachable" else "failed",
                                                     what, message[:300])
                    break
        return lost

    def facts(self, host):
        """``(facts, errors)`` of the node's one reader call, or ``(None, None)`` (also for a node another run
        holds: nothing was read there)."""
        if host not in self._facts:
            facts = stage_results.FACTS
            if self.outcome(host, facts)[0] != "ok" or self.field(host, facts, "busy", copy=False):
                self._facts[host] = None, None
            else:
                # Read in place (see :func:`by_capability`), not copied.
                self._facts[host] = (by_capability(self.field(host, stage_results.FACTS, "facts", copy=False) or {}),
                                     self.field(host, stage_results.FACTS, "errors") or {})
        return self._facts[host]

    def busy(self):
        """``{host: lock result}`` of the nodes another run holds (``module_utils/preflight_node/host/lock.py``)."""
        return {host: self.field(host, stage_results.FACTS, "busy") for host in self.hosts
                if self.outcome(host, stage_results.FACTS)[0] == "ok"
                and self.field(host, stage_results.FACTS, "busy", copy=False)}

    def read_hosts(self):
        return [host for host in self.hosts if self.facts(host)[0] is not None]

    def capability_facts(self, name, hosts):
        return {host: (self.facts(host)[0] or {}).get(name) for host in hosts}

    def capability_settings(self, name, hosts):
        return {host: self.settings[host].get(name) or {} for host in hosts}
