# -*- coding: utf-8 -*-
"""Capability ``port_mesh``, the controller half: the rendezvous port between every pair of nodes.

Each node's probe is the ``port_probe`` module (``library/port_probe.py``, its logic in
``module_utils/preflight_node/net/port_probe.py``); the node half
``module_utils/preflight_node/capabilities/port_mesh.py``
only names the capability.

* ``plan`` (controller): which nodes take part (those with an address on the
  chosen interface) and each node's ``port_probe`` arguments.  With fewer
  forks than nodes the probes run in the background (``async``) so that
  every node listens while the others connect, and the window grows with the
  number of fork batches.
* ``report`` (controller): every node's probe results -> who to blame
  (``mesh_checks`` in ``cluster_preflight/capabilities/port_mesh/mesh.py``): a node no peer reaches, or that reaches
  no one, fails; its peers' failed attempts towards it are explained by it.
"""

from __future__ import annotations

import math
import secrets

from preflight_node.checks import blocked, not_applicable
from preflight_node.capabilities.port_mesh import CAPABILITY  # noqa: F401  (the registry reads it here)

from cluster_preflight.capabilities.port_mesh.mesh import mesh_checks

from ..common import Problems, Settings, port_problems

# Seconds between two fork batches starting their background probes.
BATCH_SPREAD = 2.0
MAX_WINDOW = 600.0


def validate(settings: Settings) -> Problems:
    problems = port_problems("port_mesh_port", settings.get("port_mesh_port"),
                             "set preflight_master_port (or port_mesh_port) to the rendezvous port, e.g. 6000")
    window, connect = settings["port_mesh_window"], settings["port_mesh_connect_timeout"]
    if not 0 < connect < window <= MAX_WINDOW:
        problems.append({"name": "port_mesh_window",
                         "found": "port_mesh_window=%s, port_mesh_connect_timeout=%s" % (window, connect),
                         "expected": "0 < port_mesh_connect_timeout < port_mesh_window <= %d" % MAX_WINDOW,
                         "fix": "the window bounds the whole mesh: e.g. port_mesh_window: 8, "
                                "port_mesh_connect_timeout: 2"})
    return problems


def plan(hosts, nic_plan, settings_by_host, forks, pairing=None):
    """Who probes, with what arguments.

    ``hosts``: the nodes still in the run, in inventory order; ``pairing``: host -> the peers
    it checks (``cluster_preflight/capabilities/port_mesh/peers.py``; every other node when None).  Returns a
    decision with ``run`` (false for fewer than two nodes or no interface), ``hosts``,
    ``async_seconds`` (0 = in the foreground) and ``args_by_host``.
    """
    addr_by_host = nic_plan.get("addr_by_host") or {}
    members = [host for host in hosts if host in addr_by_host]
    checks_by_host = {}
    result = {"run": False, "hosts": members, "async_seconds": 0, "args_by_host": {}, "wait_timeout": 0}
    if len(hosts) < 2:
        for host in hosts:
            checks_by_host[host] = {"reach": not_applicable(
                "%s is the only node: no peer to reach" % host, "every pair of nodes connects on the port")}
        return dict(result, ok=True, blockers=[], checks_by_host=checks_by_host)
    if not nic_plan.get("ok") or len(members) < 2:
        reason = "no inter-node interface was chosen (see the nic_discovery checks)"
        for host in hosts:
            checks_by_host[host] = {"reach": blocked("not checked: %s" % reason,
                                                     "every pair of nodes connects on the port")}
        return dict(result, ok=False, blockers=[reason], checks_by_host=checks_by_host)
    inbound = {host: [] for host in members}
    for host in members:
        for peer in members if pairing is None else pairing.get(host, ()):
            if peer != host and peer in inbound:
                inbound[peer].append(host)
    batches = int(math.ceil(len(members) / float(max(1, forks))))
    # The run's secret: each listener answers only probers that prove it (port_probe.proof), never anyone else.
    token = secrets.token_hex(16)
    background = batches > 1
    for host in members:
        settings = settings_by_host[host]
        window = min(MAX_WINDOW, settings["port_mesh_window"] + (BATCH_SPREAD * batches if background else 0))
        result["args_by_host"][host] = {
            "listen_addr": addr_by_host[host],
            "port": settings["port_mesh_port"],
            "node_name": host,
            "peers": [{"name": peer, "addr": addr_by_host[peer]}
                      for peer in (members if pairing is None else pairing.get(host, ()))
                      if peer != host and peer in addr_by_host and peer in inbound],
            "window": window,
            "connect_timeout": settings["port_mesh_connect_timeout"],
            "inbound": inbound[host],
            "token": token,
        }
        result["wait_timeout"] = max(result["wait_timeout"], int(window) + 30)
    result.update(run=True, async_seconds=result["wait_timeout"] if background else 0)
    return dict(result, ok=True, blockers=[], checks_by_host=checks_by_host)


