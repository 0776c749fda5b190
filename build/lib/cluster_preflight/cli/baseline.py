# -*- coding: utf-8 -*-
"""``python -m cluster_preflight baseline``: record a known-good profile per inventory group (controller layer).

From gates that passed (the latest one of this cluster by default, the runs named with ``--from``, or a gate run
now with ``--run-gate``: ``cluster_preflight/cli/main.py`` chooses), every node's measured fields (its
``profile.summary`` check) are folded per inventory group into one profile
(``cluster_preflight/capabilities/profile/known_good.py``): the
value most nodes agree on for an exact field, and for a floor (a count, a rate, a busbw) the lowest node's value,
each node's value being the lower median of its runs when there are several (one noisy run neither lowers nor
raises a floor).  Nodes and runs that disagree are listed, never hidden.  The files go to
``<inventory dir>/profiles/<group>.yml`` (``--out``), outside any inventory source, and each group is pointed at
its file in the inventory's ``group_vars/<group>.yml`` (:func:`wire`), as NHC's nhc-genconf does for its
configuration.
"""

from __future__ import annotations

import collections
import datetime
import os
import statistics

import yaml

from ..capabilities.profile import known_good as profiles
from ..verdict.accounting import atomic_write
from ..outputs.cluster_names import load_inventory
from ..outputs.history import cluster_key
from ..verdict.file import VerdictError, load

SKIPPED_GROUPS = ("all", "ungrouped")
VERDICT_FILE = "verdict.json"


class BaselineError(ValueError):
    """A profile that cannot be recorded; one line for the operator."""


def inventory_groups(inventory):
    """``{group: [hosts]}`` of an inventory (file or directory), through Ansible's own inventory loader."""
    manager, _variables = load_inventory(inventory)
    return {str(name): [str(host.name) for host in group.get_hosts()] for name, group in manager.groups.items()
            if name not in SKIPPED_GROUPS}


def default_out_dir(inventory):
    """``<inventory file's directory>/profiles``: next to the inventory file, never inside an inventory source.
    An inventory given as a directory has no such place (anything under it is read as inventory)."""
    if os.path.isdir(inventory):
        raise BaselineError("the inventory %s is a directory: a profile under it would be read as inventory; pass "
                            "--out DIR outside it (and point each group's profile_file there)" % inventory)
    return os.path.join(os.path.dirname(os.path.abspath(inventory)), "profiles")


def latest_passing(results_dir, cluster):
    """``(path, verdict)`` of the newest gate in ``results_dir`` that passed on the cluster whose history key is
    ``cluster``, or None.  Run directories are named by their UTC start, so the newest is the last by name."""
    try:
        names = sorted((name for name in os.listdir(results_dir) if name != "latest" and not name.startswith(".")),
                       reverse=True)
    except OSError:
        return None
    for name in names:
        path = os.path.join(results_dir, name, VERDICT_FILE)
        if not os.path.isfile(path):
            continue
        try:
            raw = load(path)
        except VerdictError:
            continue
        if raw.get("status") == "pass" and "allreduce" in raw and cluster_key(raw.get("cluster")) == cluster:
            return path, raw
    return None


def node_fields(raw, path=""):
    """``{host: fields}`` from a verdict's ``profile.summary`` checks; raises BaselineError when the verdict
    did not pass or carries no fields."""
    where = " (%s)" % path if path else ""
    if raw.get("status") != "pass":
        raise BaselineError("the run's verdict%s is %s, not pass: a profile is recorded only from a run that "
                            "passed (fix what it names and run again)" % (where, raw.get("status")))
    fields = {}
    for host, node in (raw.get("nodes") or {}).items():
        summary = (node.get("checks") or {}).get("profile.summary") or {}
        details = summary.get("details") or {}
        if "fields" not in details:
            raise BaselineError("node %s has no profile.summary in the verdict%s (profile_enabled false?): enable "
                                "the profile capability and run again" % (host, where))
        fields[host] = details["fields"]
    if not fields:
        raise BaselineError("the verdict%s names no node" % where)
    return fields


def _floor(field, per_host, runs):
    """A floor field: each node's lower median over its runs, the group's the lowest node's; a note when the
    runs of a node differ."""
    medians = {host: statistics.median_low(values) for host, values in per_host.items()}
    floor = min(medians.values())
    note = None
    if runs > 1 and any(len(set(values)) > 1 for values in per_host.values()):
        spread = ", ".join("%s=%s" % (host, "/".join(str(value) for value in values))
                           for host, values in sorted(per_host.items()))
        note = ("%s: recorded %s, the lowest node's median over %d runs (per node, run by run: %s)"
                % (field, floor, runs, spread))
    return floor, note


def fold(fields_by_host, runs=1):
    """``(fields, notes)``: one profile from the nodes' fields (``{host: fields}``, or ``{host: [fields of each
    run]}`` when ``runs`` > 1), and ``[text]`` for nodes and runs that differ."""
    folded, notes = {}, []
    per_run = {host: value if isinstance(value, list) else [value] for host, value in fields_by_host.items()}
    for field in profiles.FIELDS:
        per_host = {host: [item[field.name] for item in items if item.get(field.name) is not None]
                    for host, items in per_run.items()}
        per_host = {host: values for host, values in per_host.items() if values}
        if not per_host:
            continue
        if field.kind == "floor":
            folded[field.name], note = _floor(field.name, per_host, runs)
            notes += [note] if note else []
            continue
        values = [(host, value) for host, items in sorted(per_host.items()) for value in items]
        counts = collections.Counter(str(value) for _host, value in values)
        top, _count = counts.most_common(1)[0]
        folded[field.name] = next(value for _host, value in values if str(value) == top)
        others = sorted(dict.fromkeys("%s=%s" % (host, value) for host, value in values if str(value) != top))
        if others:
            notes.append("%s: recorded %s (%d of %d %s); differing: %s" % (
                field.name, top, counts[top], len(values), "node runs" if runs > 1 else "nodes", ", ".join(others)))
    return folded, notes


def record_runs(runs, groups, out_dir, force=False, now=None):
    """Write one profile per group holding nodes of the runs (``[(verdict dict, verdict path)]``, each of which
    passed); returns ``[(group, path, nodes, notes)]``."""
    fields_by_run = [node_fields(raw, path) for raw, path in runs]
    per_host = {}
    for fields_by_host in fields_by_run:
        for host, fields in fields_by_host.items():
            per_host.setdefault(host, []).append(fields)
    written = []
    stamp = (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    sources = [path for _raw, path in runs]
    for group, members in sorted(groups.items()):
        hosts = [host for host in members if host in per_host]
        if not hosts:
            continue
        fields, notes = fold({host: per_host[host] for host in hosts}, runs=len(runs))
        path = os.path.join(out_dir, "%s.yml" % group)
        if os.path.exists(path) and not force:
            raise BaselineError("%s exists: pass --force to replace it (keep a copy: it is the group's known-good "
                                "profile)" % path)
        os.makedirs(out_dir, exist_ok=True)
        atomic_write(path, profiles.dump(fields, group, sources, hosts, stamp), mode=0o644)
        written.append((group, path, hosts, notes))
    if not written:
        raise BaselineError("no inventory group holds a node of the verdict")
    return written


def record(raw, verdict_path, groups, out_dir, force=False, now=None):
    """One run's :func:`record_runs`."""
    return record_runs([(raw, verdict_path)], groups, out_dir, force=force, now=now)
