"""The verdict: accounting for every targeted node, aggregation of every decision, the run
directory, and scripts/verdict on good and bad files (the run directory's privacy, task errors,
the action and write errors are in test_verdict_run_dir.py)."""

import json
import os
import subprocess
import sys

import pytest

from cluster_preflight import capabilities
from cluster_preflight.plays import stage_results
from cluster_preflight.verdict import accounting as pv
from preflight_node.checks import failed, passed, warned
from cluster_preflight.verdict.file import problems
from verdict_build_helpers import (OK, UNREACHABLE, build, every_capability_passes, gate,
                                   passing_verdict, records)


def test_every_node_checked_by_every_capability_passes():
    verdict = build(["n1", "n2"], {"n1": records(), "n2": records()},
                    [{"checks_by_host": every_capability_passes(["n1", "n2"])}, gate()])
    assert verdict["status"] == "pass" and problems(verdict) == []
    assert verdict["healthy_hosts"] == ["n1", "n2"] and verdict["failed_hosts"] == []
    assert verdict["nodes"]["n1"]["checks"]["kernel_debug.x"]["status"] == "pass"
    assert verdict["nodes"]["n1"]["checks"]["preflight.reachable"]["status"] == "pass"
    assert verdict["bound_seconds"] == 300


def test_a_capability_that_gave_nothing_fails_its_node_with_the_reason():
    checks = every_capability_passes(["n1", "n2"])
    del checks["n2"]["core_dumps"]
    verdict = build(["n1", "n2"], {"n1": records(), "n2": records()}, [{"checks_by_host": checks}, gate()])
    assert verdict["status"] == "fail" and verdict["failed_hosts"] == ["n2"]
    missing = verdict["nodes"]["n2"]["checks"]["core_dumps.no_result"]
    assert missing["status"] == "fail" and "core_dumps" in missing["found"] and "n2" in missing["found"]


def test_a_node_lost_mid_run_is_unreachable_and_named_and_its_peers_are_not_blamed():
    checks = every_capability_passes(["n1", "n2"])
    del checks["n2"]["allreduce"]
    del checks["n2"]["core_dumps"]
    verdict = build(["n1", "n2"], {"n1": records(), "n2": records(probes=UNREACHABLE)},
                    [{"checks_by_host": checks}, gate("fail")])
    assert verdict["status"] == "fail"
    assert verdict["unreachable_hosts"] == ["n2"] and verdict["failed_hosts"] == ["n2"]
    reach = verdict["nodes"]["n2"]["checks"]["preflight.reachable"]
    assert "while running the probes" in reach["found"] and "Connection timed out" in reach["found"]
    assert "while running the probes" in verdict["nodes"]["n2"]["checks"]["core_dumps.no_result"]["found"]
    assert verdict["nodes"]["n1"]["status"] == "pass"


def test_a_pass_needs_every_targeted_node_even_one_with_no_results_at_all():
    verdict = build(["n1", "n2"], {"n1": records()}, [{"checks_by_host": every_capability_passes(["n1"])}, gate()])
    assert verdict["status"] == "fail" and verdict["failed_hosts"] == ["n2"]
    assert "allreduce.no_result" in verdict["nodes"]["n2"]["checks"]


def test_a_stage_that_failed_is_named():
    verdict = build(["n1"], {"n1": records(facts={"failed": True, "msg": "The task timed out after 60 seconds"})},
                    [{"checks_by_host": {}}, gate("skipped")])
    check = verdict["nodes"]["n1"]["checks"]["preflight.facts"]
    assert check["status"] == "fail" and "timed out after 60 seconds" in check["found"]
    assert "reading its facts" in verdict["nodes"]["n1"]["checks"]["iommu.no_result"]["found"]


def test_blocked_nodes_are_unverified_not_failed():
    checks = every_capability_passes(["n1", "n2"])
    checks["n1"]["allreduce"] = {"ranks": warned("collateral", "done", "fix n2", blocked=True)}
    checks["n2"]["allreduce"] = {"suspect_rank_2": failed("rank 2 died", "done", "drain n2")}
    verdict = build(["n1", "n2"], {"n1": records(), "n2": records()}, [{"checks_by_host": checks}, gate("fail")])
    assert verdict["failed_hosts"] == ["n2"] and verdict["unverified_hosts"] == ["n1"]
    assert verdict["healthy_hosts"] == []
    assert any(line.startswith("n1 / allreduce.ranks") for line in pv.failure_lines(verdict))


