#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation of the preflight_decide action (action_plugins/preflight_decide.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_decide
short_description: Make the preflight's cross-node decisions once, on the controller
description:
  - Runs once on the controller (C(run_once)) and reads what every node the play targeted registered so far
    (C(preflight_settings), C(preflight_facts), the port probes, the all-reduce, the probes). Returns
    C({ok, blockers, checks_by_host}) plus the stage's plan; C(checks_by_host) maps a node to
    C({capability => {name => check}}). A decision never fails the play; what blocks the gate is a blocker.
  - C(inputs) stops the run before any node is touched when a node's settings are invalid.
  - C(plan) turns reader errors into C(<capability>.error), chooses the inter-node interface
    (C(nic_discovery)), finds the nodes ready to run ranks (C(allreduce)), plans the port mesh (in the
    background when C(forks) is smaller than the number of nodes) and every node's probe arguments.
  - C(launch) blames the nodes that break the port mesh and plans the one all-reduce launch over the nodes that
    are still reachable, ready and not blamed (a node lost before the launch is left out, so its peers are
    still proven).
  - C(local) (C(healthcheck.yml)) judges every node alone on its own facts and node-local probes, no peer and no
    all-reduce.
  - C(final) runs every capability's decider over its facts and probe results and summarises the all-reduce,
    suspects, collateral failures of healthy peers, and the world size compared with the plan.
version_added: "1.0.0"
extends_documentation_fragment: [preflight, preflight.controller]
options:
  probes:
    description: With C(stage=plan), whether to plan the probes (bring-up does not probe).
    type: bool
    default: true
  stage:
    description: Which decision to make.
    type: str
    required: true
    choices: [inputs, plan, launch, final, local]
attributes:
  check_mode:
    support: full
    description: Decides only, on the controller; writes nothing, the same in check mode.
"""

EXAMPLES = r"""
- name: Choose the interface and plan the port mesh, the probes and the all-reduce.
  preflight_decide:
    stage: plan
  register: preflight_plan
  run_once: true
"""

RETURN = r"""
ok:
  description: False when something blocks the next step (see RV(blockers)).
  returned: always
  type: bool
blockers:
  description: Why the next step cannot run, one sentence each.
  returned: always
  type: list
  elements: str
checks_by_host:
  description: Node to capability to check name to C({status, found, expected, fix}).
  returned: always
  type: dict
nic:
  description: (plan) The chosen interface, C(addr_by_host) and C(master).
  returned: when stage is plan
  type: dict
port_mesh:
  description: (plan) Who probes with which arguments; (launch) the mesh report with C(suspect_nodes).
  returned: when stage is plan or launch
  type: dict
probe_args_by_host:
  description: (plan) Node to capability to the arguments of its probe.
  returned: when stage is plan
  type: dict
gate:
  description:
    - (launch) The all-reduce launch, C(launch), C(hosts), C(master), C(world_size), and C(args_by_host).
  returned: when stage is launch
  type: dict
allreduce:
  description: (final) The gate's outcome, ranks, suspects and bandwidth.
  returned: when stage is final
  type: dict
"""
