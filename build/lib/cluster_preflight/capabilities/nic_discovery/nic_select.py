# -*- coding: utf-8 -*-
"""The interface the collectives use on every node (controller layer, pure Python).

``select_interface`` takes every node's interfaces (the ``nic_discovery`` facts gathered by
``module_utils/preflight_node/net/interfaces.py``) and decides which one NCCL and gloo must use, each node's
address on it, and the per-node checks (override, common interface, fabric consistency, MTU, link).
``cluster_preflight/capabilities/nic_discovery/`` (``plan``) calls it; ``usable_fabrics`` also serves
``cluster_preflight/capabilities/allreduce/``.
"""

from __future__ import annotations

import functools
import ipaddress

from preflight_node.checks import failed, not_applicable, passed, skipped, warned

FABRIC_CLASSES = ("infiniband", "roce", "efa", "opa", "slingshot")
EXCLUDED_CLASSES = ("loopback", "bridge", "container")
CLASS_TIER = {"infiniband": 0, "roce": 0, "efa": 0, "opa": 0, "slingshot": 0,
              "ethernet": 1, "veth": 2, "virtual": 3,
              "bridge": 9, "container": 9, "loopback": 9}
FABRIC_LABELS = {"infiniband": "InfiniBand", "roce": "RoCE", "efa": "EFA",
                 "opa": "Omni-Path", "slingshot": "Slingshot"}

# ``eth0`` is the conventional management/ssh interface (seeds: "Often this
# interface is called eth0").
MANAGEMENT_NAMES = ("eth0",)
LINK_LOCAL_V4 = ipaddress.ip_network("169.254.0.0/16")


def usable_ipv4(nic):
    """IPv4 CIDRs of a netdev that can carry inter-node traffic.

    Loopback addresses count only on the loopback device itself, which the
    automatic choice never picks: only an explicit override (a single-node run
    on ``lo``) reaches it.
    """
    loopback_device = (nic or {}).get("class") == "loopback"
    usable = ((_usable if isinstance(cidr, str) else _usable.__wrapped__)(cidr, loopback_device)
              for cidr in (nic or {}).get("ipv4") or [])
    return [cidr for cidr in usable if cidr is not None]


# The choice reads every node's addresses several times: each text is parsed once.
@functools.lru_cache(maxsize=1 << 17)
def _usable(cidr, loopback_device):
    """``cidr`` as :func:`usable_ipv4` lists it, or None."""
    try:
        iface = _interface(cidr)
    except ValueError:
        return None
    if (iface.ip.is_loopback and not loopback_device) or iface.ip in LINK_LOCAL_V4:
        return None
    return str(iface)


def _interface(cidr):
    return _parsed(cidr) if isinstance(cidr, str) else ipaddress.ip_interface(cidr)


@functools.lru_cache(maxsize=1 << 17)
def _parsed(cidr):
    return ipaddress.ip_interface(cidr)


def parse_override(override):
    """``"ib0"``, ``"ib0,ib1"``, ``["ib0", "ib1"]`` or None -> list of names."""
    if override is None:
        return []
    if isinstance(override, str):
        override = override.split(",")
    names = []
    for item in override:
        for name in str(item).split(","):
            name = name.strip()
            if name and name not in names:
                names.append(name)
    return names


def parse_reachability(reachability):
    """Normalise probe results to {(ifname or None, src, dst): bool}.

    Accepted keys: ``(src, dst)`` tuples, ``"src->dst"`` strings, and
    either of them nested under an interface name (``{ib0: {"a->b": true}}``).
    ``dst`` is a host name or an IPv4 address; see ``_unreachable_pairs``."""
    result = {}

    def _pair(key):
        if isinstance(key, (tuple, list)) and len(key) == 2:
            return str(key[0]), str(key[1])
        if isinstance(key, str) and "->" in key:
            src, dst = key.split("->", 1)
            return src.strip(), dst.strip()
        raise ValueError("reachability key %r is neither (src, dst) nor 'src->dst'" % (key,))

    for key, value in (reachability or {}).items():
        if isinstance(value, dict):
            for inner, ok in value.items():
                src, dst = _pair(inner)
                result[(str(key), src, dst)] = bool(ok)
        else:
            src, dst = _pair(key)
            result[(None, src, dst)] = bool(value)
    return result


