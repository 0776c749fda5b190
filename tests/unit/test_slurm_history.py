"""The run history and the age of a verdict in the Slurm scripts: a drain reason dated from the history
(``since <UTC time>``; a missing or corrupt history leaves it as it was), scripts/slurm-drain reading the
history of the results directory that holds the run, and the ``--max-age`` fast path of the prolog and the
health check (a recent pass runs nothing; a stale, failed or unknown one runs the checks), proven with a
stand-in ansible-playbook that records being called."""

import calendar
import io
import json
import os
import subprocess
import sys
import time

import pytest

from cluster_preflight.outputs import history
from cluster_preflight.slurm import drain as ps
from cluster_preflight.slurm import local as psl
from report_helpers import synthetic_verdict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOSTS = ["n1", "n2"]
SHOW_IDLE = "NodeName=n1 Arch=x86_64\n   State=IDLE ThreadsPerCore=1\n   Partitions=debug\n\n"


def record_runs(db, failing, hosts=HOSTS):
    """One gate run a day (2026-11-01 onwards) per entry of ``failing``: the nodes that fail allreduce.ranks."""
    verdict = None
    for day, failed in enumerate(failing, 1):
        verdict = synthetic_verdict(hosts=hosts, failed=failed, run_id="run%02d" % day,
                                    finished="2026-11-%02dT10:%02d:00Z" % (day, day))
        assert history.record(db, verdict, "preflight", "/results/run%02d/verdict.json" % day)["recorded"]
    return verdict


def stamp(seconds_ago):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - seconds_ago))


# -- the reason -----------------------------------------------------------------------------------

def test_the_reason_says_since_when_and_keeps_prefix_check_time_and_count():
    reason = ps.drain_reason("allreduce.ranks", "x" * 200, more=2, since="2026-11-02 10:02 UTC")
    assert len(reason) == ps.REASON_MAX
    assert reason.startswith("preflight: allreduce.ranks: xxx")
    assert reason.endswith("... since 2026-11-02 10:02 UTC (+2 more)")
    assert ps.drain_reason("a.b", "short", since="2026-11-02 10:02 UTC") == \
        "preflight: a.b: short since 2026-11-02 10:02 UTC"


def test_no_room_for_the_time_leaves_it_out_never_the_check_name():
    name = "gpu_health." + "y" * 60
    reason = ps.drain_reason(name, "what was found", since="2026-11-02 10:02 UTC", limit=100)
    assert reason == "preflight: %s: what was found" % name and len(reason) <= 100


@pytest.mark.parametrize("finished, text", [("2026-11-02T10:02:00Z", "2026-11-02 10:02 UTC"),
                                            ("yesterday\nnoon", "yesterday noon")])
def test_since_text(finished, text):
    assert ps.since_text(finished) == text


def test_history_since_is_the_first_run_of_the_current_failing_streak(tmp_path):
    db = str(tmp_path / "history.sqlite")
    record_runs(db, [("n1",), (), ("n1",), ("n1", "n2")])
    since = ps.history_since(db)
    assert since("n1", "allreduce.ranks") == "2026-11-03 10:03 UTC"
    assert since("n2", "allreduce.ranks") == "2026-11-04 10:04 UTC"
    assert since("n1", "kernel_debug.ptrace_scope") is None, "a check its latest run does not fail"
    assert since("n9", "allreduce.ranks") is None, "a node the history never saw"


def test_a_missing_corrupt_or_switched_off_history_gives_no_time(tmp_path):
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes(b"this is not a database" * 100)
    for db in (str(tmp_path / "missing.sqlite"), str(corrupt), None):
        assert ps.history_since(db)("n1", "allreduce.ranks") is None


