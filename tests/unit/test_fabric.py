"""The fabric capability: read and probe (a fake /sys/class/infiniband), decide (ports, rate, counters), settings,
the role, and the profile fields."""

import functools
import json
import time

import pytest

from preflight_node.capabilities import fabric as node_fabric
from preflight_node.capabilities import fabric_probe
from cluster_preflight.capabilities import fabric
from fabric_tree import HW_COUNTERS, PORT_COUNTERS, break_counter, bump, make_tree
from fake_ops import FakeOps
from capability_helpers import (assert_contract as check_contract, assert_one_problem, capability_under_test,
                                role_settings, role_yaml, switched_off_cases, typed_settings)

ROLE_NAME = "fabric"
ROLE, HOST, NODE = capability_under_test(ROLE_NAME, "gpu-node-03", "198.18.0.13")
NDR, HDR = "400 Gb/sec (4X NDR)", "200 Gb/sec (4X HDR)"

settings = functools.partial(role_settings, ROLE_NAME)
assert_contract = functools.partial(check_contract, ROLE_NAME, host=HOST)


def read_node(root, **overrides):
    """``(facts, settings)`` read from the tree at ``root`` as the node does: arguments and facts through JSON."""
    wanted = settings(fabric_sysfs_root=str(root), **overrides)
    ops = FakeOps()
    facts = node_fabric.read(json.loads(json.dumps(fabric.read_args(wanted, NODE))), ops)
    assert ops.calls == []
    return json.loads(json.dumps(facts)), wanted


def probe_node(root, wanted):
    ops = FakeOps()
    result = fabric_probe.probe(json.loads(json.dumps(fabric.probe_args(wanted, NODE, {}))), ops)
    assert ops.calls == []
    return json.loads(json.dumps(result))


def audit(root, probe=True, cluster=None, **overrides):
    """The checks of a node read (and probed again, unchanged, when ``probe``) from the tree at ``root``."""
    facts, wanted = read_node(root, **overrides)
    checks = fabric.decide(HOST, facts, wanted, probe=probe_node(root, wanted) if probe else None, cluster=cluster)
    assert_contract(checks)
    return checks


# --- the reader and the probe --------------------------------------------------------------------------


def test_read_gives_every_port_with_its_state_rate_and_counters(tmp_path):
    make_tree(tmp_path, down=("mlx5_5",))
    facts, wanted = read_node(tmp_path)
    assert facts["present"] is True and facts["error"] is None and facts["read_at"] > 0
    assert sorted(facts["devices"]) == ["mlx5_%d" % index for index in range(8)]
    device = facts["devices"]["mlx5_3"]
    assert device["kind"] == "infiniband" and device["driver"] == "mlx5_core" and device["pci"] == "0000:5e:00.0"
    port = device["ports"][0]
    assert (port["port"], port["state"], port["phys_state"], port["rate"], port["rate_gbps"], port["link_layer"]) == (
        1, "ACTIVE", "LinkUp", NDR, 400.0, "InfiniBand")
    wanted_names = set(wanted["fabric_error_counters"] + wanted["fabric_warn_counters"])
    assert set(port["counters"]) == wanted_names and port["counter_errors"] == {}
    assert port["counters"]["symbol_error"] == 3 and port["counters"]["out_of_buffer"] == 0
    assert facts["devices"]["mlx5_5"]["ports"][0]["state"] == "DOWN"


def test_read_args_split_port_counters_from_driver_counters():
    args = fabric.read_args(settings(), NODE)
    assert "symbol_error" in args["counters"] and "port_xmit_discards" in args["counters"]
    assert args["hw_counters"] == ["out_of_buffer", "local_ack_timeout_err", "rnr_nak_retry_err"]


def test_read_without_infiniband_class_is_not_present(tmp_path):
    facts, _wanted = read_node(tmp_path)
    assert facts["present"] is False and facts["devices"] == {} and facts["error"] is None


