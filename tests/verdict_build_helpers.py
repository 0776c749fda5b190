"""Shared helpers of the verdict unit tests (tests/unit/test_verdict.py,
tests/unit/test_verdict_run_dir.py, tests/unit/test_verdict_history.py): a node's registered stage results,
the gate decision, verdicts built by cluster_preflight/verdict/accounting.py, and the verdict step
(cluster_preflight/outputs/finish.py) run over hostvars.  Test-side, not shipped."""

from cluster_preflight import capabilities
from cluster_preflight.outputs.finish import finish
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


def run_action(args, hostvars, check_mode=False, **task_vars):
    """The verdict step (cluster_preflight/outputs/finish.py, what the task preflight_verdict runs) with ``args``
    over ``hostvars`` (every host targeted); ``check_mode`` as ``--check``; ``task_vars`` more variables of the
    task (``ansible_inventory_sources``)."""
    hosts = sorted(hostvars)
    return finish(dict(task_vars, ansible_play_hosts_all=hosts, groups={"cluster": hosts}, hostvars=hostvars), args,
                  check_mode=check_mode)
