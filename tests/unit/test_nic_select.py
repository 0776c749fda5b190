"""Interface selection across nodes (module_utils/preflight_nic.select_interface), the decision
behind the nic_discovery capability's plan."""

import pytest

from cluster_preflight.capabilities.nic_discovery import nic_select as pn


def nic(name, cls, ipv4=(), up=True, carrier=True, mtu=1500, speed=10000, rdma=(), default_route=False):
    return {"name": name, "class": cls, "ipv4": list(ipv4), "ipv6": [], "is_up": up,
            "operstate": "up" if up else "down", "carrier": carrier, "mtu": mtu, "speed_mbps": speed,
            "rdma": list(rdma), "default_route": default_route}


def node(i, *nics):
    """A node with lo plus ``nics``; i numbers its addresses."""
    result = {"lo": nic("lo", "loopback", ["127.0.0.1/8"], speed=None, mtu=65536)}
    result.update({n["name"]: n for n in nics})
    return result


def gpu_node(i, ib=True, ib_name="ib0", ib_mtu=2044, ib_up=True, eth_mtu=1500):
    nics = [nic("eth0", "ethernet", ["198.18.0.%d/24" % i], mtu=eth_mtu, default_route=True),
            nic("docker0", "bridge", ["198.18.254.1/24"])]
    if ib:
        nics.append(nic(ib_name, "infiniband", ["198.19.1.%d/24" % i], up=ib_up, mtu=ib_mtu, speed=200000,
                        rdma=[{"device": "mlx5_0", "port": 1, "state": "ACTIVE", "rate": "200 Gb/sec (4X HDR)",
                               "link_layer": "InfiniBand"}]))
    return node(i, *nics)


def assert_well_formed(decision):
    """Every fail/warn names its node and carries a fix."""
    for host, checks in decision["checks"].items():
        assert set(checks) == {"common_interface", "override", "fabric_consistency",
                               "mtu_consistency", "link"}
        for name, result in checks.items():
            assert result["status"] in ("pass", "not_applicable", "skipped", "warn", "fail"), name
            if result["status"] in ("fail", "warn"):
                assert result["fix"], (host, name)
                assert host in result["found"], (host, name, result["found"])


def statuses(decision, check):
    return {host: checks[check]["status"] for host, checks in decision["checks"].items()}


def test_picks_infiniband_over_ethernet():
    decision = pn.select_interface({"n1": gpu_node(1), "n2": gpu_node(2)}, master="n1")
    assert decision["ifname"] == "ib0"
    assert decision["nccl_socket_ifname"] == "=ib0"
    assert decision["gloo_socket_ifname"] == "ib0"
    assert decision["addr_by_host"] == {"n1": "198.19.1.1", "n2": "198.19.1.2"}
    assert decision["master_addr"] == "198.19.1.1"
    assert decision["reason"].startswith("ib0: infiniband on all 2 nodes")
    ranked = [c["ifname"] for c in decision["candidates"] if c["eligible"]]
    assert ranked == ["ib0", "eth0"]
    assert set(statuses(decision, "common_interface").values()) == {"pass"}
    assert set(statuses(decision, "link").values()) == {"pass"}
    assert set(statuses(decision, "fabric_consistency").values()) == {"pass"}
    assert set(statuses(decision, "override").values()) == {"not_applicable"}
    assert_well_formed(decision)


def test_master_defaults_to_first_host_and_unknown_master_is_rejected():
    decision = pn.select_interface({"n2": gpu_node(2), "n1": gpu_node(1)})
    assert decision["master"] == "n2" and decision["master_addr"] == "198.19.1.2"
    with pytest.raises(ValueError, match="n9"):
        pn.select_interface({"n1": gpu_node(1)}, master="n9")


def bed_node(i, eth1_down=False):
    """Like the namespace test bed: every NIC is a veth, plus a docker0 bridge."""
    nics = [nic("eth0", "veth", ["198.18.8.%d/24" % i]),
            nic("fab0", "veth", ["198.19.8.%d/24" % i]),
            nic("docker0", "bridge", ["198.18.254.1/24"]),
            nic("vethdocker0", "veth", [])]
    if eth1_down:
        nics.append(nic("eth1", "veth", ["198.18.253.%d/24" % i], up=False, carrier=None))
    return node(i, *nics)


def test_bed_layout_picks_a_veth_and_not_the_management_one():
    nodes = {"n1": bed_node(1, eth1_down=True), "n2": bed_node(2), "n3": bed_node(3)}
    decision = pn.select_interface(nodes, master="n1")
    assert decision["ifname"] == "fab0"
    assert decision["master_addr"] == "198.19.8.1"
    by_name = {c["ifname"]: c for c in decision["candidates"]}
    assert by_name["eth0"]["eligible"] and by_name["eth0"]["management"]
    assert by_name["eth0"]["rank"] == 2
    assert not by_name["docker0"]["eligible"]
    assert not by_name["vethdocker0"]["eligible"] and "no usable IPv4" in by_name["vethdocker0"]["why"]
    assert "DOWN on n1" in by_name["eth1"]["why"] and "missing on n2, n3" in by_name["eth1"]["why"]
    assert_well_formed(decision)


