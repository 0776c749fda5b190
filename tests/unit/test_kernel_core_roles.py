"""The kernel_debug and core_dumps roles (bring-up writers only) through ansible-playbook on localhost,
against a sandbox root: check mode (nothing written) -> apply (changed) -> re-apply (nothing changed).
After each run the node is audited the way the preflight does it: each capability's read + decide."""

import hashlib
import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from cluster_preflight.capabilities import core_dumps as preflight_core_dumps
from cluster_preflight.capabilities import kernel_debug as preflight_kernel_debug
from preflight_node import readers as node_halves
from fake_ops import FakeOps

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOST = "localhost"
NODE = {"name": HOST, "ansible_host": HOST, "node_addr": HOST, "user": "root", "ssh_port": 22}
PLAYBOOK = """
- name: Run the kernel roles against a sandbox root.
  hosts: localhost
  gather_facts: false
  roles:
    - kernel_debug
    - core_dumps
"""


def sandbox_tree(root, yama=True):
    files = {
        "proc/sys/kernel/core_pattern": "|/usr/share/apport/apport -p%p -s%s -c%c -d%d -P%P -u%u -g%g -- %E\n",
        "proc/sys/kernel/core_uses_pid": "0\n",
        "etc/sysctl.conf": "# site settings\nvm.swappiness = 10\n",
        "etc/security/limits.conf": "# site limits\n*  soft  nofile  65536\n",
        "etc/pam.d/sshd": "session required pam_limits.so\n",
    }
    if yama:
        files["proc/sys/kernel/yama/ptrace_scope"] = "1\n"
    for path, text in files.items():
        full = os.path.join(str(root), path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as handle:
            handle.write(text)
    os.makedirs(os.path.join(str(root), "etc/sysctl.d"))
    os.makedirs(os.path.join(str(root), "etc/security/limits.d"))


def hashes(root):
    result = {}
    for directory, dirs, files in os.walk(str(root)):
        for name in dirs:
            path = os.path.join(directory, name)
            result[path] = "dir:%o" % os.stat(path).st_mode
        for name in files:
            with open(os.path.join(directory, name), "rb") as handle:
                result[os.path.join(directory, name)] = hashlib.sha256(handle.read()).hexdigest()
    return result


def base_variables(sandbox, **extra):
    variables = {
        "kernel_debug_sysctl_root": str(sandbox), "core_dumps_root": str(sandbox),
        "core_dumps_probe_enabled": False, "core_dumps_drift_policy": "fail",
        "kernel_debug_ptrace_scope_enabled": True,
    }
    variables.update(extra)
    return variables


def play(tmp_path, sandbox, check=False, **extra):
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAYBOOK)
    variables = dict(base_variables(sandbox, **extra), ansible_python_interpreter=sys.executable)
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
            "-e", json.dumps(variables), str(playbook)]
    if check:
        argv += ["--check", "--diff"]
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    proc = subprocess.run(argv, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    recap = re.search(r"localhost\s+: ok=\d+\s+changed=(\d+).*failed=(\d+)", proc.stdout)
    return proc, (int(recap.group(1)) if recap else None)


def role_settings(role, variables):
    """The role's defaults with the run's variables, rendered: what preflight_settings hands a capability."""
    with open(os.path.join(ROOT, "roles", role, "defaults", "main.yml")) as handle:
        values = yaml.safe_load(handle)
    values.update((name, value) for name, value in variables.items() if name.startswith(role + "_"))
    if values.get("core_dumps_dir") == "{{ core_dumps_pattern | dirname }}":
        values["core_dumps_dir"] = os.path.dirname(values["core_dumps_pattern"])
    return values


def audit(sandbox, **extra):
    """Each capability's checks on the sandbox node, as the preflight's facts and decide stages make them."""
    variables = base_variables(sandbox, **extra)
    checks = {}
    for capability in (preflight_kernel_debug, preflight_core_dumps):
        wanted = role_settings(capability.CAPABILITY, variables)
        assert capability.validate(wanted) == []
        args = capability.read_args(wanted, NODE)
        facts = None if args is None else json.loads(json.dumps(node_halves.get(capability.CAPABILITY).read(args, FakeOps())))
        checks[capability.CAPABILITY] = capability.decide(HOST, facts, wanted)
    return checks


@pytest.mark.skipif(os.geteuid() != 0, reason="the core directory is owned by root")
def test_roles_check_apply_reapply(tmp_path):
    sandbox = tmp_path / "node"
    sandbox_tree(sandbox)
    before = hashes(sandbox)
    core = {"core_dumps_dir": "/var/cores", "core_dumps_pattern": "/var/cores/core-%e.%p.%h.%t"}

    proc, changed = play(tmp_path, sandbox, check=True, **core)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert changed > 0
    assert hashes(sandbox) == before, "check mode must write nothing"
    checks = audit(sandbox, **core)
    kernel, core_checks = checks["kernel_debug"], checks["core_dumps"]
    assert kernel["ptrace_scope"]["status"] == "warn" and kernel["ptrace_scope"]["found"] == "running 1"
    assert core_checks["core_pattern"]["status"] == "fail"
    assert "/var/crash" in core_checks["core_pattern"]["found"]
    assert core_checks["core_dir"]["status"] == "fail" and "does not exist" in core_checks["core_dir"]["found"]
    assert core_checks["core_limits"]["status"] == "fail"
    assert core_checks["core_probe"]["status"] == "skipped"

    proc, changed = play(tmp_path, sandbox, **core)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert changed > 0
    checks = audit(sandbox, **core)
    statuses = {name: result["status"] for role in checks.values() for name, result in role.items()}
    # The probes (a crash, a ptrace attach) run in preflight.yml's probe stage, not in this audit.
    assert {status for name, status in statuses.items() if name not in ("core_probe", "ptrace_attach")} == {
        "pass"}, statuses
    assert oct(os.stat(str(sandbox / "var/cores")).st_mode & 0o7777) == "0o1777"
    with open(str(sandbox / "proc/sys/kernel/core_pattern")) as handle:
        assert handle.read() == "/var/cores/core-%e.%p.%h.%t"
    with open(str(sandbox / "etc/sysctl.conf")) as handle:
        assert handle.read() == "# site settings\nvm.swappiness = 10\n"

    applied = hashes(sandbox)
    proc, changed = play(tmp_path, sandbox, **core)
    assert proc.returncode == 0 and changed == 0, proc.stdout
    assert hashes(sandbox) == applied


def test_no_yama_is_not_applicable_and_switches_report_skipped(tmp_path):
    sandbox = tmp_path / "node"
    sandbox_tree(sandbox, yama=False)
    before = hashes(sandbox)
    proc, _changed = play(tmp_path, sandbox, core_dumps_enabled=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = audit(sandbox, core_dumps_enabled=False)
    assert checks["kernel_debug"]["ptrace_scope"]["status"] == "not_applicable"
    assert "no Yama LSM" in checks["kernel_debug"]["ptrace_scope"]["found"]
    assert list(checks["kernel_debug"]) == ["ptrace_scope", "ptrace_attach"]
    assert checks["core_dumps"] == {"enabled": {
        "status": "skipped", "found": "core_dumps_enabled is false on localhost: core dumps are not checked",
        "expected": "core pattern, directory, limits and crash probe checked once core_dumps_enabled is true",
        "fix": ""}}
    assert hashes(sandbox) == before


def test_pipe_pattern_is_refused_before_and_by_the_role(tmp_path):
    sandbox = tmp_path / "node"
    sandbox_tree(sandbox)
    before = hashes(sandbox)
    pipe = "|/lib/systemd/systemd-coredump %P"
    # preflight_settings runs validate before any role: the pattern never reaches a node.
    problems = preflight_core_dumps.validate(role_settings("core_dumps", {"core_dumps_pattern": pipe,
                                                                          "core_dumps_dir": ""}))
    assert [problem["name"] for problem in problems] == ["core_dumps_pattern"]
    assert "pipes cores to a program" in problems[0]["found"]
    # Run on its own, the writer refuses it too, and writes nothing.
    proc, _changed = play(tmp_path, sandbox, core_dumps_pattern=pipe, core_dumps_dir="",
                          kernel_debug_ptrace_scope_enabled=False)
    assert proc.returncode != 0
    assert "pipes cores to /lib/systemd/systemd-coredump" in proc.stdout
    assert hashes(sandbox) == before


@pytest.mark.parametrize("switch", [False, "false"])
def test_ptrace_relaxation_is_opt_in(tmp_path, switch):
    """Secure by default: without kernel_debug_ptrace_scope_enabled nothing is written, and the check says why.
    The switch also works typed as text, the way -e passes it."""
    sandbox = tmp_path / "root"
    sandbox_tree(sandbox, yama=True)
    before = hashes(sandbox)
    proc, _changed = play(tmp_path, sandbox, core_dumps_enabled=False, kernel_debug_ptrace_scope_enabled=switch)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check = audit(sandbox, core_dumps_enabled=False, kernel_debug_ptrace_scope_enabled=switch)[
        "kernel_debug"]["ptrace_scope"]
    assert check["status"] == "skipped" and "kernel_debug_ptrace_scope_enabled is false" in check["found"]
    assert hashes(sandbox) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="the core directory is owned by root")
def test_the_core_directory_follows_no_link_a_user_planted_in_a_world_writable_parent(tmp_path):
    """A user's /var/tmp/cores -> /etc: the role fails naming the link, /etc keeps its mode."""
    sandbox = tmp_path / "node"
    sandbox_tree(sandbox)
    os.makedirs(str(sandbox / "var/tmp"))
    os.chmod(str(sandbox / "var/tmp"), 0o1777)
    os.chmod(str(sandbox / "etc"), 0o755)
    os.symlink(str(sandbox / "etc"), str(sandbox / "var/tmp/cores"))
    os.lchown(str(sandbox / "var/tmp/cores"), 65534, 65534)
    core = {"core_dumps_dir": "/var/tmp/cores", "core_dumps_pattern": "/var/tmp/cores/core-%e.%p.%h.%t",
            "kernel_debug_ptrace_scope_enabled": False}
    for check in (True, False):
        proc, _changed = play(tmp_path, sandbox, check=check, **core)
        assert proc.returncode != 0 and "/var/tmp/cores is a symbolic link" in proc.stdout, proc.stdout[-3000:]
        assert oct(os.stat(str(sandbox / "etc")).st_mode & 0o7777) == "0o755"


def test_bring_up_keeps_a_backup_of_a_file_it_replaces_by_default(tmp_path):
    """Backups are on by default: check (no backup) -> apply (one backup, the old text) -> re-apply (none)."""
    sandbox = tmp_path / "node"
    sandbox_tree(sandbox)
    old = {"etc/sysctl.d/60-preflight-core.conf": "kernel.core_pattern = core\n",
           "etc/sysctl.d/60-preflight-ptrace.conf": "kernel.yama.ptrace_scope = 1\n",
           "etc/security/limits.d/90-preflight-core.conf": "* soft core 0\n"}
    for path, text in old.items():
        (sandbox / path).write_text(text)

    def backups():
        return sorted(os.path.join(directory, name) for directory, _dirs, names in os.walk(str(sandbox))
                      for name in names if name.endswith("~"))

    variables = {"core_dumps_dir": ""}
    proc, changed = play(tmp_path, sandbox, check=True, core_dumps_pattern="core-%e.%p", **variables)
    assert proc.returncode == 0 and changed > 0 and backups() == [], proc.stdout[-3000:]
    proc, changed = play(tmp_path, sandbox, core_dumps_pattern="core-%e.%p", **variables)
    assert proc.returncode == 0 and changed > 0, proc.stdout[-3000:]
    kept = {os.path.relpath(path, str(sandbox)).split(".conf.")[0] + ".conf": open(path).read() for path in backups()}
    assert kept == old
    proc, changed = play(tmp_path, sandbox, core_dumps_pattern="core-%e.%p", **variables)
    assert proc.returncode == 0 and changed == 0 and len(backups()) == len(old)
