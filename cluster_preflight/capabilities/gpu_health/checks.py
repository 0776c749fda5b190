# -*- coding: utf-8 -*-
"""Capability ``gpu_health``, the controller half's checks: one pure function per check, each from the
facts of ``module_utils/preflight_node/capabilities/gpu_health.py``.  ``gpu_health.decide`` calls them in order; the
links'
checks (``pcie``, ``nvlink``) are in ``gpu_health_links.py``.

A GPU is named ``GPU <index> (<PCI bus id>)``, the field by nvidia-smi's XML path or amd-smi's key.  What a tool
reports as unavailable (``N/A``: consumer and Windows cards, vGPU guests, MIG mode) is never judged: a GPU whose
field was not observed is named with the reason, and a check that observed no GPU at all is ``not_applicable``
saying why.  ECC and persistence modes are the operator's configuration: required only where
``gpu_health_ecc_required`` / ``gpu_health_persistence_required`` say so, but a node whose GPUs disagree warns.
"""

from __future__ import annotations

import collections

from preflight_node.checks import failed, not_applicable, passed, warned, worst
from preflight_node.gpu.nvidia_gpus import normalize_bus_id
from preflight_node.privilege import needs_root

from ..common import switched_on

TOOLS = {"nvidia": "nvidia-smi", "amd": "amd-smi"}
VENDOR_NAMES = {"nvidia": "NVIDIA", "amd": "AMD"}
TOOL_FIX = {
    "nvidia": "check that the NVIDIA driver is loaded (lsmod | grep nvidia) and that nvidia-smi -q -x answers "
              "by hand; reboot the node if nvidia-smi hangs",
    "amd": "check that the amdgpu driver is loaded (lsmod | grep amdgpu) and that amd-smi static --json "
           "answers by hand",
}
RESET_FIX = "drain the node and reset the GPU (nvidia-smi -r -i %s, or reboot the node) to apply it"
HW_THROTTLE = {"hw_slowdown": "HW slowdown (power or thermal protection of the board)",
               "hw_thermal_slowdown": "HW thermal slowdown", "hw_power_brake_slowdown": "HW power brake slowdown"}
# Item statuses besides warn and fail: a GPU the check could not judge (UNOBSERVED), and what a pass must say
# about a GPU it judged (NOTE: an idle link not judged for speed, a mode that is not required).
UNOBSERVED, NOTE = "unobserved", "note"


def label(gpu):
    return "GPU %s (%s)" % (gpu.get("index"), gpu.get("bus_id"))


def _grouped(notes):
    """``[(gpu label, text)]`` as ``GPU 0 (..), GPU 1 (..): text; GPU 2 (..): other``."""
    by_text = collections.OrderedDict()
    for name, text in notes:
        by_text.setdefault(text, []).append(name)
    return "; ".join("%s: %s" % (", ".join(names), text) for text, names in by_text.items())


def combine(host, items, expected, found_ok, judged, notes=()):
    """One check of ``items`` (``(status, found, fix)`` of each problem): the worst status, every problem's
    found, the distinct fixes; ``found_ok`` when there is none; None when nothing was judged.  ``notes``
    (``[(gpu label, text)]``) qualify the text: what was not observed or not judged, and why."""
    tail = " (%s)" % _grouped(notes) if notes else ""
    if not items:
        if not judged:
            return None
        return passed("%s: %s%s" % (host, found_ok, tail), expected)
    status = worst(status for status, _found, _fix in items)
    found = "%s: %s%s" % (host, "; ".join(found for _status, found, _fix in items), tail)
    fixes = []
    for _status, _found, fix in items:
        if fix not in fixes:
            fixes.append(fix)
    return (failed if status == "fail" else warned)(found, expected, "; ".join(fixes))


