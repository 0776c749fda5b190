# -*- coding: utf-8 -*-
"""Every capability the preflight checks (the controller halves), and the interface each one implements.

A capability is one role (``roles/<name>``: its variables, prefixed ``<name>_``, in ``defaults/main.yml``
mirrored by ``meta/argument_specs.yml``; its bring-up writers in ``tasks/``), a node half
``module_utils/preflight_node/capabilities/<name>.py`` (shipped), a controller half
``cluster_preflight/capabilities/<name>/`` (a package of this package, its own helpers beside it) and one test file
``tests/unit/test_<name>.py``.  Its traits (reader, probe, after the job, in the health check, writes in bring-up, the
gate stages it depends on) and its place in the verdict are declared once,
in the registry ``module_utils/preflight_node/registry.py``; the lists below are derived from it
(``docs/adding-a-capability.md``).

Node half (``read`` bound in ``module_utils/preflight_node/readers.py``; ``probe``, in its own
``module_utils/preflight_node/capabilities/<name>_probe.py``, in ``module_utils/preflight_node/probes.py``):

``CAPABILITY``
    its name: the role name, the variables' prefix, the check namespace.
``read(args, ops) -> facts``  (inside ``library/preflight_facts.py`` and ``library/preflight_local.py``)
    pure reads, commands only through ``ops`` (``module_utils/preflight_node/host/ops.py``).
    What a node may lack (no sshd config, no Yama, no torch) is a fact, never
    an exception; an exception is recorded as ``<name>.error``.
``probe(args, ops)``  (optional, inside ``library/preflight_probes.py`` and ``library/preflight_local.py``)
    a check that has to act (crash a child, ssh to the peers), while the all-reduce runs.

Controller half (loaded here, in verdict order):

``validate(settings) -> [problem]``
    what ``meta/argument_specs.yml`` cannot say (ranges, paths, combinations);
    ``settings`` maps the role's variable names to typed values.  A problem is
    ``{"name": variable, "found": ..., "expected": ..., "fix": ...}``.
``read_args(settings, node) -> dict or None`` and ``probe_args(settings, node, plan) -> dict or None``
    the JSON-safe arguments of ``read``/``probe`` on ``node`` (see :func:`node_info`);
    None when the capability is switched off.
``decide(host, facts, settings, probe=None, cluster=None) -> {name: check}``  (pure)
    ``facts``/``probe`` are this capability's reader/probe results on
    ``host`` (None when it did not read); ``cluster`` is the view of every
    targeted node for decisions that need peers (``hosts``, ``nodes``,
    ``facts``, ``settings``, ``probes``: each mapping host -> this
    capability's data; ``node_facts``: host -> every capability's facts, for
    a decision that reads what another capability read, as ``job_env`` reads
    the interfaces ``nic_discovery`` found).  ``settings`` also carry the
    run-wide :data:`SHARED_SETTINGS` (``preflight_job_env``).

``profile_fields(facts) -> {field: value}``  (optional, pure)
    the fields of ``cluster_preflight/capabilities/profile/known_good.py`` this capability's facts measure; the
    ``profile``
    capability compares them with the known-good profile (``gpu_health``, ``fabric``).

The cluster-wide steps of the gate (interface choice, port mesh, all-reduce)
also expose ``plan``/``report`` functions used by ``action_plugins/preflight_decide.py``.
"""
from __future__ import annotations

import importlib
from typing import Optional, Protocol

from preflight_node import registry as declared

from .common import Args, Checks, Facts, Node, Problems, Settings, port_problems


class ControllerHalf(Protocol):
    """The interface of a capability's controller half, as this module loads it (typed; ``probe_args``,
    ``profile_fields`` and the cluster-wide ``plan``/``report`` are optional: defining one declares it)."""

    CAPABILITY: str

    def validate(self, settings: Settings) -> Problems:
        ...

    def read_args(self, settings: Settings, node: Node) -> Args:
        ...

    def decide(self, host: str, facts: Facts, settings: Settings, probe: Optional[dict] = None,
               cluster: Optional[dict] = None) -> Checks:
        ...


# The order of the verdict and of the audit (the gate's inputs first): the registry's, one controller half each.
ORDER = tuple(importlib.import_module("%s.%s" % (__name__, name)) for name in declared.NAMES)
BY_NAME = {module.CAPABILITY: module for module in ORDER}
NAMES = declared.NAMES
# What bring-up configures (the gate's capabilities have nothing to write).
BRINGUP_NAMES = declared.names_for("bringup")
# What a node can be judged on alone (healthcheck.yml): no peer, no all-reduce across nodes.
LOCAL_NAMES = declared.names_for("healthcheck")
# What each kind of run (preflight, bringup, healthcheck) applies, and reads and probes on a node: the lists every
# engine of the node calls runs, all derived from the registry.
KINDS = declared.KINDS
names_for = declared.names_for
readers_for = declared.readers_for
probes_for = declared.probes_for
bringup_steps = declared.bringup_steps


