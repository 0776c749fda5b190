# -*- coding: utf-8 -*-
"""Capability ``gpu_health``, the controller half's link checks: ``pcie`` (width, generation under load, replays)
and ``nvlink`` (active links per GPU), from the facts of ``module_utils/preflight_node/capabilities/gpu_health.py``.

What real machines print shaped these rules: an idle GPU lowers its PCIe generation to save power (P8 at gen 1 of
4 is normal), so the generation is judged only on a GPU under load (performance state P0/P1 or utilisation of
:data:`LOADED_UTIL` % or more); a link at half its maximum width on every GPU of a model alike is how the slot is
wired or split (two consumer cards at x8 of x16, a cloud T4), while a GPU narrower than a sibling of its model, or at
a quarter of its width or less, trained down.  ``nvidia-smi nvlink -s`` answers a GPU in MIG mode or without NVLink
with a sentence instead of links: that GPU's NVLink is not observed, never a failure.  One sentence is an
observation: "all links are inactive" is a GPU with NVLinks and none up, a failure beside siblings whose links are up
(a node whose GPUs all say it runs without NVLink).
"""

from __future__ import annotations

from preflight_node.checks import failed, not_applicable

from .checks import NOTE, UNOBSERVED, combine, label, per_gpu

LOADED_STATES = ("P0", "P1")
LOADED_UTIL = 50


def loaded(gpu):
    """Whether the GPU works hard enough for its PCIe link to run at full speed."""
    return gpu.get("performance_state") in LOADED_STATES or (gpu.get("gpu_util") or 0) >= LOADED_UTIL


def _load_text(gpu):
    parts = [gpu.get("performance_state")] + (["%s %%" % gpu["gpu_util"]] if gpu.get("gpu_util") is not None else [])
    return ", ".join(part for part in parts if part) or "load not reported"


def _widest_by_model(facts):
    """``(vendor, model) -> widest current link`` of the node's GPUs."""
    widest = {}
    for vendor in ("nvidia", "amd"):
        for gpu in (facts.get(vendor) or {}).get("gpus") or []:
            if gpu.get("pcie_width_current") is not None:
                key = (vendor, gpu.get("model"))
                widest[key] = max(widest.get(key, 0), gpu["pcie_width_current"])
    return widest


def _width(vendor, gpu, floor, siblings):
    """Items about the link width of one GPU; [] when it is not reported."""
    name, width, top = label(gpu), gpu.get("pcie_width_current"), gpu.get("pcie_width_max")
    reseat = ("reseat GPU %s and check its riser/cable and slot, then reboot so the link retrains"
              % gpu.get("index"))
    if width is None or not (floor or top):
        return []
    if floor and width < floor:
        return [("fail", "%s PCIe link trained at x%d, expected x%d (gpu_health_pcie_min_width)" % (name, width, floor),
                 reseat)]
    if floor or width >= top:
        return [("width", "", None)]
    sibling = siblings.get((vendor, gpu.get("model")), width)
    if width * 4 <= top:
        return [("fail", "%s PCIe link trained at x%d of its x%d (a quarter of its lanes or fewer)" % (
            name, width, top), reseat)]
    if sibling > width:
        return [("fail", "%s PCIe link trained at x%d of its x%d while another %s of the node runs at x%d" % (
            name, width, top, gpu.get("model"), sibling), reseat)]
    return [(NOTE, "x%d of its x%d, as every %s of the node: a slot wired or split at x%d (gpu_health_pcie_min_width "
                   "%d requires x%d)" % (width, top, gpu.get("model"), width, top, top), None)]


def _generation(gpu):
    name, gen, top = label(gpu), gpu.get("pcie_gen_current"), gpu.get("pcie_gen_max")
    if gen is None or not top:
        return []
    if gen >= top:
        return [("generation", "", None)]
    if not loaded(gpu):
        return [(NOTE, "gen %d of %d while idle (%s): an idle GPU slows its link, so the generation is judged "
                       "under load only" % (gen, top, _load_text(gpu)), None)]
    return [("warn", "%s PCIe link at gen %d of its max gen %d under load (%s)" % (name, gen, top, _load_text(gpu)),
             "check GPU %s's slot, riser and the BIOS PCIe settings (nvidia-smi -q -d PCI while a job runs); "
             "reseat it if the link stays below gen %d" % (gpu.get("index"), top))]


