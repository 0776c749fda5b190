# -*- coding: utf-8 -*-
"""How a TCP connect failed and whether the next hop answers ARP (node layer,
``module_utils/preflight_node/net/arp.py``).

Used by the port probe (``module_utils/preflight_node/net/port_probe.py``) only; the readers never ship it.
Result names used for one TCP connect from one node to another (``RESULTS``):

* ``open``       - connected and the preflight listener of the right node answered.
* ``refused``    - RST: nothing listens there, or a REJECT rule.
* ``timeout``    - no answer at all: packets dropped (firewall DROP, security group, node down behind a
                   router).
* ``no_route``   - EHOSTUNREACH / ENETUNREACH: no route, or an ICMP host-prohibited reject.
* ``unreachable`` - the connect timed out or found no route, and the next hop towards the peer never
                   answered ARP: the peer's link is down or isolated, it is on another segment or VLAN, or
                   the wrong interface was chosen.  A firewall does not block ARP, so this is told apart
                   from ``timeout`` (a DROP rule).
* ``wrong_host`` - something answered, but not the node that was meant.
* ``error``      - anything else; the errno name is kept alongside.

Who holds a port is in ``module_utils/preflight_node/net/port_holder.py``; the ``port_listen`` / ``port_reach_<peer>``
checks are in ``module_utils/preflight_node/net/port_checks.py``.
"""

from __future__ import annotations

import errno as _errno
import ipaddress
import os
import socket
import time


RESULTS = ("open", "refused", "timeout", "no_route", "unreachable", "wrong_host", "error")
_NO_ROUTE = {_errno.EHOSTUNREACH, _errno.ENETUNREACH, getattr(_errno, "EHOSTDOWN", -1),
             getattr(_errno, "ENETDOWN", -1)}
_TIMEOUT = {_errno.ETIMEDOUT}
_REFUSED = {_errno.ECONNREFUSED}


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