def test_an_unreadable_counter_is_a_fact_not_an_exception(tmp_path):
    make_tree(tmp_path)
    break_counter(tmp_path, "mlx5_2", 1, "symbol_error")
    break_counter(tmp_path, "mlx5_2", 1, "out_of_buffer")
    facts, wanted = read_node(tmp_path)
    port = facts["devices"]["mlx5_2"]["ports"][0]
    assert "symbol_error" not in port["counters"] and "out_of_buffer" not in port["counters"]
    assert "symbol_error" in port["counter_errors"]["symbol_error"]
    assert "Is a directory" in port["counter_errors"]["out_of_buffer"]
    probe = probe_node(tmp_path, wanted)
    assert "symbol_error" in probe["devices"]["mlx5_2"]["ports"][0]["counter_errors"]
    checks = fabric.decide(HOST, facts, wanted, probe=probe)
    assert_contract(checks)
    assert checks["counters"]["status"] == "pass"
    assert any("mlx5_2 port 1" in text and "symbol_error" in text for text in checks["counters"]["details"]["unread"])


def test_probe_reads_the_same_counters_with_the_readers_function(tmp_path):
    make_tree(tmp_path)
    facts, wanted = read_node(tmp_path)
    probe = probe_node(tmp_path, wanted)
    assert fabric_probe.read_counters is node_fabric.read_counters
    assert sorted(probe["devices"]) == sorted(facts["devices"])
    assert probe["devices"]["mlx5_0"]["ports"][0]["counters"] == facts["devices"]["mlx5_0"]["ports"][0]["counters"]
    assert probe["read_at"] >= facts["read_at"]


def test_reading_eight_ports_and_every_counter_is_fast(tmp_path):
    make_tree(tmp_path)
    started = time.perf_counter()
    facts = node_fabric.read({"sysfs_root": str(tmp_path), "counters": None, "hw_counters": None}, FakeOps())
    probe = fabric_probe.probe({"sysfs_root": str(tmp_path), "counters": None, "hw_counters": None}, FakeOps())
    took = time.perf_counter() - started
    port = facts["devices"]["mlx5_7"]["ports"][0]
    assert len(port["counters"]) == len(PORT_COUNTERS) + len(HW_COUNTERS)
    assert len(probe["devices"]["mlx5_7"]["ports"][0]["counters"]) == len(port["counters"])
    assert took < 0.5, took


# --- decide: ports and rate --------------------------------------------------------------------------------


def test_healthy_eight_ports_pass(tmp_path):
    make_tree(tmp_path)
    checks = audit(tmp_path, fabric_expected_ports=8)
    # InfiniBand without GPUs on this bus and without EFA: the RoCE, GPUDirect and plugin checks do not apply.
    assert {name: check["status"] for name, check in checks.items()} == {
        "ports": "pass", "rate": "pass", "counters": "pass", "roce_gid": "not_applicable",
        "peer_memory": "not_applicable", "pcie_acs": "not_applicable", "net_plugin": "not_applicable"}
    assert "8 RDMA ports ACTIVE / LinkUp on gpu-node-03" in checks["ports"]["found"]
    assert "InfiniBand MT4129 400 Gb/sec (4X NDR)" in checks["rate"]["found"]
    assert checks["counters"]["details"]["error_counters_before"]["mlx5_0 port 1 (0000:18:00.0)"]["symbol_error"] == 3


def test_a_port_down_fails_naming_it(tmp_path):
    make_tree(tmp_path, down=("mlx5_3",))
    check = audit(tmp_path)["ports"]
    assert check["status"] == "fail"
    assert "mlx5_3 port 1 (0000:5e:00.0): state DOWN, phys_state Polling" in check["found"]
    assert "mlx5_2" not in check["found"] and "ibstat mlx5_3 1" in check["fix"] and "ibportstate" in check["fix"]


def test_a_port_in_init_says_no_subnet_manager(tmp_path):
    make_tree(tmp_path, states={"mlx5_6": ("2: INIT", "5: LinkUp")})
    check = audit(tmp_path)["ports"]
    assert check["status"] == "fail" and "mlx5_6 port 1" in check["found"]
    assert "no subnet manager" in check["found"] and "sminfo" in check["fix"]