def test_the_gate_must_pass_even_when_every_node_does():
    verdict = build(["n1"], {"n1": records()}, [{"checks_by_host": every_capability_passes(["n1"])},
                                                 gate("skipped")])
    assert verdict["status"] == "fail"


def test_invalid_settings_stop_the_run_and_say_which_setting():
    bad = {"ok": False, "errors": [{"capability": "ssh_trust", "name": "ssh_trust_port", "found": "70000",
                                     "expected": "a TCP port 1-65535", "fix": "set ssh_trust_port: 22"}]}
    decisions = [{"ok": False, "blockers": ["invalid settings on n2"], "invalid_hosts": ["n2"],
                  "checks_by_host": {}}, {"checks_by_host": {}}]
    verdict = build(["n1", "n2"], {"n1": records(facts={"skipped": True}),
                                   "n2": records(settings=bad, facts={"skipped": True})}, decisions)
    assert verdict["status"] == "fail" and verdict["stopped"] == "invalid settings on n2"
    inputs = verdict["nodes"]["n2"]["checks"]["ssh_trust.inputs"]
    assert inputs["status"] == "fail" and "ssh_trust_port is 70000" in inputs["found"]
    assert "1-65535" in inputs["expected"] and inputs["fix"] == "set ssh_trust_port: 22"
    assert verdict["failed_hosts"] == ["n2"] and verdict["unverified_hosts"] == ["n1"]
    assert set(verdict["nodes"]["n1"]["checks"]) == {"preflight.inputs"}


def test_two_decisions_naming_the_same_check_are_a_contract_failure():
    checks = every_capability_passes(["n1"])
    verdict = build(["n1"], {"n1": records()}, [{"checks_by_host": checks},
                                                {"checks_by_host": {"n1": {"iommu": {"x": passed("a", "b")}}}},
                                                gate()])
    assert verdict["status"] == "fail"
    assert "two checks named iommu.x" in verdict["nodes"]["n1"]["checks"]["preflight.contract"]["found"]


def test_bringup_apply_errors_fail_that_capability_on_that_node_only():
    checks = {"n1": {name: {"x": passed("ok", "ok")} for name in capabilities.BRINGUP_NAMES}}
    data = records()
    data["preflight_apply"] = {"debug_tools": "task 'Install': No package matching 'pdsh' (no mirror)"}
    verdict = pv.build_verdict(["n1"], {"n1": data}, [{"checks_by_host": checks}], capabilities.BRINGUP_NAMES,
                               ("settings", "facts", "apply"), "r", "/tmp/r", gate=False)
    assert verdict["failed_hosts"] == ["n1"] and "allreduce" not in verdict
    assert "no mirror" in verdict["nodes"]["n1"]["checks"]["debug_tools.error"]["found"]
    assert verdict["nodes"]["n1"]["checks"]["kernel_debug.x"]["status"] == "pass"


# -- the run directory and scripts/verdict ------------------------------------

def test_run_dir_logs_stacks_and_latest_move_only_after_the_verdict(tmp_path):
    verdict = passing_verdict(str(tmp_path / "r1"))
    logs = {"n1": {"log": "[n1:0]: hello\n", "rank_logs": [{"rank": 0, "name": "rank0.stderr.log", "text": "rank 0 says hi"}],
                   "ranks": [{"rank": 0, "pid": 7, "process_state": "sleeping", "stage": "init",
                              "stack": "Thread 1 (idle)\n  main (w.py:1)"}]}}
    pv.write_run_dir(verdict, logs, str(tmp_path), str(tmp_path / "r1"))
    latest = tmp_path / "latest"
    assert json.loads((latest / "verdict.json").read_text())["status"] == "pass"
    assert (latest / "n1.log").read_text().startswith("[n1:0]")
    assert (latest / "n1.rank0.stderr.log").read_text() == "rank 0 says hi"
    assert "main (w.py:1)" in (latest / "n1.stacks.txt").read_text()
    pv.write_run_dir(verdict, {}, str(tmp_path), str(tmp_path / "r2"), filename="bringup.json")
    assert os.readlink(latest) == "r1", "a bring-up report never moves latest"
    assert not [name for name in os.listdir(tmp_path / "r1") if name.startswith(".tmp-")]


