"""The interfaces and RDMA devices the job's environment names (job_env.socket_ifname, job_env.ib_hca): NCCL's list
syntax, gloo's, what each node would use, compared with its peers; the nodes the gate's own all-reduce leaves out
for it; and the gate's ranks running with the job's environment (allreduce_env winning)."""

import pytest

from cluster_preflight.capabilities import allreduce
from cluster_preflight.capabilities import job_env as controller
from cluster_preflight.capabilities.job_env import interfaces as ifaces
from capability_helpers import assert_contract, role_settings

HOST = "pfn2"


def nic(*cidrs, up=True, cls="ethernet"):
    return {"ipv4": [c for c in cidrs if ":" not in c], "ipv6": [c for c in cidrs if ":" in c], "is_up": up,
            "class": cls}


def bed_nics(index, **changes):
    """A bed node's interfaces: management eth0, two fabric rails, lo, docker0 (the same address everywhere)."""
    nics = {"lo": nic("127.0.0.1/8", cls="loopback"), "eth0": nic("198.18.7.%d/24" % index),
            "fab0": nic("198.19.7.%d/24" % index, cls="infiniband"), "fab1": nic("198.19.71.%d/24" % index,
                                                                                 cls="infiniband"),
            "docker0": nic("172.17.0.1/16", cls="bridge")}
    for name, value in changes.items():
        if value is None:
            nics.pop(name, None)
        else:
            nics[name] = value
    return nics


def cluster_of(nics_by_host, rdma_by_host=None):
    hosts = sorted(nics_by_host)
    node_facts = {host: {"nic_discovery": {"nics": nics_by_host[host], "rdma_devices": {}}} for host in hosts}
    for host, devices in (rdma_by_host or {}).items():
        node_facts[host]["fabric"] = {"present": bool(devices), "devices": devices}
    return {"hosts": hosts, "nodes": {host: {"node_addr": "198.18.7.%s" % host[-1]} for host in hosts},
            "node_facts": node_facts, "facts": {}, "settings": {}}


def three(**changes_of_pfn2):
    return cluster_of({"pfn1": bed_nics(1), "pfn2": bed_nics(2, **changes_of_pfn2), "pfn3": bed_nics(3)})


def socket(env, cluster, host=HOST, same_subnet=True):
    check = ifaces.socket_check(host, env, cluster["node_facts"][host]["nic_discovery"], cluster, same_subnet)
    assert_contract("job_env", {"socket_ifname": check}, host)
    return check


# --- syntax -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, name, port, selected", [
    ("eth", "eth0", None, True), ("eth", "ib0", None, False), ("=eth0", "eth01", None, False),
    ("=eth0", "eth0", None, True), ("^docker,lo", "docker0", None, False), ("^docker,lo", "fab0", None, True),
    ("^=docker0", "docker01", None, True), ("mlx5_0:1", "mlx5_0", 1, True), ("mlx5_0:1", "mlx5_0", 2, False),
    ("mlx5_1", "mlx5_10", 1, True), ("=mlx5_1", "mlx5_10", 1, False),
])
def test_ncclS_list_syntax(text, name, port, selected):
    assert ifaces.matches(ifaces.parse_list(text, ports=True), name, port) is selected


def test_bad_lists_are_refused_naming_what_is_wrong():
    for text in ("", "^", "=", ","):
        with pytest.raises(ValueError):
            ifaces.parse_list(text)
    with pytest.raises(ValueError, match="port"):
        ifaces.parse_list("mlx5_0:x", ports=True)
    assert ifaces.gloo_names(" fab0, fab1 ") == ["fab0", "fab1"]


# --- socket_ifname ------------------------------------------------------------------------------------------------


def test_no_interface_named_is_not_applicable():
    assert socket({"NCCL_DEBUG": "INFO"}, three())["status"] == "not_applicable"


