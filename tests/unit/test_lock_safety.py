"""The run lock as a local account would attack it (module_utils/preflight_node/host/lock.py,
preflight_node/host/state_dir.py,
cluster_preflight/stages/run_lock.py): a lock directory another account owns or may write, a planted link, a lease file
of
another owner, a lease that is no lease, a foreign flock, a controller that vanished; and how the verdict says so.
Real files, real flock, a real unprivileged account (nobody) where the kernel's permission checks are the point."""

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time

import pytest

from preflight_node.host import lock

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: another account's files are made with chown")
NOBODY = 65534


def args(directory, run_id="ctl:100:5", live=None, lease=600, controller="ctl", **more):
    return dict({"dir": str(directory), "run_id": run_id, "controller": controller, "controller_pid": 100,
                 "controller_start": "5", "user": "op", "lease_seconds": lease,
                 "live_runs": [run_id] if live is None else live}, **more)


def locks(tmp_path):
    return tmp_path / "locks"


def test_the_lock_directory_is_made_roots_alone_and_the_lease_0600(tmp_path):
    taken = lock.acquire(args(locks(tmp_path)), now=1000.0)
    assert taken["state"] == "held", taken
    assert stat.S_IMODE(os.lstat(locks(tmp_path)).st_mode) == 0o700
    info = os.lstat(taken["path"])
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.geteuid()


@ROOT_ONLY
@pytest.mark.parametrize("case", ["owned by another account", "writable by every account (like /run/lock)",
                                  "a link to a directory of root's", "under a directory another account may write"])
def test_a_lock_directory_another_account_controls_is_refused_and_never_written(tmp_path, case):
    directory = locks(tmp_path)
    if case == "owned by another account":
        directory.mkdir()
        os.chown(directory, NOBODY, NOBODY)
    elif case.startswith("writable"):
        directory.mkdir()
        directory.chmod(0o1777)
    elif case.startswith("a link"):
        (tmp_path / "real").mkdir(mode=0o700)
        directory.symlink_to(tmp_path / "real")
    else:
        parent = tmp_path / "open"
        parent.mkdir()
        parent.chmod(0o777)
        directory = parent / "locks"
        directory.mkdir(mode=0o700)
    taken = lock.acquire(args(directory), now=1000.0)
    assert taken["state"] == "error" and "refused" in taken["why"], taken
    assert os.listdir(os.path.realpath(directory)) == [], "a lease was written in a directory others control"


@pytest.fixture(params=[0, 1], ids=["protected_symlinks=0", "protected_symlinks=1"])
def protected_symlinks(request):
    """fs.protected_symlinks (global) set for the test and restored."""
    path = "/proc/sys/fs/protected_symlinks"
    with open(path) as handle:
        before = handle.read().strip()
    subprocess.run(["sysctl", "-q", "-w", "fs.protected_symlinks=%d" % request.param], check=True)
    yield request.param
    subprocess.run(["sysctl", "-q", "-w", "fs.protected_symlinks=%s" % before], check=True)


@ROOT_ONLY
def test_a_state_path_through_another_account_s_link_is_refused_though_its_target_is_root_s(tmp_path,
                                                                                            protected_symlinks):
    """/tmp/<nobody's link> -> a directory of root's: every real directory is root's, but nobody can point the link
    elsewhere between two runs (its own directory, with a forged lease or verdict), so the path is refused."""
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    real = tmp_path / "root-state"
    real.mkdir(mode=0o700)
    link = sticky / "state"
    link.symlink_to(real)
    os.lchown(link, NOBODY, NOBODY)
    taken = lock.acquire(args(link / "locks"), now=1000.0)
    assert taken["state"] == "error" and "symbolic link" in taken["why"] and "nobody" in taken["why"], taken
    assert os.listdir(real) == [], "a lease was written through another account's link"
    # The same link of root's own is root's to keep: the path is used.
    os.lchown(link, 0, 0)
    assert lock.acquire(args(link / "locks"), now=1000.0)["state"] == "held"


def test_a_link_planted_as_the_lease_is_never_followed(tmp_path):
    directory = locks(tmp_path)
    directory.mkdir(mode=0o700)
    target = tmp_path / "shadow"
    target.write_text("root:secret\n")
    os.symlink(str(target), lock.lease_path(str(directory)))
    taken = lock.acquire(args(directory), now=1000.0)
    assert taken["state"] == "error" and "symbolic link" in taken["why"], taken
    assert target.read_text() == "root:secret\n", "root wrote through the link"
    assert lock.release({"dir": str(directory), "run_id": "ctl:100:5"})["released"] is False
    assert target.read_text() == "root:secret\n"


