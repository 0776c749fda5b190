# -*- coding: utf-8 -*-
"""Capability ``allreduce``, the node half: the training environment as the gate will find it.

``read`` finds the training Python and its torch without importing it (an import costs seconds), counts
the accelerators, lists the NVIDIA GPUs (for the GPU pair rounds) and says who holds the rendezvous port.
What the controller decides from it (readiness, the launch, the outcome) is in
``cluster_preflight/capabilities/allreduce/``.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket

from ..gpu.nvidia_gpus import QUERY_ARGV as GPU_QUERY_ARGV, parse_query_gpu
from ..host.lock import RUN_ENV
from ..net.port_holder import find_port_holder
from ..host.ops import HUNG_EARLIER_RC, TIMEOUT_RC, hang_of, job_refused
from ..host.proc import environ_of

CAPABILITY = "allreduce"

# Prints what the interpreter knows about torch without importing it.
FIND_TORCH = r"""
import importlib.util, json, os, platform, re, sys
spec = importlib.util.find_spec("torch")
info = {"python": platform.python_version(), "executable": sys.executable, "torch": None}
if spec is not None and spec.origin:
    base = os.path.dirname(spec.origin)
    info["torch"] = {"path": base, "version": None, "cuda": None, "hip": None}
    try:
        text = open(os.path.join(base, "version.py")).read()
        for key in ("__version__", "cuda", "hip"):
            m = re.search(r"^%s\s*(?::\s*\S+\s*)?=\s*'?([^'\n]*)'?" % re.escape(key), text, re.M)
            if m:
                info["torch"]["version" if key == "__version__" else key] = (
                    None if m.group(1) in ("None", "") else m.group(1))
    except OSError as exc:
        info["torch"]["error"] = str(exc)
print(json.dumps(info))
"""
PROBE_TIMEOUT = 20

def count_accelerators(dev_root, sysfs_root):
    nvidia = 0
    try:
        nvidia = len([name for name in os.listdir(dev_root) if re.match(r"nvidia\d+$", name)])
    except OSError:
        pass
    amd = 0
    topology = os.path.join(sysfs_root, "class/kfd/kfd/topology/nodes")
    try:
        for node in os.listdir(topology):
            try:
                with open(os.path.join(topology, node, "properties")) as handle:
                    props = dict(line.split(None, 1) for line in handle if line.strip())
            except (OSError, ValueError):
                continue
            if int(props.get("simd_count", "0")) > 0:
                amd += 1
    except OSError:
        pass
    return {"nvidia": nvidia, "amd": amd}


def port_state(port, proc_root, addr="0.0.0.0"):
    """Whether ``addr:port`` can be bound the way the rendezvous store will, and who holds it if not."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, port))
        return {"free": True, "detail": "port %d can be bound on %s" % (port, addr), "holder": None}
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            holder = find_port_holder(port, proc_root)
            who = ("by pid %s (%s)" % (holder["pid"], holder["comm"])) if holder and holder.get("pid") else (
                "by an unknown process")
            run = environ_of(holder["pid"], proc_root).get(RUN_ENV) if holder and holder.get("pid") else None
            if run:
                # The store of another preflight run's torchrun (a run without the lock, or another lock dir).
                who += ", the rendezvous store of another preflight run (%s)" % run
                holder = dict(holder, run_id=run)
            return {"free": False, "detail": "port %d on %s is already in use %s" % (port, addr, who),
                    "holder": holder}
        return {"free": False, "detail": "binding %s:%d failed: %s" % (addr, port, exc), "holder": None}
    finally:
        sock.close()


def read_gpus(accelerators, ops):
    """``(gpus, error)``: index, PCI bus id, UUID and name of each NVIDIA GPU from ``nvidia-smi`` (for the GPU
    pair rounds); ``([], None)`` on a node without two NVIDIA GPUs, where nothing is run."""
    if accelerators.get("nvidia", 0) < 2:
        return [], None
    program = ops.which(GPU_QUERY_ARGV[0])
    if not program:
        return [], "nvidia-smi is not on PATH"
    rc, out, err = ops.run([program] + list(GPU_QUERY_ARGV[1:]), timeout=PROBE_TIMEOUT)
    if rc != 0:
        return [], "nvidia-smi exited %d: %s" % (rc, (err or out or "").strip()[-300:])
    try:
        return parse_query_gpu(out), None
    except ValueError as exc:
        return [], "unreadable nvidia-smi output: %s" % exc


def read(args, ops):
    """The training environment as the gate will find it."""
    python = args["python"]
    facts = {"python_path": python, "python": None, "torch": None, "probe_error": None,
             "accelerators": count_accelerators(args["dev_root"], args["sysfs_root"]),
             "cuda_launch_blocking": os.environ.get("CUDA_LAUNCH_BLOCKING"),
             "port": port_state(args["master_port"], args["proc_root"]),
             "hostname": socket.gethostname().split(".")[0],
             # Who the ranks will run as: the training Python is asked as that account.
             "job_user": getattr(ops, "job", None)}
    user = getattr(ops, "job_user", None)
    job = getattr(ops, "job", None) or {}
    refused = job_refused(ops) if not hang_of(ops, python) else ""
    if refused or job.get("python_blocked"):
        # Not run: no account may run it (allreduce.job_user), or the job's user cannot reach it (the component
        # that blocks, allreduce.python); either way it is never run as root instead.
        facts["not_run"] = refused
        facts["python_blocked"] = job.get("python_blocked")
        rc, out, err = None, "", ""
    else:
        rc, out, err = ops.run([python, "-c", FIND_TORCH], timeout=PROBE_TIMEOUT, user=user)
    if rc is None:
        pass
    elif rc == 0:
        try:
            info = json.loads(out.strip().splitlines()[-1])
            facts["python"] = {"version": info["python"], "executable": info["executable"]}
            facts["torch"] = info.get("torch")
        except (ValueError, IndexError, KeyError):
            facts["probe_error"] = "unreadable probe output: %r" % out[-200:]
    elif rc in (TIMEOUT_RC, HUNG_EARLIER_RC):
        # The one failure that names this hang (allreduce.python); later readers and probes of this call
        # that need the Python are not run and say so (blocked).
        hang = hang_of(ops, python) or {}
        facts["python_hang"] = {"seconds": hang.get("seconds", PROBE_TIMEOUT),
                                "user": hang.get("user") or user or (getattr(ops, "job", None) or {}).get("name"),
                                "earlier": rc == HUNG_EARLIER_RC}
        facts["probe_error"] = "it hung: no answer in %g s as %s, killed" % (
            facts["python_hang"]["seconds"], facts["python_hang"]["user"])
    else:
        facts["probe_error"] = (err or "").strip()[-300:] or "exit code %d" % rc
    facts["gpus"], facts["gpus_error"] = read_gpus(facts["accelerators"], ops)
    backend = args["backend"]
    accel = facts["accelerators"]["nvidia"] + facts["accelerators"]["amd"]
    torch = facts["torch"] or {}
    gpu_build = bool(torch.get("cuda") or torch.get("hip"))
    if backend == "auto":
        backend = "nccl" if accel and gpu_build else "gloo"
    facts["backend"] = backend
    facts["nproc_per_node"] = args["nproc_per_node"] or (accel if backend == "nccl" else args["cpu_nproc"])
    return facts
