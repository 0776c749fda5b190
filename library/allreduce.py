#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run this node's share of a multi-node torch all-reduce gate under a hard bound."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: allreduce
short_description: Run this node's part of a bounded multi-node torch all-reduce
description:
  - "Launches C(python -m torch.distributed.run) with a static rendezvous at O(master_addr):O(master_port),
    C(--role <host>: --tee 3) so every log line carries C([host:rank]), and the all-reduce worker shipped by
    the C(allreduce) role."
  - Every node of the play must run this task at the same time (Ansible runs one task on all hosts of a play
    concurrently); node O(node_rank) 0 hosts the rendezvous.
  - The whole process tree gets O(hard_timeout) seconds of wall clock. When a rank fails while its peers still
    run, or on expiry, the stacks of every live rank are dumped with C(py-spy dump), all at once, within
    O(stack_budget) seconds in total; then the tree is killed, including workers that started their own sessions
    or were re-parented to init (every member carries a marker in its environment). The module's own bound is
    therefore O(hard_timeout) + O(stack_budget) + at most 14 s to kill and reap the tree (3 s from
    SIGTERM to SIGKILL).
  - Once a rank failed and the stacks are taken, a rank stopped by a signal (SIGSTOP, a tracer) is killed at once,
    because it would never act on torchrun's SIGTERM, which torchrun waits 30 s on before its own SIGKILL. Its
    state and stage stay in the result.
  - The tree is also killed when the module is interrupted by an exception, SIGTERM or SIGHUP, and, through a
    small guard process in its own session, when the module is killed outright (SIGKILL, which is what Ansible's
    C(async) wrapper sends when the task's C(async) time runs out).
  - Every file the run creates (the worker, rank results, torchrun's per-rank logs via C(--log-dir), temporary
    files via C(TMPDIR)) lives in one scratch directory, removed at the end unless O(keep_scratch).
  - Returns each local rank's result (stage reached, correctness, bandwidth, versions, error), the prefixed
    combined log, the tail of each rank's own log files, and findings in the shape C({status, found, expected,
    fix}) named without a capability prefix (C(ranks), C(correctness), C(bandwidth)).