@ROOT_ONLY
@pytest.mark.parametrize("case", ["another owner", "a second name"])
def test_a_lease_file_that_is_not_ours_alone_is_not_used(tmp_path, case):
    directory = locks(tmp_path)
    directory.mkdir(mode=0o700)
    path = lock.lease_path(str(directory))
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"run_id": "x:1:1", "since": 1.0, "expires": 9e9}, handle)
    if case == "another owner":
        os.chown(path, NOBODY, NOBODY)
    else:
        os.link(path, str(tmp_path / "elsewhere"))
    taken = lock.acquire(args(directory), now=1000.0)
    assert taken["state"] == "error", taken
    assert ("owned by uid %d" % NOBODY if case == "another owner" else "2 names") in taken["why"]


@pytest.mark.parametrize("content", [
    b'{"run_id": "far:7:1", "since": 1, "expires": "soon"}',
    b'{"run_id": "far:7:1", "since": 1, "expires": NaN}',
    b'{"run_id": "far:7:1", "since": 1, "expires": Infinity}',
    b'{"run_id": "far:7:1", "since": 1, "expires": true}',
    b'{"run_id": ["far"], "since": 1, "expires": 99999999999}',
    b'["a", "list"]',
    b'not json at all',
    b'\xff\xfe{"run_id"',
    b'{"run_id": "far:7:1", "pad": "' + b"x" * 70000 + b'", "since": 1, "expires": 99999999999}',
], ids=["expires-text", "expires-nan", "expires-infinite", "expires-bool", "run-id-list", "a-list", "not-json",
        "not-utf8", "oversized"])
def test_a_lease_that_is_no_lease_is_stale_a_warn_never_a_crash_nor_busy(tmp_path, content):
    from cluster_preflight.verdict.accounting import lock_checks  # pylint: disable=import-outside-toplevel

    directory = locks(tmp_path)
    directory.mkdir(mode=0o700)
    path = lock.lease_path(str(directory))
    with open(path, "wb") as handle:
        handle.write(content)
    os.chmod(path, 0o600)
    taken = lock.acquire(args(directory), now=1000.0)
    assert taken["state"] == "held", taken
    assert taken["took_over"]["unreadable"] and "could not be read" in taken["took_over"]["why"]
    assert taken["ended"] == [], "nothing is ended on the word of a lease that is no lease"
    with open(path, encoding="utf-8") as handle:
        assert json.load(handle)["run_id"] == "ctl:100:5"
    checks = {}
    assert lock_checks("n1", {"lock": taken}, checks) == ""
    assert checks[("preflight", "lock")]["status"] == "warn" and checks[("preflight", "lock")]["fix"]


