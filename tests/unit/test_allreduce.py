"""Capability allreduce: the torch reader, readiness, the one launch plan, and the outcome
(suspects, collateral peers, world size) from every node's ranks."""

import os
import socket
import stat
import sys

import pytest

from cluster_preflight.capabilities import allreduce as ar
from cluster_preflight import allreduce_outcome as outcome
from cluster_preflight import allreduce_versions as versions_mod
from preflight_node import allreduce as node_ar
from fake_ops import LocalOps

VENV_PYTHON = sys.executable


def settings(**overrides):
    values = {"allreduce_python": VENV_PYTHON, "allreduce_master_port": 6000, "allreduce_backend": "auto",
              "allreduce_nproc_per_node": 0, "allreduce_cpu_nproc": 2, "allreduce_timeout": 30.0,
              "allreduce_hard_timeout": 120.0, "allreduce_stack_budget": 20.0,
              "allreduce_sizes": [1048576, 4194304], "allreduce_iters": 5, "allreduce_warmup": 2,
              "allreduce_min_busbw_gbps": 0.0, "allreduce_poll_interval": 0.1, "allreduce_env": {},
              "allreduce_keep_scratch": False, "allreduce_selftest_fault": "none", "allreduce_selftest_rank": -1}
    values.update(overrides)
    return values


def fake_python(tmp_path, version="2.0.1", cuda="11.8"):
    """An executable that answers the probe like a Python with the given torch would."""
    script = tmp_path / "python"
    payload = ('{"python": "3.10.0", "executable": "%s", "torch": {"path": "/x/torch", "version": "%s", '
               '"cuda": %s, "hip": null}}' % (script, version, '"%s"' % cuda if cuda else "null"))
    script.write_text("#!/bin/sh\necho '%s'\n" % payload)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def read(tmp_path, python=VENV_PYTHON, port=None, **overrides):
    args = ar.read_args(settings(allreduce_python=python, **overrides), {"name": "n1"})
    args.update(dev_root=str(tmp_path), sysfs_root=str(tmp_path))
    if port:
        args["master_port"] = port
    return node_ar.read(args, LocalOps())


# -- settings -----------------------------------------------------------------

@pytest.mark.parametrize("overrides, name", [
    ({"allreduce_master_port": 70000}, "allreduce_master_port"),
    ({"allreduce_timeout": 200.0}, "allreduce_timeout"),
    ({"allreduce_sizes": []}, "allreduce_sizes"),
    ({"allreduce_iters": 0}, "allreduce_iters"),
    ({"allreduce_python": ""}, "allreduce_python"),
    ({"allreduce_env": {"NCCL DEBUG": "INFO"}}, "allreduce_env"),
    ({"allreduce_stack_budget": 0.0}, "allreduce_stack_budget"),
    ({"allreduce_floor_busbw_gbps_gloo": -1.0}, "allreduce_floor_busbw_gbps_gloo"),
    ({"allreduce_floor_relative": 1.5}, "allreduce_floor_relative"),
])
def test_validate_names_the_bad_setting_with_a_fix(overrides, name):
    problems = ar.validate(settings(**overrides))
    assert [item["name"] for item in problems] == [name]
    assert problems[0]["fix"] and problems[0]["expected"]


def test_validate_accepts_the_defaults():
    assert ar.validate(settings()) == []


# -- reader and readiness -------------------------------------------------------

def test_venv_python_with_torch_is_ready(tmp_path):
    facts = read(tmp_path)
    assert facts["torch"]["version"].startswith("2.13")
    assert facts["backend"] == "gloo" and facts["nproc_per_node"] == 2
    checks, ready = ar.readiness("n1", facts, settings())
    assert ready and {name: c["status"] for name, c in checks.items()} == {
        "job_user": "pass", "python": "pass", "torch": "pass", "accelerator_build": "pass"}


