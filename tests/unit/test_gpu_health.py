"""The gpu_health capability: read (FakeOps, a sysfs sandbox, the fake tools), decide (every fault fixture fails
exactly its check naming the GPU, bus id and field), validate, the role, and profile_fields."""

import functools
import os

import pytest
import yaml

from preflight_node import checks as preflight_checks
from preflight_node.capabilities import gpu_health as node_half
from preflight_node.gpu import nvidia_smi_xml, nvlink
from preflight_node.gpu.nvidia_gpus import parse_query_gpu
from cluster_preflight.capabilities import gpu_health
from capability_helpers import (assert_contract as check_contract, assert_one_problem, role_path, role_yaml,
                                statuses, switched_off_cases, typed_settings)
from fake_ops import LocalOps
from gpu_health_helpers import (ASPEED, FIXTURES, HOST, MI300X, MI300X_BUS, NODE, fixture, make_sysfs, read_node,
                                settings)
import fake_gpu_tools

ROLE_NAME = "gpu_health"
assert_contract = functools.partial(check_contract, ROLE_NAME, host=HOST)
ALL_PASS = {name: "pass" for name in gpu_health.CHECKS}


def audit(tmp_path, **kwargs):
    facts, wanted, _ops = read_node(tmp_path, **kwargs)
    checks = gpu_health.decide(HOST, facts, wanted)
    assert_contract(checks)
    return checks


def test_healthy_h100_node_passes_every_check(tmp_path):
    checks = audit(tmp_path)
    assert statuses(checks) == ALL_PASS
    assert "8 NVIDIA GPUs on the PCI bus, 8 in nvidia-smi" in checks["count"]["found"]
    assert "8 DCGM results" not in checks["dcgm"]["found"] and "level 1" in checks["dcgm"]["found"]


def test_one_nvidia_smi_call_and_every_command_bounded(tmp_path):
    _facts, wanted, ops = read_node(tmp_path)
    assert [call[:3] for call in ops.calls] == [
        ["/usr/bin/nvidia-smi", "-q", "-x"], ["/usr/bin/nvidia-smi", "nvlink", "-s"], ["/usr/bin/journalctl", "-k", "-b"],
        ["/usr/bin/dcgmi", "diag", "-r"]]
    assert ops.calls[3] == ["/usr/bin/dcgmi", "diag", "-r", "1", "-j"]


# --- every fault fails exactly its check -----------------------------------------------------------------


FAULTS = [
    # id, read_node kwargs, settings, check, (status, found part, fix part)
    ("ecc", {"xml": "nvidia_smi_h100_ecc.xml"}, {}, "ecc",
     ("fail", "GPU 3 (00000000:5D:00.0) ecc_errors/volatile has 2 uncorrectable errors", "nvidia-smi -r -i 3")),
    ("remap-pending", {"xml": "nvidia_smi_h100_remap_pending.xml"}, {}, "memory",
     ("fail", "GPU 5 (00000000:AB:00.0) remapped_rows/remapped_row_pending is Yes", "reset the GPU"),
     # The driver says so too: the row remap waits for a reset.
     {"reset_required": "fail"}),
    ("hw-slowdown", {"xml": "nvidia_smi_h100_hw_slowdown.xml"}, {}, "throttle",
     ("fail", "GPU 6 (00000000:BA:00.0) clocks_event_reasons/clocks_event_reason_hw_slowdown is Active", "cooling")),
    ("pcie-x8", {"xml": "nvidia_smi_h100_pcie_x8.xml"}, {}, "pcie",
     ("fail", "GPU 2 (00000000:3A:00.0) PCIe link trained at x8 of its x16 while another NVIDIA H100 80GB HBM3 of "
              "the node runs at x16", "reseat GPU 2")),
    ("pcie-below-min-width", {"xml": "nvidia_smi_h100_pcie_x8.xml"}, {"gpu_health_pcie_min_width": 16}, "pcie",
     ("fail", "x8, expected x16 (gpu_health_pcie_min_width)", "riser")),
    ("7-of-8", {"xml": "nvidia_smi_h100_7gpus.xml"}, {}, "count",
     ("fail", "the PCI bus shows 8 NVIDIA GPUs, nvidia-smi 7 (missing from nvidia-smi: 00000000:9A:00.0)",
      "Xid 79")),
    ("7-of-expected-8", {"xml": "nvidia_smi_h100_7gpus.xml", "devices": [("0000:03:00.0", ASPEED)]},
     {"gpu_health_expected_count": 8}, "count", ("fail", "7 GPUs found, gpu_health_expected_count is 8", ""),
     {"fabric_manager": "not_applicable"}),
    ("xid79", {"kernel_log": "kernel_log_xid79.txt"}, {}, "xid",
     ("fail", "Xid 79 on GPU 3 (00000000:5D:00.0), 2 lines: GPU has fallen off the bus", "reseat the GPU"),
     # The driver's own line next to the Xid: the same loss, named by gpu_lost as well.
     {"gpu_lost": "fail"}),
    ("xid48-94", {"kernel_log": "kernel_log_xid48_94.txt"}, {}, "xid",
     ("fail", "Xid 48 on GPU 1 (00000000:2A:00.0), 1 line: double bit", "nvidia-smi -r")),
    ("sxid", {"kernel_log": "kernel_log_sxid.txt"}, {}, "xid",
     ("fail", "SXid 24007 on NVSwitch 00000000:08:00.0, 1 line", "nvidia-fabricmanager")),
    ("dcgm-fail", {"dcgm": "dcgmi_diag_r1_fail.json"}, {}, "dcgm",
     ("fail", "test 'Page Retirement/Row Remap' failed on GPU 3 (00000000:5D:00.0): GPU 3 has uncorrectable memory",
      "dcgmi")),
]


