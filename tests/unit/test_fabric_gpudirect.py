"""The fabric capability's checks of the job's path over the NIC: the RoCE GID NCCL needs (``roce_gid``), GPUDirect
RDMA (``peer_memory``, ``pcie_acs``) and EFA's NCCL plugin (``net_plugin``).  Nodes are sysfs trees of the project's
own (``tests/fabric_tree.py``: an HGX node's PCIe switches with their GPUs and NICs, RoCE GID tables, /sys/module),
a sandbox root for the loader's configuration, and FakeOps answering lspci and modinfo."""

import functools
import json

import pytest

from preflight_node.capabilities import fabric as node_fabric
from preflight_node.net import lspci, nccl_plugin as node_plugin, roce_gid as node_gid
from cluster_preflight.capabilities import fabric
from cluster_preflight.capabilities.fabric.roce import hca_filter
from fabric_tree import ACS_ON, gid_table, hgx_layout, lspci_text, make_modules, make_pci, make_tree, write_gids
from fake_ops import FakeOps
from capability_helpers import assert_contract as check_contract, capability_under_test, role_settings

ROLE, HOST, NODE = capability_under_test("fabric", "gpu-node-05", "198.18.0.15")
assert_contract = functools.partial(check_contract, "fabric", host=HOST)
LSPCI, MODINFO = "/usr/bin/lspci", "/usr/sbin/modinfo"
ROCE = {"mlx5_%d" % index: "198.18.%d.5" % (index + 1) for index in range(8)}
PEERMEM_KO = "/lib/modules/6.8.0-45-generic/kernel/drivers/video/nvidia-peermem.ko"


def audit(root, job_env=None, answers=None, programs=("lspci", "modinfo"), kernel="6.8.0-45-generic", **overrides):
    """``(checks, facts, ops)`` of the node whose sysfs is ``root`` (its loader configuration under ``root/etc``)."""
    wanted = role_settings("fabric", fabric_sysfs_root=str(root), fabric_root=str(root), **overrides)
    if job_env is not None:
        wanted["preflight_job_env"] = job_env
    commands = {(LSPCI, "-D", "-vvv"): (0, lspci_text(), "")}
    commands.update(answers or {})
    ops = FakeOps(programs={name: {"lspci": LSPCI, "modinfo": MODINFO}[name] for name in programs}, commands=commands)
    args = dict(json.loads(json.dumps(fabric.read_args(wanted, NODE))), kernel_release=kernel)
    facts = json.loads(json.dumps(node_fabric.read(args, ops)))
    checks = fabric.decide(HOST, facts, wanted)
    assert_contract(checks)
    return checks, facts, ops


def hgx(root, modules=("nvidia", "nvidia_peermem"), taint="POE", version="550.90.07", **tree):
    """An HGX node: its PCIe switches with GPUs, NVSwitches and eight ConnectX-7 NICs, the GPU driver's modules."""
    layout = make_pci(root)
    make_tree(root, pci=layout["nics"], parents=layout["parents"], **tree)
    make_modules(root, modules, version=version, taint=taint)
    return layout


# --- roce_gid ---------------------------------------------------------------------------------------------------


def roce_node(root, roce=None, **kwargs):
    make_tree(root, link_layer="Ethernet", rate="200 Gb/sec (4X HDR)", roce=ROCE if roce is None else roce, **kwargs)
    return root


def test_every_roce_port_with_an_ipv4_roce_v2_gid_passes_naming_its_index(tmp_path):
    checks, facts, _ops = audit(roce_node(tmp_path))
    entries = facts["devices"]["mlx5_0"]["ports"][0]["gids"]["entries"]
    assert [(entry["index"], entry["type"], entry["family"]) for entry in entries] == [
        (0, "IB/RoCE v1", "link-local"), (1, "RoCE v2", "link-local"), (2, "IB/RoCE v1", "ipv4"),
        (3, "RoCE v2", "ipv4")]
    check = checks["roce_gid"]
    assert check["status"] == "pass" and check["details"]["gid_index"] == [3]
    assert "mlx5_0 port 1 (0000:18:00.0): RoCE v2 IPv4 GID at index 3 (198.18.1.5 on ens0f0np0)" in check["found"]
    assert "NCCL_IB_GID_INDEX unset" in check["found"]


