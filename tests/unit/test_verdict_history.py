"""The verdict action's run history and report.html (cluster_preflight/outputs/finish.py): every run is
recorded and gets its page; a database that cannot take it is a warning in the result and the message, and
the verdict's status stays what the nodes made it."""

import os

from cluster_preflight import capabilities
from cluster_preflight.plays import stage_results
from cluster_preflight.outputs import history
from verdict_build_helpers import records, run_action


def _hostvars(history_db=None):
    hostvars = {"n1": records(), "n2": records()}
    if history_db is not None:
        for host in hostvars:
            hostvars[host][stage_results.STAGE_REGISTERS["settings"]]["settings"] = {
                capabilities.RUN_ROLE: {"preflight_history_db": history_db}}
    return hostvars


def test_every_run_is_recorded_and_gets_its_page(tmp_path):
    results = tmp_path / "results"
    first = run_action({"kind": "bringup", "results_dir": str(results), "run_id": "r1", "fail": False}, _hostvars())
    second = run_action({"kind": "bringup", "results_dir": str(results), "run_id": "r2", "fail": False}, _hostvars())
    assert first["outputs"]["report.html"] == str(results / "r1" / "report.html")
    assert os.path.isfile(second["outputs"]["report.html"]) and "warnings" not in second
    rows = history.timeline(str(results / "history.sqlite"), node="n1")
    assert [(row["run_id"], row["kind"]) for row in rows] == [("r2", "bringup"), ("r1", "bringup")]
    assert "WARNING" not in second["msg"]


def test_a_corrupt_database_is_a_warning_and_the_status_stands(tmp_path):
    results = tmp_path / "results"
    plain = run_action({"kind": "bringup", "results_dir": str(results), "run_id": "r1", "fail": False}, _hostvars())
    db = tmp_path / "elsewhere.sqlite"
    db.write_bytes(b"\x00garbage" * 512)
    result = run_action({"kind": "bringup", "results_dir": str(results), "run_id": "r2", "fail": False},
                        _hostvars(str(db)))
    assert result["verdict_status"] == plain["verdict_status"]
    assert result.get("failed", False) == plain.get("failed", False)
    warning = [text for text in result["warnings"] if text.startswith("run history not recorded")]
    assert len(warning) == 1 and str(db) in warning[0] and "Fix: move it aside" in warning[0]
    assert "\nWARNING: run history not recorded" in result["msg"]
    assert os.path.isfile(result["outputs"]["report.html"])


def test_none_switches_the_history_off(tmp_path):
    results = tmp_path / "results"
    result = run_action({"kind": "bringup", "results_dir": str(results), "run_id": "r1", "fail": False},
                        _hostvars("none"))
    assert not os.path.exists(str(results / "history.sqlite"))
    assert os.path.isfile(result["outputs"]["report.html"]) and "warnings" not in result
