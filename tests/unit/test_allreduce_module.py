"""The allreduce module: parsing, findings, and real bounded launches on this machine."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

import allreduce
from preflight_node.allreduce_run import gate_run
from preflight_node.host import proc as preflight_proc
from preflight_node.allreduce_run.scratch import JobView

WORKER = os.path.join(os.path.dirname(__file__), "..", "..", "roles", "allreduce", "files", "allreduce_worker.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON = os.path.join(ROOT, ".venv", "bin", "python")

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
    assert gate_run.parse_exitcodes(TORCHRUN_FAILURE) == {0: -15, 1: 3}


def base_params(**overrides):
    params = dict(python=PYTHON, nnodes=1, node_rank=0, nproc_per_node=2, master_addr="127.0.0.1",
                  master_port=6000, backend="gloo", timeout=30.0, hard_timeout=120.0, sizes=[4096], iters=1,
                  warmup=0, selftest_fault="none", selftest_rank=-1, min_busbw_gbps=0.0, socket_ifname=None, env={})
    params.update(overrides)
    return params


def test_summarize_marks_unfinished_ranks_died_or_hung():
    params = base_params()
    files = {0: {"stage": "correctness", "status": "running"}, 1: {"stage": "done", "status": "ok", "correct": True}}
    died = gate_run.summarize_ranks(params, files, {0: 3}, {}, timed_out=False)
    assert died[0]["status"] == "died" and died[0]["exitcode"] == 3 and died[1]["status"] == "ok"
    hung = gate_run.summarize_ranks(params, files, {}, {0: {"state": "T", "stack": "x"}}, timed_out=True)
    assert hung[0]["status"] == "hung" and hung[0]["process_state"] == "stopped (SIGSTOP)"


def test_node_checks_fail_names_rank_stage_and_exit_code():
    params = base_params()
    ranks = gate_run.summarize_ranks(params, {0: {"stage": "init", "status": "running"}}, {0: -9}, {}, False)
    checks = gate_run.node_checks(params, "node7", 1, False, 3.0, ranks)
    result = checks["ranks"]
    assert result["status"] == "fail"
    assert "rank 0" in result["found"] and "stage init" in result["found"] and "exit code -9" in result["found"]
    assert "node7" in result["found"] and result["fix"]


def test_bandwidth_minimum_gates(tmp_path):
    params = base_params(min_busbw_gbps=100.0)
    ranks = [{"rank": 0, "local_rank": 0, "status": "ok", "correct": True, "correctness": {"wrong": 0},
              "bandwidth": [{"size_bytes": 4096, "busbw_gbps": 1.5, "algbw_gbps": 1.5}]}]
    checks = gate_run.node_checks(params, "n1", 0, False, 1.0, ranks)
    assert checks["bandwidth"]["status"] == "fail"
    assert "1.500 GB/s" in checks["bandwidth"]["found"]
    checks = gate_run.node_checks(base_params(min_busbw_gbps=1.0), "n1", 0, False, 1.0, ranks)
    assert checks["bandwidth"]["status"] == "pass"


def test_one_rank_measures_no_bandwidth():
    """World size 1 (one GPU): the all-reduce is a copy on one device; a busbw or a floor compared with it would claim
    a link that carried nothing."""
    ranks = [{"rank": 0, "local_rank": 0, "status": "ok", "correct": True, "correctness": {"wrong": 0},
              "bandwidth": [{"size_bytes": 1 << 30, "busbw_gbps": 38503.9, "algbw_gbps": 38503.9}]}]
    checks = gate_run.node_checks(base_params(nproc_per_node=1, min_busbw_gbps=100.0), "gpu1", 0, False, 1.0, ranks)
    assert checks["bandwidth"]["status"] == "not_applicable"
    assert "world size 1" in checks["bandwidth"]["found"] and "busbw not measured" in checks["bandwidth"]["found"]
    assert checks["correctness"]["status"] == "pass"


def test_argv_and_env_keep_every_file_in_scratch():
    params = base_params(socket_ifname="eth1", env={"NCCL_DEBUG": "INFO"})
    argv = gate_run.build_argv(params, "/s/w.py", "/s/ranks", "n1", "/s/torchrun-logs")
    assert argv[argv.index("--log-dir") + 1] == "/s/torchrun-logs"
    assert argv.index("--log-dir") < argv.index("/s/w.py"), "a torchrun option, not the worker's"
    env = gate_run.build_env(params, "/s")
    assert env["TMPDIR"] == "/s" and env["NCCL_SOCKET_IFNAME"] == "=eth1" and env["NCCL_DEBUG"] == "INFO"


def test_a_bandwidth_grace_goes_to_the_worker_with_its_deadline():
    argv = gate_run.build_argv(base_params(bandwidth_deadline=10.0, bandwidth_grace=3.0), "/s/w.py", "/s/ranks", "n1",
                               "/s/torchrun-logs")
    assert argv[argv.index("--bandwidth-deadline") + 1] == "10.0" and argv[argv.index("--bandwidth-grace") + 1] == "3.0"
    # No deadline, no grace: the stage is bounded by the hard timeout only.
    argv = gate_run.build_argv(base_params(bandwidth_grace=3.0), "/s/w.py", "/s/ranks", "n1", "/s/torchrun-logs")
    assert "--bandwidth-deadline" not in argv and "--bandwidth-grace" not in argv


def test_rank_logs_are_tails_of_torchruns_per_rank_files(tmp_path):
    for local, text in ((0, "a" * 100), (1, "hello")):
        directory = tmp_path / "torchrun-logs" / "run_abc" / "attempt_0" / str(local)
        directory.mkdir(parents=True)
        (directory / "stdout.log").write_text(text)
        (directory / "stderr.log").write_text("")
    (tmp_path / "torchrun-logs" / "run_abc" / "attempt_0" / "filtered_stdout.log").write_text("not a rank's")
    with JobView.at(str(tmp_path)) as job:
        logs = gate_run.read_rank_logs(job, 4, 10)
    assert [(e["rank"], e["local_rank"], e["stream"]) for e in logs] == [
        (4, 0, "stderr"), (4, 0, "stdout"), (5, 1, "stderr"), (5, 1, "stdout")]
    first = logs[1]
    assert first["name"] == "rank4.stdout.log" and first["text"] == "aa[... 90 bytes cut ...]\n" + "a" * 8
    assert first["bytes"] == 100 and first["truncated"] is True
    assert logs[3]["text"] == "hello" and logs[3]["truncated"] is False


def test_a_long_rank_log_keeps_nccls_transport_line_from_init_and_its_tail(tmp_path):
    directory = tmp_path / "torchrun-logs" / "run_abc" / "attempt_0" / "0"
    directory.mkdir(parents=True)
    init = "n1:40:40 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:198.18.200.1<0>\n"
    (directory / "stderr.log").write_text(init + "NCCL INFO channel chatter\n" * 5000 + "RuntimeError: the end\n")
    with JobView.at(str(tmp_path)) as job:
        text = gate_run.read_rank_logs(job, 0, 32768)[0]["text"]
    assert text.startswith(init) and text.endswith("RuntimeError: the end\n")
    assert "bytes cut ...]" in text and len(text.encode()) <= 32768 + 64


def module_args(**overrides):
    args = dict(python=PYTHON, worker_source=open(WORKER).read(), nnodes=1, node_rank=0, nproc_per_node=2,
                master_addr="127.0.0.1", master_port=free_port(), timeout=20, hard_timeout=90, sizes=[65536],
                iters=1, warmup=0, socket_ifname="lo",
                # As root, named (the embedded default's): the node checks run_as against it.
                run_as="root", job={"user": "root", "named": True})
    args.update(overrides)
    return args


def leftovers(result):
    """Processes still running this run's worker (other runs may share the machine)."""
    worker = result["argv"][result["argv"].index("--out") - 1]
    return [(pid, preflight_proc.cmdline_of(pid)) for pid in preflight_proc.all_pids()
            if worker in preflight_proc.cmdline_of(pid)]


