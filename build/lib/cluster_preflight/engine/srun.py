# -*- coding: utf-8 -*-
"""The srun engine: every node call of the gate as one Slurm step inside the controller's allocation.

``action_plugins/preflight_srun.py`` runs one node call (``call``) per task of ``playbooks/tasks/gate_srun.yml``, once
for
the whole cluster: :class:`Srun` builds each node's arguments from the same decisions the ssh engine's tasks
template (``preflight_settings``, the plan, the launch, the localisation), runs the step
(``cluster_preflight/engine/step.py``) and returns every node's result, in the shape the ssh engine's module gives
(``cluster_preflight/engine/__init__.py``).

* **The node code** reaches the nodes once per run: the archive (``cluster_preflight/engine/archive.py``) is sent
  with ``sbcast`` into ``preflight_srun_dir`` on every node of the allocation (root's alone), or is the operator's
  ``preflight_srun_archive``.  Each step runs it with ``preflight_srun_python``, as root (the allocation's user),
  and the node code switches to the job's user for job-side code as with the ssh engine (``ops.as_user``).
* **Node calls** (facts, port mesh, probes, the run lock): one task per node, the module's body in it.  A step
  whose launch Slurm aborted on some node (its slurmd down) is run again without that node, once or twice.
* **All-reduce launches** (single-node runs, the all-node run, each localisation step, the confirmation run): one
  task per rank (``module_utils/preflight_node/allreduce_run/rank_run.py``), every launch of the step at once (the pairs
  of a
  round are process groups of their own), never one ``srun`` per pair; a node's result is built from its ranks'
  records (``cluster_preflight/engine/ranks.py``).  The all-node run and the probes are two steps at the same time.
* A node a step could not reach (its task never started, fell silent, or Slurm could not launch it) is
  ``unreachable``, as a node that stops answering over SSH; later steps leave it out.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

from cluster_preflight import capabilities
from cluster_preflight.plays import stage_results
from cluster_preflight.engine import archive, by_node, step
from cluster_preflight.engine.ranks import node_result as rank_node_result
from preflight_node import registry as node_registry

PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(PROJECT, "roles", "allreduce", "files", "allreduce_worker.py")
# Seconds a step may take beyond its node calls' own bound: srun's start, the launch tree, the collection.
SLACK = 30
RETRIES = 2
# The allreduce module's options taken from a launch plan's arguments (the ssh engine's are in
# roles/allreduce/vars/main.yml: tests/unit/test_engine_srun.py keeps the two in step); these go only when set.
ALLREDUCE_KEYS = ("python", "nnodes", "node_rank", "nproc_per_node", "master_addr", "master_port", "backend",
                  "timeout", "hard_timeout", "stack_budget", "sizes", "iters", "warmup", "bandwidth_deadline",
                  "bandwidth_grace", "check_elements", "min_busbw_gbps", "socket_ifname", "role", "run_as", "env", "keep_scratch",
                  "selftest_fault", "selftest_rank", "run_id", "lock")
WHEN_SET = ("socket_ifname", "run_as", "run_id")
# What an unreachable node's slurmd makes srun or sbcast say.
UNREACHABLE_WORDS = ("connection", "timed out", "not responding", "unable to contact", "no route", "refused",
                     "node failure", "down")
SBCAST_FAILED = re.compile(r"REQUEST_FILE_BCAST\((\S+?)\): (.*)$")


def _first(view, name):
    return (view.result(view.hosts[0], name) or {}) if view.hosts else {}


def allreduce_params(args, worker_source):
    """The ``allreduce`` module's options for one node's launch ``args`` (a launch plan's entry)."""
    params = {key: args[key] for key in ALLREDUCE_KEYS if key in args and (key not in WHEN_SET or args[key])}
    params.setdefault("lock", {})
    params["worker_source"] = worker_source
    return params


def unreachable(why):
    """A node a step could not reach, as the verdict accounts for one (``via``: how it was reached)."""
    return {"unreachable": True, "msg": why, "via": "to Slurm", "changed": False}


def task_outcome(found, task, bound):
    """One task's outcome in a step's ``found`` (:func:`step.run_step`): its result, or why there is none."""
    node = task[0]
    if task in found["results"]:
        return found["results"][task]
    if node in found["launch_failed"]:
        return unreachable("Slurm could not start its task on %s: %s" % (node, found["launch_failed"][node]))
    if task in found["lost"]:
        return unreachable("%s: %s" % (node, found["lost"][task]))
    if task in found["damaged"]:
        return {"failed": True, "msg": "the task on %s ended, but %s" % (node, found["damaged"][task])}
    if task in found["overdue"]:
        return {"failed": True, "msg": "no result from %s within the step's bound of %.0f s; its task was killed with "
                                       "the step" % (node, bound)}
    said = found["task_errors"].get(node) or "; ".join(found["stderr"][-3:]) or "srun rc %s" % found["rc"]
    return {"failed": True, "msg": "the task on %s ended without a result: %s" % (node, said), "aborted": True}


class Srun(object):
    """The srun engine's steps for one controller task (a node call); see the module docstring."""

    def __init__(self, view, environ=None, runner=None):
        self.view = view
        self.environ = dict(os.environ if environ is None else environ)
        self.runner = runner or step.run_step
        run = (view.settings.get(view.hosts[0]) or {}).get(capabilities.RUN_ROLE) or {} if view.hosts else {}
        self.python = run.get("preflight_srun_python") or "/usr/bin/python3"
        self.extra = [str(item) for item in run.get("preflight_srun_args") or []]
        self.given = run.get("preflight_srun_archive") or ""
        self.dir = run.get("preflight_srun_dir") or "/run"
        self.steps = []
        self._archive = None

    def archive(self):
        """``(bytes, path on the nodes)`` of the node code (the operator's archive: no bytes)."""
        if self.given:
            return None, self.given
        if self._archive is None:
            data, digest = archive.build()
            self._archive = (data, os.path.join(self.dir, archive.file_name(digest)))
        return self._archive

    def send_archive(self, nodes):
        """sbcast the archive to the allocation's nodes; ``{node: result}`` of those of ``nodes`` it did not reach."""
        data, path = self.archive()
        if data is None:
            return {}
        with tempfile.NamedTemporaryFile(prefix="preflight-node-", suffix=".pyz") as handle:
            handle.write(data)
            handle.flush()
            argv = ["sbcast", "--force", handle.name, path]
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=120 + len(nodes) // 50,
                                      env=self.environ, check=False, stdin=subprocess.DEVNULL)
                rc, err = done.returncode, done.stderr
            except subprocess.TimeoutExpired:
                rc, err = "timeout", "sbcast took more than its bound"
        self.steps.append({"call": "sbcast", "argv": argv, "rc": rc})
        failed = {}
        for line in err.splitlines():
            match = SBCAST_FAILED.search(line)
            if match and match.group(1) in nodes:
                failed[match.group(1)] = match.group(2).strip()
        if rc != 0 and not failed:
            why = (err.strip().splitlines() or ["rc %s" % rc])[-1]
            failed = {node: why for node in nodes}
        return {node: unreachable("the node code could not be sent to %s (sbcast): %s" % (node, why))
                if any(word in why.lower() for word in UNREACHABLE_WORDS) else
                {"failed": True, "msg": "the node code could not be sent to %s (sbcast %s): %s; %s must be a "
                                        "directory of root's alone on every node (preflight_srun_dir)"
                                        % (node, path, why, self.dir)} for node, why in failed.items()}

    def run(self, call, args_by_node, bound, tasks=1, exclude=()):
        """One step of ``call`` over ``args_by_node`` (``tasks`` per node): ``{(node, local): outcome}``."""
        nodes = list(args_by_node)
        argv = step.srun_argv(nodes, call, self.python, self.archive()[1], tasks=tasks, bound=bound,
                              exclude=exclude, extra=self.extra)
        expected = [(node, local) for node in nodes for local in range(tasks)]
        found = self.runner(argv, step.payload(call, args_by_node), expected, bound, env=self.environ)
        self._record(call, argv, found)
        return {task: task_outcome(found, task, bound) for task in expected}

    def node_call(self, call, args_by_node, bound):
        """A one-task-per-node call: ``{node: result}``.  Nodes a launch failure elsewhere aborted run again."""
        results, pending = {}, dict(args_by_node)
        for attempt in range(RETRIES + 1):
            if not pending:
                break
            outcomes = self.run(call, pending, bound)
            failed_launch = {node for (node, _local), item in outcomes.items() if item.get("unreachable")
                             and "could not start its task" in str(item.get("msg"))}
            again = {}
            for (node, _local), item in outcomes.items():
                if item.get("aborted") and failed_launch and attempt < RETRIES:
                    again[node] = pending[node]
                else:
                    results[node] = {key: value for key, value in item.items() if key != "aborted"}
            pending = again
        return results

    def rank_step(self, args_by_node, bound, exclude=()):
        """``(argv, payload, expected tasks)`` of an all-reduce launch: every launch of ``args_by_node`` in one
        step, a task per rank."""
        with open(WORKER, encoding="utf-8") as handle:
            worker = handle.read()
        params = {node: allreduce_params(args, worker) for node, args in args_by_node.items()}
        tasks = max(int(args["nproc_per_node"]) for args in args_by_node.values())
        argv = step.srun_argv(list(params), "rank", self.python, self.archive()[1], tasks=tasks, bound=bound,
                              exclude=exclude, extra=self.extra)
        return argv, step.payload("rank", params), rank_tasks(args_by_node)

    def rank_call(self, args_by_node, bound, exclude=()):
        """An all-reduce launch run in the foreground: ``{node: result}``; a step that could not run at all fails
        every node, saying why."""
        if not args_by_node:
            return {}
        try:
            argv, data, expected = self.rank_step(args_by_node, bound, exclude)
            found = self.runner(argv, data, expected, bound, env=self.environ)
            self._record("rank", argv, found)
        except Exception as exc:  # pylint: disable=broad-except
            return {node: {"failed": True, "msg": "the all-reduce step could not run: %s: %s" % (
                type(exc).__name__, exc)} for node in args_by_node}
        return rank_results(args_by_node, found, bound)

    def _record(self, call, argv, found):
        self.steps.append({"call": call, "argv": argv, "rc": found["rc"], "elapsed": found["elapsed"],
                           "launch_failed": found["launch_failed"], "lost": sorted("%s:%d" % task for task in
                                                                                   found["lost"])})


