import errno
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import grub_cmdline
from preflight_node.grub import plan as grub_plan
from preflight_node.grub import shell as grub_shell
from preflight_node.capabilities import iommu as node_iommu
from cluster_preflight.capabilities import iommu as preflight_iommu
from fake_ops import FakeOps

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SH = shutil.which("sh")

# A grub defaults file with everything an in-place edit must keep.
FOREIGN = (
    "# If you change this file, run 'update-grub' afterwards to update\n"
    "# /boot/grub/grub.cfg.\n"
    "\n"
    "GRUB_DEFAULT=0\n"
    "GRUB_TIMEOUT=5\n"
    "GRUB_DISTRIBUTOR='Debian'\n"
    "GRUB_CMDLINE_LINUX_DEFAULT=\"quiet\"\n"
    "GRUB_CMDLINE_LINUX='console=tty0 console=ttyS0,115200n8'   # serial console, keep\n"
    "# GRUB_CMDLINE_LINUX_DEFAULT=\"commented out, never evaluated\"\n"
    "export GRUB_TERMINAL=\"console serial\"\n"
    "GRUB_CMDLINE_LINUX_DEFAULT=\"$GRUB_CMDLINE_LINUX_DEFAULT splash mitigations=auto\"  # second one wins\n"
    "GRUB_DISABLE_OS_PROBER=true\n"
)

SOFT = {"args": ["iommu=soft"], "absent": ["amd_iommu=off"], "variable": "GRUB_CMDLINE_LINUX_DEFAULT"}
OFF = {"args": ["amd_iommu=off"], "absent": ["iommu=soft"], "variable": "GRUB_CMDLINE_LINUX"}


def sh_value(paths, name):
    """What /bin/sh makes of ``name`` after sourcing ``paths`` in order."""
    script = "".join('. "%s"; ' % path for path in paths) + 'printf %%s "$%s"' % name
    return subprocess.run([SH, "-c", script], capture_output=True, text=True, check=True, timeout=10).stdout


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def node(tmp_path):
    """A fake root: /etc/default/grub, an empty grub.d, /proc/cmdline."""
    (tmp_path / "etc" / "default" / "grub.d").mkdir(parents=True)
    (tmp_path / "etc" / "default" / "grub").write_text(FOREIGN)
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cmdline").write_text("BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro quiet splash\n")
    return tmp_path


@pytest.fixture
def update_script(tmp_path):
    """A stand-in for update-grub that records each call in calls.log."""
    log = tmp_path / "calls.log"
    script = tmp_path / "fake-update-grub"
    script.write_text('#!/bin/sh\necho "$@" >> "%s"\n' % log)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, log


def calls(log):
    return log.read_text().splitlines() if log.exists() else []


def module_args(node, settings, mode, **extra):
    args = dict(settings, root=str(node), mode=mode, dropin_name="90-preflight-iommu.cfg", check_prefix="iommu")
    args.update(extra)
    return args


# --- the shell evaluation -------------------------------------------------------------------------


def test_parser_follows_shell_semantics(tmp_path):
    text = (
        "A='single $NOT expanded'\n"
        'B="double $A"\n'
        "C=plain\\ word\n"
        'D="${C}x ${UNSET:-fallback} ${C:-unused}"\n'
        'E="line one \\\n'
        'continued"   # comment with "quotes\n'
        "export F=exported G=two\n"
        'H=a"b c"\'d e\'f  # glued pieces\n'
        "I=x#not-a-comment\n"
        'J="escaped \\" \\$A \\\\ done"\n'
    )
    path = tmp_path / "f"
    path.write_text(text)
    env = {}
    assignments, notes = grub_shell.parse(text, str(path), env)
    assert notes == []
    for name in "ABCDEFGHIJ":
        assert env[name] == sh_value([path], name), name
    assert [item.name for item in assignments] == list("ABCDEFGHIJ")
    assert env["D"] == "plain wordx fallback plain word"


