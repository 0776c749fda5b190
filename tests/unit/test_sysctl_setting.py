"""sysctl_setting against a sandbox root with a fake /proc/sys and sysctl.d tree."""

import errno
import os

import pytest

import sysctl_setting
from preflight_node.sysctl import values as ps
from capability_helpers import link_hashes as tree_hashes, read_text as read, write

SYSCTL_CONF = (
    "# /etc/sysctl.conf - Configuration file for setting system variables\n"
    "#kernel.domainname = example.com\n"
    "\n"
    "; old-style comment\n"
    "net.ipv4.ip_forward=1   \n"
    "vm.swappiness = 10\n"
)
PTRACE_DROPIN = "/etc/sysctl.d/60-preflight-ptrace.conf"
CORE_DROPIN = "/etc/sysctl.d/60-preflight-core.conf"
APPORT = "|/usr/share/apport/apport -p%p -s%s -c%c -d%d -P%P -u%u -g%g -- %E"
COREDUMP = "|/lib/systemd/systemd-coredump %P %u %g %s %t 9223372036854775808 %h"


@pytest.fixture
def sandbox(tmp_path):
    """A node's /proc/sys and sysctl tree: Yama ptrace_scope 1, core_pattern core."""
    write(tmp_path, "/proc/sys/kernel/yama/ptrace_scope", "1\n")
    write(tmp_path, "/proc/sys/kernel/core_pattern", "core\n")
    write(tmp_path, "/proc/sys/kernel/core_uses_pid", "0\n")
    write(tmp_path, "/etc/sysctl.conf", SYSCTL_CONF)
    os.makedirs(str(tmp_path / "etc/sysctl.d"))
    os.symlink("../sysctl.conf", str(tmp_path / "etc/sysctl.d/99-sysctl.conf"))
    write(tmp_path, "/usr/lib/sysctl.d/50-pid-max.conf", "kernel.pid_max = 4194304\n")
    return tmp_path


def ptrace_args(root, **extra):
    args = {"name": "kernel.yama.ptrace_scope", "value": "0", "root": str(root)}
    args.update(extra)
    return args


def core_args(root, value="/tmp/core-%e.%p.%h.%t", **extra):
    args = {"name": "kernel.core_pattern", "value": value, "dropin": CORE_DROPIN, "root": str(root)}
    args.update(extra)
    return args


def test_ptrace_four_steps_check_apply_reapply_diff(run_module, sandbox):
    before = tree_hashes(sandbox)

    result, failed = run_module(sysctl_setting, ptrace_args(sandbox), check_mode=True, diff=True)
    assert not failed
    assert result["changed"] is True
    assert tree_hashes(sandbox) == before, "check mode must write nothing"
    assert result["checks"]["ptrace_scope"]["status"] == "fail"
    assert result["checks"]["ptrace_scope"]["found"] == "running 1"
    assert result["checks"]["ptrace_scope_persisted"]["status"] == "fail"
    assert "does not exist" in result["checks"]["ptrace_scope_persisted"]["found"]
    assert result["checks"]["ptrace_scope_boot"]["status"] == "fail"
    dropin_diff, runtime_diff = result["diff"]
    assert dropin_diff["before"] == "" and "kernel.yama.ptrace_scope = 0\n" in dropin_diff["after"]
    assert runtime_diff["before"] == "1\n" and runtime_diff["after"] == "0\n"

    result, failed = run_module(sysctl_setting, ptrace_args(sandbox))
    assert not failed and result["changed"] is True
    assert read(sandbox, "/proc/sys/kernel/yama/ptrace_scope") == "0"
    text = read(sandbox, PTRACE_DROPIN)
    assert text.startswith("# Managed by the cluster preflight")
    assert [line for line in text.splitlines() if not line.startswith("#")] == ["kernel.yama.ptrace_scope = 0"]
    assert {name: check["status"] for name, check in result["checks"].items()} == {
        "ptrace_scope": "pass", "ptrace_scope_persisted": "pass", "ptrace_scope_boot": "pass"}
    assert result["effective_at_boot"] == {"value": "0", "file": PTRACE_DROPIN, "line": 3}

    after_apply = tree_hashes(sandbox)
    result, failed = run_module(sysctl_setting, ptrace_args(sandbox), diff=True)
    assert not failed and result["changed"] is False
    assert tree_hashes(sandbox) == after_apply
    assert result["diff"][0]["before"] == result["diff"][0]["after"]
    assert result["runtime"] == "0" and result["persisted"] == "0"


