# -*- coding: utf-8 -*-
"""The gate's run on one node: torchrun under a hard bound, stacks of hung ranks, the node's result.

Run by ``library/allreduce.py`` (the launch task, the localisation rounds, the confirmation run).
:data:`ARGUMENT_SPEC` is the allreduce module's options; :func:`check_params` what the spec cannot say;
:func:`start_in_background` the detached run that writes its result to a file ``job_wait`` (or the probes
call) reads.
"""

from __future__ import annotations

import json
import os
import re
import pwd
import shutil
import signal
import socket
import stat
import time
import uuid

from ..checks import failed, not_applicable, passed
from ..host.lock import RUN_ENV, hold_for_call
from ..host.ops import as_user, user_environment
from .scratch import Scratch, read_log, read_rank_files, read_rank_logs
from .py_spy_choice import find_py_spy, py_spy_check
from ..host.proc import (MARKER_ENV, Guard, Interrupted, cmdline_of, descendants, environ_of, interruptible, kill_tree,
                         pids_with_marker, proc_stat, py_spy_dump_all, run_bounded)

WORKER_NAME = "allreduce_worker.py"
# Seconds a rank may stay stopped (SIGSTOP, state T) before the run is ended as failed; a py-spy dump stops a
# rank only for a moment, and as a tracer (state t), which does not count.
STOPPED_GRACE = 5.0
# torchrun's failure summary: "rank      : 1 (local_rank: 1)" then "exitcode  : 3 (pid: 123)".
_SUMMARY_RE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)\s*(?:\[[^\]]*\])?\s*"
                         r"exitcode\s*:\s*(-?\d+)", re.S)


def build_argv(params, worker_path, out_dir, role, log_dir):
    return [
        params["python"], "-m", "torch.distributed.run",
        "--role", "%s:" % role, "--tee", "3",
        # torchrun's default is a torchelastic_* directory in /tmp, never removed.
        "--log-dir", log_dir,
        "--nnodes", str(params["nnodes"]),
        "--nproc-per-node", str(params["nproc_per_node"]),
        "--node-rank", str(params["node_rank"]),
        "--master-addr", params["master_addr"],
        "--master-port", str(params["master_port"]),
        "--max-restarts", "0",
        "--rdzv-conf", "timeout=%d" % max(1, int(params["timeout"])),
        worker_path] + worker_args(params, out_dir)


def worker_args(params, out_dir):
    """The worker's own arguments (after its path), whoever starts it: torchrun, or a Slurm task."""
    argv = [
        "--out", out_dir,
        "--backend", params["backend"],
        "--timeout", str(params["timeout"]),
        "--sizes", ",".join(str(size) for size in params["sizes"]),
        "--iters", str(params["iters"]),
        "--warmup", str(params["warmup"]),
    ]
    if params.get("bandwidth_deadline"):
        argv += ["--bandwidth-deadline", str(params["bandwidth_deadline"])]
        if params.get("bandwidth_grace") is not None:
            argv += ["--bandwidth-grace", str(params["bandwidth_grace"])]
    if params.get("check_elements"):
        argv += ["--check-elements", str(params["check_elements"])]
    if params["selftest_fault"] != "none":
        argv += ["--selftest-fault", params["selftest_fault"], "--selftest-rank", str(params["selftest_rank"])]
    return argv


# Job configuration the node's environment may carry into the ranks when they run as another account
# (everything else of this module's environment stays behind).
JOB_ENV_PREFIXES = ("NCCL_", "GLOO_", "CUDA_", "HIP_", "ROCR_", "HSA_", "TORCH_", "OMP_", "FI_", "UCX_")


