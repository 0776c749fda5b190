"""gpu_health on the machines real outputs show, with the project's own fixtures (tests/unit/fixtures/gpu,
make_fixtures.py): a MIG node, an NVLink-less pair of idle consumer cards split x8/x8, a vGPU guest, fields a driver
reports as N/A or "Not Found", rocm-smi with its system section, PCIe replays, DCGM tests DCGM skipped.  A healthy
machine passes whatever its age, driver or virtualisation; what a tool did not report is named as not observed,
never passed; the faults still fail."""

import functools
import json

import pytest

from preflight_node.gpu import nvidia_smi_xml, nvlink
from cluster_preflight.capabilities import gpu_health
from capability_helpers import assert_contract as check_contract, assert_one_problem, statuses
from gpu_health_helpers import H100, H100_BUS, HOST, fixture, nvidia_node, read_node, settings

assert_contract = functools.partial(check_contract, "gpu_health", host=HOST)
RTX4090 = ("0x10de", "0x2684", "0x030000")
PAIR_BUS = [(H100_BUS[0], RTX4090), (H100_BUS[1], RTX4090)]


def audit(tmp_path, **kwargs):
    facts, wanted, _ops = read_node(tmp_path, **kwargs)
    checks = gpu_health.decide(HOST, facts, wanted)
    assert_contract(checks)
    return checks, facts


def expect(check, status, *words):
    """``check`` has ``status`` and every one of ``words`` in its found text."""
    assert check["status"] == status and all(word in check["found"] for word in words), check


def edited(name, old, new, count=1):
    """A tool answer: fixture ``name`` with ``old`` replaced by ``new`` (``count`` times)."""
    text = fixture(name)
    assert old in text, old
    return (0, text.replace(old, new, count), "")


def pair(tmp_path, xml=None, **kwargs):
    return audit(tmp_path, devices=PAIR_BUS, xml=xml or "nvidia_smi_rtx4090_pair.xml",
                 nvlink="nvidia_smi_nvlink_none.txt", **kwargs)


# --- a MIG node, an NVLink-less pair, a vGPU guest ----------------------------------------------------------


def test_a_mig_node_passes_and_says_what_mig_mode_hides(tmp_path):
    checks, facts = audit(tmp_path, devices=nvidia_node(), xml="nvidia_smi_h100_mig.xml",
                          nvlink="nvidia_smi_nvlink_mig.txt")
    assert facts["nvidia"]["nvlink_error"] is None
    assert facts["nvidia"]["gpus"][0]["mig_mode"] == "Enabled"
    assert statuses(checks) == {"count": "pass", "ecc": "pass", "memory": "not_applicable", "throttle": "pass",
                                "pcie": "pass", "nvlink": "not_applicable", "persistence": "pass", "xid": "pass",
                                "dcgm": "pass", "reset_required": "pass", "gpu_fabric": "pass", "gpu_lost": "pass",
                                "fabric_manager": "not_applicable"}
    assert "row remapping and page retirement not reported (N/A in MIG mode)" in checks["memory"]["found"]
    assert "Nvlink queries are not supported for Devices in MIG mode" in checks["nvlink"]["found"]
    # The volatile counts are N/A in MIG mode; the aggregate ones are read, and only they are claimed.
    assert facts["nvidia"]["gpus"][0]["ecc_uncorrectable_volatile"] is None
    assert facts["nvidia"]["gpus"][0]["ecc_uncorrectable_aggregate"] == 0
    assert gpu_health.profile_fields(facts)["gpu.nvlinks_active_min"] is None


def test_an_nvlink_less_pair_of_idle_consumer_cards_split_x8_passes(tmp_path):
    checks, facts = pair(tmp_path)
    assert [gpu["nvlink"]["note"] for gpu in facts["nvidia"]["gpus"]] == ["Device does not have or support Nvlink"] * 2
    assert statuses(checks) == {"count": "pass", "ecc": "not_applicable", "memory": "not_applicable",
                                "throttle": "pass", "pcie": "pass", "nvlink": "not_applicable", "persistence": "pass",
                                "xid": "pass", "dcgm": "pass", "reset_required": "pass", "gpu_lost": "pass",
                                "fabric_manager": "not_applicable", "gpu_fabric": "not_applicable"}
    assert "fabric state not reported (N/A: no NVSwitch fabric behind this GPU)" in checks["gpu_fabric"]["found"]
    pcie = checks["pcie"]["found"]
    assert "x8 of its x16, as every NVIDIA GeForce RTX 4090 of the node" in pcie
    assert "gen 1 of 4 while idle (P8, 0 %)" in pcie and "judged under load only" in pcie
    assert "width as expected on 0" in pcie and "generation at its maximum on 0" in pcie
    assert "ECC not reported (ecc_mode N/A" in checks["ecc"]["found"]
    assert "Device does not have or support Nvlink" in checks["nvlink"]["found"]
    assert "ECC enabled" not in checks["ecc"]["found"]