def get(name: str) -> ControllerHalf:
    """The capability module called ``name``; KeyError names the known ones."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError("unknown capability %r; known: %s" % (name, ", ".join(NAMES)))


def node_info(inventory_hostname: str, host_vars: dict) -> Node:
    """What the controller knows of a node from the inventory alone."""
    address = host_vars.get("ansible_host") or inventory_hostname
    return {
        "name": inventory_hostname,
        "ansible_host": str(address),
        "node_addr": str(host_vars.get("preflight_node_addr") or address),
        "user": str(host_vars.get("ansible_user") or ""),
        "ssh_port": int(host_vars.get("ansible_port") or 22),
    }


def job_user_wanted(run_settings: Settings, node: Node, python: str = "") -> dict:
    """The ``job`` argument of the node calls: the job user wanted on ``node`` (preflight_job_user, else
    the connecting user unless root, else "" for the node to choose), whether it was named, and the
    training Python the node checks an automatic choice against."""
    named = str(run_settings.get("preflight_job_user") or "")
    connecting = node.get("user") if node.get("user") not in (None, "", "root") else ""
    return {"user": named or connecting, "named": bool(named),
            "python": str(python or run_settings.get("preflight_training_python") or "")}


RUN_ROLE = "preflight"
# Run-wide settings every capability's settings carry as well (``settings["preflight_job_env"]``), copied in one
# place (``preflight_settings``): the environment the cluster's jobs run with, which the gate's all-reduce runs with
# and which job_env, fabric and gpu_health judge.
SHARED_SETTINGS = ("preflight_job_env",)


def shared(run_settings):
    """``{name: value}`` of the :data:`SHARED_SETTINGS` in the run-wide settings (``{}`` for a missing mapping)."""
    return {name: run_settings.get(name) or {} for name in SHARED_SETTINGS}


def validate_run(settings: Settings) -> Problems:
    """Problems in the run-wide settings (role ``preflight``)."""
    problems = port_problems("preflight_master_port", settings.get("preflight_master_port"),
                             "set preflight_master_port to a free port (the seeds use 6000)")
    if settings["preflight_nproc_per_node"] < 0:
        problems.append({"name": "preflight_nproc_per_node", "found": settings.get("preflight_nproc_per_node"),
                         "expected": "0 (one rank per accelerator, 2 on CPU) or more",
                         "fix": "set preflight_nproc_per_node to 0 or a number of ranks"})
    if settings["preflight_mesh_degree"] < 2 or settings["preflight_mesh_full_max"] < 2:
        problems.append({"name": "preflight_mesh_degree", "found": "preflight_mesh_degree=%s, preflight_mesh_full_max=%s"
                         % (settings.get("preflight_mesh_degree"), settings.get("preflight_mesh_full_max")),
                         "expected": "2 or more for both (a ring successor and at least one chord)",
                         "fix": "leave them at 4 and 32, or raise them"})
    if not 5 <= settings["preflight_healthcheck_budget"] <= 3600:
        problems.append({"name": "preflight_healthcheck_budget", "found": settings.get("preflight_healthcheck_budget"),
                         "expected": "5 to 3600 seconds", "fix": "leave it at 30 (NHC's budget; Slurm kills at 60)"})
    for name in ("preflight_facts_timeout", "preflight_probes_timeout"):
        if settings.get(name, 1) < 1:
            problems.append({"name": name, "found": settings.get(name), "expected": "1 second or more",
                             "fix": "leave %s at its default or raise it" % name})
    if not 0 <= settings["preflight_lock_grace"] <= 3600:
        problems.append({"name": "preflight_lock_grace", "found": settings.get("preflight_lock_grace"),
                         "expected": "0 to 3600 seconds", "fix": "leave preflight_lock_grace at 120"})
    if not str(settings.get("preflight_lock_dir") or "/").startswith("/"):
        problems.append({"name": "preflight_lock_dir", "found": settings.get("preflight_lock_dir"),
                         "expected": "an absolute path", "fix": "leave preflight_lock_dir at /run/cluster-preflight"})
    problems += BY_NAME["job_env"].validate_job_env(settings.get("preflight_job_env") or {})
    selftest = settings.get("preflight_selftest_error") or ""
    if selftest and selftest not in NAMES:
        problems.append({"name": "preflight_selftest_error", "found": selftest,
                         "expected": "empty, or one of %s" % ", ".join(NAMES),
                         "fix": "name a capability, or leave preflight_selftest_error empty"})
    return problems


# The stages each capability's outcome depends on, besides settings and facts (declared in the registry).
DEPENDS = {capability.name: capability.stages for capability in declared.CAPABILITIES}
