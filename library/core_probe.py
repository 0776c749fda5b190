#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prove that a crashing process leaves a core file where kernel.core_pattern says."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: core_probe
short_description: Crash a throw-away child with SIGSEGV and find its core file
description:
  - "Starts C(sleep 30) with RLIMIT_CORE raised to unlimited (or to the hard limit when not root) in a
    fresh temporary working directory, kills it with SIGSEGV, waits for it (bounded by O(timeout)) and
    reads the wait status: C(WCOREDUMP) says whether the kernel dumped at all."
  - "Expands kernel.core_pattern the way the kernel does (C(%e) comm truncated to 15 characters, C(%p)
    and C(%i) the pid/tid in the child's PID namespace, C(%P) and C(%I) in the initial one, C(%h)
    hostname, C(%t) epoch seconds within the probe's time window, C(%u) C(%g) C(%s) C(%c) C(%d) C(%E)
    C(%f) C(%%); a relative pattern is relative to the child's working directory; without C(%p) and
    with kernel.core_uses_pid=1 the kernel appends .PID), finds the core file, removes it and reports
    pass or fail with found, expected and fix."
  - A pipe pattern (C(|program)) writes no file the probe could find; the probe then reports
    not_applicable with where the cores go (apport, systemd-coredump) and how to override it, without
    crashing anything unless O(pipe_probe) asks for it.
  - C(changed) is always false; the probe leaves nothing behind.
  - "The probe and its verdict are C(preflight_core_dumps.probe) and C(probe_check), which the preflight runs
    in its probe stage (capability C(core_dumps)); this module is their stand-alone face. A job user this node
    lacks, a missing C(sleep) or a hard core limit of 0 are findings of the probe; here an unknown O(run_as)
    and a non-positive O(timeout) fail the task as bad arguments."
version_added: "1.0.0"
author:
  - Cluster preflight contributors (@cluster-preflight)
options:
  core_pattern:
    description: The pattern to expect. Defaults to the running C(<proc_root>/sys/kernel/core_pattern).
    type: str
  core_uses_pid:
    description: Whether the kernel appends .PID to a pattern without C(%p). Defaults to the running value.
    type: bool
  proc_root:
    description: Mount point of procfs.
    type: path
    default: /proc
  timeout:
    description: Seconds to wait for the child to die after SIGSEGV (writing a core takes a moment).
    type: float
    default: 10
  run_as:
    description:
      - User (name or uid) the child runs as, to prove a job user can write the core directory. Defaults
        to the user running the module.
      - Needs root; without root the child runs as the module's user and RV(note) says so.
    type: str
  pipe_probe:
    description:
      - With a pipe pattern, crash a child anyway and report whether the kernel handed a dump to the
        helper (C(WCOREDUMP)). The helper may keep a crash record (apport report, coredumpctl entry).
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description:
      - It is a probe, so it also runs in check mode. It starts one child process and kills it, and
        creates and removes one core file and one temporary directory. Nothing persists.
  diff_mode:
    support: none
    description: Nothing persists, so there is nothing to diff.
notes:
  - Only the kernel side is proven (pattern, directory, dump permission); the limits a login session
    gets come from pam_limits (see the C(limits_dropin) module) and are returned as RV(session_rlimit_core)
    for the user the module runs as.
"""

EXAMPLES = r"""
- name: Prove that a crash leaves a core file.
  core_probe:
    timeout: 10
  check_mode: false
  register: core_probe_result

- name: Prove it for a job user.
  core_probe:
    run_as: nobody
"""

RETURN = r"""
checks:
  description: "C(core_probe): pass, fail (with fix) or not_applicable (pipe pattern, with where cores go)."
  returned: always
  type: dict
core_pattern:
  description: The pattern probed.
  returned: always
  type: str
wcoredump:
  description: Whether the wait status of the child had the core-dumped flag; null when no child was crashed.
  returned: always
  type: bool
expected_path:
  description: Where the core was expected, with <...> for the parts only known at dump time.
  returned: when the pattern is a file pattern
  type: str
core_file:
  description: The core file found (and removed).
  returned: when found
  type: str
core_removed:
  description: Whether the found core file was removed.
  returned: when found
  type: bool
destination:
  description: For a pipe pattern, the helper and where it keeps cores.
  returned: when the pattern is a pipe
  type: dict
session_rlimit_core:
  description: RLIMIT_CORE (soft, hard) of the module's own process, as the login session set it.
  returned: always
  type: dict
note:
  description: Why the child did not run as O(run_as), or empty.
  returned: always
  type: str
child_pid:
  description: The pid of the crashed child as seen by the module.
  returned: when a child was started
  type: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_node import core_dumps
from ansible.module_utils.preflight_node.ops import NodeOps

# Returned only when the probe got that far (see RETURN).
OPTIONAL = ("child_pid", "expected_path", "core_file", "core_removed", "destination")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            core_pattern=dict(type="str"),
            core_uses_pid=dict(type="bool"),
            proc_root=dict(type="path", default="/proc"),
            timeout=dict(type="float", default=10.0),
            run_as=dict(type="str"),
            pipe_probe=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if params["timeout"] <= 0:
        module.fail_json(msg="Found timeout %s. Expected a positive number of seconds. Fix: set timeout to e.g. 10."
                             % params["timeout"])
    probe = core_dumps.probe(dict(params), NodeOps(module))
    if probe["outcome"] == "user_missing":
        module.fail_json(msg="Found run_as %r, which is not a user on this node. Expected an existing user. Fix: "
                             "create the user or pass run_as a job user this node has." % params["run_as"])
    if probe["outcome"] == "unreadable":
        module.fail_json(msg="Found: %s. Expected: a readable kernel.core_pattern. Fix: pass core_pattern, or "
                             "proc_root where procfs is mounted." % probe["error"])
    check = core_dumps.probe_check(probe)
    result = dict(changed=False, core_pattern=probe["core_pattern"], wcoredump=probe["wcoredump"],
                  note=probe["note"], session_rlimit_core=probe["session_rlimit_core"],
                  checks={core_dumps.PROBE: check}, msg=check["found"])
    result.update((name, probe[name]) for name in OPTIONAL if probe[name] is not None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
