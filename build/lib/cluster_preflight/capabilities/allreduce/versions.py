# -*- coding: utf-8 -*-
"""The all-reduce gate's versions compared across nodes (controller layer,
``cluster_preflight/capabilities/allreduce/versions.py``).

* ``version_checks``: torch / NCCL / CUDA / HIP / Python of every node compared
  across the cluster (``allreduce.versions``): the odd node is named.
* ``node_versions``, ``known_hang``, ``torch_lt_2_1``: one node's versions, and
  whether they hang with CUDA_LAUNCH_BLOCKING=1 (NVIDIA/nccl issue 750).

The capability's controller half is ``cluster_preflight/capabilities/allreduce/``;
``cluster_preflight/stages/decisions.py`` calls ``version_checks`` after the launch.
"""

from __future__ import annotations

import re

from preflight_node.checks import failed, passed, skipped, warned

def torch_lt_2_1(version):
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return bool(match) and (int(match.group(1)), int(match.group(2))) < (2, 1)


VERSION_KEYS = ("torch", "nccl", "cuda", "hip", "python")
VERSIONS_EXPECTED = "the same torch, NCCL, CUDA, HIP and Python on every node of the job"
# NCCL 2.14.3 (pinned by pip torch 1.13-2.0.x) hangs with CUDA_LAUNCH_BLOCKING=1; fixed in 2.17.
NCCL_HANG_FIXED = (2, 17)


def node_versions(facts, ranks=()):
    """``{key: text}`` of one node: what its ranks ran (``versions``), else what its reader found.

    A key is absent when unknown (NCCL before a run, a node whose Python could
    not be asked); ``none`` when known to be absent (cuda of a CPU build).
    """
    known = {}
    facts = facts or {}
    if facts.get("python"):
        known["python"] = facts["python"].get("version")
    torch = facts.get("torch")
    if torch:
        for key, field in (("torch", "version"), ("cuda", "cuda"), ("hip", "hip")):
            known[key] = torch.get(field)
    seen = {}
    for row in ranks or ():
        versions = row.get("versions")
        if not isinstance(versions, dict):
            continue
        for key in VERSION_KEYS:
            if key in versions:
                seen.setdefault(key, set()).add("none" if versions[key] is None else str(versions[key]))
    for key, values in seen.items():
        # A node whose ranks disagree with each other shows both values and so differs from every peer.
        known[key] = "/".join(sorted(values))
    return {key: "none" if value is None else str(value) for key, value in known.items()}


def _release(text):
    match = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def known_hang(versions):
    """Why ``versions`` hang with CUDA_LAUNCH_BLOCKING=1 (NVIDIA/nccl issue 750), or None."""
    nccl = _release(versions.get("nccl"))
    if nccl and nccl < NCCL_HANG_FIXED:
        return "NCCL %s" % versions["nccl"]
    gpu = versions.get("cuda", "none") != "none" or versions.get("hip", "none") != "none"
    if gpu and "nccl" not in versions and torch_lt_2_1(versions.get("torch")):
        return "torch %s (pins NCCL 2.14.3)" % versions["torch"]
    return None


def _odd_hosts(values_by_host):
    """``(majority value or None, hosts that differ from it)``; no single majority: every host is odd."""
    counts = {}
    for value in values_by_host.values():
        counts[value] = counts.get(value, 0) + 1
    if len(counts) < 2:
        return next(iter(counts), None), []
    top = max(counts.values())
    leaders = [value for value, count in counts.items() if count == top]
    if len(leaders) > 1:
        return None, sorted(values_by_host)
    return leaders[0], sorted(host for host, value in values_by_host.items() if value != leaders[0])


