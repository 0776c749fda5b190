#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""From this node, ssh to every peer with host-key checking on and classify what happens."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: ssh_mesh
short_description: Check node-to-node ssh with strict host-key checking, every peer in parallel
description:
  - From this node, runs C(ssh -n -o BatchMode=yes -o StrictHostKeyChecking=yes -o ConnectTimeout=N
    TARGET true) to every target of every peer (typically the peer's inter-node address and its
    hostname), all at once in threads, each call bounded by C(timeout). The ssh client reads the
    node's own configuration, so this is what pdsh, mpirun or a launcher on this node would get.
  - Each (source, destination, target) is classified as C(ok), C(host_key_unknown),
    C(host_key_changed), C(auth_denied) (host key verified, login refused), C(refused), C(timeout),
    C(dns), C(unreachable) or C(error).
  - Host-key trust and login are reported as separate checks per peer, C(ssh_host_key_<peer>) and
    C(ssh_login_<peer>), so "host key verified but login denied" never looks like an unknown key.
    A changed key names the old fingerprint (from the known_hosts line ssh calls offending) and the
    new one (the key the peer presented).
  - Reads the client's effective configuration for every target with C(ssh -G) (no connection) and
    reports in C(ssh_client_config) whether StrictHostKeyChecking is off or accept-new for a peer
    (the seeds' C(~/.ssh/config) relaxation), whether the cluster known-hosts file is read, and
    whether the cluster key is offered.
  - When pdsh is installed, also runs C(PDSH_RCMD_TYPE=ssh pdsh -w HOSTS date) as the multi-node
    debugging recipes do (check C(ssh_pdsh)); when it is not, that check is not applicable.
  - "Also runs C(ssh-keyscan) against each peer's first target: the host keys its sshd really presents
    (RV(served)). With a peer's O(peers[].keys) (the keys read from its files), C(ssh_served_<peer>)
    fails when the sshd serves a key that none of those files holds (keys read from the wrong sshd
    configuration). Scanned keys are compared, never trusted or written."
  - C(UpdateHostKeys=no) keeps ssh from writing any known_hosts file; nothing on the node changes.
  - Never fails for a finding. The same code runs in the preflight's probe (C(probe) of
    C(module_utils/preflight_node/ssh_checks.py)), which reports the same findings per node as C(ssh_trust.mesh),
    C(ssh_trust.login), C(ssh_trust.client_config) and C(ssh_trust.pdsh).
version_added: "1.0.0"
author:
  - Cluster preflight contributors (@cluster-preflight)
options:
  peers:
    description: The nodes to ssh to.
    type: list
    elements: dict
    required: true
    suboptions:
      node:
        description: The peer's inventory name (used in check names).
        type: str
        required: true
      targets:
        description: Names or addresses to ssh to, each tried separately.
        type: list
        elements: str
        required: true
      port:
        description: sshd port of the peer.
        type: int
        default: 22
      keys:
        description: The peer's host public keys as read from its own files (C(TYPE BASE64)); enables C(ssh_served_<peer>).
        type: list
        elements: str
        default: []
  source:
    description: This node's name in the results; defaults to its host name.
    type: str
  user:
    description: Login user on the peers; empty means the user this module runs as.
    type: str
    default: ""
  connect_timeout:
    description: ssh ConnectTimeout in seconds.
    type: int
    default: 5
  timeout:
    description: Bound of one ssh (or the pdsh run) in seconds; it is killed (C(timeout --kill-after=2)) after that.
    type: int
    default: 20
  parallel:
    description: Most ssh processes at once.
    type: int
    default: 32
  ssh_options:
    description: Extra C(-o) options (C(Key=Value)), for example C(IdentityFile=...); they cannot relax host-key checking.
    type: list
    elements: str
    default: []
  unknown_policy:
    description:
      - Status of C(ssh_host_key_<peer>) when this node does not know the peer's host key (not yet
        brought up). A changed key always fails.
    type: str
    choices: [warn, fail]
    default: fail
  login_policy:
    description: Status of a C(ssh_login_*) or pdsh finding that is not about the host key (auth denied, refused, timeout, dns).
    type: str
    choices: [warn, fail]
    default: fail
  pdsh:
    description: V(auto) runs the pdsh check when pdsh is installed; V(never) reports it as skipped.
    type: str
    choices: [auto, never]
    default: auto
  pdsh_hosts:
    description: Hosts for C(pdsh -w); empty skips the pdsh check.
    type: list
    elements: str
    default: []
  known_hosts_file:
    description: The cluster known-hosts file; C(ssh -G) must list it as a global or user known-hosts file.
    type: str
    default: /etc/ssh/ssh_known_hosts
  identity_file:
    description: An identity C(ssh -G) must list for every target (the cluster key); empty checks none.
    type: str
    default: ""
  relaxed:
    description:
      - The operator chose C(StrictHostKeyChecking no) for cluster peers (ssh_trust_strict_host_key_checking_no);
        it is then reported as a warning instead of a failure.
    type: bool
    default: false
  ssh_bin:
    description: The ssh client; tests point it at a stand-in.
    type: str
    default: ssh
  pdsh_bin:
    description: The pdsh executable.
    type: str
    default: pdsh
  keyscan:
    description: Run C(ssh-keyscan) against every peer (RV(served)).
    type: bool
    default: true
  keyscan_bin:
    description: The ssh-keyscan executable.
    type: str
    default: ssh-keyscan
  root:
    description: Prefix for reading the known_hosts file ssh names as offending; tests point it at a sandbox tree.
    type: path
    default: /
