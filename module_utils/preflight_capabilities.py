# -*- coding: utf-8 -*-
"""Every capability the preflight checks, and the interface each one implements.

A capability is one role (``roles/<name>``: its variables, prefixed ``<name>_``,
in ``defaults/main.yml`` mirrored by ``meta/argument_specs.yml``; its
bring-up writers in ``tasks/``), one file ``module_utils/preflight_<name>.py``
and one test file ``tests/unit/test_<name>.py``.  The file provides:

``CAPABILITY``
    its name: the role name, the variables' prefix, the check namespace.
``validate(settings) -> [problem]``  (controller)
    what ``meta/argument_specs.yml`` cannot say (ranges, paths, combinations);
    ``settings`` maps the role's variable names to typed values.  A problem is
    ``{"name": variable, "found": ..., "expected": ..., "fix": ...}``.
``read_args(settings, node) -> dict or None``  (controller)
    the JSON-safe arguments ``read`` needs on ``node`` (see :func:`node_info`);
    None when the capability is switched off.
``read(args, ops) -> facts``  (node, inside ``library/preflight_facts.py``)
    pure reads, commands only through ``ops`` (``module_utils/preflight_node.py``).
    What a node may lack (no sshd config, no Yama, no torch) is a fact, never
    an exception; an exception is recorded as ``<name>.error``.
``probe_args(settings, node, plan) -> dict or None`` and ``probe(args, ops)``  (optional)
    a check that has to act (crash a child, ssh to the peers); runs in
    ``library/preflight_probes.py`` while the all-reduce runs.
``decide(host, facts, settings, probe=None, cluster=None) -> {name: check}``  (controller, pure)
    ``facts``/``probe`` are this capability's reader/probe results on
    ``host`` (None when it did not read); ``cluster`` is the view of every
    targeted node for decisions that need peers (``hosts``, ``nodes``,
    ``facts``, ``settings``, ``probes``: each mapping host -> this
    capability's data).

The cluster-wide steps of the gate (interface choice, port mesh, all-reduce)
also expose ``plan``/``report`` functions used by ``action_plugins/preflight_decide.py``.
"""

from __future__ import annotations

import socket
import time
import traceback

from ansible.module_utils import preflight_allreduce
from ansible.module_utils import preflight_core_dumps
from ansible.module_utils import preflight_debug_tools
from ansible.module_utils import preflight_iommu
from ansible.module_utils import preflight_lock as lock
from ansible.module_utils import preflight_kernel_debug
from ansible.module_utils import preflight_nic_discovery
from ansible.module_utils import preflight_port_mesh
from ansible.module_utils import preflight_ssh_trust
from ansible.module_utils.preflight_gate_run import cancel
from ansible.module_utils.preflight_jobs import no_result, wait_for
from ansible.module_utils.preflight_node import NodeOps, resolve_job_user

# The order of the verdict and of the audit: the gate's inputs first.
ORDER = (
    preflight_nic_discovery,
    preflight_port_mesh,
    preflight_allreduce,
    preflight_kernel_debug,
    preflight_core_dumps,
    preflight_iommu,
    preflight_debug_tools,
    preflight_ssh_trust,
)
BY_NAME = {module.CAPABILITY: module for module in ORDER}
NAMES = tuple(module.CAPABILITY for module in ORDER)
# What bring-up configures (the gate's capabilities have nothing to write).
BRINGUP_NAMES = ("kernel_debug", "core_dumps", "iommu", "debug_tools", "ssh_trust")
# What a node can be judged on alone (healthcheck.yml): no peer, no all-reduce across nodes.
LOCAL_NAMES = ("nic_discovery", "allreduce", "kernel_debug", "core_dumps", "iommu", "debug_tools")


