#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wait for an Ansible async job on this node and return its result, in one module call."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: job_wait
short_description: Wait, bounded, for a background (async) job on this node and return its result
description:
  - "A task started with C(async) and C(poll: 0) (the all-reduce, the port mesh) runs while the play does other
    work. This waits for the job's result file on the node with a fine-grained poll, in a single module call (an
    C(async_status) retry loop costs a module call per poll), returns the job's result as its own and removes the
    job's result file."
  - If no result arrives within O(timeout) seconds, returns a failing C(no_result) finding for O(capability)
    instead of hanging.
  - A job whose module failed (including Ansible's own C(Timeout exceeded) when the job outlived its C(async)
    time) fails this task with the job's message.
version_added: "1.0.0"
extends_documentation_fragment: [preflight, preflight.run_state, preflight.acts_in_check_mode]
options:
  results_file:
    description: The C(results_file) of the registered async task.
    type: path
    required: true
  timeout:
    description: Seconds to wait at most.
    type: float
    default: 180
  poll:
    description: Seconds between looks at the result file.
    type: float
    default: 0.1
  what:
    description: What the job is, for messages (C(the all-reduce), C(the port mesh)).
    type: str
    default: the background job
  capability:
    description:
      - The check namespace the job's findings belong to. The C(no_result) finding is returned in C(checks) like
        the job's own findings, and C(capability) is returned with the result so the caller files both under
        C(<capability>.<name>).
    type: str
    required: true
attributes:
  check_mode:
    details:
      - It reads the job's result file and removes it in check mode too, leaving the node as it was before the
        job. C(changed) is always false.
"""

EXAMPLES = r"""
- name: Wait for this node's all-reduce.
  job_wait:
    results_file: "{{ allreduce_job.results_file }}"
    timeout: 180
    what: the all-reduce
    capability: allreduce
  register: allreduce_result
"""

RETURN = r"""
waited:
  description: Seconds spent waiting.
  returned: always
  type: float
capability:
  description: The O(capability) the findings in C(checks) belong to.
  returned: always
  type: str
checks:
  description:
    - Findings C({status, found, expected, fix}) keyed by name without the capability prefix.
    - The job's own C(checks) when it finished; C(no_result) (a C(fail)) when it did not.
  returned: always
  type: dict
  sample: {no_result: {status: fail, found: "no result from the all-reduce on node3 after 180 s ...",
                       expected: "...", fix: "..."}}
"""

import socket

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_node.checks import NAME_RE
from ansible.module_utils.preflight_node.host.jobs import no_result, read_finished, wait_for  # noqa: F401 (read_finished: tests)


def main():
    module = AnsibleModule(
        argument_spec=dict(results_file=dict(type="path", required=True),
                           timeout=dict(type="float", default=180),
                           poll=dict(type="float", default=0.1),
                           what=dict(type="str", default="the background job"),
                           capability=dict(type="str", required=True)),
        supports_check_mode=True,
    )
    params = module.params
    if not NAME_RE.match(params["capability"]):
        module.fail_json(msg="capability %r must be lower-case words joined by underscores (allreduce, port_mesh)"
                             % params["capability"])
    if params["poll"] <= 0:
        module.fail_json(msg="poll must be more than 0 seconds, got %s" % params["poll"])
    path = params["results_file"]
    data, waited = wait_for(path, params["timeout"], params["poll"])
    if data is None:
        host = socket.gethostname().split(".")[0]
        module.exit_json(changed=False, waited=waited, capability=params["capability"],
                         checks={"no_result": no_result(params["what"], host, path, waited, params["timeout"])})
    data.update(changed=False, waited=waited, capability=params["capability"])
    data.setdefault("checks", {})
    if data.get("failed"):
        module.fail_json(msg=data.pop("msg", None) or "%s failed without a message" % params["what"], **data)
    module.exit_json(**data)


if __name__ == "__main__":
    main()
