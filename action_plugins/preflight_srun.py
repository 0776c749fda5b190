# -*- coding: utf-8 -*-
"""Action plugin preflight_srun: one node call of the gate as one Slurm step (cluster_preflight/engine/srun.py)."""

from __future__ import annotations

import traceback

from cluster_preflight.plays.action import ControllerAction
from cluster_preflight.stages.view import ClusterView, without_gc
from cluster_preflight.engine import by_node
from cluster_preflight.engine.srun import CALLS, run_call


class ActionModule(ControllerAction):
    _VALID_ARGS = frozenset(("call",))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        call = self._task.args.get("call")
        if call not in CALLS:
            result.update(failed=True, msg="call %r is not one of %s" % (call, ", ".join(CALLS)))
            return result
        try:
            with without_gc():
                result.update(run_call(call, ClusterView(task_vars)))
        except Exception as exc:  # pylint: disable=broad-except
            # A defect here must not cost the verdict: every node's call failed, saying why; the run goes on.
            found = "the srun engine's %s call raised %s: %s" % (call, type(exc).__name__, exc)
            failure = {"failed": True, "msg": found, "module_stderr": traceback.format_exc()[-2000:]}
            result.update(by_node(call, {host: failure for host in task_vars.get("ansible_play_hosts_all") or []}))
        result["changed"] = False
        return result
