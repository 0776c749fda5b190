# -*- coding: utf-8 -*-
"""Load and validate every capability's settings for one node (or, for the srun engine, every node at once), before
anything runs on it.

Runs on the controller (no connection).  Its documentation lives in ``library/preflight_settings.py``; the pipeline
is ``cluster_preflight/settings/pipeline.py`` (:func:`load`, tested through the package).
"""

from __future__ import annotations

from ansible.module_utils.parsing.convert_bool import boolean

from cluster_preflight.plays.action import ControllerAction
from cluster_preflight.settings.pipeline import load


class ActionModule(ControllerAction):
    _VALID_ARGS = frozenset(("capabilities", "kind", "all_nodes", "engine", "engine_only"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        result.update(load(self._loader, self._templar, task_vars or {}, self._task.args,
                           all_nodes=boolean(self._task.args.get("all_nodes", False)),
                           engine_only=boolean(self._task.args.get("engine_only", False))))
        return result