def test_a_roce_port_whose_device_has_no_ipv4_address_fails_naming_it(tmp_path):
    checks, _facts, _ops = audit(roce_node(tmp_path, roce=dict(ROCE, mlx5_6=None)))
    check = checks["roce_gid"]
    assert check["status"] == "fail"
    assert "mlx5_6 port 1 (0000:ce:00.0): no RoCE v2 IPv4 GID (entries: 0 fe80::5aa2:e1ff:fe4c:1a30 (IB/RoCE v1, " \
           "ens6f0np0); 1 fe80::5aa2:e1ff:fe4c:1a30 (RoCE v2, ens6f0np0)); its device ens6f0np0 has no IPv4 address" \
           in check["found"]
    assert "mlx5_0" not in check["found"] and "ip addr add" in check["fix"]


@pytest.mark.parametrize("env, status, found", [
    ({"NCCL_IB_GID_INDEX": "3"}, "pass", "(NCCL_IB_GID_INDEX=3)"),
    ({"NCCL_IB_GID_INDEX": "-1"}, "pass", "NCCL_IB_GID_INDEX unset"),
    ({"NCCL_IB_GID_INDEX": "0"}, "fail", "NCCL_IB_GID_INDEX=0 names 0 fe80::5aa2:e1ff:fe4c:1a30 (IB/RoCE v1, "
                                         "ens0f0np0), not a RoCE v2 IPv4 GID; the RoCE v2 IPv4 GID is at index 3"),
    ({"NCCL_IB_GID_INDEX": "5"}, "fail", "NCCL_IB_GID_INDEX=5 names no entry"),
    ({"NCCL_IB_GID_INDEX": "three"}, "fail", "NCCL_IB_GID_INDEX=three is not a number"),
    ({"NCCL_IB_ADDR_FAMILY": "AF_INET6"}, "fail", "no RoCE v2 IPv6 GID"),
    ({"NCCL_IB_ROCE_VERSION_NUM": "1"}, "pass", "RoCE v1 IPv4 GID at index 2"),
])
def test_the_job_environment_s_gid_settings_are_judged(tmp_path, env, status, found):
    checks, _facts, _ops = audit(roce_node(tmp_path), job_env=env)
    assert checks["roce_gid"]["status"] == status, checks["roce_gid"]
    assert found in checks["roce_gid"]["found"]
    if status == "fail" and "GID_INDEX" in str(env):
        assert "NCCL_IB_GID_INDEX=3" in checks["roce_gid"]["fix"]


def test_nccl_ib_hca_selects_the_ports_judged(tmp_path):
    roce_node(tmp_path, roce=dict(ROCE, mlx5_7=None))
    checks, _facts, _ops = audit(tmp_path, job_env={"NCCL_IB_HCA": "=mlx5_0,mlx5_1:1"})
    assert checks["roce_gid"]["status"] == "pass" and "mlx5_2" not in checks["roce_gid"]["found"]
    checks, _facts, _ops = audit(tmp_path, job_env={"NCCL_IB_HCA": "^mlx5_7"})
    assert checks["roce_gid"]["status"] == "pass" and "mlx5_6" in checks["roce_gid"]["found"]
    checks, _facts, _ops = audit(tmp_path, job_env={"NCCL_IB_HCA": "bnxt_re"})
    assert checks["roce_gid"]["status"] == "not_applicable"
    assert hca_filter("mlx5")("mlx5_10", 1) and not hca_filter("=mlx5_1")("mlx5_10", 1)
    assert not hca_filter("mlx5_0:2")("mlx5_0", 1) and hca_filter("mlx5_0:2")("mlx5_0", 2)


def test_nodes_without_roce_or_without_a_gid_table_have_nothing_to_fail(tmp_path):
    make_tree(tmp_path / "ib")
    checks, _facts, _ops = audit(tmp_path / "ib")
    assert checks["roce_gid"]["status"] == "not_applicable" and "no RoCE port" in checks["roce_gid"]["found"]
    make_tree(tmp_path / "bare", link_layer="Ethernet", roce=None)
    checks, _facts, _ops = audit(tmp_path / "bare")
    assert checks["roce_gid"]["status"] == "not_applicable" and "no GID table in sysfs" in checks["roce_gid"]["found"]
    checks, _facts, _ops = audit(roce_node(tmp_path / "down", down=("mlx5_2",), roce=dict(ROCE, mlx5_2=None)))
    assert checks["roce_gid"]["status"] == "pass" and checks["ports"]["status"] == "fail"
    assert "not active, see fabric.ports: mlx5_2 port 1" in checks["roce_gid"]["found"]
    checks, _facts, _ops = audit(tmp_path / "none")
    assert {check["status"] for check in checks.values()} == {"not_applicable"}


