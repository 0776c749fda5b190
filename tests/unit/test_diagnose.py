"""diagnose: process discovery from a fake /proc, frames from recorded py-spy dumps, grouping and suspects.

The dump texts below were recorded on this machine with py-spy 0.4.3: a sleeping Python
(``sleeper.py``: a main thread and a helper thread in ``time.sleep``), and a two-rank gloo job
(torchrun --nproc-per-node 2, ``job.py`` looping ``dist.all_reduce``) with rank 1 stopped by SIGSTOP:
rank 0 waits in ``all_reduce``, rank 1 (read with --nonblocking) sits in its loop.
"""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from preflight_node import diagnose as diag
from cluster_preflight.stages import diagnosis as controller

SLEEP = (
    'Process 24316: /usr/bin/python3 sleeper.py\n'
    'Python v3.11.2 (/usr/bin/python3.11)\n'
    '\n'
    'Thread 24316 (idle): "MainThread"\n'
    '    main (sleeper.py:9)\n'
    '    <module> (sleeper.py:12)\n'
    'Thread 24318 (idle): "helper"\n'
    '    worker (sleeper.py:5)\n'
    '    Thread.run (threading.py:975)\n'
    '    Thread._bootstrap_inner (threading.py:1038)\n'
    '    Thread._bootstrap (threading.py:995)\n'
)

SLEEP_NATIVE = (
    'Process 24316: /usr/bin/python3 sleeper.py\n'
    'Python v3.11.2 (/usr/bin/python3.11)\n'
    '\n'
    'Thread 24316 (idle): "MainThread"\n'
    '    clock_nanosleep (libc.so.6)\n'
    '    main (sleeper.py:9)\n'
    '    <module> (sleeper.py:12)\n'
    '    0x7f774291c24a (libc.so.6)\n'
    'Thread 24318 (idle): "helper"\n'
    '    clock_nanosleep (libc.so.6)\n'
    '    worker (sleeper.py:5)\n'
    '    Thread.run (threading.py:975)\n'
    '    Thread._bootstrap_inner (threading.py:1038)\n'
    '    Thread._bootstrap (threading.py:995)\n'
    '    0x7f774297e1f5 (libc.so.6)\n'
    '    0x7f77429fe8ec (libc.so.6)\n'
)

HANG_RANK0 = (
    'Process 24576: /work/main/.venv/bin/python -u job.py\n'
    'Python v3.11.7 (/root/.pyenv/versions/3.11.7/bin/python3.11)\n'
    '\n'
    'Thread 24576 (idle): "MainThread"\n'
    '    all_reduce (torch/distributed/distributed_c10d.py:3252)\n'
    '    _exception_logger.<locals>.wrapper (torch/distributed/c10d_logger.py:83)\n'
    '    main (job.py:10)\n'
    '    <module> (job.py:16)\n'
)

