# -*- coding: utf-8 -*-
"""Network interfaces of a node, and the one the collectives must use.

Two halves:

* Gathering (runs on each node, read-only): ``gather_nics`` reads
  ``<sysfs_root>/class/net`` and ``<sysfs_root>/class/infiniband`` and
  classifies every interface; addresses come either from parsed
  ``ip -j -d addr show`` output (``parse_ip_addr_json``) or, without any
  external tool, from ``<proc_root>/net/fib_trie`` + ``<proc_root>/net/route``
  (IPv4) and ``<proc_root>/net/if_inet6`` (IPv6).
* Selection (runs on the controller, pure Python): ``select_interface`` takes
  every node's interfaces and decides which one NCCL and gloo must use, the
  master's address on it, and per-node check results.

Interface classes, best first for inter-node collectives:

* fabric: ``infiniband`` (IPoIB), ``roce``, ``efa``, ``opa`` (Omni-Path),
  ``slingshot`` (HPE, ``hsn*``)
* ``ethernet`` (physical NICs, and bonds/VLANs on top of them)
* ``veth`` (selectable: a node that is itself a network namespace or a
  container sees its NIC as a veth)
* ``virtual`` (tun/tap, dummy, vxlan, ... selectable only as a last resort)
* never chosen unless named by the override: ``loopback``, ``bridge``,
  ``container`` (docker/CNI/flannel/calico/... devices)
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import struct

from .checks import failed, not_applicable, passed, skipped, warned

ARPHRD_ETHER = 1
ARPHRD_INFINIBAND = 32
ARPHRD_LOOPBACK = 772
IFF_UP = 0x1
IFF_LOOPBACK = 0x8
IFF_TUN = 0x1
IFF_TAP = 0x2

FABRIC_CLASSES = ("infiniband", "roce", "efa", "opa", "slingshot")
EXCLUDED_CLASSES = ("loopback", "bridge", "container")
CLASS_TIER = {"infiniband": 0, "roce": 0, "efa": 0, "opa": 0, "slingshot": 0,
              "ethernet": 1, "veth": 2, "virtual": 3,
              "bridge": 9, "container": 9, "loopback": 9}
FABRIC_LABELS = {"infiniband": "InfiniBand", "roce": "RoCE", "efa": "EFA",
                 "opa": "Omni-Path", "slingshot": "Slingshot"}

# Devices that belong to a container runtime, CNI plugin or hypervisor: their
# addresses are node-local plumbing, never the inter-node network.
CONTAINER_NAME = re.compile(
    r"^(docker|cni|flannel|cali|cilium|weave|kube-|vxlan\.calico|tunl|lxcbr|lxdbr|"
    r"virbr|podman|nerdctl|antrea|ovn-k8s|genev_sys|nodelocaldns)"
    r"|^br-[0-9a-f]{12}$")
# ``eth0`` is the conventional management/ssh interface (seeds: "Often this
# interface is called eth0").
MANAGEMENT_NAMES = ("eth0",)
PCI_ADDRESS = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", re.IGNORECASE)
# Devices whose sysfs ``uevent`` DEVTYPE names a software link kind.
VIRTUAL_DEVTYPES = ("vlan", "vxlan", "bond", "team", "wireguard", "geneve", "macsec",
                    "bareudp", "gtp", "ipvlan", "macvlan", "dsa")
# Software kinds that carry a physical NIC's traffic (classed like that NIC).
STACKED_KINDS = ("vlan", "bond", "team", "bond_slave", "macsec")
LINK_LOCAL_V4 = ipaddress.ip_network("169.254.0.0/16")


# --------------------------------------------------------------------------
# Reading sysfs / procfs
# --------------------------------------------------------------------------

def _read(path):
    """Stripped file content, or None when missing or unreadable.

    Several sysfs attributes (carrier, speed) raise EINVAL on a down link."""
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def _read_int(path, base=10):
    text = _read(path)
    if text is None or text == "":
        return None
    try:
        return int(text, base)
    except ValueError:
        return None


def _link_basename(path):
    """Name a sysfs symlink points to (``device/driver`` -> ``mlx5_core``)."""
    try:
        return os.path.basename(os.readlink(path).rstrip("/")) or None
    except OSError:
        return None


def _listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _parse_uevent(text):
    values = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return values


def _pci_address(device_path):
    """PCI address of a netdev's device (walks up past virtio/aux devices)."""
    if not os.path.exists(device_path):
        return None
    for part in reversed(os.path.realpath(device_path).split(os.sep)):
        if PCI_ADDRESS.match(part):
            return part.lower()
    return None


