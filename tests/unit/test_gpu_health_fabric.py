"""gpu_health's checks of what stops a GPU from taking work while its telemetry looks healthy: the NVSwitch fabric
manager and each GPU's fabric state, a GPU that needs a reset or that nvidia-smi cannot reach, a GPU the kernel says
it lost without an Xid line, and one GPU whose NVLinks are all down beside siblings whose links are up.  The node is
read through FakeOps, a sysfs sandbox (its PCI bus with the NVSwitches) and a proc sandbox (the processes)."""

import functools

import pytest

from preflight_node import checks as preflight_checks
from preflight_node.gpu import nvidia_smi_xml, nvlink, nvswitch, xid_log as kernel_log
from preflight_node.host import services
from cluster_preflight.capabilities import gpu_health
from capability_helpers import assert_contract as check_contract, statuses
from gpu_health_helpers import (ASPEED, H100, H100_BUS, HOST, MI300X, MI300X_BUS, NVSWITCH, NVSWITCH_BUS, PROGRAMS,
                                fixture, make_sysfs, nvidia_node, read_node)

assert_contract = functools.partial(check_contract, "gpu_health", host=HOST)
ALL_PASS = {name: "pass" for name in gpu_health.CHECKS}
SHOW = (PROGRAMS["systemctl"], "show")


def audit(tmp_path, **kwargs):
    facts, wanted, ops = read_node(tmp_path, **kwargs)
    checks = gpu_health.decide(HOST, facts, wanted)
    assert_contract(checks)
    return checks, facts, ops


def unit(active="active", sub="running", load="loaded", enabled="enabled"):
    return (0, "LoadState=%s\nActiveState=%s\nSubState=%s\nUnitFileState=%s\n" % (load, active, sub, enabled), "")


def systemd_node(tmp_path, answer, **kwargs):
    """A node whose init is systemd and whose ``systemctl show nvidia-fabricmanager`` prints ``answer``."""
    return audit(tmp_path, processes=(), init="systemd", programs=["nvidia-smi", "journalctl", "dcgmi", "dmesg", "systemctl"],
                 extra={SHOW: answer}, **kwargs)


# --- the fabric manager ------------------------------------------------------------------------------------


def test_an_hgx_node_with_its_fabric_manager_running_passes_without_systemd(tmp_path):
    checks, facts, _ops = audit(tmp_path)
    assert statuses(checks) == ALL_PASS
    assert [switch["address"] for switch in facts["nvswitch"]["devices"]] == NVSWITCH_BUS
    assert facts["nvswitch"]["service"]["systemd"] is False and facts["nvswitch"]["service"]["pids"] == [2]
    found = checks["fabric_manager"]["found"]
    assert "4 NVSwitches on the PCI bus of %s" % HOST in found
    assert "nv-fabricmanager: running, pid 2 (no systemd on the node)" in found


def test_no_fabric_manager_process_on_an_nvswitch_node_fails_with_error_802_named(tmp_path):
    checks, _facts, _ops = audit(tmp_path, processes=(), xml="nvidia_smi_h100_fabric_not_started.xml")
    assert statuses(checks) == dict(ALL_PASS, fabric_manager="fail", gpu_fabric="fail")
    check = checks["fabric_manager"]
    assert "no process runs (no systemd on the node)" in check["found"] and "error 802" in check["found"]
    assert "systemctl enable --now nvidia-fabricmanager" in check["fix"] and "550.90.07" in check["fix"]
    fabric = checks["gpu_fabric"]["found"]
    assert "GPU 0 (00000000:18:00.0) fabric/state is Not Started (no fabric manager has trained its NVLinks)" in fabric
    assert "GPU 7 (00000000:DB:00.0) fabric/state is Not Started" in fabric
    assert "gpu_health.fabric_manager" in checks["gpu_fabric"]["fix"]