def test_foreign_sysctl_conf_and_other_files_survive_byte_for_byte(run_module, sandbox):
    conf = os.path.join(str(sandbox), "etc/sysctl.conf")
    with open(conf, "rb") as handle:
        original = handle.read()
    for args in (ptrace_args(sandbox), core_args(sandbox)):
        _result, failed = run_module(sysctl_setting, args)
        assert not failed
    with open(conf, "rb") as handle:
        assert handle.read() == original
    assert os.readlink(os.path.join(str(sandbox), "etc/sysctl.d/99-sysctl.conf")) == "../sysctl.conf"
    assert read(sandbox, "/usr/lib/sysctl.d/50-pid-max.conf") == "kernel.pid_max = 4194304\n"


def test_no_yama_is_not_applicable_with_reason_and_writes_nothing(run_module, sandbox):
    os.remove(str(sandbox / "proc/sys/kernel/yama/ptrace_scope"))
    os.rmdir(str(sandbox / "proc/sys/kernel/yama"))
    before = tree_hashes(sandbox)
    for check_mode in (True, False):
        result, failed = run_module(sysctl_setting, ptrace_args(sandbox), check_mode=check_mode)
        assert not failed
        assert result["changed"] is False
        assert result["not_applicable"] is True
        assert result["reason"] == (
            "kernel has no Yama LSM: /proc/sys/kernel/yama/ptrace_scope does not exist")
        assert result["checks"] == {"ptrace_scope": {
            "status": "not_applicable", "found": result["reason"],
            "expected": "kernel.yama.ptrace_scope = 0", "fix": ""}}
    assert tree_hashes(sandbox) == before


def test_backup_keeps_the_previous_dropin(run_module, sandbox):
    write(sandbox, PTRACE_DROPIN, "# distribution default\nkernel.yama.ptrace_scope = 1\n")
    result, failed = run_module(sysctl_setting, ptrace_args(sandbox, backup=True))
    assert not failed and result["changed"]
    assert os.path.isfile(result["backup_file"])
    with open(result["backup_file"]) as handle:
        assert handle.read() == "# distribution default\nkernel.yama.ptrace_scope = 1\n"
    assert "ptrace_scope = 0" in read(sandbox, PTRACE_DROPIN)


def test_no_backup_unless_asked(run_module, sandbox):
    write(sandbox, PTRACE_DROPIN, "kernel.yama.ptrace_scope = 1\n")
    result, failed = run_module(sysctl_setting, ptrace_args(sandbox))
    assert not failed and "backup_file" not in result
    assert [name for name in os.listdir(str(sandbox / "etc/sysctl.d")) if name.startswith("60-preflight-ptrace")] == [
        "60-preflight-ptrace.conf"]


def test_conflict_in_a_later_file_is_reported_with_file_and_fix(run_module, sandbox):
    write(sandbox, "/etc/sysctl.d/99-x.conf", "# vendor\nkernel.core_pattern = %s\n" % APPORT)
    result, failed = run_module(sysctl_setting, core_args(sandbox))
    assert not failed
    assert result["changed"] is True
    boot = result["checks"]["core_pattern_boot"]
    assert boot["status"] == "fail"
    assert "kernel.core_pattern=%s in /etc/sysctl.d/99-x.conf:2 overrides 60-preflight-core.conf at boot" % APPORT \
        in boot["found"]
    assert "/etc/sysctl.d/99-x.conf:2" in boot["fix"]
    assert [(c["file"], c["line"]) for c in result["conflicts"]] == [("/etc/sysctl.d/99-x.conf", 2)]
    assert result["effective_at_boot"]["file"] == "/etc/sysctl.d/99-x.conf"
    # The running value was applied; only the boot order is wrong.
    assert result["checks"]["core_pattern"]["status"] == "pass"
    assert read(sandbox, "/etc/sysctl.d/99-x.conf").endswith(APPORT + "\n")