def _port_sort_key(name):
    return (0, int(name)) if name.isdigit() else (1, name)


def parse_rate_gbps(rate):
    """``"100 Gb/sec (4X EDR)"`` -> 100.0; None when not parseable."""
    match = re.match(r"\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec", rate or "")
    return float(match.group(1)) if match else None


def _state_word(text):
    """``"4: ACTIVE"`` -> ``"ACTIVE"``; ``"5: LinkUp"`` -> ``"LinkUp"``."""
    if text is None:
        return None
    return text.split(":", 1)[1].strip() if ":" in text else text.strip()


def rdma_kind(name, driver, ports):
    """Fabric kind of an RDMA device (``/sys/class/infiniband/<name>``)."""
    driver = driver or ""
    if driver == "efa" or name.startswith(("efa", "rdmap")):
        return "efa"
    if driver == "hfi1" or name.startswith("hfi1"):
        return "opa"
    if driver.startswith("cxi") or name.startswith("cxi"):
        return "slingshot"
    if any((port.get("link_layer") or "").lower() == "ethernet" for port in ports):
        return "roce"
    return "infiniband"


def gather_rdma(sysfs_root):
    """RDMA devices: name -> {name, driver, kind, pci, netdevs, ports[]}."""
    base = os.path.join(sysfs_root, "class", "infiniband")
    devices = {}
    for name in _listdir(base):
        ddir = os.path.join(base, name)
        driver = _link_basename(os.path.join(ddir, "device", "driver"))
        ports = []
        for port in sorted(_listdir(os.path.join(ddir, "ports")), key=_port_sort_key):
            pdir = os.path.join(ddir, "ports", port)
            ndevs = []
            ndev_dir = os.path.join(pdir, "gid_attrs", "ndevs")
            for index in sorted(_listdir(ndev_dir), key=_port_sort_key):
                ndev = _read(os.path.join(ndev_dir, index))
                if ndev and ndev not in ndevs:
                    ndevs.append(ndev)
            rate = _read(os.path.join(pdir, "rate"))
            ports.append({
                "port": int(port) if port.isdigit() else port,
                "state": _state_word(_read(os.path.join(pdir, "state"))),
                "phys_state": _state_word(_read(os.path.join(pdir, "phys_state"))),
                "rate": rate,
                "rate_gbps": parse_rate_gbps(rate),
                "link_layer": _read(os.path.join(pdir, "link_layer")),
                "netdevs": ndevs,
            })
        netdevs = [entry for entry in _listdir(os.path.join(ddir, "device", "net"))]
        devices[name] = {
            "name": name,
            "driver": driver,
            "kind": rdma_kind(name, driver, ports),
            "pci": _pci_address(os.path.join(ddir, "device")),
            "netdevs": netdevs,
            "ports": ports,
        }
    return devices


def _rdma_by_netdev(rdma):
    """netdev name -> [(device, port)] from device/net and gid_attrs/ndevs."""
    mapping = {}
    for device in rdma.values():
        via_gid = set()
        for port in device["ports"]:
            for ndev in port["netdevs"]:
                via_gid.add(ndev)
                mapping.setdefault(ndev, [])
                if (device, port) not in mapping[ndev]:
                    mapping[ndev].append((device, port))
        for ndev in device["netdevs"]:
            if ndev in via_gid:
                continue
            # No GID table names it: the netdev sits on the same PCI function,
            # so it is on every port of the device (mlx5, hfi1: one port).
            mapping.setdefault(ndev, [])
            for port in device["ports"]:
                mapping[ndev].append((device, port))
    return mapping


def parse_ip_addr_json(text):
    """``ip -j -d addr show`` output -> name -> {ipv4, ipv6, kind, slave_kind}.

    Raises ValueError when the text is not the expected JSON list."""
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError("expected a JSON list of links")
    links = {}
    for link in data:
        if not isinstance(link, dict) or not link.get("ifname"):
            continue
        ipv4, ipv6 = [], []
        for addr in link.get("addr_info") or []:
            local, prefix = addr.get("local"), addr.get("prefixlen")
            if local is None or prefix is None:
                continue
            cidr = "%s/%s" % (local, prefix)
            if addr.get("family") == "inet":
                ipv4.append(cidr)
            elif addr.get("family") == "inet6":
                ipv6.append(cidr)
        info = link.get("linkinfo") or {}
        links[link["ifname"]] = {
            "ipv4": ipv4,
            "ipv6": ipv6,
            "kind": info.get("info_kind"),
            "slave_kind": info.get("info_slave_kind"),
        }
    return links