@pytest.fixture
def temp_dirs(tmp_path, monkeypatch):
    """(system temp dir, scratch parent): both empty, both under tmp_path."""
    system = tmp_path / "systemtmp"
    scratch = tmp_path / "scratch"
    system.mkdir()
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(system))
    monkeypatch.setattr(tempfile, "tempdir", None)
    return system, scratch


def entries(*directories):
    return [str(path) for directory in directories for path in directory.iterdir()]


def rank_log(result, rank, stream):
    return [e for e in result["rank_logs"] if e["rank"] == rank and e["stream"] == stream][0]["text"]


@pytest.mark.timeout(180)
def test_real_two_rank_launch_passes_in_check_mode_and_leaves_no_temp_files(run_module, temp_dirs):
    system, _scratch = temp_dirs
    result, failed = run_module(allreduce, module_args(), check_mode=True)
    assert not failed, result
    assert result["torchrun_rc"] == 0 and not result["timed_out"]
    assert [r["status"] for r in result["ranks"]] == ["ok", "ok"]
    assert result["checks"]["ranks"]["status"] == "pass"
    assert result["checks"]["correctness"]["status"] == "pass"
    assert set(result["checks"]) == {"ranks", "correctness", "bandwidth"}
    assert any(line.startswith("[") and ":0]" in line for line in result["log"].splitlines())
    assert result["ranks"][0]["versions"]["torch"].startswith("2.")
    assert "preflight: world_size=2" in rank_log(result, 0, "stdout")
    assert {(e["rank"], e["stream"]) for e in result["rank_logs"]} == {
        (0, "stdout"), (0, "stderr"), (1, "stdout"), (1, "stderr")}
    assert result["stack_seconds"] == 0
    assert not os.path.exists(result["argv"][result["argv"].index("--out") + 1]), "scratch removed"
    assert entries(system) == [], "the scratch directory in the system temp dir is gone, and nothing else is there"