@pytest.mark.parametrize("job, status, ready, words", [
    ({"name": "alice", "uid": 1001, "run_as": "alice", "how": "named", "note": ""}, "pass", True, "alice (uid 1001)"),
    ({"name": "bob", "uid": 1002, "run_as": None, "how": "connecting", "note": ""}, "pass", True, "connecting user"),
    ({"name": "nobody", "uid": 65534, "run_as": "nobody", "how": "auto", "note": ""}, "warn", True,
     "no job user named"),
    ({"name": "root", "uid": 0, "run_as": None, "how": "auto_root", "note": "nobody cannot use the training Python"},
     "warn", True, "ran as root"),
    ({"name": "root", "uid": 0, "run_as": None, "how": "named", "note": ""}, "warn", True, "job user is root"),
    ({"name": "carol", "uid": None, "run_as": None, "how": "missing", "note": "no account"}, "fail", False,
     "does not exist"),
    # Switching users needs root: a requirement of the check, never a fault of the node (blocked, unverified).
    ({"name": "dave", "uid": 1003, "run_as": None, "how": "cannot_switch", "note": "no root"}, "skipped", True,
     "needs root: job user dave wanted on n1"),
    (None, "fail", False, "did not say"),
])
def test_the_job_user_check_says_who_ran_job_side_code_and_warns_when_nobody_named_one(tmp_path, job, status,
                                                                                      ready, words):
    facts = dict(read(tmp_path), job_user=job)
    checks, is_ready = ar.readiness("n1", facts, settings())
    assert checks["job_user"]["status"] == status and words in checks["job_user"]["found"]
    assert is_ready is ready
    if status != "pass":
        fix = checks["job_user"]["fix"]
        assert "preflight_job_user" in fix or "n1" in fix or "preflight_become" in fix


def test_the_ranks_of_a_node_run_as_its_job_user():
    facts = {"nproc_per_node": 2, "backend": "gloo", "port": {"free": True, "detail": "free"},
             "job_user": {"name": "alice", "uid": 1001, "run_as": "alice", "how": "named"}}
    nodes = {"n1": {"name": "n1", "node_addr": "198.18.0.1"}}
    plan = ar.launch_plan(["n1"], ["n1"], {}, {"n1": facts}, {"n1": settings()}, nodes, {})
    assert plan["args_by_host"]["n1"]["run_as"] == "alice"


def test_python_without_torch_is_not_ready_and_says_how_to_fix(tmp_path):
    facts = read(tmp_path, python="/usr/bin/python3")
    checks, ready = ar.readiness("n1", facts, settings())
    assert not ready
    assert checks["torch"]["status"] == "fail" and "no torch module in /usr/bin/python3 on n1" in checks["torch"]["found"]
    assert "preflight_training_python" in checks["torch"]["fix"]


def test_missing_python_is_a_finding_not_an_exception(tmp_path):
    facts = read(tmp_path, python=str(tmp_path / "nope"))
    checks, ready = ar.readiness("n1", facts, settings())
    assert not ready and checks["python"]["status"] == "fail" and "n1" in checks["python"]["found"]


def test_port_holder_is_named(tmp_path):
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        facts = read(tmp_path, port=port)
    assert facts["port"]["free"] is False
    assert "port %d" % port in facts["port"]["detail"] and "pid %d" % os.getpid() in facts["port"]["detail"]


def test_a_port_held_by_another_preflight_runs_store_says_so(tmp_path):
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel
    from preflight_node.lock import RUN_ENV  # pylint: disable=import-outside-toplevel
    code = ("import socket, sys, time\ns = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen(1)\n"
            "print(s.getsockname()[1], flush=True)\ntime.sleep(30)\n")
    store = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, **{RUN_ENV: "ctl:4242:77"}))
    try:
        port = int(store.stdout.readline())
        facts = read(tmp_path, port=port)
    finally:
        store.kill()
        store.wait()
    assert facts["port"]["free"] is False and facts["port"]["holder"]["run_id"] == "ctl:4242:77"
    assert "the rendezvous store of another preflight run (ctl:4242:77)" in facts["port"]["detail"]


def test_gpus_with_cpu_torch_fail_and_gpu_build_picks_nccl(tmp_path):
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        (tmp_path / name).write_text("")
    facts = read(tmp_path)
    assert facts["accelerators"]["nvidia"] == 2
    checks, ready = ar.readiness("n1", facts, settings())
    assert not ready and checks["accelerator_build"]["status"] == "fail"
    facts = read(tmp_path, python=fake_python(tmp_path, "2.3.0", "12.1"))
    checks, ready = ar.readiness("n1", facts, settings())
    assert ready and facts["backend"] == "nccl" and facts["nproc_per_node"] == 2


def test_amd_gpus_counted_from_kfd_topology(tmp_path):
    nodes = tmp_path / "class/kfd/kfd/topology/nodes"
    for index, simd in enumerate((0, 304, 304)):  # node 0 is the CPU
        (nodes / str(index)).mkdir(parents=True)
        (nodes / str(index) / "properties").write_text("cpu_cores_count 0\nsimd_count %d\n" % simd)
    assert read(tmp_path)["accelerators"]["amd"] == 2