def test_bed_with_only_the_veth_uses_it():
    nodes = {h: node(i, nic("eth0", "veth", ["198.18.8.%d/24" % i]), nic("docker0", "bridge", ["198.18.254.1/24"]))
             for i, h in enumerate(("n1", "n2"), 1)}
    decision = pn.select_interface(nodes, master="n2")
    assert decision["ifname"] == "eth0" and decision["master_addr"] == "198.18.8.2"


def test_real_ethernet_beats_veth():
    nodes = {h: node(i, nic("veth0", "veth", ["198.18.8.%d/24" % i], speed=10000),
                     nic("eno1", "ethernet", ["198.18.9.%d/24" % i], speed=1000))
             for i, h in enumerate(("n1", "n2"), 1)}
    assert pn.select_interface(nodes)["ifname"] == "eno1"


def test_docker0_is_never_chosen_without_override():
    nodes = {h: node(i, nic("docker0", "bridge", ["198.18.254.1/24"]), nic("cni0", "container", ["198.18.250.1/24"]))
             for i, h in enumerate(("n1", "n2"), 1)}
    decision = pn.select_interface(nodes)
    assert decision["ifname"] is None and decision["nccl_socket_ifname"] is None
    assert decision["master_addr"] is None
    assert statuses(decision, "common_interface") == {"n1": "fail", "n2": "fail"}
    assert statuses(decision, "link") == {"n1": "skipped", "n2": "skipped"}
    assert "docker0" in decision["checks"]["n1"]["common_interface"]["found"]
    assert_well_formed(decision)
    forced = pn.select_interface(nodes, override="docker0")
    assert forced["ifname"] == "docker0" and forced["nccl_socket_ifname"] == "=docker0"
    assert set(statuses(forced, "override").values()) == {"pass"}


def test_down_and_addressless_interfaces_are_skipped():
    nodes = {"n1": gpu_node(1), "n2": gpu_node(2, ib_up=False)}
    decision = pn.select_interface(nodes)
    assert decision["ifname"] == "eth0"
    ib0 = [c for c in decision["candidates"] if c["ifname"] == "ib0"][0]
    assert not ib0["eligible"] and "DOWN on n2" in ib0["why"]
    nodes["n2"]["ib0"] = nic("ib0", "infiniband", [], speed=200000)
    decision = pn.select_interface(nodes)
    assert decision["ifname"] == "eth0"
    ib0 = [c for c in decision["candidates"] if c["ifname"] == "ib0"][0]
    assert "no usable IPv4 address on n2" in ib0["why"]


def test_link_local_and_no_carrier_do_not_count():
    nodes = {"n1": gpu_node(1), "n2": gpu_node(2)}
    nodes["n2"]["ib0"]["ipv4"] = ["169.254.3.2/16"]
    assert pn.select_interface(nodes)["ifname"] == "eth0"
    nodes["n2"]["ib0"]["ipv4"] = ["198.19.1.2/24"]
    nodes["n2"]["ib0"]["carrier"] = False
    decision = pn.select_interface(nodes)
    assert decision["ifname"] == "eth0"
    assert "no carrier on n2" in [c for c in decision["candidates"] if c["ifname"] == "ib0"][0]["why"]


@pytest.mark.parametrize("reachability", [
    {"ib0": {"n1->n2": False}},          # nested under the interface
    {"n1->198.19.1.2": False},           # flat, destination is ib0's address
    {("n1", "198.19.1.2"): False},       # tuple key (Python callers)
])
def test_isolated_interface_is_skipped(reachability):
    nodes = {"n1": gpu_node(1), "n2": gpu_node(2)}
    decision = pn.select_interface(nodes, reachability=reachability)
    assert decision["ifname"] == "eth0"
    ib0 = [c for c in decision["candidates"] if c["ifname"] == "ib0"][0]
    assert "isolated" in ib0["why"] and "n1 ->" in ib0["why"]


def test_reachability_of_another_interface_or_success_does_not_exclude():
    nodes = {"n1": gpu_node(1), "n2": gpu_node(2)}
    assert pn.select_interface(nodes, reachability={"n1->198.18.0.2": False})["ifname"] == "ib0"
    assert pn.select_interface(nodes, reachability={"ib0": {"n1->n2": True}})["ifname"] == "ib0"
    # A node unreachable as a whole leaves nothing usable.
    decision = pn.select_interface(nodes, reachability={"n1->n2": False})
    assert decision["ifname"] is None
    with pytest.raises(ValueError):
        pn.select_interface(nodes, reachability={"n1 to n2": False})


