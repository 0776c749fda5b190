#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module port_probe: a real TCP mesh test of the rendezvous port."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: port_probe
short_description: Test that a TCP port is open between every pair of nodes
description:
  - Run on all nodes of a play in the same task (Ansible runs a task on all hosts at the same
    time). Every node listens on O(port) on its inter-node address and connects to the same port
    on every peer, all pairs in parallel, within one bounded time O(window).
  - The connecting node sends C(PREFLIGHT <from> <to>) and the listener answers C(OK <node_name>),
    so a connection that lands on the wrong node is told apart from an open port.
  - Each outgoing connection is classified as C(open), C(refused) (RST, nothing listening or a
    REJECT rule), C(timeout) (packets dropped, a firewall DROP), C(no_route)
    (EHOSTUNREACH/ENETUNREACH), C(unreachable), C(wrong_host) or C(error).
  - A timeout or missing route is C(unreachable) when the next hop towards the peer (the peer, or the
    gateway, from C(/proc/net/route)) does not answer a broadcast ARP request sent once within the window
    (as arping does; without the privilege for that, when the kernel's C(/proc/net/arp) entry for it is
    incomplete). Then the peer's link is down or isolated, it is on another segment, or the wrong interface was
    chosen. Firewalls do not filter ARP, so a DROP rule stays a C(timeout).
  - When the port cannot be bound because it is in use, the holder is found from
    C(/proc/net/tcp), C(/proc/net/tcp6) and C(/proc/<pid>/fd) and reported by pid and name.
  - Findings are returned as check results in RV(checks); the task never fails for a finding, only
    for bad arguments.
  - The module always returns within O(window) + 2 seconds and closes its listening socket
    before it returns.
version_added: "1.0.0"
options:
  listen_addr:
    description:
      - This node's inter-node IPv4 address to listen on; V(0.0.0.0) listens on all addresses.
    type: str
    required: true
  port:
    description:
      - TCP port to test (the rendezvous / master port), 1-65535.
    type: int
    default: 6000
  node_name:
    description:
      - This node's inventory name; sent to peers and checked by them.
    type: str
    required: true
  peers:
    description:
      - Every other node of the mesh. An entry whose O(peers[].name) equals O(node_name) is ignored,
        so the full node list may be passed.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: The peer's inventory name.
        type: str
        required: true
      addr:
        description: The peer's inter-node IPv4 address.
        type: str
        required: true
  window:
    description:
      - Seconds the whole mesh may take on this node (listening, connecting, retrying).
      - Must cover the spread between the moments the nodes start the task.
    type: float
    default: 8.0
  connect_timeout:
    description:
      - Seconds one connection attempt may take before it counts as C(timeout).
    type: float
    default: 2.0
  listen:
    description:
      - Listen on O(port). Set to V(false) on a node that should only connect.
    type: bool
    default: true
  check_in_use_only:
    description:
      - Only test that O(port) can be bound and listened on, then return; no peer is contacted.
    type: bool
    default: false
  inbound:
    description:
      - Names of the nodes that connect to this one; the listener is done once each has connected. The same
        as the names in O(peers) when not given (a full mesh); a large cluster's pairing gives every node a few
        peers, and its inbound ones differ.
    type: list
    elements: str
  proc_root:
    description:
      - Root of the proc filesystem read to find the process holding the port and the route and ARP
        entry towards an unreachable peer (for tests).
    type: path
    default: /proc
attributes:
  check_mode:
    support: full
    description: The probe only opens sockets for its own duration and changes nothing, so it runs
      in check mode exactly as in a normal run.
  diff_mode:
    support: none
    description: Nothing is changed, so there is nothing to diff.
  platform:
    support: full
    platforms: posix
    description: Linux (reads C(/proc)).
notes:
  - All nodes must run the task at the same time (one task over all hosts, enough C(forks)).
  - The controller combines every node's RV(results) with C(mesh_summary) from
    C(module_utils/preflight_node/net.py) to name a node that no peer can reach.
author:
  - Cluster preflight contributors (@cluster-preflight)
"""

EXAMPLES = r"""
- name: Collect every node's name and inter-node address.
  ansible.builtin.set_fact:
    preflight_mesh_nodes: >-
      {{ preflight_mesh_nodes | default([])
         + [{'name': item, 'addr': hostvars[item].preflight_node_addr}] }}
  loop: "{{ ansible_play_hosts }}"

