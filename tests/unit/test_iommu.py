"""The iommu capability: validate, read (sandbox roots, FakeOps), decide (tables), and the writer's parity."""

import functools
import json
import os
import subprocess
import sys

import pytest
import yaml

import grub_cmdline
from preflight_node import checks as preflight_checks
from preflight_node.grub import plan as grub_plan
from preflight_node.capabilities import iommu as node_iommu
from cluster_preflight.capabilities import iommu
from fake_ops import FakeOps
from capability_helpers import (ROOT, assert_contract as check_contract, assert_table, capability_under_test,
                                deny_reading, role_settings, role_yaml, switched_off_cases, typed_settings)

ROLE_NAME = "iommu"
ROLE, HOST, NODE = capability_under_test(ROLE_NAME, "node7", "198.18.0.7")

GRUB = (
    "GRUB_DEFAULT=0\n"
    "GRUB_CMDLINE_LINUX_DEFAULT=\"quiet\"\n"
    "GRUB_CMDLINE_LINUX='console=tty0'   # keep\n"
)
MI300X = ("0x1002", "0x74a1", "0x120000")
# The drop-in exactly as the writer leaves it.
OWN_DROPIN = grub_plan.dropin_text("GRUB_CMDLINE_LINUX_DEFAULT", ["iommu=soft"], grub_plan.DROPIN_HEADER)
H100 = ("0x10de", "0x2330", "0x030200")
BMC = ("0x1a03", "0x2000", "0x030000")


load_yaml = functools.partial(role_yaml, ROLE_NAME)


# The role's defaults, typed, with overrides: what preflight_settings hands a capability.
settings = functools.partial(role_settings, ROLE_NAME)


def make_node(tmp_path, devices=(MI300X,), grub=GRUB, dropins=None,
              cmdline="BOOT_IMAGE=/vmlinuz root=/dev/sda1 quiet\n", grub_d=True):
    """A sandbox: ``sys/bus/pci/devices`` and a root with the grub defaults and /proc/cmdline."""
    sysfs = tmp_path / "sys"
    base = sysfs / "bus" / "pci" / "devices"
    base.mkdir(parents=True)
    for index, (vendor, device, cls) in enumerate(devices):
        path = base / ("0000:%02x:00.0" % (0xc1 + index))
        path.mkdir()
        (path / "vendor").write_text(vendor + "\n")
        (path / "device").write_text(device + "\n")
        (path / "class").write_text(cls + "\n")
    root = tmp_path / "root"
    (root / "etc" / "default").mkdir(parents=True)
    if grub_d:
        (root / "etc" / "default" / "grub.d").mkdir()
    if grub is not None:
        (root / "etc" / "default" / "grub").write_text(grub)
    for name, text in (dropins or {}).items():
        (root / "etc" / "default" / "grub.d" / name).write_text(text)
    (root / "proc").mkdir()
    if cmdline is not None:
        (root / "proc" / "cmdline").write_text(cmdline)
    return sysfs, root


def node_settings(sysfs, root, **overrides):
    return settings(iommu_sysfs_root=str(sysfs), iommu_root=str(root), **overrides)


def read_node(sysfs, root, **overrides):
    wanted = node_settings(sysfs, root, **overrides)
    ops = FakeOps()
    facts = node_iommu.read(iommu.read_args(wanted, NODE), ops)
    assert ops.calls == []  # file reads only
    # Facts travel from the node as JSON.
    facts = json.loads(json.dumps(facts))
    return facts, wanted


# Names inside the contract; every warn/fail has found/expected/fix and names the node.
assert_contract = functools.partial(check_contract, ROLE_NAME, host=HOST)


def audit(tmp_path, **kwargs):
    overrides = kwargs.pop("settings", {})
    sysfs, root = make_node(tmp_path, **kwargs)
    facts, wanted = read_node(sysfs, root, **overrides)
    checks = iommu.decide(HOST, facts, wanted)
    assert_contract(checks)
    return checks


# --- the PCI scan (library/pci_gpus.py uses the same one) -------------------------------------------------