def _unreachable_pairs(ifname, nics_by_host, reach):
    """Probe results that say ``ifname`` does not connect two nodes.

    A result nested under ``ifname`` counts; a flat result counts when its
    destination is an address held by ``ifname`` on some node, or a host
    name (then it is about the node as a whole, so about every interface)."""
    owner = {}
    for host, nics in nics_by_host.items():
        for cidr in (nics.get(ifname) or {}).get("ipv4") or []:
            owner[cidr.split("/")[0]] = host
    pairs = []
    for (iface, src, dst), ok in sorted(reach.items(), key=lambda item: tuple(str(x) for x in item[0])):
        if ok:
            continue
        if iface is not None and iface != ifname:
            continue
        if iface is None and dst not in nics_by_host and dst not in owner:
            continue
        pairs.append("%s -> %s" % (src, dst))
    return pairs


def _is_management(host, name, nic, mgmt_addr_by_host):
    if name in MANAGEMENT_NAMES or nic.get("default_route"):
        return True
    address = (mgmt_addr_by_host or {}).get(host)
    if not address:
        return False
    held = [cidr.split("/")[0] for cidr in (nic.get("ipv4") or []) + (nic.get("ipv6") or [])]
    return str(address) in held


def _common_subnets(ifname, nics_by_host):
    common = None
    for nics in nics_by_host.values():
        networks = {_interface(cidr).network for cidr in usable_ipv4(nics.get(ifname))}
        common = networks if common is None else common & networks
    return sorted(common or [], key=str)


def _pick_address(nic, subnets):
    addresses = usable_ipv4(nic)
    for cidr in addresses:
        if _interface(cidr).network in subnets:
            return cidr
    return addresses[0] if addresses else None


def _hosts_text(hosts):
    return ", ".join(hosts) if hosts else "-"


def _worst_class(classes):
    return sorted(classes, key=lambda c: (CLASS_TIER.get(c, 3), c))[-1] if classes else None


def evaluate_candidate(ifname, nics_by_host, reach=None, mgmt_addr_by_host=None):
    """Whether ``ifname`` can carry the collectives on every node, and why."""
    hosts = list(nics_by_host)
    problems = []
    missing = [h for h in hosts if ifname not in nics_by_host[h]]
    present = [h for h in hosts if h not in missing]
    classes = {h: nics_by_host[h][ifname].get("class") for h in present}
    nic_class = _worst_class(list(classes.values()))
    if missing:
        problems.append("missing on %s" % _hosts_text(missing))
    excluded = sorted({c for c in classes.values() if c in EXCLUDED_CLASSES})
    if excluded:
        problems.append("class %s is never chosen unless named by the override" % "/".join(excluded))
    down = [h for h in present if not nics_by_host[h][ifname].get("is_up")]
    if down:
        problems.append("DOWN on %s" % _hosts_text(down))
    no_carrier = [h for h in present if h not in down and nics_by_host[h][ifname].get("carrier") is False]
    if no_carrier:
        problems.append("no carrier on %s" % _hosts_text(no_carrier))
    no_addr = [h for h in present if not usable_ipv4(nics_by_host[h][ifname])]
    if no_addr:
        problems.append("no usable IPv4 address on %s" % _hosts_text(no_addr))
    unreachable = _unreachable_pairs(ifname, nics_by_host, reach or {})
    if unreachable:
        problems.append("isolated: %s unreachable" % ", ".join(unreachable))
    speeds = [nics_by_host[h][ifname].get("speed_mbps") for h in present]
    speed = min(speeds) if speeds and all(s for s in speeds) else None
    management = any(_is_management(h, ifname, nics_by_host[h][ifname], mgmt_addr_by_host) for h in present)
    subnets = _common_subnets(ifname, nics_by_host) if not missing else []
    info = {
        "ifname": ifname,
        "eligible": not problems,
        "class": nic_class,
        "classes": classes,
        "speed_mbps": speed,
        "management": management,
        "same_subnet": bool(subnets),
        "subnet": str(subnets[0]) if subnets else None,
        "problems": problems,
        "rank": None,
    }
    if problems:
        info["why"] = "not usable: " + "; ".join(problems)
    else:
        parts = ["%s on all %d nodes, UP with IPv4" % (nic_class, len(hosts))]
        parts.append("%d Mb/s" % speed if speed else "speed unknown")
        parts.append("same subnet %s" % subnets[0] if subnets else "different subnets (routed)")
        if management:
            parts.append("management interface (ranked after data interfaces)")
        info["why"] = ", ".join(parts)
    return info


