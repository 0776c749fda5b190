# -*- coding: utf-8 -*-
"""Capability ``fabric``, the controller half (controller layer, never shipped): RDMA port health and the error
counters that move while the gate's all-reduce runs.

A node with one InfiniBand port down, a port trained at 200 instead of 400 Gb/s, or a link whose symbol-error
or link-downed counters climb under load would still run a job, slowly or until the link drops.

* reader (node half, ``module_utils/preflight_node/fabric.py``): every port of ``/sys/class/infiniband`` (state,
  physical state, rate, link layer) and the configured counters, before the all-reduce;
* probe (``module_utils/preflight_node/fabric_probe.py``): the same counters after the all-reduce;
* here: ``validate``, ``read_args``, ``probe_args``, the decider (``ports``, ``rate``, ``counters``) and
  ``profile_fields`` for the known-good profile.  The rate reference of the whole cluster is computed once per
  cluster view (memoised on the facts mapping), so deciding every node stays linear in the nodes.
"""

from __future__ import annotations

import collections
import os

from preflight_node import fabric as node_half
from preflight_node.checks import failed, not_applicable, passed, skipped, warned

from .common import off_or_unread, switched_on

CAPABILITY = node_half.CAPABILITY

ACTIVE, LINK_UP = "ACTIVE", "LinkUp"
COUNTER_LISTS = ("fabric_error_counters", "fabric_warn_counters")
WHOLE_NUMBERS = ("fabric_expected_rate_gbps", "fabric_expected_ports", "fabric_counter_threshold")
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


def validate(settings):
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
    root = settings.get("fabric_sysfs_root")
    if not isinstance(root, str) or not os.path.isabs(root):
        problems.append(_problem("fabric_sysfs_root", repr(root), "an absolute path",
                                 "set fabric_sysfs_root to /sys on a real node"))
    return problems


def _counter_args(settings):
    names = []
    for name in COUNTER_LISTS:
        names.extend(entry for entry in settings.get(name) or [] if entry not in names)
    return {"sysfs_root": settings["fabric_sysfs_root"],
            "counters": [name for name in names if name in node_half.PORT_COUNTERS],
            "hw_counters": [name for name in names if name not in node_half.PORT_COUNTERS]}


def read_args(settings, node):
    """What ``read`` needs on ``node``: sysfs and the configured counters; None when ``fabric_enabled`` is off."""
    if not switched_on(settings.get("fabric_enabled", True)):
        return None
    return _counter_args(settings)


def probe_args(settings, node, plan=None):
    """The same counters again, for the read after the all-reduce; None when ``fabric_enabled`` is off."""
    return read_args(settings, node)


# --- the ports the checks look at -----------------------------------------------------------------------


def _label(name, device, port):
    return "%s port %s (%s)" % (name, port.get("port"), device.get("pci") or "no PCI address")


def checked_ports(facts, settings):
    """``[(label, device name, device, port)]`` of the ports the checks cover, in device order."""
    ignore = set(settings.get("fabric_ignore_devices") or [])
    ethernet = switched_on(settings.get("fabric_check_ethernet", True))
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
    elif switched_on(settings.get("fabric_check_ethernet", True)):
        reason = "every RDMA device of %s is in fabric_ignore_devices (%s)" % (
            host, ", ".join(sorted(facts["devices"])))
    else:
        reason = "%s has only RoCE ports (or ignored devices) and fabric_check_ethernet is false" % host
    applies = "an RDMA device (InfiniBand or RoCE), for the port checks to apply"
    checks = {name: not_applicable(reason, applies) for name in ("ports", "rate", "counters")}
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
    """``ports``: every port ACTIVE and LinkUp, and at least ``fabric_expected_ports`` of them active."""
    bad, no_sm, named = [], False, []
    for label, name, _device, port in ports:
        if _active(port) and port.get("phys_state") == LINK_UP:
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
        return passed("%d RDMA ports ACTIVE / LinkUp on %s" % (len(ports), host), expected, **details)
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