@pytest.mark.parametrize("case", FAULTS, ids=[case[0] for case in FAULTS])
def test_each_fault_fails_exactly_its_check(tmp_path, case):
    _name, kwargs, overrides, check, (status, found, fix) = case[:5]
    also = case[5] if len(case) > 5 else {}
    checks = audit(tmp_path, overrides=overrides, **kwargs)
    assert statuses(checks) == dict(ALL_PASS, **dict(also, **{check: status})), checks
    assert found in checks[check]["found"] and HOST in checks[check]["found"], checks[check]
    assert fix in checks[check]["fix"], checks[check]


def test_xid_table_severities_and_operator_lists(tmp_path):
    checks = audit(tmp_path, kernel_log="kernel_log_xid48_94.txt")
    found = checks["xid"]["found"]
    assert "Xid 63 on GPU 1" in found and "Xid 94 on GPU 1 (00000000:2A:00.0), 2 lines" in found
    assert "Xid 13 on GPU 5 (00000000:AB:00.0), 2 lines: graphics engine exception" in found
    checks = audit(tmp_path / "ignored", kernel_log="kernel_log_xid48_94.txt",
                   overrides={"gpu_health_xid_ignore": [13, 48, 63, 94]})
    assert checks["xid"]["status"] == "pass", checks["xid"]
    checks = audit(tmp_path / "downgraded", kernel_log="kernel_log_xid79.txt",
                   overrides={"gpu_health_xid_warn_only": [79, 154]})
    assert checks["xid"]["status"] == "warn" and "Xid 79" in checks["xid"]["found"]
    checks = audit(tmp_path / "apps", kernel_log="kernel_log_xid48_94.txt",
                   overrides={"gpu_health_xid_ignore": [48, 63, 94]})
    assert checks["xid"]["status"] == "warn" and "Xid 13" in checks["xid"]["found"]


def test_sxid_non_fatal_warns_and_unknown_xid_names_the_catalog(tmp_path):
    lines = ("[ 1.0] n kernel: nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Non-fatal, Link 3 LTSSM Fault Up\n"
             "[ 2.0] n kernel: NVRM: Xid (PCI:0000:18:00): 999, pid=12, name=a.out, something new\n")
    log = tmp_path / "kernel.log"
    log.write_text(lines)
    checks = audit(tmp_path, kernel_log=(0, lines, ""))
    assert checks["xid"]["status"] == "warn"
    assert "SXid 20034 on NVSwitch 00000000:06:00.0" in checks["xid"]["found"]
    assert "Xid 999 on GPU 0 (00000000:18:00.0)" in checks["xid"]["found"]
    assert "docs.nvidia.com/deploy/xid-errors" in checks["xid"]["fix"]


