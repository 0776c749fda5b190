#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read every capability's facts on a node in one module call."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_facts
short_description: Read every preflight capability's facts on a node in one call
description:
  - Runs the reader (the C(read) function of C(module_utils/preflight_node/<capability>.py), registered in
    C(module_utils/preflight_node/readers.py)) of every capability named in O(capabilities) on the node and returns
    their facts. No probe code is shipped with it (the node-local health check's call is C(preflight_local)). Readers only read (files under /proc, /sys, /etc; the
    training Python asked where torch is); nothing on the node changes.
  - Each reader is its own failure domain; one that raises is reported under RV(errors) with the exception and
    the others still run. The controller (C(preflight_decide)) turns facts into checks.
  - The arguments come from C(preflight_settings), which validated the role variables they derive from.
version_added: "1.0.0"
extends_documentation_fragment: [preflight, preflight.run_state, preflight.node_call]
options:
  capabilities:
    description: Capability name to the arguments of its reader (C(read_args) of the capability).
    type: dict
    required: true
  lock:
    description:
      - The gate's run lock, C({dir, run_id, controller, controller_pid, controller_start, user, lease_seconds,
        live_runs, take_over}) from the C(inputs) decision (C(module_utils/preflight_node/host/lock.py)). Taken before
        anything is read - a lease file (0600, never through a link) in C(dir), a directory of root's alone, named
        after the node's hostname, written under C(flock); it reaches C(lease_seconds) ahead (this call's bound plus
        the controller's slack) and each later node call of the run renews it.
      - A node another live run holds is reported in RV(busy) and nothing else runs on it; a lease whose run
        expired, whose C(ansible-playbook) no longer runs on this run's controller, that C(take_over) names, or that
        cannot be read as a lease, is taken over and what that run left on the node (its torchrun and ranks) is
        ended.
      - Empty (the default; C(bringup.yml), C(healthcheck.yml)) takes no lock.
    type: dict
    default: {}
  selftest_error:
    description:
      - Name of a capability whose reader raises on purpose, to prove that one failing reader leaves the others'
        results and the node's all-reduce intact. Empty in normal runs.
    type: str
    default: ""
attributes:
  check_mode:
    support: full
    description:
      - Runs the same in check mode. The readers only read; with O(lock) the lease is taken (written) in check mode
        too.
"""

EXAMPLES = r"""
- name: Read every capability's facts on the node in one call.
  preflight_facts:
    capabilities: "{{ preflight_settings.read_args }}"
  register: preflight_facts
"""

RETURN = r"""
job_user:
  description:
    - Who job-side commands ran as, C({name, uid, run_as, how, note}); C(how) is C(named), C(connecting), C(auto),
      C(unavailable) (no account may run job-side code, so nothing job-side ran), C(missing) (neither) or
      C(cannot_switch). C(python_blocked) names the path component that keeps a switched-to account from the
      training Python; C(python_untrusted) why another account can change it (a root job user).
  returned: always
  type: dict
facts:
  description: Capability name to what its reader found (the shape is the capability's own).
  returned: always
  type: dict
errors:
  description: Capability name to C({found, traceback}) for a reader that raised.
  returned: always
  type: dict
elapsed:
  description: Capability name to the seconds its reader took.
  returned: always
  type: dict
hangs:
  description: Program to C({program, seconds, user}) of the training Python when it hung in this call.
  returned: when it hung
  type: dict
lock:
  description:
    - With O(lock), C({state, path, lease, took_over, ended, why}) - C(state) is C(held), C(busy) or C(error) (the
      lock directory or file could not be used; the run goes on unprotected).
  returned: when lock is given
  type: dict
busy:
  description: The same as RV(lock) when another run holds the node (C(lease) says which); nothing was read.
  returned: when the node is busy
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_node import readers
from ansible.module_utils.preflight_node.calls import FACTS_CALL_SPEC, node_call


def main():
    node_call(AnsibleModule(argument_spec=FACTS_CALL_SPEC, supports_check_mode=True), readers, "read", "facts")


if __name__ == "__main__":
    main()
