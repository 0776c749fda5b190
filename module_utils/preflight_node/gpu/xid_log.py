# -*- coding: utf-8 -*-
"""Node layer: the NVIDIA Xid and NVSwitch SXid events of a kernel log, parsed from its text.

Parsing only (``gpu_health.read`` runs journalctl or dmesg).  The driver writes one line per event::

    NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
    nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error

Only those lines are kept (an SXid's continuation lines, its ``Severity`` and ``Data`` words, are not new
events); identical code + device pairs are counted once with their first text.

A GPU can also leave the bus or fail to come up with no Xid line at all (an older driver, a GPU that failed at
boot before the driver could number it, an AMD GPU): :func:`lost` reads those kernel messages::

    NVRM: GPU 0000:3a:00.0: GPU has fallen off the bus.
    NVRM: GPU 0000:3a:00.0: RmInitAdapter failed! (0x25:0xffff:1601)
    nvidia: probe of 0000:3a:00.0 failed with error -1
    amdgpu 0000:c1:00.0: amdgpu: Fatal error during GPU init
    amdgpu 0000:c1:00.0: probe with driver amdgpu failed with error -110
"""

from __future__ import annotations

import re

from .nvidia_gpus import normalize_bus_id

TEXT_LIMIT = 300
_EVENT_RE = re.compile(r"\b(?P<kind>S?Xid) \(PCI:(?P<bus>[0-9a-fA-F:.]+)\): (?P<code>\d+)\b(?P<rest>.*)$")
_PID_RE = re.compile(r"\bpid=(?:'?)(\d+)")
# The lines an NVSwitch event continues with (same SXid, then its severity or data words): not new events.
_SXID_CONTINUATION_RE = re.compile(r"^,\s*(Severity \d|Data \{)")


def _bus_id(text):
    try:
        return normalize_bus_id(text if text.count(".") else text + ".0")
    except ValueError:
        return text


def parse_line(line):
    """``{kind, code, bus_id, pid, text}`` of one Xid or SXid line, else None."""
    match = _EVENT_RE.search(line)
    if not match:
        return None
    kind = match.group("kind").lower()
    if kind == "sxid" and _SXID_CONTINUATION_RE.match(match.group("rest")):
        return None
    pid = _PID_RE.search(match.group("rest")) if kind == "xid" else None
    text = line[line.find("NVRM:") if "NVRM:" in line else match.start():].strip()
    if kind == "sxid":
        start = line.rfind("nvidia-nvswitch", 0, match.start())
        text = line[start if start >= 0 else match.start():].strip()
    return {"kind": kind, "code": int(match.group("code")), "bus_id": _bus_id(match.group("bus")),
            "pid": int(pid.group(1)) if pid else None, "text": text[:TEXT_LIMIT]}


# (kind, pattern): the bus id is group ``bus``; the first pattern that matches a line names it.
_BUS = r"(?P<bus>(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)"
LOST_PATTERNS = (
    ("fallen_off_bus", re.compile(r"NVRM: (?:The NVIDIA )?GPU (?:at PCI:)?" + _BUS + r"\b.*fallen off the bus")),
    ("init_failed", re.compile(r"NVRM: GPU (?:at PCI:)?" + _BUS + r":? (?:RmInitAdapter|rm_init_adapter) failed")),
    ("init_failed", re.compile(r"\bamdgpu " + _BUS + r": (?:amdgpu: )?(?:Fatal error during GPU init|"
                               r"amdgpu_device_ip_init failed)")),
    ("probe_failed", re.compile(r"\b(?P<driver>nvidia|amdgpu): probe of " + _BUS + r" failed with error (?P<errno>-?\d+)")),
    ("probe_failed", re.compile(r"\b(?:nvidia|amdgpu) " + _BUS + r": probe with driver (?P<driver>nvidia|amdgpu) "
                                r"failed with error (?P<errno>-?\d+)")),
    ("reset_failed", re.compile(r"\bamdgpu " + _BUS + r": (?:amdgpu: )?GPU reset(?:\(\d+\))? failed")),
)


def parse_lost(line):
    """``{kind, bus_id, text}`` of a kernel message that says a GPU left the bus, failed to initialise or failed its
    probe, else None (an Xid line is an Xid event, read by :func:`parse_line`)."""
    if "Xid" in line and _EVENT_RE.search(line):
        return None
    for kind, pattern in LOST_PATTERNS:
        match = pattern.search(line)
        if match:
            start = line.find("NVRM:") if "NVRM:" in line else match.start()
            return {"kind": kind, "bus_id": _bus_id(match.group("bus")), "text": line[start:].strip()[:TEXT_LIMIT]}
    return None


def lost(text):
    """Every lost-GPU message of a kernel log (:func:`parse_lost`), one per kind and device, each with ``count``."""
    found = {}
    for line in str(text or "").splitlines():
        event = parse_lost(line)
        if event is None:
            continue
        key = (event["kind"], event["bus_id"])
        if key in found:
            found[key]["count"] += 1
        else:
            found[key] = dict(event, count=1)
    return list(found.values())


def events(text):
    """Every Xid/SXid event of a kernel log, in order of first appearance, each with ``count``."""
    found = {}
    for line in str(text or "").splitlines():
        event = parse_line(line)
        if event is None:
            continue
        key = (event["kind"], event["code"], event["bus_id"])
        if key in found:
            found[key]["count"] += 1
        else:
            found[key] = dict(event, count=1)
    return list(found.values())
