# -*- coding: utf-8 -*-
"""Capability ``iommu``, the controller half: the IOMMU kernel argument of AMD GPU nodes.

AMD Instinct GPUs hang or run collectives slowly with the IOMMU translating
their DMA, so a node with one boots with ``iommu=soft`` (``iommu_mode: soft``,
in ``GRUB_CMDLINE_LINUX_DEFAULT``) or ``amd_iommu=off`` (``iommu_mode: off``,
in ``GRUB_CMDLINE_LINUX``), and never with the other one.

* reader (node half, ``module_utils/preflight_node/capabilities/iommu.py``): the GPUs on the
  PCI bus (sysfs), the grub defaults files and the running kernel's command line;
* here: ``validate``, ``read_args`` and the decider, which gives the same findings
  the writer (``library/grub_cmdline.py``) reports in check mode - both run
  ``plan`` of ``module_utils/preflight_node/grub/plan.py`` on the same files and judge
  it with ``module_utils/preflight_node/grub/checks.py``; ``not_applicable`` on a
  node without an AMD GPU;
* writer: ``grub_cmdline`` (bring-up, role ``iommu``), then an opt-in reboot.
"""

from __future__ import annotations

from typing import Optional

import os
import re


from preflight_node.grub import plan as grub_plan
from preflight_node.grub import checks as grub_checks
from preflight_node.checks import not_applicable, warned
from preflight_node.capabilities import iommu as node_half
from preflight_node.capabilities.iommu import GRUB_DEFAULT, GRUB_DROPIN_DIR, PROC_CMDLINE
from preflight_node.privilege import block_refused

from ..common import Args, Checks, Facts, Node, Problems, Settings, off_or_unread, switched_on

CAPABILITY = node_half.CAPABILITY

# Mirrors roles/iommu/vars/main.yml (iommu_kernel_table), which the writer task uses; a unit test keeps
# the two equal.  iommu=soft belongs to normal boots only; amd_iommu=off to every boot entry.
MODES = {
    "soft": {"arg": "iommu=soft", "conflict": "amd_iommu=off", "variable": "GRUB_CMDLINE_LINUX_DEFAULT"},
    "off": {"arg": "amd_iommu=off", "conflict": "iommu=soft", "variable": "GRUB_CMDLINE_LINUX"},
}
NO_AMD_GPU = "no AMD GPU (vendor 0x1002, display/accelerator class)"
_DEVICE_ID_RE = re.compile(r"^(0x)?[0-9a-fA-F]{1,4}$")


# --- settings ------------------------------------------------------------------------------------------



def wanted_of(settings):
    """The grub arguments ``iommu_mode`` asks for, in the shape grub_plan works with."""
    kernel = MODES[settings["iommu_mode"]]
    return grub_plan.wanted_args(
        [kernel["arg"]], [kernel["conflict"]], kernel["variable"], grub_plan.CMDLINE_VARIABLES,
        settings["iommu_grub_dropin_name"], GRUB_DEFAULT)


def _problem(name, found, expected, fix):
    return {"name": name, "found": found, "expected": expected, "fix": fix}