HOLD_FLOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_SH)
print("held", flush=True)
time.sleep(60)
"""


def test_a_foreign_flock_held_on_the_lease_never_makes_the_node_busy(tmp_path, monkeypatch):
    directory = locks(tmp_path)
    lock.acquire(args(directory), now=1000.0)
    path = lock.lease_path(str(directory))
    holder = subprocess.Popen([sys.executable, "-c", HOLD_FLOCK, path], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(lock, "FLOCK_WAIT", 0.3)
        taken = lock.acquire(args(directory, run_id="ctl:200:9", live=["ctl:200:9"]), now=1010.0)
        assert taken["state"] != "busy", taken
        assert taken["state"] == "error" and "held the flock" in taken["why"]
    finally:
        holder.kill()
        holder.wait()


@ROOT_ONLY
def test_another_account_cannot_open_the_lease_to_flock_it():
    # Even where the way down to the lease is open to every account (a lock directory of mode 0755), the lease
    # itself is root's alone: nobody cannot open it, so cannot hold its flock.
    base = tempfile.mkdtemp(dir="/tmp")
    try:
        os.chmod(base, 0o755)
        directory = os.path.join(base, "locks")
        os.mkdir(directory, 0o755)
        taken = lock.acquire(args(directory), now=1000.0)
        assert taken["state"] == "held", taken
        done = subprocess.run(["runuser", "-u", "nobody", "--", "flock", "--shared", "--nonblock", taken["path"],
                               "true"], capture_output=True, text=True, timeout=30, check=False, cwd="/")
        assert done.returncode != 0 and "Permission denied" in done.stderr, done.stderr[-500:]
    finally:
        shutil.rmtree(base)


def test_each_call_renews_the_lease_for_its_own_bound_and_never_shortens_it(tmp_path):
    directory = locks(tmp_path)
    assert lock.acquire(args(directory, lease=100), now=1000.0)["lease"]["expires"] == 1100.0
    renewed = lock.renew(args(directory, lease=50), now=1010.0)
    assert renewed["state"] == "held" and renewed["lease"]["expires"] == 1100.0, "a shorter call keeps the promise"
    renewed = lock.renew(args(directory, lease=200), now=1050.0)
    assert renewed["lease"]["expires"] == 1250.0 and renewed["lease"]["since"] == 1000.0


def test_a_renewal_that_finds_another_runs_live_lease_has_lost_the_node_and_runs_nothing(tmp_path):
    directory = locks(tmp_path)
    now = time.time()
    lock.acquire(args(directory, lease=100), now=now - 200)
    # This run's controller was away past its lease: another run took the node over.
    other = args(directory, run_id="far:7:1", controller="far", live=["far:7:1"])
    assert lock.acquire(other, now=now - 50)["took_over"]["run_id"] == "ctl:100:5"
    lost = lock.renew(args(directory, lease=100), now=now)
    assert lost["state"] == "lost" and lost["lease"]["run_id"] == "far:7:1"

    class Module(object):
        def fail_json(self, **result):
            raise RuntimeError(result)

    with pytest.raises(RuntimeError, match="no longer holds"):
        lock.hold_for_call(Module(), args(directory, lease=100))
    assert lock.hold_for_call(Module(), {}) is None


def test_a_run_named_dead_by_the_operator_is_taken_over_before_its_lease_ends(tmp_path):
    directory = locks(tmp_path)
    lock.acquire(args(directory, run_id="far:7:1", controller="far"), now=1000.0)
    mine = args(directory, run_id="ctl:200:9", live=["ctl:200:9"])
    assert lock.acquire(mine, now=1010.0)["state"] == "busy"
    taken = lock.acquire(dict(mine, take_over=["far:7:1"]), now=1010.0)
    assert taken["state"] == "held" and "preflight_lock_take_over" in taken["took_over"]["why"]


def test_busy_says_until_when_and_the_exact_commands_that_free_the_node():
    from cluster_preflight.verdict.accounting import lock_checks  # pylint: disable=import-outside-toplevel

    lease = {"run_id": "far:7:1", "controller": "far", "controller_pid": 7, "user": "op", "since": 1000.0,
             "expires": 1300.0}
    checks = {}
    why = lock_checks("n1", {"lock": {"state": "busy", "path": "/run/cluster-preflight/cluster-preflight.n1.lease",
                                      "lease": lease, "why": lock.describe(lease)}}, checks)
    busy = checks[("preflight", "busy")]
    assert why and busy["details"]["blocked"]
    assert "until at most 1970-01-01T00:21:40Z" in busy["found"]
    assert "-e preflight_lock_take_over=far:7:1" in busy["fix"]
    assert "rm -f /run/cluster-preflight/cluster-preflight.n1.lease" in busy["fix"]


class FakeView(object):
    """What lock_args reads of a ClusterView: hosts, forks and the run-wide settings."""

    def __init__(self, hosts, forks=64, **run):
        self.hosts, self.forks = hosts, forks
        settings = {"preflight": dict({"preflight_facts_timeout": 60, "preflight_probes_timeout": 120}, **run),
                    "allreduce": {"allreduce_hard_timeout": 120, "allreduce_stack_budget": 20}}
        self.settings = {host: settings for host in hosts}


def test_a_lease_reaches_the_stage_in_flight_plus_the_grace_never_the_whole_run():
    from cluster_preflight.stages import decisions as stages  # pylint: disable=import-outside-toplevel

    taken = stages.lock_args(FakeView(["n1", "n2", "n3"]))
    # The facts call: its own bound (60 s and an SSH connection) plus the controller's grace (120 s).
    assert taken["lease_seconds"] == 60 + 25 + 120 and taken["dir"] == "/run/cluster-preflight"
    short = stages.lock_args(FakeView(["n1"], preflight_lock_grace=5))
    assert short["lease_seconds"] == 60 + 25 + 5 and short["slack"] == 5
    # Fewer forks than nodes: the other fork batches of the stage and of the next one are waited for too.
    batched = stages.lock_args(FakeView(["n%d" % index for index in range(10)], forks=5))
    assert batched["slack"] == 120 + 2 * (120 + 200 + 25)


def test_every_later_node_call_renews_for_its_own_bound():
    from cluster_preflight.stages.run_lock import renewal, round_lock  # pylint: disable=import-outside-toplevel

    base = {"dir": "/run/cluster-preflight", "run_id": "ctl:1:1", "lease_seconds": 205, "slack": 120}
    assert renewal(base, 200) == dict(base, lease_seconds=320, renewal=True)
    assert renewal({}, 200) == {}
    plan = {"first_args_by_host": {"n1": {"wait_timeout": 200}, "n2": {"wait_timeout": 200}},
            "second_args_by_host": {"n1": {"wait_timeout": 200}}, "gpu_slots_by_host": {}}
    # Two steps and the confirmation run, each an SSH connection more, plus the grace.
    assert round_lock(base, plan)["lease_seconds"] == 3 * 225 + 120


def test_a_node_lost_to_another_run_mid_run_is_unverified_never_failed():
    from cluster_preflight.verdict.accounting import build_verdict  # pylint: disable=import-outside-toplevel

    lease = {"run_id": "far:7:1", "controller": "far", "since": 1000.0, "expires": 1300.0}
    lost = {"state": "lost", "path": "/run/cluster-preflight/cluster-preflight.n1.lease", "lease": lease,
            "why": lock.describe(lease)}
    records = {"n1": {"preflight_settings": {"ok": True, "settings": {}},
                      "preflight_facts": {"facts": {}, "errors": {}, "lock": {"state": "held", "path": "x"}},
                      "preflight_probes": {"probes": {}, "errors": {}, "lock": lost, "busy": lost}}}
    verdict = build_verdict(["n1"], records, [], [], ["settings", "facts", "probes"], "r1", "/tmp/r1")
    node = verdict["nodes"]["n1"]
    assert node["status"] == "unverified" and verdict["failed_hosts"] == [], node
    assert "far:7:1" in node["checks"]["preflight.probes"]["found"]


def test_every_node_the_run_holds_renews_for_each_localisation_round():
    from cluster_preflight.stages import localization as action  # pylint: disable=import-outside-toplevel
    from cluster_preflight.stages.view import ClusterView  # pylint: disable=import-outside-toplevel
    from localize_helpers import RUN_FLOOR, SLOW_BW, base_args, ranks  # pylint: disable=import-outside-toplevel

    names = ["n0", "n1", "n2", "n3"]
    held = {"dir": "/run/cluster-preflight", "run_id": "ctl:1:1", "lease_seconds": 205, "slack": 120}
    gate = {"launch": True, "hosts": names, "backend": "gloo", "master_port": 29500, "args_by_host": base_args(names),
            "floor": RUN_FLOOR}
    hostvars = {host: {"preflight_settings": {"settings": {"allreduce": {
        "allreduce_floor_busbw_gbps_gloo": 0.01, "allreduce_floor_relative": 0.7, "allreduce_localize": True}},
        "node": {"name": host, "node_addr": "198.18.200.%d" % index}}, "preflight_inputs": {"lock": held},
        "preflight_launch": {"gate": gate}, "preflight_plan": {"nic": {"addr_by_host": {}}},
        "preflight_probes": {"job": {"ranks": ranks(busbw=SLOW_BW)}}} for index, host in enumerate(names)}
    view = ClusterView({"ansible_play_hosts_all": names, "hostvars": hostvars})
    planned = action.with_round_lock(view, action.start(view))
    assert planned["needed"] and not planned["done"]
    # Round 1: one step of pairs (wait 200 s each), then the confirmation run; plus an SSH connection each, and
    # the grace.
    assert planned["lock"] == dict(held, lease_seconds=2 * 225 + 120, renewal=True)
    # Every node launches in round 1: each renews the round's lock with its launch (no call of its own).
    assert {host: args["lock"] for host, args in planned["first_args_by_host"].items()} == {
        host: planned["lock"] for host in names}
    assert "lock" not in action.with_round_lock(view, dict(planned, done=True))
    hostvars["n0"]["preflight_inputs"] = {"lock": {}}
    view = ClusterView({"ansible_play_hosts_all": names, "hostvars": hostvars})
    assert "lock" not in action.with_round_lock(view, action.start(view)), "no run lock, nothing to renew"
