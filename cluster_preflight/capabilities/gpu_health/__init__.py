# -*- coding: utf-8 -*-
"""Capability ``gpu_health``, the controller half: is every GPU of a node there, and healthy enough for a job?

* reader (node half, ``module_utils/preflight_node/capabilities/gpu_health.py``): ``nvidia-smi -q -x``, amd-smi, the
  kernel log's Xid/SXid lines, ``dcgmi diag`` and the GPUs on the PCI bus;
* here: ``validate``, ``read_args``, the decider (checks ``count``, ``reset_required``, ``ecc``, ``memory``,
  ``throttle``, ``pcie``, ``nvlink``, ``fabric_manager``, ``gpu_fabric``, ``persistence``, ``xid``, ``gpu_lost``,
  ``dcgm``; the per-GPU ones are in ``checks.py``, ``links.py`` and ``fabric.py``, the Xid codes in ``xid.py``) and
  ``profile_fields`` for the
  known-good profile comparison;
* writer: bring-up enables the NVSwitch fabric manager where it is installed (``library/service_enabled.py``,
  ``roles/gpu_health/tasks/main.yml``).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import os

from preflight_node.capabilities import gpu_health as node_half
from preflight_node.checks import failed, not_applicable

from cluster_preflight.capabilities.gpu_health import xid as xid_table

from . import checks as per_check
from . import fabric as fabric_checks
from . import links
from ..common import Args, Checks, Facts, Node, Problems, Settings, off_or_unread, switched_on

CAPABILITY = node_half.CAPABILITY
CHECKS = ("count", "reset_required", "ecc", "memory", "throttle", "pcie", "nvlink", "fabric_manager", "gpu_fabric",
          "persistence", "xid", "gpu_lost", "dcgm")
PCIE_WIDTHS = (0, 1, 2, 4, 8, 16, 32)
PROGRAMS = ("gpu_health_nvidia_smi", "gpu_health_amd_smi", "gpu_health_dcgmi")


# --- settings ------------------------------------------------------------------------------------------


def _problem(name, found, expected, fix):
    return {"name": name, "found": repr(found), "expected": expected, "fix": fix}


def _whole(value, low, high=None):
    return (not isinstance(value, bool) and isinstance(value, int) and value >= low
            and (high is None or value <= high))


def validate(settings: Settings) -> Problems:
    """Input problems beyond the types and choices of meta/argument_specs.yml."""
    problems = []
    for name in PROGRAMS:
        value = settings.get(name)
        if not isinstance(value, str) or not value.strip() or any(char.isspace() for char in value):
            problems.append(_problem(name, value, "a program name or absolute path, without spaces",
                                     "set %s to the program's name (looked up on the search path) or its path" % name))
    if not _whole(settings.get("gpu_health_dcgm_level"), 0, 3):
        problems.append(_problem("gpu_health_dcgm_level", settings.get("gpu_health_dcgm_level"), "0, 1, 2 or 3",
                                 "set gpu_health_dcgm_level to 0 (off), 1 (seconds), 2 (about 2 minutes) or 3"))
    for name in ("gpu_health_ecc_required", "gpu_health_persistence_required", "gpu_health_multinode_nvlink",
                 "gpu_health_fabric_manager_enable"):
        if not isinstance(settings.get(name, False), (bool, str)):
            problems.append(_problem(name, settings.get(name), "true or false",
                                     "set %s to true (a GPU without it warns) or false" % name))
    if not _whole(settings["gpu_health_pcie_replay_max"], 0):
        problems.append(_problem("gpu_health_pcie_replay_max", settings.get("gpu_health_pcie_replay_max"),
                                 "a whole number, 0 or more",
                                 "set gpu_health_pcie_replay_max to the PCIe replays since boot a GPU may have (0)"))
    for name in ("gpu_health_dcgm_timeout", "gpu_health_tool_timeout"):
        if not _whole(settings.get(name), 1):
            problems.append(_problem(name, settings.get(name), "a whole number of seconds above 0",
                                     "set %s to a positive number of seconds (default in roles/gpu_health/defaults)"
                                     % name))
    if settings.get("gpu_health_kernel_log") not in node_half.KERNEL_LOG_SOURCES:
        problems.append(_problem("gpu_health_kernel_log", settings.get("gpu_health_kernel_log"),
                                 "one of %s" % ", ".join(node_half.KERNEL_LOG_SOURCES),
                                 "set gpu_health_kernel_log to auto (journalctl, else dmesg) or none"))
    for name, real in (("gpu_health_sysfs_root", "/sys"), ("gpu_health_proc_root", "/proc")):
        root = settings.get(name)
        if not isinstance(root, str) or not os.path.isabs(root):
            problems.append(_problem(name, root, "an absolute path", "set %s to %s (or a test tree)" % (name, real)))
    unit = settings.get("gpu_health_fabric_manager_unit")
    if not isinstance(unit, str) or not unit.strip() or any(char.isspace() or char == "/" for char in unit):
        problems.append(_problem("gpu_health_fabric_manager_unit", unit, "a systemd unit name such as "
                                 "nvidia-fabricmanager", "set gpu_health_fabric_manager_unit: nvidia-fabricmanager"))
    if not _whole(settings.get("gpu_health_expected_count"), 0):
        problems.append(_problem("gpu_health_expected_count", settings.get("gpu_health_expected_count"),
                                 "a whole number, 0 for no fixed count",
                                 "set gpu_health_expected_count to the GPUs per node (8), "
                                 "or 0 to compare with the PCI bus"))
    if settings.get("gpu_health_pcie_min_width") not in PCIE_WIDTHS:
        problems.append(_problem("gpu_health_pcie_min_width", settings.get("gpu_health_pcie_min_width"),
                                 "one of %s" % ", ".join(str(width) for width in PCIE_WIDTHS),
                                 "set gpu_health_pcie_min_width to 16 (x16) or 0 for each GPU's own maximum"))
    for name in ("gpu_health_xid_ignore", "gpu_health_xid_warn_only"):
        codes = settings.get(name)
        if not isinstance(codes, (list, tuple)) or not all(_whole(code, 1) for code in codes):
            problems.append(_problem(name, codes, "a list of Xid or SXid codes (whole numbers above 0)",
                                     "set %s: [13, 43] (or [] for none)" % name))
    return problems


def read_args(settings: Settings, node: Node) -> Args:
    """What :func:`read` needs on ``node``; None when ``gpu_health_enabled`` is off."""
    if not switched_on(settings["gpu_health_enabled"]):
        return None
    return {
        "nvidia_smi": settings["gpu_health_nvidia_smi"],
        "amd_smi": settings["gpu_health_amd_smi"],
        "rocm_smi": node_half.ROCM_SMI,
        "dcgmi": settings["gpu_health_dcgmi"],
        "dcgm_level": int(settings["gpu_health_dcgm_level"]),
        "dcgm_timeout": int(settings["gpu_health_dcgm_timeout"]),
        "kernel_log": settings["gpu_health_kernel_log"],
        "tool_timeout": int(settings["gpu_health_tool_timeout"]),
        "sysfs_root": settings["gpu_health_sysfs_root"],
        "proc_root": settings["gpu_health_proc_root"],
        "fabric_manager_unit": settings["gpu_health_fabric_manager_unit"],
    }


# --- decider -------------------------------------------------------------------------------------------


def _gpu_names(facts):
    """PCI bus id -> ``GPU <index> (<bus id>)`` of the GPUs nvidia-smi read (Xid lines are NVIDIA's)."""
    return {gpu.get("bus_id"): per_check.label(gpu) for gpu in (facts.get("nvidia") or {}).get("gpus") or []}


def xid(host, facts, settings):
    section = facts.get("xid") or {}
    expected = "no Xid or SXid line in the kernel log since boot (other than gpu_health_xid_ignore)"
    unread = per_check.kernel_log_unread(host, section, expected)
    if unread:
        return unread
    names = _gpu_names(facts)
    ignore = set(settings.get("gpu_health_xid_ignore") or [])
    warn_only = set(settings.get("gpu_health_xid_warn_only") or [])
    items = []
    for event in section.get("events") or []:
        verdict = xid_table.classify(event, ignore, warn_only)
        if verdict["severity"] == "ignore":
            continue
        device = names.get(event.get("bus_id"), "PCI %s" % event.get("bus_id"))
        if event.get("kind") == "sxid":
            device = "NVSwitch %s" % event.get("bus_id")
        items.append((verdict["severity"], "%s %d on %s, %d line%s: %s (%s)" % (
            "SXid" if event.get("kind") == "sxid" else "Xid", event["code"], device, event.get("count", 1),
            "" if event.get("count", 1) == 1 else "s", verdict["cause"], event.get("text", "")),
            verdict["fix"]))
    if not items and not names and not (facts.get("pci") or {}).get("nvidia_gpus"):
        return not_applicable("no NVIDIA GPU on %s: no Xid to look for" % host, expected)
    return per_check.combine(host, items, expected, "no Xid or SXid line in the kernel log since boot (%s)"
                             % section.get("source"), 1)


def dcgm(host, facts, settings):
    section = facts.get("dcgm") or {}
    level = section.get("level", settings.get("gpu_health_dcgm_level"))
    expected = "every test of dcgmi diag -r %s passes" % level
    if not level:
        return not_applicable("gpu_health_dcgm_level is 0 on %s: DCGM diagnostics are not run" % host, expected)
    if not section.get("present"):
        return not_applicable("%s (gpu_health_dcgmi) is not installed on %s: DCGM diagnostics are not run"
                              % (settings.get("gpu_health_dcgmi"), host), expected)
    if section.get("error"):
        return failed("dcgmi diag could not run to the end on %s: %s" % (host, section["error"]), expected,
                      "check nv-hostengine (systemctl status nvidia-dcgm) and run dcgmi diag -r %s -j by hand on %s; "
                      "raise gpu_health_dcgm_timeout if it only needs longer" % (level, host))
    items, skipped = [], []
    # DCGM numbers GPUs as nvidia-smi does (PCI order): name them with their bus id.
    names = {gpu.get("index"): per_check.label(gpu) for gpu in (facts.get("nvidia") or {}).get("gpus") or []}
    results = section.get("results") or []
    for result in results:
        gpu = result.get("gpu")
        where = "all GPUs" if gpu is None else names.get(gpu, "GPU %s" % gpu)
        if result["status"] in ("fail", "warn"):
            items.append((result["status"], "test %r %s on %s: %s" % (
                result["test"], "failed" if result["status"] == "fail" else "warned", where, result.get("info") or "-"),
                "follow DCGM's message for each test named; confirm with dcgmi diag -r 3 on %s before draining it"
                % host))
        elif result["status"] == "skip":
            skipped.append("%r on %s" % (result["test"], where))
    ran = len(results) - len(skipped)
    if results and not ran:
        return not_applicable("dcgmi diag -r %s on %s skipped every test: %s" % (level, host, ", ".join(skipped)),
                              expected)
    notes = [("skipped by DCGM", ", ".join(skipped))] if skipped else []
    return per_check.combine(host, items, expected, "%d DCGM results at level %s, none failed or warned" % (
        ran, level), 1, notes)


def _no_gpu(facts):
    """The reason every check is not_applicable on a node without GPU, else None."""
    pci = facts.get("pci") or {}
    if pci.get("error") or any((facts.get(vendor) or {}).get(key) for vendor in per_check.TOOLS
                               for key in ("error", "gpus")):
        return None
    if pci.get("nvidia_gpus") or pci.get("amd_gpus"):
        return None
    tools = [per_check.TOOLS[vendor] for vendor in per_check.TOOLS if (facts.get(vendor) or {}).get("present")]
    return "no GPU on the PCI bus and %s" % ("no nvidia-smi/amd-smi" if not tools else
                                            "%s sees none" % " and ".join(tools))


def decide(host: str, facts: Facts, settings: Settings, probe: Optional[dict] = None,
           cluster: Optional[dict] = None) -> Checks:
    """``{count, reset_required, ecc, ..., gpu_lost, dcgm}`` (:data:`CHECKS`) for ``host``."""
    first = off_or_unread(CAPABILITY, host, settings["gpu_health_enabled"], facts,
                          "the GPUs' health", "nvidia-smi / amd-smi, the kernel log, dcgmi and the PCI bus of the node")
    if first is not None:
        return first
    reason = _no_gpu(facts)
    if reason is not None:
        checks = {name: not_applicable("%s on %s" % (reason, host), "a GPU, for the GPU health checks to apply")
                  for name in CHECKS}
        # What needs no GPU to be seen: the kernel's word that one left the bus, switches without a fabric manager.
        if (facts.get("xid") or {}).get("lost"):
            checks["gpu_lost"] = fabric_checks.gpu_lost(host, facts, settings)
        if (facts.get("nvswitch") or {}).get("devices"):
            checks["fabric_manager"] = fabric_checks.fabric_manager(host, facts, settings)
        wanted = int(settings.get("gpu_health_expected_count") or 0)
        if wanted:
            checks["count"] = failed("%s: %s, gpu_health_expected_count is %d" % (host, reason, wanted),
                                     "%d GPUs" % wanted,
                                     "install the GPUs' driver and tools, or set gpu_health_expected_count to 0")
        return checks
    return {
        "count": per_check.count(host, facts, settings),
        "reset_required": fabric_checks.reset_required(host, facts, settings),
        "ecc": per_check.ecc(host, facts, settings),
        "memory": per_check.memory(host, facts),
        "throttle": per_check.throttle(host, facts),
        "pcie": links.pcie(host, facts, settings),
        "nvlink": links.nvlink(host, facts),
        "fabric_manager": fabric_checks.fabric_manager(host, facts, settings),
        "gpu_fabric": fabric_checks.gpu_fabric(host, facts, settings),
        "persistence": per_check.persistence(host, facts, settings),
        "xid": xid(host, facts, settings),
        "gpu_lost": fabric_checks.gpu_lost(host, facts, settings),
        "dcgm": dcgm(host, facts, settings),
    }


# --- profile -------------------------------------------------------------------------------------------


def _same(values):
    """The one value all of ``values`` share, several joined by commas, None when there is none."""
    found = sorted(set(value for value in values if value is not None))
    return ",".join(str(value) for value in found) if len(found) > 1 else (found[0] if found else None)


def profile_fields(facts: Facts) -> Dict[str, Any]:
    """The flat fields a known-good profile compares (None for what was not read)."""
    facts = facts or {}
    vendor = next((name for name in per_check.TOOLS if (facts.get(name) or {}).get("gpus")), None)
    section = facts.get(vendor) or {}
    gpus = section.get("gpus") or []
    gens = [gpu.get("pcie_gen_max") for gpu in gpus if gpu.get("pcie_gen_max") is not None]
    widths = [gpu.get("pcie_width_current") for gpu in gpus if gpu.get("pcie_width_current") is not None]
    nvlinks = [links.active_links(gpu) for gpu in gpus if links.active_links(gpu) is not None]
    return {
        "gpu.vendor": vendor,
        "gpu.count": len(gpus) if vendor else None,
        "gpu.model": _same(gpu.get("model") for gpu in gpus),
        "gpu.driver_version": section.get("driver_version"),
        "gpu.cuda_version": section.get("cuda_version"),
        "gpu.pcie_gen_max": min(gens) if gens else None,
        "gpu.pcie_width_min": min(widths) if widths else None,
        "gpu.nvlinks_active_min": min(nvlinks) if nvlinks else None,
    }
