#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Read every capability's facts on a node in one module call."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_facts
short_description: Read every preflight capability's facts on a node in one call
description:
  - Runs the reader (the C(read) function of C(module_utils/preflight_<capability>.py)) of every capability named in
    O(capabilities) on the node and returns their facts. Readers only read (files under /proc, /sys, /etc; the
    training Python asked where torch is); nothing on the node changes.
  - Each reader is its own failure domain; one that raises is reported under RV(errors) with the exception and
    the others still run. The controller (C(preflight_decide)) turns facts into checks.
  - The arguments come from C(preflight_settings), which validated the role variables they derive from.
version_added: "1.0.0"
options:
  capabilities:
    description: Capability name to the arguments of its reader (C(read_args) of the capability).
    type: dict
    required: true
  probes:
    description:
      - Capability name to the arguments of a probe that needs no peer (the core crash), run after the readers in
        the same call; used by the node-local C(healthcheck.yml). Empty in C(preflight.yml), whose probes run
        while the all-reduce runs.
    type: dict
    default: {}
  job:
    description:
      - The job user wanted on the node, C({user, named, python}) from C(preflight_settings). Job-side commands of
        the readers and probes (the training Python, the core crash, the ptrace attach) run as that account with a
        minimal environment; with none wanted and root, as C(nobody) when it can use the training Python.
    type: dict
    default: {}
  early_launch:
    description:
      - "For a run whose only node is this one: C({host, settings, node, worker_source}) from C(preflight_settings).
        Once every reader ran, the module runs the controller's own C(plan) and C(launch) stages
        (C(module_utils/preflight_stages.py)) on these facts and, when they would launch, starts this node's
        all-reduce in the background at once, as the C(allreduce) task would (RV(early))."
      - "The controller recomputes the decision and adopts the run only when its arguments are identical;
        otherwise the probes call cancels it and the node gets C(allreduce.early_launch)."
      - Empty (the default, and in every run of more than one node, whose port mesh must pass first) starts
        nothing.
      - Like the C(allreduce) task, the run is a probe that acts in check mode too and leaves nothing behind.
    type: dict
    default: {}
  lock:
    description:
      - The gate's run lock, C({dir, run_id, controller, controller_pid, controller_start, user, lease_seconds,
        live_runs}) from the C(inputs) decision (C(module_utils/preflight_lock.py)). Taken before anything is read
        - a lease file in C(dir) named after the node's hostname, written under C(flock).
      - A node another live run holds is reported in RV(busy) and nothing else runs on it; a lease whose run
        expired, or whose C(ansible-playbook) no longer runs on this run's controller, is taken over and what that
        run left on the node (its torchrun and ranks) is ended.
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
    details:
      - Reads only; the one-node early launch (O(early_launch)) is a probe that runs in check mode too, as the
        C(allreduce) task does, and leaves nothing behind.
  diff_mode:
    support: none
author:
  - Cluster preflight maintainers
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
      C(auto_root), C(missing) or C(cannot_switch).
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
early:
  description:
    - With O(early_launch), C({launched, results_file, marker, args}) of the run started in the background, or
      C({launched=false, reason}) when the stages would not launch it (the controller then decides as usual).
  returned: when early_launch is given
  type: dict
hangs:
  description: Program to C({program, seconds, user}) of the training Python when it hung in this call.
  returned: when it hung
  type: dict
lock:
  description:
    - With O(lock), C({state, path, lease, took_over, ended, why}) - C(state) is C(held), C(busy) or C(error) (the
      lock directory could not be used; the run goes on unprotected).
  returned: when lock is given
  type: dict
busy:
  description: The same as RV(lock) when another run holds the node (C(lease) says which); nothing was read.
  returned: when the node is busy
  type: dict
probes:
  description: With O(probes), capability name to its probe's result (and C(probe_errors), C(probe_elapsed)).
  returned: when probes are given
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_capabilities import FACTS_CALL_SPEC, node_call
from ansible.module_utils.preflight_gate_run import start_planned
from ansible.module_utils.preflight_stages import early_launch_args


def launch_early(module, read):
    """The one-node early launch (O(early_launch)) over what the readers found: C({early: ...})."""
    early = module.params["early_launch"]
    if not early:
        return {}
    try:
        args, reason = early_launch_args(early["host"], early["settings"], early["node"], read,
                                         run_id=(module.params.get("lock") or {}).get("run_id") or "")
        if args is None:
            return {"early": {"launched": False, "reason": reason}}
        return {"early": dict(start_planned(args, early["worker_source"]), args=args)}
    except Exception as exc:  # pylint: disable=broad-except
        # Never worse than no early launch: the controller then plans and launches as usual.
        return {"early": {"launched": False, "reason": "the early launch raised %s: %s" % (type(exc).__name__, exc)}}


def main():
    node_call(AnsibleModule(argument_spec=FACTS_CALL_SPEC, supports_check_mode=True), "read", "facts",
              then=launch_early)


if __name__ == "__main__":
    main()