- name: Check that the rendezvous port is open between every pair of nodes.
  port_probe:
    listen_addr: "{{ preflight_node_addr }}"
    port: "{{ preflight_master_port }}"
    node_name: "{{ inventory_hostname }}"
    peers: "{{ preflight_mesh_nodes }}"
    window: 8
  register: preflight_port_mesh
  changed_when: false
  check_mode: false

- name: Check that the rendezvous port is free on the master node.
  port_probe:
    listen_addr: 0.0.0.0
    port: 6000
    node_name: "{{ inventory_hostname }}"
    check_in_use_only: true
  register: preflight_port_free
  changed_when: false
  check_mode: false
"""

RETURN = r"""
results:
  description: One entry per peer for the connection from this node to that peer.
  returned: always
  type: list
  elements: dict
  contains:
    source:
      description: This node's name.
      type: str
    destination:
      description: The peer's name.
      type: str
    addr:
      description: The peer's address.
      type: str
    port:
      description: The port.
      type: int
    result:
      description: Outcome of the last attempt.
      type: str
      choices: [open, refused, timeout, no_route, unreachable, wrong_host, error]
    errno:
      description: Errno name of the failure (for example V(ECONNREFUSED)), or null.
      type: str
    next_hop:
      description: With C(unreachable), the address that never answered ARP (the peer or the gateway towards it).
      type: str
      returned: when result is unreachable
    answered_by:
      description: Node name the listener answered with, or null.
      type: str
    connected:
      description: Whether the TCP connection itself was established (true for V(open), V(wrong_host) and
        for a listener that never answered the greeting, another program on the port).
      type: bool
    attempts:
      description: Connection attempts made within the window.
      type: int
    detail:
      description: One sentence for a human.
      type: str
    elapsed:
      description: Seconds from the first attempt to the outcome.
      type: float
  sample:
    - {source: node1, destination: node2, addr: 198.18.1.2, port: 6000, result: timeout, errno: null,
       answered_by: null, connected: false, attempts: 4,
       detail: "198.18.1.2:6000 timed out after 2.0 s (packets dropped: firewall?)", elapsed: 8.0}
incoming:
  description: Sorted names of the nodes that connected to this node and got an answer.
  returned: always
  type: list
  elements: str
misdirected:
  description: Connections that reached this node but were meant for another node (C(from), C(to)).
  returned: always
  type: list
  elements: dict
listen:
  description: Outcome of listening on the port on this node.
  returned: always
  type: dict
  contains:
    status:
      description: Outcome.
      type: str
      choices: [ok, in_use, addr_not_available, error, disabled]
    detail: {description: One sentence for a human., type: str}
    holder:
      description: Process holding the port when RV(listen.status=in_use) (C(pid), C(pids), C(comm),
        C(inode), C(addr), C(state)); null otherwise. C(pid) is null when the owner is not visible.
      type: dict
checks:
  description: Check results (status, found, expected, fix) by name, C(port_listen) and one
    C(port_reach_<peer>) per peer.
  returned: always
  type: dict
elapsed:
  description: Seconds the probe took on this node.
  returned: always
  type: float