HANG_RANK0_NATIVE = (
    'Process 24576: /work/main/.venv/bin/python -u job.py\n'
    'Python v3.11.7 (/root/.pyenv/versions/3.11.7/bin/python3.11)\n'
    '\n'
    'Thread 24576 (idle): "MainThread"\n'
    '    0x7fadae2a3f16 (libc.so.6)\n'
    '    pthread_cond_wait (libc.so.6)\n'
    '    std::condition_variable::wait (libstdc++.so.6.0.30)\n'
    '    c10d::Work::wait (libtorch_cpu.so)\n'
    '    pybind11::cpp_function::initialize<pybind11::cpp_function::cpp_function<bool, c10d::Work, std::chrono::duration<long, std::ratio<(long)1, (long)1000> >, pybind11::name, pybind11::is_method, pybind11::sibling, pybind11::arg_v, pybind11::call_guard<pybind11::gil_scoped_release>, char [654]>(pybind11::name const, pybind11::is_method&, pybind11::sibling, pybind11::arg_v, pybind11::call_guard<pybind11::gil_scoped_release>, char [654])::{lambda(c10d::Work*, std::chrono::duration<long, std::ratio<(long)1, (long)1000> >)#1}, bool, c10d::Work*, std::chrono::duration<long, std::ratio<(long)1, (long)1000> >, pybind11::name, pybind11::is_method, pybind11::sibling, pybind11::arg_v, pybind11::call_guard<pybind11::gil_scoped_release>, char [654]>(pybind11::cpp_function::cpp_function<bool, c10d::Work, std::chrono::duration<long, std::ratio<(long)1, (long)1000> >, pybind11::name, pybind11::is_method, pybind11::sibling, pybind11::arg_v, pybind11::call_guard<pybind11::gil_scoped_release>, char [654]>(pybind11::name const, pybind11::is_method&, pybind11::sibling, pybind11::arg_v, pybind11::call_guard<pybind11::gil_scoped_release>, char [654])::{lambda(c10d::Work*, std::chrono::duration<long, std::ratio<(long)1, (long)1000> >&&)#1}, bool (*)(c10d::Work*, std::chrono::duration<long, std::ratio<(long)1, (long)1000> >), pybind11::name const, pybind11::is_method&, pybind11::sibling, pybind11::arg_v, pybind11::call_guard<pybind11::gil_scoped_release>, char [654])::{lambda(pybind11::detail::function_call&)#1}::_FUN (libtorch_python.so)\n'
    '    pybind11::cpp_function::dispatcher (libtorch_python.so)\n'
    '    all_reduce (torch/distributed/distributed_c10d.py:3252)\n'
    '    _exception_logger.<locals>.wrapper (torch/distributed/c10d_logger.py:83)\n'
    '    main (job.py:10)\n'
    '    <module> (job.py:16)\n'
    '    0x7fadae24524a (libc.so.6)\n'
)

HANG_RANK1_STOPPED = (
    'Process 24577: /work/main/.venv/bin/python -u job.py\n'
    'Python v3.11.7 (/root/.pyenv/versions/3.11.7/bin/python3.11)\n'
    '\n'
    'Thread 24577 (idle): "MainThread"\n'
    '    main (job.py:13)\n'
    '    <module> (job.py:16)\n'
)

TORCHRUN = (
    'Process 24537: /work/main/.venv/bin/python /work/main/.venv/bin/torchrun --nproc-per-node 2 --master-port 29633 job.py\n'
    'Python v3.11.7 (/root/.pyenv/versions/3.11.7/bin/python3.11)\n'
    '\n'
    'Thread 24537 (idle): "MainThread"\n'
    '    SimpleElasticAgent._invoke_run (torch/distributed/elastic/agent/server/api.py:923)\n'
    '    SimpleElasticAgent.run (torch/distributed/elastic/agent/server/api.py:745)\n'
    '    prof.<locals>.wrap.<locals>.wrapper (torch/distributed/elastic/metrics/api.py:134)\n'
    '    launch_agent (torch/distributed/launcher/api.py:374)\n'
    '    elastic_launch.__call__ (torch/distributed/launcher/api.py:194)\n'
    '    run (torch/distributed/run.py:1019)\n'
    '    main (torch/distributed/run.py:1028)\n'
    '    record.<locals>.wrap.<locals>.wrapper (torch/distributed/elastic/multiprocessing/errors/__init__.py:367)\n'
    '    <module> (torchrun:8)\n'
)

GONE = (
    'Error: Failed to get process executable name. Check that the process is running.\n'
    '\n'
    'Caused by:\n'
    '    0: No such file or directory (os error 2)\n'
    '    1: No such file or directory (os error 2)\n'
    '\n'
    'Stack backtrace:\n'
    '   0: <E as anyhow::context::ext::StdError>::ext_context\n'
    '   1: py_spy::python_process_info::PythonProcessInfo::new\n'
    '   2: py_spy::python_spy::PythonSpy::new\n'
    '   3: py_spy::dump::write_traces\n'
    '   4: py_spy::dump::print_traces\n'
    '   5: py_spy::run_spy_command\n'
    '   6: py_spy::main\n'
    '   7: std::sys::backtrace::__rust_begin_short_backtrace\n'
    '   8: std::rt::lang_start::{{closure}}\n'
    '   9: std::rt::lang_start_internal\n'
    '  10: main\n'
)