def test_a_vgpu_guest_names_every_field_the_host_keeps(tmp_path):
    checks, facts = audit(tmp_path, devices=[(H100_BUS[0], H100)], xml="nvidia_smi_vgpu_guest.xml", nvlink=None)
    assert facts["nvidia"]["gpus"][0]["virtualization_mode"] == "VGPU"
    assert statuses(checks) == {"count": "pass", "ecc": "not_applicable", "memory": "not_applicable",
                                "throttle": "not_applicable", "pcie": "not_applicable", "nvlink": "not_applicable",
                                "persistence": "not_applicable", "xid": "pass", "dcgm": "pass",
                                "reset_required": "pass", "gpu_lost": "pass", "fabric_manager": "not_applicable",
                                "gpu_fabric": "not_applicable"}
    assert "persistence mode not reported (N/A in a vGPU guest)" in checks["persistence"]["found"]
    assert "PCIe link width, generation and replays not reported" in checks["pcie"]["found"]
    assert "clock event reasons not reported" in checks["throttle"]["found"]


# --- PCIe: the generation under load only, the width where it is real, replays ----------------------------


def _loaded(xml_name, index, state="P0"):
    xml = fixture(xml_name)
    blocks = xml.split("<gpu id=")
    blocks[index + 1] = blocks[index + 1].replace("<performance_state>P8</performance_state>",
                                                  "<performance_state>%s</performance_state>" % state)
    return (0, "<gpu id=".join(blocks), "")


def test_an_idle_gpu_at_a_lower_generation_passes_and_a_loaded_one_warns(tmp_path):
    checks, _facts = pair(tmp_path, xml=_loaded("nvidia_smi_rtx4090_pair.xml", 1))
    assert checks["pcie"]["status"] == "warn"
    assert "GPU 1 (00000000:2A:00.0) PCIe link at gen 1 of its max gen 4 under load (P0, 0 %)" in \
        checks["pcie"]["found"]
    assert "GPU 0 (00000000:18:00.0): gen 1 of 4 while idle" in checks["pcie"]["found"]
    busy = fixture("nvidia_smi_rtx4090_pair.xml").replace("<gpu_util>0 %</gpu_util>", "<gpu_util>97 %</gpu_util>")
    checks, _facts = pair(tmp_path / "busy", xml=(0, busy.replace("P8", "P2"), ""))
    assert checks["pcie"]["status"] == "warn" and "under load (P2, 97 %)" in checks["pcie"]["found"]


@pytest.mark.parametrize("widths, status, words", [
    (("8x", "16x"), "fail", "GPU 0 (00000000:18:00.0) PCIe link trained at x8 of its x16 while another NVIDIA GeForce "
                            "RTX 4090 of the node runs at x16"),
    (("4x", "4x"), "fail", "trained at x4 of its x16 (a quarter of its lanes or fewer)"),
    (("1x", "8x"), "fail", "trained at x1 of its x16"),
    (("16x", "16x"), "pass", "width as expected on 2"),
])
def test_a_link_narrower_than_its_siblings_or_a_quarter_of_its_width_fails(tmp_path, widths, status, words):
    xml = fixture("nvidia_smi_rtx4090_pair.xml")
    first, rest = xml.split("<current_link_width>8x</current_link_width>", 1)
    xml = first + "<current_link_width>%s</current_link_width>" % widths[0] + rest.replace(
        "<current_link_width>8x</current_link_width>", "<current_link_width>%s</current_link_width>" % widths[1])
    checks, _facts = pair(tmp_path, xml=(0, xml, ""))
    assert checks["pcie"]["status"] == status and words in checks["pcie"]["found"], checks["pcie"]
    if status == "fail":
        assert "reseat GPU" in checks["pcie"]["fix"]


def test_half_width_fails_where_the_operator_requires_the_full_width(tmp_path):
    checks, _facts = pair(tmp_path, overrides={"gpu_health_pcie_min_width": 16})
    expect(checks["pcie"], "fail", "x8, expected x16 (gpu_health_pcie_min_width)")


def test_pcie_replays_above_the_limit_warn(tmp_path):
    xml = edited("nvidia_smi_h100_healthy.xml", "<replay_counter>0</", "<replay_counter>147</")
    checks, _facts = audit(tmp_path, xml=xml)
    expect(checks["pcie"], "warn", "GPU 0 (00000000:18:00.0) PCIe replay count is 147 since boot")
    checks, _facts = audit(tmp_path / "allowed", xml=xml, overrides={"gpu_health_pcie_replay_max": 200})
    assert checks["pcie"]["status"] == "pass" and "replays within gpu_health_pcie_replay_max on 8" in \
        checks["pcie"]["found"]


