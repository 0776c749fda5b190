"""nic_discovery: the reader classifies every interface class on fake sysfs/procfs trees; the plan
chooses the interface from every node's facts."""

import json
import os
import sys

import pytest

from preflight_node.net import interfaces as pn
from preflight_node.capabilities import nic_discovery as nd
from cluster_preflight.capabilities import nic_discovery as ndc
from fake_ops import LocalOps

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "nic"))
from fake_sysfs import FakeNode, _hex, cluster_node  # noqa: E402  pylint: disable=wrong-import-position


@pytest.fixture
def zoo(tmp_path):
    """One node holding an interface of every class the module knows."""
    node = FakeNode(tmp_path / "zoo")
    node.netdev("lo", link_type=772, flags=0x9, operstate="unknown", speed=None, mtu=65536,
                mac="00:00:00:00:00:00", ipv4=["127.0.0.1/8"], ipv6=["::1/128"])
    node.netdev("eno1", driver="ixgbe", pci="0000:18:00.0", speed="10000", mac="3c:fd:fe:00:00:01",
                ipv4=["198.18.0.11/24"], ipv6=["fe80::3efd:feff:fe00:1/64"], default_route=True)
    # IPoIB: ARPHRD_INFINIBAND, no speed attribute -> speed from the port rate.
    node.netdev("ib0", link_type=32, driver="mlx5_core", pci="0000:3b:00.0", speed=None, mtu=2044,
                ipv4=["198.19.1.11/24"])
    node.rdma("mlx5_0", "mlx5_core", "0000:3b:00.0",
              [{"port": 1, "rate": "200 Gb/sec (4X HDR)", "link_layer": "InfiniBand"}], netdevs=["ib0"])
    # RoCE: an RDMA device whose port is Ethernet, mapped through its GID table.
    node.netdev("ens1f0np0", driver="mlx5_core", pci="0000:5e:00.0", speed="100000", mtu=9000,
                ipv4=["198.19.2.11/24"])
    node.rdma("mlx5_2", "mlx5_core", "0000:5e:00.0",
              [{"port": 1, "link_layer": "Ethernet", "rate": "100 Gb/sec (4X EDR)",
                "ndevs": ["ens1f0np0", "ens1f0np0"]}])
    # AWS: the ENA netdev stays ethernet; the EFA RDMA device has no netdev.
    node.netdev("ens32", driver="ena", pci="0000:00:06.0", speed=None, ipv4=["198.19.3.11/24"])
    node.rdma("rdmap0s7", "efa", "0000:00:07.0", [{"port": 1, "link_layer": "Unspecified",
                                                    "rate": "100 Gb/sec (4X EDR)"}])
    node.netdev("efa0", driver="efa", pci="0000:00:08.0", speed=None)
    # Omni-Path: IPoIB over hfi1 (named ib*, like InfiniBand).
    node.netdev("ib1", link_type=32, driver="hfi1", pci="0000:af:00.0", speed=None, ipv4=["198.19.4.11/24"])
    node.rdma("hfi1_0", "hfi1", "0000:af:00.0", [{"port": 1}], netdevs=["ib1"])
    # Slingshot: hsn* on a Cassini (cxi) NIC.
    node.netdev("hsn0", driver="cxi_ss1", pci="0000:c1:00.0", speed="200000", mtu=9000,
                ipv4=["198.19.5.11/24"])
    node.netdev("docker0", bridge=True, devtype="bridge", flags=0x1003, operstate="up",
                ipv4=["198.18.254.1/24"])
    node.netdev("vethab12cd3", peer=True, brport=True, master="docker0", speed="10000")
    node.netdev("cali0a1b2c3", peer=True, speed="10000")
    node.netdev("flannel.1", devtype="vxlan", mtu=1450, speed=None, ipv4=["198.18.200.0/32"])
    node.netdev("tap0", tun_flags=0x1002, operstate="down", flags=0x1002, carrier=None, speed=None)
    node.netdev("bond0", bonding=True, mtu=9000, speed="50000", operstate="up")
    node.netdev("eth1", driver="e1000e", pci="0000:00:1f.6", operstate="down", flags=0x1002, carrier=None,
                speed="-1", ipv4=["198.18.9.11/24"])
    node.netdev("eth2", driver="virtio_net", pci="0000:00:03.0", via="virtio2", speed="-1",
                ipv4=["198.18.10.11/24"])
    node.finish()
    return node


