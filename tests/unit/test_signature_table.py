"""The log diagnosis reads the line's own facts first (cluster_preflight/capabilities/allreduce/signature_table/, signatures.py).

The lines here are the project's own, written in the shapes torch, NCCL, gloo, libibverbs and CUDA print (their
formats, hosts, addresses and numbers of our own choosing); real logs of the field are measured by
bench/nccl_logs.py, never copied here."""

import os

import pytest

from cluster_preflight.capabilities.allreduce import signatures as sig
from cluster_preflight.capabilities.allreduce.signature_table import CATEGORIES

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "logs")

# id -> lines of that shape, each of which must make it the cause the log names (nodes=2, fabric as given).
SHAPED = {
    "socket_interface_missing": [
        "gpu-a07:5123:5123 [2] misc/socket.cc:511 NCCL WARN Bootstrap : no socket interface found",
        "[rank5]: ncclSocketInit: connecting to address  with family 41213 is neither AF_INET(2) nor AF_INET6(10)",
        "include/socket.h:402 WARN Socket creation failed : Address family not supported by protocol",
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/device.cc:88] ifa != nullptr. Unable to find "
        "address for: ens9f1",
        "RuntimeError: [gloo/transport/tcp/device.cc:91] Unable to find address for: enp65s0np0",
    ],
    "address_family_mismatch": [
        "RuntimeError: [enforce fail at third_party/gloo/gloo/transport/tcp/device.cc:301] "
        "ss1.ss_family == ss2.ss_family. 10 vs 2",
    ],
    "hostname_loopback": [
        "[n3:1]:RuntimeError: [/opt/gloo/transport/tcp/pair.cc:799] connect [127.0.1.1]:41877: Connection refused",
        "[c10d] The client socket has failed to connect to [localhost]:6000 (errno: 111 - Connection refused).",
        "n2:711:740 [0] misc/socket.cc:580 NCCL WARN socketStartConnect: Connect to 127.0.1.1<50611> failed : "
        "Connection refused",
        "Gloo connectFullMesh failed with [pair.cc:152] timed out connecting: SO_ERROR: Connection refused, "
        "remote=[::1]:30412",
    ],
    "name_unresolvable": [
        "[W1202 08:00:01.5 socket.cpp:612] [c10d] The IPv6 network addresses of (trainer-b, 6000) cannot be "
        "retrieved (gai error: -2 - Name or service not known).",
        "RuntimeError: [enforce fail at gloo/transport/tcp/device.cc:127] rp != nullptr. Unable to find address "
        "for: gpu-b12.cluster.example",
        "socket.gaierror: [Errno -3] Temporary failure in name resolution",
    ],
    "socket_wrong_interface": [
        "n2:71:90 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 172.17.0.1<43011> failed : "
        "Connection refused",
    ],
    "store_port_in_use": [
        "[W socket.cpp:436] [c10d] The server socket has failed to bind to 0.0.0.0:31337 (errno: 98 - Address "
        "already in use).",
        "RuntimeError: Address already in use",
    ],
    "shm_too_small": [
        "node7:812:900 [3] misc/shmutils.cc:88 NCCL WARN Error: failed to extend /dev/shm/nccl-Qm3xTz to 4194308 "
        "bytes, error: No space left on device (28)",
        "node7:812:900 [3] misc/shmutils.cc:64 NCCL WARN Call to posix_fallocate failed: No space left on device",
        "ncclSystemError: Error while creating shared memory segment /dev/shm/nccl-aB9 (size 4194304)",
    ],
    "shm_unusable": [
        "n1:40:90 [0] misc/shmutils.cc:132 NCCL WARN Error while creating shared memory segment /dev/shm/nccl-x1 "
        "(size 4194304), error: Permission denied (13)",
        "n1:40:90 [1] misc/shmutils.cc:150 NCCL WARN Error while attaching to shared memory segment /dev/shm/nccl-x2 "
        "(size 8388608), error: No such file or directory (2)",
    ],
    "ib_memlock": [
        "n4:88:99 [0] misc/ibvwrap.cc:203 NCCL WARN Call to ibv_reg_mr failed with error Cannot allocate memory",
        "n4:88:99 [0] misc/ibvwrap.cc:190 NCCL WARN Call to ibv_create_cq failed with error Cannot allocate memory",
        "libibverbs: Warning: RLIMIT_MEMLOCK is 65536 bytes.",
    ],
    "ib_qp_setup_timeout": [
        "n2:51:77 [1] misc/ibvwrap.cc:300 NCCL WARN Call to ibv_modify_qp failed with error Connection timed out",
        "n2:51:77 [1] ibvwrap.c:262 NCCL WARN Call to ibv_modify_qp failed with 110 Connection timed out, on dev "
        "mlx5_4:1, curr state INIT, next state RTR, local GID index 1, local GID fe80::a1:22ff:fe33:4455, remote "
        "GID fe80::a1:22ff:fe33:9911",
        "n2:51:77 [1] misc/ibvwrap.cc:187 NCCL WARN Call to ibv_modify_qp failed with error Network is unreachable",
    ],
    "nccl_ib_error_12": [
        "n5:61:80 [0] transport/net_ib.cc:802 NCCL WARN NET/IB : Got completion with error 12, opcode 2, len 0, "
        "vendor err 129",
    ],
    "ib_local_protection": [
        "n5:61:80 [0] NCCL WARN NET/IB : Got completion from peer 198.18.7.2<51022> with error 4, opcode 0, len 0, "
        "vendor err 81 (Recv)",
    ],
    "ib_access_error": ["n5:61:80 [0] NCCL WARN NET/IB : Got completion with error 10, opcode 1, len 0, vendor err 136"],
    "ib_reg_mr_gpu": ["n4:88:99 [0] NCCL WARN Call to ibv_reg_mr failed with error Bad address"],
    "ib_completion_error": ["n5:61:80 [0] NCCL WARN NET/IB : Got completion with error 5, opcode 0, len 0, vendor "
                            "err 249"],
    "ofi_no_provider": ["n9:12:12 [0] nccl_net_ofi_init:1500 NCCL WARN NET/OFI Couldn't find any optimal provider"],
    "ibverbs_missing": ["n9:12:12 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]"],
    "net_plugin_missing": ["n9:12:12 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal net "
                           "plugin."],
    "fabric_not_initialized": [
        "test: Test CUDA failure common.cu:1002 'system not yet initialized'",
        "RuntimeError: CUDA error: cudaErrorSystemNotReady",
    ],
    "nvls_failure": ["n1:7:70 [3] transport/nvls.cc:251 NCCL WARN Cuda failure 1 'invalid argument'"],
    "duplicate_gpu": ["n1:7:7 [0] init.cc:880 NCCL WARN Duplicate GPU detected : rank 6 and rank 2 both on CUDA device "
                      "c1000"],
    "gpu_unavailable": [
        "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable",
        "NVRM: GPU 0000:41:00.0: GPU has fallen off the bus.",
        "        Reset Required                    : Yes",
    ],
    "cuda_driver_too_old": ["RuntimeError: The NVIDIA driver on your system is too old (found version 11040)."],
    "driver_library_mismatch": ["Failed to initialize NVML: Driver/library version mismatch"],
    "nccl_internal_error": ["ncclInternalError: Internal check failed."],
    "nccl_invalid_usage": ["torch.distributed.DistBackendError: NCCL error in: x.cpp:9, invalid usage"],
}
FABRIC_FOR = {"ibverbs_missing": ["roce"], "net_plugin_missing": ["efa"]}


