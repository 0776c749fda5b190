# -*- coding: utf-8 -*-
"""Capability ``fabric``, the controller half (controller layer, never shipped): RDMA port health and the error
counters that move while the gate's all-reduce runs.

A node with one InfiniBand port down, a port trained at 200 instead of 400 Gb/s, or a link whose symbol-error
or link-downed counters climb under load would still run a job, slowly or until the link drops.

What real machines show shaped these rules: an ACTIVE port whose physical state the kernel does not know (``0:
<unknown>`` in some VMs) carries traffic; nodes mix adapters (an iWARP port at 10 Gb/s next to a QDR one at 40, NDR
InfiniBand next to 100 Gb/s Ethernet), so a port's rate is compared with ports of the same adapter type
(``hca_type``, else ``board_id``) and link layer, never with the most common rate of all; some adapters provide no
counters (``N/A (no PMA)``), which is said, not judged; and a counter at the maximum of its width (an 8-bit
``link_downed`` at 255) can no longer count, so it warns.

* reader (node half, ``module_utils/preflight_node/capabilities/fabric.py``): every port of ``/sys/class/infiniband``
  (state, physical state, rate, link layer) and the configured counters, before the all-reduce;
* probe (``module_utils/preflight_node/capabilities/fabric_probe.py``): the same counters after the all-reduce;
* here: ``validate``, ``read_args``, ``probe_args``, the decider (``ports``, ``rate``; ``counters`` in
  ``counters.py``; ``roce_gid`` in ``roce.py``; ``peer_memory``, ``pcie_acs`` and ``net_plugin`` in
  ``gpudirect.py``) and ``profile_fields`` for the known-good profile;
* writer: bring-up may disable the ACS redirect of the bridges between GPUs and NICs at boot, where
  ``fabric_acs_disable_at_boot`` opts in (``roles/fabric/tasks/main.yml``).  The rate reference of the whole
  cluster is computed once per cluster view (memoised on the facts mapping), so deciding every node stays linear in
  the nodes.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import collections
import os
import re

from preflight_node.capabilities import fabric as node_half
from preflight_node.checks import failed, not_applicable, passed, skipped, warned

from ..common import Args, Checks, Facts, Node, Problems, Settings, off_or_unread, switched_on
from .counters import counters_check
from .gpudirect import net_plugin, pcie_acs, peer_memory
from .roce import job_env, roce_gid

CAPABILITY = node_half.CAPABILITY

ACTIVE, LINK_UP = "ACTIVE", "LinkUp"
# The physical states (IB spec, sysfs phys_state) of a link that is not up; any other word on an ACTIVE port is a
# state the kernel does not know (``0: <unknown>``), not a failure.
PHYS_NOT_UP = ("Sleep", "Polling", "Disabled", "PortConfigurationTraining", "LinkErrorRecovery", "PhyTest",
               "Phy Test")
COUNTER_LISTS = ("fabric_error_counters", "fabric_warn_counters")
WHOLE_NUMBERS = ("fabric_expected_rate_gbps", "fabric_expected_ports", "fabric_counter_threshold")
CHECKS = ("ports", "rate", "counters", "roce_gid", "peer_memory", "pcie_acs", "net_plugin")
# What the node half needs of the job's environment (preflight_job_env).
JOB_ENV_KEYS = ("LD_LIBRARY_PATH", "NCCL_NET_PLUGIN", "NCCL_NET")
_MEMO = {}


# --- settings ------------------------------------------------------------------------------------------


def _problem(name, found, expected, fix):
    return {"name": name, "found": found, "expected": expected, "fix": fix}


def _names_problems(name, value):
    if not isinstance(value, (list, tuple)):
        return [_problem(name, repr(value), "a list of counter names",
                         "set %s: [symbol_error, link_downed] (or [] for none)" % name)]
    return [_problem(name, repr(entry), "a counter file name (no slash, no space), such as symbol_error",
                     "use the names ls /sys/class/infiniband/<dev>/ports/1/counters (or hw_counters) shows")
            for entry in value
            if not isinstance(entry, str) or not entry or "/" in entry or entry.strip() != entry or " " in entry]


def validate(settings: Settings) -> Problems:
    """Input problems beyond the types of meta/argument_specs.yml: ranges, names, overlaps."""
    problems = []
    for name in WHOLE_NUMBERS:
        value = settings.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            problems.append(_problem(name, repr(value), "a whole number, 0 or more",
                                     "set %s to 0 (see roles/fabric/defaults/main.yml) or a positive number" % name))
    for name in COUNTER_LISTS:
        problems.extend(_names_problems(name, settings.get(name)))
    both = set(settings.get(COUNTER_LISTS[0]) or []) & set(settings.get(COUNTER_LISTS[1]) or [])
    if both and all(isinstance(settings.get(name), (list, tuple)) for name in COUNTER_LISTS):
        problems.append(_problem("fabric_warn_counters", ", ".join(sorted(both)),
                                 "each counter in only one of fabric_error_counters and fabric_warn_counters",
                                 "remove %s from one of the two lists" % ", ".join(sorted(both))))
    ignore = settings.get("fabric_ignore_devices")
    if not isinstance(ignore, (list, tuple)) or not all(isinstance(entry, str) and entry for entry in ignore):
        problems.append(_problem("fabric_ignore_devices", repr(ignore), "a list of RDMA device names such as mlx5_4",
                                 "set fabric_ignore_devices: [] or the names ls /sys/class/infiniband shows"))
    for name, real in (("fabric_sysfs_root", "/sys"), ("fabric_root", "/")):
        root = settings.get(name)
        if not isinstance(root, str) or not os.path.isabs(root):
            problems.append(_problem(name, repr(root), "an absolute path", "set %s to %s on a real node" % (name, real)))
    program = settings.get("fabric_lspci")
    if not isinstance(program, str) or not program.strip() or any(char.isspace() for char in program):
        problems.append(_problem("fabric_lspci", repr(program), "a program name or absolute path, without spaces",
                                 "set fabric_lspci: lspci"))
    for name in ("fabric_tool_timeout", "fabric_acs_grub_update_timeout"):
        value = settings.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(_problem(name, repr(value), "a whole number of seconds above 0",
                                     "set %s to a positive number of seconds (roles/fabric/defaults)" % name))
    return problems


def _counter_args(settings):
    names = []
    for name in COUNTER_LISTS:
        names.extend(entry for entry in settings.get(name) or [] if entry not in names)
    return {"sysfs_root": settings["fabric_sysfs_root"],
            "counters": [name for name in names if name in node_half.PORT_COUNTERS],
            "hw_counters": [name for name in names if name not in node_half.PORT_COUNTERS]}


def read_args(settings: Settings, node: Node) -> Args:
    """What ``read`` needs on ``node``: sysfs, the configured counters, lspci and the parts of the job's environment
    that say where NCCL's network plugin is; None when ``fabric_enabled`` is off."""
    if not switched_on(settings["fabric_enabled"]):
        return None
    env = job_env(settings)
    return dict(_counter_args(settings), lspci=settings["fabric_lspci"],
                tool_timeout=int(settings["fabric_tool_timeout"]), root=settings["fabric_root"],
                job_env={key: str(env[key]) for key in JOB_ENV_KEYS if key in env})


