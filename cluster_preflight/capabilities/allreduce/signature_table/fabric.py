# -*- coding: utf-8 -*-
"""Signatures of the RDMA fabric as NCCL uses it: the transport it chose, the network plugin and its provider, queue
pairs that cannot reach the peer (RoCE GIDs), completion errors, and GPUDirect RDMA."""

from __future__ import annotations

from cluster_preflight.capabilities.allreduce.signature_table import sig
from cluster_preflight.capabilities.allreduce.signature_table.facts import WC_STATUS, is_link_local, link_layer, with_index

# "Got completion from peer 10.0.0.1<42133> with error 12, ...", the older "Got completion with error 12, ...", and a
# peer whose address the log (or its reader) left out.
_COMPLETION = r"Got completion (?:from peer (?:(?P<peer>\S+) )?)?with error"
_GID_FIX = ("set NCCL_IB_GID_INDEX to the index of the IPv4-mapped RoCE v2 GID (`show_gids`, or `ibv_devinfo -v`: the "
            "entry `::ffff:<the port's IPv4 address>` of type RoCE v2; the same index on every node), check that both "
            "ports are in the same VLAN / subnet and that the switches carry RoCE (ib_write_bw -x <index> between the "
            "two nodes), and on rail-optimised fabrics NCCL_CROSS_NIC=0; fabric.roce_gid checks the GID table and the "
            "job's index before the job")


def _gid_detail(facts):
    local = facts.get("local_gid") or ""
    if local and is_link_local(local):
        return " The local GID in the line (%s) is link-local: it is not routed between nodes." % local
    if local.startswith("::ffff:"):
        return (" The GIDs in the line are IPv4-mapped (RoCE v2), so the index is of the right kind: look at the path "
                "(VLAN, switch, rail) and whether the peer is still up.")
    return ""


def _qp_cause(facts):
    err = facts.get("err") or "an error"
    layer = link_layer(facts)
    return ("RDMA queue-pair setup (%s, to RTR) failed with %s: the NIC could not reach the peer's GID%s - on RoCE the "
            "GID index in use%s points at a GID that does not route between the nodes (a link-local fe80:: or RoCE v1 "
            "entry instead of the IPv4-mapped RoCE v2 one, or an index whose address differs per node), the ports are "
            "in different VLANs / subnets, or on a rail-optimised fabric a NIC tries to reach a NIC of another rail. It "
            "is not a TCP firewall: the job's TCP connections were already made.%s" % (
                facts.get("call") or "ibv_modify_qp", err, " over %s" % layer if layer else "", with_index(facts),
                _gid_detail(facts)))


def _retry_cause(facts):
    peer = facts.get("peer")
    layer = link_layer(facts)
    return ("RDMA retries exhausted (IBV_WC_RETRY_EXC_ERR, error 12)%s: the peer's port could not be reached over the "
            "fabric%s. On RoCE this is most often the GID index in use%s (not a routable IPv4-mapped RoCE v2 GID, or "
            "switches that drop RoCE on that VLAN / traffic class); on InfiniBand the two ports are not in the same "
            "partition (P_Key) or subnet, or a port or cable is down; in the middle of a run, the peer process or its "
            "node went away. The link layer NCCL printed (NET/IB : Using ...:1/RoCE or /IB), the GIDs in the line and "
            "whether it fails at the first transfer (the path never worked) or later (it went away) tell them apart."
            "%s" % (" from peer %s" % peer if peer else "", " (%s)" % layer if layer else "", with_index(facts),
                    _gid_detail(facts)))


_RETRY_FIX = ("check both ends with ibstat / ibv_devinfo (ACTIVE, same subnet prefix); on RoCE, NCCL_IB_GID_INDEX "
              "(show_gids: the IPv4-mapped RoCE v2 entry, the same on every node), the VLAN and the switches' RoCE "
              "settings; on InfiniBand, the partition membership of both ports on the subnet manager (smpquery pkeys / "
              "the SM's partitions.conf), NCCL_IB_PKEY, and the cables (ibdiagnet); fabric.roce_gid and fabric.ports "
              "check the ports and the GID table before the job")