def test_plan_dates_the_drain_and_keeps_it_once_drained_with_that_reason(tmp_path):
    db = str(tmp_path / "history.sqlite")
    report = record_runs(db, [(), ("n1",), ("n1",)])
    since = ps.history_since(db)
    drain = ps.plan(report, {"n1": {"state": "IDLE", "reason": ""}, "n2": {"state": "IDLE", "reason": ""}}, since)
    assert drain[0]["action"] == "drain"
    assert drain[0]["reason"] == "preflight: allreduce.ranks: allreduce broken on n1: value 1 since 2026-11-02 10:02 UTC"
    again = ps.plan(report, {"n1": {"state": "IDLE+DRAIN", "reason": drain[0]["reason"]}}, since)
    assert again[0]["action"] == "keep" and again[0]["why"] == "already drained"
    assert ps.plan(report, {"n1": {"state": "IDLE", "reason": ""}})[0]["reason"] == \
        "preflight: allreduce.ranks: allreduce broken on n1: value 1", "no history: the reason as before"


# -- scripts/slurm-drain: the history next to the run ---------------------------------------------

def fake_tools(tmp_path, sinfo_out=None, show_out=None):
    """scontrol records its argv (calls.jsonl) and prints ``show_out`` for show; sinfo prints ``sinfo_out``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text(
        "#!%s\nimport json, sys\nopen(%r, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "if sys.argv[1:2] == ['show']:\n    sys.stdout.write(%r)\n"
        % (sys.executable, str(tmp_path / "calls.jsonl"), show_out or ""))
    (bin_dir / "sinfo").write_text("#!/bin/sh\nprintf '%%s' %r\n" % (sinfo_out or ""))
    for name in ("scontrol", "sinfo"):
        (bin_dir / name).chmod(0o755)
    return str(bin_dir)


def updates(tmp_path):
    calls = tmp_path / "calls.jsonl"
    lines = calls.read_text().splitlines() if calls.exists() else []
    return [call for call in map(json.loads, lines) if call[0] == "update"]


def run_drain(tmp_path, run_dir, *args):
    env = dict(os.environ, PATH=fake_tools(tmp_path, "n1|idle|none\nn2|idle|none\n") + os.pathsep + os.environ["PATH"])
    env.pop("SLURM_CONF", None)
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=test\n")
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "slurm-drain"), "--slurm-conf", str(conf),
                           *args, str(run_dir)], capture_output=True, text=True, env=env, timeout=60, check=False)


def results_with_history(tmp_path):
    """results/run03/verdict.json, results/latest -> run03, and results/history.sqlite holding runs 1-3."""
    results = tmp_path / "results"
    (results / "run03").mkdir(parents=True)
    report = record_runs(str(results / "history.sqlite"), [(), ("n1",), ("n1",)])
    (results / "run03" / "verdict.json").write_text(json.dumps(report))
    os.symlink("run03", str(results / "latest"))
    return results


def test_slurm_drain_dates_the_reason_from_the_history_of_the_runs_results_directory(tmp_path):
    results = results_with_history(tmp_path)
    done = run_drain(tmp_path, results / "latest")
    assert done.returncode == 0, done.stderr
    assert updates(tmp_path) == [["update", "nodename=n1", "state=drain", "reason=preflight: allreduce.ranks: "
                                  "allreduce broken on n1: value 1 since 2026-11-02 10:02 UTC"]]


@pytest.mark.parametrize("break_it, args", [
    (lambda db: db.write_bytes(b"garbage" * 1000), ()),
    (lambda db: db.unlink(), ()),
    (lambda db: None, ("--history-db", "none")),
])
def test_slurm_drain_without_a_readable_history_gives_the_reason_as_before(tmp_path, break_it, args):
    results = results_with_history(tmp_path)
    break_it(results / "history.sqlite")
    done = run_drain(tmp_path, results / "run03" / "verdict.json", *args)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert updates(tmp_path) == [["update", "nodename=n1", "state=drain",
                                  "reason=preflight: allreduce.ranks: allreduce broken on n1: value 1"]]


# -- --max-age: which verdict lets the node skip its checks ---------------------------------------

def write_report(path, failed=(), finished=None, hosts=("n1",)):
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    report = synthetic_verdict(hosts=list(hosts), failed=failed, finished=finished or stamp(3600))
    with open(str(path), "w", encoding="utf-8") as handle:
        json.dump(report, handle)
    return str(path)


def test_a_pass_younger_than_the_max_age_lets_the_node_skip(tmp_path):
    path = write_report(tmp_path / "last.json", finished=stamp(3600))
    assert psl.fresh_pass(str(tmp_path), "n1", 6 * 3600) == path
    assert psl.fresh_pass(str(tmp_path), "n1", 1800) is None, "older than the max age"
    assert psl.fresh_pass(str(tmp_path), "n2", 6 * 3600) is None, "a verdict that does not name the node"
    assert psl.fresh_pass(str(tmp_path / "empty"), "n1", 6 * 3600) is None, "no verdict at all"


def test_a_gate_verdict_under_latest_counts_when_it_is_the_nodes_latest(tmp_path):
    write_report(tmp_path / "last.json", finished=stamp(5 * 3600))
    write_report(tmp_path / "run" / "verdict.json", failed=("n2",), finished=stamp(600), hosts=("n1", "n2"))
    os.symlink("run", str(tmp_path / "latest"))
    assert psl.fresh_pass(str(tmp_path), "n1", 6 * 3600) == os.path.join(str(tmp_path), "latest", "verdict.json"), \
        "the gate failed on n2; n1 passed in it"
    assert psl.fresh_pass(str(tmp_path), "n2", 6 * 3600) is None


@pytest.mark.parametrize("case", ["node failed last", "unreadable last.json", "no finished time"])
def test_an_unknown_or_failed_latest_outcome_runs_the_checks(tmp_path, case):
    write_report(tmp_path / "run" / "verdict.json", finished=stamp(600))
    os.symlink("run", str(tmp_path / "latest"))
    if case == "node failed last":
        write_report(tmp_path / "last.json", failed=("n1",), finished=stamp(60))
    elif case == "unreadable last.json":
        (tmp_path / "last.json").write_text('{"status": "pass", "hosts": ["n1"')
    else:
        report = synthetic_verdict(hosts=["n1"])
        del report["finished"]
        (tmp_path / "last.json").write_text(json.dumps(report))
    assert psl.fresh_pass(str(tmp_path), "n1", 6 * 3600) is None


# -- the scripts' command line, with a stand-in ansible-playbook ----------------------------------

FAKE_PLAYBOOK = """#!%(python)s
import json, os, sys
with open(%(calls)r, "a") as handle:
    handle.write(json.dumps(sys.argv[1:]) + "\\n")
