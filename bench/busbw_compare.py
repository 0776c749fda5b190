#!/usr/bin/env python3
"""Bus bandwidth: what the gate reports for a 64 MiB all-reduce vs a bare torch timing loop.

The gate side runs ``ansible-playbook preflight.yml -i inventory`` with
``allreduce_sizes: [67108864]`` and the same iterations and warm-up as the bare
side, and reads the 64 MiB busbw from the verdict: ``allreduce.sizes`` (rank
0's row, what the summary line prints); the ranks' own rows are in
``allreduce.ranks[*].bandwidth`` and are shown as well.  The bare side is a
self-contained script (written to a temp file) launched with the venv's
``torchrun --nproc-per-node 2``: gloo over the inventory's interface, a 64 MiB
float32 tensor, warm-up, a barrier, ``--iters`` timed all-reduces; time per
iteration averaged over the ranks (nccl-tests' default ``-a 1``), algbw =
bytes / time, busbw = algbw * 2(n-1)/n as nccl-tests define them.

Runs the pairs alternately, ``--runs`` times, in one process and prints every
pair (with the 1-minute load average: the machine is shared, and a busy
neighbour shows as a slow side), the medians and the ratio gate / bare
(median, min and max of the pairs; target: within +-10 %).  Use the project's venv:
    .venv/bin/python bench/busbw_compare.py --runs 5
"""

import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

# pylint: disable=wrong-import-position
from multinode import bench_parser  # noqa: E402

SIZE = 64 << 20  # 64 MiB: 16 Mi float32 elements

BARE = r'''
import datetime, json, sys, time, warnings
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
import torch
import torch.distributed as dist

size, iters, warmup, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
rank, world = dist.get_rank(), dist.get_world_size()
tensor = torch.ones(size // 4, dtype=torch.float32)
for _ in range(warmup):
    dist.all_reduce(tensor)
dist.barrier()
start = time.perf_counter()
for _ in range(iters):
    dist.all_reduce(tensor)
seconds = (time.perf_counter() - start) / iters
times = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
dist.all_gather(times, torch.tensor([seconds], dtype=torch.float64))
times = [float(t) for t in times]
mean = sum(times) / world
algbw = size / mean / 1e9
if rank == 0:
    with open(out, "w") as handle:
        json.dump({"size_bytes": size, "world_size": world, "rank_time_us": [t * 1e6 for t in times],
                   "time_us": mean * 1e6, "algbw_gbps": algbw,
                   "busbw_gbps": algbw * 2 * (world - 1) / world}, handle)
dist.destroy_process_group()
'''


def run(argv, env, cwd=None, timeout=600):
    done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=timeout, check=False)
    return done.returncode, done.stdout.decode(errors="replace")


def bare_busbw(bindir, script, workdir, args, env):
    out = os.path.join(workdir, "bare.json")
    if os.path.exists(out):
        os.unlink(out)
    argv = [os.path.join(bindir, "torchrun"), "--nproc-per-node", "2", "--master-port", str(args.port),
            script, str(SIZE), str(args.iters), str(args.warmup), out]
    code, text = run(argv, dict(env, GLOO_SOCKET_IFNAME=args.ifname, OMP_NUM_THREADS="1"))
    if code != 0 or not os.path.exists(out):
        sys.stderr.write(text[-3000:])
        raise SystemExit("bare torchrun failed (%d): %s" % (code, " ".join(argv)))
    with open(out, encoding="utf-8") as handle:
        return json.load(handle)