def test_pcie_gen_below_max_under_load_warns(tmp_path):
    xml = fixture("nvidia_smi_h100_healthy.xml").replace(
        "<current_link_gen>5</current_link_gen>", "<current_link_gen>1</current_link_gen>", 1)
    checks = audit(tmp_path, xml=(0, xml, ""))  # the fixture's GPUs are in P0: under load
    assert statuses(checks) == dict(ALL_PASS, pcie="warn")
    assert "GPU 0 (00000000:18:00.0) PCIe link at gen 1 of its max gen 5 under load (P0, 0 %)" in \
        checks["pcie"]["found"]


def test_ecc_disabled_on_one_gpu_of_eight_warns_and_aggregate_errors_warn(tmp_path):
    xml = fixture("nvidia_smi_h100_healthy.xml").replace(
        "<current_ecc>Enabled</current_ecc>", "<current_ecc>Disabled</current_ecc>", 1)
    aggregate = "<dram_uncorrectable>0</dram_uncorrectable>\n\t\t\t</aggregate>"
    xml = xml.replace(aggregate, aggregate.replace(">0<", ">4<"), 2)
    checks = audit(tmp_path, xml=(0, xml, ""))
    assert statuses(checks) == dict(ALL_PASS, ecc="warn")
    found = checks["ecc"]["found"]
    assert "ecc_mode/current_ecc is Enabled on GPU 1 (00000000:2A:00.0)" in found
    assert "but Disabled on GPU 0 (00000000:18:00.0)" in found
    assert "GPU 1 (00000000:2A:00.0) ecc_errors/aggregate has 4" in found
    assert "GPU 0 (00000000:18:00.0): ECC is Disabled, so memory errors are neither corrected nor counted" in found


def test_remap_failure_and_persistence_off_where_it_is_required(tmp_path):
    xml = fixture("nvidia_smi_h100_healthy.xml").replace(
        "<remapped_row_failure>No</remapped_row_failure>", "<remapped_row_failure>Yes</remapped_row_failure>", 1)
    xml = xml.replace("<persistence_mode>Enabled</persistence_mode>", "<persistence_mode>Disabled</persistence_mode>")
    checks = audit(tmp_path, xml=(0, xml, ""), overrides={"gpu_health_persistence_required": True})
    assert statuses(checks) == dict(ALL_PASS, memory="fail", persistence="warn")
    assert "GPU 0 (00000000:18:00.0) remapped_rows/remapped_row_failure is Yes" in checks["memory"]["found"]
    assert "RMA" in checks["memory"]["fix"]
    assert "GPU 7 (00000000:DB:00.0) persistence_mode is Disabled" in checks["persistence"]["found"]
    # Not required (the default): said, not warned.
    checks = audit(tmp_path / "default", xml=(0, xml, ""))
    assert checks["persistence"]["status"] == "pass"
    assert "persistence mode Enabled on 0 of 8 GPUs" in checks["persistence"]["found"]
    assert "persistence mode Disabled, not required" in checks["persistence"]["found"]


def test_sw_thermal_slowdown_warns(tmp_path):
    reason = "clocks_event_reason_sw_thermal_slowdown"
    xml = fixture("nvidia_smi_h100_healthy.xml").replace(
        "<%s>Not Active</%s>" % (reason, reason), "<%s>Active</%s>" % (reason, reason), 1)
    checks = audit(tmp_path, xml=(0, xml, ""))
    assert statuses(checks) == dict(ALL_PASS, throttle="warn")
    assert "software thermal slowdown" in checks["throttle"]["found"]


# --- nodes without GPUs, and GPUs without tools ------------------------------------------------------------


def test_cpu_only_node_is_not_applicable_everywhere(tmp_path):
    checks = audit(tmp_path, devices=[("0000:03:00.0", ASPEED)], xml=None, kernel_log=None, dcgm=None)
    assert statuses(checks) == {name: "not_applicable" for name in gpu_health.CHECKS}
    assert "no GPU on the PCI bus and no nvidia-smi/amd-smi on %s" % HOST in checks["count"]["found"]


def test_cpu_only_node_with_an_expected_count_fails_the_count(tmp_path):
    checks = audit(tmp_path, devices=[], xml=None, kernel_log=None, dcgm=None,
                   overrides={"gpu_health_expected_count": 8})
    assert checks["count"]["status"] == "fail" and "gpu_health_expected_count is 8" in checks["count"]["found"]
    assert checks["ecc"]["status"] == "not_applicable"


