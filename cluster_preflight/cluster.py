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

from cluster_preflight import capabilities as registry
from cluster_preflight import engine
from cluster_preflight import registers


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
    """Registered results as plain JSON data (drops templating wrappers)."""
    return json.loads(json.dumps(value, default=str))


class ClusterView(object):
    """What the nodes of this run reported so far, read from ``hostvars``."""

    def __init__(self, task_vars):
        self.hosts = list(task_vars.get("ansible_play_hosts_all") or [])
        group = task_vars.get("preflight_group") or "cluster"
        self.all_hosts = list((task_vars.get("groups") or {}).get(group) or self.hosts)
        self.forks = int(task_vars.get("ansible_forks") or 5)
        self._hostvars = task_vars.get("hostvars") or {}
        self._cache = {}
        # register -> every node's result of one engine step (cluster_preflight/engine): read once, not per node.
        self._by_node = {}
        # host -> its variables as stored (registered results included), fetched once.
        self._vars = {}
        self.settings, self.nodes = {}, {}
        for host in self.hosts:
            loaded = self.result(host, registers.SETTINGS) or {}
            self.settings[host] = loaded.get("settings") or {}
            self.nodes[host] = loaded.get("node") or registry.node_info(host, {})

    def result(self, host, name):
        key = (host, registers.known(name))
        if key not in self._cache:
            wrapped = self._by_node.get(name)
            if wrapped is None:
                value = self._registered(host, name)
                if not engine.is_by_node(value):
                    self._cache[key] = plain(value) if value is not None else None
                    return self._cache[key]
                # Registered once for every node (run_once): the same value on each, made plain once.
                wrapped = self._by_node[name] = plain(value)
            self._cache[key] = engine.node_result(wrapped, host)
        return self._cache[key]

    def _registered(self, host, name):
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

    def outcome(self, host, name):
        """``(state, message)`` of a node's registered result (see :func:`outcome`)."""
        return outcome(self.result(host, name))

    def lost(self, stages):
        """``{host: reason}`` of nodes unreachable, or whose task failed or timed out, in ``stages``."""
        lost = {}
        for host in self.hosts:
            for stage in stages:
                register, what = registry.STAGE_REGISTERS[stage], registry.STAGE_WHAT[stage]
                state, message = self.outcome(host, register)
                if state in ("unreachable", "failed"):
                    lost[host] = "%s while %s: %s" % ("unreachable" if state == "unreachable" else "failed",
                                                     what, message[:300])
                    break
        return lost

    def facts(self, host):
        """``(facts, errors)`` of the node's one reader call, or ``(None, None)`` (also for a node another run
        holds: nothing was read there)."""
        if self.outcome(host, registers.FACTS)[0] != "ok":
            return None, None
        result = self.result(host, registers.FACTS)
        if result.get("busy"):
            return None, None
        return result.get("facts") or {}, result.get("errors") or {}

    def busy(self):
        """``{host: lock result}`` of the nodes another run holds (``module_utils/preflight_node/lock.py``)."""
        return {host: (self.result(host, registers.FACTS) or {})["busy"] for host in self.hosts
                if self.outcome(host, registers.FACTS)[0] == "ok"
                and (self.result(host, registers.FACTS) or {}).get("busy")}

    def read_hosts(self):
        return [host for host in self.hosts if self.facts(host)[0] is not None]

    def capability_facts(self, name, hosts):
        return {host: (self.facts(host)[0] or {}).get(name) for host in hosts}

    def capability_settings(self, name, hosts):
        return {host: self.settings[host].get(name) or {} for host in hosts}
