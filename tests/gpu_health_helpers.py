"""What the gpu_health unit tests share: the fixtures of tests/unit/fixtures/gpu, a sysfs sandbox with the
GPUs of those fixtures on its PCI bus, and the node's facts read through FakeOps the way the node call does."""

import json
import os

from preflight_node.capabilities import gpu_health as node_half
from cluster_preflight.capabilities import gpu_health
from fake_ops import FakeOps
from capability_helpers import ROOT, role_settings

FIXTURES = os.path.join(ROOT, "tests", "unit", "fixtures", "gpu")
HOST = "gpu-node07"
NODE = {"name": HOST, "ansible_host": "198.18.0.17", "node_addr": "198.18.0.17", "user": "root", "ssh_port": 22}
# The PCI addresses of the H100 fixtures (sysfs form) and of the MI300X fixture.
H100_BUS = ["0000:%s:00.0" % bus for bus in ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")]
MI300X_BUS = ["0000:%s:00.0" % bus for bus in ("0c", "22", "38", "5c", "9f", "af", "bf", "df")]
H100 = ("0x10de", "0x2330", "0x030200")
MI300X = ("0x1002", "0x74a1", "0x120000")
ASPEED = ("0x1a03", "0x2000", "0x030000")  # the BMC's VGA: a display device that is no GPU of ours
# An H100 HGX board's NVSwitches (NVIDIA, class "bridge, other") and their PCI addresses.
NVSWITCH = ("0x10de", "0x22a3", "0x068000")
NVSWITCH_BUS = ["0000:%s:00.0" % bus for bus in ("05", "06", "07", "08")]
FABRIC_MANAGER = "nv-fabricmanager"
PROGRAMS = {"nvidia-smi": "/usr/bin/nvidia-smi", "systemctl": "/usr/bin/systemctl",
            "nv-fabricmanager": "/usr/bin/nv-fabricmanager", "amd-smi": "/opt/rocm/bin/amd-smi",
            "rocm-smi": "/opt/rocm/bin/rocm-smi",
            "dcgmi": "/usr/bin/dcgmi", "journalctl": "/usr/bin/journalctl", "dmesg": "/usr/bin/dmesg"}


def fixture(name):
    with open(os.path.join(FIXTURES, name)) as handle:
        return handle.read()


def settings(**overrides):
    return role_settings("gpu_health", **overrides)


def make_sysfs(tmp_path, devices):
    """``sys/bus/pci/devices/<address>/{vendor,device,class}`` for each ``(address, (vendor, device, class))``."""
    sysfs = tmp_path / "sys"
    base = sysfs / "bus" / "pci" / "devices"
    base.mkdir(parents=True, exist_ok=True)
    for address, (vendor, device, cls) in devices:
        path = base / address
        path.mkdir()
        (path / "vendor").write_text(vendor + "\n")
        (path / "device").write_text(device + "\n")
        (path / "class").write_text(cls + "\n")
    return sysfs


def nvidia_node(count=8, nvswitches=0):
    """The PCI devices of an 8 x H100 node: the BMC's VGA, ``count`` GPUs and ``nvswitches`` NVSwitches."""
    return ([("0000:03:00.0", ASPEED)] + [(address, NVSWITCH) for address in NVSWITCH_BUS[:nvswitches]]
            + [(address, H100) for address in H100_BUS[:count]])


def make_proc(tmp_path, processes=(FABRIC_MANAGER,), init="sshd"):
    """A ``proc`` sandbox: PID 1 is ``init``, then one pid per program of ``processes`` (its ``comm`` shortened to 15
    characters, as the kernel keeps it)."""
    proc = tmp_path / "proc"
    for pid, program in enumerate((init,) + tuple(processes), 1):
        (proc / str(pid)).mkdir(parents=True, exist_ok=True)
        (proc / str(pid) / "comm").write_text(program[:15] + "\n")
    return proc


DEFAULT_TOOLS = {"xml": "nvidia_smi_h100_healthy.xml", "kernel_log": "kernel_log_clean.txt",
                 "dcgm": "dcgmi_diag_r1_pass.json", "amd": None, "dmesg": None,
                 "nvlink": "nvidia_smi_nvlink_h100.txt", "rocm": None}


def commands(xml=None, kernel_log=None, dcgm=None, amd=None, dmesg=None, nvlink=None, rocm=None):
    """FakeOps answers: each tool given prints its fixture (or the ``(rc, out, err)`` given instead)."""
    def answer(value):
        return value if isinstance(value, tuple) else (0, fixture(value), "")
    found = {}
    if xml is not None:
        found[(PROGRAMS["nvidia-smi"], "-q", "-x")] = answer(xml)
    if nvlink is not None:
        found[(PROGRAMS["nvidia-smi"], "nvlink", "-s")] = answer(nvlink)
    if kernel_log is not None:
        found[(PROGRAMS["journalctl"], "-k")] = answer(kernel_log)
    if dcgm is not None:
        found[(PROGRAMS["dcgmi"], "diag")] = answer(dcgm)
    if dmesg is not None:
        found[(PROGRAMS["dmesg"],)] = answer(dmesg)
    if rocm is not None:
        found[(PROGRAMS["rocm-smi"], "--showallinfo")] = answer(rocm)
    if amd is not None:
        static, metric = amd
        found[(PROGRAMS["amd-smi"], "static")] = answer(static)
        found[(PROGRAMS["amd-smi"], "metric")] = answer(metric)
    return found


def read_node(tmp_path, devices=None, programs=None, overrides=None, processes=(FABRIC_MANAGER,), init="sshd",
              extra=None, **tools):
    """``(facts, settings, ops)``: the node read through FakeOps, arguments and facts through JSON.

    ``devices``: the PCI bus (default: an H100 HGX node, its NVSwitches included); ``programs``: the tools installed
    (default: those given a fixture, plus dmesg); ``processes``: the programs running (the fabric manager) under
    ``init``; ``extra``: more FakeOps answers."""
    tools = dict(DEFAULT_TOOLS, **tools)
    answers = commands(**tools)
    if programs is None:
        programs = ["dmesg"] + [name for name, key in (("nvidia-smi", "xml"), ("journalctl", "kernel_log"),
                                                       ("dcgmi", "dcgm"), ("amd-smi", "amd"),
                                                       ("rocm-smi", "rocm"))
                                if tools[key] is not None]
    answers.update(extra or {})
    sysfs = make_sysfs(tmp_path, nvidia_node(nvswitches=4) if devices is None else devices)
    proc = make_proc(tmp_path, processes, init)
    wanted = settings(gpu_health_sysfs_root=str(sysfs), gpu_health_proc_root=str(proc), **(overrides or {}))
    ops = FakeOps(programs={name: PROGRAMS[name] for name in programs}, commands=answers)
    args = json.loads(json.dumps(gpu_health.read_args(wanted, NODE)))
    facts = json.loads(json.dumps(node_half.read(args, ops)))
    return facts, wanted, ops
