# -*- coding: utf-8 -*-
"""Network interfaces of a node: the gathering half of ``nic_discovery`` (node layer).

Runs on each node, read-only: ``gather_nics`` reads
``<sysfs_root>/class/net`` and ``<sysfs_root>/class/infiniband`` and
classifies every interface; addresses come either from parsed
``ip -j -d addr show`` output (``parse_ip_addr_json``) or, without any
external tool, from ``<proc_root>/net/fib_trie`` + ``<proc_root>/net/route``
(IPv4) and ``<proc_root>/net/if_inet6`` (IPv6).

Which interface NCCL and gloo must use across the nodes (``select_interface``,
the per-node checks) is the controller's decision, in ``cluster_preflight/capabilities/nic_discovery/nic_select.py``.

Interface classes (``classify``), best first for inter-node collectives:

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

ARPHRD_ETHER = 1
ARPHRD_INFINIBAND = 32
ARPHRD_LOOPBACK = 772
IFF_UP = 0x1
IFF_LOOPBACK = 0x8
IFF_TUN = 0x1
IFF_TAP = 0x2

# Devices that belong to a container runtime, CNI plugin or hypervisor: their
# addresses are node-local plumbing, never the inter-node network.
CONTAINER_NAME = re.compile(
    r"^(docker|cni|flannel|cali|cilium|weave|kube-|vxlan\.calico|tunl|lxcbr|lxdbr|"
    r"virbr|podman|nerdctl|antrea|ovn-k8s|genev_sys|nodelocaldns)"
    r"|^br-[0-9a-f]{12}$")
PCI_ADDRESS = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", re.IGNORECASE)
# Devices whose sysfs ``uevent`` DEVTYPE names a software link kind.
VIRTUAL_DEVTYPES = ("vlan", "vxlan", "bond", "team", "wireguard", "geneve", "macsec",
                    "bareudp", "gtp", "ipvlan", "macvlan", "dsa")
# Software kinds that carry a physical NIC's traffic (classed like that NIC).
STACKED_KINDS = ("vlan", "bond", "team", "bond_slave", "macsec")


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