def build_env(params, scratch, account=None):
    """The ranks' environment; with ``account`` (a pwd entry) a minimal one for that user."""
    if account is None:
        env = dict(os.environ)
    else:
        env = user_environment(account, {key: value for key, value in os.environ.items()
                                         if key.startswith(JOB_ENV_PREFIXES)})
    env.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1")})
    # torch warns at import when numpy is absent; noise in every node's log.
    env.setdefault("PYTHONWARNINGS", "ignore:Failed to initialize NumPy")
    # Whatever torch, gloo or the worker put in the temp directory goes away with the scratch directory.
    env["TMPDIR"] = scratch
    if params["socket_ifname"]:
        env["GLOO_SOCKET_IFNAME"] = params["socket_ifname"]
        env["NCCL_SOCKET_IFNAME"] = "=" + params["socket_ifname"]
    if params.get("backend") == "nccl":
        # The transport NCCL chose and its warnings land in the rank logs, where the controller's
        # signatures read them; an operator's NCCL_DEBUG (node environment or env) wins.
        env.setdefault("NCCL_DEBUG", "INFO")
    env.update({str(key): str(value) for key, value in params["env"].items()})
    if params.get("run_id"):
        # The run lock ends what a dead run left on the node by this (module_utils/preflight_node/host/lock.py).
        env[RUN_ENV] = params["run_id"]
    return env


def parse_exitcodes(log_text):
    """{global_rank: exitcode} from torchrun's ChildFailedError summary."""
    return {int(rank): int(code) for rank, _local, code in _SUMMARY_RE.findall(log_text)}


def live_ranks(root_pid, worker_path, marker):
    """{pid: (global_rank, state)} of the worker processes still alive.

    By parentage and by marker: a worker whose launcher died was re-parented."""
    found = {}
    for pid in set(descendants(root_pid)) | set(pids_with_marker(marker) if marker else ()):
        if worker_path not in cmdline_of(pid):
            continue
        stat = proc_stat(pid)
        if not stat or stat[0] in ("Z", "X"):
            continue
        found[pid] = (int(environ_of(pid).get("RANK", -1)), stat[0])
    return found


def collect_stacks(root_pid, worker_path, py_spy, budget, marker=None, credentials=None):
    """Stacks of every live rank, dumped at once within ``budget`` seconds.

    Returns {global_rank: {pid, state, stack, stack_finished}}."""
    ranks = live_ranks(root_pid, worker_path, marker)
    if py_spy:
        # As the ranks' user, py-spy gets that user's minimal environment, nothing of root's.
        env = user_environment(pwd.getpwuid(credentials["user"])) if credentials else dict(os.environ)
        if marker:
            # A py-spy left behind by a killed module is then found and killed with the tree.
            env[MARKER_ENV] = marker
        # A stopped rank cannot be paused again by py-spy; it cannot move either.
        dumps = py_spy_dump_all({pid: state in ("T", "t") for pid, (_rank, state) in ranks.items()}, py_spy,
                                budget, env=env, credentials=credentials)
    else:
        dumps = {pid: (False, "py-spy not found on this node") for pid in ranks}
    return {rank: {"pid": pid, "state": state, "stack": dumps[pid][1], "stack_finished": dumps[pid][0]}
            for pid, (rank, state) in ranks.items()}


STATE_NAMES = {"R": "running", "S": "sleeping", "D": "uninterruptible (I/O)", "T": "stopped (SIGSTOP)",
               "t": "stopped by a tracer", "Z": "zombie"}


def summarize_ranks(params, rank_files, exitcodes, stacks, timed_out, refused=None):
    """One entry per local rank; ``refused``: ``{rank: why}`` of result files root would not read (a link, not
    the job user's, too large), which leave the rank ``missing`` with the reason as its error."""
    first = params["node_rank"] * params["nproc_per_node"]
    ranks = []
    refused = refused or {}
    for local in range(params["nproc_per_node"]):
        rank = first + local
        data = rank_files.get(rank, {})
        if rank in refused or None in refused:
            data = {"error": refused.get(rank) or refused[None], "refused": True}
        entry = {
            "rank": rank,
            "local_rank": local,
            "stage": data.get("stage", "not started"),
            "status": data.get("status", "missing"),
            "correct": data.get("correct"),
            "correctness": data.get("correctness"),
            "bandwidth": data.get("bandwidth", []),
            "versions": data.get("versions"),
            "error": data.get("error"),
            "exitcode": exitcodes.get(rank),
            "pid": data.get("pid"),
            "uid": data.get("uid"),
        }
        if data.get("slow"):
            entry["slow"] = data["slow"]
        if data.get("refused"):
            entry["refused"] = True
        if entry["status"] == "running":
            # The worker never wrote a final status. Alive when its stack was
            # taken (a peer failed, or the hard timeout expired): it hung.
            # Otherwise it was killed or crashed.
            entry["status"] = "hung" if (timed_out or rank in stacks) else "died"
        if rank in stacks:
            entry.update(process_state=STATE_NAMES.get(stacks[rank]["state"], stacks[rank]["state"]),
                         stack=stacks[rank]["stack"], stack_finished=stacks[rank].get("stack_finished", True))
        ranks.append(entry)
    return ranks


