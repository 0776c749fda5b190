"""One Slurm step of the srun engine (cluster_preflight/engine/step.py) and a task of it
(module_utils/preflight_node/srun_task.py): the srun line, the arguments every task reads, the protocol lines
reassembled, a silent or unlaunched node named, the bound kept.  The node code runs for real, from the real
archive; tests/fake_srun.py stands in for srun (the bed's tests run the real one)."""

import base64
import hashlib
import json
import os
import subprocess
import sys
import time
import zlib

import pytest

from cluster_preflight.engine import archive, step
from cluster_preflight.engine.srun import Srun, task_outcome
from preflight_node import srun_task

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE_SRUN = os.path.join(os.path.dirname(HERE), "fake_srun.py")


def test_the_values_every_node_shares_go_once_and_each_node_adds_its_own():
    args = {"n1": {"a": 1, "peers": ["n2"], "env": {"X": "1"}}, "n2": {"a": 1, "peers": ["n1"], "env": {"X": "1"}}}
    common, own = step.split_common(args)
    assert common == {"a": 1, "env": {"X": "1"}} and own == {"n1": {"peers": ["n2"]}, "n2": {"peers": ["n1"]}}
    data = json.loads(zlib.decompress(step.payload("facts", args)))
    assert data["call"] == "facts"
    for node in args:
        assert srun_task.node_args(data, node) == args[node]
    # A key one node lacks is never common.
    assert step.split_common({"n1": {"a": 1, "b": 2}, "n2": {"a": 1}})[0] == {"a": 1}


def test_the_srun_line_names_its_nodes_tasks_bound_and_leaves_no_controller_environment():
    argv = step.srun_argv(["n1", "n2", "n3"], "rank", "/usr/bin/python3", "/run/x.pyz", "ab" * 32, tasks=2,
                          bound=300, exclude=["n4"], extra=["--gpus-per-node=8"])
    # The program is the bootstrap's text, never a file on the node; the archive and its digest its arguments.
    assert argv[0] == "srun" and argv[-8:] == ["/usr/bin/python3", "-I", "-S", "-c", step.BOOTSTRAP, "/run/x.pyz",
                                               "ab" * 32, "rank"]
    for option in ("--nodes=3", "--nodelist=n[1-3]", "--ntasks-per-node=2", "--ntasks=6", "--overlap",
                   "--kill-on-bad-exit=0", "--time=7", "--exclude=n4", "--gpus-per-node=8", "--cpu-bind=none",
                   "--label", "--verbose"):
        assert option in argv
    export = next(item for item in argv if item.startswith("--export="))
    assert export == "--export=PATH=%s,LANG=C,LC_ALL=C" % step.TASK_PATH


def _lines(node, local, result, chunk=40):
    text = base64.b64encode(zlib.compress(json.dumps(result).encode())).decode()
    parts = [text[i:i + chunk] for i in range(0, len(text), chunk)]
    out = ["PFR %s %d +" % (node, local)]
    out += ["PFR %s %d r %d %d %s" % (node, local, index, len(parts), part) for index, part in enumerate(parts)]
    return out + ["PFR %s %d end %s" % (node, local, hashlib.sha256(text.encode()).hexdigest())]


def _placed(expected, clock=None, order=None):
    """A collector that read srun --verbose's launch lines of ``expected`` (one task per node, in ``order``)."""
    collector = step.Collector(expected, clock=clock) if clock else step.Collector(expected)
    for number, node in enumerate(order or [node for node, _local in expected]):
        collector.feed_err("srun: launching StepId=9.0 on host %s, 1 tasks: %d\n" % (node, number))
    return collector


def test_results_are_reassembled_whatever_the_interleaving_and_a_damaged_one_is_refused():
    first, second = _lines("n1", 0, {"facts": {"a": "x" * 500}}), _lines("n2", 0, {"facts": {"b": 2}})
    collector = _placed([("n1", 0), ("n2", 0), ("n3", 0)])
    for pair in zip(first, second):
        collector.feed("0: " + pair[0] + "\n")
        collector.feed("1: " + pair[1] + "\n")
    for line in second[len(first):]:
        collector.feed("1: " + line)
    for line in first[len(second):]:
        collector.feed("0: " + line)
    collector.feed("2: some other line")
    bad = _lines("n3", 0, {"x": 1})
    collector.feed("2: " + bad[0])
    collector.feed("2: " + bad[1][:-2] + "AA")
    for line in bad[2:]:
        collector.feed("2: " + line)
    assert collector.results == {("n1", 0): {"facts": {"a": "x" * 500}}, ("n2", 0): {"facts": {"b": 2}}}
    assert "damaged" in collector.damaged[("n3", 0)] and collector.pending_tasks() == []
    assert list(collector.other) == ["n3:0: some other line"]