def test_parser_skips_what_it_cannot_evaluate_and_says_so(tmp_path):
    text = (
        'X="before"\n'
        "if [ -e /nonexistent ]; then\n"
        '  X="inside if"\n'
        "fi\n"
        "Y=`uname`\n"
    )
    env = {}
    _assignments, notes = grub_shell.parse(text, "grub", env)
    assert any("line 2" in note and "not a plain assignment" in note for note in notes)
    assert any("line 5" in note and "command substitution" in note for note in notes)


def test_unterminated_quote_is_a_parse_error():
    with pytest.raises(grub_shell.ShellParseError) as info:
        grub_shell.parse('A=1\nGRUB_CMDLINE_LINUX="quiet\n', "grub", {})
    assert info.value.line == 2


def test_matches_absent_exact_and_by_key():
    assert grub_plan.matches_absent("amd_iommu=off", ["amd_iommu=off"])
    assert not grub_plan.matches_absent("amd_iommu=on", ["amd_iommu=off"])
    assert grub_plan.matches_absent("amd_iommu=on", ["amd_iommu"])
    assert not grub_plan.matches_absent("amd_iommu_intr=legacy", ["amd_iommu"])


# --- in-place edits keep foreign content --------------------------------------------------------------


def test_inplace_edit_touches_only_the_last_assignment_value(run_module, node):
    grub = node / "etc" / "default" / "grub"
    result, failed = run_module(grub_cmdline, module_args(node, SOFT, "inplace", update_command=[]))
    assert not failed and result["changed"]
    before = FOREIGN.splitlines(True)
    after = grub.read_text().splitlines(True)
    assert len(after) == len(before)
    changed = [index for index, (old, new) in enumerate(zip(before, after)) if old != new]
    assert changed == [10]  # the second GRUB_CMDLINE_LINUX_DEFAULT, the one that wins
    assert after[10] == ('GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT splash mitigations=auto '
                         'iommu=soft"  # second one wins\n')
    assert sh_value([grub], "GRUB_CMDLINE_LINUX_DEFAULT") == "quiet splash mitigations=auto iommu=soft"
    assert result["effective_args"] == ["quiet", "splash", "mitigations=auto", "iommu=soft"]


def test_inplace_removal_keeps_single_quotes_and_trailing_comment(run_module, node):
    grub = node / "etc" / "default" / "grub"
    grub.write_text(FOREIGN.replace("console=tty0 console", "console=tty0 amd_iommu=off console"))
    result, failed = run_module(grub_cmdline, module_args(node, SOFT, "inplace", update_command=[]))
    assert not failed
    assert result["removed"] == ["amd_iommu=off"]
    text = grub.read_text()
    assert "GRUB_CMDLINE_LINUX='console=tty0 console=ttyS0,115200n8'   # serial console, keep\n" in text
    assert text.replace('mitigations=auto iommu=soft"', 'mitigations=auto"') == FOREIGN


def test_inplace_appends_an_assignment_when_the_variable_is_missing(run_module, node):
    grub = node / "etc" / "default" / "grub"
    grub.write_text("GRUB_TIMEOUT=5")  # no final newline
    result, failed = run_module(grub_cmdline, module_args(node, OFF, "inplace", update_command=[]))
    assert not failed and result["changed"]
    assert grub.read_text() == 'GRUB_TIMEOUT=5\nGRUB_CMDLINE_LINUX="amd_iommu=off"\n'


def test_inplace_quotes_a_bare_word_value(run_module, node):
    grub = node / "etc" / "default" / "grub"
    grub.write_text("GRUB_CMDLINE_LINUX=quiet\nGRUB_CMDLINE_LINUX_DEFAULT=\n")
    run_module(grub_cmdline, module_args(node, OFF, "inplace", update_command=[]))
    assert grub.read_text() == 'GRUB_CMDLINE_LINUX="quiet amd_iommu=off"\nGRUB_CMDLINE_LINUX_DEFAULT=\n'
    assert sh_value([grub], "GRUB_CMDLINE_LINUX") == "quiet amd_iommu=off"


