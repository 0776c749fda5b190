"""The gate as the job's user on the namespace test bed: a real unprivileged account on every node.

Every node gets the account ``pfjob`` (in its own ``/etc``) and runs the gate with
``preflight_job_user: pfjob``.  While the playbook runs, a watcher on the controller lists each
node's processes: every job-side process (torchrun, the ranks, py-spy of them, the ptrace and core
probes' children) must belong to pfjob, never to root.  One run passes; one run (through the
Python API, whose typed verdict must be the file the run wrote) hangs a rank, and its stack is taken by
py-spy running as pfjob, for real.  One bed serves the module.
"""

import json
import os
import threading
import time

import pytest

from gate_helpers import cmdline, proc_state
from job_env import account_exists, job_python
from playbook import run_playbook
from testbed import testbed_fixture

pytestmark = pytest.mark.timeout(900)

JOB_USER = "pfjob"
NODES = 2
# What counts as job-side code in a node's process table.
JOB_SIDE = ("torch.distributed.run", "allreduce_worker.py", "py-spy", "PTRACE_SEIZE", "find_spec", "sleep 30")


def _uid_of(pid):
    try:
        return os.stat("/proc/%d" % pid).st_uid
    except OSError:
        return None


def _job_side(argv):
    text = " ".join(argv)
    return any(marker in text for marker in JOB_SIDE)


class Watcher(object):
    """Samples every node's process table while a run lasts: ``seen`` maps (node, kind) to the uids."""

    def __init__(self, bed):
        self.bed = bed
        self.seen = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self._stop.is_set():
            for node in self.bed.nodes:
                for pid in self.bed.host_pids(node):
                    if proc_state(pid) in (None, "Z", "X"):
                        continue
                    argv = cmdline(pid)
                    if not _job_side(argv):
                        continue
                    text = " ".join(argv)
                    kind = next(marker for marker in JOB_SIDE if marker in text)
                    uid = _uid_of(pid)
                    if uid is not None:
                        self.seen.setdefault((node.name, kind), set()).add(uid)
            self._stop.wait(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)


PY_SPY_LOG = "/tmp/preflight-test-py-spy-uids.log"


