#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Fast, import-free probe of a node's training environment before the gate launches."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: torch_probe
short_description: Check a node's training Python, torch build, accelerators and rendezvous port in well under a second
description:
  - Finds torch in the training environment's Python without importing it (an import costs seconds; the gate
    imports it anyway), reads its version and CUDA/HIP build from C(torch/version.py).
  - Counts accelerators from device nodes (C(/dev/nvidiaN), KFD topology for AMD) and chooses the backend
    (nccl with accelerators, gloo on CPU) and the ranks per node.
  - On the master, checks that the rendezvous port can be bound and names the process holding it if not.
  - Flags the seeds' known hang, C(CUDA_LAUNCH_BLOCKING=1) with torch 1.13 to 2.0.x (NCCL 2.14.3).
version_added: "1.0.0"
options:
  python:
    description: The training environment's Python on this node.
    type: str
    required: true
  backend:
    description: Requested backend; C(auto) picks nccl when accelerators are visible, gloo otherwise.
    type: str
    choices: [auto, gloo, nccl]
    default: auto
  nproc_per_node:
    description: Ranks per node; 0 means one per accelerator, or O(cpu_nproc) on CPU.
    type: int
    default: 0
  cpu_nproc:
    description: Ranks per node on a node without accelerators when O(nproc_per_node) is 0.
    type: int
    default: 2
  is_master:
    description: Whether this node hosts the rendezvous (then the port is checked).
    type: bool
    default: false
  master_addr:
    description: Address the rendezvous binds on the master (C(0.0.0.0) checks every address).
    type: str
    default: 0.0.0.0
  master_port:
    description: Rendezvous port.
    type: int
    default: 6000
  dev_root:
    description: Root of device nodes (tests).
    type: path
    default: /dev
  sysfs_root:
    description: Root of sysfs (tests).
    type: path
    default: /sys
  proc_root:
    description: Root of procfs, used to name the holder of a busy port (tests).
    type: path
    default: /proc
attributes:
  check_mode:
    support: full
    details: Read-only; binds the port for an instant on the master and closes it.
  diff_mode:
    support: none
author:
  - Cluster preflight maintainers
"""

EXAMPLES = r"""
- name: Probe the training environment.
  torch_probe:
    python: /opt/train/venv/bin/python
    is_master: "{{ inventory_hostname == ansible_play_hosts[0] }}"
    master_port: 6000
"""

RETURN = r"""
torch:
  description: What was found of torch (C(version), C(cuda), C(hip), C(path)) or null.
  returned: always
  type: dict
accelerators:
  description: C(nvidia) and C(amd) device counts.
  returned: always
  type: dict
backend:
  description: The backend the gate will use on this node.
  returned: always
  type: str
nproc_per_node:
  description: Ranks this node will run.
  returned: always
  type: int
ok:
  description: True when no check failed, so the gate may launch on this node.
  returned: always
  type: bool
checks:
  description: Findings C({status, found, expected, fix}) keyed by check name.
  returned: always
  type: dict
"""

import errno
import json
import os
import re
import socket

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_checks import failed, not_applicable, passed
from ansible.module_utils.preflight_net import find_port_holder

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


def check_port(addr, port, proc_root):
    """(free, detail) for binding addr:port the way the rendezvous store will."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, port))
        return True, "port %d can be bound on %s" % (port, addr)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            holder = find_port_holder(port, proc_root)
            who = ("by pid %s (%s)" % (holder["pid"], holder["comm"])) if holder else "by an unknown process"
            return False, "port %d on %s is already in use %s" % (port, addr, who)
        if exc.errno == errno.EADDRNOTAVAIL:
            return False, "address %s is not configured on this node" % addr
        return False, "binding %s:%d failed: %s" % (addr, port, exc)
    finally:
        sock.close()


