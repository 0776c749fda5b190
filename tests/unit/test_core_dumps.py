"""The core_dumps capability: validate, read (sandbox roots, FakeOps), decide (tables), the crash probe
(real where root and a writable kernel.core_pattern allow it), and the writers (sysctl_setting,
limits_dropin) agreeing with the audit because they share preflight_sysctl and preflight_limits."""

import functools
import json
import os
import pwd
import shutil
import tempfile

import pytest

import limits_dropin
import sysctl_setting
from preflight_node import checks as preflight_checks
from cluster_preflight.capabilities import core_dumps as controller
from preflight_node.capabilities import core_dumps
from preflight_node.capabilities import core_dumps_probe
from fake_ops import FakeOps, LocalOps
from capability_helpers import (assert_one_problem, capability_under_test, role_settings, role_yaml, sandbox_reader,
                                statuses, sysctl_tree, write, write_files)

ROLE_NAME = "core_dumps"
ROLE, HOST, NODE = capability_under_test(ROLE_NAME, "node5", "198.18.0.5")
APPORT = "|/usr/share/apport/apport -p%p -s%s -c%c -d%d -P%P -u%u -g%g -- %E"
COREDUMP = "|/lib/systemd/systemd-coredump %P %u %g %s %t 9223372036854775808 %h"
PATTERN = "/var/cores/core-%e.%p.%h.%t"
SYSCTL_DROPIN = "/etc/sysctl.d/60-preflight-core.conf"
LIMITS_DROPIN = "/etc/security/limits.d/90-preflight-core.conf"
LIMITS_OK = "*  soft  core  unlimited\n*  hard  core  unlimited\nroot soft core unlimited\nroot hard core unlimited\n"
CORE_PATTERN = "/proc/sys/kernel/core_pattern"
CORE_USES_PID = "/proc/sys/kernel/core_uses_pid"
SLEEP = shutil.which("sleep")

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(CORE_PATTERN, os.W_OK),
    reason="needs root and a writable kernel.core_pattern")


load_yaml = functools.partial(role_yaml, ROLE_NAME)


def settings(**overrides):
    """The role's defaults, typed and rendered (core_dumps_dir is the pattern's dirname), with ``overrides``:
    what preflight_settings hands a capability."""
    values = role_settings(ROLE_NAME, **overrides)
    if "core_dumps_dir" not in overrides:
        assert values["core_dumps_dir"] == "{{ core_dumps_pattern | dirname }}"
        values["core_dumps_dir"] = os.path.dirname(values["core_dumps_pattern"])
    return values


def make_node(tmp_path, running="core", uses_pid="0", sysctl_dropin=None, core_dir=None, limits=None,
              limits_d=True, pam=True, files=None):
    """A sandbox root: /proc/sys, the sysctl tree, /etc/security and /etc/pam.d; ``core_dir`` a mode
    for /var/cores (None: missing)."""
    root = tmp_path / "node"
    write(root, "/proc/sys/kernel/core_pattern", running + "\n")
    write(root, "/proc/sys/kernel/core_uses_pid", uses_pid + "\n")
    sysctl_tree(root)
    if sysctl_dropin is not None:
        write(root, SYSCTL_DROPIN, sysctl_dropin)
    write(root, "/etc/security/limits.conf", "# site limits\n*  soft  nofile  65536\n")
    if limits_d:
        os.makedirs(str(root / "etc/security/limits.d"), exist_ok=True)
    if limits is not None:
        write(root, LIMITS_DROPIN, limits)
    if pam:
        write(root, "/etc/pam.d/sshd", "session required pam_limits.so\n")
    if core_dir is not None:
        os.makedirs(str(root / "var/cores"))
        os.chmod(str(root / "var/cores"), core_dir)
    write_files(root, files)
    return root


def node_settings(root, **overrides):
    return settings(**dict(dict(core_dumps_pattern=PATTERN, core_dumps_root=str(root)), **overrides))


# read_node(root, **overrides): (facts, settings) as the node reads them; assert_contract(checks, host=HOST): names
# inside the contract, every warn/fail with found/expected/fix and naming the node.
read_node, assert_contract = sandbox_reader(controller, NODE, node_settings)


# --- validate -------------------------------------------------------------------------------------


