"""The controller's decisions (action_plugins/preflight_decide.py) over what nodes registered: a
two-node run's registered results, built here, go through inputs, plan, launch and final."""

import importlib.util
import os
import sys

from cluster_preflight import capabilities
from capability_helpers import role_settings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "nic"))
from fake_sysfs import cluster_node  # noqa: E402  pylint: disable=wrong-import-position

PLUGIN = os.path.join(os.path.dirname(__file__), "..", "..", "action_plugins", "preflight_decide.py")
spec = importlib.util.spec_from_file_location("preflight_decide_action", PLUGIN)
plugin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plugin)

HOSTS = ["n1", "n2"]
GATE = ("nic_discovery", "port_mesh", "allreduce")


def gate_settings():
    settings = {name: role_settings(name) for name in GATE}
    settings["nic_discovery"]["nic_discovery_override"] = ""
    settings["port_mesh"]["port_mesh_port"] = 6000
    settings["allreduce"].update(allreduce_python="/venv/bin/python", allreduce_master_port=6000,
                                 allreduce_nproc_per_node=0)
    return settings


def node(index):
    return {"name": "n%d" % index, "ansible_host": "198.18.0.%d" % index, "node_addr": "198.18.0.%d" % index,
            "user": "root", "ssh_port": 22}


def facts(tmp_path, index):
    from preflight_node.capabilities import nic_discovery as preflight_nic_discovery
    from fake_ops import FakeOps
    tree = cluster_node(tmp_path / ("n%d" % index), index=index)
    nics = preflight_nic_discovery.read({"sysfs_root": tree.sys, "proc_root": tree.proc, "addr_source": "proc",
                                         "ip_json_file": None}, FakeOps())
    torch = {"python_path": "/venv/bin/python", "python": {"version": "3.11.7", "executable": "/venv/bin/python"},
             "torch": {"version": "2.13.0", "cuda": None, "hip": None, "path": "/venv/torch"},
             "probe_error": None, "accelerators": {"nvidia": 0, "amd": 0}, "cuda_launch_blocking": None,
             "port": {"free": True, "detail": "port 6000 can be bound on 0.0.0.0", "holder": None},
             "hostname": "n%d" % index, "backend": "gloo", "nproc_per_node": 2,
             "job_user": {"name": "trainer", "uid": 1000, "run_as": "trainer", "how": "named", "note": ""}}
    return {"nic_discovery": nics, "allreduce": torch}


class Run(object):
    """What a play's hostvars hold, stage after stage."""

    def __init__(self, tmp_path, forks=64, hosts=HOSTS):
        self.hosts = list(hosts)
        self.hostvars = {}
        for index, host in enumerate(self.hosts, 1):
            self.hostvars[host] = {
                "preflight_settings": {"ok": True, "errors": [], "settings": gate_settings(), "node": node(index)},
                "preflight_facts": {"facts": facts(tmp_path, index), "errors": {}},
            }
        self.forks = forks

    def task_vars(self):
        return {"ansible_play_hosts_all": list(self.hosts), "groups": {"cluster": list(self.hosts)},
                "ansible_forks": self.forks, "hostvars": self.hostvars}

    def decide(self, stage, register):
        result = plugin.decide(stage, self.task_vars())
        for host in self.hosts:
            self.hostvars[host][register] = result
        return result

    def register(self, host, name, value):
        self.hostvars[host][name] = value


def mesh_result(src, dst, result="open"):
    return {"results": [{"source": src, "destination": dst, "addr": "x", "port": 6000, "result": result,
                         "detail": "%s -> %s %s" % (src, dst, result)}],
            "checks": {"port_listen": {"status": "pass", "found": "listening", "expected": "x", "fix": ""}}}