"""

import errno
import ipaddress
import socket
import threading
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_node.net import (
    classify_errno,
    describe_holder,
    errno_name,
    find_port_holder,
    listen_check,
    link_layer_silent,
    reach_check,
)

# Room left after the window for joining threads and closing sockets.
_GRACE = 0.5
_RETRY_PAUSE = 0.2
_ACCEPT_POLL = 0.1
_LINE_MAX = 256
# Seconds one ARP question to an unanswering peer's next hop may take (once per peer, inside the window).
_ARP_TIMEOUT = 1.0
_UNASKED = object()


def _read_line(conn, deadline):
    """Read one line (without the newline) or ``None`` on EOF/timeout."""
    data = b""
    while b"\n" not in data and len(data) < _LINE_MAX:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        conn.settimeout(remaining)
        try:
            chunk = conn.recv(_LINE_MAX - len(data))
        except (socket.timeout, OSError):
            return None
        if not chunk:
            break
        data += chunk
    if b"\n" not in data:
        return None
    return data.split(b"\n", 1)[0].decode("ascii", "replace").strip()


class _Listener(object):
    """Answer every connection until told to stop or the deadline.

    ``complete`` is set once every expected peer has been answered; the
    prober stops the listener only after that and after its own
    connections are done, so a connection of its own that lands here (two
    nodes sharing an address) is answered too instead of waiting unseen
    in the accept queue.
    """

    def __init__(self, sock, node_name, expected, deadline, answer_timeout):
        self.sock = sock
        self.node_name = node_name
        self.expected = set(expected)
        self.deadline = deadline
        self.answer_timeout = answer_timeout
        self.incoming = set()
        self.misdirected = []
        self.lock = threading.Lock()
        self.complete = threading.Event()
        self.stop = threading.Event()
        self.handlers = []
        if not self.expected:
            self.complete.set()

    def run(self):
        while not self.stop.is_set():
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                break
            self.sock.settimeout(min(_ACCEPT_POLL, remaining))
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            handler = threading.Thread(target=self._answer, args=(conn,), daemon=True)
            self.handlers.append(handler)
            handler.start()

    def _answer(self, conn):
        try:
            line = _read_line(conn, min(self.deadline, time.monotonic() + self.answer_timeout))
            parts = (line or "").split()
            if len(parts) != 3 or parts[0] != "PREFLIGHT":
                return
            sender, meant_for = parts[1], parts[2]
            conn.settimeout(max(0.05, min(self.answer_timeout, self.deadline - time.monotonic())))
            conn.sendall(("OK %s\n" % self.node_name).encode("ascii", "replace"))
            with self.lock:
                self.incoming.add(sender)
                if meant_for != self.node_name:
                    self.misdirected.append({"from": sender, "to": meant_for})
                if self.expected <= self.incoming:
                    self.complete.set()
        except (socket.timeout, OSError):
            pass
        finally:
            conn.close()


def _attempt(result, errno_name=None, answered_by=None, detail="", connected=False, final=False):
    return {"result": result, "errno": errno_name, "answered_by": answered_by, "detail": detail,
            "connected": connected, "final": final}


def _connect_once(node_name, peer, port, timeout, deadline):
    """One attempt of at most ``timeout`` seconds, never past ``deadline``."""
    addr = peer["addr"]
    attempt_deadline = min(deadline, time.monotonic() + timeout)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        started = time.monotonic()
        try:
            sock.connect((addr, port))
        except (socket.timeout, OSError) as exc:
            result, name = classify_errno(exc)
            waited = time.monotonic() - started
            if result == "timeout":
                detail = "%s:%d timed out after %.1f s (packets dropped: firewall?)" % (addr, port, waited)
            elif result == "refused":
                detail = "%s:%d refused the connection (nothing listening on %s, or a REJECT rule)" % (
                    addr, port, peer["name"])
            elif result == "no_route":
                detail = "no route from %s to %s:%d (%s)" % (node_name, addr, port, name)
            else:
                detail = "connecting to %s:%d failed: %s (%s)" % (addr, port, name or type(exc).__name__, exc)
            return _attempt(result, name, detail=detail)
        try:
            sock.settimeout(max(0.01, attempt_deadline - time.monotonic()))
            sock.sendall(("PREFLIGHT %s %s\n" % (node_name, peer["name"])).encode("ascii", "replace"))
        except (socket.timeout, OSError) as exc:
            _, name = classify_errno(exc)
            return _attempt("error", name, detail="connected to %s:%d but sending failed: %s" % (
                addr, port, name or exc), connected=True)
        line = _read_line(sock, attempt_deadline)
        if line is None:
            # TCP got through but nothing speaks the protocol: final, a
            # retry would only fill that program's accept queue.
            return _attempt("error", detail="connected to %s:%d but no preflight answer within %.1f s (another "
                                            "program holds port %d on %s?)" % (addr, port, timeout, port,
                                                                               peer["name"]),
                            connected=True, final=True)
        parts = line.split()
        if len(parts) == 2 and parts[0] == "OK":
            if parts[1] == peer["name"]:
                return _attempt("open", answered_by=parts[1], detail="%s:%d answered as %s" % (
                    addr, port, parts[1]), connected=True, final=True)
            return _attempt("wrong_host", answered_by=parts[1], detail="%s:%d reached %s instead of %s" % (
                addr, port, parts[1], peer["name"]), connected=True, final=True)
        return _attempt("wrong_host", detail="%s:%d answered %r, not the preflight probe of %s (another program "
                                             "holds port %d there?)" % (addr, port, line[:60], peer["name"], port),
                        connected=True, final=True)
    finally:
        sock.close()


def _unreachable(outcome, addr, port, silent):
    """A timeout or missing route whose next hop does not answer ARP becomes ``unreachable``: the link,
    segment or interface is at fault, not a firewall (the ARP reply would have come through one)."""
    if silent is None or outcome["connected"] or outcome["result"] not in ("timeout", "no_route"):
        return outcome, None
    hop = silent["next_hop"]
    detail = ("%s:%d is unreachable: %s%s never answered ARP on %s (%s): link down or isolated, another segment or "
              "VLAN, or the wrong interface; not a firewall" % (
                  addr, port, hop, "" if hop == addr else " (the gateway towards it)", silent["device"],
                  silent.get("how", "")))
    return dict(outcome, result="unreachable", detail=detail), hop


def _connector(node_name, peer, port, connect_timeout, deadline, out, lock, proc_root="/proc"):
    """Connect to one peer, retrying until a final outcome or the deadline."""
    started = time.monotonic()
    attempts = 0
    silent = _UNASKED
    outcome = _attempt("timeout", detail="no attempt fitted in the window")
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0.01:
            break
        attempts += 1
        attempt_started = time.monotonic()
        outcome = _connect_once(node_name, peer, port, min(connect_timeout, remaining), deadline)
        if outcome["final"]:
            break
        if silent is _UNASKED and outcome["result"] in ("timeout", "no_route"):
            # Once, inside the window: does the next hop answer ARP at all?
            silent = link_layer_silent(peer["addr"], proc_root,
                                       timeout=max(0.05, min(_ARP_TIMEOUT, deadline - time.monotonic() - 0.05)))
        # Refused usually means the peer's listener is not up yet; the
        # others may be transient too.  Do not spin on instant failures.
        pause = _RETRY_PAUSE - (time.monotonic() - attempt_started)
        if pause > 0:
            time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
    outcome, hop = _unreachable(outcome, peer["addr"], port, None if silent is _UNASKED else silent)
    row = {
        "source": node_name,
        "destination": peer["name"],
        "addr": peer["addr"],
        "port": port,
        "result": outcome["result"],
        "errno": outcome["errno"],
        "answered_by": outcome["answered_by"],
        "connected": outcome["connected"],
        "attempts": attempts,
        "detail": outcome["detail"],
        "elapsed": round(time.monotonic() - started, 3),
    }
    if hop is not None:
        row["next_hop"] = hop
    with lock:
        out.append(row)


def _bind(listen_addr, port, backlog):
    """Bind and listen; returns (sock, status, errno_number, detail)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # SO_REUSEADDR lets a port in TIME_WAIT be reused; SO_REUSEPORT would
    # let two listeners share it and hide the very conflict we look for.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((listen_addr, port))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            return None, "in_use", exc.errno, "port %d in use" % port
        if exc.errno == errno.EADDRNOTAVAIL:
            return None, "addr_not_available", exc.errno, "%s is not an address of this node" % listen_addr
        return None, "error", exc.errno, "cannot listen on %s:%d: %s (%s)" % (
            listen_addr, port, errno_name(exc.errno), exc.strerror)
    return sock, "ok", None, "listening on %s:%d" % (listen_addr, port)


