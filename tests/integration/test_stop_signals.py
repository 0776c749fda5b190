"""One Ctrl-C or one SIGTERM stops a run and leaves no process behind: the gate's command line (a Ctrl-C is SIGINT to
its process group, as a terminal sends it) while its all-reduce runs, and scripts/run-pytest (scripts/test's pytest
step) while a test holds a headless Chromium and a gate in flight.  Each run's processes are found by a mark in
their environment (every child keeps it: ansible-playbook, what it detached, torchrun and the ranks, chromedriver,
chromium); after the stop none is left, and the exit code says what stopped it (130 SIGINT, 143 SIGTERM for the
script).  Real signals, real processes: nothing mocked."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from preflight_node.host.proc import all_pids, cmdline_of, environ_of, proc_stat
from stop_target import LONG_GATE

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON = os.path.join(ROOT, ".venv", "bin", "python")
MARK = "PREFLIGHT_STOP_TEST"
# Seconds a stopped run may take to end (ansible-runner's poll, the cleanup's grace and settle, pytest's teardown).
STOP_BOUND = 45
START_BOUND = 150


def marked(mark):
    found = []
    for pid in all_pids():
        stat = proc_stat(pid)
        if stat is not None and stat[0] != "Z" and environ_of(pid).get(MARK) == mark:
            found.append(pid)
    return found


def running(mark, words):
    """Whether a process of this run has one of ``words`` in its command line."""
    return any(word in " ".join(cmdline_of(pid)) for pid in marked(mark) for word in words)


def start(argv, mark, **env):
    """``argv`` in a session and process group of its own (as a terminal's foreground job), marked."""
    return subprocess.Popen(argv, cwd=ROOT, env=dict(os.environ, **{MARK: mark}, **env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def wait_for(predicate, proc, seconds, what):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            pytest.fail("the run ended before %s (rc %s):\n%s" % (what, proc.returncode, proc.stdout.read()[-3000:]))
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail("no %s within %d s" % (what, seconds))


def stopped(proc, mark):
    """``(rc, output, survivors)`` once ``proc`` ended (bounded), the marked processes still there after it."""
    try:
        output, _ = proc.communicate(timeout=STOP_BOUND)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate(timeout=30)
        pytest.fail("still running %d s after the signal:\n%s" % (STOP_BOUND, output[-3000:]))
    time.sleep(0.5)
    survivors = [" ".join(cmdline_of(pid))[:160] for pid in marked(mark)]
    for pid in marked(mark):
        os.kill(pid, signal.SIGKILL)  # never leave them to the next test, whatever this one says
    return proc.returncode, output, survivors


@pytest.mark.parametrize("number, rc", [(signal.SIGINT, 130), (signal.SIGTERM, 130)])
def test_the_gate_stops_on_the_first_signal_and_leaves_nothing_running(tmp_path, number, rc):
    mark = uuid.uuid4().hex
    proc = start([PYTHON, "-m", "cluster_preflight", "gate", "--results-dir", str(tmp_path / "results"),
                  "-e", json.dumps(LONG_GATE)], mark)
    wait_for(lambda: running(mark, ("allreduce_worker",)), proc, START_BOUND, "rank of the all-reduce")
    started = time.monotonic()
    if number == signal.SIGINT:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground process group
    else:
        proc.send_signal(signal.SIGTERM)  # a scheduler or kill: the process alone
    code, output, survivors = stopped(proc, mark)
    assert code == rc, output[-3000:]
    assert survivors == [], (survivors, output[-3000:])
    assert "INTERRUPTED: the run was interrupted" in output and "exit 130" in output
    assert "Traceback" not in output
    print("stopped in %.1f s" % (time.monotonic() - started))


@pytest.mark.parametrize("number, rc", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_the_test_runner_stops_on_the_first_signal_and_leaves_nothing_running(tmp_path, number, rc):
    mark, ready = uuid.uuid4().hex, tmp_path / "ready"
    proc = start([os.path.join(ROOT, "scripts", "run-pytest"), "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                  os.path.join("tests", "integration", "stop_target.py")], mark, STOP_TARGET_READY=str(ready))
    wait_for(ready.exists, proc, START_BOUND, "browser")
    browser = ready.read_text().strip() == "browser"
    if browser:
        assert running(mark, ("chromedriver",)) and running(mark, ("chromium",))
    wait_for(lambda: running(mark, ("allreduce_worker",)), proc, START_BOUND, "rank of the all-reduce")
    if number == signal.SIGINT:
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    code, output, survivors = stopped(proc, mark)
    assert code == rc, output[-3000:]
    assert survivors == [], (survivors, output[-3000:])
    # pytest itself stopped on it (a KeyboardInterrupt), not the sweep after a kill.
    assert "KeyboardInterrupt" in output, output[-3000:]
    print("browser held: %s" % browser)