def test_read_finds_the_amd_gpu_and_the_grub_files(tmp_path):
    sysfs, root = make_node(tmp_path, devices=(BMC, MI300X, H100), dropins={"50-cloud.cfg": "GRUB_TIMEOUT=0\n"})
    facts, _wanted = read_node(sysfs, root)
    assert facts["pci"]["amd_gpus"] == 1 and facts["pci"]["nvidia_gpus"] == 1 and facts["pci"]["count"] == 3
    assert facts["pci"]["present"] is True and facts["pci"]["error"] is None
    grub = facts["grub"]
    assert grub["grub_default"] == str(root / "etc" / "default" / "grub")
    assert grub["dropins"] == [str(root / "etc" / "default" / "grub.d" / "50-cloud.cfg")]
    assert grub["texts"][grub["grub_default"]] == GRUB
    assert grub["dropin_dir_exists"] is True and grub["errors"] == {}
    assert facts["cmdline"]["text"].startswith("BOOT_IMAGE") and facts["cmdline"]["error"] is None


def test_read_without_a_pci_bus_is_a_fact(tmp_path):
    _sysfs, root = make_node(tmp_path)
    facts, wanted = read_node(tmp_path / "no-sysfs", root)
    assert facts["pci"]["present"] is False and facts["pci"]["amd_gpus"] == 0
    checks = iommu.decide(HOST, facts, wanted)
    assert checks["grub"]["status"] == "not_applicable"
    assert "no PCI bus visible" in checks["grub"]["found"] and HOST in checks["grub"]["found"]


def test_read_of_an_unreadable_pci_bus_is_a_fact_and_a_warning(tmp_path, monkeypatch):
    sysfs, root = make_node(tmp_path)
    real_listdir = os.listdir

    def listdir(path):
        if str(path).endswith(os.path.join("bus", "pci", "devices")):
            raise PermissionError(13, "Permission denied", str(path))
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", listdir)
    facts, wanted = read_node(sysfs, root)
    assert "Permission denied" in facts["pci"]["error"]
    checks = iommu.decide(HOST, facts, wanted)
    assert_contract(checks)
    assert checks["grub"]["status"] == "warn" and "cannot tell whether node7 has an AMD GPU" in checks["grub"]["found"]
    assert "sysfs" in checks["grub"]["fix"]


def test_read_with_a_malformed_device_id_filter_is_a_fact_not_an_exception(tmp_path):
    sysfs, root = make_node(tmp_path)
    facts, _wanted = read_node(sysfs, root, iommu_amd_device_ids=["mi300"])
    assert "mi300" in facts["pci"]["error"]


def test_read_of_unreadable_grub_and_cmdline_files_are_facts(tmp_path):
    sysfs, root = make_node(tmp_path, grub=None, cmdline=None)
    (root / "etc" / "default" / "grub").mkdir()  # a directory where the file should be: open() fails
    (root / "proc" / "cmdline").mkdir()
    facts, wanted = read_node(sysfs, root)
    assert str(root / "etc" / "default" / "grub") in facts["grub"]["errors"]
    assert facts["cmdline"]["text"] is None and facts["cmdline"]["error"]
    checks = iommu.decide(HOST, facts, wanted)
    assert_contract(checks)
    assert checks["grub"]["status"] == "warn" and "cannot read" in checks["grub"]["found"]
    assert checks["cmdline"]["status"] == "warn" and "cannot read" in checks["cmdline"]["found"]


def test_read_keeps_bytes_that_are_not_utf8_json_safe(tmp_path):
    sysfs, root = make_node(tmp_path)
    (root / "etc" / "default" / "grub").write_bytes(b"# caf\xe9\nGRUB_CMDLINE_LINUX_DEFAULT=\"quiet iommu=soft\"\n")
    facts, wanted = read_node(sysfs, root)
    assert iommu.decide(HOST, facts, wanted)["grub"]["status"] == "pass"


# --- decide: a table ------------------------------------------------------------------------------------