def test_a_task_silent_too_long_or_never_started_is_lost():
    now = [100.0]
    collector = _placed([("n1", 0), ("n2", 0)], clock=lambda: now[0])
    collector.feed("0: PFR n1 0 +")
    now[0] += step.LOST_AFTER - 1
    assert collector.silent() == {}
    now[0] += 2
    assert list(collector.silent()) == [("n1", 0)]
    now[0] += step.LAUNCH_GRACE
    assert "did not start" in collector.silent()[("n2", 0)]


# What srun 22.05 printed on the bed: a slurmd killed before the step, a node killed during it, a Ctrl-C.
SRUN_STDERR = """srun: error: slurm_receive_msgs: [[198.18.63.3]:6818] failed: Socket timed out on send/recv operation
srun: error: Task launch for StepId=1.1 failed on node pfn3: Socket timed out on send/recv operation
srun: error: Application launch failed: Socket timed out on send/recv operation
srun: Job step aborted
srun: error: pfn1: task 0: Interrupt
srun: error: Failure sending signal 2 to StepId=1.6 on node pfn4: Communication connection failure""".splitlines()


def test_srun_s_own_words_name_the_node_it_could_not_launch_and_each_task_s_end():
    launch, tasks = step.srun_errors(SRUN_STDERR)
    assert launch == {"pfn3": "Socket timed out on send/recv operation"}
    assert tasks == {"pfn1": "task 0: Interrupt"}


@pytest.fixture(scope="module")
def node_archive(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("node") / "node.pyz")
    return path, archive.write(path)


def _lock_step(node_archive, tmp_path, nodes, env=None, bound=30):
    path, digest = node_archive
    argv = [sys.executable] + step.srun_argv(nodes, "lock", sys.executable, path, digest, bound=bound,
                                             srun=FAKE_SRUN)
    data = step.payload("lock", {node: {"dir": str(tmp_path), "run_id": "r1"} for node in nodes})
    return step.run_step(argv, data, [(node, 0) for node in nodes], bound, env=dict(os.environ, **(env or {})))


def test_a_step_runs_the_node_code_of_the_archive_in_every_task_and_collects_each_node_s_result(node_archive,
                                                                                                   tmp_path):
    found = _lock_step(node_archive, tmp_path, ["n1", "n2"])
    assert set(found["results"]) == {("n1", 0), ("n2", 0)} and found["rc"] == 0, found
    for result in found["results"].values():
        assert result == {"changed": False, "released": False, "path": result["path"],
                          "why": "no lease on this node"}
    assert found["lost"] == {} and found["launch_failed"] == {}


def test_a_node_slurm_cannot_launch_on_is_named_and_the_aborted_peers_are_told_apart(node_archive, tmp_path):
    found = _lock_step(node_archive, tmp_path, ["n1", "n2"], env={"FAKE_SRUN_DOWN": "n2"})
    assert found["launch_failed"] == {"n2": "Communication connection failure"}
    down = task_outcome(found, ("n2", 0), 30)
    assert down["unreachable"] and "could not start its task on n2" in down["msg"]
    if ("n1", 0) not in found["results"]:
        assert task_outcome(found, ("n1", 0), 30).get("aborted")


def test_a_node_that_falls_silent_is_lost_and_the_step_stopped_within_its_bounds(node_archive, tmp_path,
                                                                                  monkeypatch):
    monkeypatch.setattr(step, "LOST_AFTER", 2.0)
    started = time.monotonic()
    found = _lock_step(node_archive, tmp_path, ["n1", "n2"], env={"FAKE_SRUN_SILENT": "n2"})
    assert time.monotonic() - started < 2.0 + 1.0 + step.STOP_GRACE + step.REAP_GRACE
    assert ("n1", 0) in found["results"] and list(found["lost"]) == [("n2", 0)]
    lost = task_outcome(found, ("n2", 0), 30)
    assert lost["unreachable"] and "no word from its task" in lost["msg"]


def test_a_step_past_its_bound_is_stopped_and_its_working_tasks_are_overdue(tmp_path):
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import os, time\nprint('PFR %s 0 +' % os.environ['SLURMD_NODENAME'], flush=True)\n"
                       "while True:\n    time.sleep(1)\n    print('PFR %s 0 .' % os.environ['SLURMD_NODENAME'], "
                       "flush=True)\n")
    argv = [sys.executable, FAKE_SRUN, "--nodelist=n1", "--label", "--verbose", sys.executable, str(sleeper)]
    started = time.monotonic()
    found = step.run_step(argv, b"", [("n1", 0)], 2.0)
    assert time.monotonic() - started < 2.0 + 1.0 + step.STOP_GRACE + step.REAP_GRACE
    assert found["overdue"] == [("n1", 0)]
    assert "within the step's bound of 2 s" in task_outcome(found, ("n1", 0), 2)["msg"]