def per_gpu(host, facts, vendors, judge, expected, found_ok, what, extra=()):
    """``judge(vendor, gpu) -> [(status, found, fix)]`` over the GPUs the tools of ``vendors`` read; a tool
    that failed is a ``fail`` (the check is not verified).  An ``UNOBSERVED`` item leaves its GPU unjudged, a
    ``NOTE`` is said in the text; ``extra`` are items about the node as a whole; ``found_ok`` is the pass text
    (``%d``: the GPUs judged), or a function of that count called after every GPU was judged.  not_applicable
    when no GPU was judged, saying why."""
    items, notes, judged = list(extra), [], 0
    for vendor in vendors:
        section = facts.get(vendor) or {}
        if section.get("error"):
            items.append(("fail", "%s failed, so %s is not verified (see gpu_health.count): %s"
                          % (TOOLS[vendor], what, section["error"]), TOOL_FIX[vendor]))
        for gpu in section.get("gpus") or []:
            found = judge(vendor, gpu)
            judged += not any(status == UNOBSERVED for status, _found, _fix in found)
            notes.extend((label(gpu), text) for status, text, _fix in found if status in (UNOBSERVED, NOTE))
            items.extend(item for item in found if item[0] in ("warn", "fail"))
    if callable(found_ok):
        found_ok = found_ok(judged)
    result = combine(host, items, expected, found_ok % judged if "%d" in found_ok else found_ok, judged, notes)
    if result is not None:
        return result
    if notes:
        return not_applicable("%s not observed on %s: %s" % (what, host, _grouped(notes)), expected)
    return not_applicable("no %s GPU read on %s: %s does not apply" % (
        " or ".join(VENDOR_NAMES[vendor] for vendor in vendors), host, what), expected)


def mixed_modes(gpus, field, xml_path, fix):
    """A ``warn`` item when the GPUs of a node report both Enabled and Disabled in ``field`` (someone changed one
    GPU: its peers show the intended configuration), else nothing."""
    by_mode = collections.defaultdict(list)
    for gpu in gpus:
        if gpu.get(field) in ("Enabled", "Disabled"):
            by_mode[gpu[field]].append(label(gpu))
    if len(by_mode) < 2:
        return []
    return [("warn", "%s is Enabled on %s but Disabled on %s" % (
        xml_path, ", ".join(by_mode["Enabled"]), ", ".join(by_mode["Disabled"])), fix)]


def _bus_addresses(pci, vendor):
    found = set()
    for gpu in pci.get("gpus") or []:
        if gpu.get("vendor_name") == vendor:
            try:
                found.add(normalize_bus_id(gpu["address"]))
            except ValueError:
                found.add(gpu["address"])
    return found


def _count_vendor(host, facts, vendor, settings):
    """The count problems of one vendor: a tool missing, failing, or seeing fewer GPUs than the bus."""
    pci, section = facts.get("pci") or {}, facts.get(vendor) or {}
    on_bus, tool = pci.get("%s_gpus" % vendor) or 0, TOOLS[vendor]
    seen = len(section.get("gpus") or [])
    if on_bus and not section.get("present"):
        return [("fail", "the PCI bus shows %d %s GPU%s but %s (gpu_health_%s: %s) is not installed" % (
            on_bus, VENDOR_NAMES[vendor], "" if on_bus == 1 else "s", tool, tool.replace("-", "_"),
            settings.get("gpu_health_%s" % tool.replace("-", "_"))),
            "install the %s driver and its tools (%s comes with them), or set gpu_health_%s to its path"
            % (VENDOR_NAMES[vendor], tool, tool.replace("-", "_")))]
    if section.get("error"):
        return [("fail", "%s is installed but fails: %s" % (tool, section["error"]), TOOL_FIX[vendor])]
    lost = ("the driver lost a GPU: look for Xid 79 in the kernel log (gpu_health.xid), drain and reboot the node; "
            "if the GPU stays missing, reseat it and check its power and riser")
    items = []
    attached = section.get("attached_gpus")
    if attached is not None and attached != seen:
        items.append(("fail", "nvidia-smi counts %d attached GPU%s (attached_gpus) but lists %d" % (
            attached, "" if attached == 1 else "s", seen), lost + "; nvidia-smi -L shows which GPUs answer"))
    if pci.get("error") is None and seen < on_bus:
        missing = sorted(_bus_addresses(pci, vendor) - set(gpu.get("bus_id") for gpu in section.get("gpus") or []))
        items.append(("fail", "the PCI bus shows %d %s GPUs, %s %d (missing from %s: %s)" % (
            on_bus, VENDOR_NAMES[vendor], tool, seen, tool, ", ".join(missing) or "unknown"), lost))
    return items


