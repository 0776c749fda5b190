# -*- coding: utf-8 -*-
"""The single-node all-reduce of the gate (controller layer): every GPU node's all-reduce over its own GPUs
(NVLink/PCIe, no network), run before the all-node run, with its own floor.

A node whose GPUs cannot reach their NVLink/PCIe bandwidth hides in an all-node run, whose busbw the network
bounds; alone, it shows.  :func:`plan` (the plan stage) gives each ready node its launch alone (the loopback
launch of ``cluster_preflight/capabilities/allreduce/localize.py``, with the node's full sizes and correctness check);
the task
``roles/allreduce/tasks/single.yml`` runs it after the port mesh (register ``allreduce_single``);
:func:`judge_all` (the launch stage) turns each node's result into ``allreduce.single_node`` and leaves the
nodes that failed alone out of the all-node run.  ``allreduce_single_node``: ``auto`` (nccl nodes with two or more
GPUs),
``always`` (every node: gloo ranks over lo, as on the test bed), ``never``.
"""

from __future__ import annotations

from preflight_node.checks import failed, passed

from cluster_preflight.capabilities.allreduce import localize
from cluster_preflight.capabilities.allreduce import alone_args, floor

EXPECTED = ("%s's all-reduce over its own %d %s alone (no network) completes with exact data and busbw at least "
            "%s GB/s at the largest size")


def applies(settings, args):
    mode = settings["allreduce_single_node"]
    if mode == "always":
        return True
    return mode == "auto" and args.get("backend") == "nccl" and int(args.get("nproc_per_node") or 0) >= 2


def plan(hosts, facts_by_host, settings_by_host, run_id=""):
    """``{args_by_host, floors}``: the single-node launch of every node of ``hosts`` (those ready to run ranks) it
    applies to, planned with the port mesh, before the all-node launch."""
    out = {"args_by_host": {}, "floors": {}}
    for host in hosts:
        settings = settings_by_host.get(host) or {}
        base = alone_args(host, facts_by_host[host], settings)
        if not applies(settings, base):
            continue
        node_floor = floor(settings, base.get("backend"), single=True)
        single = localize.loopback_args(base, base["master_port"], node_floor)
        # The gate's own correctness check (4 MiB), not a localisation round's smaller one.
        single.update(check_elements=0, run_id=run_id)
        out["args_by_host"][host] = single
        out["floors"][host] = node_floor["absolute"]
    return out


def judge_all(single, results_by_host):
    """``(checks_by_host, summaries, excluded)`` of the single-node runs of ``single`` (the plan): each node's
    ``single_node`` check, its summary (for the profile), and ``{host: reason}`` of the nodes the all-node run
    leaves out because they failed alone (they would only drag their peers down with them)."""
    checks_by_host, summaries, excluded = {}, {}, {}
    for host, args in (single.get("args_by_host") or {}).items():
        check, summary = judge(host, args, (single.get("floors") or {}).get(host, 0), results_by_host.get(host))
        checks_by_host[host] = {"single_node": check}
        summaries[host] = summary
        if summary["status"] != "pass":
            excluded[host] = "its all-reduce alone failed or was slow (see allreduce.single_node)"
    return checks_by_host, summaries, excluded


def _what(args):
    count = int(args.get("nproc_per_node") or 0)
    return "GPUs" if args.get("backend") == "nccl" else ("ranks over lo" if count != 1 else "rank over lo"), count


def judge(host, args, gbps_floor, result):
    """``(check, summary)`` of one node's single-node run; ``result`` is the module's result or a reason text."""
    kind, count = _what(args)
    expected = EXPECTED % (host, count, kind, gbps_floor)
    outcome = localize.run_outcome([host], {host: result})
    summary = {"status": "fail", "busbw_gbps": outcome.get("busbw_gbps")}
    busbw = outcome.get("busbw_gbps")
    fix_slow = ("run nvidia-smi topo -m and nvidia-smi nvlink -s on %s (an NVLink down, a GPU on a PCIe switch of "
                "its own), check gpu_health.pcie and gpu_health.throttle; on CPU (gloo) a loaded node" % host)
    if outcome["status"] == "lost":
        return failed("%s's single-node all-reduce gave no result: %s" % (host, outcome["reason"][:400]), expected,
                      "bring %s back (see preflight.reachable) and re-run the preflight" % host), summary
    if outcome["status"] == "slow":
        return failed("%s's single-node all-reduce is slow: %s" % (host, outcome["reason"]), expected,
                      fix_slow, busbw_gbps=busbw), summary
    if outcome["status"] == "fail":
        return failed("%s's single-node all-reduce failed: %s" % (host, outcome["reason"]), expected,
                      "read %s.single.log in the run directory; a node that fails alone is sick itself (GPU, driver, "
                      "torch build): see gpu_health and the allreduce checks" % host), summary
    if gbps_floor and (busbw is None or busbw < gbps_floor):
        return failed("%s's single-node all-reduce reached %s GB/s, below the floor of %s GB/s" % (
            host, busbw, gbps_floor), expected, fix_slow, busbw_gbps=busbw), summary
    summary["status"] = "pass"
    return passed("%s's single-node all-reduce over its %d %s: busbw %s GB/s" % (host, count, kind, busbw),
                  expected, busbw_gbps=busbw), summary
