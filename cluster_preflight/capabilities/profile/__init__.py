# -*- coding: utf-8 -*-
"""Capability ``profile``, the controller half (there is no node half): every node compared with the known-good
profile of its group, or, without one, with the other nodes of the run.

The fields (``cluster_preflight/capabilities/profile/known_good.py``) come from the other capabilities' facts
(``gpu_health``,
``fabric``, ``allreduce``) and from the all-node and single-node all-reduce runs; ``stages.stage_final`` gathers
them once the gate's results are in and calls :func:`decide_all`.  Each difference is a finding
``profile.<field>`` with field / found / expected / fix; ``profile.summary`` carries the node's fields (what
``python -m cluster_preflight baseline`` records).
"""

from __future__ import annotations

import collections
import functools
import os

from preflight_node.checks import blocked, check, failed, passed, skipped

from cluster_preflight.capabilities.profile import known_good as profiles
from ..common import Args, Node, Problems, Settings, switched_on

CAPABILITY = "profile"
# Fields whose busbw may be below the profile's by the tolerance; every other ``floor`` field is a count or rate.
TOLERATED = ("allreduce.busbw_gbps", "allreduce.single_node_busbw_gbps")
# Fields that are the same on every node of a run: never a per-node outlier.
RUN_WIDE = ("allreduce.busbw_gbps", "allreduce.largest_size", "allreduce.backend")


def _problem(name, found, expected, fix):
    return {"name": name, "found": found, "expected": expected, "fix": fix}


def validate(settings: Settings) -> Problems:
    problems = []
    path = settings.get("profile_file") or ""
    if path and not os.path.isabs(path):
        problems.append(_problem("profile_file", path, "an absolute path (group_vars: use "
                                 "\"{{ inventory_dir }}/profiles/NAME.yml\")", "make profile_file absolute"))
    elif path:
        try:
            profiles.load(path)
        except profiles.ProfileError as exc:
            problems.append(_problem("profile_file", str(exc), "a profile written by python -m cluster_preflight "
                                     "baseline", "record one with python -m cluster_preflight baseline -i INVENTORY, "
                                     "or set profile_file to \"\" to compare the nodes with each other"))
    tolerance = settings["profile_busbw_tolerance"]
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
        problems.append(_problem("profile_busbw_tolerance", repr(tolerance), "a fraction from 0 to below 1",
                                 "leave it at 0.2 (busbw down to 80% of the profile's passes)"))
    if settings["profile_majority_min_nodes"] < 2:
        problems.append(_problem("profile_majority_min_nodes", settings.get("profile_majority_min_nodes"),
                                 "2 or more", "leave it at 3"))
    return problems


def read_args(settings: Settings, node: Node) -> Args:
    """Nothing is read on the node for the profile: its fields come from the other capabilities."""
    return None


# --- decider --------------------------------------------------------------------------------------------------


def _display(value):
    return "not measured" if value is None else str(value)


def compare(host, field, found, expected, tolerance, against):
    """One field of ``host`` against ``expected`` (from ``against``: the profile file or the majority)."""
    spec = profiles.BY_NAME[field]
    what = "%s on %s" % (field, host)
    if spec.kind == "exact":
        wanted = "%s = %s (%s)" % (field, expected, against)
        ok = str(found) == str(expected)
    else:
        floor = float(expected) * (1 - tolerance) if field in TOLERATED else float(expected)
        wanted = "%s at least %s (%s%s)" % (field, round(floor, 3), against,
                                            ", %s less %d%%" % (expected, tolerance * 100) if field in TOLERATED
                                            else "")
        ok = float(found) >= floor
    if ok:
        return passed("%s: %s" % (what, _display(found)), wanted, field=field, value=found)
    return failed("%s: %s" % (what, _display(found)), wanted, "%s (node %s)" % (spec.fix, host), field=field,
                  value=found, profile_value=expected)


def _tally(values):
    """``(known, value, count)`` of ``values``: how many are known (not None), the most frequent known value (by
    its text; the first of them as given) and how many hold it; ``(0, None, 0)`` when none is known."""
    counts, first = collections.Counter(), {}
    for item in values:
        if item is not None:
            text = str(item)
            counts[text] += 1
            first.setdefault(text, item)
    if not counts:
        return 0, None, 0
    text, count = counts.most_common(1)[0]
    return sum(counts.values()), first[text], count


def _majority_of(tally, minimum):
    """The value held by more than half of the known values of ``tally`` (at least ``minimum`` of them), or None."""
    known, value, count = tally
    if known < minimum or count * 2 <= known:
        return None
    return value


def _loaded(path, cache):
    if path not in cache:
        try:
            cache[path] = profiles.load(path)
        except profiles.ProfileError as exc:
            cache[path] = exc
    return cache[path]


# The capabilities whose checks measure the fields the all-reduce runs give, by a field's first part (the others'
# are those whose ``profile_fields`` return it: :func:`measured_by`).
RUN_MEASURED_BY = {"torch": ("allreduce",), "nccl": ("allreduce", "port_mesh"),
                   "allreduce": ("allreduce", "port_mesh", "nic_discovery")}
RUN = "preflight"