# ---------------------------------------------------------------------------------------------------
# A fake /proc


def make_proc(root, pid, argv, ppid=1, state="S", uid=1000, gid=1000, groups=(1000,), env=None, exe=None,
              comm=None):
    """One /proc/<pid> with stat, status, cmdline, environ (None: unreadable) and exe."""
    directory = root / str(pid)
    directory.mkdir()
    comm = comm or os.path.basename(argv[0])[:15]
    (directory / "stat").write_text("%d (%s) %s %d 1 1 0 -1 0\n" % (pid, comm, state, ppid))
    (directory / "status").write_text("Name:\t%s\nUid:\t%d\t%d\t%d\t%d\nGid:\t%d\t%d\t%d\t%d\nGroups:\t%s\n" % (
        comm, uid, uid, uid, uid, gid, gid, gid, gid, " ".join(str(g) for g in groups)))
    (directory / "cmdline").write_bytes(b"\0".join(part.encode() for part in argv) + b"\0")
    environ = directory / "environ"
    if env is None:
        environ.write_bytes(b"")
        environ.chmod(0)
    else:
        environ.write_bytes(b"\0".join(("%s=%s" % item).encode() for item in env.items()) + b"\0")
    if exe:
        os.symlink(exe, str(directory / "exe"))


VENV = "/opt/train/bin/python"


@pytest.fixture
def fake_proc(tmp_path):
    root = tmp_path / "proc"
    root.mkdir()
    # A two-rank torchrun job, a DataLoader worker of rank 1, and what is not the job.
    make_proc(root, 100, [VENV, "/opt/train/bin/torchrun", "--nproc-per-node", "2", "train.py"], env={"HOME": "/h"})
    rank = {"WORLD_SIZE": "4", "MASTER_ADDR": "n1", "MASTER_PORT": "6000", "SECRET": "x"}
    make_proc(root, 101, [VENV, "-u", "train.py"], ppid=100, env=dict(rank, RANK="0", LOCAL_RANK="0"))
    make_proc(root, 102, [VENV, "-u", "train.py"], ppid=100, state="T", env=dict(rank, RANK="1", LOCAL_RANK="1"))
    make_proc(root, 103, [VENV, "-u", "train.py"], ppid=102, env=dict(rank, RANK="1", LOCAL_RANK="1"))
    make_proc(root, 200, ["/usr/bin/python3", "/usr/bin/unattended-upgrade"], uid=0, gid=0, env={})
    make_proc(root, 201, ["/usr/sbin/sshd", "-D"], uid=0, gid=0, env={})
    make_proc(root, 202, ["py-spy", "dump", "--pid", "101"], env={"RANK": "0"})
    # Another user's deepspeed job whose environment cannot be read (not root).
    make_proc(root, 300, ["/usr/bin/python3", "-m", "deepspeed.launcher.launch", "--world_info=x"], uid=2000, gid=2000,
              groups=(2000, 44), env=None)
    make_proc(root, 301, ["/usr/bin/python3", "-u", "pretrain.py", "--local_rank=3"], ppid=300, uid=2000, gid=2000,
              groups=(2000, 44), env=None)
    # A rank whose argv[0] is not "python" but whose executable is (renamed by the program).
    make_proc(root, 400, ["pt_main_thread"], env={"LOCAL_RANK": "0"}, exe="/usr/bin/python3.11")
    return root


def by_pid(processes):
    return {entry["pid"]: entry for entry in processes}


