"""Bounded runs leave nothing behind, even members that started their own sessions."""

import os
import sys
import time

from preflight_node.host import proc

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


def _wait_dead(pid, seconds=5):
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def _wait_file(path, seconds=10):
    deadline = time.monotonic() + seconds
    while not (path.exists() and path.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return int(path.read_text())


# A parent whose child calls setsid() itself and leaves a grandchild behind:
# the grandchild is in another session and re-parented away from the tree.
DETACHER = r"""
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open(sys.argv[1] + ".tmp", "w").write(str(os.getpid()))
        os.rename(sys.argv[1] + ".tmp", sys.argv[1])
        time.sleep(120)
        os._exit(0)
    os._exit(0)
time.sleep(120)
"""


def test_kill_tree_finds_a_member_that_changed_session_and_parent_by_marker(tmp_path):
    import subprocess
    marker = "setsid-%d" % os.getpid()
    pidfile = tmp_path / "grandchild.pid"
    parent = subprocess.Popen([sys.executable, "-c", DETACHER, str(pidfile)],
                              env=dict(os.environ, **{proc.MARKER_ENV: marker}), start_new_session=True)
    try:
        grandchild = _wait_file(pidfile)
        assert os.getsid(grandchild) != os.getsid(parent.pid), "it runs in a session of its own"
        assert grandchild not in proc.descendants(parent.pid), "parentage alone cannot find it"
        killed = proc.kill_tree(parent.pid, marker=marker, grace=2)
        assert grandchild in killed and parent.pid in killed
        assert _wait_dead(grandchild)
        parent.wait(timeout=5)
    finally:
        if parent.poll() is None:
            parent.kill()


def test_run_bounded_kills_the_tree_when_a_callback_raises(tmp_path):
    import pytest
    pidfile = tmp_path / "child.pid"

    def poll(pid):
        if pidfile.exists() and pidfile.read_text():
            raise RuntimeError("a bug in the caller")

    with pytest.raises(RuntimeError):
        proc.run_bounded([sys.executable, "-c", SPAWNER, str(pidfile)], timeout=60, marker="raise-%d" % os.getpid(),
                         poll=poll)
    assert _wait_dead(int(pidfile.read_text()))


def test_sigterm_interrupts_run_bounded_and_kills_the_tree(tmp_path):
    import pytest
    import signal
    import threading
    pidfile = tmp_path / "child.pid"
    before = signal.getsignal(signal.SIGTERM)

    def terminate_when_started():
        _wait_file(pidfile)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=terminate_when_started, daemon=True).start()
    start = time.monotonic()
    with pytest.raises(proc.Interrupted) as caught:
        with proc.interruptible():
            proc.run_bounded([sys.executable, "-c", SPAWNER, str(pidfile)], timeout=60,
                             marker="sigterm-%d" % os.getpid())
    assert caught.value.signal_name == "SIGTERM"
    assert time.monotonic() - start < 30, "the signal, not the timeout, ended it"
    assert _wait_dead(int(pidfile.read_text()))
    assert signal.getsignal(signal.SIGTERM) is before, "the previous handler is back"


# A caller that starts a guard and a marked tree in another session, then waits to be killed.
GUARDED_CALLER = r"""
import os, subprocess, sys, time
from preflight_node.host import proc
marker, scratch, pidfile, release = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "release"
with proc.Guard(marker, cleanup=[scratch]):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             env=dict(os.environ, **{proc.MARKER_ENV: marker}), start_new_session=True)
    open(pidfile + ".tmp", "w").write(str(child.pid))
    os.rename(pidfile + ".tmp", pidfile)
    if not release:
        time.sleep(120)
"""
MODULE_UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                            "module_utils")


def _guarded_caller(tmp_path, mode):
    import subprocess
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "file").write_text("x")
    pidfile = tmp_path / "child.pid"
    marker = "guard-%s-%d" % (mode, os.getpid())
    caller = subprocess.Popen([sys.executable, "-c", GUARDED_CALLER, MODULE_UTILS, marker, str(scratch),
                               str(pidfile), mode], start_new_session=True)
    return caller, scratch, _wait_file(pidfile), marker


def test_guard_kills_the_tree_and_removes_scratch_when_its_caller_is_killed(tmp_path):
    import signal
    caller, scratch, child, _marker = _guarded_caller(tmp_path, "die")
    try:
        # What async_wrapper does when the async time runs out: SIGKILL to the caller's process group.
        os.killpg(caller.pid, signal.SIGKILL)
        caller.wait(timeout=5)
        assert _wait_dead(child, 10), "the guard killed the tree in its own session"
        deadline = time.monotonic() + 5
        while scratch.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not scratch.exists(), "the guard removed the scratch directory"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def test_released_guard_leaves_everything_to_its_caller(tmp_path):
    import signal
    caller, scratch, child, marker = _guarded_caller(tmp_path, "release")
    try:
        assert caller.wait(timeout=10) == 0
        time.sleep(0.5)
        assert _alive(child) and (scratch / "file").exists()
        assert not [pid for pid in proc.all_pids() if marker in proc.cmdline_of(pid)], "the guard exited"
    finally:
        os.kill(child, signal.SIGKILL)


# Stands in for py-spy: "dump --pid P [--nonblocking]"; sleeps as long as delay.<P> says.
FAKE_PY_SPY = r"""#!{python}
import os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
pid = sys.argv[sys.argv.index("--pid") + 1]
open(os.path.join(here, "spy.%s" % pid), "w").write(str(os.getpid()))
try:
    delay = float(open(os.path.join(here, "delay.%s" % pid)).read())
except OSError:
    delay = 0
time.sleep(delay)
print("Thread %s (idle): MainThread nonblocking=%s" % (pid, "--nonblocking" in sys.argv))
"""


def fake_py_spy(directory, delays):
    directory.mkdir(exist_ok=True)
    path = directory / "py-spy"
    path.write_text(FAKE_PY_SPY.replace("{python}", sys.executable))
    path.chmod(0o755)
    for pid, delay in delays.items():
        (directory / ("delay.%s" % pid)).write_text(str(delay))
    return str(path)


def test_py_spy_dumps_run_in_parallel_within_one_budget(tmp_path):
    spy_dir = tmp_path / "spy"
    py_spy = fake_py_spy(spy_dir, {101: 1.0, 102: 1.0, 103: 1.0, 104: 60})
    start = time.monotonic()
    dumps = proc.py_spy_dump_all({101: False, 102: False, 103: True, 104: False}, py_spy, budget=2.5)
    elapsed = time.monotonic() - start
    # One after another the three quick ones alone would take 3 s, past the budget.
    assert elapsed < 3.5, elapsed
    for pid in (101, 102, 103):
        assert dumps[pid][0] is True and "Thread %d" % pid in dumps[pid][1], dumps[pid]
    assert "nonblocking=True" in dumps[103][1] and "nonblocking=False" in dumps[101][1]
    assert dumps[104] == (False, "py-spy dump did not finish within the 2.5 s stack budget")
    assert _wait_dead(int((spy_dir / "spy.104").read_text()), 3), "the late dump was killed, not left running"


def test_py_spy_missing_binary_is_reported_not_raised(tmp_path):
    dumps = proc.py_spy_dump_all({101: False}, str(tmp_path / "no-such-py-spy"), budget=5)
    assert dumps[101][0] is True and "py-spy could not run" in dumps[101][1]
