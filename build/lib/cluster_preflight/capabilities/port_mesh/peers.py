# -*- coding: utf-8 -*-
"""Which peers each node checks in the pairwise checks (the port mesh, the ssh mesh).

Up to ``full_mesh_max`` nodes every node checks every other one: n·(n−1) pairs, each
node-level and pair-level fault shows.  Above it, every node checks ``degree`` peers: its
successor on a ring over the nodes in inventory order, and ``degree − 1`` chords drawn with
a seeded random generator (the same inventory gives the same pairs, so a re-run retests
the same links).  That is n·degree pairs, O(n) per round.

Why this still names the bad node:

* **Every node is checked both ways.**  Node i probes its successor i+1 and is probed by its
  predecessor i−1 (ring), so every node has at least one outbound and one inbound pair; with
  the chords each node has ``degree`` outbound and on average ``degree`` inbound pairs.
* **The graph stays connected.**  The ring alone connects every node, so a partition of the
  network (a switch, a VLAN) always cuts at least one checked pair.
* **A node-level fault is seen from several sides.**  A firewall DROP, a wrong address or a
  down interface on node x fails all of x's inbound pairs (at least one, about ``degree``),
  while the peers' other pairs pass: the mesh report blames x (``inbound``/``outbound``
  suspects) and not its peers, as it does in a full mesh.
* **What it gives up:** a fault between one specific pair of otherwise healthy nodes (an ACL
  between two racks) is found only if that pair was drawn.  Lower ``degree`` trades such
  pair faults for time; the all-reduce itself still connects every rank to its ring
  neighbours and to the master.
"""

from __future__ import annotations

import random

DEFAULT_FULL_MESH_MAX = 32
DEFAULT_DEGREE = 4


def peers_by_host(hosts, full_mesh_max=DEFAULT_FULL_MESH_MAX, degree=DEFAULT_DEGREE, seed="preflight"):
    """``{host: [peers it checks]}`` for ``hosts`` (inventory order); see the module docstring."""
    hosts = list(hosts)
    count = len(hosts)
    if count <= max(full_mesh_max, 1) or count - 1 <= degree:
        return {host: [peer for peer in hosts if peer != host] for host in hosts}
    rng = random.Random("%s:%d" % (seed, count))
    index = {host: position for position, host in enumerate(hosts)}
    peers = {}
    for host in hosts:
        own = index[host]
        chosen = [hosts[(own + 1) % count]]
        while len(chosen) < degree:
            candidate = hosts[rng.randrange(count)]
            if candidate != host and candidate not in chosen:
                chosen.append(candidate)
        peers[host] = sorted(chosen, key=index.get)
    return peers


def coverage(peers):
    """``{host: (outbound pairs, inbound pairs)}`` of a pairing (for tests and the bench)."""
    inbound = {host: 0 for host in peers}
    for chosen in peers.values():
        for peer in chosen:
            inbound[peer] = inbound.get(peer, 0) + 1
    return {host: (len(peers[host]), inbound.get(host, 0)) for host in peers}