def diagnose(text, fabric=None, nodes=2):
    findings = sig.match(text, fabric=fabric, nodes=nodes)
    return findings, sig.primary(findings)


def test_every_row_has_a_category_the_checks_that_catch_it_and_a_line_of_its_shape_somewhere():
    from test_signatures import RECORDED  # pylint: disable=import-outside-toplevel
    assert set(RECORDED) | set(SHAPED) | {"nccl_net_ofi"} == set(sig.BY_ID)
    for row in sig.SIGNATURES:
        assert row.category in CATEGORIES and row.level in sig.LEVELS, row.id
        for name in row.checks if row.checks is not None else CATEGORIES[row.category]["checks"]:
            capability, _dot, check = name.partition(".")
            assert capability and check and " " not in name, (row.id, name)
    for category, entry in CATEGORIES.items():
        assert entry["expected"], category


@pytest.mark.parametrize("sig_id, line", [(sig_id, line) for sig_id, lines in sorted(SHAPED.items())
                                          for line in lines])
def test_a_line_of_the_shape_names_its_cause_with_a_fix_and_the_checks(sig_id, line):
    findings, cause = diagnose(line, fabric=FABRIC_FOR.get(sig_id))
    assert cause is not None and cause["id"] == sig_id, [f["id"] for f in findings]
    assert cause["cause"] and cause["fix"] and cause["status"] in ("warn", "fail")
    assert cause["category"] in CATEGORIES


