#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Wait for the background all-reduce on this node and return its result, in one module call."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: allreduce_wait
short_description: Wait for this node's background all-reduce and return its result
description:
  - The C(allreduce) module runs with C(async) so the play's audits run meanwhile. This waits for its result
    file on the node with a fine-grained poll, in a single module call (an C(async_status) retry loop costs a
    module call per poll), returns the all-reduce result as its own and removes the job's result file.
  - If no result arrives within O(timeout) seconds, returns a failing C(allreduce_ranks) finding instead of
    hanging.
version_added: "1.0.0"
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
attributes:
  check_mode:
    support: full
    details: Reads the job's result file and removes it, leaving the node as it was before the gate.
  diff_mode:
    support: none
author:
  - Cluster preflight maintainers
"""

EXAMPLES = r"""
- name: Wait for this node's all-reduce.
  allreduce_wait:
    results_file: "{{ allreduce_job.results_file }}"
    timeout: 180
  register: allreduce_result
"""

RETURN = r"""
waited:
  description: Seconds spent waiting.
  returned: always
  type: float
ranks:
  description: The C(allreduce) module's per-rank results (see its documentation), with every other key it returns.
  returned: when the all-reduce finished
  type: list
  elements: dict
checks:
  description: Findings C({status, found, expected, fix}).
  returned: always
  type: dict
"""

import json
import os
import socket
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_checks import failed


def read_finished(path):
    """The job's final result, or None while it runs (async_wrapper writes {"started": 1} until then)."""
    try:
        with open(path) as handle:
            data = json.loads(handle.read())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or "started" in data:
        return None
    return data


def main():
    module = AnsibleModule(
        argument_spec=dict(results_file=dict(type="path", required=True),
                           timeout=dict(type="float", default=180),
                           poll=dict(type="float", default=0.1)),
        supports_check_mode=True,
    )
    path = module.params["results_file"]
    start = time.monotonic()
    deadline = start + module.params["timeout"]
    data = read_finished(path)
    while data is None and time.monotonic() < deadline:
        time.sleep(module.params["poll"])
        data = read_finished(path)
    waited = round(time.monotonic() - start, 3)
    if data is None:
        host = socket.gethostname().split(".")[0]
        module.exit_json(changed=False, waited=waited, checks={"allreduce_ranks": failed(
            "no result from the all-reduce on %s after %.0f s" % (host, waited),
            "the gate's result within its hard timeout",
            "the node's async job did not finish: look for a stuck torchrun on %s (pgrep -af allreduce_worker) "
            "and its result file %s" % (host, path))})
    try:
        os.unlink(path)
    except OSError:
        pass
    data.pop("invocation", None)
    if data.get("failed"):
        module.fail_json(waited=waited, **data)
    data.update(changed=False, waited=waited)
    module.exit_json(**data)


if __name__ == "__main__":
    main()
