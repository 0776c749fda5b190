"""Bounded runs leave nothing behind, even members that started their own sessions."""

import os
import sys
import time

from ansible.module_utils import preflight_proc as proc

# A parent that starts a grandchild in a new session (as torchrun does) and sleeps.
SPAWNER = r"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(120)
"""


def _alive(pid):
    stat = proc.proc_stat(pid)
    return stat is not None and stat[0] != "Z"


def test_run_bounded_kills_tree_including_new_sessions(tmp_path):
    pidfile = tmp_path / "child.pid"
    seen = []
    rc, timed_out, elapsed = proc.run_bounded(
        [sys.executable, "-c", SPAWNER, str(pidfile)], timeout=3, marker="test-%d" % os.getpid(),
        on_timeout=lambda pid: seen.append(proc.descendants(pid)))
    assert timed_out and rc is None
    child = int(pidfile.read_text())
    assert seen and child in seen[0], "on_timeout sees the tree before it is killed"
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def test_run_bounded_returns_exit_code_and_output(tmp_path):
    out = tmp_path / "out.log"
    rc, timed_out, _ = proc.run_bounded([sys.executable, "-c", "print('hi'); raise SystemExit(3)"], timeout=30,
                                        stdout_path=str(out))
    assert (rc, timed_out) == (3, False)
    assert out.read_text().strip() == "hi"


def test_marker_finds_orphans(tmp_path):
    marker = "orphan-%d" % os.getpid()
    import subprocess
    env = dict(os.environ, **{proc.MARKER_ENV: marker})
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env,
                              start_new_session=True)
    try:
        assert orphan.pid in proc.pids_with_marker(marker)
        proc.kill_tree(999999999, marker=marker, grace=2)
        orphan.wait(timeout=5)
    finally:
        if orphan.poll() is None:
            orphan.kill()
    assert orphan.returncode is not None


def test_stopped_process_is_killed(tmp_path):
    import signal
    import subprocess
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    os.kill(victim.pid, signal.SIGSTOP)
    proc.kill_tree(victim.pid, grace=1)
    victim.wait(timeout=5)
    assert victim.returncode in (-signal.SIGTERM, -signal.SIGKILL)
