#!/usr/bin/env python3
"""What the GPU and fabric checks add per node: the ``gpu_health`` and ``fabric`` readers, the fabric's second
counter read, and their deciders with the profile's, timed in-process as the node call and the controller run
them.

Two nodes: this machine as it is (CPU only: no GPU tooling, no RDMA device), and a fake 8-GPU InfiniBand node (the
test bed's: fake ``nvidia-smi -q -x`` / ``journalctl -k`` / ``dcgmi diag`` printing recorded fixtures first on PATH,
a fake PCI bus and an 8-port ``/sys/class/infiniband`` tree).  Each round alternates the bare baseline (the same
commands run and the same sysfs files read, nothing parsed or judged) with the readers.  Prints medians and minima,
the readers/bare ratio, and the controller's CPU seconds per node for the decisions.  Target: the readers under 1 s
per node (DCGM's own diagnostic, seconds on real GPUs, aside).  Use the project's venv:
    .venv/bin/python bench/hardware_readers.py [--runs 20]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

# pylint: disable=wrong-import-position
import fabric_tree  # noqa: E402
import fake_gpu_tools  # noqa: E402
from capability_helpers import role_settings  # noqa: E402
from fake_ops import LocalOps  # noqa: E402
from gpu_health_helpers import FIXTURES, make_sysfs, nvidia_node  # noqa: E402
from cluster_preflight.capabilities import fabric, gpu_health, profile  # noqa: E402
from preflight_node.capabilities import fabric as fabric_node, fabric_probe, gpu_health as gpu_node  # noqa: E402

NODE = {"name": "bench1", "ansible_host": "198.18.0.1", "node_addr": "198.18.0.1", "user": "root", "ssh_port": 22}


def gpu_setup(place):
    """A fake GPU node under ``place``: ``(bin dir, gpu settings, fabric settings)``."""
    fake_gpu_tools.install(os.path.join(place, "bin"), nvidia_xml=os.path.join(FIXTURES, "nvidia_smi_h100_healthy.xml"),
                           kernel_log=os.path.join(FIXTURES, "kernel_log_clean.txt"),
                           dcgm_json=os.path.join(FIXTURES, "dcgmi_diag_r1_pass.json"))
    sysfs = make_sysfs(_Path(place), nvidia_node())
    fabric_tree.make_tree(os.path.join(place, "fab"))
    return (os.path.join(place, "bin"), role_settings("gpu_health", gpu_health_sysfs_root=str(sysfs)),
            role_settings("fabric", fabric_sysfs_root=os.path.join(place, "fab")))


class _Path(str):
    """``make_sysfs`` takes a pathlib-like directory."""

    def __truediv__(self, other):
        import pathlib  # pylint: disable=import-outside-toplevel
        return pathlib.Path(self) / other


def _read_files(paths):
    for path in paths:
        try:
            with open(path, "rb") as handle:
                handle.read()
        except OSError:
            pass


def bare(bin_dir, gpu_settings, fabric_settings):
    """The commands the readers run and the sysfs files they read, nothing parsed or judged."""
    if bin_dir:
        for argv in (["nvidia-smi", "-q", "-x"], ["nvidia-smi", "nvlink", "-s"], ["journalctl", "-k", "-b"],
                     ["dcgmi", "diag", "-r", "1", "-j"]):
            subprocess.run([os.path.join(bin_dir, argv[0])] + argv[1:], stdout=subprocess.PIPE, check=False)
    pci = os.path.join(gpu_settings["gpu_health_sysfs_root"], "bus", "pci", "devices")
    for device in sorted(os.listdir(pci)) if os.path.isdir(pci) else []:
        _read_files(os.path.join(pci, device, name) for name in ("class", "vendor", "device"))
    rdma = os.path.join(fabric_settings["fabric_sysfs_root"], "class", "infiniband")
    for device in sorted(os.listdir(rdma)) if os.path.isdir(rdma) else []:
        ports = os.path.join(rdma, device, "ports")
        for port in sorted(os.listdir(ports)):
            base = os.path.join(ports, port)
            _read_files(os.path.join(base, name) for name in ("state", "phys_state", "rate", "link_layer"))
            for sub in ("counters", "hw_counters"):
                folder = os.path.join(base, sub)
                _read_files(os.path.join(folder, name) for name in sorted(os.listdir(folder))
                            if os.path.isdir(folder))
        # The second read of the counters, after the all-reduce.
        for port in sorted(os.listdir(ports)):
            folder = os.path.join(ports, port, "counters")
            _read_files(os.path.join(folder, name) for name in sorted(os.listdir(folder)) if os.path.isdir(folder))


def readers(gpu_settings, fabric_settings):
    ops = LocalOps()
    gpu_args = json.loads(json.dumps(gpu_health.read_args(gpu_settings, NODE)))
    fabric_args = json.loads(json.dumps(fabric.read_args(fabric_settings, NODE)))
    facts = {"gpu_health": gpu_node.read(gpu_args, ops), "fabric": fabric_node.read(fabric_args, ops)}
    after = fabric_probe.probe(fabric_args, ops)
    return json.loads(json.dumps(facts)), json.loads(json.dumps(after))


def decisions(facts, after, gpu_settings, fabric_settings):
    cluster = {"hosts": ["bench1"], "facts": {"bench1": facts["fabric"]}, "settings": {"bench1": fabric_settings}}
    gpu_health.decide("bench1", facts["gpu_health"], gpu_settings)
    fabric.decide("bench1", facts["fabric"], fabric_settings, probe=after, cluster=cluster)
    fields = dict(gpu_health.profile_fields(facts["gpu_health"]), **fabric.profile_fields(facts["fabric"]))
    profile.decide_all(["bench1"], {"bench1": fields}, {"bench1": role_settings("profile")})


def measure(name, bin_dir, gpu_settings, fabric_settings, runs):
    path = os.environ["PATH"]
    os.environ["PATH"] = (bin_dir + os.pathsep + path) if bin_dir else path
    try:
        base, full, cpu = [], [], []
        for _ in range(runs):
            start = time.perf_counter()
            bare(bin_dir, gpu_settings, fabric_settings)
            base.append(time.perf_counter() - start)
            start = time.perf_counter()
            facts, after = readers(gpu_settings, fabric_settings)
            full.append(time.perf_counter() - start)
            start = time.process_time()
            decisions(facts, after, gpu_settings, fabric_settings)
            cpu.append(time.process_time() - start)
    finally:
        os.environ["PATH"] = path
    ratios = sorted(f / b for f, b in zip(full, base))
    print("%-22s bare %.4f s (min %.4f)  readers %.4f s (min %.4f)  ratio median %.2fx min %.2fx  "
          "decide %.4f CPU-s/node" % (name, statistics.median(base), min(base), statistics.median(full), min(full),
                                     statistics.median(ratios), ratios[0], statistics.median(cpu)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="alternated rounds per node kind")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as place:
        bin_dir, gpu_settings, fabric_settings = gpu_setup(place)
        measure("CPU node (this one)", None, role_settings("gpu_health"), role_settings("fabric"), args.runs)
        measure("fake 8-GPU IB node", bin_dir, gpu_settings, fabric_settings, args.runs)


if __name__ == "__main__":
    main()
