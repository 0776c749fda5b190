# -*- coding: utf-8 -*-
"""A node's all-reduce result from its ranks' records (the srun engine), in the ``allreduce`` module's shape.

With the srun engine each rank is a Slurm task supervised on its own
(``module_utils/preflight_node/allreduce_run/rank_run.py``):
one record per rank.  A node's result is what the ``allreduce`` module returns for the ssh engine (``ranks``,
``log``, ``rank_logs``, ``checks``, ``elapsed``, ``timed_out``, ``hostname``, ``run_as``), computed here with the
node layer's own ``node_checks``, so the deciders, the localisation and the verdict read both engines alike.  A
node whose ranks all were lost is unreachable; a rank with no record is ``missing``, saying why.
"""

from __future__ import annotations

from preflight_node.allreduce_run.gate_run import node_checks
from preflight_node.allreduce_run.py_spy_choice import py_spy_check

LAUNCHER = "srun (Slurm's tasks)"


def _missing(args, local, why):
    rank = int(args["node_rank"]) * int(args["nproc_per_node"]) + local
    return {"rank": rank, "local_rank": local, "stage": "not started", "status": "missing", "correct": None,
            "correctness": None, "bandwidth": [], "versions": None, "error": why, "exitcode": None, "pid": None,
            "uid": None}


def _prefixed(host, local, text):
    """A rank's output as torchrun's ``--tee`` shows it in a node's log: each line after ``[<node>:<local>]:``."""
    return "".join("[%s:%d]:%s\n" % (host, local, line) for line in (text or "").splitlines())


def node_result(host, args, records):
    """``host``'s result of one launch (``args``: its launch arguments) from ``records``: its tasks' outcomes by
    local rank, each a rank record, ``failed`` (``msg``) or ``unreachable`` (``msg``)."""
    nproc = int(args["nproc_per_node"])
    outcomes = [records.get(local) or {"unreachable": True, "msg": "no task of rank %d ran" % local, "via": "to Slurm"}
                for local in range(nproc)]
    if all(item.get("unreachable") for item in outcomes):
        return dict(outcomes[0], changed=False)
    if not any(isinstance(item.get("rank"), dict) for item in outcomes):
        # No rank ran at all (bad arguments, the run lock lost): the module's failure, as the ssh engine's.
        first = next(item for item in outcomes if not item.get("unreachable"))
        return dict(first, failed=True, msg=first.get("msg") or "no rank of %s ran" % host, changed=False)
    ranks, logs, rank_logs, refused = [], [], [], []
    rc, timed_out, elapsed, spent, used, argv, run_as = 0, False, 0.0, 0.0, None, None, None
    for local, item in enumerate(outcomes):
        if not isinstance(item.get("rank"), dict):
            why = item.get("msg") or "its task gave no record"
            ranks.append(_missing(args, local, "%s (%s)" % (why, "unreachable" if item.get("unreachable") else
                                                              "its task failed")))
            rc = rc or 1
            continue
        ranks.append(item["rank"])
        if item.get("rc") is None or item.get("rc"):
            rc = rc or (item.get("rc") if item.get("rc") is not None else -9)
        timed_out = timed_out or bool(item.get("timed_out"))
        elapsed, spent = max(elapsed, float(item.get("elapsed") or 0)), spent + float(item.get("stack_seconds") or 0)
        logs.append(_prefixed(host, local, item.get("log")))
        rank_logs.append(item.get("rank_log") or {})
        refused += [entry for entry in item.get("py_spy_refused") or [] if entry not in refused]
        used, argv, run_as = used or item.get("py_spy"), argv or item.get("argv"), run_as or item.get("run_as")
    checks = node_checks(dict(args, launcher=LAUNCHER), host, rc, timed_out, elapsed, ranks)
    if refused:
        checks["py_spy"] = py_spy_check(host, refused, used)
    return {"changed": False, "launcher": LAUNCHER, "torchrun_rc": rc, "timed_out": timed_out,
            "elapsed": round(elapsed, 3), "stack_seconds": round(spent, 3), "ranks": ranks, "log": "".join(logs),
            "rank_logs": rank_logs, "argv": argv, "hostname": host, "scratch": None, "run_as": run_as,
            "checks": checks}
