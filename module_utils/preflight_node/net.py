# -*- coding: utf-8 -*-
"""Network pieces of the preflight on a node (node layer): how a TCP connect failed, whether the
next hop answers ARP, who holds a port, and the ``port_listen`` / ``port_reach_<peer>`` checks the
``port_probe`` module (``module_utils/preflight_node/port_probe.py``) returns.  What a whole
node-to-node mesh says about each node is the controller's, ``cluster_preflight/mesh.py``.

Result names used for one TCP connect from one node to another
(``RESULTS``):

* ``open``       - connected and the preflight listener of the right node
                   answered.
* ``refused``    - RST: nothing listens there, or a REJECT rule.
* ``timeout``    - no answer at all: packets dropped (firewall DROP,
                   security group, node down behind a router).
* ``no_route``   - EHOSTUNREACH / ENETUNREACH: no route, or an ICMP
                   host-prohibited reject.
* ``unreachable`` - the connect timed out or found no route, and the next hop
                   towards the peer never answered ARP: the peer's link is
                   down or isolated, it is on another segment or VLAN, or the
                   wrong interface was chosen.  A firewall does not block ARP,
                   so this is told apart from ``timeout`` (a DROP rule).
* ``wrong_host`` - something answered, but not the node that was meant.
* ``error``      - anything else; the errno name is kept alongside.
"""

from __future__ import annotations

import errno as _errno
import ipaddress
import os
import socket
import time

from .checks import failed, passed, skipped
from .proc import socket_owners

RESULTS = ("open", "refused", "timeout", "no_route", "unreachable", "wrong_host", "error")

_NO_ROUTE = {_errno.EHOSTUNREACH, _errno.ENETUNREACH, getattr(_errno, "EHOSTDOWN", -1),
             getattr(_errno, "ENETDOWN", -1)}
_TIMEOUT = {_errno.ETIMEDOUT}
_REFUSED = {_errno.ECONNREFUSED}

# /proc/net/tcp "st" column values (include/net/tcp_states.h).
TCP_LISTEN = 0x0A
TCP_CLOSE = 0x07
TCP_TIME_WAIT = 0x06


def errno_name(number):
    """``ECONNREFUSED`` for 111; ``None`` when there is no errno."""
    if number is None:
        return None
    return _errno.errorcode.get(number, "E%d" % number)


def classify_errno(exc):
    """Classify an exception raised by ``connect``.

    Returns ``(result, errno_name)`` where ``result`` is one of ``RESULTS``
    (never ``open`` or ``wrong_host``) and ``errno_name`` is for example
    ``"ECONNREFUSED"``, or ``None`` when the exception carries no errno
    (a Python-side timeout).
    """
    number = getattr(exc, "errno", None)
    if isinstance(exc, socket.timeout) and number is None:
        return "timeout", None
    if number in _REFUSED or isinstance(exc, ConnectionRefusedError):
        return "refused", errno_name(number if number is not None else _errno.ECONNREFUSED)
    if number in _TIMEOUT:
        return "timeout", errno_name(number)
    if number in _NO_ROUTE:
        return "no_route", errno_name(number)
    if isinstance(exc, TimeoutError):
        return "timeout", errno_name(number)
    return "error", errno_name(number)


# ---------------------------------------------------------------- neighbours

def _hex_ipv4(text):
    """``0102A8C0`` (host order, as /proc/net/route prints it) -> IPv4Address('192.168.2.1')."""
    return ipaddress.IPv4Address(bytes.fromhex(text)[::-1])


def next_hop(addr, proc_root="/proc"):
    """``(next_hop, device)`` towards IPv4 ``addr`` from ``<proc_root>/net/route`` (longest prefix,
    then lowest metric), or ``None`` when there is no route or it cannot be read."""
    try:
        target = ipaddress.IPv4Address(addr)
        if target.is_loopback:
            return None
        with open(os.path.join(proc_root, "net", "route")) as handle:
            lines = handle.read().splitlines()[1:]
    except (OSError, ValueError):
        return None
    best = None
    for line in lines:
        fields = line.split()
        if len(fields) < 8:
            continue
        try:
            dest, gateway, mask = _hex_ipv4(fields[1]), _hex_ipv4(fields[2]), _hex_ipv4(fields[7])
            flags, metric = int(fields[3], 16), int(fields[6])
        except ValueError:
            continue
        if not flags & 0x1:  # RTF_UP
            continue
        prefix = bin(int(mask)).count("1")
        if int(target) & int(mask) != int(dest):
            continue
        key = (prefix, -metric)
        if best is None or key > best[0]:
            hop = gateway if flags & 0x2 else target  # RTF_GATEWAY
            best = (key, str(hop), fields[0])
    return None if best is None else (best[1], best[2])