def rank_tasks(args_by_node):
    """The tasks of a rank step: as many per node as the launch with the most ranks per node has."""
    tasks = max(int(args["nproc_per_node"]) for args in args_by_node.values())
    return [(node, local) for node in args_by_node for local in range(tasks)]


def rank_results(args_by_node, found, bound):
    """Every node's all-reduce result from a rank step's ``found`` (:func:`step.collect`)."""
    results = {}
    for node, args in args_by_node.items():
        records = {local: task_outcome(found, (node, local), bound) for local in range(int(args["nproc_per_node"]))}
        results[node] = rank_node_result(node, args, records)
    return results


def launch_bound(args_by_node):
    return max([float(args.get("wait_timeout") or 300) for args in args_by_node.values()] or [300]) + SLACK


def lost_nodes(view, names):
    """Nodes unreachable in an earlier call of the run (registers ``names``): left out of later steps."""
    return {host for host in view.hosts for name in names if view.outcome(host, name)[0] == "unreachable"}


def facts(engine, view):
    """The facts call: the archive sent, then the run lock and every reader on every targeted node."""
    inputs = _first(view, stage_results.INPUTS)
    args, bound = {}, 0.0
    for host in view.hosts:
        settings = view.result(host, stage_results.SETTINGS) or {}
        args[host] = {"capabilities": settings.get("read_args") or {}, "job": settings.get("job") or {},
                      "selftest_error": settings.get("selftest_error") or "", "lock": inputs.get("lock") or {}}
        bound = max(bound, float(settings.get("facts_timeout") or 60))
    results = engine.send_archive(list(args))
    results.update(engine.node_call("facts", {host: item for host, item in args.items() if host not in results},
                                    bound + SLACK))
    return results