CASES = [
    # id, make_node kwargs, settings, {check: (status, text in found, text in fix)}
    ("soft-missing", {}, {},
     {"grub": ("warn", "GRUB_CMDLINE_LINUX_DEFAULT lacks iommu=soft on node7", "update-grub"),
      "cmdline": ("warn", "running kernel command line lacks iommu=soft on node7", "run bringup.yml")}),
    ("soft-missing-fail-policy", {}, {"iommu_drift_policy": "fail"},
     {"grub": ("fail", "lacks iommu=soft", "reboot the node"), "cmdline": ("warn", "lacks iommu=soft", "")}),
    ("soft-in-dropin-and-running", {"dropins": {"90-preflight-iommu.cfg": OWN_DROPIN},
                                    "cmdline": "root=/dev/sda1 quiet iommu=soft\n"}, {},
     {"grub": ("pass", "no change needed", ""), "cmdline": ("pass", "has iommu=soft", "")}),
    ("soft-set-reboot-pending", {"grub": GRUB.replace('"quiet"', '"quiet iommu=soft"')}, {},
     {"grub": ("pass", "GRUB_CMDLINE_LINUX_DEFAULT has iommu=soft", ""),
      "cmdline": ("warn", "lacks iommu=soft", "reboot the node so it boots")}),
    ("soft-with-conflict-in-grub", {"grub": GRUB.replace("console=tty0", "console=tty0 amd_iommu=off")}, {},
     {"grub": ("warn", "GRUB_CMDLINE_LINUX carries amd_iommu=off", "remove amd_iommu=off"),
      "cmdline": ("warn", "lacks iommu=soft", "run bringup.yml")}),
    ("soft-conflict-running", {"grub": GRUB.replace('"quiet"', '"quiet iommu=soft"'),
                               "cmdline": "root=/dev/sda1 iommu=soft amd_iommu=off\n"}, {},
     {"grub": ("pass", "", ""), "cmdline": ("warn", "carries amd_iommu=off", "reboot the node")}),
    ("off-mode", {}, {"iommu_mode": "off"},
     {"grub": ("warn", "GRUB_CMDLINE_LINUX lacks amd_iommu=off", "add amd_iommu=off to GRUB_CMDLINE_LINUX"),
      "cmdline": ("warn", "lacks amd_iommu=off", "")}),
    ("redundant-dropin", {"grub": GRUB.replace('"quiet"', '"quiet iommu=soft"'),
                          "dropins": {"90-preflight-iommu.cfg": "# stale\n"},
                          "cmdline": "iommu=soft\n"}, {},
     {"grub": ("warn", "90-preflight-iommu.cfg need rewriting", ""), "cmdline": ("pass", "", "")}),
    ("broken-shell", {"grub": 'GRUB_CMDLINE_LINUX_DEFAULT="quiet\n'}, {},
     {"grub": ("fail", "cannot evaluate the grub defaults on node7", "line 1"), "cmdline": ("warn", "", "")}),
    ("built-from-variable", {"grub": 'SITE="amd_iommu=off"\nGRUB_CMDLINE_LINUX="$SITE"\n'}, {},
     {"grub": ("warn", "even after", "edit the lines named by hand"), "cmdline": ("warn", "", "")}),
    ("no-grub", {"grub": None, "grub_d": False}, {},
     {"grub": ("warn", "no /etc/default/grub on node7: grub does not appear", "boot loader"),
      "cmdline": ("warn", "lacks iommu=soft", "run bringup.yml")}),
    ("nvidia-only", {"devices": (H100, BMC)}, {},
     {"grub": ("not_applicable", "no AMD GPU (vendor 0x1002, display/accelerator class) found on node7", ""),
      "cmdline": ("not_applicable", "no AMD GPU", "")}),
    ("amd-filtered-out", {}, {"iommu_amd_device_ids": ["0x740f"]},
     {"grub": ("not_applicable", "iommu_amd_device_ids (0x740f)", ""), "cmdline": ("not_applicable", "", "")}),
] + switched_off_cases(ROLE_NAME, HOST)


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_decide(tmp_path, case):
    _name, node_kwargs, overrides, expected = case
    sysfs, root = make_node(tmp_path, **node_kwargs)
    wanted = node_settings(sysfs, root, **overrides)
    args = iommu.read_args(wanted, NODE)
    facts = None if args is None else json.loads(json.dumps(node_iommu.read(args, FakeOps())))
    checks = iommu.decide(HOST, facts, wanted)
    assert_contract(checks)
    assert_table(checks, expected)


def test_switched_off_reads_nothing(tmp_path):
    for value in (False, "false", "no", "0"):
        assert iommu.read_args(settings(iommu_enabled=value), NODE) is None
    assert iommu.read_args(settings(iommu_enabled="true"), NODE) is not None


def test_decide_without_facts_is_a_failure_naming_the_node():
    checks = iommu.decide(HOST, None, settings())
    assert_contract(checks)
    assert checks["no_facts"]["status"] == "fail"


def test_check_names_qualify_in_the_verdict(tmp_path):
    checks = audit(tmp_path)
    flat = preflight_checks.flatten({iommu.CAPABILITY: checks})
    assert sorted(flat) == ["iommu.cmdline", "iommu.grub"]


# --- the writer and the decider agree -----------------------------------------------------------------------


