# -*- coding: utf-8 -*-
"""Signatures of the job's context on a node: network interfaces, name resolution, the master port, /dev/shm and
the locked-memory limit (what the ``job_env`` checks look at before the job)."""

from __future__ import annotations

from cluster_preflight.capabilities.allreduce.signature_table import sig
from cluster_preflight.capabilities.allreduce.signature_table.facts import (
    FAMILIES, GAI_NAMES, GAI_UNRESOLVED, errno_text, interface_kind, looks_like_interface, loopback_fault,
    wrong_interface)

# -- network interfaces --------------------------------------------------------------------------------------------


def _no_interface_cause(facts):
    name = facts.get("ifname") or facts.get("socket_ifname")
    how = ""
    if facts.get("family"):
        how = (" (NCCL tried to connect to an address it never filled in: family %s is neither IPv4 nor IPv6)"
               % facts["family"])
    elif facts.get("err"):
        how = " (NCCL could not even create a socket: %s)" % facts["err"]
    if name:
        return ("the job names interface %s for its sockets (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME) and no "
                "interface of that name with an address exists on this node%s: it is named differently here "
                "(interface names differ between nodes), it is down, or it has no IP address" % (name, how))
    return ("NCCL / gloo found no usable network interface for the job's sockets on this node%s: "
            "NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME names an interface this node does not have (names differ "
            "between nodes) or excludes every interface, or the node (or the job's container) has no interface "
            "with an IP address besides loopback; the NCCL INFO line 'NCCL_SOCKET_IFNAME set to ...' (NCCL_DEBUG=INFO) "
            "tells the first from the last" % how)


def _no_interface_fix(facts):
    name = facts.get("ifname") or facts.get("socket_ifname") or "the interface"
    return ("on this node: `ip -br addr` lists the interfaces with their addresses; name in NCCL_SOCKET_IFNAME / "
            "GLOO_SOCKET_IFNAME one that every node has up with an address on the peers' subnet (a prefix such as "
            "`eth`, a list `eno1,eth0` when names differ between nodes, or an exclusion `^lo,docker`), or give %s its "
            "address; job_env.socket_ifname checks the job's setting on every node before the job" % name)


def _wrong_interface_cause(facts):
    where = facts.get("ifname")
    addr = facts.get("addr")
    what = "%s (%s)" % (where, addr) if where else addr
    return ("the job's sockets use %s, a %s interface or address: peers on other nodes cannot reach it (a container "
            "bridge's address is private to its node, a link-local address is not routed, loopback is the node "
            "itself), so the connections between nodes fail" % (what, interface_kind(facts)))


def _family_cause(facts):
    first, second = facts.get("fam1"), facts.get("fam2")
    families = ""
    if first and second:
        families = ": %s vs %s" % (FAMILIES.get(first, first), FAMILIES.get(second, second))
    return ("two ranks hold addresses of different families%s - on a dual-stack cluster one node's name (or "
            "interface) resolved to an IPv6 address and another's to IPv4; gloo needs one family on every rank"
            % families)


# -- name resolution ------------------------------------------------------------------------------------------------


def _loopback_cause(facts):
    if facts.get("fallback"):
        return ("torch could not resolve this node's hostname to an address of the node and gloo fell back to the "
                "loopback address: ranks on other nodes are told to reach this rank at 127.0.0.1, which is "
                "themselves")
    addr, port = facts.get("addr"), facts.get("port")
    target = "%s:%s" % (addr, port) if port else addr
    err = facts.get("err") or errno_text(facts, "the connection failed")
    text = ("%s is a loopback address: a rank was told to reach a peer at %s, so it connected to its own node (%s) - "
            "the peer's node resolves its own hostname to a loopback address (Debian's `127.0.1.1 <hostname>` line "
            "in /etc/hosts, or a container's /etc/hosts with only 127.0.0.1) and gloo / c10d advertise the address "
            "the hostname resolves to" % (addr, target, err))
    if facts.get("nodes") is None:
        text += ("; when the address is the master's, MASTER_ADDR or the rendezvous name resolves to loopback on "
                 "this node; on a job that runs on one node only, the same line means the peer's process is not up "
                 "or died (its own log says which)")
    return text


