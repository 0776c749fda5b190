"""The gate's per-node run lock (module_utils/preflight_node/host/lock.py): held, busy, stale, released; and what the
verdict makes of it.  Real files and flock in a temporary lock directory; real processes for a dead run's
leftovers."""

import multiprocessing
import os
import subprocess
import sys
import time

import pytest

from preflight_node.host import lock
from cluster_preflight.verdict.accounting import lock_checks


def args(directory, run_id="ctl:100:5", live=None, lease=600, controller="ctl"):
    return {"dir": str(directory), "run_id": run_id, "controller": controller, "controller_pid": 100,
            "controller_start": "5", "user": "op", "lease_seconds": lease,
            "live_runs": [run_id] if live is None else live}


def test_a_free_node_is_held_and_the_lease_says_by_whom(tmp_path):
    taken = lock.acquire(args(tmp_path), now=1000.0)
    assert taken["state"] == "held" and taken["took_over"] is None
    assert taken["path"] == lock.lease_path(str(tmp_path))
    assert taken["lease"] == {"run_id": "ctl:100:5", "controller": "ctl", "controller_pid": 100,
                              "controller_start": "5", "user": "op", "since": 1000.0, "expires": 1600.0}
    # The same run again (a later call of it) keeps its own lease, since when it first took it.
    again = lock.acquire(args(tmp_path), now=1100.0)
    assert again["state"] == "held" and again["lease"]["since"] == 1000.0


def test_a_second_live_run_finds_the_node_busy_and_leaves_the_first_untouched(tmp_path):
    first = lock.acquire(args(tmp_path), now=1000.0)
    second = lock.acquire(args(tmp_path, run_id="ctl:200:9", live=["ctl:100:5", "ctl:200:9"]), now=1010.0)
    assert second["state"] == "busy" and second["lease"] == first["lease"]
    assert "run ctl:100:5 from controller ctl" in second["why"] and "pid 100" in second["why"]
    with open(first["path"], encoding="utf-8") as handle:
        assert '"run_id": "ctl:100:5"' in handle.read()
    # Another controller cannot tell whether that run lives: only the lease's expiry frees the node.
    other = lock.acquire(args(tmp_path, run_id="far:7:1", live=["far:7:1"], controller="far"), now=1500.0)
    assert other["state"] == "busy"


@pytest.mark.parametrize("case, now, live", [
    ("expired", 1601.0, ["ctl:100:5", "ctl:200:9"]),
    ("dead controller run", 1010.0, ["ctl:200:9"]),
])
def test_a_stale_lease_is_taken_over(tmp_path, case, now, live):
    lock.acquire(args(tmp_path), now=1000.0)
    taken = lock.acquire(args(tmp_path, run_id="ctl:200:9", live=live), now=now)
    assert taken["state"] == "held", case
    assert taken["took_over"]["run_id"] == "ctl:100:5"
    assert ("expired" in taken["took_over"]["why"]) is (case == "expired")
    assert ("no longer runs" in taken["took_over"]["why"]) is (case != "expired")
    assert taken["lease"]["run_id"] == "ctl:200:9" and taken["lease"]["since"] == now


def test_taking_over_ends_what_the_dead_run_left_on_the_node(tmp_path):
    env = dict(os.environ, **{lock.RUN_ENV: "ctl:100:5"})
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env,
                                start_new_session=True)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        lock.acquire(args(tmp_path), now=1000.0)
        taken = lock.acquire(args(tmp_path, run_id="ctl:200:9", live=["ctl:200:9"]), now=1010.0)
        assert leftover.pid in taken["ended"] and bystander.pid not in taken["ended"]
        assert leftover.wait(timeout=10) is not None
        assert bystander.poll() is None, "a process of no run is never touched"
    finally:
        for proc in (leftover, bystander):
            proc.kill()
            proc.wait()


def test_release_removes_only_this_runs_lease(tmp_path):
    lock.acquire(args(tmp_path), now=1000.0)
    refused = lock.release({"dir": str(tmp_path), "run_id": "ctl:200:9"})
    assert refused["released"] is False and "ctl:100:5" in refused["why"]
    done = lock.release({"dir": str(tmp_path), "run_id": "ctl:100:5"})
    assert done["released"] is True and not os.path.exists(done["path"])
    assert lock.release({"dir": str(tmp_path), "run_id": "ctl:100:5"})["why"] == "no lease on this node"
    assert os.listdir(tmp_path) == [], "nothing left behind"


def test_a_lock_directory_that_cannot_be_used_is_an_error_not_a_crash(tmp_path):
    taken = lock.acquire(args(tmp_path / "missing" / "locks"))
    assert taken["state"] == "error" and "No such file" in taken["why"]


def _race(directory, run_id, start, queue):
    while time.time() < start:
        time.sleep(0.001)
    queue.put((run_id, lock.acquire(args(directory, run_id=run_id, live=["ctl:1:1", "ctl:2:2"]))["state"]))


def test_two_runs_taking_a_node_at_the_same_moment_get_one_each_never_both(tmp_path):
    queue = multiprocessing.Queue()
    start = time.time() + 0.3
    procs = [multiprocessing.Process(target=_race, args=(str(tmp_path), run_id, start, queue))
             for run_id in ("ctl:1:1", "ctl:2:2")]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(10)
    states = sorted(state for _run, state in (queue.get(timeout=5) for _ in procs))
    assert states == ["busy", "held"]


def test_the_verdict_reports_a_busy_node_blocked_with_who_holds_it_and_a_take_over_as_a_note():
    busy = {"lock": {"state": "busy", "path": "/run/lock/cluster-preflight.n1.lease",
                     "why": "run ctl:100:5 from controller ctl (ansible-playbook pid 100, as op), holding it since "
                            "2026-11-25T10:00:00Z until at most 2026-11-25T10:40:00Z"}}
    checks = {}
    why = lock_checks("n1", busy, checks)
    assert "another preflight run holds it" in why
    found = checks[("preflight", "busy")]
    assert found["status"] == "skipped" and found["details"]["blocked"] and "ctl:100:5" in found["found"]
    assert "since 2026-11-25T10:00:00Z" in found["found"] and found["fix"]
    checks = {}
    assert lock_checks("n1", {"lock": {"state": "held", "path": "/run/lock/x", "ended": [4, 5],
                                       "took_over": {"run_id": "ctl:9:9", "why": "its lease expired at T"}}},
                       checks) == ""
    assert checks[("preflight", "lock")]["status"] == "pass" and "ended 2 process(es)" in \
        checks[("preflight", "lock")]["found"]
    checks = {}
    lock_checks("n1", {"lock": {"state": "error", "path": "/nope/x", "why": "/nope/x: No such file"}}, checks)
    assert checks[("preflight", "lock")]["status"] == "warn" and "preflight_lock_dir" in \
        checks[("preflight", "lock")]["fix"]
    assert lock_checks("n1", {"facts": {}}, {}) == ""
