# -*- coding: utf-8 -*-
"""The generic readings: a socket error, a rendezvous that timed out, a collective that did not complete, an NCCL or
CUDA error.  They are symptoms: named only where no row of the other modules explains the log.

Where the log allows it, the socket rows tell the cases apart:

* ``Connection refused`` (ECONNREFUSED, errno 111): the host answered, nothing listens on that port (the peer or
  master is not up, or died) or a firewall REJECTs with a TCP reset.
* ``Connection timed out`` (ETIMEDOUT, errno 110): nothing answered at all: a firewall DROPs the packets, or the host
  is down or unreachable.
* ``No route to host`` (EHOSTUNREACH, errno 113) and ``Network is unreachable`` (ENETUNREACH, errno 101): the address
  is not reachable from the interface the node used (wrong interface or route), the host is down on the local
  segment, or a firewall REJECTs with icmp-host-prohibited (firewalld's default).
* torch's TCPStore retries refused connections until its timeout and then only says ``The client socket has timed out
  after ...``: that line alone cannot tell a DROP from a master that never listened, and the row says so.
"""

from __future__ import annotations

from cluster_preflight.capabilities.allreduce.signature_table import sig

_FIREWALL = "iptables -S / nft list ruleset on both ends"


def _to(facts):
    addr, port = facts.get("addr"), facts.get("port")
    if not addr:
        return ""
    return " to %s" % ("%s:%s" % (addr, port) if port else addr)