def test_cuda_launch_blocking_known_hang(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    checks, ready = ar.readiness("n1", read(tmp_path, python=fake_python(tmp_path, "1.13.1", "11.7")), settings())
    assert not ready and "issue 750" in checks["cuda_launch_blocking"]["fix"]
    checks, _ = ar.readiness("n1", read(tmp_path, python=fake_python(tmp_path, "2.1.0", "12.1")), settings())
    assert "cuda_launch_blocking" not in checks


# -- the launch plan ----------------------------------------------------------

def facts_of(nproc=2, backend="gloo", free=True):
    return {"nproc_per_node": nproc, "backend": backend,
            "port": {"free": free, "detail": "port 6000 can be bound" if free else "port 6000 in use by pid 7"}}


def nodes(hosts):
    return {host: {"name": host, "ansible_host": "198.18.0.%d" % i, "node_addr": "198.18.0.%d" % i}
            for i, host in enumerate(hosts, 1)}


def plan_for(hosts, ready=None, excluded=None, facts=None, blockers=(), nic=None):
    facts = facts or {host: facts_of() for host in hosts}
    nic = nic if nic is not None else {"addr_by_host": {h: "198.19.0.%d" % i for i, h in enumerate(hosts, 1)},
                                       "gloo_socket_ifname": "fab0"}
    return ar.launch_plan(hosts, ready if ready is not None else list(hosts), excluded or {}, facts,
                          {host: settings() for host in hosts}, nodes(hosts), nic, blockers)


def test_plan_launches_every_ready_node_on_the_chosen_interface():
    plan = plan_for(["n1", "n2", "n3"])
    assert plan["launch"] and plan["ok"] and plan["world_size"] == 6
    assert plan["master"] == "n1" and plan["master_addr"] == "198.19.0.1"
    assert [plan["args_by_host"][h]["node_rank"] for h in ("n1", "n2", "n3")] == [0, 1, 2]
    assert plan["args_by_host"]["n2"]["socket_ifname"] == "fab0"
    assert plan["checks_by_host"]["n1"]["master_port"]["status"] == "pass"


def test_a_node_lost_before_the_launch_is_left_out_and_the_rest_still_run():
    plan = plan_for(["n1", "n2", "n3"], excluded={"n1": "unreachable while reading its facts"})
    assert plan["launch"] and plan["hosts"] == ["n2", "n3"] and plan["master"] == "n2"
    assert plan["world_size"] == 4 and plan["args_by_host"]["n3"]["nnodes"] == 2
    run = plan["checks_by_host"]["n1"]["run"]
    assert run["status"] == "skipped" and run["details"]["blocked"] and "unreachable" in run["found"]


def test_a_not_ready_node_is_left_out_without_a_run_check_of_its_own():
    plan = plan_for(["n1", "n2"], ready=["n2"])
    assert plan["hosts"] == ["n2"] and "n1" not in plan["checks_by_host"]


@pytest.mark.parametrize("facts, words", [
    ({"n1": facts_of(nproc=2), "n2": facts_of(nproc=1)}, "ranks per node differ"),
    ({"n1": facts_of(backend="gloo"), "n2": facts_of(backend="nccl")}, "backends differ"),
    ({"n1": facts_of(free=False), "n2": facts_of()}, "rendezvous port is taken on the master n1"),
])
def test_cluster_wide_blockers_stop_the_launch_and_block_every_node(facts, words):
    plan = plan_for(["n1", "n2"], facts=facts)
    assert not plan["launch"] and not plan["ok"] and words in plan["skip_reason"]
    for host in ("n1", "n2"):
        assert plan["checks_by_host"][host]["run"]["details"]["blocked"]


def test_earlier_blockers_stop_the_launch():
    plan = plan_for(["n1", "n2"], blockers=["no inter-node interface every node shares"])
    assert not plan["launch"] and "interface" in plan["skip_reason"]


# -- the outcome --------------------------------------------------------------

def rank(host, number, status="ok", stage="done", **extra):
    row = {"rank": number, "local_rank": number % 2, "status": status, "stage": stage, "correct": status == "ok",
           "correctness": {"wrong": 0}, "bandwidth": [{"size_bytes": 4096, "algbw_gbps": 1.0, "busbw_gbps": 1.5}],
           "versions": {"torch": "2.13.0"}, "error": None, "exitcode": None}
    row.update(extra)
    return row


def result(ranks, ok=True):
    status = "pass" if ok else "fail"
    return {"ranks": ranks, "log": "[n:0]: hello\n",
            "checks": {"ranks": {"status": status, "found": "x", "expected": "y", "fix": "" if ok else "z"}}}


def two_node_plan():
    return plan_for(["n1", "n2"])


def test_all_ranks_done_pass_with_the_planned_world_size():
    summary, checks = outcome.summarize(two_node_plan(), {"n1": result([rank("n1", 0), rank("n1", 1)]),
                                                     "n2": result([rank("n2", 2), rank("n2", 3)])})
    assert summary["status"] == "pass" and summary["world_size"] == 4 and summary["correct"] is True
    assert summary["sizes"][0]["busbw_gbps"] == 1.5
    assert checks["n1"]["world_size"]["status"] == "pass"


def test_dead_rank_is_blamed_and_peers_are_collateral():
    n1 = [rank("n1", 0, "error", "correctness", error="RuntimeError: Connection closed by peer"),
          rank("n1", 1, "error", "correctness", error="RuntimeError: Connection reset by peer")]
    n2 = [rank("n2", 2, "died", "correctness", exitcode=-9), rank("n2", 3, "died", "correctness", exitcode=-15)]
    summary, checks = outcome.summarize(two_node_plan(), {"n1": result(n1, ok=False), "n2": result(n2, ok=False)})
    assert summary["status"] == "fail"
    assert [(s["host"], s["rank"]) for s in summary["suspects"]] == [("n2", 2)]
    collateral = checks["n1"]["ranks"]
    assert collateral["status"] == "warn" and collateral["details"]["blocked"] and "n2" in collateral["found"]
    blame = checks["n2"]["suspect_rank_2"]
    assert blame["status"] == "fail" and "exit code -9" in blame["found"] and "drain n2" in blame["fix"]
    assert checks["n2"]["ranks"]["status"] == "fail"


def test_a_node_whose_result_never_came_back_is_the_suspect_and_the_world_size_is_short():
    summary, checks = outcome.summarize(two_node_plan(), {"n1": result([rank("n1", 0, "error", "correctness",
                                                                         error="Connection reset by peer"),
                                                                    rank("n1", 1, "error", "correctness",
                                                                         error="Connection reset by peer")],
                                                                   ok=False)},
                                   lost={"n2": "unreachable while waiting for the all-reduce: ssh timed out"})
    assert summary["status"] == "fail" and summary["world_size"] == 2 and summary["planned_world_size"] == 4
    assert {s["host"] for s in summary["suspects"]} == {"n2"}
    assert "ssh timed out" in checks["n2"]["suspect_rank_2"]["found"]
    assert checks["n2"]["world_size"]["status"] == "fail"
    assert checks["n1"]["world_size"]["status"] == "warn" and checks["n1"]["ranks"]["status"] == "warn"


def test_wrong_data_is_blamed():
    n1 = [rank("n1", 0), rank("n1", 1, "wrong", correct=False, correctness={"wrong": 5})]
    plan = plan_for(["n1"])
    summary, _ = outcome.summarize(plan, {"n1": result(n1, ok=False)})
    assert summary["status"] == "fail" and summary["correct"] is False
    assert summary["suspects"][0]["rank"] == 1


def test_hung_rank_blamed_when_peers_timed_out():
    rows = [dict(rank("n1", 0, "error", "correctness", error="RuntimeError: Timed out waiting 4000ms for recv"),
                 host="n1"),
            dict(rank("n1", 1, "hung", "init", exitcode=-15, process_state="sleeping"), host="n1")]
    assert [(s["host"], s["rank"]) for s in outcome.find_suspects(rows)] == [("n1", 1)]


def test_monitored_barrier_names_missing_rank():
    rows = [dict(rank("n1", 0, "error", "barrier",
                      error="RuntimeError: Rank 1 failed to pass monitoredBarrier in 30000 ms"), host="n1"),
            dict(rank("n1", 1, "error", "barrier", error="RuntimeError: something else"), host="n1")]
    assert [s["rank"] for s in outcome.find_suspects(rows)] == [1]


def test_a_plan_that_did_not_launch_is_skipped_with_its_reason():
    plan = plan_for(["n1", "n2"], blockers=["port mesh failures without a single culprit"])
    summary, checks = outcome.summarize(plan, {})
    assert summary["status"] == "skipped" and "culprit" in summary["reason"] and checks == {}


def test_a_lost_node_explains_peers_whose_rendezvous_failed():
    """Peers whose torchrun never started its ranks because a node went away are not suspects."""
    rows = [dict(rank("n1", 0, "missing", "not started"), host="n1"),
            dict(rank("n1", 1, "missing", "not started"), host="n1"),
            dict(rank("n2", 2, "no_result", "unknown"), host="n2"),
            dict(rank("n3", 4, "wrong", correct=False, correctness={"wrong": 3}), host="n3")]
    suspects = outcome.find_suspects(rows, lost={"n2": "unreachable while running the probes"})
    assert [(s["host"], s["rank"]) for s in suspects] == [("n2", 2), ("n3", 4)]
    assert "unreachable while running the probes" in suspects[0]["reason"]


# -- failure signatures in the outcome -----------------------------------------

NCCL_SOCKET = "n2:41:41 [0] NCCL INFO NET/Socket : Using [0]eth0:198.18.201.12<0>"
NCCL_IB = "n1:40:40 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:198.18.200.1<0>"
GLOO_CLOSED = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
               "[127.0.0.1]:37574. This is typically caused by a remote worker crashing.")
