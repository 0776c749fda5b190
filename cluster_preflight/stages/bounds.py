# -*- coding: utf-8 -*-
"""How long the gate's stages may take, computed in one place: one SSH connection (:data:`CONNECT_BOUND`), one
all-reduce launch on a node (:func:`launch_bound`, what the run lock's lease covers while it runs) and the whole
run (:func:`run_bound`, the sum of its stages' bounds, which the verdict records as ``bound_seconds``)."""

from __future__ import annotations

from cluster_preflight.capabilities.allreduce.localize import MAX_ROUNDS
from cluster_preflight.capabilities.allreduce.retest import STEPS as RETEST_STEPS
from cluster_preflight.plays import stage_results

# Seconds to open (or find dead) one SSH connection: ansible.cfg timeout plus ServerAlive 5 s x 3.
CONNECT_BOUND = 25


def launch_bound(allreduce_settings: dict) -> float:
    """One all-reduce launch on a node: its hard timeout, the stack dump, start-up and collection."""
    return (float(allreduce_settings.get("allreduce_hard_timeout") or 120)
            + float(allreduce_settings.get("allreduce_stack_budget") or 20) + 60)


def run_bound(view, plan: dict, launch: dict, localize: dict = None) -> int:
    """The longest this run could have taken: the sum of its stages' bounds (with the single-node runs when
    planned, and the localisation rounds when they ran: at most MAX_ROUNDS rounds of two steps, each bounded
    like the all-node run, every GPU pair launch of the node with the most, one after another, and the
    retest's steps when it was on)."""
    first = view.hosts[0] if view.hosts else None
    settings = (view.result(first, stage_results.SETTINGS) or {}) if first else {}
    gate_args = list(((launch or {}).get("gate") or {}).get("args_by_host", {}).values())
    mesh = (plan or {}).get("port_mesh") or {}
    parts = [settings.get("facts_timeout") or 0, mesh.get("wait_timeout") or 0, CONNECT_BOUND,
             settings.get("probes_timeout") or 0, gate_args[0]["wait_timeout"] if gate_args else 0]
    single = list((((plan or {}).get("single") or {}).get("args_by_host") or {}).values())
    if single:
        # The single-node runs before the all-node run, every node's at once.
        parts.append(max(args["wait_timeout"] for args in single) + CONNECT_BOUND)
    if (localize or {}).get("needed") and gate_args:
        parts.append(MAX_ROUNDS * 2 * (gate_args[0]["wait_timeout"] + CONNECT_BOUND))
        # GPU pair rounds run their launches one after another on a node: each is bounded like a launch.
        gpus = ((localize or {}).get("localize") or {}).get("gpus") or {}
        launches = max([sum(len(item["launches"]) for item in summary.get("rounds") or [])
                        for summary in gpus.values()] or [0])
        parts.append(launches * (gate_args[0]["wait_timeout"] + CONNECT_BOUND))
        # The retest of the nodes named for a slow or failed run: a pair, then a run alone, each bounded alike.
        if (((localize or {}).get("localize") or {}).get("retest") or {}).get("enabled"):
            parts.append(RETEST_STEPS * (gate_args[0]["wait_timeout"] + CONNECT_BOUND))
        # The group rounds that ran (every pair passed): each step bounded like a launch.
        steps = [1 + max([launch.get("step") or 0 for launch in item["launches"]] or [0])
                 for item in (((localize or {}).get("localize") or {}).get("groups") or {}).get("rounds") or []]
        parts.append(sum(steps) * (gate_args[0]["wait_timeout"] + CONNECT_BOUND))
        # The confirmation run over the nodes left, bounded like the all-node run.
        parts.append(gate_args[0]["wait_timeout"] + CONNECT_BOUND)
    return int(sum(parts) + CONNECT_BOUND * 6)
