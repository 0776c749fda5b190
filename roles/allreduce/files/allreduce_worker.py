#!/usr/bin/env python3
"""All-reduce gate worker: one process per rank, launched by torchrun.

What every rank does, in order (each stage is recorded in its JSON result as
it is reached, so a rank that hangs or dies is known by the last stage it
entered):

1. ``init``        init_process_group with a bounded timeout.
2. ``correctness`` an all-reduce whose expected result is exact and differs per
                   element and per rank; every element is compared.
3. ``barrier``     monitored_barrier (gloo names the ranks that did not
                   arrive); on NCCL a side gloo group carries it.
4. ``bandwidth``   timed all-reduce at a few sizes, algbw and busbw as
                   nccl-tests computes them.  With ``--bandwidth-deadline``
                   a watchdog marks the rank ``slow`` (with the busbw it
                   reached) when the stage outlives the time the sizes take
                   at the floor busbw; with ``--bandwidth-grace`` as soon as
                   the collective in flight is late against the same floor
                   (the ones before it and it at the floor, plus the grace).
                   The node's gate then takes the stacks and ends the run
                   instead of waiting for the hard timeout.
5. ``done``

The result file is ``<out>/rank<RANK>.json``; it is rewritten atomically at
every stage.  The self-test options (--selftest-fault) let an operator prove
that the gate catches a bad rank; they are off by default.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import sys
import threading
import time
import traceback
import warnings

STAGES = ("start", "init", "correctness", "barrier", "bandwidth", "done")
# float32 represents every integer below 2**24 exactly, so sums of the pattern
# below are exact for any realistic world size and element count.
PATTERN_PERIOD = 13


def expected_value(index, world_size):
    """Element ``index`` of the reduced tensor: sum over ranks r of (r + 1) * (index % P + 1)."""
    return (index % PATTERN_PERIOD + 1) * world_size * (world_size + 1) // 2


def rank_value(index, rank):
    """What rank ``rank`` contributes at element ``index``."""
    return (rank + 1) * (index % PATTERN_PERIOD + 1)


def algbw_gbps(size_bytes, seconds):
    """Algorithm bandwidth in GB/s (1e9 bytes), as nccl-tests reports it."""
    if seconds <= 0:
        return 0.0
    return size_bytes / seconds / 1e9


def busbw_gbps(size_bytes, seconds, world_size):
    """All-reduce bus bandwidth: algbw * 2(n-1)/n (nccl-tests' formula)."""
    if world_size <= 1:
        return algbw_gbps(size_bytes, seconds)
    return algbw_gbps(size_bytes, seconds) * 2 * (world_size - 1) / world_size


class Recorder:
    """Writes this rank's result file atomically after every change."""

    def __init__(self, out_dir, rank):
        self.path = os.path.join(out_dir, "rank%d.json" % rank)
        self.data = {
            "rank": rank,
            "local_rank": int(os.environ.get("LOCAL_RANK", 0)),
            "node_rank": int(os.environ.get("GROUP_RANK", 0)),
            "world_size": int(os.environ.get("WORLD_SIZE", 1)),
            "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            # Who the rank ran as: the gate proves what the job's user can do, not root.
            "uid": os.getuid(),
            "stage": "start",
            "stages": {},
            "status": "running",
        }
        self._t0 = time.monotonic()
        # The bandwidth watchdog writes from its own thread.
        self.lock = threading.Lock()
        self.write()

    def stage(self, name):
        with self.lock:
            self.data["stage"] = name
            self.data["stages"][name] = round(time.monotonic() - self._t0, 4)
            self._write()

    def write(self):
        with self.lock:
            self._write()

    def _write(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as handle:
            json.dump(self.data, handle, indent=1, sort_keys=True)
        os.replace(tmp, self.path)


def versions(torch):
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "nccl": None,
        "cuda_available": torch.cuda.is_available(),
        "device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }
    if torch.cuda.is_available():
        try:
            version = torch.cuda.nccl.version()
            info["nccl"] = ".".join(str(part) for part in version) if isinstance(version, tuple) else str(version)
        except Exception as exc:  # NCCL missing from this build: report, don't die
            info["nccl"] = "unavailable: %s" % exc
    return info


def check_correctness(torch, dist, device, world_size, rank, numel, corrupt=False):
    """All-reduce a rank- and index-dependent tensor; count wrong elements."""
    index = torch.arange(numel, dtype=torch.int64, device=device)
    pattern = (index % PATTERN_PERIOD + 1).to(torch.float32)
    tensor = pattern * float(rank + 1)
    if corrupt:
        tensor[numel // 2] += 1.0
    dist.all_reduce(tensor)
    expected = pattern * float(world_size * (world_size + 1) // 2)
    wrong = (tensor != expected).nonzero().flatten()
    first = None
    if wrong.numel():
        bad = int(wrong[0])
        first = {"index": bad, "got": float(tensor[bad]), "expected": float(expected[bad])}
    return int(wrong.numel()), first


class Progress:
    """How far the bandwidth stage got, for the watchdog: collectives issued and their bus bytes; ``plan``: the
    bytes of every collective of the sweep in order (warm-up and timed, each size)."""

    def __init__(self, world_size, plan=()):
        self.factor = 2.0 * (world_size - 1) / world_size if world_size > 1 else 1.0
        self.plan = list(plan)
        self.started = time.monotonic()
        self.size_bytes = 0
        self.collectives = 0
        self.bus_bytes = 0.0
        self.finished = threading.Event()

    def step(self, size_bytes):
        self.size_bytes = size_bytes
        self.collectives += 1
        self.bus_bytes += size_bytes * self.factor

    def reached(self):
        """The busbw reached so far over the whole stage, in GB/s."""
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return round(self.bus_bytes / elapsed / 1e9, 6)


def late(progress, deadline, grace, elapsed):
    """The deadline the bandwidth stage is past after ``elapsed`` seconds, or None: the whole ``deadline``, or,
    with ``grace`` (the part of it that is start-up, >= 0), the collective in flight's: the time it and those
    before it take at the floor (the sweep's bus bytes over ``deadline - grace``) plus the grace.  A run slower
    than the floor then ends when its first late collective shows it, not after the time the whole sweep takes."""
    if elapsed >= deadline:
        return deadline
    if grace is None or grace < 0 or deadline <= grace or not progress.plan:
        return None
    total = sum(progress.plan)
    due = grace + (deadline - grace) * sum(progress.plan[:progress.collectives + 1]) / total if total else deadline
    return due if elapsed > due else None


def watch_bandwidth(rec, progress, deadline, grace=None):
    """Mark the rank ``slow`` once the bandwidth stage is late (:func:`late`); the node's gate ends it."""
    due = None
    while due is None:
        if progress.finished.wait(0.1):
            return
        due = late(progress, deadline, grace, time.monotonic() - progress.started)
    with rec.lock:
        if progress.finished.is_set() or rec.data.get("stage") != "bandwidth":
            return
        rec.data["status"] = "slow"
        rec.data["slow"] = {
            "deadline_seconds": round(due, 3),
            "elapsed_seconds": round(time.monotonic() - progress.started, 3),
            "size_bytes": progress.size_bytes,
            "collectives_done": progress.collectives,
            "busbw_reached_gbps": progress.reached(),
        }
        rec._write()  # pylint: disable=protected-access
    print("preflight: rank %d is slow: the bandwidth stage outlived its deadline of %.1f s at busbw %.4f GB/s" % (
        rec.data["rank"], due, rec.data["slow"]["busbw_reached_gbps"]), file=sys.stderr, flush=True)


def measure(torch, dist, device, world_size, size_bytes, iters, warmup, sync, progress=None):
    numel = max(1, size_bytes // 4)
    tensor = torch.ones(numel, dtype=torch.float32, device=device)
    step = progress.step if progress is not None else (lambda _size: None)
    for _ in range(warmup):
        dist.all_reduce(tensor)
        step(numel * 4)
    sync()
    # Every rank starts the timed loop together, as nccl-tests do.
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
        step(numel * 4)
    sync()
    seconds = (time.perf_counter() - start) / iters
    size = numel * 4
    return {
        "size_bytes": size,
        "time_us": round(seconds * 1e6, 1),
        "algbw_gbps": round(algbw_gbps(size, seconds), 4),
        "busbw_gbps": round(busbw_gbps(size, seconds, world_size), 4),
    }


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".", help="directory for rank<N>.json")
    parser.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="seconds for init_process_group and every collective")
    parser.add_argument("--sizes", default="1048576,4194304,16777216",
                        help="comma list of all-reduce sizes in bytes for the bandwidth stage")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--bandwidth-deadline", type=float, default=0.0,
                        help="seconds the bandwidth stage may take (the sizes at the floor busbw, plus start-up); "
                             "past it the rank is marked slow. 0: no deadline")
    parser.add_argument("--bandwidth-grace", type=float, default=-1.0,
                        help="seconds of --bandwidth-deadline that are start-up: each collective is then late past "
                             "the collectives up to it at the floor plus this grace. Negative: the whole deadline only")
    parser.add_argument("--check-elements", type=int, default=1 << 20,
                        help="elements in the correctness all-reduce")
    parser.add_argument("--linger", type=float, default=2.0,
                        help="seconds a failed rank waits before exiting, so its peers' stacks can be taken")
    parser.add_argument("--selftest-fault", default="none", choices=("none", "exit", "hang", "corrupt"),
                        help="self-test: make --selftest-rank misbehave to prove the gate catches it")
    parser.add_argument("--selftest-rank", type=int, default=-1)
    return parser.parse_args(argv)


def selftest_after_init(fault, rank):
    """The self-test faults of --selftest-rank right after init: ``exit`` (code 3) or ``hang``."""
    if fault == "exit":
        print("selftest: rank %d exits with code 3 after init" % rank, flush=True)
        os._exit(3)
    if fault == "hang":
        print("selftest: rank %d hangs before the correctness all-reduce" % rank, flush=True)
        while True:
            time.sleep(1)


def bandwidth_stage(rec, args, torch, dist, device, world_size, sync):
    """The timed all-reduces at every size (with the --bandwidth-deadline watchdog); the rank's status."""
    sizes = [int(size) for size in args.sizes.split(",") if size.strip()]
    # The collectives in the order measure() issues them (each one's bytes: numel x 4).
    plan = [max(1, size // 4) * 4 for size in sizes for _ in range(args.warmup + args.iters)]
    progress = Progress(world_size, plan)
    if args.bandwidth_deadline > 0:
        threading.Thread(target=watch_bandwidth, args=(rec, progress, args.bandwidth_deadline, args.bandwidth_grace),
                         daemon=True).start()
    bandwidth = [measure(torch, dist, device, world_size, size, args.iters, args.warmup, sync, progress)
                 for size in sizes]
    progress.finished.set()
    with rec.lock:
        rec.data["bandwidth"] = bandwidth
        if rec.data["status"] != "slow":
            rec.data["status"] = "ok" if rec.data["correct"] else "wrong"


def make_store(dist, rank, world_size, timeout):
    """The rendezvous store, its keys under this run's secret (``PREFLIGHT_STORE_TOKEN``: a program of another
    account that connects to the port does not know their names).  Under torchrun its agent holds the store (it
    listens on every address); started by Slurm (the srun engine), rank 0 holds it, listening on the master's
    inter-node address only (``MASTER_ADDR``), never on every address of the node."""
    addr, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", 29500))
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" or rank != 0:
        store = dist.TCPStore(addr, port, world_size, False, timeout)
    else:
        family, kind, proto, _name, where = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
        listener = socket.socket(family, kind, proto)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(where)
            listener.listen(max(128, world_size))
        except OSError as exc:
            listener.close()
            raise RuntimeError("the rendezvous store could not listen on %s:%d: %s" % (addr, port, exc)) from exc
        store = dist.TCPStore(addr, port, world_size, True, timeout, master_listen_fd=listener.detach())
    token = os.environ.get("PREFLIGHT_STORE_TOKEN") or ""
    return dist.PrefixStore("preflight-%s/" % token, store) if token else store


def print_summary(rec, world_size, backend):
    """Rank 0's lines on stdout: the run, then one line per size."""
    info = rec.data["versions"]
    print("preflight: world_size=%d backend=%s torch=%s cuda=%s nccl=%s correct=%s" % (
        world_size, backend, info["torch"], info["cuda"], info["nccl"], rec.data["correct"]), flush=True)
    for row in rec.data["bandwidth"]:
        print("preflight: all_reduce %10d bytes  %9.1f us  algbw %.3f GB/s  busbw %.3f GB/s" % (
            row["size_bytes"], row["time_us"], row["algbw_gbps"], row["busbw_gbps"]), flush=True)


def main(argv=None):
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    os.makedirs(args.out, exist_ok=True)
    rec = Recorder(args.out, rank)
    faulty = args.selftest_fault != "none" and rank == args.selftest_rank

    # torch warns at import when numpy is absent; numpy is not needed here.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch
    import torch.distributed as dist

    rec.data["versions"] = versions(torch)
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    rec.data["backend"] = backend
    timeout = datetime.timedelta(seconds=args.timeout)
    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    try:
        rec.stage("init")
        dist.init_process_group(backend=backend, store=make_store(dist, rank, world_size, timeout), rank=rank,
                                world_size=world_size, timeout=timeout)
        barrier_group = None
        if backend != "gloo":
            # monitored_barrier exists only on gloo; a side group names missing ranks.
            barrier_group = dist.new_group(backend="gloo", timeout=timeout)

        if faulty:
            selftest_after_init(args.selftest_fault, rank)

        rec.stage("correctness")
        wrong, first = check_correctness(torch, dist, device, world_size, rank, args.check_elements,
                                         corrupt=faulty and args.selftest_fault == "corrupt")
        rec.data["correctness"] = {"elements": args.check_elements, "wrong": wrong, "first_wrong": first}
        rec.data["correct"] = wrong == 0

        rec.stage("barrier")
        dist.monitored_barrier(group=barrier_group, timeout=timeout, wait_all_ranks=True)

        rec.stage("bandwidth")
        bandwidth_stage(rec, args, torch, dist, device, world_size, sync)
        rec.stage("done")
        if rank == 0:
            print_summary(rec, world_size, backend)
    except Exception as exc:
        rec.data["status"] = "error"
        rec.data["error"] = "%s: %s" % (type(exc).__name__, exc)
        rec.data["traceback"] = traceback.format_exc()
        rec.write()
        print("preflight: rank %d failed at stage %s: %s" % (rank, rec.data["stage"], rec.data["error"]),
              file=sys.stderr, flush=True)
        time.sleep(args.linger)
        return 2
    finally:
        rec.write()
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # tearing down after a peer died must not mask the real error
                pass
    return 0 if rec.data["correct"] else 4


if __name__ == "__main__":
    sys.exit(main())
