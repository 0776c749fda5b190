# -*- coding: utf-8 -*-
"""What the facts a log line carries mean: addresses, interfaces, errnos, resolver and verbs codes.

Shared by the rows of ``cluster_preflight/signature_table/``; pure functions of strings.
"""

from __future__ import annotations

import ipaddress
import re

# Interfaces that do not carry traffic between nodes: loopback, container bridges and their veths, virtual bridges,
# CNI and tunnel devices.
_VIRTUAL_IF_RE = re.compile(r"^(lo|docker\d*|br-[0-9a-f]+|virbr\d*|veth\w*|cni\d*|flannel[.\w]*|cali\w*|cilium\w*|"
                            r"lxc\w*|tun\d*|tap\d*|ip6tnl\d*|kube-\w+|weave|vxlan[.\w]*)$")
# Names shaped like an interface rather than a host: what gloo's "Unable to find address for: X" names.
_IFNAME_RE = re.compile(r"^(eth|en[opsx]|eno|ens|enp|ib|bond|lo|docker|wl|em|p\d+p|vlan|br|team|net|hsn|mlx|ibp|"
                        r"ibs|veth|virbr)[\w.:-]*$")
DOCKER_BRIDGE_GATEWAY = "172.17.0.1"

ERRNO_NAMES = {"12": "ENOMEM", "13": "EACCES", "2": "ENOENT", "19": "ENODEV", "22": "EINVAL", "28": "ENOSPC",
               "97": "EAFNOSUPPORT", "98": "EADDRINUSE", "101": "ENETUNREACH", "110": "ETIMEDOUT",
               "111": "ECONNREFUSED", "113": "EHOSTUNREACH"}
# getaddrinfo's codes as glibc numbers them (c10d prints "gai error: -3 - ...").
GAI_NAMES = {"-2": "EAI_NONAME", "-3": "EAI_AGAIN", "-4": "EAI_FAIL", "-5": "EAI_NODATA", "-8": "EAI_SERVICE",
             "-9": "EAI_ADDRFAMILY", "-11": "EAI_SYSTEM"}
# The name does not resolve at all (as opposed to "no address of this family", which a dual lookup expects).
GAI_UNRESOLVED = ("-2", "-3", "-4")
# ibv_wc_status (libibverbs' verbs.h), as NCCL prints "Got completion ... with error N".
WC_STATUS = {"1": "IBV_WC_LOC_LEN_ERR", "2": "IBV_WC_LOC_QP_OP_ERR", "4": "IBV_WC_LOC_PROT_ERR",
             "5": "IBV_WC_WR_FLUSH_ERR", "6": "IBV_WC_MW_BIND_ERR", "7": "IBV_WC_BAD_RESP_ERR",
             "8": "IBV_WC_LOC_ACCESS_ERR", "9": "IBV_WC_REM_INV_REQ_ERR", "10": "IBV_WC_REM_ACCESS_ERR",
             "11": "IBV_WC_REM_OP_ERR", "12": "IBV_WC_RETRY_EXC_ERR", "13": "IBV_WC_RNR_RETRY_EXC_ERR",
             "19": "IBV_WC_FATAL_ERR", "20": "IBV_WC_RESP_TIMEOUT_ERR", "21": "IBV_WC_GENERAL_ERR"}
# Address families as gloo and NCCL print them.
FAMILIES = {"2": "AF_INET (IPv4)", "10": "AF_INET6 (IPv6)"}


def _address(text):
    text = (text or "").strip().strip("[]")
    text = text.split("%", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def is_loopback(addr):
    """127.0.0.0/8, ::1, an IPv4-mapped loopback, or ``localhost``."""
    if (addr or "").strip("[]").lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    parsed = _address(addr)
    if parsed is None:
        return False
    mapped = getattr(parsed, "ipv4_mapped", None)
    return parsed.is_loopback or bool(mapped and mapped.is_loopback)


def is_link_local(addr):
    parsed = _address(addr)
    return bool(parsed and parsed.is_link_local)


def is_virtual_interface(name):
    return bool(_VIRTUAL_IF_RE.match(name or ""))


def looks_like_interface(name):
    """A word shaped like an interface name (``eth2``, ``ens1f0``, ``ib0``, ``bond0``), not a host name."""
    return bool(name) and "." not in name.rstrip(".") and bool(_IFNAME_RE.match(name))


def loopback_fault(facts):
    """A connection to a loopback address explains a failure only when the job spans nodes (or may)."""
    return is_loopback(facts.get("addr")) and facts.get("nodes") != 1


def wrong_interface(facts):
    """The interface or address NCCL bootstrapped on cannot reach another node."""
    if facts.get("nodes") == 1:
        return False
    name, addr = facts.get("ifname"), facts.get("addr")
    return is_virtual_interface(name) or is_loopback(addr) or is_link_local(addr) or addr == DOCKER_BRIDGE_GATEWAY


def interface_kind(facts):
    name, addr = facts.get("ifname") or "", facts.get("addr") or ""
    if name == "lo" or is_loopback(addr):
        return "loopback"
    if is_link_local(addr):
        return "link-local"
    if name.startswith(("docker", "br-", "virbr", "veth", "cni", "flannel", "cali", "cilium", "lxc", "kube")) or \
            addr == DOCKER_BRIDGE_GATEWAY:
        return "container or virtual bridge"
    return "virtual"


def errno_text(facts, default=""):
    """``errno 111 (ECONNREFUSED)`` from the line's errno, or ``default``."""
    number = facts.get("errno")
    if not number:
        return default
    name = ERRNO_NAMES.get(str(number))
    return "errno %s%s" % (number, " (%s)" % name if name else "")


def with_index(facts):
    """`` (NCCL_IB_GID_INDEX=3)`` where the log says which GID index was in use."""
    index = facts.get("gid_index")
    return " (NCCL_IB_GID_INDEX=%s)" % index if index else ""


def link_layer(facts):
    return {"RoCE": "RoCE (Ethernet)", "IB": "InfiniBand"}.get(facts.get("ib_link") or "", "")