def _loopback_fix(facts):
    return ("on every node: `getent hosts $(hostname)` must answer with the node's routable address, never 127.x or "
            "::1 - replace the `127.0.1.1 <hostname>` line of /etc/hosts with the node's address (or drop it where "
            "DNS answers), or set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME to the inter-node interface so the address "
            "comes from it; the master's name must resolve likewise on every node; job_env.hostname and "
            "job_env.master_name check both before the job")


def _unresolved_cause(facts):
    name = facts.get("name") or "a host name"
    code = facts.get("gai")
    why = facts.get("gai_text") or ""
    detail = ", ".join(part for part in (why.strip(), "gai error %s %s" % (code, GAI_NAMES.get(code, "")) if code
                                         else "") if part).strip()
    return ("the name %s does not resolve on this node%s: the node's own hostname has no entry in /etc/hosts or DNS "
            "(torch and gloo look the hostname up to find their own address), or the master / rendezvous name is "
            "unknown here" % (name, " (%s)" % detail if detail else ""))


def _unresolved_fix(facts):
    name = facts.get("name") or "<name>"
    return ("on this node: `getent hosts %s` must answer with the node's (or the master's) routable address: add it "
            "to /etc/hosts (the node's own address, not 127.0.1.1) or DNS, or give the master as an address "
            "(MASTER_ADDR, --rdzv-endpoint); job_env.hostname and job_env.master_name check every node before the "
            "job" % name)


def _c10d_unresolved(facts):
    return facts.get("gai") in GAI_UNRESOLVED


def _gloo_name(facts):
    cond = facts.get("gloo_cond")
    return cond == "rp" or (cond is None and not looks_like_interface(facts.get("name")))


def _gloo_interface(facts):
    cond = facts.get("gloo_cond")
    return cond == "ifa" or (cond is None and looks_like_interface(facts.get("ifname")))


# -- the master port --------------------------------------------------------------------------------------------


def _port_cause(facts):
    port = facts.get("port")
    return ("the master's rendezvous store could not listen: another process already holds the master port%s on "
            "this node (EADDRINUSE) - a second job started on this node with the same (default) master port, "
            "another preflight run, a training job's torchrun, or a store left behind by an earlier run that did not "
            "exit; which process holds it tells them apart" % (" %s" % port if port else ""))


def _port_fix(facts):
    port = facts.get("port")
    return ("see which process holds it on this node: ss -ltnp 'sport = :PORT' (PORT is the port in the line%s, "
            "preflight_master_port for the gate); wait for that job or run to end, stop a leftover process (its job "
            "is over), or choose another port (each job its own MASTER_PORT, another preflight_master_port); "
            "allreduce.master_port says whether it was free when the run was planned (if it was, it was taken between "
            "the plan and the launch)" % (": %s here" % port if port else ""))


# -- /dev/shm ---------------------------------------------------------------------------------------------------


def _shm_full(facts):
    return facts.get("errno") in (None, "28") and "denied" not in (facts.get("err") or "")


def _shm_cause(facts):
    segment = facts.get("segment")
    size = facts.get("size")
    what = "its shared-memory segment%s%s" % (" %s" % segment if segment else "",
                                                " of %s bytes" % size if size else "")
    return ("NCCL could not create %s in /dev/shm (%s): /dev/shm is too small or full - a container's default is 64 MB "
            "(Docker) or less, NCCL needs segments of this size for every pair of local GPUs, and files of dead jobs "
            "(/dev/shm/nccl-*) fill it" % (what, facts.get("err", "").strip() or "no space left on device"))


def _shm_unusable_cause(facts):
    err = (facts.get("err") or errno_text(facts, "an error")).strip()
    if facts.get("attach"):
        return ("a rank could not attach to the shared-memory segment %s a peer on this node created (%s): the ranks "
                "of the node do not share one /dev/shm (separate containers without --ipc=host), or it was removed "
                "under them" % (facts.get("segment", ""), err))
    return ("NCCL could not create its shared-memory segment %s (%s): /dev/shm is not writable by the job's user, or "
            "is not a usable tmpfs in the job's context" % (facts.get("segment", ""), err))


