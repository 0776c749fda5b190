# -*- coding: utf-8 -*-
"""Who holds a TCP port on this node (node layer): ``/proc/net/tcp`` parsed and the socket's owner found.

:func:`find_port_holder` is what the allreduce reader (``module_utils/preflight_node/capabilities/allreduce.py``) and
the
port probe (``module_utils/preflight_node/net/port_probe.py``) need.  How a connect failed and whether the next
hop answers ARP is in ``module_utils/preflight_node/net/arp.py``; the ``port_listen`` / ``port_reach_<peer>``
checks are in ``module_utils/preflight_node/net/port_checks.py``; what a whole node-to-node mesh says about each
node is the controller's, ``cluster_preflight/capabilities/port_mesh/mesh.py``.
"""

from __future__ import annotations

import ipaddress
import os

from ..host.proc import socket_owners


# /proc/net/tcp "st" column values (include/net/tcp_states.h).
TCP_LISTEN = 0x0A
TCP_CLOSE = 0x07
TCP_TIME_WAIT = 0x06


# ---------------------------------------------------------------- port holder

def _parse_proc_addr(text):
    """``0100007F:1770`` -> (IPv4Address('127.0.0.1'), 6000); tcp6 too."""
    addr_hex, port_hex = text.split(":")
    raw = bytes.fromhex(addr_hex)
    # The kernel prints each 32-bit word in host (little-endian) order.
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    if len(words) == 4:
        addr = ipaddress.IPv4Address(words)
    else:
        addr = ipaddress.IPv6Address(words)
        if addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
    return addr, int(port_hex, 16)


def parse_proc_net_tcp(text):
    """Parse the text of /proc/net/tcp or /proc/net/tcp6.

    Returns a list of ``{addr, port, state, inode}`` (addr as a string,
    state as an int such as ``TCP_LISTEN``).  Malformed lines are skipped.
    """
    sockets = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        try:
            addr, port = _parse_proc_addr(fields[1])
            state = int(fields[3], 16)
            inode = int(fields[9])
        except ValueError:
            continue
        sockets.append({"addr": str(addr), "port": port, "state": state, "inode": inode})
    return sockets


def _overlaps(bound, wanted):
    """Would binding ``wanted`` collide with a socket bound to ``bound``?"""
    if wanted is None:
        return True
    bound_ip = ipaddress.ip_address(bound)
    wanted_ip = ipaddress.ip_address(wanted)
    return bound_ip.is_unspecified or wanted_ip.is_unspecified or bound_ip == wanted_ip


def _port_sockets(port, proc_root, addr):
    """Inodes of the sockets on ``port`` that can block a bind, best first."""
    found = []
    for name in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc_root, "net", name)) as handle:
                text = handle.read()
        except OSError:
            continue
        for sock in parse_proc_net_tcp(text):
            if sock["port"] != port or sock["inode"] == 0 or sock["state"] == TCP_TIME_WAIT:
                continue
            # A listener blocks a bind; a bound socket that does not listen
            # (state CLOSE) blocks it when it lacks SO_REUSEADDR; an
            # accepted connection shares its listener's port.
            rank = {TCP_LISTEN: 0, TCP_CLOSE: 2}.get(sock["state"], 4)
            if not _overlaps(sock["addr"], addr):
                rank += 1
            found.append((rank, sock))
    found.sort(key=lambda item: (item[0], item[1]["inode"]))
    return [sock for _, sock in found]


def _read_comm(proc_root, pid):
    try:
        with open(os.path.join(proc_root, str(pid), "comm")) as handle:
            return handle.read().strip()
    except OSError:
        return None


def find_port_holder(port, proc_root="/proc", addr=None, deadline=None):
    """Which process holds TCP ``port`` (so a bind to it fails)?

    Reads ``<proc_root>/net/tcp`` and ``tcp6`` for a socket on ``port``
    (a LISTEN socket first, on an address overlapping ``addr`` first), then
    scans ``<proc_root>/<pid>/fd/*`` for the link ``socket:[<inode>]``.

    Returns ``None`` when no socket on the port is found, else
    ``{pid, pids, comm, inode, addr, state}``; ``pid``/``comm`` are
    ``None`` when no visible process owns the socket (another user's process
    without root, or the scan ran past ``deadline``, a ``time.monotonic()``
    value).
    """
    candidates = _port_sockets(port, proc_root, addr)
    if not candidates:
        return None
    try:
        entries = sorted((entry for entry in os.listdir(proc_root) if entry.isdigit()), key=int)
    except OSError:
        entries = []
    owners = socket_owners(proc_root, entries, [sock["inode"] for sock in candidates], deadline)[0]
    for sock in candidates:
        pids = sorted(set(owners.get(sock["inode"], [])))
        if pids:
            return {"pid": pids[0], "pids": pids, "comm": _read_comm(proc_root, pids[0]),
                    "inode": sock["inode"], "addr": sock["addr"], "state": _state_name(sock["state"])}
    best = candidates[0]
    return {"pid": None, "pids": [], "comm": None, "inode": best["inode"], "addr": best["addr"],
            "state": _state_name(best["state"])}


def _state_name(state):
    return {TCP_LISTEN: "LISTEN", TCP_CLOSE: "CLOSE"}.get(state, "0x%02X" % state)


def describe_holder(port, holder):
    """``port 6000 in use by pid 1234 (python3)``."""
    if not holder:
        return "port %d in use by a process that could not be identified" % port
    if holder.get("pid") is None:
        return "port %d in use by a process not visible here (socket inode %s; run as root to see it)" % (
            port, holder.get("inode"))
    return "port %d in use by pid %d (%s)" % (port, holder["pid"], holder.get("comm") or "?")