# --- N/A, Not Found, the tool's own count, modes the operator chooses ---------------------------------------


def _xml(body, attached=1, cuda="12.4"):
    return ("<nvidia_smi_log><driver_version>430.26</driver_version><cuda_version>%s</cuda_version>"
            "<attached_gpus>%d</attached_gpus><gpu id=\"00000000:18:00.0\"><product_name>Tesla K80</product_name>"
            "<uuid>GPU-00000000-1111-2222-3333-444444444444</uuid>%s</gpu></nvidia_smi_log>" % (cuda, attached, body))


@pytest.mark.parametrize("text", ["Not Found", "[N/A]", "N/A", "Not Supported", "[Not Supported]"])
def test_unavailable_words_are_not_values(text):
    parsed = nvidia_smi_xml.parse(_xml("<persistence_mode>%s</persistence_mode>" % text, cuda=text))
    assert parsed["cuda_version"] is None and parsed["gpus"][0]["persistence_mode"] is None


def test_a_gpu_the_driver_counts_but_does_not_list_fails_the_count(tmp_path):
    checks, _facts = audit(tmp_path, devices=[(H100_BUS[0], H100)], xml=(0, _xml("", attached=4), ""), nvlink=None)
    assert checks["count"]["status"] == "fail"
    assert "nvidia-smi counts 4 attached GPUs (attached_gpus) but lists 1" in checks["count"]["found"]
    assert "nvidia-smi -L" in checks["count"]["fix"]


def test_ecc_disabled_is_not_observed_unless_required_and_a_pending_change_warns(tmp_path):
    disabled = edited("nvidia_smi_rtx4090_pair.xml", "<current_ecc>N/A</", "<current_ecc>Disabled</", 2)
    checks, _facts = pair(tmp_path, xml=disabled)
    assert checks["ecc"]["status"] == "not_applicable"
    assert "ECC is Disabled, so memory errors are neither corrected nor counted" in checks["ecc"]["found"]
    checks, _facts = pair(tmp_path / "required", xml=disabled, overrides={"gpu_health_ecc_required": True})
    expect(checks["ecc"], "warn", "is Disabled (gpu_health_ecc_required)")
    pending = edited("nvidia_smi_h100_healthy.xml", "<pending_ecc>Enabled</", "<pending_ecc>Disabled</")
    checks, _facts = audit(tmp_path / "pending", xml=pending)
    expect(checks["ecc"], "warn", "pending_ecc Disabled: the change waits for a GPU reset")


def test_persistence_modes_that_differ_on_one_node_warn(tmp_path):
    xml = edited("nvidia_smi_rtx4090_pair.xml", "<persistence_mode>Enabled</", "<persistence_mode>Disabled</")
    checks, _facts = pair(tmp_path, xml=xml)
    expect(checks["persistence"], "warn",
           "persistence_mode is Enabled on GPU 1 (00000000:2A:00.0) but Disabled on GPU 0")


def test_the_new_settings_are_validated():
    assert gpu_health.validate(settings()) == []
    assert_one_problem(gpu_health.validate(settings(gpu_health_pcie_replay_max=-1)), "gpu_health_pcie_replay_max", "-1")
    assert_one_problem(gpu_health.validate(settings(gpu_health_ecc_required=[1])), "gpu_health_ecc_required", "[1]")


# --- nvidia-smi nvlink -s: sentences, masked UUIDs, a MIG GPU among NVLink GPUs --------------------------------


def test_nvlink_sentences_are_notes_and_masked_uuids_match_by_index():
    listed = nvlink.parse(fixture("nvidia_smi_nvlink_none.txt"))
    assert [(entry["index"], entry["note"], entry["active"]) for entry in listed] == [
        (0, "Device does not have or support Nvlink", []), (1, "Device does not have or support Nvlink", [])]
    same = "GPU-00000000-0000-0000-0000-000000000000"
    gpus = [{"index": 0, "uuid": same}, {"index": 1, "uuid": same}]
    text = "GPU 0: X (UUID: %s)\n\t Link 0: 25 GB/s\nGPU 1: X (UUID: %s)\n\t Link 0: <inactive>\n" % (same, same)
    found = nvlink.match(gpus, nvlink.parse(text))
    assert found[0]["active"] == [0] and found[1]["inactive"] == [0]