results = [arg.split("=", 1)[1] for arg in sys.argv if arg.startswith("preflight_results_dir=")][0]
report = os.environ.get("FAKE_REPORT")
if report:
    os.makedirs(os.path.join(results, "run1"))
    with open(os.path.join(results, "run1", "healthcheck.json"), "w") as handle:
        handle.write(report)
    sys.exit(0)
print("the stand-in ansible-playbook was called without a report to give")
sys.exit(1)
"""


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """``sys.executable`` in a directory whose ansible-playbook records its argv in ``playbook.jsonl``."""
    bin_dir = tmp_path / "venv-bin"
    bin_dir.mkdir()
    os.symlink(sys.executable, str(bin_dir / "python"))
    (bin_dir / "ansible-playbook").write_text(FAKE_PLAYBOOK % {"python": sys.executable,
                                                               "calls": str(tmp_path / "playbook.jsonl")})
    (bin_dir / "ansible-playbook").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.delenv("PREFLIGHT_MAX_AGE", raising=False)
    monkeypatch.delenv("FAKE_REPORT", raising=False)

    def calls():
        path = tmp_path / "playbook.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return calls


def main(tmp_path, mode, *args):
    err = io.StringIO()
    results = tmp_path / "slurm-results"
    code = psl.local_main(["--node", "n1", "--vars", str(tmp_path / "none.yml"), "--results-dir", str(results),
                           *args], mode, ROOT, stderr=err)
    return code, err.getvalue()


def test_prolog_after_a_fresh_pass_exits_0_and_never_runs_the_playbook(tmp_path, stand_in):
    last = write_report(tmp_path / "slurm-results" / "last.json", finished=stamp(3600))
    before = os.stat(last).st_mtime_ns
    assert main(tmp_path, "prolog", "--max-age", "6h") == (0, "")
    assert stand_in() == [], "the playbook was run"
    assert os.stat(last).st_mtime_ns == before and sorted(os.listdir(str(tmp_path / "slurm-results"))) == ["last.json"]


@pytest.mark.parametrize("mode", ["prolog", "healthcheck"])
def test_a_stale_pass_runs_the_checks(tmp_path, stand_in, mode, monkeypatch):
    write_report(tmp_path / "slurm-results" / "last.json", finished=stamp(7 * 3600))
    monkeypatch.setenv("PREFLIGHT_MAX_AGE", "6h")  # the environment's value, as a wrapper would set it
    monkeypatch.setenv("PATH", fake_tools(tmp_path, show_out=SHOW_IDLE) + os.pathsep + os.environ["PATH"])
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=test\n")
    code, err = main(tmp_path, mode, "--slurm-conf", str(conf))
    assert len(stand_in()) == 1, "the checks were not run"
    assert code == 1 and err.startswith("preflight: n1: preflight.report: ansible-playbook ended (rc 1)"), err


def test_without_max_age_a_fresh_pass_still_runs_the_checks(tmp_path, stand_in):
    write_report(tmp_path / "slurm-results" / "last.json", finished=stamp(60))
    main(tmp_path, "prolog")
    assert len(stand_in()) == 1


def test_a_bad_max_age_is_a_usage_error(tmp_path, stand_in, capsys):
    with pytest.raises(SystemExit) as stop:
        main(tmp_path, "prolog", "--max-age", "six hours")
    assert stop.value.code == 2 and "max age 'six hours' is not a number with a unit" in capsys.readouterr().err
    assert stand_in() == []


def test_the_health_check_records_its_run_and_dates_its_drain_from_that_history(tmp_path, stand_in, monkeypatch):
    results = tmp_path / "slurm-results"
    results.mkdir()
    record_runs(str(results / "history.sqlite"), [(), ("n1",)], hosts=["n1"])
    report = synthetic_verdict(hosts=["n1"], failed=("n1",), run_id="run03", finished="2026-11-03T10:03:00Z")
    monkeypatch.setenv("FAKE_REPORT", json.dumps(report))
    monkeypatch.setenv("PATH", fake_tools(tmp_path, show_out=SHOW_IDLE) + os.pathsep + os.environ["PATH"])
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=test\n")
    code, err = main(tmp_path, "healthcheck", "--slurm-conf", str(conf))
    assert code == 1 and err.startswith("preflight: n1: allreduce.ranks: allreduce broken on n1"), err
    extra_vars = [json.loads(arg) for arg in stand_in()[0] if arg.startswith("{")]
    assert extra_vars == [{"preflight_history_db": str(results / "history.sqlite")}], "recorded in the node's history"
    assert updates(tmp_path) == [["update", "nodename=n1", "state=drain", "reason=preflight: allreduce.ranks: "
                                  "allreduce broken on n1: value 1 since 2026-11-02 10:02 UTC"]]


@pytest.mark.parametrize("option, node_vars, expected", [
    ("", {}, "RESULTS/history.sqlite"),
    ("", {"preflight_history_db": "/srv/history.sqlite"}, "/srv/history.sqlite"),
    ("/opt/h.sqlite", {"preflight_history_db": "/srv/history.sqlite"}, "/opt/h.sqlite"),
    ("none", {}, None),
    ("", {"preflight_history_db": "none"}, None),
])
def test_which_history_the_node_local_runs_use(tmp_path, option, node_vars, expected):
    found = psl.history_db(option, node_vars, str(tmp_path))
    assert found == (expected.replace("RESULTS", str(tmp_path)) if expected else None)
    assert psl.healthcheck_argv("ap", "hc.yml", "inv", "res", 20, found)[-1] == \
        json.dumps({"preflight_history_db": found or "none"})


def test_the_ages_a_verdict_file_loads_with(tmp_path):
    path = write_report(tmp_path / "last.json", finished="2026-11-03T10:00:00Z")
    now = calendar.timegm((2026, 11, 3, 15, 59, 0, 0, 0, 0))
    assert psl.fresh_pass(str(tmp_path), "n1", 6 * 3600, now=now) == path
    assert psl.fresh_pass(str(tmp_path), "n1", 5 * 3600, now=now) is None
