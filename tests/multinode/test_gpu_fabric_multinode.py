"""GPU health, RDMA fabric and the known-good profile end to end on the namespace test bed: nine nodes that
look like 8-GPU InfiniBand nodes, each with its own fake ``nvidia-smi``, ``dcgmi``, ``journalctl`` and ``lspci`` (in
its own overlay of ``/usr/local/bin``, first on its PATH), its own fake PCI bus and ``/sys/class/infiniband`` tree,
all over real SSH; the all-reduce itself stays real (gloo).

Three playbook runs: the first four nodes, healthy, pass and ``baseline`` records their profile; then, the four gated
against that profile, one node drifts (another driver), one lost a GPU and an IB port, and one logged Xid 79, lost an
NVLink and takes link errors while the all-reduce runs (a counter bumped mid-run): each fails with exactly its
findings, the healthy node passes.  In the same run two healthy nodes of other kinds, without a profile, pass: one
with its eight GPUs in MIG mode (nvidia-smi answers NVLink queries with a sentence, row remapping is N/A), one with
two HDR adapters of another type next to its six NDR ones (their rate is compared with their own kind).

The third run gates nine HGX nodes whose PCIe tree puts each pair of GPUs and NICs under a switch, with NVSwitches
and a fabric manager process of their own: one healthy, and eight each with one of the field's faults, named on that
node alone with its cause and fix: the fabric manager not running (every GPU's fabric Not Started), one GPU whose
NVLinks are all inactive, a GPU the driver says needs a reset, a GPU that failed to initialise with no Xid line, a
RoCE port without an IPv4 GID, no peer-memory module, ACS redirecting on a switch's bridges, EFA without NCCL's
plugin."""

import os
import threading
import time

import pytest
import yaml

import fabric_tree
import fake_gpu_tools
from cluster_preflight.cli import main as cli
from gate_helpers import explain, rank_processes
from gpu_health_helpers import FIXTURES, make_sysfs, nvidia_node
from playbook import run_playbook
from testbed import testbed_fixture

pytestmark = pytest.mark.timeout(900)

NODES = 9
# The nodes of the second run (the third gates all nine).
FIRST_SIX = 6
HEALTHY_XML = os.path.join(FIXTURES, "nvidia_smi_h100_healthy.xml")
MIG_XML = os.path.join(FIXTURES, "nvidia_smi_h100_mig.xml")
# Two ConnectX-6 (MT4123) HDR ports next to the node's six ConnectX-7 NDR ones, all InfiniBand.
MIXED = {"slow": {"mlx5_6": "200 Gb/sec (4X HDR)", "mlx5_7": "200 Gb/sec (4X HDR)"},
         "adapters": {"mlx5_6": ("MT4123", "MT_0000000223"), "mlx5_7": ("MT4123", "MT_0000000223")}}
EXTRA = {"ssh_trust_mesh": False}


@pytest.fixture(scope="module")
def bed(request):
    return testbed_fixture(request, nodes=NODES, private_dirs=("/etc", "/usr/local/bin"))


def drifted_xml(directory):
    """The healthy node's XML with another driver (what a node left out of an upgrade shows)."""
    path = directory / "drifted.xml"
    with open(HEALTHY_XML) as handle:
        path.write_text(handle.read().replace("550.90.07", "550.54.15"))
    return str(path)


def install_tools(bed, node, root, xml=HEALTHY_XML, kernel_log="kernel_log_clean.txt", nvlink_down=None,
                  nvlink_file=None, **more):
    """Fake GPU tools (``more``: ``lspci``, ``fabric_manager``) in ``node``'s own /usr/local/bin."""
    staging = root / "bin"
    fake_gpu_tools.install(staging, nvidia_xml=xml, kernel_log=os.path.join(FIXTURES, kernel_log),
                           dcgm_json=os.path.join(FIXTURES, "dcgmi_diag_r1_pass.json"), nvlink_down=nvlink_down,
                           nvlink_file=nvlink_file, **more)
    # Written from inside the node (its own mount namespace), replacing what an earlier test put there.
    bed.run(node, ["sh", "-c", "rm -rf /usr/local/bin/.fake_gpu /usr/local/bin/nvidia-smi /usr/local/bin/dcgmi "
                   "/usr/local/bin/journalctl /usr/local/bin/lspci /usr/local/bin/nv-fabricmanager && "
                   "cp -a %s/. /usr/local/bin/" % staging], check=True)
    assert "NVIDIA H100" in bed.run(node, ["nvidia-smi", "-q", "-x"], check=True).stdout