def test_finds_launchers_ranks_and_children_and_nothing_else(fake_proc):
    found = by_pid(diag.find_processes(str(fake_proc), exclude=()))
    assert sorted(found) == [100, 101, 102, 103, 300, 301, 400]
    assert (found[100]["role"], found[100]["launcher"]) == ("launcher", "torchrun")
    assert (found[101]["role"], found[101]["rank"], found[101]["local_rank"], found[101]["world_size"]) == ("rank", 0, 0, 4)
    assert found[101]["launcher"] == "torchrun"
    assert found[102]["state"] == "T" and found[102]["rank"] == 1
    # The DataLoader worker of rank 1: same argv and parent a rank.
    assert found[103]["role"] == "child"
    # Only the rank variables are kept from the environment.
    assert found[101]["env"] == {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "n1",
                                 "MASTER_PORT": "6000"}
    assert (found[300]["role"], found[300]["launcher"]) == ("launcher", "deepspeed")
    # Environment unreadable: a rank because it runs below a launcher; its local rank from --local_rank.
    assert (found[301]["role"], found[301]["env_readable"], found[301]["local_rank"]) == ("rank", False, 3)
    assert (found[301]["uid"], found[301]["gid"], found[301]["groups"]) == (2000, 2000, [2000, 44])
    assert found[400]["role"] == "rank"


@pytest.mark.parametrize("pattern, uid, expected", [
    ("", 2000, [300, 301]),
    ("\\btrain\\.py", None, [100, 101, 102, 103]),
    ("pretrain|unattended", None, [200, 301]),
    ("\\btrain\\.py", 2000, []),
])
def test_a_pattern_or_a_user_chooses_the_processes(fake_proc, pattern, uid, expected):
    assert [entry["pid"] for entry in diag.find_processes(str(fake_proc), pattern, uid, exclude=())] == expected


def test_the_caller_and_its_ancestors_are_never_targets(fake_proc):
    assert 101 not in by_pid(diag.find_processes(str(fake_proc), exclude={101}))


@pytest.mark.parametrize("argv, exe, expected", [
    (["torchrun", "--nnodes", "2", "x.py"], "", "torchrun"),
    (["/v/bin/python", "/v/bin/torchrun", "x.py"], "", "torchrun"),
    (["python3", "-m", "torch.distributed.run", "x.py"], "", "torchrun"),
    (["python3", "-mtorch.distributed.launch", "x.py"], "", "torchrun"),
    (["python", "-u", "/v/bin/deepspeed", "x.py"], "", "deepspeed"),
    (["/v/bin/accelerate", "launch", "x.py"], "", "accelerate"),
    (["python3", "-m", "accelerate.commands.launch", "x.py"], "", "accelerate"),
    (["python3", "train.py", "torchrun"], "", None),
    (["pt_main_thread", "-m", "torch.distributed.run"], "python3.11", "torchrun"),
    (["bash", "-c", "torchrun x.py"], "", None),
    ([], "", None),
])
def test_launchers_by_command_line(argv, exe, expected):
    assert diag.launcher_of(argv, exe) == expected


# ---------------------------------------------------------------------------------------------------
# Frames from real dumps


@pytest.mark.parametrize("text, pid, frame, native", [
    (SLEEP, 24316, "main (sleeper.py:9)", ""),
    (SLEEP_NATIVE, 24316, "main (sleeper.py:9)", "clock_nanosleep (libc.so.6)"),
    (HANG_RANK0, 24576, "all_reduce (torch/distributed/distributed_c10d.py:3252)", ""),
    (HANG_RANK0_NATIVE, 24576, "all_reduce (torch/distributed/distributed_c10d.py:3252)", "pthread_cond_wait (libc.so.6)"),
    (HANG_RANK1_STOPPED, 24577, "main (job.py:13)", ""),
    (TORCHRUN, 24537, "SimpleElasticAgent._invoke_run (torch/distributed/elastic/agent/server/api.py:923)", ""),
])
def test_where_a_process_is_stuck_is_the_innermost_frame_of_its_main_thread(text, pid, frame, native):
    where = diag.where_stuck(text, pid)
    assert (where["frame"], where["native_frame"], where["thread"], where["error"]) == (frame, native, "MainThread", "")