def rank_key(info):
    """Fabric > ethernet > veth > virtual; data before management; faster;
    one shared subnet; then by name so the order is stable."""
    return (CLASS_TIER.get(info["class"], 3), info["management"], -(info["speed_mbps"] or 0),
            not info["same_subnet"], info["ifname"])


def rank_candidates(nics_by_host, reach=None, mgmt_addr_by_host=None):
    """Every interface name seen on any node, eligible ones first in rank order."""
    names = sorted({name for nics in nics_by_host.values() for name in nics})
    infos = [evaluate_candidate(n, nics_by_host, reach, mgmt_addr_by_host) for n in names]
    eligible = sorted((i for i in infos if i["eligible"]), key=rank_key)
    for position, info in enumerate(eligible, 1):
        info["rank"] = position
    rest = sorted((i for i in infos if not i["eligible"]), key=lambda i: i["ifname"])
    return eligible + rest


def usable_fabrics(nics, rdma):
    """Fabric kinds a node can use: UP fabric netdevs and ACTIVE RDMA ports."""
    kinds = {}
    for name, nic in (nics or {}).items():
        if nic.get("class") in FABRIC_CLASSES and nic.get("is_up"):
            kinds.setdefault(nic["class"], []).append(name)
    for name, device in (rdma or {}).items():
        if any((port.get("state") or "").upper() == "ACTIVE" for port in device.get("ports") or []):
            kind = device.get("kind") or "infiniband"
            if kind in FABRIC_LABELS:
                kinds.setdefault(kind, []).append(name)
    return kinds


def _capped(parts, limit=12):
    """Join at most ``limit`` parts: a Kubernetes node can hold hundreds of veths."""
    text = "; ".join(parts[:limit])
    if len(parts) > limit:
        text += "; ... and %d more" % (len(parts) - limit)
    return text


def _nic_summary(nics):
    parts = []
    for name in sorted(nics or {}):
        nic = nics[name]
        if nic.get("class") == "loopback":
            continue
        parts.append("%s (%s, %s%s)" % (name, nic.get("class"), "UP" if nic.get("is_up") else "DOWN",
                                        ", " + ",".join(usable_ipv4(nic)) if usable_ipv4(nic) else ""))
    return _capped(parts) or "no interfaces besides loopback"


def _override_checks(names, nics_by_host):
    checks = {}
    for host, nics in nics_by_host.items():
        problems = []
        for name in names:
            nic = nics.get(name)
            if nic is None:
                problems.append("%s does not exist (interfaces here: %s)" % (name, ", ".join(sorted(nics)) or "none"))
            elif not nic.get("is_up"):
                problems.append("%s is DOWN (operstate %s)" % (name, nic.get("operstate")))
            elif not usable_ipv4(nic):
                problems.append("%s has no usable IPv4 address (link-local does not count, nor loopback "
                                "addresses outside lo)" % name)
        expected = "%s UP with an IPv4 address on every node (interface override)" % ", ".join(names)
        if problems:
            checks[host] = failed(
                "%s: %s" % (host, "; ".join(problems)), expected,
                "On %s bring %s up with an address (ip link set dev IF up; for InfiniBand check the "
                "port with ibstat and the subnet manager), or correct the interface override in the "
                "inventory." % (host, ", ".join(names)), node=host, interfaces=names)
        else:
            checks[host] = passed("%s: %s" % (host, ", ".join(
                "%s UP with %s" % (n, ",".join(usable_ipv4(nics[n]))) for n in names)), expected)
    return checks