def make_gpu_node(bed, node, root, xml=HEALTHY_XML, kernel_log="kernel_log_clean.txt", gpus_on_bus=8, down=(),
                  nvlink_down=None, nvlink_file=None, fabric=None):
    """Fake GPU tools in ``node``'s /usr/local/bin, a fake PCI bus and IB tree (``fabric``: more of
    ``fabric_tree.make_tree``'s arguments); returns the node's host vars."""
    install_tools(bed, node, root, xml, kernel_log, nvlink_down, nvlink_file)
    sysfs = make_sysfs(root, nvidia_node(gpus_on_bus))
    fabric_tree.make_tree(str(root / "fab"), down=down, **(fabric or {}))
    return {"gpu_health_sysfs_root": str(sysfs), "fabric_sysfs_root": str(root / "fab")}


def hardware_checks(verdict, host):
    return {name: check for name, check in verdict["nodes"][host]["checks"].items()
            if name.startswith(("gpu_health.", "fabric.", "profile."))}


def failed(verdict, host):
    return sorted(name for name, check in verdict["nodes"][host]["checks"].items() if check["status"] == "fail")


def h100_nodes(bed):
    """The four nodes of the profiled group (the other two are nodes of other kinds)."""
    return bed.nodes[:4]


@pytest.fixture(scope="module")
def recorded(bed, tmp_path_factory):
    """The healthy run of the profiled group, and the profile ``baseline`` recorded from it."""
    tmp_path = tmp_path_factory.mktemp("healthy")
    host_vars = {node.name: make_gpu_node(bed, node, tmp_path / node.name) for node in h100_nodes(bed)}
    inventory = bed.write_inventory(path=str(tmp_path / "inventory.yml"), host_vars=host_vars)
    limit = ",".join(node.name for node in h100_nodes(bed))
    result = run_playbook(tmp_path, inventory=inventory, timeout=600, extravars=EXTRA, limit=limit)
    assert result.verdict is not None, explain(result)
    out = tmp_path / "profiles"
    code = cli.main(["baseline", "-i", inventory, "--from", os.path.join(result.results_dir, "latest"),
                     "--out", str(out), "--group", "cluster"])
    return result, code, str(out / "cluster.yml")


def test_a_healthy_gpu_bed_passes_every_gpu_and_fabric_check_and_baseline_records_it(bed, recorded):
    result, code, profile = recorded
    verdict = result.verdict
    assert verdict["status"] == "pass", explain(result)
    assert sorted(verdict["hosts"]) == sorted(node.name for node in h100_nodes(bed))
    for node in h100_nodes(bed):
        checks = hardware_checks(verdict, node.name)
        for name in ("gpu_health.count", "gpu_health.ecc", "gpu_health.memory", "gpu_health.throttle",
                     "gpu_health.pcie", "gpu_health.nvlink", "gpu_health.xid", "gpu_health.dcgm", "fabric.ports",
                     "fabric.rate",
                     "fabric.counters"):
            assert checks[name]["status"] == "pass", (node.name, name, checks[name])
        assert "8 " in checks["gpu_health.count"]["found"]
        assert "compared" in checks["fabric.counters"]["found"]
    assert code == 0 and os.path.exists(profile)
    with open(profile) as handle:
        fields = yaml.safe_load(handle)["fields"]
    assert fields["gpu.count"] == 8 and fields["gpu.model"] == "NVIDIA H100 80GB HBM3"
    assert fields["gpu.driver_version"] == "550.90.07" and fields["rdma.active_ports"] == 8
    assert fields["rdma.rate_gbps"] == 400 and fields["allreduce.backend"] == "gloo"