@pytest.fixture
def py_spy_witness():
    """A ``py-spy`` next to the training Python (where the gate looks first) that notes the uid it runs as,
    then runs the real one: who ran py-spy is recorded, not sampled."""
    import shutil
    import stat

    real = shutil.which("py-spy")
    if real is None:
        pytest.skip("py-spy is not installed on this machine")
    wrapper = os.path.join(os.path.dirname(job_python("nobody")), "py-spy")
    with open(PY_SPY_LOG, "w"):
        pass
    os.chmod(PY_SPY_LOG, 0o666)  # written by the job user's py-spy
    with open(wrapper, "w") as handle:
        handle.write('#!/bin/sh\nid -u >> %s\nexec %s "$@"\n' % (PY_SPY_LOG, os.path.realpath(real)))
    os.chmod(wrapper, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    try:
        yield PY_SPY_LOG
    finally:
        os.unlink(wrapper)
        os.unlink(PY_SPY_LOG)


@pytest.fixture(scope="module")
def bed(request):
    python = job_python(JOB_USER if account_exists(JOB_USER) else "nobody")
    if python is None:
        pytest.skip("no Python with torch that an unprivileged account can run on this machine")
    bed = testbed_fixture(request, nodes=NODES, private_dirs=("/etc", "/home"), training_python=python)
    for node in bed.nodes:
        bed.run(node, ["useradd", "--create-home", "--shell", "/bin/bash", JOB_USER], check=True)
    return bed


def _uid_on(bed, node):
    out = bed.run(node, ["id", "-u", JOB_USER], check=True).stdout.strip()
    return int(out)


def run(bed, tmp_path, **extravars):
    inventory = bed.write_inventory(path=str(tmp_path / "inventory.yml"),
                                    group_vars={"preflight_job_user": JOB_USER})
    with Watcher(bed) as watcher:
        result = run_playbook(tmp_path, inventory=inventory, timeout=600, extravars=dict(
            {"ssh_trust_mesh": False}, **extravars))
    return result, watcher.seen


def run_api(bed, tmp_path, **extravars):
    """The same run through the Python API (cluster_preflight.gate), as a scheduler would call it."""
    import cluster_preflight

    inventory = bed.write_inventory(path=str(tmp_path / "inventory.yml"),
                                    group_vars={"preflight_job_user": JOB_USER})
    with Watcher(bed) as watcher:
        result = cluster_preflight.gate(inventory=inventory, results_dir=str(tmp_path / "results"), timeout=600,
                                        extravars=dict({"ssh_trust_mesh": False}, **extravars))
    return result, watcher.seen


def test_the_gate_passes_as_the_job_user_and_no_job_side_process_runs_as_root(bed, tmp_path):
    result, seen = run(bed, tmp_path)
    verdict = result.verdict
    assert verdict is not None, result.stdout[-3000:]
    assert sorted(verdict["healthy_hosts"]) == sorted(node.name for node in bed.nodes), result.stdout[-3000:]
    uids = {node.name: _uid_on(bed, node) for node in bed.nodes}
    for node in bed.nodes:
        checks = verdict["nodes"][node.name]["checks"]
        assert checks["allreduce.job_user"]["status"] == "pass"
        assert "runs as %s (uid %d)" % (JOB_USER, uids[node.name]) in checks["allreduce.job_user"]["found"]
        # The core probe crashed a process of the job user and found its core; the user attached with ptrace.
        assert checks["core_dumps.core_probe"]["status"] == "pass"
        assert "running as %s" % JOB_USER in checks["core_dumps.core_probe"]["found"]
        assert checks["kernel_debug.ptrace_attach"]["status"] == "pass"
        assert checks["kernel_debug.ptrace_attach"]["found"].startswith("%s (uid %d)" % (JOB_USER, uids[node.name]))
        assert "runuser -l %s" % JOB_USER in checks["core_dumps.core_limits_session"]["found"]
        # What ps saw while the gate ran: torchrun and the ranks, as the job user only.
        for kind in ("torch.distributed.run", "allreduce_worker.py"):
            assert seen.get((node.name, kind)) == {uids[node.name]}, (node.name, kind, seen)
    ranks = verdict["allreduce"]["ranks"]
    by_hostname = dict(uids, **{node.hostname: uids[node.name] for node in bed.nodes})
    assert len(ranks) == NODES * 2 and all(rank["uid"] == by_hostname[rank["host"]] for rank in ranks), ranks
    assert not [key for key, found in seen.items() if 0 in found], "job-side code ran as root: %s" % seen
    readable = [os.path.join(top, name) for top, dirs, files in os.walk(result.results_dir)
                for name in dirs + files if os.lstat(os.path.join(top, name)).st_mode & 0o004
                and not os.path.islink(os.path.join(top, name))]
    assert readable == [], "world-readable under results/: %s" % readable


def test_a_hung_ranks_stack_is_taken_by_py_spy_running_as_the_job_user(bed, tmp_path, py_spy_witness):
    # Localisation rounds would re-run the injected hang in pairs: this test is about who takes the stacks.
    result, seen = run_api(bed, tmp_path, allreduce_selftest_fault="hang", allreduce_selftest_rank=1,
                           allreduce_timeout=25, allreduce_localize=False)
    # The API's typed verdict is the verdict file this run wrote.
    assert result.verdict is not None and result.exit_code == 2, (result.error, result.summary)
    with open(os.path.join(result.verdict.run_dir, "verdict.json")) as handle:
        verdict = json.load(handle)
    assert result.verdict.raw == verdict and result.verdict.status == "fail"
    assert sorted(result.verdict.failed_hosts + result.verdict.unverified_hosts) == sorted(
        node.name for node in bed.nodes)
    hung = [rank for rank in verdict["allreduce"]["ranks"] if rank["rank"] == 1][0]
    host = [node.name for node in bed.nodes if hung.get("host") in (node.name, node.hostname)][0]
    uid = _uid_on(bed, bed.node(host))
    assert hung["status"] == "hung" and hung["uid"] == uid, hung
    with open(os.path.join(result.verdict.run_dir, "%s.stacks.txt" % host)) as handle:
        stacks = handle.read()
    assert "== rank 1 " in stacks and "main (allreduce_worker.py" in stacks.split("== rank 1 ")[1], stacks
    # Every py-spy the gate started ran as the job user (the witness wrote its uid before running it).
    with open(py_spy_witness) as handle:
        spies = [int(line) for line in handle.read().split()]
    assert spies and set(spies) == {uid}, "py-spy ran as %s, expected only uid %d" % (spies, uid)
    assert not [key for key, found in seen.items() if 0 in found], "job-side code ran as root: %s" % seen
