# -*- coding: utf-8 -*-
"""Capability ``job_env``: the interfaces and RDMA devices the job's environment names (controller, pure).

``NCCL_SOCKET_IFNAME`` and ``NCCL_IB_HCA`` take NCCL's list syntax (NCCL's environment documentation): a comma
list of prefixes (``eth`` matches ``eth0`` and ``eth1``), ``=`` first for exact names, ``^`` first to exclude
(``^docker,lo``; ``^=docker0``); ``NCCL_IB_HCA`` items may carry a port (``mlx5_0:1``).  NCCL takes every
interface that matches and has an address, UP or not, and uses the first for its bootstrap; it skips RDMA ports
that are not ACTIVE.  ``GLOO_SOCKET_IFNAME`` is a comma list of exact names, each of which must be UP with an
address ("Unable to find address for: <name>" otherwise).

The interfaces are ``nic_discovery``'s facts of each node, the RDMA devices ``fabric``'s (else ``nic_discovery``'s),
so what is judged here is what the gate itself saw.  ``socket_check`` is also what keeps a node out of the gate's
own all-reduce (:func:`excluded`): its ranks could not start with the job's environment.
"""

from __future__ import annotations

import ipaddress

from preflight_node.checks import failed, not_applicable, passed

NCCL_SOCKET = "NCCL_SOCKET_IFNAME"
GLOO_SOCKET = "GLOO_SOCKET_IFNAME"
IB_HCA = "NCCL_IB_HCA"
SOCKET_VARIABLES = (NCCL_SOCKET, GLOO_SOCKET)
FAMILIES = {"AF_INET": "ipv4", "AF_INET6": "ipv6"}
_MEMO = {}


# ---------------------------------------------------------------------------------------------
# syntax

def parse_list(value, ports=False):
    """NCCL's list syntax -> ``{exclude, exact, items: [(name, port or None)]}``; ValueError names what is wrong."""
    text = str(value if value is not None else "").strip()
    exclude = text.startswith("^")
    text = text[1:] if exclude else text
    exact = text.startswith("=")
    text = text[1:] if exact else text
    items = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, port = part.partition(":") if ports else (part, "", "")
        if not name or any(char.isspace() for char in name):
            raise ValueError("%r is not an interface or device name" % part)
        if sep and not port.isdigit():
            raise ValueError("%r: the port after ':' must be a number (mlx5_0:1)" % part)
        items.append((name, int(port) if sep else None))
    if not items:
        raise ValueError("%r names nothing" % value)
    return {"exclude": exclude, "exact": exact, "items": items}


def gloo_names(value):
    """``GLOO_SOCKET_IFNAME``: a comma list of exact interface names."""
    names = [part.strip() for part in str(value or "").split(",") if part.strip()]
    if not names:
        raise ValueError("%r names no interface" % value)
    return names


def matches(spec, name, port=None):
    """Whether NCCL's list ``spec`` (:func:`parse_list`) selects ``name`` (and ``port``)."""
    hit = False
    for item, wanted_port in spec["items"]:
        same = name == item if spec["exact"] else name.startswith(item)
        if same and (wanted_port is None or port is None or wanted_port == port):
            hit = True
            break
    return hit != spec["exclude"]


def syntax_problems(env):
    """``[(variable, why)]`` for the interface variables of the job environment ``env`` that do not parse."""
    problems = []
    for name, ports in ((NCCL_SOCKET, False), (IB_HCA, True)):
        if name in env:
            try:
                parse_list(env[name], ports=ports)
            except ValueError as exc:
                problems.append((name, str(exc)))
    if GLOO_SOCKET in env:
        try:
            gloo_names(env[GLOO_SOCKET])
        except ValueError as exc:
            problems.append((GLOO_SOCKET, str(exc)))
    family = env.get("NCCL_SOCKET_FAMILY")
    if family is not None and str(family) not in FAMILIES:
        problems.append(("NCCL_SOCKET_FAMILY", "%r is not AF_INET or AF_INET6" % family))
    return problems


# ---------------------------------------------------------------------------------------------
# what a node would use

def _addresses(nic, family):
    """The addresses of ``nic`` a socket of ``family`` (ipv4, ipv6 or None for both) could bind, IPv4 first."""
    found = []
    for kind in ("ipv4", "ipv6"):
        if family in (None, kind):
            found.extend(str(cidr) for cidr in nic.get(kind) or [] if not str(cidr).lower().startswith("fe80"))
    return found


def _describe(name, nic):
    state = "UP" if nic.get("is_up") else "DOWN"
    addresses = _addresses(nic, None)
    return "%s (%s%s)" % (name, state, ", " + ", ".join(addresses) if addresses else ", no address")


