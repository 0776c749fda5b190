"""core_probe: a real SIGSEGV child on this machine, and the paths that need no root."""

import os
import pwd
import resource

import pytest

import core_probe
from preflight_node import core_dumps as preflight_core_dumps

CORE_PATTERN = "/proc/sys/kernel/core_pattern"
CORE_USES_PID = "/proc/sys/kernel/core_uses_pid"
APPORT = "|/usr/share/apport/apport -p%p -s%s -c%c -d%d -P%P -u%u -g%g -- %E"
COREDUMP = "|/lib/systemd/systemd-coredump %P %u %g %s %t 9223372036854775808 %h"

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(CORE_PATTERN, os.W_OK),
    reason="needs root and a writable kernel.core_pattern")


def _read(path):
    with open(path) as handle:
        return handle.read().rstrip("\n")


def _write(path, value):
    with open(path, "w") as handle:
        handle.write(value)


@pytest.fixture
def kernel_core(tmp_path):
    """Set the real kernel.core_pattern / core_uses_pid; always restore them."""
    saved = {CORE_PATTERN: _read(CORE_PATTERN), CORE_USES_PID: _read(CORE_USES_PID)}

    def setter(pattern, uses_pid=None):
        _write(CORE_PATTERN, pattern)
        if uses_pid is not None:
            _write(CORE_USES_PID, "1" if uses_pid else "0")
        assert _read(CORE_PATTERN) == pattern

    try:
        yield setter
    finally:
        for path, value in saved.items():
            _write(path, value)
        assert _read(CORE_PATTERN) == saved[CORE_PATTERN]


@needs_root
def test_real_probe_finds_and_removes_the_core(run_module, kernel_core, tmp_path):
    cores = tmp_path / "cores"
    cores.mkdir()
    os.chmod(str(cores), 0o1777)
    kernel_core(str(cores) + "/core-%e.%p.%h.%t")
    # Check mode on purpose: the probe runs there too.
    result, failed = run_module(core_probe, {"timeout": 10}, check_mode=True)
    assert not failed
    check = result["checks"]["core_probe"]
    assert check["status"] == "pass", check
    assert result["wcoredump"] is True
    assert result["changed"] is False
    name = os.path.basename(result["core_file"])
    assert name.startswith("core-sleep.%d.%s." % (result["child_pid"], os.uname().nodename))
    assert result["core_removed"] is True
    assert os.listdir(str(cores)) == []


@needs_root
def test_real_probe_relative_pattern_with_core_uses_pid(run_module, kernel_core):
    kernel_core("core-%e", uses_pid=True)
    result, failed = run_module(core_probe, {})
    assert not failed
    assert result["checks"]["core_probe"]["status"] == "pass", result["checks"]
    assert os.path.basename(result["core_file"]) == "core-sleep.%d" % result["child_pid"]
    assert not os.path.exists(os.path.dirname(result["core_file"]))  # the temp cwd is gone too


@needs_root
def test_real_probe_directory_not_writable_by_the_job_user_fails_with_fix(run_module, kernel_core, tmp_path):
    nobody = pwd.getpwnam("nobody")
    cores = tmp_path / "cores"
    cores.mkdir()
    os.chmod(str(cores), 0o755)
    os.chmod(str(tmp_path), 0o755)
    kernel_core(str(cores) + "/core-%e.%p.%h.%t")
    result, failed = run_module(core_probe, {"run_as": "nobody", "timeout": 10})
    assert not failed
    check = result["checks"]["core_probe"]
    assert check["status"] == "fail"
    assert result["wcoredump"] is False
    assert "not writable by nobody" in check["found"]
    assert check["fix"].startswith("chmod 1777 %s" % cores)
    assert os.listdir(str(cores)) == []
    assert nobody.pw_uid != 0


@needs_root
def test_real_probe_missing_directory_fails_with_mkdir_fix(run_module, kernel_core, tmp_path):
    kernel_core(str(tmp_path / "missing") + "/core-%e.%p")
    result, _failed = run_module(core_probe, {})
    check = result["checks"]["core_probe"]
    assert check["status"] == "fail"
    assert "does not exist" in check["found"]
    assert check["fix"].startswith("mkdir -p %s" % (tmp_path / "missing"))


@pytest.mark.parametrize("pattern, where", [(APPORT, "/var/crash"), (COREDUMP, "coredumpctl list")])
def test_pipe_pattern_is_not_applicable_with_where_cores_go(run_module, pattern, where):
    result, failed = run_module(core_probe, {"core_pattern": pattern})
    assert not failed
    check = result["checks"]["core_probe"]
    assert check["status"] == "not_applicable"
    assert where in check["found"]
    assert "sysctl -w kernel.core_pattern=" in check["found"]
    assert result["wcoredump"] is None  # nothing was crashed
    assert "child_pid" not in result


def test_pattern_read_from_proc_root(run_module, tmp_path):
    (tmp_path / "sys" / "kernel").mkdir(parents=True)
    (tmp_path / "sys" / "kernel" / "core_pattern").write_text(APPORT + "\n")
    result, _failed = run_module(core_probe, {"proc_root": str(tmp_path)})
    assert result["core_pattern"] == APPORT
    assert result["destination"]["handler"] == "apport"


def test_hard_limit_zero_fails_before_crashing_anything(run_module, monkeypatch):
    # The probe itself lives in module_utils/preflight_node/core_dumps.py (shared with the capability).
    monkeypatch.setattr(preflight_core_dumps.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(preflight_core_dumps.resource, "getrlimit", lambda _which: (0, 0))
    result, failed = run_module(core_probe, {"core_pattern": "/tmp/core-%e.%p"})
    assert not failed
    check = result["checks"]["core_probe"]
    assert check["status"] == "fail"
    assert "hard core limit" in check["found"] and "limits.d" in check["fix"]
    assert "child_pid" not in result
    assert result["session_rlimit_core"] == {"soft": "0", "hard": "0"}


def test_session_limits_are_reported(run_module):
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    result, _failed = run_module(core_probe, {"core_pattern": APPORT})
    expected = {"soft": "unlimited" if soft == resource.RLIM_INFINITY else str(soft),
                "hard": "unlimited" if hard == resource.RLIM_INFINITY else str(hard)}
    assert result["session_rlimit_core"] == expected


def test_bad_timeout_and_unknown_user_are_argument_errors(run_module):
    result, failed = run_module(core_probe, {"core_pattern": "/tmp/core-%p", "timeout": 0})
    assert failed and "timeout" in result["msg"]
    result, failed = run_module(core_probe, {"core_pattern": "/tmp/core-%p", "run_as": "no-such-user-x"})
    assert failed and "no-such-user-x" in result["msg"]
