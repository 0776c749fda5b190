# -*- coding: utf-8 -*-
"""What a whole node-to-node port mesh says about each node (controller layer).

Every node's ``port_probe`` results (``library/port_probe.py``, logic in
``module_utils/preflight_node/net/port_probe.py``) -> the matrix, the suspects and the per-node
``port_mesh`` findings; ``cluster_preflight/capabilities/port_mesh/`` (``report``) uses them.
The single-connection check builders (``reach_check``, ``listen_check``) stay on the node, in
``module_utils/preflight_node/net/port_checks.py``: the probe returns their checks.
"""

from __future__ import annotations

from preflight_node.checks import failed, passed
from preflight_node.net.port_checks import reach_check


def _host_results(value):
    if isinstance(value, dict):
        return value.get("results") or []
    return value or []


def _mesh_rows(results_by_host):
    """(matrix ``{src: {dst: result}}``, rows with their source, the one port or None)."""
    matrix = {}
    rows = []
    ports = set()
    for host in sorted(results_by_host):
        for row in _host_results(results_by_host[host]):
            src = row.get("source") or host
            matrix.setdefault(src, {})[row["destination"]] = row["result"]
            rows.append(dict(row, source=src))
            if row.get("port") is not None:
                ports.add(row["port"])
    port = ports.pop() if len(ports) == 1 else None
    return matrix, rows, port


def _inbound_message(node, peers, port_text):
    """Why no peer reaches ``node`` (``peers``: peer -> result)."""
    kinds = set(peers.values())
    listing = ", ".join("%s: %s" % (peer, peers[peer]) for peer in sorted(peers))
    if kinds == {"timeout"}:
        what = "%s drops %s from every peer (%s): firewall DROP on %s or a security group" % (
            node, port_text, listing, node)
    elif kinds == {"refused"}:
        what = "%s refuses %s from every peer (%s): nothing listens there or a REJECT rule on %s" % (
            node, port_text, listing, node)
    elif kinds == {"unreachable"}:
        what = ("%s is unreachable on %s from every peer (%s): its address gets no ARP answer, so its link is "
                "down or isolated, it is on another segment or VLAN, or the wrong interface was chosen (not a "
                "firewall: firewalls do not block ARP)" % (node, port_text, listing))
    elif kinds == {"wrong_host"}:
        what = "%s's address answers as another node for every peer (%s): wrong address in the inventory" % (
            node, listing)
    else:
        what = "no peer reaches %s on %s (%s)" % (node, port_text, listing)
    if len(peers) == 1:
        what += "; with a single peer this cannot be told apart from %s blocking outbound" % next(iter(peers))
    return what


def _suspects(matrix, incoming, port_text):
    """Inbound suspects (no peer reaches them), then outbound ones (they reach no one while others do)."""
    inbound_bad = set()
    suspects = []
    for node in sorted(incoming):
        peers = incoming[node]
        if not peers or any(outcome == "open" for outcome in peers.values()):
            continue
        inbound_bad.add(node)
        suspects.append({"node": node, "direction": "inbound", "peers": dict(peers),
                         "message": _inbound_message(node, peers, port_text)})

    for node in sorted(matrix):
        peers = matrix[node]
        if not peers or any(outcome == "open" for outcome in peers.values()):
            continue
        # When every destination is itself unreachable for everyone, the
        # destinations explain the failures and this node is not to blame.
        if all(dst in inbound_bad for dst in peers):
            continue
        listing = ", ".join("%s: %s" % (peer, peers[peer]) for peer in sorted(peers))
        cause = ("no peer answers its ARP: its link is down or isolated, or it uses the wrong interface"
                 if set(peers.values()) == {"unreachable"} else "outbound firewall or routing on %s" % node)
        suspects.append({"node": node, "direction": "outbound", "peers": dict(peers),
                         "message": "%s cannot reach any peer on %s (%s) although other nodes reach them: %s" % (
                             node, port_text, listing, cause)})
    return suspects