def test_gid_reader_shapes(tmp_path):
    write_gids(str(tmp_path), gid_table("198.19.2.3"), "eth2")
    table = node_gid.read_gids(str(tmp_path))
    assert table["present"] and [entry["address"] for entry in table["entries"]][2:] == ["198.19.2.3", "198.19.2.3"]
    assert node_gid.read_gids(str(tmp_path / "nothing")) == {"present": False, "entries": [], "error": None}
    assert node_gid.address_of("fe80:0000:0000:0000:0000:0000:0000:0001") == ("link-local", "fe80::1")
    assert node_gid.address_of("2001:0db8:0000:0000:0000:0000:0000:0001") == ("ipv6", "2001:db8::1")


# --- peer_memory ------------------------------------------------------------------------------------------------


def test_an_hgx_node_with_nvidia_peermem_loaded_passes(tmp_path):
    hgx(tmp_path)
    checks, facts, ops = audit(tmp_path)
    assert facts["gpudirect"]["gpus"]["nvidia"] == 8
    assert checks["peer_memory"]["status"] == "pass" and "nvidia_peermem loaded" in checks["peer_memory"]["found"]
    assert not any("modinfo" in call[0] for call in ops.calls)
    assert checks["pcie_acs"]["status"] == "pass"


@pytest.mark.parametrize("modinfo, programs, status, found", [
    ((0, PEERMEM_KO + "\n", ""), ("lspci", "modinfo"), "fail", "it is installed (%s) but not loaded" % PEERMEM_KO),
    ((1, "", "modinfo: ERROR: Module nvidia-peermem not found.\n"), ("lspci", "modinfo"), "fail",
     "modinfo finds no peer-memory module"),
    (None, ("lspci",), "fail", "modinfo is not installed"),
])
def test_no_peer_memory_module_and_no_dma_buf_fails(tmp_path, modinfo, programs, status, found):
    hgx(tmp_path, modules=("nvidia",))
    answers = {(MODINFO, "-F", "filename"): modinfo} if modinfo else {}
    checks, _facts, _ops = audit(tmp_path, answers=answers, programs=programs)
    check = checks["peer_memory"]
    assert check["status"] == status and found in check["found"]
    assert "the GPU driver is the proprietary kernel module (taint POE)" in check["found"]
    assert "modprobe nvidia-peermem" in check["fix"] and "/etc/modules-load.d" in check["fix"]


@pytest.mark.parametrize("taint, version, kernel, env, status, found", [
    ("OE", "550.90.07", "6.8.0-45-generic", None, "pass", "DMA-BUF: open GPU kernel module 550.90.07, kernel 6.8"),
    ("OE", "550.90.07", "5.4.0-196-generic", None, "fail", "kernel 5.4.0-196-generic is older than 5.12"),
    ("OE", "510.47.03", "6.8.0-45-generic", None, "fail", "driver 510.47.03 is older than R515"),
    ("OE", "550.90.07", "6.8.0-45-generic", {"NCCL_DMABUF_ENABLE": "0"}, "fail", "sets NCCL_DMABUF_ENABLE=0"),
])
def test_dma_buf_serves_where_the_open_module_and_the_kernel_allow(tmp_path, taint, version, kernel, env, status,
                                                                   found):
    hgx(tmp_path, modules=("nvidia",), taint=taint, version=version)
    checks, _facts, _ops = audit(tmp_path, job_env=env, kernel=kernel,
                                 answers={(MODINFO, "-F", "filename"): (1, "", "not found\n")})
    assert checks["peer_memory"]["status"] == status and found in checks["peer_memory"]["found"]


def test_peer_memory_applies_to_nvidia_gpus_beside_infiniband_or_roce_only(tmp_path):
    hgx(tmp_path / "warn", modules=("nvidia",))
    checks, _facts, _ops = audit(tmp_path / "warn", programs=("lspci",), fabric_peer_memory_required=False)
    assert checks["peer_memory"]["status"] == "warn"
    make_tree(tmp_path / "cpu")
    checks, _facts, _ops = audit(tmp_path / "cpu")
    assert checks["peer_memory"]["status"] == "not_applicable" and "no NVIDIA GPU" in checks["peer_memory"]["found"]
    hgx(tmp_path / "nodriver", modules=())
    checks, _facts, _ops = audit(tmp_path / "nodriver", programs=("lspci",))
    assert checks["peer_memory"]["status"] == "skipped" and "NVIDIA kernel module is not loaded" in \
        checks["peer_memory"]["found"]


