# -*- coding: utf-8 -*-
"""Capability ``fabric``, the controller half's ``counters`` check: the configured RDMA port counters read before the
gate's all-reduce (the reader) and after it (the probe), compared.

A counter that grew by more than ``fabric_counter_threshold`` fails (``fabric_error_counters``) or warns
(``fabric_warn_counters``).  Counters are fixed-width in the InfiniBand PortCounters attribute and stop at their
maximum instead of wrapping: an 8-bit ``link_downed`` at 255 can never grow again, so a counter at the maximum of
its width warns (the gate cannot see errors there) until someone clears it.  A port whose adapter provides no
counters (no counter folders, or ``N/A (no PMA)`` in each file) is named as not observed.
"""

from __future__ import annotations

import collections

from preflight_node.checks import failed, not_applicable, passed, skipped, warned
from preflight_node.capabilities.fabric import UNAVAILABLE

# Width in bits of the PortCounters fields (IBA 1.3, PortCounters); the traffic counters are 32-bit in PortCounters
# and 64-bit where the kernel reads PortCountersExtended, so both maxima count there; any other counter (the
# drivers' hw_counters) is 32- or 64-bit.
COUNTER_BITS = {
    "symbol_error": (16,), "link_error_recovery": (8,), "link_downed": (8,), "port_rcv_errors": (16,),
    "port_rcv_remote_physical_errors": (16,), "port_rcv_switch_relay_errors": (16,), "port_xmit_discards": (16,),
    "port_xmit_constraint_errors": (8,), "port_rcv_constraint_errors": (8,), "local_link_integrity_errors": (4,),
    "excessive_buffer_overrun_errors": (4,), "VL15_dropped": (16,), "port_xmit_wait": (32, 64),
    "port_xmit_data": (32, 64), "port_rcv_data": (32, 64), "port_xmit_packets": (32, 64),
    "port_rcv_packets": (32, 64),
}
OTHER_BITS = (32, 64)
_ABSENT = ": No such file or directory"
_FIX_ERRORS = ("on %s: the named links took errors under load: check each (%s: BER, FEC, symbol errors) and "
               "the switch side (perfquery), reseat or replace the cable / transceiver, then re-run")
_FIX_WARN = ("on %s: discards and receive-buffer or retry counters point at congestion or a slow peer: check the "
             "switch ports and the peers' counters; counters reset or ports not read again cannot be judged, "
             "re-run the gate")
_FIX_SATURATED = ("on %s: clear the saturated counters so they count again (perfquery -R -C <device> -P <port>, or "
                  "reset the HCA), then re-run; until then errors on those ports cannot be seen")


def saturated_at(name, value):
    """The width in bits whose maximum ``value`` is (the counter cannot grow any more), else None."""
    for bits in COUNTER_BITS.get(name, OTHER_BITS):
        if value == 2 ** bits - 1:
            return bits
    return None


def _after_ports(probe):
    """``{(device, port): port}`` of the probe's result."""
    return {(name, port.get("port")): port
            for name, device in ((probe or {}).get("devices") or {}).items() for port in device.get("ports") or []}


def _compare(label, before, after, names, threshold, seconds):
    """``(moved, reset, unread, saturated)`` texts for ``names`` of one port, before vs after."""
    moved, reset, unread, saturated = [], [], [], []
    for counter in names:
        old, new = (before.get("counters") or {}).get(counter), (after.get("counters") or {}).get(counter)
        if old is None or new is None:
            why = (after.get("counter_errors") or {}).get(counter) or (before.get("counter_errors") or {}).get(
                counter) or "not read"
            unread.append("%s %s: %s" % (label, counter, why))
            continue
        bits = saturated_at(counter, new) or saturated_at(counter, old)
        if bits:
            saturated.append("%s: %s is %d, the maximum of its %d bits" % (label, counter, max(old, new), bits))
        if new < old:
            reset.append("%s: %s %d -> %d" % (label, counter, old, new))
        elif new - old > threshold:
            moved.append("%s: %s %d -> %d (+%d in %.1f s)" % (label, counter, old, new, new - old, seconds))
    return moved, reset, unread, saturated


def provides_none(port):
    """Why a port gives none of the configured counters (no counter folders, or each file N/A or absent), else None
    (a counter that exists but cannot be read is not the adapter's choice)."""
    if port.get("counters"):
        return None
    if not port.get("counters_present", True):
        return "no counters in sysfs"
    errors = list((port.get("counter_errors") or {}).values())
    unavailable = [error for error in errors if error.startswith(UNAVAILABLE)]
    if errors and all(error.startswith(UNAVAILABLE) or error.endswith(_ABSENT) for error in errors):
        return unavailable[0] if unavailable else "none of the configured counters exists"
    return None