attributes:
  check_mode:
    support: full
    description: Only connects and reads; runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing is changed, so there is nothing to diff.
"""

EXAMPLES = r"""
- name: Check ssh from this node to every other node with host-key checking on.
  ssh_mesh:
    source: "{{ inventory_hostname }}"
    peers:
      - {node: gpu02, targets: [198.18.0.12, gpu02]}
      - {node: gpu03, targets: [198.18.0.13, gpu03]}
    pdsh_hosts: [gpu02, gpu03]
  register: ssh_trust_mesh
"""

RETURN = r"""
results:
  description: One row per (source, destination, target).
  returned: always
  type: list
  elements: dict
  sample:
    - {source: gpu01, destination: gpu02, target: 198.18.0.12, status: host_key_changed, rc: 255,
       key_type: ED25519, new_fingerprint: "SHA256:fUa/...", old_fingerprint: "SHA256:8mbU...",
       offending: "/etc/ssh/ssh_known_hosts:3", stderr: "..."}
client_config:
  description: Per target, what C(ssh -G) says (stricthostkeychecking, known-hosts files, identity files).
  returned: always
  type: dict
pdsh:
  description:
    - The pdsh run; C(state) is C(ran) (then hosts, argv, rc, ok hosts, failed hosts with their stderr), C(off),
      C(no_hosts) or C(not_installed).
  returned: always
  type: dict
served:
  description: Per peer, C({target, keys, error}) - the host keys its sshd presented to C(ssh-keyscan).
  returned: always
  type: dict
checks:
  description:
    - C(ssh_host_key_<peer>) and C(ssh_login_<peer>) per peer, C(ssh_served_<peer>) per peer given O(peers[].keys),
      C(ssh_client_config) and C(ssh_pdsh).
  returned: always
  type: dict