def _ranks_failure(params, host, rc, timed_out, bad):
    """``(found, fix)`` of the ``ranks`` check of a run whose ranks ``bad`` did not all finish."""
    # What started the ranks: torchrun (the ssh engine), or Slurm's tasks (``launcher``, the srun engine).
    launcher = params.get("launcher") or "torchrun"
    described = []
    for r in bad:
        text = "rank %d (local %d) %s at stage %s" % (r["rank"], r["local_rank"], r["status"], r["stage"])
        if r.get("exitcode") is not None:
            text += " exit code %d" % r["exitcode"]
        if r.get("process_state"):
            text += " process %s" % r["process_state"]
        if r.get("stack_finished") is False:
            text += " (no stack: %s)" % r["stack"].strip().splitlines()[0][:200]
        if r.get("error"):
            text += ": %s" % r["error"].splitlines()[0][:300]
        if r.get("slow"):
            slow = r["slow"]
            text += ": past the bandwidth deadline of %.1f s at busbw %.4f GB/s (%d collectives, at %d bytes)" % (
                slow["deadline_seconds"], slow["busbw_reached_gbps"], slow["collectives_done"], slow["size_bytes"])
        described.append(text)
    if any(r["status"] == "slow" for r in bad) and not timed_out:
        found = "the all-reduce on %s was slow and ended at its bandwidth deadline; %s" % (
            host, "; ".join(described))
        fix = ("the run was too slow to finish at the floor busbw: see allreduce.localize for the node that causes "
               "it (link speed, shaping, errors, MTU on the path the collectives use; NCCL's transport for nccl)")
    elif timed_out:
        found = "no result after the %.0f s hard timeout on %s; %s" % (
            params["hard_timeout"], host, "; ".join(described) or "%s never started the ranks" % launcher)
        fix = ("read the hang stacks in the run directory (py-spy dump per rank); a rank stuck in init means "
               "it cannot reach %s:%d (firewall, wrong interface, master down); a rank stuck in a collective "
               "points at its peer or the network" % (params["master_addr"], params["master_port"]))
    elif any(r.get("refused") for r in bad):
        found = "%s exited %s on %s; %s" % (launcher, rc, host, "; ".join(described))
        fix = ("the job's user replaced the gate's result files on %s while its ranks ran (links or other files "
               "where the ranks write): look at what the training Python %s runs as that user (a "
               "sitecustomize, a .pth file, a wrapper script); the gate never reads through them"
               % (host, params["python"]))
    else:
        found = "%s exited %s on %s; %s" % (launcher, rc, host, "; ".join(described) or "no rank started")
        fix = ("read this node's log in the run directory for the first failing rank's traceback; if the "
               "ranks never started check that %s imports torch and that port %d is free on the master"
               % (params["python"], params["master_port"]))
    return found, fix


