# -*- coding: utf-8 -*-
"""The port mesh probe of one node (node layer): listen on the rendezvous port, connect to every peer
within one window, classify each outcome (``open``, ``refused``, ``timeout``, ``no_route``,
``unreachable`` after an unanswered ARP, ``wrong_host``, ``error``) and name the holder of a port in use.

``library/port_probe.py`` is the Ansible module around :func:`probe` (documentation, arguments);
the errno/ARP pieces are in ``module_utils/preflight_node/net/arp.py``, the port holder in
``module_utils/preflight_node/net/port_holder.py``, the check builders in
``module_utils/preflight_node/net/port_checks.py``;
what the whole mesh says about each node is the controller's, ``cluster_preflight/capabilities/port_mesh/mesh.py``.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import threading
import time

from .arp import classify_errno, errno_name, link_layer_silent
from ..host.lock import hold_for_call
from .port_holder import describe_holder, find_port_holder
from .port_checks import listen_check, reach_check


# Room left after the window for joining threads and closing sockets.
_GRACE = 0.5
_RETRY_PAUSE = 0.2
_ACCEPT_POLL = 0.1
_LINE_MAX = 256
# Seconds one ARP question to an unanswering peer's next hop may take (once per peer, inside the window).
_ARP_TIMEOUT = 1.0
_UNASKED = object()
# Retest before blame (preflight_retest_port_mesh): a connection that failed through the window is tried once
# more after this pause; every listener stays up for the pause and one connect timeout more.
RETRY_PAUSE = 0.5


def retry_slack(connect_timeout):
    """Seconds a probe with ``retry`` may run past its window: the pause and one more connect attempt."""
    return RETRY_PAUSE + float(connect_timeout)


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


def _retry_once(node_name, peer, port, connect_timeout, outcome, retry_deadline):
    """The failed ``outcome`` tried once more after ``RETRY_PAUSE`` (the peer's listener is still up until
    ``retry_deadline``): the new outcome, whose detail says it was retried, and the first one."""
    time.sleep(max(0.0, min(RETRY_PAUSE, retry_deadline - time.monotonic())))
    again = _connect_once(node_name, peer, port, max(0.05, min(connect_timeout, retry_deadline - time.monotonic())),
                          retry_deadline)
    detail = "%s; retried once after %g s: %s" % (outcome["detail"], RETRY_PAUSE, again["detail"])
    return dict(again, detail=detail), {"result": outcome["result"], "errno": outcome["errno"],
                                        "detail": outcome["detail"]}


def _connector(node_name, peer, port, connect_timeout, deadline, out, lock, proc_root="/proc", retry_deadline=None):
    """Connect to one peer, retrying until a final outcome or the deadline; with ``retry_deadline``, a peer
    not connected by then is tried once more after a pause (its row has ``retried``)."""
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
    first = None
    if retry_deadline is not None and not outcome["connected"]:
        attempts += 1
        outcome, first = _retry_once(node_name, peer, port, connect_timeout, outcome, retry_deadline)
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
    if first is not None:
        row["retried"] = first
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


def _start(sock, node_name, peers, port, connect_timeout, deadline, results, lock, proc_root, inbound,
           retry_deadline=None):
    """Start the listener (when ``sock``) and one connector thread per peer; returns (listener,
    listener_thread, connector threads)."""
    listener = listener_thread = None
    threads = []
    if sock is not None:
        expected = [p["name"] for p in peers] if inbound is None else [n for n in inbound if n != node_name]
        listener = _Listener(sock, node_name, expected, retry_deadline or deadline, max(connect_timeout, 0.5))
        listener_thread = threading.Thread(target=listener.run, daemon=True)
        listener_thread.start()
    for peer in peers:
        threads.append(threading.Thread(
            target=_connector, args=(node_name, peer, port, connect_timeout, deadline, results, lock, proc_root,
                                     retry_deadline), daemon=True))
    for thread in threads:
        thread.start()
    return listener, listener_thread, threads


def _finish(listener, listener_thread, threads, deadline):
    """Join the connectors, then stop the listener once its peers came; returns (incoming, misdirected)."""
    incoming, misdirected = [], []
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
    return incoming, misdirected


def _rows(results, lock, peers, node_name, port, window, started):
    """Every peer's row in ``peers`` order; a connector with no outcome counts as a timeout."""
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
    return rows


