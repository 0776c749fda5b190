# -*- coding: utf-8 -*-
"""Capability ``ssh_trust``, controller half: the cluster plan over every node's facts.

Controller layer (``cluster_preflight/capabilities/ssh_trust/cluster_plan.py``, never shipped): the names each
node is known by (the inventory only), the known-hosts entries and each node's block compared with
them, the client drop-in, the mesh peers and the cluster key's public halves, computed once per
cluster view (:func:`_analysis`) for ``plan`` and ``decide`` in ``cluster_preflight/capabilities/ssh_trust/``.
"""

from __future__ import annotations

from preflight_node.privilege import BECOME_FIX
from preflight_node.ssh.known_hosts_plan import KNOWN_HOSTS, _NAME, normalize_entries, plan_block
from preflight_node.ssh.primitives import MARKER, SshTrustError, host_token, markers, parse_public_key

from .settings import LOCAL_NAME, _port, as_bool, as_list, setting


def _node(cluster, host):
    node = dict((cluster.get("nodes") or {}).get(host) or {})
    node.setdefault("name", host)
    node["ansible_host"] = str(node.get("ansible_host") or host)
    node["node_addr"] = str(node.get("node_addr") or node["ansible_host"])
    return node


def _settings(cluster, host):
    return (cluster.get("settings") or {}).get(host) or {}


def _facts(cluster, host):
    return (cluster.get("facts") or {}).get(host)


def _usable(name):
    name = str(name or "").strip()
    return name if name and _NAME.match(name) and not LOCAL_NAME.match(name) else ""


def _named(node, settings):
    """``[(name, source)]``: the names a node has in the inventory, each with where it comes from."""
    named = [(node["name"], "inventory name"), (node.get("node_addr"), "preflight_node_addr"),
             (node.get("ansible_host"), "ansible_host")]
    named += [(name, "ssh_trust_extra_names") for name in as_list(setting(settings, "extra_names"))]
    found = {}
    for name, source in named:
        name = _usable(name)
        if name and name not in found:
            found[name] = source
    return list(found.items())


def reported_names(facts):
    """The names a node reports for itself: ``[(what, name)]`` for its hostname and FQDN."""
    if not facts:
        return []
    found = []
    for what, name in (("hostname", facts.get("hostname")), ("FQDN", facts.get("fqdn"))):
        name = _usable(name)
        if name and name not in [n for _w, n in found]:
            found.append((what, name))
    return found


def _claims(cluster, hosts):
    """``(names, duplicates, owners)`` over the inventory alone.

    ``names``: per node the names it keeps.  A name (with the node's ssh port, as known_hosts
    holds it) that two nodes list belongs to neither, except that a node's own inventory name
    stays its own.  ``duplicates``: per node ``[{name, source, others: {node: source}}]``, on every
    node involved and no other.  ``owners``: lower-cased name -> ``{node: source}``."""
    owners, listed = {}, {}
    for host in hosts:
        port = _port(_settings(cluster, host))
        listed[host] = [(name, source, host_token(name, port).lower())
                        for name, source in _named(_node(cluster, host), _settings(cluster, host))]
        for name, source, token in listed[host]:
            owners.setdefault(token, {}).setdefault(host, source)
    names, duplicates, by_name = {}, {}, {}
    for host in hosts:
        keep = []
        for name, source, token in listed[host]:
            by_name.setdefault(name.lower(), {}).setdefault(host, source)
            others = {h: src for h, src in owners[token].items() if h != host}
            if not others:
                keep.append(name)
                continue
            if source == "inventory name" and "inventory name" not in others.values():
                keep.append(name)
            duplicates.setdefault(host, []).append({"name": name, "source": source, "others": others})
        names[host] = keep
    return names, duplicates, by_name


def render_dropin(names, cluster_key, key_name, relaxed):
    """The ssh client drop-in: settings for the cluster's own names only, never ``Host *``."""
    lines = ["# Managed by the cluster preflight (role ssh_trust); local edits are overwritten.",
             "# Applies only to the cluster's names and addresses below, never to other hosts."]
    for start in range(0, len(names), 16):
        lines.append("Host " + " ".join(names[start:start + 16]))
        if cluster_key:
            lines.append("    IdentityFile ~/.ssh/%s" % key_name)
        if relaxed:
            lines += ["    # SECURITY: host keys of these peers are NOT verified "
                      "(ssh_trust_strict_host_key_checking_no: true);",
                      "    # a spoofed or reinstalled node is not detected.", "    StrictHostKeyChecking no"]
    return "\n".join(lines) + "\n"


def mesh_targets(name, node):
    """What a peer is reached by in the mesh: its inter-node address and its inventory name."""
    node = node or {}
    targets = [t for t in dict.fromkeys([_usable(node.get("node_addr") or node.get("ansible_host")),
                                         _usable(name)]) if t]
    return targets or [name]


