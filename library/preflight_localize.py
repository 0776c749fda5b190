#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation of the preflight_localize action (action_plugins/preflight_localize.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_localize
short_description: Name the node that breaks or slows the all-reduce, in at most three rounds of pair runs
description:
  - Runs once on the controller (C(run_once)) in C(roles/allreduce/tasks/localize.yml), after the all-node all-reduce
    was collected. With O(start), decides whether localisation is needed (the all-node run failed, or its busbw is
    below C(allreduce_floor_busbw_gbps_<backend>)) and plans round 1; a healthy run returns C(needed=false) and the
    rounds are skipped.
  - Without O(start), folds the round's results (registered as C(allreduce_localize_first) and
    C(allreduce_localize_second)) into the rounds so far and plans the next round, or concludes with the
    C(allreduce.localize) check of every node and the rounds for the verdict.
  - Round 1 runs disjoint node pairs at once (a node left over runs alone over C(lo)); round 2 tests every suspect
    and every unproven node against a node already proven good, and runs each suspect alone over C(lo) to tell a
    node fault from a network fault; round 3 runs only if still ambiguous. Each launch is the C(allreduce) module
    with its own hard timeout and its own master port (above the run's C(allreduce_master_port)).
  - When every pair passed (every node proven good) but the all-node run did not, from 6 nodes the group rounds
    (C(cluster_preflight/capabilities/allreduce/groups.py)) bisect by substitution - halves run at once, the failing half's nodes halved
    again and padded with proven nodes to the failing group's size - and name the node of a fault that shows only in
    a large group (kind C(group)), retested once in one more such group; the steps go through the same
    C(first_args_by_host) and C(second_args_by_host) as the pair rounds.
  - A node named for a node fault on backend nccl with two GPUs or more (C(nvidia-smi) in its facts) then gets up to
    three rounds over its GPUs (2-GPU runs alone over C(lo)), which name the bad GPU by index and PCI bus id
    (C(allreduce.gpu_pairs)); C(allreduce_gpu_pairs=false) turns that off.
  - Once concluded, the nodes left (neither named bad nor lost) are planned for one more all-node all-reduce on the
    run's own master port (C(confirm_args_by_host)); with O(confirm), the call after that run folds its outcome in
    (C(localize.confirm)) - a pass proves them together, anything else leaves them unverified, never healthy.
  - The logic is in C(cluster_preflight/capabilities/allreduce/localize.py).
version_added: "1.0.0"
extends_documentation_fragment: [preflight, preflight.controller]
options:
  start:
    description: Decide whether to localise and plan round 1 (true), or fold the last round in and go on (false).
    type: bool
    default: false
  confirm:
    description: Fold the confirmation run (registered as C(allreduce_confirm)) into the concluded localisation.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Plans only, on the controller; it contacts no node, the same in check mode.
"""

EXAMPLES = r"""
- name: Decide whether the all-reduce needs localising and plan round 1.
  preflight_localize:
    start: true
  register: allreduce_localize
  run_once: true
"""

RETURN = r"""
needed:
  description: Whether the all-node run failed or was below the floor, so rounds run.
  returned: always
  type: bool
done:
  description: Whether localisation has concluded (or was not needed).
  returned: always
  type: bool
round:
  description: The round planned (or, once done, the number of rounds run).
  returned: when needed
  type: int
steps_max:
  description:
    - The most steps the localisation may plan - three node rounds, the retest's two steps and three GPU rounds, or
      the node rounds and the group rounds C(cluster_preflight/capabilities/allreduce/groups.py) can take for this many nodes.
      C(localize_round.yml) includes itself until C(done); a plan past this ends the localisation with
      C(allreduce.localize_error) on every node (a defect), so the run always reaches its verdict.
  returned: when needed
  type: int
steps:
  description: The steps planned so far.
  returned: after the first round, when needed
  type: int
first_args_by_host:
  description: Node to C(allreduce) arguments of the round's first step (pairs, and loopback runs of idle nodes).
  returned: when needed
  type: dict
second_args_by_host:
  description: Node to C(allreduce) arguments of the round's second step (loopback runs of paired suspects).
  returned: when needed
  type: dict
retest_first_args_by_host:
  description:
    - Node to C(allreduce) arguments of the retest's first step (C(cluster_preflight/capabilities/allreduce/retest.py)) - a node the
      rounds named for a slow or failed run paired with a node proven good. Only in the round that retests.
  returned: when a node is retested
  type: dict
retest_second_args_by_host:
  description: Node to C(allreduce) arguments of the retest's second step (the retested node alone over C(lo)).
  returned: when a node is retested
  type: dict
gpu_slots_by_host:
  description:
    - Node to the list of C(allreduce) arguments of its GPU pair launches in this round, run one after another
      (C(CUDA_VISIBLE_DEVICES) of two GPUs, alone over C(lo)). Only for a node named for a node fault with two
      GPUs or more on backend nccl (C(cluster_preflight/capabilities/allreduce/gpu_pairs.py)); empty otherwise.
  returned: when needed
  type: dict
lock:
  description:
    - The run lock every node the run holds renews for the round, so a node sitting the round out keeps it for the
      round's launches one after another and the confirmation run, plus the controller's slack
      (C(cluster_preflight/stages/run_lock.py)). Every launch of the round carries it (its first renews it); a node with
      no launch in the round's first step renews it with C(preflight_lock) and C(renew).
  returned: while rounds remain and the run holds a lock
  type: dict
checks_by_host:
  description:
    - "Node to C({allreduce: {localize: check}}) once done, and C(gpu_pairs) on a node whose GPUs were localised."
  returned: when done and needed
  type: dict
localize:
  description:
    - The summary for the verdict, once done - trigger, floors, the median pair busbw, rounds_run, bad (with kinds,
      node, network or group), good, lost, unproven, excluded, rounds (each launch with kind, hosts, master_port,
      verdict, busbw_gbps, why) and elapsed_seconds; with group rounds, C(groups) (named, size, rounds with each
      group's hosts and suspects, stop); with GPU pair rounds, C(gpus) (node to the GPU summary with bad
      GPUs by index and PCI bus id, good, unproven, rounds); C(confirm) (hosts, status pass/slow/fail/lost or
      planned, busbw_gbps, reason, master_port).
  returned: when done and needed
  type: dict
confirm_args_by_host:
  description: Node to C(allreduce) arguments of the confirmation run over the nodes left; empty once folded.
  returned: when done and needed
  type: dict
confirm_plan:
  description: The confirmation run as a launch plan (hosts, master, master_port, world_size, args_by_host).
  returned: when done and needed
  type: dict
"""
