#!/usr/bin/env python3
"""Gate time of two checkouts on one bed: the healthy gate of ``--before`` (another worktree, with its own venv)
and of this checkout, in alternated pairs, in one run.

Brings up one bed as tests/multinode/test_gate_multinode.py does (3 nodes, two fabric rails, a docker0 and a DOWN
eth1 in every node; ssh trust brought up with this checkout's bringup.yml), then runs ``ansible-playbook
preflight.yml`` from each checkout in turn, ``--runs`` pairs, the order swapped every pair (before-after,
after-before, ...), and prints each checkout's median and min wall time and the ratios after/before (target: a
change that adds checks keeps the healthy gate within 5 %).  Every run must end with a passing verdict.

Needs root (namespaces).  Use the project's venv:
    .venv/bin/python bench/gate_before_after.py --before /path/to/other/worktree --runs 6
"""

import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

# pylint: disable=wrong-import-position
from multinode import BRINGUP_VARS, bench_parser, bench_workdir  # noqa: E402
from testbed import Testbed  # noqa: E402


def timed_gate(tree, bed, results_dir):
    """Seconds of one gate of ``tree`` (its own ansible-playbook, playbooks, roles and packages) on ``bed``; it must
    pass (exit 0: the verdict is pass)."""
    argv = [os.path.join(tree, ".venv", "bin", "ansible-playbook"), "preflight.yml", "-i", bed.inventory_path,
            "-e", "preflight_results_dir=%s" % results_dir]
    start = time.perf_counter()
    env = bed.ansible_env()
    # The tree's own configuration (library/, roles/, callback plugins) and venv, never this checkout's.
    env.update(ANSIBLE_CONFIG=os.path.join(tree, "ansible.cfg"),
               PATH=os.path.join(tree, ".venv", "bin") + os.pathsep + env["PATH"])
    done = subprocess.run(argv, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900,
                          check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.stderr.write(done.stdout.decode(errors="replace")[-4000:])
        raise SystemExit("the gate of %s did not pass (rc %d)" % (tree, done.returncode))
    return elapsed


def main():
    parser = bench_parser(__doc__, runs=(6, "timed pairs"), warmup=(1, "untimed pairs first"))
    parser.add_argument("--before", required=True, help="the other checkout (a worktree with its own .venv)")
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    args = parser.parse_args()
    before = os.path.abspath(args.before)
    if not os.access(os.path.join(before, ".venv", "bin", "ansible-playbook"), os.X_OK):
        raise SystemExit("%s has no .venv (scripts/bootstrap.sh there first)" % before)
    workdir = bench_workdir("before-after")
    try:
        run_bench(args, before, workdir)
    finally:
        if args.keep:
            print("run directories kept in %s" % workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def run_bench(args, before, workdir):
    trees = {"before": before, "after": ROOT}
    times = {"before": [], "after": []}
    with Testbed(nodes=3, fabric_rails=2, docker_bridge=True, down_iface=True) as bed:
        done = subprocess.run([os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "bringup.yml",
                               "-i", bed.inventory_path, "-e", BRINGUP_VARS,
                               "-e", "preflight_results_dir=%s" % os.path.join(workdir, "bringup")],
                              cwd=ROOT, env=bed.ansible_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=900, check=False)
        if done.returncode != 0:
            sys.stderr.write(done.stdout.decode(errors="replace")[-4000:])
            raise SystemExit("ssh trust bring-up failed on the bed")
        for index in range(args.warmup + args.runs):
            order = ("before", "after") if index % 2 == 0 else ("after", "before")
            for name in order:
                elapsed = timed_gate(trees[name], bed, os.path.join(workdir, "%s-%d" % (name, index)))
                if index >= args.warmup:
                    times[name].append(elapsed)
                print("pair %d %-6s %.2f s" % (index, name, elapsed), flush=True)
    for name in ("before", "after"):
        print("%-6s median %.2f s  min %.2f s  (%s)" % (name, statistics.median(times[name]), min(times[name]),
                                                        ", ".join("%.2f" % value for value in times[name])))
    print("after/before: median %.3f  min %.3f" % (statistics.median(times["after"]) / statistics.median(
        times["before"]), min(times["after"]) / min(times["before"])))


if __name__ == "__main__":
    main()
