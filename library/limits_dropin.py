#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ensure or audit a pam_limits drop-in (for example core dumps unlimited)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: limits_dropin
short_description: Ensure or audit resource limits in a limits.d drop-in of their own
description:
  - Writes one file in C(/etc/security/limits.d) holding C(<domain> <type> <item> <value>) for every
    domain and type given (by default C(soft) and C(hard) C(core unlimited) for C(*) and for C(root),
    because pam_limits never applies C(*) or group lines to root). The file is written atomically with
    a managed header; C(/etc/security/limits.conf) and other drop-ins are only read, never written.
  - Every input is validated before anything is read or written; a bad type, item or value fails
    naming it and C(man limits.conf).
  - "Reads C(limits.conf) and every other C(limits.d/*.conf) the way pam_limits applies them: a line for
    a user name beats a group line, which beats C(*), and among lines of the same kind the one read last
    (limits.conf first, then limits.d in lexical order) wins. A line elsewhere that would override the
    drop-in with a different value (for example C(* hard core 0) in a later file, or C(alice hard core 0)
    anywhere) is a finding with the file and line to change."
  - Reports whether any PAM service in C(/etc/pam.d) loads C(pam_limits.so), since limits.d is applied
    only by it. Processes started by systemd units or a batch daemon get their limits elsewhere
    (C(LimitCORE=), the daemon's own propagation) and are not covered by this file.
  - "Reads the node (C(preflight_limits.read_limits)), writes only outside check mode, then judges what is
    there with C(decide_limits) - the same reader and decider the preflight audit (capability C(core_dumps))
    uses, so the writer and the audit never disagree. The drop-in passes when its lines are exactly the
    wanted ones (comments aside); C(changed) compares the whole file, header and comment included."
  - Findings never fail the task; they are returned in RV(checks). The task fails only for bad arguments or
    when the drop-in cannot be written (read-only C(/etc), no permission) or is a symlink (see O(path)), with
    found, expected and fix.
    A missing C(limits.d), PAM directory or unreadable limits file is a finding, not an error.
version_added: "1.0.0"
extends_documentation_fragment: [preflight, preflight.dropin]
options:
  path:
    description:
      - The drop-in. It must end in C(.conf) and live in O(limits_dir); any other content is replaced.
      - It must be a regular file or absent. When it would change and is a symlink, the task fails naming
        the link and its target (in check mode too); nothing is written over or through it.
    type: path
    default: /etc/security/limits.d/90-preflight-core.conf
  domains:
    description:
      - Domains to set, as in limits.conf(5) (C(*), a user name, C(@group), a uid range C(min:max)).
      - Keep C(root) next to C(*) when root's processes should get the limit too.
    type: list
    elements: str
    default: ["*", root]
  types:
    description: Limit types to set, each one of C(soft), C(hard), C(-) (both).
    type: list
    elements: str
    default: [soft, hard]
  item:
    description: The limits.conf(5) item (C(core), C(nofile), C(memlock), ...).
    type: str
    default: core
  value:
    description:
      - An integer, or C(unlimited) (also spelled C(infinity) or C(-1)). C(nice) and C(priority) take
        -20 to 19.
    type: str
    default: unlimited
  state:
    description: V(present) writes the drop-in; V(audit) only reads and reports.
    type: str
    choices: [present, audit]
    default: present
  limits_conf:
    description: The main pam_limits file, read for conflicting lines.
    type: path
    default: /etc/security/limits.conf
  limits_dir:
    description: The pam_limits drop-in directory.
    type: path
    default: /etc/security/limits.d
  pam_dir:
    description: PAM service directory searched for C(pam_limits.so).
    type: path
    default: /etc/pam.d
  root:
    description: Prefix for every path above; tests point it at a sandbox tree. Reported paths stay logical.
    type: path
    default: /
  policy:
    description: Status of a finding (drift in check mode or audit, a conflicting line that wins, no pam_limits).
    type: str
    choices: [warn, fail]
    default: fail
  check_name:
    description: Prefix of the names in RV(checks); defaults to C(<item>_limits).
    type: str
attributes:
  diff_mode:
    support: full
    description: Before/after of the drop-in.
seealso:
  - name: limits.conf(5)
    description: Syntax, items and precedence.
    link: https://man7.org/linux/man-pages/man5/limits.conf.5.html
"""

EXAMPLES = r"""
- name: Ensure every job user, and root, may write core files of any size.
  limits_dropin:
    path: /etc/security/limits.d/90-preflight-core.conf
    domains: ["*", root]
    types: [soft, hard]
    item: core
    value: unlimited

- name: Audit the core limits without changing anything.
  limits_dropin:
    state: audit
    policy: warn
  register: core_limits_audit
"""

RETURN = r"""
changed:
  description: Whether the drop-in was (or in check mode would be) changed.
  returned: always
  type: bool
checks:
  description:
    - "C(<check_name>) for the drop-in content, C(<check_name>_conflicts) for lines elsewhere that win
      over it, C(<check_name>_pam) for pam_limits being loaded by a PAM service."
  returned: always
  type: dict
entries:
  description: The lines the drop-in holds (domain, type, item, value).
  returned: always
  type: list
  elements: dict
conflicts:
  description: Lines in other files that override the drop-in for some users, with file, line and who they apply to.
  returned: always
  type: list
  elements: dict
  sample:
    - {file: /etc/security/limits.conf, line: 12, domain: "*", type: hard, value: "0", applies_to: every user but root}
pam_services:
  description: PAM service files that load pam_limits.so.
  returned: always
  type: list
  elements: str
backup_file:
  description: Path of the backup copy.
  returned: when a backup was made
  type: str
diff:
  description: Before/after of the drop-in.
  returned: diff mode, state=present
  type: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_node.limits import session as limits
from ansible.module_utils.preflight_node.limits import write as limits_write
from ansible.module_utils.preflight_node.host.files import DROPIN_OPTIONS, refuse_symlinks
from ansible.module_utils.preflight_node.sysctl.values import rooted
from ansible.module_utils.preflight_node.sysctl.write import write_dropin


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", default="/etc/security/limits.d/90-preflight-core.conf"),
            domains=dict(type="list", elements="str", default=["*", "root"]),
            types=dict(type="list", elements="str", default=["soft", "hard"]),
            item=dict(type="str", default="core"),
            value=dict(type="str", default="unlimited"),
            state=dict(type="str", default="present", choices=["present", "audit"]),
            limits_conf=dict(type="path", default=limits.LIMITS_CONF),
            limits_dir=dict(type="path", default=limits.LIMITS_DIR),
            pam_dir=dict(type="path", default=limits.PAM_DIR),
            **DROPIN_OPTIONS
        ),
        supports_check_mode=True,
    )
    params = module.params
    item = params["item"].strip().lower()
    types = [str(limit_type).strip().lower() for limit_type in params["types"]]
    domains = [str(domain).strip() for domain in params["domains"]]
    value = str(params["value"]).strip().lower()
    errors = limits_write.validate(domains, types, item, value)
    path = os.path.normpath(params["path"])
    problem = limits_write.path_problem(path, os.path.normpath(params["limits_dir"]),
                                  os.path.normpath(params["limits_conf"]))
    if problem:
        errors.append(problem)
    if errors:
        module.fail_json(msg="Invalid limits: " + "; ".join(errors), errors=errors)

    root = params["root"]
    short = params["check_name"] or "%s_limits" % item
    present = params["state"] == "present"
    entries = limits_write.entries_for(domains, types, item, value)

    # Read, decide what to write, write only outside check mode, then judge what
    # is there now with the same decider the audit uses.
    def read():
        return limits.read_limits(root, path, params["limits_conf"], params["limits_dir"], params["pam_dir"],
                                  item=item)

    before = read()
    if before["error"] and present:
        module.fail_json(msg="Found: %s. Expected: a readable %s. Fix: run the bring-up as root "
                             "(preflight_become: true)." % (before["error"], path))
    desired_text = limits_write.render(item, entries, params["comment"])
    after_text = desired_text if present else before["text"]
    changed = present and before["text"] != desired_text
    result = dict(changed=changed, entries=entries, path=path)
    applied = changed and not module.check_mode
    if changed:
        # Decided before anything is written (and in check mode, where the real run would fail).
        refuse_symlinks(module, [(rooted(root, path), path)])
    if applied:
        # A read-only /etc or no permission ends the task in write_atomic with found / expected / fix.
        backup_file = write_dropin(module, rooted(root, path), desired_text, params["backup"], logical=path)
        if backup_file:
            result["backup_file"] = backup_file
    after = read() if applied else before

    checks = limits_write.decide_limits(after, entries, params["policy"], short)
    result.update(checks=checks, conflicts=limits_write.conflicts(after, entries),
                  pam_services=after["pam_services"] or [])
    if present and module._diff:
        result["diff"] = dict(before_header=path, after_header=path, before=before["text"] or "", after=after_text)
    result["msg"] = "%s: %s" % (path, "would change" if changed and module.check_mode else
                                ("changed" if changed else "unchanged"))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
