"""The fake node ``bench/real_outputs.py`` builds around each real sample, as the test bed builds its GPU nodes:
fake tools first on PATH (``tests/fake_gpu_tools.py``) print the captured output, a fake PCI bus lists the GPUs the
output names, and RDMA samples are (or become) a ``/sys/class/infiniband`` tree.

What a sample does not carry, the node gets from the project's own fixtures (``tests/unit/fixtures/gpu``): a clean
kernel log; the healthy 8 x H100 node around a kernel log or a DCGM answer.  Around an ``nvidia-smi nvlink -s``
capture it builds an ``nvidia-smi -q -x`` of the GPUs the capture names from the fixtures' template; the reader asks
for NVLink only where there are two GPUs, so a one-GPU capture is paired with a twin (its lines again, as ``GPU 1``
with another UUID).  A multi-GPU ``-q -x`` sample gets an ``nvlink -s`` that says, per GPU, that the device has no
NVLink (what current drivers print on PCIe cards).  ``ibstat`` / ``ibstatus`` captures become the sysfs tree they
describe (state, physical state, rate, link layer, CA type; no counters); a folder of one port's files becomes
device ``mlx5_0``'s port 1.
"""

import importlib.util
import json
import os
import re
import sys
import xml.etree.ElementTree as ElementTree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

# pylint: disable=wrong-import-position
import fake_gpu_tools  # noqa: E402
from gpu_health_helpers import FIXTURES, H100, H100_BUS, make_sysfs  # noqa: E402
from preflight_node.gpu.nvidia_gpus import sysfs_address  # noqa: E402

CLEAN_LOG = os.path.join(FIXTURES, "kernel_log_clean.txt")
HEALTHY_XML = os.path.join(FIXTURES, "nvidia_smi_h100_healthy.xml")
HEALTHY_NVLINK = os.path.join(FIXTURES, "nvidia_smi_nvlink_h100.txt")
NO_NVLINK = "Device does not have or support Nvlink"
NVIDIA, AMD = "0x10de", "0x1002"
DISPLAY_3D, DISPLAY_OTHER = "0x030200", "0x038000"
_GPU_LINE = re.compile(r"^GPU (\d+): (.*?) \(UUID: (\S+)\)\s*$")


