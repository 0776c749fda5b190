"""What the Slurm prolog and health check trust as root (cluster_preflight/slurm/local.py): their state directory
(root's alone, checked at every start, or refused with exit 2 and nothing read or written there), the verdicts in
it (none dated in the future, none of a shape no run writes, is fresh), and the node's variables file (another
account may not write it; an invalid one means the script could not run, and drains nothing).  The scripts'
command line with the stand-in ansible-playbook of test_slurm_history."""

import io
import json
import os
import time

import pytest

from cluster_preflight.slurm import local as psl
from cluster_preflight.verdict import file as verdict_file
from report_helpers import synthetic_verdict
from test_slurm_history import ROOT, SHOW_IDLE, fake_tools, stamp, stand_in, updates, write_report  # noqa: F401

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: another account's files are made with chown")
NOBODY = 65534
FUTURE = "2099-01-01T00:00:00Z"


def run_script(tmp_path, mode, results, *extra, node_vars=None):
    """``(exit code, stderr)`` of the script in ``mode`` on node n1 with ``results`` as its results directory."""
    err = io.StringIO()
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=test\n")
    argv = ["--node", "n1", "--vars", str(node_vars or tmp_path / "none.yml"), "--results-dir", str(results),
            "--slurm-conf", str(conf), *extra]
    return psl.local_main(argv, mode, ROOT, stderr=err), err.getvalue()


def listing(path):
    return sorted((name, os.lstat(os.path.join(path, name)).st_mtime_ns) for name in os.listdir(path))


def test_the_state_directory_is_roots_own_under_var_lib_by_default(monkeypatch):
    monkeypatch.delenv("PREFLIGHT_SLURM_RESULTS", raising=False)
    assert psl.RESULTS_BASE == "/var/lib/preflight-slurm"
    assert psl._parser("prolog").parse_args([]).results_dir == "/var/lib/preflight-slurm"


@ROOT_ONLY
@pytest.mark.parametrize("mode", ["prolog", "healthcheck"])
@pytest.mark.parametrize("case", ["created first by another account", "writable by every account",
                                  "a link to another directory", "under a directory others may write"])
def test_a_state_directory_others_control_is_refused_and_nothing_is_read_or_written(tmp_path, stand_in, monkeypatch,
                                                                                     mode, case):
    monkeypatch.setenv("PATH", fake_tools(tmp_path, show_out=SHOW_IDLE) + os.pathsep + os.environ["PATH"])
    results = tmp_path / "state"
    if case == "under a directory others may write":
        (tmp_path / "open").mkdir()
        (tmp_path / "open").chmod(0o777)
        results = tmp_path / "open" / "state"
    if case == "a link to another directory":
        (tmp_path / "real").mkdir(mode=0o700)
        results.symlink_to(tmp_path / "real")
    else:
        results.mkdir(mode=0o700)
    # A forged pass of this node, finished far in the future: with --max-age it would let the node skip its checks.
    write_report(results / "last.json", finished=FUTURE)
    if case == "created first by another account":
        os.chown(results, NOBODY, NOBODY)
        os.chown(results / "last.json", NOBODY, NOBODY)
    elif case == "writable by every account":
        results.chmod(0o777)
    before = listing(os.path.realpath(results))
    code, err = run_script(tmp_path, mode, results, "--max-age", "6h")
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("preflight: n1: preflight.state_dir: the results directory "), err
    assert "refused, nothing read or written there -- fix: " in err
    assert stand_in() == [], "the checks ran in a directory others control"
    assert listing(os.path.realpath(results)) == before and updates(tmp_path) == []


def test_a_verdict_dated_in_the_future_is_never_fresh(tmp_path, stand_in):
    results = tmp_path / "state"
    path = write_report(results / "last.json", finished=FUTURE)
    assert psl.fresh_pass(str(results), "n1", 6 * 3600) is None
    with pytest.raises(verdict_file.VerdictError, match="in the future"):
        verdict_file.load(path, max_age=6 * 3600)
    code, _err = run_script(tmp_path, "prolog", results, "--max-age", "6h")
    assert len(stand_in()) == 1 and code == 1, "the checks ran"


