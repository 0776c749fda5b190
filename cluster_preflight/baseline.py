# -*- coding: utf-8 -*-
"""``python -m cluster_preflight baseline``: record a known-good profile per inventory group (controller layer).

From a gate that passed (run now, or ``--from`` a run directory or verdict file), every node's measured
fields (its ``profile.summary`` check) are folded per inventory group into one profile
(``cluster_preflight/profile.py``): the value most nodes agree on for an exact field, the lowest for a floor
(a count, a rate, a busbw: every node of a trusted run met it).  Nodes that disagree are listed, never hidden.
The files go to ``<inventory dir>/profiles/<group>.yml`` (``--out``); the inventory then points each group at
its file (``profile_file``), as NHC's nhc-genconf does for its configuration.
"""

from __future__ import annotations

import collections
import datetime
import os

from . import profile as profiles
from .accounting import atomic_write

SKIPPED_GROUPS = ("all", "ungrouped")


class BaselineError(ValueError):
    """A profile that cannot be recorded; one line for the operator."""


def inventory_groups(inventory):
    """``{group: [hosts]}`` of an inventory (file or directory), through Ansible's own inventory loader."""
    from ansible.inventory.manager import InventoryManager  # pylint: disable=import-outside-toplevel
    from ansible.parsing.dataloader import DataLoader  # pylint: disable=import-outside-toplevel

    manager = InventoryManager(loader=DataLoader(), sources=inventory if isinstance(inventory, list) else [inventory])
    return {str(name): [str(host.name) for host in group.get_hosts()] for name, group in manager.groups.items()
            if name not in SKIPPED_GROUPS}


def node_fields(raw):
    """``{host: fields}`` from a verdict's ``profile.summary`` checks; raises BaselineError when the verdict
    did not pass or carries no fields."""
    if raw.get("status") != "pass":
        raise BaselineError("the run's verdict is %s, not pass: a profile is recorded only from a run that "
                            "passed (fix what it names and run again)" % raw.get("status"))
    fields = {}
    for host, node in (raw.get("nodes") or {}).items():
        summary = (node.get("checks") or {}).get("profile.summary") or {}
        details = summary.get("details") or {}
        if "fields" not in details:
            raise BaselineError("node %s has no profile.summary in the verdict (profile_enabled false?): enable "
                                "the profile capability and run again" % host)
        fields[host] = details["fields"]
    if not fields:
        raise BaselineError("the verdict names no node")
    return fields


def fold(fields_by_host):
    """``(fields, disagreements)``: one profile from the nodes' fields, and ``[text]`` for nodes that differ."""
    folded, notes = {}, []
    for field in profiles.FIELDS:
        values = {host: fields.get(field.name) for host, fields in fields_by_host.items()
                  if fields.get(field.name) is not None}
        if not values:
            continue
        if field.kind == "floor":
            folded[field.name] = min(values.values())
            continue
        counts = collections.Counter(str(value) for value in values.values())
        top, _count = counts.most_common(1)[0]
        folded[field.name] = next(value for value in values.values() if str(value) == top)
        others = sorted("%s=%s" % (host, value) for host, value in values.items() if str(value) != top)
        if others:
            notes.append("%s: recorded %s (%d of %d nodes); differing: %s" % (
                field.name, top, counts[top], len(values), ", ".join(others)))
    return folded, notes


def record(raw, verdict_path, groups, out_dir, force=False, now=None):
    """Write one profile per group holding nodes of the verdict; returns ``[(group, path, nodes, notes)]``."""
    fields_by_host = node_fields(raw)
    written = []
    stamp = (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    for group, members in sorted(groups.items()):
        hosts = [host for host in members if host in fields_by_host]
        if not hosts:
            continue
        fields, notes = fold({host: fields_by_host[host] for host in hosts})
        path = os.path.join(out_dir, "%s.yml" % group)
        if os.path.exists(path) and not force:
            raise BaselineError("%s exists: pass --force to replace it (keep a copy: it is the group's known-good "
                                "profile)" % path)
        os.makedirs(out_dir, exist_ok=True)
        atomic_write(path, profiles.dump(fields, group, verdict_path, hosts, stamp), mode=0o644)
        written.append((group, path, hosts, notes))
    if not written:
        raise BaselineError("no inventory group holds a node of the verdict")
    return written
