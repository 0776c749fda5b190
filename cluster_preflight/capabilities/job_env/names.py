# -*- coding: utf-8 -*-
"""Capability ``job_env``: the names a job resolves on each node (controller, pure).

A job resolves two names: its node's own hostname (gloo without GLOO_SOCKET_IFNAME binds the first address it
resolves to and tells the peers to connect there: Debian's ``127.0.1.1 <hostname>`` alias makes every peer
connect to its own loopback) and the rendezvous (master) name (c10d's store; ``gai error`` when it does not
resolve).  Each node resolved both as the job user (``job_env.read``); here each answer is judged against what the
gate saw: the addresses each node's interfaces hold (``nic_discovery``) and the family of the gate's own addresses
(IPv4: the interface choice, ``cluster_preflight/capabilities/nic_discovery/nic_select.py``, takes IPv4 addresses
only), compared across the nodes (gloo cannot connect an IPv6 device to an IPv4 one).
"""

from __future__ import annotations

import ipaddress

from preflight_node.checks import blocked, failed, not_applicable, passed, warned

# The family of the addresses the gate's all-reduce runs over (nic_select.usable_ipv4).
GATE_FAMILY = "IPv4"
GAI_FIX = "prefer IPv4 for every lookup in /etc/gai.conf ('precedence ::ffff:0:0/96 100')"
JOB_USER_FIX = "see allreduce.job_user: name the job's account in preflight_job_user"
_MEMO = {}


def _ip(text):
    try:
        return ipaddress.ip_address(str(text).split("%", 1)[0])
    except ValueError:
        return None


def family(address):
    parsed = _ip(address)
    return None if parsed is None else "IPv%d" % parsed.version


def is_loopback(address):
    parsed = _ip(address)
    return bool(parsed and parsed.is_loopback)


def held(nic_facts):
    """The addresses the interfaces of a node hold (``nic_discovery`` facts), or None when they were not read."""
    nics = (nic_facts or {}).get("nics")
    if nics is None:
        return None
    found = set()
    for nic in nics.values():
        for cidr in list(nic.get("ipv4") or []) + list(nic.get("ipv6") or []):
            parsed = _ip(str(cidr).split("/", 1)[0])
            if parsed is not None:
                found.add(str(parsed))
    return found


def loopback_run(node):
    """Whether the gate reaches this node over loopback (the embedded default: one machine, every rank local)."""
    address = str((node or {}).get("node_addr") or "")
    return address == "localhost" or is_loopback(address)


def _node_facts(cluster, host, capability):
    return (((cluster or {}).get("node_facts") or {}).get(host) or {}).get(capability)


def master_host(name, cluster):
    """The node of the run named ``name``: by inventory name, else by the hostname it reported; None."""
    hosts = (cluster or {}).get("hosts") or []
    if name in hosts:
        return name
    facts = (cluster or {}).get("facts") or {}
    key = (id(facts), len(facts))
    hit = _MEMO.get("hostnames")
    if not (hit and hit[0] == key and hit[1] is facts):
        hit = (key, facts, {(item or {}).get("hostname"): host for host, item in facts.items() if item})
        _MEMO["hostnames"] = hit
    return hit[2].get(name)


def guessed(name, cluster, env):
    """Whether ``name`` is job_env_master_name's default (the run's first inventory name) rather than a name the
    operator stated (another name, or MASTER_ADDR in the job environment ``env``)."""
    hosts = (cluster or {}).get("hosts") or []
    return bool(hosts) and name == hosts[0] and not (env or {}).get("MASTER_ADDR")


def _unanswered(host, name, answer, expected):
    """The check for a name that got no address on ``host``, or None when it did."""
    if answer is None:
        return blocked("%s was not resolved on %s (no answer recorded)" % (name, host), expected,
                       "run the preflight again; if it repeats, see preflight_facts on %s" % host)
    if answer.get("addresses"):
        return None
    kind, error = answer.get("kind"), answer.get("error") or "no address"
    if kind == "not_run":
        return blocked("not checked: %s" % error, expected, JOB_USER_FIX)
    if kind == "tool":
        return blocked("not checked: %s" % error, expected,
                       "install getent (libc-bin) on %s, or resolve by hand: getent ahosts %s" % (host, name))
    if kind == "timeout":
        return failed("on %s: %s: a job's lookup hangs there too" % (host, error), expected,
                      "on %s: fix the resolver a job user's lookup goes through (/etc/nsswitch.conf, "
                      "/etc/resolv.conf), or list %s in /etc/hosts" % (host, name))
    return None


