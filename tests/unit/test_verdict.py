"""Verdict logic: blame, collateral, unreachable nodes, run directory."""

import importlib.util
import json
import os

PLUGIN = os.path.join(os.path.dirname(__file__), "..", "..", "action_plugins", "preflight_verdict.py")
spec = importlib.util.spec_from_file_location("preflight_verdict_action", PLUGIN)
verdict = importlib.util.module_from_spec(spec)
spec.loader.exec_module(verdict)

PASS = {"status": "pass", "found": "ok", "expected": "ok", "fix": ""}


def rank(host, number, status="ok", stage="done", **extra):
    row = {"rank": number, "local_rank": number % 2, "status": status, "stage": stage, "correct": status == "ok",
           "correctness": {"wrong": 0}, "bandwidth": [{"size_bytes": 4096, "algbw_gbps": 1.0, "busbw_gbps": 1.5}],
           "versions": {"torch": "2.13.0"}, "error": None, "exitcode": None}
    row.update(extra)
    return row


def facts(ranks, checks=None, reachable=True):
    data = {"preflight_ping": {"ping": "pong"} if reachable else {"unreachable": True, "msg": "ssh: timed out"},
            "allreduce_checks": checks or {"torch_import": PASS},
            "allreduce_plan": {"world_size": 4, "backend": "gloo", "master": "n1", "launch": True}}
    if ranks is not None:
        data["allreduce_result"] = {"ranks": ranks, "log": "[n:0]: hello\n"}
    return data


def test_all_pass():
    v = verdict.build_verdict(["n1", "n2"], {"n1": facts([rank("n1", 0), rank("n1", 1)]),
                                             "n2": facts([rank("n2", 2), rank("n2", 3)])}, "r", "/tmp/r")
    assert v["status"] == "pass"
    assert v["healthy_hosts"] == ["n1", "n2"] and v["failed_hosts"] == []
    assert v["allreduce"]["correct"] is True and v["allreduce"]["world_size"] == 4
    assert v["allreduce"]["sizes"][0]["busbw_gbps"] == 1.5


def test_dead_rank_is_blamed_and_peers_are_collateral():
    n1 = [rank("n1", 0, "error", "correctness", error="RuntimeError: Connection closed by peer"),
          rank("n1", 1, "error", "correctness", error="RuntimeError: Connection reset by peer")]
    n2 = [rank("n2", 2, "died", "correctness", exitcode=-9), rank("n2", 3, "died", "correctness", exitcode=-15)]
    v = verdict.build_verdict(["n1", "n2"], {"n1": facts(n1), "n2": facts(n2)}, "r", "/tmp/r")
    assert v["status"] == "fail"
    assert v["failed_hosts"] == ["n2"]
    assert [(s["host"], s["rank"]) for s in v["allreduce"]["suspects"]] == [("n2", 2)]
    assert v["nodes"]["n1"]["status"] == "warn"
    assert "n2" in v["nodes"]["n1"]["checks"]["allreduce_ranks"]["found"]
    blame = v["nodes"]["n2"]["checks"]["allreduce_suspect_rank_2"]
    assert blame["status"] == "fail" and "exit code -9" in blame["found"] and "drain n2" in blame["fix"]


def test_missing_ranks_fail_the_gate():
    v = verdict.build_verdict(["n1"], {"n1": facts([rank("n1", 0)])}, "r", "/tmp/r")
    assert v["allreduce"]["status"] == "fail", "world_size 4 planned, 1 rank reported"


def test_wrong_data_is_blamed():
    n1 = [rank("n1", 0), rank("n1", 1, "wrong", correct=False, correctness={"wrong": 5})]
    v = verdict.build_verdict(["n1"], {"n1": facts(n1)}, "r", "/tmp/r")
    assert v["status"] == "fail" and v["allreduce"]["correct"] is False
    assert v["allreduce"]["suspects"][0]["rank"] == 1


def test_hung_rank_blamed_when_peers_timed_out():
    n1 = [rank("n1", 0, "error", "correctness", error="RuntimeError: Timed out waiting 4000ms for recv"),
          rank("n1", 1, "hung", "init", exitcode=-15, process_state="sleeping")]
    v = verdict.build_verdict(["n1"], {"n1": facts(n1)}, "r", "/tmp/r")
    assert [(s["host"], s["rank"]) for s in v["allreduce"]["suspects"]] == [("n1", 1)]


