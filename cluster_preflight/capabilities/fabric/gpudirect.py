# -*- coding: utf-8 -*-
"""Capability ``fabric``, the controller half's checks of a node with GPUs and RDMA NICs: ``peer_memory`` (the NIC
can register GPU memory: nvidia-peermem loaded, or DMA-BUF), ``pcie_acs`` (no ACS redirect on the PCIe bridges
between a GPU and a NIC) and ``net_plugin`` (EFA devices need NCCL's aws-ofi-nccl plugin where the job's dlopen
finds it).  Facts from ``module_utils/preflight_node/net/gpudirect.py`` and ``net/nccl_plugin.py``.

Without GPUDirect RDMA NCCL still runs, through host memory, at a fraction of the fabric's bandwidth (its log says
``GPU Direct RDMA Disabled``); with ACS redirecting, GPU-to-NIC traffic crosses the CPU's root complex, slowly, or
fails with IB completion errors; without the plugin on EFA, NCCL falls back to TCP sockets.  None of it shows in a
GPU's or a port's own health.
"""

from __future__ import annotations

from preflight_node.net import lspci
from preflight_node.checks import blocked, failed, not_applicable, passed, warned
from preflight_node.privilege import needs_root

from ..common import switched_on
from .roce import hca_filter, job_env

RDMA_KINDS = ("infiniband", "roce")
DMABUF_DRIVER = 515
DMABUF_KERNEL = (5, 12)


def _rdma(ports, kinds, settings=None):
    """The devices of ``ports`` (the fabric checks' ``[(label, name, device, port)]``: ``fabric_ignore_devices`` and
    ``fabric_check_ethernet`` applied) of the given kinds, and of those the job's ``NCCL_IB_HCA`` selects."""
    chosen = hca_filter(job_env(settings or {}).get("NCCL_IB_HCA"))
    return sorted(set(name for _label, name, device, port in ports
                      if device.get("kind") in kinds and chosen(name, port.get("port"))))


def _driver_major(version):
    try:
        return int(str(version).split(".")[0])
    except (TypeError, ValueError):
        return None


def _dmabuf(memory, env):
    """``(usable, why not)`` of DMA-BUF for GPUDirect RDMA on this node."""
    nvidia = memory.get("nvidia") or {}
    reasons = []
    if str(env.get("NCCL_DMABUF_ENABLE", "")).strip() == "0":
        reasons.append("the job's environment sets NCCL_DMABUF_ENABLE=0")
    if nvidia.get("open") is not True:
        reasons.append("the GPU driver is %s" % ("the proprietary kernel module (taint %s)" % nvidia.get("taint")
                                                 if nvidia.get("open") is False else "not a loaded module we can read"))
    major = _driver_major(nvidia.get("version"))
    if major is not None and major < DMABUF_DRIVER:
        reasons.append("driver %s is older than R%d" % (nvidia.get("version"), DMABUF_DRIVER))
    kernel = memory.get("kernel_version")
    if kernel is None or tuple(kernel) < DMABUF_KERNEL:
        reasons.append("kernel %s is older than %d.%d" % ((memory.get("kernel"),) + DMABUF_KERNEL))
    return not reasons, reasons


