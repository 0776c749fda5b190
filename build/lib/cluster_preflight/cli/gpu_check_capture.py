# -*- coding: utf-8 -*-
"""``scripts/gpu-check``'s first half: find the machine's NVIDIA GPUs, capture what the GPU and RDMA tools print (for
a corpus of real outputs) and run the ``gpu_health`` and ``fabric`` readers on them as a node call does.

Every command runs through the node layer's bounded runner (``preflight_node.host.ops.run_bounded_command``: its own
session, killed with everything it started when its bound expires); nothing here waits without a bound.  The
readers need no Ansible; the deciders (``decide``) need ansible-core's module_utils, which the wheels bring.
"""

from __future__ import annotations

import json
import os
import shutil
import time

from preflight_node.capabilities import fabric as fabric_node
from preflight_node.capabilities import gpu_health as gpu_node
from preflight_node.gpu.nvidia_gpus import QUERY_ARGV, parse_query_gpu
from preflight_node.host.ops import run_bounded_command

# What is captured, each ``(file name, argv, seconds)``; the kernel log keeps only the GPU driver's lines.
NVIDIA_CAPTURES = (
    ("nvidia-smi-q.xml", ["-q", "-x"], 60),
    ("nvidia-smi-q.txt", ["-q"], 60),
    ("nvidia-smi-nvlink-s.txt", ["nvlink", "-s"], 30),
    ("nvidia-smi-topo-m.txt", ["topo", "-m"], 30),
    ("nvidia-smi-query-gpu.csv", QUERY_ARGV[1:], 30),
)
KERNEL_LOGS = (("journalctl", ["-k", "-b", "--no-pager", "-o", "short-monotonic"]), ("dmesg", []))
KERNEL_WORDS = ("NVRM", "Xid", "SXid", "nvidia", "NVIDIA", "nvswitch", "NVSwitch", "mlx5", "infiniband")
DCGM_ARGV, DCGM_SECONDS = ["diag", "-r", "1", "-j"], 180
RDMA_MAX_FILES = 4000
FILE_MAX_BYTES = 4096


class LocalOps(object):
    """The node layer's ``ops`` for this machine: programs looked up on PATH, every command bounded."""

    def __init__(self):
        self.job, self.job_user = None, None

    def which(self, name, paths=()):
        if os.path.isabs(name):
            return name if os.access(name, os.X_OK) else None
        return shutil.which(name, path=os.pathsep.join(list(paths) + [os.environ.get("PATH", "")]))

    def run(self, argv, timeout=20.0, env=None, cwd=None, data=None, user=None):
        return run_bounded_command([str(part) for part in argv], timeout, env=env, cwd=cwd, data=data, user=user)


def find_gpus(nvidia_smi="nvidia-smi", timeout=30):
    """``(gpus, why)``: the GPUs ``nvidia-smi --query-gpu`` lists (``[{index, bus_id, uuid, name}]``), or ``[]``
    and why there is none (no nvidia-smi, it fails or hangs, or it sees no GPU)."""
    program = LocalOps().which(nvidia_smi)
    if not program:
        return [], "%s is not installed (not on PATH): this machine has no NVIDIA driver" % nvidia_smi
    rc, out, err = run_bounded_command([program] + QUERY_ARGV[1:], timeout)
    if rc == 124:
        return [], "%s did not answer within %d s (a hung driver or GPU): %s" % (program, timeout, err.strip()[-200:])
    if rc != 0:
        return [], "%s --query-gpu exited %d: %s" % (program, rc, (err or out).strip()[-300:] or "no output")
    try:
        gpus = parse_query_gpu(out)
    except ValueError as exc:
        return [], str(exc)
    return gpus, None if gpus else "%s sees no GPU (No devices were found)" % program