def read(sysfs_root="/sys", proc_root="/proc", ops=None, **extra):
    args = {"sysfs_root": sysfs_root, "proc_root": proc_root, "addr_source": "auto", "ip_json_file": None}
    args.update(extra)
    return nd.read(args, ops or LocalOps())


def run_facts(node, **extra):
    return read(node.sys, node.proc, **extra)


EXPECTED_CLASSES = {
    "lo": "loopback",
    "eno1": "ethernet",
    "ib0": "infiniband",
    "ens1f0np0": "roce",
    "ens32": "ethernet",
    "efa0": "efa",
    "ib1": "opa",
    "hsn0": "slingshot",
    "docker0": "bridge",
    "vethab12cd3": "veth",
    "cali0a1b2c3": "container",
    "flannel.1": "container",
    "tap0": "virtual",
    "bond0": "ethernet",
    "eth1": "ethernet",
    "eth2": "ethernet",
}


def test_every_interface_is_classified(zoo):
    result = run_facts(zoo)
    nics = result["nics"]
    assert {name: nic["class"] for name, nic in nics.items()} == EXPECTED_CLASSES
    # The fake tree is not this machine: auto mode must not have run ip.
    assert result["addr_source"] == "proc"


def test_loopback_fields(zoo):
    lo = run_facts(zoo)["nics"]["lo"]
    assert lo["ipv4"] == ["127.0.0.1/8"]
    assert lo["ipv6"] == ["::1/128"]
    assert lo["is_up"] is True and lo["operstate"] == "unknown"
    assert lo["is_virtual"] is True and lo["driver"] is None
    assert lo["speed_mbps"] is None and lo["mtu"] == 65536


def test_physical_ethernet_fields(zoo):
    eno1 = run_facts(zoo)["nics"]["eno1"]
    assert eno1["driver"] == "ixgbe"
    assert eno1["pci"] == "0000:18:00.0"
    assert eno1["mac"] == "3c:fd:fe:00:00:01"
    assert eno1["speed_mbps"] == 10000 and eno1["speed_source"] == "sysfs"
    assert eno1["ipv4"] == ["198.18.0.11/24"]
    assert eno1["ipv6"] == ["fe80::3efd:feff:fe00:1/64"]
    assert eno1["is_up"] is True and eno1["carrier"] is True and eno1["is_virtual"] is False
    assert eno1["default_route"] is True
    assert eno1["rdma"] == []


def test_ipoib_maps_rdma_port_and_takes_speed_from_rate(zoo):
    result = run_facts(zoo)
    ib0 = result["nics"]["ib0"]
    assert ib0["type"] == 32 and ib0["driver"] == "mlx5_core"
    assert ib0["rdma"] == [{"device": "mlx5_0", "port": 1, "state": "ACTIVE", "phys_state": "LinkUp",
                            "rate": "200 Gb/sec (4X HDR)", "link_layer": "InfiniBand"}]
    assert ib0["speed_mbps"] == 200000 and ib0["speed_source"] == "rdma_rate"
    assert result["rdma_devices"]["mlx5_0"]["kind"] == "infiniband"
    assert result["rdma_devices"]["mlx5_0"]["netdevs"] == ["ib0"]


def test_roce_is_rdma_with_ethernet_link_layer(zoo):
    result = run_facts(zoo)
    roce = result["nics"]["ens1f0np0"]
    # The GID table lists the netdev twice (IPv4- and IPv6-based GIDs): one entry.
    assert [(r["device"], r["port"], r["link_layer"]) for r in roce["rdma"]] == [("mlx5_2", 1, "Ethernet")]
    assert roce["speed_mbps"] == 100000 and roce["speed_source"] == "sysfs"
    assert result["rdma_devices"]["mlx5_2"]["kind"] == "roce"
    assert result["rdma_devices"]["mlx5_2"]["ports"][0]["netdevs"] == ["ens1f0np0"]