@pytest.mark.timeout(180)
def test_rank_exit_is_named_and_nothing_is_left(run_module, temp_dirs):
    system, scratch = temp_dirs
    result, failed = run_module(allreduce, module_args(selftest_fault="exit", selftest_rank=1,
                                                       scratch_dir=str(scratch)))
    assert not failed
    by_rank = {r["rank"]: r for r in result["ranks"]}
    assert by_rank[1]["status"] == "died" and by_rank[1]["exitcode"] == 3
    assert result["checks"]["ranks"]["status"] == "fail"
    assert "selftest: rank 1 exits with code 3" in rank_log(result, 1, "stdout")
    assert not leftovers(result)
    assert entries(system, scratch) == []


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
    assert "main" in by_rank[1]["stack"] and by_rank[1]["stack_finished"] is True
    assert result["checks"]["ranks"]["status"] == "fail"
    assert "failed at stage correctness" in rank_log(result, 0, "stderr")
    assert not leftovers(result)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("collective_timeout", [4, 60])
def test_a_stopped_rank_is_killed_once_its_peer_failed_not_left_to_torchruns_30_s_grace(run_module, temp_dirs,
                                                                                        collective_timeout):
    """SIGSTOP rank 1 in the bandwidth loop: rank 0 times out in its collective (4 s), or, with a collective
    timeout longer than that (60 s), the rank has been stopped for STOPPED_GRACE; either way the module takes the
    stacks and kills the stopped rank at once (it never acts on torchrun's SIGTERM, which torchrun would wait 30 s
    on), and the run ends long before the hard timeout."""
    import threading  # pylint: disable=import-outside-toplevel
    _system, scratch = temp_dirs
    stopped = []

    def stop_rank_one():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not stopped:
            for pid in preflight_proc.all_pids():
                argv = preflight_proc.cmdline_of(pid)
                if "--out" not in argv or not argv[argv.index("--out") + 1].startswith(str(scratch)):
                    continue
                try:
                    with open("/proc/%d/environ" % pid, "rb") as handle:
                        env = dict(item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item)
                    with open(os.path.join(argv[argv.index("--out") + 1], "rank1.json")) as handle:
                        stage = json.load(handle).get("stage")
                except (OSError, ValueError, IndexError):
                    continue
                if env.get(b"RANK") == b"1" and stage == "bandwidth":
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
                    return
            time.sleep(0.05)

    stopper = threading.Thread(target=stop_rank_one, daemon=True)
    stopper.start()
    result, failed = run_module(allreduce, module_args(timeout=collective_timeout, hard_timeout=100,
                                                       sizes=[4194304], iters=4000, scratch_dir=str(scratch)))
    stopper.join(10)
    assert stopped, "rank 1 was never seen in the bandwidth loop"
    assert not failed and result["timed_out"] is False
    by_rank = {r["rank"]: r for r in result["ranks"]}
    assert by_rank[1]["status"] == "hung" and by_rank[1]["process_state"] == "stopped (SIGSTOP)", by_rank[1]
    assert by_rank[1]["stage"] == "bandwidth", by_rank[1]
    # With the long collective timeout the module ends the whole tree (torchrun too, so no summary line).
    assert by_rank[1]["exitcode"] == -9 or (collective_timeout == 60 and by_rank[1]["exitcode"] is None), by_rank[1]
    assert result["elapsed"] < 40, "ended at the stopped rank, not the 100 s hard timeout"
    assert result["checks"]["ranks"]["status"] == "fail"
    # torchrun did not have to force it: the module had killed it already.
    assert "forcefully exiting via" not in result["log"], result["log"][-2000:]
    assert not leftovers(result)


