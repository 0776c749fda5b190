# -*- coding: utf-8 -*-
"""Controller-side diagnosis of a running job: group the ranks of every node, name the suspects, write the report.

Its documentation lives in ``library/preflight_diagnose.py``; the step is
``cluster_preflight/outputs/diagnosis_report.py`` (:func:`write_diagnosis`, tested through the package).
"""

from __future__ import annotations

from cluster_preflight.outputs.diagnosis_report import write_diagnosis
from cluster_preflight.plays.action import ControllerAction


class ActionModule(ControllerAction):
    _VALID_ARGS = frozenset(("results_dir", "run_id", "fail_on_suspect", "register"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        result.update(write_diagnosis(task_vars or {}, self._task.args))
        return result
