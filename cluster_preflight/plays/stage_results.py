# -*- coding: utf-8 -*-
"""The stage results: every name under which a playbook task registers a result the controller reads.

The stages hand data on through Ansible's registered variables, read back from ``hostvars`` by
:class:`cluster_preflight.stages.view.ClusterView`. This table is the one place those names are defined:
Python reads them through the constants below (``ClusterView.result`` refuses a name that is not here),
and ``tests/unit/test_registers.py`` checks that every name is registered by a task of the playbooks or
roles. A register renamed on one side only fails a test, not a run.
"""

from __future__ import annotations

RUN_ENGINE = "preflight_run_engine"
SETTINGS = "preflight_settings"
INPUTS = "preflight_inputs"
FACTS = "preflight_facts"
AUDIT_FACTS = "preflight_audit_facts"
PLAN = "preflight_plan"
PORT_MESH_PROBE = "port_mesh_probe"
PORT_MESH_WAIT = "port_mesh_wait"
LAUNCH = "preflight_launch"
ALLREDUCE_JOB = "allreduce_job"
SINGLE = "allreduce_single"
PROBES = "preflight_probes"
LOCALIZE = "allreduce_localize"
LOCALIZE_FIRST = "allreduce_localize_first"
LOCALIZE_SECOND = "allreduce_localize_second"
LOCALIZE_GPU = "allreduce_localize_gpu"
RETEST_FIRST = "allreduce_retest_first"
RETEST_SECOND = "allreduce_retest_second"
CONFIRM = "allreduce_confirm"
LOCALIZE_LOCK = "allreduce_localize_lock"
UNLOCK = "preflight_unlock"
FINAL = "preflight_final"
LOCAL = "preflight_local"
APPLY = "preflight_apply"
DIAGNOSE_STACKS = "diagnose_stacks"

# name -> (who registers it, what it holds)
REGISTERS = {
    RUN_ENGINE: ("preflight_settings engine_only (controller, once)", "the engine of the node stages, checked"),
    SETTINGS: ("preflight_settings (controller, per node)", "typed, validated settings and reader arguments"),
    INPUTS: ("preflight_decide stage=inputs", "invalid settings stop the run; the run lock's id"),
    FACTS: ("preflight_facts (node)", "every capability's reader result, the job user, the run lock"),
    AUDIT_FACTS: ("preflight_facts (node), bring-up's audit after the changes",
                  "the facts read again where the bring-up applied; where it did not, the first read stands"),
    PLAN: ("preflight_decide stage=plan", "interface, ready nodes, port-mesh plan, probe arguments"),
    PORT_MESH_PROBE: ("port_probe (node)", "every peer's answer on the rendezvous port"),
    PORT_MESH_WAIT: ("job_wait (node)", "the port probe's result when it ran in the background"),
    LAUNCH: ("preflight_decide stage=launch", "mesh blame and the one all-reduce launch"),
    SINGLE: ("allreduce (node), single-node run", "the node's all-reduce over its own GPUs (or ranks) alone"),
    ALLREDUCE_JOB: ("allreduce (node, background)", "the results file of the node's ranks"),
    PROBES: ("preflight_probes (node)", "every probe's result and the all-reduce's"),
    LOCALIZE: ("preflight_localize (controller)", "the pair rounds and their conclusion"),
    LOCALIZE_FIRST: ("allreduce (node), a round's first launch step", "the pair launches of that step"),
    LOCALIZE_SECOND: ("allreduce (node), a round's second launch step", "the loopback launches of that step"),
    RETEST_FIRST: ("allreduce (node), the retest's first step", "a named node's pair with a node proven good"),
    RETEST_SECOND: ("allreduce (node), the retest's second step", "a named node's run alone over lo"),
    LOCALIZE_GPU: ("allreduce (node), GPU pair slots", "the GPU pair launches of a named node"),
    CONFIRM: ("allreduce (node), confirmation run", "the all-node run over the nodes left"),
    LOCALIZE_LOCK: ("preflight_lock renew (node), each localisation round", "the run lock held for the round"),
    UNLOCK: ("preflight_lock (node), the run's last call", "the run lock released"),
    FINAL: ("preflight_decide stage=final", "every decider's checks"),
    LOCAL: ("preflight_decide stage=local", "node-local checks (healthcheck.yml)"),
    APPLY: ("preflight_apply (bring-up rescue)", "a capability that could not be applied on a node"),
    DIAGNOSE_STACKS: ("diagnose_stacks (node)", "every rank's stack of a hung job"),
}


# The gate's node stages: stage -> the variable its result is registered in (the node calls of
# cluster_preflight/engine, NODE_CALLS, take theirs from here), and what the node was doing (for
# "unreachable while ..." findings).  STAGE_ORDER is the play's order of the stages a node is accounted for by.
STAGE_ORDER = ("settings", "facts", "port_mesh", "port_mesh_wait", "single", "launch", "probes", "confirm", "apply")
STAGE_REGISTERS = {
    "settings": SETTINGS,
    "facts": FACTS,
    "port_mesh": PORT_MESH_PROBE,
    "port_mesh_wait": PORT_MESH_WAIT,
    "single": SINGLE,
    "launch": ALLREDUCE_JOB,
    "probes": PROBES,
    "confirm": CONFIRM,
    "apply": APPLY,
    "localize_lock": LOCALIZE_LOCK,
    "localize_first": LOCALIZE_FIRST,
    "localize_second": LOCALIZE_SECOND,
    "localize_gpu": LOCALIZE_GPU,
    "retest_first": RETEST_FIRST,
    "retest_second": RETEST_SECOND,
    "unlock": UNLOCK,
}
STAGE_WHAT = {
    "settings": "loading its settings",
    "facts": "reading its facts",
    "port_mesh": "probing the rendezvous port",
    "port_mesh_wait": "waiting for the port mesh probe",
    "single": "running its single-node all-reduce",
    "launch": "starting the all-reduce",
    "probes": "running the probes (core crash, ssh mesh) and waiting for the all-reduce",
    "confirm": "running the confirmation all-reduce over the nodes left after localisation",
    "apply": "applying the bring-up",
}


def known(name):
    """``name`` itself, or KeyError naming the table when the controller asks for a result no task registers."""
    if name not in REGISTERS:
        raise KeyError("%r is not a stage result (cluster_preflight/plays/stage_results.py); known: %s"
                       % (name, ", ".join(sorted(REGISTERS))))
    return name