# --- the four steps, in both modes -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["dropin", "inplace"])
def test_four_steps(run_module, node, update_script, mode):
    grub = node / "etc" / "default" / "grub"
    dropin = node / "etc" / "default" / "grub.d" / "90-preflight-iommu.cfg"
    script, log = update_script
    args = module_args(node, SOFT, mode, update_command=[str(script), "-o", "/boot/grub/grub.cfg"])
    original = digest(grub)

    # 1. Check mode reports the change and touches nothing.
    result, failed = run_module(grub_cmdline, args, check_mode=True, diff=True)
    assert not failed
    assert result["changed"] is True
    assert result["mode"] == mode
    assert digest(grub) == original and not dropin.exists()
    assert calls(log) == []
    assert result["regenerated"] is False
    assert result["checks"]["iommu_grub"]["status"] == "warn"
    assert "GRUB_CMDLINE_LINUX_DEFAULT lacks iommu=soft" in result["checks"]["iommu_grub"]["found"]
    assert "update-grub" in result["checks"]["iommu_grub"]["fix"]
    assert "iommu=soft" in result["effective_args"]

    # 2. Apply: changed, the update command ran once.
    result, failed = run_module(grub_cmdline, args, diff=True)
    assert not failed and result["changed"] is True
    assert result["regenerated"] is True
    assert calls(log) == ["-o /boot/grub/grub.cfg"]
    assert result["checks"]["iommu_grub"]["status"] == "pass"
    if mode == "dropin":
        assert digest(grub) == original
        assert 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT iommu=soft"\n' in dropin.read_text()
        assert stat.S_IMODE(dropin.stat().st_mode) == 0o644
        sourced = [grub, dropin]
    else:
        assert not dropin.exists()
        sourced = [grub]
    assert sh_value(sourced, "GRUB_CMDLINE_LINUX_DEFAULT") == "quiet splash mitigations=auto iommu=soft"
    assert sh_value(sourced, "GRUB_CMDLINE_LINUX") == "console=tty0 console=ttyS0,115200n8"

    # 3. Re-apply: nothing to do, the update command does not run again.
    result, failed = run_module(grub_cmdline, args, diff=True)
    assert not failed and result["changed"] is False
    assert "diff" not in result
    assert calls(log) == ["-o /boot/grub/grub.cfg"]
    assert result["regenerated"] is False
    assert result["effective_args"] == ["quiet", "splash", "mitigations=auto", "iommu=soft"]

    # 4. The diff of a change shows before and after.
    result, _failed = run_module(grub_cmdline, dict(args, args=["iommu=soft", "pci=realloc"]), check_mode=True,
                                 diff=True)
    diff = result["diff"]
    assert "pci=realloc" not in diff["before"] and "pci=realloc" in diff["after"]
    assert diff["after_header"] == str(dropin if mode == "dropin" else grub)


@pytest.mark.parametrize("mode", ["dropin", "inplace"])
def test_switching_soft_to_off_moves_the_argument(run_module, node, mode):
    grub = node / "etc" / "default" / "grub"
    dropin = node / "etc" / "default" / "grub.d" / "90-preflight-iommu.cfg"
    run_module(grub_cmdline, module_args(node, SOFT, mode, update_command=[]))
    result, failed = run_module(grub_cmdline, module_args(node, OFF, mode, update_command=[]), diff=True)
    assert not failed and result["changed"]
    assert result["effective"]["GRUB_CMDLINE_LINUX"] == ["console=tty0", "console=ttyS0,115200n8", "amd_iommu=off"]
    assert result["effective"]["GRUB_CMDLINE_LINUX_DEFAULT"] == ["quiet", "splash", "mitigations=auto"]
    sourced = [grub, dropin] if mode == "dropin" else [grub]
    assert "iommu=soft" not in sh_value(sourced, "GRUB_CMDLINE_LINUX_DEFAULT").split()
    assert "amd_iommu=off" in sh_value(sourced, "GRUB_CMDLINE_LINUX").split()
    if mode == "dropin":
        assert grub.read_text() == FOREIGN
        assert "iommu=soft" not in dropin.read_text()
    else:
        expected = FOREIGN.replace("console=ttyS0,115200n8'", "console=ttyS0,115200n8 amd_iommu=off'")
        assert grub.read_text() == expected
    # And back again.
    result, _failed = run_module(grub_cmdline, module_args(node, SOFT, mode, update_command=[]))
    assert result["effective"]["GRUB_CMDLINE_LINUX"] == ["console=tty0", "console=ttyS0,115200n8"]
    assert "iommu=soft" in result["effective"]["GRUB_CMDLINE_LINUX_DEFAULT"]