def test_conflict_policy_warn(run_module, sandbox):
    write(sandbox, "/etc/sysctl.d/99-x.conf", "kernel.core_pattern = %s\n" % APPORT)
    result, _failed = run_module(sysctl_setting, core_args(sandbox, policy="warn"))
    assert result["checks"]["core_pattern_boot"]["status"] == "warn"
    assert result["checks"]["core_pattern_boot"]["fix"]


def test_sysctl_conf_is_applied_last_and_counted_once(run_module, sandbox):
    with open(str(sandbox / "etc/sysctl.conf"), "a") as handle:
        handle.write("kernel.core_pattern = core\n")
    result, _failed = run_module(sysctl_setting, core_args(sandbox))
    assert [(c["file"], c["line"]) for c in result["conflicts"]] == [("/etc/sysctl.conf", 7)]
    assert result["checks"]["core_pattern_boot"]["status"] == "fail"


def test_earlier_file_with_other_value_is_overridden_not_a_conflict(run_module, sandbox):
    write(sandbox, "/usr/lib/sysctl.d/50-coredump.conf", "kernel.core_pattern=%s\n" % COREDUMP)
    write(sandbox, "/etc/sysctl.d/10-glob.conf", "kernel.*_pattern = core\n")
    result, _failed = run_module(sysctl_setting, core_args(sandbox))
    assert result["conflicts"] == []
    assert result["checks"]["core_pattern_boot"]["status"] == "pass"
    assert result["effective_at_boot"]["file"] == CORE_DROPIN


def test_glob_key_in_a_later_file_conflicts(run_module, sandbox):
    write(sandbox, "/etc/sysctl.d/90-glob.conf", "-kernel.core_* = core\n")
    result, _failed = run_module(sysctl_setting, core_args(sandbox))
    assert [c["file"] for c in result["conflicts"]] == ["/etc/sysctl.d/90-glob.conf"]


def test_dropin_shadowed_by_same_name_in_etc(run_module, sandbox):
    write(sandbox, "/etc/sysctl.d/60-preflight-core.conf", "kernel.core_pattern = core\n")
    result, _failed = run_module(
        sysctl_setting, core_args(sandbox, dropin="/usr/lib/sysctl.d/60-preflight-core.conf"))
    assert result["checks"]["core_pattern_boot"]["status"] == "fail"
    assert "is never read" in result["checks"]["core_pattern_boot"]["found"]


def test_masked_file_does_not_count(run_module, sandbox):
    write(sandbox, "/usr/lib/sysctl.d/99-vendor.conf", "kernel.core_pattern = core\n")
    os.symlink("/dev/null", str(sandbox / "etc/sysctl.d/99-vendor.conf"))
    result, _failed = run_module(sysctl_setting, core_args(sandbox))
    assert result["conflicts"] == []


def test_pipe_pattern_as_desired_value_is_rejected_with_reason(run_module, sandbox):
    before = tree_hashes(sandbox)
    result, failed = run_module(sysctl_setting, core_args(sandbox, value=APPORT))
    assert failed
    assert "pipes cores to /usr/share/apport/apport" in result["msg"]
    assert "/var/crash" in result["msg"]
    assert tree_hashes(sandbox) == before


