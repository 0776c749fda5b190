# -*- coding: utf-8 -*-
"""Node layer: the PCIe Access Control Services (ACS) of each device, parsed from ``lspci -D -vvv`` (parsing only;
the ``fabric`` reader runs it).

``lspci -vvv`` prints each device from a line that starts at column 0 with its address, then its capabilities,
indented; a device with ACS has::

    0000:17:01.0 PCI bridge: PLX Technology, Inc. PEX 88096 PCIe Gen 4 Switch (rev b0) (prog-if 00 [Normal decode])
    	...
    	Capabilities: [148 v1] Access Control Services
    		ACSCap:	SrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl+ DirectTrans+
    		ACSCtl:	SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-

``ACSCtl`` is what is enabled.  Of its bits, P2P Request Redirect, P2P Completion Redirect and P2P Egress Control
send peer-to-peer traffic up to the root complex instead of across the switch: a GPU and a NIC under one switch
then talk through the CPU, and GPUDirect RDMA slows down or fails (NCCL's troubleshooting guide).  Without root,
lspci cannot read the extended capabilities and prints ``Capabilities: <access denied>``: that device's ACS is not
observed.
"""

from __future__ import annotations

import re

_DEVICE = re.compile(r"^([0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]\s")
_FLAG = re.compile(r"([A-Za-z]+)([+-])")
# The ACS controls that redirect or block peer-to-peer traffic (what the kernel's pci=disable_acs_redir clears).
REDIRECTING = ("ReqRedir", "CmpltRedir", "EgressCtrl")


def _address(text):
    """sysfs's form of a PCI address (``0000:17:01.0``), which ``lspci -D`` prints."""
    return text.strip().lower()


def parse(text):
    """``{address: {name, acs: {flag: bool} or None, denied}}`` of every device in ``lspci -D -vvv`` output; the
    address in sysfs's form (``0000:17:01.0``).  ``acs`` None: the device shows no ACS capability (or its
    capabilities were denied: ``denied`` True)."""
    devices, current = {}, None
    for raw in str(text or "").splitlines():
        if _DEVICE.match(raw):
            address, _sep, name = raw.partition(" ")
            current = devices.setdefault(_address(address), {"name": name.strip()[:200], "acs": None,
                                                             "denied": False})
            continue
        if current is None:
            continue
        line = raw.strip()
        if line.startswith("Capabilities:") and "<access denied>" in line:
            current["denied"] = True
        elif line.startswith("ACSCtl:"):
            current["acs"] = {flag: sign == "+" for flag, sign in _FLAG.findall(line[len("ACSCtl:"):])}
    return devices


def redirecting(acs):
    """The controls of an ``ACSCtl`` (:func:`parse`'s ``acs``) that divert peer-to-peer traffic, enabled."""
    return [flag for flag in REDIRECTING if (acs or {}).get(flag)]