ROWS = (
    # "NCCL error in: .../ProcessGroupNCCL.cpp:1191, unhandled system error (run with NCCL_DEBUG=INFO ...)"
    sig("nccl_system_error", r"unhandled system error|ncclSystemError",
        "NCCL hit a failing system call or library call (socket, shared memory, IB verbs): the NCCL WARN "
        "line just before it (or the 'Last error:' line) names the call",
        "read the 'NCCL WARN' lines of this rank log; common causes: /dev/shm too small in a container "
        "(give it --shm-size or --ipc=host), NCCL_SOCKET_IFNAME naming an interface without an address, "
        "RDMA devices not visible in the container, a peer that died", "fail", "nccl"),
    sig("nccl_internal_error", r"ncclInternalError|internal error - please report",
        "NCCL reported an internal error: the 'Last error:' line (or the NCCL WARN line before it) names what failed",
        "read the 'Last error:' / 'NCCL WARN' lines of this rank log; run with NCCL_DEBUG=INFO for the failing call",
        "fail", "nccl"),
    sig("nccl_invalid_usage", r"ncclInvalidUsage|invalid usage",
        "NCCL reported invalid usage: the 'Last error:' line names it (two ranks on one GPU, mismatched collectives, "
        "a communicator used after an error)",
        "read the 'Last error:' line of this rank log", "fail", "nccl"),
    sig("nccl_cuda_error", r"unhandled cuda error|ncclUnhandledCudaError",
        "NCCL got an error from the CUDA runtime (driver, device or peer-to-peer access)",
        "run nvidia-smi and read dmesg for Xid errors on this node; check the driver matches the CUDA "
        "runtime of torch; NCCL_P2P_DISABLE=1 tells a P2P/ACS problem apart", "fail", "nccl"),
    sig("nccl_watchdog_timeout", r"Watchdog caught collective operation timeout",
        "an NCCL collective did not finish within the timeout: a rank on some node is hung, dead or much "
        "slower (the rank that did not reach the collective is the cause, not this one)",
        "read the stacks (<node>.stacks.txt) of every node; the node whose rank is not in the collective is "
        "the suspect", "warn", "collective"),
    # Sockets: torch c10d ("(errno: 111 - Connection refused)"), NCCL ("Connect to ... failed : Connection
    # refused"), gloo and python ("[Errno 111] Connection refused").
    sig("connection_refused", r"Connection refused|errno:? 111\b|ECONNREFUSED",
        lambda facts: ("a connection%s was refused: the host answered but nothing listens on that port (the master's "
                       "store or the peer's process is not up yet, or died), or a firewall REJECTs it with a TCP reset"
                       % _to(facts)),
        "check that the master's torchrun is running and listens on the rendezvous port (ss -ltnp on the "
        "master; see port_mesh.reach), that no other job holds the port, and the firewall's REJECT rules "
        "(%s)" % _FIREWALL, "fail", "network"),
    sig("connection_timed_out", r"Connection timed out|errno:? 110\b|ETIMEDOUT",
        lambda facts: ("a connection attempt%s got no answer at all: a firewall DROPs the packets, or the host is down "
                       "or unreachable on that address" % _to(facts)),
        "check the firewall's DROP rules on both ends (%s), that the peer is up and answers on the chosen "
        "interface (ping its address from this node), and security groups between the nodes" % _FIREWALL,
        "fail", "network"),
    sig("no_route_to_host", r"No route to host|errno:? 113\b|EHOSTUNREACH",
        lambda facts: ("no route%s from the interface used: the wrong interface (or address family) was chosen, the "
                       "route is missing, the host is down on the local segment, or a firewall rejects with "
                       "icmp-host-prohibited" % _to(facts)),
        "check `ip route get <peer address>` on this node, that NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME name "
        "the inter-node interface (see nic_discovery.common_interface), and the firewall's REJECT rules "
        "(firewalld rejects with icmp-host-prohibited)", "fail", "network"),
    sig("network_unreachable", r"Network is unreachable|errno:? 101\b|ENETUNREACH",
        lambda facts: ("the peer's network%s is not reachable from this node at all: no route to that subnet (wrong "
                       "interface, or an IPv6 address without IPv6 routing)" % _to(facts)),
        "check `ip route get <peer address>`; set preflight_socket_ifname to the interface every node "
        "shares, or give that interface its address and route", "fail", "network"),
    # gloo: "[.../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:37574. This is
    # typically caused by a remote worker crashing."  "Connection reset by peer" from the socket layer.
    sig("gloo_peer_closed", r"Connection (reset|closed) by (remote )?peer",
        lambda facts: ("the peer%s closed the connection in the middle of a collective: its process crashed, was "
                       "killed or its node went away (a symptom here, the cause is on the peer)"
                       % (" %s" % facts["addr"] if facts.get("addr") else "")),
        "look at the peer named in the line: its rank log, its <node>.stacks.txt and dmesg (OOM kills)",
        "warn", "collective"),
    # gloo: "[.../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation to complete"
    sig("gloo_timeout", r"Timed out waiting \d+ ?ms for (recv|send) operation",
        "a gloo send/receive did not complete within the timeout: the peer is hung, dead, or too slow "
        "(a symptom here, the cause is the rank that did not send or receive)",
        "read the stacks of the other nodes' ranks (<node>.stacks.txt); the rank stuck before the "
        "collective is the suspect; a slow or lossy link shows in port_mesh and the bandwidth check",
        "warn", "collective"),
    # TCPStore client: "The client socket has timed out after 3000ms while trying to connect to (127.0.0.1, 29981)."
    # (torch retries a refused connection until then, so the line alone cannot tell the causes apart.)
    sig("store_connect_timeout", r"client socket has timed out after",
        lambda facts: ("this node could not reach the rendezvous store on the master%s in time: the master's torchrun "
                       "was not listening yet or at all (a refused connection is retried until this timeout), or a "
                       "firewall DROPs the rendezvous port, or the master address is wrong for this node - the line "
                       "alone cannot tell which" % _to(facts)),
        "check the master's torchrun started (its log), that the rendezvous port is open from this node "
        "(port_mesh.reach; nc -vz <master> <port>), and the firewall on the master (%s)" % _FIREWALL,
        "fail", "rendezvous"),
    # TCPStore server: "Timed out after 4 seconds waiting for clients. 1/2 clients joined."
    sig("store_wait_timeout", r"Timed out after \d+ seconds waiting for clients",
        "the master's rendezvous store waited in vain: not every node joined (a node did not start its "
        "torchrun or cannot reach the master)",
        "find the node(s) that did not join: their torchrun logs and port_mesh.reach toward the master",
        "fail", "rendezvous"),
    sig("rendezvous_timeout", r"RendezvousTimeoutError|Timed out waiting for (the )?rendezvous",
        "the elastic rendezvous timed out: not every node joined in time",
        "find the node(s) that did not join: their torchrun logs and port_mesh.reach toward the rendezvous "
        "endpoint", "fail", "rendezvous"),
    # "RuntimeError: CUDA error: an illegal memory access was encountered" ... "consider passing CUDA_LAUNCH_BLOCKING=1"
    sig("cuda_error", r"CUDA error:|CUDA_LAUNCH_BLOCKING=1|CUDA failure|Cuda failure",
        "a CUDA error: kernels run asynchronously, so the traceback may point at a later call than the one "
        "that failed",
        "re-run the failing job with CUDA_LAUNCH_BLOCKING=1 to get the failing call (not with torch < 2.1 / "
        "NCCL < 2.17: that combination hangs, NVIDIA/nccl issue 750); check nvidia-smi and dmesg for Xid "
        "errors", "fail", "cuda"),
)