def probe(listen_addr, port, node_name, peers=(), window=8.0, connect_timeout=2.0, listen=True,
          check_in_use_only=False, proc_root="/proc", inbound=None):
    """Run the probe on this node; returns the module's result (without ``changed``).

    ``inbound``: the names of the nodes that connect here (the listener is done once each has);
    the same as ``peers`` when None, as in a full mesh."""
    started = time.monotonic()
    deadline = started + window
    peers = [dict(name=p["name"], addr=p["addr"]) for p in peers if p["name"] != node_name]
    if check_in_use_only:
        peers = []
        listen = True

    sock = None
    listen_info = {"status": "disabled", "detail": "listening switched off", "holder": None}
    if listen:
        sock, status, _, detail = _bind(listen_addr, port, max(128, 2 * len(peers)))
        listen_info = {"status": status, "detail": detail, "holder": None}

    results, incoming, misdirected = [], [], []
    lock = threading.Lock()
    try:
        if sock is not None and check_in_use_only:
            sock.close()
            sock = None
        listener = listener_thread = None
        threads = []
        if sock is not None:
            expected = [p["name"] for p in peers] if inbound is None else [n for n in inbound if n != node_name]
            listener = _Listener(sock, node_name, expected, deadline, max(connect_timeout, 0.5))
            listener_thread = threading.Thread(target=listener.run, daemon=True)
            listener_thread.start()
        for peer in peers:
            threads.append(threading.Thread(
                target=_connector, args=(node_name, peer, port, connect_timeout, deadline, results, lock, proc_root),
                daemon=True))
        for thread in threads:
            thread.start()

        if listen_info["status"] == "in_use":
            # Runs while the connectors work; bounded by the same window.
            holder = find_port_holder(port, proc_root, addr=listen_addr, deadline=deadline)
            listen_info["holder"] = holder
            listen_info["detail"] = describe_holder(port, holder)

        for thread in threads:
            thread.join(max(0.0, deadline + _GRACE - time.monotonic()))
        if listener is not None:
            listener.complete.wait(max(0.0, deadline - time.monotonic()))
            listener.stop.set()
            listener_thread.join(max(0.0, deadline + _GRACE - time.monotonic()))
            for handler in list(listener.handlers):
                handler.join(max(0.0, deadline + _GRACE - time.monotonic()))
            with listener.lock:
                incoming = sorted(listener.incoming)
                misdirected = list(listener.misdirected)
    finally:
        if sock is not None:
            sock.close()

    with lock:
        reported = {row["destination"] for row in results}
        rows = list(results)
    for peer in peers:
        if peer["name"] not in reported:
            # A connector still stuck after the grace period: report it as a
            # timeout rather than waiting for it.
            rows.append({"source": node_name, "destination": peer["name"], "addr": peer["addr"], "port": port,
                         "result": "timeout", "errno": None, "answered_by": None, "connected": False,
                         "attempts": 0,
                         "detail": "%s:%d gave no outcome within the %.1f s window" % (peer["addr"], port, window),
                         "elapsed": round(time.monotonic() - started, 3)})
    order = {peer["name"]: index for index, peer in enumerate(peers)}
    rows.sort(key=lambda row: order[row["destination"]])

    checks = {"port_listen": listen_check(node_name, listen_addr, port, listen_info)}
    for row in rows:
        checks["port_reach_%s" % row["destination"]] = reach_check(row)
    return {
        "results": rows,
        "incoming": incoming,
        "misdirected": misdirected,
        "listen": listen_info,
        "checks": checks,
        "elapsed": round(time.monotonic() - started, 3),
    }