def node_checks(params, host, rc, timed_out, elapsed, ranks):
    checks = {}
    bad = [r for r in ranks if r["status"] != "ok"]
    if not bad and rc == 0:
        checks["ranks"] = passed(
            "%d rank(s) on %s completed init, correctness, barrier and bandwidth in %.1f s"
            % (len(ranks), host, elapsed), "every rank reaches stage done")
    else:
        found, fix = _ranks_failure(params, host, rc, timed_out, bad)
        checks["ranks"] = failed(found, "every rank on %s reaches stage done and exits 0" % host, fix)
    wrong = [r for r in ranks if r.get("correctness") and r["correctness"].get("wrong")]
    if wrong:
        r = wrong[0]
        checks["correctness"] = failed(
            "rank %d on %s saw %d wrong element(s) after all-reduce; first %s" % (
                r["rank"], host, r["correctness"]["wrong"], json.dumps(r["correctness"]["first_wrong"])),
            "every element equals sum over ranks of (rank+1)*(i%13+1)",
            "silent data corruption: drain %s and run the vendor's diagnostics (GPU memory, NIC, PCIe)" % host)
    elif any(r.get("correct") for r in ranks):
        checks["correctness"] = passed("every element correct on every rank of %s" % host,
                                       "exact all-reduce result")
    # The largest size is the one gated (the sizes may be given in any order).
    rows = [max(r["bandwidth"], key=lambda row: row.get("size_bytes") or 0) for r in ranks if r.get("bandwidth")]
    if rows and int(params.get("nnodes") or 1) * int(params.get("nproc_per_node") or 1) == 1:
        # One rank moves no data between ranks: its "all-reduce" is a copy on one device, so any busbw (or a floor
        # compared with it) would claim a link that was never measured.
        largest = max(rows, key=lambda row: row.get("size_bytes") or 0)
        checks["bandwidth"] = not_applicable(
            "one rank on %s (world size 1): the all-reduce crossed no link (algbw %.3f GB/s at %d bytes is a copy on "
            "one device); busbw not measured" % (host, largest.get("algbw_gbps") or 0, largest.get("size_bytes") or 0))
    elif rows:
        slowest = min(rows, key=lambda row: row["busbw_gbps"])
        found = "busbw %.3f GB/s (algbw %.3f GB/s) at %d bytes on %s" % (
            slowest["busbw_gbps"], slowest["algbw_gbps"], slowest["size_bytes"], host)
        minimum = params["min_busbw_gbps"]
        if minimum and slowest["busbw_gbps"] < minimum:
            checks["bandwidth"] = failed(
                found, "busbw >= %.3f GB/s" % minimum,
                "check the chosen interface (NCCL_SOCKET_IFNAME), link speed and MTU on %s; with nccl, "
                "allreduce.signatures and the rank logs (NCCL_DEBUG=INFO) say which transport NCCL picked" % host)
        else:
            checks["bandwidth"] = passed(
                found, ("busbw >= %.3f GB/s" % minimum) if minimum else "reported (no minimum set)")
    return checks


def _watchers(worker_path, scratch, py_spy, marker, credentials, stacks, budget):
    """``(take_stacks, poll)`` of one run: stacks of its ranks into ``stacks`` within ``budget``
    (``{left, spent}`` seconds), and the poll that takes them and ends the run early when a rank failed,
    fell below the bandwidth deadline or was held stopped (see :func:`run_gate`)."""

    def take_stacks(pid):
        if budget["left"] <= 0:
            return
        start = time.monotonic()
        try:
            found = collect_stacks(pid, worker_path, py_spy, budget["left"], marker=marker, credentials=credentials)
        finally:
            spent = time.monotonic() - start
            budget["left"] -= spent
            budget["spent"] += spent
        for rank, entry in found.items():
            # A later stack is the newer story, unless it did not finish.
            if entry["stack_finished"] or not stacks.get(rank, {}).get("stack_finished"):
                stacks[rank] = entry

    failed_seen = []
    stopped_since = {}

    def stopped_too_long(pid):
        # A rank held stopped (SIGSTOP) never moves again by itself, and its own watchdog is stopped with it.
        now, live = time.monotonic(), live_ranks(pid, worker_path, marker)
        for rank_pid, (_rank, state) in live.items():
            if state == "T":
                stopped_since.setdefault(rank_pid, now)
            else:
                stopped_since.pop(rank_pid, None)
        return any(now - since >= STOPPED_GRACE for rank_pid, since in stopped_since.items() if rank_pid in live)

    def poll(pid):
        # A rank that failed lingers a moment (the worker's --linger) so the
        # stacks of its still-running peers can be taken before torchrun
        # tears them down: the peer stuck in a collective is the story.
        if failed_seen:
            return
        with scratch.job() as job:
            statuses = {data.get("status") for data in read_rank_files(job)[0].values()}
        stopped = stopped_too_long(pid)
        if not statuses & {"error", "wrong", "slow"} and not stopped:
            return
        failed_seen.append(True)
        take_stacks(pid)
        # A stopped rank never acts on torchrun's SIGTERM, and torchrun waits 30 s before its SIGKILL:
        # with its stack (or its state) recorded, kill it now so the verdict does not wait for nothing.
        for rank_pid, (rank, state) in live_ranks(pid, worker_path, marker).items():
            if state in ("T", "t"):
                stacks.setdefault(rank, {"pid": rank_pid, "state": state, "stack_finished": False,
                                         "stack": "no stack taken (stack_budget used up or 0)"})
                try:
                    os.kill(rank_pid, signal.SIGKILL)
                except OSError:
                    pass
        if "slow" in statuses or stopped:
            # Past the bandwidth deadline, or a rank held stopped: nothing more is learnt by waiting.  The
            # stacks say where the ranks were, the rank files what they reached; end the run now instead of
            # at the hard timeout.
            kill_tree(pid, marker=marker)

    return take_stacks, poll


