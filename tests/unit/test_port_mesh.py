"""Capability port_mesh: who probes with which arguments (foreground, or background when fewer
forks than nodes), and whom the results blame."""

import pytest

from cluster_preflight.capabilities import port_mesh as pm


def settings(**overrides):
    values = {"port_mesh_port": 6000, "port_mesh_window": 8.0, "port_mesh_connect_timeout": 2.0}
    values.update(overrides)
    return values


NIC = {"ok": True, "addr_by_host": {"n1": "198.19.0.1", "n2": "198.19.0.2", "n3": "198.19.0.3"}}


def plan(hosts=("n1", "n2", "n3"), forks=64, nic=None):
    return pm.plan(list(hosts), nic or NIC, {host: settings() for host in hosts}, forks)


@pytest.mark.parametrize("overrides", [{"port_mesh_port": 0}, {"port_mesh_port": 65536},
                                       {"port_mesh_window": 2.0}, {"port_mesh_connect_timeout": 0.0},
                                       {"port_mesh_window": 601.0}])
def test_validate_refuses_out_of_range_settings(overrides):
    problems = pm.validate(settings(**overrides))
    assert len(problems) == 1 and problems[0]["fix"]


def test_every_node_probes_every_other_in_the_foreground_when_forks_suffice():
    decision = plan()
    assert decision["run"] and decision["async_seconds"] == 0 and decision["hosts"] == ["n1", "n2", "n3"]
    args = decision["args_by_host"]["n2"]
    assert args["listen_addr"] == "198.19.0.2" and args["window"] == 8.0
    assert [peer["name"] for peer in args["peers"]] == ["n1", "n3"]


def test_fewer_forks_than_nodes_run_in_the_background_with_a_longer_window():
    decision = plan(forks=2)
    assert decision["async_seconds"] > 0
    assert decision["args_by_host"]["n1"]["window"] > 8.0
    assert decision["wait_timeout"] >= decision["args_by_host"]["n1"]["window"]


def test_a_single_node_has_no_mesh():
    decision = plan(hosts=["n1"])
    assert not decision["run"] and decision["ok"]
    assert decision["checks_by_host"]["n1"]["reach"]["status"] == "not_applicable"


def test_no_interface_blocks_the_mesh_without_blaming_anyone():
    decision = plan(nic={"ok": False, "addr_by_host": {}})
    assert not decision["run"] and not decision["ok"]
    for host in ("n1", "n2", "n3"):
        check = decision["checks_by_host"][host]["reach"]
        assert check["status"] == "skipped" and check["details"]["blocked"]


def row(src, dst, result="open", detail=""):
    return {"source": src, "destination": dst, "addr": NIC["addr_by_host"][dst], "port": 6000, "result": result,
            "detail": detail or "%s -> %s %s" % (src, dst, result)}


def probe(src, rows, listen="pass"):
    return {"results": rows, "checks": {"port_listen": {"status": listen, "found": "listening", "expected": "x",
                                                        "fix": "" if listen == "pass" else "free the port"}}}


def all_open():
    hosts = ("n1", "n2", "n3")
    return {src: probe(src, [row(src, dst) for dst in hosts if dst != src]) for src in hosts}


def test_report_passes_a_full_mesh():
    report = pm.report(plan(), all_open())
    assert report["ok"] and report["suspect_nodes"] == []
    assert report["checks_by_host"]["n1"]["reach"]["status"] == "pass"
    assert report["checks_by_host"]["n1"]["listen"]["status"] == "pass"


def test_report_blames_the_node_that_drops_the_port_and_not_its_peers():
    probes = all_open()
    for src in ("n1", "n2"):
        probes[src]["results"] = [row(src, dst, "timeout" if dst == "n3" else "open")
                                  for dst in ("n1", "n2", "n3") if dst != src]
    report = pm.report(plan(), probes)
    assert report["ok"] and report["suspect_nodes"] == ["n3"]
    assert report["checks_by_host"]["n3"]["reach"]["status"] == "fail"
    assert "drops" in report["checks_by_host"]["n3"]["reach"]["found"]
    assert report["checks_by_host"]["n1"]["reach"]["status"] == "pass"


def test_a_node_lost_during_the_mesh_is_not_blamed_on_its_peers():
    probes = all_open()
    del probes["n3"]
    for src in ("n1", "n2"):
        probes[src]["results"] = [row(src, dst, "timeout" if dst == "n3" else "open")
                                  for dst in ("n1", "n2", "n3") if dst != src]
    report = pm.report(plan(), probes, lost={"n3": "unreachable while probing the rendezvous port"})
    assert report["ok"] and report["suspect_nodes"] == []
    assert set(report["checks_by_host"]) == {"n1", "n2"}
    assert report["checks_by_host"]["n1"]["reach"]["status"] == "pass"


def test_a_port_held_on_a_node_makes_it_a_suspect():
    probes = all_open()
    probes["n2"]["checks"]["port_listen"] = {"status": "fail", "found": "port 6000 in use by pid 7",
                                             "expected": "free", "fix": "stop pid 7"}
    report = pm.report(plan(), probes)
    assert "n2" in report["suspect_nodes"]


def test_failures_without_a_single_culprit_block_the_gate():
    probes = all_open()
    probes["n1"]["results"] = [row("n1", "n2", "refused"), row("n1", "n3")]
    report = pm.report(plan(), probes)
    assert not report["ok"] and "n1 -> n2 refused" in report["blockers"][0]
