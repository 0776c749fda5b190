"""Hard bounds after a kill (module_utils/preflight_node/host/reap.py and its users): a command that left its session,
or that does not die from SIGKILL (a GPU tool stuck in the driver, state D), never holds its caller past its bound;
it is reported and abandoned, and the node call's other capabilities keep their results."""

import os
import signal
import sys
import textwrap
import time

import pytest

from capability_helpers import role_settings
from cluster_preflight.slurm import local as slurm_local
from cluster_preflight.capabilities import gpu_health, nic_discovery
from preflight_node import calls, readers
from preflight_node.host import proc, reap
from preflight_node.host.ops import HUNG_EARLIER_RC, TIMEOUT_RC, NodeOps, run_bounded_command

# The most a bounded command may take past its own timeout: the kill's reap and the last read of its output.
SLACK = 2 * reap.REAP_TIMEOUT + 1.5
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _gone(pid, within=5.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        stat = reap.describe(pid)
        if stat is None:
            return True
        time.sleep(0.05)
    return False


def _pid_in(path, within=5.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError("%s was never written" % path)


@pytest.fixture
def unkillable(monkeypatch):
    """No signal that ends a process (SIGTERM, SIGKILL, ...) reaches anything while the test runs, as for a
    process stuck in the kernel (state D); what the test started is really killed afterwards."""
    real_kill, real_killpg = os.kill, os.killpg
    left = []

    def kill(pid, sig):
        if sig not in (0, signal.SIGCONT):
            left.append(pid)
            return
        real_kill(pid, sig)

    def killpg(pgid, sig):
        if sig not in (0, signal.SIGCONT):
            left.append(-pgid)
            return
        real_killpg(pgid, sig)

    monkeypatch.setattr(os, "kill", kill)
    monkeypatch.setattr(os, "killpg", killpg)
    # Shorter bounds, so the test waits less; what is checked is that the wait ends at them.
    monkeypatch.setattr(reap, "REAP_TIMEOUT", 1.0)
    monkeypatch.setattr(proc, "REAP_TIMEOUT", 1.0)
    yield left
    monkeypatch.undo()
    for pid in left:
        try:
            (real_killpg if pid < 0 else real_kill)(abs(pid), signal.SIGKILL)
        except OSError:
            pass


def test_a_child_that_left_the_session_and_holds_the_output_is_killed_within_the_bound(tmp_path):
    pid_file = tmp_path / "stray.pid"
    started = time.monotonic()
    rc, _out, err = run_bounded_command(["sh", "-c", 'setsid sh -c "echo \\$\\$ > $0; exec sleep 30" & sleep 60',
                                         str(pid_file)], 1)
    took = time.monotonic() - started
    assert rc == TIMEOUT_RC and "killed after 1 s" in err
    assert took < 1 + SLACK, "held %.1f s by a child in another session" % took
    assert _gone(_pid_in(pid_file)), "the child that left the session survived its command's kill"


def test_what_a_command_left_in_another_session_holding_its_output_ends_with_it(tmp_path):
    """It exited, but a child of its own session keeps the pipes open: the wait ends at the bound, not the child's."""
    started = time.monotonic()
    rc, out, _err = run_bounded_command(["sh", "-c", "echo said; setsid sleep 30 & exit 3"], 2)
    assert (rc, out) == (3, "said\n") and time.monotonic() - started < 2 + SLACK


def test_a_child_that_will_not_die_is_reported_with_its_state_and_abandoned(tmp_path, unkillable):
    started = time.monotonic()
    rc, _out, err = run_bounded_command(["sleep", "8"], 1)
    took = time.monotonic() - started
    assert rc == TIMEOUT_RC and took < 1 + SLACK, "waited %.1f s for a child that would not die" % took
    assert "abandoned" in err and "(sleep) in state S" in err, err
    assert unkillable, "the kill was tried"


def test_a_program_that_did_not_die_is_not_run_again_in_the_same_node_call(tmp_path, unkillable):
    tool = tmp_path / "stuck-tool"
    tool.write_text("#!/bin/sh\nexec sleep 8\n")
    tool.chmod(0o755)
    ops = NodeOps(_Module())
    first = ops.run([str(tool)], timeout=1)
    started = time.monotonic()
    again = ops.run([str(tool), "--other"], timeout=1)
    assert first[0] == TIMEOUT_RC and "state S" in first[2]
    assert again[0] == HUNG_EARLIER_RC and time.monotonic() - started < 0.5
    assert "did not die from its kill" in again[2] and str(tool) in again[2]
    # The next call of the run on this node (the probes call) is told too.
    assert NodeOps(_Module(hangs=ops.hangs)).run([str(tool)], timeout=1)[0] == HUNG_EARLIER_RC


def test_a_command_inside_a_command_is_reached_by_the_outer_kill(tmp_path):
    """The outer command (a module) started the inner one in a session of its own (ops.run): killing the outer
    one at its bound kills the inner one's child that left even that session."""
    pid_file = tmp_path / "inner.pid"
    inner = textwrap.dedent("""
        import sys
        from preflight_node.host.ops import run_bounded_command
        run_bounded_command(["sh", "-c", 'setsid sh -c "echo \\\\$\\\\$ > $0; exec sleep 30" & sleep 60', sys.argv[1]],
        100)
    """)
    started = time.monotonic()
    rc, _out, _err = run_bounded_command([sys.executable, "-c", inner, str(pid_file)], 2)
    assert rc == TIMEOUT_RC and time.monotonic() - started < 2 + SLACK
    assert _gone(_pid_in(pid_file)), "the inner command's child outlived the outer command's kill"


def test_the_health_check_budget_kill_reaches_the_sessions_its_node_calls_started(tmp_path):
    """slurm-healthcheck's kill at the end of its budget: ansible-playbook's modules start their commands in
    sessions of their own (ops.run); those go with it, within the bound."""
    pid_file = tmp_path / "inner.pid"
    inner = textwrap.dedent("""
        import sys
        from preflight_node.host.ops import run_bounded_command
        print("module started", flush=True)
        run_bounded_command(["sh", "-c", 'setsid sh -c "echo \\\\$\\\\$ > $0; exec sleep 30" & sleep 60', sys.argv[1]],
        100)
    """)
    started = time.monotonic()
    rc, output = slurm_local.run_bounded([sys.executable, "-c", inner, str(pid_file)], 2, dict(os.environ), ROOT)
    assert rc is None and "module started" in output and time.monotonic() - started < 2 + SLACK
    assert _gone(_pid_in(pid_file)), "a session the health check's modules started outlived its budget"


def test_the_health_check_reports_what_did_not_die_at_its_budget(tmp_path, unkillable):
    started = time.monotonic()
    rc, output = slurm_local.run_bounded(["sleep", "8"], 1, dict(os.environ), ROOT)
    assert rc is None and time.monotonic() - started < 1 + SLACK
    assert "(sleep) in state S" in output and "abandoned" in output


def test_a_hung_gpu_tool_is_that_capabilitys_finding_and_the_others_keep_their_results(tmp_path):
    """nvidia-smi hung in the driver (here: it hangs and its child left the session holding its output): the node
    call ends within the tool's bound, gpu_health says what hung, nic_discovery still has its facts."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nsetsid sleep 30 &\nexec sleep 60\n")
    smi.chmod(0o755)
    node = {"name": "n1", "ansible_host": "127.0.0.1", "node_addr": "127.0.0.1", "user": "root", "ssh_port": 22}
    gpu_args = gpu_health.read_args(role_settings("gpu_health", gpu_health_nvidia_smi=str(smi),
                                                  gpu_health_tool_timeout=1, gpu_health_dcgm_level=0), node)
    nic_args = nic_discovery.read_args(role_settings("nic_discovery"), node)
    started = time.monotonic()
    results, errors, _elapsed = calls.run_all(readers, "read", {"gpu_health": gpu_args, "nic_discovery": nic_args},
                                              NodeOps(_Module()))
    took = time.monotonic() - started
    assert took < 1 + SLACK + 5, "the node call took %.1f s" % took
    assert errors == {}
    assert "timed out after 1 s" in results["gpu_health"]["nvidia"]["error"]
    assert results["nic_discovery"]["nics"], "nic_discovery lost its result to the hung GPU tool"


def test_run_bounded_abandons_a_launcher_that_does_not_die(tmp_path, unkillable):
    stuck = []
    started = time.monotonic()
    rc, timed_out, _elapsed = proc.run_bounded(["sleep", "30"], 0.5, stuck=stuck)
    assert (rc, timed_out) == (None, True)
    assert time.monotonic() - started < 0.5 + proc.KILL_GRACE + proc.KILL_SETTLE + 2 * proc.REAP_TIMEOUT + 1
    assert [item["comm"] for item in stuck] == ["sleep"] and stuck[0]["state"] in "SD"


class _Module(object):
    """What NodeOps reads of the module: the call's ``job`` parameter and get_bin_path."""

    def __init__(self, hangs=None):
        self.params = {"job": {"user": "", "named": False, "python": "", "hangs": hangs or {}}}

    def get_bin_path(self, name, opt_dirs=()):
        import shutil
        return shutil.which(name)