def test_every_thread_is_parsed_innermost_first():
    threads = diag.parse_dump(SLEEP)["threads"]
    assert [(t["id"], t["status"], t["name"]) for t in threads] == [("24316", "idle", "MainThread"),
                                                                    ("24318", "idle", "helper")]
    assert [f["text"] for f in threads[1]["frames"]][:2] == ["worker (sleeper.py:5)", "Thread.run (threading.py:975)"]
    native = diag.parse_dump(SLEEP_NATIVE)["threads"][0]["frames"]
    assert [f["python"] for f in native] == [False, True, True, False]


@pytest.mark.parametrize("text, error", [
    (GONE, "Error: Failed to get process executable name. Check that the process is running."),
    ("", "py-spy printed nothing"),
    ("Permission denied (os error 13)\n", "Permission denied (os error 13)"),
])
def test_a_failed_dump_gives_no_frame_and_py_spys_error(text, error):
    assert diag.where_stuck(text) == {"frame": "", "native_frame": "", "thread": "", "error": error}


def test_a_thread_without_a_name_is_found_by_the_pid():
    text = 'Thread 0x7F12 (active)\n    spin (w.py:3)\nThread 77 (idle)\n    run (m.py:9)\n'
    assert diag.where_stuck(text, 77)["frame"] == "run (m.py:9)"


# ---------------------------------------------------------------------------------------------------
# Stacks: parallel, as the owner, nonblocking for a stopped process


def test_stacks_run_as_each_owner_and_a_stopped_process_nonblocking_without_native(fake_proc):
    processes = diag.find_processes(str(fake_proc), exclude=())
    calls = []

    def dump_all(targets, py_spy, budget, native=False, env=None, credentials=None):
        calls.append((dict(targets), native, credentials, (env or {}).get("HOME")))
        texts = {101: HANG_RANK0, 102: HANG_RANK1_STOPPED}
        return {pid: (True, texts.get(pid, SLEEP)) for pid in targets}

    stacks = diag.take_stacks(processes, "/usr/bin/py-spy", 5, native=True, dump_all=dump_all, euid=0)
    assert sorted(stacks) == [100, 101, 102, 300, 301, 400]  # never the DataLoader child 103
    by_targets = {tuple(sorted(targets)): (native, credentials) for targets, native, credentials, _home in calls}
    assert by_targets[(100, 101, 400)] == (True, {"user": 1000, "group": 1000, "extra_groups": [1000]})
    assert by_targets[(102,)] == (False, {"user": 1000, "group": 1000, "extra_groups": [1000]})
    assert by_targets[(300, 301)] == (True, {"user": 2000, "group": 2000, "extra_groups": [2000, 44]})
    assert [targets for targets, *_ in calls if 102 in targets] == [{102: True}]
    assert stacks[101]["frame"].startswith("all_reduce (") and stacks[102]["frame"] == "main (job.py:13)"
    assert stacks[102]["native"] is False and stacks[101]["native"] is True


def test_not_root_py_spy_runs_as_this_user_and_without_py_spy_every_dump_says_why(fake_proc):
    processes = diag.find_processes(str(fake_proc), exclude=())
    seen = []

    def dump_all(targets, py_spy, budget, native=False, env=None, credentials=None):
        seen.append(credentials)
        return {pid: (False, "py-spy dump did not finish within the 5 s stack budget") for pid in targets}

    stacks = diag.take_stacks(processes, "/usr/bin/py-spy", 5, dump_all=dump_all, euid=1000)
    assert seen and all(credentials is None for credentials in seen)
    assert stacks[101]["error"].startswith("py-spy dump did not finish") and not stacks[101]["finished"]
    missing = diag.take_stacks(processes, "", 5, dump_all=dump_all, euid=0)
    assert missing[101]["error"].startswith("py-spy not found on this node")


# ---------------------------------------------------------------------------------------------------
# Grouping and suspects

