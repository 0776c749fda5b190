# -*- coding: utf-8 -*-
"""Capability ``ssh_trust``, controller half: the checks of the ssh mesh (each node's logins to its peers,
their host keys, pdsh, the client configuration, and the logins of its peers to it).

Controller layer (``cluster_preflight/capabilities/ssh_trust/mesh.py``, never shipped); called by
``decide`` in ``cluster_preflight/capabilities/ssh_trust/``.
"""

from __future__ import annotations

from preflight_node.checks import check, failed, passed, skipped, warned, worst
from preflight_node.ssh.checks import (LIST_LIMIT, LOGIN_FIX, NOT_LOGIN, _last_line, client_config_check, pdsh_check,
                                       peer_host_key_check, peer_login_check)

from .cluster_plan import _settings
from .settings import _port, _summary, as_bool, policy, setting

_MEMO = {}

# The causes shared by many findings of a cluster (every node, every peer), by what ssh answered: the summary
# groups the findings of one cause under it (``details.causes``: ``cluster_preflight/outputs/summary.py``).
CAUSES = {
    "dns": {"id": "names_unresolved", "title": "the inventory names do not resolve on the nodes",
            "fix": "add every node's inventory name to the nodes' /etc/hosts or DNS (a launcher on a node that uses "
                   "the names fails the same way); meanwhile the host lists name those nodes by address "
                   "(preflight_hostfile_names)"},
    "auth_denied": {"id": "login_opt_in", "title": "node-to-node ssh login is not set up (it is opt-in)",
                    "fix": "jobs that ssh between nodes (mpirun, pdsh, DeepSpeed's launcher) need it: set "
                           "ssh_trust_cluster_key: true and run the bring-up (docs/ssh-trust.md); jobs started by "
                           "torchrun or srun do not: set ssh_trust_mesh: false to stop checking it"},
    "host_key_unknown": {"id": "host_keys_unknown", "title": "the nodes do not know each other's host keys yet",
                         "fix": "run the bring-up: it writes every node's host keys into /etc/ssh/ssh_known_hosts "
                                "on every node (role ssh_trust), host-key checking stays on"},
}


def with_causes(result, statuses, settings):
    """``result`` with ``details.causes`` for the shared causes among ``statuses`` (what ssh answered); a denied
    login is the opt-in cause only while the cluster key is off (with it on, a denial is a real failure)."""
    if result["status"] not in ("warn", "fail"):
        return result
    cluster_key = as_bool(setting(settings, "cluster_key"))
    causes = [CAUSES[status] for status in dict.fromkeys(statuses)
              if status in CAUSES and not (status == "auth_denied" and cluster_key)]
    if causes:
        result = dict(result, details=dict(result.get("details") or {}, causes=causes))
    return result


def _collateral(result, reason):
    """A peer's failure that its own checks explain: a warn on this node, never a fail (its causes kept)."""
    if result["status"] not in ("warn", "fail"):
        return result
    return warned("%s (collateral: %s)" % (result["found"], reason), result["expected"],
                  "fix the peer first: %s" % reason, **(result.get("details") or {}))


def _aggregate(per_peer, expected, what):
    """One check over every peer: the worst status, the peers that are not fine named first."""
    bad = {p: c for p, c in per_peer.items() if c["status"] in ("warn", "fail")}
    if bad:
        fixes = list(dict.fromkeys(c["fix"] for c in bad.values()))
        return check(worst(c["status"] for c in bad.values()), _summary(c["found"] for c in bad.values()), expected,
                     _summary(fixes), peers={p: c["status"] for p, c in sorted(bad.items())})
    fine = [p for p, c in per_peer.items() if c["status"] == "pass"]
    if not fine:
        return skipped(_summary(c["found"] for c in per_peer.values()) or "no peer", expected)
    rest = [c["found"] for c in per_peer.values() if c["status"] != "pass"]
    return passed("%s for %d peer(s): %s%s" % (what, len(fine), ", ".join(sorted(fine)[:LIST_LIMIT])
                                                + (", ..." if len(fine) > LIST_LIMIT else ""),
                                                ("; " + _summary(rest)) if rest else ""), expected)


def _login_outcome(rows):
    statuses = [r["status"] for r in rows]
    if "ok" in statuses:
        return "ok"
    if any(s not in NOT_LOGIN for s in statuses):
        return "fail"
    return "host_key"