def count(host, facts, settings):
    """GPUs the tools see vs. the PCI bus vs. the tool's own count vs. ``gpu_health_expected_count``."""
    pci = facts.get("pci") or {}
    items = _count_vendor(host, facts, "nvidia", settings) + _count_vendor(host, facts, "amd", settings)
    seen = {vendor: len((facts.get(vendor) or {}).get("gpus") or []) for vendor in TOOLS}
    total = sum(seen[vendor] or pci.get("%s_gpus" % vendor) or 0 for vendor in TOOLS)
    wanted = int(settings.get("gpu_health_expected_count") or 0)
    if wanted and total != wanted:
        items.append(("fail", "%d GPU%s found, gpu_health_expected_count is %d" % (total, "" if total == 1 else "s",
                                                                                   wanted),
                      "find the missing GPUs (PCI bus, driver, kernel log) or correct gpu_health_expected_count"))
    if pci.get("error"):
        items.append(("warn", "cannot compare with the PCI bus: %s" % pci["error"],
                      "check that sysfs is mounted at gpu_health_sysfs_root (%s) and readable"
                      % settings.get("gpu_health_sysfs_root")))
    expected = ("every GPU on the PCI bus and every GPU the tool counts listed by its driver's tool"
                + (", %d in all (gpu_health_expected_count)" % wanted if wanted else ""))
    found_ok = ", ".join("%d %s GPUs on the PCI bus, %d in %s" % (pci.get("%s_gpus" % vendor) or 0,
                                                                  VENDOR_NAMES[vendor], seen[vendor], TOOLS[vendor])
                         for vendor in TOOLS if seen[vendor] or pci.get("%s_gpus" % vendor))
    if pci.get("present") is False:
        # A VM or sandbox without a visible PCI bus: the tools' own lists are all there is to compare.
        found_ok += " (%s: the tools' lists are not compared with the bus)" % "; ".join(
            pci.get("notes") or ["no PCI bus visible"])
    return combine(host, items, expected, found_ok, 1)


def _ecc_nvidia(gpu, required):
    name, items = label(gpu), []
    mode, pending = gpu.get("ecc_mode_current"), gpu.get("ecc_mode_pending")
    if mode and pending and pending != mode:
        items.append(("warn", "%s ecc_mode/current_ecc is %s, pending_ecc %s: the change waits for a GPU reset" % (
            name, mode, pending), RESET_FIX % gpu.get("index")))
    if mode is None:
        return items + [(UNOBSERVED, "ECC not reported (ecc_mode N/A: not supported by this GPU or hidden from a "
                                     "guest)", None)]
    if mode == "Disabled":
        if required:
            items.append(("warn", "%s ecc_mode/current_ecc is Disabled (gpu_health_ecc_required)" % name,
                          "enable ECC (nvidia-smi -i %s -e 1) and reset the GPU or reboot the node" % gpu.get("index")))
        return items + [(UNOBSERVED, "ECC is Disabled, so memory errors are neither corrected nor counted", None)]
    volatile, aggregate = gpu.get("ecc_uncorrectable_volatile"), gpu.get("ecc_uncorrectable_aggregate")
    if volatile is None and aggregate is None:
        return items + [(UNOBSERVED, "ECC Enabled but its error counts are not reported (N/A)", None)]
    if volatile:
        items.append(("fail", "%s ecc_errors/volatile has %d uncorrectable errors since the last reset" % (
            name, volatile), RESET_FIX % gpu.get("index") + "; if they come back, open an RMA for the GPU"))
    elif aggregate:
        items.append(("warn", "%s ecc_errors/aggregate has %d uncorrectable errors over its life" % (name, aggregate),
                      "watch the GPU: check gpu_health.memory for remapping and open an RMA if the count grows"))
    return items


def ecc(host, facts, settings):
    required = switched_on(settings["gpu_health_ecc_required"])

    def judge(vendor, gpu):
        if vendor == "nvidia":
            return _ecc_nvidia(gpu, required)
        bad = gpu.get("ecc_uncorrectable")
        if bad is None:
            return [(UNOBSERVED, "the uncorrectable ECC count is not reported", None)]
        return [("fail", "%s ecc.total_uncorrectable_count is %d" % (label(gpu), bad),
                 "drain the node, reset the GPU (amd-smi reset -G -g %s) and open an RMA if it comes back"
                 % gpu.get("index"))] if bad else []
    extra = mixed_modes((facts.get("nvidia") or {}).get("gpus") or [], "ecc_mode_current", "ecc_mode/current_ecc",
                        "set the same ECC mode on every GPU (nvidia-smi -e 1 for all) and reset them")
    return per_gpu(host, facts, ("nvidia", "amd"), judge,
                   "no uncorrectable ECC error since the last reset on the GPUs that report ECC%s" % (
                       ", ECC enabled on every GPU (gpu_health_ecc_required)" if required else ""),
                   "ECC enabled, no uncorrectable error on %d GPUs", "the ECC state", extra)


