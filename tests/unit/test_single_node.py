"""The gate's single-node all-reduce (cluster_preflight/capabilities/allreduce/single_node.py): planned from the
all-node plan on the
nodes it applies to, judged per node, carried into the verdict and the profile by the final stage; and the node
calls' after_job probes (module_utils/preflight_node/calls.py), which run once the job is collected."""

import types

import pytest

from cluster_preflight.capabilities.allreduce import single_node
from preflight_node import calls, registry
from capability_helpers import role_settings
from test_decide import HOSTS, Run, mesh_result


def facts(backend="nccl", nproc=8):
    return {"backend": backend, "nproc_per_node": nproc, "job_user": {"run_as": "trainer"}}


@pytest.mark.parametrize("mode, backend, nproc, planned", [
    ("auto", "nccl", 8, True), ("auto", "nccl", 1, False), ("auto", "gloo", 2, False),
    ("always", "gloo", 2, True), ("never", "nccl", 8, False)])
def test_the_single_node_run_applies_to_multi_gpu_nccl_nodes_unless_told(mode, backend, nproc, planned):
    settings = role_settings("allreduce", allreduce_single_node=mode, allreduce_python="/venv/bin/python",
                             allreduce_master_port=6000, allreduce_env={"NCCL_DEBUG": "INFO"})
    plan = single_node.plan(HOSTS, {host: facts(backend, nproc) for host in HOSTS},
                            {host: settings for host in HOSTS}, run_id="ctl:1:2")
    assert bool(plan["args_by_host"]) == planned
    if planned:
        args = plan["args_by_host"]["n2"]
        assert (args["nnodes"], args["node_rank"], args["master_addr"], args["master_port"]) == (1, 0, "127.0.0.1",
                                                                                               6000)
        assert args["env"]["NCCL_SOCKET_IFNAME"] == "lo" and args["env"]["NCCL_DEBUG"] == "INFO"
        assert args["check_elements"] == 0 and args["bandwidth_deadline"] > 0 and args["run_id"] == "ctl:1:2"
        assert args["nproc_per_node"] == nproc and args["run_as"] == "trainer"
        assert args["sizes"] == settings["allreduce_sizes_nccl" if backend == "nccl" else "allreduce_sizes"]
        assert plan["floors"]["n2"] == settings["allreduce_floor_single_busbw_gbps_%s" % backend]


def ranks(busbw, status="ok", correct=True):
    return {"ranks": [{"rank": rank, "status": status, "stage": "done", "correct": correct, "error": None,
                       "bandwidth": [{"size_bytes": 1 << 30, "busbw_gbps": busbw}]} for rank in range(2)]}


@pytest.mark.parametrize("result, status, words", [
    (ranks(455.0), "pass", "busbw 455.0 GB/s"),
    (ranks(120.0), "fail", "below the floor of 400"),
    (ranks(455.0, status="failed", correct=False), "fail", "failed"),
    ("unreachable: ssh timed out", "fail", "gave no result"),
])
def test_each_nodes_single_run_is_judged_on_its_own_floor(result, status, words):
    args = {"backend": "nccl", "nproc_per_node": 8}
    check, summary = single_node.judge("n1", args, 400.0, result)
    assert check["status"] == status and words in check["found"] and "n1" in check["found"]
    assert summary["status"] == status
    if status == "fail":
        assert check["fix"]


def test_the_single_runs_are_planned_with_the_mesh_and_their_busbw_goes_to_the_profile(tmp_path):
    run = Run(tmp_path)
    for host in HOSTS:
        run.hostvars[host]["preflight_settings"]["settings"]["allreduce"]["allreduce_single_node"] = "always"
        run.hostvars[host]["preflight_settings"]["settings"]["profile"] = role_settings("profile")
    run.decide("inputs", "preflight_inputs")
    plan = run.decide("plan", "preflight_plan")
    assert sorted(plan["single"]["args_by_host"]) == HOSTS
    for src, dst in (("n1", "n2"), ("n2", "n1")):
        run.register(src, "port_mesh_probe", mesh_result(src, dst))
    run.register("n1", "allreduce_single", ranks(1.5))
    run.register("n2", "allreduce_single", ranks(1.5))
    launch = run.decide("launch", "preflight_launch")
    assert launch["gate"]["hosts"] == HOSTS
    for index, host in enumerate(HOSTS):
        run.register(host, "preflight_probes", {"probes": {}, "errors": {}, "job": {"ranks": [
            {"rank": 2 * index + local, "local_rank": local, "status": "ok", "stage": "done", "correct": True,
             "bandwidth": [{"size_bytes": 16 << 20, "busbw_gbps": 0.5}], "error": None} for local in (0, 1)],
            "checks": {}, "log": ""}})
    final = run.decide("final", "preflight_final")
    assert launch["checks_by_host"]["n1"]["allreduce"]["single_node"]["status"] == "pass"
    fields = final["checks_by_host"]["n1"]["profile"]["summary"]["details"]["fields"]
    assert fields["allreduce.single_node_busbw_gbps"] == 1.5 and fields["allreduce.busbw_gbps"] == 0.5


