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
  selftest_error:
    description:
      - Name of a capability whose reader raises on purpose, to prove that one failing reader leaves the others'
        results and the node's all-reduce intact. Empty in normal runs.
    type: str
    default: ""
attributes:
  check_mode:
    support: full
    details: Reads only.
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
probes:
  description: With O(probes), capability name to its probe's result (and C(probe_errors), C(probe_elapsed)).
  returned: when probes are given
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_capabilities import NODE_CALL_SPEC, node_call


def main():
    node_call(AnsibleModule(argument_spec=NODE_CALL_SPEC, supports_check_mode=True), "read", "facts")


if __name__ == "__main__":
    main()
