#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read every capability's facts on a node and run its node-local probes in one module call (the node-local
health check, playbooks/healthcheck.yml)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_local
short_description: Read a node's preflight facts and run its node-local probes in one call
description:
  - The one node call of the node-local health check (C(healthcheck.yml)). Runs the reader (the C(read) function
    of C(module_utils/preflight_node/<capability>.py), registered in C(module_utils/preflight_node/readers.py)) of
    every capability named in O(capabilities), then the probe (the C(probe) function of
    C(module_utils/preflight_node/<capability>_probe.py), registered in C(module_utils/preflight_node/probes.py))
    of every capability named in O(probes) - those that need no peer, such as the core crash.
  - Each reader and each probe is its own failure domain; one that raises is reported under RV(errors) (a reader)
    or RV(probe_errors) (a probe) with the exception and the others still run. The controller
    (C(preflight_decide)) turns facts and probe results into checks.
  - The arguments come from C(preflight_settings) with C(kind=healthcheck), which validated the role variables they
    derive from. Takes no run lock and starts no background job.
version_added: "1.0.0"
extends_documentation_fragment: [preflight, preflight.run_state, preflight.node_call]
options:
  capabilities:
    description: Capability name to the arguments of its reader (C(read_args) of the capability).
    type: dict
    required: true
  probes:
    description:
      - Capability name to the arguments of a probe that needs no peer (the core crash, the ptrace attach), run
        after the readers in the same call. Empty runs the readers only.
    type: dict
    default: {}
  selftest_error:
    description:
      - Name of a capability whose reader (and probe) raises on purpose, to prove that one failing capability
        leaves the others' results intact. Empty in normal runs.
    type: str
    default: ""
attributes:
  check_mode:
    support: full
    description:
      - Runs the same in check mode. The readers only read; the probes act (a crashing child, a ptrace attach)
        but change nothing that persists.
"""

EXAMPLES = r"""
- name: Read the node and run its node-local probes in one call.
  preflight_local:
    capabilities: "{{ preflight_settings.read_args }}"
    probes: "{{ preflight_settings.local_probes }}"
    job: "{{ preflight_settings.job }}"
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
probes:
  description: Capability name to its probe's result (the shape is the capability's own).
  returned: when probes are given
  type: dict
probe_errors:
  description: Capability name to C({found, traceback}) for a probe that raised.
  returned: when probes are given
  type: dict
probe_elapsed:
  description: Capability name to the seconds its probe took.
  returned: when probes are given
  type: dict
hangs:
  description: Program to C({program, seconds, user}) of the training Python when it hung in this call.
  returned: when it hung
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_node import probes, readers
from ansible.module_utils.preflight_node.calls import LOCAL_CALL_SPEC, node_call


def main():
    node_call(AnsibleModule(argument_spec=LOCAL_CALL_SPEC, supports_check_mode=True), readers, "read", "facts",
              local_probes=probes)


if __name__ == "__main__":
    main()