def cli(*args):
    script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "verdict")
    done = subprocess.run([sys.executable, script] + list(args), capture_output=True, text=True, timeout=30,
                          check=False)
    return done.returncode, done.stdout, done.stderr


def test_cli_exit_codes_and_drain_list(tmp_path):
    checks = every_capability_passes(["n1", "n2"])
    checks["n2"]["allreduce"] = {"suspect_rank_2": failed("rank 2 on n2 died", "done", "drain n2")}
    bad = build(["n1", "n2"], {"n1": records(), "n2": records()}, [{"checks_by_host": checks}, gate("fail")])
    pv.write_run_dir(bad, {}, str(tmp_path), str(tmp_path / "r1"))
    code, out, _ = cli(str(tmp_path / "r1"))
    assert code == 2 and "n2 allreduce.suspect_rank_2" in out
    assert cli("--drain-list", str(tmp_path / "r1"))[:2] == (2, "n2\n")
    code, out, _ = cli("--nhc", str(tmp_path / "r1"))
    assert out.startswith("n2 ERROR: nhc: Health check failed: preflight allreduce.suspect_rank_2")
    pv.write_run_dir(passing_verdict(str(tmp_path / "r2")), {}, str(tmp_path), str(tmp_path / "r2"))
    assert cli(str(tmp_path / "latest"))[0] == 0


@pytest.mark.parametrize("content, words", [
    (None, "no verdict at"),
    ('{"status": "pass", "hosts": ["n1"], "nod', "not a complete verdict"),
    ('{"status": "pass"}', "not a valid verdict"),
    ('[]', "not an object"),
    ('{"status": "maybe", "hosts": ["n1"], "nodes": {}, "healthy_hosts": [], "failed_hosts": [], '
     '"unreachable_hosts": []}', "status is 'maybe'"),
])
def test_cli_refuses_missing_truncated_and_wrong_verdicts_with_one_line_and_exit_3(tmp_path, content, words):
    if content is not None:
        (tmp_path / "verdict.json").write_text(content)
    code, out, err = cli(str(tmp_path))
    assert code == 3 and out == ""
    assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cli_refuses_a_pass_that_contradicts_its_nodes(tmp_path):
    verdict = passing_verdict(str(tmp_path))
    verdict["nodes"]["n2"]["status"] = "fail"
    (tmp_path / "verdict.json").write_text(json.dumps(verdict))
    code, _, err = cli(str(tmp_path))
    assert code == 3 and "contradicts" in err


def test_a_budgeted_run_reports_its_wall_time_and_an_overrun_fails_every_node():
    checks = {"n1": {name: {"x": passed("ok", "ok")} for name in capabilities.LOCAL_NAMES}}
    data = {"n1": {stage_results.STAGE_REGISTERS["settings"]: {"ok": True, "errors": []},
                   stage_results.STAGE_REGISTERS["facts"]: dict(OK)}}
    within = pv.build_verdict(["n1"], data, [{"checks_by_host": checks}], capabilities.LOCAL_NAMES, ("settings", "facts"),
                              "r", "/tmp/r", gate=False, budget={"elapsed": 2.5, "limit": 30})
    assert within["status"] == "pass" and "2.5 s of the 30 s budget" in within["nodes"]["n1"]["checks"][
        "preflight.budget"]["found"]
    over = pv.build_verdict(["n1"], data, [{"checks_by_host": checks}], capabilities.LOCAL_NAMES, ("settings", "facts"),
                            "r", "/tmp/r", gate=False, budget={"elapsed": 41.0, "limit": 30})
    budget = over["nodes"]["n1"]["checks"]["preflight.budget"]
    assert over["status"] == "fail" and budget["status"] == "fail" and "over the 30 s budget" in budget["found"]