def test_the_defaults_are_valid():
    assert controller.validate(settings()) == []
    assert controller.validate(settings(core_dumps_pattern="core", core_dumps_dir="")) == []
    assert controller.validate(settings(core_dumps_pattern="/var/cores/core-%e.%p", core_dumps_dir="/var/cores/",
                                        core_dumps_dir_mode="01777", core_dumps_probe_user="")) == []


@pytest.mark.parametrize("overrides, name, found", [
    ({"core_dumps_pattern": COREDUMP, "core_dumps_dir": ""}, "core_dumps_pattern", "pipes cores to a program"),
    ({"core_dumps_pattern": APPORT, "core_dumps_dir": ""}, "core_dumps_pattern", "/var/crash"),
    ({"core_dumps_pattern": " ", "core_dumps_dir": ""}, "core_dumps_pattern", "must not be empty"),
    ({"core_dumps_pattern": "/tmp/" + "x" * 130}, "core_dumps_pattern", "bytes"),
    ({"core_dumps_pattern": "/var/cores/%u/core.%p", "core_dumps_dir": "/var/cores"}, "core_dumps_pattern",
     "specifier in its directory part"),
    ({"core_dumps_pattern": "/var/cores/core.%p", "core_dumps_dir": "/var/%u"}, "core_dumps_dir",
     "core_pattern specifier"),
    ({"core_dumps_dir": "cores"}, "core_dumps_dir", "cores"),
    ({"core_dumps_pattern": "/var/cores/core.%p", "core_dumps_dir": "/srv/cores"}, "core_dumps_dir",
     "writes cores into /var/cores"),
    ({"core_dumps_pattern": "core.%p", "core_dumps_dir": "/tmp"}, "core_dumps_dir", "working directory"),
    ({"core_dumps_dir_mode": "999"}, "core_dumps_dir_mode", "999"),
    ({"core_dumps_dir_mode": "rwxrwxrwt"}, "core_dumps_dir_mode", "rwxrwxrwt"),
    ({"core_dumps_dir_owner": "job user"}, "core_dumps_dir_owner", "job user"),
    ({"core_dumps_dir_group": ""}, "core_dumps_dir_group", ""),
    ({"core_dumps_sysctl_dropin": "/etc/sysctl.conf"}, "core_dumps_sysctl_dropin", "would never be read at boot"),
    ({"core_dumps_sysctl_dropin": "/etc/core.conf"}, "core_dumps_sysctl_dropin", "/etc/core.conf"),
    ({"core_dumps_limits_dropin": "/etc/security/limits.conf"}, "core_dumps_limits_dropin", "limits.conf"),
    ({"core_dumps_limits_dropin": "/etc/security/limits.d/90-core"}, "core_dumps_limits_dropin", "90-core"),
    ({"core_dumps_limits_value": "lots"}, "core_dumps_limits_value", "'lots'"),
    ({"core_dumps_limits_value": "-5"}, "core_dumps_limits_value", "'-5'"),
    ({"core_dumps_limits_domains": ["bad domain"]}, "core_dumps_limits_domains", "'bad domain'"),
    ({"core_dumps_limits_domains": []}, "core_dumps_limits_domains", "at least one domain"),
    ({"core_dumps_probe_timeout": 0}, "core_dumps_probe_timeout", "0"),
    ({"core_dumps_probe_timeout": -3}, "core_dumps_probe_timeout", "-3"),
    ({"core_dumps_probe_user": "job user"}, "core_dumps_probe_user", "job user"),
    ({"core_dumps_task_timeout": 0}, "core_dumps_task_timeout", "0"),
    ({"core_dumps_root": "sandbox"}, "core_dumps_root", "sandbox"),
    ({"core_dumps_proc_root": "proc"}, "core_dumps_proc_root", "proc"),
    ({"core_dumps_drift_policy": "ignore"}, "core_dumps_drift_policy", "ignore"),
])
def test_validate_names_the_variable_with_found_expected_fix(overrides, name, found):
    assert_one_problem(controller.validate(settings(**overrides)), name, found)


# --- read -----------------------------------------------------------------------------------------