def report(mesh_plan, probes_by_host, lost=None):
    """Blame from every node's probe results.

    ``probes_by_host``: host -> ``port_probe`` result; ``lost``:
    ``{host: reason}`` of nodes whose probe never came back.  Returns a
    decision with ``suspect_nodes`` (to keep out of the all-reduce),
    ``matrix`` and ``messages``; ``ok`` is false when a failure has no
    single culprit (the gate then does not launch).
    """
    lost = dict(lost or {})
    if not mesh_plan.get("run"):
        return {"ok": True, "blockers": [], "checks_by_host": {}, "suspect_nodes": [], "matrix": {},
                "messages": [], "held": {}}
    members = [host for host in mesh_plan["hosts"] if host not in lost]
    held = held_nodes(probes_by_host, members)
    # A lost node's peers could not reach it: that is the lost node's story, told by the verdict; a node whose port
    # another account holds was not reachable on it: that account's doing, no peer's and not the node's.
    probes = {host: dict(probes_by_host[host], results=[
        row for row in probes_by_host[host].get("results") or [] if row.get("destination") not in lost
        and row.get("destination") not in held]) for host in members if isinstance(probes_by_host.get(host), dict)}
    checks, summary, _ok = mesh_checks(probes, members)
    renamed = {}
    for host, host_checks in checks.items():
        renamed[host] = {{"port_listen": "listen", "port_mesh": "reach"}.get(name, name): value
                         for name, value in host_checks.items()}
    for host in held:
        renamed.setdefault(host, {})["reach"] = blocked(
            "the peers of %s could not check it on port %s: another account holds that port there (see "
            "port_mesh.listen)" % (host, summary["port"]), "every peer connects to %s on the port" % host,
            renamed[host]["listen"]["fix"])
    suspects = [host for host in summary["suspect_nodes"] if host in members]
    for host in members:
        listen = renamed.get(host, {}).get("listen")
        if listen and listen["status"] == "fail" and host not in suspects:
            suspects.append(host)
    failing = [row for row in summary["failing"]
               if row["source"] not in suspects and row["destination"] not in suspects]
    blockers = []
    if failing:
        blockers.append("port mesh failures without a single culprit: %s" % "; ".join(
            "%s -> %s %s" % (row["source"], row["destination"], row["result"]) for row in failing[:6]))
    return {"ok": not blockers, "blockers": blockers, "checks_by_host": renamed, "suspect_nodes": sorted(suspects),
            "matrix": summary["matrix"], "messages": summary["messages"],
            "held": {host: "its rendezvous port is held by another account (see port_mesh.listen)" for host in held}}


def held_nodes(probes_by_host, members):
    """The nodes whose probe found the port held by another account (``listen.holder.foreign``)."""
    held = []
    for host in members:
        listen = (probes_by_host.get(host) or {}).get("listen") if isinstance(probes_by_host.get(host), dict) else None
        if isinstance(listen, dict) and listen.get("status") == "in_use" and (listen.get("holder") or {}).get(
                "foreign"):
            held.append(host)
    return held