def test_dropin_mode_removes_a_conflicting_argument_from_the_grub_file(run_module, node):
    grub = node / "etc" / "default" / "grub"
    grub.write_text(FOREIGN.replace('="quiet"', '="quiet amd_iommu=off"'))
    result, failed = run_module(grub_cmdline, module_args(node, SOFT, "dropin", update_command=[]), diff=True)
    assert not failed
    assert grub.read_text() == FOREIGN
    assert isinstance(result["diff"], list) and len(result["diff"]) == 2
    assert result["removed"] == ["amd_iommu=off"]


def test_auto_mode_picks_dropin_only_when_the_directory_exists(run_module, node):
    result, _failed = run_module(grub_cmdline, module_args(node, SOFT, "auto", update_command=[]), check_mode=True)
    assert result["mode"] == "dropin"
    (node / "etc" / "default" / "grub.d").rmdir()
    result, _failed = run_module(grub_cmdline, module_args(node, SOFT, "auto", update_command=[]), check_mode=True)
    assert result["mode"] == "inplace"


def test_dropin_is_removed_when_the_argument_is_already_set_elsewhere(run_module, node):
    dropin = node / "etc" / "default" / "grub.d" / "90-preflight-iommu.cfg"
    run_module(grub_cmdline, module_args(node, SOFT, "dropin", update_command=[]))
    assert dropin.exists()
    (node / "etc" / "default" / "grub.d" / "50-site.cfg").write_text(
        'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT iommu=soft"\n')
    result, _failed = run_module(grub_cmdline, module_args(node, SOFT, "dropin", update_command=[]))
    assert result["changed"] and not dropin.exists()
    assert result["effective_args"].count("iommu=soft") == 1


# --- regeneration, reboot, backup --------------------------------------------------------------------------


def test_reboot_required_follows_the_running_command_line(run_module, node):
    args = module_args(node, SOFT, "dropin", update_command=[])
    result, _failed = run_module(grub_cmdline, args)
    assert result["reboot_required"] is True
    assert result["checks"]["iommu_cmdline"]["status"] == "warn"
    assert "lacks iommu=soft" in result["checks"]["iommu_cmdline"]["found"]
    (node / "proc" / "cmdline").write_text("BOOT_IMAGE=/vmlinuz root=/dev/sda1 quiet splash iommu=soft\n")
    result, _failed = run_module(grub_cmdline, args)
    assert result["reboot_required"] is False
    assert result["checks"]["iommu_cmdline"]["status"] == "pass"
    (node / "proc" / "cmdline").write_text("root=/dev/sda1 iommu=soft amd_iommu=off\n")
    result, _failed = run_module(grub_cmdline, args)
    assert result["reboot_required"] is True
    assert "carries amd_iommu=off" in result["checks"]["iommu_cmdline"]["found"]
    assert result["checks"]["iommu_cmdline"]["fix"].startswith("reboot the node")


def test_update_command_failure_fails_the_task(run_module, node, tmp_path):
    script = tmp_path / "broken-update-grub"
    script.write_text("#!/bin/sh\necho 'grub-probe: error: cannot find a device' >&2\nexit 3\n")
    script.chmod(0o755)
    result, failed = run_module(grub_cmdline, module_args(node, SOFT, "dropin", update_command=[str(script)]))
    assert failed
    assert result["rc"] == 3 and "cannot find a device" in result["msg"]


def test_no_update_tool_is_reported_not_crashed(run_module, node):
    # root is not /, so nothing is auto-detected: the same path as a node without update-grub.
    result, failed = run_module(grub_cmdline, module_args(node, SOFT, "dropin"))
    assert not failed and result["changed"]
    assert result["regenerated"] is False and result["update_command"] is None
    check = result["checks"]["iommu_grub"]
    assert check["status"] == "warn" and "not regenerated" in check["found"]
    assert "update-grub" in check["fix"]


