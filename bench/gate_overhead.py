#!/usr/bin/env python3
"""Gate overhead: full preflight playbook vs a bare torchrun of the same worker.

Runs both, alternating, ``--runs`` times each in one process and prints the
median wall times and their ratio (target: <= 1.5x).  Use the project's venv:
    .venv/bin/python bench/gate_overhead.py --runs 5

With ``--floor`` (the default) a third command runs in each round: Ansible's
floor, an ``ansible-playbook`` whose only task is the project's ``allreduce``
module with the gate's defaults (no audit, no decision, no verdict).  What the
gate costs beyond that floor is the preflight's own overhead; the floor itself
is Ansible's start-up and one module call.
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


FLOOR_PLAYBOOK = """- name: Ansible's floor, the all-reduce module alone
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Run the all-reduce with the gate's defaults
      allreduce:
        python: "{{{{ ansible_playbook_python }}}}"
        worker_source: "{{{{ lookup('ansible.builtin.file', '{worker}') }}}}"
        nnodes: 1
        node_rank: 0
        nproc_per_node: 2
        master_addr: 127.0.0.1
        master_port: {port}
        socket_ifname: lo
        role: localhost
        # The account the embedded default names (this bench runs as the one who built .venv).
        run_as: "{{{{ lookup('ansible.builtin.pipe', 'id -un') }}}}"
        job: {{user: "{{{{ lookup('ansible.builtin.pipe', 'id -un') }}}}", named: true}}
        sizes: {sizes}
        iters: {iters}
        warmup: {warmup}
"""


def floor_argv(bindir, port):
    """The floor command: a playbook of the allreduce module alone, with the allreduce role's defaults."""
    import yaml
    with open(os.path.join(ROOT, "roles", "allreduce", "defaults", "main.yml")) as handle:
        defaults = yaml.safe_load(handle)
    path = os.path.join(tempfile.mkdtemp(prefix="preflight-bench-floor-"), "floor.yml")
    with open(path, "w") as handle:
        handle.write(FLOOR_PLAYBOOK.format(worker=WORKER, port=port, sizes=defaults["allreduce_sizes"],
                                           iters=defaults["allreduce_iters"], warmup=defaults["allreduce_warmup"]))
    return [os.path.join(bindir, "ansible-playbook"), "-i", "localhost,", "-c", "local",
            "-e", "ansible_python_interpreter=%s" % sys.executable, path]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--port", type=int, default=6000)
    parser.add_argument("--floor", action=argparse.BooleanOptionalAction, default=True,
                        help="also time Ansible's floor: the allreduce module alone in a playbook")
    args = parser.parse_args()
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    results_dir = tempfile.mkdtemp(prefix="preflight-bench-")
    bare_argv = [os.path.join(bindir, "torchrun"), "--nproc-per-node", "2", "--master-port", str(args.port),
                 WORKER, "--out", tempfile.mkdtemp(prefix="preflight-bench-bare-")]
    gate_argv = [os.path.join(bindir, "ansible-playbook"), "preflight.yml", "-i", "inventory",
                 "-e", "preflight_results_dir=%s" % results_dir]
    floor_cmd = floor_argv(bindir, args.port) if args.floor else None
    floor_env = dict(env, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    bare, gate, floor = [], [], []
    for run in range(args.runs):
        bare.append(timed(bare_argv, env=env))
        gate.append(timed(gate_argv, env=env, cwd=ROOT))
        line = "run %d: bare torchrun %.2f s, preflight.yml %.2f s" % (run + 1, bare[-1], gate[-1])
        if floor_cmd:
            floor.append(timed(floor_cmd, env=floor_env, cwd=ROOT))
            line += ", floor %.2f s" % floor[-1]
        print(line, flush=True)
    mb, mg = statistics.median(bare), statistics.median(gate)
    print("median bare torchrun   : %.2f s" % mb)
    print("median preflight.yml   : %.2f s" % mg)
    print("ratio preflight / bare : %.2fx median, %.2fx min of the pairs (target <= 1.5x)" % (
        mg / mb, min(g / b for g, b in zip(gate, bare))))
    if floor:
        mf = statistics.median(floor)
        print("median floor           : %.2f s (ansible-playbook running only the allreduce module)" % mf)
        print("ratio floor / bare     : %.2fx median, %.2fx min of the pairs" % (
            mf / mb, min(f / b for f, b in zip(floor, bare))))
        print("preflight beyond floor : %.2f s median (the audit, the decisions and the verdict)" % (mg - mf))


if __name__ == "__main__":
    main()
