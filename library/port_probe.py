#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright: Contributors to the cluster preflight project
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module port_probe: a real TCP mesh test of the rendezvous port (logic in
module_utils/preflight_node/net/port_probe.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: port_probe
short_description: Test that a TCP port is open between every pair of nodes
description:
  - Run on all nodes of a play in the same task (Ansible runs a task on all hosts at the same
    time). Every node listens on O(port) on its inter-node address and connects to the same port
    on every peer, all pairs in parallel, within one bounded time O(window).
  - The connecting node sends C(PREFLIGHT <from> <to> <nonce> <proof>) and the listener answers
    C(OK <node_name> <proof>), each proof an HMAC of the words with the run's O(token), so a connection that lands on
    the wrong node, or on another program's listener, is told apart from an open port, and another program's
    connection is neither answered nor counted.
  - Each outgoing connection is classified as C(open), C(refused) (RST, nothing listening or a
    REJECT rule), C(timeout) (packets dropped, a firewall DROP), C(no_route)
    (EHOSTUNREACH/ENETUNREACH), C(unreachable), C(wrong_host) or C(error).
  - A timeout or missing route is C(unreachable) when the next hop towards the peer (the peer, or the
    gateway, from C(/proc/net/route)) does not answer a broadcast ARP request sent once within the window
    (as arping does; without the privilege for that, when the kernel's C(/proc/net/arp) entry for it is
    incomplete). Then the peer's link is down or isolated, it is on another segment, or the wrong interface was
    chosen. Firewalls do not filter ARP, so a DROP rule stays a C(timeout).
  - When the port cannot be bound because it is in use, the holder is found from
    C(/proc/net/tcp), C(/proc/net/tcp6) and C(/proc/<pid>/fd) and reported by pid and name.
  - Findings are returned as check results in RV(checks); the task never fails for a finding, only
    for bad arguments or a run lock another run took over (O(lock)).
  - The module always returns within O(window) + 2 seconds and closes its listening socket
    before it returns.
version_added: "1.0.0"
extends_documentation_fragment: [preflight, preflight.no_change]
options:
  listen_addr:
    description:
      - This node's inter-node IPv4 address to listen on; V(0.0.0.0) listens on all addresses.
    type: str
    required: true
  port:
    description:
      - TCP port to test (the rendezvous / master port), 1-65535.
    type: int
    default: 6000
  node_name:
    description:
      - This node's inventory name; sent to peers and checked by them.
    type: str
    required: true
  peers:
    description:
      - Every other node of the mesh. An entry whose O(peers[].name) equals O(node_name) is ignored,
        so the full node list may be passed.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: The peer's inventory name.
        type: str
        required: true
      addr:
        description: The peer's inter-node IPv4 address.
        type: str
        required: true
  window:
    description:
      - Seconds the whole mesh may take on this node (listening, connecting, retrying).
      - Must cover the spread between the moments the nodes start the task.
    type: float
    default: 8.0
  connect_timeout:
    description:
      - Seconds one connection attempt may take before it counts as C(timeout).
    type: float
    default: 2.0
  retry:
    description:
      - A peer not connected within O(window) is tried once more after a short pause, and the listener stays up
        that long too (the pause plus O(connect_timeout)), before the pair is blamed. The row of a peer tried
        again has C(retried) (the first outcome) and says so in C(detail).
    type: bool
    default: false
  token:
    description:
      - The run's secret (the controller's plan makes one per run, 32 hex digits); required. The listener answers
        only probers that prove it, and a peer's answer counts only with its proof. It never crosses the network.
    type: str
    default: ""
  lock:
    description:
      - The gate's run lock arguments with C(lease_seconds) (C(cluster_preflight/stages/run_lock.py)), renewed before anything
        else (C(module_utils/preflight_node/host/lock.py)); the task fails, probing nothing, when another run took the node
        over. Empty (the default) touches no lock.
    type: dict
    default: {}
  listen:
    description:
      - Listen on O(port). Set to V(false) on a node that should only connect.
    type: bool
    default: true
  check_in_use_only:
    description:
      - Only test that O(port) can be bound and listened on, then return; no peer is contacted.
    type: bool
    default: false
  inbound:
    description:
      - Names of the nodes that connect to this one; the listener is done once each has connected. The same
        as the names in O(peers) when not given (a full mesh); a large cluster's pairing gives every node a few
        peers, and its inbound ones differ.
    type: list
    elements: str
  proc_root:
    description:
      - Root of the proc filesystem read to find the process holding the port and the route and ARP
        entry towards an unreachable peer (for tests).
    type: path
    default: /proc
