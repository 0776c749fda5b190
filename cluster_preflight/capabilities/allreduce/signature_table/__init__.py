# -*- coding: utf-8 -*-
"""The table of failure signatures, by category (the matcher is ``cluster_preflight/signatures.py``).

A row (:class:`Signature`): ``id``, the regular expressions searched in each line (their named groups are the
line's facts), the ``cause`` and the ``fix`` (a text, or a function of the facts that writes one), the ``status`` it gives a
node, the ``category``, the ``level`` (``cause`` / ``symptom`` / ``info``), ``needs_fabric`` (the status holds only on a
node with a fabric, or with that fabric kind), ``checks`` (the checks that catch the cause before the job; ``None``:
the category's), ``when`` (a predicate on the facts: the row takes the line only when it holds) and ``on_failure``
(the row is a finding only when another row of the log warns or fails: the interface NCCL used explains a failure,
it is not one).

The modules keep the rows of one part of the node each: ``job_env`` (interfaces, names, ports, /dev/shm, locked
memory), ``fabric`` (RDMA transport, GIDs, GPUDirect, the network plugin), ``gpu`` (NVSwitch fabric, devices,
versions), ``generic`` (the generic readings: sockets, the rendezvous, the collectives, NCCL and CUDA errors).  ``ROWS`` is their order:
the causes that explain other lines come first.
"""

from __future__ import annotations

import collections
import re

Signature = collections.namedtuple(
    "Signature", "id regex cause fix status category level needs_fabric checks when on_failure")


def sig(sig_id, patterns, cause, fix, status, category, level="symptom", needs_fabric=False, checks=None, when=None,
        on_failure=False):
    """One row (see the module's docstring).  ``patterns``: one regular expression or a tuple of them (the shapes
    the same fact takes in torch, NCCL, gloo and the system's own messages); the first that matches a line and
    satisfies ``when`` takes it.  ``on_failure``: a bool, or a function of the line's facts."""
    if level not in ("cause", "symptom", "info"):
        raise ValueError("%s: level %r" % (sig_id, level))
    patterns = (patterns,) if isinstance(patterns, str) else tuple(patterns)
    return Signature(sig_id, tuple(re.compile(pattern) for pattern in patterns), cause, fix, status, category,
                     level, needs_fabric, tuple(checks) if checks is not None else None, when, on_failure)


# What a healthy node shows, and the checks that look at it before the job (verdict names), per category.
CATEGORIES = {
    "interface": {
        "expected": "the interfaces the job's sockets use (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, or NCCL's own "
                    "choice) exist and are up with an address on the peers' subnet, of one address family on every "
                    "node",
        "checks": ("job_env.socket_ifname", "job_env.address_family", "nic_discovery.common_interface")},
    "name_resolution": {
        "expected": "every node's hostname and the master's name resolve, on every node, to a routable address of "
                    "the node (never a loopback address), of the family the job uses",
        "checks": ("job_env.hostname", "job_env.master_name", "job_env.address_family")},
    "port": {
        "expected": "the master port is free on the master when the job starts",
        "checks": ("allreduce.master_port", "port_mesh.listen")},
    "shm": {
        "expected": "/dev/shm is mounted in the job's context with room for NCCL's segments for the node's GPUs, "
                    "writable by the job user",
        "checks": ("job_env.dev_shm",)},
    "memlock": {
        "expected": "the job user's locked-memory limit is unlimited (or above the floor) in the job's own session "
                    "on nodes with an RDMA fabric",
        "checks": ("job_env.memlock",)},
    "roce_gid": {
        "expected": "RDMA queue pairs reach the peer: on RoCE a routable IPv4-mapped RoCE v2 GID, and "
                    "NCCL_IB_GID_INDEX (when set) naming it on every node",
        "checks": ("fabric.roce_gid", "fabric.ports")},
    "gpudirect": {
        "expected": "GPUDirect RDMA works between the GPUs and the NICs: PCIe ACS off on the bridges between them, "
                    "the peer-memory module (or dma-buf) present",
        "checks": ("fabric.pcie_acs", "fabric.peer_memory")},
    "net_plugin": {
        "expected": "the job's environment has what the node's fabric needs: libibverbs for InfiniBand/RoCE, the "
                    "aws-ofi-nccl plugin with a usable libfabric EFA provider on EFA",
        "checks": ("fabric.net_plugin",)},
    "nvswitch": {
        "expected": "on NVSwitch systems the fabric manager runs and every GPU's fabric state is Completed / Success",
        "checks": ("gpu_health.fabric_manager", "gpu_health.gpu_fabric")},
    "duplicate_gpu": {
        "expected": "every rank of a node on its own GPU",
        "checks": ("job_env.visible_devices",)},
    "gpu_reset": {
        "expected": "every GPU of the node usable: none in a reset-required or lost state",
        "checks": ("gpu_health.reset_required", "gpu_health.gpu_lost", "gpu_health.xid")},
    "versions": {
        "expected": "a driver new enough for the job's CUDA runtime, and the same torch / CUDA / NCCL on every node",
        "checks": ("allreduce.versions",)},
    "transport": {
        "expected": "NCCL on the node's RDMA fabric where it has one",
        "checks": ("fabric.ports", "nic_discovery.fabric_consistency")},
    "fabric": {
        "expected": "RDMA transfers complete between the nodes' ports",
        "checks": ("fabric.ports", "fabric.counters")},
    "network": {
        "expected": "every node reaches every peer on the job's ports over the chosen interface",
        "checks": ("port_mesh.reach", "nic_discovery.common_interface")},
    "rendezvous": {
        "expected": "every node's torchrun reaches the rendezvous store on the master in time",
        "checks": ("port_mesh.reach", "allreduce.rendezvous")},
    "collective": {
        "expected": "every rank reaches every collective in time",
        "checks": ()},
    "nccl": {
        "expected": "NCCL initialises and runs without a system, internal or usage error",
        "checks": ()},
    "cuda": {
        "expected": "CUDA runs without errors on the node's GPUs",
        "checks": ("gpu_health.xid",)},
}

# pylint: disable=wrong-import-position
from cluster_preflight.capabilities.allreduce.signature_table import fabric, generic, gpu, job_env  # noqa: E402

ROWS = job_env.ROWS + fabric.ROWS + gpu.ROWS + generic.ROWS

_unknown = sorted({row.category for row in ROWS} - set(CATEGORIES))
if _unknown:
    raise ValueError("rows of categories without an entry in CATEGORIES: %s" % ", ".join(_unknown))