def pcie(host, facts, settings):
    floor = int(settings.get("gpu_health_pcie_min_width") or 0)
    replay_max = int(settings.get("gpu_health_pcie_replay_max") or 0)
    siblings = _widest_by_model(facts)
    seen = {"width": 0, "generation": 0, "replays": 0}

    def judge(vendor, gpu):
        found = _width(vendor, gpu, floor, siblings) + _generation(gpu)
        replays = gpu.get("pcie_replays")
        seen["width"] += any(item[0] == "width" for item in found)
        seen["generation"] += any(item[0] == "generation" for item in found)
        seen["replays"] += replays is not None
        if replays is not None and replays > replay_max:
            found.append(("warn", "%s PCIe replay count is %d since boot (above gpu_health_pcie_replay_max %d): the "
                          "link retransmits" % (label(gpu), replays, replay_max),
                          "watch the count under load; if it grows, reseat GPU %s and check its riser/cable and slot"
                          % gpu.get("index")))
        if not found and replays is None:
            return [(UNOBSERVED, "PCIe link width, generation and replays not reported (N/A)", None)]
        return [item for item in found if item[0] in ("warn", "fail", NOTE)]
    return per_gpu(host, facts, ("nvidia", "amd"), judge,
                   "every GPU's PCIe link at its full width (or half of it on every GPU of a model alike%s), at its "
                   "generation under load, replays at most gpu_health_pcie_replay_max" % (
                       "; at least x%d" % floor if floor else ""),
                   lambda judged: "PCIe links of %d GPUs: width as expected on %d, generation at its maximum on %d, "
                                  "replays within gpu_health_pcie_replay_max on %d" % (
                                      judged, seen["width"], seen["generation"], seen["replays"]),
                   "the PCIe link")


def active_links(gpu):
    """How many NVLinks of ``gpu`` are active (None when nvidia-smi nvlink -s listed none of its links and did not
    say all of them are inactive)."""
    links = gpu.get("nvlink")
    if links and links.get("all_inactive"):
        return 0
    if not links or not (links.get("active") or links.get("inactive")):
        return None
    return len(links.get("active") or [])


def _unobserved_reason(gpu):
    links = gpu.get("nvlink") or {}
    if links.get("note"):
        return "nvidia-smi nvlink -s says %r" % links["note"]
    return "no link listed by nvidia-smi nvlink -s (PCIe only)"


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
    if len(gpus) < 2:
        return not_applicable("fewer than two NVIDIA GPUs on %s: no NVLink between them to check" % host, expected)
    listed = [gpu for gpu in gpus if gpu.get("nvlink") is not None]
    unobserved = [(label(gpu), _unobserved_reason(gpu)) for gpu in listed if active_links(gpu) is None]
    best = max([active_links(gpu) or 0 for gpu in gpus] or [0])
    if not best:
        quiet = [label(gpu) for gpu in listed if (gpu.get("nvlink") or {}).get("all_inactive")]
        if quiet and len(quiet) == len(listed):
            return not_applicable("every GPU of %s says all its NVLinks are inactive: a node without NVLink in use"
                                  % host, expected)
        return not_applicable("no active NVLink observed on %s: %s" % (host, "; ".join(
            "%s: %s" % pair for pair in unobserved) or "nvidia-smi nvlink -s listed no GPU"), expected)
    items = []
    for gpu in gpus:
        count = active_links(gpu)
        if gpu.get("nvlink") is None:
            items.append(("fail", "%s is missing from nvidia-smi nvlink -s while its peers have %d active links" % (
                label(gpu), best), "run nvidia-smi nvlink -s -i %s on %s" % (gpu.get("index"), host)))
        elif count is not None and count < best:
            down = (", ".join("link %d" % link for link in gpu["nvlink"].get("inactive") or [])
                    or "all, nvidia-smi nvlink -s says %r" % gpu["nvlink"].get("note"))
            items.append(("fail", "%s has %d active NVLinks, its peers %d (inactive: %s)" % (
                label(gpu), count, best, down),
                "drain %s: check the NVLink/NVSwitch tray and nvidia-fabricmanager's log, reset the GPUs (reboot); "
                "if the link stays down, open an RMA for the baseboard" % host))
    judged = len(gpus) - len(unobserved)
    return combine(host, items, expected, "%d GPUs with %d active NVLinks each" % (judged, best), judged, unobserved)