def get(name):
    """The capability module called ``name``; KeyError names the known ones."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError("unknown capability %r; known: %s" % (name, ", ".join(NAMES)))


def node_info(inventory_hostname, host_vars):
    """What the controller knows of a node from the inventory alone."""
    address = host_vars.get("ansible_host") or inventory_hostname
    return {
        "name": inventory_hostname,
        "ansible_host": str(address),
        "node_addr": str(host_vars.get("preflight_node_addr") or address),
        "user": str(host_vars.get("ansible_user") or ""),
        "ssh_port": int(host_vars.get("ansible_port") or 22),
    }


def job_user_wanted(run_settings, node, python=""):
    """The ``job`` argument of the node calls: the job user wanted on ``node`` (preflight_job_user, else
    the connecting user unless root, else "" for the node to choose), whether it was named, and the
    training Python the node checks an automatic choice against."""
    named = str(run_settings.get("preflight_job_user") or "")
    connecting = node.get("user") if node.get("user") not in (None, "", "root") else ""
    return {"user": named or connecting, "named": bool(named),
            "python": str(python or run_settings.get("preflight_training_python") or "")}


SELFTEST_MESSAGE = "self-test: preflight_selftest_error names this capability, so it raises on purpose"


# The options of the two node calls, preflight_facts (readers, and in a node-local run the probes too) and
# preflight_probes (probes).
NODE_CALL_SPEC = dict(capabilities=dict(type="dict", required=True), selftest_error=dict(type="str", default=""),
                      probes=dict(type="dict", default={}), job=dict(type="dict", default={}))
# preflight_facts of a one-node run also starts the all-reduce once its facts are read.
FACTS_CALL_SPEC = dict(NODE_CALL_SPEC, early_launch=dict(type="dict", default={}), lock=dict(type="dict", default={}))


# preflight_probes also collects the background all-reduce once its probes are done (or cancels a run the
# facts call started early that the controller did not adopt: ``cancel_marker``).
PROBES_CALL_SPEC = dict(NODE_CALL_SPEC, wait_for=dict(type="dict"), release_lock=dict(type="dict", default={}))
# Seconds the probes call waits for what a cancelled run left (its runner writes it once the tree is gone).
CANCELLED_RESULT_WAIT = 10.0


def node_call(module, function_name, result_key, then=None):
    """The body of a node call: every capability's ``function_name`` through :func:`run_all`, returned
    under ``result_key`` with ``errors`` and ``elapsed``; then, with ``wait_for``
    (``{results_file, timeout, poll, what, cancel_marker}``), the background job's result as ``job``.
    ``then(module, result)``, given, adds to the result once every reader ran (the early launch).

    Job-side commands of the readers and probes run as the job user (``job``, see
    :func:`~ansible.module_utils.preflight_node.resolve_job_user`), returned as ``job_user``."""
    taken = {}
    if module.params.get("lock"):
        # The gate's run lock first: a node another run holds is reported busy and nothing else runs on it.
        taken = lock.acquire(module.params["lock"])
        if taken["state"] == "busy":
            module.exit_json(changed=False, busy=taken, lock=taken, errors={}, elapsed={}, job_user={},
                             **{result_key: {}})
    ops = NodeOps(module)
    job_user = resolve_job_user(module.params.get("job"), ops)
    ops.job, ops.job_user = job_user, job_user["run_as"]
    results, errors, elapsed = run_all(function_name, module.params["capabilities"], ops,
                                       module.params["selftest_error"])
    extra = {}
    if module.params.get("probes"):
        # A node-local run: the probes that need no peer, in the same call as the readers.
        probes, probe_errors, probe_elapsed = run_all("probe", module.params["probes"], ops,
                                                      module.params["selftest_error"])
        extra.update(probes=probes, probe_errors=probe_errors, probe_elapsed=probe_elapsed)
    if then is not None:
        extra.update(then(module, {"facts": results, "errors": errors, "job_user": job_user}))
    job = module.params.get("wait_for")
    if job:
        timeout = float(job["timeout"])
        if job.get("cancel_marker"):
            # Its tree is gone once this returns; its runner then writes what the run left (its file removed
            # once read, like any other).
            cancel(job["cancel_marker"])
            timeout = max(timeout, CANCELLED_RESULT_WAIT)
        data, waited = wait_for(job["results_file"], timeout, float(job.get("poll") or 0.1))
        if data is None:
            what = job.get("what") or "the background job"
            data = {"checks": {"no_result": no_result(what, socket.gethostname().split(".")[0], job["results_file"],
                                                      waited, timeout)}}
        extra["job"] = dict(data, waited=waited)
    if taken:
        extra["lock"] = taken
    if module.params.get("release_lock"):
        # The run's last call on this node (a run that cannot localise): the node is free again.
        extra["lock_released"] = lock.release(module.params["release_lock"])
    if getattr(ops, "hangs", None):
        # Handed to the run's next call on this node (``job["hangs"]``), which then does not wait for it again.
        extra["hangs"] = ops.hangs
    module.exit_json(changed=False, errors=errors, elapsed=elapsed, job_user=job_user,
                     **dict(extra, **{result_key: results}))


def run_all(function_name, capabilities, ops, selftest_error=""):
    """On the node: call ``function_name`` (``read`` or ``probe``) of each capability with its args.

    Each capability is its own failure domain: one that raises is recorded in
    ``errors`` (``{found, traceback}``) and the others still run.  Returns
    ``(results, errors, elapsed)``, each keyed by capability name.
    """
    results, errors, elapsed = {}, {}, {}
    for name, args in capabilities.items():
        started = time.monotonic()
        try:
            if name == selftest_error:
                raise RuntimeError(SELFTEST_MESSAGE)
            results[name] = getattr(get(name), function_name)(args, ops)
        except Exception as exc:  # pylint: disable=broad-except
            errors[name] = {"found": "%s: %s" % (type(exc).__name__, exc),
                            "traceback": traceback.format_exc()[-2000:]}
        elapsed[name] = round(time.monotonic() - started, 3)
    return results, errors, elapsed


RUN_ROLE = "preflight"


def validate_run(settings):
    """Problems in the run-wide settings (role ``preflight``)."""
    problems = []
    port = settings.get("preflight_master_port")
    if not isinstance(port, int) or not 1 <= port <= 65535:
        problems.append({"name": "preflight_master_port", "found": port, "expected": "a TCP port 1-65535",
                         "fix": "set preflight_master_port to a free port (the seeds use 6000)"})
    if settings.get("preflight_nproc_per_node", 0) < 0:
        problems.append({"name": "preflight_nproc_per_node", "found": settings.get("preflight_nproc_per_node"),
                         "expected": "0 (one rank per accelerator, 2 on CPU) or more",
                         "fix": "set preflight_nproc_per_node to 0 or a number of ranks"})
    if settings.get("preflight_mesh_degree", 2) < 2 or settings.get("preflight_mesh_full_max", 2) < 2:
        problems.append({"name": "preflight_mesh_degree", "found": "preflight_mesh_degree=%s, preflight_mesh_full_max=%s"
                         % (settings.get("preflight_mesh_degree"), settings.get("preflight_mesh_full_max")),
                         "expected": "2 or more for both (a ring successor and at least one chord)",
                         "fix": "leave them at 4 and 32, or raise them"})
    if not 5 <= settings.get("preflight_healthcheck_budget", 30) <= 3600:
        problems.append({"name": "preflight_healthcheck_budget", "found": settings.get("preflight_healthcheck_budget"),
                         "expected": "5 to 3600 seconds", "fix": "leave it at 30 (NHC's budget; Slurm kills at 60)"})
    for name in ("preflight_facts_timeout", "preflight_probes_timeout"):
        if settings.get(name, 1) < 1:
            problems.append({"name": name, "found": settings.get(name), "expected": "1 second or more",
                             "fix": "leave %s at its default or raise it" % name})
    selftest = settings.get("preflight_selftest_error") or ""
    if selftest and selftest not in NAMES:
        problems.append({"name": "preflight_selftest_error", "found": selftest,
                         "expected": "empty, or one of %s" % ", ".join(NAMES),
                         "fix": "name a capability, or leave preflight_selftest_error empty"})
    return problems


# The node tasks of preflight.yml: stage -> the variable its result is registered in, and what the
# node was doing (for "unreachable while ..." findings).  Order is the play's order.
STAGE_ORDER = ("settings", "facts", "port_mesh", "port_mesh_wait", "launch", "probes", "confirm", "apply")
STAGE_REGISTERS = {
    "settings": "preflight_settings",
    "facts": "preflight_facts",
    "port_mesh": "port_mesh_probe",
    "port_mesh_wait": "port_mesh_wait",
    "launch": "allreduce_job",
    "probes": "preflight_probes",
    "confirm": "allreduce_confirm",
    "apply": "preflight_apply",
}
STAGE_WHAT = {
    "settings": "loading its settings",
    "facts": "reading its facts",
    "port_mesh": "probing the rendezvous port",
    "port_mesh_wait": "waiting for the port mesh probe",
    "launch": "starting the all-reduce",
    "probes": "running the probes (core crash, ssh mesh) and waiting for the all-reduce",
    "confirm": "running the confirmation all-reduce over the nodes left after localisation",
    "apply": "applying the bring-up",
}
# The stages each capability's outcome depends on, besides settings and facts.
DEPENDS = {
    "nic_discovery": (),
    "port_mesh": ("port_mesh", "port_mesh_wait"),
    "allreduce": ("launch", "probes"),
    "kernel_debug": ("probes",),
    "core_dumps": ("probes",),
    "iommu": (),
    "debug_tools": (),
    "ssh_trust": ("probes",),
}