@pytest.mark.parametrize("answer, status, found, fix", [
    (unit(), "pass", "nvidia-fabricmanager.service: active/running, enabled at boot", ""),
    (unit(enabled="disabled"), "warn", "not enabled at boot (UnitFileState disabled) (LoadState loaded): it will not start after a reboot",
     "systemctl enable nvidia-fabricmanager"),
    (unit(active="failed", sub="failed"), "fail", "nvidia-fabricmanager.service: failed/failed",
     "journalctl -u nvidia-fabricmanager"),
    (unit(load="not-found", active="inactive", sub="dead", enabled=""), "fail",
     "nvidia-fabricmanager is not installed", "nvidia-fabricmanager package of driver 550.90.07"),
])
def test_the_fabric_manager_unit_as_systemd_reports_it(tmp_path, answer, status, found, fix):
    checks, facts, ops = systemd_node(tmp_path, answer)
    assert facts["nvswitch"]["service"]["systemd"] is True
    assert [PROGRAMS["systemctl"], "show", "nvidia-fabricmanager", "--no-pager",
            "--property=LoadState,ActiveState,SubState,UnitFileState"] in ops.calls
    check = checks["fabric_manager"]
    assert check["status"] == status, check
    assert found in check["found"] and fix in check["fix"]


def test_a_node_without_nvswitch_asks_nothing_about_a_fabric_manager(tmp_path):
    checks, facts, ops = audit(tmp_path, devices=nvidia_node(), processes=())
    assert facts["nvswitch"] == {"devices": [], "error": None, "service": None}
    assert not any("systemctl" in call[0] for call in ops.calls)
    assert checks["fabric_manager"]["status"] == "not_applicable"
    assert "no NVSwitch on the PCI bus" in checks["fabric_manager"]["found"]


def test_nvswitches_whose_gpus_the_driver_does_not_see_still_need_their_fabric_manager(tmp_path):
    """Every GPU gone from the bus and from nvidia-smi: the switches are still there, and so is the question."""
    devices = [("0000:03:00.0", ASPEED)] + [(address, NVSWITCH) for address in NVSWITCH_BUS]
    checks, _facts, _ops = audit(tmp_path, devices=devices, processes=(), xml=(6, "No devices were found\n", ""))
    assert checks["fabric_manager"]["status"] == "fail" and checks["count"]["status"] == "not_applicable"


def test_services_read_the_process_table_by_the_kernel_s_short_name(tmp_path):
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "comm").write_text("systemd\n")
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "comm").write_text("nv-fabricmanage\n")
    (tmp_path / "self").mkdir()
    assert services.systemd_is_init(str(tmp_path)) is True
    assert services.processes(str(tmp_path), "nv-fabricmanager") == [77]
    assert services.parse_show("LoadState=loaded\nActiveState=active\nnoise\n") == {"LoadState": "loaded",
                                                                                     "ActiveState": "active"}


def test_nvswitch_scan_takes_nvidia_bridges_only(tmp_path):
    sysfs = make_sysfs(tmp_path, [(NVSWITCH_BUS[0], NVSWITCH), ("0000:10:00.0", ("0x1000", "0xc030", "0x060400")),
                                  (H100_BUS[0], H100), ("0000:11:00.0", ("0x10de", "0x22a3", "0x060400"))])
    assert nvswitch.scan(str(sysfs)) == {"devices": [{"address": NVSWITCH_BUS[0], "device": "0x22a3"}],
                                         "error": None}
    assert nvswitch.scan(str(tmp_path / "none")) == {"devices": [], "error": None}


# --- each GPU's fabric state, multi-node NVLink -------------------------------------------------------------


def test_one_gpu_whose_fabric_registration_failed_is_named_alone(tmp_path):
    checks, _facts, _ops = audit(tmp_path, xml="nvidia_smi_h100_fabric_failed.xml")
    assert statuses(checks) == dict(ALL_PASS, gpu_fabric="fail")
    found = checks["gpu_fabric"]["found"]
    assert "GPU 4 (00000000:9A:00.0) fabric/status is Insufficient Resources" in found
    assert "GPU 3" not in found and HOST in found


def _in_domain(xml, cluster="6c9e2f40-1b7d-4e8a-9d3c-5f0a7b2e8c14", clique="7", only=None):
    blocks = xml.split("<gpu id=")
    for index in range(1, len(blocks)):
        if only is None or index - 1 in only:
            blocks[index] = blocks[index].replace(
                "<cliqueId>0</cliqueId>", "<cliqueId>%s</cliqueId>" % clique).replace(
                "<clusterUuid>00000000-0000-0000-0000-000000000000</clusterUuid>",
                "<clusterUuid>%s</clusterUuid>" % cluster)
    return (0, "<gpu id=".join(blocks), "")