def test_pattern_without_pid_warns_unless_core_uses_pid(run_module, sandbox):
    result, failed = run_module(sysctl_setting, core_args(sandbox, value="/tmp/core-%e"), check_mode=True)
    assert not failed
    pid = result["checks"]["core_pattern_pid"]
    assert pid["status"] == "warn"
    assert "overwrite each other" in pid["found"] and "%p" in pid["fix"]

    write(sandbox, "/proc/sys/kernel/core_uses_pid", "1\n")
    result, _failed = run_module(sysctl_setting, core_args(sandbox, value="/tmp/core-%e"), check_mode=True)
    assert result["checks"]["core_pattern_pid"]["status"] == "pass"

    result, _failed = run_module(sysctl_setting, core_args(sandbox), check_mode=True)
    assert result["checks"]["core_pattern_pid"]["status"] == "pass"


@pytest.mark.parametrize("current, where", [
    (APPORT, "/var/crash"),
    (COREDUMP, "coredumpctl list"),
])
def test_running_pipe_pattern_is_reported_with_where_cores_go(run_module, sandbox, current, where):
    write(sandbox, "/proc/sys/kernel/core_pattern", current + "\n")
    result, failed = run_module(sysctl_setting, core_args(sandbox, state="audit", policy="warn"))
    assert not failed and result["changed"] is False
    runtime = result["checks"]["core_pattern"]
    assert runtime["status"] == "warn"
    assert where in runtime["found"]
    assert "kernel.core_pattern" in runtime["fix"]
    assert read(sandbox, "/proc/sys/kernel/core_pattern") == current + "\n"


def test_audit_reports_drift_and_writes_nothing(run_module, sandbox):
    before = tree_hashes(sandbox)
    result, failed = run_module(sysctl_setting, ptrace_args(sandbox, state="audit"), diff=True)
    assert not failed
    assert result["changed"] is False
    assert "diff" not in result
    assert result["checks"]["ptrace_scope"]["status"] == "fail"
    assert tree_hashes(sandbox) == before


def test_reload_false_writes_only_the_dropin(run_module, sandbox):
    result, failed = run_module(sysctl_setting, ptrace_args(sandbox, reload=False))
    assert not failed and result["changed"]
    assert read(sandbox, "/proc/sys/kernel/yama/ptrace_scope") == "1\n"
    assert result["checks"]["ptrace_scope"]["status"] == "warn"
    assert "sysctl -p /etc/sysctl.d/60-preflight-ptrace.conf" == result["checks"]["ptrace_scope"]["fix"]
    assert result["checks"]["ptrace_scope_persisted"]["status"] == "pass"


def test_multi_field_values_compare_word_by_word(run_module, sandbox):
    write(sandbox, "/proc/sys/net/ipv4/tcp_rmem", "4096\t131072\t6291456\n")
    result, _failed = run_module(sysctl_setting, {
        "name": "net/ipv4/tcp_rmem", "value": "4096 131072  6291456", "root": str(sandbox),
        "dropin": "/etc/sysctl.d/60-tcp.conf"}, check_mode=True)
    assert result["checks"]["tcp_rmem"]["status"] == "pass"
    assert result["changed"] is True  # only the drop-in is missing


@pytest.mark.parametrize("dropin", ["/etc/sysctl.conf", "/etc/ptrace.conf", "/etc/sysctl.d/10-ptrace"])
def test_dropin_outside_the_search_list_is_rejected(run_module, sandbox, dropin):
    result, failed = run_module(sysctl_setting, ptrace_args(sandbox, dropin=dropin))
    assert failed
    assert "would never be read at boot" in result["msg"]


def test_kernel_refusing_the_value_fails_with_fix(run_module, sandbox, monkeypatch):
    real_open = os.open

    def refuse(path, flags, *args):
        if path.endswith("proc/sys/kernel/yama/ptrace_scope") and flags & os.O_WRONLY:
            raise PermissionError(1, "Operation not permitted")
        return real_open(path, flags, *args)

    write(sandbox, "/proc/sys/kernel/yama/ptrace_scope", "3\n")
    monkeypatch.setattr(sysctl_setting.os, "open", refuse)
    result, failed = run_module(sysctl_setting, ptrace_args(sandbox))
    assert failed
    assert "can only be lowered by a reboot" in result["msg"]
    assert result["changed"] is True  # the drop-in was written for the next boot
    assert "ptrace_scope = 0" in read(sandbox, PTRACE_DROPIN)


