# -*- coding: utf-8 -*-
"""Capability ``gpu_health``, the controller half's checks of what keeps a GPU from taking work although its own
telemetry looks healthy: ``fabric_manager`` and ``gpu_fabric`` (NVSwitch systems), ``reset_required`` (a GPU the
driver says needs a reset, or that nvidia-smi cannot reach) and ``gpu_lost`` (the kernel's messages of a GPU that
fell off the bus or failed to come up, with or without an Xid line).  Facts from
``module_utils/preflight_node/capabilities/gpu_health.py`` (and ``gpu/nvswitch.py``, ``host/services.py``,
``gpu/xid_log.py``).

What real machines show shaped these rules: GPUs behind no NVSwitch fabric (PCIe cards, consumer cards, NVLink
bridges, Ampere boards that predate the field) report the fabric state as N/A, which is not judged; an HGX GPU
reports State Completed / Status Success with CliqueId 0 and a zero ClusterUUID when it is in no multi-node NVLink
domain, so those two are required non-zero only on multi-node NVLink (``gpu_health_multinode_nvlink``, or a node
whose GPUs already report a cluster); the reset status is N/A on consumer cards.
"""

from __future__ import annotations

from preflight_node.checks import blocked, failed, not_applicable, passed, warned

from ..common import switched_on
from .checks import RESET_FIX, UNOBSERVED, combine, kernel_log_unread, label, per_gpu

ZERO_UUID = "00000000-0000-0000-0000-000000000000"
FM_LOG = "journalctl -u nvidia-fabricmanager and /var/log/fabricmanager.log"
RECOVERY_FIX = {
    "gpu reset": RESET_FIX,
    "reset": RESET_FIX,
    "node reboot": "drain the node and reboot it: the fault may have left the OS inconsistent",
    "reboot": "drain the node and reboot it: the fault may have left the OS inconsistent",
    "system reboot": "drain the node and reboot it (a cold reboot, with the power off)",
    "drain p2p": "drain the node: stop every job using peer-to-peer on its GPUs, then reset them (nvidia-smi -r)",
    "drain and reset": "drain the node, stop its GPU jobs, then reset the GPU (nvidia-smi -r -i %s) or reboot",
    "bus reset": "drain the node and reset the GPU's PCIe bus (a reboot does it)",
}


# --- NVSwitch systems ------------------------------------------------------------------------------------


def _driver(facts):
    return (facts.get("nvidia") or {}).get("driver_version") or "the driver's"


def _service_text(service):
    state = service.get("unit_state")
    if state is not None:
        return "%s.service: %s/%s, %s (LoadState %s)" % (
            service["unit"], state.get("ActiveState"), state.get("SubState"),
            "enabled at boot" if service.get("enabled") else "not enabled at boot (UnitFileState %s)" % (
                state.get("UnitFileState") or "none"), state.get("LoadState"))
    pids = service.get("pids") or []
    how = "no systemd on the node" if not service.get("systemd") else "systemctl could not say (%s)" % (
        service.get("unit_error"))
    return "%s: %s (%s)" % (service["program"], "running, pid %s" % ", ".join(str(pid) for pid in pids)
                            if pids else "no process runs", how)


def fabric_manager(host, facts, settings):
    """An NVSwitch system runs the fabric manager (active, and enabled at boot where systemd manages it)."""
    section = facts.get("nvswitch") or {}
    unit = settings.get("gpu_health_fabric_manager_unit") or "nvidia-fabricmanager"
    expected = "on a node with NVSwitches: %s active (and enabled at boot)" % unit
    if section.get("error"):
        return blocked("cannot tell whether %s has NVSwitches: %s" % (host, section["error"]), expected,
                       "check that sysfs is mounted at gpu_health_sysfs_root (%s) and readable"
                       % settings.get("gpu_health_sysfs_root"))
    switches = section.get("devices") or []
    if not switches:
        return not_applicable("no NVSwitch on the PCI bus of %s: no fabric for a fabric manager to manage" % host,
                              expected)
    service = section.get("service") or {}
    where = "%d NVSwitch%s on the PCI bus of %s (%s)" % (len(switches), "" if len(switches) == 1 else "es", host,
                                                          ", ".join(switch["address"] for switch in switches))
    start = ("on %s: systemctl enable --now %s (or run bringup.yml); its version must be the driver's (%s); if it "
             "does not start, read %s" % (host, unit, _driver(facts), FM_LOG))
    if service.get("active"):
        found = "%s; %s" % (where, _service_text(service))
        if service.get("enabled") is False:
            return warned(found + ": it will not start after a reboot", expected,
                          "on %s: systemctl enable %s (or run bringup.yml)" % (host, unit))
        return passed(found, expected)
    if service.get("installed") is False:
        return failed("%s but %s is not installed: CUDA jobs there fail with error 802 (system not yet initialized)"
                      % (where, unit), expected,
                      "on %s: install the fabric manager of the driver's branch (the nvidia-fabricmanager package of "
                      "driver %s), then systemctl enable --now %s" % (host, _driver(facts), unit))
    return failed("%s but the fabric manager is not running: %s; CUDA jobs there fail with error 802 (system not "
                  "yet initialized)" % (where, _service_text(service)), expected, start)


