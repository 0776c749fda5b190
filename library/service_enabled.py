#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ensure a systemd service is enabled at boot and running, where it is installed."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: service_enabled
short_description: Ensure an installed systemd service is enabled at boot and running
description:
  - Reads the service the way the preflight audit does (C(module_utils/preflight_node/host/services.py)) - C(systemctl show)
    when systemd is the node's init, the process table otherwise - then decides, then acts outside check mode only.
  - A unit systemd does not know (LoadState C(not-found)) is not installed; the module changes nothing and says so in
    RV(installed). A node whose init is not systemd has nothing to enable; RV(managed) is false.
  - Enables the unit (C(systemctl enable)) when O(enabled) and it is not enabled, starts it (C(systemctl start)) when
    O(started) and it is not active, then reads it again; a unit that does not become active fails the task, with
    the unit's state and where its log is.
  - Bring-up's C(gpu_health) role runs it for the NVIDIA fabric manager on nodes with NVSwitches.
version_added: "1.0.0"
extends_documentation_fragment: [preflight]
options:
  name:
    description: The unit's name, without C(.service) (C(nvidia-fabricmanager)).
    type: str
    required: true
  program:
    description: The service's program as the process table shows it (C(nv-fabricmanager)), read without systemd.
    type: str
    required: true
  enabled:
    description: Enable the unit at boot.
    type: bool
    default: true
  started:
    description: Start the unit when it is not active.
    type: bool
    default: true
  proc_root:
    description: Where procfs is mounted (PID 1 tells whether systemd is the init; tests).
    type: path
    default: /proc
  systemctl:
    description: The systemctl program, by name on the search path or absolute path (tests).
    type: str
    default: systemctl
  timeout:
    description: Bound, in seconds, of each systemctl command.
    type: int
    default: 60
attributes:
  check_mode:
    support: full
    description: Reads the service and reports what it would change; runs no systemctl command that changes state.
  diff_mode:
    support: full
    description: Returns the unit's enabled and active states before and after.
  platform:
    support: full
    platforms: linux
    description: Linux with systemd; elsewhere it changes nothing and says so.
"""

EXAMPLES = r"""
- name: Ensure the NVIDIA fabric manager is enabled at boot and running.
  service_enabled:
    name: nvidia-fabricmanager
    program: nv-fabricmanager
"""

RETURN = r"""
managed:
  description: Whether systemd is the node's init, so the unit could be managed.
  returned: always
  type: bool
installed:
  description: Whether systemd knows the unit (null without systemd).
  returned: always
  type: bool
before:
  description: The service's state before (C(enabled), C(active), C(unit_state), C(pids)).
  returned: always
  type: dict
after:
  description: The service's state after (what it would be, in check mode).
  returned: always
  type: dict
msg:
  description: What was found and done.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_node.host import services
from ansible.module_utils.preflight_node.host.ops import NodeOps


def _text(state):
    return "enabled: %s\nactive: %s\n" % (state.get("enabled"), state.get("active"))


def _act(module, ops, command, verb, name):
    rc, out, err = ops.run([command, verb, name + ".service"], timeout=module.params["timeout"])
    if rc != 0:
        module.fail_json(msg="systemctl %s %s exited %s: %s. Expected: the unit %s. Fix: read systemctl status %s and "
                             "journalctl -u %s on the node" % (verb, name, rc, " ".join((err or out).split())[:300],
                                                              "enabled" if verb == "enable" else "started", name, name))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True), program=dict(type="str", required=True),
            enabled=dict(type="bool", default=True), started=dict(type="bool", default=True),
            proc_root=dict(type="path", default="/proc"), systemctl=dict(type="str", default="systemctl"),
            timeout=dict(type="int", default=60),
        ),
        supports_check_mode=True,
    )
    params, ops = module.params, NodeOps(module)
    name = params["name"][:-len(".service")] if params["name"].endswith(".service") else params["name"]
    before = services.read(ops, name, params["program"], params["proc_root"], params["timeout"], params["systemctl"])
    result = {"managed": before["systemd"], "installed": before["installed"], "before": before, "after": before,
              "changed": False}
    if not before["systemd"]:
        module.exit_json(msg="systemd is not the init of this node: no unit to enable (the audit reads %s's process)"
                             % params["program"], **result)
    command = ops.which(params["systemctl"])
    if not command:
        module.fail_json(msg="systemd is the init but %s is not found. Expected: systemctl on the search path. Fix: "
                             "set systemctl to its path" % params["systemctl"], **result)
    if before["unit_error"]:
        module.fail_json(msg="%s. Expected: systemctl show to answer for %s. Fix: run systemctl status %s by hand"
                             % (before["unit_error"], name, name), **result)
    if not before["installed"]:
        module.exit_json(msg="%s.service is not installed: nothing to enable" % name, **result)
    enable = params["enabled"] and not before["enabled"]
    start = params["started"] and not before["active"]
    after = dict(before, enabled=before["enabled"] or enable, active=before["active"] or start)
    result.update(changed=enable or start, after=after)
    if module._diff:
        result["diff"] = {"before": _text(before), "after": _text(after),
                          "before_header": "%s.service" % name, "after_header": "%s.service" % name}
    if not (enable or start) or module.check_mode:
        module.exit_json(msg="%s.service %s" % (name, "would be %s" % " and ".join(
            verb for verb, wanted in (("enabled", enable), ("started", start)) if wanted) if enable or start
            else "is enabled and active"), **result)
    if enable:
        _act(module, ops, command, "enable", name)
    if start:
        _act(module, ops, command, "start", name)
    result["after"] = services.read(ops, name, params["program"], params["proc_root"], params["timeout"],
                                    params["systemctl"])
    if params["started"] and not result["after"]["active"]:
        module.fail_json(msg="%s.service did not become active (ActiveState %s). Expected: it running. Fix: read "
                             "journalctl -u %s (the fabric manager also logs to /var/log/fabricmanager.log; its "
                             "version must match the driver's)" % (name, (result["after"]["unit_state"] or {}).get(
                                 "ActiveState"), name), **result)
    module.exit_json(msg="%s.service %s" % (name, " and ".join(
        verb for verb, done in (("enabled", enable), ("started", start)) if done)), **result)


if __name__ == "__main__":
    main()
