#!/usr/bin/env python3
"""Gate scaling: preflight.yml over 2 nodes vs 8 nodes of the namespace test bed.

Brings up one bed (tests/testbed.py: one network namespace, sshd and process
table per node, a fabric link each), then times ``ansible-playbook
preflight.yml`` over the first 2 nodes and over all 8 nodes, one rank per
node, alternating, ``--runs`` times each, and prints the medians and their
ratio (target: 8-node <= 1.3x the 2-node time: the gate fans out, it does not
walk the nodes one by one).  Every run must end with a passing verdict.

Needs root (namespaces).  Use the project's venv:
    .venv/bin/python bench/multinode.py --runs 3
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

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

# pylint: disable=wrong-import-position
from testbed import Testbed, unavailable_reason  # noqa: E402


# The gate audits node-to-node SSH trust: bring the nodes up first with bringup.yml for that
# capability alone (known host keys; no cluster user key, since the nodes share this machine's /root).
BRINGUP_VARS = '{"preflight_bringup_capabilities": ["ssh_trust"]}'


def machine_cpu_seconds():
    """CPU time this machine spent busy (all processes, all CPUs) since boot."""
    with open("/proc/stat", encoding="ascii") as handle:
        fields = [int(x) for x in handle.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def controller_cpu_seconds():
    """CPU time of this process's finished children: ansible-playbook, its forks and
    their ssh clients (the controller's share; the nodes' processes are sshd's)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def write_inventory(bed, names, path):
    """The bed's inventory restricted to ``names`` (the verdict covers exactly these)."""
    inventory = bed.inventory()
    group = inventory["all"]["children"]["cluster"]
    group["hosts"] = {name: group["hosts"][name] for name in names}
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(inventory, handle, default_flow_style=False, sort_keys=False)
    return path


def timed_gate(bed, inventory, results_dir, extra):
    argv = [os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "preflight.yml", "-i", inventory,
            "-e", "preflight_results_dir=%s" % results_dir] + extra
    start, cpu, own = time.perf_counter(), machine_cpu_seconds(), controller_cpu_seconds()
    done = subprocess.run(argv, cwd=ROOT, env=bed.ansible_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=900, check=False)
    elapsed, cpu = time.perf_counter() - start, machine_cpu_seconds() - cpu
    own = controller_cpu_seconds() - own
    with open(os.path.join(results_dir, "latest", "verdict.json"), encoding="utf-8") as handle:
        verdict = json.load(handle)
    if done.returncode != 0 or verdict["status"] != "pass":
        sys.stderr.write(done.stdout.decode(errors="replace")[-4000:])
        raise SystemExit("gate did not pass (rc %d, verdict %s): %s" % (
            done.returncode, verdict["status"], " ".join(argv)))
    return elapsed, cpu, own, verdict


def bench_workdir(name):
    """A fresh work directory for the bench ``name``; exits when the test bed is unavailable."""
    reason = unavailable_reason()
    if reason:
        raise SystemExit("test bed unavailable: %s" % reason)
    return tempfile.mkdtemp(prefix="preflight-bench-%s-" % name)


def bench_parser(doc, **counts):
    """A bench's argument parser, described by ``doc``'s first line, with an integer option per entry
    of ``counts``: ``name=(default, help)`` is ``--name``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    for name, (default, text) in counts.items():
        parser.add_argument("--" + name, type=int, default=default, help=text)
    return parser


def main():
    parser = bench_parser(__doc__, runs=(3, "timed runs per size"), small=(2, "nodes in the small run"),
                          large=(8, "nodes in the large run (the bed's size)"),
                          warmup=(1, "untimed runs per size first"))
    parser.add_argument("--keep", action="store_true", help="keep the run directories (verdicts, logs)")
    parser.add_argument("--forks", type=int, default=0,
                        help="ansible forks (0: ansible.cfg's 64); fewer forks than nodes runs the mesh in batches")
    args = parser.parse_args()
    workdir = bench_workdir("multinode")
    try:
        run_bench(args, workdir)
    finally:
        if args.keep:
            print("run directories kept in %s" % workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def run_bench(args, workdir):
    # One rank per node: the gate's fan-out, not 2 cores' share of 16 ranks, is measured.
    extra = ["-e", "preflight_nproc_per_node=1"] + (["--forks", str(args.forks)] if args.forks else [])
    with Testbed(nodes=args.large, fabric=True) as bed:
        done = subprocess.run([os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "bringup.yml",
                               "-i", bed.inventory_path, "-e", BRINGUP_VARS,
                               "-e", "preflight_results_dir=%s" % os.path.join(workdir, "bringup")],
                              cwd=ROOT, env=bed.ansible_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=900, check=False)
        if done.returncode != 0:
            sys.stderr.write(done.stdout.decode(errors="replace")[-4000:])
            raise SystemExit("ssh trust bring-up failed on the bed")
        names = [node.name for node in bed.nodes]
        inventories = {
            args.small: write_inventory(bed, names[:args.small], os.path.join(workdir, "small.yml")),
            args.large: write_inventory(bed, names, os.path.join(workdir, "large.yml")),
        }
        times = {args.small: [], args.large: []}
        cpus = {args.small: [], args.large: []}
        owns = {args.small: [], args.large: []}
        print("bed %s: %d nodes, %d logical CPUs on this machine" % (bed.runid, args.large, os.cpu_count()),
              flush=True)
        for run in range(args.warmup + args.runs):
            line = []
            # Alternate which size goes first, so drift in the machine's load hits both.
            order = (args.small, args.large) if run % 2 == 0 else (args.large, args.small)
            for size in order:
                elapsed, cpu, own, verdict = timed_gate(bed, inventories[size],
                                                        os.path.join(workdir, "r%d-%d" % (run, size)), extra)
                assert verdict["allreduce"]["world_size"] == size, verdict["allreduce"]
                if run >= args.warmup:
                    times[size].append(elapsed)
                    cpus[size].append(cpu)
                    owns[size].append(own)
                line.append("%d nodes %.2f s (CPU: machine %.0f s, controller %.1f s)" % (size, elapsed, cpu, own))
            label = "warm-up" if run < args.warmup else "run %d" % (run - args.warmup + 1)
            print("%s: %s" % (label, ", ".join(line)), flush=True)
    small, large = statistics.median(times[args.small]), statistics.median(times[args.large])
    print("median preflight.yml, %d nodes x 1 rank : %.2f s" % (args.small, small))
    print("median preflight.yml, %d nodes x 1 rank : %.2f s" % (args.large, large))
    print("ratio %d-node / %d-node              : %.2fx (target <= 1.3x)" % (args.large, args.small, large / small))
    # Busy CPU of the whole machine per wall second: near the CPU count means the
    # run was bound by this machine's cores (every node shares them), not serial.
    # The controller's CPU is what grows with the node count on a real cluster,
    # where each node's share runs on that node's own CPUs.
    for size in (args.small, args.large):
        print("%d nodes: median CPU %.0f s (controller %.1f s) over %.0f s wall = %.2f of %d CPUs busy" % (
            size, statistics.median(cpus[size]), statistics.median(owns[size]), statistics.median(times[size]),
            statistics.median(cpus[size]) / statistics.median(times[size]), os.cpu_count()))
    per_node = (statistics.median(owns[args.large]) - statistics.median(owns[args.small])) / (args.large - args.small)
    print("controller CPU per added node: %.2f CPU-s (target <= 1)" % per_node)


if __name__ == "__main__":
    main()
