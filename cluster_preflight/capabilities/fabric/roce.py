# -*- coding: utf-8 -*-
"""Capability ``fabric``, the controller half's ``roce_gid`` check: every RoCE port NCCL will use has a GID of the
kind NCCL asks for, and ``NCCL_IB_GID_INDEX``, where the job's environment sets it, points at one.

NCCL, by default, wants a RoCE v2 GID with an IPv4 address (``NCCL_IB_ADDR_FAMILY`` AF_INET,
``NCCL_IB_ROCE_VERSION_NUM`` 2).  A port whose network device has no IPv4 address has none (only the link-local
entries the kernel derives from the MAC), and its queue pairs cannot connect across subnets: the job's log shows
``ibv_modify_qp`` timing out.  A ``NCCL_IB_GID_INDEX`` that names a link-local or RoCE v1 entry does the same, and
the right index differs between nodes whose devices carry their addresses differently (a VLAN, a second address).
NCCL 2.21 and later pick the entry themselves when ``NCCL_IB_GID_INDEX`` is unset (or -1).  The job's environment is
the run-wide setting ``preflight_job_env`` (its ``NCCL_IB_HCA`` selects the ports NCCL uses).  Facts from
``module_utils/preflight_node/net/roce_gid.py``.
"""

from __future__ import annotations

from preflight_node.checks import failed, not_applicable, passed

ACTIVE = "ACTIVE"


def job_env(settings):
    """The environment the cluster's jobs run with (``preflight_job_env``; ``{}`` when it is not set)."""
    value = settings.get("preflight_job_env") or {}
    return value if isinstance(value, dict) else {}


def hca_filter(text):
    """A predicate ``(device, port) -> bool`` for NCCL_IB_HCA: a comma list of ``name[:port]``, prefixes unless the
    list starts with ``=`` (exact names), all but the listed ones when it starts with ``^``."""
    text = (text or "").strip()
    if not text:
        return lambda device, port: True
    exclude = text.startswith("^")
    text = text.lstrip("^")
    exact = text.startswith("=")
    wanted = []
    for item in text.lstrip("=").split(","):
        name, _sep, port = item.strip().partition(":")
        if name:
            wanted.append((name, port.strip() or None))

    def listed(device, port):
        return any((device == name if exact else device.startswith(name)) and (want is None or str(port) == want)
                   for name, want in wanted)
    return (lambda device, port: not listed(device, port)) if exclude else listed


def _wanted(env):
    """``(family, type, text)`` NCCL will look for in the GID table."""
    family = "ipv6" if (env.get("NCCL_IB_ADDR_FAMILY") or "AF_INET").strip().upper() == "AF_INET6" else "ipv4"
    version = "RoCE v1" if str(env.get("NCCL_IB_ROCE_VERSION_NUM") or "2").strip() == "1" else "RoCE v2"
    return family, version, "%s %s" % (version, "IPv6" if family == "ipv6" else "IPv4")


def _index(env):
    """``(index or None, problem text or None)`` of NCCL_IB_GID_INDEX (-1 and unset: NCCL chooses)."""
    text = str(env.get("NCCL_IB_GID_INDEX") if env.get("NCCL_IB_GID_INDEX") is not None else "").strip()
    if not text:
        return None, None
    try:
        index = int(text)
    except ValueError:
        return None, "NCCL_IB_GID_INDEX=%s is not a number" % text
    return (None, None) if index < 0 else (index, None)


def _version(entry):
    """``RoCE v1`` / ``RoCE v2`` of an entry (sysfs writes v1 as ``IB/RoCE v1``), else its type as it is."""
    kind = entry.get("type") or ""
    return "RoCE v2" if kind.endswith("v2") else "RoCE v1" if kind.endswith("v1") else kind


def _entry_text(entry):
    return "%d %s (%s%s)" % (entry["index"], entry.get("address") or entry.get("gid"), entry.get("type") or "type ?",
                             ", %s" % entry["ndev"] if entry.get("ndev") else "")