def test_a_healthy_pair_is_planned_launched_and_summarised(tmp_path):
    run = Run(tmp_path)
    assert run.decide("inputs", "preflight_inputs")["ok"]
    plan = run.decide("plan", "preflight_plan")
    assert plan["ok"] and plan["hosts"] == HOSTS and plan["ready"] == HOSTS
    assert plan["nic"]["ifname"] == "ib0" and plan["port_mesh"]["run"]
    assert plan["port_mesh"]["async_seconds"] == 0
    assert plan["checks_by_host"]["n1"]["allreduce"]["torch"]["status"] == "pass"
    for src, dst in (("n1", "n2"), ("n2", "n1")):
        run.register(src, "port_mesh_probe", mesh_result(src, dst))
    launch = run.decide("launch", "preflight_launch")
    gate = launch["gate"]
    assert launch["ok"] and gate["hosts"] == HOSTS and gate["world_size"] == 4
    assert gate["args_by_host"]["n2"]["master_addr"] == "198.19.1.1"
    for index, host in enumerate(HOSTS):
        run.register(host, "allreduce_job", {"results_file": "/x", "started": 1})
        run.register(host, "preflight_probes", {"probes": {}, "errors": {}, "job": {"ranks": [
            {"rank": 2 * index + local, "local_rank": local, "status": "ok", "stage": "done", "correct": True,
             "bandwidth": [], "error": None} for local in (0, 1)],
            "checks": {"ranks": {"status": "pass", "found": "ok", "expected": "ok", "fix": ""}}, "log": ""}})
    final = run.decide("final", "preflight_final")
    assert final["allreduce"]["status"] == "pass" and final["allreduce"]["world_size"] == 4
    assert final["checks_by_host"]["n2"]["allreduce"]["world_size"]["status"] == "pass"
    # Versions are compared across every node that was read; a healthy gloo run has no signatures check.
    for host in HOSTS:
        versions = final["checks_by_host"][host]["allreduce"]["versions"]
        assert versions["status"] == "pass" and "the same on all 2 node(s)" in versions["found"]
        assert "signatures" not in final["checks_by_host"][host]["allreduce"]


def test_the_final_stage_names_the_node_whose_torch_differs(tmp_path):
    run = Run(tmp_path)
    run.hostvars["n2"]["preflight_facts"]["facts"]["allreduce"]["torch"]["version"] = "2.12.0"
    final = run.decide("final", "preflight_final")
    checks = {host: final["checks_by_host"][host]["allreduce"]["versions"] for host in HOSTS}
    assert checks["n1"]["status"] == checks["n2"]["status"] == "fail", "two nodes that differ: both named"
    assert "torch 2.12.0 on n2, but 2.13.0 on n1 (no majority)" in checks["n2"]["found"]


def test_fewer_forks_than_nodes_probe_the_mesh_in_the_background(tmp_path):
    run = Run(tmp_path, forks=1)
    run.decide("inputs", "preflight_inputs")
    assert run.decide("plan", "preflight_plan")["port_mesh"]["async_seconds"] > 0


def test_a_node_lost_during_the_mesh_is_left_out_of_the_launch(tmp_path):
    run = Run(tmp_path)
    run.decide("inputs", "preflight_inputs")
    run.decide("plan", "preflight_plan")
    run.register("n1", "port_mesh_probe", mesh_result("n1", "n2", "timeout"))
    run.register("n2", "port_mesh_probe", {"unreachable": True, "msg": "ssh: connect timed out"})
    launch = run.decide("launch", "preflight_launch")
    assert launch["gate"]["hosts"] == ["n1"] and launch["reachable"] == ["n1"]
    assert "unreachable while probing the rendezvous port" in launch["lost"]["n2"]
    assert launch["checks_by_host"]["n2"]["allreduce"]["run"]["details"]["blocked"]
    assert launch["checks_by_host"]["n1"]["port_mesh"]["reach"]["status"] == "pass"


def test_a_reader_that_raised_is_that_capabilitys_error_and_the_rest_is_planned(tmp_path):
    run = Run(tmp_path)
    run.hostvars["n2"]["preflight_facts"]["errors"] = {"iommu": {"found": "RuntimeError: boom", "traceback": "tb"}}
    run.decide("inputs", "preflight_inputs")
    plan = run.decide("plan", "preflight_plan")
    error = plan["checks_by_host"]["n2"]["iommu"]["error"]
    assert error["status"] == "fail" and "boom" in error["found"] and error["details"]["traceback"] == "tb"
    assert plan["ready"] == HOSTS


