#!/usr/bin/env python3
"""The srun engine's costs on the bed's real Slurm: three ratios, each from alternated pairs in one run.

Brings up one namespace test bed of ``--nodes`` nodes (default 12; tests/testbed.py) with a real Slurm on it
(tests/slurm_bed.py: munged, slurmctld, a slurmd per node declaring 2 CPUs), then, ``--runs`` times each:

* ``cpu``: the gate (``python -m cluster_preflight gate --engine srun``, inside ``salloc``) over the first 4 nodes
  and over all ``--nodes``, alternated.  The controller's CPU seconds are those of ``salloc`` and everything under
  it on this machine (the CLI, ansible-playbook and its workers, srun, sbcast; ``getrusage`` of the reaped
  children); the nodes' tasks run under their slurmd and are not the controller's.  It prints the CPU of each and
  the growth per added node (target <= 0.05 CPU-s).
* ``launch``: the gate over 8 nodes vs the same all-reduce launched by hand: one ``srun`` in an allocation of the
  same 8 nodes, the same worker, sizes and iterations, ranks from ``SLURM_PROCID``/``SLURM_NTASKS``, the master
  the first node; wall time of each, both including ``salloc`` (target gate <= 1.3x).
* ``sick``: the gate over 8 nodes with one node's egress throttled (``tc tbf``, 20 Mbit/s: named by the
  localisation rounds) vs a healthy gate over the same 8 nodes: seconds to the verdict (target <= 3x).

Every gate must end with the verdict expected (healthy: pass; sick: the throttled node the only one failed).
One rank per node and small all-reduces (as the bed tests use) keep the bed's 2 cores from dominating.  Needs root
and Slurm (apt-get install slurm-wlm munge).  From the repository root:
    .venv/bin/python bench/srun_engine.py --runs 3 [--only cpu,launch,sick]

``--against DIR`` measures another checkout (with its own ``.venv``: an earlier commit, say) in the same run on the
same bed: every figure is taken for both, the two alternated within each run, and each printed per checkout with
the ratio of this one's to that one's.
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

# pylint: disable=wrong-import-position
from gate_helpers import clear_throttles  # noqa: E402
from slurm_bed import SlurmCluster  # noqa: E402
from testbed import Testbed  # noqa: E402

GATE_VARS = {"allreduce_sizes": [1048576], "allreduce_iters": 3, "allreduce_warmup": 1, "preflight_nproc_per_node": 1,
             "allreduce_floor_busbw_gbps_gloo": 0.01, "allreduce_floor_relative": 0.7, "ssh_trust_mesh": False}
THROTTLE = ["root", "tbf", "rate", "20mbit", "burst", "32kbit", "latency", "400ms"]
WORKER = os.path.join(ROOT, "roles", "allreduce", "files", "allreduce_worker.py")


class Checkout(object):
    """A checkout whose gate is measured: its directory and label; its own venv's programs come first on PATH."""

    def __init__(self, root, label):
        self.root, self.label = os.path.abspath(root), label
        self.python = os.path.join(self.root, ".venv", "bin", "python")

    def env(self, slurm):
        env = slurm.env()
        env["PATH"] = os.pathsep.join([os.path.join(self.root, ".venv", "bin"), env["PATH"]])
        return env


THIS = Checkout(ROOT, "this")


def timed(argv, env, timeout=1800, cwd=ROOT):
    """``(wall seconds, controller CPU seconds, completed process)`` of ``argv`` and everything it reaps."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done


def gate(bed, slurm, work, nodes, label, expect_failed=None, checkout=THIS):
    """One srun-engine gate of ``checkout`` over the first ``nodes`` bed nodes: ``(wall, cpu)``; the verdict must be
    as expected."""
    names = [node.name for node in bed.nodes[:nodes]]
    results = os.path.join(work, "results-%s-%s" % (checkout.label, label))
    argv = ["salloc", "-N%d" % nodes, "-w", ",".join(names), "--exclusive", "--no-kill", "-t", "30", "--",
            checkout.python, "-m", "cluster_preflight", "gate", "--engine", "srun", "-q", "-i", bed.inventory_path,
            "--limit", ",".join(names), "--results-dir", results, "-e", json.dumps(GATE_VARS)]
    wall, cpu, done = timed(argv, checkout.env(slurm), cwd=checkout.root)
    with open(os.path.join(results, "latest", "verdict.json"), encoding="utf-8") as handle:
        verdict = json.load(handle)
    shutil.rmtree(results, ignore_errors=True)
    wanted = [expect_failed] if expect_failed else []
    if verdict["failed_hosts"] != wanted or (not wanted and verdict["status"] != "pass"):
        raise SystemExit("%s (%s): unexpected verdict %s failed=%s (exit %d): %s" % (
            label, checkout.label, verdict["status"], verdict["failed_hosts"], done.returncode, done.stdout[-2000:]))
    return wall, cpu


def by_hand(bed, slurm, work, nodes):
    """The same all-reduce, launched by hand: one srun, a rank per node, in an allocation of the same nodes."""
    names = [node.name for node in bed.nodes[:nodes]]
    out = tempfile.mkdtemp(prefix="ranks-", dir=work)
    script = ("export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID MASTER_ADDR=%s "
              "MASTER_PORT=6000 GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1; exec %s %s --out %s --backend gloo "
              "--timeout 30 --sizes 1048576 --iters 3 --warmup 1" % (
                  bed.nodes[0].node_addr, bed.training_python, WORKER, out))
    argv = ["salloc", "-N%d" % nodes, "-w", ",".join(names), "--exclusive", "--no-kill", "-t", "10", "--",
            "srun", "-N%d" % nodes, "--ntasks-per-node=1", "bash", "-c", script]
    wall, _cpu, done = timed(argv, slurm.env())
    ok = all(json.load(open(os.path.join(out, "rank%d.json" % rank), encoding="utf-8")).get("status") == "ok"
             for rank in range(nodes))
    shutil.rmtree(out, ignore_errors=True)
    if done.returncode != 0 or not ok:
        raise SystemExit("the all-reduce by hand failed (exit %d): %s" % (done.returncode, done.stderr[-2000:]))
    return wall


def alternated(checkouts, run):
    """The checkouts in this run's order: alternated from one run to the next."""
    return list(checkouts) if run % 2 == 0 else list(reversed(checkouts))


