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



@pytest.mark.parametrize("job, forged", [
    # No job user named, root: the node's own choice is nobody; the forwarded one says "stay root".
    ({"user": "", "named": False}, {"how": "auto", "name": "nobody", "uid": 0, "run_as": None, "note": ""}),
    # A named account; the forwarded one keeps its name and drops the switch.
    ({"user": "nobody", "named": True}, {"how": "named", "name": "nobody", "uid": 65534, "run_as": None,
                                         "note": ""}),
    # A resolution the node never gives.
    ({"user": "", "named": False}, {"how": "connecting", "name": "root", "uid": 0, "run_as": None, "note": ""}),
])
def test_a_forwarded_job_user_that_contradicts_the_node_s_own_settings_never_runs_job_code_as_root(public_dir, job,
                                                                                                    forged):
    """The probes call takes the facts call's resolution back from the controller: the node checks it against its
    own settings, and one that would run job-side code as root is refused (the node's own is used)."""
    marker = os.path.join(public_dir, "ran-as-root")
    python = _marking_python(public_dir, marker)
    from preflight_node.host.ops import resolve_job_user
    forged = dict(forged, python=python)
    from preflight_node.host.ops import NO_JOB_USER, NodeOps, job_account
    resolved = resolve_job_user(dict(job, python=python, resolved=forged), NodeOps(_Module({}, job)))
    # nobody, or no account at all (this Python fails as nobody): never this module's own user, root.
    assert job_account(resolved) in ("nobody", NO_JOB_USER) and "contradicts" in resolved["forwarded_refused"], \
        resolved
    _probes_call(python, job, forged)
    assert not os.path.exists(marker), "a forwarded resolution ran the training Python as root"


def test_a_forwarded_resolution_that_agrees_is_taken_as_it_is():
    from preflight_node.host.ops import resolve_job_user
    agreed = {"how": "auto", "name": "nobody", "uid": __import__("pwd").getpwnam("nobody").pw_uid,
              "run_as": "nobody", "note": "", "python": "/nonexistent/python"}
    assert resolve_job_user({"user": "", "named": False, "python": "/nonexistent/python", "resolved": agreed},
                            None) == agreed
    refused = {"how": "unavailable", "name": "root", "uid": 0, "run_as": None, "note": "nobody cannot"}
    assert resolve_job_user({"user": "", "named": False, "python": "/x", "resolved": refused}, None) == refused


@pytest.mark.parametrize("run_as, job, problem", [
    ("", {"user": "", "named": False}, "names no account"),
    ("root", {"user": "", "named": False}, "only with preflight_job_user: root"),
    ("root", {"user": "nobody", "named": True}, "this node's settings name nobody"),
    ("daemon", {"user": "nobody", "named": True}, "this node's settings name nobody"),
    ("nobody", {"user": "", "named": False}, None),
    ("nobody", {"user": "nobody", "named": True}, None),
    ("root", {"user": "root", "named": True}, None),
    ("nobody", {}, "no job settings"),
])
def test_ranks_always_name_their_account_and_root_only_when_preflight_job_user_names_it(run_as, job, problem):
    from preflight_node.allreduce_run.gate_run import MODULE_SPEC, check_params
    from preflight_node.srun_task import with_defaults
    params = with_defaults(MODULE_SPEC, {"python": "/usr/bin/python3", "worker_source": "", "nnodes": 1,
                                         "node_rank": 0, "nproc_per_node": 1, "master_addr": "127.0.0.1",
                                         "run_as": run_as, "job": job})
    found = check_params(params)
    if problem is None:
        assert found == [], found
    else:
        assert any(problem in item for item in found), found


@pytest.fixture
def personal_torch(public_dir, monkeypatch):
    """nobody with a home of its own (``HOME`` as the job's environment gives it) holding a fake torch in its user
    site directory (``~/.local/lib/python3.X/site-packages``) that leaves a marker when imported: ``marker``."""
    import pwd
    import sys
    nobody = pwd.getpwnam("nobody")
    home = os.path.join(public_dir, "home-nobody")
    marker = os.path.join(public_dir, "fake-torch-imported")
    version = "python%d.%d" % sys.version_info[:2]
    system = __import__("subprocess").run(["/usr/bin/python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                          capture_output=True, text=True, check=True).stdout.strip()
    for minor in {version, "python" + system}:
        torch = os.path.join(home, ".local", "lib", minor, "site-packages", "torch")
        os.makedirs(os.path.join(torch, "distributed"))
        for name in ("__init__.py", os.path.join("distributed", "__init__.py"), os.path.join("distributed", "run.py")):
            with open(os.path.join(torch, name), "w") as handle:
                handle.write("open(%r, 'a').write('imported\\n')\n" % marker)
        with open(os.path.join(torch, "version.py"), "w") as handle:
            handle.write("__version__ = '9.9.9'\ncuda = None\n")
    for top, dirs, files in os.walk(home):
        for name in dirs + files:
            os.chown(os.path.join(top, name), nobody.pw_uid, nobody.pw_gid)
    os.chown(home, nobody.pw_uid, nobody.pw_gid)
    with open(marker, "w"):
        pass
    os.chmod(marker, 0o666)
    os.truncate(marker, 0)
    real = pwd.getpwnam

    def getpwnam(name):
        entry = real(name)
        if name != "nobody":
            return entry
        return pwd.struct_passwd((entry.pw_name, entry.pw_passwd, entry.pw_uid, entry.pw_gid, entry.pw_gecos, home,
                                  entry.pw_shell))
    from preflight_node.host import ops
    monkeypatch.setattr(ops.pwd, "getpwnam", getpwnam)
    return marker


def test_the_job_user_s_site_directory_never_answers_for_the_training_environment(personal_torch):
    """The training Python is the system's (no torch); nobody's ~/.local holds a fake one.  The torch probe runs
    isolated (-I): it finds no torch, so the node cannot pass on it."""
    from cluster_preflight.capabilities import allreduce as controller
    facts = _facts_call("/usr/bin/python3", {"user": "nobody", "named": True})
    assert facts["job_user"]["run_as"] == "nobody"
    found = facts["facts"]["allreduce"]
    assert found["torch"] is None, found["torch"]
    assert open(personal_torch).read() == "", "the torch probe imported the job user's own torch"
    checks, ready = controller.readiness("n1", found, {"allreduce_env": {}})
    assert not ready and checks["torch"]["status"] == "fail", checks


def test_the_ranks_never_import_from_the_job_user_s_site_directory(personal_torch, public_dir):
    """torchrun and its ranks run without user site directories (-s, PYTHONNOUSERSITE=1): nobody's fake torch is
    never imported, so it cannot report a bandwidth for the node."""
    import uuid
    from preflight_node.allreduce_run import gate_run
    params = {name: spec.get("default") for name, spec in gate_run.ARGUMENT_SPEC.items()}
    params.update(python="/usr/bin/python3", worker_source="# the worker\n", nnodes=1, node_rank=0, nproc_per_node=1,
                  master_addr="127.0.0.1", timeout=5.0, hard_timeout=20.0, stack_budget=0.0, run_as="nobody",
                  role="n1", scratch_dir=public_dir)
    result = gate_run.bounded_run(params, "n1", uuid.uuid4().hex)
    assert open(personal_torch).read() == "", "the ranks imported the job user's own torch"
    assert result["argv"][:2] == ["/usr/bin/python3", "-s"], result["argv"]
    assert "No module named 'torch'" in result["log"], result["log"][-2000:]
