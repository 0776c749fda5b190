"""One node speaks only for itself on the srun engine (docs/security.md, "The srun engine"): what a step's task (root
on its node) prints is bound to that task by Slurm, never by what the line says; srun's own words are read only from
srun's own lines; what a node prints is bounded.  Each attack is what root on one node can do with its task's
output: the node code runs for real, from the real archive, under tests/fake_srun.py (which labels and places tasks
as srun --label --verbose does); the bed's test runs the same attack on the real Slurm
(tests/multinode/test_srun_engine_multinode.py)."""

import base64
import hashlib
import json
import os
import sys
import time
import zlib

import pytest

from cluster_preflight.engine import archive, relay, step
from cluster_preflight.engine.srun import task_outcome

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE_SRUN = os.path.join(os.path.dirname(HERE), "fake_srun.py")


def protocol(node, local, result):
    """The lines a task prints for ``result``, naming ``node`` ``local`` (whoever prints them)."""
    text = base64.b64encode(zlib.compress(json.dumps(result).encode())).decode()
    parts = [text[index:index + 700] for index in range(0, len(text), 700)] or [""]
    lines = ["PFR %s %d +" % (node, local)]
    lines += ["PFR %s %d r %d %d %s" % (node, local, index, len(parts), part) for index, part in enumerate(parts)]
    return lines + ["PFR %s %d end %s" % (node, local, hashlib.sha256(text.encode()).hexdigest())]


@pytest.fixture(scope="module")
def node_archive(tmp_path_factory):
    """``(path, sha256)`` of the node code's archive in a directory of root's alone."""
    path = str(tmp_path_factory.mktemp("node") / "node.pyz")
    return path, archive.write(path)


def python_of(tmp_path, attacker, script):
    """A "python" for the step's tasks: on ``attacker`` it first runs ``script`` (sh), then the real Python, as
    root on that node could make its task do; on the other nodes just the real Python."""
    path = tmp_path / "python"
    path.write_text('#!/bin/sh\nif [ "$SLURMD_NODENAME" = %s ]; then\n%s\nfi\nexec %s "$@"\n' % (
        attacker, script, sys.executable))
    path.chmod(0o755)
    return str(path)


def lock_step(node_archive, tmp_path, python, nodes, bound=30.0, env=None):
    """The run lock's node call as one step over ``nodes`` (the fake srun, the real node code), as the engine
    starts it."""
    path, digest = node_archive
    argv = [sys.executable] + step.srun_argv(nodes, "lock", python, path, digest, bound=bound, srun=FAKE_SRUN)
    data = step.payload("lock", {node: {"dir": str(tmp_path), "run_id": "r1"} for node in nodes})
    return step.run_step(argv, data, [(node, 0) for node in nodes], bound, env=dict(os.environ, **(env or {})))


def test_a_task_printing_another_node_s_result_and_heartbeats_is_the_finding_never_the_named_node(
        node_archive, tmp_path, monkeypatch):
    monkeypatch.setattr(step, "LOST_AFTER", 2.0)
    forged = tmp_path / "forged"
    forged.write_text("\n".join(protocol("n2", 0, {"failed": True, "msg": "FORGED by n1"})) + "\n")
    # n1 hands n2 a failed result before n2's own and once more after it, and keeps the silent n3 "alive" with
    # heartbeats.
    script = "cat %s\n(sleep 1; cat %s; while :; do echo 'PFR n3 0 .'; sleep 0.3; done) &" % (forged, forged)
    started = time.monotonic()
    found = lock_step(node_archive, tmp_path, python_of(tmp_path, "n1", script), ["n1", "n2", "n3"], bound=12.0,
                      env={"FAKE_SRUN_SILENT": "n3"})
    outcomes = {task[0]: task_outcome(found, task, 12.0) for task in [("n1", 0), ("n2", 0), ("n3", 0)]}
    # n2's result is n2's own.
    assert not outcomes["n2"].get("failed") and outcomes["n2"]["why"] == "no lease on this node", outcomes
    # The printer is the one failed, saying whom it spoke for.
    assert outcomes["n1"].get("failed") and "printed protocol lines naming n2" in outcomes["n1"]["msg"], outcomes
    # n3 is lost on its own silence, the heartbeats n1 printed for it notwithstanding (well within the bound).
    assert outcomes["n3"].get("unreachable") and "no word from its task" in outcomes["n3"]["msg"], outcomes
    assert time.monotonic() - started < 12.0