REFUSED = "[c10d] The client socket has failed to connect to [n1]:6000 (errno: 111 - Connection refused)."


def logged(ranks, ok=True, log="", rank_logs=()):
    out = result(ranks, ok)
    out["log"] = log
    out["rank_logs"] = [{"rank": r, "stream": "stderr", "text": text} for r, text in rank_logs]
    return out


def nic_facts(fabric):
    """nic_discovery facts with or without an ACTIVE InfiniBand port."""
    rdma = {"mlx5_0": {"name": "mlx5_0", "kind": "infiniband", "ports": [{"port": 1, "state": "ACTIVE"}]}}
    return {"nics": {"eth0": {"class": "ethernet", "is_up": True}}, "rdma_devices": rdma if fabric else {}}


def nccl_plan():
    plan = two_node_plan()
    plan["backend"] = "nccl"
    return plan


def test_node_fabrics_come_from_the_nic_discovery_facts():
    assert outcome.node_fabrics(nic_facts(True)) == ["infiniband"]
    assert outcome.node_fabrics(nic_facts(False)) == [] and outcome.node_fabrics(None) is None


def test_a_healthy_gloo_run_has_no_signature_check():
    _summary, checks = outcome.summarize(two_node_plan(), {
        "n1": logged([rank("n1", 0), rank("n1", 1)], log=GLOO_CLOSED),
        "n2": logged([rank("n2", 2), rank("n2", 3)])})
    assert "signatures" not in checks["n1"] and "signatures" not in checks["n2"]


