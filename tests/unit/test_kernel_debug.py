"""The kernel_debug capability: validate, read (sandbox roots, FakeOps), decide (tables), and the
writer (library/sysctl_setting.py) agreeing with the audit because both use preflight_sysctl."""

import functools
import os

import pytest

import sysctl_setting
from cluster_preflight.capabilities import kernel_debug as controller
from preflight_node.capabilities import kernel_debug
from preflight_node.capabilities import kernel_debug_probe
from preflight_node.sysctl import values as preflight_sysctl
from capability_helpers import (assert_one_problem, capability_under_test, deny_reading, role_settings, role_yaml,
                                sandbox_reader, statuses, sysctl_tree, write, write_files)

ROLE_NAME = "kernel_debug"
ROLE, HOST, NODE = capability_under_test(ROLE_NAME, "node3", "198.18.0.3")
PTRACE_DROPIN = "/etc/sysctl.d/60-preflight-ptrace.conf"
PANIC = {"name": "kernel.panic_on_oops", "value": "1", "dropin": "/etc/sysctl.d/60-preflight-panic.conf",
         "check_name": None}


load_yaml = functools.partial(role_yaml, ROLE_NAME)


def sysctl_checks(host, facts, wanted, **kwargs):
    """The checks of the sysctls alone (the ptrace probe's check is tested on its own below)."""
    checks = controller.decide(host, facts, wanted, **kwargs)
    checks.pop("ptrace_attach")
    return checks


# The role's defaults, typed, with overrides: what preflight_settings hands a capability.
settings = functools.partial(role_settings, ROLE_NAME)


def make_node(tmp_path, yama="1", dropin=None, files=None):
    """A sandbox root: /proc/sys (Yama ptrace_scope ``yama``, or no Yama when None) and a sysctl tree."""
    root = tmp_path / "node"
    write(root, "/proc/sys/kernel/panic_on_oops", "0\n")
    if yama is not None:
        write(root, "/proc/sys/kernel/yama/ptrace_scope", yama + "\n")
    sysctl_tree(root)
    if dropin is not None:
        write(root, PTRACE_DROPIN, dropin)
    write_files(root, files)
    return root


def node_settings(root, **overrides):
    return settings(**dict(dict(kernel_debug_ptrace_scope_enabled=True, kernel_debug_sysctl_root=str(root)),
                           **overrides))


# read_node(root, **overrides): (facts, settings) as the node reads them; assert_contract(checks, host=HOST): names
# inside the contract, every warn/fail with found/expected/fix and naming the node.
read_node, assert_contract = sandbox_reader(controller, NODE, node_settings)


# --- validate -------------------------------------------------------------------------------------


def test_the_defaults_are_valid():
    assert controller.validate(settings()) == []
    assert controller.validate(settings(kernel_debug_ptrace_scope_enabled=True, kernel_debug_ptrace_scope=3,
                                          kernel_debug_extra_sysctls=[PANIC])) == []