def test_monitored_barrier_names_missing_rank():
    n1 = [rank("n1", 0, "error", "barrier", error="RuntimeError: Rank 1 failed to pass monitoredBarrier in 30000 ms"),
          rank("n1", 1, "error", "barrier", error="RuntimeError: something else")]
    suspects = verdict.find_suspects([dict(r, host="n1") for r in n1])
    assert [s["rank"] for s in suspects] == [1]


def test_unreachable_node_is_named_and_gate_skipped():
    n1 = facts(None)
    n1["allreduce_plan"]["launch"] = False
    n1["allreduce_plan"]["skip_reason"] = "not ready: n2"
    v = verdict.build_verdict(["n1", "n2"], {"n1": n1, "n2": facts(None, reachable=False)}, "r", "/tmp/r")
    assert v["status"] == "fail"
    assert v["unreachable_hosts"] == ["n2"] and "n2" in v["failed_hosts"]
    assert "ssh: timed out" in v["nodes"]["n2"]["checks"]["ssh_reachable"]["found"]
    assert v["allreduce"]["status"] == "skipped" and "n2" in v["allreduce"]["reason"]
    lines = verdict.failure_lines(v)
    assert any(line.startswith("n2 / ssh_reachable") for line in lines)


def test_not_applicable_and_warn_do_not_fail_a_node():
    checks = {"torch_import": PASS,
              "ptrace_scope": {"status": "not_applicable", "found": "no Yama LSM", "expected": "0", "fix": ""},
              "core_limit": {"status": "warn", "found": "0", "expected": "unlimited", "fix": "run bringup.yml"}}
    data = facts([rank("n1", 0)], checks)
    data["allreduce_plan"]["world_size"] = 1
    v = verdict.build_verdict(["n1"], {"n1": data}, "r", "/tmp/r")
    assert v["nodes"]["n1"]["status"] == "warn"
    assert v["status"] == "pass" and v["warn_hosts"] == ["n1"] and v["healthy_hosts"] == ["n1"]


def test_write_run_dir_and_latest_link(tmp_path):
    data = {"n1": facts([dict(rank("n1", 0, "hung", "init"), stack="Thread 1 (idle)\n  main (w.py:1)")])}
    v = verdict.build_verdict(["n1"], data, "20260101T000000Z", str(tmp_path / "20260101T000000Z"))
    verdict.write_run_dir(v, data, str(tmp_path), v["run_dir"])
    run = tmp_path / "latest"
    assert json.loads((run / "verdict.json").read_text())["status"] == "fail"
    assert (run / "n1.log").read_text().startswith("[n:0]")
    assert "main (w.py:1)" in (run / "n1.stacks.txt").read_text()
    verdict.write_run_dir(v, data, str(tmp_path), str(tmp_path / "second"))
    assert os.readlink(tmp_path / "latest") == "second"


def _run_cli(*args):
    import subprocess
    import sys
    script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "verdict")
    done = subprocess.run([sys.executable, script] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=30)
    return done.returncode, done.stdout


def test_cli_exit_codes_and_drain_list(tmp_path):
    n1 = [rank("n1", 0), rank("n1", 1)]
    n2 = [rank("n2", 2, "died", "correctness", exitcode=-9), rank("n2", 3, "died", "correctness", exitcode=-15)]
    data = {"n1": facts(n1), "n2": facts(n2)}
    bad = verdict.build_verdict(["n1", "n2"], data, "r1", str(tmp_path / "r1"))
    verdict.write_run_dir(bad, data, str(tmp_path), bad["run_dir"])
    code, out = _run_cli(str(tmp_path / "r1"))
    assert code == 2 and "n2 allreduce_suspect_rank_2" in out
    assert _run_cli("--drain-list", str(tmp_path / "r1")) == (2, "n2\n")
    code, out = _run_cli("--nhc", str(tmp_path / "r1"))
    assert out.startswith("n2 ERROR: nhc: Health check failed: preflight allreduce_suspect_rank_2")

    good_data = {"n1": facts([rank("n1", 0), rank("n1", 1)]), "n2": facts([rank("n2", 2), rank("n2", 3)])}
    good = verdict.build_verdict(["n1", "n2"], good_data, "r2", str(tmp_path / "r2"))
    verdict.write_run_dir(good, good_data, str(tmp_path), good["run_dir"])
    assert _run_cli(str(tmp_path / "latest"))[0] == 0
    assert _run_cli(str(tmp_path / "missing"))[0] == 3
