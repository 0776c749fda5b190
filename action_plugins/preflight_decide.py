# -*- coding: utf-8 -*-
"""Every cross-node decision of the preflight, made once on the controller.

Its documentation lives in ``library/preflight_decide.py``; the stages themselves are pure functions of the
registered results in ``hostvars``, in ``cluster_preflight/stages/decisions.py``.
"""

from __future__ import annotations

from ansible.module_utils.parsing.convert_bool import boolean

from cluster_preflight.plays.action import ControllerAction
from cluster_preflight.stages.decisions import STAGES, decide


class ActionModule(ControllerAction):
    _VALID_ARGS = frozenset(("stage", "probes"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        stage = self._task.args.get("stage")
        if stage not in STAGES:
            result.update(failed=True, msg="stage %r is not one of %s" % (stage, ", ".join(STAGES)))
            return result
        result.update(decide(stage, task_vars or {}, probes=boolean(self._task.args.get("probes", True))))
        result["changed"] = False
        return result
