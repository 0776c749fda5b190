# -*- coding: utf-8 -*-
"""Node layer: the GID table of a RoCE port (read by the ``fabric`` reader; the decision is in
``cluster_preflight/capabilities/fabric/roce.py``).

A RoCE port's queue pairs address their peers by GID; the kernel fills the table from the addresses of the port's
network device, one entry per address and RoCE version::

    $ cat /sys/class/infiniband/mlx5_0/ports/1/gids/3
    0000:0000:0000:0000:0000:ffff:c612:0105
    $ cat /sys/class/infiniband/mlx5_0/ports/1/gid_attrs/types/3
    RoCE v2
    $ cat /sys/class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/3
    ens1f0np0

Entries the kernel has not filled read as all zeros, and their ``types`` / ``ndevs`` files fail with EINVAL: they are
left out.  An IPv4 address is stored IPv4-mapped (``::ffff:198.18.1.5``); NCCL, by default (``NCCL_IB_ADDR_FAMILY``
AF_INET, ``NCCL_IB_ROCE_VERSION_NUM`` 2), needs a RoCE v2 entry of that form, and ``NCCL_IB_GID_INDEX`` names the
entry by its index.
"""

from __future__ import annotations

import ipaddress
import os

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
# A port has at most a few hundred entries; reading stops there whatever the directory holds.
MAX_ENTRIES = 1024


def _read(path):
    try:
        with open(path, "r", encoding="ascii", errors="replace") as handle:
            return handle.read(256).strip() or None
    except OSError:
        return None


def _index_key(name):
    return (0, int(name)) if name.isdigit() else (1, name)


def address_of(gid):
    """``(family, address)`` of a GID: ``("ipv4", "198.18.1.5")`` for an IPv4-mapped one, ``("ipv6", text)``
    otherwise (``link-local`` for fe80::/10); None when it is not a GID."""
    try:
        address = ipaddress.IPv6Address(gid)
    except ValueError:
        return None
    if address.ipv4_mapped is not None:
        return "ipv4", str(address.ipv4_mapped)
    return ("link-local" if address.is_link_local else "ipv6"), str(address)


def read_gids(port_dir):
    """``{present, entries: [{index, gid, type, ndev, family, address}], error}`` of one port directory.

    ``present`` is False when the port has no ``gids`` folder (a sysfs without GID tables: nothing observed)."""
    gids_dir = os.path.join(port_dir, "gids")
    try:
        names = sorted(os.listdir(gids_dir), key=_index_key)[:MAX_ENTRIES]
    except FileNotFoundError:
        return {"present": False, "entries": [], "error": None}
    except OSError as exc:
        return {"present": True, "entries": [], "error": "cannot list %s: %s" % (gids_dir, exc.strerror or exc)}
    entries = []
    for name in names:
        gid = _read(os.path.join(gids_dir, name))
        if not gid or gid == ZERO_GID or not name.isdigit():
            continue
        family, address = address_of(gid) or (None, None)
        entries.append({"index": int(name), "gid": gid, "family": family, "address": address,
                        "type": _read(os.path.join(port_dir, "gid_attrs", "types", name)),
                        "ndev": _read(os.path.join(port_dir, "gid_attrs", "ndevs", name))})
    return {"present": True, "entries": entries, "error": None}