def test_a_node_that_fails_alone_is_left_out_of_the_all_node_run_and_its_peers_still_run(tmp_path):
    hosts = ["n1", "n2", "n3"]
    run = Run(tmp_path, hosts=hosts)
    for host in hosts:
        run.hostvars[host]["preflight_settings"]["settings"]["allreduce"]["allreduce_single_node"] = "always"
    run.decide("inputs", "preflight_inputs")
    run.decide("plan", "preflight_plan")
    for src in hosts:
        run.register(src, "port_mesh_probe", {"results": [mesh_result(src, dst)["results"][0] for dst in hosts
                                                          if dst != src], "checks": mesh_result(src, src)["checks"]})
    run.register("n1", "allreduce_single", ranks(1.5))
    run.register("n2", "allreduce_single", ranks(1.5, status="failed", correct=False))
    run.register("n3", "allreduce_single", ranks(0.001))
    launch = run.decide("launch", "preflight_launch")
    assert launch["gate"]["hosts"] == ["n1"] and launch["gate"]["launch"] is True
    checks = launch["checks_by_host"]
    assert checks["n1"]["allreduce"]["single_node"]["status"] == "pass"
    assert checks["n2"]["allreduce"]["single_node"]["status"] == "fail"
    assert "n2's single-node all-reduce failed" in checks["n2"]["allreduce"]["single_node"]["found"]
    assert "below the floor" in checks["n3"]["allreduce"]["single_node"]["found"]
    for host in ("n2", "n3"):
        run_check = checks[host]["allreduce"]["run"]
        assert run_check["details"]["blocked"] and "see allreduce.single_node" in run_check["found"]
    assert launch["single"]["n2"]["status"] == "fail" and launch["single"]["n1"]["status"] == "pass"


def test_a_node_lost_in_its_single_run_is_lost_for_the_gate_and_named_for_it(tmp_path):
    run = Run(tmp_path)
    for host in HOSTS:
        run.hostvars[host]["preflight_settings"]["settings"]["allreduce"]["allreduce_single_node"] = "always"
    run.decide("inputs", "preflight_inputs")
    run.decide("plan", "preflight_plan")
    for src, dst in (("n1", "n2"), ("n2", "n1")):
        run.register(src, "port_mesh_probe", mesh_result(src, dst))
    run.register("n1", "allreduce_single", ranks(1.5))
    run.register("n2", "allreduce_single", {"unreachable": True, "msg": "ssh: connect timed out"})
    launch = run.decide("launch", "preflight_launch")
    single = launch["checks_by_host"]["n2"]["allreduce"]["single_node"]
    assert single["status"] == "fail" and "unreachable: ssh: connect timed out" in single["found"]
    assert "running its single-node all-reduce" in launch["lost"]["n2"]
    assert launch["gate"]["hosts"] == ["n1"]


class _Exit(Exception):
    pass


def test_after_job_probes_run_once_the_job_is_collected(monkeypatch, tmp_path):
    """The registry declares the fabric's probe ``after_job``: it runs after the job was collected, the others
    before it; a reader call of the same capabilities keeps its order (after_job is a probe's trait)."""
    assert registry.after_job("fabric") and not registry.after_job("kernel_debug")
    order = []
    early = types.SimpleNamespace(CAPABILITY="kernel_debug", probe=lambda args, ops: order.append("early") or {"e": 1},
                                  read=lambda args, ops: order.append("read early") or {})
    late = types.SimpleNamespace(CAPABILITY="fabric", probe=lambda args, ops: order.append("late") or {"l": 1},
                                 read=lambda args, ops: order.append("read late") or {})
    halves = types.SimpleNamespace(get=lambda name: {"kernel_debug": early, "fabric": late}[name])
    monkeypatch.setattr(calls, "resolve_job_user", lambda job, ops: {"run_as": None})
    monkeypatch.setattr(calls, "_collect", lambda job: order.append("job") or {"ranks": []})
    captured = {}

    def exit_json(**result):
        captured.update(result)
        raise _Exit()

    module = types.SimpleNamespace(params={"capabilities": {"fabric": {}, "kernel_debug": {}}, "selftest_error": "",
                                           "job": {}, "wait_for": {"results_file": "x", "timeout": 1}},
                                   exit_json=exit_json)
    with pytest.raises(_Exit):
        calls.node_call(module, halves, "probe", "probes")
    assert order == ["early", "job", "late"]
    assert captured["probes"] == {"kernel_debug": {"e": 1}, "fabric": {"l": 1}}
    assert set(captured["elapsed"]) == {"kernel_debug", "fabric"}
    order.clear()
    module.params.pop("wait_for")
    with pytest.raises(_Exit):
        calls.node_call(module, halves, "read", "facts")
    assert order == ["read late", "read early"]