def usage(env, nics):
    """What the job's environment makes NCCL and gloo use on a node with interfaces ``nics``:
    ``{variable: {"spec": text, "used": [(name, [addresses])], "named_missing": [...], "down": [...]}}``."""
    family = FAMILIES.get(str(env.get("NCCL_SOCKET_FAMILY") or ""))
    found = {}
    if NCCL_SOCKET in env:
        spec = parse_list(env[NCCL_SOCKET])
        used, down = [], []
        for name in sorted(nics):
            addresses = _addresses(nics[name], family)
            if addresses and matches(spec, name):
                used.append((name, addresses))
                if not nics[name].get("is_up"):
                    down.append(name)
        found[NCCL_SOCKET] = {"spec": str(env[NCCL_SOCKET]), "used": used, "named_missing": [], "down": down}
    if GLOO_SOCKET in env:
        used, missing, down = [], [], []
        for name in gloo_names(env[GLOO_SOCKET]):
            nic = nics.get(name)
            addresses = _addresses(nic, None) if nic else []
            if not nic or not addresses:
                missing.append(name)
            elif not nic.get("is_up"):
                down.append(name)
            else:
                # gloo binds the interface's first address.
                used.append((name, addresses[:1]))
        found[GLOO_SOCKET] = {"spec": str(env[GLOO_SOCKET]), "used": used, "named_missing": missing, "down": down}
    return found


def _network(cidr):
    try:
        return ipaddress.ip_interface(cidr)
    except ValueError:
        return None


def cluster_view(cluster, env):
    """``{variable: {"networks": {network: {hosts}}, "addresses": {address: {hosts}}, "hosts": n}}`` over every
    node of ``cluster`` whose interfaces were read, for the job environment ``env``; memoised per view."""
    node_facts = (cluster or {}).get("node_facts") or {}
    key = (id(node_facts), len(node_facts), tuple(sorted((str(k), str(v)) for k, v in env.items())))
    hit = _MEMO.get("view")
    if hit and hit[0] == key and hit[1] is node_facts:
        return hit[2]
    view = {}
    for host, facts in node_facts.items():
        nics = ((facts or {}).get("nic_discovery") or {}).get("nics")
        if nics is None:
            continue
        for variable, item in usage(env, nics).items():
            entry = view.setdefault(variable, {"networks": {}, "addresses": {}, "hosts": 0})
            entry["hosts"] += 1
            for _name, addresses in item["used"]:
                for cidr in addresses:
                    parsed = _network(cidr)
                    if parsed is None or parsed.ip.is_loopback:
                        continue
                    entry["networks"].setdefault(str(parsed.network), set()).add(host)
                    entry["addresses"].setdefault(str(parsed.ip), set()).add(host)
    _MEMO["view"] = (key, node_facts, view)
    return view


# ---------------------------------------------------------------------------------------------
# the checks

def _has(nics):
    return ", ".join(_describe(name, nics[name]) for name in sorted(nics)
                     if nics[name].get("class") != "loopback") or "no interface but lo"


def _variable_problems(host, variable, item, nics, view, same_subnet, loopback_run):
    """Each problem of one variable on ``host`` as text (empty: it names something usable)."""
    problems = []
    if item["named_missing"]:
        problems.append("%s=%s: %s has no interface %s with an address" % (
            variable, item["spec"], host, ", ".join(item["named_missing"])))
    if not item["used"] and not item["named_missing"]:
        problems.append("%s=%s matches no interface with an address on %s" % (variable, item["spec"], host))
    if item["down"]:
        problems.append("%s=%s selects %s, DOWN on %s" % (variable, item["spec"], ", ".join(item["down"]), host))
    peers = (view or {}).get(variable) or {"networks": {}, "addresses": {}, "hosts": 0}
    for name, addresses in item["used"]:
        for cidr in addresses:
            parsed = _network(cidr)
            if parsed is None:
                continue
            if parsed.ip.is_loopback:
                if not loopback_run:
                    problems.append("%s=%s selects %s (%s): loopback, which no peer reaches" % (
                        variable, item["spec"], name, cidr))
                continue
            others = sorted((peers["addresses"].get(str(parsed.ip)) or set()) - {host})
            if others:
                problems.append("%s on %s holds %s, the same address as %s: a bridge local to each node "
                                "(docker0?), which no peer reaches" % (name, host, parsed.ip, ", ".join(others)))
            elif same_subnet and peers["hosts"] > 1:
                sharing = len(peers["networks"].get(str(parsed.network)) or ())
                if sharing * 2 <= peers["hosts"]:
                    problems.append("%s on %s is on %s, %s of the %d nodes" % (
                        name, host, parsed.network, "where no other is" if sharing <= 1 else "where only %d are" %
                        sharing, peers["hosts"]))
    return problems