def test_read_args_follow_the_switches():
    assert controller.read_args(settings(core_dumps_enabled=False), NODE) is None
    assert controller.read_args(settings(core_dumps_enabled="false"), NODE) is None
    args = controller.read_args(settings(core_dumps_limits_enabled=False), NODE)
    assert args["limits"] is None and args["core_dir"] == "/tmp"
    args = controller.read_args(settings(core_dumps_pattern="core", core_dumps_dir=""), NODE)
    assert args["core_dir"] == "" and args["limits"]["path"] == LIMITS_DROPIN


def test_read_a_node(tmp_path):
    facts, _wanted = read_node(make_node(tmp_path, running=APPORT, core_dir=0o755, limits=LIMITS_OK))
    assert facts["core_pattern"]["runtime"] == APPORT
    assert facts["core_pattern"]["core_uses_pid"] == "0"
    assert facts["core_dir"]["exists"] and facts["core_dir"]["is_dir"]
    assert facts["core_dir"]["mode"] == "0755"
    assert facts["core_dir"]["owner"] == pwd.getpwuid(os.getuid()).pw_name
    assert facts["limits"]["text"] == LIMITS_OK
    assert facts["limits"]["pam_services"] == ["/etc/pam.d/sshd"]
    assert {line["file"] for line in facts["limits"]["lines"]} == {LIMITS_DROPIN}  # only core lines


def test_read_what_a_node_lacks_is_a_fact(tmp_path):
    root = make_node(tmp_path, limits_d=False, pam=False, core_dir=None)
    facts, wanted = read_node(root)
    assert facts["core_dir"]["exists"] is False
    assert facts["limits"]["limits_dir_exists"] is False and facts["limits"]["text"] is None
    assert facts["limits"]["pam_services"] is None
    checks = controller.decide(HOST, facts, wanted)
    assert_contract(checks)
    assert "nor does /etc/security/limits.d" in checks["core_limits"]["found"]
    assert checks["core_limits_pam"]["status"] == "not_applicable"
    assert checks["core_dir"]["found"] == "/var/cores does not exist"
    assert checks["core_dir"]["fix"].startswith("on node5: run the node bring-up (role core_dumps), or: mkdir -p")


def test_read_core_dir_that_is_a_file(tmp_path):
    root = make_node(tmp_path, files={"/var/cores": "not a directory\n"})
    facts, wanted = read_node(root)
    checks = controller.decide(HOST, facts, wanted)
    assert checks["core_dir"]["status"] == "warn"
    assert checks["core_dir"]["found"] == "/var/cores is not a directory"


# --- decide ---------------------------------------------------------------------------------------

GOOD = dict(running=PATTERN, sysctl_dropin="kernel.core_pattern = %s\n" % PATTERN, core_dir=0o1777,
            limits=LIMITS_OK)
ALL_PASS = {"core_pattern": "pass", "core_pattern_persisted": "pass", "core_pattern_boot": "pass",
            "core_pattern_pid": "pass", "core_dir": "pass", "core_limits": "pass", "core_limits_conflicts": "pass",
            "core_limits_pam": "pass", "core_probe": "skipped"}


def changed(base, **updates):
    result = dict(base)
    result.update(updates)
    return result