def test_override_missing_on_one_node_fails_naming_it():
    nodes = {"n1": gpu_node(1), "n2": gpu_node(2, ib=False), "n3": gpu_node(3)}
    decision = pn.select_interface(nodes, override="ib0", master="n1")
    assert decision["ifname"] == "ib0" and decision["nccl_socket_ifname"] == "=ib0"
    assert statuses(decision, "override") == {"n1": "pass", "n2": "fail", "n3": "pass"}
    found = decision["checks"]["n2"]["override"]["found"]
    assert "n2" in found and "ib0 does not exist" in found
    assert "ib0" in decision["checks"]["n2"]["override"]["fix"]
    assert set(statuses(decision, "common_interface").values()) == {"skipped"}
    assert decision["checks"]["n2"]["link"]["status"] == "skipped"
    assert decision["addr_by_host"] == {"n1": "198.19.1.1", "n3": "198.19.1.3"}
    assert "not usable on n2" in decision["reason"]
    assert_well_formed(decision)


def test_override_down_fails_override_and_link():
    nodes = {"n1": gpu_node(1), "n2": gpu_node(2, ib_up=False)}
    decision = pn.select_interface(nodes, override=["ib0"])
    assert statuses(decision, "override") == {"n1": "pass", "n2": "fail"}
    assert "DOWN" in decision["checks"]["n2"]["override"]["found"]
    assert statuses(decision, "link") == {"n1": "pass", "n2": "fail"}
    assert_well_formed(decision)


def test_override_list_sets_both_variables():
    nodes = {h: node(i, nic("ib0", "infiniband", ["198.19.1.%d/24" % i]), nic("ib1", "infiniband", ["198.19.2.%d/24" % i]))
             for i, h in enumerate(("n1", "n2"), 1)}
    decision = pn.select_interface(nodes, override="ib0, ib1")
    assert decision["ifnames"] == ["ib0", "ib1"]
    assert decision["nccl_socket_ifname"] == "=ib0,ib1"
    assert decision["gloo_socket_ifname"] == "ib0,ib1"
    assert decision["master_addr"] == "198.19.1.1"


def test_mtu_mismatch_fails_naming_nodes_and_mtus():
    nodes = {"n1": gpu_node(1), "n2": gpu_node(2, ib_mtu=4092), "n3": gpu_node(3)}
    decision = pn.select_interface(nodes)
    assert decision["ifname"] == "ib0"
    assert statuses(decision, "mtu_consistency") == {"n1": "pass", "n2": "fail", "n3": "pass"}
    found = decision["checks"]["n2"]["mtu_consistency"]["found"]
    assert "MTU 4092" in found and "n1 2044" in found and "n3 2044" in found
    assert "2044" in decision["checks"]["n2"]["mtu_consistency"]["fix"]
    assert_well_formed(decision)
    # Two nodes, two values: no majority, both are named.
    tie = pn.select_interface({"n1": gpu_node(1), "n2": gpu_node(2, ib_mtu=4092)})
    assert statuses(tie, "mtu_consistency") == {"n1": "fail", "n2": "fail"}


def test_ib_on_some_nodes_only_is_a_finding():
    nodes = {"n1": gpu_node(1), "n2": gpu_node(2, ib=False), "n3": gpu_node(3)}
    decision = pn.select_interface(nodes)
    assert decision["ifname"] == "eth0"
    assert statuses(decision, "fabric_consistency") == {"n1": "pass", "n2": "fail", "n3": "pass"}
    found = decision["checks"]["n2"]["fabric_consistency"]["found"]
    assert "InfiniBand on some nodes only" in found and "n1, n3 has InfiniBand" in found
    assert "missing on n2" in decision["checks"]["n1"]["fabric_consistency"]["found"]
    assert_well_formed(decision)
    soft = pn.select_interface(nodes, fabric_mismatch="warn")
    assert soft["checks"]["n2"]["fabric_consistency"]["status"] == "warn"


def test_efa_without_netdev_counts_through_rdma_facts():
    nodes = {h: node(i, nic("ens32", "ethernet", ["198.18.0.%d/24" % i], speed=None))
             for i, h in enumerate(("n1", "n2"), 1)}
    efa = {"rdmap0s7": {"name": "rdmap0s7", "kind": "efa", "ports": [{"port": 1, "state": "ACTIVE"}]}}
    decision = pn.select_interface(nodes, rdma_by_host={"n1": efa, "n2": {}})
    assert decision["ifname"] == "ens32"
    assert statuses(decision, "fabric_consistency") == {"n1": "pass", "n2": "fail"}
    assert "EFA" in decision["checks"]["n2"]["fabric_consistency"]["found"]
    same = pn.select_interface(nodes, rdma_by_host={"n1": efa, "n2": efa})
    assert set(statuses(same, "fabric_consistency").values()) == {"pass"}