def probe_args(settings: Settings, node: Node, plan: Optional[dict] = None) -> Args:
    """The same counters again, for the read after the all-reduce; None when ``fabric_enabled`` is off."""
    if not switched_on(settings["fabric_enabled"]):
        return None
    return _counter_args(settings)


# --- the ports the checks look at -----------------------------------------------------------------------


def _label(name, device, port):
    return "%s port %s (%s)" % (name, port.get("port"), device.get("pci") or "no PCI address")


def checked_ports(facts, settings):
    """``[(label, device name, device, port)]`` of the ports the checks cover, in device order."""
    ignore = set(settings.get("fabric_ignore_devices") or [])
    ethernet = switched_on(settings["fabric_check_ethernet"])
    chosen = []
    for name in sorted((facts or {}).get("devices") or {}):
        if name in ignore:
            continue
        device = facts["devices"][name]
        for port in device.get("ports") or []:
            if not ethernet and (port.get("link_layer") or "").lower() == "ethernet":
                continue
            chosen.append((_label(name, device, port), name, device, port))
    return chosen


def _active(port):
    return port.get("state") == ACTIVE


def _nothing_to_check(host, facts, settings):
    """Checks for a node with no port to look at; None when there is one."""
    root = facts.get("root") or os.path.join(settings["fabric_sysfs_root"], "class", "infiniband")
    if not facts.get("devices"):
        reason = "no RDMA device in %s on %s" % (root, host)
    elif switched_on(settings["fabric_check_ethernet"]):
        reason = "every RDMA device of %s is in fabric_ignore_devices (%s)" % (
            host, ", ".join(sorted(facts["devices"])))
    else:
        reason = "%s has only RoCE ports (or ignored devices) and fabric_check_ethernet is false" % host
    applies = "an RDMA device (InfiniBand, RoCE or EFA), for the fabric checks to apply"
    checks = {name: not_applicable(reason, applies) for name in CHECKS}
    wanted = settings.get("fabric_expected_ports") or 0
    if wanted:
        checks["ports"] = failed(
            "%s: 0 active RDMA ports, fabric_expected_ports is %d" % (reason, wanted),
            "%d active RDMA ports" % wanted,
            "on %s: check that the HCAs are seen (lspci | grep -i mellanox) and their driver is loaded "
            "(ibstat, ls %s), or set fabric_expected_ports: 0" % (host, root))
    return checks