def test_efa_device_without_netdev_is_reported_as_rdma(zoo):
    result = run_facts(zoo)
    efa = result["rdma_devices"]["rdmap0s7"]
    assert efa["kind"] == "efa" and efa["driver"] == "efa" and efa["netdevs"] == []
    assert result["rdma_devices"]["rdmap0s7"]["ports"][0]["rate_gbps"] == 100.0
    assert result["nics"]["efa0"]["driver"] == "efa"


def test_opa_and_slingshot(zoo):
    result = run_facts(zoo)
    assert result["rdma_devices"]["hfi1_0"]["kind"] == "opa"
    assert result["nics"]["ib1"]["rdma"][0]["device"] == "hfi1_0"
    assert result["nics"]["hsn0"]["driver"] == "cxi_ss1"
    assert result["nics"]["hsn0"]["speed_mbps"] == 200000


def test_bridge_and_veth_are_virtual(zoo):
    nics = run_facts(zoo)["nics"]
    assert nics["docker0"]["is_virtual"] is True and nics["docker0"]["kind"] == "bridge"
    assert nics["docker0"]["ipv4"] == ["198.18.254.1/24"]
    veth = nics["vethab12cd3"]
    assert veth["kind"] == "veth" and veth["driver"] == "veth" and veth["is_virtual"] is True
    assert veth["bridge_port"] is True and veth["master"] == "docker0"
    assert nics["tap0"]["kind"] == "tap"
    assert nics["flannel.1"]["kind"] == "vxlan"
    assert nics["bond0"]["kind"] == "bond" and nics["bond0"]["is_virtual"] is True


def test_down_interface(zoo):
    result = run_facts(zoo)
    eth1 = result["nics"]["eth1"]
    assert eth1["is_up"] is False and eth1["operstate"] == "down"
    assert eth1["carrier"] is None and eth1["speed_mbps"] is None
    # A down link has no connected route, so procfs cannot attribute its address.
    assert eth1["ipv4"] == []
    assert any("198.18.9.11" in warning for warning in result["warnings"])


def test_unknown_speed_is_null(zoo):
    nics = run_facts(zoo)["nics"]
    assert nics["eth2"]["speed_mbps"] is None          # speed reads -1
    assert nics["ens32"]["speed_mbps"] is None         # no speed attribute
    assert nics["eth2"]["pci"] == "0000:00:03.0"       # device is virtio2 under the PCI function
    assert nics["eth2"]["driver"] == "virtio_net"


def test_ip_json_file_supplies_addresses_and_link_kind(tmp_path):
    node = FakeNode(tmp_path / "n")
    node.netdev("lo", link_type=772, flags=0x9, operstate="unknown", speed=None, ipv4=["127.0.0.1/8"])
    # Without `ip -d` nothing tells this software link is a veth (iflink == ifindex).
    node.netdev("pod0", speed="10000", ipv4=["198.18.7.2/24"], ip_kind="veth")
    node.finish()
    path = node.ip_json(overrides={"pod0": {"ipv4": ["198.18.7.2/24", "198.18.8.2/24"]}})
    without = run_facts(node)["nics"]["pod0"]
    assert without["class"] == "virtual" and without["ipv4"] == ["198.18.7.2/24"]
    result = run_facts(node, ip_json_file=path)
    assert result["addr_source"] == "ip_json_file"
    pod0 = result["nics"]["pod0"]
    assert pod0["class"] == "veth" and pod0["kind"] == "veth"
    assert pod0["ipv4"] == ["198.18.7.2/24", "198.18.8.2/24"]


def test_bad_ip_json_file_raises_for_the_capability_error(tmp_path):
    node = cluster_node(tmp_path / "n")
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    with pytest.raises(ValueError):
        run_facts(node, ip_json_file=str(bad))


def test_reading_twice_returns_the_same_facts(tmp_path):
    node = cluster_node(tmp_path / "n")
    assert run_facts(node)["nics"] == run_facts(node)["nics"]
    assert run_facts(node)["nics"]["ib0"]["class"] == "infiniband"


def test_missing_sysfs_tree_warns_and_finds_nothing(tmp_path):
    (tmp_path / "proc" / "net").mkdir(parents=True)
    result = read(str(tmp_path / "nosys"), str(tmp_path / "proc"))
    assert result["nics"] == {}
    assert any("does not exist" in w for w in result["warnings"])


# -- procfs parsers --------------------------------------------------------

