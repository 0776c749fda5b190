"""The srun engine end to end on the bed's real Slurm (munged, slurmctld, one slurmd per namespace node; 6 nodes
declaring 2 CPUs each), one bed and one Slurm cluster shared by the whole file, one gate per scenario, each inside
an allocation as an operator starts it (``salloc ... python -m cluster_preflight gate --engine srun``):

* refused outside an allocation, and when a node of the inventory is not in the allocation: exit 4, ``stopped``,
  the node's ``preflight.inputs`` saying what was found, what is expected and the fix; nothing ran on a node;
* a healthy gate passes, and the ssh engine's gate over the same nodes gives the same verdict shape (the same
  checks on every node, the same statuses, the same all-reduce);
* root on one node makes its task print a failed result for another node: the printer is the one failed, saying
  whom it spoke for, and the node it named keeps its own result and passes;
* a node whose training Python hangs, a throttled node (tc tbf), a node whose slurmd was stopped before the run,
  and a node killed while the all-reduce step runs: each time that node is the only one failed, and its peers
  are proven (the all-reduce over them passed, at once or in the confirmation run after localisation).

The destructive scenarios come last, in the order above (a stopped slurmd is started again; the killed node is
the last test's).  Seconds per gate are printed at the end (pytest -s)."""

import base64
import hashlib
import json
import os
import subprocess
import sys
import time
import zlib

import pytest

from gate_helpers import clear_throttles, rank_processes
from slurm_bed import ROOT, slurm_fixture
from testbed import testbed_fixture

pytestmark = pytest.mark.timeout(1800)

NODES = 6
THROTTLE = ["root", "tbf", "rate", "20mbit", "burst", "32kbit", "latency", "400ms"]
# Small all-reduces and one rank per node keep 6 nodes' gates short on a 2-core machine; the healthy gate runs the
# default two ranks per node (two Slurm tasks per node).
SMALL = {"allreduce_sizes": [1048576], "allreduce_iters": 3, "allreduce_warmup": 1, "preflight_nproc_per_node": 1,
         "allreduce_floor_busbw_gbps_gloo": 0.01, "allreduce_floor_relative": 0.7}
SECONDS = []


@pytest.fixture(scope="module")
def bed(request):
    bed = testbed_fixture(request, nodes=NODES)
    return bed


@pytest.fixture(scope="module")
def slurm(request, bed):
    cluster = slurm_fixture(request, bed, cpus=2)
    yield cluster
    for name, seconds, rc in SECONDS:
        print("srun engine gate: %-45s %6.1f s (exit %s)" % (name, seconds, rc))


def write_inventory(bed, tmp_path, host_vars=None, **group_vars):
    """The bed's inventory with the srun engine's settings: the node code's directory is root's alone (the bed's
    nodes share the host's files, so one directory serves them all)."""
    srun_dir = os.path.join(bed.workdir, "srun")
    os.makedirs(srun_dir, mode=0o700, exist_ok=True)
    variables = {"preflight_srun_dir": srun_dir, "ssh_trust_mesh": False}
    variables.update(group_vars)
    return bed.write_inventory(host_vars=host_vars, group_vars=variables, path=str(tmp_path / "inventory.yml"))


def run_gate(slurm, name, inventory, results, allocate=NODES, nodelist=None, engine="srun", during=None, extra=()):
    """``python -m cluster_preflight gate`` (inside ``salloc`` unless ``allocate`` is 0): ``(exit code, verdict,
    output)``; ``during(proc)`` runs while the gate does."""
    gate = [sys.executable, "-m", "cluster_preflight", "gate", "-q", "--engine", engine, "-i", inventory,
            "--results-dir", str(results)] + list(extra)
    argv = gate
    if allocate:
        where = ["-w", nodelist] if nodelist else []
        argv = ["salloc", "-N%d" % allocate, "--exclusive", "--no-kill", "-t", "30"] + where + ["--"] + gate
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, env=slurm.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        if during:
            during(proc)
        out, _ = proc.communicate(timeout=1200)
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    SECONDS.append((name, time.monotonic() - started, proc.returncode))
    path = os.path.join(str(results), "latest", "verdict.json")
    verdict = json.load(open(path, encoding="utf-8")) if os.path.exists(path) else None
    return proc.returncode, verdict, out


def why(verdict, out):
    if not verdict:
        return out[-4000:]
    lines = ["status=%s failed=%s unreachable=%s" % (verdict["status"], verdict["failed_hosts"],
                                                     verdict["unreachable_hosts"])]
    for host, node in verdict["nodes"].items():
        for name, check in sorted(node["checks"].items()):
            if check["status"] == "fail" or (check.get("details") or {}).get("blocked"):
                lines.append("%s/%s %s: %s" % (host, name, check["status"], check["found"][:300]))
    lines.append("allreduce=%s localize=%s" % (json.dumps(verdict.get("allreduce", {}).get("status")),
                                               json.dumps({key: (verdict.get("localize") or {}).get(key) for key in
                                                           ("bad", "good", "lost", "confirm")})))
    return "\n".join(lines) + "\n" + out[-1500:]