# --- decider -------------------------------------------------------------------------------------------


def ports_check(host, ports, settings):
    """``ports``: every port ACTIVE and LinkUp (or ACTIVE in a physical state the kernel does not name), and at least
    ``fabric_expected_ports`` of them active."""
    bad, no_sm, named, unknown = [], False, [], []
    for label, name, _device, port in ports:
        if _active(port) and port.get("phys_state") == LINK_UP:
            continue
        if _active(port) and port.get("phys_state") not in PHYS_NOT_UP:
            unknown.append("%s: %r" % (label, port.get("phys_state")))
            continue
        text = "%s: state %s, phys_state %s" % (label, port.get("state"), port.get("phys_state"))
        named.append("ibstat %s %s" % (name, port.get("port")))
        if port.get("state") == "INIT" and (port.get("link_layer") or "").lower() != "ethernet":
            text += " (INIT: the link trained but no subnet manager configured the port)"
            no_sm = True
        bad.append(text)
    active = sum(1 for _label, _name, _device, port in ports if _active(port))
    wanted = settings.get("fabric_expected_ports") or 0
    expected = "every RDMA port ACTIVE / LinkUp%s" % (" and %d active ports" % wanted if wanted else "")
    details = {"ports": ["%s: %s / %s" % (label, port.get("state"), port.get("phys_state"))
                         for label, _name, _device, port in ports]}
    if wanted > active:
        bad.append("%d active RDMA ports on %s, fabric_expected_ports is %d" % (active, host, wanted))
    if not bad:
        found = "%d RDMA ports ACTIVE / LinkUp on %s" % (len(ports) - len(unknown), host)
        if unknown:
            found += "; %d ACTIVE whose physical state the kernel does not name (%s): the logical state is what " \
                     "carries traffic" % (len(unknown), "; ".join(unknown))
        return passed(found, expected, **details)
    fix = ("on %s: %s; phys_state Polling or Disabled: check the cable, "
           "transceiver and the switch port (ibportstate <lid> <port> query)" % (
               host, ", ".join(named) or "ibstat"))
    if no_sm:
        fix += "; state INIT: no subnet manager answers (sminfo), start or check opensm / the fabric's SM"
    return failed("%s on %s" % ("; ".join(bad), host), expected, fix + ", then re-run", **details)


def _majority(rates):
    """The most common rate of ``rates`` when one rate is more common than every other, else None."""
    counts = collections.Counter(rates).most_common(2)
    if not counts or (len(counts) == 2 and counts[0][1] == counts[1][1]):
        return None
    return counts[0][0]


def _layer(port):
    return port.get("link_layer") or "unknown link layer"


def adapter_type(name, device):
    """The kind of adapter a device is: its ``hca_type`` (MT4129), else its ``board_id``, else its driver, else its
    name without the number (``hfi1``)."""
    return (device.get("hca_type") or device.get("board_id") or device.get("driver")
            or re.sub(r"_?[0-9]+$", "", name) or name)


def _group(name, device, port):
    """The ports whose rates are compared: same link layer, same adapter type."""
    return "%s %s" % (_layer(port), adapter_type(name, device))


def cluster_rates(host, facts, settings, cluster):
    """``{group: (reference rate or None, [rates seen])}`` over the active ports of every node read (this node's
    alone without a cluster), each node's ports as its own settings select them; a group is a link layer and an
    adapter type (:func:`_group`).  Memoised per view."""
    every = dict((cluster or {}).get("facts") or {})
    every[host] = facts
    all_settings = (cluster or {}).get("settings") or {}
    key = (id((cluster or {}).get("facts")), id(all_settings), len(every),
           tuple(sorted(settings.get("fabric_ignore_devices") or [])),
           switched_on(settings["fabric_check_ethernet"]))
    hit = _MEMO.get("rates")
    # The memo holds the mapping itself, so its id cannot be reused by another view while it is kept.
    memo = bool(cluster) and host in (cluster.get("facts") or {})
    if memo and hit and hit[0] == key and hit[1][0] is cluster.get("facts") and hit[1][1] is all_settings:
        return hit[2]
    seen = collections.defaultdict(list)
    for name in sorted(every):
        for _label, device_name, device, port in checked_ports(every[name], all_settings.get(name) or settings):
            if _active(port) and port.get("rate_gbps") is not None:
                seen[_group(device_name, device, port)].append(port["rate_gbps"])
    result = {layer: (_majority(rates), sorted(set(rates))) for layer, rates in seen.items()}
    if memo:
        _MEMO["rates"] = (key, (cluster.get("facts"), all_settings), result)
    return result


def _rate_text(gbps):
    return "%g Gb/sec" % gbps