def run_gate(params, host, role, scratch, marker):
    """Launch, bound, take stacks, kill; the module's result (without ``changed``).  ``scratch``: the run's
    :class:`.scratch.Scratch`, whose files root writes before the job's user gets ``job/`` and reads back only
    through descriptors (docs/security.md)."""
    account, credentials = None, None
    if params["run_as"] and params["run_as"] != _me():
        # torchrun, its ranks and py-spy of them run as the job's user, in a directory it owns.
        account, credentials = as_user(params["run_as"])
    worker_path = scratch.write(WORKER_NAME, params["worker_source"], 0o644)
    log_fd = scratch.open_log()
    try:
        job_path = scratch.hand_over()
        argv = build_argv(params, worker_path, os.path.join(job_path, "ranks"), role,
                          os.path.join(job_path, "torchrun-logs"))
        py_spy, refused = find_py_spy(params, account)
        stacks = {}
        # One budget for every stack collection of the run, so the module's bound
        # is hard_timeout + stack_budget + the kill, however often ranks fail.
        budget = {"left": float(params["stack_budget"]), "spent": 0.0}
        take_stacks, poll = _watchers(worker_path, scratch, py_spy, marker, credentials, stacks, budget)
        rc, timed_out, elapsed = run_bounded(argv, params["hard_timeout"], env=build_env(params, job_path, account),
                                             cwd=job_path, stdout_fd=log_fd, marker=marker, on_timeout=take_stacks,
                                             poll=poll, poll_interval=0.25, credentials=credentials)
        log_text = read_log(log_fd, params["log_max_bytes"])[0]
    finally:
        os.close(log_fd)
    first = params["node_rank"] * params["nproc_per_node"]
    with scratch.job() as job:
        rank_files, refused_files = read_rank_files(job)
        rank_logs = read_rank_logs(job, first, params["rank_log_max_bytes"])
    ranks = summarize_ranks(params, rank_files, parse_exitcodes(log_text), stacks, timed_out, refused_files)
    checks = node_checks(params, host, rc, timed_out, elapsed, ranks)
    if refused:
        checks["py_spy"] = py_spy_check(host, refused, py_spy)
    return dict(torchrun_rc=rc, timed_out=timed_out, elapsed=elapsed, stack_seconds=round(budget["spent"], 3),
                ranks=ranks, log=log_text, rank_logs=rank_logs, argv=argv, hostname=host,
                scratch=scratch.path if params["keep_scratch"] else None,
                run_as={"name": account.pw_name, "uid": account.pw_uid} if account else
                {"name": _me(), "uid": os.geteuid()}, checks=checks)