# --- pcie_acs ---------------------------------------------------------------------------------------------------


def test_acs_redirecting_on_the_bridges_between_gpus_and_nics_fails_naming_them(tmp_path):
    layout = hgx(tmp_path)
    text = lspci_text(layout, acs_on=("0000:39:01.0", "0000:39:02.0"))
    checks, facts, ops = audit(tmp_path, answers={(LSPCI, "-D", "-vvv"): (0, text, "")})
    assert [LSPCI, "-D", "-vvv"] in ops.calls
    assert len(facts["gpudirect"]["pairs"]) == 16
    check = checks["pcie_acs"]
    assert check["status"] == "fail" and check["details"]["bridges"] == ["0000:39:01.0", "0000:39:02.0"]
    assert "0000:39:01.0 (PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0) (prog-if 00 [Normal " \
           "decode]); ACSCtl ReqRedir+ CmpltRedir+; between GPU 0000:3a:00.0 - NIC 0000:3b:00.0, GPU 0000:5d:00.0 - " \
           "NIC 0000:3b:00.0)" in check["found"]
    assert "0000:17:01.0" not in check["found"]
    assert "setpci -s 0000:39:01.0 ECAP_ACS+0x6.w=0000; setpci -s 0000:39:02.0 ECAP_ACS+0x6.w=0000" in check["fix"]
    assert "fabric_acs_disable_at_boot" in check["fix"]


def test_acs_unobservable_is_never_a_pass(tmp_path):
    layout = hgx(tmp_path)
    checks, _facts, _ops = audit(tmp_path, programs=("modinfo",))
    assert checks["pcie_acs"]["status"] == "skipped" and "lspci is not installed" in checks["pcie_acs"]["found"]
    checks, _facts, _ops = audit(tmp_path, answers={(LSPCI, "-D", "-vvv"): (0, lspci_text(layout, denied=True), "")})
    assert checks["pcie_acs"]["status"] == "skipped" and checks["pcie_acs"]["found"].startswith("needs root")
    checks, _facts, _ops = audit(tmp_path, answers={(LSPCI, "-D", "-vvv"): (1, "", "pcilib: Cannot open\n")})
    assert checks["pcie_acs"]["status"] == "skipped" and "Cannot open" in checks["pcie_acs"]["found"]


def test_acs_with_direct_translated_p2p_is_a_vm_with_ats_not_a_fault(tmp_path):
    layout = hgx(tmp_path)
    text = lspci_text(layout, acs_on=("0000:17:01.0",)).replace(ACS_ON, ACS_ON.replace("DirectTrans-", "DirectTrans+"))
    checks, _facts, _ops = audit(tmp_path, answers={(LSPCI, "-D", "-vvv"): (0, text, "")})
    assert checks["pcie_acs"]["status"] == "pass" and "Direct Translated P2P on" in checks["pcie_acs"]["found"]


def test_gpus_and_nics_under_no_shared_switch_need_no_acs_check(tmp_path):
    layout = make_pci(tmp_path)
    make_tree(tmp_path, pci=["0000:%02x:00.0" % bus for bus in range(0xe0, 0xe8)])
    make_modules(tmp_path)
    checks, _facts, ops = audit(tmp_path)
    assert checks["pcie_acs"]["status"] == "not_applicable" and "no GPU and RDMA NIC share a PCIe switch" in \
        checks["pcie_acs"]["found"]
    assert not any("lspci" in call[0] for call in ops.calls) and layout["gpus"]


def test_lspci_parser_reads_acs_and_denied_capabilities():
    text = lspci_text(acs_on=("0000:17:01.0",))
    devices = lspci.parse(text)
    assert lspci.redirecting(devices["0000:17:01.0"]["acs"]) == ["ReqRedir", "CmpltRedir"]
    assert lspci.redirecting(devices["0000:17:00.0"]["acs"]) == []
    assert lspci.parse(lspci_text(denied=True))["0000:17:01.0"] == {
        "name": "PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0) (prog-if 00 [Normal decode])",
        "acs": None, "denied": True}
    assert len(hgx_layout()["gpus"]) == 8


