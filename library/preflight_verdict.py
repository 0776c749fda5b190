#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Documentation of the preflight_verdict action (action_plugins/preflight_verdict.py)."""

DOCUMENTATION = r"""
---
module: preflight_verdict
short_description: Collect every node's findings into one verdict a scheduler can act on
description:
  - Runs on the controller. Reads each node's C(*_checks) facts, its reachability (C(preflight_ping)) and the
    all-reduce results, names the ranks and nodes that caused a failed gate (collateral failures of healthy
    peers are warnings, not blame), and writes a run directory C(<results_dir>/<run_id>/) with
    C(verdict.json), each node's prefixed log (C(<host>.log)) and hang stacks (C(<host>.stacks.txt)), and
    points C(<results_dir>/latest) at it.
  - Fails the task (so C(ansible-playbook) exits non-zero) when the verdict is C(fail); the message lists every
    failing check as node / check / found / expected / fix.
version_added: "1.0.0"
options:
  hosts:
    description: The nodes the verdict is about (normally the gate's group).
    type: list
    elements: str
    required: true
  results_dir:
    description: Directory holding one run directory per run and the C(latest) link.
    type: path
    default: results
  run_id:
    description: Name of this run's directory; the UTC time (C(%Y%m%dT%H%M%SZ)) by default.
    type: str
  fail:
    description: Fail the task when the verdict is C(fail).
    type: bool
    default: true
attributes:
  check_mode:
    support: full
    details: Writes only the run directory on the controller, never on a node.
  diff_mode:
    support: none
author:
  - Cluster preflight maintainers
"""

EXAMPLES = r"""
- name: Write the verdict and fail when any node failed.
  preflight_verdict:
    hosts: "{{ groups['cluster'] }}"
    results_dir: "{{ playbook_dir }}/results"
"""

RETURN = r"""
verdict_status:
  description: C(pass) or C(fail).
  returned: always
  type: str
run_dir:
  description: The run directory.
  returned: always
  type: str
verdict_file:
  description: Path of C(verdict.json).
  returned: always
  type: str
healthy_hosts:
  description: Nodes whose every check passed.
  returned: always
  type: list
  elements: str
failed_hosts:
  description: Nodes to drain.
  returned: always
  type: list
  elements: str
failures:
  description: One line per failing check, node / check / found / expected / fix.
  returned: always
  type: list
  elements: str
"""