_SHM_FIX = ("give the job's /dev/shm room for NCCL: `docker run --shm-size=1g` (or --ipc=host), a Kubernetes emptyDir "
            "with medium: Memory mounted on /dev/shm, or a larger tmpfs; remove stale /dev/shm/nccl-* files of dead "
            "jobs; NCCL_SHM_DISABLE=1 only to confirm (slower); job_env.dev_shm checks the room for the node's GPUs and "
            "that the job user may write it, before the job")
_SHM_SHAPES = (
    r"posix_fallocate failed\s*:?\s*(?P<err>[A-Za-z][\w ]*)?",
    r"Error while creating shared memory segment\s+(?P<segment>\S+)\s+\(size (?P<size>\d+)\)"
    r"(?:,\s*error:\s*(?P<err>[^(\n]+?)\s*\((?P<errno>\d+)\))?",
    r"failed to extend (?P<segment>\S+) to (?P<size>\d+) bytes(?:,\s*error:\s*(?P<err>[^(\n]+?)\s*\((?P<errno>\d+)\))?",
    r"insufficient shared memory \(shm\)",
)

# -- locked memory ----------------------------------------------------------------------------------------------


def _memlock_cause(facts):
    if facts.get("limit"):
        return ("libibverbs warns that the locked-memory limit (RLIMIT_MEMLOCK) is %s bytes: RDMA buffers must be "
                "pinned, and registrations beyond it fail (ibv_reg_mr: Cannot allocate memory)" % facts["limit"])
    call = facts.get("call") or "an ibv_* call"
    return ("%s failed with ENOMEM (Cannot allocate memory): the RDMA library could not pin memory - the job's "
            "locked-memory limit (`ulimit -l` in the job's own session: limits.conf, what Slurm propagates, a "
            "container's default) is too low; when `ulimit -l` inside the job says unlimited, the NIC ran out of "
            "registration resources instead (very large jobs)" % call)


_MEMLOCK_FIX = ("raise the job user's locked-memory limit to unlimited: `* soft memlock unlimited` and `* hard memlock "
                "unlimited` in /etc/security/limits.d, LimitMEMLOCK=infinity for slurmd (and PropagateResourceLimits), "
                "`docker run --ulimit memlock=-1`, then a new login; check `ulimit -l` inside the job itself (srun, "
                "mpirun, the container); job_env.memlock checks the job's context before the job")