ALL_REDUCE = "all_reduce (torch/distributed/distributed_c10d.py:3252)"
LOOP = "main (job.py:13)"


def rank(pid, rank_no, frame=ALL_REDUCE, state="S", error=""):
    return {"pid": pid, "role": "rank", "rank": rank_no, "state": state, "frame": frame, "dump_error": error}


@pytest.mark.parametrize("nodes, majority, suspects", [
    # Everyone in the same collective: nothing to blame.
    ({"a": [rank(1, 0), rank(2, 1)], "b": [rank(1, 2), rank(2, 3)]}, ALL_REDUCE, []),
    # One rank stopped (SIGSTOP) in its loop: by state and by frame.
    ({"a": [rank(1, 0), rank(2, 1)], "b": [rank(1, 2), rank(2, 3, LOOP, "T")]}, ALL_REDUCE, ["b:2"]),
    # Stopped but in the same frame as the others: the state alone names it.
    ({"a": [rank(1, 0), rank(2, 1)], "b": [rank(7, 2, ALL_REDUCE, "T")]}, ALL_REDUCE, ["b:7"]),
    # Uninterruptible sleep and zombie.
    ({"a": [rank(1, 0), rank(2, 1, ALL_REDUCE, "D"), rank(3, 2, "", "Z", "Error: gone")]}, ALL_REDUCE,
     ["a:2", "a:3"]),
    # A rank elsewhere than the majority.
    ({"a": [rank(1, 0), rank(2, 1), rank(3, 2, "backward (torch/_tensor.py:626)")]}, ALL_REDUCE, ["a:3"]),
    # Two ranks, two frames, both running: no majority, nobody named by frame.
    ({"a": [rank(1, 0), rank(2, 1, LOOP)]}, "", []),
    # A dump that failed while the peers' worked.
    ({"a": [rank(1, 0), rank(2, 1), rank(3, 2, "", "S", "Permission denied")]}, ALL_REDUCE, ["a:3"]),
    # Every dump failed (py-spy missing): nothing to compare, nobody named.
    ({"a": [rank(1, 0, ""), rank(2, 1, "")]}, "", []),
])
def test_grouping_and_suspects(nodes, majority, suspects):
    report = controller.diagnose({host: {"ok": True, "processes": procs} for host, procs in nodes.items()})
    assert report["majority"] == majority
    assert [suspect["id"] for suspect in report["suspects"]] == suspects
    assert report["status"] == ("suspect" if suspects else "no_suspect")


def test_the_report_reads_as_lines_and_names_the_stopped_rank():
    nodes = {"a": {"ok": True, "processes": [
        {"pid": 9, "role": "launcher", "launcher": "torchrun", "state": "S", "frame": "run (x.py:1)"},
        rank(10, 0), rank(11, 1)]},
        "b": {"ok": True, "processes": [rank(20, 2), rank(21, 3, LOOP, "T")]}}
    report = controller.diagnose(nodes)
    lines = report["lines"]
    assert lines[0] == ("DIAGNOSIS: 4 rank(s) on 2 of 2 node(s); 3 wait in %s; SUSPECT: b:21 rank 3" % ALL_REDUCE)
    assert "a:9 torchrun launcher [S] run (x.py:1)" in lines
    assert "b:21 rank 3 [T] %s" % LOOP in lines
    assert "group of 3 in %s: a:10, a:11, b:20" % ALL_REDUCE in lines
    suspect = [line for line in lines if line.startswith("SUSPECT")]
    assert len(suspect) == 1 and suspect[0].startswith("SUSPECT b:21 rank 3: stopped (state T")
    assert "stuck in %s while 3 of 4 ranks wait in %s" % (LOOP, ALL_REDUCE) in suspect[0]
    # The launcher is reported but never counted in the majority.
    assert [group["count"] for group in report["groups"]] == [3, 1]


