# -*- coding: utf-8 -*-
"""The gate's node calls: one interface, two engines (``preflight_engine: ssh|srun``).

The gate reaches its nodes through a fixed set of **node calls** (:data:`NODE_CALLS`): the facts, the port mesh, the
single-node runs, the all-node all-reduce and its collection with the probes, the localisation rounds, the
confirmation run and the release of the run lock.  Each call takes its per-node arguments from a decision on the
controller (``preflight_settings``, the plan, the launch, the localisation) and gives one result per node, under the
register the decisions read (``cluster_preflight/plays/stage_results.py``), with the same shape whichever engine ran it:
a
module's result, ``failed`` with ``msg``, or ``unreachable`` with ``msg``.  The deciders, the accounting, the verdict
and every output do not know which engine ran.

* ``ssh`` (the default, the only one for the embedded default and for clusters without a scheduler):
  ``playbooks/tasks/gate_ssh.yml``.  Each call is an Ansible task of a node module (``library/``) on every node it
  concerns, over that node's connection, its result registered per node.
* ``srun``: ``playbooks/tasks/gate_srun.yml``, inside a Slurm allocation.  Each call is one controller task
  (``preflight_srun``, ``cluster_preflight/engine/srun.py``) that runs one Slurm step over every node it concerns,
  the same node-side code in each task (``module_utils/preflight_node/srun_task.py``); the task registers every
  node's result at once (:data:`BY_NODE`) and :class:`cluster_preflight.stages.view.ClusterView` hands each node its own
  (:func:`node_result`).

``preflight.yml`` includes the file of the run's engine once (the ``inputs`` decision's ``engine``), so a run pays
nothing for the engine it does not use.
"""

from __future__ import annotations

from collections import namedtuple

from cluster_preflight.plays import stage_results

ENGINES = ("ssh", "srun")
SETTING = "preflight_engine"
# A register holding every node's result of one call (the srun engine's): {BY_NODE: {node: result}, "call": name}.
BY_NODE = "preflight_by_node"

# ``name``: the call; ``register``: where its results go; ``module``: the node module the ssh engine runs for it
# (and whose code the srun engine runs in each task); ``what``: the call in words.
NodeCall = namedtuple("NodeCall", "name register module what")


def _call(name, module, what):
    return NodeCall(name, stage_results.STAGE_REGISTERS[name], module, what)


NODE_CALLS = (
    _call("facts", "preflight_facts", "the run lock, then every capability's reader"),
    _call("port_mesh", "port_probe", "the rendezvous port to and from every peer"),
    _call("single", "allreduce", "each node's all-reduce over its own GPUs (or ranks) alone"),
    _call("launch", "allreduce", "the all-node all-reduce, started"),
    _call("probes", "preflight_probes", "every probe, then the all-node all-reduce collected"),
    _call("localize_lock", "preflight_lock", "the run lock renewed for a round"),
    _call("localize_first", "allreduce", "a round's pairs (and idle loopback runs)"),
    _call("localize_second", "allreduce", "a round's loopback runs of suspects"),
    _call("localize_gpu", "allreduce", "a named node's GPU pairs, one slot at a time"),
    _call("retest_first", "allreduce", "a named node's pair with a node proven good"),
    _call("retest_second", "allreduce", "a named node's run alone over lo"),
    _call("confirm", "allreduce", "the all-node run over the nodes left"),
    _call("unlock", "preflight_lock", "the run lock released"),
)
BY_NAME = {call.name: call for call in NODE_CALLS}


def engine_of(run_settings):
    """The engine a node's run-wide settings (role ``preflight``) name (its default: the role's defaults)."""
    return str((run_settings or {}).get(SETTING))


def by_node(call, results):
    """A register value holding ``results`` (``{node: result}``) of one ``call`` for every node."""
    return {BY_NODE: results, "call": call, "changed": False}


def is_by_node(value):
    return isinstance(value, dict) and isinstance(value.get(BY_NODE), dict)


def node_result(value, host):
    """``host``'s result in a :func:`by_node` value: a node the call did not concern was skipped, as the ssh
    engine's task is on a node its ``when`` leaves out."""
    found = value[BY_NODE].get(host)
    if found is None:
        return {"skipped": True, "skip_reason": "not part of the %s step" % value.get("call")}
    return found


# The srun options preflight_srun_args may add: they choose the resources a step gets (GPUs a constrained node
# shows, a partition, an account), nothing else.  Each is given whole as --name=value (a flag of FLAGS alone): srun
# accepts abbreviations (--exp for --export) and bundled short options (-lK), so anything not exactly on this list
# could export the controller's environment to root on every node (--export), run a program there (--task-prolog,
# --bcast), move a step's tasks or output (-w, -n, -o, --chdir) or break how a line is bound to its task (--label).
SRUN_ARG_OPTIONS = ("--gpus-per-node", "--gpus", "--gpus-per-task", "--gres", "--gpu-bind", "--gpu-freq",
                    "--cpus-per-task", "--cpus-per-gpu", "--mem", "--mem-per-cpu", "--mem-per-gpu", "--partition",
                    "--account", "--qos", "--reservation", "--constraint", "--network", "--switches", "--comment",
                    "--wckey")
SRUN_ARG_FLAGS = ("--exclusive",)


def srun_arg_problem(option):
    """Why ``option`` may not be added to every step's srun line, or ""."""
    text = str(option)
    name, sep, value = text.partition("=")
    if text in SRUN_ARG_FLAGS:
        return ""
    if name in SRUN_ARG_OPTIONS and sep and value and not any(char.isspace() for char in text):
        return ""
    return "not an option that only chooses a step's resources"


def problems(run_settings, host, first_engine, environ):
    """The engine's input problems on ``host`` (``{name, found, expected, fix}``): one engine for the whole run
    (``first_engine``: the first targeted node's), and for srun, an allocation holding the node and well-formed
    srun settings."""
    from cluster_preflight.engine.allocation import refusals  # pylint: disable=import-outside-toplevel

    wanted = engine_of(run_settings)
    found = []
    if wanted != first_engine:
        found.append({"name": SETTING, "found": "%s on %s, %s on the first node of the run" % (wanted, host,
                                                                                             first_engine),
                      "expected": "one engine for the whole run",
                      "fix": "set preflight_engine once for the group (group_vars) or with -e"})
    if wanted != "srun":
        return found
    for name in ("preflight_srun_dir", "preflight_srun_python", "preflight_srun_archive"):
        value = str(run_settings.get(name) or "")
        if (value or name != "preflight_srun_archive") and not value.startswith("/"):
            found.append({"name": name, "found": value or "empty", "expected": "an absolute path on the nodes",
                          "fix": "leave %s at its default or name an absolute path" % name})
    for option in run_settings.get("preflight_srun_args") or []:
        if srun_arg_problem(option):
            found.append({"name": "preflight_srun_args", "found": option,
                          "expected": "only srun options that choose a step's resources, each as --name=value (%s) "
                                      "or %s; the engine sets the step's nodes, tasks, environment, I/O and bounds "
                                      "itself" % (", ".join(SRUN_ARG_OPTIONS), " or ".join(SRUN_ARG_FLAGS)),
                          "fix": "remove %s from preflight_srun_args (or write it as --name=value with a name of "
                                 "the list)" % option})
    return found + refusals(host, environ)
