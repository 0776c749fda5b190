#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Turn every node's port_probe result into per-node findings that name the bad node."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: port_mesh_report
short_description: Name the node that breaks the rendezvous port mesh
description:
  - "Runs once on the controller after C(port_probe) ran on every node. Builds the (source, destination)
    matrix, names the node that no peer reaches (or that reaches no one while others can), and returns
    per-node findings C({status, found, expected, fix}) where a healthy node's failed connections to the bad
    node are explained by the bad node instead of failing the healthy one."
version_added: "1.0.0"
options:
  probes_by_host:
    description: Node name to that node's registered C(port_probe) result.
    type: dict
    required: true
  hosts:
    description: The nodes of the mesh, in play order.
    type: list
    elements: str
    required: true
attributes:
  check_mode:
    support: full
    details: Pure computation on the controller.
  diff_mode:
    support: none
author:
  - Cluster preflight maintainers
"""

EXAMPLES = r"""
- name: Name the nodes the port mesh blames.
  port_mesh_report:
    hosts: "{{ ansible_play_hosts }}"
    probes_by_host: "{{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, 'port_mesh_probe'))) }}"
  delegate_to: localhost
  run_once: true
  register: port_mesh_report
"""

RETURN = r"""
ok:
  description: True when every pair connected and every node could listen.
  returned: always
  type: bool
checks_by_host:
  description: "Node name to C({port_listen, port_mesh}) findings."
  returned: always
  type: dict
matrix:
  description: "C({source: {destination: result}}) with results open, refused, timeout, no_route, wrong_host, error."
  returned: always
  type: dict
failing:
  description: "Every failed pair C({source, destination, addr, result, detail})."
  returned: always
  type: list
  elements: dict
suspect_nodes:
  description: Nodes the mesh blames.
  returned: always
  type: list
  elements: str
messages:
  description: One sentence per suspect.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_net import mesh_checks


def main():
    module = AnsibleModule(
        argument_spec=dict(probes_by_host=dict(type="dict", required=True),
                           hosts=dict(type="list", elements="str", required=True)),
        supports_check_mode=True,
    )
    probes = {host: value for host, value in module.params["probes_by_host"].items()
              if isinstance(value, dict) and not value.get("skipped")}
    checks, summary, ok = mesh_checks(probes, module.params["hosts"])
    module.exit_json(changed=False, ok=ok, checks_by_host=checks, matrix=summary["matrix"],
                     failing=summary["failing"], suspect_nodes=summary["suspect_nodes"],
                     messages=summary["messages"], silent=summary["silent"])


if __name__ == "__main__":
    main()
