# -*- coding: utf-8 -*-
"""Capability ``gpu_health``, the controller half's checks: one pure function per check, each from the
facts of ``module_utils/preflight_node/gpu_health.py``.  ``gpu_health.decide`` calls them in order.

A GPU is named ``GPU <index> (<PCI bus id>)``, the field by nvidia-smi's XML path or amd-smi's key.
"""

from __future__ import annotations

from preflight_node.checks import failed, not_applicable, passed, warned, worst
from preflight_node.gpus import normalize_bus_id

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


def label(gpu):
    return "GPU %s (%s)" % (gpu.get("index"), gpu.get("bus_id"))


def combine(host, items, expected, found_ok, judged):
    """One check of ``items`` (``(status, found, fix)`` of each problem): the worst status, every problem's
    found, the distinct fixes; ``found_ok`` when there is none; not_applicable when nothing was judged."""
    if not items:
        if not judged:
            return None
        return passed("%s: %s" % (host, found_ok), expected)
    status = worst(status for status, _found, _fix in items)
    found = "%s: %s" % (host, "; ".join(found for _status, found, _fix in items))
    fixes = []
    for _status, _found, fix in items:
        if fix not in fixes:
            fixes.append(fix)
    return (failed if status == "fail" else warned)(found, expected, "; ".join(fixes))


def per_gpu(host, facts, vendors, judge, expected, found_ok, what):
    """``judge(vendor, gpu) -> [(status, found, fix)]`` over the GPUs the tools of ``vendors`` read; a tool
    that failed is a ``fail`` (the check is not verified); not_applicable when no GPU of ``vendors``."""
    items, judged = [], 0
    for vendor in vendors:
        section = facts.get(vendor) or {}
        if section.get("error"):
            items.append(("fail", "%s failed, so %s is not verified (see gpu_health.count): %s"
                          % (TOOLS[vendor], what, section["error"]), TOOL_FIX[vendor]))
        for gpu in section.get("gpus") or []:
            judged += 1
            items.extend(judge(vendor, gpu))
    result = combine(host, items, expected, found_ok % judged if "%d" in found_ok else found_ok, judged)
    if result is None:
        return not_applicable("no %s GPU read on %s: %s does not apply" % (
            " or ".join(VENDOR_NAMES[vendor] for vendor in vendors), host, what), expected)
    return result


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
    if pci.get("error") is None and seen < on_bus:
        missing = sorted(_bus_addresses(pci, vendor) - set(gpu.get("bus_id") for gpu in section.get("gpus") or []))
        return [("fail", "the PCI bus shows %d %s GPUs, %s %d (missing from %s: %s)" % (
            on_bus, VENDOR_NAMES[vendor], tool, seen, tool, ", ".join(missing) or "unknown"),
            "the driver lost a GPU: look for Xid 79 in the kernel log (gpu_health.xid), drain and reboot the node; "
            "if the GPU stays missing, reseat it and check its power and riser")]
    return []


def count(host, facts, settings):
    """GPUs the tools see vs. the PCI bus vs. ``gpu_health_expected_count``."""
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
    expected = ("every GPU on the PCI bus seen by its driver's tool"
                + (", %d in all (gpu_health_expected_count)" % wanted if wanted else ""))
    found_ok = ", ".join("%d %s GPUs on the PCI bus, %d in %s" % (pci.get("%s_gpus" % vendor) or 0,
                                                                  VENDOR_NAMES[vendor], seen[vendor], TOOLS[vendor])
                         for vendor in TOOLS if seen[vendor] or pci.get("%s_gpus" % vendor))
    return combine(host, items, expected, found_ok, 1)


def ecc(host, facts):
    def judge(vendor, gpu):
        name = label(gpu)
        if vendor == "amd":
            bad = gpu.get("ecc_uncorrectable")
            return [("fail", "%s ecc.total_uncorrectable_count is %d" % (name, bad),
                     "drain the node, reset the GPU (amd-smi reset -G -g %s) and open an RMA if it comes back"
                     % gpu.get("index"))] if bad else []
        items = []
        if gpu.get("ecc_mode_current") == "Disabled":
            items.append(("warn", "%s ecc_mode/current_ecc is Disabled" % name,
                          "enable ECC (nvidia-smi -i %s -e 1) and reset the GPU or reboot the node" % gpu.get("index")))
        if gpu.get("ecc_uncorrectable_volatile"):
            items.append(("fail", "%s ecc_errors/volatile has %d uncorrectable errors since the last reset" % (
                name, gpu["ecc_uncorrectable_volatile"]), RESET_FIX % gpu.get("index")
                + "; if they come back, open an RMA for the GPU"))
        elif gpu.get("ecc_uncorrectable_aggregate"):
            items.append(("warn", "%s ecc_errors/aggregate has %d uncorrectable errors over its life" % (
                name, gpu["ecc_uncorrectable_aggregate"]),
                "watch the GPU: check gpu_health.memory for remapping and open an RMA if the count grows"))
        return items
    return per_gpu(host, facts, ("nvidia", "amd"), judge,
                   "ECC enabled and no uncorrectable ECC error since the last reset",
                   "ECC enabled, no uncorrectable error on %d GPUs", "the ECC state")


