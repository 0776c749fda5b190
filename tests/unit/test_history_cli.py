"""``python -m cluster_preflight history`` (cluster_preflight/cli/history.py) and verdict expiry
(``--max-age`` of scripts/verdict and of the ``verdict`` command, ``verdict_file.load(max_age=...)``)."""

import datetime
import json
import os
import subprocess
import sys

import pytest

from cluster_preflight.cli import main as cli
from cluster_preflight.outputs import history
from cluster_preflight.verdict.file import VerdictError, describe_age, load, parse_age
from report_helpers import synthetic_verdict

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "verdicts", "mixed.json")
SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "verdict")


def _aged(tmp_path, hours):
    verdict = json.load(open(FIXTURE, encoding="utf-8"))
    when = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=hours)
    verdict["finished"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    path = tmp_path / "verdict.json"
    path.write_text(json.dumps(verdict))
    return str(path)


def test_parse_and_describe_ages():
    assert [parse_age(text) for text in ("90", "90s", "30m", "24h", "7d", "1.5h")] == [90, 90, 1800, 86400, 604800,
                                                                                      5400]
    with pytest.raises(ValueError, match="s, m, h or d"):
        parse_age("1w")
    assert [describe_age(value) for value in (59, 3600, 90061, 86400)] == ["59s", "1h", "1d 1h", "1d"]


def test_load_refuses_a_verdict_older_than_max_age(tmp_path):
    path = _aged(tmp_path, 2)
    assert load(path, max_age=3 * 3600)["status"] == "fail"
    with pytest.raises(VerdictError, match=r"finished at .*Z, 2h ago, older than the max age of 1h: treated as no"):
        load(path, max_age=3600)
    assert load(path)["status"] == "fail"  # no max age: any age


def test_a_verdict_without_a_finished_time_has_no_age(tmp_path):
    verdict = json.load(open(FIXTURE, encoding="utf-8"))
    del verdict["finished"]
    path = tmp_path / "verdict.json"
    path.write_text(json.dumps(verdict))
    with pytest.raises(VerdictError, match="no finished time"):
        load(str(path), max_age=60)


def test_scripts_verdict_max_age_exits_3_saying_its_age(tmp_path):
    path = _aged(tmp_path, 30)
    old = subprocess.run([sys.executable, SCRIPT, path, "--max-age", "24h"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert old.returncode == 3 and old.stdout == ""
    assert "1d 6h ago, older than the max age of 1d" in old.stderr and "Traceback" not in old.stderr
    fresh = subprocess.run([sys.executable, SCRIPT, path, "--max-age", "2d"], capture_output=True, text=True,
                           timeout=60, check=False)
    assert fresh.returncode == 2, fresh.stderr  # the fixture's own verdict: fail
    bad = subprocess.run([sys.executable, SCRIPT, path, "--max-age", "soon"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert bad.returncode == 3 and "not a number with a unit" in bad.stderr


def test_the_verdict_command_takes_max_age(tmp_path, capsys):
    path = _aged(tmp_path, 2)
    assert cli.main(["verdict", path, "--max-age", "1h"]) == 3
    assert "2h ago, older than the max age of 1h" in capsys.readouterr().err
    assert cli.main(["verdict", path, "--max-age", "3h"]) == 2
    assert cli.main(["verdict", path, "--max-age", "later"]) == 4


@pytest.fixture
def db(tmp_path):
    path = str(tmp_path / "history.sqlite")
    for number, failed in ((1, ("b",)), (2, ()), (3, ("b",))):
        verdict = synthetic_verdict(hosts=["a", "b"], failed=failed, run_id="r%d" % number, localize=True,
                                    finished="2026-11-0%dT00:00:00Z" % number, busbw={"a": 20.0 + number})
        assert history.record(path, verdict, "preflight", "x")["recorded"]
    return path


def test_history_text(db, capsys):
    assert cli.main(["history", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "Last run that passed: gate r2 (2026-11-02T00:00:00Z)" in out
    assert "  b (last pass: r2)" in out
    assert "    2026-11-03T00:00:00Z gate        fail       allreduce.ranks: allreduce broken on b: value 1" in out
    assert "Flaky nodes:\n  b failed 2 of its last 3 runs" in out
    assert "  a: 21.000 22.000 23.000" in out and "  a+b: 8.500 8.500 8.500" in out


def test_history_json_node_and_since(db, capsys):
    assert cli.main(["history", "--db", db, "--node", "a", "--since", "2026-11-02", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data["timelines"]) == ["a"]
    assert [run["run_id"] for run in data["timelines"]["a"]] == ["r3", "r2"]
    assert [point["busbw_gbps"] for point in data["busbw"]["node"]["a"]] == [22.0, 23.0]
    assert data["last_pass"]["a"]["run_id"] == "r3" and data["flaky"] == []


def test_history_without_a_database_or_with_a_bad_since(tmp_path, capsys):
    assert cli.main(["history", "--db", str(tmp_path / "none.sqlite")]) == 3
    assert "UNKNOWN: no run history at" in capsys.readouterr().err
    assert cli.main(["history", "--db", str(tmp_path / "none.sqlite"), "--since", "yesterday-ish"]) == 4
    assert cli.main(["history", "--nope"]) == 4