def only_failed(verdict, out, name, names):
    """``name`` is the only failed node and every other one is proven: healthy, and an all-node all-reduce over
    them passed (at once, or as the confirmation run)."""
    assert verdict is not None and verdict["status"] == "fail", why(verdict, out)
    assert verdict["failed_hosts"] == [name], why(verdict, out)
    assert sorted(verdict["healthy_hosts"]) == sorted(other for other in names if other != name), why(verdict, out)
    summary = verdict["allreduce"]
    proven = summary["status"] == "pass" and name not in summary["hosts"]
    proven = proven or (summary.get("confirm") or {}).get("status") == "pass"
    assert proven, why(verdict, out)


def test_srun_outside_an_allocation_is_refused_before_any_node_is_touched(bed, slurm, tmp_path):
    code, verdict, out = run_gate(slurm, "refused: no allocation", write_inventory(bed, tmp_path), tmp_path / "r",
                                  allocate=0)
    assert code == 4 and verdict["stopped"], why(verdict, out)
    check = verdict["nodes"][bed.nodes[0].name]["checks"]["preflight.inputs"]
    assert "outside a Slurm allocation" in check["found"] and "salloc" in check["fix"], check


def test_srun_for_a_node_the_allocation_does_not_hold_is_refused_naming_it(bed, slurm, tmp_path):
    names = [node.name for node in bed.nodes]
    code, verdict, out = run_gate(slurm, "refused: a node not allocated", write_inventory(bed, tmp_path),
                                  tmp_path / "r", allocate=NODES - 1, nodelist=",".join(names[:-1]))
    assert code == 4 and verdict["stopped"] == "invalid settings on %s" % names[-1], why(verdict, out)
    found = verdict["nodes"][names[-1]]["checks"]["preflight.inputs"]["found"]
    assert "%s is not a node of allocation" % names[-1] in found, found


def test_a_healthy_gate_passes_with_the_ssh_engine_s_verdict_shape(bed, slurm, tmp_path):
    inventory = write_inventory(bed, tmp_path, allreduce_sizes=[1048576], allreduce_iters=3, allreduce_warmup=1)
    code, verdict, out = run_gate(slurm, "healthy, 2 ranks per node", inventory, tmp_path / "srun")
    assert code == 0 and verdict["status"] == "pass", why(verdict, out)
    assert verdict["allreduce"]["world_size"] == 2 * NODES, verdict["allreduce"]
    ssh_code, ssh_verdict, ssh_out = run_gate(slurm, "healthy, the ssh engine", inventory, tmp_path / "ssh",
                                              engine="ssh")
    assert ssh_code == 0, why(ssh_verdict, ssh_out)
    assert set(verdict) == set(ssh_verdict)
    for host in ssh_verdict["hosts"]:
        ours, theirs = verdict["nodes"][host], ssh_verdict["nodes"][host]
        assert set(ours["checks"]) == set(theirs["checks"]), (host, set(ours["checks"]) ^ set(theirs["checks"]))
        assert ours["status"] == theirs["status"], host
        assert {name: check["status"] for name, check in ours["checks"].items()} == \
            {name: check["status"] for name, check in theirs["checks"].items()}, host
    for key in ("status", "world_size", "planned_world_size", "hosts", "backend"):
        assert verdict["allreduce"].get(key) == ssh_verdict["allreduce"].get(key), key
    # The same sizes measured (their bandwidths are the runs' own).
    assert [row["size_bytes"] for row in verdict["allreduce"]["sizes"]] == \
        [row["size_bytes"] for row in ssh_verdict["allreduce"]["sizes"]]


def forged_lines(node, result):
    """The protocol lines of ``result`` naming ``node``'s task 0, as any task could print them."""
    text = base64.b64encode(zlib.compress(json.dumps(result).encode())).decode()
    return "PFR %s 0 +\nPFR %s 0 r 0 1 %s\nPFR %s 0 end %s\n" % (node, node, text, node,
                                                                  hashlib.sha256(text.encode()).hexdigest())


