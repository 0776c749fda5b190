# -*- coding: utf-8 -*-
"""Node layer: the health fields of ``nvidia-smi -q -x`` (nvsmi_device_v13.dtd and older), parsed with ElementTree.

Parsing only, no command runs here; ``gpu_health.read`` runs nvidia-smi once.  Every field nvidia-smi
reports as unavailable (``N/A``, ``[N/A]``, ``Not Supported``, ``Not Found``, ...) or leaves out, as older
schemas do, becomes None, never an exception: the checks then say what they could not observe.  Consumer and
Windows (WDDM) cards report ECC and persistence as ``N/A``, a vGPU guest most of the PCIe and memory fields, a
GPU in MIG mode its row remapping.  A document that is not XML raises ValueError for the reader to turn into an
``error`` fact.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree

from .nvidia_gpus import normalize_bus_id

# The clock event reasons that mean the GPU is slowed down by something other than its workload.
# r535+ names them clocks_event_reason_*, older drivers clocks_throttle_reason_* (same suffixes).
THROTTLE_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")
_UNAVAILABLE = ("n/a", "[n/a]", "not supported", "[not supported]", "not found", "[not found]", "not available",
                "[not available]", "unknown error", "[unknown error]", "insufficient permissions",
                "[insufficient permissions]", "")
_NO_HANDLE_RE = re.compile(r"Unable to determine the device handle for (?:GPU|gpu)\s*([0-9A-Fa-f]{0,8}:?[0-9A-Fa-f]{2}:"
                           r"[0-9A-Fa-f]{2}\.[0-7])\s*:\s*(.+?)\s*$")


def _text(element, path):
    """Stripped text at ``path`` under ``element``; None when missing or N/A."""
    found = element.find(path) if element is not None else None
    if found is None or found.text is None:
        return None
    text = found.text.strip()
    return None if text.lower() in _UNAVAILABLE else text


def _int(element, path):
    """A count, a width (``16x``) or a percentage (``91 %``) at ``path`` as an int; None when missing, N/A or not a
    number."""
    text = _text(element, path)
    if text is None:
        return None
    text = text.rstrip("xX%").strip()
    return int(text) if text.isdigit() else None


def _yes_no(element, path):
    text = _text(element, path)
    if text is None:
        return None
    return text.lower() in ("yes", "true", "active", "enabled")


def _sum(values):
    """Sum of the counters read; None when none was."""
    numbers = [value for value in values if value is not None]
    return sum(numbers) if numbers else None


def uncorrectable(section):
    """Uncorrectable ECC errors of a ``<volatile>`` or ``<aggregate>`` block, summed over its memories.

    r535+: ``dram_uncorrectable`` + ``sram_uncorrectable`` (or its ``_parity`` + ``_secded`` halves in
    later drivers); older drivers: ``double_bit/total``."""
    if section is None:
        return None
    sram = _int(section, "sram_uncorrectable")
    if sram is None:
        sram = _sum([_int(section, "sram_uncorrectable_parity"), _int(section, "sram_uncorrectable_secded")])
    found = _sum([_int(section, "dram_uncorrectable"), sram])
    if found is None:
        found = _int(section, "double_bit/total")
    return found


def _pending_pages(gpu):
    """Retired pages waiting for a reset: ``pending_blacklist`` (older) or ``pending_retirement``."""
    for name in ("retired_pages/pending_retirement", "retired_pages/pending_blacklist"):
        value = _yes_no(gpu, name)
        if value is not None:
            return value
    return None


def _throttle(gpu):
    """The names in :data:`THROTTLE_REASONS` nvidia-smi reports Active; None when it reports none of them (the block
    missing, or every reason N/A)."""
    for block, prefix in (("clocks_event_reasons", "clocks_event_reason_"),
                          ("clocks_throttle_reasons", "clocks_throttle_reason_")):
        reasons = gpu.find(block)
        if reasons is not None:
            states = [(name, _text(reasons, prefix + name)) for name in THROTTLE_REASONS]
            if all(state is None for _name, state in states):
                return None
            return [name for name, state in states if state == "Active"]
    return None


def _bus_id(gpu):
    text = _text(gpu, "pci/pci_bus_id") or gpu.get("id")
    try:
        return normalize_bus_id(text)
    except ValueError:
        return text


def parse_gpu(gpu, position):
    """One ``<gpu>`` element as the reader's facts; ``position`` is its order, the index nvidia-smi uses
    when it sorts by PCI bus id (its default)."""
    link = gpu.find("pci/pci_gpu_link_info")
    return {
        "index": position,
        "minor_number": _int(gpu, "minor_number"),
        "bus_id": _bus_id(gpu),
        "uuid": _text(gpu, "uuid"),
        "model": _text(gpu, "product_name"),
        "mig_mode": _text(gpu, "mig_mode/current_mig"),
        "virtualization_mode": _text(gpu, "gpu_virtualization_mode/virtualization_mode"),
        "driver_model": _text(gpu, "driver_model/current_dm"),
        "performance_state": _text(gpu, "performance_state"),
        "gpu_util": _int(gpu, "utilization/gpu_util"),
        "persistence_mode": _text(gpu, "persistence_mode"),
        "ecc_mode_current": _text(gpu, "ecc_mode/current_ecc"),
        "ecc_mode_pending": _text(gpu, "ecc_mode/pending_ecc"),
        "ecc_uncorrectable_volatile": uncorrectable(gpu.find("ecc_errors/volatile")),
        "ecc_uncorrectable_aggregate": uncorrectable(gpu.find("ecc_errors/aggregate")),
        "retired_pages_pending": _pending_pages(gpu),
        "remap_pending": _yes_no(gpu, "remapped_rows/remapped_row_pending"),
        "remap_failure": _yes_no(gpu, "remapped_rows/remapped_row_failure"),
        "throttle_active": _throttle(gpu),
        "pcie_gen_current": _int(link, "pcie_gen/current_link_gen"),
        "pcie_gen_max": _int(link, "pcie_gen/max_link_gen"),
        "pcie_width_current": _int(link, "link_widths/current_link_width"),
        "pcie_width_max": _int(link, "link_widths/max_link_width"),
        "pcie_replays": _int(gpu, "pci/replay_counter"),
        # The NVSwitch fabric (Hopper and later behind NVSwitches; N/A elsewhere): State Not Started / In Progress /
        # Completed, Status Success or an error; on multi-node NVLink the clique and cluster the GPU joined.
        "fabric_state": _text(gpu, "fabric/state"),
        "fabric_status": _text(gpu, "fabric/status"),
        "fabric_clique_id": _text(gpu, "fabric/cliqueId"),
        "fabric_cluster_uuid": _text(gpu, "fabric/clusterUuid"),
        "fabric_bandwidth": _text(gpu, "fabric/health/bandwidth"),
        # What the driver says the GPU needs before it takes work again (r470+; gpu_recovery_action r570+).
        "reset_required": _yes_no(gpu, "gpu_reset_status/reset_required"),
        "drain_and_reset": _yes_no(gpu, "gpu_reset_status/drain_and_reset_recommended"),
        "recovery_action": _text(gpu, "gpu_recovery_action"),
    }


def unavailable_gpus(text):
    """``(rest, [{bus_id, reason}])``: the lines of ``text`` in which nvidia-smi says it cannot reach a GPU (``Unable to
    determine the device handle for GPU 0000:3A:00.0: GPU is lost.  Reboot the system to recover this GPU``, ``...: GPU
    requires reset``, ``...: Unknown Error``) taken out of it, and what they say; nvidia-smi prints them before the
    document of the GPUs it could reach and exits non-zero."""
    kept, lost = [], []
    for line in str(text or "").splitlines(True):
        match = _NO_HANDLE_RE.search(line)
        if not match:
            kept.append(line)
            continue
        try:
            bus_id = normalize_bus_id(match.group(1))
        except ValueError:
            bus_id = match.group(1)
        if all(entry["bus_id"] != bus_id for entry in lost):
            lost.append({"bus_id": bus_id, "reason": " ".join(match.group(2).split())[:200]})
    return "".join(kept), lost


def parse(text):
    """``{driver_version, cuda_version, attached_gpus, gpus}`` of a ``nvidia-smi -q -x`` document.

    Raises ValueError when ``text`` is not XML or not an ``nvidia_smi_log``."""
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError as exc:
        raise ValueError("not an XML document (%s)" % exc) from None
    if root.tag != "nvidia_smi_log":
        raise ValueError("the XML root is <%s>, not <nvidia_smi_log>" % root.tag)
    return {
        "driver_version": _text(root, "driver_version"),
        "cuda_version": _text(root, "cuda_version"),
        "attached_gpus": _int(root, "attached_gpus"),
        "gpus": [parse_gpu(gpu, position) for position, gpu in enumerate(root.findall("gpu"))],
    }