def test_boot_order_helper_follows_systemd_rules(sandbox):
    write(sandbox, "/run/sysctl.d/50-pid-max.conf", "kernel.pid_max = 32768\n")
    files, shadowed = ps.boot_files(str(sandbox), ps.DEFAULT_SYSCTL_DIRS)
    paths = [entry["path"] for entry in files]
    assert paths == ["/run/sysctl.d/50-pid-max.conf", "/etc/sysctl.d/99-sysctl.conf", "/etc/sysctl.conf"]
    assert shadowed[0]["path"] == "/usr/lib/sysctl.d/50-pid-max.conf"
    assert ps.normalize_key("kernel/yama/ptrace_scope") == "kernel.yama.ptrace_scope"
    assert ps.normalize_key("net/ipv4/conf/eth0.100/rp_filter") == "net.ipv4.conf.eth0/100.rp_filter"


# -- symlinks and a read-only /etc ---------------------------------------------------------------------


@pytest.mark.parametrize("check_mode", [True, False])
def test_a_symlinked_dropin_is_refused_and_nothing_is_written(run_module, sandbox, check_mode):
    """Debian's 99-sysctl.conf -> ../sysctl.conf: writing the drop-in there would replace the link, or
    followed, replace /etc/sysctl.conf whole; neither happens, in check mode or not."""
    before = tree_hashes(sandbox)
    result, failed = run_module(sysctl_setting, ptrace_args(sandbox, dropin="/etc/sysctl.d/99-sysctl.conf"),
                                check_mode=check_mode)
    assert failed and result["changed"] is False
    assert tree_hashes(sandbox) == before, "the link, /etc/sysctl.conf and /proc/sys are untouched"
    assert result["link"] == "/etc/sysctl.d/99-sysctl.conf" and result["link_target"] == "../sysctl.conf"
    assert "is a symlink to ../sysctl.conf (/etc/sysctl.conf)" in result["found"]
    assert "a file of its own in /etc/sysctl.d" in result["fix"] and "Fix:" in result["msg"]


def test_an_audit_of_a_symlinked_dropin_is_not_refused(run_module, sandbox):
    """Nothing is to be written, so nothing is refused: what is there can still be audited."""
    result, failed = run_module(sysctl_setting, ptrace_args(sandbox, dropin="/etc/sysctl.d/99-sysctl.conf",
                                                            state="audit"))
    assert not failed and result["changed"] is False


@pytest.mark.parametrize("raised", ["oserror", "wrapped"])
def test_a_read_only_etc_is_a_clean_failure_and_the_running_value_is_left(run_module, sandbox, monkeypatch,
                                                                           raised):
    from ansible.module_utils import basic

    def read_only(self, src, dest, unsafe_writes=False):
        if raised == "oserror":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        try:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        except OSError as exc:  # what Ansible's atomic_move raises for an error it does not work around
            raise Exception("Could not replace %r with %r." % (dest, src)) from exc

    monkeypatch.setattr(basic.AnsibleModule, "atomic_move", read_only)
    before = tree_hashes(sandbox)
    result, failed = run_module(sysctl_setting, ptrace_args(sandbox))
    assert failed
    assert result["found"].startswith("cannot write %s on " % PTRACE_DROPIN)
    assert "Read-only file system" in result["found"] and "read-only" in result["fix"]
    assert result["expected"] == "/etc/sysctl.d writable by the bring-up" and result["path"] == PTRACE_DROPIN
    assert tree_hashes(sandbox) == before, "no temp file left, the running value not set"
    result, failed = run_module(sysctl_setting, ptrace_args(sandbox), check_mode=True)
    assert not failed and result["changed"] is True, "check mode writes nothing, so it cannot fail this way"