@pytest.mark.parametrize("overrides, name, found", [
    ({"kernel_debug_ptrace_scope": 4}, "kernel_debug_ptrace_scope", "4"),
    ({"kernel_debug_ptrace_scope": -1}, "kernel_debug_ptrace_scope", "-1"),
    ({"kernel_debug_ptrace_scope": "often"}, "kernel_debug_ptrace_scope", "often"),
    ({"kernel_debug_ptrace_scope": True}, "kernel_debug_ptrace_scope", "True"),
    ({"kernel_debug_ptrace_scope_dropin": "/etc/sysctl.conf"}, "kernel_debug_ptrace_scope_dropin",
     "would never be read at boot"),
    ({"kernel_debug_ptrace_scope_dropin": "/etc/ptrace.conf"}, "kernel_debug_ptrace_scope_dropin", "/etc/ptrace.conf"),
    ({"kernel_debug_ptrace_scope_dropin": "/etc/sysctl.d/10-ptrace"}, "kernel_debug_ptrace_scope_dropin",
     "10-ptrace"),
    ({"kernel_debug_ptrace_scope_dropin": "etc/sysctl.d/10-ptrace.conf"}, "kernel_debug_ptrace_scope_dropin",
     "etc/sysctl.d"),
    ({"kernel_debug_sysctl_dirs": []}, "kernel_debug_sysctl_dirs", "[]"),
    ({"kernel_debug_sysctl_dirs": ["/etc/sysctl.conf"]}, "kernel_debug_sysctl_dirs", "sysctl.conf"),
    ({"kernel_debug_sysctl_dirs": ["etc/sysctl.d"]}, "kernel_debug_sysctl_dirs", "etc/sysctl.d"),
    ({"kernel_debug_sysctl_root": "sandbox"}, "kernel_debug_sysctl_root", "sandbox"),
    ({"kernel_debug_proc_root": ""}, "kernel_debug_proc_root", ""),
    ({"kernel_debug_task_timeout": 0}, "kernel_debug_task_timeout", "0"),
    ({"kernel_debug_drift_policy": "ignore"}, "kernel_debug_drift_policy", "ignore"),
    ({"kernel_debug_extra_sysctls": [dict(PANIC, dropin="/etc/panic.conf")]}, "kernel_debug_extra_sysctls[0]",
     "/etc/panic.conf"),
    ({"kernel_debug_extra_sysctls": [dict(PANIC, dropin=PTRACE_DROPIN)]}, "kernel_debug_extra_sysctls[0]",
     "also used by kernel_debug_ptrace_scope_dropin"),
    ({"kernel_debug_extra_sysctls": [PANIC, dict(PANIC, name="kernel.panic")]}, "kernel_debug_extra_sysctls[1]",
     "also used by kernel_debug_extra_sysctls[0]"),
    ({"kernel_debug_extra_sysctls": [dict(PANIC, name="kernel panic")]}, "kernel_debug_extra_sysctls[0]",
     "not a sysctl key"),
    ({"kernel_debug_extra_sysctls": [dict(PANIC, name="kernel.core_pattern")]}, "kernel_debug_extra_sysctls[0]",
     "kept by core_dumps_pattern"),
    ({"kernel_debug_extra_sysctls": [dict(PANIC, name="kernel/yama/ptrace_scope")]},
     "kernel_debug_extra_sysctls[0]", "kept by kernel_debug_ptrace_scope"),
    ({"kernel_debug_extra_sysctls": [dict(PANIC, value="1\n2")]}, "kernel_debug_extra_sysctls[0]", "value"),
    ({"kernel_debug_extra_sysctls": [dict(PANIC, value="")]}, "kernel_debug_extra_sysctls[0]", "value"),
    ({"kernel_debug_extra_sysctls": [dict(PANIC, check_name="Panic-On-Oops")]}, "kernel_debug_extra_sysctls[0]",
     "Panic-On-Oops"),
    ({"kernel_debug_extra_sysctls": [dict(PANIC, check_name="ptrace_scope_boot")]},
     "kernel_debug_extra_sysctls[0]", "ptrace_scope_boot is taken"),
    ({"kernel_debug_extra_sysctls": [PANIC, dict(PANIC, name="vm.panic_on_oops",
                                                 dropin="/etc/sysctl.d/61-vm.conf")]},
     "kernel_debug_extra_sysctls[1]", "panic_on_oops is taken"),
    ({"kernel_debug_extra_sysctls": [{"name": "kernel.panic", "value": "1"}]}, "kernel_debug_extra_sysctls[0]",
     "kernel.panic"),
])
def test_validate_names_the_variable_with_found_expected_fix(overrides, name, found):
    assert_one_problem(controller.validate(settings(**overrides)), name, found)


# --- read -----------------------------------------------------------------------------------------


