"""The job_env role's bring-up (the memlock limits drop-in) through ansible-playbook on localhost against a sandbox
root: check mode (reports the change, writes nothing, shows the diff) -> apply (changed) -> re-apply (nothing
changed); after each, the node audited as bring-up's audit does (job_env read + decide, no interface facts)."""

import hashlib
import json
import os
import re
import subprocess
import sys

from cluster_preflight.capabilities import job_env as controller
from preflight_node.capabilities import job_env
from capability_helpers import role_settings, write
from fake_ops import FakeOps

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DROPIN = "/etc/security/limits.d/90-preflight-memlock.conf"
PLAYBOOK = """
- name: Run the job_env role against a sandbox root.
  hosts: localhost
  gather_facts: false
  roles:
    - job_env
"""


def sandbox(tmp_path):
    root = tmp_path / "node"
    write(root, "/etc/security/limits.conf", "# site limits\n*  soft  nofile  65536\n")
    write(root, "/etc/pam.d/runuser", "session required pam_limits.so\n")
    os.makedirs(str(root / "etc/security/limits.d"))
    # An RDMA node: bring-up's audit judges memlock where /sys/class/infiniband lists a device.
    os.makedirs(str(root / "sys/class/infiniband/mlx5_0"))
    return root


def hashes(root):
    found = {}
    for directory, _dirs, files in os.walk(str(root)):
        for name in files:
            with open(os.path.join(directory, name), "rb") as handle:
                found[os.path.join(directory, name)] = hashlib.sha256(handle.read()).hexdigest()
    return found


def play(tmp_path, root, check=False, **extra):
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAYBOOK)
    variables = dict({"job_env_root": str(root), "ansible_python_interpreter": sys.executable}, **extra)
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
            "-e", json.dumps(variables), str(playbook)] + (["--check", "--diff"] if check else [])
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    proc = subprocess.run(argv, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    recap = re.search(r"localhost\s+: ok=\d+\s+changed=(\d+).*failed=(\d+)", proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, int(recap.group(1))


def audit(root):
    """memlock as bring-up's audit judges it: job_env's reader on the sandbox, no interface facts."""
    chosen = role_settings("job_env", job_env_root=str(root), job_env_proc_root=str(root / "proc"),
                           job_env_sysfs_root=str(root / "sys"), job_env_master_name="", preflight_job_env={})
    facts = json.loads(json.dumps(job_env.read(controller.read_args(chosen, {"name": "localhost"}), FakeOps())))
    assert facts["memlock"]["session"] is None, "a sandbox root opens no login session"
    return controller.decide("localhost", facts, chosen, cluster={"hosts": ["localhost"], "nodes": {},
                                                                   "facts": {"localhost": facts}, "node_facts": {}})


def test_bring_up_writes_the_memlock_drop_in_check_apply_reapply(tmp_path):
    root = sandbox(tmp_path)
    before = hashes(root)
    assert audit(root)["memlock"]["status"] == "fail"

    proc, changed = play(tmp_path, root, check=True)
    assert changed == 1 and hashes(root) == before, "check mode writes nothing"
    assert "+*          soft  memlock  unlimited" in proc.stdout, "the diff shows the lines it would write"

    proc, changed = play(tmp_path, root)
    assert changed == 1
    with open(str(root) + DROPIN) as handle:
        text = handle.read()
    for line in ("*          soft  memlock  unlimited", "*          hard  memlock  unlimited",
                 "root       soft  memlock  unlimited", "root       hard  memlock  unlimited"):
        assert line in text
    with open(str(root / "etc/security/limits.conf")) as handle:
        assert handle.read() == "# site limits\n*  soft  nofile  65536\n", "foreign files are only read"
    check = audit(root)["memlock"]
    assert check["status"] == "pass", check

    applied = hashes(root)
    _proc, changed = play(tmp_path, root)
    assert changed == 0 and hashes(root) == applied


def test_a_later_file_that_lowers_memlock_is_named_by_the_audit(tmp_path):
    root = sandbox(tmp_path)
    play(tmp_path, root)
    write(root, "/etc/security/limits.d/99-site.conf", "*  hard  memlock  64\n")
    check = audit(root)["memlock"]
    assert check["status"] == "fail" and "99-site.conf" in check["found"], check
    assert "remove or change /etc/security/limits.d/99-site.conf:1" in check["fix"]


def test_a_node_without_rdma_has_no_memlock_to_audit(tmp_path):
    root = sandbox(tmp_path)
    os.rmdir(str(root / "sys/class/infiniband/mlx5_0"))
    assert audit(root)["memlock"]["status"] == "not_applicable"


def test_the_drop_in_switch_writes_nothing(tmp_path):
    root = sandbox(tmp_path)
    before = hashes(root)
    _proc, changed = play(tmp_path, root, job_env_memlock_dropin_enabled=False)
    assert changed == 0 and hashes(root) == before