def gate_busbw(bindir, workdir, args, env, run_no):
    results_dir = os.path.join(workdir, "gate%d" % run_no)
    extra = json.dumps({"allreduce_sizes": [SIZE], "allreduce_iters": args.iters,
                        "allreduce_warmup": args.warmup})
    argv = [os.path.join(bindir, "ansible-playbook"), "preflight.yml", "-i", "inventory", "-e", extra,
            "-e", "preflight_results_dir=%s" % results_dir]
    code, text = run(argv, env, cwd=ROOT)
    found = glob.glob(os.path.join(results_dir, "[0-9]*", "verdict.json"))
    if code != 0 or len(found) != 1:
        sys.stderr.write(text[-3000:])
        raise SystemExit("gate failed (rc %d, %d verdicts): %s" % (code, len(found), " ".join(argv)))
    with open(found[0], encoding="utf-8") as handle:
        gate = json.load(handle)["allreduce"]
    if gate.get("status") != "pass":
        raise SystemExit("gate all-reduce did not pass: %s" % gate.get("status"))
    # The summary row (rank 0's) and every rank's own row at 64 MiB.
    summary = next(row for row in gate["sizes"] if row["size_bytes"] == SIZE)
    ranks = [next(row for row in rank["bandwidth"] if row["size_bytes"] == SIZE) for rank in gate["ranks"]]
    world = gate["world_size"]
    mean_us = statistics.mean(row["time_us"] for row in ranks)
    # nccl-tests' -a 1 over the ranks' rows: busbw from the ranks' mean time.
    avg_busbw = SIZE / (mean_us / 1e6) / 1e9 * 2 * (world - 1) / world
    return {"busbw_gbps": summary["busbw_gbps"], "time_us": summary["time_us"],
            "rank_busbw": [row["busbw_gbps"] for row in ranks], "avg_busbw_gbps": avg_busbw}


def main():
    parser = bench_parser(__doc__, runs=(5, "alternated pairs (bare, gate)"),
                          iters=(20, "timed all-reduces on both sides (nccl-tests: 20)"),
                          warmup=(5, "warm-up all-reduces on both sides (nccl-tests: 5)"),
                          port=(29517, "the bare torchrun's master port"))
    parser.add_argument("--ifname", default="lo",
                        help="GLOO_SOCKET_IFNAME of the bare side (the embedded inventory's preflight_socket_ifname)")
    args = parser.parse_args()
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    workdir = tempfile.mkdtemp(prefix="preflight-bench-busbw-")
    try:
        script = os.path.join(workdir, "bare_allreduce.py")
        with open(script, "w", encoding="utf-8") as handle:
            handle.write(BARE)
        print("64 MiB all-reduce, 2 ranks, gloo, %d timed + %d warm-up iterations per side" % (
            args.iters, args.warmup), flush=True)
        bare, gate, gate_avg = [], [], []
        for number in range(1, args.runs + 1):
            b = bare_busbw(bindir, script, workdir, args, env)
            g = gate_busbw(bindir, workdir, args, env, number)
            bare.append(b["busbw_gbps"])
            gate.append(g["busbw_gbps"])
            gate_avg.append(g["avg_busbw_gbps"])
            load = os.getloadavg()[0]
            print("pair %d (load %.1f): bare busbw %.3f GB/s (%.0f us; ranks %s us) | gate busbw %.3f GB/s "
                  "(%.0f us; ranks %s GB/s, mean-time busbw %.3f) | gate/bare %.3f" % (
                      number, load, b["busbw_gbps"], b["time_us"], "/".join("%.0f" % t for t in b["rank_time_us"]),
                      g["busbw_gbps"], g["time_us"], "/".join("%.3f" % r for r in g["rank_busbw"]),
                      g["avg_busbw_gbps"], g["busbw_gbps"] / b["busbw_gbps"]), flush=True)
        ratios = [g / b for g, b in zip(gate, bare)]
        mb, mg = statistics.median(bare), statistics.median(gate)
        print("median bare busbw        : %.3f GB/s" % mb)
        print("median gate busbw        : %.3f GB/s (rank 0's row, verdict allreduce.sizes)" % mg)
        print("median gate mean-time bw : %.3f GB/s (ranks' rows, nccl-tests -a 1)" % statistics.median(gate_avg))
        print("ratio gate / bare        : %.3f median of pairs (%.3f of medians), min %.3f, max %.3f "
              "(target 0.90..1.10)" % (statistics.median(ratios), mg / mb, min(ratios), max(ratios)))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