def module_args(root, wanted, mode):
    kernel = iommu.MODES[wanted["iommu_mode"]]
    return {"args": [kernel["arg"]], "absent": [kernel["conflict"]], "variable": kernel["variable"],
            "root": str(root), "mode": mode, "dropin_name": wanted["iommu_grub_dropin_name"], "update_command": [],
            "check_prefix": "iommu", "drift_status": wanted["iommu_drift_policy"]}


def strip_node(text):
    return text.replace(" on %s" % HOST, "").replace(" on this node", "")


PARITY = [
    ("missing", {}, {}),
    ("conflict", {"grub": GRUB.replace("console=tty0", "console=tty0 amd_iommu=off")}, {"iommu_mode": "soft"}),
    ("off", {}, {"iommu_mode": "off", "iommu_drift_policy": "fail"}),
    ("done", {"grub": GRUB.replace('"quiet"', '"quiet iommu=soft"'), "cmdline": "iommu=soft\n"}, {}),
    ("broken", {"grub": 'GRUB_CMDLINE_LINUX_DEFAULT="quiet\n'}, {}),
    ("no-grub", {"grub": None, "grub_d": False}, {}),
    ("inplace", {"grub_d": False}, {"iommu_grub_mode": "inplace"}),
]


@pytest.mark.parametrize("case", PARITY, ids=[case[0] for case in PARITY])
def test_audit_reports_what_the_writer_reports_in_check_mode(run_module, tmp_path, case):
    _name, node_kwargs, overrides = case
    sysfs, root = make_node(tmp_path, **node_kwargs)
    facts, wanted = read_node(sysfs, root, **overrides)
    decided = iommu.decide(HOST, facts, wanted)
    result, failed = run_module(grub_cmdline, module_args(root, wanted, wanted["iommu_grub_mode"]), check_mode=True)
    assert not failed
    for name in ("grub", "cmdline"):
        mine, theirs = decided[name], result["checks"]["iommu_" + name]
        assert mine["status"] == theirs["status"], (name, mine, theirs)
        assert mine["expected"] == theirs["expected"] and mine["fix"] == theirs["fix"], (name, mine, theirs)
        assert strip_node(mine["found"]) == strip_node(theirs["found"]), (name, mine, theirs)


@pytest.mark.parametrize("mode", ["dropin", "inplace"])
def test_re_audit_after_the_writer_applied_passes_the_grub_check(run_module, tmp_path, mode):
    sysfs, root = make_node(tmp_path)
    facts, wanted = read_node(sysfs, root, iommu_grub_mode=mode)
    assert iommu.decide(HOST, facts, wanted)["grub"]["status"] == "warn"
    result, failed = run_module(grub_cmdline, module_args(root, wanted, mode))
    assert not failed and result["changed"]
    facts, wanted = read_node(sysfs, root, iommu_grub_mode=mode)
    checks = iommu.decide(HOST, facts, wanted)
    assert checks["grub"]["status"] == "pass"
    assert checks["cmdline"]["status"] == "warn" and checks["cmdline"]["fix"].startswith("reboot the node")
    (root / "proc" / "cmdline").write_text("root=/dev/sda1 quiet iommu=soft\n")
    facts, wanted = read_node(sysfs, root, iommu_grub_mode=mode)
    assert {name: check["status"] for name, check in iommu.decide(HOST, facts, wanted).items()} == {
        "grub": "pass", "cmdline": "pass"}


def test_plan_is_the_one_function_both_use(tmp_path):
    sysfs, root = make_node(tmp_path)
    facts, wanted = read_node(sysfs, root)
    outcome = grub_plan.plan(facts["grub"], iommu.wanted_of(wanted), "dropin")
    assert outcome["state"] == "planned" and outcome["added"] == ["iommu=soft"]
    assert outcome["changed_paths"] == [str(root / "etc" / "default" / "grub.d" / "90-preflight-iommu.cfg")]


# --- validate ----------------------------------------------------------------------------------------------


def test_defaults_are_valid():
    assert iommu.validate(settings()) == []