@pytest.mark.parametrize("fabric, status, words", [
    (True, "warn", "NCCL_IB_DISABLE"),
    (False, "pass", "no fabric"),
])
def test_a_healthy_nccl_run_reports_each_nodes_transport_and_warns_sockets_on_a_fabric(fabric, status, words):
    summary, checks = outcome.summarize(nccl_plan(), {
        "n1": logged([rank("n1", 0), rank("n1", 1)], rank_logs=[(0, NCCL_IB)]),
        "n2": logged([rank("n2", 2), rank("n2", 3)], rank_logs=[(2, NCCL_SOCKET), (3, REFUSED)])},
        nic_facts={"n1": nic_facts(True), "n2": nic_facts(fabric)})
    assert summary["status"] == "pass"
    assert checks["n1"]["signatures"]["status"] == "pass"
    assert checks["n1"]["signatures"]["details"]["transport"] == "NET/IB"
    mine = checks["n2"]["signatures"]
    assert mine["status"] == status and mine["details"]["transport"] == "NET/Socket"
    assert words in mine["fix"] + mine["found"]
    assert [f["id"] for f in mine["details"]["findings"]] == ["nccl_net_socket"], "only the transport on success"


def test_a_healthy_nccl_run_without_transport_lines_says_so():
    _summary, checks = outcome.summarize(nccl_plan(), {"n1": logged([rank("n1", 0), rank("n1", 1)]),
                                                  "n2": logged([rank("n2", 2), rank("n2", 3)])})
    assert checks["n1"]["signatures"]["status"] == "not_applicable"
    assert "NCCL_DEBUG" in checks["n1"]["signatures"]["found"]


def test_a_failed_run_names_each_nodes_signatures_and_the_suspects_are_not_collateral():
    n1 = [rank("n1", 0, "error", "correctness", error=GLOO_CLOSED),
          rank("n1", 1, "error", "correctness", error=GLOO_CLOSED)]
    n2 = [rank("n2", 2, "died", "init", exitcode=1), rank("n2", 3, "died", "init", exitcode=-15)]
    summary, checks = outcome.summarize(two_node_plan(), {
        "n1": logged(n1, ok=False, log="[n1:0]:" + GLOO_CLOSED + "\n[n1:1]:" + GLOO_CLOSED),
        "n2": logged(n2, ok=False, rank_logs=[(2, REFUSED), (3, REFUSED)])})
    assert {s["host"] for s in summary["suspects"]} == {"n2"}
    n2_sig = checks["n2"]["signatures"]
    assert n2_sig["status"] == "fail" and "connection_refused" in n2_sig["found"]
    assert "nothing listens" in n2_sig["found"] and "ss -ltnp" in n2_sig["fix"]
    n1_sig = checks["n1"]["signatures"]
    assert n1_sig["status"] == "warn" and "gloo_peer_closed" in n1_sig["found"] and "and 1 more" in n1_sig["found"]


