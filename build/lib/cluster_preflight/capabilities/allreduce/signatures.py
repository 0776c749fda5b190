# -*- coding: utf-8 -*-
"""Known failure signatures of a torch all-reduce, in one table, and the matcher over log lines.

The gate reads a node's torchrun log and its ranks' own log files (``log`` and
``rank_logs`` of the ``allreduce`` module) and names what it recognises: the
cause in words and the fix.  Every signature is one row of :data:`SIGNATURES`;
nothing else in the preflight matches these lines, so a new signature is one
new row plus a recorded line in ``tests/unit/test_signatures.py``.

A row: ``id``, a regular expression searched in each line, the ``cause``, the
``fix``, the ``status`` it gives a node (the check contract's ``pass``/``warn``/
``fail``; ``pass`` rows are information such as the transport NCCL chose), the
``category`` and ``needs_fabric``: the row's status holds only on a node that
has a fabric (InfiniBand, RoCE, EFA, ...); elsewhere the line is information
(NCCL on sockets is right on an Ethernet-only cluster).

Where the log allows it, the network rows tell the cases apart:

* ``Connection refused`` (ECONNREFUSED, errno 111): the host answered, nothing
  listens on that port (the peer or master is not up, or died) or a firewall
  REJECTs with a TCP reset.
* ``Connection timed out`` (ETIMEDOUT, errno 110): nothing answered at all: a
  firewall DROPs the packets, or the host is down or unreachable.
* ``No route to host`` (EHOSTUNREACH, errno 113) and ``Network is unreachable``
  (ENETUNREACH, errno 101): the address is not reachable from the interface the
  node used (wrong interface or route), the host is down on the local segment,
  or a firewall REJECTs with icmp-host-prohibited (firewalld's default).
* torch's TCPStore retries refused connections until its timeout and then only
  says ``The client socket has timed out after ...``: that line alone cannot tell
  a DROP from a master that never listened, and the row says so.
"""

from __future__ import annotations

import collections
import re

# One finding per signature; the line is cut to this many characters.
LINE_MAX = 300

Signature = collections.namedtuple("Signature", "id regex cause fix status category needs_fabric")


def _sig(sig_id, pattern, cause, fix, status, category, needs_fabric=False):
    return Signature(sig_id, re.compile(pattern), cause, fix, status, category, needs_fabric)