def test_a_gpu_in_mig_mode_among_nvlink_gpus_is_named_and_a_non_zero_exit_with_answers_counts(tmp_path):
    lines = fixture("nvidia_smi_nvlink_h100.txt").split("GPU 7:")
    text = "%sGPU 7:%s\nNvlink queries are not supported for Devices in MIG mode\n" % (
        lines[0], lines[1].splitlines()[0])
    checks, facts = audit(tmp_path, nvlink=(3, text, ""))
    assert facts["nvidia"]["nvlink_error"] is None
    assert checks["nvlink"]["status"] == "pass"
    assert "7 GPUs with 18 active NVLinks each" in checks["nvlink"]["found"]
    assert "GPU 7 (00000000:DB:00.0): nvidia-smi nvlink -s says 'Nvlink queries are not supported" in \
        checks["nvlink"]["found"]


# --- AMD: rocm-smi's system section, replays, the kernel's banner as a driver version ---------------------------

MI250 = ("0x1002", "0x740c", "0x038000")


def _rocm(replays):
    cards = {"card%d" % index: {"Card series": "AMD Instinct MI250X/MI250",
                                "PCI Bus": "0000:%02X:00.0" % (0xc1 + index),
                                "PCIe Replay Count": str(replay), "pcie clock level": "1 (16.0GT/s x16)"}
             for index, replay in enumerate(replays)}
    return json.dumps(dict(cards, system={"Driver version": "6.8.5"}))


def test_rocm_smi_driver_version_comes_from_its_system_section_and_replays_warn(tmp_path):
    devices = [("0000:%02x:00.0" % (0xc1 + index), MI250) for index in range(2)]
    checks, facts = audit(tmp_path, devices=devices, xml=None, nvlink=None, dcgm=None, rocm=(0, _rocm([0, 147]), ""))
    assert facts["amd"]["driver_version"] == "6.8.5"
    assert [gpu["pcie_replays"] for gpu in facts["amd"]["gpus"]] == [0, 147]
    assert checks["pcie"]["status"] == "warn"
    assert "GPU 1 (00000000:C2:00.0) PCIe replay count is 147 since boot" in checks["pcie"]["found"]
    assert checks["ecc"]["status"] == "not_applicable" and "not reported" in checks["ecc"]["found"]
    assert gpu_health.profile_fields(facts)["gpu.driver_version"] == "6.8.5"
    checks, _facts = audit(tmp_path / "clean", devices=devices, xml=None, nvlink=None, dcgm=None,
                           rocm=(0, _rocm([0, 0]), ""))
    assert checks["pcie"]["status"] == "pass" and "replays within gpu_health_pcie_replay_max on 2" in \
        checks["pcie"]["found"]


def test_amd_smi_replays_and_the_kernel_banner_as_a_driver_version(tmp_path):
    static = json.loads(fixture("amd_smi_static_mi300x.json"))
    items = static["gpu_data"] if isinstance(static, dict) else static
    items[0]["driver"]["version"] = "Linuxversion6.8.0-45-generic(buildd@lcy02-amd64-075)(x86_64-linux-gnu-gcc-13)"
    metric = json.loads(fixture("amd_smi_metric_ecc.json"))
    metric_items = metric["gpu_data"] if isinstance(metric, dict) else metric
    metric_items[3]["pcie"]["replay_count"] = 147
    from gpu_health_helpers import MI300X, MI300X_BUS  # pylint: disable=import-outside-toplevel
    checks, facts = audit(tmp_path, devices=[(address, MI300X) for address in MI300X_BUS], xml=None, nvlink=None,
                          dcgm=None, amd=((0, json.dumps(static), ""), (0, json.dumps(metric), "")))
    assert facts["amd"]["gpus"][0]["driver_version"] == "6.8.0-45-generic"
    assert "GPU 3 (00000000:5C:00.0) PCIe replay count is 147 since boot" in checks["pcie"]["found"]


# --- DCGM: a skipped test is reported --------------------------------------------------------------------------


def _dcgm(statuses_by_test):
    tests = [{"name": name, "results": [{"gpu_id": "0", "status": status}]} for name, status in statuses_by_test]
    return (0, json.dumps({"DCGM GPU Diagnostic": {"test_categories": [{"category": "Hardware", "tests": tests}]}}),
            "")


def test_dcgm_tests_that_were_skipped_are_reported_not_dropped(tmp_path):
    checks, _facts = audit(tmp_path, dcgm=_dcgm([("Memory", "Pass"), ("EUD", "Skip")]))
    assert checks["dcgm"]["status"] == "pass"
    assert "1 DCGM results at level 1, none failed or warned" in checks["dcgm"]["found"]
    assert "skipped by DCGM: 'EUD' on GPU 0 (00000000:18:00.0)" in checks["dcgm"]["found"]
    checks, _facts = audit(tmp_path / "all", dcgm=_dcgm([("EUD", "Skip")]))
    assert checks["dcgm"]["status"] == "not_applicable" and "skipped every test" in checks["dcgm"]["found"]