def _judge_port(label, name, device, port, wanted, index):
    """``(status, text, right index or None)`` of one port; status ``unobserved`` when its table was not read."""
    family, version, what = wanted
    table = port.get("gids") or {}
    if not table.get("present") or table.get("error"):
        return "unobserved", "%s: %s" % (label, table.get("error") or "no GID table in sysfs"), None
    entries = table.get("entries") or []
    good = [entry for entry in entries if _version(entry) == version and entry.get("family") == family]
    netdev = next((entry["ndev"] for entry in entries if entry.get("ndev")), None) or ", ".join(
        device.get("netdevs") or []) or "its network device"
    if not good:
        return "fail", "%s: no %s GID (entries: %s); its device %s has no %s address" % (
            label, what, "; ".join(_entry_text(entry) for entry in entries) or "none", netdev,
            "IPv6" if family == "ipv6" else "IPv4"), None
    right = good[0]
    if index is not None and index not in [entry["index"] for entry in good]:
        named = next((entry for entry in entries if entry["index"] == index), None)
        return "fail", "%s: NCCL_IB_GID_INDEX=%d names %s, not a %s GID; the %s GID is at index %d (%s)" % (
            label, index, _entry_text(named) if named else "no entry", what, what, right["index"],
            right.get("address")), right["index"]
    chosen = next(entry for entry in good if index is None or entry["index"] == index)
    return "pass", "%s: %s GID at index %d (%s on %s)" % (label, what, chosen["index"], chosen.get("address"),
                                                         chosen.get("ndev") or netdev), right["index"]


def roce_gid(host, ports, settings):
    """``roce_gid`` over the ``ports`` the fabric checks cover (``[(label, name, device, port)]``)."""
    env = job_env(settings)
    wanted = _wanted(env)
    index, problem = _index(env)
    expected = ("every active RoCE port NCCL uses with a %s GID%s" % (
        wanted[2], ", at NCCL_IB_GID_INDEX=%d" % index if index is not None else ""))
    chosen = hca_filter(env.get("NCCL_IB_HCA"))
    roce = [entry for entry in ports if entry[2].get("kind") == "roce"
            and (entry[3].get("link_layer") or "").lower() == "ethernet"]
    if not roce:
        return not_applicable("no RoCE port on %s: no GID to choose" % host, expected)
    used = [entry for entry in roce if chosen(entry[1], entry[3].get("port"))]
    if not used:
        return not_applicable("NCCL_IB_HCA=%s selects none of the RoCE ports of %s" % (env.get("NCCL_IB_HCA"), host),
                              expected)
    results = [_judge_port(label, name, device, port, wanted, index) for label, name, device, port in used
               if port.get("state") == ACTIVE]
    idle = [label for label, _name, _device, port in used if port.get("state") != ACTIVE]
    bad = [text for status, text, _right in results if status == "fail"] + ([problem] if problem else [])
    unobserved = [text for status, text, _right in results if status == "unobserved"]
    good = [text for status, text, _right in results if status == "pass"]
    rights = sorted(set(right for _status, _text, right in results if right is not None))
    tail = "".join(["; not active, see fabric.ports: %s" % ", ".join(idle) if idle else "",
                    "; not observed: %s" % "; ".join(unobserved) if unobserved else ""])
    if bad:
        fix = ("on %s: give each named port's network device an %s address on the fabric's subnet (ip addr add "
               "ADDRESS/PREFIX dev DEVICE), then check its table (cat /sys/class/infiniband/DEV/ports/N/gids/* and "
               "gid_attrs/types/*)" % (host, "IPv6" if wanted[0] == "ipv6" else "IPv4"))
        if rights:
            fix += "; the %s GID is at index %s here: set NCCL_IB_GID_INDEX=%s in the job's environment, or unset it " \
                   "(NCCL 2.21+ picks the entry itself)" % (wanted[2], "/".join(str(right) for right in rights),
                                                            rights[0])
        return failed("%s on %s%s" % ("; ".join(bad), host, tail), expected, fix)
    if not good:
        return not_applicable("RoCE GID tables not observed on %s%s" % (host, tail), expected)
    how = ("NCCL_IB_GID_INDEX=%d" % index if index is not None else
           "NCCL_IB_GID_INDEX unset: NCCL 2.21+ picks the %s entry" % wanted[2])
    return passed("%s on %s (%s)%s" % ("; ".join(good), host, how, tail), expected, gid_index=rights)