@pytest.mark.parametrize("node, overrides, expected", [
    (GOOD, {}, ALL_PASS),
    # a fresh node: drift everywhere, under the default policy warn and under fail
    ({"running": "core"}, {}, changed(ALL_PASS, core_pattern="warn", core_pattern_persisted="warn",
                                      core_pattern_boot="warn", core_dir="warn", core_limits="warn")),
    ({"running": "core"}, {"core_dumps_drift_policy": "fail"},
     changed(ALL_PASS, core_pattern="fail", core_pattern_persisted="fail", core_pattern_boot="fail",
             core_dir="fail", core_limits="fail")),
    # a running pipe pattern, the rest in place
    (changed(GOOD, running=APPORT), {}, changed(ALL_PASS, core_pattern="warn")),
    # a vendor file wins at boot
    (changed(GOOD, files={"/etc/sysctl.d/99-vendor.conf": "kernel.core_pattern = %s\n" % COREDUMP}), {},
     changed(ALL_PASS, core_pattern_boot="warn")),
    # a directory root made but not sticky and world-writable
    (changed(GOOD, core_dir=0o755), {}, changed(ALL_PASS, core_dir="warn")),
    # a later limits file takes the core limit away from every user
    (changed(GOOD, files={"/etc/security/limits.d/95-site.conf": "* hard core 0\n"}), {},
     changed(ALL_PASS, core_limits_conflicts="warn")),
    # no PAM service loads pam_limits
    (changed(GOOD, pam=False, files={"/etc/pam.d/login": "session required pam_unix.so\n"}), {},
     changed(ALL_PASS, core_limits_pam="warn")),
    # a pattern without %p and core_uses_pid 0
    (changed(GOOD, running="/var/cores/core-%e", sysctl_dropin="kernel.core_pattern = /var/cores/core-%e\n"),
     {"core_dumps_pattern": "/var/cores/core-%e"}, changed(ALL_PASS, core_pattern_pid="warn")),
    (changed(GOOD, running="/var/cores/core-%e", uses_pid="1",
             sysctl_dropin="kernel.core_pattern = /var/cores/core-%e\n"),
     {"core_dumps_pattern": "/var/cores/core-%e"}, ALL_PASS),
    # a relative pattern: no directory to manage
    (changed(GOOD, running="core.%p", sysctl_dropin="kernel.core_pattern = core.%p\n"),
     {"core_dumps_pattern": "core.%p", "core_dumps_dir": ""}, changed(ALL_PASS, core_dir="not_applicable")),
    # switches
    (GOOD, {"core_dumps_limits_enabled": False},
     {name: status for name, status in changed(ALL_PASS, core_limits="skipped").items()
      if name not in ("core_limits_conflicts", "core_limits_pam")}),
    (GOOD, {"core_dumps_probe_enabled": "false"}, ALL_PASS),
    ({"running": APPORT}, {"core_dumps_enabled": False}, {"enabled": "skipped"}),
    ({"running": APPORT}, {"core_dumps_enabled": "false"}, {"enabled": "skipped"}),
])
def test_decide(tmp_path, node, overrides, expected):
    facts, wanted = read_node(make_node(tmp_path, **node), **overrides)
    checks = controller.decide(HOST, facts, wanted)
    assert statuses(checks) == expected, checks
    assert_contract(checks)


def test_decide_texts_say_where_cores_go_and_which_variable_switched_what_off(tmp_path):
    facts, wanted = read_node(make_node(tmp_path, **changed(GOOD, running=APPORT, core_dir=0o755)))
    checks = controller.decide(HOST, facts, wanted)
    assert "/var/crash" in checks["core_pattern"]["found"]
    assert checks["core_pattern"]["fix"].startswith("on node5: set a file pattern")
    assert checks["core_dir"]["found"] == "/var/cores is a directory with mode 0755, owner root, group root"
    assert "chmod 1777 /var/cores" in checks["core_dir"]["fix"]
    assert checks["core_probe"]["found"].startswith("no probe result")

    wanted = node_settings(tmp_path, core_dumps_enabled=False)
    assert controller.decide(HOST, None, wanted) == {"enabled": {
        "status": "skipped", "found": "core_dumps_enabled is false on node5: core dumps are not checked",
        "expected": "core pattern, directory, limits and crash probe checked once core_dumps_enabled is true",
        "fix": ""}}
    checks = controller.decide(HOST, facts, node_settings(tmp_path, core_dumps_limits_enabled=False,
                                                          core_dumps_probe_enabled=False))
    assert checks["core_limits"]["found"] == "core_dumps_limits_enabled is false"
    assert checks["core_probe"]["found"] == "core_dumps_probe_enabled is false"


def test_decide_without_facts_fails_and_names_the_node():
    checks = controller.decide(HOST, None, settings())
    assert statuses(checks) == {"core_pattern": "fail", "core_dir": "fail", "core_limits": "fail",
                                "core_probe": "skipped"}
    assert_contract(checks)