def port_mesh(engine, view):
    mesh = _first(view, stage_results.PLAN).get("port_mesh") or {}
    keys = ("listen_addr", "port", "node_name", "peers", "window", "connect_timeout", "inbound", "retry", "lock")
    args = {host: {key: item[key] for key in keys if key in item}
            for host, item in (mesh.get("args_by_host") or {}).items()
            if host not in lost_nodes(view, [stage_results.FACTS])}
    return engine.node_call("port_probe", args, float(mesh.get("wait_timeout") or 60) + SLACK)


def single(engine, view):
    args = (_first(view, stage_results.PLAN).get("single") or {}).get("args_by_host") or {}
    args = {host: item for host, item in args.items() if host not in lost_nodes(view, [stage_results.FACTS,
                                                                                       stage_results.PORT_MESH_PROBE])}
    return engine.rank_call(args, launch_bound(args))


def _probe_args(view, hosts, capabilities_of, lock):
    settings = {host: view.result(host, stage_results.SETTINGS) or {} for host in hosts}
    out = {}
    for host in hosts:
        found = view.result(host, stage_results.FACTS) or {}
        job = dict(settings[host].get("job") or {}, resolved=found.get("job_user") or {}, hangs=found.get("hangs") or {})
        out[host] = {"capabilities": capabilities_of(host), "job": job, "lock": lock,
                     "selftest_error": settings[host].get("selftest_error") or ""}
    return out