def test_srun_s_own_words_about_a_node_are_never_taken_from_a_task_s_lines(node_archive, tmp_path):
    script = "echo 'srun: error: Task launch for StepId=7.0 failed on node n1: Connection refused' >&2"
    found = lock_step(node_archive, tmp_path, python_of(tmp_path, "n2", script), ["n1", "n2"])
    assert found["launch_failed"] == {}, found
    assert not task_outcome(found, ("n1", 0), 30).get("unreachable")
    assert any("n2:0 (stderr): srun: error: Task launch" in line for line in found["other"]), found["other"]


def test_lines_are_the_task_s_that_srun_placed_whatever_order_the_node_list_had():
    collector = step.Collector([("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1)])
    # A line may come before srun's word on where its task runs: it waits for it.
    for line in protocol("n2", 1, {"ok": "n2-1"}):
        collector.feed(" 3: %s\n" % line)
    collector.feed_err("srun: launching StepId=4.2 on host n2, 2 tasks: [2-3]\n")
    collector.feed_err("srun: launching StepId=4.2 on host n1, 2 tasks: [0-1]\n")
    for line in protocol("n1", 0, {"ok": "n1-0"}):
        collector.feed(" 0: %s\n" % line)
    # Task 1 (n1's second) names itself n2's second: its finding; n2's second keeps its own result.
    for line in protocol("n2", 1, {"ok": "forged"}):
        collector.feed(" 1: %s\n" % line)
    assert collector.results == {("n2", 1): {"ok": "n2-1"}, ("n1", 0): {"ok": "n1-0"}}
    assert collector.spoke_for == {("n1", 1): "n2 task 1"}
    # A number srun never placed is nobody's.
    collector.feed("17: PFR n2 0 +\n")
    assert ("n2", 0) not in collector.seen


def test_srun_placing_tasks_in_its_own_order_is_read_from_its_verbose_lines():
    assert step.task_numbers("0") == [0] and step.task_numbers("4-5") == [4, 5]
    assert step.task_numbers("0,2-3") == [0, 2, 3]
    collector = step.Collector([("pfn1", 0), ("pfn3", 0)])
    collector.feed_err("srun: launching StepId=2.0 on host pfn1, 1 tasks: 0")
    collector.feed_err("srun: launching StepId=2.0 on host pfn3, 1 tasks: 1")
    # A node srun did not launch for this step is not ours to place.
    collector.feed_err("srun: launching StepId=2.0 on host pfn9, 1 tasks: 2")
    assert collector.layout == {0: ("pfn1", 0), 1: ("pfn3", 0)}


# -- the node code's archive: checked by the fixed bootstrap before any of it runs ---------------------------------

EVIL = "import os\nopen(%r, 'w').write('ran as uid %%d' %% os.geteuid())\n"


def evil_archive(path, marker, owner=None):
    """A zip application that leaves ``marker`` whichever way it is started (as ``__main__`` or through
    ``preflight_node.srun_task.main``): what whoever can replace the node code would put there."""
    import zipfile
    with zipfile.ZipFile(path, "w") as handle:
        handle.writestr("__main__.py", EVIL % marker)
        handle.writestr("preflight_node/__init__.py", "")
        handle.writestr("preflight_node/srun_task.py", EVIL % marker + "def main(argv=None):\n    return 0\n")
    os.chmod(path, 0o644)
    if owner is not None:
        os.chown(path, owner.pw_uid, owner.pw_gid)
    return path


def refused_step(node_archive, tmp_path, path):
    """The lock call over n1 with the archive at ``path`` (this controller's digest): n1's outcome."""
    _genuine, digest = node_archive
    found = lock_step((path, digest), tmp_path, sys.executable, ["n1"])
    return task_outcome(found, ("n1", 0), 30)


@pytest.mark.skipif(os.geteuid() != 0, reason="another account's files need root to make")
def test_node_code_in_a_directory_another_account_owns_never_runs(node_archive, tmp_path, public_dir):
    import pwd
    nobody = pwd.getpwnam("nobody")
    theirs = os.path.join(public_dir, "srun")
    os.mkdir(theirs, 0o755)
    os.chown(theirs, nobody.pw_uid, nobody.pw_gid)
    marker = os.path.join(public_dir, "evil-ran")
    outcome = refused_step(node_archive, tmp_path, evil_archive(os.path.join(theirs, "node.pyz"), marker, nobody))
    assert not os.path.exists(marker), "root ran node code another account placed"
    assert outcome["failed"] and "refused to run the node code on n1" in outcome["msg"], outcome
    assert "belongs to uid %d" % nobody.pw_uid in outcome["msg"], outcome


@pytest.mark.skipif(os.geteuid() != 0, reason="another account's files need root to make")
def test_node_code_another_account_created_first_in_a_sticky_directory_never_runs(node_archive, tmp_path,
                                                                                  public_dir):
    import pwd
    nobody = pwd.getpwnam("nobody")
    sticky = os.path.join(public_dir, "tmp")
    os.mkdir(sticky)
    os.chmod(sticky, 0o1777)
    marker = os.path.join(public_dir, "evil-ran")
    outcome = refused_step(node_archive, tmp_path, evil_archive(os.path.join(sticky, "node.pyz"), marker, nobody))
    assert not os.path.exists(marker) and "belongs to uid %d, not root" % nobody.pw_uid in outcome["msg"], outcome


def test_node_code_of_another_digest_never_runs_even_where_only_root_writes(node_archive, tmp_path):
    marker = str(tmp_path / "evil-ran")
    outcome = refused_step(node_archive, tmp_path, evil_archive(str(tmp_path / "node.pyz"), marker))
    assert not os.path.exists(marker), "the bootstrap ran an archive whose digest is not the controller's"
    assert "is not this controller's node code" in outcome["msg"], outcome


def test_node_code_reached_through_a_link_or_that_is_a_fifo_is_refused_without_waiting(node_archive, tmp_path):
    genuine, _digest = node_archive
    link = tmp_path / "link.pyz"
    link.symlink_to(genuine)
    assert "without following a link" in refused_step(node_archive, tmp_path, str(link))["msg"]
    fifo = str(tmp_path / "fifo.pyz")
    os.mkfifo(fifo, 0o600)
    started = time.monotonic()
    assert "not a regular file" in refused_step(node_archive, tmp_path, fifo)["msg"]
    assert time.monotonic() - started < 10


def test_the_node_code_runs_from_the_bytes_the_bootstrap_checked():
    """Imported from memory: the modules come from the verified archive, never from the path again."""
    from cluster_preflight.engine import bootstrap
    data, _digest = archive.build()
    code = bootstrap.NodeCode(data)
    spec = code.find_spec("preflight_node.srun_task")
    assert spec.origin == "<node code>/preflight_node/srun_task.py" and code.find_spec("json") is None
    assert "def main" in code.get_source("preflight_node.srun_task")
    # Subpackages are packages, their modules found under them.
    assert code.find_spec("preflight_node.host").submodule_search_locations is not None
    assert code.find_spec("preflight_node.host.ops").origin == "<node code>/preflight_node/host/ops.py"


# -- what a node prints is bounded, and whose output was cut is said ------------------------------------------------

def test_a_task_that_floods_its_output_is_cut_at_its_share_and_named_and_its_peer_keeps_its_result(node_archive,
                                                                                                   tmp_path):
    """n1 prints 40 MiB before its result: the controller keeps its share (16 MiB), n1 is the one failed, saying
    how much it printed and where it was cut; n2's result stands; the step's files stay within the shares."""
    flood = "head -c 41943040 /dev/zero | tr '\\\\0' 'x' | fold -w 4000"
    nodes, sizes = ["n1", "n2"], []
    path, digest = node_archive
    argv = [sys.executable] + step.srun_argv(nodes, "lock", python_of(tmp_path, "n1", flood), path, digest,
                                             bound=60, srun=FAKE_SRUN)
    data = step.payload("lock", {node: {"dir": str(tmp_path), "run_id": "r1"} for node in nodes})
    directory = tmp_path / "step"
    directory.mkdir(mode=0o700)
    handle = step.start(argv, data, str(directory), env=dict(os.environ))
    real_read = step._read

    def watching(collector, out, err, everything=False):
        sizes.append(os.path.getsize(str(directory / "out")) if (directory / "out").exists() else 0)
        return real_read(collector, out, err, everything)
    step._read = watching
    try:
        found = step.collect(handle, [(node, 0) for node in nodes], handle["started"] + 60)
    finally:
        step._read = real_read
    assert max(sizes) <= step.PER_TASK_BYTES + 1024 * 1024, max(sizes)
    n1, n2 = task_outcome(found, ("n1", 0), 60), task_outcome(found, ("n2", 0), 60)
    # (It printed until its step ended, once every task was done or cut.)
    assert n1["failed"] and "more than the %d bytes a task may" % step.PER_TASK_BYTES in n1["msg"], n1
    assert "cut after" in n1["msg"] and "result not read" in n1["msg"], n1
    assert n2.get("why") == "no lease on this node", n2


def test_the_relay_keeps_each_task_s_share_and_srun_s_own_lines_and_says_what_it_cut(tmp_path):
    import io
    source = io.BytesIO(b"".join([b"0: PFR n1 0 +\n"] + [b"1: " + b"y" * 97 + b"\n"] * 50 + [b"srun: hello\n"] +
                                 [b"0: " + b"z" * 200000 + b"\n"]))
    sink = io.BytesIO()
    cut = relay.copy(source, sink, per_task=1000, unlabelled=100)
    lines = sink.getvalue().decode().splitlines()
    assert lines[0] == "0: PFR n1 0 +" and "srun: hello" in lines
    # A line counts with its label: nine of task 1's 101-byte lines fit in 1000 bytes.
    assert "PFRCUT 1 909" in lines and "PFRCUT 1 total 5050" in lines, lines[-5:]
    # A line longer than the relay keeps counts whole, and is cut too (task 0 past its share with it).
    assert "PFRCUT 0 14" in lines and "PFRCUT 0 total %d" % (14 + 200004) in lines
    assert cut == {"0": 14 + 200004, "1": 5050}
    assert len(sink.getvalue()) < 1000 * 2 + 200


def test_a_result_that_decompresses_past_its_bound_or_claims_endless_parts_is_refused_at_once():
    collector = step.Collector([("n1", 0), ("n2", 0)])
    collector.feed_err("srun: launching StepId=1.0 on host n1, 1 tasks: 0")
    collector.feed_err("srun: launching StepId=1.0 on host n2, 1 tasks: 1")
    bomb = base64.b64encode(zlib.compress(b"[" * 1 + b"0," * (step.RESULT_MAX_BYTES // 2 + 10) + b"0]", 9)).decode()
    for line in ["PFR n1 0 +", "PFR n1 0 r 0 1 %s" % bomb,
                 "PFR n1 0 end %s" % hashlib.sha256(bomb.encode()).hexdigest()]:
        collector.feed("0: %s" % line)
    assert "larger than %d bytes" % step.RESULT_MAX_BYTES in collector.damaged[("n1", 0)]
    started = time.monotonic()
    for line in ["PFR n2 0 +", "PFR n2 0 r 0 999999999999 x", "PFR n2 0 end %s" % ("0" * 64)]:
        collector.feed("1: %s" % line)
    assert time.monotonic() - started < 1 and "incomplete" in collector.damaged[("n2", 0)]


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to the job's user needs root")
def test_a_job_user_command_that_prints_without_end_is_kept_within_its_bound_and_the_cut_said():
    """A login shell reading a huge ~/.profile, as the job's user: root keeps 1 MiB of it, and says so."""
    from preflight_node.host.ops import JOB_OUTPUT_MAX_BYTES, run_bounded_command
    rc, out, err = run_bounded_command(["/usr/bin/python3", "-c", "import sys\nfor _ in range(100): "
                                        "sys.stdout.write('x' * 1048575 + '\\n')"], 60, user="nobody")
    assert rc == 0 and len(out) <= JOB_OUTPUT_MAX_BYTES + 100, len(out)
    assert "standard output was 104857600 bytes, more than the %d kept" % JOB_OUTPUT_MAX_BYTES in err, err