def test_a_healthy_peers_failed_signature_is_collateral_and_a_quiet_log_is_said_to_be_quiet():
    n1 = [rank("n1", 0, "error", "init", error="x"), rank("n1", 1, "error", "init", error="y")]
    n2 = [rank("n2", 2, "died", "init", exitcode=1), rank("n2", 3, "died", "init", exitcode=-15)]
    _summary, checks = outcome.summarize(two_node_plan(), {
        "n1": logged(n1, ok=False, log="[n1:0]:" + REFUSED),
        "n2": logged(n2, ok=False, log="[n2:0]: nothing known here")})
    collateral = checks["n1"]["signatures"]
    assert collateral["status"] == "warn" and collateral["details"]["blocked"] and "collateral" in collateral["found"]
    assert collateral["details"]["findings"][0]["id"] == "connection_refused"
    assert checks["n2"]["signatures"]["status"] == "not_applicable"
    assert "no known failure signature" in checks["n2"]["signatures"]["found"]


def test_a_lost_node_gets_no_signature_check():
    _summary, checks = outcome.summarize(two_node_plan(), {"n1": logged([rank("n1", 0, "error", "init", error=REFUSED),
                                                                    rank("n1", 1, "error", "init", error=REFUSED)],
                                                                   ok=False, log=REFUSED)},
                                    lost={"n2": "unreachable"})
    assert "signatures" not in checks["n2"] and checks["n1"]["signatures"]["details"]["findings"]


def test_nccl_debug_info_is_set_for_nccl_unless_the_operator_chose_a_level(monkeypatch):
    from preflight_node import gate_run as allreduce
    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    params = {"socket_ifname": "", "env": {}, "backend": "nccl"}
    assert allreduce.build_env(params, "/s")["NCCL_DEBUG"] == "INFO"
    assert "NCCL_DEBUG" not in allreduce.build_env(dict(params, backend="gloo"), "/s")
    assert allreduce.build_env(dict(params, env={"NCCL_DEBUG": "WARN"}), "/s")["NCCL_DEBUG"] == "WARN"
    monkeypatch.setenv("NCCL_DEBUG", "TRACE")
    assert allreduce.build_env(params, "/s")["NCCL_DEBUG"] == "TRACE"


# -- versions across nodes ------------------------------------------------------

def reader(torch="2.1.0", cuda="12.1", python="3.11.7", hip=None, blocking=None):
    return {"python_path": "/venv/bin/python", "python": {"version": python, "executable": "/venv/bin/python"},
            "torch": {"version": torch, "cuda": cuda, "hip": hip, "path": "/venv/torch"} if torch else None,
            "cuda_launch_blocking": blocking}


def ran(host, first, **versions):
    values = {"python": "3.11.7", "torch": "2.1.0", "cuda": "12.1", "hip": None, "nccl": "2.18.1"}
    values.update(versions)
    return {"ranks": [rank(host, first, versions=dict(values)), rank(host, first + 1, versions=dict(values))]}


@pytest.mark.parametrize("facts, odd, words", [
    # One node of three with another torch: only it fails, naming the majority.
    ({"n1": reader(), "n2": reader(torch="2.0.1"), "n3": reader()}, ["n2"],
     "torch 2.0.1 on n2, but 2.1.0 on 2 other node(s) (n1, n3)"),
    # Two nodes that differ: no majority, both named.
    ({"n1": reader(), "n2": reader(python="3.10.12")}, ["n1", "n2"], "no majority"),
    # A CPU build among CUDA builds.
    ({"n1": reader(), "n2": reader(cuda=None), "n3": reader()}, ["n2"], "cuda none on n2, but 12.1"),
    # The same everywhere.
    ({"n1": reader(), "n2": reader(), "n3": reader()}, [], "the same on all 3 node(s)"),
])
def test_version_drift_from_the_reader_names_the_odd_nodes(facts, odd, words):
    checks = versions_mod.version_checks(sorted(facts), facts)
    assert sorted(h for h, c in checks.items() if c["status"] == "fail") == odd
    text = " ".join(c["found"] for c in checks.values())
    assert words in text
    for host in odd:
        assert host in checks[host]["fix"] and "drift" not in checks[host]["fix"]
    for host in set(facts) - set(odd):
        assert checks[host]["status"] == "pass"
        if odd:
            assert "differs on %s" % ", ".join(odd) in checks[host]["found"]