def compare(name, values, lower_is_better=True):
    """Each checkout's median and min of ``values`` (``{label: [value per run]}``), and this one's over the other's."""
    for label, items in values.items():
        print("%s (%s): median %.3f, min %.3f" % (name, label, statistics.median(items), min(items)), flush=True)
    if len(values) == 2:
        this, other = values["this"], next(items for label, items in values.items() if label != "this")
        print("%s: this / the other checkout: median %.2fx, min %.2fx (%s is better)" % (
            name, statistics.median(this) / statistics.median(other), min(this) / min(other),
            "lower" if lower_is_better else "higher"), flush=True)


def bench_cpu(bed, slurm, work, runs, large, checkouts):
    rows = {checkout.label: [] for checkout in checkouts}
    for run in range(runs):
        for checkout in alternated(checkouts, run):
            order = [(4, "small"), (large, "large")] if run % 2 == 0 else [(large, "large"), (4, "small")]
            row = {}
            for nodes, label in order:
                row[nodes] = gate(bed, slurm, work, nodes, "cpu-%s-%d" % (label, run), checkout=checkout)
            per_node = (row[large][1] - row[4][1]) / (large - 4)
            rows[checkout.label].append(per_node)
            print("cpu run %d (%s): 4 nodes %.2f CPU-s (%.1f s wall), %d nodes %.2f CPU-s (%.1f s wall): %.3f CPU-s "
                  "per added node" % (run + 1, checkout.label, row[4][1], row[4][0], large, row[large][1],
                                      row[large][0], per_node), flush=True)
    compare("controller CPU per added node (srun engine, 4 vs %d nodes; target <= 0.05 CPU-s)" % large, rows)


def bench_launch(bed, slurm, work, runs, checkouts):
    rows = {checkout.label: [] for checkout in checkouts}
    for run in range(runs):
        first_hand = run % 2 == 1
        hand = by_hand(bed, slurm, work, 8) if first_hand else None
        for checkout in alternated(checkouts, run):
            gate_wall = gate(bed, slurm, work, 8, "launch-%d" % run, checkout=checkout)[0]
            rows[checkout.label].append(gate_wall)
        hand = hand if first_hand else by_hand(bed, slurm, work, 8)
        for checkout in checkouts:
            rows[checkout.label][-1] /= hand
            print("launch run %d (%s): gate / one srun by hand (%.1f s): %.2fx" % (
                run + 1, checkout.label, hand, rows[checkout.label][-1]), flush=True)
    compare("8-node gate (srun engine) vs the all-reduce by hand with one srun (target <= 1.3x)", rows)


def bench_sick(bed, slurm, work, runs, checkouts):
    rows = {checkout.label: [] for checkout in checkouts}
    for run in range(runs):
        sick_node = bed.nodes[1 + run % 7]
        for checkout in alternated(checkouts, run):

            def sick(checkout=checkout, sick_node=sick_node, run=run):
                bed.tc(sick_node, ["qdisc", "add", "dev", "eth0"] + THROTTLE)
                try:
                    return gate(bed, slurm, work, 8, "sick-%d" % run, expect_failed=sick_node.name,
                                checkout=checkout)[0]
                finally:
                    clear_throttles(bed)

            if run % 2 == 0:
                healthy, ill = gate(bed, slurm, work, 8, "healthy-%d" % run, checkout=checkout)[0], sick()
            else:
                ill, healthy = sick(), gate(bed, slurm, work, 8, "healthy-%d" % run, checkout=checkout)[0]
            rows[checkout.label].append(ill / healthy)
            print("sick run %d (%s): one throttled node (%s) %.1f s, healthy %.1f s: %.2fx" % (
                run + 1, checkout.label, sick_node.name, ill, healthy, ill / healthy), flush=True)
    compare("one sick node among 8 -> verdict vs a healthy gate (srun engine; target <= 3x)", rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=12, help="bed nodes (the cpu ratio's larger size)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", default="cpu,launch,sick")
    parser.add_argument("--against", metavar="DIR", help="another checkout (with its .venv) to measure in the same "
                                                         "run, alternated with this one")
    args = parser.parse_args()
    checkouts = [THIS] + ([Checkout(args.against, "other")] if args.against else [])
    wanted = set(args.only.split(","))
    work = tempfile.mkdtemp(prefix="bench-srun-")
    os.chmod(work, 0o711)
    try:
        with Testbed(nodes=args.nodes) as bed, SlurmCluster(bed, cpus=2) as slurm:
            srun_dir = os.path.join(bed.workdir, "srun")
            os.makedirs(srun_dir, mode=0o700, exist_ok=True)
            bed.write_inventory(group_vars={"preflight_srun_dir": srun_dir})
            # One gate first, untimed: caches warm, the archive on the nodes.
            for checkout in checkouts:
                gate(bed, slurm, work, 4, "warm-up", checkout=checkout)
            if "cpu" in wanted:
                bench_cpu(bed, slurm, work, args.runs, args.nodes, checkouts)
            if "launch" in wanted:
                bench_launch(bed, slurm, work, args.runs, checkouts)
            if "sick" in wanted:
                bench_sick(bed, slurm, work, args.runs, checkouts)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