def test_decide_uses_the_probe_result(tmp_path):
    facts, wanted = read_node(make_node(tmp_path, **GOOD))
    found = {"outcome": "found", "core_pattern": PATTERN, "core_file": "/var/cores/core-sleep.7.node5.1",
             "core_removed": True, "who": "nobody", "wcoredump": True, "note": "",
             "expected_path": "/var/cores/core-sleep.7.node5.<epoch seconds>"}
    checks = controller.decide(HOST, facts, wanted, probe=found)
    assert checks["core_probe"]["status"] == "pass"
    assert "written by a child running as nobody" in checks["core_probe"]["found"]
    missing = dict(found, outcome="no_dump", core_file=None, wcoredump=False, core_dir="/var/cores",
                   core_dir_exists=False)
    checks = controller.decide(HOST, facts, wanted, probe=missing)
    assert checks["core_probe"]["status"] == "fail"
    assert checks["core_probe"]["fix"] == ("on node5: mkdir -p /var/cores && chmod 1777 /var/cores (the core_dumps "
                                           "role does this)")
    assert_contract(checks)


# --- probe ----------------------------------------------------------------------------------------


def probe_args(**overrides):
    return controller.probe_args(settings(**overrides), NODE, {"hosts": [HOST]})


def test_probe_args_follow_the_switches():
    assert probe_args(core_dumps_enabled=False) is None
    assert probe_args(core_dumps_probe_enabled="false") is None
    args = probe_args(core_dumps_probe_user="", core_dumps_probe_timeout=7)
    assert args == {"proc_root": "/proc", "timeout": 7.0, "run_as": "", "core_pattern": None, "core_uses_pid": None,
                    "pipe_probe": False}
    assert json.loads(json.dumps(args)) == args


@pytest.mark.parametrize("pattern, where", [(APPORT, "/var/crash"), (COREDUMP, "coredumpctl list")])
def test_probe_pipe_pattern_crashes_nothing_and_is_not_applicable(pattern, where):
    ops = FakeOps(programs={"sleep": SLEEP})
    result = core_dumps_probe.probe(dict(probe_args(), core_pattern=pattern), ops)
    assert result["outcome"] == "pipe" and result["child_pid"] is None and result["wcoredump"] is None
    check = controller.probe_check(result)
    assert check["status"] == "not_applicable" and where in check["found"]
    assert json.loads(json.dumps(result)) == result


def test_probe_reads_the_running_pattern_from_proc_root(tmp_path):
    (tmp_path / "sys" / "kernel").mkdir(parents=True)
    (tmp_path / "sys" / "kernel" / "core_pattern").write_text(APPORT + "\n")
    result = core_dumps_probe.probe(dict(probe_args(), proc_root=str(tmp_path)), FakeOps())
    assert result["core_pattern"] == APPORT and result["destination"]["handler"] == "apport"
    assert result["core_uses_pid"] is False


@pytest.mark.parametrize("args, outcome, found, fix", [
    ({"proc_root": "/nonexistent"}, "unreadable", "cannot read /nonexistent/sys/kernel/core_pattern",
     "core_dumps_proc_root"),
    ({"core_pattern": "  "}, "empty_pattern", "is empty", "sysctl -w kernel.core_pattern="),
    ({"core_pattern": "/tmp/core-%p", "run_as": "no-such-user-x"}, "user_missing", "no-such-user-x does not exist",
     "core_dumps_probe_user"),
])
def test_probe_what_a_node_lacks_is_an_outcome_with_a_fix(args, outcome, found, fix):
    result = core_dumps_probe.probe(dict(probe_args(), **args), FakeOps(programs={"sleep": SLEEP}))
    assert result["outcome"] == outcome and result["child_pid"] is None
    check = controller.probe_check(result)
    assert check["status"] == "fail" and found in check["found"] and fix in check["fix"], check


def test_probe_without_sleep_crashes_nothing():
    result = core_dumps_probe.probe(dict(probe_args(), core_pattern="/tmp/core-%p", run_as=""), FakeOps())
    assert result["outcome"] == "no_sleep" and result["child_pid"] is None
    assert controller.probe_check(result)["fix"] == "install coreutils"