def mesh_peers(host, hosts, nodes, port_of):
    """The peers ``host`` sshes to: every other targeted node, by :func:`mesh_targets`
    (``port_of(peer)`` is the peer's sshd port)."""
    return [{"node": peer, "targets": mesh_targets(peer, nodes.get(peer)), "port": port_of(peer)}
            for peer in hosts if peer != host]


def _cluster_key_plan(cluster, hosts, all_hosts):
    """``(public, keys, holders)``: the plan's ``cluster_key`` (``{enabled, users, from}``), every
    user's public cluster key per node (``{user: {node: (public_key, fingerprint)}}``) and who holds
    each key (``{fingerprint: [(node, user)]}``).  Each node generates its own pair per user; the
    controller only ever sees public keys."""
    enabled = [h for h in hosts if as_bool(setting(_settings(cluster, h), "cluster_key"))]
    public = {"enabled": bool(enabled), "users": [], "from": []}
    keys, holders = {}, {}
    if not enabled:
        return public, keys, holders
    addresses = []
    for host in all_hosts:
        node = _node(cluster, host)
        addresses += [node.get("node_addr"), node.get("ansible_host")]
    public["from"] = [a for a in dict.fromkeys(_usable(a) for a in addresses) if a]
    users = []
    for host in enabled:
        users += as_list(setting(_settings(cluster, host), "cluster_key_users"))
        state = ((_facts(cluster, host) or {}).get("cluster_key") or {}).get("users") or {}
        for user, entry in state.items():
            if entry.get("exists") and entry.get("fingerprint"):
                keys.setdefault(user, {})[host] = (entry["public_key"], entry["fingerprint"])
                holders.setdefault(entry["fingerprint"], []).append((host, user))
    public["users"] = list(dict.fromkeys(users))
    return public, keys, holders


_MEMO = {}


def _analysis(cluster):
    """Everything :func:`plan` and :func:`decide` derive from the cluster view, computed once.

    Memoised on the identity of the view's mappings (``decide`` runs once per node over the
    same view): pass new mappings after changing facts or settings."""
    hosts = cluster.get("hosts") or []
    all_hosts = cluster.get("all_hosts") or hosts
    facts_map, settings_map = cluster.get("facts") or {}, cluster.get("settings") or {}
    # O(1) per call: the mappings' identities and sizes (decide runs once per node over one view); the lists of
    # nodes are copied only when the analysis is made.
    key = (id(facts_map), id(settings_map), id(cluster.get("nodes")), len(hosts), len(all_hosts),
           len(facts_map), len(settings_map))
    hit = _MEMO.get("last")
    if hit and hit[0] == key:
        return hit[2]
    result = _analyse(cluster, list(hosts), list(all_hosts))
    # The view is kept alive with its result so that the ids in the key cannot be reused.
    _MEMO["last"] = (key, (facts_map, settings_map, cluster.get("nodes")), result)
    return result


def _entries(cluster, targeted, names):
    """``(entries, unreadable, unread, fingerprints)``: the known-hosts entry of every targeted node whose
    host keys were read and that has a name of its own, why the others have none, and each node's key
    fingerprints."""
    entries, unreadable, unread, fingerprints = [], {}, [], {}
    for host in targeted:
        facts = _facts(cluster, host)
        if facts is None:
            unread.append(host)
            continue
        keys = []
        for key in facts.get("keys") or []:
            try:
                parsed = parse_public_key(key.get("public_key"))
            except (SshTrustError, AttributeError):
                continue
            keys.append("%s %s" % (parsed["type"], parsed["blob"]))
            fingerprints.setdefault(host, []).append(parsed["fingerprint"])
        if not keys:
            unreadable[host] = "; ".join(facts.get("problems") or []) or "no host key named"
            continue
        if not names[host]:
            unreadable[host] = "%s has no name of its own in the inventory (each is another node's too, or means " \
                               "'this machine')" % host
            continue
        entries.append({"node": host, "names": names[host], "keys": keys, "port": _port(_settings(cluster, host))})
    return entries, unreadable, unread, fingerprints


def _blocks(cluster, targeted, keep_nodes, desired):
    """``(blocks, changed_keys)``: each node's known-hosts block compared with ``desired``, and every
    changed host key over all the blocks (with the nodes it was seen on)."""
    blocks, changes = {}, {}
    # The block every node holds once bring-up ran; a node whose block is exactly that needs no parsing.
    fresh = plan_block("", None, keep_nodes, (), MARKER, desired=desired)
    canonical = fresh["block"]
    begin, end = markers(MARKER)
    for host in targeted:
        facts = _facts(cluster, host)
        known = (facts or {}).get("known_hosts")
        if not known or known.get("error"):
            continue
        block = list(known.get("block") or [])
        if known.get("present") and block == canonical:
            blocks[host] = {"block": canonical, "old_block": block, "present": True, "changed_keys": [],
                            "missing": [], "dropped": []}
            continue
        if not block:  # what the writer does to a file without a block: add every entry
            blocks[host] = dict(fresh, old_block=[], present=bool(known.get("present")))
            continue
        text = begin + "\n" + "".join(line + "\n" for line in block) + end + "\n" if known.get("present") else ""
        settings = _settings(cluster, host)
        result = plan_block(text, None, keep_nodes, as_list(setting(settings, "accept_changed")), MARKER,
                            known.get("path") or KNOWN_HOSTS, desired=desired)
        blocks[host] = result
        for change in result["changed_keys"]:
            record = changes.setdefault((change["node"], change["key_type"], change["old_fingerprint"],
                                         change["new_fingerprint"]),
                                        dict(change, seen_on=[], names=list(change["names"]), accepted=True))
            record["seen_on"].append(host)
            record["accepted"] = record["accepted"] and change["accepted"]
            record["names"] += [n for n in change["names"] if n not in record["names"]]
    changed_keys = [changes[k] for k in sorted(changes)]
    return blocks, changed_keys


