# -*- coding: utf-8 -*-
"""The controller half of the gate's run lock (the node half is ``module_utils/preflight_node/host/lock.py``).

* :func:`lock_args`: the lock the facts call takes on every node (the ``inputs`` decision's ``lock``): this run's
  identity, the controller's live runs, the runs the operator declared dead (``preflight_lock_take_over``), and
  ``slack``, the seconds a node may wait between two calls of a live run beyond the first call's own bound: the
  controller's decisions and SSH connections (``preflight_lock_grace``) and, when ``forks`` is smaller than the
  number of nodes, the other fork batches of that stage and of the next.
* :func:`renewal`: the lock a later node call renews, reaching that call's own bound plus ``slack``; the stages
  put it into each call's arguments (port mesh, single-node run, launch, probes, every localisation launch),
  and :func:`round_lock` covers a localisation round on every node the run holds, those sitting it out too.
  So a lease never reaches further than the stage in flight: a run whose controller vanished frees its nodes
  that long after its last call started.
* :func:`lock_checks` and :func:`lost_checks`: what the verdict says about it (``preflight.lock``,
  ``preflight.busy``).
"""

from __future__ import annotations

import getpass
import math
import os

from cluster_preflight import capabilities
from cluster_preflight.plays import stage_results
from cluster_preflight.stages.bounds import CONNECT_BOUND, launch_bound
from cluster_preflight.stages.view import live_runs, run_identity
from cluster_preflight.engine import engine_of
from preflight_node.checks import RUN, blocked, passed, warned
from preflight_node.host.lock import LOCK_DIR, when

DEFAULT_GRACE = 120


def lock_args(view):
    """The run lock every node of the gate is taken with (``{}``: none, ``preflight_lock: false``)."""
    first = view.hosts[0] if view.hosts else None
    run = (view.settings.get(first) or {}).get(capabilities.RUN_ROLE) or {} if first else {}
    if not first or not run.get("preflight_lock", True):
        return {}
    gate = (view.settings.get(first) or {}).get("allreduce") or {}
    facts = float(run.get("preflight_facts_timeout") or 60)
    longest = max(facts, float(run.get("preflight_probes_timeout") or 120) + launch_bound(gate)) + CONNECT_BOUND
    # The srun engine reaches every node in one Slurm step: no fork batches.
    forks = len(view.hosts) if engine_of(run) == "srun" else view.forks
    batches = int(math.ceil(len(view.hosts) / float(max(1, forks))))
    grace = run.get("preflight_lock_grace")
    slack = float(DEFAULT_GRACE if grace is None else grace) + 2 * (batches - 1) * longest
    run_id, pid, start = run_identity()
    return {"dir": run.get("preflight_lock_dir") or LOCK_DIR, "run_id": run_id, "controller": run_id.split(":")[0],
            "controller_pid": pid, "controller_start": start, "user": getpass.getuser(),
            "lease_seconds": int(math.ceil(facts + CONNECT_BOUND + slack)), "slack": int(math.ceil(slack)),
            "live_runs": live_runs(), "take_over": [str(item) for item in run.get("preflight_lock_take_over") or []]}


def renewal(lock, bound):
    """The lock a later node call renews: reaching ``bound`` (the call's own, seconds) plus the slack."""
    if not lock:
        return {}
    return dict(lock, lease_seconds=int(math.ceil(float(bound) + lock.get("slack", DEFAULT_GRACE))), renewal=True)


def round_lock(lock, plan):
    """The lock every node the run holds renews at the start of a localisation round (``plan``: the round's
    ``preflight_localize`` result): the round's launches one after another, then the confirmation run."""
    maps = [plan.get(key) or {} for key in ("first_args_by_host", "second_args_by_host",
                                            "retest_first_args_by_host", "retest_second_args_by_host")]
    slots = [args for items in (plan.get("gpu_slots_by_host") or {}).values() for args in items or []]
    bounds = [float(args.get("wait_timeout") or 0) for args in slots] + [
        float(args.get("wait_timeout") or 0) for items in maps for args in items.values()]
    longest = max(bounds or [0])
    steps = sum(1 for items in maps if items) + max([len(items or []) for items in
                                                     (plan.get("gpu_slots_by_host") or {}).values()] or [0])
    return renewal(lock, (steps + 1) * (longest + CONNECT_BOUND))


def _free_fix(host, taken):
    lease = taken.get("lease") or {}
    run_id = lease.get("run_id") or "?"
    return ("wait until %s, when that run's lease ends unless a call of it renews it (then re-run the gate); if that "
            "run is dead (its controller gone), free the node now: re-run the gate with -e "
            "preflight_lock_take_over=%s (it ends what that run left on %s, then takes the node), or by hand on %s "
            "as root: rm -f %s" % (when(lease.get("expires")), run_id, host, host, taken.get("path") or "the lease"))


def lock_checks(host, facts_result, checks):
    """``preflight.lock`` (and ``preflight.busy``) from the facts call's run lock into ``checks`` (keyed
    ``(capability, name)``); returns why the node is busy ("" when it is not): another run holds it, so
    nothing was checked there and nothing there is blamed."""
    taken = (facts_result or {}).get("lock") if isinstance(facts_result, dict) else None
    if not taken:
        return ""
    expected = "this run holds %s alone for the whole gate (its lease in %s)" % (host, os.path.dirname(
        taken.get("path") or LOCK_DIR + "/x"))
    if taken.get("state") == "busy":
        why = "another preflight run holds it: %s" % taken.get("why")
        checks[(RUN, "busy")] = blocked("%s is busy: %s; nothing was run on it by this run" % (host, why), expected,
                                        _free_fix(host, taken))
        return why
    if taken.get("state") == "error":
        checks[(RUN, "lock")] = warned("the run lock could not be taken on %s: %s; a second run on this node "
                                       "would not be detected" % (host, taken.get("why")), expected,
                                       "let root own the lock directory on %s: run the gate as root "
                                       "(preflight_become: true) with preflight_lock_dir a directory of root's "
                                       "alone (the default %s is created 0700)" % (host, LOCK_DIR))
        return ""
    stale = taken.get("took_over")
    if stale and stale.get("unreadable"):
        checks[(RUN, "lock")] = warned("%s held by this run; it replaced a lease file it could not read (%s)" % (
            host, stale.get("why")), expected, "nothing to do if no other preflight run was on %s; a lease is "
            "written only by the gate as root, so find out what wrote %s" % (host, taken.get("path")))
        return ""
    took = ("; it took over the lease of run %s (%s) and ended %d process(es) that run left" % (
        stale.get("run_id"), stale.get("why"), len(taken.get("ended") or []))) if stale else ""
    checks[(RUN, "lock")] = passed("%s held by this run%s" % (host, took), expected)
    return ""


def lost_checks(host, records, stages, checks):
    """A later node call that found the node taken over by another run (its renewal ``lost``, after this run's
    lease expired): that stage's finding is ``blocked``, never a fail, and the reason is returned ("" when no
    call lost the node)."""
    for stage in stages:
        result = records.get(stage_results.STAGE_REGISTERS[stage])
        taken = (result.get("lock") or {}) if isinstance(result, dict) else {}
        if taken.get("state") != "lost":
            continue
        why = "another preflight run took it over while this run was %s: %s" % (stage_results.STAGE_WHAT[stage],
                                                                               taken.get("why"))
        checks[(RUN, stage)] = blocked(
            "%s was lost: %s; nothing more was run on it by this run" % (host, why),
            "this run holds %s until its last call there" % host,
            "this run's controller was away longer than its lease (preflight_lock_grace): re-run the gate once "
            "that run has ended")
        return why
    return ""
