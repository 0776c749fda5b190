# -*- coding: utf-8 -*-
"""Known-good profiles (controller layer): what a healthy node of one SKU looks like, as a YAML file.

A profile is recorded from a run the operator trusts (``python -m cluster_preflight baseline -i INV``, see
``cluster_preflight/cli/baseline.py``) and the inventory points each group at its file (``profile_file`` in
``group_vars``).  The gate then compares every node with it (``cluster_preflight/capabilities/profile/``).

Here: the file's shape (:func:`load`, :func:`dump`), the fields a node is compared on (:data:`FIELDS`) and how
they are gathered from one run's facts and all-reduce results (:func:`node_fields`), the same way for the gate
and for ``baseline``, so a profile recorded from a run compares equal with that run.
"""

from __future__ import annotations

import collections
import os

import yaml

VERSION = 1

Field = collections.namedtuple("Field", "name kind fix")

_HW = "a node of this group differs in hardware: check the node (drained for repair?) or record a profile for its SKU"
# The fields of a profile, in report order.  kind: ``exact`` (equal), ``floor`` (at least the profile's value
# less the tolerance).  Each field's check is ``profile.<name with dots as underscores>``.
FIELDS = (
    Field("gpu.vendor", "exact", _HW),
    Field("gpu.count", "exact", "a GPU is missing or hidden (nvidia-smi -L, lspci): reseat or RMA it, or check "
          "CUDA_VISIBLE_DEVICES and the driver"),
    Field("gpu.model", "exact", _HW),
    Field("gpu.driver_version", "exact", "install the driver version of the profile (or re-record the profile "
          "after a planned upgrade of every node)"),
    Field("gpu.cuda_version", "exact", "install the driver/CUDA of the profile (or re-record it after a planned "
          "upgrade)"),
    Field("gpu.pcie_gen_max", "exact", _HW),
    Field("gpu.pcie_width_min", "floor", "a GPU's PCIe link trained narrower than on healthy nodes: reseat the GPU "
          "or riser, check with nvidia-smi -q -d PCIE / lspci -vv (LnkSta)"),
    Field("gpu.nvlinks_active_min", "floor", "a GPU has fewer active NVLinks than on healthy nodes: nvidia-smi "
          "nvlink -s, check the NVLink/NVSwitch tray and nvidia-fabricmanager"),
    Field("rdma.devices", "exact", "an RDMA device is missing (ibstat, lspci): check the HCA and its driver"),
    Field("rdma.active_ports", "floor", "an RDMA port is down: ibstat, check the cable and the switch port"),
    Field("rdma.rate_gbps", "floor", "an RDMA port trained at a lower rate: mlxlink -d <dev>, reseat or replace "
          "the cable/transceiver"),
    Field("rdma.link_layer", "exact", _HW),
    Field("torch.version", "exact", "install the torch of the profile into the training Python"),
    Field("nccl.version", "exact", "install the torch/NCCL build of the profile"),
    Field("allreduce.backend", "exact", "torch sees no GPU on this node (driver, CUDA build of torch) or the "
          "backend was forced: see the allreduce checks"),
    Field("allreduce.transport", "exact", "NCCL fell back from the fabric: NCCL_IB_DISABLE / NCCL_NET in the "
          "job's environment, no rdma-core in the job's container, ports not ACTIVE (ibstat), NCCL_IB_HCA; the "
          "NCCL INFO lines of the rank logs say which"),
    Field("allreduce.largest_size", "exact", "run with the profile's sizes (allreduce_sizes / allreduce_sizes_nccl) "
          "or re-record the profile: busbw is compared at the largest size"),
    Field("allreduce.busbw_gbps", "floor", "the all-node all-reduce is slower than on the known-good run: see the "
          "localisation rounds and the fabric checks"),
    Field("allreduce.single_node_busbw_gbps", "floor", "this node's own all-reduce (over its GPUs) is slower than "
          "on the known-good run: NVLink/PCIe (nvidia-smi topo -m, nvidia-smi nvlink -s), a throttled GPU"),
)
BY_NAME = {field.name: field for field in FIELDS}


class ProfileError(ValueError):
    """A profile file that cannot be used (missing, not YAML, wrong shape)."""


def check_name(field):
    """``gpu.count`` -> ``gpu_count`` (the check ``profile.gpu_count``)."""
    return field.replace(".", "_")