_FIREWALL = "iptables -S / nft list ruleset on both ends"
SIGNATURES = (
    # Which transport NCCL chose (NCCL_DEBUG=INFO, init): "NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>",
    # "NET/Socket : Using [0]eth0:10.0.0.1<0>", "Using network IB".
    _sig("nccl_net_ib", r"NET/IB\s*:\s*Using\s+\[\d+\]|Using network IB\b",
         "NCCL uses the RDMA fabric (NET/IB: InfiniBand or RoCE verbs)", "", "pass", "transport"),
    _sig("nccl_net_ofi", r"NET/OFI\b.*\b(Selected|Using)\b|Using network (AWS )?Libfabric\b",
         "NCCL uses the fabric through the aws-ofi-nccl plugin (NET/OFI: EFA)", "", "pass", "transport"),
    _sig("nccl_net_socket", r"NET/Socket\s*:\s*Using\s+\[\d+\]|Using network Socket\b",
         "NCCL moves inter-node data over TCP sockets (NET/Socket) although this node has a fabric: the "
         "collectives run at Ethernet speed or slower",
         "find why NCCL did not take the fabric: NCCL_IB_DISABLE=1 or NCCL_NET=Socket in the job's environment, "
         "no libibverbs/rdma-core (or no /dev/infiniband) in the job's container, RDMA ports not ACTIVE "
         "(ibstat), or NCCL_IB_HCA naming the wrong device; the NCCL INFO lines before 'NET/Socket' say which",
         "warn", "transport", needs_fabric=True),
    _sig("nccl_ib_no_device", r"NET/IB\s*:\s*No device found",
         "NCCL found no usable RDMA device although this node has a fabric",
         "check that the job can open /dev/infiniband/uverbs* and load libibverbs (rdma-core in the job's "
         "container), that the ports are ACTIVE (ibstat), and that NCCL_IB_HCA matches the devices",
         "warn", "transport", needs_fabric=True),
    # "NET/IB : Got completion from peer 10.0.0.1<42133> with error 12, opcode 32753, len 0, vendor err 129"
    _sig("nccl_ib_error_12", r"Got completion from peer .* error 12\b",
         "InfiniBand transport retries exhausted (IBV_WC_RETRY_EXC_ERR, error 12): the peer's port cannot be "
         "reached over the fabric - the two ports are not in the same partition (P_Key) or subnet, a port or "
         "cable is down or flapping, or the peer process is gone",
         "check both ends with ibstat / ibv_devinfo (ACTIVE, same subnet prefix), the partition membership of "
         "both ports on the subnet manager (smpquery pkeys / the SM's partitions.conf), NCCL_IB_PKEY, and the "
         "cables (ibdiagnet); for RoCE, NCCL_IB_GID_INDEX and the VLAN", "fail", "fabric"),
    # "NCCL error in: .../ProcessGroupNCCL.cpp:1191, unhandled system error (run with NCCL_DEBUG=INFO ...)"
    _sig("nccl_system_error", r"unhandled system error|ncclSystemError",
         "NCCL hit a failing system call or library call (socket, shared memory, IB verbs): the NCCL WARN "
         "line just before it names the call",
         "read the 'NCCL WARN' lines of this rank log; common causes: /dev/shm too small in a container "
         "(give it --shm-size or --ipc=host), NCCL_SOCKET_IFNAME naming an interface without an address, "
         "RDMA devices not visible in the container, a peer that died", "fail", "nccl"),
    _sig("nccl_cuda_error", r"unhandled cuda error|ncclUnhandledCudaError",
         "NCCL got an error from the CUDA runtime (driver, device or peer-to-peer access)",
         "run nvidia-smi and read dmesg for Xid errors on this node; check the driver matches the CUDA "
         "runtime of torch; NCCL_P2P_DISABLE=1 tells a P2P/ACS problem apart", "fail", "nccl"),
    _sig("nccl_watchdog_timeout", r"Watchdog caught collective operation timeout",
         "an NCCL collective did not finish within the timeout: a rank on some node is hung, dead or much "
         "slower (the rank that did not reach the collective is the cause, not this one)",
         "read the stacks (<node>.stacks.txt) of every node; the node whose rank is not in the collective is "
         "the suspect", "warn", "collective"),
    # Sockets: torch c10d ("(errno: 111 - Connection refused)"), NCCL ("Connect to ... failed : Connection
    # refused"), gloo and python ("[Errno 111] Connection refused").
    _sig("connection_refused", r"Connection refused|errno:? 111\b|ECONNREFUSED",
         "a connection was refused: the host answered but nothing listens on that port (the master's store or "
         "the peer's process is not up yet, or died), or a firewall REJECTs it with a TCP reset",
         "check that the master's torchrun is running and listens on the rendezvous port (ss -ltnp on the "
         "master; see port_mesh.reach), that no other job holds the port, and the firewall's REJECT rules "
         "(%s)" % _FIREWALL, "fail", "network"),
    _sig("connection_timed_out", r"Connection timed out|errno:? 110\b|ETIMEDOUT",
         "a connection attempt got no answer at all: a firewall DROPs the packets, or the host is down or "
         "unreachable on that address",
         "check the firewall's DROP rules on both ends (%s), that the peer is up and answers on the chosen "
         "interface (ping its address from this node), and security groups between the nodes" % _FIREWALL,
         "fail", "network"),
    _sig("no_route_to_host", r"No route to host|errno:? 113\b|EHOSTUNREACH",
         "no route to the peer's address from the interface used: the wrong interface (or address family) "
         "was chosen, the route is missing, the host is down on the local segment, or a firewall rejects "
         "with icmp-host-prohibited",
         "check `ip route get <peer address>` on this node, that NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME name "
         "the inter-node interface (see nic_discovery.common_interface), and the firewall's REJECT rules "
         "(firewalld rejects with icmp-host-prohibited)", "fail", "network"),
    _sig("network_unreachable", r"Network is unreachable|errno:? 101\b|ENETUNREACH",
         "the peer's network is not reachable from this node at all: no route to that subnet (wrong "
         "interface, or an IPv6 address without IPv6 routing)",
         "check `ip route get <peer address>`; set preflight_socket_ifname to the interface every node "
         "shares, or give that interface its address and route", "fail", "network"),
    # gloo: "[.../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:37574. This is
    # typically caused by a remote worker crashing."  "Connection reset by peer" from the socket layer.
    _sig("gloo_peer_closed", r"Connection (reset|closed) by peer",
         "the peer closed the connection in the middle of a collective: its process crashed, was killed or "
         "its node went away (a symptom here, the cause is on the peer)",
         "look at the peer named in the line: its rank log, its <node>.stacks.txt and dmesg (OOM kills)",
         "warn", "collective"),
    # gloo: "[.../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation to complete"
    _sig("gloo_timeout", r"Timed out waiting \d+ ?ms for (recv|send) operation",
         "a gloo send/receive did not complete within the timeout: the peer is hung, dead, or too slow "
         "(a symptom here, the cause is the rank that did not send or receive)",
         "read the stacks of the other nodes' ranks (<node>.stacks.txt); the rank stuck before the "
         "collective is the suspect; a slow or lossy link shows in port_mesh and the bandwidth check",
         "warn", "collective"),
    # TCPStore client: "The client socket has timed out after 3000ms while trying to connect to (127.0.0.1, 29981)."
    # (torch retries a refused connection until then, so the line alone cannot tell the causes apart.)
    _sig("store_connect_timeout", r"client socket has timed out after",
         "this node could not reach the rendezvous store on the master in time: the master's torchrun was not "
         "listening yet or at all (a refused connection is retried until this timeout), or a firewall DROPs "
         "the rendezvous port, or the master address is wrong for this node",
         "check the master's torchrun started (its log), that the rendezvous port is open from this node "
         "(port_mesh.reach; nc -vz <master> <port>), and the firewall on the master (%s)" % _FIREWALL,
         "fail", "rendezvous"),
    # TCPStore server: "Timed out after 4 seconds waiting for clients. 1/2 clients joined."
    _sig("store_wait_timeout", r"Timed out after \d+ seconds waiting for clients",
         "the master's rendezvous store waited in vain: not every node joined (a node did not start its "
         "torchrun or cannot reach the master)",
         "find the node(s) that did not join: their torchrun logs and port_mesh.reach toward the master",
         "fail", "rendezvous"),
    # TCPStore server on a taken port.  torch >= 2.4: "torch.distributed.DistNetworkError: The server socket has
    # failed to listen on any local network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE,
    # message: address already in use" (recorded here, 2.13); torch 2.0-2.3: "[W socket.cpp:426] [c10d] The server
    # socket has failed to bind to [::]:29500 (errno: 98 - Address already in use)." then "[E socket.cpp:462]
    # [c10d] The server socket has failed to listen on any local network address."
    _sig("store_port_in_use", r"server socket has failed to (listen on any local network address|bind to)|"
                              r"EADDRINUSE|[Aa]ddress already in use|errno:? 98\b",
         "the master's rendezvous store could not listen: another process already holds the master port on this "
         "node (EADDRINUSE) - another preflight run, a training job's torchrun, or a store left behind by an "
         "earlier run that did not exit",
         "see which process holds it on this node: ss -ltnp 'sport = :PORT' (PORT is the port in the line, "
         "preflight_master_port); wait for that job or run to end, stop a leftover process, or choose another "
         "preflight_master_port (allreduce.master_port says whether it was free when the run was planned; "
         "if it was, it was taken between the plan and the launch)", "fail", "rendezvous"),
    _sig("rendezvous_timeout", r"RendezvousTimeoutError|Timed out waiting for (the )?rendezvous",
         "the elastic rendezvous timed out: not every node joined in time",
         "find the node(s) that did not join: their torchrun logs and port_mesh.reach toward the rendezvous "
         "endpoint", "fail", "rendezvous"),
    # "RuntimeError: CUDA error: an illegal memory access was encountered" ... "consider passing CUDA_LAUNCH_BLOCKING=1"
    _sig("cuda_error", r"CUDA error:|CUDA_LAUNCH_BLOCKING=1",
         "a CUDA error: kernels run asynchronously, so the traceback may point at a later call than the one "
         "that failed",
         "re-run the failing job with CUDA_LAUNCH_BLOCKING=1 to get the failing call (not with torch < 2.1 / "
         "NCCL < 2.17: that combination hangs, NVIDIA/nccl issue 750); check nvidia-smi and dmesg for Xid "
         "errors", "fail", "cuda"),
)
BY_ID = {signature.id: signature for signature in SIGNATURES}
TRANSPORTS = {"nccl_net_ib": "NET/IB", "nccl_net_ofi": "NET/OFI", "nccl_net_socket": "NET/Socket"}
# torchrun's --tee prefix "[node1:0]:" and glog's "[E1123 15:44:16.477 socket.cpp:1028] " carry no meaning here.
_PREFIX_RE = re.compile(r"^\[[^\]\s]+:\d+\]:")