def test_the_ranks_versions_win_and_bring_nccl():
    facts = {"n1": reader(), "n2": reader(), "n3": reader()}
    results = {"n1": ran("n1", 0), "n2": ran("n2", 2, nccl="2.14.3"), "n3": ran("n3", 4)}
    checks = versions_mod.version_checks(["n1", "n2", "n3"], facts, results)
    assert checks["n2"]["status"] == "fail" and "nccl 2.14.3 on n2, but 2.18.1" in checks["n2"]["found"]
    assert checks["n2"]["details"]["odd"] == ["nccl"]
    assert checks["n1"]["status"] == "pass" and "nccl 2.18.1" in checks["n1"]["found"]


def test_a_node_the_reader_could_not_ask_is_skipped_and_not_counted():
    facts = {"n1": reader(), "n2": {"python_path": "/nope", "python": None, "torch": None}, "n3": reader()}
    checks = versions_mod.version_checks(["n1", "n2", "n3"], facts)
    assert checks["n2"]["status"] == "skipped" and "allreduce.python" in checks["n2"]["found"]
    assert checks["n1"]["status"] == checks["n3"]["status"] == "pass"


@pytest.mark.parametrize("facts, results, settings, status, words", [
    # torch 2.0.x on a CUDA build: NCCL 2.14.3, a known hang with CUDA_LAUNCH_BLOCKING=1.
    (reader(torch="2.0.1+cu118", cuda="11.8"), None, {}, "warn", "torch 2.0.1+cu118 (pins NCCL 2.14.3)"),
    (reader(torch="1.13.1", cuda="11.7", blocking="1"), None, {}, "warn", "see allreduce.cuda_launch_blocking"),
    (reader(torch="2.0.1"), None, {"allreduce_env": {"CUDA_LAUNCH_BLOCKING": 1}}, "warn", "it is set"),
    # What the ranks ran decides: NCCL 2.14.3 whatever torch says.
    (reader(), {"ranks": [{"versions": {"nccl": "2.14.3"}}]}, {}, "warn", "NCCL 2.14.3 hangs"),
    # A CPU build of an old torch has no NCCL; a new NCCL is fine.
    (reader(torch="2.0.1", cuda=None), None, {}, "pass", "torch 2.0.1"),
    (reader(), {"ranks": [{"versions": {"nccl": "2.18.1"}}]}, {}, "pass", "nccl 2.18.1"),
])
def test_known_bad_versions_warn_and_point_at_the_cuda_launch_blocking_check(facts, results, settings, status,
                                                                             words):
    checks = versions_mod.version_checks(["n1"], {"n1": facts}, {"n1": results} if results else None, {"n1": settings})
    assert checks["n1"]["status"] == status and words in checks["n1"]["found"]
    if status == "warn":
        assert "torch to 2.1" in checks["n1"]["fix"]


# -- a rendezvous nobody reaches ------------------------------------------------

STORE_TIMEOUT = ("[E1123 18:01:30.308141457 socket.cpp:1028] [c10d] The client socket has timed out after 20000ms "
                 "while trying to connect to (198.19.0.1, 6000).")


def never_started(host, first, log):
    return logged([rank(host, first, "missing", "not started", correct=False, bandwidth=[]),
                   rank(host, first + 1, "missing", "not started", correct=False, bandwidth=[])], ok=False, log=log)


def three_node_plan():
    return plan_for(["n1", "n2", "n3"])


def test_a_store_no_node_reaches_names_the_master_and_its_port_not_the_peers():
    plan = three_node_plan()
    results = {host: never_started(host, 2 * index, STORE_TIMEOUT) for index, host in enumerate(("n1", "n2", "n3"))}
    summary, checks = outcome.summarize(plan, results, mesh_reached={"n1", "n2", "n3"})
    assert summary["status"] == "fail"
    assert summary["rendezvous"] == {"blamed": ["n1"], "endpoint": "198.19.0.1:%d" % plan["master_port"]}
    assert {s["host"] for s in summary["suspects"]} == {"n1"}
    found = checks["n1"]["rendezvous"]
    assert found["status"] == "fail" and "n1 hosts the rendezvous store at 198.19.0.1" in found["found"]
    assert "port mesh reached n1" in found["found"] and "iptables -S INPUT" in found["fix"]
    for host in ("n2", "n3"):
        assert "rendezvous" not in checks[host]
        assert not [name for name, check in checks[host].items() if check["status"] == "fail"], checks[host]
    # Without the mesh having reached the master, the text does not claim it did.
    _summary, checks = outcome.summarize(plan, results, mesh_reached=set())
    assert "port mesh" not in checks["n1"]["rendezvous"]["found"]