def load(path):
    """The profile at ``path``: ``{fields: {name: value}, tolerance, group, recorded_from, ...}``; raises
    ProfileError saying what is wrong."""
    try:
        with open(path, "r", encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except OSError as exc:
        raise ProfileError("cannot read %s: %s" % (path, exc.strerror or exc)) from None
    except yaml.YAMLError as exc:
        raise ProfileError("%s is not YAML: %s" % (path, str(exc).splitlines()[0])) from None
    if not isinstance(data, dict) or not isinstance(data.get("fields"), dict):
        raise ProfileError("%s has no 'fields' mapping (a profile written by python -m cluster_preflight "
                           "baseline)" % path)
    if data.get("profile_version") != VERSION:
        raise ProfileError("%s is profile_version %r; this preflight reads version %d" % (
            path, data.get("profile_version"), VERSION))
    unknown = sorted(set(data["fields"]) - set(BY_NAME))
    if unknown:
        raise ProfileError("%s names unknown fields: %s (known: %s)" % (path, ", ".join(unknown),
                                                                         ", ".join(BY_NAME)))
    return data


def resolve(path, base):
    """``path`` as given (absolute) or relative to ``base`` (the inventory or project directory)."""
    return path if os.path.isabs(path) else os.path.normpath(os.path.join(base, path))


def dump(fields, group, recorded_from, nodes, recorded_at):
    """The YAML text of a profile; ``recorded_from``: the verdict file (or files) it was recorded from."""
    sources = [str(item) for item in recorded_from] if isinstance(recorded_from, (list, tuple)) else [
        str(recorded_from)]
    header = ("# Known-good profile of inventory group %s: what a healthy node of this group looks like.\n"
              "# Recorded by `python -m cluster_preflight baseline` from %s.\n"
              "# Point the group at it (group_vars: profile_file: <this file>); edit a field to accept a change,\n"
              "# delete one to stop comparing it.\n" % (group, ", ".join(sources)))
    body = {"profile_version": VERSION, "group": str(group), "recorded_from": sources,
            "recorded_at": str(recorded_at), "nodes": [str(node) for node in nodes],
            "fields": {name: fields[name] for name in BY_NAME if fields.get(name) is not None}}
    return header + yaml.safe_dump(body, sort_keys=False, default_flow_style=False)


# --- the fields of one node, from one run -------------------------------------------------------------------


def _largest(bandwidth):
    rows = [row for row in bandwidth or [] if isinstance(row, dict) and row.get("size_bytes")]
    return max(rows, key=lambda row: row["size_bytes"]) if rows else None


def _round(value):
    return None if value is None else round(float(value), 3)


def run_fields(summary, host):
    """The all-node fields of ``host`` (backend, largest size and its busbw): from the all-node run when it passed
    with the node, else from the confirmation run over the nodes left after localisation when that passed with
    it (a sick peer must not leave the proven nodes without a measurement); nothing otherwise."""
    return run_fields_by_host(summary, [host])[host]


def run_fields_by_host(summary, hosts):
    """``{host: run_fields(summary, host)}`` of every one of ``hosts``, each run's nodes and sizes read once."""
    runs = []
    for run in (summary or {}, (summary or {}).get("confirm") or {}):
        if run.get("status") == "pass":
            # One rank crosses no link: its busbw is a copy on one device, never a known-good value.
            largest = _largest(run.get("sizes")) if (summary or {}).get("world_size") != 1 else None
            runs.append((set(run.get("hosts") or []), {
                "allreduce.backend": summary.get("backend"),
                "allreduce.largest_size": largest["size_bytes"] if largest else None,
                "allreduce.busbw_gbps": _round(largest.get("busbw_gbps")) if largest else None}))
    return {host: dict(next((fields for members, fields in runs if host in members), {})) for host in hosts}


def node_fields(host, sources, allreduce_facts, rows, signatures, single):
    """Every field of ``host`` that this run measured (None: not measured).

    ``sources``: ``{capability: (profile_fields function, facts)}`` of the node readers that feed a profile
    (gpu_health, fabric); ``allreduce_facts``: the allreduce reader's facts; ``rows``: the node's rank rows of a
    passed all-node run; ``signatures``: its ``allreduce.signatures`` check (the NCCL transport); ``single``: its
    single-node run's summary or None."""
    fields = {}
    for function, facts in sources.values():
        if facts is not None:
            fields.update(function(facts))
    torch = (allreduce_facts or {}).get("torch") or {}
    fields["torch.version"] = torch.get("version")
    versions = next((row.get("versions") for row in rows or [] if row.get("versions")), None) or {}
    fields["nccl.version"] = versions.get("nccl")
    fields["allreduce.transport"] = ((signatures or {}).get("details") or {}).get("transport")
    if single and single.get("status") == "pass":
        fields["allreduce.single_node_busbw_gbps"] = _round(single.get("busbw_gbps"))
    return {name: fields.get(name) for name in BY_NAME if name in fields}