def rate_check(host, ports, settings, facts, cluster):
    """``rate``: no active port below ``fabric_expected_rate_gbps``, or (0) the most common rate of the cluster's ports
    of its adapter type and link layer."""
    active = [entry for entry in ports if _active(entry[3])]
    if not active:
        return skipped("no ACTIVE RDMA port on %s to compare (see fabric.ports)" % host,
                       "active ports at the expected rate")
    floor = settings.get("fabric_expected_rate_gbps") or 0
    references = {} if floor else cluster_rates(host, facts, settings, cluster)
    slow, unknown, open_layers, named = [], [], set(), []
    for label, name, device, port in active:
        if port.get("rate_gbps") is None:
            unknown.append("%s: rate %r" % (label, port.get("rate")))
            continue
        group = _group(name, device, port)
        reference = floor or references.get(group, (None, []))[0]
        if reference is None:
            open_layers.add(group)
        elif port["rate_gbps"] < reference:
            named.append("mlxlink -d %s -p %s" % (name, port.get("port")))
            slow.append("%s: %s expected, %s found (%s)" % (
                label, _rate_text(reference), port.get("rate"), "the floor fabric_expected_rate_gbps" if floor
                else "the most common rate of the cluster's %s ports" % group))
    rates = sorted(set("%s %s" % (_group(n, d, p), p.get("rate")) for _l, n, d, p in active))
    expected = ("every active port at %s or more" % _rate_text(floor) if floor
                else "every active port at the most common rate of the cluster's ports of its adapter type and link "
                     "layer")
    details = {"rates": rates, "no_majority": sorted(open_layers)}
    if slow:
        return failed("%s on %s" % ("; ".join(slow), host), expected,
                      "on %s: a cable or transceiver trained down: check each named port (%s: speed, FEC, errors), "
                      "reseat or replace the cable / transceiver, check the switch port, then re-run"
                      % (host, ", ".join(named)), **details)
    if unknown:
        return warned("%s on %s: the rate cannot be read" % ("; ".join(unknown), host), expected,
                      "on %s: cat the port's rate file and ibstat <device>; re-run once it reads" % host, **details)
    found = "%d active ports on %s at %s" % (len(active), host, ", ".join(rates))
    if open_layers:
        found += " (no most common rate among the cluster's %s ports: nothing to compare; a profile's " \
                 "rdma.rate_gbps or fabric_expected_rate_gbps sets one)" % ", ".join(sorted(open_layers))
    return passed(found, expected, **details)


def decide(host: str, facts: Facts, settings: Settings, probe: Optional[dict] = None,
           cluster: Optional[dict] = None) -> Checks:
    """``{ports, rate, counters, roce_gid, peer_memory, pcie_acs, net_plugin}`` checks for ``host``; ``{enabled}``
    skipped when switched off."""
    first = off_or_unread(CAPABILITY, host, settings["fabric_enabled"], facts,
                          "the RDMA ports and their counters", "the ports of /sys/class/infiniband read on the node")
    if first is not None:
        return first
    if facts.get("error"):
        found = "cannot tell which RDMA ports %s has: %s" % (host, facts["error"])
        fix = "on %s: check that sysfs is mounted at %s and readable, then re-run" % (
            host, settings["fabric_sysfs_root"])
        return {name: warned(found, "the RDMA ports read", fix) for name in CHECKS}
    ports = checked_ports(facts, settings)
    if not ports:
        return _nothing_to_check(host, facts, settings)
    return {"ports": ports_check(host, ports, settings),
            "rate": rate_check(host, ports, settings, facts, cluster),
            "counters": counters_check(host, ports, settings, facts, probe),
            "roce_gid": roce_gid(host, ports, settings),
            "peer_memory": peer_memory(host, facts, settings, ports),
            "pcie_acs": pcie_acs(host, facts, settings, ports),
            "net_plugin": net_plugin(host, facts, settings, ports)}


def profile_fields(facts: Facts) -> Dict[str, Any]:
    """The node's fabric in the known-good profile: ``rdma.active_ports``, ``rdma.rate_gbps`` (lowest active rate),
    ``rdma.link_layer`` (sorted, comma-joined), ``rdma.devices``; every value None when nothing was read."""
    if not facts or not isinstance(facts.get("devices"), dict):
        return {"rdma.active_ports": None, "rdma.rate_gbps": None, "rdma.link_layer": None, "rdma.devices": None}
    active = [port for device in facts["devices"].values() for port in device.get("ports") or [] if _active(port)]
    rates = [port["rate_gbps"] for port in active if port.get("rate_gbps") is not None]
    layers = sorted(set(port.get("link_layer") or "" for device in facts["devices"].values()
                        for port in device.get("ports") or []) - {""})
    return {"rdma.active_ports": len(active), "rdma.rate_gbps": min(rates) if rates else None,
            "rdma.link_layer": ",".join(layers), "rdma.devices": len(facts["devices"])}