@pytest.mark.parametrize("env", [
    {"NCCL_SOCKET_IFNAME": "fab"}, {"NCCL_SOCKET_IFNAME": "=fab0"}, {"GLOO_SOCKET_IFNAME": "fab0,fab1"},
    {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"},
])
def test_interfaces_every_node_has_pass(env):
    check = socket(env, three())
    assert check["status"] == "pass", check
    assert "uses" in check["found"] and HOST in check["found"]


@pytest.mark.parametrize("env, changes, words", [
    ({"GLOO_SOCKET_IFNAME": "fab1"}, {"fab1": None},
     "GLOO_SOCKET_IFNAME=fab1: pfn2 has no interface fab1 with an address"),
    ({"NCCL_SOCKET_IFNAME": "=fab1"}, {"fab1": None}, "matches no interface with an address on pfn2"),
    ({"NCCL_SOCKET_IFNAME": "ib"}, {}, "matches no interface with an address on pfn2"),
    ({"GLOO_SOCKET_IFNAME": "fab1"}, {"fab1": nic("198.19.71.2/24", up=False)}, "selects fab1, DOWN on pfn2"),
    ({"NCCL_SOCKET_IFNAME": "fab"}, {"fab1": nic("198.19.71.2/24", up=False)}, "selects fab1, DOWN on pfn2"),
    ({"NCCL_SOCKET_IFNAME": "^docker"}, {}, "selects lo (127.0.0.1/8): loopback"),
    ({"NCCL_SOCKET_IFNAME": "docker0"}, {}, "the same address as pfn1, pfn3"),
    ({"GLOO_SOCKET_IFNAME": "fab1"}, {"fab1": nic("198.19.1.2/24")},
     "fab1 on pfn2 is on 198.19.1.0/24, where no other is of the 3 nodes"),
])
def test_a_node_where_the_named_interfaces_do_not_serve_fails_naming_what_it_has(env, changes, words):
    check = socket(env, three(**changes))
    assert check["status"] == "fail" and words in check["found"], check
    assert "pfn2 has: " in check["found"] and "eth0 (UP, 198.18.7.2/24)" in check["found"].split("has:")[1]
    assert "lo (" not in check["found"].split("has:")[1]
    assert check["fix"].startswith("on pfn2:")
    # Its peers are not blamed for a fault of its own (a name nothing has, lo, docker0: every node's alike).
    if changes:
        assert socket(env, three(**changes), host="pfn1")["status"] == "pass"


def test_a_fabric_routed_between_subnets_is_not_held_to_one_subnet():
    routed = cluster_of({"pfn1": bed_nics(1), "pfn2": bed_nics(2, fab1=nic("198.19.1.2/24")), "pfn3": bed_nics(3)})
    env = {"GLOO_SOCKET_IFNAME": "fab1"}
    assert socket(env, routed)["status"] == "fail"
    assert socket(env, routed, same_subnet=False)["status"] == "pass"


def test_a_node_alone_has_no_peer_to_compare_with():
    alone = cluster_of({HOST: bed_nics(2, fab1=nic("198.19.1.2/24"))})
    assert socket({"GLOO_SOCKET_IFNAME": "fab1"}, alone)["status"] == "pass"


def test_nccl_socket_family_limits_the_addresses():
    v6 = three(fab1=nic("2001:db8::2/64", cls="infiniband"))
    check = socket({"NCCL_SOCKET_IFNAME": "=fab1", "NCCL_SOCKET_FAMILY": "AF_INET"}, v6)
    assert check["status"] == "fail" and "matches no interface with an address" in check["found"]


# --- ib_hca -------------------------------------------------------------------------------------------------------


def ports(*states):
    return [{"port": index + 1, "state": state} for index, state in enumerate(states)]


DEVICES = {"mlx5_0": ports("ACTIVE"), "mlx5_1": ports("DOWN")}


@pytest.mark.parametrize("env, devices, peers, status, words", [
    ({}, DEVICES, [], "not_applicable", "sets no NCCL_IB_HCA"),
    ({"NCCL_IB_HCA": "mlx5"}, DEVICES, [], "pass", "selects mlx5_0:1 (ACTIVE), mlx5_1:1 (DOWN)"),
    ({"NCCL_IB_HCA": "=mlx5_0:1"}, DEVICES, [], "pass", "mlx5_0:1 (ACTIVE)"),
    ({"NCCL_IB_HCA": "=mlx5_1"}, DEVICES, [], "fail", "selects no ACTIVE port (mlx5_1:1 (DOWN))"),
    ({"NCCL_IB_HCA": "mlx5_9"}, DEVICES, [], "fail", "selects nothing on pfn2; pfn2 has: mlx5_0:1 (ACTIVE)"),
    ({"NCCL_IB_HCA": "^mlx5"}, DEVICES, [], "fail", "selects nothing"),
    ({"NCCL_IB_HCA": "mlx5_0:2"}, DEVICES, [], "fail", "selects nothing"),
    ({"NCCL_IB_HCA": "mlx5"}, {}, ["pfn1", "pfn3"], "fail", "pfn2 has none while pfn1, pfn3 have them"),
    ({"NCCL_IB_HCA": "mlx5"}, {}, [], "not_applicable", "no node has an RDMA device"),
    ({"NCCL_IB_HCA": "mlx5", "NCCL_IB_DISABLE": "1"}, DEVICES, [], "not_applicable", "turns NCCL's RDMA"),
])
def test_ib_hca_selects_an_active_port(env, devices, peers, status, words):
    check = ifaces.ib_check(HOST, env, devices, peers)
    assert_contract("job_env", {"ib_hca": check}, HOST)
    assert check["status"] == status and words in check["found"], check


def test_the_rdma_devices_are_the_fabric_capabilitys_else_nic_discoverys():
    fabric = {"devices": {"mlx5_0": {"ports": ports("ACTIVE")}}}
    nic_facts = {"rdma_devices": {"mlx5_4": {"ports": ports("ACTIVE")}}}
    assert list(ifaces.rdma_devices(fabric, nic_facts)) == ["mlx5_0"]
    assert list(ifaces.rdma_devices({"devices": {}}, nic_facts)) == ["mlx5_4"]
    assert ifaces.rdma_devices(None, None) == {}


# --- the gate's own all-reduce ------------------------------------------------------------------------------------


def test_a_node_whose_job_environment_names_a_missing_interface_gets_no_ranks():
    cluster = three(fab1=None)
    env = {"GLOO_SOCKET_IFNAME": "fab1", "NCCL_SOCKET_IFNAME": "=fab1"}
    cluster["settings"] = {host: role_settings("job_env", preflight_job_env=env) for host in cluster["hosts"]}
    left_out = controller.launch_exclusions(cluster["hosts"], cluster)
    assert list(left_out) == [HOST] and "job_env.socket_ifname" in left_out[HOST]
    cluster["settings"][HOST]["job_env_enabled"] = False
    assert controller.launch_exclusions(cluster["hosts"], cluster) == {}


def test_no_job_environment_leaves_nobody_out():
    cluster = three(fab1=None)
    cluster["settings"] = {host: role_settings("job_env", preflight_job_env={}) for host in cluster["hosts"]}
    assert controller.launch_exclusions(cluster["hosts"], cluster) == {}


def test_the_gates_ranks_run_with_the_job_environment_and_allreduce_env_wins():
    settings = {"preflight_job_env": {"NCCL_IB_HCA": "mlx5", "NCCL_DEBUG": "WARN", "NCCL_IB_GID_INDEX": 3,
                                      "NCCL_DEBUG_FILE": "/tmp/nccl.%h.%p", "GLOO_SOCKET_IFNAME": "fab1"},
                "allreduce_env": {"GLOO_SOCKET_IFNAME": "fab0"}}
    # The gate's logs stay its own (its diagnosis reads them); allreduce_env wins over the job's.
    assert allreduce.gate_env(settings) == {"NCCL_IB_HCA": "mlx5", "NCCL_IB_GID_INDEX": "3",
                                            "GLOO_SOCKET_IFNAME": "fab0"}
    assert allreduce.gate_env(dict(settings, allreduce_env={"NCCL_DEBUG": "TRACE"}))["NCCL_DEBUG"] == "TRACE"
    assert allreduce.gate_env({"allreduce_env": {}}) == {}


def test_the_single_node_run_over_lo_keeps_lo_whatever_the_job_names():
    settings = dict(role_settings("allreduce"), allreduce_python="/usr/bin/python3", allreduce_master_port=6000,
                    allreduce_nproc_per_node=0,
                    preflight_job_env={"GLOO_SOCKET_IFNAME": "fab1", "NCCL_SOCKET_IFNAME": "=fab1",
                                       "NCCL_IB_HCA": "mlx5"})
    facts = {"nproc_per_node": 2, "backend": "gloo", "job_user": {"run_as": None}}
    args = allreduce.alone_args(HOST, facts, settings)
    assert args["env"]["GLOO_SOCKET_IFNAME"] == "lo" and args["env"]["NCCL_SOCKET_IFNAME"] == "lo"
    assert args["env"]["NCCL_IB_HCA"] == "mlx5" and args["socket_ifname"] == "lo"