def test_a_node_without_answer_is_a_suspect_and_a_node_without_ranks_is_said():
    report = controller.diagnose({"a": {"ok": True, "processes": [rank(1, 0), rank(2, 1)]},
                            "b": {"ok": False, "error": "unreachable: ssh timed out"},
                            "c": {"ok": True, "processes": []}})
    assert [s["id"] for s in report["suspects"]] == ["b"] and report["failed_hosts"] == ["b"]
    assert report["hosts_without_ranks"] == ["c"]
    assert "SUSPECT b: the node gave no diagnosis: unreachable: ssh timed out" in report["lines"]
    assert "c: no rank found on this node" in report["lines"]


def test_no_training_process_anywhere():
    report = controller.diagnose({"a": {"ok": True, "processes": []}})
    assert report["status"] == "no_ranks" and "no training process found" in report["lines"][0]


# ---------------------------------------------------------------------------------------------------
# Inputs


@pytest.mark.parametrize("params, problem", [
    ({"pattern": "train(", "stack_budget": 5}, "Found pattern 'train('"),
    ({"pattern": "", "stack_budget": 0}, "Found stack_budget 0"),
    ({"stack_budget": 5, "core_dir": "/tmp", "core_timeout": 0}, "Found core_timeout 0"),
    ({"pattern": "x", "stack_budget": 5}, None),
])
def test_inputs(params, problem):
    problems = diag.validate(params)
    assert (problems[0].startswith(problem) and "Fix:" in problems[0]) if problem else problems == []


# ---------------------------------------------------------------------------------------------------
# For real on this machine: py-spy on a sleeping Python, gdb on a core of it

SLEEPER = "import time\ndef main():\n    time.sleep(600)\nmain()\n"


class Ops(object):
    def which(self, name, paths=()):
        return shutil.which(name)

    def run(self, argv, timeout=20.0, **_kwargs):
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return 124, "", "timed out"
        return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture
def sleeper(tmp_path):
    script = tmp_path / ("diag_sleeper_%d.py" % os.getpid())
    script.write_text(SLEEPER)
    proc = subprocess.Popen([sys.executable, str(script)])
    time.sleep(0.5)
    yield proc, script
    proc.kill()
    proc.wait()


@pytest.mark.skipif(not shutil.which("py-spy"), reason="py-spy is not installed")
def test_a_real_dump_of_a_sleeping_python(sleeper):
    proc, script = sleeper
    result = diag.read({"pattern": script.name, "stack_budget": 15, "native": False, "user": ""}, Ops())
    rows = [row for row in result["processes"] if row["pid"] == proc.pid]
    assert len(rows) == 1, result
    row = rows[0]
    assert row["frame"] == "main (%s:3)" % script.name, row.get("stack")
    assert row["dump_finished"] and row["dump_error"] == "" and row["role"] == "rank"


@pytest.mark.skipif(not (shutil.which("gdb") and shutil.which("gcore")), reason="gdb is not installed")
def test_gdb_backtrace_of_the_newest_core(sleeper, tmp_path):
    proc, _script = sleeper
    cores = tmp_path / "cores"
    cores.mkdir()
    (cores / "core-old").write_text("not a core")
    os.utime(str(cores / "core-old"), (1, 1))
    subprocess.run(["gcore", "-o", str(cores / "core-new"), str(proc.pid)], capture_output=True, timeout=120,
                   check=True)
    found = diag.core_backtrace(str(cores), "core*", shutil.which("gdb"), 120, Ops())
    assert found["found"] and os.path.basename(found["path"]).startswith("core-new"), found
    assert found["command"].startswith(sys.executable.split("/")[-1]) or "python" in found["command"], found
    assert "python" in os.path.basename(found["executable"]), found
    assert "Thread 1" in found["backtrace"] and found["error"] == "", found["backtrace"][-2000:]
    assert diag.core_backtrace(str(tmp_path / "none"), "core*", "gdb", 5, Ops())["found"] is False