def memory(host, facts):
    def judge(_vendor, gpu):
        name, items = label(gpu), []
        fields = (gpu.get("remap_pending"), gpu.get("remap_failure"), gpu.get("retired_pages_pending"))
        if all(value is None for value in fields):
            mig = " in MIG mode" if gpu.get("mig_mode") == "Enabled" else ""
            return [(UNOBSERVED, "row remapping and page retirement not reported (N/A%s)" % mig, None)]
        if gpu.get("remap_failure"):
            items.append(("fail", "%s remapped_rows/remapped_row_failure is Yes (no spare row left)" % name,
                          "drain the node and open an RMA for the GPU: its memory cannot be repaired in the field"))
        for field, value in (("remapped_rows/remapped_row_pending", gpu.get("remap_pending")),
                             ("retired_pages/pending_retirement", gpu.get("retired_pages_pending"))):
            if value:
                items.append(("fail", "%s %s is Yes" % (name, field), RESET_FIX % gpu.get("index")))
        return items
    return per_gpu(host, facts, ("nvidia",), judge,
                   "no row remap or page retirement pending, no remap failure",
                   "no row remap or page retirement pending or failed on %d GPUs", "row remapping")


def throttle(host, facts):
    def judge(_vendor, gpu):
        reasons = gpu.get("throttle_active")
        if reasons is None:
            return [(UNOBSERVED, "clock event reasons not reported (N/A)", None)]
        items = []
        for reason in reasons:
            field = "clocks_event_reasons/clocks_event_reason_%s is Active" % reason
            if reason in HW_THROTTLE:
                items.append(("fail", "%s %s (%s)" % (label(gpu), field, HW_THROTTLE[reason]),
                              "check the GPU's cooling, power supplies and power brake signal (nvidia-smi -q -d "
                              "PERFORMANCE,TEMPERATURE,POWER -i %s); drain the node until it clears"
                              % gpu.get("index")))
            else:
                items.append(("warn", "%s %s (software thermal slowdown)" % (label(gpu), field),
                              "check the airflow and inlet temperature of GPU %s" % gpu.get("index")))
        return items
    return per_gpu(host, facts, ("nvidia",), judge, "no hardware or thermal clock slowdown active",
                   "no clock slowdown active on %d GPUs", "clock slowdown")


def _not_reported(gpu, what):
    if gpu.get("driver_model") == "WDDM":
        return "%s not reported (N/A under the Windows WDDM driver)" % what
    if (gpu.get("virtualization_mode") or "").upper() == "VGPU":
        return "%s not reported (N/A in a vGPU guest)" % what
    return "%s not reported (N/A)" % what


def persistence(host, facts, settings):
    required = switched_on(settings["gpu_health_persistence_required"])
    gpus = (facts.get("nvidia") or {}).get("gpus") or []

    def judge(_vendor, gpu):
        mode = gpu.get("persistence_mode")
        if mode is None:
            return [(UNOBSERVED, _not_reported(gpu, "persistence mode"), None)]
        if mode != "Disabled":
            return []
        if required:
            return [("warn", "%s persistence_mode is Disabled (gpu_health_persistence_required)" % label(gpu),
                     "enable nvidia-persistenced (systemctl enable --now nvidia-persistenced) or run "
                     "nvidia-smi -i %s -pm 1" % gpu.get("index"))]
        return [(NOTE, "persistence mode Disabled, not required (gpu_health_persistence_required is false): each "
                       "job's first CUDA call initialises the GPU", None)]
    enabled = sum(1 for gpu in gpus if gpu.get("persistence_mode") == "Enabled")
    reported = sum(1 for gpu in gpus if gpu.get("persistence_mode") is not None)
    extra = mixed_modes(gpus, "persistence_mode", "persistence_mode",
                        "set persistence mode alike on every GPU (nvidia-persistenced, or nvidia-smi -pm 1 for all)")
    return per_gpu(host, facts, ("nvidia",), judge,
                   "persistence mode the same on every GPU%s" % (
                       ", Enabled (gpu_health_persistence_required)" if required else ""),
                   "persistence mode Enabled on %s GPUs" % (
                       enabled if enabled == reported else "%d of %d" % (enabled, reported)), "persistence mode", extra)


def kernel_log_unread(host, section, expected):
    """The check of a kernel-log reading (``facts["xid"]``) that could not observe: not read by setting, not
    without root, or an error; None when it was read."""
    if section.get("source") == "none":
        return not_applicable("gpu_health_kernel_log is none on %s: the kernel log is not read" % host, expected)
    if section.get("needs_root"):
        return needs_root("cannot read the kernel log of %s without root (%s)" % (host, section.get("error")),
                          expected)
    if section.get("error"):
        return warned("cannot read the kernel log of %s: %s" % (host, section["error"]), expected,
                      "install journalctl or dmesg on %s, or set gpu_health_kernel_log to the one it has" % host)
    return None
