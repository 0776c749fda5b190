# -*- coding: utf-8 -*-
"""One rank of an all-reduce started by Slurm (node layer): the srun engine's launch, supervised as torchrun's is.

The srun engine (``cluster_preflight/engine/srun.py``) starts the ranks of an all-reduce as the tasks of one step,
``--ntasks-per-node`` ranks per node, instead of a torchrun per node: task ``SLURM_LOCALID`` of a node with
launch arguments ``node_rank``, ``nproc_per_node``, ``nnodes`` (the plan's, the same the ssh engine hands
torchrun) is rank ``node_rank * nproc_per_node + SLURM_LOCALID`` of ``nnodes * nproc_per_node``, with
``MASTER_ADDR``/``MASTER_PORT`` the plan's master.  In the all-node run the plan's node order is the allocation's,
so these are Slurm's own ``SLURM_PROCID`` and ``SLURM_NTASKS``; in a localisation round every pair is a process
group of its own in the same step (its own master and port).

Each task, as root, does for its one rank what ``gate_run.run_gate`` does for a node's: a scratch directory made
before the job's user gets ``job/`` (``module_utils/preflight_node/allreduce_run/scratch.py``), the worker run as the
job's
user with the training Python under the hard bound (``proc.run_bounded``), its output in a file of root's read
back through the descriptor, the stack of a hung, failed, slow or stopped rank taken with py-spy within the stack
budget, the result file read without following anything the job's user controls.  Its result is one rank's
record; the controller assembles a node's result from its ranks' records (``cluster_preflight/engine/ranks.py``).
"""

from __future__ import annotations

import os
import signal
import socket
import uuid

from .py_spy_choice import find_py_spy
from .gate_run import (WORKER_NAME, _me, _watchers, build_env, check_params, guarded, summarize_ranks,
                       worker_args)
from ..host.lock import hold_for_call
from ..host.ops import as_user
from ..host.proc import run_bounded
from .scratch import head_and_tail, read_log, read_rank_files

LOG_NAME = "rank.log"


def identity(params, local_rank):
    """``(rank, world size, local world size)`` of the task ``local_rank`` on a node with launch ``params``."""
    nproc = int(params["nproc_per_node"])
    return int(params["node_rank"]) * nproc + local_rank, int(params["nnodes"]) * nproc, nproc


def rank_env(params, job_path, account, local_rank):
    """The rank's environment: the ranks' (``gate_run.build_env``) and what torchrun would give it."""
    rank, world, nproc = identity(params, local_rank)
    env = build_env(params, job_path, account)
    env.update(RANK=str(rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(nproc),
               GROUP_RANK=str(params["node_rank"]), MASTER_ADDR=str(params["master_addr"]),
               MASTER_PORT=str(params["master_port"]))
    return env


def _log_of(fd, params):
    """``(log text for the node's log, the rank log entry)`` of the rank's output file (root's descriptor)."""
    text, size = read_log(fd, int(params["log_max_bytes"]) // max(1, int(params["nproc_per_node"])))
    limit = int(params["rank_log_max_bytes"])
    data = head_and_tail(fd, size, limit) if size > limit else os.pread(fd, size, 0)
    return text, {"bytes": size, "truncated": size > limit, "text": data.decode(errors="replace")}


def run_rank(params, host, local_rank, scratch, marker):
    """Start this task's rank, bound it, take its stack, kill it; its record (see the module docstring)."""
    rank, world, _nproc = identity(params, local_rank)
    account, credentials = None, None
    if params["run_as"] and params["run_as"] != _me():
        account, credentials = as_user(params["run_as"])
    worker_path = scratch.write(WORKER_NAME, params["worker_source"], 0o644)
    log_fd = scratch.open_log(LOG_NAME)
    try:
        job_path = scratch.hand_over()
        argv = [params["python"], worker_path] + worker_args(params, os.path.join(job_path, "ranks"))
        py_spy, refused = find_py_spy(params, account)
        stacks = {}
        budget = {"left": float(params["stack_budget"]), "spent": 0.0}
        take_stacks, poll = _watchers(worker_path, scratch, py_spy, marker, credentials, stacks, budget)
        rc, timed_out, elapsed = run_bounded(argv, params["hard_timeout"], env=rank_env(params, job_path, account,
                                                                                      local_rank),
                                             cwd=job_path, stdout_fd=log_fd, marker=marker, on_timeout=take_stacks,
                                             poll=poll, poll_interval=0.25, credentials=credentials)
        log_text, rank_log = _log_of(log_fd, params)
    finally:
        os.close(log_fd)
    with scratch.job() as job:
        rank_files, refused_files = read_rank_files(job)
    entries = summarize_ranks(params, rank_files, {rank: rc} if rc is not None else {}, stacks, timed_out,
                              refused_files)
    entry = next(item for item in entries if item["rank"] == rank)
    rank_log.update(rank=rank, local_rank=local_rank, stream="stdout", attempt=0, name="rank%d.stdout.log" % rank)
    return {"rank": entry, "rank_log": rank_log, "log": log_text, "rc": rc, "timed_out": timed_out,
            "elapsed": elapsed, "stack_seconds": round(budget["spent"], 3), "world_size": world, "hostname": host,
            "argv": argv, "py_spy_refused": refused, "py_spy": py_spy,
            "run_as": {"name": account.pw_name, "uid": account.pw_uid} if account else
            {"name": _me(), "uid": os.geteuid()}}


def bounded_rank(params, host, local_rank, marker):
    """:func:`run_rank` in a scratch directory of its own, interruptible (the step ended by the controller): the
    record, or ``failed`` with ``msg``."""
    record, interrupted, seconds = guarded(params, marker, lambda scratch: run_rank(params, host, local_rank, scratch,
                                                                                  marker),
                                           signals=(signal.SIGTERM, signal.SIGHUP, signal.SIGINT))
    if interrupted:
        return {"failed": True, "interrupted": interrupted.signal_name, "hostname": host,
                "msg": "rank %d on %s was interrupted by %s after %.1f s (its step was ended); its process tree "
                       "was killed" % (identity(params, local_rank)[0], host, interrupted.signal_name, seconds)}
    return record


def module_main(module):
    """A rank task's body over the srun step's module: its launch arguments are the ``allreduce`` module's."""
    params = module.params
    local_rank = int(os.environ.get("SLURM_LOCALID") or 0)
    if local_rank >= int(params["nproc_per_node"]):
        # A node of the step with fewer ranks than the step's tasks per node (a loopback run beside GPU pairs).
        module.exit_json(changed=False, idle=True, local_rank=local_rank)
    problems = check_params(params)
    if problems:
        module.fail_json(msg="; ".join(problems))
    # Every rank renews the run lock for the launch's bound (one renewal is enough; more do no harm).
    hold_for_call(module, params["lock"])
    host = params["role"] or socket.gethostname().split(".")[0]
    record = bounded_rank(params, host, local_rank, uuid.uuid4().hex)
    if record.get("failed"):
        module.fail_json(**dict(record, local_rank=local_rank))
    module.exit_json(changed=False, **record)