@pytest.mark.parametrize("line, words", [
    (SHAPED["socket_interface_missing"][3], ["ens9f1", "job_env.socket_ifname"]),
    (SHAPED["socket_interface_missing"][1], ["family 41213"]),
    (SHAPED["hostname_loopback"][0], ["127.0.1.1:41877", "127.0.1.1 <hostname>", "getent hosts"]),
    (SHAPED["name_unresolvable"][0], ["trainer-b", "EAI_NONAME", "getent hosts trainer-b"]),
    (SHAPED["name_unresolvable"][1], ["gpu-b12.cluster.example"]),
    (SHAPED["store_port_in_use"][0], ["31337", "second job", "leftover"]),
    (SHAPED["shm_too_small"][0], ["/dev/shm/nccl-Qm3xTz", "4194308", "--shm-size", "job_env.dev_shm"]),
    (SHAPED["shm_unusable"][1], ["attach", "--ipc=host"]),
    (SHAPED["ib_memlock"][0], ["ibv_reg_mr", "ulimit -l", "job_env.memlock"]),
    (SHAPED["ib_memlock"][2], ["65536 bytes"]),
    (SHAPED["ib_qp_setup_timeout"][1], ["NCCL_IB_GID_INDEX=1", "link-local", "not a TCP firewall",
                                        "fabric.roce_gid"]),
    (SHAPED["ib_local_protection"][0], ["IBV_WC_LOC_PROT_ERR", "198.18.7.2<51022>", "ACS", "NCCL_NET_GDR_LEVEL",
                                        "fabric.pcie_acs"]),
    (SHAPED["duplicate_gpu"][0], ["ranks 6 and 2", "c1000", "LOCAL_RANK"]),
    (SHAPED["nvls_failure"][0], ["invalid argument", "fabric manager", "NCCL_NVLS_ENABLE=0"]),
])
def test_the_cause_and_fix_carry_the_lines_own_facts(line, words):
    _findings, cause = diagnose(line)
    text = cause["cause"] + " " + cause["fix"] + " " + " ".join(cause["checks"])
    for word in words:
        assert word in text, word


def test_a_refused_connection_to_loopback_is_name_resolution_only_across_nodes():
    refused = "[c10d] The client socket has failed to connect to [127.0.0.1]:6000 (errno: 111 - Connection refused)."
    assert diagnose(refused, nodes=2)[1]["id"] == "hostname_loopback"
    assert diagnose(refused, nodes=1)[1]["id"] == "connection_refused", "one node: the peer is not up, or died"
    unknown = diagnose(refused, nodes=None)[1]
    assert unknown["id"] == "hostname_loopback" and "one node only" in unknown["cause"], "says what tells them apart"
    routable = diagnose(refused.replace("127.0.0.1", "198.18.3.4"), nodes=2)[1]
    assert routable["id"] == "connection_refused" and "198.18.3.4:6000" in routable["cause"]