ROWS = (
    sig("socket_interface_missing", (
        r"[Nn]o (?:usable |socket |IP |listening |NCCL_SOCKET_IFNAME )*interfaces? (?:was )?found",
        r"connecting to address\s+with family (?P<family>\d+) is neither AF_INET",
        r"Socket creation failed\s*:\s*(?P<err>Address family not supported by protocol)",
        r"(?:(?P<gloo_cond>rp|ifa) != nullptr\.?\s*)?Unable to find address for:?\s*(?P<ifname>[^\s\]]+)"),
        _no_interface_cause, _no_interface_fix, "fail", "interface", level="cause",
        when=lambda facts: "ifname" not in facts or _gloo_interface(facts)),
    sig("address_family_mismatch", (
        r"ss_family == \w+\.ss_family\.?\s*(?P<fam1>\d+) vs (?P<fam2>\d+)",
        r"[Aa]ddress famil(?:y|ies) (?:mismatch|do not match)"),
        _family_cause,
        "make every node resolve the job's names to one family: /etc/hosts or DNS with IPv4 (or IPv6) addresses "
        "only for the nodes' names, or GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME naming an interface with an address "
        "of the same family on every node; job_env.address_family compares the family on every node before the job",
        "fail", "interface", level="cause"),
    sig("hostname_loopback", (
        r"connect \[(?P<addr>[^\]]+)\]:(?P<port>\d+):\s*(?P<err>[A-Z][\w ]+)",
        r"(?P<err>Connection refused|timed out)[^\n]*?remote=\[(?P<addr>[^\]]+)\]:(?P<port>[\w<>]+)",
        r"client socket has (?:failed to connect to|timed out after \S+ while trying to connect to) "
        r"\(?\[?(?P<addr>[^\]\s,()]+)\]?(?::|, )(?P<port>\d+)\)?",
        r"Connect to (?P<addr>[^<\s]+)<(?P<port>\d+)> failed",
        r"connect\(\) to \[?(?P<addr>[\d.]+|[0-9a-fA-F:]+)\]? failed",
        r"(?P<fallback>Unable to resolve hostname to a \(local\) address|Using the loopback address as fallback)"),
        _loopback_cause, _loopback_fix, "fail", "name_resolution", level="cause",
        when=lambda facts: (facts.get("fallback") and facts.get("nodes") != 1) or
        (not facts.get("fallback") and loopback_fault(facts)),
        on_failure=lambda facts: bool(facts.get("fallback"))),
    sig("name_unresolvable", (
        r"addresses of \((?P<name>[^,()]+), (?P<port>\d+)\) cannot be retrieved \(gai error: (?P<gai>-?\d+)"
        r"(?: - (?P<gai_text>[^)]+))?\)",
        r"(?:(?P<gloo_cond>rp|ifa) != nullptr\.?\s*)?Unable to find address for:?\s*(?P<name>[^\s\]]+)",
        r"(?P<gai_text>Name or service not known|Temporary failure in name resolution|nodename nor servname provided|"
        r"Non-recoverable failure in name resolution|getaddrinfo failed)"),
        _unresolved_cause, _unresolved_fix, "fail", "name_resolution", level="cause",
        when=lambda facts: (_c10d_unresolved(facts) if "gai" in facts else
                            _gloo_name(facts) if "name" in facts else True)),
    sig("socket_wrong_interface", (
        r"(?:Bootstrap|NET/Socket)\s*:\s*Using\s+(?:\[\d+\])?(?P<ifname>[^\s:\[\]]+):(?P<addr>[^<\s]+)<",
        r"NET : Using interface (?P<ifname>[^\s:]+):(?P<addr>[^<\s]+)<",
        r"(?:Connect to|connect\(\) to) (?P<addr>172\.17\.0\.1)\b"),
        _wrong_interface_cause,
        "set NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME to the interface the nodes reach each other on (the one "
        "nic_discovery.common_interface names), or exclude the virtual ones (`^lo,docker,veth,virbr`); in a container, "
        "--network=host; job_env.socket_ifname checks the job's setting on every node before the job",
        "fail", "interface", level="cause", when=wrong_interface,
        on_failure=lambda facts: "ifname" in facts),
    sig("store_port_in_use", (
        r"server socket has failed to bind to (?P<addr>\[?[^\s\]]*\]?):(?P<port>\d+)",
        r"server socket has failed to listen on any local network address(?:\. port: (?P<port>\d+))?",
        r"EADDRINUSE|[Aa]ddress already in use|errno:? 98\b"),
        _port_cause, _port_fix, "fail", "port", level="cause"),
    sig("shm_too_small", _SHM_SHAPES, _shm_cause, _SHM_FIX, "fail", "shm", level="cause", when=_shm_full),
    sig("shm_unusable", _SHM_SHAPES[:3] + (
        r"(?P<attach>Error while attaching to shared memory segment)\s+(?P<segment>\S+)\s+\(size (?P<size>\d+)\)"
        r"(?:,\s*error:\s*(?P<err>[^(\n]+?)\s*\((?P<errno>\d+)\))?",),
        _shm_unusable_cause, _SHM_FIX, "fail", "shm", level="cause",
        when=lambda facts: bool(facts.get("attach")) or not _shm_full(facts)),
    sig("ib_memlock", (
        r"(?P<call>ibv_\w+)\S*\s+failed\b[^\n]*?(?:Cannot allocate memory|ENOMEM|errno:? ?12\b)",
        r"RLIMIT_MEMLOCK is (?P<limit>\d+) bytes"),
        _memlock_cause, _MEMLOCK_FIX, "fail", "memlock", level="cause"),
)
