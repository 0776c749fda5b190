# -*- coding: utf-8 -*-
"""The checks of a node's settings that hold for every capability alike (controller layer), run once by
the settings pipeline (``pipeline.py``) before anything runs on a node:

* **unknown variables**: a variable whose name starts with a role's prefix (``allreduce_``, ``preflight_``, ...)
  that no file of the project reads is a typo until shown otherwise (``-e allreduce_floor_busbw_gbps_ncll=300``
  would otherwise be a pass with no floor): an error naming the closest input (did you mean ...), or a ``warn``
  with ``preflight_unknown_variables: warn``;
* **numbers**: every int and float setting finite and within :data:`RANGES` (``nan`` compares false with every
  floor, so a NaN floor switches the bandwidth gate off; ``inf`` passes every "more than" check);
* **node names**: an inventory host name names files in the run directory (``<node>.log``), so it must be a
  file name there (``accounting.node_name_problem``).

A problem is ``{name, found, expected, fix}`` (the shape of a capability's ``validate``).
"""

from __future__ import annotations

import difflib
import glob
import math
import os
import re

from cluster_preflight import capabilities
from cluster_preflight.plays import stage_results
from cluster_preflight.verdict.accounting import node_name_problem

PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SWITCH = "preflight_unknown_variables"
# Variables the playbooks read themselves (not a role's setting): the group, where runs go, become.
PLAYBOOK_VARIABLES = {
    "preflight_group": "the inventory group the playbooks run on",
    "preflight_results_dir": "where run directories go",
    "preflight_become": "become root on the nodes",
    "preflight_bringup_capabilities": "the capabilities bringup.yml applies",
    "preflight_local_capabilities": "the capabilities healthcheck.yml checks",
}
# The YAML the project reads variables in (besides the argument specs): a name used nowhere there, outside a
# comment, is read by nothing.
PROJECT_YAML = ("playbooks/*.yml", "*.yml", "roles/*/defaults/*.yml", "roles/*/vars/*.yml", "roles/*/tasks/*.yml")
_COMMENT = re.compile(r"(?:^|\s)#.*$", re.MULTILINE)

# Inclusive bounds of every int and float setting (of a list's elements for a list of numbers).  A setting of a
# kind the bounds cannot cover is rejected by its capability's validate; a new numeric setting needs a line here,
# or in its capability's controller half (a ``RANGES`` of its own, :func:`ranges_of`; tests/unit/test_settings_inputs.py
# keeps the tables and the argument specs in step).
DAY = 86400
RANGES = {
    # allreduce
    "allreduce_master_port": (1, 65535), "allreduce_nproc_per_node": (0, 1024), "allreduce_cpu_nproc": (1, 1024),
    "allreduce_timeout": (0.1, DAY), "allreduce_hard_timeout": (0.1, DAY), "allreduce_stack_budget": (0.1, 3600),
    "allreduce_sizes": (1, 1 << 36), "allreduce_sizes_nccl": (1, 1 << 36),
    "allreduce_floor_single_busbw_gbps_nccl": (0, 1e6), "allreduce_floor_single_busbw_gbps_gloo": (0, 1e6),
    "allreduce_iters": (1, 100000), "allreduce_warmup": (0, 100000), "allreduce_min_busbw_gbps": (0, 1e6),
    "allreduce_floor_busbw_gbps_gloo": (0, 1e6), "allreduce_floor_busbw_gbps_nccl": (0, 1e6),
    "allreduce_floor_relative": (0, 1), "allreduce_slow_grace": (0, 3600), "allreduce_poll_interval": (0.01, 60),
    "allreduce_selftest_rank": (-1, 1 << 20),
    # core_dumps
    "core_dumps_probe_timeout": (1, 3600), "core_dumps_task_timeout": (1, DAY),
    # debug_tools
    "debug_tools_package_cache_valid_time": (0, 30 * DAY), "debug_tools_install_timeout": (1, DAY),
    # diagnose
    "diagnose_stack_budget": (0.1, 3600), "diagnose_core_timeout": (0.1, DAY), "diagnose_task_timeout": (1, DAY),
    # fabric
    "fabric_expected_rate_gbps": (0, 1 << 20), "fabric_expected_ports": (0, 1024),
    "fabric_counter_threshold": (0, 1 << 62), "fabric_tool_timeout": (1, 3600),
    "fabric_acs_grub_update_timeout": (1, DAY),
    # gpu_health
    "gpu_health_dcgm_level": (0, 4), "gpu_health_dcgm_timeout": (1, DAY), "gpu_health_tool_timeout": (1, 3600),
    "gpu_health_expected_count": (0, 1024), "gpu_health_pcie_min_width": (0, 32),
    "gpu_health_pcie_replay_max": (0, 1 << 32),
    "gpu_health_xid_ignore": (0, 1 << 16), "gpu_health_xid_warn_only": (0, 1 << 16),
    # iommu
    "iommu_grub_update_timeout": (1, DAY), "iommu_reboot_timeout": (1, DAY),
    # job_env
    "job_env_shm_mb_per_gpu": (0, 1 << 20), "job_env_shm_min_mb": (0, 1 << 24), "job_env_task_timeout": (1, DAY),
    # kernel_debug
    "kernel_debug_ptrace_scope": (0, 3), "kernel_debug_ptrace_probe_timeout": (1, 3600),
    "kernel_debug_task_timeout": (1, DAY),
    # port_mesh
    "port_mesh_port": (1, 65535), "port_mesh_window": (0.1, 3600), "port_mesh_connect_timeout": (0.1, 600),
    # preflight (the run)
    "preflight_lock_grace": (0, 3600), "preflight_master_port": (1, 65535), "preflight_nproc_per_node": (0, 1024), "preflight_mesh_full_max": (2, 1 << 20),
    "preflight_mesh_degree": (2, 1024), "preflight_facts_timeout": (1, DAY), "preflight_probes_timeout": (1, DAY),
    "preflight_healthcheck_budget": (5, 3600),
    # profile
    "profile_busbw_tolerance": (0, 1), "profile_majority_min_nodes": (1, 1 << 20),
    # ssh_trust
    "ssh_trust_port": (1, 65535), "ssh_trust_mesh_connect_timeout": (1, 600), "ssh_trust_mesh_timeout": (1, 3600),
    "ssh_trust_mesh_parallel": (1, 1024), "ssh_trust_task_timeout": (1, DAY),
}
NUMBER_TYPES = ("int", "float")