attributes:
  check_mode:
    support: full
    description: The probe only opens sockets for its own duration and changes nothing, so it runs
      in check mode exactly as in a normal run.
  platform:
    support: full
    platforms: posix
    description: Linux (reads C(/proc)).
notes:
  - All nodes must run the task at the same time (one task over all hosts, enough C(forks)).
  - The controller combines every node's RV(results) with C(mesh_summary) from
    C(cluster_preflight/capabilities/port_mesh/mesh.py) to name a node that no peer can reach.
"""

EXAMPLES = r"""
- name: Collect every node's name and inter-node address.
  ansible.builtin.set_fact:
    preflight_mesh_nodes: >-
      {{ preflight_mesh_nodes | default([])
         + [{'name': item, 'addr': hostvars[item].preflight_node_addr}] }}
  loop: "{{ ansible_play_hosts }}"

- name: Check that the rendezvous port is open between every pair of nodes.
  port_probe:
    listen_addr: "{{ preflight_node_addr }}"
    port: "{{ preflight_master_port }}"
    node_name: "{{ inventory_hostname }}"
    peers: "{{ preflight_mesh_nodes }}"
    window: 8
  register: preflight_port_mesh
  changed_when: false
  check_mode: false

- name: Check that the rendezvous port is free on the master node.
  port_probe:
    listen_addr: 0.0.0.0
    port: 6000
    node_name: "{{ inventory_hostname }}"
    check_in_use_only: true
  register: preflight_port_free
  changed_when: false
  check_mode: false
"""

RETURN = r"""
results:
  description: One entry per peer for the connection from this node to that peer.
  returned: always
  type: list
  elements: dict
  contains:
    source:
      description: This node's name.
      type: str
    destination:
      description: The peer's name.
      type: str
    addr:
      description: The peer's address.
      type: str
    port:
      description: The port.
      type: int
    result:
      description: Outcome of the last attempt.
      type: str
      choices: [open, refused, timeout, no_route, unreachable, wrong_host, error]
    errno:
      description: Errno name of the failure (for example V(ECONNREFUSED)), or null.
      type: str
    next_hop:
      description: With C(unreachable), the address that never answered ARP (the peer or the gateway towards it).
      type: str
      returned: when result is unreachable
    answered_by:
      description: Node name the listener answered with, or null.
      type: str
    connected:
      description: Whether the TCP connection itself was established (true for V(open), V(wrong_host) and
        for a listener that never answered the greeting, another program on the port).
      type: bool
    attempts:
      description: Connection attempts made within the window.
      type: int
    detail:
      description: One sentence for a human.
      type: str
    elapsed:
      description: Seconds from the first attempt to the outcome.
      type: float
  sample:
    - {source: node1, destination: node2, addr: 198.18.1.2, port: 6000, result: timeout, errno: null,
       answered_by: null, connected: false, attempts: 4,
       detail: "198.18.1.2:6000 timed out after 2.0 s (packets dropped: firewall?)", elapsed: 8.0}
incoming:
  description: Sorted names of the nodes that connected to this node and got an answer.
  returned: always
  type: list
  elements: str
misdirected:
  description: Connections that reached this node but were meant for another node (C(from), C(to)).
  returned: always
  type: list
  elements: dict
listen:
  description: Outcome of listening on the port on this node.
  returned: always
  type: dict
  contains:
    status:
      description: Outcome.
      type: str
      choices: [ok, in_use, addr_not_available, error, disabled]
    detail: {description: One sentence for a human., type: str}
    holder:
      description: Process holding the port when RV(listen.status=in_use) (C(pid), C(pids), C(comm),
        C(inode), C(addr), C(state)); null otherwise. C(pid) is null when the owner is not visible.
      type: dict
checks:
  description: Check results (status, found, expected, fix) by name, C(port_listen) and one
    C(port_reach_<peer>) per peer.
  returned: always
  type: dict
elapsed:
  description: Seconds the probe took on this node.
  returned: always
  type: float
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.preflight_node.net.port_probe import ARGUMENT_SPEC, module_main


def main():
    module_main(AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True))


if __name__ == "__main__":
    main()