def test_diagnose_writes_no_file_outside_its_run_directory_whatever_a_node_is_named(tmp_path):
    """An inventory name is not a file name: ``../../x`` would have put its stacks file outside the run directory
    (and over any file there the controller's user may write)."""
    import importlib.util
    from unittest import mock
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = importlib.util.spec_from_file_location("preflight_diagnose_action",
                                                  os.path.join(root, "action_plugins", "preflight_diagnose.py"))
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    process = {"pid": 7, "role": "rank", "rank": 0, "state": "S", "dump_user": "alice", "stack": "Thread 7\n  main",
               "frames": [], "command": "python train.py"}
    hosts = ["n1", "../../escaped"]
    hostvars = {host: {"diagnose_stacks": {"processes": [dict(process)], "core": None, "py_spy": "py-spy",
                                           "hostname": "h", "seconds": 1.0, "refused": []}} for host in hosts}
    task = mock.MagicMock(args={"results_dir": str(tmp_path / "results"), "run_id": "r1",
                                "register": "diagnose_stacks"}, async_val=0, check_mode=False, diff=False)
    action = plugin.ActionModule(task, mock.MagicMock(), mock.MagicMock(), mock.MagicMock(), mock.MagicMock(),
                                 mock.MagicMock())
    result = action.run(task_vars={"ansible_play_hosts_all": hosts, "hostvars": hostvars})
    written = sorted(os.path.relpath(os.path.join(top, name), str(tmp_path))
                     for top, _dirs, files in os.walk(str(tmp_path)) for name in files)
    assert written == ["results/r1/diagnose.json", "results/r1/n1.stacks.txt"], written
    assert not result.get("failed"), result
    with open(str(tmp_path / "results" / "r1" / "diagnose.json")) as handle:
        report = json.load(handle)
    assert "../../escaped" not in report["stacks_files"]
    assert any("../../escaped" in line and "not usable as a file name" in line for line in result["lines"]), \
        result["lines"]


def test_the_diagnosis_is_written_with_a_stacks_file_per_node_and_fails_on_a_suspect_when_asked(tmp_path):
    """What the task preflight_diagnose runs (cluster_preflight/outputs/diagnosis_report.py): every node's
    registered stacks grouped, diagnose.json and one stacks file per node with ranks, the suspects named."""
    from cluster_preflight.outputs.diagnosis_report import REPORT_FILE, write_diagnosis
    a = [dict(rank(1, 0), stack="Thread 1\n  all_reduce\n", cmdline="python job.py"), rank(2, 1)]
    b = [rank(1, 2), dict(rank(2, 3, LOOP, "T"), stack="Thread 9\n  main\n")]
    task_vars = {"ansible_play_hosts_all": ["a", "b", "c"], "hostvars": {
        "a": {"diagnose_stacks": {"processes": a}}, "b": {"diagnose_stacks": {"processes": b}},
        "c": {"diagnose_stacks": {"unreachable": True, "msg": "ssh: connect to host c port 22: No route to host"}}}}
    args = {"results_dir": str(tmp_path), "run_id": "d1"}
    result = write_diagnosis(task_vars, args)
    # The stopped rank, and the node that did not answer.
    assert not result.get("failed") and result["status"] == "suspect" and result["suspects"] == ["b:2", "c"]
    report = json.loads((tmp_path / "d1" / REPORT_FILE).read_text())
    assert report["failed_hosts"] == ["c"] and any("No route to host" in line for line in report["lines"])
    assert report["stacks_files"] == {host: str(tmp_path / "d1" / ("%s.stacks.txt" % host)) for host in "ab"}
    stacks = (tmp_path / "d1" / "b.stacks.txt").read_text()
    assert "state T" in stacks and "Thread 9" in stacks
    assert "stack" not in report["ranks"][0], "the stack texts live in the per-node files"
    failed = write_diagnosis(task_vars, dict(args, run_id="d2", fail_on_suspect=True))
    assert failed["failed"] and failed["msg"].startswith("DIAGNOSIS names suspects")
    refused = write_diagnosis(task_vars, dict(args, run_id="latest"))
    assert refused["failed"] and "Found run_id 'latest'" in refused["msg"]