@pytest.mark.timeout(180)
def test_a_run_past_its_bandwidth_deadline_is_slow_with_the_busbw_reached_and_ends_at_once(run_module, temp_dirs):
    """Far more iterations than the deadline allows: every rank is marked slow by its watchdog with the busbw it
    reached, the stacks are taken, and the run ends seconds after the deadline, not at the hard timeout."""
    _system, scratch = temp_dirs
    started = time.monotonic()
    result, failed = run_module(allreduce, module_args(timeout=20, hard_timeout=150, sizes=[4194304], iters=100000,
                                                       bandwidth_deadline=3, scratch_dir=str(scratch)))
    wall = time.monotonic() - started
    assert not failed and result["timed_out"] is False, result
    assert wall < 60, "ended at the deadline, not the hard timeout (%.1f s)" % wall
    by_rank = {r["rank"]: r for r in result["ranks"]}
    assert {r["status"] for r in by_rank.values()} == {"slow"}, by_rank
    for row in by_rank.values():
        assert row["stage"] == "bandwidth" and row["slow"]["deadline_seconds"] == 3
        assert row["slow"]["busbw_reached_gbps"] > 0 and row["slow"]["collectives_done"] > 0, row["slow"]
        assert row["slow"]["size_bytes"] == 4194304
        assert "main" in row.get("stack", ""), row
    found = result["checks"]["ranks"]
    assert found["status"] == "fail" and "bandwidth deadline of 3.0 s" in found["found"], found
    assert "--bandwidth-deadline" in result["argv"]
    assert not leftovers(result)


