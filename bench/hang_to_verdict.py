#!/usr/bin/env python3
"""Hang to verdict: seconds from a rank hanging to the verdict, beyond the collective timeout.

Runs ``ansible-playbook preflight.yml -i inventory`` (the embedded default: this
machine, 2 ranks on gloo) with ``-e allreduce_timeout=T`` and a rendezvous
port of its own (``--port``, ``-e preflight_master_port``) in a subprocess,
watches the process table (/proc) for the run's worker ranks
(allreduce_worker.py with this run's MASTER_PORT, found as
tests/gate_helpers.py finds them) and SIGSTOPs one rank (``--rank``) as soon as
its result file says it entered the ``bandwidth`` stage.  When the playbook
exits it reads verdict.json's mtime and prints, per run,

    overhead = verdict time - SIGSTOP time - allreduce_timeout

(and the same from the playbook's exit), then the median over ``--runs``
(target: <= 15 s).  Every run must end with a failing verdict whose
suspect check names the stopped rank (its found text is printed), and with none
of the run's processes left; the stopped rank is SIGCONTed and SIGKILLed at the
end whatever happens.  Use the project's venv:
    .venv/bin/python bench/hang_to_verdict.py --runs 3
"""

import argparse
import glob
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

# pylint: disable=wrong-import-position
from gate_helpers import WORKER, cmdline, environ, proc_state, rank_stage, send_signal  # noqa: E402

TARGET = 15.0


def pids():
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def alive(pid):
    return proc_state(pid) not in (None, "Z", "X")


def is_worker(argv):
    return any(part.endswith(WORKER) for part in argv) and "torch.distributed.run" not in argv


def rank_processes(port):
    """{global rank: pid} of this run's worker ranks (not torchrun): the rendezvous port tells them
    from the ranks of anyone else's gate on this machine."""
    ranks = {}
    for pid in pids():
        argv = cmdline(pid)
        if not is_worker(argv) or not alive(pid):
            continue
        env = environ(pid)
        if env.get("MASTER_PORT") == str(port) and "RANK" in env:
            ranks[int(env["RANK"])] = pid
    return ranks


def run_processes(port):
    """Live pids of this run's gate: its ranks and their torchrun (by its --master-port)."""
    found = []
    for pid in pids():
        argv = cmdline(pid)
        if not alive(pid) or not any(part.endswith(WORKER) for part in argv):
            continue
        if "torch.distributed.run" in argv:
            if "--master-port" in argv and argv[argv.index("--master-port") + 1] == str(port):
                found.append(pid)
        elif environ(pid).get("MASTER_PORT") == str(port):
            found.append(pid)
    return found


def stop_in_bandwidth(proc, port, rank, poll, held):
    """SIGSTOP ``rank`` once it records the bandwidth stage (its pid goes in ``held`` first, for the release).

    Returns (pid, monotonic, wall) of the stop, or None when the rank got past the stage unseen
    or the playbook ended first."""
    pid = None
    while proc.poll() is None:
        if pid is None:
            pid = rank_processes(port).get(rank)
            if pid is None:
                time.sleep(poll)
                continue
        stage = rank_stage(pid, rank)
        if stage == "bandwidth":
            held.append(pid)
            os.kill(pid, signal.SIGSTOP)
            return pid, time.monotonic(), time.time()
        if stage == "done" or not alive(pid):
            return None
        time.sleep(poll)
    return None


def release(pid):
    """The stopped rank: continued then killed, if it is still one of the gate's workers."""
    if pid is not None and alive(pid) and is_worker(cmdline(pid)):
        send_signal(pid, signal.SIGCONT)
        send_signal(pid, signal.SIGKILL)


def suspect_checks(verdict, rank):
    """(name, host, found) of the failing checks that name ``rank``."""
    named = []
    for host, node in sorted((verdict.get("nodes") or {}).items()):
        for name, check in sorted(node.get("checks", {}).items()):
            if check.get("status") == "fail" and ("rank %d " % rank) in (check.get("found") or ""):
                named.append((name, host, check["found"]))
    return named


