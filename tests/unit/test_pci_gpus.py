import os

import pytest

import pci_gpus

# address -> (vendor, device, class, driver)
DEVICES = {
    "0000:c1:00.0": ("0x1002", "0x74a1", "0x120000", "amdgpu"),   # AMD Instinct MI300X (accelerator class)
    "0000:c2:00.0": ("0x1002", "0x740f", "0x038000", None),       # AMD Instinct MI210 (display/other class)
    "0000:17:00.0": ("0x10de", "0x2330", "0x030200", "nvidia"),   # NVIDIA H100 (3D controller)
    "0000:03:00.0": ("0x1a03", "0x2000", "0x030000", "ast"),      # ASPEED BMC VGA
    "0000:41:00.0": ("0x15b3", "0x1021", "0x020000", "mlx5_core"),  # NIC
    "0000:00:00.0": ("0x1022", "0x14a4", "0x060000", None),       # AMD host bridge (vendor 0x1022, not a GPU)
}


def make_sysfs(root, devices):
    base = root / "bus" / "pci" / "devices"
    base.mkdir(parents=True)
    drivers = root / "bus" / "pci" / "drivers"
    for address, (vendor, device, cls, driver) in devices.items():
        path = base / address
        path.mkdir()
        (path / "vendor").write_text(vendor + "\n")
        (path / "device").write_text(device + "\n")
        (path / "class").write_text(cls + "\n")
        if driver:
            (drivers / driver).mkdir(parents=True, exist_ok=True)
            os.symlink(str(drivers / driver), str(path / "driver"))
    return root


@pytest.fixture
def sysfs(tmp_path):
    return make_sysfs(tmp_path / "sys", DEVICES)


def test_scan_counts_gpus_by_vendor_and_skips_bmc_vga_and_nic(sysfs):
    summary = pci_gpus.scan(str(sysfs))
    addresses = [gpu["address"] for gpu in summary["gpus"]]
    assert addresses == ["0000:03:00.0", "0000:17:00.0", "0000:c1:00.0", "0000:c2:00.0"]
    assert summary["amd_gpus"] == 2
    assert summary["nvidia_gpus"] == 1
    assert summary["intel_gpus"] == 0
    assert summary["count"] == 4
    bmc = summary["gpus"][0]
    assert bmc["vendor_name"] == "other" and bmc["class"] == "0x030000"
    mi300 = summary["gpus"][2]
    assert mi300 == {"address": "0000:c1:00.0", "vendor": "0x1002", "vendor_name": "amd", "device": "0x74a1",
                     "class": "0x120000", "driver": "amdgpu"}
    assert summary["gpus"][3]["driver"] is None


def test_amd_device_ids_filter_keeps_only_listed_amd_devices(sysfs):
    summary = pci_gpus.scan(str(sysfs), ["74A1"])
    assert summary["amd_gpus"] == 1
    assert [gpu["device"] for gpu in summary["gpus"] if gpu["vendor_name"] == "amd"] == ["0x74a1"]
    assert summary["nvidia_gpus"] == 1


def test_module_publishes_fact_in_check_mode(run_module, sysfs):
    result, failed = run_module(pci_gpus, {"sysfs_root": str(sysfs)}, check_mode=True)
    assert not failed
    assert result["changed"] is False
    assert result["amd_gpus"] == 2 and result["nvidia_gpus"] == 1
    fact = result["ansible_facts"]["preflight_pci_gpus"]
    assert fact["amd_gpus"] == 2 and len(fact["gpus"]) == 4


def test_node_without_gpu_reports_zero(run_module, tmp_path):
    root = make_sysfs(tmp_path / "sys", {"0000:00:03.0": ("0x1af4", "0x1000", "0x020000", None)})
    result, failed = run_module(pci_gpus, {"sysfs_root": str(root)})
    assert not failed
    assert result["count"] == 0 and result["amd_gpus"] == 0 and result["gpus"] == []


def test_missing_pci_bus_is_no_gpu_with_a_note(run_module, tmp_path):
    result, failed = run_module(pci_gpus, {"sysfs_root": str(tmp_path / "nothing")})
    assert not failed
    assert result["count"] == 0
    assert "no PCI bus" in result["notes"][0]


def test_unreadable_or_partial_device_entries_are_skipped(tmp_path):
    root = make_sysfs(tmp_path / "sys", {"0000:c1:00.0": ("0x1002", "0x74a1", "0x120000", None)})
    (root / "bus" / "pci" / "devices" / "0000:c3:00.0").mkdir()  # no attributes at all
    broken = root / "bus" / "pci" / "devices" / "0000:c4:00.0"
    broken.mkdir()
    for name, value in (("vendor", "garbage"), ("device", "0x74a1"), ("class", "0x120000")):
        (broken / name).write_text(value)
    assert pci_gpus.scan(str(root))["amd_gpus"] == 1


def test_bad_device_id_is_an_argument_error(run_module, sysfs):
    result, failed = run_module(pci_gpus, {"sysfs_root": str(sysfs), "amd_device_ids": ["mi300"]})
    assert failed
    assert "mi300" in result["msg"]