def test_update_command_auto_detection(monkeypatch, run_module):
    found = {"grub2-mkconfig": "/usr/sbin/grub2-mkconfig"}

    class FakeModule(object):
        def get_bin_path(self, name):
            return found.get(name)

    assert grub_cmdline.find_update_command(FakeModule(), "/") == [
        "/usr/sbin/grub2-mkconfig", "-o", "/boot/grub2/grub.cfg"]
    found["update-grub"] = "/usr/sbin/update-grub"
    assert grub_cmdline.find_update_command(FakeModule(), "/") == ["/usr/sbin/update-grub"]
    assert grub_cmdline.find_update_command(FakeModule(), "/srv/fake") is None
    found.clear()
    assert grub_cmdline.find_update_command(FakeModule(), "/") is None


def test_backup_is_made_only_when_asked_and_not_in_check_mode(run_module, node):
    directory = node / "etc" / "default"
    args = module_args(node, SOFT, "inplace", update_command=[], backup=True)
    run_module(grub_cmdline, args, check_mode=True)
    assert sorted(os.listdir(directory)) == ["grub", "grub.d"]
    result, _failed = run_module(grub_cmdline, args)
    assert len(result["backup_files"]) == 1
    backup = result["backup_files"][0]
    assert os.path.dirname(backup) == str(directory)
    with open(backup) as handle:
        assert handle.read() == FOREIGN


# --- what cannot be done is reported ----------------------------------------------------------------------------


def test_argument_from_another_variable_is_reported_not_edited(run_module, node):
    grub = node / "etc" / "default" / "grub"
    grub.write_text('SITE_ARGS="amd_iommu=off"\nGRUB_CMDLINE_LINUX="$SITE_ARGS"\n')
    result, failed = run_module(grub_cmdline, module_args(node, SOFT, "inplace", update_command=[],
                                                          drift_status="fail"), check_mode=True)
    assert not failed
    assert result["converged"] is False
    check = result["checks"]["iommu_grub"]
    assert check["status"] == "fail"
    assert "GRUB_CMDLINE_LINUX carries amd_iommu=off" in check["found"] and "line 2" in check["found"]


def test_broken_grub_file_is_a_failed_check_and_left_alone(run_module, node):
    grub = node / "etc" / "default" / "grub"
    grub.write_text('GRUB_CMDLINE_LINUX_DEFAULT="quiet\n')
    before = digest(grub)
    result, failed = run_module(grub_cmdline, module_args(node, SOFT, "inplace", update_command=[]))
    assert not failed and result["changed"] is False
    assert digest(grub) == before
    assert result["checks"]["iommu_grub"]["status"] == "fail"
    assert "line 1" in result["checks"]["iommu_grub"]["fix"]


def test_node_without_grub_is_reported(run_module, node):
    (node / "etc" / "default" / "grub").unlink()
    (node / "etc" / "default" / "grub.d").rmdir()
    result, failed = run_module(grub_cmdline, module_args(node, SOFT, "auto", update_command=[]))
    assert not failed and result["changed"] is False
    assert "grub does not appear" in result["checks"]["iommu_grub"]["found"]
    assert not (node / "etc" / "default" / "grub").exists()


@pytest.mark.parametrize("bad, message", [
    ({"args": ["iommu=soft quiet"]}, "not allowed"),
    ({"args": ['x="y"']}, "not allowed"),
    ({"args": ["iommu=soft"], "absent": ["iommu"]}, "absent names iommu=soft"),
    ({"dropin_name": "iommu.conf"}, "must be a file name ending in .cfg"),
    ({"mode": "sideways"}, "mode"),
])
def test_bad_arguments_fail(run_module, node, bad, message):
    args = module_args(node, SOFT, "inplace", update_command=[])
    args.update(bad)
    result, failed = run_module(grub_cmdline, args)
    assert failed
    assert message in result["msg"]
    assert (node / "etc" / "default" / "grub").read_text() == FOREIGN


# --- the iommu role's argument validation -------------------------------------------------------------------


def test_iommu_role_rejects_unknown_mode(tmp_path):
    playbook = tmp_path / "bogus.yml"
    playbook.write_text(
        "- hosts: localhost\n"
        "  connection: local\n"
        "  gather_facts: false\n"
        "  roles:\n"
        "    - role: iommu\n"
        "      iommu_mode: bogus\n")
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", str(playbook),
         "-e", "ansible_python_interpreter=%s" % sys.executable],
        capture_output=True, text=True, env=env, timeout=120, cwd=str(tmp_path))
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert "Validating arguments against arg spec" in output
    assert "value of iommu_mode must be one of: soft, off, got: bogus" in output


