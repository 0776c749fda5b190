"""The gate's single-node all-reduce (cluster_preflight/single_node.py): planned from the all-node plan on the
nodes it applies to, judged per node, carried into the verdict and the profile by the final stage; and the node
calls' AFTER_JOB halves (module_utils/preflight_node/calls.py), which run once the job is collected."""

import types

import pytest

from cluster_preflight import single_node
from preflight_node import calls
from capability_helpers import role_settings
from test_decide import HOSTS, Run, mesh_result


def gate_args(backend="nccl", nproc=8):
    return {"args_by_host": {host: {"backend": backend, "nproc_per_node": nproc, "master_port": 6000,
                                    "master_addr": "198.18.0.1", "nnodes": 2, "node_rank": index,
                                    "sizes": [1 << 20, 1 << 30], "iters": 5, "warmup": 2, "env": {"NCCL_DEBUG": "INFO"},
                                    "check_elements": 0}
                             for index, host in enumerate(HOSTS)}}


@pytest.mark.parametrize("mode, backend, nproc, planned", [
    ("auto", "nccl", 8, True), ("auto", "nccl", 1, False), ("auto", "gloo", 2, False),
    ("always", "gloo", 2, True), ("never", "nccl", 8, False)])
def test_the_single_node_run_applies_to_multi_gpu_nccl_nodes_unless_told(mode, backend, nproc, planned):
    settings = role_settings("allreduce", allreduce_single_node=mode)
    plan = single_node.plan(gate_args(backend, nproc), {host: settings for host in HOSTS})
    assert bool(plan["args_by_host"]) == planned
    if planned:
        args = plan["args_by_host"]["n2"]
        assert (args["nnodes"], args["node_rank"], args["master_addr"]) == (1, 0, "127.0.0.1")
        assert args["env"]["NCCL_SOCKET_IFNAME"] == "lo" and args["env"]["NCCL_DEBUG"] == "INFO"
        assert args["check_elements"] == 0 and args["bandwidth_deadline"] > 0
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
    args = gate_args()["args_by_host"]["n1"]
    check, summary = single_node.judge("n1", args, 400.0, result)
    assert check["status"] == status and words in check["found"] and "n1" in check["found"]
    assert summary["status"] == status
    if status == "fail":
        assert check["fix"]


def test_the_final_stage_judges_the_single_runs_and_gives_their_busbw_to_the_profile(tmp_path):
    run = Run(tmp_path)
    for host in HOSTS:
        run.hostvars[host]["preflight_settings"]["settings"]["allreduce"]["allreduce_single_node"] = "always"
        run.hostvars[host]["preflight_settings"]["settings"]["profile"] = role_settings("profile")
    run.decide("inputs", "preflight_inputs")
    run.decide("plan", "preflight_plan")
    for src, dst in (("n1", "n2"), ("n2", "n1")):
        run.register(src, "port_mesh_probe", mesh_result(src, dst))
    launch = run.decide("launch", "preflight_launch")
    assert sorted(launch["single"]["args_by_host"]) == HOSTS
    run.register("n1", "allreduce_single", ranks(1.5))
    run.register("n2", "allreduce_single", ranks(1.5, status="failed", correct=False))
    for index, host in enumerate(HOSTS):
        run.register(host, "preflight_probes", {"probes": {}, "errors": {}, "job": {"ranks": [
            {"rank": 2 * index + local, "local_rank": local, "status": "ok", "stage": "done", "correct": True,
             "bandwidth": [{"size_bytes": 16 << 20, "busbw_gbps": 0.5}], "error": None} for local in (0, 1)],
            "checks": {}, "log": ""}})
    final = run.decide("final", "preflight_final")
    checks = final["checks_by_host"]
    assert checks["n1"]["allreduce"]["single_node"]["status"] == "pass"
    assert checks["n2"]["allreduce"]["single_node"]["status"] == "fail"
    assert "n2's single-node all-reduce failed" in checks["n2"]["allreduce"]["single_node"]["found"]
    fields = checks["n1"]["profile"]["summary"]["details"]["fields"]
    assert fields["allreduce.single_node_busbw_gbps"] == 1.5 and fields["allreduce.busbw_gbps"] == 0.5
    assert "allreduce.single_node_busbw_gbps" not in checks["n2"]["profile"]["summary"]["details"]["fields"]


def test_a_node_lost_in_its_single_run_is_lost_for_the_gate_and_named_for_it(tmp_path):
    run = Run(tmp_path)
    for host in HOSTS:
        run.hostvars[host]["preflight_settings"]["settings"]["allreduce"]["allreduce_single_node"] = "always"
    run.decide("inputs", "preflight_inputs")
    run.decide("plan", "preflight_plan")
    for src, dst in (("n1", "n2"), ("n2", "n1")):
        run.register(src, "port_mesh_probe", mesh_result(src, dst))
    run.decide("launch", "preflight_launch")
    run.register("n1", "allreduce_single", ranks(1.5))
    run.register("n2", "allreduce_single", {"unreachable": True, "msg": "ssh: connect timed out"})
    final = run.decide("final", "preflight_final")
    single = final["checks_by_host"]["n2"]["allreduce"]["single_node"]
    assert single["status"] == "fail" and "unreachable: ssh: connect timed out" in single["found"]
    assert "running its single-node all-reduce" in final["lost"]["n2"]


class _Exit(Exception):
    pass


def test_after_job_halves_run_once_the_job_is_collected(monkeypatch, tmp_path):
    order = []
    early = types.SimpleNamespace(CAPABILITY="early", probe=lambda args, ops: order.append("early") or {"e": 1})
    late = types.SimpleNamespace(CAPABILITY="late", AFTER_JOB=True,
                                 probe=lambda args, ops: order.append("late") or {"l": 1})
    halves = types.SimpleNamespace(get=lambda name: {"early": early, "late": late}[name])
    monkeypatch.setattr(calls, "resolve_job_user", lambda job, ops: {"run_as": None})
    monkeypatch.setattr(calls, "_collect", lambda job: order.append("job") or {"ranks": []})
    captured = {}

    def exit_json(**result):
        captured.update(result)
        raise _Exit()

    module = types.SimpleNamespace(params={"capabilities": {"late": {}, "early": {}}, "selftest_error": "",
                                           "job": {}, "wait_for": {"results_file": "x", "timeout": 1}},
                                   exit_json=exit_json)
    with pytest.raises(_Exit):
        calls.node_call(module, halves, "probe", "probes")
    assert order == ["early", "job", "late"]
    assert captured["probes"] == {"early": {"e": 1}, "late": {"l": 1}} and set(captured["elapsed"]) == {"early", "late"}
