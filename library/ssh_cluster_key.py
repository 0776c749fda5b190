#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Each listed user's own key pair for node-to-node logins, and that user's keys from every node authorized."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: ssh_cluster_key
short_description: A node-to-node ssh key pair per user and node, and each user's keys from every node authorized
description:
  - For every user in O(users), on this node, ensures an ed25519 key pair of the user's own in
    C(~/.ssh/KEY_NAME). The directory and the pair are created B(as that user) (C(mkdir) and
    C(ssh-keygen) run with its uid, its groups and a minimal environment), so root never writes
    a key into a user's directory and no user ever gets another user's (root's) key. A missing
    C(.pub) is derived with C(ssh-keygen -y), also as the user.
  - The private key is never read by this module, returned, logged or copied. The user's own private
    key with a mode other than 0600 gets 0600 through a descriptor opened without following a link;
    one owned by someone else (or with other hard links) is refused, never chowned. RV(public_keys)
    returns the public halves only, for the controller to collect.
  - "Refuses (a finding in RV(refused) and the C(ssh_dirs) check, nothing written for that user, the
    other users still handled): a home or C(~/.ssh) that group or others can write or that someone else
    owns (sshd's StrictModes ignores such keys), a C(~/.ssh) or C(authorized_keys) that is a symlink, a
    user that does not exist."
  - With O(authorized) (node -> user -> public key, every node's RV(public_keys)), rewrites the user's
    cluster key lines in C(~/.ssh/authorized_keys), the lines whose last word is O(comment), one per node
    (C([OPTIONS ]TYPE KEY node=NODE COMMENT)), sorted by node, where the first one was. Every other
    line stays byte for byte. A node of O(keep_nodes) without a key in O(authorized) (not reached this
    run) keeps its old line; any other old cluster key line goes (a departed node, an old shared key).
  - C(authorized_keys) is written as root only through a descriptor of C(~/.ssh) opened without
    following a link and checked again (owner, mode), as a new file owned by the user, mode 0600,
    renamed over the old one.
  - The same rules as the preflight's audit (C(ssh_dir_refusal) and C(plan_authorized_keys) in
    C(module_utils/preflight_node/ssh/keys_write.py)), so bring-up and audit judge alike.
version_added: "1.1.0"
extends_documentation_fragment: [preflight]
options:
  users:
    description: The users that get a pair of their own on this node.
    type: list
    elements: str
    required: true
  key_name:
    description: File name of the pair in each user's C(~/.ssh).
    type: str
    default: id_ed25519_cluster
  comment:
    description: One word; the key's comment and the last word of each of its C(authorized_keys) lines.
    type: str
    default: preflight-ssh-trust-cluster-key
  generate:
    description: Create C(~/.ssh) and the pair when missing; false only reports them.
    type: bool
    default: true
  authorized:
    description:
      - Node -> user -> public key (C(TYPE BASE64)), every node's RV(public_keys). Omitted, C(authorized_keys) is
        left alone.
    type: dict
  keep_nodes:
    description: Nodes whose old line stays when O(authorized) has no key of theirs for the user.
    type: list
    elements: str
    default: []
  options:
    description: C(authorized_keys) options written before each key, for example C(from="198.18.0.1,198.18.0.2").
    type: str
    default: ""
  backup:
    description: Keep a timestamped copy of C(authorized_keys) (owned by the user, 0600) before replacing it.
    type: bool
    default: false
  node:
    description: This node's name in findings; defaults to its host name.
    type: str
  root:
    description: Prefix for every path; tests point it at a sandbox tree. Reported paths stay logical.
    type: path
    default: /
attributes:
  check_mode:
    support: full
    description: Reports what it would create, generate and write; creates, generates and writes nothing.
  diff_mode:
    support: full
    description: Before and after of each C(authorized_keys) (public keys only).
"""

EXAMPLES = r"""
- name: Ensure each cluster key user's own key pair on the node.
  ssh_cluster_key:
    users: [root, train]
    node: "{{ inventory_hostname }}"
  register: ssh_trust_cluster_key_pairs

- name: Ensure each user authorizes their own key from every node.
  ssh_cluster_key:
    users: [root, train]
    generate: false
    authorized:
      gpu01: {root: "ssh-ed25519 AAAAC3Nza...", train: "ssh-ed25519 AAAAC3Nza..."}
      gpu02: {root: "ssh-ed25519 AAAAC3Nza...", train: "ssh-ed25519 AAAAC3Nza..."}
    keep_nodes: [gpu01, gpu02, gpu03]
"""

RETURN = r"""
changed:
  description: Whether a directory, a pair, a key's mode or an C(authorized_keys) was (in check mode, would be) changed.
  returned: always
  type: bool
public_keys:
  description: Per user whose pair exists, its public key C(TYPE BASE64). Never a private key.
  returned: always
  type: dict
  sample: {train: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI..."}
users:
  description:
    - Per user handled, what was done - home, path, created_dir, generated, derived_public, private_fixed,
      fingerprint, authorized_changed, added and removed (C(authorized_keys) lines), backup_file.
  returned: always
  type: dict
refused:
  description: Per user refused, C({found, expected, fix}); nothing was written for that user.
  returned: always
  type: dict
checks:
  description: C(ssh_dirs), fail naming every refused user with found / expected / fix, else pass.
  returned: always
  type: dict
diff:
  description: Before and after of each C(authorized_keys) that changes.
  returned: diff mode
  type: list
"""

import os
import pwd
import re
import socket

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_node.checks import failed, passed
from ansible.module_utils.preflight_node.host.ops import NodeOps
from ansible.module_utils.preflight_node.ssh.primitives import SshTrustError, parse_public_key, rooted
from ansible.module_utils.preflight_node.ssh.keys import (UnsafeDirectory, open_ssh_dir, private_key_state, read_in_dir,
                                                          user_ssh_state)
from ansible.module_utils.preflight_node.ssh.keys_write import (authorized_line, plan_authorized_keys, ssh_dir_refusal,
                                                                tighten_private_key, write_in_dir)

KEY_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
COMMENT = re.compile(r"^[A-Za-z0-9_.@:+=-]+$")


class Refused(Exception):
    """This user's ~/.ssh must not be written: ``problem`` is ``{found, expected, fix}``."""

    def __init__(self, problem):
        super().__init__(problem["found"])
        self.problem = problem


class Failed(Exception):
    """An action the node refused (mkdir, ssh-keygen, a write): ``problem`` is ``{found, expected, fix}``."""

    def __init__(self, problem):
        super().__init__(problem["found"])
        self.problem = problem


def _as_user(ops, user, argv, what, node, fix):
    rc, out, err = ops.run(argv, timeout=60, user=user)
    if rc != 0:
        raise Failed({"found": "%s as %s on %s failed (rc %s): %s" % (what, user, node, rc, (err or out).strip()[-400:]),
                      "expected": "%s succeeds as %s" % (what, user), "fix": fix})
    return out


class UserKey(object):
    """One user's pair and authorized_keys on this node."""

    def __init__(self, module, ops, user, node):
        self.module, self.ops, self.user, self.node = module, ops, user, node
        self.params = module.params
        self.root = self.params["root"]
        self.check_mode = module.check_mode
        self.result = {}
        self.public_key = None
        self.diff = None

    def unsafe(self, why):
        return Refused({"found": "%s's ssh directory on %s: %s" % (self.user, self.node, why),
                        "expected": "%s's ~/.ssh on %s is a directory of its own (no symlink, not writable by group "
                                    "or others)" % (self.user, self.node),
                        "fix": "on %s: make %s a real directory owned by %s, mode 0700, then re-run bringup.yml"
                               % (self.node, self.ssh_dir, self.user)})

    def run(self):
        try:
            entry = pwd.getpwnam(self.user)
        except KeyError:
            raise Refused({"found": "no user %s on %s" % (self.user, self.node),
                           "expected": "every user of ssh_trust_cluster_key_users exists on %s" % self.node,
                           "fix": "create %s on %s first, or remove it from ssh_trust_cluster_key_users"
                                  % (self.user, self.node)}) from None
        self.uid, self.gid, self.home = entry.pw_uid, entry.pw_gid, entry.pw_dir
        self.ssh_dir = self.home.rstrip("/") + "/.ssh"
        self.path = "%s/%s" % (self.ssh_dir, self.params["key_name"])
        self.result = {"home": self.home, "path": self.path, "created_dir": False, "generated": False,
                       "derived_public": False, "private_fixed": False, "fingerprint": "",
                       "authorized_changed": False}
        state = user_ssh_state(self.root, self.home)
        refusal = ssh_dir_refusal(self.node, self.user, self.uid, state)
        if refusal:
            raise Refused(refusal)
        if not state["ssh_dir_state"].get("exists"):
            if not (self.params["generate"] or self.wanted()):
                self.result["missing"] = "no %s" % self.ssh_dir
                return
            self.result["created_dir"] = True
            if self.check_mode:
                self.result["generated"] = self.params["generate"]
                self.authorize(None)
                return
            _as_user(self.ops, self.user, [self.ops.which("mkdir") or "/bin/mkdir", "-m", "700", "--",
                                           rooted(self.root, self.ssh_dir)],
                     "mkdir -m 700 %s" % self.ssh_dir, self.node,
                     "%s must be able to create %s: check the owner and mode of %s on %s"
                     % (self.user, self.ssh_dir, self.home, self.node))
        try:
            dir_fd = open_ssh_dir(self.root, self.home, self.uid)
        except UnsafeDirectory as exc:
            raise self.unsafe(str(exc)) from exc
        try:
            self.pair(dir_fd)
            self.authorize(dir_fd)
        except UnsafeDirectory as exc:
            raise self.unsafe(str(exc)) from exc
        finally:
            os.close(dir_fd)

    def pair(self, dir_fd):
        name = self.params["key_name"]
        state = private_key_state(dir_fd, name)
        keygen = self.ops.which("ssh-keygen")
        if state.get("exists") and state["kind"] != "file":
            raise self.unsafe("%s is a %s, not a private key file" % (self.path, state["kind"]))
        if not state.get("exists"):
            if not self.params["generate"]:
                self.result["missing"] = "no %s" % self.path
                return
            self.result["generated"] = True
            if self.check_mode:
                return
            if not keygen:
                raise Failed({"found": "ssh-keygen is not installed on %s" % self.node,
                              "expected": "ssh-keygen to generate %s's key as %s" % (self.path, self.user),
                              "fix": "install openssh-client on %s" % self.node})
            _as_user(self.ops, self.user, [keygen, "-q", "-t", "ed25519", "-N", "", "-C", self.params["comment"],
                                           "-f", rooted(self.root, self.path)],
                     "ssh-keygen -t ed25519 -f %s" % self.path, self.node,
                     "%s must be able to write %s: check its owner and mode on %s" % (self.user, self.ssh_dir,
                                                                                     self.node))
        elif state["uid"] != self.uid:
            raise self.unsafe("%s is owned by uid %s, not by %s (uid %s): it is not %s's own key" % (
                self.path, state["uid"], self.user, self.uid, self.user))
        elif state["mode"] != 0o600:
            self.result["private_fixed"] = True
            if not self.check_mode:
                tighten_private_key(dir_fd, name, self.uid)
        text = read_in_dir(dir_fd, name + ".pub", self.uid)
        if text is None:
            if not keygen:
                raise Failed({"found": "%s.pub is missing on %s and ssh-keygen is not installed" % (self.path,
                                                                                                  self.node),
                              "expected": "the public half next to %s" % self.path,
                              "fix": "install openssh-client on %s" % self.node})
            text = _as_user(self.ops, self.user, [keygen, "-y", "-f", rooted(self.root, self.path)],
                            "ssh-keygen -y -f %s" % self.path, self.node,
                            "check that %s is an unencrypted private key of %s on %s" % (self.path, self.user,
                                                                                        self.node))
            self.result["derived_public"] = True
        try:
            key = parse_public_key(text)
        except SshTrustError:
            # The error would quote the file: say only that it is not a public key.
            raise Failed({"found": "%s.pub on %s is not an ssh public key" % (self.path, self.node),
                          "expected": "an ssh public key next to %s" % self.path,
                          "fix": "remove %s and %s.pub on %s so bring-up generates a new pair"
                                 % (self.path, self.path, self.node)}) from None
        if self.result["derived_public"] and not self.check_mode:
            write_in_dir(dir_fd, name + ".pub", "%s %s %s\n" % (key["type"], key["blob"], self.params["comment"]),
                         self.uid, self.gid, 0o644)
        self.public_key = "%s %s" % (key["type"], key["blob"])
        self.result["fingerprint"] = key["fingerprint"]

    def wanted(self):
        """node -> this user's authorized_keys line, from ``authorized``."""
        wanted = {}
        for node, by_user in sorted((self.params["authorized"] or {}).items()):
            key = by_user.get(self.user) if isinstance(by_user, dict) else None
            if not key:
                continue
            try:
                wanted[str(node)] = authorized_line(key, node, self.params["comment"], self.params["options"])
            except SshTrustError as exc:
                raise Failed({"found": "the public key of %s from %s is not usable: %s" % (self.user, node, exc),
                              "expected": "TYPE BASE64 public keys in authorized",
                              "fix": "re-run bringup.yml; if it persists, remove %s's pair on %s" % (self.user, node)})
        return wanted

    def authorize(self, dir_fd):
        if self.params["authorized"] is None:
            return
        wanted = self.wanted()
        path = self.ssh_dir + "/authorized_keys"
        text = read_in_dir(dir_fd, "authorized_keys", self.uid) if dir_fd is not None else None
        plan = plan_authorized_keys(text, self.params["comment"], wanted, self.params["keep_nodes"])
        loose = False
        if dir_fd is not None and text is not None:
            state = private_key_state(dir_fd, "authorized_keys")
            loose = bool(state.get("mode", 0) & 0o022) or state.get("uid") not in (self.uid, 0)
        if (text is None and not plan["lines"]) or (plan["text"] == text and not loose):
            return
        self.result.update(authorized_changed=True, added=plan["added"], removed=plan["removed"])
        self.diff = {"before_header": path, "after_header": path, "before": text or "", "after": plan["text"]}
        if not self.check_mode:
            backup = write_in_dir(dir_fd, "authorized_keys", plan["text"], self.uid, self.gid, 0o600,
                                  self.params["backup"])
            if backup:
                self.result["backup_file"] = self.ssh_dir + "/" + backup

    def changed(self):
        return any(self.result.get(k) for k in ("created_dir", "generated", "derived_public", "private_fixed",
                                                "authorized_changed"))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            users=dict(type="list", elements="str", required=True),
            key_name=dict(type="str", default="id_ed25519_cluster"),
            comment=dict(type="str", default="preflight-ssh-trust-cluster-key"),
            generate=dict(type="bool", default=True),
            authorized=dict(type="dict"),
            keep_nodes=dict(type="list", elements="str", default=[]),
            options=dict(type="str", default=""),
            backup=dict(type="bool", default=False),
            node=dict(type="str"),
            root=dict(type="path", default="/"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    node = params["node"] or socket.gethostname()
    if not KEY_NAME.match(params["key_name"]) or not COMMENT.match(params["comment"]) or "\n" in params["options"]:
        module.fail_json(msg="Found: key_name %r, comment %r on %s. Expected: a plain file name and a single word. "
                             "Fix: set ssh_trust_cluster_key_name and ssh_trust_cluster_key_comment to plain words."
                             % (params["key_name"], params["comment"], node))
    ops = NodeOps(module)
    users, public_keys, refused, errors, diffs = {}, {}, {}, {}, []
    changed = False
    for user in dict.fromkeys(params["users"]):
        handler = UserKey(module, ops, user, node)
        try:
            handler.run()
        except Refused as exc:
            refused[user] = exc.problem
        except Failed as exc:
            errors[user] = exc.problem
        except OSError as exc:
            errors[user] = {"found": "%s on %s: %s" % (handler.result.get("path") or user, node,
                                                       exc.strerror or exc),
                            "expected": "%s's ~/.ssh writable by the bring-up" % user,
                            "fix": "fix what the error names on %s, then re-run bringup.yml" % node}
        users[user] = handler.result
        changed = changed or handler.changed()
        if handler.public_key:
            public_keys[user] = handler.public_key
        if handler.diff:
            diffs.append(handler.diff)
    expected = "the home and ~/.ssh of %s on %s are directories of their own (not group- or world-writable, " \
               "~/.ssh no symlink)" % (", ".join(params["users"]), node)
    if refused:
        ssh_dirs = failed("; ".join(p["found"] for p in refused.values()), expected,
                          " ".join(p["fix"] for p in refused.values()))
    else:
        ssh_dirs = passed("the home and ~/.ssh of %s on %s are safe to hold keys" % (", ".join(users), node),
                          expected)
    result = dict(changed=changed, public_keys=public_keys, users=users, refused=refused,
                  checks={"ssh_dirs": ssh_dirs})
    if module._diff and diffs:
        result["diff"] = diffs
    if errors:
        module.fail_json(msg="Found: %s. Expected: %s. Fix: %s." % (
            "; ".join(p["found"] for p in errors.values()), "; ".join(p["expected"] for p in errors.values()),
            "; ".join(p["fix"] for p in errors.values())), errors=errors, **result)
    done = [u for u in users if u not in refused]
    result["msg"] = "%s: %s%s" % (node, "%s for %s" % ("would change" if module.check_mode else "changed", ", ".join(
        u for u in done if users[u] and any(users[u].get(k) for k in ("created_dir", "generated", "derived_public",
                                                                       "private_fixed", "authorized_changed"))))
                                  if changed else "unchanged", "; refused: %s" % "; ".join(
                                      p["found"] for p in refused.values()) if refused else "")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