ARGUMENT_SPEC = dict(
    python=dict(type="path", required=True),
    worker_source=dict(type="str", required=True),
    nnodes=dict(type="int", required=True),
    node_rank=dict(type="int", required=True),
    nproc_per_node=dict(type="int", required=True),
    master_addr=dict(type="str", required=True),
    master_port=dict(type="int", default=6000),
    backend=dict(type="str", default="gloo", choices=["gloo", "nccl"]),
    timeout=dict(type="float", default=30),
    hard_timeout=dict(type="float", default=120),
    stack_budget=dict(type="float", default=20),
    sizes=dict(type="list", elements="int", default=[1048576, 4194304, 16777216]),
    iters=dict(type="int", default=5),
    warmup=dict(type="int", default=2),
    bandwidth_deadline=dict(type="float", default=0),
    bandwidth_grace=dict(type="float"),
    check_elements=dict(type="int", default=0),
    min_busbw_gbps=dict(type="float", default=0),
    role=dict(type="str"),
    run_as=dict(type="str"),
    socket_ifname=dict(type="str"),
    env=dict(type="dict", default={}),
    py_spy=dict(type="path"),
    scratch_dir=dict(type="path"),
    keep_scratch=dict(type="bool", default=False),
    log_max_bytes=dict(type="int", default=262144),
    rank_log_max_bytes=dict(type="int", default=32768),
    selftest_fault=dict(type="str", default="none", choices=["none", "exit", "hang", "corrupt"]),
    selftest_rank=dict(type="int", default=-1),
    background=dict(type="bool", default=False),
    run_id=dict(type="str", default=""),
    results_file=dict(type="path"),
)


def _me():
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())



def check_params(params):
    """What the argument spec cannot say about ``params`` (validated allreduce options): a list of problems."""
    problems = []
    if not 1 <= params["master_port"] <= 65535:
        problems.append("master_port %d is outside 1-65535" % params["master_port"])
    if params["nproc_per_node"] < 1:
        problems.append("nproc_per_node must be at least 1, got %d" % params["nproc_per_node"])
    if not 0 <= params["node_rank"] < max(params["nnodes"], 1):
        problems.append("node_rank %d is outside 0..nnodes-1 (nnodes=%d)" % (params["node_rank"], params["nnodes"]))
    if params["timeout"] <= 0 or params["hard_timeout"] <= params["timeout"]:
        problems.append("need 0 < timeout < hard_timeout, got timeout=%s hard_timeout=%s"
                        % (params["timeout"], params["hard_timeout"]))
    if params["stack_budget"] < 0:
        problems.append("stack_budget must be 0 or more seconds, got %s" % params["stack_budget"])
    for name in ("log_max_bytes", "rank_log_max_bytes"):
        if params[name] < 0:
            problems.append("%s must be 0 or more, got %d" % (name, params[name]))
    if params["run_as"]:
        try:
            pwd.getpwnam(params["run_as"])
        except KeyError:
            problems.append("run_as %s: no such user on this node (getent passwd %s); create it or correct "
                            "preflight_job_user" % (params["run_as"], params["run_as"]))
        else:
            if params["run_as"] != _me() and os.geteuid() != 0:
                problems.append("run_as %s needs root to switch users, and the module runs as %s; set "
                                "preflight_become=true or connect as %s" % (params["run_as"], _me(), params["run_as"]))
    if params["scratch_dir"]:
        problems += _scratch_dir_problems(params["scratch_dir"])
    return problems


def _scratch_dir_problems(path):
    """A scratch parent others could rename entries in would let them swap root's scratch directory."""
    try:
        info = os.lstat(path)
    except OSError:
        info = None
    if info is None or not stat.S_ISDIR(info.st_mode):
        return ["scratch_dir %s is not a directory" % path]
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        return ["scratch_dir %s is writable by other accounts without the sticky bit (mode %04o), so they could "
                "replace the run's scratch directory: use a directory only root writes, or one with the sticky "
                "bit such as /tmp" % (path, stat.S_IMODE(info.st_mode))]
    return []


