# -*- coding: utf-8 -*-
"""Plan and conclude the localisation rounds of a failed or slow all-reduce, on the controller.

Its documentation lives in ``library/preflight_localize.py``; the rounds are
``cluster_preflight/stages/localization.py`` (:func:`step`, tested through the package).  Never fails the play:
what it finds is a check on a node.
"""

from __future__ import annotations

from ansible.module_utils.parsing.convert_bool import boolean

from cluster_preflight.plays.action import ControllerAction
from cluster_preflight.stages.localization import step


class ActionModule(ControllerAction):
    _VALID_ARGS = frozenset(("start", "confirm"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        result.update(step(task_vars or {}, start_round=boolean(self._task.args.get("start", False)),
                           confirm=boolean(self._task.args.get("confirm", False))), changed=False)
        return result
