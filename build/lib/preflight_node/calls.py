# -*- coding: utf-8 -*-
"""The node calls of a run (``module_utils/preflight_node/calls.py``, node layer): their option specs and their
body, which runs every capability's reader (``read(args, ops)``) or probe (``probe(args, ops)``) on the node,
each its own failure domain.

The registry a call runs is its parameter, so each call ships only what it runs: ``library/preflight_facts.py``
passes the readers (``module_utils/preflight_node/readers.py``), ``library/preflight_probes.py`` the probes
(``module_utils/preflight_node/probes.py``) and ``library/preflight_local.py`` (the node-local health check)
both.  What the controller decides from the results is in the ``cluster_preflight`` package, which never ships.
"""

from __future__ import annotations

import socket
import time
import traceback

from .host import lock
from . import registry
from .host.jobs import no_result, wait_for
from .host.ops import NodeOps, job_account, resolve_job_user

SELFTEST_MESSAGE = "self-test: preflight_selftest_error names this capability, so it raises on purpose"


# The options every node call takes: preflight_facts (readers), preflight_probes (probes), preflight_local
# (readers, then the probes that need no peer).
NODE_CALL_SPEC = dict(capabilities=dict(type="dict", required=True), selftest_error=dict(type="str", default=""),
                      job=dict(type="dict", default={}))
# preflight_facts first takes the run lock; preflight_probes renews it first.
FACTS_CALL_SPEC = dict(NODE_CALL_SPEC, lock=dict(type="dict", default={}))
# preflight_probes also collects the background all-reduce once its probes are done.
PROBES_CALL_SPEC = dict(NODE_CALL_SPEC, wait_for=dict(type="dict"), release_lock=dict(type="dict", default={}),
                        lock=dict(type="dict", default={}))
# preflight_local runs the node-local probes it names after the readers.
LOCAL_CALL_SPEC = dict(NODE_CALL_SPEC, probes=dict(type="dict", default={}))


def node_call(module, halves, function_name, result_key, local_probes=None):
    """The body of a node call: ``function_name`` of every capability in ``halves`` (the registry module,
    ``readers`` or ``probes``: its ``get(name)``) through :func:`run_all`, returned under ``result_key`` with
    ``errors`` and ``elapsed``; with ``local_probes`` (the ``probes`` registry, node-local call) the probes
    named in the ``probes`` option too; then, with ``wait_for`` (``{results_file, timeout, poll, what}``),
    the background job's result as ``job``, and after it the probes the registry declares ``after_job`` (a probe
    reading what the job changed, such as the fabric's error counters).

    Job-side commands of the readers and probes run as the job user (``job``, see
    :func:`.ops.resolve_job_user`), returned as ``job_user``."""
    taken = {}
    if module.params.get("lock"):
        # The gate's run lock first (taken by the facts call, renewed by the later ones): a node another run
        # holds is reported busy (or lost, to a renewal) and nothing else runs on it.
        taken = lock.acquire(module.params["lock"])
        if taken["state"] in ("busy", "lost"):
            module.exit_json(changed=False, busy=taken, lock=taken, errors={}, elapsed={}, job_user={},
                             **{result_key: {}})
    ops = NodeOps(module)
    job_user = resolve_job_user(module.params.get("job"), ops)
    ops.job, ops.job_user = job_user, job_account(job_user)
    capabilities = module.params["capabilities"]
    # A probe that reads what the all-reduce changed (the fabric's error counters) runs after it was collected.
    late = {name: args for name, args in capabilities.items()
            if function_name == "probe" and registry.after_job(name)}
    early = {name: args for name, args in capabilities.items() if name not in late}
    results, errors, elapsed = run_all(halves, function_name, early, ops, module.params["selftest_error"])
    extra = {}
    if local_probes is not None and module.params.get("probes"):
        # A node-local run: the probes that need no peer, in the same call as the readers.
        probes, probe_errors, probe_elapsed = run_all(local_probes, "probe", module.params["probes"], ops,
                                                      module.params["selftest_error"])
        extra.update(probes=probes, probe_errors=probe_errors, probe_elapsed=probe_elapsed)
    job = module.params.get("wait_for")
    if job:
        extra["job"] = _collect(job)
    if late:
        for result, more in zip((results, errors, elapsed),
                                run_all(halves, function_name, late, ops, module.params["selftest_error"])):
            result.update(more)
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


def _collect(job):
    """The background job's result (``wait_for``: ``{results_file, timeout, poll, what}``) with ``waited``;
    a job with no result in time gives ``checks.no_result``."""
    timeout = float(job["timeout"])
    data, waited = wait_for(job["results_file"], timeout, float(job.get("poll") or 0.1))
    if data is None:
        what = job.get("what") or "the background job"
        data = {"checks": {"no_result": no_result(what, socket.gethostname().split(".")[0], job["results_file"],
                                                  waited, timeout)}}
    return dict(data, waited=waited)


def run_all(halves, function_name, capabilities, ops, selftest_error=""):
    """On the node: call ``function_name`` (``read`` or ``probe``) of each capability, looked up in ``halves``
    (the registry module: ``readers`` or ``probes``), with its args.

    Each capability is its own failure domain: one that raises (an unknown one too) is recorded in
    ``errors`` (``{found, traceback}``) and the others still run.  Returns
    ``(results, errors, elapsed)``, each keyed by capability name.
    """
    results, errors, elapsed = {}, {}, {}
    for name, args in capabilities.items():
        started = time.monotonic()
        try:
            if name == selftest_error:
                raise RuntimeError(SELFTEST_MESSAGE)
            results[name] = getattr(halves.get(name), function_name)(args, ops)
        except Exception as exc:  # pylint: disable=broad-except
            errors[name] = {"found": "%s: %s" % (type(exc).__name__, exc),
                            "traceback": traceback.format_exc()[-2000:]}
        elapsed[name] = round(time.monotonic() - started, 3)
    return results, errors, elapsed
