#!/usr/bin/env python3
"""A stand-in for ``srun`` in the unit tests of the srun engine's step runner (cluster_preflight/engine/step.py):
it starts the step's command once per task on this machine, as Slurm would on each node (``SLURMD_NODENAME``,
``SLURM_LOCALID``, ``SLURM_PROCID``, ``SLURM_NTASKS``), hands each task its own copy of standard input and
forwards their output line by line.  The bed's tests run the real Slurm (tests/slurm_bed.py); this one plays what
the bed cannot make happen on demand:

* ``FAKE_SRUN_DOWN=node,...``: Slurm cannot launch there; the others are started, then the step is aborted with
  the words srun 22.05 uses (``Task launch for StepId=... failed on node ...``);
* ``FAKE_SRUN_SILENT=node``: that node's tasks stop (SIGSTOP) once started, as a node that died holds its tasks'
  connections open;
* ``FAKE_SRUN_LOG=path``: its own argv, one JSON line per run.

As the real one does, it orders the step's nodes its own way (sorted by name here, Slurm's node table order there,
whatever order ``--nodelist`` gives), numbers the tasks in that order, prints with ``--verbose`` which tasks it
launches on which node (``srun: launching StepId=... on host N, K tasks: [a-b]``) and with ``--label`` puts the task
number before every line a task prints, on standard output and standard error.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time


def _option(argv, name):
    for item in argv:
        if item.startswith(name + "="):
            return item.split("=", 1)[1]
    return None


def _expand(text):
    import hostlist  # pylint: disable=import-outside-toplevel
    return hostlist.expand_hostlist(text)


def main():
    argv = sys.argv[1:]
    if os.environ.get("FAKE_SRUN_LOG"):
        with open(os.environ["FAKE_SRUN_LOG"], "a", encoding="utf-8") as handle:
            handle.write(json.dumps(argv) + "\n")
    # Slurm's order, not the order given (its node table's; sorted here).
    nodes = sorted(_expand(_option(argv, "--nodelist")))
    tasks = int(_option(argv, "--ntasks-per-node") or 1)
    start = next(index for index, item in enumerate(argv) if not item.startswith("-"))
    options, command = argv[:start], argv[start:]
    label = "--label" in options or "-l" in options
    verbose = "--verbose" in options or "-v" in options
    width = len(str(max(tasks * len(nodes) - 1, 0)))
    data = sys.stdin.buffer.read()
    down = set(filter(None, os.environ.get("FAKE_SRUN_DOWN", "").split(",")))
    silent = os.environ.get("FAKE_SRUN_SILENT", "")
    lock = threading.Lock()
    procs = []
    for index, node in enumerate(nodes):
        if node in down:
            continue
        if verbose:
            ids = "%d" % (index * tasks) if tasks == 1 else "[%d-%d]" % (index * tasks, index * tasks + tasks - 1)
            print("srun: launching StepId=7.0 on host %s, %d tasks: %s" % (node, tasks, ids), file=sys.stderr,
                  flush=True)
        for local in range(tasks):
            task = index * tasks + local
            env = dict(os.environ, SLURMD_NODENAME=node, SLURM_LOCALID=str(local),
                       SLURM_PROCID=str(task), SLURM_NTASKS=str(tasks * len(nodes)))
            proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,  # pylint: disable=consider-using-with
                                    stderr=subprocess.PIPE if label else None, env=env)
            procs.append((node, proc))
            prefix = ("%*d: " % (width, task)).encode() if label else b""
            threading.Thread(target=_feed, args=(proc, data), daemon=True).start()
            threading.Thread(target=_forward, args=(proc.stdout, sys.stdout.buffer, prefix, lock, proc,
                                                    node == silent), daemon=True).start()
            if label:
                threading.Thread(target=_forward, args=(proc.stderr, sys.stderr.buffer, prefix, lock, proc, False),
                                 daemon=True).start()
    if down:
        time.sleep(0.5)
        for node in sorted(down):
            print("srun: error: Task launch for StepId=7.3 failed on node %s: Communication connection failure"
                  % node, file=sys.stderr, flush=True)
        print("srun: error: Application launch failed: Communication connection failure", file=sys.stderr)
        for _node, proc in procs:
            proc.kill()
        print("srun: Job step aborted", file=sys.stderr, flush=True)
        return 233
    signal.signal(signal.SIGINT, lambda *_: [proc.kill() for _node, proc in procs])
    for _node, proc in procs:
        while proc.poll() is None:
            time.sleep(0.05)
    return 0


def _feed(proc, data):
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except OSError:
        pass


def _forward(source, sink, prefix, lock, proc, silence):
    for line in iter(source.readline, b""):
        with lock:
            sink.write(prefix + line)
            sink.flush()
        if silence:
            os.kill(proc.pid, signal.SIGSTOP)
            return


if __name__ == "__main__":
    sys.exit(main())