def test_fewer_active_ports_than_expected_fail(tmp_path):
    make_tree(tmp_path, ports=4)
    check = audit(tmp_path, fabric_expected_ports=8)["ports"]
    assert check["status"] == "fail" and "4 active RDMA ports on gpu-node-03, fabric_expected_ports is 8" in check[
        "found"]


def test_a_slow_port_fails_against_the_floor(tmp_path):
    make_tree(tmp_path, slow={"mlx5_4": HDR})
    check = audit(tmp_path, fabric_expected_rate_gbps=400)["rate"]
    assert check["status"] == "fail"
    assert "mlx5_4 port 1 (0000:9a:00.0): 400 Gb/sec expected, %s found" % HDR in check["found"]
    assert "mlxlink -d mlx5_4 -p 1" in check["fix"] and "trained down" in check["fix"]


def test_a_slow_port_fails_against_the_majority_of_its_own_ports(tmp_path):
    make_tree(tmp_path, slow={"mlx5_4": HDR})
    check = audit(tmp_path)["rate"]
    assert check["status"] == "fail" and "mlx5_4 port 1" in check["found"] and "most common rate" in check["found"]
    assert "mlx5_3" not in check["found"]


def test_the_cluster_majority_decides_for_a_node_whose_ports_all_trained_down(tmp_path):
    good = tmp_path / "good"
    make_tree(good)
    good_facts, _ = read_node(good)
    make_tree(tmp_path / "slow", rate=HDR)
    facts, wanted = read_node(tmp_path / "slow")
    cluster = {"facts": {"gpu-node-01": good_facts, "gpu-node-02": good_facts, HOST: facts},
               "settings": {"gpu-node-01": wanted, "gpu-node-02": wanted, HOST: wanted}}
    checks = fabric.decide(HOST, facts, wanted, probe=None, cluster=cluster)
    assert_contract(checks)
    assert checks["rate"]["status"] == "fail" and checks["rate"]["found"].count(HDR + " found") == 8
    assert fabric.decide("gpu-node-01", good_facts, wanted, cluster=cluster)["rate"]["status"] == "pass"


def test_no_majority_passes_listing_the_rates(tmp_path):
    make_tree(tmp_path, ports=2, slow={"mlx5_1": HDR})
    check = audit(tmp_path)["rate"]
    assert check["status"] == "pass" and "no most common rate" in check["found"]
    assert check["details"]["rates"] == ["InfiniBand MT4129 " + HDR, "InfiniBand MT4129 " + NDR]


def test_roce_ports_have_their_own_majority_and_can_be_left_out(tmp_path):
    make_tree(tmp_path, slow={"mlx5_7": "100 Gb/sec (4X EDR)"}, link_layer={"mlx5_7": "Ethernet"})
    assert audit(tmp_path)["rate"]["status"] == "pass"
    make_tree(tmp_path / "down", down=("mlx5_7",), link_layer={"mlx5_7": "Ethernet"})
    assert audit(tmp_path / "down")["ports"]["status"] == "fail"
    assert audit(tmp_path / "down", fabric_check_ethernet=False)["ports"]["status"] == "pass"


def test_an_ignored_device_is_left_out(tmp_path):
    make_tree(tmp_path, down=("mlx5_7",), slow={"mlx5_7": HDR})
    checks = audit(tmp_path, fabric_ignore_devices=["mlx5_7"], fabric_expected_rate_gbps=400)
    assert checks["ports"]["status"] == "pass" and checks["rate"]["status"] == "pass"
    assert "mlx5_7" not in json.dumps(checks)


def test_no_rdma_device_is_not_applicable(tmp_path):
    checks = audit(tmp_path)
    assert {check["status"] for check in checks.values()} == {"not_applicable"}
    assert "no RDMA device in %s/class/infiniband on %s" % (tmp_path, HOST) in checks["ports"]["found"]
    assert audit(tmp_path, fabric_expected_ports=8)["ports"]["status"] == "fail"


# --- decide: counters --------------------------------------------------------------------------------------