def _own_address(answer, mine, node):
    """The address to name in a fix: one the name already resolves to that the node holds, else the gate's."""
    for address in (answer or {}).get("addresses") or []:
        if not is_loopback(address) and mine is not None and str(_ip(address)) in mine:
            return address
    return node.get("node_addr") or "<its cluster address>"


def hostname_check(host, facts, cluster):
    """``hostname``: the node's own hostname resolves, as the job user, first to an address the node holds, not to
    loopback (unless the gate itself runs this node over loopback)."""
    name = facts.get("hostname") or "?"
    node = ((cluster or {}).get("nodes") or {}).get(host) or {}
    expected = "%s resolves on %s, as the job user, first to an address of its own that peers reach (not loopback)" \
        % (name, host)
    answer = (facts.get("names") or {}).get(name)
    mine = held(_node_facts(cluster, host, "nic_discovery"))
    fix = ("on %s: make %s resolve to its cluster address first, e.g. the line '%s %s' in /etc/hosts, and no "
           "'127.0.1.1 %s' line (remove that one), or the cluster DNS; or name the interface in the jobs' "
           "GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME" % (host, name, _own_address(answer, mine, node), name, name))
    early = _unanswered(host, name, answer, expected)
    if early:
        return early
    if not answer.get("addresses"):
        return failed("%s, the hostname of %s, does not resolve there as %s (%s): c10d and gloo fail with 'gai "
                      "error' / 'Unable to find address'" % (name, host, facts.get("job_user"), answer.get("error")),
                      expected, fix)
    found = "%s resolves on %s as %s to %s" % (name, host, facts.get("job_user"), ", ".join(answer["addresses"][:4]))
    # gloo binds the first address it can: a loopback one, or one an interface of the node holds.
    bound = next((address for address in answer["addresses"]
                  if is_loopback(address) or mine is None or str(_ip(address)) in mine), None)
    if bound is None:
        return failed("%s, none of which an interface of %s holds (it holds %s): gloo cannot bind its hostname and "
                      "falls back to loopback" % (found, host, ", ".join(sorted(mine)) or "nothing"), expected, fix)
    if is_loopback(bound):
        if loopback_run(node):
            return passed("%s; the gate runs %s over loopback (preflight_node_addr %s), so every rank is local" % (
                found, host, node.get("node_addr")), expected)
        return failed("%s: gloo binds %s, a loopback address, and every peer is told to connect to %s, its own "
                      "loopback (Connection refused)" % (found, bound, bound), expected, fix)
    return passed(found if mine is not None else "%s (whether %s holds it was not read: no interface facts)" % (
        found, host), expected)