@functools.lru_cache(maxsize=None)
def measured_by():
    """The capabilities whose checks measure a field, by its first part: a failure there (or of the run itself) is
    why the field was not measured, never the profile.  A capability with ``profile_fields`` measures the fields it
    returns (``gpu_health``: ``gpu``, ``fabric``: ``rdma``)."""
    from cluster_preflight import capabilities  # pylint: disable=import-outside-toplevel  (it loads this module)
    found = dict(RUN_MEASURED_BY)
    for module in capabilities.ORDER:
        if hasattr(module, "profile_fields"):
            for prefix in dict.fromkeys(field.split(".")[0] for field in module.profile_fields(None)):
                found[prefix] = found.get(prefix, ()) + (module.CAPABILITY,)
    return found


def failures_of(checks):
    """``["capability.name"]`` of every check of ``checks`` (``{capability: {name: check}}``) that failed or was
    blocked, the profile's own left out: what may have kept a field from being measured."""
    found = []
    for capability, named in sorted((checks or {}).items()):
        if capability == CAPABILITY:
            continue
        for name, result in sorted((named or {}).items()):
            if result.get("status") == "fail" or (result.get("details") or {}).get("blocked"):
                found.append("%s.%s" % (capability, name))
    return found


def _unmeasured(host, field, expected, path, failures):
    """A field the profile holds that this run did not measure on ``host``: blocked by the failure that kept it
    from being measured when there is one (fix that; the profile is right), else by its check not running."""
    wanted = "%s = %s (profile %s)" % (field, expected, path)
    sources = measured_by().get(field.split(".")[0], ())
    cause = [name for name in failures if name.split(".")[0] in sources + (RUN,)] or list(failures)
    if cause:
        return check("skipped", "%s was not measured on %s: blocked by %s" % (field, host, ", ".join(cause)),
                     wanted, "fix %s on %s first (each finding says how); the profile needs no change"
                     % (", ".join(cause), host), blocked=True, blocked_by=cause)
    return blocked("%s was not measured on %s (see the %s checks of this node)" % (field, host, field.split(".")[0]),
                   wanted, "make the check that measures it run on %s, or remove %s from the profile" % (host, field))


def _with_profile(host, fields, data, path, tolerance, failures=()):
    checks = {}
    for field, expected in data["fields"].items():
        found = fields.get(field)
        if found is None:
            checks[profiles.check_name(field)] = _unmeasured(host, field, expected, path, failures)
        else:
            checks[profiles.check_name(field)] = compare(host, field, found, expected, tolerance, "profile %s" % path)
    return checks


def _with_majority(host, fields, tallies, settings):
    """``host``'s fields against the majority of the nodes without a profile (``tallies``: field -> its
    :func:`_tally` over those nodes, counted once for the run)."""
    checks = {}
    minimum = settings["profile_majority_min_nodes"]
    for field in profiles.BY_NAME:
        # Bandwidth needs a known-good value: without one the gate's floors and localisation judge it (a
        # median of peers is no known-good value, and run-to-run noise would name healthy nodes).
        if field in RUN_WIDE or field in TOLERATED or fields.get(field) is None:
            continue
        expected = _majority_of(tallies[field], minimum)
        if expected is not None:
            checks[profiles.check_name(field)] = compare(
                host, field, fields[field], expected, settings["profile_busbw_tolerance"],
                "the majority of the %d nodes without a profile" % tallies[field][0])
    return checks


def _tallies(fields_of_peers):
    """Field -> :func:`_tally` of its values over ``fields_of_peers`` (the nodes without a profile)."""
    return {field: _tally([fields.get(field) for fields in fields_of_peers]) for field in profiles.BY_NAME
            if field not in RUN_WIDE and field not in TOLERATED}


def decide_all(hosts, fields_by_host, settings_by_host, failures_by_host=None):
    """``{host: {check: result}}``: each node against its profile, or the majority of the nodes without one.
    ``failures_by_host``: each node's failed or blocked checks of the other capabilities (:func:`failures_of`), which
    a field the profile holds but this run did not measure is blocked by."""
    cache, checks_by_host = {}, {}
    without = [host for host in hosts if switched_on(settings_by_host[host].get("profile_enabled", True))
               and not settings_by_host[host].get("profile_file")]
    tallies = _tallies([fields_by_host.get(peer) or {} for peer in without]) if without else {}
    for host in hosts:
        settings, fields = settings_by_host[host], fields_by_host.get(host) or {}
        if not switched_on(settings["profile_enabled"]):
            checks_by_host[host] = {"enabled": skipped("profile_enabled is false on %s" % host,
                                                       "the node compared with its known-good profile")}
            continue
        path = settings.get("profile_file") or ""
        summary = {"fields": fields, "profile": path or None}
        if path:
            data = _loaded(path, cache)
            if isinstance(data, profiles.ProfileError):
                checks_by_host[host] = {"file": failed(
                    "the profile of %s cannot be used: %s" % (host, data), "a profile written by baseline",
                    "record it again with python -m cluster_preflight baseline -i INVENTORY")}
                continue
            checks = _with_profile(host, fields, data, path, settings["profile_busbw_tolerance"],
                                   (failures_by_host or {}).get(host) or ())
            against = "the profile %s (%d fields)" % (path, len(data["fields"]))
        else:
            checks = _with_majority(host, fields, tallies, settings)
            against = ("the majority of the %d nodes without a profile (%d fields compared)" % (len(without),
                                                                                                len(checks)))
        measured = sorted(name for name, value in fields.items() if value is not None)
        checks["summary"] = passed("%s: %d fields measured (%s), compared with %s" % (
            host, len(measured), ", ".join(measured) or "none", against),
            "every node like the known-good profile of its group", **summary)
        checks_by_host[host] = checks
    return checks_by_host