def probe(listen_addr, port, node_name, peers=(), window=8.0, connect_timeout=2.0, listen=True,
          check_in_use_only=False, proc_root="/proc", inbound=None, retry=False):
    """Run the probe on this node; returns the module's result (without ``changed``).

    ``inbound``: the names of the nodes that connect here (the listener is done once each has);
    the same as ``peers`` when None, as in a full mesh.  ``retry``: a peer not connected within the
    window is tried once more after a pause (the probe then takes up to ``retry_slack`` seconds more)."""
    started = time.monotonic()
    deadline = started + window
    end = deadline + retry_slack(connect_timeout) if retry else deadline
    peers = [dict(name=p["name"], addr=p["addr"]) for p in peers if p["name"] != node_name]
    if check_in_use_only:
        peers = []
        listen = True

    sock = None
    listen_info = {"status": "disabled", "detail": "listening switched off", "holder": None}
    if listen:
        sock, status, _, detail = _bind(listen_addr, port, max(128, 2 * len(peers)))
        listen_info = {"status": status, "detail": detail, "holder": None}

    results = []
    lock = threading.Lock()
    try:
        if sock is not None and check_in_use_only:
            sock.close()
            sock = None
        listener, listener_thread, threads = _start(sock, node_name, peers, port, connect_timeout, deadline,
                                                    results, lock, proc_root, inbound, end if retry else None)
        if listen_info["status"] == "in_use":
            # Runs while the connectors work; bounded by the same window.
            holder = find_port_holder(port, proc_root, addr=listen_addr, deadline=deadline)
            listen_info["holder"] = holder
            listen_info["detail"] = describe_holder(port, holder)
        incoming, misdirected = _finish(listener, listener_thread, threads, end)
    finally:
        if sock is not None:
            sock.close()

    rows = _rows(results, lock, peers, node_name, port, window, started)
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


# The options of the port_probe module (library/port_probe.py), and of the srun engine's port mesh step.
ARGUMENT_SPEC = dict(
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
    retry=dict(type="bool", default=False),
    lock=dict(type="dict", default={}),
)


def params_problem(params):
    """What the argument spec cannot say about the port_probe options ``params``: a message, or ""."""
    try:
        ipaddress.IPv4Address(params["listen_addr"])
    except ValueError:
        return ("listen_addr %r is not an IPv4 address (expected for example 198.18.1.1 or 0.0.0.0)"
                % params["listen_addr"])
    if not 1 <= params["port"] <= 65535:
        return "port %d is out of range, expected 1-65535" % params["port"]
    if params["window"] <= 0 or params["window"] > 600:
        return "window %s is out of range, expected more than 0 and at most 600 seconds" % params["window"]
    if params["connect_timeout"] <= 0:
        return "connect_timeout %s must be more than 0 seconds" % params["connect_timeout"]
    if not params["node_name"] or any(ch.isspace() for ch in params["node_name"]):
        return "node_name %r must be a non-empty name without spaces" % params["node_name"]
    seen = set()
    for peer in params["peers"]:
        name, addr = peer["name"], peer["addr"]
        if not name or any(ch.isspace() for ch in name):
            return "peer name %r must be a non-empty name without spaces" % name
        try:
            ipaddress.IPv4Address(addr)
        except ValueError:
            return ("peer %s has addr %r, expected an IPv4 address (names are not resolved so the probe stays "
                    "bounded in time)" % (name, addr))
        if name in seen:
            return "peer %s is listed twice in peers" % name
        seen.add(name)
    return ""


def module_main(module):
    """The port_probe module's body over ``module`` (an AnsibleModule, or the srun engine's step module)."""
    params = module.params
    problem = params_problem(params)
    if problem:
        module.fail_json(msg=problem)
    hold_for_call(module, params["lock"])
    result = probe(params["listen_addr"], params["port"], params["node_name"], params["peers"],
                   window=params["window"], connect_timeout=params["connect_timeout"], listen=params["listen"],
                   check_in_use_only=params["check_in_use_only"], proc_root=params["proc_root"],
                   inbound=params["inbound"], retry=params["retry"])
    module.exit_json(changed=False, **result)
