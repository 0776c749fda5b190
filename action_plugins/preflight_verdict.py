# -*- coding: utf-8 -*-
"""Controller-side verdict: account for every targeted node, write the run directory.

Its documentation lives in ``library/preflight_verdict.py``; the step is
``cluster_preflight/outputs/finish.py`` (:func:`finish`, tested through the package).  Fails the task, and so the
play, unless the verdict is ``pass``.
"""

from __future__ import annotations

from cluster_preflight.outputs.finish import finish
from cluster_preflight.plays.action import ControllerAction


class ActionModule(ControllerAction):
    _VALID_ARGS = frozenset(("results_dir", "run_id", "kind", "fail"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        result.update(finish(task_vars or {}, self._task.args, check_mode=self._task.check_mode is True))
        return result
