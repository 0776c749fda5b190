"""A verdict as its consumers read it, whoever wrote it: a malformed one is exit 3 and one line everywhere, a run
stopped on invalid settings drains nothing, texts the job controls reach no terminal or output as control codes,
and every run keeps a directory of its own."""

import copy
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import types

import pytest

from cluster_preflight.outputs import finish
from cluster_preflight.verdict import accounting as pv
from cluster_preflight.cli import main as cli
from cluster_preflight.outputs import history
from cluster_preflight.slurm import drain as slurm, local as slurm_local
from cluster_preflight.verdict.file import VerdictError, load
from preflight_node.checks import failed, passed, warned
from verdict_build_helpers import build, gate, records, run_action

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "scripts")
ESCAPES = "\x1b[2J\x1b]0;owned\x07\x1b[1A\rPASS \x9b31m\u202eevil"


def _verdict(found="ranks 2-3 hung in allreduce", stopped=None):
    """A gate verdict: n1 passes with a warning, n2 fails one check."""
    checks = {"n1": {"kernel_debug": {"x": passed("fine on n1", "fine")},
                     "core_dumps": {"pattern": warned("no core pattern on n1", "a pattern", "set one on n1")}},
              "n2": {"allreduce": {"ranks": failed(found + " on n2", "every rank finishes", "replace n2's NIC")}}}
    verdict = build(["n1", "n2"], {"n1": records(), "n2": records()},
                    [{"checks_by_host": checks}, dict(gate(), allreduce=dict(gate()["allreduce"], sizes=[
                        {"size_bytes": 1048576, "busbw_gbps": 1.5, "algbw_gbps": 1.0, "time_us": 900.0}]))],
                    capabilities=("kernel_debug", "core_dumps", "allreduce"))
    if stopped:
        verdict["stopped"] = stopped
    return verdict


def _write(tmp_path, data, name="verdict.json"):
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    return str(path)


def _script(name, *args, env=None):
    return subprocess.run([sys.executable, os.path.join(SCRIPTS, name)] + list(args), capture_output=True,
                          text=True, timeout=60, env=env, check=False)