def test_different_fabric_names_are_not_matched():
    nodes = {"n1": gpu_node(1, ib_name="ib0"), "n2": gpu_node(2, ib_name="ib1")}
    decision = pn.select_interface(nodes)
    assert decision["ifname"] == "eth0"
    assert statuses(decision, "fabric_consistency") == {"n1": "warn", "n2": "warn"}
    found = decision["checks"]["n1"]["fabric_consistency"]["found"]
    assert "n1: ib0" in found and "n2: ib1" in found
    assert_well_formed(decision)


def test_no_common_interface_fails_everywhere():
    nodes = {"n1": node(1, nic("ib0", "infiniband", ["198.19.1.1/24"])),
             "n2": node(2, nic("ib1", "infiniband", ["198.19.1.2/24"]))}
    decision = pn.select_interface(nodes)
    assert decision["ifname"] is None
    assert statuses(decision, "common_interface") == {"n1": "fail", "n2": "fail"}
    assert statuses(decision, "mtu_consistency") == {"n1": "skipped", "n2": "skipped"}
    found = decision["checks"]["n1"]["common_interface"]["found"]
    assert "ib0 not usable: missing on n2" in found and "ib1 not usable: missing on n1" in found
    assert decision["reason"].startswith("no interface is usable on every node")
    assert_well_formed(decision)


def test_faster_fabric_wins_and_slowest_node_counts():
    def n(i, ib1_speed):
        return node(i, nic("ib0", "infiniband", ["198.19.1.%d/24" % i], speed=100000),
                    nic("ib1", "infiniband", ["198.19.2.%d/24" % i], speed=ib1_speed))
    assert pn.select_interface({"n1": n(1, 200000), "n2": n(2, 200000)})["ifname"] == "ib1"
    decision = pn.select_interface({"n1": n(1, 200000), "n2": n(2, 50000)})
    assert decision["ifname"] == "ib0"
    assert [c for c in decision["candidates"] if c["ifname"] == "ib1"][0]["speed_mbps"] == 50000


def test_management_address_ranks_after_data_interface():
    nodes = {h: node(i, nic("ens1", "ethernet", ["198.18.1.%d/24" % i]), nic("ens2", "ethernet", ["198.18.2.%d/24" % i]))
             for i, h in enumerate(("n1", "n2"), 1)}
    assert pn.select_interface(nodes)["ifname"] == "ens1"
    decision = pn.select_interface(nodes, mgmt_addr_by_host={"n1": "198.18.1.1", "n2": "node2.example"})
    assert decision["ifname"] == "ens2"


def test_shared_subnet_preferred_and_used_for_addresses():
    nodes = {"n1": node(1, nic("ens1", "ethernet", ["198.18.1.1/24"]),
                        nic("ens2", "ethernet", ["198.18.5.1/24", "198.18.2.1/24"])),
             "n2": node(2, nic("ens1", "ethernet", ["198.18.3.2/24"]),
                        nic("ens2", "ethernet", ["198.18.2.2/24"]))}
    decision = pn.select_interface(nodes)
    assert decision["ifname"] == "ens2"
    assert decision["addr_by_host"] == {"n1": "198.18.2.1", "n2": "198.18.2.2"}
    ens1 = [c for c in decision["candidates"] if c["ifname"] == "ens1"][0]
    assert ens1["eligible"] and not ens1["same_subnet"] and "different subnets" in ens1["why"]


def test_rdma_port_not_active_fails_link():
    nodes = {"n1": gpu_node(1), "n2": gpu_node(2)}
    nodes["n2"]["ib0"]["rdma"][0]["state"] = "INIT"
    decision = pn.select_interface(nodes, override="ib0")
    assert statuses(decision, "link") == {"n1": "pass", "n2": "fail"}
    assert "INIT" in decision["checks"]["n2"]["link"]["found"]
    assert "subnet manager" in decision["checks"]["n2"]["link"]["fix"]


def test_failure_message_stays_short_on_a_node_with_many_pod_veths():
    pods = [nic("cali%04d" % k, "container", []) for k in range(40)]
    nodes = {"n1": node(1, nic("ens1", "ethernet", ["198.18.1.1/24"]), *pods),
             "n2": node(2, nic("ens2", "ethernet", ["198.18.1.2/24"]))}
    decision = pn.select_interface(nodes)
    found = decision["checks"]["n1"]["common_interface"]["found"]
    assert decision["ifname"] is None
    assert "... and 29 more" in found and "cali0039" not in found
    assert "ens1 not usable: missing on n2" in found
