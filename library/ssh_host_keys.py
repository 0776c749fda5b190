#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read this node's own SSH host public keys and the names it calls itself by."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: ssh_host_keys
short_description: Read a node's SSH host public keys from the node itself
description:
  - Reads the public half of every host key the node's sshd serves, from the node's own files, so a
    cluster known-hosts set can be built without an unauthenticated C(ssh-keyscan) of the network.
    The connection that runs this module is itself host-key checked, which is what makes the keys
    trustworthy.
  - The key files are those the B(running) sshd serves. The process listening on O(port) is found
    from C(/proc/net/tcp) and C(/proc/net/tcp6) (the socket's inode) and C(/proc/PID/fd); its command
    line gives its configuration (C(-f FILE), C(/etc/ssh/sshd_config) without one), its C(-h KEY) and
    C(-o OPTION) arguments, and C(sshd -T) with them lists the C(HostKey) files (retried with
    C(-C user=root,host=localhost,addr=127.0.0.1) for Match blocks). Without C(sshd -T) (no binary, not
    root) the configuration is parsed (C(Include) lines followed up to the first C(Match) block). Each
    key is read from its C(.pub).
  - O(sshd_config) (that configuration instead of the running sshd's) and O(host_key_files) (these
    files) are explicit overrides. When no sshd is found listening (not root, socket activation)
    C(/etc/ssh/sshd_config) is assumed and the check is a C(warn) saying why.
  - A host key without its C(.pub) file is derived with C(ssh-keygen -y); the private key is read by
    ssh-keygen only and never returned.
  - Also returns the node's host name and FQDN as the node reports them, so no fact gathering is
    needed.
  - Never fails for a finding; a node with no readable host key, no sshd configuration or no sshd at all
    gets a failing C(ssh_host_keys) check that says so.
  - The same reader as the preflight's (C(read) of C(module_utils/preflight_node/ssh_trust.py)).
version_added: "1.0.0"
author:
  - Cluster preflight contributors (@cluster-preflight)
options:
  sshd_config:
    description:
      - An sshd configuration whose C(HostKey) lines name the keys, instead of the running sshd's; empty finds the
        sshd listening on O(port).
    type: str
    default: ""
  port:
    description: The TCP port of the sshd whose keys are read (the port the other nodes reach it on).
    type: int
    default: 22
  host_key_files:
    description:
      - Host key files to read instead of the ones O(sshd_config) names; a private key path or its
        C(.pub). Replaces every discovery.
    type: list
    elements: path
    default: []
  root:
    description: Prefix for every path above; tests point it at a sandbox tree. Reported paths stay logical.
    type: path
    default: /
attributes:
  check_mode:
    support: full
    description: Only reads, in check mode too; RV(check_mode) tells the caller whether the run is an audit.
  diff_mode:
    support: none
    description: Nothing is changed, so there is nothing to diff.
"""

EXAMPLES = r"""
- name: Read this node's SSH host public keys.
  ssh_host_keys:
  register: ssh_trust_host_keys
"""

RETURN = r"""
hostname:
  description: The node's host name (C(hostname)).
  returned: always
  type: str
  sample: gpu017
fqdn:
  description: The node's fully qualified name as its resolver reports it (C(hostname -f)).
  returned: always
  type: str
  sample: gpu017.cluster.example.org
short_name:
  description: The host name up to the first dot.
  returned: always
  type: str
keys:
  description: One entry per host key type; RV(keys[].public_key) is C(TYPE BASE64) without comment.
  returned: always
  type: list
  elements: dict
  sample:
    - {type: ssh-ed25519, public_key: "ssh-ed25519 AAAAC3...", fingerprint: "SHA256:8mbU...", path: /etc/ssh/ssh_host_ed25519_key.pub}
  contains:
    type:
      description: The key type, for example C(ssh-ed25519).
      type: str
    public_key:
      description: The public key as C(TYPE BASE64), without comment.
      type: str
    fingerprint:
      description: The key's C(SHA256:) fingerprint.
      type: str
    path:
      description: The file the key was read from (or the private key it was derived from with C(ssh-keygen -y)).
      type: str
host_key_files:
  description: The private key paths considered, in order.
  returned: always
  type: list
  elements: str
sshd:
  description:
    - Where the key files came from - source (C(listener), C(ssh_trust_sshd_config), C(ssh_trust_host_key_files) or
      C(default)), config, how (C(sshd -T) or parsed), port, pid and argv of the listening sshd, and discovery (why no
      running sshd was found).
  returned: always
  type: dict
  sample: {source: listener, config: /srv/sshd/sshd_config, how: sshd -T, port: 22, pid: 1,
           argv: [/usr/sbin/sshd, -D, -f, /srv/sshd/sshd_config], discovery: ""}
problems:
  description:
    - A missing or unreadable sshd configuration, and key files that could not be read or parsed, with the reason.
  returned: always
  type: list
  elements: str
check_mode:
  description: Whether the task ran in check mode (play-level check_mode is not visible as ansible_check_mode).
  returned: always
  type: bool
checks:
  description:
    - C(ssh_host_keys), pass when at least one host public key was read from the running sshd's files; warn when no
      running sshd was found (the default configuration was assumed); otherwise a fail whose fix names
      O(sshd_config) and O(host_key_files).
  returned: always
  type: dict
"""

import socket

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_node.ops import NodeOps
from ansible.module_utils.preflight_node.sshd import host_key_sources, read_host_keys
from ansible.module_utils.preflight_node.ssh_checks import host_keys_check


def main():
    module = AnsibleModule(
        argument_spec=dict(
            sshd_config=dict(type="str", default=""),
            host_key_files=dict(type="list", elements="path", default=[]),
            port=dict(type="int", default=22),
            root=dict(type="path", default="/"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    root = params["root"]
    ops = NodeOps(module)
    paths, problem, sshd = host_key_sources(root, params["sshd_config"], params["host_key_files"], ops,
                                            params["port"])
    keys, problems = read_host_keys(root, paths, ops)
    if problem:
        problems.insert(0, problem)
    hostname = socket.gethostname()
    fqdn = socket.getfqdn() or hostname
    check = host_keys_check(hostname, keys, problems, sshd)
    module.exit_json(changed=False, hostname=hostname, fqdn=fqdn, short_name=hostname.split(".")[0], keys=keys,
                     host_key_files=[p[:-4] if p.endswith(".pub") else p for p in paths], problems=problems, sshd=sshd,
                     check_mode=module.check_mode, checks={"ssh_host_keys": check})


if __name__ == "__main__":
    main()