def _lines(lines_or_text):
    if isinstance(lines_or_text, str):
        return lines_or_text.splitlines()
    lines = []
    for item in lines_or_text or ():
        lines.extend(str(item or "").splitlines())
    return lines


def match(lines_or_text, fabric=None, categories=None, signatures=SIGNATURES):
    """The signatures found in ``lines_or_text`` (a text, or a list of lines or texts).

    One finding per signature (the first line that matched, ``count`` lines in
    all), in table order: ``{id, line, cause, fix, status, category, count}``.
    ``fabric``: whether the node has a fabric; a ``needs_fabric`` row gives its
    status only when true, else it is information (``pass``).  ``categories``
    limits the rows (for example ``("transport",)`` on a healthy run).
    """
    rows = [sig for sig in signatures if categories is None or sig.category in categories]
    found = {}
    for raw in _lines(lines_or_text):
        line = _PREFIX_RE.sub("", raw.strip()).strip()
        if not line:
            continue
        for sig in rows:
            if sig.regex.search(line):
                if sig.id in found:
                    found[sig.id]["count"] += 1
                else:
                    found[sig.id] = {"line": line[:LINE_MAX], "count": 1}
    if "nccl_net_ib" in found or "nccl_net_ofi" in found:
        # NCCL took the fabric: socket lines then come from a transport it did not use.
        found.pop("nccl_net_socket", None)
        found.pop("nccl_ib_no_device", None)
    findings = []
    for sig in rows:
        if sig.id not in found:
            continue
        status, cause, fix = sig.status, sig.cause, sig.fix
        if sig.needs_fabric and not fabric:
            status, fix = "pass", ""
            cause = cause.split(" although")[0] + " (no fabric on this node: expected)"
        findings.append(dict(found[sig.id], id=sig.id, cause=cause, fix=fix, status=status, category=sig.category))
    return findings


def transport(findings):
    """The NCCL transport the findings show (``NET/IB``, ``NET/OFI``, ``NET/Socket``), or None."""
    for finding in findings:
        if finding["id"] in TRANSPORTS:
            return TRANSPORTS[finding["id"]]
    return None
