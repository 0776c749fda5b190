#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation of the preflight_srun action (action_plugins/preflight_srun.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_srun
short_description: Run one node call of the gate as one Slurm step over every node it concerns
description:
  - The srun engine of C(preflight.yml) (C(preflight_engine=srun), C(playbooks/tasks/gate_srun.yml)). Runs once on the
    controller (C(run_once)), inside the Slurm allocation the controller was started in, and runs the node call
    O(call) as one C(srun) step over every node it concerns - the same node-side code the ssh engine's module runs
    (C(module_utils/preflight_node/srun_task.py), from an archive sent with C(sbcast)), its JSON result collected
    per node (C(cluster_preflight/engine/srun.py)).
  - All-reduce launches run one task per rank started by Slurm (C(module_utils/preflight_node/allreduce_run/rank_run.py)); every
    launch of a localisation step runs in one step, each pair its own process group; the confirmation run
    excludes the named nodes (C(--exclude)).
  - Every step is bounded (the controller stops C(srun) at the call's bound, reaped within seconds; C(--time) is
    Slurm's backstop). A node whose task never started, fell silent or could not be launched is C(unreachable),
    as a node that stops answering over SSH.
  - Registers every node's result at once, under the register the ssh engine's task uses; the decisions read
    each node's own (C(cluster_preflight/stages/view.py)). Never fails the play.
version_added: "1.0.0"
extends_documentation_fragment: [preflight, preflight.controller]
options:
  call:
    description: The node call to run (C(cluster_preflight/engine/__init__.py)).
    type: str
    required: true
    choices: [facts, port_mesh, single, launch, probes, localize_lock, localize_first, localize_second, localize_gpu,
              retest_first, retest_second, confirm, unlock]
attributes:
  check_mode:
    support: full
    description: The node calls read, probe and run the all-reduce as the ssh engine's modules do, in check mode too.
"""

EXAMPLES = r"""
- name: Read every capability's facts on every node in one Slurm step.
  preflight_srun:
    call: facts
  register: preflight_facts
  run_once: true
"""

RETURN = r"""
preflight_by_node:
  description: Node to its result of the call (a module's result, or C(failed)/C(unreachable) with C(msg)).
  returned: always
  type: dict
call:
  description: The call that ran.
  returned: always
  type: str
steps:
  description: Each Slurm command the call ran - C(argv), C(rc), C(elapsed), the nodes whose launch failed or that
    were lost.
  returned: always
  type: list
  elements: dict
"""