def _inbound(cluster, hosts):
    """Per node, the outcome of every peer's login to it: ``{node: {source: (outcome, rows)}}``."""
    inbound = {host: {} for host in hosts}
    for source in hosts:
        result = (cluster.get("probes") or {}).get(source)
        if not result or not result.get("connect"):
            continue
        rows = {}
        for row in result.get("results") or []:
            rows.setdefault(row["destination"], []).append(row)
        for node, node_rows in rows.items():
            if node in inbound:
                inbound[node][source] = (_login_outcome(node_rows), node_rows)
    return inbound


def _refuses(tried):
    """Whether a node's failures are its own: every peer that tried failed to log in to it, and
    either at least two peers tried or every answer was ``Connection refused`` (from the node)."""
    if not tried or any(outcome != "fail" for outcome, _rows in tried.values()):
        return False
    if len(tried) >= 2:
        return True
    return all(r["status"] == "refused" for _outcome, rows in tried.values() for r in rows
               if r["status"] not in NOT_LOGIN)


def _mesh_view(cluster, analysis):
    """Every node's inbound logins and the nodes whose own findings explain their peers' failures,
    computed once per cluster view (memoised like :func:`_analysis`)."""
    probes = cluster.get("probes") or {}
    key = (id(analysis), id(cluster.get("probes")), len(cluster["hosts"]), len(probes))
    hit = _MEMO.get("mesh")
    if hit and hit[0] == key:
        return hit[2]
    hosts = list(cluster["hosts"])
    inbound = _inbound(cluster, hosts)
    suspects = dict(analysis["suspects"])
    for node, tried in inbound.items():
        if node not in suspects and _refuses(tried):
            suspects[node] = "no peer could log in to %s (see ssh_trust.inbound on %s)" % (node, node)
    if probes:
        for node in hosts:
            if node not in suspects and probes.get(node) is None:
                suspects[node] = ("%s gave no ssh_trust probe result (see its ssh_trust.error or preflight.reachable)"
                                  % node)
    # What each node's sshd presented to the peers that scanned it: {node: {source: row}}.
    served = {}
    for source, report in probes.items():
        for node, row in ((report or {}).get("served") or {}).items():
            served.setdefault(node, {})[source] = row
    result = {"inbound": inbound, "suspects": suspects, "served": served}
    _MEMO["mesh"] = (key, (analysis, cluster.get("probes")), result)
    return result


