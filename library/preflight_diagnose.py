#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation of the preflight_diagnose action (action_plugins/preflight_diagnose.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_diagnose
short_description: Group a running job's ranks by where they are stuck, name the suspects, write the report
description:
  - Runs once on the controller after C(diagnose_stacks) ran on every node of the play (C(diagnose.yml)). Reads
    each node's registered result (a node that failed or did not answer is a suspect itself), takes for every
    rank the innermost frame of its main thread (C(all_reduce (torch/distributed/distributed_c10d.py:3252))),
    groups the ranks by that frame and names the suspects, each with its reasons; a rank in state C(T) or C(t)
    (stopped), C(D) (uninterruptible sleep) or C(Z) (exited); a rank whose stack could not be taken while its
    peers' were; a rank stuck in another frame than the strict majority of the ranks.
  - Writes C(<results_dir>/<run_id>/<host>.stacks.txt) (every py-spy dump of the node, and the gdb backtrace of
    its newest core) and then C(diagnose.json) (groups, suspects, ranks, launchers, lines), atomically, the
    directory 0750 and the files 0640 (the verdict's writers). Does not move C(results/latest), which is the
    gate's verdict.
  - Succeeds when the report is written, suspects or not (they are findings), unless O(fail_on_suspect).
    The logic is in C(cluster_preflight/stages/diagnosis.py).
version_added: "1.0.0"
extends_documentation_fragment: [preflight, preflight.controller, preflight.results]
options:
  results_dir:
    description: Directory holding one run directory per run; created 0750.
    type: path
    default: results
  run_id:
    description: Name of this run's directory; the UTC time (C(%Y%m%dT%H%M%SZ)) by default.
    type: str
  fail_on_suspect:
    description: Fail the task (so C(ansible-playbook) exits non-zero) when a suspect is named.
    type: bool
    default: false
  register:
    description: The variable the nodes registered the C(diagnose_stacks) result in.
    type: str
    default: diagnose_stacks
"""

EXAMPLES = r"""
- name: Group the ranks by where they are stuck and name the suspects.
  preflight_diagnose:
    results_dir: "{{ playbook_dir }}/../results"
  register: diagnose_report
  run_once: true
"""

RETURN = r"""
status:
  description: C(suspect) (someone is named), C(no_suspect) or C(no_ranks) (no training process on any node).
  returned: when the report was written
  type: str
suspects:
  description: C(host:pid) of every suspect process, or C(host) of a node that gave no diagnosis.
  returned: when the report was written
  type: list
  elements: str
majority:
  description: The frame most ranks are in (empty without a strict majority).
  returned: when the report was written
  type: str
lines:
  description: The summary; a headline, one line per launcher and rank, the groups, the suspects, the report's path.
  returned: always
  type: list
  elements: str
report_file:
  description: Path of C(diagnose.json).
  returned: when the report was written
  type: str
run_dir:
  description: The run directory.
  returned: when the report was written
  type: str
"""