def moved(tmp_path, changes, **overrides):
    """Read, move the counters ``changes`` ([(device, counter, by)]), probe, decide."""
    make_tree(tmp_path)
    facts, wanted = read_node(tmp_path, **overrides)
    for device, counter, by in changes:
        bump(tmp_path, device, 1, counter, by)
    checks = fabric.decide(HOST, facts, wanted, probe=probe_node(tmp_path, wanted))
    assert_contract(checks)
    return checks["counters"]


def test_an_error_counter_that_climbs_during_the_gate_fails_with_the_numbers(tmp_path):
    check = moved(tmp_path, [("mlx5_1", "symbol_error", 37), ("mlx5_5", "link_downed", 1)])
    assert check["status"] == "fail"
    assert "mlx5_1 port 1 (0000:40:00.0): symbol_error 3 -> 40 (+37 in " in check["found"]
    assert "mlx5_5 port 1 (0000:c0:00.0): link_downed 0 -> 1 (+1 in " in check["found"]
    assert "mlxlink -d mlx5_1 -p 1, mlxlink -d mlx5_5 -p 1" in check["fix"] and check["details"]["seconds"] >= 0


def test_a_warn_counter_that_climbs_warns(tmp_path):
    check = moved(tmp_path, [("mlx5_2", "out_of_buffer", 12), ("mlx5_2", "port_xmit_discards", 4)])
    assert check["status"] == "warn"
    assert "mlx5_2 port 1 (0000:4f:00.0): out_of_buffer 0 -> 12 (+12" in check["found"]
    assert "port_xmit_discards 0 -> 4 (+4" in check["found"]


def test_the_threshold_lets_small_increases_pass(tmp_path):
    assert moved(tmp_path, [("mlx5_1", "symbol_error", 5)], fabric_counter_threshold=5)["status"] == "pass"


def test_a_counter_that_went_down_warns_that_it_was_reset(tmp_path):
    check = moved(tmp_path, [("mlx5_0", "symbol_error", -3)])
    assert check["status"] == "warn"
    assert "counters were reset during the run, cannot tell" in check["found"]
    assert "mlx5_0 port 1 (0000:18:00.0): symbol_error 3 -> 0" in check["found"]


def test_traffic_counters_and_old_errors_are_no_finding(tmp_path):
    check = moved(tmp_path, [("mlx5_0", "port_xmit_data", 10 ** 9), ("mlx5_0", "port_xmit_wait", 500)])
    assert check["status"] == "pass"


def test_without_the_after_gate_read_the_counters_are_skipped_never_passed(tmp_path):
    make_tree(tmp_path)
    check = audit(tmp_path, probe=False)["counters"]
    assert check["status"] == "skipped"
    assert "the after-gate read did not run on this node" in check["found"] and HOST in check["found"]


# --- switched off, settings, role, profile -------------------------------------------------------------------


@pytest.mark.parametrize("case, facts, overrides, expected", switched_off_cases(ROLE_NAME, HOST))
def test_switched_off(case, facts, overrides, expected):
    checks = fabric.decide(HOST, facts, settings(**overrides))
    assert_contract(checks)
    assert {name: check["status"] for name, check in checks.items()} == {"enabled": "skipped"}, case
    assert expected["enabled"][1] in checks["enabled"]["found"]
    assert fabric.read_args(settings(**overrides), NODE) is None
    assert fabric.probe_args(settings(**overrides), NODE, {}) is None


def test_no_facts_fails():
    checks = fabric.decide(HOST, {}, settings())
    assert checks["no_facts"]["status"] == "fail"


