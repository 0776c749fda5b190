"""Capability allreduce, continued from test_allreduce.py: the outcome (suspects, collateral
peers, world size) from every node's ranks, failure signatures, versions across nodes and a
rendezvous nobody reaches (cluster_preflight/capabilities/allreduce/outcome.py, allreduce_versions.py)."""

import pytest

from cluster_preflight.capabilities.allreduce import outcome
from cluster_preflight.capabilities.allreduce import versions as versions_mod
from allreduce_helpers import plan_for


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


def test_the_cause_leads_the_check_and_every_finding_names_its_node_rank_and_the_check_that_catches_it():
    shm = ("n2:77:90 [1] misc/shmutils.cc:132 NCCL WARN Error while creating shared memory segment /dev/shm/nccl-k2 "
           "(size 4194304), error: No space left on device (28)")
    system = "torch.distributed.DistBackendError: NCCL error in: x.cpp:268, unhandled system error"
    n2 = [rank("n2", 2, "died", "init", exitcode=1), rank("n2", 3, "died", "init", exitcode=1)]
    _summary, checks = outcome.summarize(nccl_plan(), {
        "n1": logged([rank("n1", 0, "error", "init", error="x"), rank("n1", 1, "error", "init", error="y")],
                     ok=False),
        "n2": logged(n2, ok=False, log="[n2:1]:" + shm, rank_logs=[(2, system)])})
    mine = checks["n2"]["signatures"]
    assert mine["status"] == "fail" and mine["details"]["cause"] == "shm_too_small"
    assert mine["details"]["category"] == "shm" and mine["details"]["checks"] == ["job_env.dev_shm"]
    assert mine["found"].startswith("n2 (fabric not read): cause shm_too_small: n2 rank 3:"), "local rank 1 is rank 3"
    assert mine["fix"].startswith("for n2 rank 3:") and "job_env.dev_shm checks" in mine["fix"]
    assert "/dev/shm" in mine["expected"]
    by_id = {finding["id"]: finding for finding in mine["details"]["findings"]}
    assert by_id["nccl_system_error"]["where"] == "n2 rank 2" and by_id["nccl_system_error"]["node"] == "n2"
    for finding in by_id.values():
        assert finding["found"] and finding["expected"] and finding["fix"].startswith("for n2 rank")


@pytest.mark.parametrize("hosts, cause", [(["n1", "n2"], "hostname_loopback"), (["n1"], "connection_refused")])
def test_a_loopback_peer_is_name_resolution_on_a_run_across_nodes_only(hosts, cause):
    line = "RuntimeError: [gloo/transport/tcp/pair.cc:799] connect [127.0.1.1]:51012: Connection refused"
    plan = plan_for(hosts)
    results = {host: logged([rank(host, 2 * i, "error", "init", error=line), rank(host, 2 * i + 1, "error", "init",
                                                                                  error=line)], ok=False,
                            log="[%s:0]:%s" % (host, line)) for i, host in enumerate(hosts)}
    _summary, checks = outcome.summarize(plan, results)
    assert checks["n1"]["signatures"]["details"]["cause"] == cause


def test_a_lost_node_gets_no_signature_check():
    _summary, checks = outcome.summarize(two_node_plan(), {"n1": logged([rank("n1", 0, "error", "init", error=REFUSED),
                                                                    rank("n1", 1, "error", "init", error=REFUSED)],
                                                                   ok=False, log=REFUSED)},
                                    lost={"n2": "unreachable"})
    assert "signatures" not in checks["n2"] and checks["n1"]["signatures"]["details"]["findings"]


def test_nccl_debug_info_is_set_for_nccl_unless_the_operator_chose_a_level(monkeypatch):
    from preflight_node.allreduce_run import gate_run as allreduce
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