def _after_job(name):
    return node_registry.after_job(name)


def _gate_args(view):
    launch = _first(view, stage_results.LAUNCH)
    hosts = [host for host in launch.get("reachable") or [] if host not in lost_nodes(
        view, [stage_results.FACTS, stage_results.PORT_MESH_PROBE, stage_results.SINGLE])]
    return {host: args for host, args in ((launch.get("gate") or {}).get("args_by_host") or {}).items()
            if host in hosts}, hosts


def launch(engine, view):
    """The all-node all-reduce started in the background (a task per rank), to be collected by the probes call as
    the ssh engine's is: each node's result is ``{started, step}``, ``step`` the handle that call follows."""
    gate_args, _hosts = _gate_args(view)
    if not gate_args:
        return {}
    bound = launch_bound(gate_args)
    argv, data, _expected = engine.rank_step(gate_args, bound)
    handle = step.start(argv, data, tempfile.mkdtemp(prefix="preflight-launch-"), env=engine.environ)
    handle.pop("proc")
    handle.update(deadline=handle["started"] + bound, bound=bound)
    engine.steps.append({"call": "rank", "argv": argv, "started": handle["started"]})
    return {host: {"started": 1, "finished": 0, "step": handle, "changed": False} for host in gate_args}


def probes(engine, view):
    """The probes (a task per node) while the all-node run works, then that run collected, then the probes that
    read what it changed (``after_job`` in the registry): each node's result as the ssh engine's probes call gives it,
    the
    all-reduce's as ``job``."""
    plan, launched = _first(view, stage_results.PLAN), _first(view, stage_results.LAUNCH)
    probe_args = plan.get("probe_args_by_host") or {}
    gate_args, hosts = _gate_args(view)
    bound = max([float((view.result(host, stage_results.SETTINGS) or {}).get("probes_timeout") or 120)
                 for host in hosts] or [120]) + SLACK
    lock = launched.get("probes_lock") or {}
    early = engine.node_call("probes", _probe_args(view, hosts, lambda host: {
        name: args for name, args in (probe_args.get(host) or {}).items() if not _after_job(name)}, lock), bound)
    ranks = _collect_launch(engine, view, gate_args)
    late_hosts = [host for host in hosts if any(_after_job(name) for name in probe_args.get(host) or {})
                  and not (early.get(host) or {}).get("unreachable")]
    late = engine.node_call("probes", _probe_args(view, late_hosts, lambda host: {
        name: args for name, args in (probe_args.get(host) or {}).items() if _after_job(name)}, lock), bound)
    return {host: _merged(early.get(host), late.get(host), ranks.get(host), host in gate_args) for host in hosts}


def _collect_launch(engine, view, gate_args):
    """The background all-node run's results (``launch``'s step followed to its end, then its files removed)."""
    started = {host: view.result(host, stage_results.ALLREDUCE_JOB) or {} for host in gate_args}
    handle = next((item.get("step") for item in started.values() if isinstance(item.get("step"), dict)), None)
    if handle is None:
        return {host: {"failed": True, "msg": "the all-reduce step was not started: %s" % (
            item.get("msg") or "no launch recorded")} for host, item in started.items()}
    try:
        found = step.collect(handle, rank_tasks(gate_args), handle["deadline"])
        engine.steps.append({"call": "rank (collected)", "elapsed": found["elapsed"],
                             "launch_failed": found["launch_failed"],
                             "lost": sorted("%s:%d" % task for task in found["lost"])})
        return rank_results(gate_args, found, handle["bound"])
    finally:
        shutil.rmtree(handle["dir"], ignore_errors=True)