def version_checks(hosts, facts_by_host, results_by_host=None, settings_by_host=None):
    """``{host: versions check}``: each node's versions against the other nodes'.

    ``hosts``: the nodes that were read; ``facts_by_host``: their allreduce
    reader facts (torch before any launch); ``results_by_host``: the launched
    nodes' ``allreduce`` results, whose ranks' ``versions`` win (what ran, and
    NCCL).  A value that differs from the majority fails on the odd node(s),
    naming the majority; without a single majority (two nodes that differ) every
    node fails.  A node matching the majority passes and names the odd ones.  A
    version that hangs with CUDA_LAUNCH_BLOCKING=1 warns (that it is set is the
    ``cuda_launch_blocking`` check's fail).
    """
    results_by_host = results_by_host or {}
    settings_by_host = settings_by_host or {}
    versions = {host: node_versions(facts_by_host.get(host), (results_by_host.get(host) or {}).get("ranks"))
                for host in hosts}
    drift = {}  # key -> (majority, odd hosts, values_by_host)
    for key in VERSION_KEYS:
        values = {host: known[key] for host, known in versions.items() if key in known}
        majority, odd = _odd_hosts(values)
        if odd:
            drift[key] = (majority, odd, values)
    checks = {}
    for host in hosts:
        mine = versions[host]
        if not mine:
            checks[host] = skipped("the versions on %s are unknown: its training Python could not be asked (see "
                                   "allreduce.python)" % host, VERSIONS_EXPECTED)
            continue
        have = ", ".join("%s %s" % (key, mine[key]) for key in VERSION_KEYS if key in mine)
        odd_keys = [key for key, (_m, odd, _v) in drift.items() if host in odd]
        if odd_keys:
            parts, wanted = [], []
            for key in odd_keys:
                majority, odd, values = drift[key]
                others = sorted(h for h in values if h != host)
                if majority is None:
                    parts.append("%s %s on %s, but %s (no majority)" % (key, mine[key], host, ", ".join(
                        "%s on %s" % (values[h], h) for h in others)))
                else:
                    agree = [h for h in values if values[h] == majority]
                    parts.append("%s %s on %s, but %s on %d other node(s) (%s)" % (
                        key, mine[key], host, majority, len(agree), ", ".join(sorted(agree))))
                    wanted.append("%s %s" % (key, majority))
            python = (facts_by_host.get(host) or {}).get("python_path") or "the training Python"
            if wanted:
                fix = ("bring %s in line with the other nodes (%s) in %s, e.g. pip install torch==<the others' "
                       "version>, or point preflight_training_python at the environment the other nodes use; "
                       "drain %s until then: mixed versions hang or fail collectives" % (
                           host, ", ".join(wanted), python, host))
            else:
                fix = ("choose one version and install it on every node (%s on %s): there is no majority to "
                       "tell which node is odd; mixed versions hang or fail collectives" % (python, host))
            checks[host] = failed("; ".join(parts), VERSIONS_EXPECTED, fix, odd=odd_keys, versions=mine)
            continue
        others = sorted({h for _m, odd, _v in drift.values() for h in odd})
        found = "%s on %s" % (have, host)
        found += ("; the same on all %d node(s)" % len(hosts) if not others else
                  "; as the majority; differs on %s (see their allreduce.versions)" % ", ".join(others))
        hang = known_hang(mine)
        if hang:
            blocking = (settings_by_host.get(host) or {}).get("allreduce_env") or {}
            checks[host] = warned(
                "%s; %s hangs with CUDA_LAUNCH_BLOCKING=1 (NVIDIA/nccl issue 750)%s" % (
                    found, hang, "; it is set: see allreduce.cuda_launch_blocking" if str(
                        blocking.get("CUDA_LAUNCH_BLOCKING", "")) == "1" or (facts_by_host.get(host) or {}).get(
                        "cuda_launch_blocking") == "1" else ""),
                "%s; NCCL >= 2.17 (torch >= 2.1)" % VERSIONS_EXPECTED,
                "upgrade torch to 2.1 or later on every node (NCCL >= 2.17), or never debug with "
                "CUDA_LAUNCH_BLOCKING=1 on these nodes", versions=mine)
        else:
            checks[host] = passed(found, VERSIONS_EXPECTED, versions=mine)
    return checks