def parse_fib_trie_local(text):
    """Local IPv4 addresses (``/32 host LOCAL`` leaves) of ``/proc/net/fib_trie``.

    A leaf is a ``|-- A.B.C.D`` line followed by one or more ``/LEN scope
    TYPE`` lines; the Main and Local tables repeat leaves, so duplicates are
    folded.  ``/8 host LOCAL`` (the 127/8 route) is a route, not an address."""
    addresses = []
    leaf = None
    for raw in (text or "").splitlines():
        line = raw.strip()
        if line.startswith("|--"):
            leaf = line[3:].strip()
            continue
        if line.startswith("+--") or line.endswith(":"):
            leaf = None
            continue
        fields = line.split()
        if leaf and len(fields) >= 3 and fields[0] == "/32" and fields[-1] == "LOCAL":
            if leaf not in addresses:
                addresses.append(leaf)
    return addresses


def _hex_ipv4(value):
    # /proc/net/route prints the network-order address as a host-order u32.
    return socket.inet_ntoa(struct.pack("=I", int(value, 16)))


def parse_proc_route(text):
    """``/proc/net/route`` -> [{iface, network (IPv4Network), gateway, metric}]."""
    routes = []
    lines = (text or "").splitlines()
    for line in lines[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        try:
            dest, gateway, mask = _hex_ipv4(fields[1]), _hex_ipv4(fields[2]), _hex_ipv4(fields[7])
            network = ipaddress.ip_network("%s/%s" % (dest, mask), strict=False)
            metric = int(fields[6])
        except (ValueError, struct.error):
            continue
        routes.append({"iface": fields[0], "network": network, "gateway": gateway, "metric": metric})
    return routes


def ipv4_from_proc(fib_trie_text, route_text):
    """(name -> [cidr], [unattributed address]) from fib_trie + route.

    fib_trie knows the local addresses but not their interface; the
    directly connected route (gateway 0.0.0.0) whose network holds the
    address names the interface and the prefix length.  An address whose
    link is down has no connected route and stays unattributed; two links
    in one subnet are told apart by the lowest metric only."""
    routes = [route for route in parse_proc_route(route_text)
              if route["gateway"] == "0.0.0.0" and route["network"].prefixlen > 0]
    by_iface, unattributed = {}, []
    for address in parse_fib_trie_local(fib_trie_text):
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            continue
        matches = [route for route in routes if ip in route["network"]]
        if matches:
            best = sorted(matches, key=lambda r: (-r["network"].prefixlen, r["metric"]))[0]
            by_iface.setdefault(best["iface"], []).append("%s/%d" % (address, best["network"].prefixlen))
        elif ip.is_loopback:
            by_iface.setdefault("lo", []).append("%s/8" % address)
        else:
            unattributed.append(address)
    return by_iface, unattributed


def parse_if_inet6(text):
    """``/proc/net/if_inet6`` -> name -> [cidr] (address, index, plen, scope, flags, name)."""
    by_iface = {}
    for line in (text or "").splitlines():
        fields = line.split()
        if len(fields) < 6 or len(fields[0]) != 32:
            continue
        try:
            address = ipaddress.ip_address(bytes.fromhex(fields[0]))
            prefix = int(fields[2], 16)
        except ValueError:
            continue
        by_iface.setdefault(fields[5], []).append("%s/%d" % (address.compressed, prefix))
    return by_iface


def default_route_ifaces(proc_root):
    """Interfaces that carry an IPv4 or IPv6 default route."""
    names = set()
    for route in parse_proc_route(_read(os.path.join(proc_root, "net", "route"))):
        if route["network"].prefixlen == 0:
            names.add(route["iface"])
    for line in (_read(os.path.join(proc_root, "net", "ipv6_route")) or "").splitlines():
        fields = line.split()
        if len(fields) < 10:
            continue
        try:
            flags = int(fields[8], 16)
        except ValueError:
            continue
        # RTF_UP 0x1 set, RTF_REJECT 0x200 unset: the kernel lists a reject
        # ::/0 on lo when there is no IPv6 default.
        if fields[0] == "0" * 32 and fields[1] == "00" and flags & 0x1 and not flags & 0x200 \
                and fields[9] != "lo":
            names.add(fields[9])
    return names


def addresses_from_proc(proc_root):
    """(name -> {ipv4, ipv6}, warnings) without any external tool."""
    net = os.path.join(proc_root, "net")
    warnings = []
    fib = _read(os.path.join(net, "fib_trie"))
    route = _read(os.path.join(net, "route"))
    if fib is None:
        warnings.append("%s is unreadable: no IPv4 addresses known" % os.path.join(net, "fib_trie"))
    ipv4, unattributed = ipv4_from_proc(fib, route)
    if unattributed:
        warnings.append("IPv4 address(es) %s have no connected route in %s, so their interface is "
                        "unknown (link down?)" % (", ".join(unattributed), os.path.join(net, "route")))
    ipv6 = parse_if_inet6(_read(os.path.join(net, "if_inet6")))
    links = {}
    for name in set(ipv4) | set(ipv6):
        links[name] = {"ipv4": ipv4.get(name, []), "ipv6": ipv6.get(name, []), "kind": None, "slave_kind": None}
    return links, warnings


# --------------------------------------------------------------------------
# Classification
# --------------------------------------------------------------------------

def _software_kind(name, ndir, uevent, has_device, link_type, ip_kind):
    """Software link kind (veth, bridge, vlan, tun, ...) or None for hardware."""
    if ip_kind:
        if ip_kind == "tun":
            flags = _read_int(os.path.join(ndir, "tun_flags"), 16)
            if flags is not None and flags & IFF_TAP:
                return "tap"
        return ip_kind
    devtype = uevent.get("DEVTYPE")
    if os.path.isdir(os.path.join(ndir, "bridge")) or devtype == "bridge":
        return "bridge"
    if os.path.isdir(os.path.join(ndir, "bonding")):
        return "bond"
    if devtype in VIRTUAL_DEVTYPES:
        return devtype
    tun_flags = _read_int(os.path.join(ndir, "tun_flags"), 16)
    if tun_flags is not None:
        return "tap" if tun_flags & IFF_TAP else "tun"
    if has_device:
        return None
    if name.startswith("dummy"):
        return "dummy"
    ifindex = _read_int(os.path.join(ndir, "ifindex"))
    iflink = _read_int(os.path.join(ndir, "iflink"))
    # Without `ip -d`: a software Ethernet link whose iflink names another
    # device is a veth (its peer); macvlan/ipvlan look the same and are
    # equally container plumbing.
    if link_type == ARPHRD_ETHER and ifindex and iflink and iflink != ifindex:
        return "veth"
    return None


def classify(name, link_type, flags, driver, kind, has_device, rdma_links):
    """Class of one netdev (see the module docstring for the list)."""
    driver = driver or ""
    kinds = [device["kind"] for device, _port in rdma_links]
    if link_type == ARPHRD_LOOPBACK or (flags is not None and flags & IFF_LOOPBACK) or name == "lo":
        return "loopback"
    if link_type == ARPHRD_INFINIBAND or driver == "ib_ipoib" or kind == "ipoib":
        return "opa" if (driver == "hfi1" or "opa" in kinds) else "infiniband"
    if driver == "hfi1" or "opa" in kinds:
        return "opa"
    if driver == "efa" or "efa" in kinds:
        return "efa"
    if name.startswith("hsn") or driver.startswith("cxi") or "slingshot" in kinds:
        return "slingshot"
    if "roce" in kinds:
        return "roce"
    if kind == "bridge":
        return "bridge"
    if CONTAINER_NAME.match(name):
        return "container"
    if kind in ("veth", "macvlan", "ipvlan", "macvtap", "ipvtap"):
        return "veth"
    if kind in STACKED_KINDS and link_type == ARPHRD_ETHER:
        return "ethernet"
    if has_device and link_type == ARPHRD_ETHER:
        return "ethernet"
    return "virtual"


def _is_up(operstate, flags, carrier):
    if flags is not None and not flags & IFF_UP:
        return False
    if operstate == "up":
        return True
    # lo, dummy and some tunnels never report "up", only "unknown".
    return operstate == "unknown" and carrier is True


def gather_nics(sysfs_root="/sys", proc_root="/proc", links=None):
    """Every netdev of the node: (name -> facts, rdma devices, warnings).

    ``links`` is ``parse_ip_addr_json`` output; when None, addresses come
    from ``addresses_from_proc``."""
    warnings = []
    if links is None:
        links, proc_warnings = addresses_from_proc(proc_root)
        warnings.extend(proc_warnings)
    rdma = gather_rdma(sysfs_root)
    rdma_links = _rdma_by_netdev(rdma)
    default_ifaces = default_route_ifaces(proc_root)
    base = os.path.join(sysfs_root, "class", "net")
    if not os.path.isdir(base):
        warnings.append("%s does not exist: no interfaces found" % base)
    nics = {}
    for name in _listdir(base):
        ndir = os.path.join(base, name)
        if not os.path.isdir(ndir):  # bonding_masters is a plain file
            continue
        link = links.get(name) or {}
        link_type = _read_int(os.path.join(ndir, "type"))
        flags = _read_int(os.path.join(ndir, "flags"), 16)
        operstate = (_read(os.path.join(ndir, "operstate")) or "unknown").lower()
        carrier_text = _read(os.path.join(ndir, "carrier"))
        carrier = {"1": True, "0": False}.get(carrier_text)
        speed = _read_int(os.path.join(ndir, "speed"))
        if speed is not None and (speed <= 0 or speed >= 0xFFFFFFFF):
            speed = None
        device_path = os.path.join(ndir, "device")
        has_device = os.path.exists(device_path)
        device_driver = _link_basename(os.path.join(device_path, "driver"))
        uevent = _parse_uevent(_read(os.path.join(ndir, "uevent")))
        kind = _software_kind(name, ndir, uevent, has_device, link_type, link.get("kind"))
        ports = rdma_links.get(name, [])
        nic_class = classify(name, link_type, flags, device_driver, kind, has_device, ports)
        rdma_entries = [{"device": device["name"], "port": port["port"], "state": port["state"],
                         "phys_state": port["phys_state"], "rate": port["rate"],
                         "link_layer": port["link_layer"]} for device, port in ports]
        speed_source = "sysfs" if speed is not None else None
        if speed is None and ports:
            rates = [port["rate_gbps"] for _device, port in ports if port["rate_gbps"]]
            if rates:
                speed, speed_source = int(max(rates) * 1000), "rdma_rate"
        master = _link_basename(os.path.join(ndir, "master"))
        nics[name] = {
            "name": name,
            "operstate": operstate,
            "carrier": carrier,
            "mtu": _read_int(os.path.join(ndir, "mtu")),
            "speed_mbps": speed,
            "speed_source": speed_source,
            "mac": _read(os.path.join(ndir, "address")) or None,
            "type": link_type,
            "flags": "0x%x" % flags if flags is not None else None,
            "ipv4": list(link.get("ipv4") or []),
            "ipv6": list(link.get("ipv6") or []),
            "driver": device_driver or kind,
            "kind": kind,
            "class": nic_class,
            "pci": _pci_address(device_path),
            "master": master,
            "bridge_port": os.path.isdir(os.path.join(ndir, "brport")),
            "default_route": name in default_ifaces,
            "rdma": rdma_entries,
            "is_virtual": not has_device,
            "is_up": _is_up(operstate, flags, carrier),
        }
    return nics, rdma, warnings


# --------------------------------------------------------------------------
# Selection (controller side)
# --------------------------------------------------------------------------

def usable_ipv4(nic):
    """IPv4 CIDRs of a netdev that can carry inter-node traffic.

    Loopback addresses count only on the loopback device itself, which the
    automatic choice never picks: only an explicit override (a single-node run
    on ``lo``) reaches it.
    """
    result = []
    loopback_device = (nic or {}).get("class") == "loopback"
    for cidr in (nic or {}).get("ipv4") or []:
        try:
            iface = ipaddress.ip_interface(cidr)
        except ValueError:
            continue
        if (iface.ip.is_loopback and not loopback_device) or iface.ip in LINK_LOCAL_V4:
            continue
        result.append(str(iface))
    return result


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
        networks = {ipaddress.ip_interface(cidr).network for cidr in usable_ipv4(nics.get(ifname))}
        common = networks if common is None else common & networks
    return sorted(common or [], key=str)


def _pick_address(nic, subnets):
    addresses = usable_ipv4(nic)
    for cidr in addresses:
        if ipaddress.ip_interface(cidr).network in subnets:
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
        ifnames = names
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
    else:
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
        else:
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

    ifname = ifnames[0] if ifnames else None
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

    addr_by_host = {}
    if ifname:
        subnets = _common_subnets(ifname, nics_by_host) if all(ifname in n for n in nics_by_host.values()) else []
        for host in hosts:
            cidr = _pick_address(nics_by_host[host].get(ifname), subnets)
            if cidr:
                addr_by_host[host] = cidr.split("/")[0]
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
