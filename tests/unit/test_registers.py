"""The table of stage results (cluster_preflight/plays/stage_results.py) against the playbooks and the Python that
reads them: a register renamed on one side only fails here, not in a run."""

import ast
import glob
import os

import pytest
import yaml

from cluster_preflight import capabilities
from cluster_preflight.plays import stage_results
from cluster_preflight.stages.view import ClusterView

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
YAML_FILES = sorted(glob.glob(os.path.join(ROOT, "playbooks", "*.yml"))
                    + glob.glob(os.path.join(ROOT, "playbooks", "tasks", "*.yml"))
                    + glob.glob(os.path.join(ROOT, "roles", "*", "tasks", "*.yml")))
PYTHON_FILES = sorted(glob.glob(os.path.join(ROOT, "cluster_preflight", "**", "*.py"), recursive=True)
                      + glob.glob(os.path.join(ROOT, "action_plugins", "*.py")))
SET_FACT = ("set_fact", "ansible.builtin.set_fact")


def _tasks(items):
    for item in items or []:
        if not isinstance(item, dict):
            continue
        yield item
        for key in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always"):
            yield from _tasks(item.get(key))


def registered_names():
    """Every name a task registers or sets as a fact, with the files that do."""
    names = {}
    for path in YAML_FILES:
        with open(path, encoding="utf-8") as handle:
            document = yaml.safe_load(handle) or []
        for task in _tasks(document):
            found = [task["register"]] if "register" in task else []
            for module in SET_FACT:
                if isinstance(task.get(module), dict):
                    found += list(task[module])
            for name in found:
                names.setdefault(name, []).append(os.path.relpath(path, ROOT))
    return names


def read_names():
    """``(file, line, name)`` of each literal string the controller passes to ``ClusterView.result``/``outcome``
    (there should be none: the names are the table's constants)."""
    for path in PYTHON_FILES:
        tree = ast.parse(open(path, encoding="utf-8").read(), path)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("result", "outcome") and len(node.args) == 2
                    and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
                yield os.path.relpath(path, ROOT), node.lineno, node.args[1].value


def test_every_stage_result_is_registered_by_a_task():
    names = registered_names()
    missing = sorted(set(stage_results.REGISTERS) - set(names))
    assert not missing, "in cluster_preflight/plays/stage_results.py but registered by no task: %s" % missing


def test_the_controller_reads_stage_results_through_the_table_only():
    literals = list(read_names())
    assert not literals, "write these as cluster_preflight.plays.stage_results constants: %s" % literals
    assert set(stage_results.STAGE_REGISTERS.values()) <= set(stage_results.REGISTERS)


def test_the_view_refuses_a_name_no_task_registers():
    view = ClusterView({"ansible_play_hosts_all": ["n1"], "hostvars": {"n1": {"preflight_plan": {"ok": True}}}})
    assert view.result("n1", stage_results.PLAN) == {"ok": True}
    with pytest.raises(KeyError, match="not a stage result"):
        view.result("n1", "preflight_plans")