def test_multi_node_nvlink_needs_every_gpu_in_one_domain(tmp_path):
    healthy = fixture("nvidia_smi_h100_healthy.xml")
    # A single HGX board reports clique 0 and a zero cluster: that is no fault unless the site says it is MNNVL.
    checks, _facts, _ops = audit(tmp_path / "single")
    assert checks["gpu_fabric"]["status"] == "pass" and "multi-node" not in checks["gpu_fabric"]["found"]
    checks, _facts, _ops = audit(tmp_path / "wanted", overrides={"gpu_health_multinode_nvlink": True})
    assert checks["gpu_fabric"]["status"] == "fail"
    assert "GPU 0 (00000000:18:00.0) fabric/clusterUuid 00000000-0000-0000-0000-000000000000, cliqueId 0: in no " \
           "multi-node NVLink domain" in checks["gpu_fabric"]["found"]
    assert "nvidia-imex" in checks["gpu_fabric"]["fix"]
    checks, _facts, _ops = audit(tmp_path / "joined", xml=_in_domain(healthy))
    assert checks["gpu_fabric"]["status"] == "pass"
    assert "in one multi-node NVLink domain" in checks["gpu_fabric"]["found"]
    # Judged as multi-node because its siblings joined a cluster, without the setting: GPU 5 did not.
    checks, _facts, _ops = audit(tmp_path / "one_out", xml=_in_domain(healthy, only=[0, 1, 2, 3, 4, 6, 7]))
    assert checks["gpu_fabric"]["status"] == "fail" and "GPU 5 (00000000:AB:00.0) fabric/clusterUuid" in \
        checks["gpu_fabric"]["found"]
    split = _in_domain(_in_domain(healthy, clique="3", only=[0, 1, 2, 3])[1], clique="4", only=[4, 5, 6, 7])
    checks, _facts, _ops = audit(tmp_path / "split", xml=split)
    assert checks["gpu_fabric"]["status"] == "fail" and "the GPUs are in 2 NVLink domains" in \
        checks["gpu_fabric"]["found"]


# --- a GPU that needs a reset, or that nvidia-smi cannot reach --------------------------------------------------


def test_a_gpu_the_driver_says_needs_a_reset_is_named(tmp_path):
    checks, _facts, _ops = audit(tmp_path, xml="nvidia_smi_h100_reset_required.xml")
    assert statuses(checks) == dict(ALL_PASS, reset_required="fail")
    found = checks["reset_required"]["found"]
    assert "GPU 1 (00000000:2A:00.0) gpu_reset_status/reset_required is Yes" in found
    assert "GPU 1 (00000000:2A:00.0) gpu_reset_status/drain_and_reset_recommended is Yes" in found
    assert "nvidia-smi -r -i 1" in checks["reset_required"]["fix"]


@pytest.mark.parametrize("action, fix", [("Node Reboot", "reboot it"), ("GPU Reset", "nvidia-smi -r -i 6"),
                                         ("Drain P2P", "peer-to-peer"), ("None", None)])
def test_the_recovery_action_of_newer_drivers(tmp_path, action, fix):
    blocks = fixture("nvidia_smi_h100_healthy.xml").split("<gpu id=")
    for index in range(1, len(blocks)):
        blocks[index] = blocks[index].replace("</gpu_reset_status>", "</gpu_reset_status>\n\t\t<gpu_recovery_action>%s"
                                              "</gpu_recovery_action>" % (action if index == 7 else "None"))
    checks, _facts, _ops = audit(tmp_path, xml=(0, "<gpu id=".join(blocks), ""))
    if fix is None:
        assert checks["reset_required"]["status"] == "pass"
        return
    assert checks["reset_required"]["status"] == "fail"
    assert "GPU 6 (00000000:BA:00.0) gpu_recovery_action is %s" % action in checks["reset_required"]["found"]
    assert fix in checks["reset_required"]["fix"]


LOST_LINE = "Unable to determine the device handle for GPU 0000:3A:00.0: GPU is lost.  Reboot the system to recover " \
            "this GPU\n"