def _gdr_cause(facts):
    code = facts.get("wc")
    status = WC_STATUS.get(code, "error %s" % code)
    head = ("the NIC's DMA into (or out of) GPU memory was refused (%s, error %s)%s: GPUDirect RDMA is broken on this "
            "path" % (status, code, " with peer %s" % facts["peer"] if facts.get("peer") else ""))
    return (head + " - PCIe ACS enabled on a switch between the GPU and the NIC redirects the peer-to-peer traffic to "
            "the root complex, which refuses it, the IOMMU translates it (not iommu=pt), or the peer-memory module "
            "(nvidia-peermem) is missing or mismatched. NCCL_NET_GDR_LEVEL=0 (or LOC) making the job work, slower, "
            "confirms GPUDirect is the failing path; `lspci -vvv | grep ACSCtl` shows SrcValid+ on the bridges; "
            "`lsmod | grep peermem` shows the module")


_GDR_FIX = ("disable PCIe ACS on the bridges between the GPUs and the NICs (in the BIOS, or `setpci -s <bridge> "
            "ECAP_ACS+0x6.w=0000` at every boot), boot with iommu=pt, and load nvidia-peermem (or use dma-buf); "
            "fabric.pcie_acs and fabric.peer_memory check the node before the job")


def _completion_cause(facts):
    code = facts.get("wc")
    status = WC_STATUS.get(code, "error %s" % code)
    if code == "5":
        return ("an RDMA work request was flushed (IBV_WC_WR_FLUSH_ERR, error 5): a consequence - the queue pair had "
                "already failed; the first completion error of the log (or a peer that went away) is the cause")
    return ("an RDMA completion failed (%s, error %s)%s: the transfer between the two ports did not complete" % (
        status, code, " with peer %s" % facts["peer"] if facts.get("peer") else ""))


def _reg_gpu_cause(facts):
    return ("%s failed with %s: registering GPU memory with the NIC failed - the peer-memory module (nvidia-peermem) "
            "is not loaded, or dma-buf is not supported by this driver / kernel, so the NIC cannot map GPU memory "
            "(GPUDirect RDMA)" % (facts.get("call") or "ibv_reg_mr", facts.get("err") or "an error"))


