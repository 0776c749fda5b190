#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation of the preflight_settings action (action_plugins/preflight_settings.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_settings
short_description: Load and validate every capability's settings for a node before anything runs on it
description:
  - Runs on the controller for each node and contacts no node. For the run-wide role C(preflight) and every
    capability role a run of its O(kind) applies (the capability registry,
    C(module_utils/preflight_node/registry.py), says which) it reads C(defaults/main.yml) and
    C(meta/argument_specs.yml), takes each variable from the node's variables (inventory, play, C(-e)) or else the
    role default, renders it and converts it to the type the spec names, so C(-e debug_tools_enabled=false) is the
    boolean false and C(-e ssh_trust_port=abc) is an error.
  - Then runs each capability's C(validate) (ranges, paths, combinations the spec cannot say) and, when every
    setting is valid, each capability's C(read_args) for the node's reader call (C(preflight_facts)).
  - Never fails the task; invalid settings are returned in RV(errors) with found / expected / fix and the
    C(preflight_decide) stage C(inputs) stops the run before any node is touched.
version_added: "1.0.0"
extends_documentation_fragment: [preflight, preflight.controller]
options:
  kind:
    description:
      - The run the settings are for. C(preflight) (the gate) loads every capability; C(bringup) those that write
        in bring-up and returns their apply steps (RV(bringup)); C(healthcheck) the node-local ones and the
        arguments of their probes (RV(local_probes)).
    type: str
    choices: [preflight, bringup, healthcheck]
    default: preflight
  capabilities:
    description:
      - Some of the capabilities of O(kind) only (a list, or names separated by commas); all of them by default. A
        name that a run of O(kind) does not apply is an error in RV(errors).
    type: list
    elements: str
  all_nodes:
    description:
      - Load every targeted node's settings in this one task (run it once) and return each node's result under
        C(preflight_by_node), registered for every node at once; the decisions read each node's own
        (C(cluster_preflight/engine)). The srun engine's runs do, where nothing else runs per node.
    type: bool
    default: false
  engine:
    description:
      - The engine of the run's node stages, as the O(engine_only) task chose it; each node's C(preflight_engine)
        must agree with it (one engine for the whole run). Empty reads the run's first node's.
    type: str
  engine_only:
    description:
      - Return only the engine of the run's node stages (RV(engine)), read once from the run's first node's
        C(preflight_engine) or the role's default and checked against its choices, before any node's settings
        (C(preflight.yml) shapes its later tasks by it). Run it once.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Reads the project's role files only, on the controller; the same in check mode.
"""

EXAMPLES = r"""
- name: Load and validate every capability's settings (no node is contacted).
  preflight_settings:
  register: preflight_settings
"""

RETURN = r"""
engine:
  description: With O(engine_only), the engine of the run's node stages (C(ssh) or C(srun)).
  returned: with engine_only
  type: str
valid:
  description: With O(engine_only), whether C(preflight_engine) is one of its choices (when not, every node's settings
    say so and the run stops at its inputs).
  returned: with engine_only
  type: bool
ok:
  description: True when every setting of the node is valid.
  returned: always
  type: bool
errors:
  description: Invalid settings, each C({capability, name, found, expected, fix}).
  returned: always
  type: list
  elements: dict
settings:
  description: Role name to its variables, typed.
  returned: always
  type: dict
node:
  description: What the inventory says of the node (C(name), C(ansible_host), C(node_addr), C(user), C(ssh_port)).
  returned: always
  type: dict
read_args:
  description: Capability name to the arguments of its reader on this node (empty when a setting is invalid).
  returned: always
  type: dict
local_probes:
  description: With O(kind=healthcheck), capability name to the arguments of its node-local probe.
  returned: always
  type: dict
bringup:
  description:
    - With O(kind=bringup), the apply steps of the capabilities asked for that write, in verdict order, each
      C({name, what, how}) (the role and the names of its block and task).
  returned: always
  type: list
  elements: dict
capabilities:
  description: The capabilities loaded, in the order asked.
  returned: always
  type: list
  elements: str
facts_timeout:
  description: Seconds the reader call may take (C(preflight_facts_timeout)).
  returned: always
  type: int
probes_timeout:
  description: Seconds the probes call may take (C(preflight_probes_timeout)).
  returned: always
  type: int
selftest_error:
  description: The capability whose reader and probe raise on purpose (C(preflight_selftest_error)), or empty.
  returned: always
  type: str
"""