def peer_memory(host, facts, settings, ports):
    """GPU + InfiniBand/RoCE nodes: a peer-memory module loaded, or DMA-BUF usable."""
    section = facts.get("gpudirect") or {}
    gpus = section.get("gpus") or {}
    expected = ("on a node with NVIDIA GPUs and InfiniBand/RoCE NICs: nvidia_peermem (or nv_peer_mem) loaded, or "
                "DMA-BUF usable (open GPU kernel module R%d+, Linux %d.%d+)" % ((DMABUF_DRIVER,) + DMABUF_KERNEL))
    nics = _rdma(ports, RDMA_KINDS, settings)
    if not gpus.get("nvidia"):
        other = " (AMD GPUs: RCCL's GPUDirect is not judged here)" if gpus.get("amd") else ""
        return not_applicable("no NVIDIA GPU on the PCI bus of %s%s" % (host, other), expected)
    if not nics:
        return not_applicable("no InfiniBand or RoCE device on %s (EFA registers GPU memory through its own driver)"
                              % host, expected)
    memory = section.get("peer_memory") or {}
    if memory.get("loaded"):
        return passed("%s: %s loaded, for GPUDirect RDMA between %d NVIDIA GPUs and %s" % (
            host, ", ".join(memory["loaded"]), gpus["nvidia"], ", ".join(nics)), expected)
    usable, why_not = _dmabuf(memory, job_env(settings))
    nvidia = memory.get("nvidia") or {}
    if usable:
        return passed("%s: no peer-memory module loaded; DMA-BUF: open GPU kernel module %s, kernel %s (NCCL 2.13+ "
                      "registers GPU memory through it)" % (host, nvidia.get("version"), memory.get("kernel")),
                      expected)
    if not nvidia.get("loaded"):
        return blocked("%s: the NVIDIA kernel module is not loaded, so GPUDirect RDMA is not verified (see "
                       "gpu_health.count)" % host, expected, "load the NVIDIA driver on %s" % host)
    installed = memory.get("installed")
    path = next((value for value in (installed or {}).values() if value), None)
    where = ("it is installed (%s) but not loaded" % path if path else
             "modinfo finds no peer-memory module" if installed is not None else
             "modinfo is not installed, so whether it is installed is not known")
    found = "%s: no peer-memory module loaded (%s), and DMA-BUF is not usable: %s; NCCL stages GPU buffers through " \
            "host memory (GPU Direct RDMA Disabled in its log)" % (host, where, "; ".join(why_not))
    fix = ("on %s: modprobe nvidia-peermem (it ships with the driver, R470+), and have it load at boot (echo "
           "nvidia-peermem > /etc/modules-load.d/nvidia-peermem.conf); or move to the open GPU kernel modules (R%d+) "
           "on Linux %d.%d+ for DMA-BUF" % ((host, DMABUF_DRIVER) + DMABUF_KERNEL))
    judge = failed if switched_on(settings["fabric_peer_memory_required"]) else warned
    return judge(found, expected, fix)


def _pair_text(pairs, bridge):
    return ", ".join("GPU %s - NIC %s" % (pair["gpu"], pair["nic"]) for pair in pairs if bridge in pair["bridges"])


