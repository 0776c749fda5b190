#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Find a running training job's processes on this node and take their stacks, in one module call."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: diagnose_stacks
short_description: Stacks of a running or hung training job's launchers and ranks on this node
description:
  - Reads C(/proc) for the training processes of this node. Without O(pattern), the launchers (C(torchrun),
    C(deepspeed), C(accelerate), also as C(python -m torch.distributed.run) and the like) and their ranks (Python
    processes with C(RANK) or C(LOCAL_RANK) in their environment, or, when the environment cannot be read, below a
    launcher). The rank variables come from C(/proc/<pid>/environ) when it is readable. A process whose parent is
    a rank with the same command line (a DataLoader worker) is listed as a C(child) and not dumped.
  - Runs C(py-spy dump) on every launcher and rank at once, all within O(stack_budget) seconds; a dump still
    running then is killed (the process it read runs on) and reported as unfinished. Each dump runs as the
    account that owns the process (its real uid, gid and groups), never as root for a job user's rank, so it
    proves what that user could see. A stopped (C(T), C(t)) or C(D)-state process is read with C(--nonblocking).
  - Optionally runs C(gdb -batch -ex 'thread apply all bt') on the newest core file in O(core_dir), bounded by
    O(core_timeout).
  - Only reads. The controller (action C(preflight_diagnose)) groups the ranks of every node by the innermost
    frame of their main thread and names the suspects (C(cluster_preflight/stages/diagnosis.py)). The node side is in
    C(module_utils/preflight_node/diagnose.py).
version_added: "1.0.0"
extends_documentation_fragment: [preflight, preflight.no_change]
options:
  pattern:
    description:
      - Python regular expression searched in each process's command line (arguments joined by spaces); the
        processes it matches are the targets instead of the launchers and ranks found by default.
    type: str
    default: ""
  user:
    description: Only processes of this account (a name or a uid); empty for any account.
    type: str
    default: ""
  stack_budget:
    description: Seconds, in total, for the C(py-spy dump) of every process (all are dumped at once).
    type: float
    default: 20
  native:
    description: Also native frames (C(py-spy dump --native)); not for a stopped process (py-spy cannot unwind it).
    type: bool
    default: false
  py_spy:
    description:
      - Path of C(py-spy); looked up on C(PATH), in C(/usr/local/bin), then next to the ranks' Python.
      - As root, only a py-spy root alone can change (root-owned, not group or other writable, nor any directory above
        it) is run; one that was looked up must also lie in the system's directories, C(/opt/preflight-tools) or the
        project's venv. Another is not run and RV(refused) says so.
    type: path
  core_dir:
    description: Directory holding core files; the newest one matching O(core_glob) gets a gdb backtrace. Empty for none.
    type: path
  core_glob:
    description: Shell pattern of the core file names in O(core_dir).
    type: str
    default: "core*"
  core_timeout:
    description: Seconds gdb may take on the core file.
    type: float
    default: 60
  gdb:
    description:
      - Path of C(gdb); looked up on C(PATH) when unset. As root, the same rule as for O(py_spy).
      - gdb reads the core as the core's owner (its ids, a minimal environment), never as root on another account's
        file; a core of root's only when no other account could have swapped it.
    type: path
attributes:
  check_mode:
    support: full
    description: Only reads C(/proc) and a core file, and runs py-spy and gdb, which read; the same in check mode.
notes:
  - Give the task a C(timeout) of at least O(stack_budget) + O(core_timeout) + 30 s.
  - py-spy needs ptrace rights over the process as its owner (C(kernel.yama.ptrace_scope) 0, or 1 with
    C(CAP_SYS_PTRACE)); a dump that fails says why and makes that rank a suspect only if its peers were dumped.
"""

EXAMPLES = r"""
- name: Take the stacks of the training job's launchers and ranks on every node.
  diagnose_stacks:
    stack_budget: 20
  register: diagnose_stacks

- name: Take native stacks of one user's processes of train.py, and the backtrace of the newest core file.
  diagnose_stacks:
    pattern: 'train\.py'
    user: alice
    native: true
    core_dir: /tmp
    core_glob: "core-*"
"""

RETURN = r"""
hostname:
  description: The node's hostname.
  returned: always
  type: str
py_spy:
  description: The py-spy used (empty when none was found; every dump then says so).
  returned: always
  type: str
dump_seconds:
  description: Seconds spent finding the processes and dumping them.
  returned: always
  type: float
processes:
  description:
    - One entry per process found, sorted by pid, with pid, ppid, state (C(/proc) letter) and state_name, role
      (C(launcher), C(rank), C(child)), launcher, rank, local_rank, world_size, uid, user, cmdline, env (only the
      torch launchers' rank variables) and env_readable.
    - For a launcher or a rank also frame (innermost Python frame of the main thread, as py-spy prints it), native_frame,
      thread, dump_error, dump_finished, dump_user (who py-spy ran as), dump_native and stack (py-spy's text).
  returned: always
  type: list
  elements: dict
  sample:
    - pid: 4242
      role: rank
      rank: 1
      state: S
      frame: all_reduce (torch/distributed/distributed_c10d.py:3252)
      dump_user: alice
core:
  description: The newest core file (path, mtime, size, uid, command, executable), who gdb ran as (gdb_user) and
    its backtrace, or why none.
  returned: when core_dir is set
  type: dict
refused:
  description: Programs found or named that were not run as root, each a sentence saying why.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_node.diagnose import read, user_uid, validate
from ansible.module_utils.preflight_node.host.ops import NodeOps


def main():
    module = AnsibleModule(
        argument_spec=dict(
            pattern=dict(type="str", default=""),
            user=dict(type="str", default=""),
            stack_budget=dict(type="float", default=20),
            native=dict(type="bool", default=False),
            py_spy=dict(type="path"),
            core_dir=dict(type="path"),
            core_glob=dict(type="str", default="core*"),
            core_timeout=dict(type="float", default=60),
            gdb=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    problems = validate(params)
    if params["user"]:
        try:
            user_uid(params["user"])
        except KeyError:
            problems.append("Found user %r: no such account on this node (getent passwd %s finds nothing). Expected: "
                            "the account the job runs as. Fix: set diagnose_user to that account, or leave it empty"
                            % (params["user"], params["user"]))
    if problems:
        module.fail_json(msg="; ".join(problems))
    result = read(params, NodeOps(module))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