def _template():
    """``tests/unit/fixtures/gpu/make_fixtures.py``: the project's healthy GPU block."""
    spec = importlib.util.spec_from_file_location("make_fixtures", os.path.join(FIXTURES, "make_fixtures.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the fake node around a sample ----------------------------------------------------------------------


def _write(place, name, text):
    path = os.path.join(place, name)
    with open(path, "w") as handle:
        handle.write(text)
    return path


def read_text(path):
    with open(path, errors="replace") as handle:
        return handle.read()


def pci_of_nvidia_xml(text):
    """``[(sysfs address, (vendor, device, class))]`` of the GPUs an ``nvidia-smi -q -x`` document lists."""
    devices = []
    for gpu in ElementTree.fromstring(text).findall("gpu"):
        bus = (gpu.findtext("pci/pci_bus_id") or gpu.get("id") or "").strip()
        device = (gpu.findtext("pci/pci_device_id") or "0x0000").strip()
        device = "0x" + device[:4].lower() if len(device) == 8 else device
        devices.append((sysfs_address(bus), (NVIDIA, device, DISPLAY_3D)))
    return devices


def _no_nvlink_text(xml_text):
    out = []
    for index, gpu in enumerate(ElementTree.fromstring(xml_text).findall("gpu")):
        out.append("GPU %d: %s (UUID: %s)\n%s\n" % (index, (gpu.findtext("product_name") or "").strip(),
                                                     (gpu.findtext("uuid") or "").strip(), NO_NVLINK))
    return "".join(out)


def nvidia_node(place, xml_path, nvlink_path=None, kernel_log=CLEAN_LOG, dcgm_json=None):
    """Fake tools and PCI bus of an NVIDIA node; returns ``(bin dir, sysfs root)``."""
    text = read_text(xml_path)
    if nvlink_path is None and len(ElementTree.fromstring(text).findall("gpu")) >= 2:
        nvlink_path = _write(place, "nvlink.txt", _no_nvlink_text(text))
    bin_dir = os.path.join(place, "bin")
    fake_gpu_tools.install(bin_dir, nvidia_xml=xml_path, kernel_log=kernel_log, dcgm_json=dcgm_json,
                           nvlink_file=nvlink_path)
    sysfs = make_sysfs(_Dir(place), pci_of_nvidia_xml(text))
    return bin_dir, str(sysfs)


def nvlink_node(place, sample):
    """The node around an ``nvidia-smi nvlink -s`` capture: a ``-q -x`` of the GPUs it names (a twin for one)."""
    lines = read_text(sample).splitlines()
    gpus = [match.groups() for match in (_GPU_LINE.match(line) for line in lines) if match]
    if len(gpus) == 1:
        twin = "GPU-%s" % ("f" * 8 + gpus[0][2][12:])
        lines = lines + ["GPU 1: %s (UUID: %s)" % (gpus[0][1], twin)] + lines[1:]
        gpus.append(("1", gpus[0][1], twin))
    module = _template()
    blocks = []
    for index, (_number, name, uuid) in enumerate(gpus):
        block = module.gpu(index).replace(module.UUIDS[index], uuid)
        blocks.append(block.replace("<product_name>NVIDIA H100 80GB HBM3</product_name>",
                                    "<product_name>%s</product_name>" % name))
    xml_path = _write(place, "nvidia_smi.xml", module.document(blocks))
    nvlink_path = _write(place, "nvlink.txt", "\n".join(lines) + "\n")
    return nvidia_node(place, xml_path, nvlink_path=nvlink_path)


def amd_node(place, sample, rocm):
    """Fake amd-smi (static: the sample; metric: nothing captured) or rocm-smi, and the PCI bus of their GPUs."""
    document = json.loads(read_text(sample))
    devices = []
    if rocm:
        for name, card in sorted(document.items()):
            if name.startswith("card") and isinstance(card, dict) and card.get("PCI Bus"):
                model = card.get("Card model") or card.get("Card Model") or "0x0000"
                devices.append((card["PCI Bus"].lower(), (AMD, model, DISPLAY_OTHER)))
    else:
        for item in document.get("gpu_data", document) if isinstance(document, dict) else document:
            bus, asic = item.get("bus") or {}, item.get("asic") or {}
            if bus.get("bdf"):  # a capture without the address cannot place its GPU on the fake bus
                devices.append((str(bus["bdf"]).lower(), (AMD, asic.get("device_id") or "0x0000", DISPLAY_OTHER)))
    bin_dir = os.path.join(place, "bin")
    if rocm:
        fake_gpu_tools.install(bin_dir, kernel_log=CLEAN_LOG, rocm_smi=sample)
    else:
        metric = _write(place, "metric.json", '{"gpu_data": []}\n')
        fake_gpu_tools.install(bin_dir, kernel_log=CLEAN_LOG, amd=(sample, metric))
    return bin_dir, str(make_sysfs(_Dir(place), devices))


def h100_node(place, kernel_log=CLEAN_LOG, dcgm_json=None):
    """The project's healthy 8 x H100 node around a kernel log or a DCGM answer."""
    bin_dir = os.path.join(place, "bin")
    fake_gpu_tools.install(bin_dir, nvidia_xml=HEALTHY_XML, kernel_log=kernel_log, dcgm_json=dcgm_json,
                           nvlink_file=HEALTHY_NVLINK)
    return bin_dir, str(make_sysfs(_Dir(place), [(address, H100) for address in H100_BUS]))


class _Dir(str):
    """``make_sysfs`` takes a pathlib-like directory."""

    def __truediv__(self, other):
        import pathlib  # pylint: disable=import-outside-toplevel
        return pathlib.Path(self) / other


# --- RDMA samples as sysfs trees ------------------------------------------------------------------------

STATES = {"down": "1: DOWN", "init": "2: INIT", "initializing": "2: INIT", "armed": "3: ARMED", "active": "4: ACTIVE"}
PHYS_STATES = {"sleep": "1: Sleep", "polling": "2: Polling", "disabled": "3: Disabled", "linkup": "5: LinkUp",
               "portconfigurationtraining": "4: PortConfigurationTraining", "linkerrorrecovery": "6: LinkErrorRecovery"}


def parse_ibstat(text):
    """``{device: {"hca_type": str|None, "ports": {port: {file: text}}}}`` of ``ibstat`` or ``ibstatus`` output."""
    devices, device, port = {}, None, None
    for raw in text.splitlines():
        line = raw.strip()
        header = re.match(r"^CA '([^']+)'$", line) or re.match(r"^Infiniband device '([^']+)' port (\d+) status:$",
                                                               line)
        if header:
            device = devices.setdefault(header.group(1), {"hca_type": None, "ports": {}})
            port = device["ports"].setdefault(header.group(2), {}) if header.lastindex == 2 else None
            continue
        key, _sep, value = (part.strip() for part in line.partition(":"))
        if device is None or not _sep:
            continue
        if key == "CA type":
            device["hca_type"] = value
        elif re.match(r"^Port (\d+)$", key):
            port = device["ports"].setdefault(key.split()[1], {})
        elif port is not None and key.lower() in ("state", "physical state", "phys state", "rate", "link layer",
                                                   "link_layer"):
            port[_SYSFS_NAME[key.lower()]] = _sysfs_value(key.lower(), value)
    return devices


_SYSFS_NAME = {"state": "state", "physical state": "phys_state", "phys state": "phys_state", "rate": "rate",
               "link layer": "link_layer", "link_layer": "link_layer"}


def _sysfs_value(key, value):
    """An ibstat word in the form sysfs writes it (``Active`` -> ``4: ACTIVE``, ``400`` -> ``400 Gb/sec``)."""
    if ":" in value or key in ("link layer", "link_layer"):
        return value
    if key == "state":
        return STATES.get(value.lower(), value)
    if key in ("physical state", "phys state"):
        return PHYS_STATES.get(value.lower().replace(" ", ""), value)
    return "%s Gb/sec" % value if re.match(r"^[0-9.]+$", value) else value


def write_tree(place, devices):
    """``<place>/sys/class/infiniband/<device>/...`` for ``devices`` as :func:`parse_ibstat` returns them."""
    for name, device in devices.items():
        base = os.path.join(place, "sys", "class", "infiniband", name)
        os.makedirs(base, exist_ok=True)
        if device.get("hca_type"):
            _write(base, "hca_type", device["hca_type"] + "\n")
        for port, files in device["ports"].items():
            os.makedirs(os.path.join(base, "ports", port), exist_ok=True)
            for file_name, value in files.items():
                _write(os.path.join(base, "ports", port), file_name, value + "\n")
    return os.path.join(place, "sys")


def port_folder_tree(place, sample):
    """A folder holding one port's files (``state``, ``phys_state``, ``rate``) as the port of one device."""
    files = {name: read_text(os.path.join(sample, name)).strip() for name in sorted(os.listdir(sample))}
    return write_tree(place, {"mlx5_0": {"hca_type": None, "ports": {"1": files}}})


def sysfs_root_of(sample):
    """The sysfs root of a captured tree: the folder whose ``class/infiniband`` holds the devices."""
    for folder, names, _files in os.walk(sample):
        if os.path.basename(folder) == "class" and "infiniband" in names:
            return os.path.dirname(folder)
    return None