def is_numeric(option):
    """Whether an argument-spec option is a number or a list of numbers."""
    return option.get("type") in NUMBER_TYPES or (option.get("type") == "list" and option.get("elements") in NUMBER_TYPES)


def ranges_of(role):
    """The bounds of ``role``'s numeric settings: :data:`RANGES`, and the ``RANGES`` its capability's controller half
    declares (a new capability keeps its thresholds' bounds beside the check that reads them)."""
    own = getattr(capabilities.BY_NAME.get(role), "RANGES", None) or {}
    return dict(RANGES, **own) if own else RANGES


def number_problems(options, values, ranges=RANGES):
    """Problems of the numeric settings among ``values`` (typed), ``options`` being their argument specs: not
    finite (nan, inf), or outside ``ranges`` (:func:`ranges_of` the role)."""
    problems = []
    for name, option in options.items():
        if name not in values or values[name] is None or not is_numeric(option):
            continue
        low, high = ranges.get(name, (-math.inf, math.inf))
        items = values[name] if isinstance(values[name], list) else [values[name]]
        bad = [item for item in items if isinstance(item, (int, float)) and not isinstance(item, bool)
               and (not math.isfinite(item) or not low <= item <= high)]
        if bad:
            problems.append({"name": name, "found": bad[0] if len(items) == 1 else values[name],
                             "expected": "%s from %s to %s" % ("numbers" if len(items) > 1 else "a finite number",
                                                               _number(low), _number(high)),
                             "fix": "set %s within that range, or leave it at its default" % name})
    return problems


def _number(value):
    return "%g" % value


def role_prefixes(project=PROJECT):
    """The variable prefixes of the project's roles (``allreduce_``, ..., ``preflight_``)."""
    return tuple(sorted("%s_" % name for name in os.listdir(os.path.join(project, "roles"))
                        if os.path.isdir(os.path.join(project, "roles", name))))


def known_variables(prefixes, project=PROJECT):
    """Every prefixed name the project's plays, tasks, defaults and vars use outside a comment (internal
    variables, registered results, module names), the stage results and :data:`PLAYBOOK_VARIABLES`."""
    pattern = re.compile(r"\b(?:%s)[A-Za-z0-9_]+" % "|".join(re.escape(prefix) for prefix in prefixes))
    known = set(stage_results.REGISTERS) | set(PLAYBOOK_VARIABLES)
    for spec in PROJECT_YAML:
        for path in glob.glob(os.path.join(project, spec)):
            with open(path, encoding="utf-8") as handle:
                known.update(pattern.findall(_COMMENT.sub("", handle.read())))
    return known


def unknown_variables(names, inputs, project=PROJECT):
    """Problems for the names among ``names`` (a node's variables) that carry a role's prefix and that no file
    of the project reads; ``inputs``: every role's settings (their argument specs), each problem suggests the
    closest of them."""
    prefixes = role_prefixes(project)
    candidates = sorted(name for name in names if isinstance(name, str) and name.startswith(prefixes))
    if not candidates:
        return []
    known = known_variables(prefixes, project) | set(inputs)
    choices = sorted(set(inputs) | set(PLAYBOOK_VARIABLES))
    problems = []
    for name in candidates:
        if name in known:
            continue
        close = difflib.get_close_matches(name, choices, n=1, cutoff=0.75)
        hint = ("did you mean %s? " % close[0]) if close else ""
        problems.append({"name": name, "suggestion": close[0] if close else "",
                         "found": "set, but no part of the preflight reads it",
                         "expected": "only variables the roles define (docs/variables.md)",
                         "fix": "%scorrect or remove %s in the inventory or the -e option; set %s: warn to run "
                                "anyway with a warning" % (hint, name, SWITCH)})
    return problems


def host_problems(inventory_hostname):
    """The node's inventory name as a file name of the run directory (``<node>.log``, ``<node>.stacks.txt``)."""
    problem = node_name_problem(inventory_hostname)
    if not problem:
        return []
    return [{"name": "inventory_hostname", "found": "the inventory host name %s" % problem,
             "expected": "a host name such as node01, gpu-a1.example.com or 10.0.0.7",
             "fix": "rename the host in the inventory (ansible_host can keep any address)"}]