def test_read_args_none_when_switched_off_and_nothing_else_to_read():
    assert controller.read_args(settings(), NODE) is None
    args = controller.read_args(settings(kernel_debug_extra_sysctls=[PANIC]), NODE)
    assert [item["check_name"] for item in args["settings"]] == ["panic_on_oops"]
    # Switches typed on the command line arrive as text.
    assert controller.read_args(settings(kernel_debug_ptrace_scope_enabled="false"), NODE) is None
    args = controller.read_args(settings(kernel_debug_ptrace_scope_enabled="true"), NODE)
    assert args["settings"] == [{"check_name": "ptrace_scope", "key": "kernel.yama.ptrace_scope",
                                 "dropin": PTRACE_DROPIN}]


def test_read_with_yama(tmp_path):
    facts, _wanted = read_node(make_node(tmp_path, yama="1"))
    ptrace = facts["settings"]["ptrace_scope"]
    assert ptrace["runtime"] == "1" and ptrace["missing_reason"] is None
    assert ptrace["dropin_text"] is None and ptrace["dropin_value"] is None
    assert PTRACE_DROPIN in [entry["path"] for entry in ptrace["boot_files"]]
    assert ptrace["assignments"] == []


def test_read_without_yama(tmp_path):
    facts, _wanted = read_node(make_node(tmp_path, yama=None))
    ptrace = facts["settings"]["ptrace_scope"]
    assert ptrace["runtime"] is None
    assert ptrace["missing_reason"] == "kernel has no Yama LSM: /proc/sys/kernel/yama/ptrace_scope does not exist"


def test_read_unreadable_files_are_facts_not_exceptions(tmp_path, monkeypatch):
    root = make_node(tmp_path, dropin="kernel.yama.ptrace_scope = 0\n",
                     files={"/etc/sysctl.d/99-locked.conf": "kernel.yama.ptrace_scope = 1\n"})
    real_open = open

    def deny(path, *args, **kwargs):
        if str(path).endswith(("99-locked.conf", "yama/ptrace_scope")):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", deny)
    facts, wanted = read_node(root)
    monkeypatch.undo()
    ptrace = facts["settings"]["ptrace_scope"]
    assert "Permission denied" in ptrace["runtime_error"]
    assert ptrace["unreadable"] == [{"path": "/etc/sysctl.d/99-locked.conf", "error": "Permission denied"}]
    checks = sysctl_checks(HOST, facts, wanted)
    assert_contract(checks)
    assert checks["ptrace_scope"]["status"] == "warn"
    assert "preflight_become" in checks["ptrace_scope"]["fix"]
    assert "99-locked.conf cannot be read" in checks["ptrace_scope_boot"]["found"]
    assert checks["ptrace_scope_persisted"]["status"] == "pass"


# --- decide ---------------------------------------------------------------------------------------

OK_DROPIN = "kernel.yama.ptrace_scope = 0\n"