def _shaped(report, case):
    node = report["nodes"]["n1"]
    if case == "a pass that its own checks contradict":
        node["checks"]["allreduce.ranks"] = {"status": "fail", "found": "x", "expected": "y", "fix": "z"}
    elif case == "a pass not among the healthy hosts":
        report["healthy_hosts"] = []
    elif case == "a run stopped on invalid settings":
        report["stopped"] = "invalid settings on n1"
    elif case == "an object in a host list":
        report["failed_hosts"] = [{"node": "n1"}]
    return report


@pytest.mark.parametrize("case", ["a pass that its own checks contradict", "a pass not among the healthy hosts",
                                  "a run stopped on invalid settings", "an object in a host list",
                                  "bytes that are not UTF-8"])
def test_a_verdict_of_a_shape_no_run_writes_is_never_fresh(tmp_path, case):
    results = tmp_path / "state"
    results.mkdir()
    report = _shaped(synthetic_verdict(hosts=["n1"], finished=stamp(60)), case)
    data = json.dumps(report).encode("utf-8")
    if case == "bytes that are not UTF-8":
        data = data.replace(b'"run_dir": "', b'"run_dir": "\xff')
    (results / "last.json").write_bytes(data)
    assert psl.fresh_pass(str(results), "n1", 6 * 3600) is None


def _stopped_report():
    report = synthetic_verdict(hosts=["n1"], failed=("n1",), finished=stamp(1))
    report["nodes"]["n1"]["checks"] = {"allreduce.inputs": {
        "status": "fail", "found": "invalid setting(s) for allreduce on n1: allreduce_timeout is -5.0",
        "expected": "a positive number of seconds", "fix": "set allreduce_timeout to 30"}}
    report["stopped"] = "invalid settings on n1"
    return report


@pytest.mark.parametrize("mode, code", [("prolog", 0), ("healthcheck", 2)])
@pytest.mark.parametrize("case", ["unreadable YAML", "settings the run refuses"])
def test_an_invalid_node_variables_file_could_not_run_and_drains_nothing(tmp_path, stand_in, monkeypatch, mode, code,
                                                                         case):
    monkeypatch.setenv("PATH", fake_tools(tmp_path, show_out=SHOW_IDLE) + os.pathsep + os.environ["PATH"])
    node_vars = tmp_path / "node.yml"
    if case == "unreadable YAML":
        node_vars.write_text("preflight_training_python: [/opt/t/python\n")
    else:
        node_vars.write_text("allreduce_timeout: -5\n")
        monkeypatch.setenv("FAKE_REPORT", json.dumps(_stopped_report()))
    found, err = run_script(tmp_path, mode, tmp_path / "state", node_vars=node_vars)
    # The prolog exits 0: Slurm drains a node on any other exit of its prolog.
    assert found == code, err
    assert err.count("\n") == 1 and err.startswith("preflight: n1: "), err
    assert "could not run" in err and "nothing was checked or drained" in err and str(node_vars) in err
    assert updates(tmp_path) == [], "a node was drained or resumed on invalid settings"
    assert len(stand_in()) == (0 if case == "unreadable YAML" else 1)


@ROOT_ONLY
@pytest.mark.parametrize("case", ["owned by another account", "in a directory others may write"])
def test_a_node_variables_file_another_account_may_write_is_refused(tmp_path, stand_in, case):
    folder = tmp_path / "etc"
    folder.mkdir()
    node_vars = folder / "node.yml"
    node_vars.write_text("preflight_training_python: /home/someone/python\n")
    if case == "owned by another account":
        os.chown(node_vars, NOBODY, NOBODY)
    else:
        folder.chmod(0o777)
    code, err = run_script(tmp_path, "prolog", tmp_path / "state", node_vars=node_vars)
    assert code == 2 and err.startswith("preflight: n1: preflight.node_vars: ") and "refused, not read" in err, err
    assert stand_in() == [], "root ran what another account chose"


def test_a_fresh_pass_in_roots_own_directory_still_skips(tmp_path, stand_in):
    results = tmp_path / "state"
    write_report(results / "last.json", finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    code, err = run_script(tmp_path, "prolog", results, "--max-age", "6h")
    assert (code, err) == (0, "") and stand_in() == []