def _dropins(cluster, targeted, keep_nodes, names):
    """``(dropin_names, dropin)``: every cluster name, and per targeted node the drop-in's state and content."""
    dropin_names = []
    for host in keep_nodes:
        dropin_names += names.get(host) or []
    dropin_names = list(dict.fromkeys(dropin_names))
    dropin, rendered = {}, {}
    for host in targeted:
        facts, settings = _facts(cluster, host), _settings(cluster, host)
        wanted = as_bool(setting(settings, "cluster_key")) or as_bool(setting(settings, "strict_host_key_checking_no"))
        variant = (as_bool(setting(settings, "cluster_key")), setting(settings, "cluster_key_name"),
                   as_bool(setting(settings, "strict_host_key_checking_no")))
        if variant not in rendered:
            rendered[variant] = render_dropin(dropin_names, *variant)
        content = rendered[variant]
        if facts is None:
            state = "unknown"
        elif not wanted:
            state = "absent"
        elif (facts.get("client") or {}).get("dropin_included"):
            state = "present"
        else:
            state = "unsupported"
        dropin[host] = {"state": state, "content": content if state == "present" else ""}
    return dropin_names, dropin


def _suspects(unread, unreadable, fingerprints, changed_keys):
    """The nodes whose own findings explain their peers' failures, with the reason."""
    suspects = {}
    for host in unread:
        suspects[host] = ("no ssh_trust facts were read from %s (see its ssh_trust.error or preflight.reachable)"
                          % host)
    for host in unreadable:
        if host in fingerprints:  # keys read, but it has no name of its own
            suspects[host] = "%s has no name of its own (see ssh_trust.names on %s)" % (host, host)
        else:
            suspects[host] = "%s's host keys could not be read (see ssh_trust.host_keys on %s)" % (host, host)
    for change in changed_keys:
        if not change["accepted"]:
            suspects.setdefault(change["node"], "%s's host key changed (see ssh_trust.host_key_unchanged on %s)"
                                % (change["node"], change["node"]))
    return suspects


def _analyse(cluster, hosts, all_hosts):
    targeted = sorted(hosts)
    keep_nodes = sorted(set(all_hosts) | set(hosts))
    names, duplicates, owners = _claims(cluster, keep_nodes)
    entries, unreadable, unread, fingerprints = _entries(cluster, targeted, names)
    desired = normalize_entries(entries)
    blocks, changed_keys = _blocks(cluster, targeted, keep_nodes, desired)
    dropin_names, dropin = _dropins(cluster, targeted, keep_nodes, names)
    peers = {h: {"targets": mesh_targets(h, _node(cluster, h)), "port": _port(_settings(cluster, h))}
             for h in targeted}
    suspects = _suspects(unread, unreadable, fingerprints, changed_keys)
    cluster_key, user_keys, key_holders = _cluster_key_plan(cluster, targeted, keep_nodes)
    guessed = {h: assumption((_facts(cluster, h) or {}).get("sshd")) for h in targeted if h in fingerprints}
    public = {"entries": entries, "keep_nodes": keep_nodes, "names": dropin_names, "peers": peers, "dropin": dropin,
              "cluster_key": cluster_key, "unreadable": unreadable, "unread": unread, "changed_keys": changed_keys,
              "duplicate_names": duplicates}
    return {"plan": public, "desired": desired, "blocks": blocks, "fingerprints": fingerprints, "suspects": suspects,
            "names": names, "owners": owners, "user_keys": user_keys, "key_holders": key_holders,
            "assumed": {h: text for h, text in guessed.items() if text}}


ASSUMED_FIX = (BECOME_FIX + " so the sshd listening on ssh_trust_port is found, or point ssh_trust_sshd_config (or "
               "ssh_trust_host_key_files) at the configuration it runs with")


def assumption(sshd):
    """What a comparison with the key files in ``sshd`` (the reader's fact) assumes, or "" when they are
    the running sshd's (found, or named by the inventory)."""
    sshd = sshd or {}
    if sshd.get("source") != "default" or not sshd.get("discovery"):
        return ""
    return "compared with the key files of %s, assumed because the running sshd could not be found%s: %s" % (
        sshd.get("config"), " without root" if sshd.get("needs_root") else "", sshd.get("discovery"))