def test_settings_validate():
    assert fabric.validate(settings()) == []
    assert fabric.validate(typed_settings(ROLE_NAME, fabric_expected_rate_gbps="400")) == []
    assert_one_problem(fabric.validate(settings(fabric_expected_rate_gbps=-1)), "fabric_expected_rate_gbps", "-1")
    assert_one_problem(fabric.validate(settings(fabric_counter_threshold=True)), "fabric_counter_threshold", "True")
    assert_one_problem(fabric.validate(settings(fabric_error_counters=["counters/symbol_error"])),
                       "fabric_error_counters", "counters/symbol_error")
    assert_one_problem(fabric.validate(settings(fabric_warn_counters=["symbol_error"])),
                       "fabric_warn_counters", "symbol_error")
    assert_one_problem(fabric.validate(settings(fabric_sysfs_root="sys")), "fabric_sysfs_root", "sys")
    assert_one_problem(fabric.validate(settings(fabric_ignore_devices="mlx5_4")), "fabric_ignore_devices", "mlx5_4")


def test_defaults_are_mirrored_by_the_argument_specs():
    options = role_yaml(ROLE_NAME, "meta", "argument_specs.yml")["argument_specs"]["main"]["options"]
    defaults = role_yaml(ROLE_NAME, "defaults", "main.yml")
    assert sorted(options) == sorted(defaults)
    assert all(name.startswith("fabric_") and options[name].get("type") and options[name].get("description")
               for name in options)


def test_profile_fields(tmp_path):
    make_tree(tmp_path, down=("mlx5_0",), slow={"mlx5_1": HDR}, link_layer={"mlx5_7": "Ethernet"})
    facts, _wanted = read_node(tmp_path)
    assert fabric.profile_fields(facts) == {"rdma.active_ports": 7, "rdma.rate_gbps": 200.0,
                                            "rdma.link_layer": "Ethernet,InfiniBand", "rdma.devices": 8}
    assert set(fabric.profile_fields(None).values()) == {None}


def test_the_cluster_rate_reference_is_computed_once_per_view(tmp_path):
    make_tree(tmp_path)
    facts, wanted = read_node(tmp_path)
    hosts = ["gpu-node-%03d" % index for index in range(400)]
    cluster = {"facts": {host: facts for host in hosts}, "settings": {host: wanted for host in hosts}}
    started = time.perf_counter()
    statuses = {fabric.decide(host, facts, wanted, cluster=cluster)["rate"]["status"] for host in hosts}
    assert statuses == {"pass"}
    assert time.perf_counter() - started < 2.0


# --- what real machines show: odd physical states, mixed adapters, saturated or missing counters ------------


def test_an_active_port_whose_physical_state_the_kernel_does_not_name_passes_saying_so(tmp_path):
    make_tree(tmp_path, ports=2, states={"mlx5_0": ("4: ACTIVE", "0: <unknown>")})
    check = audit(tmp_path)["ports"]
    assert check["status"] == "pass"
    assert "1 RDMA ports ACTIVE / LinkUp" in check["found"]
    assert "1 ACTIVE whose physical state the kernel does not name (mlx5_0 port 1 (0000:18:00.0): '<unknown>')" in \
        check["found"]
    make_tree(tmp_path / "polling", ports=2, states={"mlx5_0": ("4: ACTIVE", "2: Polling")})
    assert audit(tmp_path / "polling")["ports"]["status"] == "fail"


CX6DX = ("MT4125", "MT_0000000528")
IWARP = ("I40IW", "I40IW Board ID")


def test_mixed_adapters_are_each_compared_with_their_own_kind(tmp_path):
    # Eight NDR ports, two 100 Gb/s Ethernet ports of another adapter and a 10 Gb/s iWARP port, all as built.
    make_tree(tmp_path, ports=8, slow={"mlx5_6": "100 Gb/sec (2X HDR)", "mlx5_7": "100 Gb/sec (2X HDR)",
                                       "mlx5_5": "10 Gb/sec (4X)"},
              link_layer={"mlx5_6": "Ethernet", "mlx5_7": "Ethernet"},
              adapters={"mlx5_6": CX6DX, "mlx5_7": CX6DX, "mlx5_5": IWARP})
    check = audit(tmp_path)["rate"]
    assert check["status"] == "pass", check
    assert "Ethernet MT4125 100 Gb/sec (2X HDR)" in check["found"] and "InfiniBand I40IW 10 Gb/sec (4X)" in \
        check["found"]
    # One NDR port trained down still fails against the other ports of its kind.
    make_tree(tmp_path / "slow", ports=8, slow={"mlx5_6": "100 Gb/sec (2X HDR)", "mlx5_7": "100 Gb/sec (2X HDR)",
                                                "mlx5_2": HDR},
              link_layer={"mlx5_6": "Ethernet", "mlx5_7": "Ethernet"}, adapters={"mlx5_6": CX6DX, "mlx5_7": CX6DX})
    check = audit(tmp_path / "slow")["rate"]
    assert check["status"] == "fail" and "mlx5_2 port 1" in check["found"]
    assert "the most common rate of the cluster's InfiniBand MT4129 ports" in check["found"]
    assert "mlx5_6" not in check["found"]


