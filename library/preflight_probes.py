#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run every capability's acting probe on a node in one module call."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_probes
short_description: Run the preflight checks that have to act (crash a child, ssh to the peers) in one call
description:
  - Runs the probe (the C(probe) function of C(module_utils/preflight_node/<capability>_probe.py), registered in
    C(module_utils/preflight_node/probes.py)) of every capability named in O(capabilities), for example
    C(core_dumps) crashes a throw-away child and finds its core file, and C(ssh_trust) logs in to every peer
    with host-key checking on. Probes leave nothing behind on the node. No reader code is shipped with it.
  - Each probe is its own failure domain; one that raises is reported under RV(errors) and the others still
    run. The controller (C(preflight_decide)) turns the results into checks.
  - With O(wait_for), the background all-reduce's result is collected after the probes, and the probes that read
    what it changed (declared C(after_job) in C(module_utils/preflight_node/registry.py), the C(fabric) error
    counters) run after it.
version_added: "1.0.0"
extends_documentation_fragment: [preflight, preflight.run_state, preflight.node_call]
options:
  capabilities:
    description: Capability name to the arguments of its probe (C(probe_args) of the capability).
    type: dict
    required: true
  job:
    description:
      - The job user wanted on the node, C({user, named, python}) from C(preflight_settings). Job-side commands of
        the readers and probes (the training Python, the core crash, the ptrace attach) run as that account with a
        minimal environment; with none wanted and root, as C(nobody) when it can use the training Python.
      - C(resolved) (the facts call's RV(job_user)) is taken as it is, and C(hangs) (program to C({seconds, user}),
        the facts call's C(hangs)) are not run again - a training Python that hung once is not waited for twice.
  selftest_error:
    description: Name of a capability whose probe raises on purpose (tests of the isolation). Empty normally.
    type: str
    default: ""
  wait_for:
    description:
      - Once the probes are done, wait (bounded) for a background job on this node and return its result as
        RV(job); C(results_file) (required), C(timeout) seconds (required), C(poll) seconds (0.1), C(what) (a name
        for messages). The all-reduce started with C(background) is collected this way, in the same call.
    type: dict
  lock:
    description:
      - This run's lock arguments with C(lease_seconds) (C(cluster_preflight/stages/run_lock.py)); renewed before anything
        runs, to at least now plus C(lease_seconds) (this call's bound plus the controller's slack). When another run
        took the node over (this run's lease had expired), nothing runs and RV(lock) says which run.
      - Empty (the default) touches no lock.
    type: dict
    default: {}
  release_lock:
    description:
      - C({dir, run_id}) - once everything else is done, remove this run's lease on the node (taken by the facts
        call); another run's lease is left alone. Given when this is the run's last call on the node.
    type: dict
    default: {}
attributes:
  check_mode:
    support: full
    description:
      - Probes act (a crashing child, ssh logins) but change nothing that persists; they run in an audit (check
        mode) too. With O(wait_for) the job's result file is removed once read, and with O(release_lock) this
        run's lease is removed, in check mode too.
"""

EXAMPLES = r"""
- name: Run the probes that have to act on the node.
  preflight_probes:
    capabilities: "{{ preflight_plan.probe_args_by_host[inventory_hostname] }}"
  register: preflight_probes
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
lock:
  description: With O(lock), C({state, path, lease, took_over, ended, why}) - C(state) is C(held), C(lost) or C(error).
  returned: when lock is given
  type: dict
busy:
  description: The same as RV(lock) when another run took the node over; nothing ran.
  returned: when the lock is lost
  type: dict
lock_released:
  description: With O(release_lock), C({released, path, why}).
  returned: when release_lock is given
  type: dict
probes:
  description: Capability name to its probe's result (the shape is the capability's own).
  returned: always
  type: dict
errors:
  description: Capability name to C({found, traceback}) for a probe that raised.
  returned: always
  type: dict
elapsed:
  description: Capability name to the seconds its probe took.
  returned: always
  type: dict
job:
  description:
    - With O(wait_for), the background job's result (a failed job keeps C(failed) and C(msg)) and C(waited); a job
      with no result in time gives C(checks.no_result).
  returned: when wait_for is given
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_node import probes
from ansible.module_utils.preflight_node.calls import PROBES_CALL_SPEC, node_call


def main():
    node_call(AnsibleModule(argument_spec=PROBES_CALL_SPEC, supports_check_mode=True), probes, "probe", "probes")


if __name__ == "__main__":
    main()