@pytest.mark.parametrize("yama, dropin, files, overrides, expected", [
    # drift everywhere, drift policy warn (the default)
    ("1", None, {}, {}, {"ptrace_scope": "warn", "ptrace_scope_persisted": "warn", "ptrace_scope_boot": "warn"}),
    # the same drift under policy fail
    ("1", None, {}, {"kernel_debug_drift_policy": "fail"},
     {"ptrace_scope": "fail", "ptrace_scope_persisted": "fail", "ptrace_scope_boot": "fail"}),
    # all in place
    ("0", OK_DROPIN, {}, {}, {"ptrace_scope": "pass", "ptrace_scope_persisted": "pass", "ptrace_scope_boot": "pass"}),
    # running value right, the drop-in missing
    ("0", None, {}, {}, {"ptrace_scope": "pass", "ptrace_scope_persisted": "warn", "ptrace_scope_boot": "warn"}),
    # a later file wins at boot
    ("0", OK_DROPIN, {"/etc/sysctl.d/99-vendor.conf": "kernel.yama.ptrace_scope = 2\n"}, {},
     {"ptrace_scope": "pass", "ptrace_scope_persisted": "pass", "ptrace_scope_boot": "warn"}),
    # an earlier file with another value is overridden: no finding
    ("0", OK_DROPIN, {"/usr/lib/sysctl.d/05-vendor.conf": "kernel.yama.ptrace_scope = 2\n"}, {},
     {"ptrace_scope": "pass", "ptrace_scope_persisted": "pass", "ptrace_scope_boot": "pass"}),
    # /etc/sysctl.conf is applied last
    ("0", OK_DROPIN, {"/etc/sysctl.conf": "kernel.yama.ptrace_scope=1\n"}, {},
     {"ptrace_scope": "pass", "ptrace_scope_persisted": "pass", "ptrace_scope_boot": "warn"}),
    # the drop-in sets another value
    ("1", "kernel.yama.ptrace_scope = 1\n", {}, {},
     {"ptrace_scope": "warn", "ptrace_scope_persisted": "warn", "ptrace_scope_boot": "warn"}),
    # no Yama: one not_applicable, nothing else
    (None, None, {}, {}, {"ptrace_scope": "not_applicable"}),
    # switched off: skipped, whatever the node has
    ("1", None, {}, {"kernel_debug_ptrace_scope_enabled": False}, {"ptrace_scope": "skipped"}),
    (None, None, {}, {"kernel_debug_ptrace_scope_enabled": "false"}, {"ptrace_scope": "skipped"}),
    # ptrace_scope 1 wanted and in place
    ("1", "kernel.yama.ptrace_scope = 1\n", {}, {"kernel_debug_ptrace_scope": 1},
     {"ptrace_scope": "pass", "ptrace_scope_persisted": "pass", "ptrace_scope_boot": "pass"}),
    # an extra sysctl next to ptrace_scope, named by its key's last component
    ("0", OK_DROPIN, {}, {"kernel_debug_extra_sysctls": [PANIC]},
     {"ptrace_scope": "pass", "ptrace_scope_persisted": "pass", "ptrace_scope_boot": "pass",
      "panic_on_oops": "warn", "panic_on_oops_persisted": "warn", "panic_on_oops_boot": "warn"}),
    # an extra sysctl with its own check name, ptrace switched off
    (None, None, {"/etc/sysctl.d/60-preflight-panic.conf": "kernel.panic_on_oops = 0\n"},
     {"kernel_debug_ptrace_scope_enabled": False,
      "kernel_debug_extra_sysctls": [dict(PANIC, value="0", check_name="oops")]},
     {"ptrace_scope": "skipped", "oops": "pass", "oops_persisted": "pass", "oops_boot": "pass"}),
])
def test_decide(tmp_path, yama, dropin, files, overrides, expected):
    facts, wanted = read_node(make_node(tmp_path, yama=yama, dropin=dropin, files=files), **overrides)
    checks = sysctl_checks(HOST, facts, wanted)
    assert statuses(checks) == expected, checks
    assert_contract(checks)


def test_decide_texts(tmp_path):
    root = make_node(tmp_path, yama="1", files={"/etc/sysctl.d/99-vendor.conf": "# vendor\nkernel.yama.ptrace_scope = 2\n"})
    facts, wanted = read_node(root)
    checks = sysctl_checks(HOST, facts, wanted)
    assert checks["ptrace_scope"]["found"] == "running 1"
    assert checks["ptrace_scope"]["expected"] == "0"
    assert checks["ptrace_scope"]["fix"] == (
        "on node3: sysctl -w kernel.yama.ptrace_scope='0' and persist it as 'kernel.yama.ptrace_scope = 0' in "
        "/etc/sysctl.d/60-preflight-ptrace.conf (the node bring-up does both)")
    assert checks["ptrace_scope_persisted"]["found"] == "/etc/sysctl.d/60-preflight-ptrace.conf does not exist"
    boot = checks["ptrace_scope_boot"]
    assert "kernel.yama.ptrace_scope=2 in /etc/sysctl.d/99-vendor.conf:2 overrides 60-preflight-ptrace.conf at boot" \
        in boot["found"]
    assert "/etc/sysctl.d/99-vendor.conf:2" in boot["fix"]