def _merged(early, late, job, launched):
    """A node's probes result: the early and late steps' together, the all-reduce's as ``job``."""
    for part in (early, late, job if launched else None):
        if isinstance(part, dict) and part.get("unreachable"):
            return part
    merged = dict(early or {"failed": True, "msg": "the probes step gave no result"})
    if isinstance(late, dict):
        if late.get("failed") and not merged.get("failed"):
            return late
        for key in ("probes", "errors", "elapsed", "hangs"):
            merged[key] = dict(merged.get(key) or {}, **(late.get(key) or {}))
    if launched:
        merged["job"] = job if isinstance(job, dict) else {"failed": True, "msg": "the all-reduce step gave no result"}
    return merged


def localize_lock(engine, view):
    lock = _first(view, stage_results.LOCALIZE).get("lock") or {}
    held = [host for host in view.hosts if ((view.result(host, stage_results.FACTS) or {}).get("lock") or {}).get(
        "state") == "held" and host not in lost_nodes(view, [stage_results.FACTS, stage_results.PROBES])]
    return engine.node_call("lock", {host: {"renew": lock} for host in held}, 60 + SLACK)


def launches(key):
    """A localisation step (its planned launches: ``allreduce_localize[key]``) as one step of ranks."""
    def run(engine, view):
        args = _first(view, stage_results.LOCALIZE).get(key) or {}
        return engine.rank_call(args, launch_bound(args))
    run.__doc__ = "The localisation step planned in %s, one step of ranks." % key
    return run


def localize_gpu(engine, view):
    """A round's GPU pairs: slot ``i`` of every named node in one step, the slots one after another."""
    slots = _first(view, stage_results.LOCALIZE).get("gpu_slots_by_host") or {}
    results = {host: {"results": [], "changed": False} for host in slots}
    for index in range(max([len(items) for items in slots.values()] or [0])):
        args = {host: items[index] for host, items in slots.items() if len(items) > index}
        for host, result in engine.rank_call(args, launch_bound(args)).items():
            results[host]["results"].append(result)
    return results


def confirm(engine, view):
    """The confirmation run: the nodes left, every other targeted node excluded by name (``srun --exclude``)."""
    args = _first(view, stage_results.LOCALIZE).get("confirm_args_by_host") or {}
    named = [host for host in view.hosts if host not in args]
    return engine.rank_call(args, launch_bound(args), exclude=named)


def unlock(engine, view):
    lock = _first(view, stage_results.INPUTS).get("lock") or {}
    held = [host for host in view.hosts if ((view.result(host, stage_results.FACTS) or {}).get("lock") or {}).get(
        "state") == "held"]
    held = [host for host in held if host not in lost_nodes(view, [stage_results.FACTS, stage_results.PROBES])]
    return engine.node_call("lock", {host: {"dir": lock.get("dir"), "run_id": lock.get("run_id")} for host in held},
                            60 + SLACK)


# Each node call of the interface (cluster_preflight/engine NODE_CALLS: its register) -> what this engine runs for it.
CALLS = {
    "facts": facts,
    "port_mesh": port_mesh,
    "single": single,
    "launch": launch,
    "probes": probes,
    "localize_lock": localize_lock,
    "localize_first": launches("first_args_by_host"),
    "localize_second": launches("second_args_by_host"),
    "localize_gpu": localize_gpu,
    "retest_first": launches("retest_first_args_by_host"),
    "retest_second": launches("retest_second_args_by_host"),
    "confirm": confirm,
    "unlock": unlock,
}


def run_call(call, view, environ=None, runner=None):
    """The register value of node call ``call`` over the cluster (:func:`cluster_preflight.engine.by_node`)."""
    engine = Srun(view, environ, runner)
    results = CALLS[call](engine, view)
    return dict(by_node(call, results), steps=engine.steps)
