"""Who runs job-side code on a node (module_utils/preflight_node/host/ops.py resolve_job_user): root only when
``preflight_job_user: root`` asks; with no account that can run the training Python, nothing job-side runs and the
node is unverified with the fix, never failed; a deliberate root is acknowledged; a job user who cannot reach the
training Python gets one finding naming the directory that stops it (docs/security.md).  Needs root.
"""

import os
import shutil

import pytest

from attacker_helpers import write_script

from preflight_node.checks import is_blocked, node_status

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching to the job's user needs root")


def _script(directory, body, name="python"):
    return write_script(os.path.join(directory, name), body)


class _Module(object):
    """What a node call needs of an AnsibleModule: params, get_bin_path, exit_json."""

    def __init__(self, capabilities, job):
        self.params = {"capabilities": capabilities, "selftest_error": "", "job": job}
        self.result = None

    def get_bin_path(self, name, opt_dirs=()):
        return shutil.which(name, path=":".join(list(opt_dirs) + [os.environ.get("PATH", "")]))

    def exit_json(self, **kwargs):
        self.result = kwargs


def _marking_python(directory, marker):
    """A training Python that leaves ``marker`` when it runs as root (and then fails)."""
    return _script(directory, '[ "$(id -u)" = 0 ] && echo ran-as-root > "%s"\nexit 1\n' % marker)


def _facts_call(python, job):
    from preflight_node import calls, readers
    args = {"python": python, "backend": "gloo", "nproc_per_node": 0, "cpu_nproc": 2, "master_port": 1,
            "dev_root": "/nonexistent", "sysfs_root": "/nonexistent", "proc_root": "/proc"}
    module = _Module({"allreduce": args}, dict(job, python=python))
    calls.node_call(module, readers, "read", "facts")
    return module.result


def _probes_call(python, job, resolved):
    from preflight_node import calls, probes
    module = _Module({"kernel_debug": {"proc_root": "/proc", "timeout": 5}},
                     dict(job, python=python, resolved=resolved))
    calls.node_call(module, probes, "probe", "probes")
    return module.result


@pytest.fixture
def private_python(public_dir):
    """A training Python under a 0700 directory (a venv under a home directory): ``(python, blocking dir, marker)``;
    it leaves ``marker`` when it runs as root."""
    home = os.path.join(public_dir, "home")
    os.makedirs(os.path.join(home, "venv", "bin"))
    os.chmod(home, 0o700)
    marker = os.path.join(public_dir, "ran-as-root")
    return _marking_python(os.path.join(home, "venv", "bin"), marker), home, marker


def test_no_job_code_runs_as_root_when_no_job_user_is_named_and_nobody_cannot_run_the_python(private_python):
    """Without preflight_job_user: root, neither the torch probe nor the ptrace probe may run a training Python
    nobody cannot run as root instead."""
    python, _home, marker = private_python
    job = {"user": "", "named": False}
    facts = _facts_call(python, job)
    assert not os.path.exists(marker), "the training Python ran as root without preflight_job_user: root"
    _probes_call(python, job, facts["job_user"])
    assert not os.path.exists(marker), "the ptrace probe ran the training Python as root"
    assert facts["job_user"]["run_as"] in (None, "") and facts["job_user"]["how"] == "unavailable"


def test_a_node_without_an_account_for_job_code_is_unverified_with_the_fix_and_its_peers_still_run(private_python):
    from cluster_preflight.capabilities import allreduce as controller
    from cluster_preflight.capabilities import core_dumps, kernel_debug
    python, home, _marker = private_python
    job = {"user": "", "named": False}
    called = _facts_call(python, job)
    facts = called["facts"]["allreduce"]
    checks, ready = controller.readiness("n1", facts, {"allreduce_env": {}})
    found = checks["job_user"]
    assert not ready and is_blocked(found), found
    assert node_status(checks) == "unverified", "a missing job user is the gate's setting, never the node's fault"
    assert "nobody" in found["found"] and "%s (mode 0700" % home in found["found"], found["found"]
    assert "preflight_job_user: root" in found["fix"] and home in found["fix"], found["fix"]
    # One finding: the Python was not run, so it is not also reported as broken.
    assert checks["python"]["status"] == "skipped" and "allreduce.job_user" in checks["python"]["found"]
    assert [name for name, check in checks.items() if check["status"] in ("fail", "warn")] == []
    probes = _probes_call(python, job, called["job_user"])["probes"]
    assert is_blocked(kernel_debug.attach_check("n1", probes["kernel_debug"]))
    healthy = dict(facts, job_user={"name": "pfjob", "uid": 1000, "run_as": "pfjob", "how": "named", "note": ""},
                   not_run="", python_blocked=None, python={"version": "3.11", "executable": python},
                   torch={"version": "2.13.0", "cuda": None, "hip": None, "path": "/x"})
    found = controller.candidates(["n1", "n2"], {"n1": facts, "n2": healthy}, {"n1": {}, "n2": {}})
    assert found["ready"] == ["n2"]
    crash = core_dumps.probe_check({"outcome": "no_job_user", "error": "no account may run job-side code"})
    assert is_blocked(crash)