def _zero(value):
    text = (value or "").strip().lower()
    return text in ("", "0", ZERO_UUID)


def _multinode(facts, settings):
    """Whether the node's GPUs must be in a multi-node NVLink domain: the setting, or a GPU already in one."""
    gpus = (facts.get("nvidia") or {}).get("gpus") or []
    return (switched_on(settings["gpu_health_multinode_nvlink"])
            or any(not _zero(gpu.get("fabric_cluster_uuid")) for gpu in gpus))


def _domains(gpus):
    """A warn item when the GPUs of one node report more than one NVLink domain (cluster UUID + clique)."""
    domains = {}
    for gpu in gpus:
        if not _zero(gpu.get("fabric_cluster_uuid")):
            domains.setdefault("%s clique %s" % (gpu["fabric_cluster_uuid"], gpu.get("fabric_clique_id")),
                               []).append(label(gpu))
    if len(domains) < 2:
        return []
    return [("fail", "the GPUs are in %d NVLink domains: %s" % (len(domains), "; ".join(
        "%s: %s" % (domain, ", ".join(names)) for domain, names in sorted(domains.items()))),
        "check the NVLink partition of the node's GPUs with the NVLink switches' fabric manager (NMX) and the IMEX "
        "service; reboot the node if its GPUs joined different domains")]


def gpu_fabric(host, facts, settings):
    """Every GPU behind an NVSwitch fabric: fabric state Completed, status Success; on multi-node NVLink a
    non-zero clique id and cluster UUID."""
    multinode = _multinode(facts, settings)
    gpus = (facts.get("nvidia") or {}).get("gpus") or []
    fm_fix = ("on %s: check the fabric manager (gpu_health.fabric_manager; %s), restart it, and reset the GPUs or "
              "reboot the node if the state does not reach Completed" % (host, FM_LOG))
    domain_fix = ("on %s: the GPU joined no multi-node NVLink domain: check the IMEX service (nvidia-imex) and the "
                  "NVLink switch trays' fabric manager, then reboot the node" % host)

    def judge(_vendor, gpu):
        state, status = gpu.get("fabric_state"), gpu.get("fabric_status")
        if state is None and status is None:
            return [(UNOBSERVED, "fabric state not reported (N/A: no NVSwitch fabric behind this GPU)", None)]
        items = []
        if state != "Completed":
            items.append(("fail", "%s fabric/state is %s%s" % (label(gpu), state, {
                "Not Started": " (no fabric manager has trained its NVLinks)",
                "In Progress": " (the fabric manager has not finished)"}.get(state, "")), fm_fix))
        if status is not None and status != "Success":
            items.append(("fail", "%s fabric/status is %s" % (label(gpu), status), fm_fix))
        if multinode and (_zero(gpu.get("fabric_cluster_uuid")) or _zero(gpu.get("fabric_clique_id"))):
            items.append(("fail", "%s fabric/clusterUuid %s, cliqueId %s: in no multi-node NVLink domain" % (
                label(gpu), gpu.get("fabric_cluster_uuid"), gpu.get("fabric_clique_id")), domain_fix))
        return items
    expected = "every GPU's fabric/state Completed and fabric/status Success%s" % (
        ", in a multi-node NVLink domain (non-zero cliqueId and clusterUuid)" if multinode else "")
    return per_gpu(host, facts, ("nvidia",), judge, expected,
                   "fabric state Completed, status Success on %%d GPUs%s" % (
                       " in one multi-node NVLink domain" if multinode else ""),
                   "the NVSwitch fabric state", _domains(gpus) if multinode else [])


# --- a GPU that needs a reset, or that the driver lost -----------------------------------------------------


