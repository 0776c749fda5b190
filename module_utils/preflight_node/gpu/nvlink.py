# -*- coding: utf-8 -*-
"""NVLink state per link, from ``nvidia-smi nvlink -s`` (node layer; parsing only, the ``gpu_health`` reader
runs the command).

``nvidia-smi -q -x`` does not carry NVLink state; ``nvidia-smi nvlink -s`` prints, per GPU, one line per link,
its speed when active and ``<inactive>`` when it is down (it has no XML or JSON form)::

    GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-4d1c9a4e-7b0f-3e2a-9c51-0a6f2e8b1d37)
    	 Link 0: 26.562 GB/s
    	 Link 1: <inactive>

Where a GPU's links cannot be listed, current drivers print a sentence under its GPU line instead: a GPU in MIG
mode ("Nvlink queries are not supported for Devices in MIG mode"), a PCIe card without NVLink ("Device does not
have or support Nvlink").  Such a sentence is a fact about that GPU (its ``note``), not a parse error; older
drivers print the GPU line alone.  One sentence is an observation, not a gap: NVML's "Unable to retrieve NVLink
information as all links are inActive" says the GPU has NVLinks and none is up (``all_inactive``): on a node whose
other GPUs have theirs up, that GPU lost its NVLink; on every GPU alike, the node has no NVLink in use.
"""

from __future__ import annotations

import re

ARGV = ["nvlink", "-s"]
_GPU = re.compile(r"^GPU (\d+): (.*?) \(UUID: ([^)\s]+)\)\s*$")
_LINK = re.compile(r"^Link (\d+): (.+?)\s*$")
_SPEED = re.compile(r"^([0-9.]+) GB/s$")
_ALL_INACTIVE = re.compile(r"all links are inactive", re.IGNORECASE)
NOTE_LIMIT = 200
# What the reader keeps of each GPU's entry.
FIELDS = ("active", "inactive", "gbps", "note", "all_inactive")


def parse(text):
    """``[{index, uuid, name, active: [link], inactive: [link], gbps: {link: speed}, note, all_inactive}]`` in the
    order printed; ``note`` is what the driver said instead of links (None when it listed links or said nothing),
    ``all_inactive`` whether that sentence says every link of the GPU is down.  ValueError naming the line for text
    before the first GPU line."""
    gpus, current = [], None
    for number, raw in enumerate(str(text or "").splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        gpu = _GPU.match(line)
        if gpu:
            current = {"index": int(gpu.group(1)), "uuid": gpu.group(3), "name": gpu.group(2), "active": [],
                       "inactive": [], "gbps": {}, "note": None, "all_inactive": False}
            gpus.append(current)
            continue
        if current is None:
            raise ValueError("line %d comes before any 'GPU <i>: <name> (UUID: ...)' line: %r" % (number, line[:200]))
        link = _LINK.match(line)
        if not link:
            note = line if current["note"] is None else "%s %s" % (current["note"], line)
            current["note"] = note[:NOTE_LIMIT]
            current["all_inactive"] = current["all_inactive"] or bool(_ALL_INACTIVE.search(line))
            continue
        index, state = int(link.group(1)), link.group(2)
        speed = _SPEED.match(state)
        if speed:
            current["active"].append(index)
            current["gbps"][str(index)] = float(speed.group(1))
        else:
            # "<inactive>", and anything else a driver prints for a link that does not carry traffic.
            current["inactive"].append(index)
    return gpus


def match(gpus, listed):
    """Each GPU of ``gpus`` (the ``-q -x`` facts) -> its entry of ``listed`` (:func:`parse`), or None when it is not
    listed: by UUID where the UUIDs tell the GPUs apart, else by index (nvidia-smi numbers both in PCI order)."""
    uuids = [entry["uuid"] for entry in listed]
    by_uuid = len(set(uuids)) == len(uuids) and len(set(gpu.get("uuid") for gpu in gpus)) == len(gpus)
    found = {}
    for gpu in gpus:
        key = gpu.get("uuid") if by_uuid else gpu.get("index")
        found[gpu.get("index")] = next((entry for entry in listed
                                        if (entry["uuid"] if by_uuid else entry["index"]) == key), None)
    return found