def neighbour(addr, proc_root="/proc"):
    """The ARP entry of ``addr`` in ``<proc_root>/net/arp``: ``{answered, device, hwaddr}``, or ``None``.

    ``answered`` is the ATF_COM flag: false while the kernel still asks (INCOMPLETE) and after
    nobody answered (FAILED)."""
    try:
        with open(os.path.join(proc_root, "net", "arp")) as handle:
            lines = handle.read().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[0] == addr:
            try:
                flags = int(fields[2], 16)
            except ValueError:
                continue
            return {"answered": bool(flags & 0x2), "device": fields[5], "hwaddr": fields[3]}
    return None


def _source_addr(target):
    """The local address the kernel would use towards ``target`` (a UDP connect sends nothing)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.connect((target, 9))
        return sock.getsockname()[0]
    finally:
        sock.close()


def arp_answers(target, device, timeout=1.0, sys_root="/sys"):
    """Ask ``target`` for its MAC on ``device`` with a broadcast ARP request, as arping does.

    True: it answered; False: no answer within ``timeout``; None: could not ask (not root, no such
    device, not Ethernet).  Firewalls (iptables, nftables' ip/inet tables) do not filter ARP, so an
    answer means the link works and only the layers above can drop the connection."""
    try:
        with open(os.path.join(sys_root, "class", "net", device, "address")) as handle:
            mac = bytes.fromhex(handle.read().strip().replace(":", ""))
        if len(mac) != 6 or mac == b"\0" * 6:
            return None
        source = socket.inet_aton(_source_addr(target))
        wanted = socket.inet_aton(target)
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806))
    except (OSError, ValueError, AttributeError):
        return None
    request = (b"\xff" * 6 + mac + b"\x08\x06" + b"\x00\x01\x08\x00\x06\x04\x00\x01" + mac + source
               + b"\0" * 6 + wanted)
    deadline = time.monotonic() + timeout
    try:
        sock.bind((device, 0x0806))
        sends = [deadline - timeout, deadline - timeout / 2.0]
        while True:
            now = time.monotonic()
            if now >= deadline:
                return False
            if sends and now >= sends[0]:
                sends.pop(0)
                sock.send(request)
            sock.settimeout(max(0.01, min(deadline, sends[0] if sends else deadline) - now))
            try:
                frame = sock.recv(128)
            except socket.timeout:
                continue
            # Ethernet type ARP, operation reply, sender protocol address = the target.
            if len(frame) >= 42 and frame[12:14] == b"\x08\x06" and frame[20:22] == b"\x00\x02" \
                    and frame[28:32] == wanted:
                return True
    except OSError:
        return None
    finally:
        sock.close()


def link_layer_silent(addr, proc_root="/proc", timeout=1.0, sys_root="/sys"):
    """``{next_hop, device, how}`` when the next hop towards ``addr`` does not answer ARP; else ``None``.

    Asks the next hop itself (``arp_answers``); where that is not possible, falls back to the kernel's
    ARP table (an entry the kernel asked for and never got an answer to)."""
    hop = next_hop(addr, proc_root)
    if hop is None:
        return None
    answers = arp_answers(hop[0], hop[1], timeout, sys_root)
    if answers is True:
        return None
    if answers is False:
        return {"next_hop": hop[0], "device": hop[1], "how": "asked with ARP for %.1f s" % timeout}
    silent = unanswered_neighbour(addr, proc_root)
    return dict(silent, how="the kernel's ARP entry is incomplete") if silent else None


def unanswered_neighbour(addr, proc_root="/proc"):
    """``{next_hop, device}`` when the next hop towards ``addr`` has not answered ARP; else ``None``
    (it answered, it was never asked, or this is not IPv4)."""
    hop = next_hop(addr, proc_root)
    if hop is None:
        return None
    entry = neighbour(hop[0], proc_root)
    if entry is None or entry["answered"]:
        return None
    return {"next_hop": hop[0], "device": entry["device"] or hop[1]}


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


# ---------------------------------------------------------------- checks

def listen_check(node, addr, port, listen):
    """The ``port_listen`` check from a probe's ``listen`` dict."""
    status = listen.get("status")
    expected = "%s can listen on %s:%d for the rendezvous" % (node, addr, port)
    if status == "ok":
        return passed("%s listens on %s:%d" % (node, addr, port), expected)
    if status == "disabled":
        return skipped("listening switched off on %s (listen: false)" % node, expected)
    if status == "in_use":
        holder = listen.get("holder") or {}
        if holder.get("pid") is not None:
            fix = ("stop pid %d (%s) on %s (ss -ltnp 'sport = :%d' shows it) or choose another "
                   "preflight_master_port" % (holder["pid"], holder.get("comm") or "?", node, port))
        else:
            fix = ("find the owner on %s as root (ss -ltnp 'sport = :%d') and stop it, or choose another "
                   "preflight_master_port" % (node, port))
        return failed("%s on %s" % (describe_holder(port, holder), node), expected, fix,
                      holder=listen.get("holder"))
    if status == "addr_not_available":
        return failed("%s is not an address of %s (EADDRNOTAVAIL)" % (addr, node), expected,
                      "set %s's inter-node address to one of its own addresses (ip -4 addr show on %s), "
                      "or bring up the interface that carries %s" % (node, node, addr))
    return failed("cannot listen on %s:%d on %s: %s" % (addr, port, node, listen.get("detail")), expected,
                  "fix the error on %s, or choose another preflight_master_port (ports below 1024 need root)"
                  % node)


def reach_check(result):
    """The ``port_reach_<peer>`` check from one outgoing probe result."""
    src, dst, addr, port = result["source"], result["destination"], result["addr"], result["port"]
    expected = "TCP connect from %s to %s on %d succeeds" % (src, dst, port)
    outcome = result["result"]
    open_it = ("open TCP %d inbound on %s: iptables -I INPUT -p tcp --dport %d -j ACCEPT on %s (and persist "
               "it in the node's firewall configuration), or allow TCP %d between the nodes in the cloud "
               "security group / network ACL" % (port, dst, port, dst, port))
    details = {"source": src, "destination": dst, "result": outcome}
    if outcome == "open":
        return passed("%s (%s:%d) answered %s in %.2f s" % (dst, addr, port, src, result["elapsed"]),
                      expected, **details)
    if outcome == "timeout":
        fix = open_it + "; also check that %s allows outbound TCP %d" % (src, port)
    elif outcome == "refused":
        fix = ("check %s's port_listen result (its probe must listen on %s:%d); if it listened, a REJECT rule "
               "on %s blocks the port: %s" % (dst, addr, port, dst, open_it))
    elif outcome == "no_route":
        fix = ("make %s reachable from %s: ip route get %s on %s, check that %s is up with %s on its "
               "inter-node interface; if a firewall on %s rejects with icmp-host-prohibited, %s"
               % (addr, src, addr, src, dst, addr, dst, open_it))
    elif outcome == "unreachable":
        fix = ("%s never answered ARP: check that %s's inter-node interface is up and cabled to the same "
               "segment/VLAN as %s (ip -br link and ip -br addr on %s; ip neigh show %s and arping %s on %s); if %s "
               "is on another network, the wrong interface was chosen: set preflight_socket_ifname to the interface "
               "both nodes share (see nic_discovery.common_interface). Not a firewall: firewalls do not block ARP"
               % (result.get("next_hop") or addr, dst, src, dst, result.get("next_hop") or addr,
                  result.get("next_hop") or addr, src, addr))
    elif outcome == "wrong_host":
        fix = ("fix the inter-node address of %s in the inventory: %s does not belong to %s (two nodes share "
               "it, or another program holds port %d on %s)" % (dst, addr, dst, port, dst))
    elif result.get("connected"):
        fix = ("another program holds port %d on %s and does not answer the probe: see %s's port_listen check "
               "(ss -ltnp 'sport = :%d' on %s), stop it or choose another preflight_master_port" % (
                   port, dst, dst, port, dst))
    else:
        fix = "fix the error on %s (%s), then re-run the preflight" % (src, result.get("errno") or "unknown")
    return failed(result["detail"], expected, fix, **details)
