"""The real preflight playbook on the embedded default inventory (localhost, 2 ranks, gloo)."""

import os
import socket

import pytest

from playbook import run_playbook
from ansible.module_utils import preflight_proc

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def free_port():
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return sock.getsockname()[1]


def leftovers():
    return [pid for pid in preflight_proc.all_pids()
            if any("allreduce_worker.py" in part for part in preflight_proc.cmdline_of(pid))]


def test_default_inventory_passes_with_a_full_verdict(tmp_path):
    result = run_playbook(tmp_path, extravars={"preflight_master_port": free_port()})
    assert result.rc == 0, result.stdout[-3000:]
    v = result.verdict
    assert v["status"] == "pass"
    assert v["healthy_hosts"] == ["localhost"] and v["failed_hosts"] == []
    node = v["nodes"]["localhost"]
    # Bring-up drift on this machine is a warning (drift policy warn), not a failure.
    assert node["status"] in ("pass", "warn")
    for name in ("ssh_reachable", "torch_python", "torch_import", "master_port", "allreduce_ranks",
                 "allreduce_correctness", "allreduce_bandwidth"):
        assert node["checks"][name]["status"] == "pass", name
        assert set(node["checks"][name]) >= {"status", "found", "expected", "fix"}
    ar = v["allreduce"]
    assert ar["world_size"] == 2 and ar["backend"] == "gloo" and ar["correct"] is True
    assert [row["size_bytes"] for row in ar["sizes"]] == [1048576, 4194304, 16777216]
    assert all(row["busbw_gbps"] > 0 and row["algbw_gbps"] > 0 for row in ar["sizes"])
    assert ar["versions"]["torch"].startswith("2.13")
    log = open(os.path.join(result.results_dir, "latest", "localhost.log")).read()
    assert "]:preflight: world_size=2 backend=gloo" in log
    assert "PREFLIGHT PASS" in result.stdout and "verdict.json" in result.stdout


def test_python_without_torch_fails_fast_naming_node(tmp_path):
    result = run_playbook(tmp_path, extravars={"preflight_training_python": "/usr/bin/python3"})
    assert result.rc != 0
    v = result.verdict
    assert v["status"] == "fail" and v["failed_hosts"] == ["localhost"]
    check = v["nodes"]["localhost"]["checks"]["torch_import"]
    assert check["status"] == "fail" and "/usr/bin/python3" in check["found"] and check["fix"]
    assert v["allreduce"]["status"] == "skipped" and "localhost" in v["allreduce"]["reason"]
    assert "localhost / torch_import" in result.stdout


def test_master_port_in_use_fails_naming_port_and_node(tmp_path):
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        result = run_playbook(tmp_path, extravars={"preflight_master_port": port})
    assert result.rc != 0
    check = result.verdict["nodes"]["localhost"]["checks"]["master_port"]
    assert check["status"] == "fail"
    assert "port %d" % port in check["found"] and "master" in check["found"]
    assert result.verdict["allreduce"]["launched"] is False


@pytest.mark.parametrize("extravars, message", [
    ({"allreduce_backend": "mpi"}, "allreduce_backend"),
    ({"allreduce_master_port": 70000}, "allreduce_master_port=70000"),
    ({"allreduce_nproc_per_node": -1}, "allreduce_nproc_per_node=-1"),
    ({"allreduce_timeout": "soon"}, "allreduce_timeout"),
])
def test_invalid_variables_are_rejected_before_anything_runs(tmp_path, extravars, message):
    result = run_playbook(tmp_path, extravars=extravars)
    assert result.rc != 0
    assert message in result.stdout
    probes = [e for e in result.events if e.get("event") == "runner_on_ok"
              and "Probe the training Python" in e.get("event_data", {}).get("task", "")]
    assert not probes, "nothing ran on the node"


def test_rank_that_exits_is_named_and_leaves_nothing(tmp_path):
    result = run_playbook(tmp_path, extravars={"allreduce_selftest_fault": "exit", "allreduce_selftest_rank": 1,
                                               "preflight_master_port": free_port()})
    assert result.rc != 0
    v = result.verdict
    assert v["status"] == "fail" and v["failed_hosts"] == ["localhost"]
    assert [(s["host"], s["rank"]) for s in v["allreduce"]["suspects"]] == [("localhost", 1)]
    check = v["nodes"]["localhost"]["checks"]["allreduce_suspect_rank_1"]
    assert "exit code 3" in check["found"] and "drain localhost" in check["fix"]
    assert "localhost / allreduce_suspect_rank_1" in result.stdout
    assert not leftovers()


def test_hung_rank_is_named_with_its_stack(tmp_path):
    result = run_playbook(tmp_path, extravars={"allreduce_selftest_fault": "hang", "allreduce_selftest_rank": 1,
                                               "allreduce_timeout": 5, "allreduce_hard_timeout": 60,
                                               "preflight_master_port": free_port()})
    assert result.rc != 0
    v = result.verdict
    assert [(s["host"], s["rank"]) for s in v["allreduce"]["suspects"]] == [("localhost", 1)]
    stacks = open(os.path.join(result.results_dir, "latest", "localhost.stacks.txt")).read()
    assert "== rank 1" in stacks and "main" in stacks
    assert not leftovers()