def test_a_deliberate_root_job_user_is_acknowledged_not_asked_for():
    from cluster_preflight.capabilities.allreduce import job_user_check
    check = job_user_check("n1", {"name": "root", "uid": 0, "run_as": None, "how": "named", "note": ""})
    assert check["status"] == "warn" and "preflight_job_user: root" in check["found"]
    assert "set preflight_job_user" not in check["fix"] and "name the account" in check["fix"], check["fix"]


def test_a_job_user_who_cannot_reach_the_python_gets_one_finding_naming_the_blocking_directory(public_dir):
    """The venv's python is a link to an interpreter under a 0700 directory (a pyenv build under /root):
    the finding names that directory, not the link, and its fix is about access, not about installing torch."""
    home = os.path.join(public_dir, "root")
    os.makedirs(os.path.join(home, "pyenv", "bin"))
    os.chmod(home, 0o700)
    real = _script(os.path.join(home, "pyenv", "bin"), "exit 0\n", name="python3.11")
    venv_bin = os.path.join(public_dir, "venv", "bin")
    os.makedirs(venv_bin)
    os.symlink(real, os.path.join(venv_bin, "python3"))
    python = os.path.join(venv_bin, "python")
    os.symlink("python3", python)
    from cluster_preflight.capabilities import allreduce as controller
    from cluster_preflight.capabilities import kernel_debug
    job = {"user": "nobody", "named": True}
    facts = _facts_call(python, job)
    checks, ready = controller.readiness("n1", facts["facts"]["allreduce"], {"allreduce_env": {}})
    found = checks["python"]["found"]
    assert not ready and checks["python"]["status"] == "fail" and checks["job_user"]["status"] == "pass"
    assert "%s (mode 0700" % home in found and found.count(python) == 1, found
    fix = checks["python"]["fix"]
    assert home in fix
    # Advice never weakens the node: the least-privilege fix leads (a venv from the system interpreter), the
    # narrower ACL names the real account and directory and the package it needs, chmod o+x is advised against,
    # and nothing needs sudo (absent on minimal nodes).
    assert fix.index("/usr/bin/python3 -m venv /opt/venv") < fix.index("setfacl -m u:nobody:x %s" % home)
    assert "apt-get install acl" in fix and "apt-get install python3-venv" in fix
    assert fix.index("Not chmod o+x %s" % home) > fix.index("setfacl")
    assert "<" not in fix and "sudo" not in fix and " on n1" in fix
    attach = kernel_debug.attach_check("n1", _probes_call(python, job, facts["job_user"])["probes"]["kernel_debug"])
    assert is_blocked(attach) and "allreduce.python" in attach["found"], attach


def test_a_training_python_that_is_not_there_is_the_nodes_finding_not_a_missing_account(public_dir):
    """No account could run it: nobody stays the job user and allreduce.python fails saying so (as the Slurm
    hooks drain a node whose node.yml names a Python that is not installed)."""
    from cluster_preflight.capabilities import allreduce as controller
    python = os.path.join(public_dir, "no-such-venv", "bin", "python")
    facts = _facts_call(python, {"user": "", "named": False})
    assert facts["job_user"]["how"] == "auto" and facts["job_user"]["name"] == "nobody"
    checks, ready = controller.readiness("n1", facts["facts"]["allreduce"], {"allreduce_env": {}})
    assert not ready and checks["python"]["status"] == "fail" and "No such file" in checks["python"]["found"]
    named = _facts_call(python, {"user": "nobody", "named": True})
    assert named["job_user"]["python_blocked"] is None