def _fib_subnet(net, inner, route, local, broadcast):
    """A Main-table subnet of /proc/net/fib_trie: its network route, one local address, its broadcast."""
    return ("     +-- %s 2 0 2\n"
            "        +-- %s\n"
            "           |-- %s\n"
            "              %s\n"
            "           |-- %s\n"
            "              /32 host LOCAL\n"
            "        |-- %s\n"
            "           /32 link BROADCAST\n") % (net, inner, net.split("/")[0], route, local, broadcast)


FIB_TRIE = ("Main:\n"
            "  +-- 0.0.0.0/0 3 0 5\n"
            "     |-- 0.0.0.0\n"
            "        /0 universe UNICAST\n"
            + _fib_subnet("127.0.0.0/8", "127.0.0.0/31 1 0 0", "/8 host LOCAL", "127.0.0.1", "127.255.255.255")
            + _fib_subnet("198.18.0.0/24", "198.18.0.0/30 2 0 2", "/24 link UNICAST", "198.18.0.2", "198.18.0.255")
            + """Local:
  +-- 0.0.0.0/0 3 0 5
     +-- 127.0.0.0/8 2 0 2
           |-- 127.0.0.1
              /32 host LOCAL
     +-- 198.18.0.0/24 2 0 2
           |-- 198.18.0.2
              /32 host LOCAL
""")


def test_fib_trie_yields_local_addresses_once():
    # 127.0.0.0 "/8 host LOCAL" is the loopback route, not an address.
    assert pn.parse_fib_trie_local(FIB_TRIE) == ["127.0.0.1", "198.18.0.2"]


def test_ipv4_from_proc_uses_the_longest_connected_route():
    def line(iface, dest, gateway, mask):
        return "%s\t%s\t%s\t0001\t0\t0\t0\t%s\t0\t0\t0" % (iface, _hex(dest), _hex(gateway), _hex(mask))
    route = "\n".join([
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT",
        line("eth0", "0.0.0.0", "198.18.0.254", "0.0.0.0"),
        line("eth0", "198.18.0.0", "0.0.0.0", "255.255.0.0"),
        line("ib0", "198.18.0.0", "0.0.0.0", "255.255.255.0"),
        line("eth0", "198.18.0.0", "198.18.1.1", "255.255.255.128"),  # via a gateway: not connected
    ])
    by_iface, unattributed = pn.ipv4_from_proc(FIB_TRIE, route)
    assert by_iface == {"lo": ["127.0.0.1/8"], "ib0": ["198.18.0.2/24"]}
    assert unattributed == []
    assert pn.ipv4_from_proc(FIB_TRIE, "")[1] == ["198.18.0.2"]


def test_if_inet6_parser():
    text = ("fe8000000000000000fc00fffe000001 04 40 20 80     eth0\n"
            "fd000000000000000000000000000002 04 40 00 82     eth0\n"
            "00000000000000000000000000000001 01 80 10 80       lo\n")
    assert pn.parse_if_inet6(text) == {"eth0": ["fe80::fc:ff:fe00:1/64", "fd00::2/64"], "lo": ["::1/128"]}


def test_ip_json_parser_keeps_kind_and_both_families():
    text = json.dumps([{"ifname": "eth0", "linkinfo": {"info_kind": "veth", "info_slave_kind": "bridge"},
                        "addr_info": [{"family": "inet", "local": "198.18.0.3", "prefixlen": 24},
                                      {"family": "inet6", "local": "fe80::1", "prefixlen": 64}]}])
    assert pn.parse_ip_addr_json(text) == {"eth0": {"ipv4": ["198.18.0.3/24"], "ipv6": ["fe80::1/64"],
                                                    "kind": "veth", "slave_kind": "bridge"}}
    with pytest.raises(ValueError):
        pn.parse_ip_addr_json('{"not": "a list"}')


@pytest.mark.parametrize("rate, gbps", [("100 Gb/sec (4X EDR)", 100.0), ("25 Gb/sec (1X EDR)", 25.0),
                                        ("2.5 Gb/sec (1X SDR)", 2.5), ("", None), (None, None)])
def test_rate_parser(rate, gbps):
    assert pn.parse_rate_gbps(rate) == gbps


# -- this machine, read-only ---------------------------------------------