class Capture(object):
    """Raw outputs under ``<out>/raw`` and a manifest of every command (argv, exit status, seconds, file)."""

    def __init__(self, out):
        self.folder = os.path.join(out, "raw")
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        self.manifest = []

    def command(self, name, argv, seconds, keep=None):
        """Run ``argv`` bounded and write its output to ``name`` (``keep`` filters its lines); the manifest row."""
        start = time.monotonic()
        rc, out, err = run_bounded_command(argv, seconds)
        lines = out.splitlines()
        text = "".join(line + "\n" for line in lines if keep is None or keep(line))
        row = {"file": name, "argv": argv, "rc": rc, "seconds": round(time.monotonic() - start, 2),
               "lines": len(lines), "kept": len(text.splitlines()), "stderr": err.strip()[-500:]}
        if text:
            self.write(name, text)
        self.manifest.append(row)
        return rc, out, row

    def write(self, name, text):
        with open(os.path.join(self.folder, name), "w", encoding="utf-8") as handle:
            handle.write(text)

    def close(self):
        self.write("manifest.json", json.dumps(self.manifest, indent=1) + "\n")


def _kernel_line(line):
    return any(word in line for word in KERNEL_WORDS)


def capture_all(out, nvidia_smi, ops=None):
    """Every capture this machine allows: nvidia-smi's answers, the GPU lines of the kernel log, dcgmi's quick
    diagnostic, the RDMA sysfs tree, the driver and kernel versions.  Returns the manifest."""
    ops = ops or LocalOps()
    capture = Capture(out)
    program = ops.which(nvidia_smi)
    for name, argv, seconds in NVIDIA_CAPTURES if program else ():
        capture.command(name, [program] + list(argv), seconds)
    for name, argv in KERNEL_LOGS:
        tool = ops.which(name)
        if tool:
            rc, _out, _row = capture.command("kernel-log-%s.txt" % name, [tool] + argv, 30, keep=_kernel_line)
            if rc == 0:
                break
    dcgmi = ops.which("dcgmi")
    if dcgmi:
        capture.command("dcgmi-diag-r1.json", [dcgmi] + DCGM_ARGV, DCGM_SECONDS)
    for name, path in (("proc-driver-nvidia-version.txt", "/proc/driver/nvidia/version"),
                       ("os-release.txt", "/etc/os-release"), ("proc-version.txt", "/proc/version")):
        text = _small_file(path)
        if text is not None:
            capture.write(name, text)
    rdma = rdma_tree("/sys")
    if rdma:
        capture.write("sys-class-infiniband.txt", rdma)
    capture.close()
    return capture.manifest


def _small_file(path, limit=FILE_MAX_BYTES):
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            return handle.read(limit)
    except OSError:
        return None


def rdma_tree(sysfs_root):
    """``path = value`` of every small file of ``<sysfs_root>/class/infiniband`` (ports, counters, adapter type),
    bounded in files; None when there is no RDMA device."""
    base = os.path.join(sysfs_root, "class", "infiniband")
    if not os.path.isdir(base):
        return None
    lines, seen = [], 0
    for device in sorted(os.listdir(base)):
        for folder, names, files in os.walk(os.path.join(base, device), followlinks=False):
            names[:] = sorted(name for name in names if name not in ("device", "subsystem", "power", "gids",
                                                                     "pkeys", "gid_attrs"))
            for name in sorted(files):
                seen += 1
                if seen > RDMA_MAX_FILES:
                    lines.append("... stopped after %d files" % RDMA_MAX_FILES)
                    return "".join(line + "\n" for line in lines)
                text = _small_file(os.path.join(folder, name), 256)
                if text is not None:
                    lines.append("%s = %s" % (os.path.relpath(os.path.join(folder, name), base), text.strip()))
    return "".join(line + "\n" for line in lines)


def read_node(settings_gpu, settings_fabric, node, read_args):
    """The ``gpu_health`` and ``fabric`` readers on this machine as the node call runs them (arguments and facts
    through JSON); ``read_args`` is ``{capability: read_args function}``."""
    ops = LocalOps()
    gpu_args = json.loads(json.dumps(read_args["gpu_health"](settings_gpu, node)))
    fabric_args = json.loads(json.dumps(read_args["fabric"](settings_fabric, node)))
    return {"gpu_health": json.loads(json.dumps(gpu_node.read(gpu_args, ops))),
            "fabric": json.loads(json.dumps(fabric_node.read(fabric_args, ops)))}