def test_a_gpu_nvidia_smi_cannot_reach_is_named_with_the_others_still_judged(tmp_path):
    seven = fixture("nvidia_smi_h100_healthy.xml").split("<gpu id=")
    del seven[3]
    text = LOST_LINE + "<gpu id=".join(seven).replace("<attached_gpus>8</attached_gpus>",
                                                      "<attached_gpus>7</attached_gpus>")
    checks, facts, _ops = audit(tmp_path, xml=(15, text, ""))
    assert facts["nvidia"]["error"] is None and len(facts["nvidia"]["gpus"]) == 7
    assert facts["nvidia"]["unavailable"] == [{"bus_id": "00000000:3A:00.0", "reason": "GPU is lost. Reboot the "
                                                                                       "system to recover this GPU"}]
    assert checks["reset_required"]["status"] == "fail" and checks["count"]["status"] == "fail"
    assert "nvidia-smi cannot reach the GPU at 00000000:3A:00.0: GPU is lost" in checks["reset_required"]["found"]
    assert "reboot" in checks["reset_required"]["fix"] and "00000000:3A:00.0" in checks["count"]["found"]


def test_nvidia_smi_that_reaches_no_gpu_says_which_one_needs_a_reset(tmp_path):
    line = "Unable to determine the device handle for GPU 0000:18:00.0: GPU requires reset\n"
    checks, facts, _ops = audit(tmp_path, xml=(15, line, ""))
    assert facts["nvidia"]["error"] and facts["nvidia"]["unavailable"][0]["reason"] == "GPU requires reset"
    assert checks["reset_required"]["status"] == "fail"
    assert "00000000:18:00.0: GPU requires reset" in checks["reset_required"]["found"]
    assert "nvidia-smi -r -i 00000000:18:00.0" in checks["reset_required"]["fix"]


def test_unavailable_gpus_are_taken_out_of_the_document():
    rest, lost = nvidia_smi_xml.unavailable_gpus(LOST_LINE + "<nvidia_smi_log/>\n")
    assert rest == "<nvidia_smi_log/>\n" and lost[0]["bus_id"] == "00000000:3A:00.0"
    assert nvidia_smi_xml.unavailable_gpus("Unable to determine the device handle for gpu 0000:18:00.0: Unknown "
                                           "Error\n")[1] == [{"bus_id": "00000000:18:00.0", "reason": "Unknown Error"}]


# --- a GPU the kernel lost without an Xid line ----------------------------------------------------------------


BOOT = "[    5.702215] gpu-node07 kernel: NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07\n"


@pytest.mark.parametrize("line, kind, found", [
    ("[ 9120.0] gpu-node07 kernel: NVRM: GPU 0000:ba:00.0: GPU has fallen off the bus.\n", "fallen_off_bus",
     "GPU 6 (00000000:BA:00.0) fell off the bus, 1 line: NVRM: GPU 0000:ba:00.0: GPU has fallen off the bus."),
    ("[   7.1] gpu-node07 kernel: NVRM: GPU 0000:ba:00.0: RmInitAdapter failed! (0x25:0xffff:1601)\n"
     "[   7.1] gpu-node07 kernel: NVRM: GPU 0000:ba:00.0: rm_init_adapter failed, device minor number 6\n",
     "init_failed", "GPU 6 (00000000:BA:00.0) failed to initialise, 2 lines"),
    ("[   4.9] gpu-node07 kernel: nvidia: probe of 0000:ba:00.0 failed with error -1\n", "probe_failed",
     "failed its driver's probe"),
])
def test_a_lost_gpu_without_an_xid_line_fails_gpu_lost(tmp_path, line, kind, found):
    checks, facts, _ops = audit(tmp_path, kernel_log=(0, BOOT + line, ""))
    assert [event["kind"] for event in facts["xid"]["lost"]] == [kind] and facts["xid"]["events"] == []
    assert statuses(checks) == dict(ALL_PASS, gpu_lost="fail")
    assert found in checks["gpu_lost"]["found"] and "no Xid line names it" in checks["gpu_lost"]["found"]
    assert "drain %s" % HOST in checks["gpu_lost"]["fix"]