"""

import socket

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_node.checks import worst
from ansible.module_utils.preflight_node.ops import NodeOps
from ansible.module_utils.preflight_node.ssh_checks import (client_config_check, pdsh_check, peer_host_key_check,
                                                       peer_login_check, served_keys_check)
from ansible.module_utils.preflight_node.ssh_mesh import forbidden_ssh_options, run_mesh


def main():
    module = AnsibleModule(
        argument_spec=dict(
            peers=dict(type="list", elements="dict", required=True, options=dict(
                node=dict(type="str", required=True),
                targets=dict(type="list", elements="str", required=True),
                port=dict(type="int", default=22),
                keys=dict(type="list", elements="str", default=[], no_log=False),
            )),
            source=dict(type="str"),
            user=dict(type="str", default=""),
            connect_timeout=dict(type="int", default=5),
            timeout=dict(type="int", default=20),
            parallel=dict(type="int", default=32),
            ssh_options=dict(type="list", elements="str", default=[]),
            login_policy=dict(type="str", choices=["warn", "fail"], default="fail"),
            unknown_policy=dict(type="str", choices=["warn", "fail"], default="fail"),
            pdsh=dict(type="str", choices=["auto", "never"], default="auto"),
            pdsh_hosts=dict(type="list", elements="str", default=[]),
            ssh_bin=dict(type="str", default="ssh"),
            pdsh_bin=dict(type="str", default="pdsh"),
            keyscan=dict(type="bool", default=True),
            keyscan_bin=dict(type="str", default="ssh-keyscan"),
            root=dict(type="path", default="/"),
            known_hosts_file=dict(type="str", default="/etc/ssh/ssh_known_hosts"),
            identity_file=dict(type="str", default=""),
            relaxed=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    params = module.params
    source = params["source"] or socket.gethostname()
    if params["connect_timeout"] < 1 or params["timeout"] <= params["connect_timeout"] or params["parallel"] < 1:
        module.fail_json(msg="Found: connect_timeout %s, timeout %s, parallel %s on %s. Expected: connect_timeout >= 1, "
                             "timeout > connect_timeout and parallel >= 1. Fix: set them so (defaults 5, 20, 32)."
                         % (params["connect_timeout"], params["timeout"], params["parallel"], source))
    for option in forbidden_ssh_options(params["ssh_options"]):
        module.fail_json(msg="Found: ssh_options sets %r on %s. Expected: no option that relaxes or bypasses "
                             "host-key checking (the check measures the node's own). Fix: remove it from ssh_options."
                         % (option, source))
    report = run_mesh(NodeOps(module), source, params["peers"], user=params["user"],
                      connect_timeout=params["connect_timeout"], timeout=params["timeout"],
                      parallel=params["parallel"], ssh_options=params["ssh_options"], connect=True,
                      pdsh=params["pdsh"], pdsh_hosts=params["pdsh_hosts"], ssh_bin=params["ssh_bin"],
                      pdsh_bin=params["pdsh_bin"], root=params["root"], keyscan=params["keyscan"],
                      keyscan_bin=params["keyscan_bin"])
    if report["problem"]:
        module.fail_json(msg="Found: %s. Expected: an ssh client on %s. Fix: install openssh-client on %s."
                             % (report["problem"], source, source))

    results = report["results"]
    checks = {}
    for peer in params["peers"]:
        rows = [r for r in results if r["destination"] == peer["node"]]
        if not rows:
            continue
        checks["ssh_host_key_%s" % peer["node"]] = peer_host_key_check(source, peer["node"], rows,
                                                                       params["unknown_policy"])
        checks["ssh_login_%s" % peer["node"]] = peer_login_check(source, peer["node"], rows, params["login_policy"],
                                                                 peer["port"])
        if peer["keys"]:
            checks["ssh_served_%s" % peer["node"]] = served_keys_check(source, peer["node"], peer["keys"],
                                                                       report["served"].get(peer["node"]))
    checks["ssh_client_config"] = client_config_check(source, report["client_config"], params["known_hosts_file"],
                                                      params["identity_file"], params["relaxed"])
    checks["ssh_pdsh"] = pdsh_check(source, report["pdsh"], [h for h in params["pdsh_hosts"] if h],
                                    params["unknown_policy"], params["login_policy"],
                                    off_reason="pdsh check switched off (pdsh: never)")

    counts = {}
    for row in results:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    status = worst(c["status"] for c in checks.values())
    module.exit_json(changed=False, source=source, results=results, client_config=report["client_config"],
                     pdsh=report["pdsh"], served=report["served"],
                     checks=checks, counts=counts,
                     msg="%s: %d ssh target(s), %s; worst check %s" % (
                         source, len(results), ", ".join("%s %d" % kv for kv in sorted(counts.items())) or "none",
                         status))


if __name__ == "__main__":
    main()
