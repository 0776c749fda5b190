#!/usr/bin/env python3
"""Localisation cost: rounds and seconds to a verdict that names one throttled node among N, vs a healthy gate.

Brings up one namespace test bed of ``--nodes`` nodes (tests/testbed.py; default 8, one rank per
node), brings up SSH trust with bringup.yml, then alternates, ``--runs`` times:

* a healthy ``preflight.yml`` (the all-node all-reduce only), and
* the same gate with one node's egress throttled with ``tc tbf`` (a different node each run),

and prints per run: the rounds the pair rounds took, the seconds they took (the verdict's
``localize.elapsed_seconds``, controller clock from the first plan to the conclusion), whether the
throttled node was the one named, the all-node all-reduce's own seconds (the slowest node's
``allreduce.ranks`` time in the healthy run), both playbooks' wall times, and whether the verdict failed
exactly the throttled node (the others proven by the confirmation run and in the hostfile).  Targets: <= 3
rounds, seconds to the verdict with one sick node <= 3x a healthy gate's.  ``--fault hard`` throttles so hard
that the all-node run cannot finish within its hard timeout (the bandwidth deadline ends it as slow);
``mild`` (default) lets it finish below the floor.  Needs root (namespaces).  Use the project's venv:
    .venv/bin/python bench/localize.py --nodes 8 --runs 2 [--fault hard]
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

# pylint: disable=wrong-import-position
from multinode import BRINGUP_VARS, bench_workdir  # noqa: E402
from testbed import Testbed  # noqa: E402

THROTTLES = {"mild": ["root", "tbf", "rate", "20mbit", "burst", "32kbit", "latency", "400ms"],
             "hard": ["root", "tbf", "rate", "8mbit", "burst", "32kbit", "latency", "400ms"]}
# Small sizes: the all-node run and each pair run stay short on a 2-core machine (as the bed tests do).
GATE_VARS = {"mild": {"allreduce_sizes": [1048576], "allreduce_iters": 3, "allreduce_warmup": 1,
                      "allreduce_floor_busbw_gbps_gloo": 0.01, "allreduce_floor_relative": 0.7,
                      "preflight_nproc_per_node": 1},
             # Seven 4 MiB collectives at 8 Mbit/s outlast the 45 s hard timeout; the deadline ends them first.
             "hard": {"allreduce_sizes": [4194304], "allreduce_iters": 5, "allreduce_warmup": 2,
                      "allreduce_timeout": 20, "allreduce_hard_timeout": 45, "allreduce_slow_grace": 3,
                      "allreduce_floor_busbw_gbps_gloo": 0.01, "allreduce_floor_relative": 0.7,
                      "preflight_nproc_per_node": 1}}
RANKS_SECONDS = re.compile(r"completed init, correctness, barrier and bandwidth in ([0-9.]+) s")


def gate(bed, results_dir, gate_vars, log=None):
    """One gate: ``(wall seconds, verdict)``; its output (each task's time on every node) goes to ``log``."""
    argv = [os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "preflight.yml", "-i", bed.inventory_path,
            "-e", json.dumps(gate_vars), "-e", "preflight_results_dir=%s" % results_dir]
    start = time.perf_counter()
    with open(log or os.devnull, "w", encoding="utf-8") as out, subprocess.Popen(
            argv, cwd=ROOT, env=bed.ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        watchdog = threading.Timer(1800, proc.kill)
        watchdog.start()
        try:
            # Each line with the seconds since the start: where a gate's time goes.
            for line in proc.stdout:
                out.write("[%7.1fs] %s" % (time.perf_counter() - start, line.decode(errors="replace")))
            proc.wait(timeout=60)
        finally:
            watchdog.cancel()
    elapsed = time.perf_counter() - start
    with open(os.path.join(results_dir, "latest", "verdict.json"), encoding="utf-8") as handle:
        return elapsed, json.load(handle)


def all_node_seconds(verdict):
    """The all-node all-reduce's own time: the slowest node's torchrun from launch to its last rank done."""
    seconds = []
    for node in verdict["nodes"].values():
        match = RANKS_SECONDS.search((node["checks"].get("allreduce.ranks") or {}).get("found", ""))
        if match:
            seconds.append(float(match.group(1)))
    return max(seconds) if seconds else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--fault", choices=sorted(THROTTLES), default="mild")
    parser.add_argument("--logs", help="a directory for every gate's output (the time each task took)")
    parser.add_argument("--keep", action="store_true", help="keep the gates' run directories (printed at the end)")
    args = parser.parse_args()
    if args.logs:
        os.makedirs(args.logs, exist_ok=True)
    workdir = bench_workdir("localize")
    try:
        with Testbed(nodes=args.nodes) as bed:
            run_bench(args, bed, workdir)
    finally:
        if args.keep:
            print("run directories kept in %s" % workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def run_bench(args, bed, workdir):
    done = subprocess.run([os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "bringup.yml",
                           "-i", bed.inventory_path, "-e", BRINGUP_VARS,
                           "-e", "preflight_results_dir=%s" % os.path.join(workdir, "bringup")],
                          cwd=ROOT, env=bed.ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=900, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stdout.decode(errors="replace")[-4000:])
        raise SystemExit("ssh trust bring-up failed on the bed")
    print("bed %s: %d nodes x 1 rank, %d logical CPUs on this machine" % (bed.runid, args.nodes, os.cpu_count()),
          flush=True)
    rows = []
    for run in range(args.runs):
        healthy_wall, healthy = gate(bed, os.path.join(workdir, "healthy-%d" % run), GATE_VARS[args.fault],
                                     log=args.logs and os.path.join(args.logs, "healthy-%d.log" % run))
        if healthy["status"] != "pass":
            raise SystemExit("the healthy gate did not pass: %s" % healthy["failed_hosts"])
        all_node = all_node_seconds(healthy)
        node = bed.nodes[(2 + 3 * run) % len(bed.nodes)]
        bed.tc(node, ["qdisc", "add", "dev", "eth0"] + THROTTLES[args.fault])
        try:
            throttled_wall, throttled = gate(bed, os.path.join(workdir, "throttled-%d" % run), GATE_VARS[args.fault],
                                             log=args.logs and os.path.join(args.logs, "throttled-%d.log" % run))
        finally:
            bed.tc(node, ["qdisc", "del", "dev", "eth0", "root"])
        localize = throttled.get("localize") or {}
        named = localize.get("bad") == [node.name]
        others = sorted(other.name for other in bed.nodes if other is not node)
        alone = throttled["failed_hosts"] == [node.name] and sorted(throttled["healthy_hosts"]) == others
        rows.append({"rounds": localize.get("rounds_run"), "seconds": localize.get("elapsed_seconds"),
                     "all_node": all_node, "named": named, "healthy_wall": healthy_wall,
                     "throttled_wall": throttled_wall, "alone": alone})
        for item in localize.get("rounds") or []:
            print("  round %d: %s" % (item["round"], "; ".join(
                "%s %s step %d %s %s%s" % (launch["kind"], "+".join(launch["hosts"]), launch["step"], launch["verdict"],
                                          launch["busbw_gbps"], " (%s)" % launch["why"] if launch.get("why") else "")
                for launch in item["launches"])), flush=True)
        print("run %d: failed %s, healthy %d of %d (the others %s), confirmation run %s; verdict %.2fx the healthy "
              "gate's seconds" % (run + 1, throttled["failed_hosts"], len(throttled["healthy_hosts"]), len(others),
                                  "all proven" if alone else "NOT all proven",
                                  (localize.get("confirm") or {}).get("status"), throttled_wall / healthy_wall),
              flush=True)
        print("run %d: throttled %s -> named %s (%s), %s round(s) in %s s; all-node all-reduce %.1f s "
              "(healthy gate %.1f s wall, throttled gate %.1f s wall); launches per round: %s" % (
                  run + 1, node.name, localize.get("bad"), "right" if named else "WRONG", localize.get("rounds_run"),
                  localize.get("elapsed_seconds"), all_node or float("nan"), healthy_wall, throttled_wall,
                  [len(item["launches"]) for item in localize.get("rounds") or []]), flush=True)
    seconds = [row["seconds"] for row in rows if row["seconds"] is not None]
    all_node = [row["all_node"] for row in rows if row["all_node"]]
    print("named the throttled node: %d of %d runs, and only it failed in %d; rounds: %s (target <= 3)" % (
        sum(row["named"] for row in rows), len(rows), sum(row["alone"] for row in rows),
        [row["rounds"] for row in rows]))
    ratios = [row["throttled_wall"] / row["healthy_wall"] for row in rows]
    print("seconds to the verdict, one sick node vs healthy (%s throttle, %d nodes): median %.2fx, min %.2fx, "
          "max %.2fx (target <= 3x)" % (args.fault, args.nodes, statistics.median(ratios), min(ratios), max(ratios)))
    if seconds and all_node:
        print("median localisation %.1f s vs median all-node all-reduce %.1f s: %.2fx (target <= 3x); "
              "vs the healthy gate's whole wall time %.2fx" % (
                  statistics.median(seconds), statistics.median(all_node),
                  statistics.median(seconds) / statistics.median(all_node),
                  statistics.median(seconds) / statistics.median(row["healthy_wall"] for row in rows)))


if __name__ == "__main__":
    main()