def test_an_amd_gpu_that_failed_its_probe_is_named_by_its_bus_address(tmp_path):
    log = ("[ 4.03] mi-node kernel: amdgpu 0000:bf:00.0: Fatal error during GPU init\n"
           "[ 4.03] mi-node kernel: amdgpu: probe of 0000:bf:00.0 failed with error -2\n")
    devices = [(address, MI300X) for address in MI300X_BUS]
    checks, _facts, _ops = audit(tmp_path, devices=devices, xml=None, dcgm=None, kernel_log=(0, log, ""),
                                 amd=("amd_smi_static_mi300x.json", "amd_smi_metric_ecc.json"))
    found = checks["gpu_lost"]["found"]
    assert checks["gpu_lost"]["status"] == "fail"
    assert "the GPU at PCI 00000000:BF:00.0 failed to initialise" in found and "failed its driver's probe" in found
    assert "Above 4G decoding" in checks["gpu_lost"]["fix"]


def test_a_node_whose_only_gpu_left_the_bus_still_fails_gpu_lost(tmp_path):
    log = BOOT + "[ 99.0] n kernel: NVRM: GPU at PCI:0000:18:00: GPU has fallen off the bus.\n"
    checks, _facts, _ops = audit(tmp_path, devices=[("0000:03:00.0", ASPEED)], xml=(6, "No devices were found\n", ""),
                                 kernel_log=(0, log, ""))
    assert checks["gpu_lost"]["status"] == "fail" and checks["count"]["status"] == "not_applicable"
    assert "the GPU at PCI 00000000:18:00.0 fell off the bus" in checks["gpu_lost"]["found"]


def test_lost_messages_read_from_real_shapes_and_never_from_xid_lines():
    assert kernel_log.parse_lost("NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen "
                                 "off the bus.") is None
    assert kernel_log.parse_lost("e1000e: probe of 0000:00:1f.6 failed with error -2") is None
    assert kernel_log.parse_lost("amdgpu 0000:c1:00.0: probe with driver amdgpu failed with error -110")["kind"] == \
        "probe_failed"
    assert kernel_log.parse_lost("amdgpu 0000:c1:00.0: amdgpu: GPU reset(2) failed")["kind"] == "reset_failed"
    assert [event["count"] for event in kernel_log.lost("NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.\n" * 3)] \
        == [3]


def test_gpu_lost_needs_the_kernel_log(tmp_path, monkeypatch):
    from preflight_node.capabilities import gpu_health as node_half
    monkeypatch.setattr(node_half, "privileged", lambda: False)
    checks, _facts, _ops = audit(tmp_path, kernel_log=None,
                                 dmesg=(1, "", "dmesg: read kernel buffer failed: Operation not permitted\n"))
    assert preflight_checks.is_blocked(checks["gpu_lost"])
    checks, _facts, _ops = audit(tmp_path / "none", overrides={"gpu_health_kernel_log": "none"})
    assert checks["gpu_lost"]["status"] == "not_applicable"


# --- one GPU whose NVLinks are all down -------------------------------------------------------------------------


def test_one_gpu_saying_all_its_links_are_inactive_beside_linked_siblings_fails(tmp_path):
    checks, facts, _ops = audit(tmp_path, nvlink="nvidia_smi_nvlink_h100_gpu2_all_down.txt")
    assert facts["nvidia"]["gpus"][2]["nvlink"]["all_inactive"] is True
    assert statuses(checks) == dict(ALL_PASS, nvlink="fail")
    assert "GPU 2 (00000000:3A:00.0) has 0 active NVLinks, its peers 18 (inactive: all, nvidia-smi nvlink -s says " \
           "'NVML: Unable to retrieve NVLink information as all links are inActive')" in checks["nvlink"]["found"]
    assert gpu_health.profile_fields(facts)["gpu.nvlinks_active_min"] == 0


def test_every_gpu_saying_all_links_are_inactive_is_a_node_without_nvlink(tmp_path):
    every = []
    for line in fixture("nvidia_smi_nvlink_h100_gpu2_all_down.txt").splitlines(True):
        if line.startswith("GPU"):
            every += [line, "\tNVML: Unable to retrieve NVLink information as all links are inActive\n"]
    listed = nvlink.parse("".join(every))
    assert all(entry["all_inactive"] for entry in listed) and len(listed) == 8
    checks, _facts, _ops = audit(tmp_path, nvlink=(0, "".join(every), ""))
    assert checks["nvlink"]["status"] == "not_applicable"
    assert "a node without NVLink in use" in checks["nvlink"]["found"]