def _mesh_checks(host, settings, probe_result, cluster, analysis):
    mesh_on = as_bool(setting(settings, "mesh"))
    known_hosts_file = setting(settings, "known_hosts_file")
    identity = "~/.ssh/%s" % setting(settings, "cluster_key_name") if as_bool(setting(settings, "cluster_key")) else ""
    relaxed = as_bool(setting(settings, "strict_host_key_checking_no"))
    off = "ssh_trust_mesh is false: ssh from %s to its peers was not tried" % host
    checks = {}
    if probe_result is None:
        reason = ("no ssh mesh result from %s in this run (bring-up does not probe; in preflight.yml see its "
                  "ssh_trust.error or preflight.reachable)" % host)
        checks["client_config"] = skipped(reason)
        for name in ("mesh", "login", "pdsh"):
            checks[name] = skipped(off if not mesh_on else reason)
        return checks
    if probe_result.get("problem"):
        checks["client_config"] = failed(probe_result["problem"], "an ssh client on %s" % host,
                                         "install openssh-client on %s" % host)
        checks["mesh"] = (skipped(off) if not mesh_on else
                          failed(probe_result["problem"], "%s verifies every peer's host key over ssh" % host,
                                 "install openssh-client on %s" % host))
        checks["login"] = skipped(off if not mesh_on else "no ssh client on %s (see ssh_trust.mesh)" % host)
        checks["pdsh"] = skipped(off if not mesh_on else "no ssh client on %s (see ssh_trust.mesh)" % host)
        return checks
    checks["client_config"] = client_config_check(host, probe_result.get("client_config") or {}, known_hosts_file,
                                                  identity, relaxed)
    if not mesh_on or not probe_result.get("connect"):
        checks["mesh"] = skipped(off, "ssh from %s to every peer with StrictHostKeyChecking=yes" % host)
        checks["login"] = skipped(off)
        checks["pdsh"] = skipped(off)
        return checks

    suspects = _mesh_view(cluster, analysis)["suspects"]
    rows = {}
    for row in probe_result.get("results") or []:
        rows.setdefault(row["destination"], []).append(row)
    # The peers this node was given to check (every other node, or its share of a large cluster).
    peers = [peer["node"] for peer in probe_result.get("peers") or [] if peer["node"] != host]
    if not peers:
        peers = [p for p in cluster["hosts"] if p != host]
    unknown_policy = policy(settings, "unknown_key_policy")
    login_policy = policy(settings, "login_policy")
    host_key, login = {}, {}
    for peer in peers:
        peer_rows = rows.get(peer, [])
        port = _port(_settings(cluster, peer))
        # A peer's keys read from a fallback say nothing about what its sshd presents.
        result = peer_host_key_check(host, peer, peer_rows, unknown_policy, None if peer in analysis["assumed"]
                                     else analysis["fingerprints"].get(peer))
        result_login = peer_login_check(host, peer, peer_rows, login_policy, port)
        if peer in suspects:
            result, result_login = _collateral(result, suspects[peer]), _collateral(result_login, suspects[peer])
        host_key[peer], login[peer] = result, result_login
    answered = [row["status"] for peer in peers for row in rows.get(peer, [])]
    checks["mesh"] = with_causes(_aggregate(host_key, "%s verifies the host key of every peer with "
                                                      "StrictHostKeyChecking=yes" % host,
                                            "%s verified the host key" % host),
                                 [status for status in answered if status == "host_key_unknown"], settings)
    checks["login"] = with_causes(_aggregate(login, "%s logs in to every peer without a prompt (BatchMode)" % host,
                                             "%s logged in" % host),
                                  [status for status in answered if status not in NOT_LOGIN], settings)
    report = probe_result.get("pdsh") or {}
    target_of = {row["target"]: peer for peer in peers for row in rows.get(peer, [])}
    collateral = {target: suspects[peer] for target, peer in target_of.items() if peer in suspects}
    checks["pdsh"] = with_causes(pdsh_check(host, report, report.get("hosts") or [], unknown_policy, login_policy,
                                            collateral),
                                 [item.get("status") for item in (report.get("failed") or {}).values()], settings)
    return checks


def _inbound_check(host, settings, cluster, analysis):
    expected = "every peer logs in to %s over ssh" % host
    if not as_bool(setting(settings, "mesh")):
        return skipped("ssh_trust_mesh is false: ssh to %s was not tried" % host, expected)
    tried = _mesh_view(cluster, analysis)["inbound"].get(host) or {}
    if not tried:
        return skipped("no peer's ssh_trust probe reached the point of trying %s" % host, expected)
    # The peers on which this node's inventory name did not resolve (the host lists then name its address).
    unresolved = sorted(source for source, (_outcome, rows) in tried.items()
                        if any(r["status"] == "dns" and r.get("target") == host for r in rows))
    result = with_causes(_inbound_result(host, settings, tried, expected),
                         [r["status"] for _outcome, rows in tried.values() for r in rows], settings)
    result["details"] = dict(result.get("details") or {}, name_unresolved_on=unresolved)
    return result


def _inbound_result(host, settings, tried, expected):
    if _refuses(tried):
        rows = [r for _outcome, source_rows in tried.values() for r in source_rows if r["status"] not in NOT_LOGIN]
        kinds = list(dict.fromkeys(r["status"] for r in rows))
        found = "no peer could log in to %s: %s" % (host, _summary(
            "%s -> %s %s (%s)" % (r["source"], r["target"], r["status"], _last_line(r)) for r in rows))
        fix = "; ".join(LOGIN_FIX.get(k, LOGIN_FIX["error"]) % {
            "source": "its peers", "node": host, "port": _port(settings),
            "targets": ", ".join(dict.fromkeys(r["target"] for r in rows))} for k in kinds)
        return check(policy(settings, "login_policy"), found, expected, fix)
    fine = sorted(s for s, (outcome, _rows) in tried.items() if outcome == "ok")
    others = sorted(s for s in tried if s not in fine)
    return passed("%d of %d peer(s) logged in to %s%s" % (
        len(fine), len(tried), host, "; the others' findings are on them (ssh_trust.mesh, ssh_trust.login): %s"
        % ", ".join(others) if others else ""), expected)