def _validate(module):
    params = module.params
    try:
        ipaddress.IPv4Address(params["listen_addr"])
    except ValueError:
        module.fail_json(msg="listen_addr %r is not an IPv4 address (expected for example 198.18.1.1 or 0.0.0.0)"
                         % params["listen_addr"])
    if not 1 <= params["port"] <= 65535:
        module.fail_json(msg="port %d is out of range, expected 1-65535" % params["port"])
    if params["window"] <= 0 or params["window"] > 600:
        module.fail_json(msg="window %s is out of range, expected more than 0 and at most 600 seconds"
                         % params["window"])
    if params["connect_timeout"] <= 0:
        module.fail_json(msg="connect_timeout %s must be more than 0 seconds" % params["connect_timeout"])
    if not params["node_name"] or any(ch.isspace() for ch in params["node_name"]):
        module.fail_json(msg="node_name %r must be a non-empty name without spaces" % params["node_name"])
    seen = set()
    for peer in params["peers"]:
        name, addr = peer["name"], peer["addr"]
        if not name or any(ch.isspace() for ch in name):
            module.fail_json(msg="peer name %r must be a non-empty name without spaces" % name)
        try:
            ipaddress.IPv4Address(addr)
        except ValueError:
            module.fail_json(msg="peer %s has addr %r, expected an IPv4 address (names are not resolved so "
                                 "the probe stays bounded in time)" % (name, addr))
        if name in seen:
            module.fail_json(msg="peer %s is listed twice in peers" % name)
        seen.add(name)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            listen_addr=dict(type="str", required=True),
            port=dict(type="int", default=6000),
            node_name=dict(type="str", required=True),
            peers=dict(type="list", elements="dict", default=[], options=dict(
                name=dict(type="str", required=True),
                addr=dict(type="str", required=True),
            )),
            window=dict(type="float", default=8.0),
            connect_timeout=dict(type="float", default=2.0),
            listen=dict(type="bool", default=True),
            check_in_use_only=dict(type="bool", default=False),
            proc_root=dict(type="path", default="/proc"),
            inbound=dict(type="list", elements="str"),
        ),
        supports_check_mode=True,
    )
    _validate(module)
    params = module.params
    result = probe(params["listen_addr"], params["port"], params["node_name"], params["peers"],
                   window=params["window"], connect_timeout=params["connect_timeout"], listen=params["listen"],
                   check_in_use_only=params["check_in_use_only"], proc_root=params["proc_root"],
                   inbound=params["inbound"])
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
