"""The gpu_health node parsers on every fixture: nvidia-smi -q -x (ElementTree), amd-smi and rocm-smi (json),
the kernel log's Xid/SXid lines, dcgmi diag (json); what they cannot parse is a ValueError naming it."""

import json

import pytest

from preflight_node.gpu import amd_smi, dcgm, xid_log as kernel_log, nvidia_smi_xml
from gpu_health_helpers import fixture

H100_IDS = ["00000000:%s:00.0" % bus for bus in ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")]
HEALTHY_GPU = {
    "persistence_mode": "Enabled", "ecc_mode_current": "Enabled", "ecc_uncorrectable_volatile": 0,
    "ecc_uncorrectable_aggregate": 0, "retired_pages_pending": None, "remap_pending": False, "remap_failure": False,
    "throttle_active": [], "pcie_gen_current": 5, "pcie_gen_max": 5, "pcie_width_current": 16, "pcie_width_max": 16,
    "model": "NVIDIA H100 80GB HBM3",
}


# --- nvidia-smi -q -x --------------------------------------------------------------------------------------


def test_healthy_h100_document():
    parsed = nvidia_smi_xml.parse(fixture("nvidia_smi_h100_healthy.xml"))
    assert (parsed["driver_version"], parsed["cuda_version"], parsed["attached_gpus"]) == ("550.90.07", "12.4", 8)
    assert [gpu["bus_id"] for gpu in parsed["gpus"]] == H100_IDS
    assert [gpu["index"] for gpu in parsed["gpus"]] == list(range(8))
    assert parsed["gpus"][3]["uuid"] == "GPU-b37523a5-3b4a-4ee2-8463-513755ac0ecd"
    for gpu in parsed["gpus"]:
        assert {key: gpu[key] for key in HEALTHY_GPU} == HEALTHY_GPU, gpu


@pytest.mark.parametrize("name, index, changed", [
    ("nvidia_smi_h100_ecc.xml", 3, {"ecc_uncorrectable_volatile": 2, "ecc_uncorrectable_aggregate": 2}),
    ("nvidia_smi_h100_remap_pending.xml", 5, {"remap_pending": True}),
    ("nvidia_smi_h100_hw_slowdown.xml", 6, {"throttle_active": ["hw_slowdown"]}),
    ("nvidia_smi_h100_pcie_x8.xml", 2, {"pcie_width_current": 8}),
])
def test_each_fault_document_changes_one_field_of_one_gpu(name, index, changed):
    gpus = nvidia_smi_xml.parse(fixture(name))["gpus"]
    for gpu in gpus:
        wanted = dict(HEALTHY_GPU, **changed) if gpu["index"] == index else HEALTHY_GPU
        assert {key: gpu[key] for key in HEALTHY_GPU} == wanted, gpu


def test_seven_of_eight_gpus():
    parsed = nvidia_smi_xml.parse(fixture("nvidia_smi_h100_7gpus.xml"))
    assert parsed["attached_gpus"] == 7
    assert [gpu["bus_id"] for gpu in parsed["gpus"]] == H100_IDS[:4] + H100_IDS[5:]


def _one_gpu(body):
    return "<nvidia_smi_log><driver_version>470.199.02</driver_version><gpu id=\"00000000:3B:00.0\">%s</gpu>" \
           "</nvidia_smi_log>" % body


def test_unavailable_and_missing_fields_are_none():
    gpu = nvidia_smi_xml.parse(_one_gpu(
        "<product_name>Tesla T4</product_name><persistence_mode>N/A</persistence_mode>"
        "<ecc_mode><current_ecc>N/A</current_ecc></ecc_mode>"
        "<ecc_errors><volatile><dram_uncorrectable>N/A</dram_uncorrectable></volatile></ecc_errors>"
        "<pci><pci_gpu_link_info><link_widths><current_link_width>N/A</current_link_width></link_widths>"
        "</pci_gpu_link_info></pci>"))["gpus"][0]
    assert gpu["bus_id"] == "00000000:3B:00.0"  # from the id attribute when <pci_bus_id> is missing
    assert gpu["persistence_mode"] is None and gpu["ecc_mode_current"] is None
    assert gpu["ecc_uncorrectable_volatile"] is None and gpu["ecc_uncorrectable_aggregate"] is None
    assert gpu["pcie_width_current"] is None and gpu["pcie_gen_max"] is None
    assert gpu["remap_pending"] is None and gpu["throttle_active"] is None
    assert nvidia_smi_xml.parse(_one_gpu(""))["cuda_version"] is None


def test_older_driver_layouts():
    gpu = nvidia_smi_xml.parse(_one_gpu(
        "<ecc_errors><volatile><single_bit><total>4</total></single_bit><double_bit><device_memory>1</device_memory>"
        "<total>1</total></double_bit></volatile>"
        "<aggregate><sram_uncorrectable_parity>1</sram_uncorrectable_parity>"
        "<sram_uncorrectable_secded>2</sram_uncorrectable_secded><dram_uncorrectable>3</dram_uncorrectable>"
        "</aggregate></ecc_errors>"
        "<retired_pages><pending_blacklist>Yes</pending_blacklist></retired_pages>"
        "<clocks_throttle_reasons><clocks_throttle_reason_hw_slowdown>Not Active</clocks_throttle_reason_hw_slowdown>"
        "<clocks_throttle_reason_sw_thermal_slowdown>Active</clocks_throttle_reason_sw_thermal_slowdown>"
        "<clocks_throttle_reason_hw_power_brake_slowdown>Active</clocks_throttle_reason_hw_power_brake_slowdown>"
        "</clocks_throttle_reasons>"))["gpus"][0]
    assert gpu["ecc_uncorrectable_volatile"] == 1  # double_bit/total
    assert gpu["ecc_uncorrectable_aggregate"] == 6  # sram parity + secded + dram
    assert gpu["retired_pages_pending"] is True
    assert gpu["throttle_active"] == ["hw_power_brake_slowdown", "sw_thermal_slowdown"]


@pytest.mark.parametrize("text, words", [
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", "not an XML document"),
    (fixture("nvidia_smi_h100_healthy.xml")[:5000], "not an XML document"),
    ("<?xml version=\"1.0\" ?><html><body>proxy error</body></html>", "not <nvidia_smi_log>"),
])
def test_what_is_not_nvidia_smi_xml_is_a_value_error(text, words):
    with pytest.raises(ValueError, match=words):
        nvidia_smi_xml.parse(text)


# --- the kernel log ----------------------------------------------------------------------------------------


def _events(name):
    return [(event["kind"], event["code"], event["bus_id"], event["pid"], event["count"])
            for event in kernel_log.events(fixture(name))]


def test_kernel_log_xid79():
    assert _events("kernel_log_xid79.txt") == [("xid", 79, "00000000:5D:00.0", None, 2),
                                               ("xid", 154, "00000000:5D:00.0", None, 1)]
    first = kernel_log.events(fixture("kernel_log_xid79.txt"))[0]
    assert first["text"] == ("NVRM: Xid (PCI:0000:5d:00): 79, pid='<unknown>', name=<unknown>, "
                             "GPU has fallen off the bus.")


def test_kernel_log_xid48_63_94_and_application_faults():
    assert _events("kernel_log_xid48_94.txt") == [
        ("xid", 48, "00000000:2A:00.0", 418832, 1), ("xid", 63, "00000000:2A:00.0", 418832, 1),
        ("xid", 94, "00000000:2A:00.0", 418832, 2), ("xid", 13, "00000000:AB:00.0", 418851, 2)]


def test_kernel_log_sxid_counts_events_not_their_continuation_lines():
    assert _events("kernel_log_sxid.txt") == [("sxid", 12028, "00000000:05:00.0", None, 1),
                                              ("sxid", 24007, "00000000:08:00.0", None, 1),
                                              ("xid", 74, "00000000:18:00.0", None, 1)]
    fatal = kernel_log.events(fixture("kernel_log_sxid.txt"))[1]
    assert fatal["text"].startswith("nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 24007, Fatal, Link 44")


def test_clean_kernel_log_has_no_event():
    assert kernel_log.events(fixture("kernel_log_clean.txt")) == []
    assert kernel_log.events("") == [] and kernel_log.events(None) == []


def test_a_long_line_is_trimmed():
    line = "[ 1.0] h kernel: NVRM: Xid (PCI:0000:18:00): 31, pid=77, name=python, %s" % ("x" * 1000)
    event = kernel_log.events(line)[0]
    assert len(event["text"]) == kernel_log.TEXT_LIMIT and event["pid"] == 77


# --- dcgmi diag -j -----------------------------------------------------------------------------------------


def test_dcgm_pass_document_in_the_dcgm_gpu_diagnostic_layout():
    results = dcgm.parse(fixture("dcgmi_diag_r1_pass.json"))
    assert results and all(result["status"] == "pass" for result in results)
    assert {result["gpu"] for result in results if result["test"] == "Page Retirement/Row Remap"} == set(range(8))
    assert {result["gpu"] for result in results if result["test"] == "Denylist"} == {None}


def test_dcgm_fail_document_in_the_category_layout():
    results = dcgm.parse(fixture("dcgmi_diag_r1_fail.json"))
    bad = [(result["test"], result["gpu"], result["status"]) for result in results if result["status"] != "pass"]
    assert bad == [("Persistence Mode", None, "warn"), ("Page Retirement/Row Remap", 3, "fail")]
    failed = [result for result in results if result["status"] == "fail"][0]
    assert "row remappings are pending" in failed["info"]


def test_dcgm_results_for_several_gpus_are_one_per_gpu():
    text = json.dumps({"category": [{"category": "Integration", "tests": [{"name": "PCIe", "results": [
        {"gpu_ids": "0,1", "status": "Fail", "info": "bandwidth low"}, {"gpu_id": 2, "status": "Skip"}]}]}]})
    assert [(result["gpu"], result["status"]) for result in dcgm.parse(text)] == [(0, "fail"), (1, "fail"),
                                                                                   (2, "skip")]


@pytest.mark.parametrize("text, words", [
    (fixture("dcgmi_diag_r1_pass.json")[:400], "not a JSON document"),
    ("Error: unable to establish a connection to the specified host: localhost", "not a JSON document"),
    ("[]", "not an object"),
    ("{\"version\": \"3.3.6\"}", "no test_categories or category"),
    (json.dumps({"category": [{"tests": [{"name": "Inforom", "results": [{"status": "Maybe"}]}]}]}), "Maybe"),
])
def test_what_is_not_dcgm_json_is_a_value_error(text, words):
    with pytest.raises(ValueError, match=words):
        dcgm.parse(text)


# --- amd-smi and rocm-smi ----------------------------------------------------------------------------------


def test_amd_smi_static_and_metric():
    gpus = amd_smi.parse(fixture("amd_smi_static_mi300x.json"), fixture("amd_smi_metric_ecc.json"))
    assert [gpu["index"] for gpu in gpus] == list(range(8))
    assert gpus[0] == {"index": 0, "bus_id": "00000000:0C:00.0", "model": "AMD Instinct MI300X", "pcie_gen_max": 5,
                       "pcie_gen_current": 5, "pcie_width_max": 16, "pcie_width_current": 16, "ecc_uncorrectable": 0,
                       "ecc_correctable": 0, "pcie_replays": 0, "driver_version": "6.7.0"}
    assert gpus[2]["ecc_uncorrectable"] == 1 and gpus[2]["ecc_correctable"] == 3
    assert gpus[5]["pcie_width_current"] == 8


def test_amd_smi_without_metric_and_with_value_objects():
    static = [{"gpu": 0, "asic": {"market_name": "AMD Instinct MI250X"},
               "bus": {"bdf": "0000:c1:00.0", "max_pcie_width": {"value": 16, "unit": ""}, "max_pcie_speed": "16 GT/s",
                       "pcie_interface_version": "N/A"}}]
    gpu = amd_smi.parse(json.dumps({"gpu_data": static}))[0]
    assert (gpu["pcie_width_max"], gpu["pcie_gen_max"], gpu["pcie_width_current"]) == (16, 4, None)
    assert gpu["bus_id"] == "00000000:C1:00.0" and gpu["ecc_uncorrectable"] is None


@pytest.mark.parametrize("static, metric, words", [
    (fixture("amd_smi_static_mi300x.json")[:300], None, "amd-smi static: not a JSON document"),
    (fixture("amd_smi_static_mi300x.json"), "{", "amd-smi metric: not a JSON document"),
    ("{\"error\": \"no AMD GPU\"}", None, "expected a list of GPUs"),
    ("[{\"bus\": {}}]", None, "without a GPU number"),
])
def test_what_is_not_amd_smi_json_is_a_value_error(static, metric, words):
    with pytest.raises(ValueError, match=words):
        amd_smi.parse(static, metric)


def test_rocm_smi_best_effort():
    text = json.dumps({"card0": {"Card Series": "AMD Instinct MI250X", "PCI Bus": "0000:C1:00.0",
                                 "Driver version": "6.2.4"},
                       "card1": {"Card series": "AMD Instinct MI250X", "PCI Bus": "0000:C6:00.0"},
                       "system": {"Driver version": "6.2.4"}})
    gpus = amd_smi.parse_rocm_smi(text)
    assert [(gpu["index"], gpu["bus_id"], gpu["model"]) for gpu in gpus] == [
        (0, "00000000:C1:00.0", "AMD Instinct MI250X"), (1, "00000000:C6:00.0", "AMD Instinct MI250X")]
    with pytest.raises(ValueError, match="rocm-smi: not a JSON document"):
        amd_smi.parse_rocm_smi("WARNING: AMD GPU device(s) is/are in a low-power state")