# --- net_plugin ---------------------------------------------------------------------------------------------------


def efa_node(root, conf=None, files=()):
    """Four EFA devices (p4d/p5 style), the loader's configuration ``conf`` (file -> text) and plugin ``files``."""
    make_tree(root, ports=4, rate="100 Gb/sec", link_layer="Unspecified", driver="efa",
              device_names=["rdmap%ds0" % (16 + index) for index in range(4)])
    for path, text in dict({"etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\n"}, **(conf or {})).items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    for path in files:
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("ELF\n")
    return root


def test_efa_without_the_plugin_fails_and_says_where_it_was_found(tmp_path):
    efa_node(tmp_path, files=["/opt/amazon/ofi-nccl/lib/libnccl-net.so"])
    checks, facts, _ops = audit(tmp_path)
    assert [device["kind"] for device in facts["devices"].values()] == ["efa"] * 4
    check = checks["net_plugin"]
    assert check["status"] == "fail" and "4 EFA devices" in check["found"]
    assert "no libnccl-net.so where NCCL looks (NCCL_NET_PLUGIN unset; searched /lib, /usr/lib" in check["found"]
    assert "found outside the search path: /opt/amazon/ofi-nccl/lib/libnccl-net.so" in check["found"]
    assert "aws-ofi-nccl" in check["fix"] and "ld.so.conf.d" in check["fix"]
    assert checks["peer_memory"]["status"] == "not_applicable" and checks["roce_gid"]["status"] == "not_applicable"


@pytest.mark.parametrize("conf, files, env, found", [
    ({"etc/ld.so.conf.d/aws-ofi-nccl.conf": "/opt/amazon/ofi-nccl/lib\n"}, ["/opt/amazon/ofi-nccl/lib/libnccl-net.so"],
     None, "/opt/amazon/ofi-nccl/lib/libnccl-net.so"),
    (None, ["/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so"],
     {"NCCL_NET_PLUGIN": "ofi", "LD_LIBRARY_PATH": "/opt/amazon/ofi-nccl/lib:/usr/local/cuda/lib64"},
     "/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so"),
    (None, ["/srv/nccl/libnccl-net.so"], {"NCCL_NET_PLUGIN": "/srv/nccl/libnccl-net.so"}, "/srv/nccl/libnccl-net.so"),
    (None, ["/usr/lib/libnccl-net.so"], None, "/usr/lib/libnccl-net.so"),
])
def test_the_plugin_where_the_job_s_dlopen_looks_passes(tmp_path, conf, files, env, found):
    efa_node(tmp_path, conf, files)
    checks, _facts, _ops = audit(tmp_path, job_env=env)
    assert checks["net_plugin"]["status"] == "pass", checks["net_plugin"]
    assert found in checks["net_plugin"]["found"]


def test_a_job_on_sockets_needs_no_plugin(tmp_path):
    efa_node(tmp_path)
    checks, _facts, _ops = audit(tmp_path, job_env={"NCCL_NET": "Socket"})
    assert checks["net_plugin"]["status"] == "not_applicable"
    assert node_plugin.wanted_names("ofi") == ["libnccl-net-ofi.so", "ofi.so"]


def test_ignored_devices_and_nccl_ib_hca_leave_the_gpudirect_checks(tmp_path):
    """A management RDMA device the site leaves out (fabric_ignore_devices), or that NCCL_IB_HCA does not select,
    makes no GPUDirect demand."""
    layout = hgx(tmp_path, modules=("nvidia",))
    every = ["mlx5_%d" % index for index in range(8)]
    checks, _facts, _ops = audit(tmp_path, programs=("lspci",), fabric_ignore_devices=every)
    assert {checks[name]["status"] for name in ("peer_memory", "pcie_acs", "net_plugin")} == {"not_applicable"}
    text = lspci_text(layout, acs_on=("0000:17:01.0",))
    checks, _facts, _ops = audit(tmp_path, job_env={"NCCL_IB_HCA": "=mlx5_2,mlx5_3"}, programs=("lspci",),
                                 answers={(LSPCI, "-D", "-vvv"): (0, text, "")})
    # mlx5_0 (19:00.0) sits behind 17:01.0: not selected, so its bridge is not judged; peer memory still applies.
    assert checks["pcie_acs"]["status"] == "pass" and "0000:17:01.0" not in checks["pcie_acs"]["found"]
    assert checks["peer_memory"]["status"] == "fail"