@pytest.mark.timeout(180)
def test_ranks_and_py_spy_run_as_the_job_user_and_a_hung_ranks_stack_is_taken_without_root(run_module):
    import pwd
    if os.geteuid() != 0:
        pytest.skip("switching to another account needs root")
    from job_env import job_python
    python = job_python("nobody")
    if python is None:
        pytest.skip("no Python with torch that nobody can run on this machine")
    nobody = pwd.getpwnam("nobody")
    parent = tempfile.mkdtemp(prefix="preflight-test-", dir="/tmp")
    os.chmod(parent, 0o711)  # pytest's tmp_path is root's alone; the job user must reach its scratch
    try:
        result, failed = run_module(allreduce, module_args(selftest_fault="hang", selftest_rank=1, timeout=4,
                                                           hard_timeout=60, run_as="nobody", scratch_dir=parent,
                                                           python=python, job={"user": "nobody", "named": True}))
        assert not failed, result
        assert result["run_as"] == {"name": "nobody", "uid": nobody.pw_uid}
        by_rank = {r["rank"]: r for r in result["ranks"]}
        assert {r["uid"] for r in result["ranks"]} == {nobody.pw_uid}
        # py-spy ran as nobody too: it attached to nobody's hung rank with the user's own rights.
        assert by_rank[1]["status"] == "hung" and "main" in by_rank[1]["stack"], by_rank[1]
        assert not leftovers(result) and os.listdir(parent) == []
    finally:
        os.rmdir(parent)


@pytest.mark.timeout(180)
def test_hard_timeout_dumps_stacks_and_kills_everything(run_module, temp_dirs):
    system, scratch = temp_dirs
    result, failed = run_module(allreduce, module_args(selftest_fault="hang", selftest_rank=1, timeout=9.5,
                                                       hard_timeout=10, scratch_dir=str(scratch)))
    assert not failed
    assert result["timed_out"] is True and result["torchrun_rc"] is None
    stacks = {r["rank"]: r.get("stack", "") for r in result["ranks"]}
    assert all("Thread" in stack for stack in stacks.values()), stacks
    assert 0 < result["stack_seconds"] <= 20
    assert "hard timeout" in result["checks"]["ranks"]["found"]
    assert not leftovers(result)
    assert entries(system, scratch) == []


def test_bad_arguments_are_rejected(run_module):
    result, failed = run_module(allreduce, module_args(master_port=70000))
    assert failed and "master_port 70000" in result["msg"]
    result, failed = run_module(allreduce, module_args(nproc_per_node=0))
    assert failed and "nproc_per_node" in result["msg"]
    result, failed = run_module(allreduce, module_args(stack_budget=-1))
    assert failed and "stack_budget" in result["msg"]