def test_the_fallback_warning_explains_a_failure_and_is_quiet_alone():
    warning = ("[rank2]: Warning: Unable to resolve hostname to a (local) address. Using the loopback address as "
               "fallback. Manually set the network interface to bind to with GLOO_SOCKET_IFNAME.")
    assert diagnose(warning)[0] == [], "alone (the run may pass on one node) it is no finding"
    failed = warning + "\n[rank2]: RuntimeError: Gloo connectFullMesh failed ... SO_ERROR: Connection refused"
    assert diagnose(failed)[1]["id"] == "hostname_loopback"
    assert diagnose(failed, nodes=1)[1]["id"] == "connection_refused"


@pytest.mark.parametrize("code, named", [("-2", "name_unresolvable"), ("-3", "name_unresolvable"),
                                         ("-5", None), ("-9", None)])
def test_only_a_name_that_does_not_resolve_at_all_is_named(code, named):
    line = ("[W socket.cpp:601] [c10d] The IPv6 network addresses of (node4, 6000) cannot be retrieved (gai error: "
            "%s - whatever the resolver says)." % code)
    cause = diagnose(line)[1]
    assert (cause and cause["id"]) == named


@pytest.mark.parametrize("line, named", [
    ("RuntimeError: [device.cc:127] rp != nullptr. Unable to find address for: eth7", "name_unresolvable"),
    ("RuntimeError: [device.cc:88] ifa != nullptr. Unable to find address for: node12", "socket_interface_missing"),
    ("RuntimeError: Unable to find address for: bond1", "socket_interface_missing"),
    ("RuntimeError: Unable to find address for: node12.rack3", "name_unresolvable"),
])
def test_gloo_unable_to_find_address_is_told_apart_by_its_condition_then_the_names_shape(line, named):
    assert diagnose(line)[1]["id"] == named


def test_an_rdma_queue_pair_timeout_is_not_a_tcp_firewall():
    findings, cause = diagnose(SHAPED["ib_qp_setup_timeout"][0])
    assert cause["id"] == "ib_qp_setup_timeout" and cause["category"] == "roce_gid"
    assert "connection_timed_out" not in [finding["id"] for finding in findings], "the line's facts won"
    tcp = diagnose("n2:51:77 [1] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 198.18.9.9<4431> "
                   "failed : Connection timed out")[1]
    assert tcp["id"] == "connection_timed_out"


def test_error_12_names_the_link_layer_and_gid_index_from_the_log():
    text = "\n".join(["n5:61:61 [0] NCCL INFO NCCL_IB_GID_INDEX set by environment to 1.",
                      "n5:61:61 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE ; OOB eth0:198.18.5.5<0>",
                      "n5:61:80 [0] NCCL WARN NET/IB : Got completion from peer 198.18.5.6<40001> with error 12, "
                      "opcode 0, len 0, vendor err 129 (Recv) localGid fe80::1:2ff:fe03:405 remoteGid "
                      "fe80::1:2ff:fe03:406"])
    cause = diagnose(text, fabric=["roce"])[1]
    assert cause["id"] == "nccl_ib_error_12"
    for word in ("RoCE (Ethernet)", "NCCL_IB_GID_INDEX=1", "198.18.5.6<40001>", "link-local", "P_Key"):
        assert word in cause["cause"], word


def test_the_first_completion_error_is_the_cause_and_the_flushes_after_it_are_not():
    text = SHAPED["ib_completion_error"][0] + "\n" + SHAPED["ib_local_protection"][0]
    findings, cause = diagnose(text)
    assert cause["id"] == "ib_local_protection"
    flushed = next(finding for finding in findings if finding["id"] == "ib_completion_error")
    assert flushed["level"] == "symptom" and "consequence" in flushed["cause"]


def test_a_container_bridge_explains_a_failure_and_is_quiet_on_a_healthy_run():
    bootstrap = "n2:71:71 [0] NCCL INFO Bootstrap : Using docker0:172.17.0.1<0>"
    assert diagnose(bootstrap)[0] == []
    timed_out = bootstrap + "\n" + ("n2:71:90 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to "
                                    "172.17.0.2<33001> failed : Connection timed out")
    findings, cause = diagnose(timed_out)
    assert cause["id"] == "socket_wrong_interface" and "docker0" in cause["cause"]
    assert "container or virtual bridge" in cause["cause"]
    assert "connection_timed_out" in [finding["id"] for finding in findings], "the symptom is still listed"
    assert diagnose(timed_out.replace("docker0:172.17.0.1", "lo:127.0.0.1"), nodes=1)[1]["id"] == \
        "connection_timed_out", "one node on lo is right"


