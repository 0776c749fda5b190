"""The real preflight playbook on the embedded default inventory (localhost, 2 ranks, gloo)."""

import os
import socket

import pytest

from playbook import run_playbook
from preflight_node.host import proc as preflight_proc

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
    for name in ("preflight.reachable", "allreduce.python", "allreduce.torch", "allreduce.master_port",
                 "allreduce.ranks", "allreduce.correctness", "allreduce.bandwidth", "allreduce.world_size"):
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
    # One node, no peers: nothing to trust over ssh, whatever sshd this machine has.
    assert node["checks"]["ssh_trust.peers"]["status"] == "not_applicable"
    assert node["checks"]["port_mesh.reach"]["status"] == "not_applicable"
    # Every capability gave its outcome.
    assert {name.split(".")[0] for name in node["checks"]} >= {
        "preflight", "nic_discovery", "port_mesh", "allreduce", "kernel_debug", "core_dumps", "iommu",
        "debug_tools", "ssh_trust"}
    # What other tools read sits next to the verdict, written before it: JUnit with a case per check,
    # the node_exporter text file, the healthy hosts.
    import xml.etree.ElementTree as ElementTree

    from prometheus_client.parser import text_string_to_metric_families
    run_dir = os.path.join(result.results_dir, "latest")
    cases = ElementTree.parse(os.path.join(run_dir, "junit.xml")).getroot().iter("testcase")
    assert sorted(case.get("name") for case in cases) == sorted(node["checks"])
    with open(os.path.join(run_dir, "preflight.prom")) as handle:
        families = {family.name: family for family in text_string_to_metric_families(handle.read())}
    statuses = {sample.labels["check"] for sample in families["preflight_check_status"].samples}
    assert statuses == set(node["checks"])
    assert open(os.path.join(run_dir, "hostfile")).read() == "localhost slots=2\n"
    assert open(os.path.join(run_dir, "hosts.csv")).read().strip() == "localhost"


def test_python_without_torch_fails_fast_naming_node(tmp_path):
    result = run_playbook(tmp_path, extravars={"preflight_training_python": "/usr/bin/python3"})
    assert result.rc != 0
    v = result.verdict
    assert v["status"] == "fail" and v["failed_hosts"] == ["localhost"]
    check = v["nodes"]["localhost"]["checks"]["allreduce.torch"]
    assert check["status"] == "fail" and "/usr/bin/python3" in check["found"] and check["fix"]
    assert v["allreduce"]["status"] == "skipped" and "no node is ready" in v["allreduce"]["reason"]
    assert "localhost / allreduce.torch" in result.stdout


def test_master_port_in_use_fails_naming_port_and_node(tmp_path):
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        result = run_playbook(tmp_path, extravars={"preflight_master_port": port})
    assert result.rc != 0
    check = result.verdict["nodes"]["localhost"]["checks"]["allreduce.master_port"]
    assert check["status"] == "fail"
    assert "port %d" % port in check["found"] and "master" in check["found"]
    assert result.verdict["allreduce"]["launched"] is False


@pytest.mark.parametrize("extravars, check, message", [
    ({"allreduce_backend": "mpi"}, "allreduce.inputs", "must be one of: auto, gloo, nccl, got: mpi"),
    ({"allreduce_master_port": 70000}, "allreduce.inputs", "allreduce_master_port is 70000"),
    ({"allreduce_nproc_per_node": -1}, "allreduce.inputs", "allreduce_nproc_per_node is -1"),
    ({"allreduce_timeout": "soon"}, "allreduce.inputs", "allreduce_timeout"),
    ({"ssh_trust_port": 70000}, "ssh_trust.inputs", "ssh_trust_port"),
    ({"debug_tools_enabled": "maybe"}, "debug_tools.inputs", "debug_tools_enabled"),
])
def test_invalid_variables_are_rejected_before_anything_runs(tmp_path, extravars, check, message):
    result = run_playbook(tmp_path, extravars=extravars)
    assert result.rc != 0
    finding = result.verdict["nodes"]["localhost"]["checks"][check]
    assert finding["status"] == "fail" and message in finding["found"] and finding["fix"]
    assert "localhost / %s" % check in result.stdout
    assert result.verdict["stopped"].startswith("invalid settings on localhost")
    ran = [e for e in result.events if e.get("event") == "runner_on_ok"
           and "Read every capability's facts" in e.get("event_data", {}).get("task", "")]
    assert not ran, "nothing ran on the node"


def test_switches_typed_the_way_users_type_them_work(tmp_path):
    """-e passes strings: "false" must switch a capability off, not fail every node."""
    result = run_playbook(tmp_path, extravars={"debug_tools_enabled": "false", "iommu_enabled": "no",
                                               "preflight_master_port": str(free_port())})
    assert result.rc == 0, result.stdout[-3000:]
    assert result.verdict["allreduce"]["status"] == "pass"
    checks = result.verdict["nodes"]["localhost"]["checks"]
    assert checks["debug_tools.enabled"]["status"] == "skipped"
    assert "debug_tools_enabled" in checks["debug_tools.enabled"]["found"]
    assert checks["iommu.enabled"]["status"] == "skipped"


def test_rank_that_exits_is_named_and_leaves_nothing(tmp_path):
    result = run_playbook(tmp_path, extravars={"allreduce_selftest_fault": "exit", "allreduce_selftest_rank": 1,
                                               "preflight_master_port": free_port()})
    assert result.rc != 0
    v = result.verdict
    assert v["status"] == "fail" and v["failed_hosts"] == ["localhost"]
    assert [(s["host"], s["rank"]) for s in v["allreduce"]["suspects"]] == [("localhost", 1)]
    check = v["nodes"]["localhost"]["checks"]["allreduce.suspect_rank_1"]
    assert "exit code 3" in check["found"] and "drain localhost" in check["fix"]
    assert "localhost / allreduce.suspect_rank_1" in result.stdout
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