def pcie_acs(host, facts, settings, ports):
    """No ACS control that redirects peer-to-peer traffic on the bridges between a GPU and an RDMA NIC."""
    section = facts.get("gpudirect") or {}
    used = set(device.get("pci") for _label, name, device, _port in ports
               if name in _rdma(ports, RDMA_KINDS + ("efa",), settings))
    pairs = [pair for pair in section.get("pairs") or [] if pair["nic"] in used]
    expected = "no PCIe ACS redirect (ReqRedir, CmpltRedir, EgressCtrl) on the bridges between a GPU and an RDMA NIC"
    if not pairs:
        gpus = section.get("gpus") or {}
        why = ("no GPU on the PCI bus" if not (gpus.get("nvidia") or gpus.get("amd"))
               else "no GPU and RDMA NIC share a PCIe switch")
        return not_applicable("%s of %s: no peer-to-peer path through a PCIe switch to judge" % (why, host), expected)
    between = set(bridge for pair in pairs for bridge in pair["bridges"])
    bridges = {address: bridge for address, bridge in (section.get("bridges") or {}).items() if address in between}
    tool = section.get("lspci") or {}
    names = ", ".join(sorted(bridges))
    if not tool.get("present"):
        return blocked("lspci is not installed on %s: the ACS of the bridges between GPUs and NICs (%s) is not read"
                       % (host, names), expected, "install pciutils on %s (bringup.yml's debug tools)" % host)
    if tool.get("error"):
        return blocked("cannot read the ACS of %s on %s: %s" % (names, host, tool["error"]), expected,
                       "run lspci -D -vvv by hand on %s" % host)
    denied = [address for address, bridge in bridges.items() if bridge.get("denied") and bridge.get("acs") is None]
    if denied:
        return needs_root("lspci could not read the capabilities of %s on %s (<access denied>)" % (
            ", ".join(denied), host), expected)
    bad, direct, unlisted = [], [], [address for address, bridge in bridges.items() if not bridge.get("listed")]
    for address in sorted(bridges):
        bridge = bridges[address]
        on = lspci.redirecting(bridge.get("acs"))
        if on and (bridge.get("acs") or {}).get("DirectTrans"):
            direct.append(address)
        elif on:
            bad.append((address, bridge, on))
    if bad:
        found = "; ".join("%s (%s; ACSCtl %s; between %s)" % (
            address, bridge.get("name") or "%s:%s" % (bridge.get("vendor"), bridge.get("device")),
            " ".join(flag + "+" for flag in on), _pair_text(pairs, address)) for address, bridge, on in bad)
        fix = ("on %s: disable ACS on these bridges: in the BIOS (PCIe ACS off), or at each boot: %s (NCCL's "
               "troubleshooting guide), or set fabric_acs_disable_at_boot: true and run bringup.yml (the kernel's "
               "pci=disable_acs_redir); in a VM leave ACS on and enable ATS on the NICs instead" % (
                   host, "; ".join("setpci -s %s ECAP_ACS+0x6.w=0000" % address for address, _b, _on in bad)))
        return failed("ACS redirects peer-to-peer traffic between GPUs and NICs on %s: %s" % (host, found),
                      expected, fix, bridges=[address for address, _b, _on in bad])
    text = "%s: %d bridge%s between GPUs and NICs, none redirecting peer-to-peer traffic (%s)" % (
        host, len(bridges), "" if len(bridges) == 1 else "s", names)
    if direct:
        text += "; %s redirect only untranslated requests (ACS Direct Translated P2P on, as in a VM with ATS)" % (
            ", ".join(direct))
    if unlisted:
        text += "; not listed by lspci: %s" % ", ".join(sorted(unlisted))
    return passed(text, expected)


def net_plugin(host, facts, settings, ports):
    """EFA devices: NCCL's network plugin (aws-ofi-nccl) where the job's dlopen finds it."""
    section = facts.get("net_plugin")
    efa = _rdma(ports, ("efa",))
    expected = "on a node with EFA devices: the NCCL network plugin (aws-ofi-nccl) on the job's library path"
    if section is None or not efa:
        return not_applicable("no EFA device on %s: NCCL needs no network plugin for its fabric" % host, expected)
    if (section.get("nccl_net") or "").lower() == "socket":
        return not_applicable("the job's environment sets NCCL_NET=Socket on %s: NCCL does not use EFA" % host,
                              expected)
    if section.get("found"):
        return passed("%s: %d EFA device%s, NCCL's network plugin at %s" % (
            host, len(efa), "" if len(efa) == 1 else "s", ", ".join(section["found"])), expected)
    hint = ("; found outside the search path: %s" % ", ".join(section["elsewhere"])) if section.get("elsewhere") else ""
    found = "%s: %d EFA device%s (%s) but no %s where NCCL looks (NCCL_NET_PLUGIN %s; searched %s)%s: NCCL falls " \
            "back to TCP sockets" % (host, len(efa), "" if len(efa) == 1 else "s", ", ".join(efa),
                                     " or ".join(section.get("wanted") or []), section.get("plugin") or "unset",
                                     ", ".join(section.get("searched") or []), hint)
    fix = ("on %s: install aws-ofi-nccl and put its library directory on the job's library path (LD_LIBRARY_PATH in "
           "preflight_job_env and the job's environment, or a file in /etc/ld.so.conf.d and ldconfig), or set "
           "NCCL_NET_PLUGIN to the plugin's path" % host)
    if section.get("elsewhere"):
        fix += "; it is already at %s" % section["elsewhere"][0]
    return failed(found, expected, fix)
