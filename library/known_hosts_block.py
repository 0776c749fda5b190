#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Keep the cluster's host keys in a managed block of the system-wide known_hosts file."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: known_hosts_block
short_description: Keep every cluster node's host keys in a managed block of ssh_known_hosts
description:
  - Writes one line per node and host key type, C(NAMES TYPE KEY node=NODE), between a BEGIN and an
    END marker line in O(path) (by default C(/etc/ssh/ssh_known_hosts), which every ssh client on
    the node reads). Every line outside the markers, hashed (C(|1|...)) entries included, is kept
    byte for byte.
  - The keys come from the nodes themselves (the C(ssh_trust) reader of every node), never from C(ssh-keyscan).
  - "A node whose key differs from the one the block already holds (reinstalled, or spoofed) is never
    silently replaced: its old lines stay, RV(changed_keys) names it with both SHA256 fingerprints and
    the command to accept the new key, until the node is listed in O(accept_changed)."
  - Lines of nodes listed in O(keep_nodes) that have no entry this run (unreachable) are kept as they
    are; lines of any other node without an entry are dropped.
  - The entries are the output of C(plan) in C(cluster_preflight/capabilities/ssh_trust/) (role variable
    C(ssh_trust_known_hosts_entries)); the preflight audit compares each node's block with the same
    function this module writes with, so bring-up and audit cannot disagree.
  - The file is replaced atomically (temp file in the same directory, then rename); O(backup) keeps a
    copy first. A file with a BEGIN marker but no END (or two blocks) is refused, not guessed at.
version_added: "1.0.0"
extends_documentation_fragment: [preflight]
options:
  path:
    description: The known_hosts file.
    type: path
    default: /etc/ssh/ssh_known_hosts
  entries:
    description: The desired nodes, in any order (the block is sorted by node).
    type: list
    elements: dict
    default: []
    suboptions:
      node:
        description: Inventory name; written as the C(node=) comment that ties a line to its node.
        type: str
        required: true
      names:
        description: Every name and address the node is reached by (hostname, FQDN, short name, addresses).
        type: list
        elements: str
        required: true
      keys:
        description: Host public keys, C(TYPE BASE64) (a comment is ignored).
        type: list
        elements: str
        required: true
      port:
        description: sshd port; names are written as C([name]:port) unless it is 22.
        type: int
        default: 22
  keep_nodes:
    description: Nodes whose existing lines stay when they have no entry (for example unreachable this run).
    type: list
    elements: str
    default: []
  accept_changed:
    description: Nodes whose changed host key may replace the old one (after the operator verified it).
    type: list
    elements: str
    default: []
  state:
    description: V(present) writes the block; V(absent) removes it (and only it).
    type: str
    choices: [present, absent]
    default: present
  marker:
    description: Marker line template; C({mark}) becomes C(BEGIN) and C(END).
    type: str
    default: "# {mark} preflight ssh_trust: cluster host keys (managed block; change the inventory, not these lines)"
  drift_policy:
    description: Status of the C(ssh_known_hosts) check when check mode finds the block out of date.
    type: str
    choices: [warn, fail]
    default: fail
  mode:
    description: Mode of a newly created file (an existing file keeps its mode).
    type: raw
    default: "0644"
  backup:
    description: Keep a timestamped copy of the file before replacing it.
    type: bool
    default: false
  root:
    description: Prefix for O(path); tests point it at a sandbox tree. Reported paths stay logical.
    type: path
    default: /
attributes:
  check_mode:
    support: full
    description: Reports what would change (and the drift check); writes nothing.
  diff_mode:
    support: full
    description: Before and after of the whole file.
"""

EXAMPLES = r"""
- name: Write the cluster known-hosts block.
  known_hosts_block:
    entries:
      - node: gpu01
        names: [gpu01, gpu01.cluster.example.org, 198.18.0.11]
        keys: ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO..."]
    keep_nodes: "{{ groups['all'] }}"
    accept_changed: "{{ ssh_trust_accept_changed }}"
  register: ssh_trust_known_hosts
"""

RETURN = r"""
changed:
  description: Whether the file was (or in check mode would be) changed.
  returned: always
  type: bool
path:
  description: The known_hosts file (logical path).
  returned: always
  type: str
block:
  description: The lines the block holds after this run (in check mode, would hold).
  returned: always
  type: list
  elements: str
changed_keys:
  description:
    - One entry per node and key type whose key differs from the one the block held, with the names
      it was listed under, old and new SHA256 fingerprints, whether it was accepted, and the fix.
  returned: always
  type: list
  elements: dict
  sample:
    - {node: gpu02, names: [gpu02, 198.18.0.12], key_type: ssh-ed25519, old_fingerprint: "SHA256:8mbU...",
       new_fingerprint: "SHA256:fUa/...", accepted: false, fix: "verify that SHA256:fUa/... is gpu02's ..."}