def _unavailable_items(facts):
    items = []
    for entry in (facts.get("nvidia") or {}).get("unavailable") or []:
        reason = entry.get("reason") or ""
        fix = ("drain the node and reboot it: the driver lost the GPU (look for Xid 79 in gpu_health.xid); if it "
               "stays lost, reseat the GPU and check its power and riser" if "lost" in reason.lower()
               else "drain the node and reset the GPU (nvidia-smi -r -i %s) or reboot it" % entry.get("bus_id"))
        items.append(("fail", "nvidia-smi cannot reach the GPU at %s: %s" % (entry.get("bus_id"), reason), fix))
    return items


def reset_required(host, facts, settings):
    """No GPU the driver says needs a reset (reset_required, drain_and_reset_recommended, gpu_recovery_action), and
    none nvidia-smi cannot reach."""
    def judge(_vendor, gpu):
        fields = (gpu.get("reset_required"), gpu.get("drain_and_reset"), gpu.get("recovery_action"))
        if all(value is None for value in fields):
            return [(UNOBSERVED, "reset status not reported (N/A)", None)]
        items = []
        if gpu.get("reset_required"):
            items.append(("fail", "%s gpu_reset_status/reset_required is Yes" % label(gpu),
                          RESET_FIX % gpu.get("index")))
        if gpu.get("drain_and_reset"):
            items.append(("fail", "%s gpu_reset_status/drain_and_reset_recommended is Yes" % label(gpu),
                          RECOVERY_FIX["drain and reset"] % gpu.get("index")))
        action = gpu.get("recovery_action")
        if action is not None and action.lower() != "none":
            fix = RECOVERY_FIX.get(action.lower(), "follow the driver's recovery action %r for GPU %s" % (
                action, gpu.get("index")))
            items.append(("fail", "%s gpu_recovery_action is %s" % (label(gpu), action),
                          fix % gpu.get("index") if "%s" in fix else fix))
        return items
    return per_gpu(host, facts, ("nvidia",), judge,
                   "no GPU needing a reset or recovery action, and every GPU reachable by nvidia-smi",
                   "no reset or recovery needed on %d GPUs", "the GPUs' reset status", _unavailable_items(facts))


LOST_TEXT = {"fallen_off_bus": "fell off the bus", "init_failed": "failed to initialise",
             "probe_failed": "failed its driver's probe", "reset_failed": "failed its reset"}
LOST_FIX = {
    "fallen_off_bus": "drain %s and reboot it; if the GPU falls off again, reseat it and check its power cables "
                      "and riser, then open an RMA",
    "init_failed": "drain %s: the driver could not bring the GPU up (read the kernel log around the line: GSP "
                   "firmware, VBIOS, a driver that does not support the GPU); reboot, and reseat or RMA the GPU if "
                   "it fails again",
    "probe_failed": "drain %s: the driver's probe failed (check the BIOS: Above 4G decoding and Resizable BAR on, "
                    "the driver's install with modprobe), then reboot",
    "reset_failed": "drain %s and reboot it: the GPU could not be reset in place",
}


def gpu_lost(host, facts, settings):
    """No kernel message saying a GPU fell off the bus, failed to initialise or failed its probe since boot."""
    section = facts.get("xid") or {}
    expected = "no kernel message of a GPU lost from the bus, failing to initialise or failing its probe since boot"
    unread = kernel_log_unread(host, section, expected)
    if unread:
        return unread
    names = {gpu.get("bus_id"): label(gpu) for gpu in (facts.get("nvidia") or {}).get("gpus") or []}
    xid_buses = {}
    for event in section.get("events") or []:
        xid_buses.setdefault(event.get("bus_id"), []).append("%s %s" % (
            "SXid" if event.get("kind") == "sxid" else "Xid", event.get("code")))
    items = []
    for event in section.get("lost") or []:
        bus = event.get("bus_id")
        also = ("; the kernel log also has %s for it (gpu_health.xid)" % ", ".join(xid_buses[bus])
                if bus in xid_buses else "; no Xid line names it")
        items.append(("fail", "%s %s, %d line%s: %s%s" % (
            names.get(bus, "the GPU at PCI %s" % bus), LOST_TEXT.get(event.get("kind"), event.get("kind")),
            event.get("count", 1), "" if event.get("count", 1) == 1 else "s", event.get("text", ""), also),
            LOST_FIX.get(event.get("kind"), "drain %s and reboot it") % host))
    return combine(host, items, expected, "no message of a lost GPU in the kernel log since boot (%s)"
                   % section.get("source"), 1)