def one_run(args, env, workdir, number):
    results_dir = os.path.join(workdir, "run%s" % number)
    log_path = os.path.join(workdir, "run%s.log" % number)
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "preflight.yml", "-i", "inventory",
            "-e", "allreduce_timeout=%d" % args.timeout, "-e", "preflight_master_port=%d" % args.port,
            "-e", "preflight_results_dir=%s" % results_dir]
    stopped, held = None, []
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        stopped = stop_in_bandwidth(proc, args.port, args.rank, args.poll, held)
        proc.wait(timeout=args.timeout + 600)
        ended = time.monotonic()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in held:
            release(pid)
        time.sleep(1.0)  # the gate's own teardown has finished when the playbook exits; let the kill land
        left = run_processes(args.port)
        for pid in left:
            send_signal(pid, signal.SIGCONT)
            send_signal(pid, signal.SIGKILL)
    if stopped is None:
        return None
    pid, stop_mono, stop_wall = stopped
    found = glob.glob(os.path.join(results_dir, "[0-9]*", "verdict.json"))
    if len(found) != 1:
        with open(log_path, errors="replace") as handle:
            sys.stderr.write(handle.read()[-4000:])
        raise SystemExit("run %s: %d verdicts (rc %s)" % (number, len(found), proc.returncode))
    verdict_wall = os.stat(found[0]).st_mtime
    with open(found[0], encoding="utf-8") as handle:
        verdict = json.load(handle)
    return {"pid": pid, "rc": proc.returncode, "status": verdict.get("status"),
            "verdict": verdict_wall - stop_wall - args.timeout, "exit": ended - stop_mono - args.timeout,
            "named": suspect_checks(verdict, args.rank), "left": left,
            "allreduce": verdict.get("allreduce") or {}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=20, help="allreduce_timeout passed to the gate (s)")
    parser.add_argument("--rank", type=int, default=1, help="the rank to SIGSTOP")
    parser.add_argument("--port", type=int, default=29541,
                        help="preflight_master_port of the runs (tells this bench's ranks from anyone else's)")
    parser.add_argument("--poll", type=float, default=0.005, help="seconds between looks at the rank")
    parser.add_argument("--attempts", type=int, default=3,
                        help="tries per run when the rank gets through the bandwidth stage unseen")
    parser.add_argument("--keep", action="store_true", help="keep the run directories (verdicts, playbook logs)")
    args = parser.parse_args()
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    workdir = tempfile.mkdtemp(prefix="preflight-bench-hang-")
    overheads, exits, ok = [], [], True
    try:
        for number in range(1, args.runs + 1):
            result = None
            for attempt in range(1, args.attempts + 1):
                result = one_run(args, env, workdir, "%d_%d" % (number, attempt) if attempt > 1 else number)
                if result is not None:
                    break
                print("run %d attempt %d: rank %d passed the bandwidth stage unseen; again" % (
                    number, attempt, args.rank), flush=True)
            if result is None:
                raise SystemExit("run %d: never caught rank %d in the bandwidth stage" % (number, args.rank))
            overheads.append(result["verdict"])
            exits.append(result["exit"])
            good = result["status"] == "fail" and bool(result["named"]) and not result["left"]
            ok = ok and good
            print("run %d: SIGSTOP rank %d (pid %d) in bandwidth; verdict %s (rc %d) %.1f s after the stop, "
                  "overhead %.1f s beyond allreduce_timeout=%d (playbook exit: %.1f s); processes left: %s" % (
                      number, args.rank, result["pid"], result["status"], result["rc"],
                      result["verdict"] + args.timeout, result["verdict"], args.timeout, result["exit"],
                      result["left"] or "none"), flush=True)
            for name, host, found in result["named"] or [("-", "-", "NO failing check names rank %d" % args.rank)]:
                print("    %s/%s: %s" % (host, name, found), flush=True)
            print("    allreduce: status=%s suspects=%s" % (
                result["allreduce"].get("status"),
                ["rank %s on %s: %s" % (s.get("rank"), s.get("host"), s.get("reason"))
                 for s in result["allreduce"].get("suspects") or []]), flush=True)
        print("median overhead verdict - stop - timeout : %.1f s (min %.1f, max %.1f; target <= %.0f s)" % (
            statistics.median(overheads), min(overheads), max(overheads), TARGET))
        print("median overhead exit - stop - timeout    : %.1f s" % statistics.median(exits))
        print("every verdict failed, named rank %d and left no process: %s" % (args.rank, "yes" if ok else "NO"))
    finally:
        if args.keep:
            print("run directories kept in %s" % workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