def test_no_yama_and_switched_off_say_why(tmp_path):
    facts, wanted = read_node(make_node(tmp_path, yama=None))
    assert sysctl_checks(HOST, facts, wanted) == {"ptrace_scope": {
        "status": "not_applicable",
        "found": "kernel has no Yama LSM: /proc/sys/kernel/yama/ptrace_scope does not exist",
        "expected": "kernel.yama.ptrace_scope = 0", "fix": ""}}
    off = settings()
    checks = sysctl_checks(HOST, None, off)
    assert list(checks) == ["ptrace_scope"]
    assert checks["ptrace_scope"]["status"] == "skipped"
    assert "kernel_debug_ptrace_scope_enabled is false" in checks["ptrace_scope"]["found"]


def test_decide_without_facts_for_an_enabled_setting_fails_and_names_the_node():
    checks = sysctl_checks(HOST, None, settings(kernel_debug_ptrace_scope_enabled=True))
    assert statuses(checks) == {"ptrace_scope": "fail"}
    assert_contract(checks)


def test_shadowed_dropin_is_a_boot_finding(tmp_path):
    root = make_node(tmp_path, yama="0", files={"/etc/sysctl.d/10-ptrace.conf": "kernel.yama.ptrace_scope = 1\n",
                                                "/usr/lib/sysctl.d/10-ptrace.conf": OK_DROPIN})
    facts, wanted = read_node(root, kernel_debug_ptrace_scope_dropin="/usr/lib/sysctl.d/10-ptrace.conf")
    checks = sysctl_checks(HOST, facts, wanted)
    assert checks["ptrace_scope_boot"]["status"] == "warn"
    assert "is never read" in checks["ptrace_scope_boot"]["found"]


# --- the writer and the audit agree ----------------------------------------------------------------


def writer_args(root, wanted, **extra):
    args = {"name": "kernel.yama.ptrace_scope", "value": str(wanted["kernel_debug_ptrace_scope"]),
            "dropin": wanted["kernel_debug_ptrace_scope_dropin"], "root": str(root),
            "policy": wanted["kernel_debug_drift_policy"], "sysctl_dirs": wanted["kernel_debug_sysctl_dirs"]}
    args.update(extra)
    return args


def without_node(checks):
    prefix = "on %s: " % HOST
    return {name: dict(result, fix=result["fix"][len(prefix):] if result["fix"].startswith(prefix) else result["fix"])
            for name, result in checks.items()}


@pytest.mark.parametrize("yama, files", [
    ("1", {}),
    ("0", {"/etc/sysctl.d/99-vendor.conf": "kernel.yama.ptrace_scope = 2\n"}),
    (None, {}),
])
def test_writer_check_mode_reports_exactly_what_the_audit_decides(run_module, tmp_path, yama, files):
    root = make_node(tmp_path, yama=yama, files=files)
    facts, wanted = read_node(root)
    result, failed = run_module(sysctl_setting, writer_args(root, wanted), check_mode=True)
    assert not failed
    assert result["checks"] == without_node(sysctl_checks(HOST, facts, wanted))


def test_audit_passes_after_the_writer_applied(run_module, tmp_path):
    root = make_node(tmp_path, yama="1")
    _facts, wanted = read_node(root)
    result, failed = run_module(sysctl_setting, writer_args(root, wanted))
    assert not failed and result["changed"]
    assert set(statuses(result["checks"]).values()) == {"pass"}
    facts, wanted = read_node(root)
    checks = sysctl_checks(HOST, facts, wanted)
    assert checks == result["checks"]
    assert preflight_sysctl.dropin_value(facts["settings"]["ptrace_scope"]["dropin_text"],
                                         "kernel.yama.ptrace_scope") == "0"


