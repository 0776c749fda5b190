#!/usr/bin/env python3
"""Gate overhead: full preflight playbook vs a bare torchrun of the same worker.

Runs both, alternating, ``--runs`` times each in one process and prints the
median wall times and their ratio (target: <= 1.5x).  Use the project's venv:
    .venv/bin/python bench/gate_overhead.py --runs 5
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "roles", "allreduce", "files", "allreduce_worker.py")


def timed(argv, env=None, cwd=None):
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.stderr.write(done.stdout.decode(errors="replace")[-3000:])
        raise SystemExit("command failed (%d): %s" % (done.returncode, " ".join(argv)))
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--port", type=int, default=6000)
    args = parser.parse_args()
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    results_dir = tempfile.mkdtemp(prefix="preflight-bench-")
    bare_argv = [os.path.join(bindir, "torchrun"), "--nproc-per-node", "2", "--master-port", str(args.port),
                 WORKER, "--out", tempfile.mkdtemp(prefix="preflight-bench-bare-")]
    gate_argv = [os.path.join(bindir, "ansible-playbook"), "preflight.yml", "-i", "inventory",
                 "-e", "preflight_results_dir=%s" % results_dir]
    bare, gate = [], []
    for run in range(args.runs):
        bare.append(timed(bare_argv, env=env))
        gate.append(timed(gate_argv, env=env, cwd=ROOT))
        print("run %d: bare torchrun %.2f s, preflight.yml %.2f s" % (run + 1, bare[-1], gate[-1]), flush=True)
    mb, mg = statistics.median(bare), statistics.median(gate)
    print("median bare torchrun   : %.2f s" % mb)
    print("median preflight.yml   : %.2f s" % mg)
    print("ratio preflight / bare : %.2fx median, %.2fx min of the pairs (target <= 1.5x)" % (
        mg / mb, min(g / b for g, b in zip(gate, bare))))


if __name__ == "__main__":
    main()