def test_a_mixed_adapter_node_among_uniform_ones_passes(tmp_path):
    make_tree(tmp_path / "uniform")
    uniform, wanted = read_node(tmp_path / "uniform")
    make_tree(tmp_path / "mixed", slow={"mlx5_7": "100 Gb/sec (2X HDR)"}, link_layer={"mlx5_7": "InfiniBand"},
              adapters={"mlx5_7": CX6DX})
    mixed, _ = read_node(tmp_path / "mixed")
    cluster = {"facts": {"gpu-node-01": uniform, "gpu-node-02": uniform, HOST: mixed},
               "settings": {"gpu-node-01": wanted, "gpu-node-02": wanted, HOST: wanted}}
    assert fabric.decide(HOST, mixed, wanted, cluster=cluster)["rate"]["status"] == "pass"


@pytest.mark.parametrize("counter, value, bits", [("link_downed", 255, 8), ("symbol_error", 65535, 16),
                                                  ("local_link_integrity_errors", 15, 4),
                                                  ("out_of_buffer", 4294967295, 32)])
def test_a_counter_at_the_maximum_of_its_width_warns(tmp_path, counter, value, bits):
    make_tree(tmp_path, ports=2)
    bump(tmp_path, "mlx5_1", 1, counter, value - (3 if counter == "symbol_error" else 0))  # symbol_error starts at 3
    check = audit(tmp_path)["counters"]
    assert check["status"] == "warn", check
    assert "mlx5_1 port 1 (0000:40:00.0): %s is %d, the maximum of its %d bits" % (counter, value, bits) in \
        check["found"]
    assert "perfquery -R" in check["fix"]


def test_counters_an_adapter_does_not_provide_are_named_never_judged(tmp_path):
    import shutil  # pylint: disable=import-outside-toplevel
    make_tree(tmp_path, ports=2)
    for directory in ("counters", "hw_counters"):
        for name in (PORT_COUNTERS if directory == "counters" else HW_COUNTERS):
            path = tmp_path / "class" / "infiniband" / "mlx5_1" / "ports" / "1" / directory / name
            path.write_text("N/A (no PMA)\n")
    check = audit(tmp_path)["counters"]
    assert check["status"] == "pass"
    assert "of 1 ports compared" in check["found"] and "no counters, not judged: mlx5_1 port 1" in check["found"]
    assert "N/A (no PMA)" in check["found"]
    for name in ("mlx5_0", "mlx5_1"):
        for directory in ("counters", "hw_counters"):
            shutil.rmtree(str(tmp_path / "class" / "infiniband" / name / "ports" / "1" / directory))
    check = audit(tmp_path)["counters"]
    assert check["status"] == "not_applicable" and "no RDMA port of %s provides counters" % HOST in check["found"]
    assert "no counters in sysfs" in check["found"]


def test_the_adapter_type_is_read_with_the_ports(tmp_path):
    make_tree(tmp_path, ports=2, adapters={"mlx5_1": CX6DX})
    facts, _ = read_node(tmp_path)
    assert (facts["devices"]["mlx5_0"]["hca_type"], facts["devices"]["mlx5_1"]["hca_type"]) == ("MT4129", "MT4125")
    assert facts["devices"]["mlx5_1"]["board_id"] == "MT_0000000528"
    assert facts["devices"]["mlx5_0"]["ports"][0]["counters_present"] is True