def _mtu_checks(ifname, nics_by_host):
    mtus = {h: (nics.get(ifname) or {}).get("mtu") for h, nics in nics_by_host.items() if ifname in nics}
    checks = {}
    counts = {}
    for mtu in mtus.values():
        counts[mtu] = counts.get(mtu, 0) + 1
    top = max(counts.values()) if counts else 0
    majority = [m for m, c in counts.items() if c == top]
    expected_mtu = majority[0] if len(majority) == 1 else None
    listing = ", ".join("%s %s" % (h, mtus[h]) for h in sorted(mtus))
    for host in nics_by_host:
        if host not in mtus:
            checks[host] = skipped("%s does not exist on %s" % (ifname, host), "the same MTU on every node")
            continue
        expected = ("the same MTU on %s on every node (most nodes: %s)" % (ifname, expected_mtu)
                    if expected_mtu is not None else "the same MTU on %s on every node" % ifname)
        if len(counts) == 1:
            checks[host] = passed("%s: MTU %s on %s, as on every node" % (host, mtus[host], ifname), expected)
        elif expected_mtu is not None and mtus[host] == expected_mtu:
            checks[host] = passed("%s: MTU %s on %s; nodes differ: %s" % (host, mtus[host], ifname, listing),
                                  expected, mtus=mtus)
        else:
            target = expected_mtu if expected_mtu is not None else "one common value"
            checks[host] = failed(
                "%s: MTU %s on %s differs from other nodes (%s)" % (host, mtus[host], ifname, listing), expected,
                "Set MTU %s on %s on %s (ip link set dev %s mtu N, and persist it in the network "
                "configuration): mismatched MTUs drop large frames and stall collectives."
                % (target, ifname, host, ifname), node=host, mtus=mtus)
    return checks


def _link_checks(ifname, nics_by_host):
    checks = {}
    expected = "%s UP with carrier" % ifname
    for host, nics in nics_by_host.items():
        nic = nics.get(ifname)
        if nic is None:
            checks[host] = skipped("%s does not exist on %s (see nic_discovery.override)" % (ifname, host), expected)
            continue
        ports = nic.get("rdma") or []
        inactive = [p for p in ports if (p.get("state") or "").upper() != "ACTIVE"]
        state = "operstate %s, carrier %s" % (nic.get("operstate"), {True: "on", False: "off"}.get(nic.get("carrier"), "unknown"))
        if not nic.get("is_up") or nic.get("carrier") is False:
            checks[host] = failed(
                "%s: %s is not usable (%s)" % (host, ifname, state), expected,
                "On %s run ip link set dev %s up and check the cable, the switch port%s."
                % (host, ifname, " and the subnet manager (ibstat)" if nic.get("class") in FABRIC_CLASSES else ""),
                node=host)
        elif ports and len(inactive) == len(ports):
            checks[host] = failed(
                "%s: %s is up but its RDMA port(s) are not ACTIVE: %s" % (host, ifname, ", ".join(
                    "%s/%s %s" % (p["device"], p["port"], p.get("state")) for p in ports)),
                expected + " and an ACTIVE RDMA port",
                "On %s check the port with ibstat: INIT means no subnet manager (start opensm or fix the "
                "fabric's SM), DOWN means cable or switch port." % host, node=host)
        else:
            speed = nic.get("speed_mbps")
            checks[host] = passed("%s: %s %s%s" % (host, ifname, state, ", %d Mb/s" % speed if speed else ""),
                                  expected)
    return checks


