"""diagnose.yml on a real hung two-node torch job, on the namespace test bed.

Each node gets the unprivileged account ``pfdiag``; a small gloo job (all_reduce in a loop) runs as that
account with torchrun on both nodes, two ranks per node. One rank is stopped (SIGSTOP), so its three
peers wait in the collective. One run of diagnose.yml must name that node:pid as the suspect, say that
the others wait in all_reduce, and have taken the stacks with py-spy running as pfdiag. Everything the
job started is killed afterwards (and the bed goes with the module).
"""

import glob
import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time

import pytest

from gate_helpers import cmdline, environ, node_pid, proc_state, send_signal
from job_env import job_python
from playbook import run_playbook
from testbed import testbed_fixture

pytestmark = pytest.mark.timeout(600)

JOB_USER = "pfdiag"
NODES = 2
RANKS_PER_NODE = 2
SCRIPT_NAME = "diag_hang_job.py"
JOB = """
import datetime, os, sys, time
import torch
import torch.distributed as dist

def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=10))
    tensor = torch.ones(1024)
    step = 0
    while True:
        dist.all_reduce(tensor)
        tensor.fill_(1.0)
        step += 1
        if step == 20:
            with open(os.path.join(sys.argv[1], "rank%d.ready" % dist.get_rank()), "w") as handle:
                handle.write("ok")
        time.sleep(0.02)

if __name__ == "__main__":
    main()
"""


@pytest.fixture(scope="module")
def bed(request):
    python = job_python()
    if python is None:
        pytest.skip("no Python with torch that an unprivileged account can run on this machine")
    bed = testbed_fixture(request, nodes=NODES, private_dirs=("/etc", "/home"), training_python=python)
    for node in bed.nodes:
        bed.run(node, ["useradd", "--create-home", "--shell", "/bin/bash", JOB_USER], check=True)
    return bed


@pytest.fixture
def job_dir():
    # Shared by the nodes (/tmp is the host's) and readable by the job's account.
    directory = tempfile.mkdtemp(prefix="pft-diagnose-")
    os.chmod(directory, 0o777)
    with open(os.path.join(directory, SCRIPT_NAME), "w") as handle:
        handle.write(JOB)
    os.chmod(os.path.join(directory, SCRIPT_NAME), 0o644)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def job_processes(bed, node):
    """Host pids of the job's processes on the node (torchrun and the ranks)."""
    return [pid for pid in bed.host_pids(node)
            if proc_state(pid) not in (None, "Z", "X") and any(SCRIPT_NAME in part for part in cmdline(pid))]


def ranks_of(bed, node):
    found = {}
    for pid in job_processes(bed, node):
        env = environ(pid)
        if "RANK" in env and "torch.distributed.run" not in " ".join(cmdline(pid)):
            found[int(env["RANK"])] = pid
    return found


def logs(job_dir):
    text = ""
    for path in sorted(glob.glob(os.path.join(job_dir, "node*.log"))):
        with open(path) as handle:
            text += "== %s\n%s\n" % (os.path.basename(path), handle.read()[-3000:])
    return text


def kill_job(bed, launched):
    for node in bed.nodes:
        for pid in job_processes(bed, node):
            send_signal(pid, signal.SIGCONT)
            send_signal(pid, signal.SIGKILL)
    for proc in launched:
        proc.kill()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def test_diagnose_names_the_stopped_rank_and_the_collective_its_peers_wait_in(bed, job_dir, tmp_path):
    master = bed.nodes[0]
    port = "29%03d" % (os.getpid() % 1000)
    launched = []
    try:
        for index, node in enumerate(bed.nodes):
            argv = ["runuser", "-u", JOB_USER, "--", bed.training_python, "-m", "torch.distributed.run",
                    "--nnodes", str(NODES), "--nproc-per-node", str(RANKS_PER_NODE), "--node-rank", str(index),
                    "--master-addr", master.node_addr, "--master-port", port,
                    os.path.join(job_dir, SCRIPT_NAME), job_dir]
            env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/home/" + JOB_USER, "LANG": "C", "GLOO_SOCKET_IFNAME": "eth0",
                   "OMP_NUM_THREADS": "1"}
            with open(os.path.join(job_dir, "node%d.log" % index), "w") as log:
                launched.append(bed.spawn(node, argv, cwd="/", env=env, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 120
        while len(glob.glob(os.path.join(job_dir, "rank*.ready"))) < NODES * RANKS_PER_NODE:
            assert time.monotonic() < deadline, "the job did not start: %s" % os.listdir(job_dir)
            assert all(proc.poll() is None for proc in launched), "torchrun exited: %s" % logs(job_dir)
            time.sleep(0.5)
        last = bed.nodes[-1]
        ranks = ranks_of(bed, last)
        victim_rank = max(ranks)
        victim = ranks[victim_rank]
        os.kill(victim, signal.SIGSTOP)
        time.sleep(2)
        assert proc_state(victim) == "T"
        inventory = bed.write_inventory(path=str(tmp_path / "inventory.yml"))
        result = run_playbook(tmp_path, playbook="diagnose.yml", inventory=inventory, timeout=300,
                              extravars={"diagnose_user": JOB_USER, "diagnose_stack_budget": 30})
        reports = glob.glob(os.path.join(result.results_dir, "*", "diagnose.json"))
        assert result.rc == 0 and len(reports) == 1, result.stdout[-4000:]
        with open(reports[0]) as handle:
            report = json.load(handle)
        suspect = "%s:%d" % (last.name, node_pid(victim))
        text = "\n".join(report["lines"])
        assert report["status"] == "suspect", text
        assert [item["id"] for item in report["suspects"]] == [suspect], text
        assert report["suspects"][0]["rank"] == victim_rank
        assert report["suspects"][0]["reasons"][0].startswith("stopped (state T"), text
        # The three others wait in the collective (all_reduce, or the work's wait).
        assert report["majority"].split(" ")[0] in ("all_reduce", "wait"), text
        # The stopped rank may itself have been stopped inside the collective: the others are in the group,
        # it may be too, and it is named by its state either way.
        others = NODES * RANKS_PER_NODE - 1
        assert report["groups"][0]["count"] in (others, others + 1), text
        assert len(report["ranks"]) == NODES * RANKS_PER_NODE and len(report["launchers"]) == NODES, text
        # py-spy ran as the job's account, never as root, and read every rank.
        assert {rank["dump_user"] for rank in report["ranks"]} == {JOB_USER}, text
        assert all(rank["dump_finished"] and rank["frame"] for rank in report["ranks"]), text
        # The summary is printed, the files are the verdict's modes, one stacks file per node.
        assert "SUSPECT %s rank %d" % (suspect, victim_rank) in result.stdout, result.stdout[-4000:]
        run_dir = os.path.dirname(reports[0])
        assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o750
        for node in bed.nodes:
            path = os.path.join(run_dir, "%s.stacks.txt" % node.name)
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
        with open(os.path.join(run_dir, "%s.stacks.txt" % last.name)) as handle:
            assert "py-spy as %s" % JOB_USER in handle.read()
        # The diagnosis only read: the stopped rank is still stopped, its peers still wait.
        assert proc_state(victim) == "T"
    finally:
        kill_job(bed, launched)
    # SIGKILLed processes take a moment to be reaped by their node's init: wait for that, bounded.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(job_processes(bed, node) for node in bed.nodes):
        kill_job(bed, [])
        time.sleep(0.2)
    for node in bed.nodes:
        assert job_processes(bed, node) == []