# Quick runs without torch: a launcher that does what torchrun does to the tree
# (each rank in a session of its own, per-rank logs under --log-dir, a file in
# the temp directory) and a worker that hangs, leaving an orphan re-parented to
# init, or succeeds.
FAKE_TORCHRUN = r"""#!{python}
import os, subprocess, sys, tempfile
args = sys.argv[sys.argv.index("torch.distributed.run") + 1:]  # after "[-s] -m torch.distributed.run"
options = {}
while args[0].startswith("--"):
    options[args[0]] = args[1]
    args = args[2:]
worker, rest = args[0], args[1:]
nproc, node_rank = int(options["--nproc-per-node"]), int(options["--node-rank"])
tempfile.mkstemp(prefix="fake-torchrun-")  # torch and gloo may do this; TMPDIR must catch it
os.makedirs(options["--log-dir"], exist_ok=True)
attempt = os.path.join(tempfile.mkdtemp(prefix="run_", dir=options["--log-dir"]), "attempt_0")
ranks = []
for local in range(nproc):
    directory = os.path.join(attempt, str(local))
    os.makedirs(directory)
    env = dict(os.environ, RANK=str(node_rank * nproc + local), LOCAL_RANK=str(local), WORLD_SIZE=str(nproc))
    ranks.append(subprocess.Popen([sys.executable, worker] + rest, env=env, start_new_session=True,
                                  stdout=open(os.path.join(directory, "stdout.log"), "w"),
                                  stderr=open(os.path.join(directory, "stderr.log"), "w")))
print("fake torchrun started %d ranks" % nproc, flush=True)
sys.exit(max(rank.wait() for rank in ranks))
"""
FAKE_WORKER = r"""
import json, os, sys, time
args = sys.argv[1:]
out = args[args.index("--out") + 1]
fault = args[args.index("--selftest-fault") + 1] if "--selftest-fault" in args else "none"
rank = int(os.environ["RANK"])
pids = os.environ["FAKE_PIDS"]
os.makedirs(out, exist_ok=True)
def write(**data):
    path = os.path.join(out, "rank%d.json" % rank)
    json.dump(dict(rank=rank, pid=os.getpid(), **data), open(path + ".tmp", "w"))
    os.replace(path + ".tmp", path)
def note(name, pid):
    open(os.path.join(pids, name + ".tmp"), "w").write(str(pid))
    os.replace(os.path.join(pids, name + ".tmp"), os.path.join(pids, name))
print("fake rank %d says hello" % rank, flush=True)
print("fake rank %d warns" % rank, file=sys.stderr, flush=True)
if fault != "hang":
    write(stage="done", status="ok", correct=True, correctness={"wrong": 0},
          bandwidth=[{"size_bytes": 4096, "busbw_gbps": 1.0, "algbw_gbps": 1.0, "time_us": 1.0}])
    sys.exit(0)
write(stage="init", status="running")
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        note("orphan.%d" % rank, os.getpid())
        while True:
            time.sleep(1)
    os._exit(0)
note("rank.%d" % rank, os.getpid())
while True:
    time.sleep(1)
"""
# py-spy stand-in: answers at once for rank 0 and never for the others.
FAKE_PY_SPY = r"""#!{python}
import sys, time
pid = sys.argv[sys.argv.index("--pid") + 1]
environ = open("/proc/%s/environ" % pid, "rb").read().split(b"\0")
if b"RANK=0" not in environ:
    time.sleep(300)
print("Thread %s (idle): MainThread\n    main (allreduce_worker.py:1)" % pid)
"""


