"""The kernel_debug and core_dumps roles through ansible-playbook on localhost, against a sandbox
root: check mode (drift, nothing written) -> apply (changed) -> re-apply (nothing changed)."""

import hashlib
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK = """
- name: Run the kernel roles against a sandbox root.
  hosts: localhost
  gather_facts: false
  roles:
    - kernel_debug
    - core_dumps
  post_tasks:
    - name: Save the published checks.
      ansible.builtin.copy:
        content: "{{ {'kernel_debug': kernel_debug_checks, 'core_dumps': core_dumps_checks} | to_json }}"
        dest: "{{ out }}"
        mode: "0644"
      check_mode: false
      changed_when: false
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


def play(tmp_path, sandbox, check=False, **extra):
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAYBOOK)
    out = tmp_path / "checks.json"
    if out.exists():
        out.unlink()
    variables = {
        "out": str(out), "ansible_python_interpreter": sys.executable,
        "kernel_debug_sysctl_root": str(sandbox), "core_dumps_root": str(sandbox),
        "core_dumps_probe_enabled": False, "core_dumps_drift_policy": "fail",
        "kernel_debug_ptrace_scope_enabled": True,
    }
    variables.update(extra)
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
            "-e", json.dumps(variables), str(playbook)]
    if check:
        argv += ["--check", "--diff"]
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    proc = subprocess.run(argv, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    recap = re.search(r"localhost\s+: ok=\d+\s+changed=(\d+).*failed=(\d+)", proc.stdout)
    checks = json.loads(out.read_text()) if out.exists() else None
    return proc, (int(recap.group(1)) if recap else None), checks


@pytest.mark.skipif(os.geteuid() != 0, reason="the core directory is owned by root")
def test_roles_check_apply_reapply(tmp_path):
    sandbox = tmp_path / "node"
    sandbox_tree(sandbox)
    before = hashes(sandbox)

    proc, changed, checks = play(tmp_path, sandbox, check=True, core_dumps_dir="/var/cores",
                                 core_dumps_pattern="/var/cores/core-%e.%p.%h.%t")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert changed > 0
    assert hashes(sandbox) == before, "check mode must write nothing"
    kernel, core = checks["kernel_debug"], checks["core_dumps"]
    assert kernel["ptrace_scope"]["status"] == "warn" and kernel["ptrace_scope"]["found"] == "running 1"
    assert core["core_pattern"]["status"] == "fail"
    assert "/var/crash" in core["core_pattern"]["found"]
    assert core["core_dir"]["status"] == "fail" and "does not exist" in core["core_dir"]["found"]
    assert core["core_limits"]["status"] == "fail"
    assert core["core_probe"]["status"] == "skipped"

    proc, changed, checks = play(tmp_path, sandbox, core_dumps_dir="/var/cores",
                                 core_dumps_pattern="/var/cores/core-%e.%p.%h.%t")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert changed > 0
    statuses = {name: result["status"] for role in checks.values() for name, result in role.items()}
    assert {status for name, status in statuses.items() if name != "core_probe"} == {"pass"}, statuses
    assert oct(os.stat(str(sandbox / "var/cores")).st_mode & 0o7777) == "0o1777"
    with open(str(sandbox / "proc/sys/kernel/core_pattern")) as handle:
        assert handle.read() == "/var/cores/core-%e.%p.%h.%t"
    with open(str(sandbox / "etc/sysctl.conf")) as handle:
        assert handle.read() == "# site settings\nvm.swappiness = 10\n"

    applied = hashes(sandbox)
    proc, changed, _checks = play(tmp_path, sandbox, core_dumps_dir="/var/cores",
                                  core_dumps_pattern="/var/cores/core-%e.%p.%h.%t")
    assert proc.returncode == 0 and changed == 0, proc.stdout
    assert hashes(sandbox) == applied


def test_no_yama_is_not_applicable_and_switches_report_skipped(tmp_path):
    sandbox = tmp_path / "node"
    sandbox_tree(sandbox, yama=False)
    before = hashes(sandbox)
    proc, _changed, checks = play(tmp_path, sandbox, core_dumps_enabled=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert checks["kernel_debug"]["ptrace_scope"]["status"] == "not_applicable"
    assert "no Yama LSM" in checks["kernel_debug"]["ptrace_scope"]["found"]
    assert checks["core_dumps"] == {"core_dumps": {
        "status": "skipped", "found": "core_dumps_enabled is false", "expected": "", "fix": ""}}
    assert hashes(sandbox) == before


def test_pipe_pattern_is_refused_by_the_role(tmp_path):
    sandbox = tmp_path / "node"
    sandbox_tree(sandbox)
    proc, _changed, checks = play(tmp_path, sandbox, core_dumps_pattern="|/lib/systemd/systemd-coredump %P")
    assert proc.returncode != 0
    assert "pipes cores to a program" in proc.stdout
    assert checks is None


def test_ptrace_relaxation_is_opt_in(tmp_path):
    """Secure by default: without kernel_debug_ptrace_scope_enabled nothing is written, and the check says why."""
    sandbox = tmp_path / "root"
    sandbox_tree(sandbox, yama=True)
    before = hashes(sandbox)
    proc, _changed, checks = play(tmp_path, sandbox, core_dumps_enabled=False,
                                  kernel_debug_ptrace_scope_enabled=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check = checks["kernel_debug"]["ptrace_scope"]
    assert check["status"] == "skipped" and "kernel_debug_ptrace_scope_enabled is false" in check["found"]
    assert hashes(sandbox) == before
