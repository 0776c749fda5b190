# -*- coding: utf-8 -*-
"""Node layer: the AMD GPUs of ``amd-smi static --json`` and ``amd-smi metric --ecc --pcie --json``
(and, where only rocm-smi is installed, ``rocm-smi --showallinfo --json``), parsed with json.

Parsing only (``gpu_health.read`` runs the tools).  amd-smi gives values either bare (``16``) or, in
later releases, as ``{"value": 16, "unit": ...}``; both are read.  ``N/A`` becomes None.  rocm-smi keeps the
driver version once, under its ``system`` key, not per card; its ``pcie clock level`` (``1 (16.0GT/s x16)``) is
the link's current state, and neither tool's static answer says whether the GPU is loaded.
"""

from __future__ import annotations

import json
import re

from .nvidia_gpus import normalize_bus_id

# PCIe transfer rate per lane (GT/s) -> generation.
_GEN_OF_RATE = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
_NUMBER_RE = re.compile(r"(\d+(?:\.\d+)?)")
_LEVEL_RE = re.compile(r"\(\s*([0-9.]+)\s*GT/s\s*x(\d+)\s*\)")
# The amdgpu driver that ships with the kernel reports the kernel's banner as its version ("Linux version 6.8...").
_KERNEL_BANNER_RE = re.compile(r"^Linux\s*version\s*(\S+?)(?:\(|\s|$)")


def _load(text, what):
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ValueError("%s: not a JSON document (%s)" % (what, exc)) from None
    if isinstance(document, dict) and isinstance(document.get("gpu_data"), list):
        document = document["gpu_data"]  # amd-smi 6.3+ wraps the list
    if not isinstance(document, list):
        raise ValueError("%s: expected a list of GPUs, got a %s" % (what, type(document).__name__))
    return [item for item in document if isinstance(item, dict)]


def _value(raw):
    if isinstance(raw, dict):
        raw = raw.get("value")
    if raw is None or str(raw).strip().upper() in ("N/A", ""):
        return None
    return raw


def _number(raw):
    raw = _value(raw)
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return raw
    match = _NUMBER_RE.search(str(raw)) if raw is not None else None
    return float(match.group(1)) if match else None


def _int(raw):
    number = _number(raw)
    return int(number) if number is not None else None


def _gen_of_speed(raw):
    rate = _number(raw)
    return _GEN_OF_RATE.get(float(rate)) if rate is not None else None


def _driver_version(raw):
    raw = _value(raw)
    if raw is None:
        return None
    banner = _KERNEL_BANNER_RE.match(str(raw).strip())
    return banner.group(1) if banner else str(raw).strip()


def _bus_id(raw):
    raw = _value(raw)
    try:
        return normalize_bus_id(raw)
    except ValueError:
        return raw


def parse(static_text, metric_text=None):
    """``[{index, bus_id, model, pcie_gen_current, pcie_gen_max, pcie_width_current, pcie_width_max,
    ecc_uncorrectable, ecc_correctable, driver_version}]``; raises ValueError for a document that is not
    amd-smi's JSON."""
    metrics = {}
    if metric_text is not None:
        metrics = {item.get("gpu"): item for item in _load(metric_text, "amd-smi metric")}
    gpus = []
    for item in _load(static_text, "amd-smi static"):
        if not isinstance(item.get("gpu"), int):
            raise ValueError("amd-smi static: an entry without a GPU number: %s" % json.dumps(item)[:200])
        bus, asic = item.get("bus") or {}, item.get("asic") or {}
        metric = metrics.get(item["gpu"]) or {}
        pcie, ecc = metric.get("pcie") or {}, metric.get("ecc") or {}
        gpus.append({
            "index": item["gpu"], "bus_id": _bus_id(bus.get("bdf")), "model": _value(asic.get("market_name")),
            "pcie_gen_max": _int(bus.get("pcie_interface_version")) or _gen_of_speed(bus.get("max_pcie_speed")),
            "pcie_gen_current": _gen_of_speed(pcie.get("speed")),
            "pcie_width_max": _int(bus.get("max_pcie_width")), "pcie_width_current": _int(pcie.get("width")),
            "ecc_uncorrectable": _int(ecc.get("total_uncorrectable_count")),
            "ecc_correctable": _int(ecc.get("total_correctable_count")),
            "pcie_replays": _int(pcie.get("replay_count")),
            "driver_version": _driver_version((item.get("driver") or {}).get("version")),
        })
    return sorted(gpus, key=lambda gpu: gpu["index"])


def _pcie_level(card):
    """``(gen, width)`` of rocm-smi's ``pcie clock level`` (``"1 (16.0GT/s x16)"``), the link's current state."""
    for key, value in card.items():
        if key.lower().rstrip(":").strip() == "pcie clock level":
            match = _LEVEL_RE.search(str(value))
            if match:
                return _GEN_OF_RATE.get(float(match.group(1))), int(match.group(2))
    return None, None


def parse_rocm_smi(text):
    """The GPUs of ``rocm-smi --showallinfo --json`` (``{"card0": {...}, "system": {...}}``), best effort: index,
    bus id, model, the link's current state, the PCIe replay count and the driver version (``system``); what
    amd-smi adds (the maximum link, ECC) is None."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ValueError("rocm-smi: not a JSON document (%s)" % exc) from None
    if not isinstance(document, dict):
        raise ValueError("rocm-smi: expected an object of cards, got a %s" % type(document).__name__)
    system = document.get("system") if isinstance(document.get("system"), dict) else {}
    gpus = []
    for name, card in sorted(document.items()):
        if not (name.startswith("card") and name[4:].isdigit() and isinstance(card, dict)):
            continue
        model = card.get("Card Series") or card.get("Card series") or card.get("Device Name") or card.get("Card SKU")
        gen, width = _pcie_level(card)
        gpus.append({"index": int(name[4:]), "bus_id": _bus_id(card.get("PCI Bus")), "model": _value(model),
                     "pcie_gen_max": None, "pcie_gen_current": gen, "pcie_width_max": None,
                     "pcie_width_current": width, "ecc_uncorrectable": None, "ecc_correctable": None,
                     "pcie_replays": _int(card.get("PCIe Replay Count")),
                     "driver_version": _driver_version(card.get("Driver version") or system.get("Driver version"))})
    return sorted(gpus, key=lambda gpu: gpu["index"])