def _fabric_checks(nics_by_host, rdma_by_host, chosen_class, mismatch_status):
    per_host = {h: usable_fabrics(nics_by_host[h], (rdma_by_host or {}).get(h)) for h in nics_by_host}
    all_kinds = sorted({k for kinds in per_host.values() for k in kinds})
    checks = {}
    expected = "the same fabrics (InfiniBand/RoCE/EFA/Omni-Path/Slingshot) usable on every node"
    if not all_kinds:
        for host in nics_by_host:
            checks[host] = not_applicable("no fabric (InfiniBand, RoCE, EFA, Omni-Path, Slingshot) on any node; "
                                          "collectives use sockets", expected)
        return checks
    # Fabric netdevs on every node but none chosen: their names differ.
    netdev_fabric = {h: sorted(n for n, nic in nics_by_host[h].items()
                               if nic.get("class") in FABRIC_CLASSES and nic.get("is_up") and usable_ipv4(nic))
                     for h in nics_by_host}
    names_differ = all(netdev_fabric.values()) and chosen_class not in FABRIC_CLASSES
    # Computed once, not per node: the same for every node's finding.
    lacking = sorted(h for h in nics_by_host if set(all_kinds) - set(per_host[h]))
    having = {k: sorted(h for h in nics_by_host if k in per_host[h]) for k in all_kinds}
    listing = "; ".join("%s: %s" % (h, ", ".join(netdev_fabric[h])) for h in sorted(netdev_fabric))
    for host in nics_by_host:
        have = per_host[host]
        missing = [k for k in all_kinds if k not in have]
        if missing:
            labels = ", ".join(FABRIC_LABELS[k] for k in missing)
            others = {k: having[k] for k in missing}
            found = "%s has no usable %s while %s (%s on some nodes only)" % (
                host, labels, "; ".join("%s has %s" % (_hosts_text(others[k]), FABRIC_LABELS[k]) for k in missing),
                "/".join(FABRIC_LABELS[k] for k in missing))
            fix = ("On %s bring the %s port up (ibstat / fi_info; cable, driver, subnet manager) or keep the node "
                   "out of fabric jobs: NCCL on mixed nodes falls back to sockets or hangs (a socket-only job "
                   "can set NCCL_IB_DISABLE=1)." % (host, labels))
            build = failed if mismatch_status == "fail" else warned
            checks[host] = build(found, expected, fix, node=host, missing=missing)
        elif names_differ:
            checks[host] = warned(
                "%s: every node has fabric interfaces but under different names (%s), so none is common "
                "and a slower interface was chosen" % (host, listing), expected + " under one name",
                "Give the fabric interfaces the same name on every node (udev rule or systemd .link file), "
                "or set the interface override.", node=host)
        else:
            checks[host] = passed("%s: %s usable here%s" % (
                host, ", ".join(FABRIC_LABELS[k] for k in sorted(have)),
                "; missing on %s (see those nodes)" % _hosts_text(lacking) if lacking else ", as on every node"),
                expected)
    return checks


def _override_choice(names, nics_by_host, checks):
    """The override's interfaces, its checks into ``checks``; returns (ifnames, reason)."""
    hosts = list(nics_by_host)
    override_checks = _override_checks(names, nics_by_host)
    bad = [h for h in hosts if override_checks[h]["status"] == "fail"]
    for host in hosts:
        checks[host]["override"] = override_checks[host]
        if bad:
            checks[host]["common_interface"] = skipped(
                "the interface comes from the override, which is not usable on %s (see nic_discovery.override)"
                % _hosts_text(bad), "one interface UP with IPv4 under the same name on every node")
        else:
            checks[host]["common_interface"] = passed(
                "%s: override %s is UP with IPv4 on every node" % (host, ",".join(names)),
                "one interface UP with IPv4 under the same name on every node")
    reason = "%s set by the interface override" % ",".join(names)
    if bad:
        reason += "; not usable on %s" % _hosts_text(bad)
    return names, reason


def _automatic_choice(candidates, nics_by_host, checks):
    """The best eligible candidate, the common_interface checks into ``checks``; returns (ifnames, reason)."""
    hosts = list(nics_by_host)
    eligible = [c for c in candidates if c["eligible"]]
    ifnames = [eligible[0]["ifname"]] if eligible else []
    for host in hosts:
        checks[host]["override"] = not_applicable("no interface override set", "")
    expected = "one interface UP with IPv4 under the same name on every node"
    if eligible:
        best = eligible[0]
        reason = "%s: %s; ranked first of %d usable interface(s)" % (best["ifname"], best["why"], len(eligible))
        for host in hosts:
            nic = nics_by_host[host][best["ifname"]]
            checks[host]["common_interface"] = passed(
                "%s: %s (%s) with %s" % (host, best["ifname"], nic.get("class"), ",".join(usable_ipv4(nic))),
                expected)
        return ifnames, reason
    blockers = _capped(["%s %s" % (c["ifname"], c["why"]) for c in candidates
                        if c["class"] not in EXCLUDED_CLASSES]) or "only loopback, bridges and container devices"
    reason = "no interface is usable on every node: " + blockers
    for host in hosts:
        checks[host]["common_interface"] = failed(
            "%s: no interface is UP with an IPv4 address under the same name on all %d nodes. "
            "Here: %s. Across nodes: %s" % (host, len(hosts), _nic_summary(nics_by_host[host]), blockers),
            expected,
            "Give the inter-node interface the same name on every node (udev rule or systemd .link "
            "file), bring it up with an address, or set the interface override in the inventory.",
            node=host)
    return ifnames, reason


