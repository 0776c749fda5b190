"""How readers and probes run commands on a node (module_utils/preflight_node/host/ops.py)."""

import os
import time

from preflight_node.host.ops import NOT_FOUND_RC, TIMEOUT_RC, run_bounded_command


def test_output_of_a_command_that_is_slow_to_print_is_kept():
    """run_command loses it when select() waited a second and the command exits just then."""
    rc, out, err = run_bounded_command(["sh", "-c", "sleep 1.2; echo late; echo err >&2"], 10)
    assert (rc, out, err) == (0, "late\n", "err\n")


def test_c_locale_input_and_environment():
    rc, out, _ = run_bounded_command(["sh", "-c", 'cat; echo "$LANG $EXTRA"'], 10, env={"EXTRA": "x"}, data="in\n")
    assert rc == 0 and out == "in\nC x\n"


def test_time_bound_kills_the_command_and_what_it_started(tmp_path):
    marker = tmp_path / "grandchild.pid"
    rc, _out, err = run_bounded_command(["sh", "-c", 'sleep 60 & echo $! > "$0"; wait', str(marker)], 1)
    assert rc == TIMEOUT_RC and "killed after 1 s" in err
    pid = int(marker.read_text())
    deadline = time.monotonic() + 5
    while os.path.exists("/proc/%d" % pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists("/proc/%d" % pid) or open("/proc/%d/stat" % pid).read().split()[2] == "Z"


def test_a_missing_program_is_rc_127_not_an_exception(tmp_path):
    rc, out, err = run_bounded_command([str(tmp_path / "nope")], 5)
    assert rc == NOT_FOUND_RC and out == "" and "nope" in err


def test_a_command_as_another_user_gets_its_ids_and_none_of_roots_environment(monkeypatch):
    import pwd

    import pytest
    if os.geteuid() != 0:
        pytest.skip("switching user needs root")
    monkeypatch.setenv("ROOT_SECRET", "x")
    rc, out, _ = run_bounded_command(["sh", "-c", 'id -u; echo "$HOME ${ROOT_SECRET:-none} $LANG"'], 10,
                                     user="nobody")
    entry = pwd.getpwnam("nobody")
    assert rc == 0 and out.split("\n")[:2] == [str(entry.pw_uid), "%s none C" % entry.pw_dir]
    assert run_bounded_command(["true"], 5, user="no-such-user-here")[0] == NOT_FOUND_RC


# -- a training Python that hangs: waited out once per node call ---------------------------------------

class _Module(object):
    """What NodeOps reads of the module: the call's ``job`` parameter and get_bin_path."""

    def __init__(self, python):
        self.params = {"job": {"user": "", "named": False, "python": python}}

    def get_bin_path(self, name, opt_dirs=()):
        import shutil
        return shutil.which(name)


def _hanging_python():
    """A training Python whose start-up never returns (a sitecustomize importing a torch that blocks in
    driver init, a hung file system under the venv): it sleeps.  In a directory every user can reach, as
    the job user (nobody, when the tests run as root) must be able to start it for it to hang."""
    import tempfile
    directory = tempfile.mkdtemp(prefix="hung-python-", dir="/tmp")
    os.chmod(directory, 0o755)
    path = os.path.join(directory, "python")
    with open(path, "w") as handle:
        handle.write("#!/bin/sh\nexec sleep 30\n")
    os.chmod(path, 0o755)
    return path


def test_a_watched_program_that_hung_is_not_run_again_in_the_same_call():
    import shutil

    from preflight_node.host.ops import HUNG_EARLIER_RC, NodeOps, hang_of
    python = _hanging_python()
    try:
        ops = NodeOps(_Module(python))
        started = time.monotonic()
        assert ops.run([python, "-c", "pass"], timeout=0.5)[0] == TIMEOUT_RC
        first = time.monotonic() - started
        started = time.monotonic()
        rc, out, err = ops.run([python, "-c", "other"], timeout=5, user="nobody")
        again = time.monotonic() - started
        assert rc == HUNG_EARLIER_RC and out == "" and "%s hung for 0.5 s earlier in this call" % python in err
        assert first >= 0.5 and again < 0.05
        assert hang_of(ops, python)["seconds"] == 0.5 and hang_of(object(), python) is None
        # Programs other than the training Python are not remembered: ssh may time out toward one peer only.
        assert [ops.run(["sleep", "5"], timeout=0.2)[0] for _ in range(2)] == [TIMEOUT_RC, TIMEOUT_RC]
        assert NodeOps(_Module(python)).hangs == {}, "a new node call starts afresh"
    finally:
        shutil.rmtree(os.path.dirname(python))


def _node_call(ops, python, monkeypatch):
    """What one healthcheck node call does with the training Python: choose the job user, the allreduce
    reader, the ptrace probe; then the controller's deciders.  Returns (seconds, checks)."""
    from cluster_preflight.capabilities import allreduce as controller_ar
    from preflight_node.capabilities import allreduce as ar
    from cluster_preflight.capabilities import kernel_debug as controller_kd
    from preflight_node.capabilities import kernel_debug_probe as kd
    from preflight_node.host import ops as pn
    monkeypatch.setattr(pn, "JOB_USER_PROBE_TIMEOUT", 1)
    monkeypatch.setattr(ar, "PROBE_TIMEOUT", 1)
    started = time.monotonic()
    # As root the job user is named (root runs no job code unless asked): the reader and the probe run it.
    as_root = os.geteuid() == 0
    job = pn.resolve_job_user({"user": "nobody" if as_root else "", "named": as_root, "python": python}, ops)
    ops.job, ops.job_user = job, job["run_as"]
    facts = ar.read({"python": python, "backend": "gloo", "nproc_per_node": 0, "cpu_nproc": 1, "master_port": 1,
                     "dev_root": "/nonexistent", "sysfs_root": "/nonexistent", "proc_root": "/proc"}, ops)
    probe = kd.probe({"proc_root": "/proc", "timeout": 1}, ops)
    seconds = time.monotonic() - started
    checks, ready = controller_ar.readiness("n1", facts, {"allreduce_env": {}})
    attach = controller_kd.attach_check("n1", probe)
    return seconds, dict(checks, ptrace_attach=attach), ready


def test_a_hung_training_python_is_waited_out_once_and_the_checks_after_it_are_blocked(monkeypatch):
    import shutil

    from preflight_node.checks import is_blocked
    from preflight_node.host.ops import NodeOps
    python = _hanging_python()
    try:
        once, checks, ready = _node_call(NodeOps(_Module(python)), python, monkeypatch)
        each, old_checks, _ = _node_call(NodeOps(_Module(python), watch=()), python, monkeypatch)
    finally:
        shutil.rmtree(os.path.dirname(python))
    bounds = 2  # the allreduce reader, then the ptrace probe
    print("\nhung training Python, %d bounds of 1 s in one node call: %.2f s remembered, %.2f s waited each time"
          % (bounds, once, each))
    assert once < 1.5 and each >= bounds - 0.1
    assert not ready and checks["python"]["status"] == "fail"
    assert "%s on n1 hung: no answer in 1 s" % python in checks["python"]["found"]
    assert "py-spy dump" in checks["python"]["fix"] and "preflight_training_python" in checks["python"]["fix"]
    attach = checks["ptrace_attach"]
    assert is_blocked(attach) and attach["found"] == "not checked: %s hung for 1 s earlier (allreduce.python)" % python
    assert old_checks["ptrace_attach"]["status"] == "fail", "without the memory the probe waits and fails again"


def test_the_runs_next_call_on_the_node_takes_the_job_user_and_the_hang_from_the_facts_call():
    """The probes call gets what the facts call resolved (``job.resolved``) and what hung there
    (``job.hangs``): it neither resolves the job user again nor waits for the hung Python a second time."""
    import shutil

    from preflight_node.host.ops import HUNG_EARLIER_RC, NodeOps, resolve_job_user
    python = _hanging_python()
    try:
        facts_call = NodeOps(_Module(python))
        assert facts_call.run([python, "-c", "pass"], timeout=0.3)[0] == TIMEOUT_RC
        resolved = {"name": "root", "uid": 0, "run_as": None, "how": "unavailable", "note": "nobody: it hung"}
        module = _Module(python)
        module.params["job"].update(resolved=resolved, hangs=facts_call.hangs)
        probes_call = NodeOps(module)
        started = time.monotonic()
        assert resolve_job_user(module.params["job"], probes_call) == resolved
        assert probes_call.run([python, "-c", "probe"], timeout=5)[0] == HUNG_EARLIER_RC
        assert time.monotonic() - started < 0.1
        # A hang of another program is not taken over (only the training Python is watched).
        module.params["job"]["hangs"] = {"/usr/bin/ssh": {"program": "/usr/bin/ssh", "seconds": 1, "user": "x"}}
        assert NodeOps(module).hangs == {}
    finally:
        shutil.rmtree(os.path.dirname(python))
