#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Release the gate's run lock on a node."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_lock
short_description: Release the gate's run lock (its lease) on a node at the end of the run
description:
  - The facts call of C(preflight.yml) takes every node with a lease (C(module_utils/preflight_node/lock.py)); this
    module, the run's last call on a node that took part in more than one node's run, removes it again so the
    next run finds the node free. A one-node run releases it in its probes call instead.
  - Only this run's lease is removed (the run id must match), under C(flock); another run's lease is left alone.
version_added: "1.0.0"
extends_documentation_fragment: [preflight, preflight.run_state, preflight.acts_in_check_mode]
options:
  dir:
    description: The lock directory the lease was taken in (C(preflight_lock_dir)).
    type: path
    required: true
  run_id:
    description: The run whose lease to remove (the C(inputs) decision's C(lock.run_id)).
    type: str
    required: true
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
"""

RETURN = r"""
released:
  description: Whether this run's lease was there and was removed.
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
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_node.lock import release


def main():
    module = AnsibleModule(argument_spec=dict(dir=dict(type="path", required=True),
                                              run_id=dict(type="str", required=True)),
                           supports_check_mode=True)
    result = release({"dir": module.params["dir"], "run_id": module.params["run_id"]})
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