def test_invalid_settings_on_one_node_stop_every_node(tmp_path):
    run = Run(tmp_path)
    run.hostvars["n2"]["preflight_settings"]["ok"] = False
    inputs = run.decide("inputs", "preflight_inputs")
    assert not inputs["ok"] and inputs["invalid_hosts"] == ["n2"]


def test_a_decision_that_raises_becomes_every_nodes_finding_not_a_lost_verdict():
    class Broken(dict):
        def __getitem__(self, key):
            raise RuntimeError("hostvars are broken")

    result = plugin.decide("plan", {"ansible_play_hosts_all": HOSTS, "hostvars": Broken({"n1": 1, "n2": 2})})
    assert not result["ok"] and "RuntimeError" in result["blockers"][0]
    for host in HOSTS:
        check = result["checks_by_host"][host][capabilities.RUN_ROLE]["decide_plan"]
        assert check["status"] == "fail" and "hostvars are broken" in check["found"]


def test_a_gate_that_failed_or_gave_no_result_on_a_node_makes_it_the_suspect(tmp_path):
    run = Run(tmp_path)
    run.decide("inputs", "preflight_inputs")
    run.decide("plan", "preflight_plan")
    for src, dst in (("n1", "n2"), ("n2", "n1")):
        run.register(src, "port_mesh_probe", mesh_result(src, dst))
    run.decide("launch", "preflight_launch")
    run.register("n1", "preflight_probes", {"probes": {}, "errors": {}, "job": {"failed": True, "msg": "boom"}})
    run.register("n2", "preflight_probes", {"probes": {}, "errors": {}, "job": {"checks": {"no_result": {
        "status": "fail", "found": "no result from the all-reduce on n2 after 200 s", "expected": "x", "fix": "y"}}}})
    final = run.decide("final", "preflight_final")
    gate = final["allreduce"]
    assert gate["status"] == "fail" and gate["world_size"] == 0
    reasons = {item["host"]: item["reason"] for item in gate["suspects"]}
    assert "the all-reduce failed on n1: boom" in reasons["n1"]
    assert "no result from the all-reduce on n2" in reasons["n2"]


def test_a_one_node_run_is_planned_and_launched_by_the_controller(tmp_path):
    run = Run(tmp_path, hosts=["n1"])
    run.decide("inputs", "preflight_inputs")
    run.decide("plan", "preflight_plan")
    launch = run.decide("launch", "preflight_launch")
    args = launch["gate"]["args_by_host"]["n1"]
    assert launch["ok"] and args["nnodes"] == 1 and args["run_as"] == "trainer" and args["socket_ifname"] == "ib0"
    run.register("n1", "preflight_probes", {"probes": {}, "errors": {}, "job": {"ranks": [
        {"rank": local, "local_rank": local, "status": "ok", "stage": "done", "correct": True, "bandwidth": [],
         "error": None} for local in (0, 1)],
        "checks": {"ranks": {"status": "pass", "found": "ok", "expected": "ok", "fix": ""}}, "log": ""}})
    final = run.decide("final", "preflight_final")
    assert final["allreduce"]["status"] == "pass"


def test_a_one_node_run_whose_rendezvous_port_is_taken_launches_nothing(tmp_path):
    run = Run(tmp_path, hosts=["n1"])
    run.hostvars["n1"]["preflight_facts"]["facts"]["allreduce"]["port"] = {
        "free": False, "detail": "port 6000 is held by pid 7 (python)", "holder": 7}
    run.decide("inputs", "preflight_inputs")
    run.decide("plan", "preflight_plan")
    launch = run.decide("launch", "preflight_launch")
    assert not launch["gate"]["launch"] and "n1" not in launch["gate"]["args_by_host"]
    assert "rendezvous port is taken" in launch["gate"]["skip_reason"]
