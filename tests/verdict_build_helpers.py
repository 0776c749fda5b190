"""Shared helpers of the verdict unit tests (tests/unit/test_verdict.py,
tests/unit/test_verdict_run_dir.py, tests/unit/test_verdict_history.py): a node's registered stage results,
the gate decision, verdicts built by cluster_preflight/verdict/accounting.py, and the verdict action run over
hostvars.  Test-side, not shipped."""

import importlib.util
import os
from unittest import mock

from cluster_preflight import capabilities
from cluster_preflight.plays import stage_results
from cluster_preflight.verdict import accounting as pv
from preflight_node.checks import passed

STAGES = ("settings", "facts", "port_mesh", "port_mesh_wait", "launch", "probes")
OK = {"changed": False}
UNREACHABLE = {"unreachable": True, "msg": "Failed to connect to the host via ssh: Connection timed out"}


def records(**given):
    """A node's registered results: every stage ok unless given."""
    data = {stage_results.STAGE_REGISTERS[stage]: dict(OK) for stage in STAGES}
    data[stage_results.STAGE_REGISTERS["settings"]] = {"ok": True, "errors": []}
    for stage, result in given.items():
        data[stage_results.STAGE_REGISTERS[stage]] = result
    return data


def every_capability_passes(hosts):
    return {host: {name: {"x": passed("fine on %s" % host, "fine")} for name in capabilities.NAMES} for host in hosts}


def gate(status="pass"):
    return {"allreduce": {"status": status, "world_size": 4, "planned_world_size": 4, "ranks": [], "suspects": [],
                          "launched": True}}


def build(hosts, records_by_host, decisions, stages=STAGES, capabilities=capabilities.NAMES):
    return pv.build_verdict(hosts, records_by_host, decisions, capabilities, stages, "r1", "/tmp/r1",
                            bound_seconds=300)


def passing_verdict(run_dir):
    return build(["n1", "n2"], {"n1": records(), "n2": records()},
                 [{"checks_by_host": every_capability_passes(["n1", "n2"])}, gate()])


ACTION = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "action_plugins",
                      "preflight_verdict.py")


def run_action(args, hostvars, check_mode=False, **task_vars):
    """``action_plugins/preflight_verdict.py`` run with ``args`` over ``hostvars`` (every host targeted);
    ``check_mode`` as ``--check``; ``task_vars`` more variables of the task (``ansible_inventory_sources``)."""
    spec = importlib.util.spec_from_file_location("preflight_verdict_action", ACTION)
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    task = mock.MagicMock(args=args, async_val=0, check_mode=check_mode, diff=False)
    action = plugin.ActionModule(task, mock.MagicMock(), mock.MagicMock(), mock.MagicMock(), mock.MagicMock(),
                                 mock.MagicMock())
    hosts = sorted(hostvars)
    return action.run(task_vars=dict(task_vars, ansible_play_hosts_all=hosts, groups={"cluster": hosts},
                                     hostvars=hostvars))
