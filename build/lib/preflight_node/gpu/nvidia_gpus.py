# -*- coding: utf-8 -*-
"""The NVIDIA GPUs of a node as ``nvidia-smi --query-gpu`` lists them: index, PCI bus id, UUID and name.

Read on the node by the ``allreduce`` reader (for the GPU pair rounds the controller plans in
``cluster_preflight/capabilities/allreduce/gpu_pairs.py``); parsing only, no command is run here.
"""

from __future__ import annotations

import re

QUERY_FIELDS = ("index", "pci.bus_id", "uuid", "name")
QUERY_ARGV = ["nvidia-smi", "--query-gpu=%s" % ",".join(QUERY_FIELDS), "--format=csv,noheader"]
NO_DEVICES = "no devices were found"

_BUS_ID_RE = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")
_UUID_RE = re.compile(r"^GPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")


# --------------------------------------------------------------------------
# nvidia-smi


def normalize_bus_id(text):
    """``nvidia-smi``'s PCI bus id form, ``DDDDDDDD:BB:DD.F`` in upper-case hex (the domain padded to 8 digits).

    Accepts the 4-digit-domain form of sysfs and lspci (``0000:18:00.0``) and no
    domain (``18:00.0``); raises ValueError otherwise."""
    match = _BUS_ID_RE.match(str(text).strip())
    if not match:
        raise ValueError("%r is not a PCI bus id (expected domain:bus:device.function, e.g. 00000000:18:00.0)"
                         % (text,))
    domain, bus, device, function = match.groups()
    return "%08X:%02X:%02X.%s" % (int(domain or "0", 16), int(bus, 16), int(device, 16), function)


def sysfs_address(bus_id):
    """The sysfs / lspci form of a bus id: ``0000:18:00.0`` (4-digit domain, lower case)."""
    domain, rest = normalize_bus_id(bus_id).split(":", 1)
    return "%04x:%s" % (int(domain, 16), rest.lower())


def parse_query_gpu(text):
    """The GPUs of ``nvidia-smi --query-gpu=index,pci.bus_id,uuid,name --format=csv,noheader`` output.

    Returns ``[{index, bus_id, uuid, name}]`` sorted by index, ``bus_id``
    normalised (:func:`normalize_bus_id`).  Blank lines and spaces around
    fields are ignored; nvidia-smi's own "No devices were found" is no GPU.
    Raises ValueError naming the line for anything else that is not one GPU
    per line (a header line, an error message, a missing or extra field, a
    non-numeric index, a bad bus id or UUID, an index or bus id twice)."""
    lines = [(number, line.strip()) for number, line in enumerate(str(text or "").splitlines(), 1) if line.strip()]
    if len(lines) == 1 and lines[0][1].lower().rstrip(".") == NO_DEVICES:
        return []
    gpus, seen_index, seen_bus = [], {}, {}
    for number, line in lines:
        def bad(why, number=number, line=line):
            return ValueError("nvidia-smi --query-gpu output, line %d is malformed (%s): %r; expected %r per GPU, "
                              "from %s" % (number, why, line[:200], ", ".join(QUERY_FIELDS), " ".join(QUERY_ARGV)))
        fields = [field.strip() for field in line.split(",", len(QUERY_FIELDS) - 1)]
        if [field.lower() for field in fields] == list(QUERY_FIELDS):
            raise bad("a CSV header: run it with --format=csv,noheader")
        if len(fields) < len(QUERY_FIELDS):
            raise bad("%d field%s instead of %d%s" % (
                len(fields), "" if len(fields) == 1 else "s", len(QUERY_FIELDS),
                ": a message from nvidia-smi, not a GPU" if len(fields) == 1 else ""))
        index_text, bus_text, uuid, name = fields
        if not index_text.isdigit():
            raise bad("index %r is not a number" % index_text)
        try:
            bus_id = normalize_bus_id(bus_text)
        except ValueError as exc:
            raise bad(str(exc)) from None
        if not _UUID_RE.match(uuid):
            raise bad("uuid %r is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)" % uuid)
        if not name or name.startswith("["):
            raise bad("no GPU name (%r)" % name)
        index = int(index_text)
        if index in seen_index:
            raise bad("index %d already on line %d" % (index, seen_index[index]))
        if bus_id in seen_bus:
            raise bad("bus id %s already on line %d" % (bus_id, seen_bus[bus_id]))
        seen_index[index], seen_bus[bus_id] = number, number
        gpus.append({"index": index, "bus_id": bus_id, "uuid": uuid, "name": name})
    return sorted(gpus, key=lambda gpu: gpu["index"])