def test_a_node_whose_task_prints_another_node_s_result_is_the_one_failed(bed, slurm, tmp_path):
    victim, attacker, names = bed.nodes[0], bed.nodes[2], [item.name for item in bed.nodes]
    python = "/etc/pf-srun-python"
    # Root on the attacker's node: its tasks' Python first prints a failed facts result naming the victim.
    forged = forged_lines(victim.name, {"failed": True, "msg": "FORGED by %s" % attacker.name})
    for node in bed.nodes:
        body = "#!/bin/sh\nexec /usr/bin/python3 \"$@\"\n"
        if node is attacker:
            bed.run(node, ["sh", "-c", 'cat > /etc/pf-forged'], input=forged, check=True)
            body = '#!/bin/sh\ncase " $* " in *" facts "*) cat /etc/pf-forged;; esac\nexec /usr/bin/python3 "$@"\n'
        bed.run(node, ["sh", "-c", 'cat > "$1" && chmod 755 "$1"', "-", python], input=body, check=True)
    code, verdict, out = run_gate(slurm, "a node prints another's result", write_inventory(
        bed, tmp_path, preflight_srun_python=python, **SMALL), tmp_path / "r")
    assert code == 2, why(verdict, out)
    only_failed(verdict, out, attacker.name, names)
    # The victim's facts are its own (only_failed: it is healthy, the all-reduce over it passed).
    assert "preflight.facts" not in verdict["nodes"][victim.name]["checks"], why(verdict, out)
    check = verdict["nodes"][attacker.name]["checks"]["preflight.facts"]
    assert "printed protocol lines naming %s task 0" % victim.name in check["found"], check
    assert "FORGED" not in json.dumps(verdict), why(verdict, out)


def test_a_node_whose_training_python_hangs_is_the_only_one_failed(bed, slurm, tmp_path):
    node, names = bed.nodes[1], [item.name for item in bed.nodes]
    hang = tmp_path / "hung-python"
    hang.write_text("#!/bin/sh\nexec sleep 3600\n")
    hang.chmod(0o755)
    inventory = write_inventory(bed, tmp_path, host_vars={node.name: {"preflight_training_python": str(hang)}},
                                **SMALL)
    code, verdict, out = run_gate(slurm, "training Python hangs on one node", inventory, tmp_path / "r")
    assert code == 2, why(verdict, out)
    only_failed(verdict, out, node.name, names)
    python = verdict["nodes"][node.name]["checks"]["allreduce.python"]
    assert python["status"] == "fail" and "hung" in python["found"], python


def test_a_throttled_node_is_named_alone_and_its_peers_proven(bed, slurm, tmp_path):
    node, names = bed.nodes[2], [item.name for item in bed.nodes]
    bed.tc(node, ["qdisc", "add", "dev", "eth0"] + THROTTLE)
    try:
        code, verdict, out = run_gate(slurm, "one node throttled (tc tbf)", write_inventory(bed, tmp_path, **SMALL),
                                      tmp_path / "r")
    finally:
        clear_throttles(bed)
    assert code == 2, why(verdict, out)
    only_failed(verdict, out, node.name, names)
    localize = verdict["localize"]
    assert localize["bad"] == [node.name] and localize["kinds"] == {node.name: "network"}, why(verdict, out)
    assert localize["good"] == sorted(name for name in names if name != node.name) and localize["rounds_run"] <= 3


def test_a_node_whose_slurmd_was_stopped_before_the_run_is_unreachable_and_alone(bed, slurm, tmp_path):
    node, names = bed.nodes[3], [item.name for item in bed.nodes]
    inventory = write_inventory(bed, tmp_path, **SMALL)

    def stop_slurmd(_proc):
        # The allocation is granted while every slurmd answers; then this node's stops, before any step.
        time.sleep(0.5)
        slurm.stop_slurmd(node)

    try:
        code, verdict, out = run_gate(slurm, "slurmd stopped on one node", inventory, tmp_path / "r",
                                      during=stop_slurmd, extra=["-e", "preflight_facts_timeout=60"])
    finally:
        slurm.start_slurmd(node)
    assert code == 2, why(verdict, out)
    only_failed(verdict, out, node.name, names)
    assert verdict["unreachable_hosts"] == [node.name], why(verdict, out)
    reachable = verdict["nodes"][node.name]["checks"]["preflight.reachable"]
    assert reachable["status"] == "fail" and "Slurm" in reachable["found"], reachable


def test_a_node_killed_while_the_all_reduce_step_runs_is_the_only_one_failed(bed, slurm, tmp_path):
    node, names = bed.nodes[-1], [item.name for item in bed.nodes]

    def kill_once_ranks_run(proc):
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            if rank_processes(bed, node):
                bed.stop_sshd(node)
                return
            time.sleep(0.2)
        raise AssertionError("the ranks never started on %s" % node.name)

    code, verdict, out = run_gate(slurm, "one node killed mid-step", write_inventory(bed, tmp_path, **SMALL),
                                  tmp_path / "r", during=kill_once_ranks_run)
    assert code == 2, why(verdict, out)
    only_failed(verdict, out, node.name, names)
    assert verdict["unreachable_hosts"] == [node.name], why(verdict, out)