def test_driver_installed_without_a_gpu_is_not_applicable(tmp_path):
    checks = audit(tmp_path, devices=[], xml=(6, "No devices were found\n", ""))
    assert statuses(checks) == {name: "not_applicable" for name in gpu_health.CHECKS}
    assert "nvidia-smi sees none" in checks["ecc"]["found"]


def test_gpus_on_the_bus_without_nvidia_smi_is_a_finding_with_a_fix(tmp_path):
    checks = audit(tmp_path, xml=None, dcgm=None)
    assert checks["count"]["status"] == "fail"
    assert "the PCI bus shows 8 NVIDIA GPUs but nvidia-smi (gpu_health_nvidia_smi: nvidia-smi) is not installed" \
        in checks["count"]["found"]
    assert "install the NVIDIA driver" in checks["count"]["fix"]


# --- tool errors are facts, then findings -----------------------------------------------------------------


@pytest.mark.parametrize("answer, fact", [
    ((9, "", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"),
     "/usr/bin/nvidia-smi -q -x exited 9: NVIDIA-SMI has failed"),
    ((124, "", "\nkilled after 20 s"), "/usr/bin/nvidia-smi -q -x timed out after 20 s"),
    ((0, fixture("nvidia_smi_h100_healthy.xml")[:2000], ""), "printed what is not nvidia-smi's XML"),
])
def test_nvidia_smi_errors_fail_the_checks_they_leave_unverified(tmp_path, answer, fact):
    facts, wanted, _ops = read_node(tmp_path, xml=answer)
    assert fact in facts["nvidia"]["error"] and facts["nvidia"]["gpus"] == []
    checks = gpu_health.decide(HOST, facts, wanted)
    assert_contract(checks)
    assert checks["count"]["status"] == "fail" and "nvidia-smi is installed but fails" in checks["count"]["found"]
    for name in ("ecc", "memory", "throttle", "pcie", "persistence"):
        assert checks[name]["status"] == "fail" and "not verified" in checks[name]["found"], checks[name]
    assert checks["xid"]["status"] == "pass"


@pytest.mark.parametrize("answer, fact", [
    ((0, fixture("dcgmi_diag_r1_pass.json")[:500], ""), "not a JSON document"),
    ((124, "", "\nkilled after 120 s"), "timed out after 120 s"),
    ((255, "", "Error: unable to establish a connection to the specified host: localhost\n"), "unable to establish"),
])
def test_dcgm_errors_fail_the_dcgm_check(tmp_path, answer, fact):
    checks = audit(tmp_path, dcgm=answer)
    assert statuses(checks) == dict(ALL_PASS, dcgm="fail")
    assert fact in checks["dcgm"]["found"] and "nvidia-dcgm" in checks["dcgm"]["fix"]


def test_dcgmi_exit_status_of_a_failed_test_still_gives_its_results(tmp_path):
    checks = audit(tmp_path, dcgm=(226, fixture("dcgmi_diag_r1_fail.json"), ""))
    assert checks["dcgm"]["status"] == "fail" and "failed on GPU 3" in checks["dcgm"]["found"]


def test_dcgm_off_or_missing_is_not_applicable_and_not_run(tmp_path):
    facts, wanted, ops = read_node(tmp_path, overrides={"gpu_health_dcgm_level": 0})
    assert not any("dcgmi" in call[0] for call in ops.calls)
    checks = gpu_health.decide(HOST, facts, wanted)
    assert checks["dcgm"]["status"] == "not_applicable" and "gpu_health_dcgm_level is 0" in checks["dcgm"]["found"]
    checks = audit(tmp_path / "missing", dcgm=None)
    assert checks["dcgm"]["status"] == "not_applicable" and "dcgmi (gpu_health_dcgmi) is not installed" in \
        checks["dcgm"]["found"]


def test_amd_node_reads_amd_smi(tmp_path):
    devices = [(address, MI300X) for address in MI300X_BUS]
    facts, wanted, ops = read_node(tmp_path, devices=devices, xml=None, dcgm=None,
                                   amd=("amd_smi_static_mi300x.json", "amd_smi_metric_ecc.json"))
    assert ["/opt/rocm/bin/amd-smi", "metric", "--ecc", "--pcie", "--json"] in ops.calls
    checks = gpu_health.decide(HOST, facts, wanted)
    assert_contract(checks)
    assert statuses(checks) == {"count": "pass", "ecc": "fail", "memory": "not_applicable", "nvlink": "not_applicable",
                                "throttle": "not_applicable", "pcie": "fail", "persistence": "not_applicable",
                                "xid": "not_applicable", "dcgm": "not_applicable", "reset_required": "not_applicable",
                                "fabric_manager": "not_applicable", "gpu_fabric": "not_applicable", "gpu_lost": "pass"}
    assert "GPU 2 (00000000:38:00.0) ecc.total_uncorrectable_count is 1" in checks["ecc"]["found"]
    assert "GPU 5 (00000000:AF:00.0) PCIe link trained at x8 of its x16 while another AMD Instinct MI300X" in \
        checks["pcie"]["found"]


def test_amd_smi_truncated_json_is_a_fact_then_a_failure(tmp_path):
    devices = [(address, MI300X) for address in MI300X_BUS]
    facts, wanted, _ops = read_node(tmp_path, devices=devices, xml=None, dcgm=None,
                                    amd=((0, fixture("amd_smi_static_mi300x.json")[:700], ""),
                                         "amd_smi_metric_ecc.json"))
    assert "amd-smi static: not a JSON document" in facts["amd"]["error"]
    checks = gpu_health.decide(HOST, facts, wanted)
    assert_contract(checks)
    assert checks["count"]["status"] == "fail" and checks["ecc"]["status"] == "fail"


# --- the kernel log: journalctl, dmesg, none, without root ---------------------------------------------------


def test_journal_hidden_from_a_non_member_falls_back_to_dmesg(tmp_path):
    hint = ("Hint: You are currently not seeing messages from other users and the system.\n"
            "      Users in groups 'adm', 'systemd-journal' can see all messages.\n")
    facts, wanted, ops = read_node(tmp_path, kernel_log=(0, "-- No entries --\n", hint), dmesg="kernel_log_xid79.txt")
    assert ops.calls[-2] == ["/usr/bin/dmesg"]
    assert facts["xid"]["source"] == "dmesg" and facts["xid"]["error"] is None
    assert [event["code"] for event in facts["xid"]["events"]] == [79, 154]
    assert gpu_health.decide(HOST, facts, wanted)["xid"]["status"] == "fail"


REFUSED = (1, "", "dmesg: read kernel buffer failed: Operation not permitted\n")


def test_dmesg_refused_without_root_is_blocked_never_failed(tmp_path, monkeypatch):
    monkeypatch.setattr(node_half, "privileged", lambda: False)
    facts, wanted, _ops = read_node(tmp_path, kernel_log=None, dmesg=REFUSED)
    assert facts["xid"]["needs_root"] is True and facts["privileged"] is False
    assert facts["needs_root"] == [{"path": "kernel log", "error": facts["xid"]["error"]}]
    assert "journalctl is not installed" in facts["xid"]["error"] and "Operation not permitted" in facts["xid"]["error"]
    checks = gpu_health.decide(HOST, facts, wanted)
    assert_contract(checks)
    assert checks["xid"]["status"] == "skipped" and preflight_checks.is_blocked(checks["xid"])
    assert checks["xid"]["found"].startswith("needs root: cannot read the kernel log of %s" % HOST)
    assert "preflight_become" in checks["xid"]["fix"]
    assert checks["gpu_lost"]["status"] == "skipped" and preflight_checks.is_blocked(checks["gpu_lost"])
    assert all(check["status"] == "pass" for name, check in checks.items() if name not in ("xid", "gpu_lost"))


def test_dmesg_refused_to_root_is_a_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(node_half, "privileged", lambda: True)
    facts, wanted, _ops = read_node(tmp_path, kernel_log=None, dmesg=REFUSED)
    assert facts["xid"]["needs_root"] is False and facts["needs_root"] == []
    checks = gpu_health.decide(HOST, facts, wanted)
    assert checks["xid"]["status"] == "warn" and "Operation not permitted" in checks["xid"]["found"]


@pytest.mark.parametrize("source, first_call", [("dmesg", ["/usr/bin/dmesg"]), ("journalctl", None)])
def test_kernel_log_source_chosen_by_setting(tmp_path, source, first_call):
    facts, wanted, ops = read_node(tmp_path, dmesg="kernel_log_sxid.txt",
                                   overrides={"gpu_health_kernel_log": source})
    log_calls = [call for call in ops.calls if call[0].endswith(("dmesg", "journalctl"))]
    assert len(log_calls) == 1 and log_calls[0][0].endswith(source)
    assert facts["xid"]["source"] == source
    expected = {"dmesg": "fail", "journalctl": "pass"}[source]  # the journal holds the clean log
    assert gpu_health.decide(HOST, facts, wanted)["xid"]["status"] == expected


def test_kernel_log_none_is_not_read(tmp_path):
    facts, wanted, ops = read_node(tmp_path, overrides={"gpu_health_kernel_log": "none"})
    assert not any(call[0].endswith(("dmesg", "journalctl")) for call in ops.calls)
    checks = gpu_health.decide(HOST, facts, wanted)
    assert checks["xid"]["status"] == "not_applicable" and "gpu_health_kernel_log is none" in checks["xid"]["found"]


# --- the fake tools the test bed puts on a node's PATH --------------------------------------------------------


def test_reader_parses_what_the_fake_tools_print(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    written = fake_gpu_tools.install(
        bin_dir, nvidia_xml=os.path.join(FIXTURES, "nvidia_smi_h100_ecc.xml"),
        kernel_log=os.path.join(FIXTURES, "kernel_log_xid79.txt"),
        dcgm_json=os.path.join(FIXTURES, "dcgmi_diag_r1_fail.json"), dcgm_rc=226,
        amd=(os.path.join(FIXTURES, "amd_smi_static_mi300x.json"), os.path.join(FIXTURES, "amd_smi_metric_ecc.json")))
    assert sorted(os.path.basename(path) for path in written) == ["amd-smi", "dcgmi", "journalctl", "nvidia-smi"]
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % bin_dir)
    ops = LocalOps(missing={"rocm-smi"})
    sysfs = make_sysfs(tmp_path, [])
    args = gpu_health.read_args(settings(gpu_health_sysfs_root=str(sysfs)), NODE)
    facts = node_half.read(args, ops)
    assert facts["nvidia"]["error"] is None
    nvlinks = {entry["uuid"]: {key: entry[key] for key in nvlink.FIELDS}
               for entry in nvlink.parse(fixture("nvidia_smi_nvlink_h100.txt"))}
    assert facts["nvidia"]["gpus"] == [dict(gpu, nvlink=nvlinks[gpu["uuid"]]) for gpu in nvidia_smi_xml.parse(
        fixture("nvidia_smi_h100_ecc.xml"))["gpus"]]
    assert facts["nvidia"]["nvlink_error"] is None
    assert facts["amd"]["error"] is None and len(facts["amd"]["gpus"]) == 8
    assert facts["xid"]["source"] == "journalctl" and [event["code"] for event in facts["xid"]["events"]] == [79, 154]
    assert facts["dcgm"]["error"] is None and any(result["status"] == "fail" for result in facts["dcgm"]["results"])
    rc, out, _err = ops.run(["nvidia-smi", "--query-gpu=index,pci.bus_id,uuid,name", "--format=csv,noheader"])
    assert rc == 0 and [gpu["bus_id"] for gpu in parse_query_gpu(out)] == [
        gpu["bus_id"] for gpu in facts["nvidia"]["gpus"]]
    rc, _out, err = ops.run(["nvidia-smi", "-L"])
    assert rc == 2 and "unsupported arguments: -L" in err


# --- settings, the role, the contract ------------------------------------------------------------------------


def test_defaults_are_valid_and_mirrored_by_the_argument_specs():
    assert gpu_health.validate(settings()) == []
    options = role_yaml(ROLE_NAME, "meta", "argument_specs.yml")["argument_specs"]["main"]["options"]
    defaults = role_yaml(ROLE_NAME, "defaults", "main.yml")
    assert sorted(options) == sorted(defaults)
    assert all(name.startswith("gpu_health_") for name in defaults)
    assert all(option.get("type") and option.get("description") for option in options.values())


@pytest.mark.parametrize("overrides, name, found", [
    ({"gpu_health_dcgm_level": 4}, "gpu_health_dcgm_level", "4"),
    ({"gpu_health_dcgm_timeout": 0}, "gpu_health_dcgm_timeout", "0"),
    ({"gpu_health_tool_timeout": -1}, "gpu_health_tool_timeout", "-1"),
    ({"gpu_health_kernel_log": "syslog"}, "gpu_health_kernel_log", "syslog"),
    ({"gpu_health_sysfs_root": "sys"}, "gpu_health_sysfs_root", "sys"),
    ({"gpu_health_expected_count": -8}, "gpu_health_expected_count", "-8"),
    ({"gpu_health_pcie_min_width": 12}, "gpu_health_pcie_min_width", "12"),
    ({"gpu_health_xid_ignore": ["79"]}, "gpu_health_xid_ignore", "79"),
    ({"gpu_health_xid_warn_only": 13}, "gpu_health_xid_warn_only", "13"),
    ({"gpu_health_nvidia_smi": "nvidia-smi -q"}, "gpu_health_nvidia_smi", "nvidia-smi -q"),
])
def test_validate_names_the_variable_with_found_expected_fix(overrides, name, found):
    assert_one_problem(gpu_health.validate(settings(**overrides)), name, found)


def test_settings_typed_from_the_command_line():
    typed = typed_settings(ROLE_NAME, gpu_health_dcgm_level="2", gpu_health_xid_ignore="13,43",
                           gpu_health_expected_count="8")
    assert gpu_health.validate(typed) == []
    args = gpu_health.read_args(typed, NODE)
    assert args["dcgm_level"] == 2 and args["tool_timeout"] == 20 and args["rocm_smi"] == "rocm-smi"
    assert typed["gpu_health_xid_ignore"] == [13, 43]
    assert gpu_health.read_args(typed_settings(ROLE_NAME, gpu_health_enabled="false"), NODE) is None


def test_the_role_writes_only_the_fabric_manager_in_bring_up():
    assert sorted(os.listdir(role_path(ROLE_NAME))) == ["README.md", "defaults", "meta", "tasks"]
    with open(os.path.join(role_path(ROLE_NAME), "tasks", "main.yml")) as handle:
        tasks = yaml.safe_load(handle)
    assert [sorted(set(task) & {"pci_gpus", "service_enabled"}) for task in tasks] == [["pci_gpus"],
                                                                                      ["service_enabled"]]
    assert tasks[0]["check_mode"] is False and tasks[0]["changed_when"] is False


@pytest.mark.parametrize("case", switched_off_cases(ROLE_NAME, HOST), ids=lambda case: case[0])
def test_switched_off_is_skipped_and_reads_nothing(case):
    _name, _kwargs, overrides, expected = case
    wanted = settings(**overrides)
    assert gpu_health.read_args(wanted, NODE) is None
    checks = gpu_health.decide(HOST, None, wanted)
    assert_contract(checks)
    (status, found, _fix), = expected.values()
    assert list(checks) == ["enabled"] and checks["enabled"]["status"] == status
    assert found in checks["enabled"]["found"]


def test_decide_without_facts_is_a_failure_naming_the_node():
    checks = gpu_health.decide(HOST, None, settings())
    assert_contract(checks)
    assert checks["no_facts"]["status"] == "fail"


def test_check_names_qualify_in_the_verdict(tmp_path):
    flat = preflight_checks.flatten({gpu_health.CAPABILITY: audit(tmp_path)})
    assert sorted(flat) == sorted("gpu_health.%s" % name for name in gpu_health.CHECKS)


# --- profile_fields ------------------------------------------------------------------------------------------


def test_profile_fields(tmp_path):
    facts, _wanted, _ops = read_node(tmp_path, xml="nvidia_smi_h100_pcie_x8.xml")
    assert gpu_health.profile_fields(facts) == {
        "gpu.vendor": "nvidia", "gpu.count": 8, "gpu.model": "NVIDIA H100 80GB HBM3",
        "gpu.driver_version": "550.90.07", "gpu.cuda_version": "12.4", "gpu.pcie_gen_max": 5,
        "gpu.pcie_width_min": 8, "gpu.nvlinks_active_min": 18}
    amd, _wanted, _ops = read_node(tmp_path / "amd", devices=[(address, MI300X) for address in MI300X_BUS],
                                   xml=None, dcgm=None, amd=("amd_smi_static_mi300x.json", "amd_smi_metric_ecc.json"))
    assert gpu_health.profile_fields(amd) == {
        "gpu.vendor": "amd", "gpu.count": 8, "gpu.model": "AMD Instinct MI300X", "gpu.driver_version": "6.7.0",
        "gpu.cuda_version": None, "gpu.pcie_gen_max": 5, "gpu.pcie_width_min": 8,
        "gpu.nvlinks_active_min": None}
    empty, _wanted, _ops = read_node(tmp_path / "cpu", devices=[], xml=None, kernel_log=None, dcgm=None)
    assert set(gpu_health.profile_fields(empty).values()) == {None}
    assert set(gpu_health.profile_fields(None).values()) == {None}


# --- NVLink (nvidia-smi nvlink -s) -----------------------------------------------------------------------


def test_nvlink_parser_reads_every_link_of_every_gpu():
    links = nvlink.parse(fixture("nvidia_smi_nvlink_h100_link_down.txt"))
    assert len(links) == 8 and all(len(gpu["active"]) + len(gpu["inactive"]) == 18 for gpu in links)
    down = [gpu for gpu in links if gpu["inactive"]]
    assert [(gpu["index"], gpu["inactive"]) for gpu in down] == [(5, [3, 11])]
    assert nvlink.parse("GPU 0: NVIDIA L40S (UUID: GPU-0a1b2c3d-0000-1111-2222-333344445555)\n") == [
        {"index": 0, "uuid": "GPU-0a1b2c3d-0000-1111-2222-333344445555", "name": "NVIDIA L40S", "active": [],
         "inactive": [], "gbps": {}, "note": None, "all_inactive": False}]
    with pytest.raises(ValueError, match="line 1"):
        nvlink.parse("NVML: Unable to determine the device handle\n")


def test_a_gpu_with_an_nvlink_down_fails_naming_it_and_its_links(tmp_path):
    facts, wanted, _ops = read_node(tmp_path, nvlink="nvidia_smi_nvlink_h100_link_down.txt")
    checks = gpu_health.decide(HOST, facts, wanted)
    assert_contract(checks)
    assert [name for name, check in checks.items() if check["status"] != "pass"] == ["nvlink"]
    found = checks["nvlink"]["found"]
    assert "GPU 5 (00000000:AB:00.0) has 16 active NVLinks, its peers 18 (inactive: link 3, link 11)" in found
    assert gpu_health.profile_fields(facts)["gpu.nvlinks_active_min"] == 16


def test_nvlink_not_read_is_a_failure_and_pcie_only_gpus_are_not_applicable(tmp_path):
    facts, wanted, _ops = read_node(tmp_path / "a", nvlink=(9, "", "Failed to initialize NVML: Driver/library mismatch"))
    check = gpu_health.decide(HOST, facts, wanted)["nvlink"]
    assert check["status"] == "fail" and "nvidia-smi nvlink -s failed" in check["found"] and "mismatch" in check["found"]
    pcie_only = "".join(line + "\n" for line in fixture("nvidia_smi_nvlink_h100.txt").splitlines()
                        if not line.strip().startswith("Link"))
    facts, wanted, _ops = read_node(tmp_path / "b", nvlink=(0, pcie_only, ""))
    check = gpu_health.decide(HOST, facts, wanted)["nvlink"]
    assert check["status"] == "not_applicable" and "PCIe only" in check["found"]


def test_an_h200_as_captured_on_a_real_driver_passes(tmp_path):
    """``nvidia_smi_h200_580_captured.xml``: the project's own capture of ``nvidia-smi -q -x`` on one H200 (driver
    580.159.04, a Firecracker VM, the GPU idle at P0), serial and UUID blanked. One GPU: no NVLink between GPUs to
    check; no DCGM installed there."""
    h200 = ("0x10de", "0x2335", "0x030200")
    checks = audit(tmp_path, devices=[("0000:00:06.0", h200)], xml="nvidia_smi_h200_580_captured.xml", nvlink=None,
                   dcgm=None)
    # A VM given one GPU: no NVSwitch on its bus, and this capture's GPU reports no fabric state.
    assert statuses(checks) == dict(ALL_PASS, nvlink="not_applicable", dcgm="not_applicable",
                                    fabric_manager="not_applicable", gpu_fabric="not_applicable")
    assert "1 NVIDIA GPUs on the PCI bus, 1 in nvidia-smi" in checks["count"]["found"]
