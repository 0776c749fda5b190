#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Release (or renew) the gate's run lock on a node."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_lock
short_description: Release the gate's run lock (its lease) on a node at the end of the run, or renew it
description:
  - The facts call of C(preflight.yml) takes every node with a lease (C(module_utils/preflight_node/host/lock.py)); this
    module, the run's last call on a node that took part in more than one node's run, removes it again so the
    next run finds the node free. A one-node run releases it in its probes call instead.
  - Only this run's lease is removed (the run id must match), under C(flock); another run's lease is left alone.
  - With O(renew) it renews this run's lease instead (each localisation round, so a node that sits a round out
    keeps it for that round, and no longer).
version_added: "1.0.0"
extends_documentation_fragment: [preflight, preflight.run_state, preflight.acts_in_check_mode]
options:
  dir:
    description: The lock directory the lease was taken in (C(preflight_lock_dir)); required without O(renew).
    type: path
  run_id:
    description: The run whose lease to remove (the C(inputs) decision's C(lock.run_id)); required without O(renew).
    type: str
  renew:
    description:
      - This run's lock arguments with C(lease_seconds) (the localisation's C(lock), C(cluster_preflight/stages/run_lock.py));
        the lease is renewed to at least now plus C(lease_seconds) and nothing is removed. Fails when another run
        took the node over (RV(lock) says which).
    type: dict
attributes:
  check_mode:
    details:
      - The lease is run-time state of the gate (a tmpfs file the gate itself created), not configuration - it is
        removed in check mode too, so an audit leaves nothing behind. C(changed) is always false.
"""

EXAMPLES = r"""
- name: Release this run's lock on the node.
  preflight_lock:
    dir: "{{ preflight_inputs.lock.dir }}"
    run_id: "{{ preflight_inputs.lock.run_id }}"
  check_mode: false

- name: Hold this node for the localisation round.
  preflight_lock:
    renew: "{{ allreduce_localize.lock }}"
  check_mode: false
"""

RETURN = r"""
released:
  description: Whether this run's lease was there and was removed (false with O(renew)).
  returned: always
  type: bool
path:
  description: The lease file.
  returned: always
  type: str
why:
  description: Why nothing was removed (no lease, another run's lease), or empty.
  returned: always
  type: str
lock:
  description: With O(renew), C({state, path, lease, took_over, ended, why}); C(state) is C(held), C(lost) or C(error).
  returned: when renew is given
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_node.host.lock import MODULE_SPEC, module_main


def main():
    module_main(AnsibleModule(argument_spec=MODULE_SPEC, required_one_of=[("run_id", "renew")],
                              required_together=[("dir", "run_id")], mutually_exclusive=[("run_id", "renew")],
                              supports_check_mode=True))


if __name__ == "__main__":
    main()