def test_probe_hard_limit_zero_crashes_nothing(monkeypatch):
    monkeypatch.setattr(core_dumps_probe.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(core_dumps_probe.resource, "getrlimit", lambda _which: (0, 0))
    result = core_dumps_probe.probe(dict(probe_args(), core_pattern="/tmp/core-%p", run_as=""),
                              FakeOps(programs={"sleep": SLEEP}))
    assert result["outcome"] == "hard_limit_zero" and result["child_pid"] is None
    assert result["session_rlimit_core"] == {"soft": "0", "hard": "0"}
    check = controller.probe_check(result)
    assert "hard core limit" in check["found"] and "limits.d" in check["fix"]


@pytest.mark.parametrize("result, status", [
    ({"outcome": "pipe_dumped", "destination": {"where": "apport", "override": "x"}}, "not_applicable"),
    ({"outcome": "pipe_not_dumped", "destination": {"where": "apport", "override": "sysctl -w ..."}}, "fail"),
    ({"outcome": "timeout", "timeout": 10.0}, "fail"),
    ({"outcome": "start_failed", "error": "sleep could not be started", "who": "nobody"}, "fail"),
    ({"outcome": "not_found", "expected_path": "/var/cores/core-sleep.7", "core_dir": "/var/cores",
      "core_dir_listing": ["other"]}, "fail"),
    ({"outcome": "no_dump", "core_dir": "/var/cores", "core_dir_exists": True, "core_dir_writable": False,
      "core_dir_mode": "0755", "who": "nobody"}, "fail"),
    ({"outcome": "no_dump", "core_dir": "/var/cores", "core_dir_exists": True, "core_dir_writable": True,
      "suid_dumpable": "0", "who": "nobody"}, "fail"),
    ({"outcome": "something new"}, "fail"),
])
def test_probe_check_for_every_outcome(result, status):
    base = {"core_pattern": PATTERN, "note": "", "wcoredump": None, "expected_path": None}
    check = controller.probe_check(dict(base, **result))
    assert check["status"] == status
    assert preflight_checks.normalize(check, "core_probe") == check


@pytest.fixture
def kernel_core():
    """Set the real kernel.core_pattern / core_uses_pid; always restore them."""
    def read(path):
        with open(path) as handle:
            return handle.read().rstrip("\n")

    def write_value(path, value):
        with open(path, "w") as handle:
            handle.write(value)

    saved = {CORE_PATTERN: read(CORE_PATTERN), CORE_USES_PID: read(CORE_USES_PID)}

    def setter(pattern, uses_pid=None):
        write_value(CORE_PATTERN, pattern)
        if uses_pid is not None:
            write_value(CORE_USES_PID, "1" if uses_pid else "0")

    try:
        yield setter
    finally:
        for path, value in saved.items():
            write_value(path, value)
        assert read(CORE_PATTERN) == saved[CORE_PATTERN]


@pytest.fixture
def shared_dir():
    """A directory every user can reach (pytest's tmp_path sits under a 0700 directory of root's)."""
    path = tempfile.mkdtemp(prefix="core-dumps-test-", dir="/tmp")
    os.chmod(path, 0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@needs_root
def test_real_probe_as_the_job_user_finds_and_removes_the_core(kernel_core, shared_dir):
    cores = os.path.join(shared_dir, "cores")
    os.mkdir(cores)
    os.chmod(cores, 0o1777)
    kernel_core(cores + "/core-%e.%p.%h.%t")
    result = core_dumps_probe.probe(probe_args(core_dumps_probe_user="nobody"), FakeOps(programs={"sleep": SLEEP}))
    assert result["outcome"] == "found", result
    assert result["who"] == "nobody" and result["wcoredump"] is True and result["core_removed"] is True
    assert os.path.basename(result["core_file"]).startswith("core-sleep.%d.%s." % (result["child_pid"],
                                                                                  os.uname().nodename))
    assert os.listdir(cores) == []
    assert json.loads(json.dumps(result)) == result
    check = controller.decide(HOST, None, settings(core_dumps_limits_enabled=False), probe=result)["core_probe"]
    assert check["status"] == "pass"


@needs_root
def test_real_probe_missing_directory_fails_with_mkdir_fix(kernel_core, tmp_path):
    kernel_core(str(tmp_path / "missing") + "/core-%e.%p")
    result = core_dumps_probe.probe(probe_args(core_dumps_probe_user=""), FakeOps(programs={"sleep": SLEEP}))
    assert result["outcome"] == "no_dump" and result["core_dir_exists"] is False
    check = controller.probe_check(result)
    assert check["status"] == "fail" and "does not exist" in check["found"]
    assert check["fix"].startswith("mkdir -p %s" % (tmp_path / "missing"))


@needs_root
def test_real_probe_directory_not_writable_by_the_job_user(kernel_core, tmp_path):
    cores = tmp_path / "cores"
    cores.mkdir()
    os.chmod(str(cores), 0o755)
    os.chmod(str(tmp_path), 0o755)
    kernel_core(str(cores) + "/core-%e.%p.%h.%t")
    ops = FakeOps(programs={"sleep": SLEEP})
    ops.job_user = "nobody"  # no core_dumps_probe_user: the probe crashes a process of the job user
    result = core_dumps_probe.probe(probe_args(), ops)
    check = controller.probe_check(result)
    assert result["outcome"] == "no_dump" and check["status"] == "fail"
    assert "not writable by nobody" in check["found"]
    assert check["fix"].startswith("chmod 1777 %s" % cores)


# --- the writers and the audit agree --------------------------------------------------------------


def without_node(checks):
    prefix = "on %s: " % HOST
    return {name: dict(result, fix=result["fix"][len(prefix):] if result["fix"].startswith(prefix) else result["fix"])
            for name, result in checks.items()}


def pattern_args(root, wanted):
    return {"name": "kernel.core_pattern", "value": wanted["core_dumps_pattern"],
            "dropin": wanted["core_dumps_sysctl_dropin"], "root": str(root),
            "policy": wanted["core_dumps_drift_policy"]}


def limits_args(root, wanted):
    return {"path": wanted["core_dumps_limits_dropin"], "domains": wanted["core_dumps_limits_domains"],
            "value": wanted["core_dumps_limits_value"], "root": str(root), "policy": wanted["core_dumps_drift_policy"]}


@pytest.mark.parametrize("node", [
    {"running": APPORT},
    changed(GOOD, files={"/etc/sysctl.d/99-vendor.conf": "kernel.core_pattern = core\n",
                         "/etc/security/limits.d/95-site.conf": "* soft core 0\n"}),
])
def test_writers_in_check_mode_report_exactly_what_the_audit_decides(run_module, tmp_path, node):
    root = make_node(tmp_path, **node)
    facts, wanted = read_node(root)
    audit = without_node(controller.decide(HOST, facts, wanted))
    result, failed = run_module(sysctl_setting, pattern_args(root, wanted), check_mode=True)
    assert not failed
    assert result["checks"] == {name: audit[name] for name in result["checks"]}
    result, failed = run_module(limits_dropin, limits_args(root, wanted), check_mode=True)
    assert not failed
    assert result["checks"] == {name: audit[name] for name in result["checks"]}


def test_audit_passes_after_the_writers_applied(run_module, tmp_path):
    root = make_node(tmp_path, running=APPORT, core_dir=0o1777)
    _facts, wanted = read_node(root)
    for module, args in ((sysctl_setting, pattern_args(root, wanted)), (limits_dropin, limits_args(root, wanted))):
        result, failed = run_module(module, args)
        assert not failed and result["changed"]
    facts, wanted = read_node(root)
    assert statuses(controller.decide(HOST, facts, wanted)) == ALL_PASS


@pytest.mark.parametrize("session, policy, status, words", [
    ({"user": "alice", "soft": "unlimited", "hard": "unlimited", "how": "runuser -l alice", "error": None}, "warn",
     "pass", "ulimit -c is unlimited"),
    ({"user": "alice", "soft": "0", "hard": "unlimited", "how": "runuser -l alice", "error": None}, "warn",
     "warn", "ulimit -c is 0"),
    ({"user": "alice", "soft": "0", "hard": "0", "how": "runuser -l alice", "error": None}, "fail",
     "fail", "(hard 0)"),
    ({"user": "alice", "soft": None, "hard": None, "how": None, "error": "runuser (util-linux) is not installed"},
     "fail", "warn", "runuser"),
])
def test_the_session_limit_is_judged_for_the_job_users_login(session, policy, status, words):
    check = controller.session_check(session, settings(core_dumps_drift_policy=policy), policy)
    assert check["status"] == status and words in check["found"] and (check["fix"] or status == "pass")
    assert "alice" in check["expected"]
    if session["hard"] == "0":
        assert "hard limit 0 caps it" in check["fix"]


def test_the_session_limit_is_read_in_a_login_session_of_the_job_user():
    ops = FakeOps(programs={"runuser": "/usr/sbin/runuser"},
                  commands={("/usr/sbin/runuser", "-l", "alice"): (0, "0\nunlimited\n", "")})
    ops.job_user = "alice"
    if os.geteuid() != 0:
        pytest.skip("a login session of another user needs root")
    session = core_dumps.login_core_limit(ops)
    assert session == {"user": "alice", "soft": "0", "hard": "unlimited", "how": "runuser -l alice", "error": None}
    assert ops.calls[-1] == ["/usr/sbin/runuser", "-l", "alice", "-s", "/bin/sh", "-c", core_dumps.SESSION_LIMITS]


@needs_root
def test_the_real_login_session_of_nobody_reports_its_core_limit():
    ops = LocalOps()
    ops.job_user = "nobody"
    session = core_dumps.login_core_limit(ops)
    assert session["error"] is None and session["user"] == "nobody" and session["soft"] is not None


# --- a reader without root: what it was refused is blocked, never failed ------------------------------


def deny_reading(monkeypatch, *endings):
    real_open = open

    def deny(path, *args, **kwargs):
        if str(path).endswith(endings):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr("builtins.open", deny)


def test_limits_files_refused_to_a_reader_without_root_are_blocked_not_failed(tmp_path, monkeypatch):
    root = make_node(tmp_path, running=PATTERN, limits=LIMITS_OK, files={
        "/etc/security/limits.d/10-site.conf": "* soft core 0\n"})
    monkeypatch.setattr(core_dumps, "privileged", lambda: False)
    deny_reading(monkeypatch, "90-preflight-core.conf", "10-site.conf")
    facts, wanted = read_node(root, core_dumps_drift_policy="fail")
    monkeypatch.undo()
    assert facts["privileged"] is False
    assert {item["path"] for item in facts["needs_root"]} == {LIMITS_DROPIN, "/etc/security/limits.d/10-site.conf"}
    checks = controller.decide(HOST, facts, wanted)
    assert_contract(checks)
    for name in ("core_limits", "core_limits_conflicts"):
        assert checks[name]["status"] == "skipped" and checks[name]["details"]["blocked"], checks[name]
        assert checks[name]["found"].startswith("needs root: ") and "preflight_become" in checks[name]["fix"]
    assert [n for n, c in checks.items() if c["status"] == "fail" and "Permission denied" in c["found"]] == []
    # Read as root, the same refusal is the node's own finding (policy fail).
    deny_reading(monkeypatch, "90-preflight-core.conf", "10-site.conf")
    facts, wanted = read_node(root, core_dumps_drift_policy="fail")
    monkeypatch.undo()
    assert facts["needs_root"] == [] and controller.decide(HOST, facts, wanted)["core_limits"]["status"] == "fail"


def test_a_crash_that_could_not_run_as_the_job_user_never_passes_for_it():
    found = {"outcome": "found", "core_file": "/tmp/core.1", "who": "pfuser", "wcoredump": True,
             "core_removed": True, "note": "", "needs_root": "pfjob (the job user)"}
    check = controller.probe_check(found)
    assert check["status"] == "warn" and "ran as pfuser, not as pfjob (the job user)" in check["found"]
    assert check["fix"].startswith("set preflight_become: true")
    missing = {"outcome": "no_dump", "who": "pfuser", "core_dir": "/var/cores", "core_dir_exists": True,
               "core_dir_writable": False, "core_dir_mode": "0755", "needs_root": "pfjob (core_dumps_probe_user)"}
    check = controller.probe_check(missing)
    assert check["status"] == "skipped" and check["details"]["blocked"] and check["found"].startswith("needs root: ")
    assert controller.probe_check(dict(missing, needs_root=""))["status"] == "fail"
    assert controller.probe_check(dict(found, needs_root=""))["status"] == "pass"


def test_the_probe_names_the_job_user_it_cannot_switch_to_without_root():
    import types
    job = {"name": "pfjob", "how": "cannot_switch", "note": "connected as pfuser without root"}
    assert core_dumps_probe._unswitched("", types.SimpleNamespace(job=job)) == "pfjob (the job user)"
    assert core_dumps_probe._unswitched("", types.SimpleNamespace(job=dict(job, how="named"))) == ""
    assert core_dumps_probe._unswitched("nobody", types.SimpleNamespace(job=job)) == ""