version_added: "1.0.0"
extends_documentation_fragment: [preflight, preflight.run_state]
options:
  python:
    description: The training environment's Python on this node (must import torch).
    type: path
    required: true
  worker_source:
    description: Source text of the worker script; written to a scratch directory on the node.
    type: str
    required: true
  nnodes:
    description: Number of nodes taking part.
    type: int
    required: true
  node_rank:
    description: This node's index (0 hosts the rendezvous).
    type: int
    required: true
  nproc_per_node:
    description: Ranks on this node (one per GPU with NCCL).
    type: int
    required: true
  master_addr:
    description: Address of node rank 0 on the inter-node network.
    type: str
    required: true
  master_port:
    description: Rendezvous port on the master.
    type: int
    default: 6000
  backend:
    description: Collective backend for the worker.
    type: str
    choices: [gloo, nccl]
    default: gloo
  timeout:
    description: Seconds for the rendezvous, C(init_process_group) and every collective.
    type: float
    default: 30
  hard_timeout:
    description: Wall-clock bound in seconds for the whole launch on this node.
    type: float
    default: 120
  stack_budget:
    description:
      - Seconds, in total, for the C(py-spy dump) of every live rank (all ranks are dumped at once) when a rank
        fails or the hard timeout expires. A rank whose dump did not finish in it is reported as such.
      - 0 takes no stacks.
    type: float
    default: 20
  sizes:
    description: All-reduce sizes in bytes for the bandwidth stage.
    type: list
    elements: int
    default: [1048576, 4194304, 16777216]
  iters:
    description: Timed iterations per size.
    type: int
    default: 5
  warmup:
    description: Untimed iterations per size.
    type: int
    default: 2
  run_id:
    description:
      - The gate run this launch belongs to (its run lock's id); set in the environment of torchrun and the ranks as
        C(PREFLIGHT_RUN_ID), so a later run that takes over the lock of a dead run ends what it left on the node.
    type: str
    default: ""
  lock:
    description:
      - The gate's run lock arguments with C(lease_seconds) (C(cluster_preflight/stages/run_lock.py)), renewed before the
        launch (C(module_utils/preflight_node/host/lock.py)) to cover it; the task fails, starting nothing, when another run
        took the node over. Empty (the default) touches no lock.
    type: dict
    default: {}
  bandwidth_deadline:
    description:
      - Seconds the bandwidth stage may take, counted from its start on each rank (the controller derives it from
        the sizes at the backend's floor busbw, plus start-up); past it the ranks are C(slow), their stacks are
        taken and the run ends at once, with the busbw each rank reached. 0 leaves only O(hard_timeout).
    type: float
    default: 0
  bandwidth_grace:
    description:
      - The seconds of O(bandwidth_deadline) that are start-up (the rest is the sweep at the floor busbw). Given, each
        collective in flight has a deadline of its own - the collectives up to it at the floor, plus this grace - so
        a run already slower than the floor ends at its first late collective instead of at the end of the time the
        whole sweep takes. Unset, only O(bandwidth_deadline) ends the stage.
    type: float
  check_elements:
    description:
      - Elements (float32) of the correctness all-reduce; 0 keeps the worker's 1048576 (4 MiB). The localisation's
        pair and single-node runs use fewer (their question is speed, the all-node and confirmation runs prove the
        data).
    type: int
    default: 0
  min_busbw_gbps:
    description: Minimum bus bandwidth in GB/s at the largest size; 0 reports without gating.
    type: float
    default: 0
  role:
    description: Log prefix; lines read C([<role>:<local_rank>]). Defaults to the short hostname.
    type: str
  socket_ifname:
    description:
      - Interface the collectives must use; sets C(GLOO_SOCKET_IFNAME=<name>) and C(NCCL_SOCKET_IFNAME==<name>).
    type: str
  store_token:
    description:
      - The run's secret for the rendezvous store (the launch plan makes one per launch). The ranks' keys go under
        it, so a program of another account that connects to the port cannot name them. Handed to the ranks in their
        environment (C(PREFLIGHT_STORE_TOKEN)), never on a command line.
    type: str
    default: ""
  run_as:
    description:
      - Account torchrun, the ranks and C(py-spy) of them run as (the job's user); the scratch directory is given to
        it. Its environment is minimal (HOME, USER, PATH, C locale, and C(NCCL_*), C(GLOO_*), C(CUDA_*) and similar
        job settings of this module's environment) plus O(env). Needs root unless it is the module's own user.
      - Required, and checked on the node against O(job) (the node's own settings). It must be the account they
        name, else the module's own login when it is not root, else C(nobody); C(root) only when O(job) says
        C(preflight_job_user) named it. A launch naming another account is refused.
    type: str
  job:
    description:
      - The node's job-user settings, C({user, named, python}) (C(preflight_settings)' C(job)), which O(run_as) is
        checked against on the node.
    type: dict
  env:
    description:
      - Extra environment for torchrun and the ranks.
      - C(TMPDIR) is set to the scratch directory unless given here.
      - With O(backend=nccl), C(NCCL_DEBUG=INFO) unless given here or in the node's environment, so the rank logs
        show the transport NCCL chose and its warnings.
    type: dict
    default: {}
  py_spy:
    description:
      - Path of C(py-spy) for hang stacks; looked up next to O(python) and on PATH when unset.
      - py-spy runs as the ranks' user. Run as root, it must be a program root alone can change (root-owned, not
        group or other writable, nor any directory above it); one that was found must also lie in the system's
        directories or the project's venv. Another is not run, and C(checks.py_spy) says so.
    type: path
  scratch_dir:
    description:
      - Parent directory for the scratch directory (default the system temp directory). Refused when other accounts
        can write it without the sticky bit.
      - Root writes the worker and C(torchrun.log) there before the ranks' user gets its own C(job/) directory, and
        reads the ranks' results and logs back through descriptors, never following a link (see
        C(docs/security.md)).
    type: path
  keep_scratch:
    description: Keep the scratch directory (worker, rank results, logs) for inspection.
    type: bool
    default: false
  log_max_bytes:
    description: At most this many bytes of the combined log are returned (the tail).
    type: int
    default: 262144
  rank_log_max_bytes:
    description: At most this many bytes of each rank's C(stdout.log) and C(stderr.log) are returned (a longer
      file gives its first quarter, where NCCL names its transport at init, and its tail).
    type: int
    default: 32768
  selftest_fault:
    description: Self-test of the gate; make rank O(selftest_rank) exit, hang or corrupt its data.
    type: str
    choices: [none, exit, hang, corrupt]
    default: none
  selftest_rank:
    description: Global rank the self-test fault applies to.
    type: int
    default: -1
  background:
    description:
      - Start the gate in a detached process and return at once with RV(results_file); C(job_wait) (or the
        C(wait_for) option of C(preflight_probes)) collects the result. The detached run has the same bounds and
        clean-up. Needs no Ansible C(async), so it works with any connection plugin or strategy.
    type: bool
    default: false
  results_file:
    description: Where the background run writes its result; C(~/.ansible_async/preflight-allreduce-<id>.json) by default.
    type: path
attributes:
  check_mode:
    support: full
    description:
      - The gate is a probe and runs the same in check mode; C(changed) is always false. Its scratch directory is
        removed at the end (unless O(keep_scratch)); with O(background) the results file stays until
        C(job_wait) reads and removes it.
notes:
  - The scratch directory is removed unless O(keep_scratch) is set.
  - Give the task an C(async) time of at least O(hard_timeout) + O(stack_budget) + 15 s, so that the module
    always reports before the wrapper kills it.
"""

EXAMPLES = r"""
- name: Run this node's share of the all-reduce gate.
  allreduce:
    python: /opt/train/venv/bin/python
    worker_source: "{{ lookup('ansible.builtin.file', 'allreduce_worker.py') }}"
    nnodes: 2
    node_rank: 0
    nproc_per_node: 8
    master_addr: 10.0.0.1
    master_port: 6000
    backend: nccl
    socket_ifname: ib0
    hard_timeout: 120
    stack_budget: 20
  register: allreduce_job
  async: 160
  poll: 0
"""

RETURN = r"""
run_as:
  description: Who the ranks ran as, C({name, uid}).
  returned: when the run finished
  type: dict
results_file:
  description: With O(background), the file the detached run writes its result to (the rest of this list).
  returned: when background is true
  type: str
torchrun_rc:
  description:
    - torchrun's exit code on this node (null when it was killed on timeout). Not named C(rc), which Ansible
      would read as the task failing; findings go to the verdict instead.
  returned: unless background is true
  type: int
timed_out:
  description: Whether the hard timeout expired.
  returned: unless background is true
  type: bool
elapsed:
  description: Seconds the launch took on this node.
  returned: unless background is true
  type: float
stack_seconds:
  description: Seconds spent dumping stacks (at most O(stack_budget)).
  returned: unless background is true
  type: float
ranks:
  description:
    - One entry per expected local rank with rank, local_rank, stage, status, exitcode, error, correct,
      correctness, bandwidth, versions.
    - C(status) is C(ok), C(wrong), C(error), C(died), C(hung), C(missing), or C(slow) with C(slow) saying
      C({deadline_seconds, elapsed_seconds, size_bytes, collectives_done, busbw_reached_gbps}).
    - For a rank that was alive when stacks were taken, also process_state, stack (the py-spy dump, or why there
      is none) and stack_finished (false when the dump did not finish within O(stack_budget) or py-spy is
      missing).
  returned: unless background is true
  type: list
  elements: dict
log:
  description: The node's torchrun output, every line prefixed with C([host:rank]) (tail of O(log_max_bytes)).
  returned: unless background is true
  type: str
rank_logs:
  description:
    - "The head and tail (O(rank_log_max_bytes) in all) of each rank's own log file as torchrun wrote it under C(--log-dir), so the
      controller can keep them with the run: rank, local_rank, stream (C(stdout) or C(stderr)), attempt, name
      (a file name such as C(rank1.stderr.log)), bytes (the file's full size), truncated, text."
    - "A file or directory the module would not read (a link, not the ranks' user's, more than one link) has
      C(refused) (why) and a text saying so instead of its content."
  returned: unless background is true
  type: list
  elements: dict
  sample:
    - {rank: 1, local_rank: 1, stream: stderr, attempt: 0, name: rank1.stderr.log, bytes: 120, truncated: false,
       text: "preflight: rank 1 failed at stage correctness: ..."}
argv:
  description: The torchrun command line that was run.
  returned: unless background is true
  type: list
  elements: str
checks:
  description:
    - Findings C({status, found, expected, fix}) keyed by check name, without the capability prefix (the verdict
      names them C(allreduce.<name>)).
    - C(ranks) every local rank reached stage done; C(correctness) the exact all-reduce result (when a rank got
      that far); C(bandwidth) the slowest rank's bus bandwidth at the largest size (when measured); C(py_spy) a
      py-spy that was not run as root (see O(py_spy)).
  returned: unless background is true
  type: dict
hostname:
  description: This node's short hostname, as used in the findings.
  returned: unless background is true
  type: str
scratch:
  description: The scratch directory, kept for inspection (null unless O(keep_scratch)).
  returned: unless background is true
  type: str
interrupted:
  description: The signal that interrupted the module (C(SIGTERM), C(SIGHUP)); the tree was killed first.
  returned: when interrupted
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
# The run itself is in module_utils/preflight_node/allreduce_run/gate_run.py.
from ansible.module_utils.preflight_node.allreduce_run.gate_run import MODULE_SPEC, module_main


def main():
    module_main(AnsibleModule(argument_spec=MODULE_SPEC, supports_check_mode=True))


if __name__ == "__main__":
    main()