def socket_check(host, env, nic_facts, cluster, same_subnet=True, loopback_run=False):
    """``socket_ifname``: the interfaces NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME name exist on ``host``, are UP, have
    an address, on the peers' subnet (``same_subnet``) and shared with no peer."""
    named = [variable for variable in SOCKET_VARIABLES if variable in env]
    expected = ("the interfaces the job environment names (%s) exist, UP with an address, on the peers' subnet"
                % ", ".join(named or SOCKET_VARIABLES))
    if not named:
        return not_applicable("the job environment (preflight_job_env) names no interface: NCCL and gloo choose "
                              "their own on %s" % host, expected)
    nics = (nic_facts or {}).get("nics")
    if nics is None:
        return not_applicable("no interface facts of %s (see nic_discovery): the job's interfaces could not be "
                              "compared" % host, expected)
    items = usage(env, nics)
    view = cluster_view(cluster, env) if cluster else {}
    problems = []
    for variable in named:
        problems += _variable_problems(host, variable, items[variable], nics, view, same_subnet, loopback_run)
    used = "; ".join("%s=%s uses %s" % (variable, items[variable]["spec"], ", ".join(
        "%s (%s)" % (name, ", ".join(addresses)) for name, addresses in items[variable]["used"]) or "nothing")
        for variable in named)
    if not problems:
        return passed("%s on %s" % (used, host), expected)
    return failed("%s; %s has: %s" % ("; ".join(problems), host, _has(nics)), expected,
                  "on %s: bring the named interface up with its address on the cluster network, or change %s in "
                  "preflight_job_env (and the jobs' environment) to name interfaces every node has%s" % (
                      host, "/".join(named), "" if not same_subnet else
                      " (a fabric routed between subnets: set job_env_same_subnet: false)"))


def rdma_devices(fabric_facts, nic_facts):
    """``{device: [ports]}`` of a node: the fabric capability's devices, else nic_discovery's RDMA devices."""
    devices = (fabric_facts or {}).get("devices") or (nic_facts or {}).get("rdma_devices") or {}
    return {name: list(device.get("ports") or []) for name, device in devices.items()}


def ib_check(host, env, devices, peers_with_rdma):
    """``ib_hca``: NCCL_IB_HCA selects at least one ACTIVE RDMA port on ``host``."""
    expected = "NCCL_IB_HCA selects an ACTIVE RDMA port on every node"
    if IB_HCA not in env:
        return not_applicable("the job environment (preflight_job_env) sets no NCCL_IB_HCA: NCCL takes every RDMA "
                              "device on %s" % host, expected)
    if str(env.get("NCCL_IB_DISABLE", "0")).strip() == "1" or str(env.get("NCCL_NET", "")).lower() == "socket":
        return not_applicable("the job environment turns NCCL's RDMA transport off (NCCL_IB_DISABLE / NCCL_NET): "
                              "NCCL_IB_HCA is not used on %s" % host, expected)
    spec = parse_list(env[IB_HCA], ports=True)
    if not devices:
        if peers_with_rdma:
            return failed("NCCL_IB_HCA=%s names RDMA devices, and %s has none while %s have them: NCCL falls back "
                          "to its socket transport on %s" % (env[IB_HCA], host, ", ".join(peers_with_rdma[:5]), host),
                          expected, "on %s: check the HCA and its driver (ibv_devices, nic_discovery, fabric)" % host)
        return not_applicable("no node has an RDMA device: NCCL_IB_HCA=%s selects nothing anywhere, so NCCL uses "
                              "its socket transport (no RDMA check applies to %s)" % (env[IB_HCA], host), expected)
    selected, active = [], []
    have = []
    for name in sorted(devices):
        for port in devices[name]:
            label = "%s:%s (%s)" % (name, port.get("port"), port.get("state") or "unknown")
            have.append(label)
            if matches(spec, name, port.get("port")):
                selected.append(label)
                if str(port.get("state") or "").upper() == "ACTIVE":
                    active.append(label)
    if active:
        return passed("NCCL_IB_HCA=%s selects %s on %s" % (env[IB_HCA], ", ".join(selected), host), expected)
    found = ("NCCL_IB_HCA=%s selects %s on %s" % (env[IB_HCA], "no ACTIVE port (%s)" % ", ".join(selected)
                                                 if selected else "nothing", host))
    return failed("%s; %s has: %s" % (found, host, ", ".join(have)), expected,
                  "on %s: bring the port up, or change NCCL_IB_HCA in preflight_job_env (and the jobs' environment) "
                  "to name devices every node has (ibv_devinfo lists them)" % host)


def excluded(hosts, cluster, options_of):
    """``{host: reason}``: the nodes of ``hosts`` whose ranks could not start with the job's environment (their
    ``socket_ifname`` fails), left out of the gate's own all-reduce so their peers are still proven.
    ``options_of(host)``: ``(env, same_subnet, loopback_run)`` of that node."""
    left_out = {}
    node_facts = (cluster or {}).get("node_facts") or {}
    for host in hosts:
        env, same_subnet, loopback_run = options_of(host)
        if not any(variable in env for variable in SOCKET_VARIABLES):
            continue
        nic_facts = (node_facts.get(host) or {}).get("nic_discovery")
        result = socket_check(host, env, nic_facts, cluster, same_subnet, loopback_run)
        if result["status"] == "fail":
            left_out[host] = "its job environment names no usable interface there (see job_env.socket_ifname)"
    return left_out