ROWS = (
    # Which transport NCCL chose (NCCL_DEBUG=INFO, init): "NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>",
    # "NET/Socket : Using [0]eth0:10.0.0.1<0>", "Using network IB".
    sig("nccl_net_ib", r"NET/IB\s*:\s*Using\s+\[\d+\]|Using network IB\b",
        "NCCL uses the RDMA fabric (NET/IB: InfiniBand or RoCE verbs)", "", "pass", "transport", level="info"),
    sig("nccl_net_ofi", r"NET/OFI\b.*\b(Selected|Using)\b|Using network (AWS )?Libfabric\b",
        "NCCL uses the fabric through the aws-ofi-nccl plugin (NET/OFI: EFA)", "", "pass", "transport", level="info"),
    sig("nccl_net_socket", r"NET/Socket\s*:\s*Using\s+\[\d+\]|Using network Socket\b",
        "NCCL moves inter-node data over TCP sockets (NET/Socket) although this node has a fabric: the "
        "collectives run at Ethernet speed or slower",
        "find why NCCL did not take the fabric: NCCL_IB_DISABLE=1 or NCCL_NET=Socket in the job's environment, "
        "no libibverbs/rdma-core (or no /dev/infiniband) in the job's container, RDMA ports not ACTIVE "
        "(ibstat), or NCCL_IB_HCA naming the wrong device; the NCCL INFO lines before 'NET/Socket' say which",
        "warn", "transport", level="cause", needs_fabric=True),
    sig("nccl_ib_no_device", r"NET/IB\s*:\s*No device found",
        "NCCL found no usable RDMA device although this node has a fabric",
        "check that the job can open /dev/infiniband/uverbs* and load libibverbs (rdma-core in the job's "
        "container), that the ports are ACTIVE (ibstat), and that NCCL_IB_HCA matches the devices; job_env.ib_hca "
        "checks the job's NCCL_IB_HCA before the job",
        "warn", "transport", level="cause", needs_fabric=True, checks=("job_env.ib_hca", "fabric.ports")),
    sig("ofi_no_provider", (
        r"NET/OFI (?:Could not|Couldn't|Unable to) find any (?:optimal|usable|suitable) provider",
        r"NET/OFI .*[Nn]o (?:usable |suitable )?(?:libfabric )?providers?\b"),
        "the aws-ofi-nccl network plugin loaded but libfabric offers it no usable provider (no EFA provider: the EFA "
        "devices are not visible in the job's container, libfabric / the EFA installer is missing or too old, or "
        "FI_PROVIDER names one that is absent): NCCL falls back past the plugin to IB verbs and then to TCP sockets, "
        "so 'Failed to open libibverbs' after it is a symptom",
        "in the job's environment `fi_info -p efa -t FI_EP_RDM` must list EFA: pass the EFA devices into the "
        "container (--device /dev/infiniband/uverbs*), install the EFA installer's libfabric and the plugin it ships, "
        "keep FI_PROVIDER=efa; fabric.net_plugin checks the plugin and EFA devices before the job",
        "fail", "net_plugin", level="cause"),
    sig("net_plugin_missing", (
        r"NET/Plugin\s*:?\s*(?:No plugin found|Could not find:?\s*(?P<plugin>libnccl-net\S*))",
        r"NET/Plugin\s*:?\s*Plugin load (?:\(\S+\) )?returned"),
        "NCCL found no network plugin (libnccl-net.so) although this node has EFA: without aws-ofi-nccl NCCL cannot "
        "use EFA and runs over TCP sockets",
        "install aws-ofi-nccl in the job's environment (the EFA installer ships it) and put it on LD_LIBRARY_PATH "
        "(or NCCL_NET_PLUGIN); fabric.net_plugin checks it before the job",
        "warn", "net_plugin", level="cause", needs_fabric="efa"),
    sig("ibverbs_missing", r"Failed to open libibverbs\.so|libibverbs(?:\.so\S*)?: cannot open shared object",
        "the job's environment has no libibverbs (rdma-core) although this node has a fabric: NCCL cannot use RDMA and "
        "falls back to TCP sockets",
        "install rdma-core (libibverbs and the NIC's provider, e.g. libmlx5) in the job's environment or container and "
        "pass /dev/infiniband into the container; fabric.net_plugin checks the job's environment before the job",
        "warn", "net_plugin", level="cause", needs_fabric=True),
    sig("ib_qp_setup_timeout", (
        r"(?P<call>ibv_modify_qp)\S*\s+failed(?: with)?(?: error)?\s*(?P<errno>\d+)?\s*(?P<err>Connection timed out|"
        r"Network is unreachable|No route to host|No such device|ETIMEDOUT|ENETUNREACH)"
        r"(?:[^\n]*?local GID index (?P<gid_index>\d+))?(?:[^\n]*?local GID (?P<local_gid>[0-9a-fA-F:.x]+))?",
        r"(?P<call>[Mm]odify QP to RTR)[^\n]*?(?P<err>Connection timed out|Network is unreachable|No route to host)"),
        _qp_cause, _GID_FIX, "fail", "roce_gid", level="cause"),
    # "NET/IB : Got completion from peer 10.0.0.1<42133> with error 12, opcode 32753, len 0, vendor err 129"; older
    # NCCL prints "Got completion with error 12, ..." without the peer.
    sig("nccl_ib_error_12",
        _COMPLETION + r" (?P<wc>12)\b"
        r"(?:[^\n]*?localGid (?P<local_gid>\S+))?",
        _retry_cause, _RETRY_FIX, "fail", "roce_gid", level="cause"),
    sig("ib_local_protection",
        _COMPLETION + r" (?P<wc>4)\b",
        _gdr_cause, _GDR_FIX, "fail", "gpudirect", level="cause"),
    sig("ib_access_error",
        _COMPLETION + r" (?P<wc>8|10|11)\b",
        lambda facts: _gdr_cause(facts) + "; a peer that freed its buffers or died gives the remote errors too",
        _GDR_FIX, "fail", "gpudirect", level="cause"),
    sig("ib_reg_mr_gpu",
        r"(?P<call>ibv_reg\w*mr\w*)\S*\s+failed\b[^\n]*?(?P<err>Bad address|EFAULT|Invalid argument|EINVAL)",
        _reg_gpu_cause,
        "load nvidia-peermem (modprobe nvidia-peermem, the same driver version) or use a driver and kernel with "
        "dma-buf; fabric.peer_memory checks it before the job", "fail", "gpudirect", level="cause",
        checks=("fabric.peer_memory",)),
    sig("ib_completion_error",
        _COMPLETION + r" (?P<wc>\d+)",
        _completion_cause,
        "read the first completion error of the log and both nodes' ibstat / error counters (fabric.counters); a "
        "peer that went away shows in its own log", "fail", "fabric"),
)