def _collect(ports, after, errors, warns, threshold, seconds):
    """Every port's comparison, grouped: ``fail``, ``warn``, ``reset``, ``unread``, ``missing``, ``saturated``,
    ``devices`` (to look at), ``none`` (ports that provide no counter); and the error counters' values before."""
    found, baseline = collections.defaultdict(list), {}
    for label, name, _device, port in ports:
        why = provides_none(port)
        if why:
            found["none"].append("%s (%s)" % (label, why))
            continue
        baseline[label] = {counter: (port.get("counters") or {}).get(counter) for counter in errors}
        later = after.get((name, port.get("port")))
        if later is None:
            found["missing"].append("%s was not read after the run" % label)
            continue
        for kind, names in (("fail", errors), ("warn", warns)):
            moved, reset, unread, saturated = _compare(label, port, later, names, threshold, seconds)
            found[kind] += moved
            if moved and kind == "fail":
                found["devices"].append("mlxlink -d %s -p %s" % (name, port.get("port")))
            found["reset"] += reset
            found["unread"] += unread
            found["saturated"] += saturated
    return found, baseline


def counters_check(host, ports, settings, facts, probe):
    """``counters``: no configured counter grew by more than the threshold between the read before the all-reduce
    and the probe after it (error counters fail, warn counters warn), none at its width's maximum; ``skipped``
    without the probe's read, ``not_applicable`` when no port provides counters."""
    errors, warns = list(settings.get("fabric_error_counters") or []), list(settings.get("fabric_warn_counters") or [])
    threshold = settings.get("fabric_counter_threshold") or 0
    expected = ("no error counter (%s) and no warn counter (%s) grew by more than %d during the gate, none at the "
                "maximum of its width" % (", ".join(errors) or "none", ", ".join(warns) or "none", threshold))
    if probe is None:
        return skipped("the counters were read once on %s: the after-gate read did not run on this node" % host,
                       expected)
    if probe.get("error") and not probe.get("devices"):
        return warned("the after-gate counter read failed on %s: %s" % (host, probe["error"]), expected,
                      "on %s: check that %s/class/infiniband is readable, then re-run"
                      % (host, settings["fabric_sysfs_root"]))
    seconds = max(0.0, float(probe.get("read_at") or 0) - float(facts.get("read_at") or 0))
    found, baseline = _collect(ports, _after_ports(probe), errors, warns, threshold, seconds)
    details = {"seconds": round(seconds, 1), "error_counters_before": baseline, "unread": found["unread"]}
    judged = len(ports) - len(found["none"])
    if ports and not judged:
        return not_applicable("no RDMA port of %s provides counters: %s" % (host, "; ".join(found["none"])), expected,
                              **details)
    compared = judged * len(errors + warns) - len(found["unread"]) - len(found["missing"]) * len(errors + warns)
    none = " (no counters, not judged: %s)" % "; ".join(found["none"]) if found["none"] else ""
    if found["fail"]:
        return _failed(host, found, expected, none, details)
    if found["warn"] or found["reset"] or found["missing"] or found["saturated"]:
        fix = (_FIX_SATURATED % host if found["saturated"] and not (found["warn"] or found["reset"] or found["missing"])
               else _FIX_WARN % host + ("; " + _FIX_SATURATED % host if found["saturated"] else ""))
        return warned("on %s: %s%s" % (host, "; ".join(_warn_texts(found)), none), expected, fix, **details)
    if not compared and errors + warns:
        return warned("no configured counter could be read on %s before and after the gate: cannot tell (%s)"
                      % (host, "; ".join(found["unread"][:4])), expected,
                      "on %s: check which counters the driver offers (ls <port>/counters <port>/hw_counters) and "
                      "list those in fabric_error_counters / fabric_warn_counters" % host, **details)
    return passed("%d counters of %d ports compared over %.1f s on %s: none grew by more than %d%s" % (
        compared, judged, seconds, host, threshold, none), expected, **details)


def _failed(host, found, expected, none, details):
    return failed("link errors during the gate on %s: %s%s%s" % (host, "; ".join(found["fail"]), _also(found), none),
                  expected, _FIX_ERRORS % (host, ", ".join(found["devices"])), **details)


def _warn_texts(found):
    texts = list(found["warn"])
    if found["saturated"]:
        texts.append("counters at their maximum cannot count errors during the gate (%s)" % "; ".join(
            found["saturated"]))
    if found["reset"]:
        texts.append("counters were reset during the run, cannot tell (%s)" % "; ".join(found["reset"]))
    texts.extend(found["missing"])
    return texts


def _also(found):
    rest = _warn_texts(found)
    return " (also: %s)" % "; ".join(rest) if rest else ""