def test_iommu_role_in_check_and_apply_mode(tmp_path, update_script):
    """The role on a fake AMD node: check mode writes nothing and the audit reports drift; bring-up fixes it.

    The role only writes; the checks come from the audit's reader and decider
    (module_utils/preflight_node/capabilities/iommu.py) on the same node.
    """
    sysfs = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:c1:00.0"
    sysfs.mkdir(parents=True)
    for name, value in (("vendor", "0x1002"), ("device", "0x74a1"), ("class", "0x120000")):
        (sysfs / name).write_text(value + "\n")
    fake_root = tmp_path / "root"
    (fake_root / "etc" / "default" / "grub.d").mkdir(parents=True)
    (fake_root / "etc" / "default" / "grub").write_text(FOREIGN)
    (fake_root / "proc").mkdir()
    (fake_root / "proc" / "cmdline").write_text("root=/dev/sda1 quiet\n")
    script, log = update_script
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        "- hosts: localhost\n"
        "  connection: local\n"
        "  gather_facts: false\n"
        "  roles:\n"
        "    - role: iommu\n")
    extra = {
        "ansible_python_interpreter": sys.executable, "iommu_root": str(fake_root),
        "iommu_sysfs_root": str(tmp_path / "sys"), "iommu_grub_update_command": [str(script)],
        "iommu_drift_policy": "fail"}
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    command = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,",
               str(playbook), "-e", json.dumps(extra)]
    with open(os.path.join(ROOT, "roles", "iommu", "defaults", "main.yml")) as handle:
        settings = yaml.safe_load(handle)
    settings.update((name, value) for name, value in extra.items() if name.startswith("iommu_"))

    def audit():
        args = preflight_iommu.read_args(settings, {"name": "localhost"})
        facts = json.loads(json.dumps(node_iommu.read(args, FakeOps())))
        return preflight_iommu.decide("localhost", facts, settings)

    proc = subprocess.run(command + ["--check"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = audit()
    assert checks["grub"]["status"] == "fail"
    assert checks["cmdline"]["status"] == "warn"
    assert (fake_root / "etc" / "default" / "grub").read_text() == FOREIGN
    assert not (fake_root / "etc" / "default" / "grub.d" / "90-preflight-iommu.cfg").exists()
    assert calls(log) == []

    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = audit()
    assert checks["grub"]["status"] == "pass"
    assert checks["cmdline"]["fix"].startswith("reboot the node")
    assert (fake_root / "etc" / "default" / "grub.d" / "90-preflight-iommu.cfg").exists()
    assert len(calls(log)) == 1

    (sysfs / "vendor").write_text("0x10de\n")
    proc = subprocess.run(command + ["--check"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = audit()
    assert checks["grub"]["status"] == "not_applicable"
    assert "no AMD GPU (vendor 0x1002" in checks["grub"]["found"]


def test_a_later_dropin_that_overrides_the_variable(run_module, node):
    # Ubuntu cloud images set GRUB_CMDLINE_LINUX_DEFAULT again in grub.d/50-cloudimg-settings.cfg.
    cloud = node / "etc" / "default" / "grub.d" / "50-cloudimg-settings.cfg"
    cloud.write_text('GRUB_TIMEOUT=0\nGRUB_CMDLINE_LINUX_DEFAULT="console=tty1 console=ttyS0"\n')
    result, _failed = run_module(grub_cmdline, module_args(node, SOFT, "inplace", update_command=[]),
                                 check_mode=True)
    assert result["converged"] is False  # an edit of /etc/default/grub would be overridden
    assert "GRUB_CMDLINE_LINUX_DEFAULT lacks iommu=soft" in result["checks"]["iommu_grub"]["found"]
    result, _failed = run_module(grub_cmdline, module_args(node, SOFT, "dropin", update_command=[]))
    assert result["converged"] is True
    dropin = node / "etc" / "default" / "grub.d" / "90-preflight-iommu.cfg"
    assert sh_value([node / "etc" / "default" / "grub", cloud, dropin], "GRUB_CMDLINE_LINUX_DEFAULT") == \
        "console=tty1 console=ttyS0 iommu=soft"
    assert result["effective_args"] == ["console=tty1", "console=ttyS0", "iommu=soft"]


def test_dropin_mode_creates_the_directory(run_module, node):
    (node / "etc" / "default" / "grub.d").rmdir()
    result, failed = run_module(grub_cmdline, module_args(node, OFF, "dropin", update_command=[]))
    assert not failed and result["changed"]
    dropin = node / "etc" / "default" / "grub.d" / "90-preflight-iommu.cfg"
    assert dropin.read_text().endswith('GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX amd_iommu=off"\n')


# --- symlinks and a read-only /etc ---------------------------------------------------------------------


def tree(root):
    """Every file and symlink under root: symlinks by target, files by content."""
    found = {}
    for directory, _dirs, files in os.walk(str(root)):
        for name in files:
            full = os.path.join(directory, name)
            found[full] = "link:" + os.readlink(full) if os.path.islink(full) else digest(Path(full))
    return found


@pytest.mark.parametrize("check_mode", [True, False])
def test_a_symlinked_grub_defaults_file_is_refused_in_place(run_module, node, update_script, check_mode):
    """A grub defaults file shared over a link: editing it in place would replace the link (or,
    followed, change every node sharing the target); refused before anything is written."""
    shared = node / "srv" / "grub-defaults"
    shared.parent.mkdir()
    grub = node / "etc" / "default" / "grub"
    grub.rename(shared)
    os.symlink(str(shared), str(grub))
    script, log = update_script
    before = tree(node)
    result, failed = run_module(grub_cmdline, module_args(node, SOFT, "inplace", update_command=[str(script)]),
                                check_mode=check_mode)
    assert failed and result["changed"] is False
    assert tree(node) == before and calls(log) == []
    assert result["link"] == str(grub) and result["link_target"] == str(shared)
    assert "is a symlink to %s" % shared in result["found"] and "readlink -f" in result["fix"]


def test_a_symlinked_dropin_is_refused(run_module, node):
    elsewhere = node / "srv" / "iommu.cfg"
    elsewhere.parent.mkdir()
    elsewhere.write_text("# someone else's\n")
    dropin = node / "etc" / "default" / "grub.d" / "90-preflight-iommu.cfg"
    os.symlink(str(elsewhere), str(dropin))
    before = tree(node)
    result, failed = run_module(grub_cmdline, module_args(node, SOFT, "dropin", update_command=[]))
    assert failed and tree(node) == before
    assert result["link"] == str(dropin) and "Found:" in result["msg"]


def test_a_read_only_etc_is_a_clean_failure_that_says_what_was_already_written(run_module, node, update_script,
                                                                                  monkeypatch):
    from ansible.module_utils import basic
    real_move = basic.AnsibleModule.atomic_move

    def read_only_dropin_dir(self, src, dest, unsafe_writes=False):
        if os.path.basename(dest).endswith(".cfg"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real_move(self, src, dest, unsafe_writes=unsafe_writes)

    monkeypatch.setattr(basic.AnsibleModule, "atomic_move", read_only_dropin_dir)
    grub = node / "etc" / "default" / "grub"
    grub.write_text(FOREIGN.replace('="quiet"', '="quiet amd_iommu=off"'))
    dropin = node / "etc" / "default" / "grub.d" / "90-preflight-iommu.cfg"
    script, log = update_script
    result, failed = run_module(grub_cmdline, module_args(node, SOFT, "dropin", update_command=[str(script)]))
    assert failed
    assert result["found"].startswith("cannot write %s on " % dropin) and "Read-only" in result["found"]
    assert "read-only" in result["fix"] and result["path"] == str(dropin)
    assert result["written"] == [str(grub)] and result["changed"] is True, "the grub file was already edited"
    assert not dropin.exists() and calls(log) == []
    assert grub.read_text() == FOREIGN
    assert sorted(os.listdir(str(dropin.parent))) == [], "no temp file left"