@pytest.mark.parametrize("addr_source", ["auto", "proc"])
def test_real_machine_has_loopback(addr_source):
    result = read(addr_source=addr_source)
    lo = result["nics"]["lo"]
    assert lo["class"] == "loopback" and lo["is_up"] is True
    assert "127.0.0.1/8" in lo["ipv4"]
    if addr_source == "proc":
        assert result["addr_source"] == "proc"


def test_ethernet_netdev_on_an_omni_path_device_is_opa(tmp_path):
    # OPA VNIC: an Ethernet-type netdev listed under the hfi1 device.
    node = FakeNode(tmp_path / "n")
    node.netdev("veth_opa0", driver=None, pci="0000:af:00.0", ipv4=["198.19.4.2/24"])
    node.rdma("hfi1_0", "hfi1", "0000:af:00.0", [{"port": 1}], netdevs=["veth_opa0"])
    node.finish()
    nics = run_facts(node)["nics"]
    assert nics["veth_opa0"]["class"] == "opa"
    assert nics["veth_opa0"]["driver"] == "hfi1"


def test_ip_fallback_and_required_ip():
    result = read(ops=LocalOps(missing=["ip"]))
    assert result["addr_source"] == "proc"
    assert "ip is not installed" in result["warnings"][0]
    assert "127.0.0.1/8" in result["nics"]["lo"]["ipv4"]
    with pytest.raises(ValueError, match="ip is not installed"):
        read(ops=LocalOps(missing=["ip"]), addr_source="ip")


# -- the plan over every node's facts ----------------------------------------

def _settings(override="", mismatch="fail"):
    return {"nic_discovery_override": override, "nic_discovery_fabric_mismatch": mismatch,
            "nic_discovery_sysfs_root": "/sys", "nic_discovery_proc_root": "/proc"}


def _nodes(hosts):
    return {host: {"name": host, "ansible_host": "198.18.0.%d" % index, "node_addr": "198.18.0.%d" % index,
                   "user": "", "ssh_port": 22} for index, host in enumerate(hosts, 1)}


def test_plan_over_fake_nodes_chooses_the_fabric_and_each_nodes_address(tmp_path):
    facts = {}
    for index, host in enumerate(("n1", "n2"), 1):
        tree = cluster_node(tmp_path / host, index=index)
        facts[host] = run_facts(tree)
    decision = ndc.plan(["n1", "n2"], facts, {h: _settings() for h in facts}, _nodes(facts))
    assert decision["ok"] and decision["blockers"] == []
    assert decision["ifname"] == "ib0" and decision["gloo_socket_ifname"] == "ib0"
    assert decision["addr_by_host"] == {"n1": "198.19.1.1", "n2": "198.19.1.2"}
    assert decision["checks_by_host"]["n2"]["fabric_consistency"]["status"] == "pass"
    assert "checks" not in decision and "candidates" not in decision


def test_plan_blocks_naming_the_node_that_lacks_the_override(tmp_path):
    facts = {"n1": run_facts(cluster_node(tmp_path / "n1", index=1)),
             "n2": run_facts(cluster_node(tmp_path / "n2", index=2, ib_name="ib1"))}
    decision = ndc.plan(["n1", "n2"], facts, {h: _settings(override="ib0") for h in facts}, _nodes(facts))
    assert not decision["ok"]
    assert "n2" in decision["blockers"][0]
    assert decision["checks_by_host"]["n2"]["override"]["status"] == "fail"
    assert decision["checks_by_host"]["n1"]["override"]["status"] == "pass"


def test_plan_leaves_out_nodes_that_were_not_read(tmp_path):
    facts = {"n1": run_facts(cluster_node(tmp_path / "n1", index=1)), "n2": None}
    decision = ndc.plan(["n1", "n2"], facts, {h: _settings() for h in facts}, _nodes(facts))
    assert decision["ok"] and set(decision["checks_by_host"]) == {"n1"}
    assert ndc.plan(["n2"], {"n2": None}, {"n2": _settings()}, _nodes(["n2"]))["ok"] is False


@pytest.mark.parametrize("override, ok", [("", True), ("ib0", True), ("ib0,eth0", True), ("bad name", False),
                                          ("a" * 16, False)])
def test_validate_override(override, ok):
    assert (ndc.validate(_settings(override=override)) == []) is ok