def master_check(host, facts, cluster, env=None):
    """``master_name``: the rendezvous name resolves on this node, as the job user, to an address the master holds,
    not to loopback (on the master itself loopback reaches its own store).  ``env``: the job environment (its
    MASTER_ADDR states the name); a default name that does not resolve only warns."""
    name = facts.get("master_name") or ""
    expected = "the rendezvous name %s resolves on %s, as the job user, to an address the master holds" % (
        name or "(none)", host)
    if not name:
        return not_applicable("no rendezvous name to resolve on %s (job_env_master_name is empty)" % host, expected)
    answer = (facts.get("names") or {}).get(name)
    master = master_host(name, cluster)
    node = ((cluster or {}).get("nodes") or {}).get(host) or {}
    fix = ("on %s: correct the entry for %s in /etc/hosts or the cluster DNS (the address %s holds on the cluster "
           "network), or set job_env_master_name to the name jobs use" % (host, name, master or name))
    early = _unanswered(host, name, answer, expected)
    if early:
        return early
    if not answer.get("addresses"):
        found = "the rendezvous name %s does not resolve on %s as %s (%s): c10d's rendezvous fails there " \
                "('gai error')" % (name, host, facts.get("job_user"), answer.get("error"))
        if guessed(name, cluster, env):
            # The default, not a name the operator stated: jobs that use another name (Slurm's node names, an
            # address) are not hurt, so the node is not failed for it.
            return warned("%s, if a job uses it: it is the run's first inventory name, job_env_master_name's "
                          "default" % found, expected,
                          "%s; or state the name your jobs use as MASTER_ADDR (job_env_master_name, or MASTER_ADDR "
                          "in preflight_job_env) to have it checked" % fix)
        return failed(found, expected, fix)
    first = answer["addresses"][0]
    found = "%s resolves on %s as %s to %s" % (name, host, facts.get("job_user"), ", ".join(answer["addresses"][:4]))
    if is_loopback(first):
        if host == master or loopback_run(node):
            return passed("%s; loopback reaches the store on %s itself (its hostname is job_env.hostname's)" % (
                found, host), expected)
        return failed("%s: first %s, a loopback address: c10d connects to %s itself, not to the master %s" % (
            found, first, host, master or name), expected, fix)
    theirs = held(_node_facts(cluster, master, "nic_discovery")) if master else None
    if theirs is not None and str(_ip(first)) not in theirs:
        return failed("%s: first %s, which the master %s does not hold (it holds %s): a stale /etc/hosts or DNS "
                      "entry" % (found, first, master, ", ".join(sorted(theirs)) or "nothing"), expected, fix)
    if theirs is None:
        found += " (not compared with the master's addresses: %s)" % (
            "no node of this run is named %s" % name if not master else "no interface facts of %s" % master)
    return passed(found, expected)


def families_of(facts):
    """``{name: family}`` of the first address each name resolved to on a node."""
    return {name: family(answer["addresses"][0]) for name, answer in ((facts or {}).get("names") or {}).items()
            if (answer or {}).get("addresses")}


def cluster_families(cluster):
    """``{family: [hosts]}``: the family each node's names resolve to first (a node with both: ``mixed``)."""
    facts = (cluster or {}).get("facts") or {}
    key = (id(facts), len(facts))
    hit = _MEMO.get("families")
    if hit and hit[0] == key and hit[1] is facts:
        return hit[2]
    groups = {}
    for host in sorted(facts):
        seen = set(families_of(facts[host]).values())
        if seen:
            groups.setdefault(seen.pop() if len(seen) == 1 else "mixed", []).append(host)
    _MEMO["families"] = (key, facts, groups)
    return groups


def family_check(host, facts, cluster):
    """``address_family``: the names resolve on this node to the family the gate uses, as on every node."""
    expected = "the names a job resolves give %s addresses first on %s, as the gate's and every node's" % (
        GATE_FAMILY, host)
    families = families_of(facts)
    if not families:
        return not_applicable("no name resolved on %s (see job_env.hostname and job_env.master_name)" % host,
                              expected)
    groups = cluster_families(cluster) if cluster else {}
    across = "; ".join("%s: %s" % (name, ", ".join(hosts[:6]) + (" and %d more" % (len(hosts) - 6)
                                                                  if len(hosts) > 6 else ""))
                       for name, hosts in sorted(groups.items()))
    found = "on %s %s" % (host, ", ".join("%s resolves to %s first" % item for item in sorted(families.items())))
    other = sorted(name for name, kind in families.items() if kind != GATE_FAMILY)
    if not other:
        return passed("%s%s" % (found, " (across the nodes: %s)" % across if across else ""), expected)
    return failed("%s; the gate uses %s%s: gloo cannot connect an IPv6 device with an IPv4 one" % (
        found, GATE_FAMILY, " (across the nodes: %s)" % across if across else ""), expected,
        "on %s: give %s %s address first (in /etc/hosts the %s line before the other, or the DNS record), or %s" % (
            host, ", ".join(other), "an " + GATE_FAMILY, GATE_FAMILY, GAI_FIX))