def test_node_calls_aborted_by_a_launch_failure_elsewhere_run_again_without_that_node():
    calls = []

    def runner(argv, data, expected, bound, env=None):
        calls.append(sorted(node for node, _local in expected))
        nodes = {node for node, _local in expected}
        if "n3" in nodes:
            return {"results": {}, "damaged": {}, "lost": {}, "launch_failed": {"n3": "Connection refused"},
                    "task_errors": {}, "overdue": [], "rc": 233, "stderr": ["srun: Job step aborted"], "other": [],
                    "elapsed": 1.0}
        return {"results": {task: {"facts": {}, "node": task[0]} for task in expected}, "damaged": {}, "lost": {},
                "launch_failed": {}, "task_errors": {}, "overdue": [], "rc": 0, "stderr": [], "other": [],
                "elapsed": 1.0}

    engine = Srun.__new__(Srun)
    engine.python, engine.extra, engine.given, engine.dir = "/usr/bin/python3", [], "/shared/node.pyz", "/run"
    engine.environ, engine.runner, engine.steps, engine._archive = {}, runner, [], None
    results = engine.node_call("facts", {"n1": {}, "n2": {}, "n3": {}}, 60)
    assert calls == [["n1", "n2", "n3"], ["n1", "n2"]]
    assert results["n3"]["unreachable"] and "Connection refused" in results["n3"]["msg"]
    assert results["n1"] == {"facts": {}, "node": "n1"} and results["n2"]["node"] == "n2"
    assert [item["call"] for item in engine.steps] == ["facts", "facts"]


def test_a_task_gives_a_module_s_result_for_each_call_and_a_failure_never_escapes():
    assert srun_task.run("nonesuch", {})["failed"]
    failed = srun_task.run("lock", {"dir": "/nonexistent", "run_id": "r", "bogus": 1})
    assert failed["failed"] and "unsupported parameters: bogus" in failed["msg"]
    spec = {"a": {"type": "float", "default": 1}, "b": {"type": "bool"}, "c": {"type": "str", "required": True},
            "d": {"type": "dict", "default": {}}}
    assert srun_task.with_defaults(spec, {"c": "x", "b": "true"}) == {"a": 1.0, "b": True, "c": "x", "d": {}}
    with pytest.raises(ValueError, match="missing required argument: c"):
        srun_task.with_defaults(spec, {})
    assert srun_task.StepModule.get_bin_path("sh") in ("/bin/sh", "/usr/bin/sh")
    assert srun_task.StepModule.get_bin_path("no-such-program-here") is None


def test_the_archive_is_the_node_layer_and_the_same_bytes_for_the_same_code(tmp_path):
    data, digest = archive.build()
    assert archive.build()[1] == digest and archive.file_name(digest).startswith(archive.PREFIX)
    path = tmp_path / "node.pyz"
    path.write_bytes(data)
    done = subprocess.run([sys.executable, str(path), "lock"], input=zlib.compress(json.dumps(
        {"call": "lock", "common": {"dir": str(tmp_path), "run_id": "r"}, "nodes": {}}).encode()),
        capture_output=True, timeout=60, env=dict(os.environ, SLURMD_NODENAME="n9", SLURM_LOCALID="0"), check=True)
    lines = done.stdout.decode().splitlines()
    assert lines[0] == "PFR n9 0 +" and lines[-1].startswith("PFR n9 0 end ")
    collector = _placed([("n9", 0)])
    for line in lines:
        collector.feed("0: " + line)
    assert collector.results[("n9", 0)]["why"] == "no lease on this node"


def test_srun_s_verbose_lines_place_the_tasks_and_are_not_kept_as_its_words():
    collector = step.Collector([("pfn1", 0), ("pfn1", 1)])
    for line in ["srun: defined options", "srun: -------------------- --------------------",
                 "srun: ntasks-per-node     : 2", "srun: end of defined options",
                 "srun: jobid 1: nodes(3):`pfn[1-3]', cpu counts: 2(x3)",
                 "srun: launch/slurm: launch_p_step_launch: CpuBindType=(null type)",
                 "srun: launching StepId=1.0 on host pfn1, 2 tasks: [0-1]",
                 "srun: route/default: init: route default plugin loaded",
                 "srun: launch/slurm: _task_start: Node pfn1, 2 tasks started"] + SRUN_STDERR[-2:]:
        collector.feed_err(line)
    assert collector.layout == {0: ("pfn1", 0), 1: ("pfn1", 1)}
    assert list(collector.stderr) == SRUN_STDERR[-2:]
