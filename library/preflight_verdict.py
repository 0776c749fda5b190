#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation of the preflight_verdict action (action_plugins/preflight_verdict.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_verdict
short_description: Account for every targeted node and write the verdict a scheduler can act on
description:
  - Runs once on the controller at the end of C(preflight.yml), C(bringup.yml) or C(healthcheck.yml). Starts from
    the nodes the play targeted (C(ansible_play_hosts_all), so C(--limit) is honoured), not from those still
    answering, and aggregates the checks of every C(preflight_decide) stage. Every node ends with an outcome for
    every capability that applies, or a C(fail) saying why not (C(preflight.reachable) with the stage a node
    stopped answering at, C(preflight.<stage>) for a failed node task, C(<capability>.no_result),
    C(<capability>.inputs)); a check that breaks the contract is itself a C(fail).
  - C(kind=preflight) also requires the all-reduce to pass with its planned world size, writes each node's
    prefixed log, torchrun's per-rank logs and hang stacks next to C(verdict.json), and points
    C(<results_dir>/latest) at the run once the verdict is written (atomically). C(kind=bringup) writes
    C(bringup.json) and C(kind=healthcheck) C(healthcheck.json), with C(preflight.budget) for the run's wall time;
    neither moves C(latest).
  - Fails the task (so C(ansible-playbook) exits non-zero) unless the verdict is C(pass); the message lists every
    failing or blocked check as node / check / found / expected / fix. The logic is in
    C(cluster_preflight/verdict/accounting.py).
version_added: "1.0.0"
extends_documentation_fragment: [preflight, preflight.controller, preflight.results]
options:
  kind:
    description: Which playbook the verdict is for.
    type: str
    choices: [preflight, bringup, healthcheck]
    default: preflight
  results_dir:
    description:
      - Directory holding one run directory per run and the C(latest) link; created 0750. An existing one open to
        other users loses those bits when this user owns it (a warning says so).
      - Run directories are 0750 and the files in them 0640, whatever the umask.
    type: path
    default: results
  run_id:
    description:
      - Name of this run's directory; the UTC time (C(%Y%m%dT%H%M%SZ)) by default. A plain directory name, not
        containing C(/), not C(latest), not starting with a dot.
    type: str
  fail:
    description: Fail the task unless the verdict is C(pass).
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Write the verdict and fail unless every targeted node passed.
  preflight_verdict:
    results_dir: "{{ playbook_dir }}/../results"
  run_once: true
"""

RETURN = r"""
outputs:
  description:
    - File name to path of what other tools read, written next to the verdict before it (cluster_preflight/outputs/formats.py)
      C(junit.xml) (one test case per node and check), C(preflight.prom) (node_exporter textfile format),
      C(hostfile) (C(host slots=N) of the healthy nodes), C(hosts.txt) and C(hosts.csv).
  returned: when the verdict was written
  type: dict
verdict_status:
  description: C(pass) or C(fail).
  returned: always
  type: str
run_dir:
  description: The run directory.
  returned: always
  type: str
verdict_file:
  description: Path of the verdict file (C(verdict.json), C(bringup.json) or C(healthcheck.json)).
  returned: always
  type: str
healthy_hosts:
  description: Nodes whose every check passed or only warned.
  returned: always
  type: list
  elements: str
unverified_hosts:
  description: Nodes with nothing wrong found but a check blocked by another node or a cluster-wide problem.
  returned: always
  type: list
  elements: str
unreachable_hosts:
  description: Nodes that stopped answering at some stage.
  returned: always
  type: list
  elements: str
failed_hosts:
  description: Nodes to drain.
  returned: always
  type: list
  elements: str
failures:
  description: One line per failing or blocked check, node / check / found / expected / fix.
  returned: always
  type: list
  elements: str
"""