def validate(settings: Settings) -> Problems:
    """Input problems beyond the types and choices of meta/argument_specs.yml."""
    problems = []
    ids = settings.get("iommu_amd_device_ids") or []
    if not isinstance(ids, (list, tuple)):
        problems.append(_problem("iommu_amd_device_ids", repr(ids), "a list of PCI device ids",
                                 "set iommu_amd_device_ids: [\"0x74a1\"] (or [] for every AMD GPU)"))
        ids = []
    for value in ids:
        if not _DEVICE_ID_RE.match(str(value).strip()):
            problems.append(_problem(
                "iommu_amd_device_ids", repr(value), "a hexadecimal PCI device id such as 0x74a1 or 74a1",
                "use the id lspci -nn shows in brackets after 1002: (for example [1002:74a1] -> 0x74a1)"))
    mode = settings.get("iommu_mode")
    if mode not in MODES:
        problems.append(_problem("iommu_mode", repr(mode), "one of %s" % ", ".join(sorted(MODES)),
                                 "set iommu_mode to soft (iommu=soft) or off (amd_iommu=off)"))
    name = settings.get("iommu_grub_dropin_name")
    if not isinstance(name, str) or not re.match(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\.cfg$", name):
        problems.append(_problem(
            "iommu_grub_dropin_name", repr(name), "a file name ending in .cfg (grub-mkconfig sources only *.cfg)",
            "set iommu_grub_dropin_name: 90-preflight-iommu.cfg"))
    command = settings.get("iommu_grub_update_command")
    if command is not None:
        if not isinstance(command, (list, tuple)) or not all(isinstance(part, str) and part for part in command):
            problems.append(_problem(
                "iommu_grub_update_command", repr(command),
                "null (detect), [] (never) or an argv list of non-empty strings",
                "set iommu_grub_update_command: [update-grub] or [grub2-mkconfig, -o, /boot/grub2/grub.cfg]"))
        elif command and any(char.isspace() for char in command[0]):
            problems.append(_problem(
                "iommu_grub_update_command", repr(command), "an argv list: the program alone in the first entry",
                "split the command into one list entry per word (no shell is used)"))
    for name in ("iommu_grub_update_timeout", "iommu_reboot_timeout"):
        value = settings.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            problems.append(_problem(name, repr(value), "a whole number of seconds above 0",
                                     "set %s to a positive number of seconds (default in roles/iommu/defaults)"
                                     % name))
    for name in ("iommu_root", "iommu_sysfs_root"):
        value = settings.get(name)
        if not isinstance(value, str) or not os.path.isabs(value):
            problems.append(_problem(name, repr(value), "an absolute path",
                                     "set %s to an absolute path (%s on a real node)"
                                     % (name, "/" if name == "iommu_root" else "/sys")))
    if switched_on(settings["iommu_reboot"]) and settings.get("iommu_root") not in ("/", "", None):
        problems.append(_problem(
            "iommu_reboot", "iommu_reboot is true while iommu_root is %s" % settings.get("iommu_root"),
            "a reboot only for the node's real grub defaults (iommu_root /)",
            "set iommu_reboot: false when iommu_root points at a test tree"))
    return problems


def read_args(settings: Settings, node: Node) -> Args:
    """What :func:`read` needs on ``node``; None when ``iommu_enabled`` is off."""
    if not switched_on(settings["iommu_enabled"]):
        return None
    return {
        "sysfs_root": settings["iommu_sysfs_root"],
        "amd_device_ids": list(settings.get("iommu_amd_device_ids") or []),
        "root": settings["iommu_root"],
        "grub_default": GRUB_DEFAULT,
        "dropin_dir": GRUB_DROPIN_DIR,
        "proc_cmdline": PROC_CMDLINE,
    }


# --- decider -------------------------------------------------------------------------------------------


def decide(host: str, facts: Facts, settings: Settings, probe: Optional[dict] = None,
           cluster: Optional[dict] = None) -> Checks:
    """``{grub, cmdline}`` checks for ``host``; ``{enabled}`` skipped when switched off."""
    first = off_or_unread("iommu", host, settings["iommu_enabled"], facts,
                          "the IOMMU kernel arguments", "the PCI GPUs, grub defaults and /proc/cmdline read on the node")
    if first is not None:
        return first
    wanted = wanted_of(settings)
    expected = grub_checks.expected_text(wanted)
    pci = facts.get("pci") or {}
    if pci.get("error"):
        found = "cannot tell whether %s has an AMD GPU: %s" % (host, pci["error"])
        fix = ("check that sysfs is mounted at %s and readable on %s and that iommu_amd_device_ids holds hex ids "
               "such as 0x74a1, then re-run" % (settings["iommu_sysfs_root"], host))
        return {"grub": warned(found, expected, fix), "cmdline": warned(found, expected, fix)}
    if not pci.get("amd_gpus"):
        reason = "%s found on %s" % (NO_AMD_GPU, host)
        if pci.get("present") is False:
            reason += " (%s does not exist: no PCI bus visible)" % pci.get("path")
        elif settings.get("iommu_amd_device_ids"):
            reason += " among the device ids of iommu_amd_device_ids (%s)" % ", ".join(settings["iommu_amd_device_ids"])
        applies = "an AMD GPU, for the IOMMU setting to apply"
        return {"grub": not_applicable(reason, applies), "cmdline": not_applicable(reason, applies)}
    outcome = grub_plan.plan(facts["grub"], wanted, settings["iommu_grub_mode"])
    grub = grub_checks.grub_check(outcome, wanted, settings["iommu_drift_policy"], host=host)
    grub.setdefault("details", {})["amd_gpus"] = ["%s (device %s)" % (gpu["address"], gpu["device"])
                                                  for gpu in pci.get("gpus", []) if gpu.get("vendor_name") == "amd"]
    cmdline = grub_checks.cmdline_check(facts["cmdline"], wanted, grub_ready=grub["status"] == "pass", host=host)
    return block_refused({"grub": grub, "cmdline": cmdline}, facts.get("needs_root"))