def cluster_rates(host, facts, settings, cluster):
    """``{link layer: (reference rate or None, [rates seen])}`` over the active ports of every node read (this
    node's alone without a cluster), each node's ports as its own settings select them.  Memoised per view."""
    every = dict((cluster or {}).get("facts") or {})
    every[host] = facts
    all_settings = (cluster or {}).get("settings") or {}
    key = (id((cluster or {}).get("facts")), id(all_settings), len(every),
           tuple(sorted(settings.get("fabric_ignore_devices") or [])),
           switched_on(settings.get("fabric_check_ethernet", True)))
    hit = _MEMO.get("rates")
    # The memo holds the mapping itself, so its id cannot be reused by another view while it is kept.
    memo = bool(cluster) and host in (cluster.get("facts") or {})
    if memo and hit and hit[0] == key and hit[1][0] is cluster.get("facts") and hit[1][1] is all_settings:
        return hit[2]
    seen = collections.defaultdict(list)
    for name in sorted(every):
        for _label, _dev, _device, port in checked_ports(every[name], all_settings.get(name) or settings):
            if _active(port) and port.get("rate_gbps") is not None:
                seen[_layer(port)].append(port["rate_gbps"])
    result = {layer: (_majority(rates), sorted(set(rates))) for layer, rates in seen.items()}
    if memo:
        _MEMO["rates"] = (key, (cluster.get("facts"), all_settings), result)
    return result


def _rate_text(gbps):
    return "%g Gb/sec" % gbps


def rate_check(host, ports, settings, facts, cluster):
    """``rate``: no active port below ``fabric_expected_rate_gbps``, or (0) the cluster's most common rate."""
    active = [entry for entry in ports if _active(entry[3])]
    if not active:
        return skipped("no ACTIVE RDMA port on %s to compare (see fabric.ports)" % host,
                       "active ports at the expected rate")
    floor = settings.get("fabric_expected_rate_gbps") or 0
    references = {} if floor else cluster_rates(host, facts, settings, cluster)
    slow, unknown, open_layers, named = [], [], set(), []
    for label, name, _device, port in active:
        if port.get("rate_gbps") is None:
            unknown.append("%s: rate %r" % (label, port.get("rate")))
            continue
        reference = floor or references.get(_layer(port), (None, []))[0]
        if reference is None:
            open_layers.add(_layer(port))
        elif port["rate_gbps"] < reference:
            named.append("mlxlink -d %s -p %s" % (name, port.get("port")))
            slow.append("%s: %s expected, %s found (%s)" % (
                label, _rate_text(reference), port.get("rate"), "the floor fabric_expected_rate_gbps" if floor
                else "the most common rate of the cluster's %s ports" % _layer(port)))
    rates = sorted(set("%s %s" % (_layer(p), p.get("rate")) for _l, _n, _d, p in active))
    expected = ("every active port at %s or more" % _rate_text(floor) if floor
                else "every active port at its link layer's most common rate in the cluster")
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
        found += " (no most common rate among the cluster's %s ports: nothing to compare)" % ", ".join(
            sorted(open_layers))
    return passed(found, expected, **details)


def _after_ports(probe):
    """``{(device, port): port}`` of the probe's result."""
    return {(name, port.get("port")): port
            for name, device in ((probe or {}).get("devices") or {}).items() for port in device.get("ports") or []}


def _compare(label, before, after, names, threshold, seconds):
    """``(moved, reset, unread)`` texts for ``names`` of one port, before vs after."""
    moved, reset, unread = [], [], []
    for counter in names:
        old, new = (before.get("counters") or {}).get(counter), (after.get("counters") or {}).get(counter)
        if old is None or new is None:
            why = (after.get("counter_errors") or {}).get(counter) or (before.get("counter_errors") or {}).get(
                counter) or "not read"
            unread.append("%s %s: %s" % (label, counter, why))
        elif new < old:
            reset.append("%s: %s %d -> %d" % (label, counter, old, new))
        elif new - old > threshold:
            moved.append("%s: %s %d -> %d (+%d in %.1f s)" % (label, counter, old, new, new - old, seconds))
    return moved, reset, unread