def mesh_summary(results_by_host):
    """Summarise a whole mesh from every node's probe results.

    ``results_by_host`` maps a node name to that node's probe return (a dict
    with ``results``) or directly to its list of outgoing results.

    Returns ``{port, matrix, failing, suspects, suspect_nodes, silent,
    messages}``:

    * ``matrix``: ``{src: {dst: result}}``.
    * ``failing``: ``[{source, destination, addr, result, detail}]``.
    * ``suspects``: ``[{node, direction, peers, message}]`` where
      ``direction`` is ``inbound`` (no peer reaches the node: its firewall
      or address is the likely cause) or ``outbound`` (the node reaches no
      peer although others reach them).  ``peers`` maps peer -> result.
    * ``suspect_nodes``: sorted node names from ``suspects``.
    * ``silent``: nodes probed by others that returned no results of their
      own (not in ``results_by_host``).
    """
    matrix, rows, port = _mesh_rows(results_by_host)
    port_text = "port %d" % port if port is not None else "the probed port"

    failing = [{"source": row["source"], "destination": row["destination"], "addr": row.get("addr"),
                "result": row["result"], "detail": row.get("detail", "")}
               for row in rows if row["result"] != "open"]
    failing.sort(key=lambda item: (item["source"], item["destination"]))

    incoming = {}
    for src, row in matrix.items():
        for dst, outcome in row.items():
            incoming.setdefault(dst, {})[src] = outcome

    suspects = _suspects(matrix, incoming, port_text)
    silent = sorted(set(incoming) - set(results_by_host) - set(matrix))
    messages = [item["message"] for item in suspects]
    messages.extend("%s returned no probe results (was it in the play?)" % node for node in silent)
    return {
        "port": port,
        "matrix": matrix,
        "failing": failing,
        "suspects": suspects,
        "suspect_nodes": sorted({item["node"] for item in suspects}),
        "silent": silent,
        "messages": messages,
    }


def mesh_checks(probes_by_host, hosts):
    """Per-node findings for the verdict from every node's probe return.

    The blame goes where the fault most likely is: a node no peer reaches (or
    that reaches no one while others can) fails; its peers' failed
    connections to it are explained by it and do not fail them.  A failed
    pair that no suspect explains fails its destination (an inbound firewall
    is the usual cause) with the source named.  Returns
    ``(checks_by_host, summary, ok)``.
    """
    summary = mesh_summary({host: probes_by_host[host] for host in hosts if probes_by_host.get(host)})
    port = summary["port"]
    suspects = {}
    for item in summary["suspects"]:
        suspects.setdefault(item["node"], []).append(item)
    rows_into = {}
    for host in hosts:
        for row in _host_results(probes_by_host.get(host) or {}):
            rows_into.setdefault(row["destination"], []).append(row)
    checks = {host: {} for host in hosts}
    ok = not summary["failing"]
    for host in hosts:
        probe = probes_by_host.get(host) or {}
        if probe.get("checks", {}).get("port_listen"):
            checks[host]["port_listen"] = probe["checks"]["port_listen"]
            if probe["checks"]["port_listen"]["status"] == "fail":
                ok = False
        expected = "every peer connects to %s on port %s and %s connects to every peer" % (host, port, host)
        if host in suspects:
            failing_in = [row for row in rows_into.get(host, []) if row["result"] != "open"]
            fix = reach_check(failing_in[0])["fix"] if failing_in else (
                "check outbound firewall rules and routes on %s (iptables -S OUTPUT; ip route)" % host)
            checks[host]["port_mesh"] = failed("; ".join(item["message"] for item in suspects[host]), expected,
                                               fix, peers={item["direction"]: item["peers"]
                                                           for item in suspects[host]})
            continue
        unexplained = [row for row in rows_into.get(host, [])
                       if row["result"] != "open" and row["source"] not in suspects]
        if unexplained:
            found = "; ".join("%s cannot reach %s: %s" % (row["source"], host, row["detail"]) for row in unexplained)
            checks[host]["port_mesh"] = failed(found, expected, reach_check(unexplained[0])["fix"])
            continue
        outgoing = _host_results(probe)
        blamed = sorted({row["destination"] for row in outgoing if row["result"] != "open"})
        found = "%s reaches %d peer(s) on port %s and is reached by %d" % (
            host, len([row for row in outgoing if row["result"] == "open"]), port,
            len([row for row in rows_into.get(host, []) if row["result"] == "open"]))
        if blamed:
            found += "; failures to %s are blamed on %s" % (", ".join(blamed), ", ".join(blamed))
        checks[host]["port_mesh"] = passed(found, expected)
    return checks, summary, ok