def memory(host, facts):
    def judge(_vendor, gpu):
        name, items = label(gpu), []
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
                   "no row remap pending or failed on %d GPUs", "row remapping")


def throttle(host, facts):
    def judge(_vendor, gpu):
        items = []
        for reason in gpu.get("throttle_active") or []:
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


def pcie(host, facts, settings):
    floor = int(settings.get("gpu_health_pcie_min_width") or 0)

    def judge(_vendor, gpu):
        items, name = [], label(gpu)
        width, widest = gpu.get("pcie_width_current"), gpu.get("pcie_width_max")
        wanted = floor or widest
        if width is not None and wanted and width < wanted:
            items.append(("fail", "%s PCIe link trained at x%d, expected x%d (%s)" % (
                name, width, wanted, "gpu_health_pcie_min_width" if floor else "the GPU's max_link_width"),
                "reseat GPU %s and check its riser/cable and slot, then reboot so the link retrains"
                % gpu.get("index")))
        gen, top = gpu.get("pcie_gen_current"), gpu.get("pcie_gen_max")
        if gen is not None and top and gen < top:
            items.append(("warn", "%s PCIe link at gen %d, max gen %d (an idle GPU lowers its link speed to save "
                          "power, so this is only a problem under load)" % (name, gen, top),
                          "re-check GPU %s under load (nvidia-smi -q -d PCI while a job runs); if it stays below "
                          "gen %d, check the slot, riser and BIOS PCIe settings" % (gpu.get("index"), top)))
        return items
    return per_gpu(host, facts, ("nvidia", "amd"), judge,
                   "every GPU's PCIe link at its full width%s" % (" (at least x%d)" % floor if floor else ""),
                   "%d GPUs at full PCIe width", "the PCIe link")


def persistence(host, facts):
    def judge(_vendor, gpu):
        if gpu.get("persistence_mode") == "Disabled":
            return [("warn", "%s persistence_mode is Disabled" % label(gpu),
                     "enable nvidia-persistenced (systemctl enable --now nvidia-persistenced) or run "
                     "nvidia-smi -i %s -pm 1" % gpu.get("index"))]
        return []
    return per_gpu(host, facts, ("nvidia",), judge, "persistence mode enabled on every NVIDIA GPU",
                   "persistence mode enabled on %d GPUs", "persistence mode")


def active_links(gpu):
    """How many NVLinks of ``gpu`` are active (None when nvidia-smi nvlink -s did not list it)."""
    links = gpu.get("nvlink")
    return None if not links else len(links.get("active") or [])


def nvlink(host, facts):
    """Every GPU has as many active NVLinks as the best GPU of its node (an NVLink that went down is inactive on one
    GPU only; a node built with fewer links has them inactive on every GPU alike)."""
    section = facts.get("nvidia") or {}
    gpus = section.get("gpus") or []
    expected = "as many active NVLinks on every GPU as on the best GPU of the node"
    if section.get("nvlink_error"):
        return failed("nvidia-smi nvlink -s failed on %s, so NVLink is not verified: %s" % (
            host, section["nvlink_error"]), expected,
            "run nvidia-smi nvlink -s by hand on %s; check nvidia-fabricmanager (systemctl status "
            "nvidia-fabricmanager) on NVSwitch systems" % host)
    counts = {label(gpu): active_links(gpu) for gpu in gpus}
    best = max([count for count in counts.values() if count is not None] or [0])
    if len(gpus) < 2 or not best:
        return not_applicable("no active NVLink on the GPUs of %s (PCIe only, or fewer than two GPUs)" % host,
                              expected)
    items = []
    for gpu in gpus:
        count = counts[label(gpu)]
        if count is None:
            items.append(("fail", "%s is missing from nvidia-smi nvlink -s while its peers have %d active links" % (
                label(gpu), best), "run nvidia-smi nvlink -s -i %s on %s" % (gpu.get("index"), host)))
        elif count < best:
            items.append(("fail", "%s has %d active NVLinks, its peers %d (inactive: %s)" % (
                label(gpu), count, best, ", ".join("link %d" % link for link in gpu["nvlink"].get("inactive") or [])),
                "drain %s: check the NVLink/NVSwitch tray and nvidia-fabricmanager's log, reset the GPUs (reboot); "
                "if the link stays down, open an RMA for the baseboard" % host))
    return combine(host, items, expected, "%d GPUs with %d active NVLinks each" % (len(gpus), best), len(gpus))
