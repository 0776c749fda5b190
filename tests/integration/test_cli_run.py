"""cluster_preflight on localhost: the API returns the verdict the playbook wrote, the command line's exit
codes follow it (0 for the embedded default, 2 for a node whose training Python has no torch), and
``verdict`` refuses a missing file with 3; ``baseline`` records a profile the next gate holds to.  Five real
runs."""

import json
import os
import socket
import subprocess
import sys

import pytest

import cluster_preflight

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NO_TORCH = "/usr/bin/python3"


def free_port():
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return sock.getsockname()[1]


def cli(*args, timeout=540):
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    return subprocess.run([sys.executable, "-m", "cluster_preflight"] + list(args), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_api_gate_returns_the_verdict_the_playbook_wrote(tmp_path):
    seen = []
    result = cluster_preflight.gate(inventory=os.path.join(ROOT, "inventory"), results_dir=str(tmp_path / "results"),
                                    extravars={"preflight_master_port": free_port()}, progress=seen.append)
    assert result.exit_code == 0 and result.rc == 0, (result.error, result.summary)
    verdict = result.verdict
    assert verdict.path == str(tmp_path / "results" / os.path.basename(verdict.run_dir) / "verdict.json")
    with open(verdict.path, encoding="utf-8") as handle:
        assert verdict.raw == json.load(handle)
    assert os.path.realpath(str(tmp_path / "results" / "latest")) == os.path.realpath(verdict.run_dir)
    assert verdict.status == "pass" and verdict.healthy_hosts == ("localhost",) and verdict.failed_hosts == ()
    assert all(item.status in ("warn", "unverified") for item in verdict.findings)
    assert {item.check for item in verdict.findings} == {
        name for name, check in verdict.raw["nodes"]["localhost"]["checks"].items() if check["status"] == "warn"}
    assert sorted(verdict.outputs) == ["hostfile", "hosts.csv", "hosts.txt", "junit.xml", "preflight.prom", "report.html"]
    assert all(os.path.isfile(path) for path in verdict.outputs.values())
    # The summary callback ran under ansible-runner; progress saw the plays and every task.
    assert result.summary[0] == "PREFLIGHT SUMMARY: PASS, 1/1 nodes healthy"
    assert result.summary[-1] == "verdict: %s" % verdict.path
    assert any(event.get("event") == "playbook_on_play_start" for event in seen)


def test_cli_exit_codes_follow_the_verdict(tmp_path):
    results = str(tmp_path / "results")
    done = cli("gate", "--results-dir", results, "-e", "preflight_master_port=%d" % free_port())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    last = done.stdout.splitlines()[-1]
    assert last.startswith("PREFLIGHT PASS: 1/1 nodes healthy; verdict %s/" % results), last
    assert "nodes done in" in done.stderr and "Traceback" not in done.stderr
    passed = last.rsplit(" ", 1)[1]
    # A pass with warnings: 0 for the run, 1 from `verdict` (as scripts/verdict).
    assert cli("verdict", passed).returncode == (1 if json.load(open(passed))["warn_hosts"] else 0)

    failing = cli("gate", "--quiet", "--results-dir", results, "-e", "preflight_training_python=%s" % NO_TORCH,
                  "-e", "preflight_master_port=%d" % free_port())
    assert failing.returncode == cluster_preflight.EXIT_FAIL, failing.stdout[-3000:] + failing.stderr[-3000:]
    assert failing.stdout.startswith("PREFLIGHT FAIL: 0/1 nodes healthy; failed: localhost; verdict ")
    assert failing.stderr == ""
    path = failing.stdout.strip().rsplit(" ", 1)[1]
    verdict = cluster_preflight.load_verdict(path)
    assert verdict.raw["nodes"]["localhost"]["checks"]["allreduce.torch"]["status"] == "fail"
    drain = cli("verdict", "--drain-list", path)
    assert drain.returncode == 2 and drain.stdout.split() == ["localhost"]


def test_cli_verdict_refuses_a_missing_file(tmp_path):
    done = cli("verdict", str(tmp_path / "no-such-run"), timeout=60)
    assert done.returncode == 3 and done.stdout == ""
    assert done.stderr.startswith("UNKNOWN: no verdict at ") and "Traceback" not in done.stderr


def test_baseline_runs_the_gate_records_the_profile_and_the_next_gate_holds_to_it(tmp_path):
    results, out = str(tmp_path / "results"), str(tmp_path / "profiles")
    port = str(free_port())
    # --no-wire: the embedded inventory's group_vars are the checkout's, not this test's.
    recorded = cli("baseline", "-q", "--results-dir", results, "--out", out, "--group", "cluster", "--run-gate",
                   "--no-wire", "-e", "preflight_master_port=" + port)
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    profile = os.path.join(out, "cluster.yml")
    run = os.path.realpath(os.path.join(results, "latest", "verdict.json"))
    assert "baseline: from the gate just run: %s" % run in recorded.stdout
    assert "profile of group cluster (1 nodes) -> %s" % profile in recorded.stdout
    again = cli("baseline", "-q", "--results-dir", results, "--out", out, "--from", os.path.join(results, "latest"))
    assert again.returncode == 4 and "pass --force" in again.stderr
    # Without --from or --run-gate: the latest gate of this cluster (the embedded inventory's) that passed.
    latest = cli("baseline", "--results-dir", results, "--out", out, "--force", "--no-wire")
    assert latest.returncode == 0 and "from the latest gate of cluster %s that passed: %s" % (
        os.path.join(ROOT, "inventory", "hosts.yml"), run) in latest.stdout, latest.stdout + latest.stderr
    gated = cli("gate", "-q", "--results-dir", results, "-e", "preflight_master_port=" + port,
                "-e", "profile_file=" + profile, "-e", "profile_busbw_tolerance=0.95")
    assert gated.returncode in (0, 1), gated.stdout + gated.stderr
    with open(os.path.join(results, "latest", "verdict.json")) as handle:
        checks = json.load(handle)["nodes"]["localhost"]["checks"]
    compared = {name: check for name, check in checks.items() if name.startswith("profile.")}
    assert {"profile.torch_version", "profile.allreduce_backend", "profile.allreduce_busbw_gbps",
            "profile.summary"} <= set(compared)
    assert all(check["status"] == "pass" for check in compared.values()), compared


def test_setup_sets_up_the_venv_and_runs_nothing(tmp_path):
    """scripts/setup (a node's checkout for the Slurm hooks): the venv, no playbook, no results directory."""
    results = os.path.join(ROOT, "results")
    before = sorted(os.listdir(results)) if os.path.isdir(results) else []
    done = subprocess.run([os.path.join(ROOT, "scripts", "setup")], cwd=str(tmp_path), capture_output=True,
                          text=True, timeout=540, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("set up: %s" % os.path.join(ROOT, ".venv")), done.stdout
    assert "PLAY" not in done.stdout + done.stderr
    assert (sorted(os.listdir(results)) if os.path.isdir(results) else []) == before
    assert os.listdir(str(tmp_path)) == []