def test_a_node_that_alone_cannot_reach_the_store_is_named_not_the_master():
    plan = three_node_plan()
    quiet = "torchrun: waiting for the other nodes\n"
    results = {"n1": never_started("n1", 0, quiet), "n2": never_started("n2", 2, quiet),
               "n3": never_started("n3", 4, STORE_TIMEOUT)}
    summary, checks = outcome.summarize(plan, results)
    assert summary["rendezvous"]["blamed"] == ["n3"]
    assert "n3 could not reach the rendezvous store on n1" in checks["n3"]["rendezvous"]["found"]
    assert "iptables -S OUTPUT" in checks["n3"]["rendezvous"]["fix"]
    assert "rendezvous" not in checks["n1"] and "rendezvous" not in checks["n2"]


def test_ranks_that_started_are_not_a_rendezvous_fault():
    plan = two_node_plan()
    n1 = [rank("n1", 0, "error", "init", error=STORE_TIMEOUT), rank("n1", 1, "error", "init", error=STORE_TIMEOUT)]
    n2 = [rank("n2", 2, "died", "correctness", exitcode=-9), rank("n2", 3, "ok")]
    summary, checks = outcome.summarize(plan, {"n1": logged(n1, ok=False, log=STORE_TIMEOUT),
                                          "n2": logged(n2, ok=False)})
    assert "rendezvous" not in summary and "rendezvous" not in checks["n1"]
    assert [(s["host"], s["rank"]) for s in summary["suspects"]] == [("n2", 2)]


# -- the GPUs the reader lists for the GPU pair rounds ----------------------------

def test_read_gpus_asks_nvidia_smi_only_on_a_node_with_two_nvidia_gpus():
    import os  # pylint: disable=import-outside-toplevel
    from fake_ops import FakeOps  # pylint: disable=import-outside-toplevel
    fixture = os.path.join(os.path.dirname(__file__), "fixtures", "nvidia_smi", "query_gpu_8.csv")
    with open(fixture, encoding="utf-8") as handle:
        listing = handle.read()
    smi = "/usr/bin/nvidia-smi"
    ops = FakeOps(programs={"nvidia-smi": smi}, commands={(smi,): (0, listing, "")})
    gpus, problem = node_ar.read_gpus({"nvidia": 8, "amd": 0}, ops)
    assert problem is None and len(gpus) == 8 and gpus[5]["bus_id"] == "00000000:AB:00.0"
    assert ops.calls == [[smi, "--query-gpu=index,pci.bus_id,uuid,name", "--format=csv,noheader"]]
    # A CPU node (or one GPU): nothing is run.
    cpu = FakeOps(programs={"nvidia-smi": smi}, commands={(smi,): (0, listing, "")})
    assert node_ar.read_gpus({"nvidia": 0, "amd": 0}, cpu) == ([], None) and cpu.calls == []
    # What a node may lack is a fact, never an exception.
    assert node_ar.read_gpus({"nvidia": 2, "amd": 0}, FakeOps()) == ([], "nvidia-smi is not on PATH")
    broken = FakeOps(programs={"nvidia-smi": smi}, commands={(smi,): (9, "", "NVIDIA-SMI has failed")})
    assert node_ar.read_gpus({"nvidia": 2, "amd": 0}, broken)[1] == "nvidia-smi exited 9: NVIDIA-SMI has failed"
    garbled = FakeOps(programs={"nvidia-smi": smi}, commands={(smi,): (0, "not a listing\n", "")})
    assert node_ar.read_gpus({"nvidia": 2, "amd": 0}, garbled)[1].startswith("unreadable nvidia-smi output")


@pytest.mark.parametrize("rc, seconds, earlier", [(124, 20, False), (125, 30.0, True)])
def test_a_hung_training_python_is_one_failure_naming_it_and_the_fix(tmp_path, rc, seconds, earlier):
    from fake_ops import FakeOps

    ops = FakeOps(commands={("/venv/bin/python",): (rc, "", "killed")})
    if earlier:  # it hung as nobody while the job user was chosen, earlier in this node call
        ops.hangs = {"/venv/bin/python": {"program": "/venv/bin/python", "seconds": 30.0, "user": "nobody"}}
    args = ar.read_args(settings(allreduce_python="/venv/bin/python"), {"name": "n1"})
    args.update(dev_root=str(tmp_path), sysfs_root=str(tmp_path))
    facts = node_ar.read(args, ops)
    assert facts["python_hang"] == {"seconds": seconds, "user": "nobody" if earlier else "trainer", "earlier": earlier}
    checks, ready = ar.readiness("n1", facts, settings())
    assert not ready and checks["python"]["status"] == "fail" and "torch" not in checks
    assert "/venv/bin/python on n1 hung: no answer in %g s" % seconds in checks["python"]["found"]
    assert "py-spy dump" in checks["python"]["fix"]