def counters_check(host, ports, settings, facts, probe):
    """``counters``: no configured counter grew by more than the threshold between the read before the all-reduce
    and the probe after it (error counters fail, warn counters warn); ``skipped`` without the probe's read."""
    errors, warns = list(settings.get("fabric_error_counters") or []), list(settings.get("fabric_warn_counters") or [])
    threshold = settings.get("fabric_counter_threshold") or 0
    expected = "no error counter (%s) and no warn counter (%s) grew by more than %d during the gate" % (
        ", ".join(errors) or "none", ", ".join(warns) or "none", threshold)
    if probe is None:
        return skipped("the counters were read once on %s: the after-gate read did not run on this node" % host,
                       expected)
    if probe.get("error") and not probe.get("devices"):
        return warned("the after-gate counter read failed on %s: %s" % (host, probe["error"]), expected,
                      "on %s: check that %s/class/infiniband is readable, then re-run"
                      % (host, settings["fabric_sysfs_root"]))
    seconds = max(0.0, float(probe.get("read_at") or 0) - float(facts.get("read_at") or 0))
    after, found = _after_ports(probe), collections.defaultdict(list)
    baseline = {}
    for label, name, _device, port in ports:
        baseline[label] = {counter: (port.get("counters") or {}).get(counter) for counter in errors}
        later = after.get((name, port.get("port")))
        if later is None:
            found["missing"].append("%s was not read after the run" % label)
            continue
        for kind, names in (("fail", errors), ("warn", warns)):
            moved, reset, unread = _compare(label, port, later, names, threshold, seconds)
            found[kind] += moved
            if moved and kind == "fail":
                found["devices"].append("mlxlink -d %s -p %s" % (name, port.get("port")))
            found["reset"] += reset
            found["unread"] += unread
    details = {"seconds": round(seconds, 1), "error_counters_before": baseline, "unread": found["unread"]}
    compared = len(ports) * len(errors + warns) - len(found["unread"]) - len(found["missing"]) * len(errors + warns)
    if found["fail"]:
        return failed("link errors during the gate on %s: %s%s" % (host, "; ".join(found["fail"]), _also(found)),
                      expected, _FIX_ERRORS % (host, ", ".join(found["devices"])), **details)
    if found["warn"] or found["reset"] or found["missing"]:
        return warned("on %s: %s" % (host, "; ".join(_warn_texts(found))), expected, _FIX_WARN % host, **details)
    if not compared and errors + warns:
        return warned("no configured counter could be read on %s before and after the gate: cannot tell (%s)"
                      % (host, "; ".join(found["unread"][:4])), expected,
                      "on %s: check which counters the driver offers (ls <port>/counters <port>/hw_counters) and "
                      "list those in fabric_error_counters / fabric_warn_counters" % host, **details)
    return passed("%d counters of %d ports compared over %.1f s on %s: none grew by more than %d" % (
        compared, len(ports), seconds, host, threshold), expected, **details)


_FIX_ERRORS = ("on %s: the named links took errors under load: check each (%s: BER, FEC, symbol errors) and "
               "the switch side (perfquery), reseat or replace the cable / transceiver, then re-run")
_FIX_WARN = ("on %s: discards and receive-buffer or retry counters point at congestion or a slow peer: check the "
             "switch ports and the peers' counters; counters reset or ports not read again cannot be judged, "
             "re-run the gate")


def _warn_texts(found):
    texts = list(found["warn"])
    if found["reset"]:
        texts.append("counters were reset during the run, cannot tell (%s)" % "; ".join(found["reset"]))
    texts.extend(found["missing"])
    return texts


def _also(found):
    rest = _warn_texts(found)
    return " (also: %s)" % "; ".join(rest) if rest else ""


def decide(host, facts, settings, probe=None, cluster=None):
    """``{ports, rate, counters}`` checks for ``host``; ``{enabled}`` skipped when switched off."""
    first = off_or_unread(CAPABILITY, host, settings.get("fabric_enabled", True), facts,
                          "the RDMA ports and their counters", "the ports of /sys/class/infiniband read on the node")
    if first is not None:
        return first
    if facts.get("error"):
        found = "cannot tell which RDMA ports %s has: %s" % (host, facts["error"])
        fix = "on %s: check that sysfs is mounted at %s and readable, then re-run" % (
            host, settings["fabric_sysfs_root"])
        return {name: warned(found, "the RDMA ports read", fix) for name in ("ports", "rate", "counters")}
    ports = checked_ports(facts, settings)
    if not ports:
        return _nothing_to_check(host, facts, settings)
    return {"ports": ports_check(host, ports, settings),
            "rate": rate_check(host, ports, settings, facts, cluster),
            "counters": counters_check(host, ports, settings, facts, probe)}


def profile_fields(facts):
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