def guarded(params, marker, work, signals=(signal.SIGTERM, signal.SIGHUP)):
    """``(result, Interrupted or None, seconds)`` of ``work(scratch)`` in a scratch directory of its own (made for
    the job's user, removed after, also when this process is killed outright), interruptible by ``signals``."""
    started = time.monotonic()
    result, interrupted, scratch = None, None, None
    with interruptible(signals):
        try:
            account = as_user(params["run_as"])[0] if params["run_as"] and params["run_as"] != _me() else None
            scratch = Scratch(params["scratch_dir"], account)
            # The guard cleans up if this process is killed outright (SIGKILL).
            with Guard(marker, cleanup=[] if params["keep_scratch"] else [scratch.path]):
                try:
                    result = work(scratch)
                finally:
                    _remove(scratch, params["keep_scratch"])
        except Interrupted as exc:
            interrupted = exc
            # The signal may have cut the removal above short; another one cannot interrupt this.
            _remove(scratch, params["keep_scratch"])
    return result, interrupted, time.monotonic() - started


def bounded_run(params, host, marker):
    """The whole gate on this node, interruptible: the module's result, or ``failed`` with ``msg``."""
    result, interrupted, seconds = guarded(params, marker, lambda scratch: run_gate(params, host, host, scratch,
                                                                                   marker))
    if interrupted:
        return {"failed": True, "interrupted": interrupted.signal_name, "hostname": host,
                "msg": "the all-reduce on %s was interrupted by %s after %.1f s; its process tree was killed"
                       % (host, interrupted.signal_name, seconds)}
    return result


def _remove(scratch, keep):
    if scratch is None:
        return
    scratch.close()
    if not keep:
        # rmtree removes links, never what they point to.
        shutil.rmtree(scratch.path, ignore_errors=True)


def _write_json(path, data):
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as handle:
        json.dump(data, handle)
    os.replace(tmp, path)


def start_in_background(params, host, marker):
    """Run the gate in a detached process that writes its result to a file ``job_wait`` reads.

    The module returns at once (the play's other checks run meanwhile) without Ansible's async
    wrapper, so it works under any connection and strategy.  Until the result is in, the file
    says ``started``.  Everything the run imports was imported before the fork.
    """
    results_file = params["results_file"] or os.path.join(os.path.expanduser("~/.ansible_async"),
                                                          "preflight-allreduce-%s.json" % marker)
    os.makedirs(os.path.dirname(results_file), mode=0o700, exist_ok=True)
    _write_json(results_file, {"started": 1, "finished": 0})
    child = os.fork()
    if child:
        os.waitpid(child, 0)
        return results_file
    # The detached runner: a new session, no tie to the module's pipes (Ansible waits for them).
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        try:
            outcome = bounded_run(params, host, marker)
        except Exception as exc:  # pylint: disable=broad-except
            outcome = {"failed": True, "msg": "the all-reduce on %s raised %s: %s" % (host, type(exc).__name__, exc)}
        outcome.setdefault("changed", False)
        _write_json(results_file, outcome)
    finally:
        os._exit(0)


# The allreduce module's options (library/allreduce.py): the run's, and the run lock it renews for its bound.
MODULE_SPEC = dict(ARGUMENT_SPEC, lock=dict(type="dict", default={}))


def module_main(module):
    """The allreduce module's body over ``module`` (an AnsibleModule)."""
    params = module.params
    problems = check_params(params)
    if problems:
        module.fail_json(msg="; ".join(problems))
    # The run lock covers the launch (its hard bound) before anything starts.
    hold_for_call(module, params["lock"])
    # Findings name the node as the inventory does (the role prefix), its hostname otherwise.
    host = params["role"] or socket.gethostname().split(".")[0]
    marker = uuid.uuid4().hex
    if params["background"]:
        results_file = start_in_background(params, host, marker)
        module.exit_json(changed=False, started=1, finished=0, results_file=results_file)
    outcome = bounded_run(params, host, marker)
    if outcome.get("failed"):
        module.fail_json(**outcome)
    module.exit_json(changed=False, **outcome)
