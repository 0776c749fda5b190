"""The allreduce module: parsing, findings, and real bounded launches on this machine."""

import os
import socket

import pytest

import allreduce
from ansible.module_utils import preflight_proc

WORKER = os.path.join(os.path.dirname(__file__), "..", "..", "roles", "allreduce", "files", "allreduce_worker.py")
PYTHON = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      ".venv", "bin", "python")

TORCHRUN_FAILURE = """
[vm:0]:preflight: rank 0 failed at stage correctness: RuntimeError: Connection closed by peer
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
allreduce_worker.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-21_23:01:02
  host      : vm
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 4242)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-21_23:01:01
  host      : vm
  rank      : 1 (local_rank: 1)
  exitcode  : 3 (pid: 4243)
  error_file: <N/A>
"""


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_parse_exitcodes_reads_torchrun_summary():
    assert allreduce.parse_exitcodes(TORCHRUN_FAILURE) == {0: -15, 1: 3}


def base_params(**overrides):
    params = dict(python=PYTHON, nnodes=1, node_rank=0, nproc_per_node=2, master_addr="127.0.0.1",
                  master_port=6000, backend="gloo", timeout=30.0, hard_timeout=120.0, sizes=[4096], iters=1,
                  warmup=0, selftest_fault="none", selftest_rank=-1, min_busbw_gbps=0.0, socket_ifname=None, env={})
    params.update(overrides)
    return params


def test_summarize_marks_unfinished_ranks_died_or_hung():
    params = base_params()
    files = {0: {"stage": "correctness", "status": "running"}, 1: {"stage": "done", "status": "ok", "correct": True}}
    died = allreduce.summarize_ranks(params, files, {0: 3}, {}, timed_out=False)
    assert died[0]["status"] == "died" and died[0]["exitcode"] == 3 and died[1]["status"] == "ok"
    hung = allreduce.summarize_ranks(params, files, {}, {0: {"state": "T", "stack": "x"}}, timed_out=True)
    assert hung[0]["status"] == "hung" and hung[0]["process_state"] == "stopped (SIGSTOP)"


def test_node_checks_fail_names_rank_stage_and_exit_code():
    params = base_params()
    ranks = allreduce.summarize_ranks(params, {0: {"stage": "init", "status": "running"}}, {0: -9}, {}, False)
    checks = allreduce.node_checks(params, "node7", 1, False, 3.0, ranks)
    result = checks["allreduce_ranks"]
    assert result["status"] == "fail"
    assert "rank 0" in result["found"] and "stage init" in result["found"] and "exit code -9" in result["found"]
    assert "node7" in result["found"] and result["fix"]


def test_bandwidth_minimum_gates(tmp_path):
    params = base_params(min_busbw_gbps=100.0)
    ranks = [{"rank": 0, "local_rank": 0, "status": "ok", "correct": True, "correctness": {"wrong": 0},
              "bandwidth": [{"size_bytes": 4096, "busbw_gbps": 1.5, "algbw_gbps": 1.5}]}]
    checks = allreduce.node_checks(params, "n1", 0, False, 1.0, ranks)
    assert checks["allreduce_bandwidth"]["status"] == "fail"
    assert "1.500 GB/s" in checks["allreduce_bandwidth"]["found"]
    checks = allreduce.node_checks(base_params(min_busbw_gbps=1.0), "n1", 0, False, 1.0, ranks)
    assert checks["allreduce_bandwidth"]["status"] == "pass"


def module_args(**overrides):
    args = dict(python=PYTHON, worker_source=open(WORKER).read(), nnodes=1, node_rank=0, nproc_per_node=2,
                master_addr="127.0.0.1", master_port=free_port(), timeout=20, hard_timeout=90, sizes=[65536],
                iters=1, warmup=0, socket_ifname="lo")
    args.update(overrides)
    return args


def leftovers():
    return [pid for pid in preflight_proc.all_pids()
            if any("allreduce_worker.py" in part and "preflight-allreduce-" in part
                   for part in preflight_proc.cmdline_of(pid))]


@pytest.mark.timeout(180)
def test_real_two_rank_launch_passes_in_check_mode(run_module):
    result, failed = run_module(allreduce, module_args(), check_mode=True)
    assert not failed, result
    assert result["torchrun_rc"] == 0 and not result["timed_out"]
    assert [r["status"] for r in result["ranks"]] == ["ok", "ok"]
    assert result["checks"]["allreduce_ranks"]["status"] == "pass"
    assert result["checks"]["allreduce_correctness"]["status"] == "pass"
    assert any(line.startswith("[") and ":0]" in line for line in result["log"].splitlines())
    assert result["ranks"][0]["versions"]["torch"].startswith("2.")
    assert not os.path.exists(result["argv"][result["argv"].index("--out") + 1]), "scratch removed"


@pytest.mark.timeout(180)
def test_rank_exit_is_named_and_nothing_is_left(run_module):
    result, failed = run_module(allreduce, module_args(selftest_fault="exit", selftest_rank=1))
    assert not failed
    by_rank = {r["rank"]: r for r in result["ranks"]}
    assert by_rank[1]["status"] == "died" and by_rank[1]["exitcode"] == 3
    assert result["checks"]["allreduce_ranks"]["status"] == "fail"
    assert not leftovers()


@pytest.mark.timeout(180)
def test_hung_rank_is_caught_by_collective_timeout_with_its_stack(run_module):
    result, failed = run_module(allreduce, module_args(selftest_fault="hang", selftest_rank=1, timeout=4,
                                                       hard_timeout=60))
    assert not failed
    assert result["timed_out"] is False, "the collective timeout ended it, not the hard bound"
    by_rank = {r["rank"]: r for r in result["ranks"]}
    assert by_rank[0]["status"] == "error" and by_rank[0]["stage"] == "correctness"
    # Rank 1 never left init; its stack was taken while rank 0 lingered on its error.
    assert by_rank[1]["status"] == "hung" and by_rank[1]["stage"] == "init"
    assert "main" in by_rank[1]["stack"]
    assert result["checks"]["allreduce_ranks"]["status"] == "fail"
    assert not leftovers()


@pytest.mark.timeout(180)
def test_hard_timeout_dumps_stacks_and_kills_everything(run_module):
    result, failed = run_module(allreduce, module_args(selftest_fault="hang", selftest_rank=1, timeout=9.5,
                                                       hard_timeout=10))
    assert not failed
    assert result["timed_out"] is True and result["torchrun_rc"] is None
    stacks = {r["rank"]: r.get("stack", "") for r in result["ranks"]}
    assert all("Thread" in stack for stack in stacks.values()), stacks
    assert "hard timeout" in result["checks"]["allreduce_ranks"]["found"]
    assert not leftovers()


def test_bad_arguments_are_rejected(run_module):
    result, failed = run_module(allreduce, module_args(master_port=70000))
    assert failed and "master_port 70000" in result["msg"]
    result, failed = run_module(allreduce, module_args(nproc_per_node=0))
    assert failed and "nproc_per_node" in result["msg"]
