"""Bring-up of the GPU fabric on a node of the project's own making: pci_acs_bridges finds the bridges between the
GPUs and the NICs and the kernel argument that clears their ACS redirect, grub_cmdline writes it (check mode writes
nothing, apply, re-apply changes nothing); pci_gpus names the NVSwitches that call for a fabric manager."""

import hashlib
import os

import pytest

import grub_cmdline
import pci_acs_bridges
import pci_gpus
from fabric_tree import hgx_layout, make_pci, make_tree

GRUB = "GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT=\"quiet\"\nGRUB_CMDLINE_LINUX=\"console=ttyS0,115200n8\"\n"


def hgx(root):
    layout = make_pci(root)
    make_tree(root, pci=layout["nics"], parents=layout["parents"])
    return layout


def hashes(root):
    found = {}
    for folder, _dirs, files in os.walk(str(root)):
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as handle:
                found[path] = hashlib.sha256(handle.read()).hexdigest()
    return found


def test_the_bridges_between_gpus_and_nics_and_their_kernel_argument(run_module, tmp_path):
    layout = hgx(tmp_path)
    result, failed = run_module(pci_acs_bridges, {"sysfs_root": str(tmp_path)}, check_mode=True)
    assert not failed and result["changed"] is False
    # Each switch: its upstream port and the four downstream ports; never the root ports or the NVSwitches' port.
    assert len(result["bridges"]) == 20 and "0000:15:01.0" not in result["bridges"]
    assert set(result["bridges"]) <= set(layout["bridges"])
    assert result["ids"] == ["1000:c030"] and result["kernel_arg"] == "pci=disable_acs_redir=pci:1000:c030"


def test_bridges_of_two_switch_models_are_refused_naming_them(run_module, tmp_path):
    hgx(tmp_path)
    with open(str(tmp_path / "bus" / "pci" / "devices" / "0000:39:01.0" / "device"), "w") as handle:
        handle.write("0xc040\n")
    result, failed = run_module(pci_acs_bridges, {"sysfs_root": str(tmp_path)})
    assert failed and "2 PCI ids (1000:c030:" in result["msg"] and "1000:c040: 0000:39:01.0" in result["msg"]
    assert "setpci -s BRIDGE ECAP_ACS+0x6.w=0000" in result["msg"]


def test_no_shared_switch_no_argument(run_module, tmp_path):
    make_pci(tmp_path)
    make_tree(tmp_path, pci=["0000:%02x:00.0" % bus for bus in range(0xe0, 0xe8)])
    result, failed = run_module(pci_acs_bridges, {"sysfs_root": str(tmp_path)})
    assert not failed and result["bridges"] == [] and result["kernel_arg"] is None


@pytest.fixture
def grub_root(tmp_path):
    root = tmp_path / "root"
    (root / "etc" / "default" / "grub.d").mkdir(parents=True)
    (root / "etc" / "default" / "grub").write_text(GRUB)
    (root / "proc").mkdir()
    (root / "proc" / "cmdline").write_text("BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro quiet\n")
    return root


def test_the_acs_argument_in_four_steps(run_module, tmp_path, grub_root):
    hgx(tmp_path / "sys")
    found, _failed = run_module(pci_acs_bridges, {"sysfs_root": str(tmp_path / "sys")})
    args = {"args": [found["kernel_arg"]], "variable": "GRUB_CMDLINE_LINUX", "mode": "auto",
            "dropin_name": "91-preflight-acs.cfg", "root": str(grub_root), "update_command": [],
            "check_prefix": "fabric_acs"}
    before = hashes(grub_root)
    result, failed = run_module(grub_cmdline, args, check_mode=True, diff=True)
    assert not failed and result["changed"] is True and hashes(grub_root) == before
    diffs = result["diff"] if isinstance(result["diff"], list) else [result["diff"]]
    assert any("pci=disable_acs_redir=pci:1000:c030" in diff["after"] for diff in diffs)
    result, failed = run_module(grub_cmdline, args)
    assert not failed and result["changed"] is True
    dropin = (grub_root / "etc" / "default" / "grub.d" / "91-preflight-acs.cfg").read_text()
    assert "pci=disable_acs_redir=pci:1000:c030" in dropin
    assert result["reboot_required"] is True
    after = hashes(grub_root)
    result, failed = run_module(grub_cmdline, args)
    assert not failed and result["changed"] is False and hashes(grub_root) == after


def test_pci_gpus_names_the_nvswitches(run_module, tmp_path):
    layout = make_pci(tmp_path)
    result, failed = run_module(pci_gpus, {"sysfs_root": str(tmp_path)})
    assert not failed and result["nvidia_gpus"] == 8
    assert [switch["address"] for switch in result["nvswitches"]] == layout["nvswitches"]
    assert hgx_layout()["nvswitches"] == layout["nvswitches"]
