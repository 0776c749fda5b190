"""Which peers each node checks in the port and ssh meshes (cluster_preflight/capabilities/port_mesh/peers.py)."""

import pytest

from cluster_preflight.capabilities.port_mesh import peers as pairs
from cluster_preflight.capabilities import port_mesh as pm
from cluster_preflight.capabilities import ssh_trust as st
from capability_helpers import role_settings


def hosts(count):
    return ["n%04d" % index for index in range(count)]


def connected(peers):
    """Whether the undirected graph of the checked pairs reaches every node."""
    edges = {host: set() for host in peers}
    for host, chosen in peers.items():
        for peer in chosen:
            edges[host].add(peer)
            edges[peer].add(host)
    start = next(iter(peers))
    seen, todo = {start}, [start]
    while todo:
        for peer in edges[todo.pop()]:
            if peer not in seen:
                seen.add(peer)
                todo.append(peer)
    return len(seen) == len(peers)


def test_small_clusters_check_every_pair():
    peers = pairs.peers_by_host(hosts(5), full_mesh_max=32)
    assert all(set(chosen) == set(hosts(5)) - {host} for host, chosen in peers.items())


@pytest.mark.parametrize("count", [33, 100, 1000, 4000])
def test_large_clusters_check_degree_peers_each_covering_every_node_both_ways(count):
    names = hosts(count)
    peers = pairs.peers_by_host(names, full_mesh_max=32, degree=4)
    assert sum(len(chosen) for chosen in peers.values()) == 4 * count  # O(n) pairs
    for position, host in enumerate(names):
        assert len(set(peers[host])) == 4 and host not in peers[host]
        assert names[(position + 1) % count] in peers[host]  # the ring successor
    assert all(out == 4 and inbound >= 1 for out, inbound in pairs.coverage(peers).values())
    assert connected(peers)


def test_the_same_inventory_gives_the_same_pairs():
    assert pairs.peers_by_host(hosts(200)) == pairs.peers_by_host(hosts(200))
    assert pairs.peers_by_host(hosts(200)) != pairs.peers_by_host(hosts(200), seed="other")


def test_port_mesh_probes_only_the_chosen_peers_and_listens_for_those_that_chose_it():
    names = hosts(40)
    peers = pairs.peers_by_host(names, full_mesh_max=32, degree=3)
    nic = {"ok": True, "addr_by_host": {host: "198.19.0.%d" % (index + 1) for index, host in enumerate(names)}}
    settings = {"port_mesh_port": 6000, "port_mesh_window": 8.0, "port_mesh_connect_timeout": 2.0}
    plan = pm.plan(names, nic, {host: settings for host in names}, forks=64, pairing=peers)
    for host in names:
        args = plan["args_by_host"][host]
        assert [peer["name"] for peer in args["peers"]] == peers[host]
        assert sorted(args["inbound"]) == sorted(other for other in names if host in peers[other])


def test_ssh_mesh_peers_follow_the_pairing():
    names = hosts(40)
    peers = pairs.peers_by_host(names, full_mesh_max=32, degree=3)
    nodes = {host: {"name": host, "ansible_host": "198.18.0.%d" % (i + 1), "node_addr": "198.19.0.%d" % (i + 1),
                    "user": "root", "ssh_port": 22} for i, host in enumerate(names)}
    settings = role_settings("ssh_trust", ssh_trust_login_policy="warn")
    args = st.probe_args(settings, nodes["n0007"], {"hosts": names, "nodes": nodes, "peers": peers})
    assert [peer["node"] for peer in args["peers"]] == peers["n0007"]