@pytest.mark.parametrize("overrides, name, text", [
    ({"iommu_amd_device_ids": ["mi300"]}, "iommu_amd_device_ids", "mi300"),
    ({"iommu_amd_device_ids": ["0x74a1", "0x123456"]}, "iommu_amd_device_ids", "0x123456"),
    ({"iommu_grub_dropin_name": "iommu.conf"}, "iommu_grub_dropin_name", "iommu.conf"),
    ({"iommu_grub_dropin_name": "../grub.cfg"}, "iommu_grub_dropin_name", "../grub.cfg"),
    ({"iommu_grub_update_command": ["update-grub", ""]}, "iommu_grub_update_command", "update-grub"),
    ({"iommu_grub_update_command": ["grub2-mkconfig -o /boot/grub2/grub.cfg"]}, "iommu_grub_update_command",
     "grub2-mkconfig -o"),
    ({"iommu_grub_update_timeout": 0}, "iommu_grub_update_timeout", "0"),
    ({"iommu_reboot_timeout": -5}, "iommu_reboot_timeout", "-5"),
    ({"iommu_root": "srv/fake"}, "iommu_root", "srv/fake"),
    ({"iommu_sysfs_root": "sys"}, "iommu_sysfs_root", "sys"),
    ({"iommu_reboot": True, "iommu_root": "/srv/fake"}, "iommu_reboot", "/srv/fake"),
    ({"iommu_mode": "on"}, "iommu_mode", "on"),
])
def test_validate_names_the_variable_with_found_expected_fix(overrides, name, text):
    problems = iommu.validate(settings(**overrides))
    assert [problem["name"] for problem in problems] == [name], problems
    problem = problems[0]
    assert text in problem["found"] and problem["expected"] and problem["fix"]


def test_validate_accepts_what_users_write():
    assert iommu.validate(settings(iommu_amd_device_ids=["74A1", "0x740f"], iommu_grub_update_command=[],
                                   iommu_reboot=True)) == []
    assert iommu.validate(settings(iommu_grub_update_command=["/usr/sbin/grub2-mkconfig", "-o",
                                                              "/boot/grub2/grub.cfg"])) == []


# --- the role ----------------------------------------------------------------------------------------------------


def test_defaults_are_mirrored_by_the_argument_specs():
    options = load_yaml("meta", "argument_specs.yml")["argument_specs"]["main"]["options"]
    assert sorted(options) == sorted(load_yaml("defaults", "main.yml"))


def test_the_role_and_the_decider_share_one_mode_table():
    assert load_yaml("vars", "main.yml")["iommu_kernel_table"] == iommu.MODES


def test_role_tasks_are_writers_with_timeouts_and_typed_switches():
    with open(os.path.join(ROLE, "tasks", "main.yml")) as handle:
        text = handle.read()
    tasks = yaml.safe_load(text)
    assert all("timeout" in task for task in tasks), tasks
    assert "preflight_audit" not in text and "iommu_checks" not in text and "set_fact" not in text
    for task in tasks:
        for condition in task.get("when", []) if isinstance(task.get("when"), list) else [task.get("when")]:
            if condition and ("iommu_enabled" in condition or "iommu_reboot" in condition):
                assert "| bool" in condition, condition


def test_role_switched_off_from_the_command_line_does_nothing(tmp_path):
    playbook = tmp_path / "play.yml"
    playbook.write_text("- hosts: localhost\n  connection: local\n  gather_facts: false\n  roles:\n    - role: iommu\n")
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", str(playbook),
         "-e", "ansible_python_interpreter=%s" % sys.executable, "-e", "iommu_enabled=false"],
        capture_output=True, text=True, env=env, timeout=120, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "changed=0" in proc.stdout and "failed=0" in proc.stdout


def typed(**overrides):
    """The defaults with ``overrides`` as ``-e`` passes them, typed by the role's argument specs."""
    return typed_settings(ROLE_NAME, **overrides)


def test_settings_typed_from_the_command_line_validate_and_switch_off():
    assert iommu.validate(typed()) == []
    assert iommu.validate(typed(iommu_grub_update_timeout="600")) == []
    assert iommu.read_args(typed(iommu_enabled="false"), NODE) is None
    assert iommu.validate(typed(iommu_reboot_timeout="0"))[0]["name"] == "iommu_reboot_timeout"


def test_grub_defaults_refused_to_a_reader_without_root_are_blocked_never_failed(tmp_path, monkeypatch):
    sysfs, root = make_node(tmp_path)
    deny_reading(monkeypatch, node_iommu, "/etc/default/grub")
    facts, wanted = read_node(sysfs, root, iommu_drift_policy="fail")
    monkeypatch.undo()
    assert facts["privileged"] is False and [item["path"] for item in facts["needs_root"]] == [
        str(root / "etc" / "default" / "grub")]
    checks = iommu.decide(HOST, facts, wanted)
    assert_contract(checks)
    assert checks["grub"]["status"] == "skipped" and checks["grub"]["details"]["blocked"], checks["grub"]
    assert checks["grub"]["found"].startswith("needs root: cannot read ")
    assert all(check["status"] != "fail" for check in checks.values()), checks