def _chosen_checks(ifname, nics_by_host, rdma_by_host, fabric_mismatch, checks):
    """The fabric, MTU and link checks of the chosen interface (``ifname`` None: none chosen)."""
    hosts = list(nics_by_host)
    chosen_classes = [nics_by_host[h][ifname].get("class") for h in hosts if ifname and ifname in nics_by_host[h]]
    fabric = _fabric_checks(nics_by_host, rdma_by_host, _worst_class(chosen_classes), fabric_mismatch)
    if ifname:
        mtu, link = _mtu_checks(ifname, nics_by_host), _link_checks(ifname, nics_by_host)
    for host in hosts:
        checks[host]["fabric_consistency"] = fabric[host]
        if ifname:
            checks[host]["mtu_consistency"] = mtu[host]
            checks[host]["link"] = link[host]
        else:
            checks[host]["mtu_consistency"] = skipped("no interface chosen (see nic_discovery.common_interface)",
                                                          "the same MTU on every node")
            checks[host]["link"] = skipped("no interface chosen (see nic_discovery.common_interface)",
                                               "the chosen interface UP with carrier")


def _addresses(ifname, nics_by_host):
    """host -> its address on ``ifname`` (a shared subnet's first)."""
    addr_by_host = {}
    if ifname:
        subnets = _common_subnets(ifname, nics_by_host) if all(ifname in n for n in nics_by_host.values()) else []
        for host in nics_by_host:
            cidr = _pick_address(nics_by_host[host].get(ifname), subnets)
            if cidr:
                addr_by_host[host] = cidr.split("/")[0]
    return addr_by_host


def select_interface(nics_by_host, master=None, override=None, reachability=None,
                     mgmt_addr_by_host=None, rdma_by_host=None, fabric_mismatch="fail"):
    """Choose the interface the collectives use on every node.

    ``nics_by_host``: host -> ``preflight_nics`` (nic_facts).  Returns a dict
    with ifname, ifnames, nccl_socket_ifname, gloo_socket_ifname,
    addr_by_host, master, master_addr, reason, candidates and checks (host ->
    {check_name: check result}).  Raises ValueError for bad arguments."""
    if not isinstance(nics_by_host, dict) or not nics_by_host:
        raise ValueError("nics_by_host must be a non-empty dict host -> preflight_nics")
    nics_by_host = {str(h): dict(n or {}) for h, n in nics_by_host.items()}
    hosts = list(nics_by_host)
    if master is None:
        master = hosts[0]
    if master not in nics_by_host:
        raise ValueError("master %r is not one of the hosts in nics_by_host (%s)" % (master, ", ".join(hosts)))
    if fabric_mismatch not in ("fail", "warn"):
        raise ValueError("fabric_mismatch must be fail or warn, got %r" % (fabric_mismatch,))
    reach = parse_reachability(reachability)
    names = parse_override(override)
    candidates = rank_candidates(nics_by_host, reach, mgmt_addr_by_host)
    checks = {h: {} for h in hosts}
    if names:
        ifnames, reason = _override_choice(names, nics_by_host, checks)
    else:
        ifnames, reason = _automatic_choice(candidates, nics_by_host, checks)
    ifname = ifnames[0] if ifnames else None
    _chosen_checks(ifname, nics_by_host, rdma_by_host, fabric_mismatch, checks)
    addr_by_host = _addresses(ifname, nics_by_host)
    return {
        "ifname": ifname,
        "ifnames": ifnames,
        "nccl_socket_ifname": "=" + ",".join(ifnames) if ifnames else None,
        "gloo_socket_ifname": ",".join(ifnames) if ifnames else None,
        "addr_by_host": addr_by_host,
        "master": master,
        "master_addr": addr_by_host.get(master),
        "reason": reason,
        "candidates": candidates,
        "checks": checks,
    }