def executable(path, text):
    path.write_text(text.replace("{python}", sys.executable))
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def fakes(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    return {"python": executable(tmp_path / "fake-python", FAKE_TORCHRUN),
            "py_spy": executable(tmp_path / "fake-py-spy", FAKE_PY_SPY), "pids": pids}


def fake_args(fakes, **overrides):
    args = module_args(python=fakes["python"], py_spy=fakes["py_spy"], worker_source=FAKE_WORKER,
                       env={"FAKE_PIDS": str(fakes["pids"])}, timeout=1, hard_timeout=2, stack_budget=1.5)
    args.update(overrides)
    return args


def tree_pids(fakes, count=4, seconds=20):
    deadline = time.monotonic() + seconds
    while len(list(fakes["pids"].glob("*.[0-9]"))) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return [int(path.read_text()) for path in fakes["pids"].glob("*.[0-9]")]


def all_dead(pids, seconds=10):
    deadline = time.monotonic() + seconds
    while any(preflight_proc._alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not [pid for pid in pids if preflight_proc._alive(pid)]


@pytest.mark.timeout(60)
def test_fake_pass_returns_rank_logs_and_leaves_no_temp_files(run_module, fakes, temp_dirs):
    system, scratch = temp_dirs
    result, failed = run_module(allreduce, fake_args(fakes, hard_timeout=30, scratch_dir=str(scratch)))
    assert not failed, result
    assert result["torchrun_rc"] == 0 and result["checks"]["ranks"]["status"] == "pass", result["log"]
    assert rank_log(result, 1, "stdout") == "fake rank 1 says hello\n"
    assert rank_log(result, 1, "stderr") == "fake rank 1 warns\n"
    assert entries(system, scratch) == [], "the launcher's temp file went to the scratch directory"


@pytest.mark.timeout(60)
def test_stacks_are_taken_at_once_within_the_budget_and_late_ones_are_named(run_module, fakes, temp_dirs):
    system, scratch = temp_dirs
    start = time.monotonic()
    result, failed = run_module(allreduce, fake_args(fakes, selftest_fault="hang", scratch_dir=str(scratch)))
    took = time.monotonic() - start
    assert not failed, result
    assert result["timed_out"] is True
    # hard_timeout + stack_budget + the kill, not a dump per rank one after another.
    assert took < 2 + 1.5 + preflight_proc.KILL_GRACE + 2, took
    assert result["stack_seconds"] <= 1.5 + 0.5
    by_rank = {r["rank"]: r for r in result["ranks"]}
    assert by_rank[0]["stack_finished"] is True and "MainThread" in by_rank[0]["stack"]
    assert by_rank[1]["stack_finished"] is False
    assert by_rank[1]["stack"] == "py-spy dump did not finish within the 1.5 s stack budget"
    found = result["checks"]["ranks"]["found"]
    assert "rank 1 (local 1) hung" in found and "no stack: py-spy dump did not finish" in found
    pids = tree_pids(fakes)
    assert len(pids) == 4 and all_dead(pids), "ranks and their orphans (re-parented, own session) are gone"
    assert not [pid for pid in preflight_proc.all_pids() if fakes["py_spy"] in preflight_proc.cmdline_of(pid)]
    assert entries(system, scratch) == []


DRIVER = r"""
import json, sys
sys.path[:0] = [{library!r}, {root!r}]
import ansible.module_utils
ansible.module_utils.__path__.append({module_utils!r})
from ansible.module_utils.testing import patch_module_args
import allreduce
with patch_module_args(json.load(open(sys.argv[1]))):
    allreduce.main()
"""


def start_driver(tmp_path, args):
    """The module in a process of its own (as Ansible runs it), in its own process group."""
    (tmp_path / "args.json").write_text(json.dumps(args))
    source = DRIVER.format(library=os.path.join(ROOT, "library"), root=ROOT,
                           module_utils=os.path.join(ROOT, "module_utils"))
    return subprocess.Popen([sys.executable, "-c", source, str(tmp_path / "args.json")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)


@contextlib.contextmanager
def hung_driver(tmp_path, fakes):
    """The module driving a selftest that hangs, and the pids of its process tree; the module is killed
    on the way out if still running."""
    driver = start_driver(tmp_path, fake_args(fakes, selftest_fault="hang", hard_timeout=50, timeout=40))
    try:
        yield driver, tree_pids(fakes)
    finally:
        if driver.poll() is None:
            driver.kill()


@pytest.mark.timeout(60)
def test_sigterm_kills_the_tree_and_removes_scratch(tmp_path, fakes, temp_dirs):
    system, _scratch = temp_dirs
    with hung_driver(tmp_path, fakes) as (driver, pids):
        assert len(pids) == 4
        driver.send_signal(signal.SIGTERM)
        out, err = driver.communicate(timeout=20)
    result = json.loads(out)
    assert result["failed"] and result["interrupted"] == "SIGTERM", (out, err)
    assert "interrupted by SIGTERM" in result["msg"]
    assert all_dead(pids)
    assert entries(system) == [], "scratch removed"


@pytest.mark.timeout(60)
def test_sigkill_of_the_module_group_still_kills_the_tree_and_removes_scratch(tmp_path, fakes, temp_dirs):
    system, _scratch = temp_dirs
    with hung_driver(tmp_path, fakes) as (driver, pids):
        assert len(pids) == 4
        # What async_wrapper does when the task's async time runs out.
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=10)
    assert all_dead(pids, 15), "the guard killed the tree"
    deadline = time.monotonic() + 10
    while entries(system) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert entries(system) == [], "the guard removed the scratch directory"
