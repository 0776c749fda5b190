# -*- coding: utf-8 -*-
"""The two node calls of a run, ``preflight_facts`` and ``preflight_probes``: every capability's reader
(``read(args, ops)``) or probe (``probe(args, ops)``) on the node, each its own failure domain.

This is the node's whole view of the capabilities: :data:`NODE_HALVES` names the node half of each one.
What the controller decides from the results is in the ``cluster_preflight`` package, which never ships.
"""

from __future__ import annotations

import socket
import time
import traceback

from . import allreduce, core_dumps, debug_tools, iommu, kernel_debug, nic_discovery, port_mesh, ssh_trust
from . import lock
from .jobs import no_result, wait_for
from .ops import NodeOps, resolve_job_user

# Capability name -> the node module holding its ``read`` (and ``probe``, where it has one).
NODE_HALVES = {module.CAPABILITY: module for module in (
    nic_discovery, port_mesh, allreduce, kernel_debug, core_dumps, iommu, debug_tools, ssh_trust)}


def get(name):
    """The node half of capability ``name``; KeyError names the known ones."""
    try:
        return NODE_HALVES[name]
    except KeyError:
        raise KeyError("unknown capability %r; known: %s" % (name, ", ".join(sorted(NODE_HALVES))))


SELFTEST_MESSAGE = "self-test: preflight_selftest_error names this capability, so it raises on purpose"


# The options of the two node calls, preflight_facts (readers, and in a node-local run the probes too) and
# preflight_probes (probes).
NODE_CALL_SPEC = dict(capabilities=dict(type="dict", required=True), selftest_error=dict(type="str", default=""),
                      probes=dict(type="dict", default={}), job=dict(type="dict", default={}))
# preflight_facts first takes the run lock.
FACTS_CALL_SPEC = dict(NODE_CALL_SPEC, lock=dict(type="dict", default={}))


# preflight_probes also collects the background all-reduce once its probes are done.
PROBES_CALL_SPEC = dict(NODE_CALL_SPEC, wait_for=dict(type="dict"), release_lock=dict(type="dict", default={}))


def node_call(module, function_name, result_key):
    """The body of a node call: every capability's ``function_name`` through :func:`run_all`, returned
    under ``result_key`` with ``errors`` and ``elapsed``; then, with ``wait_for``
    (``{results_file, timeout, poll, what}``), the background job's result as ``job``.

    Job-side commands of the readers and probes run as the job user (``job``, see
    :func:`.ops.resolve_job_user`), returned as ``job_user``."""
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
    job = module.params.get("wait_for")
    if job:
        timeout = float(job["timeout"])
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