def _cli(capsys, *args):
    code = cli.main(["verdict"] + list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(text):
    lines = [line for line in text.splitlines() if line.strip()]
    return len(lines) == 1 and "Traceback" not in text


# -- malformed verdicts: exit 3, one line, everywhere ------------------------------------------------------------

MALFORMED = {
    "not UTF-8": json.dumps(_verdict()).encode().replace(b"ranks 2-3", b"ranks \xff\xfe"),
    "an object in a host list": dict(_verdict(), failed_hosts=[{"name": "n2"}]),
    "a fail check without a fix": None,  # built below
    "nested too deep": b"[" * 100000 + b"]" * 100000,
}


def _malformed(name):
    if name == "a fail check without a fix":
        verdict = _verdict()
        del verdict["nodes"]["n2"]["checks"]["allreduce.ranks"]["fix"]
        return verdict
    return MALFORMED[name]


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_verdict_is_exit_3_and_one_line_in_scripts_verdict_and_the_cli(tmp_path, capsys, name):
    path = _write(tmp_path, _malformed(name))
    for args in ([], ["--drain-list"], ["--nhc"]):
        done = _script("verdict", path, *args)
        assert (done.returncode, done.stdout) == (3, ""), (args, done.stdout, done.stderr)
        assert _one_line(done.stderr) and done.stderr.startswith("UNKNOWN: "), done.stderr
        code, out, err = _cli(capsys, path, *args)
        assert (code, out) == (3, "") and _one_line(err) and err.startswith("UNKNOWN: "), (args, err)


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_verdict_drains_nothing_and_says_so_in_one_line(tmp_path, name):
    path = _write(tmp_path, _malformed(name))
    done = _script("slurm-drain", "--dry-run", path)
    assert (done.returncode, done.stdout) == (3, "") and _one_line(done.stderr), done.stderr


def _paths(value, prefix=()):
    """Every (path) into a JSON value, containers and leaves."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value[:2]):
            yield from _paths(item, prefix + (index,))


def _mutated(verdict, path, replacement):
    data = copy.deepcopy(verdict)
    target = data
    for key in path[:-1]:
        target = target[key]
    if replacement is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = replacement
    return data


_DELETE = object()
REPLACEMENTS = (_DELETE, None, 7, "x", {}, ["n1", {"b": 2}])


def test_no_mutation_of_a_verdict_makes_a_consumer_raise(tmp_path, capsys):
    """Every field replaced by every wrong type, or removed: each consumer refuses the file (exit 3) or reads it,
    never a traceback (Python's exit 1 reads as a pass with warnings)."""
    script = _load("verdict_script", os.path.join(SCRIPTS, "verdict"))
    summary = _callback()
    base = _verdict(stopped=None)
    tried = 0
    for path in list(_paths(base))[1:]:
        for replacement in REPLACEMENTS:
            data = _mutated(base, path, replacement)
            where = _write(tmp_path, data)
            tried += 1
            try:
                loaded = load(where)
            except VerdictError:
                loaded = None
            code, _out, err = _cli(capsys, where, "--nhc")
            assert "Traceback" not in err and (code == 3) == (loaded is None), (path, replacement, err)
            for args in ([], ["--drain-list"]):
                # main, not its guard: an exception here is a defect the guard would only hide.
                assert (script.main([where] + args) == 3) == (loaded is None)
            assert "Traceback" not in capsys.readouterr().err
            if loaded is not None:
                summary.summary_lines(loaded, where)
                slurm.plan(loaded, {host: {"state": "idle", "reason": ""} for host in loaded["hosts"]})
                for host in loaded["hosts"]:
                    slurm.failure_line(host, loaded["nodes"][host])
                slurm_local.fresh_pass(str(tmp_path), "n1", 3600)
    assert tried > 400


def _load(name, path):
    """The Python file at ``path`` (a script without .py too) as a module."""
    loader = importlib.machinery.SourceFileLoader(name, path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    loader.exec_module(module)
    return module


def _callback():
    return _load("preflight_summary_callback", os.path.join(ROOT, "callback_plugins", "preflight_summary.py"))


# -- a run stopped on invalid settings drains nothing ----------------------------------------------------------

def _fake_slurm(tmp_path):
    """sinfo that shows n1 and n2 idle, scontrol that records what it was asked; a slurm.conf to point at."""
    log = tmp_path / "scontrol.log"
    sinfo = tmp_path / "sinfo"
    sinfo.write_text("#!/bin/sh\nprintf 'n1|idle|none\\nn2|idle|none\\n'\n")
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\necho \"$@\" >> %s\n" % log)
    for path in (sinfo, scontrol):
        path.chmod(0o755)
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=bed\n")
    return ["--sinfo", str(sinfo), "--scontrol", str(scontrol), "--slurm-conf", str(conf)], log


def test_slurm_drain_drains_nothing_on_a_run_stopped_by_invalid_settings(tmp_path):
    path = _write(tmp_path, _verdict(stopped="invalid settings on n1, n2"))
    options, log = _fake_slurm(tmp_path)
    done = _script("slurm-drain", *options, path)
    assert not log.exists(), "scontrol was called: %s" % log.read_text()
    assert done.returncode == 3 and "stopped" in done.stderr and _one_line(done.stderr)
    # The same verdict, not stopped: the bed drains n2 (so the fakes above are what slurm-drain uses).
    path = _write(tmp_path, _verdict(), "ran.json")
    assert _script("slurm-drain", *options, path).returncode == 0 and "state=drain" in log.read_text()


def test_no_plan_drains_or_resumes_a_node_of_a_stopped_run():
    verdict = _verdict(stopped="invalid settings on n2")
    current = {"n1": {"state": "drained", "reason": "preflight: x"}, "n2": {"state": "idle", "reason": ""}}
    assert {item["action"] for item in slurm.plan(verdict, current)} == {"keep"}


def test_the_drain_list_of_a_stopped_run_is_empty(tmp_path, capsys):
    path = _write(tmp_path, _verdict(stopped="invalid settings on n2"))
    for args in (["--drain-list"], ["--nhc"]):
        done = _script("verdict", path, *args)
        assert done.stdout == "" and done.returncode == 2 and "STOPPED" in done.stderr, done
        code, out, err = _cli(capsys, path, *args)
        assert (code, out) == (4, "") and "STOPPED" in err


def test_the_prolog_does_not_fail_the_node_on_a_stopped_run(tmp_path, monkeypatch):
    """Slurm drains a node on any non-zero prolog exit: invalid settings are exit 0 and one line saying nothing
    was checked or drained."""
    verdict = _verdict(stopped="invalid settings on n2")
    monkeypatch.setattr(slurm_local, "local_check", lambda *args, **kwargs: (verdict, "log"))
    err = types.SimpleNamespace(lines=[], write=lambda text: err.lines.append(text), flush=lambda: None)
    code = slurm_local.local_main(["--node", "n2", "--results-dir", str(tmp_path), "--vars", "/nonexistent"],
                                  "prolog", ROOT, stderr=err)
    assert code == 0 and "could not run" in "".join(err.lines) and "nothing was checked or drained" in "".join(err.lines)


# -- texts the job controls reach no terminal as control codes -----------------------------------------------

def test_escape_sequences_in_a_rank_error_reach_no_terminal_and_no_output(tmp_path, capsys):
    from cluster_preflight.verdict.printable import printable_tree

    verdict = _verdict(found="rank 1: " + ESCAPES)
    results = tmp_path / "results"
    logs = {"n2": {"log": "[n2 rank1] " + ESCAPES + "\nnext line\n",
                   "ranks": [{"rank": 1, "stack": "Thread 1\n  " + ESCAPES + " (train.py:3)"}]}}
    pv.write_run_dir(printable_tree(verdict), logs, str(results), str(results / "r1"))
    written = {name: (results / "r1" / name).read_text() for name in os.listdir(results / "r1")}
    assert "next line" in written["n2.log"] and "Thread 1" in written["n2.stacks.txt"]
    for name, text in written.items():
        assert not any(char in text for char in "\x1b\x07\r\x9b\u202e"), name
    # A verdict file written by someone else: the readers clean it at the terminal.
    path = _write(tmp_path, verdict)
    for args in ([], ["--nhc"]):
        done = _script("verdict", path, *args)
        assert not any(char in done.stdout for char in "\x1b\x07\r\x9b\u202e"), done.stdout
        _code, out, _err = _cli(capsys, path, *args)
        assert not any(char in out for char in "\x1b\x07\r\x9b\u202e"), out
    reason = slurm.node_reason(verdict["nodes"]["n2"])
    line = slurm.failure_line("n2", verdict["nodes"]["n2"])
    assert not any(char in reason + line for char in "\x1b\x07\r\x9b\u202e")
    lines = _callback().summary_lines(dict(verdict, allreduce=dict(verdict["allreduce"], status="skipped",
                                                                 reason=ESCAPES)), path)
    assert not any(char in text for text, _color in lines for char in "\x1b\x07\r\x9b\u202e")


def test_the_verdict_action_writes_no_control_code_into_the_verdict_and_its_outputs(tmp_path):
    hostvars = {"n1": records(settings={"ok": False, "errors": [{"capability": "allreduce", "name": "allreduce_x",
                                                                 "found": ESCAPES, "expected": "a value",
                                                                 "fix": "set it"}]}),
                "n2": records()}
    result = run_action({"kind": "bringup", "results_dir": str(tmp_path / "results"), "run_id": "r1",
                         "fail": False}, hostvars)
    for name in os.listdir(result["run_dir"]):
        text = open(os.path.join(result["run_dir"], name), encoding="utf-8").read()
        assert not any(char in text for char in "\x1b\x07\x9b\u202e"), name
        assert "\\u001b" not in text, name
    assert not any(char in result["msg"] for char in "\x1b\x07\x9b\u202e")


# -- run directories: one per run, never lost to latest, never outside ---------------------------------------

def test_two_runs_ending_in_the_same_second_keep_two_directories_and_two_history_rows(tmp_path, monkeypatch):
    results = tmp_path / "results"
    monkeypatch.setattr(finish, "run_place", lambda args: (str(results), "20260101T000000Z"))
    first = run_action({"kind": "preflight", "results_dir": str(results), "fail": False},
                       {"n1": records(), "n2": records()})
    second = run_action({"kind": "preflight", "results_dir": str(results), "fail": False},
                        {"n1": records()})
    assert first["run_dir"] != second["run_dir"]
    assert os.path.basename(second["run_dir"]) == "20260101T000000Z-2"
    assert load(first["run_dir"])["hosts"] == ["n1", "n2"] and load(second["run_dir"])["hosts"] == ["n1"]
    assert load(second["run_dir"])["run_id"] == "20260101T000000Z-2"
    assert (results / "20260101T000000Z" / "hostfile").read_text().count("\n") == 0  # n1, n2 failed here
    rows = history.timeline(str(results / "history.sqlite"), node="n1")
    assert sorted(row["run_id"] for row in rows) == ["20260101T000000Z", "20260101T000000Z-2"]


def test_a_latest_that_cannot_be_replaced_never_deletes_the_finished_run(tmp_path):
    results = tmp_path / "results"
    (results / "latest").mkdir(parents=True)
    (results / "latest" / "keep.txt").write_text("an operator's own file\n")
    verdict = _verdict()
    notes = pv.write_run_dir(verdict, {"n1": {"log": "ok\n"}}, str(results), str(results / "r1"))
    assert load(str(results / "r1"))["hosts"] == ["n1", "n2"] and (results / "r1" / "n1.log").exists()
    assert (results / "latest" / "keep.txt").exists()
    assert any("latest" in note and "not moved" in note and str(results / "r1") in note for note in notes)


@pytest.mark.parametrize("host", ["../../x", "../escape", "a/b", ".hidden", "", "bad\nname"])
def test_a_host_name_that_is_no_file_name_writes_nothing_outside_the_run_directory(tmp_path, host):
    results = tmp_path / "deep" / "results"
    with pytest.raises(OSError) as raised:
        pv.write_run_dir(_verdict(), {host: {"log": "x\n"}}, str(results), str(results / "r1"))
    assert "not usable as a file name" in str(raised.value)
    outside = [os.path.join(path, name) for path, _dirs, names in os.walk(tmp_path) for name in names]
    assert outside == [], outside