# -- ptrace probe: the job user's view -----------------------------------------------------------

def fake_proc(tmp_path, scope):
    """A proc root whose Yama ptrace_scope is ``scope`` (None: a kernel without Yama, as on these machines)."""
    root = tmp_path / "proc"
    (root / "sys" / "kernel").mkdir(parents=True)
    if scope is not None:
        (root / "sys" / "kernel" / "yama").mkdir()
        (root / "sys" / "kernel" / "yama" / "ptrace_scope").write_text("%d\n" % scope)
    return str(root)


def attaching_as(uid, scope):
    """A node whose kernel answers the probe's PTRACE_SEIZE as Yama ``scope`` would for ``uid``."""
    import json

    from fake_ops import FakeOps

    def answer(argv):
        ok = kernel_debug_probe.yama_allows(scope, uid)
        return 0, json.dumps({"uid": uid, "target": 4242, "attached": ok, "errno": "" if ok else "EPERM",
                              "error": "" if ok else "Operation not permitted"}) + "\n", ""

    ops = FakeOps(commands={("/venv/bin/python", "-I"): answer})
    ops.job = {"name": "alice" if uid else "root", "python": "/venv/bin/python"}
    ops.job_user = "alice" if uid else None
    return ops


@pytest.mark.parametrize("scope, uid, status, words", [
    (None, 1001, "pass", "no Yama LSM"),
    (0, 1001, "pass", "ptrace_scope = 0"),
    (1, 1001, "fail", "kernel_debug_ptrace_scope_enabled=true"),
    (2, 1001, "fail", "CAP_SYS_PTRACE"),
    (3, 1001, "fail", "cannot be lowered until a reboot"),
    # Root passes at 1 and 2 (CAP_SYS_PTRACE): a check run as root would wrongly pass for the job's user.
    (1, 0, "pass", "ptrace_scope = 1"),
    (2, 0, "pass", "ptrace_scope = 2"),
    (3, 0, "fail", "cannot be lowered"),
])
def test_ptrace_attach_is_decided_from_the_job_users_view(tmp_path, scope, uid, status, words):
    ops = attaching_as(uid, scope)
    result = kernel_debug_probe.probe({"proc_root": fake_proc(tmp_path, scope), "timeout": 5}, ops)
    assert result["yama_scope"] == scope and result["uid"] == uid
    assert ops.users == ["alice" if uid else None], "the attach runs as the job user"
    checks = controller.decide("n1", {"settings": {}}, settings(), probe=result)
    check = checks["ptrace_attach"]
    assert check["status"] == status
    assert words in check["found"] + check.get("fix", "")
    if status == "fail":
        assert check["fix"].startswith("on n1: ") and "uid %d" % uid in check["found"]


def test_a_probe_that_cannot_run_is_a_failure_naming_the_user_and_the_python(tmp_path):
    from fake_ops import FakeOps

    ops = FakeOps(commands={("/venv/bin/python",): (126, "", "Permission denied")})
    ops.job, ops.job_user = {"name": "alice", "python": "/venv/bin/python"}, "alice"
    result = kernel_debug_probe.probe({"proc_root": fake_proc(tmp_path, None), "timeout": 5}, ops)
    check = controller.decide("n1", {"settings": {}}, settings(), probe=result)["ptrace_attach"]
    assert check["status"] == "fail" and "alice" in check["found"] and "Permission denied" in check["found"]


