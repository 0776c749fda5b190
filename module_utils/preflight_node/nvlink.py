# -*- coding: utf-8 -*-
"""NVLink state per link, from ``nvidia-smi nvlink -s`` (node layer; parsing only, the ``gpu_health`` reader
runs the command).

``nvidia-smi -q -x`` does not carry NVLink state; ``nvidia-smi nvlink -s`` prints, per GPU, one line per link,
its speed when active and ``<inactive>`` when it is down (it has no XML or JSON form)::

    GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-4d1c9a4e-7b0f-3e2a-9c51-0a6f2e8b1d37)
    	 Link 0: 26.562 GB/s
    	 Link 1: <inactive>

A GPU without NVLink (PCIe only) prints its GPU line and no link line.
"""

from __future__ import annotations

import re

ARGV = ["nvlink", "-s"]
_GPU = re.compile(r"^GPU (\d+): (.*?) \(UUID: (GPU-[0-9A-Fa-f-]+)\)\s*$")
_LINK = re.compile(r"^Link (\d+): (.+?)\s*$")
_SPEED = re.compile(r"^([0-9.]+) GB/s$")


def parse(text):
    """``{uuid: {index, active: [link], inactive: [link], gbps: {link: speed}}}``; ValueError naming the line
    for a line that is neither a GPU nor a link of one."""
    gpus, current = {}, None
    for number, raw in enumerate(str(text or "").splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        gpu = _GPU.match(line)
        if gpu:
            current = gpus.setdefault(gpu.group(3), {"index": int(gpu.group(1)), "active": [], "inactive": [],
                                                     "gbps": {}})
            continue
        link = _LINK.match(line)
        if not link or current is None:
            raise ValueError("line %d is neither 'GPU <i>: <name> (UUID: ...)' nor 'Link <n>: ...' of one: %r"
                             % (number, line[:200]))
        index, state = int(link.group(1)), link.group(2)
        speed = _SPEED.match(state)
        if speed:
            current["active"].append(index)
            current["gbps"][str(index)] = float(speed.group(1))
        else:
            # "<inactive>", and anything else a driver prints for a link that does not carry traffic.
            current["inactive"].append(index)
    return gpus