def bump_when_ranks_run(bed, node, tree, done):
    """Once ``node``'s ranks run (the all-reduce, after the facts' first read), link errors on mlx5_5."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not done.is_set():
        if rank_processes(bed, node):
            fabric_tree.bump(tree, "mlx5_5", 1, "symbol_error", 7)
            fabric_tree.bump(tree, "mlx5_5", 1, "link_downed", 1)
            return
        time.sleep(0.05)


def test_each_hardware_fault_and_a_drift_from_the_profile_fail_exactly_their_node(bed, recorded, tmp_path):
    _result, _code, profile = recorded
    healthy, drifted, short, xid, mig, mixed = (node.name for node in bed.nodes[:FIRST_SIX])
    host_vars = {
        healthy: make_gpu_node(bed, bed.nodes[0], tmp_path / healthy),
        drifted: make_gpu_node(bed, bed.nodes[1], tmp_path / drifted, xml=drifted_xml(tmp_path)),
        short: make_gpu_node(bed, bed.nodes[2], tmp_path / short,
                             xml=os.path.join(FIXTURES, "nvidia_smi_h100_7gpus.xml"), down=("mlx5_3",)),
        xid: make_gpu_node(bed, bed.nodes[3], tmp_path / xid, kernel_log="kernel_log_xid79.txt", nvlink_down={2: [4]}),
        mig: make_gpu_node(bed, bed.nodes[4], tmp_path / mig, xml=MIG_XML,
                           nvlink_file=os.path.join(FIXTURES, "nvidia_smi_nvlink_mig.txt")),
        mixed: make_gpu_node(bed, bed.nodes[5], tmp_path / mixed, fabric=MIXED),
    }
    for node in h100_nodes(bed):
        host_vars[node.name]["profile_file"] = profile
    inventory = bed.write_inventory(path=str(tmp_path / "inventory.yml"), host_vars=host_vars)
    done = threading.Event()
    striker = threading.Thread(target=bump_when_ranks_run, args=(bed, bed.nodes[3], host_vars[xid]["fabric_sysfs_root"],
                                                                 done))
    striker.start()
    try:
        # gloo busbw on a shared 2-core machine varies run to run: the test is about the hardware fields.
        result = run_playbook(tmp_path, inventory=inventory, timeout=600,
                              extravars=dict(EXTRA, profile_busbw_tolerance=0.95),
                              limit=",".join(node.name for node in bed.nodes[:FIRST_SIX]))
    finally:
        done.set()
        striker.join()
    verdict = result.verdict
    assert verdict is not None, explain(result)
    assert sorted(verdict["failed_hosts"]) == sorted([drifted, short, xid]), explain(result)
    # The healthy node: nothing failed, every GPU, fabric and profile check passed (the bed is not brought up, so
    # its core-dump settings warn).
    assert failed(verdict, healthy) == [] and verdict["nodes"][healthy]["status"] == "warn"
    # A flat PCI bus without NVSwitches, GPUs beside no NIC of its fabric tree: those checks do not apply.
    assert {name for name, check in hardware_checks(verdict, healthy).items() if check["status"] != "pass"} == {
        "gpu_health.fabric_manager", "fabric.roce_gid", "fabric.peer_memory", "fabric.pcie_acs", "fabric.net_plugin"}
    assert failed(verdict, drifted) == ["profile.gpu_driver_version"]
    drift = verdict["nodes"][drifted]["checks"]["profile.gpu_driver_version"]
    assert "550.54.15" in drift["found"] and "550.90.07" in drift["expected"] and profile in drift["expected"]
    assert failed(verdict, short) == ["fabric.ports", "gpu_health.count", "profile.gpu_count",
                                      "profile.rdma_active_ports"]
    checks = verdict["nodes"][short]["checks"]
    assert "mlx5_3 port 1" in checks["fabric.ports"]["found"] and "DOWN" in checks["fabric.ports"]["found"]
    assert "7" in checks["gpu_health.count"]["found"] and "8" in checks["gpu_health.count"]["found"]
    # The driver's own "fallen off the bus" line next to the Xid names the loss in gpu_lost too.
    assert failed(verdict, xid) == ["fabric.counters", "gpu_health.gpu_lost", "gpu_health.nvlink", "gpu_health.xid",
                                    "profile.gpu_nvlinks_active_min"]
    checks = verdict["nodes"][xid]["checks"]
    assert "79" in checks["gpu_health.xid"]["found"] and "5D:00" in checks["gpu_health.xid"]["found"].upper()
    assert "symbol_error" in checks["fabric.counters"]["found"] and "mlx5_5" in checks["fabric.counters"]["found"]
    assert "GPU 2 (00000000:3A:00.0) has 17 active NVLinks, its peers 18 (inactive: link 4)" in checks[
        "gpu_health.nvlink"]["found"]
    # The nodes of other kinds: nothing failed, what MIG mode hides said so, the HDR adapters judged among their kind.
    for host in (mig, mixed):
        assert failed(verdict, host) == [] and verdict["nodes"][host]["status"] == "warn", explain(result)
    checks = verdict["nodes"][mig]["checks"]
    assert checks["gpu_health.nvlink"]["status"] == "not_applicable"
    assert "Nvlink queries are not supported for Devices in MIG mode" in checks["gpu_health.nvlink"]["found"]
    memory = checks["gpu_health.memory"]
    assert memory["status"] == "not_applicable" and "MIG mode" in memory["found"]
    assert all(checks[name]["status"] == "pass" for name in ("gpu_health.count", "gpu_health.ecc", "gpu_health.pcie",
                                                               "gpu_health.xid", "fabric.rate", "fabric.ports"))
    rate = verdict["nodes"][mixed]["checks"]["fabric.rate"]
    assert rate["status"] == "pass" and "InfiniBand MT4123 200 Gb/sec (4X HDR)" in rate["found"], rate
    for host in (drifted, short, xid):
        for name in failed(verdict, host):
            check = verdict["nodes"][host]["checks"][name]
            assert check["found"] and check["expected"] and check["fix"], (host, name, check)


# --- the third run: nine HGX nodes, eight of them each with one of the field's faults ----------------------------


LOST_LOG = "kernel_log_init_failed.txt"


def init_failed_log(directory):
    """The clean kernel log with the driver failing to bring up the GPU at 9a:00.0, and no Xid line."""
    path = directory / LOST_LOG
    with open(os.path.join(FIXTURES, "kernel_log_clean.txt")) as handle:
        clean = handle.read()
    path.write_text(clean + "[    6.104417] gpu-node07 kernel: NVRM: GPU 0000:9a:00.0: RmInitAdapter failed! "
                    "(0x25:0xffff:1601)\n[    6.104593] gpu-node07 kernel: NVRM: GPU 0000:9a:00.0: rm_init_adapter "
                    "failed, device minor number 4\n")
    return str(path)


def make_hgx_node(bed, node, root, xml=HEALTHY_XML, kernel_log="kernel_log_clean.txt", nvlink_file=None,
                  fabric_manager=True, modules=("nvidia", "nvidia_peermem"), acs_on=(), fabric=None):
    """An HGX node: the fake tools, one sysfs tree with its PCIe switches, GPUs, NVSwitches and NICs
    (``fabric``: more of ``make_tree``'s arguments) and /sys/module, and a fabric manager process unless
    ``fabric_manager`` is false; returns ``(host vars, the fabric manager's Popen or None)``."""
    sysfs = str(root / "sys")
    layout = fabric_tree.make_pci(sysfs)
    install_tools(bed, node, root, xml, kernel_log, nvlink_file=nvlink_file,
                  lspci=fabric_tree.lspci_text(layout, acs_on=acs_on), fabric_manager=True)
    fabric_tree.make_tree(sysfs, pci=layout["nics"], parents=layout["parents"], **(fabric or {}))
    fabric_tree.make_modules(sysfs, modules)
    manager = bed.spawn(node, ["/usr/local/bin/nv-fabricmanager", "900"]) if fabric_manager else None
    return {"gpu_health_sysfs_root": sysfs, "fabric_sysfs_root": sysfs}, manager


ROCE = {"link_layer": "Ethernet", "roce": dict({"mlx5_%d" % index: "198.18.%d.5" % (index + 1) for index in range(8)},
                                               mlx5_5=None)}
EFA = {"link_layer": "Unspecified", "rate": "100 Gb/sec", "driver": "efa",
       "device_names": ["rdmap%ds0" % (79 + index) for index in range(8)],
       "adapters": {index: ("efa", "efa") for index in range(8)}}
FIELD_FAULTS = (
    # name, make_hgx_node arguments, the checks that fail, (check, a part of its found, a part of its fix)
    ("healthy", {}, [], None),
    ("fm_down", {"fabric_manager": False, "xml": os.path.join(FIXTURES, "nvidia_smi_h100_fabric_not_started.xml")},
     ["gpu_health.fabric_manager", "gpu_health.gpu_fabric"],
     ("gpu_health.fabric_manager", "no process runs (no systemd on the node)", "systemctl enable --now")),
    ("nvlink_gone", {"nvlink_file": os.path.join(FIXTURES, "nvidia_smi_nvlink_h100_gpu2_all_down.txt")},
     ["gpu_health.nvlink"], ("gpu_health.nvlink", "GPU 2 (00000000:3A:00.0) has 0 active NVLinks, its peers 18",
                             "NVLink")),
    ("needs_reset", {"xml": os.path.join(FIXTURES, "nvidia_smi_h100_reset_required.xml")},
     ["gpu_health.reset_required"], ("gpu_health.reset_required", "GPU 1 (00000000:2A:00.0) gpu_reset_status/"
                                     "reset_required is Yes", "nvidia-smi -r -i 1")),
    ("init_failed", {"xml": os.path.join(FIXTURES, "nvidia_smi_h100_7gpus.xml"), "kernel_log": LOST_LOG},
     ["gpu_health.count", "gpu_health.gpu_lost"],
     ("gpu_health.gpu_lost", "the GPU at PCI 00000000:9A:00.0 failed to initialise, 2 lines",
      "could not bring the GPU up")),
    ("roce_no_ipv4", {"fabric": ROCE}, ["fabric.roce_gid"],
     ("fabric.roce_gid", "mlx5_5 port 1 (0000:ac:00.0): no RoCE v2 IPv4 GID", "NCCL_IB_GID_INDEX=3")),
    ("no_peermem", {"modules": ("nvidia",)}, ["fabric.peer_memory"],
     ("fabric.peer_memory", "no peer-memory module loaded", "modprobe nvidia-peermem")),
    ("acs_on", {"acs_on": ("0000:99:01.0", "0000:99:03.0")}, ["fabric.pcie_acs"],
     ("fabric.pcie_acs", "0000:99:01.0 (PCI bridge", "setpci -s 0000:99:01.0 ECAP_ACS+0x6.w=0000")),
    ("efa_no_plugin", {"fabric": EFA}, ["fabric.net_plugin"],
     ("fabric.net_plugin", "8 EFA devices", "aws-ofi-nccl")),
)


def test_each_field_fault_fails_its_node_alone_with_its_cause_and_fix(bed, tmp_path):
    assert len(FIELD_FAULTS) == len(bed.nodes)
    host_vars, managers = {}, []
    for (name, kwargs, _failing, _named), node in zip(FIELD_FAULTS, bed.nodes):
        root = tmp_path / node.name
        root.mkdir()
        if kwargs.get("kernel_log") == LOST_LOG:
            kwargs = dict(kwargs, kernel_log=init_failed_log(root))
        host_vars[node.name], manager = make_hgx_node(bed, node, root, **kwargs)
        managers.append(manager)
    inventory = bed.write_inventory(path=str(tmp_path / "inventory.yml"), host_vars=host_vars)
    try:
        # Compared with each other, nodes of one cluster with different fabrics (RoCE, EFA) are profile outliers
        # too: this run is about each node's own fault.
        result = run_playbook(tmp_path, inventory=inventory, timeout=600, extravars=dict(EXTRA, profile_enabled=False))
    finally:
        for manager in managers:
            if manager is not None:
                manager.kill()
                manager.wait(timeout=10)
    verdict = result.verdict
    assert verdict is not None, explain(result)
    by_name = {name: node.name for (name, _kwargs, _failing, _named), node in zip(FIELD_FAULTS, bed.nodes)}
    assert sorted(verdict["failed_hosts"]) == sorted(by_name[name] for name, _k, failing, _n in FIELD_FAULTS
                                                     if failing), explain(result)
    healthy = by_name["healthy"]
    checks = hardware_checks(verdict, healthy)
    assert {name for name, check in checks.items() if check["status"] != "pass"} == {
        "fabric.roce_gid", "fabric.net_plugin", "profile.enabled"}, checks
    assert "4 NVSwitches" in checks["gpu_health.fabric_manager"]["found"]
    assert "nvidia_peermem loaded" in checks["fabric.peer_memory"]["found"]
    assert "20 bridges between GPUs and NICs, none redirecting" in checks["fabric.pcie_acs"]["found"]
    for name, _kwargs, failing, named in FIELD_FAULTS[1:]:
        host = by_name[name]
        assert failed(verdict, host) == failing, (name, explain(result))
        check_name, found, fix = named
        check = verdict["nodes"][host]["checks"][check_name]
        assert found in check["found"] and host in check["found"], (name, check)
        assert fix in check["fix"], (name, check)
        for check_name in failing:
            check = verdict["nodes"][host]["checks"][check_name]
            assert check["found"] and check["expected"] and check["fix"], (host, check_name, check)