held_back:
  description: Nodes whose old lines were kept because their changed key is not accepted.
  returned: always
  type: list
  elements: str
missing:
  description: Per node, the names for which the block did not hold the node's current key before this run.
  returned: always
  type: list
  elements: dict
dropped:
  description: Nodes whose lines were removed (neither an entry nor in keep_nodes).
  returned: always
  type: list
  elements: str
before_sha256:
  description: SHA-256 of the file before (null when it did not exist).
  returned: always
  type: str
after_sha256:
  description: SHA-256 of the file after (in check mode, as it would be).
  returned: always
  type: str
checks:
  description: C(ssh_known_hosts), whether this node's file holds every reachable node's current key.
  returned: always
  type: dict
backup_file:
  description: Path of the backup copy.
  returned: when a backup was made
  type: str
diff:
  description: Before and after of the file.
  returned: diff mode
  type: dict
"""

import socket

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_node.host.files import refuse_symlinks, write_atomic
from ansible.module_utils.preflight_node.ssh.known_hosts_plan import join_block, plan_block, sha256_text
from ansible.module_utils.preflight_node.ssh.primitives import MARKER, SshTrustError, markers, read_text, rooted, split_block
from ansible.module_utils.preflight_node.ssh.checks import known_hosts_check


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", default="/etc/ssh/ssh_known_hosts"),
            entries=dict(type="list", elements="dict", default=[], options=dict(
                node=dict(type="str", required=True),
                names=dict(type="list", elements="str", required=True),
                keys=dict(type="list", elements="str", required=True, no_log=False),
                port=dict(type="int", default=22),
            )),
            keep_nodes=dict(type="list", elements="str", default=[]),
            accept_changed=dict(type="list", elements="str", default=[]),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            marker=dict(type="str", default=MARKER),
            drift_policy=dict(type="str", choices=["warn", "fail"], default="fail"),
            mode=dict(type="raw", default="0644"),
            backup=dict(type="bool", default=False),
            root=dict(type="path", default="/"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    path = params["path"]
    full = rooted(params["root"], path)
    try:
        mode = int(str(params["mode"]), 8)
    except ValueError:
        module.fail_json(msg="Found: mode %r for %s on %s. Expected: an octal file mode such as 0644. Fix: set mode "
                             "to an octal string." % (params["mode"], path, socket.gethostname()))
    before = read_text(full)
    try:
        if params["state"] == "absent":
            begin, end = markers(params["marker"])
            head, body, tail, _present = split_block(before, begin, end)
            plan = {"text": join_block(head, [], tail, begin, end), "block": [], "old_block": body,
                    "changed_keys": [], "missing": [], "dropped": []}
        else:
            plan = plan_block(before, params["entries"], params["keep_nodes"], params["accept_changed"],
                              params["marker"], path)
    except SshTrustError as exc:
        # SshTrustError's text already says what was found, what is expected and the fix.
        module.fail_json(msg="%s on %s: %s" % (path, socket.gethostname(), exc))

    after = plan["text"]
    if before is None and not after:
        after = None
    changed = after != before
    held_back = sorted({c["node"] for c in plan["changed_keys"] if not c["accepted"]})
    result = dict(changed=changed, path=path, block=plan["block"], changed_keys=plan["changed_keys"],
                  held_back=held_back, dropped=plan["dropped"],
                  missing=[m for m in plan["missing"] if m["node"] not in held_back],
                  before_sha256=sha256_text(before), after_sha256=sha256_text(after))

    if changed:
        # Decided before acting, in check mode too: the real run would refuse a symlinked file.
        refuse_symlinks(module, [(full, path)])
    if changed and not module.check_mode:
        backup_file = write_atomic(module, full, after or "", mode=mode, backup=params["backup"], logical=path)
        if backup_file:
            result["backup_file"] = backup_file

    result["checks"] = {"ssh_known_hosts": known_hosts_check(
        None, path, plan, params["drift_policy"], applied=not module.check_mode, held_back=held_back,
        changed=changed)}
    if params["state"] == "absent":
        result["checks"]["ssh_known_hosts"]["expected"] = "no managed block in %s" % path
    if held_back:
        result["checks"]["ssh_known_hosts"]["details"] = {"held_back": held_back}

    if module._diff:
        result["diff"] = dict(before_header=path, after_header=path, before=before or "", after=after or "")
    result["msg"] = "%s: %s" % (path, ("would change" if module.check_mode else "changed") if changed else "unchanged")
    if held_back:
        result["msg"] += "; host key changed and not accepted for %s (old lines kept)" % ", ".join(held_back)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