def test_no_probe_or_a_switched_off_probe_is_skipped_with_the_reason():
    assert controller.decide("n1", {"settings": {}}, settings())["ptrace_attach"]["status"] == "skipped"
    off = settings(kernel_debug_ptrace_probe_enabled=False)
    assert controller.probe_args(off, {}) is None
    assert "false" in controller.decide("n1", {"settings": {}}, off)["ptrace_attach"]["found"]


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the probe as another account")
@pytest.mark.parametrize("user", [None, "nobody"])
def test_the_real_probe_attaches_to_a_non_child_process_of_the_same_user(user):
    from fake_ops import LocalOps
    from job_env import job_python

    python = job_python("nobody")
    if python is None:
        pytest.skip("no Python that nobody can run on this machine")
    ops = LocalOps()
    ops.job, ops.job_user = {"name": user or "root", "python": python}, user
    result = kernel_debug_probe.probe({"proc_root": "/proc", "timeout": 15}, ops)
    assert result["attached"] is True, result
    assert result["uid"] == (0 if user is None else __import__("pwd").getpwnam(user).pw_uid)


@pytest.mark.parametrize("rc, status", [(125, "skipped"), (124, "fail")])
def test_a_training_python_that_hung_blocks_the_attach_check_or_fails_it_where_it_hung_now(tmp_path, rc, status):
    from fake_ops import FakeOps

    from preflight_node.checks import is_blocked
    ops = FakeOps(commands={("/venv/bin/python",): (rc, "", "not run: /venv/bin/python hung for 30 s earlier")})
    ops.job, ops.job_user = {"name": "alice", "python": "/venv/bin/python"}, "alice"
    ops.hangs = {"/venv/bin/python": {"program": "/venv/bin/python", "seconds": 30.0, "user": "nobody"}}
    result = kernel_debug_probe.probe({"proc_root": fake_proc(tmp_path, None), "timeout": 5}, ops)
    assert result["python_hang"]["earlier"] is (rc == 125)
    check = controller.decide("n1", {"settings": {}}, settings(), probe=result)["ptrace_attach"]
    assert check["status"] == status and is_blocked(check) is (rc == 125)
    if rc == 125:
        assert check["found"] == "not checked: /venv/bin/python hung for 30 s earlier (allreduce.python)"
    else:
        assert "/venv/bin/python hung running the ptrace probe" in check["found"] and "py-spy" in check["fix"]


def test_a_reader_without_root_refused_a_file_is_blocked_never_failed(tmp_path, monkeypatch):
    root = make_node(tmp_path, dropin="kernel.yama.ptrace_scope = 0\n",
                     files={"/etc/sysctl.d/99-locked.conf": "kernel.yama.ptrace_scope = 1\n"})
    deny_reading(monkeypatch, kernel_debug, "99-locked.conf")
    facts, wanted = read_node(root, kernel_debug_drift_policy="fail", kernel_debug_ptrace_scope=1)
    monkeypatch.undo()
    assert facts["privileged"] is False
    assert facts["needs_root"] == [{"path": "/etc/sysctl.d/99-locked.conf", "error": "Permission denied"}]
    checks = sysctl_checks(HOST, facts, wanted)
    assert_contract(checks)
    boot = checks["ptrace_scope_boot"]
    assert boot["status"] == "skipped" and boot["details"]["blocked"] and boot["found"].startswith("needs root: ")
    assert "99-locked.conf" in boot["found"] and boot["fix"] == "set preflight_become: true (or connect as root)"
    assert checks["ptrace_scope"]["status"] == "pass"


def test_a_ptrace_probe_that_could_not_switch_to_the_job_user_is_blocked_never_passed():
    """Another job user wanted and no root to switch: the probe ran as the login, so even an attach that
    worked says nothing of the job user's view (needs root, node unverified)."""
    from cluster_preflight.capabilities.kernel_debug import attach_check

    result = attach_check("n1", {"user": "pfuser", "uid": 1000, "yama_scope": None, "attached": True,
                                 "unswitched": "alice"})
    assert result["status"] == "skipped" and result["details"]["blocked"], result
    assert result["found"].startswith("needs root:") and "alice" in result["found"] and "pfuser" in result["found"]
    assert "preflight_become" in result["fix"]