def test_a_cause_that_is_a_failure_itself_comes_before_one_that_only_explains():
    text = "\n".join(["n1:5:5 [0] NCCL INFO Bootstrap : Using lo:127.0.0.1<0>", SHAPED["shm_too_small"][0],
                      "torch.distributed.DistBackendError: NCCL error in: x.cpp:268, unhandled system error"])
    findings, cause = diagnose(text, nodes=None)
    assert cause["id"] == "shm_too_small"
    assert {"socket_wrong_interface", "nccl_system_error"} <= {finding["id"] for finding in findings}


@pytest.mark.parametrize("fabric, status", [(["efa"], "warn"), (["infiniband"], "pass"), (None, "pass")])
def test_a_missing_network_plugin_matters_only_on_efa(fabric, status):
    finding = diagnose(SHAPED["net_plugin_missing"][0], fabric=fabric)[0][0]
    assert finding["id"] == "net_plugin_missing" and finding["status"] == status


def test_no_provider_is_the_cause_and_the_verbs_fallback_after_it_a_symptom():
    text = SHAPED["ofi_no_provider"][0] + "\n" + SHAPED["ibverbs_missing"][0]
    assert diagnose(text, fabric=["efa"])[1]["id"] == "ofi_no_provider"
    assert diagnose(text)[1]["id"] == "ofi_no_provider"


@pytest.mark.parametrize("name, fabric, nodes", [
    ("nccl_healthy_roce.log", ["roce"], 2),
    ("nccl_healthy_roce.log", None, 2),
    ("nccl_healthy_roce.log", True, None),
    ("nccl_healthy_single_lo.log", None, 1),
    ("nccl_healthy_single_lo.log", None, None),
])
def test_the_info_lines_of_a_healthy_run_name_no_cause(name, fabric, nodes):
    with open(os.path.join(FIXTURES, name)) as handle:
        findings, cause = diagnose(handle.read(), fabric=fabric, nodes=nodes)
    assert cause is None, cause
    assert all(finding["status"] == "pass" for finding in findings), findings


@pytest.mark.parametrize("value", ["No", "N/A"])
def test_nvidia_smi_fields_of_a_healthy_gpu_name_no_cause(value):
    assert diagnose("        Reset Required                    : %s\n        Drain and Reset Recommended       : No"
                    % value)[0] == []


def test_facts_of_the_whole_log_and_the_ranks_of_a_finding_are_kept():
    text = [(None, "[node1:1]:node1:3301:3301 [1] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth9\n"
                   "[node1:1]:node1:3301:3301 [1] misc/socket.cc:511 NCCL WARN Bootstrap : no socket interface found"),
            (3, "[rank3]: Bootstrap : no socket interface found")]
    finding = diagnose(text)[1]
    assert finding["facts"]["socket_ifname"] == "eth9" and "eth9" in finding["cause"]
    assert finding["local_ranks"] == [1] and finding["ranks"] == [3] and finding["count"] == 2


@pytest.mark.parametrize("pattern, keys", [
    (r"[Nn]o (?:usable )*interfaces? (?:was )?found", ("interface",)),
    (r"errno:? 111\b|ECONNREFUSED", ("errno", "ECONNREFUSED")),
    (r"connect\(\) to (?P<addr>\S+) failed", ("connect() to ",)),
    (r"(?P<fallback>Unable to resolve hostname)", None),
    (r"ab|cdef", None),
])
def test_a_shape_is_searched_only_in_lines_holding_a_literal_it_requires(pattern, keys):
    import re  # pylint: disable=import-outside-toplevel
    assert sig._keys(re.compile(pattern)) == keys  # pylint: disable=protected-access