def torch_lt_2_1(version):
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return bool(match) and (int(match.group(1)), int(match.group(2))) < (2, 1)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type="str", required=True),
            backend=dict(type="str", default="auto", choices=["auto", "gloo", "nccl"]),
            nproc_per_node=dict(type="int", default=0),
            cpu_nproc=dict(type="int", default=2),
            is_master=dict(type="bool", default=False),
            master_addr=dict(type="str", default="0.0.0.0"),
            master_port=dict(type="int", default=6000),
            dev_root=dict(type="path", default="/dev"),
            sysfs_root=dict(type="path", default="/sys"),
            proc_root=dict(type="path", default="/proc"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    host = socket.gethostname().split(".")[0]
    checks = {}
    torch = None
    python = p["python"]
    fix_python = ("set preflight_training_python in the inventory to the Python of the training environment on "
                  "%s, or install torch into it (pip install torch==<version>)" % host)

    argv = [python, "-c", FIND_TORCH]
    timeout_bin = module.get_bin_path("timeout")
    if timeout_bin:
        argv = [timeout_bin, "--kill-after=5", "20"] + argv
    try:
        rc, out, err = module.run_command(argv, environ_update={"LANG": "C"})
    except Exception as exc:  # run_command raises for a missing executable on some cores
        rc, out, err = 127, "", str(exc)
    info = {}
    if rc == 0:
        try:
            info = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            rc, err = 1, "unreadable probe output: %r" % out[-200:]
    if rc != 0:
        reason = "timed out after 20 s" if rc == 124 else (err.strip() or "exit code %d" % rc)
        checks["torch_python"] = failed("training Python %s on %s cannot run: %s" % (python, host, reason[-300:]),
                                        "an executable Python interpreter", fix_python)
    else:
        checks["torch_python"] = passed("Python %s at %s" % (info["python"], info["executable"]),
                                        "an executable Python interpreter")
        torch = info.get("torch")
        if not torch:
            checks["torch_import"] = failed("no torch module in %s on %s" % (python, host),
                                            "torch importable by the training Python", fix_python)
        else:
            checks["torch_import"] = passed("torch %s (cuda %s, hip %s) at %s" % (
                torch.get("version"), torch.get("cuda"), torch.get("hip"), torch["path"]),
                "torch importable by the training Python")

    accel = count_accelerators(p["dev_root"], p["sysfs_root"])
    n_accel = accel["nvidia"] + accel["amd"]
    gpu_build = bool(torch and (torch.get("cuda") or torch.get("hip")))
    backend = p["backend"]
    if backend == "auto":
        backend = "nccl" if n_accel and gpu_build else "gloo"
    if n_accel and torch and not gpu_build:
        checks["torch_accelerator_build"] = failed(
            "%d accelerator(s) on %s but torch %s is a CPU-only build" % (n_accel, host, torch.get("version")),
            "a CUDA or ROCm build of torch on a GPU node",
            "install the CUDA/ROCm wheel of torch into %s" % python)
    elif backend == "nccl" and not n_accel:
        checks["torch_accelerator_build"] = failed(
            "backend nccl requested but no accelerator is visible on %s" % host,
            "NVIDIA (/dev/nvidiaN) or AMD (KFD) devices for nccl",
            "use backend gloo on CPU nodes, or check the GPU driver (nvidia-smi / rocm-smi)")
    nproc = p["nproc_per_node"] or (n_accel if backend == "nccl" else p["cpu_nproc"])

    if torch and torch_lt_2_1(torch.get("version")) and os.environ.get("CUDA_LAUNCH_BLOCKING") == "1":
        checks["torch_cuda_launch_blocking"] = failed(
            "CUDA_LAUNCH_BLOCKING=1 with torch %s (NCCL 2.14.3) on %s" % (torch.get("version"), host),
            "CUDA_LAUNCH_BLOCKING unset, or torch >= 2.1 (NCCL >= 2.17)",
            "unset CUDA_LAUNCH_BLOCKING or upgrade torch: NCCL 2.14.3 hangs with it (NVIDIA/nccl issue 750)")

    if p["is_master"]:
        free, detail = check_port(p["master_addr"], p["master_port"], p["proc_root"])
        expected = "rendezvous port %d free on the master %s" % (p["master_port"], host)
        if free:
            checks["master_port"] = passed(detail, expected)
        else:
            checks["master_port"] = failed(
                "%s (master %s)" % (detail, host), expected,
                "stop that process on %s or choose another port with preflight_master_port" % host)
    else:
        checks["master_port"] = not_applicable("%s is not the master; the rendezvous port is checked there" % host)

    ok = not any(result["status"] == "fail" for result in checks.values())
    module.exit_json(changed=False, ok=ok, torch=torch, python=info or None, accelerators=accel, backend=backend,
                     nproc_per_node=nproc, hostname=host, checks=checks)


if __name__ == "__main__":
    main()
