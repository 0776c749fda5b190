# -*- coding: utf-8 -*-
"""Capability ``ssh_trust``, controller half: the checks of one node from its facts and the cluster plan
(names, hostname, served host keys, changed host keys, the known-hosts block, ~/.ssh, the cluster key,
the client drop-in).

Controller layer (``cluster_preflight/capabilities/ssh_trust/checks.py``, never shipped); called by
``decide`` in ``cluster_preflight/capabilities/ssh_trust/``.
"""

from __future__ import annotations

from preflight_node.checks import check, failed, passed, skipped, warned
from preflight_node.privilege import assumed, needs_root
from preflight_node.ssh.primitives import safe_fingerprint
from preflight_node.ssh.checks import BRINGUP, describe_sshd, known_hosts_check
from preflight_node.ssh.keys_write import ssh_dir_refusal

from .mesh import _mesh_view
from .cluster_plan import ASSUMED_FIX, assumption, reported_names
from .settings import _nodes, _summary, as_bool, as_list, policy, setting


def _names_check(host, analysis):
    names = analysis["names"].get(host) or []
    duplicates = analysis["plan"]["duplicate_names"].get(host) or []
    expected = "every name %s has in the inventory belongs to it alone" % host
    if duplicates:
        found = "; ".join("%s is a name of both %s (%s) and %s" % (
            d["name"], host, d["source"], " and ".join("%s (%s)" % (other, source) for other, source in
                                                       sorted(d["others"].items()))) for d in duplicates)
        lost = [d["name"] for d in duplicates if d["name"] not in names]
        nodes = sorted({host} | {other for d in duplicates for other in d["others"]})
        return failed("%s%s; %s is known as %s" % (
            found, "; %s left out of every known_hosts block and of the mesh" % ", ".join(lost) if lost else "",
            host, ", ".join(names)), expected,
            "give each node its own names in the inventory: change ansible_host, preflight_node_addr or "
            "ssh_trust_extra_names of %s so no two nodes share one" % " or ".join(nodes),
            nodes=nodes)
    return passed("%s is known as %s" % (host, ", ".join(names)), expected)


# The cause the summary groups every node's hostname warning under (``cluster_preflight/outputs/summary.py``).
HOSTNAME_CAUSE = {"id": "hostnames_not_inventory_names",
                  "title": "the nodes call themselves by names that are not their inventory names",
                  "fix": "add each node's own hostname to ssh_trust_extra_names for it (host_vars), or give each node "
                         "its inventory name as hostname (hostnamectl set-hostname); a reported name is never "
                         "trusted on its own"}


def _hostname_check(host, facts, analysis):
    """A hostname or FQDN the node reports that is not one of its inventory names: a warning, never a
    trusted name (a node cannot put itself under another node's name into anybody's known_hosts)."""
    own = {name.lower() for name in analysis["names"].get(host) or []}
    own |= {d["name"].lower() for d in analysis["plan"]["duplicate_names"].get(host) or []}
    reported = reported_names(facts)
    expected = "the hostname and FQDN %s reports are among its inventory names (only those are trusted)" % host
    if not reported:
        return passed("%s reports no name of its own besides localhost" % host, expected)
    differing = [(what, name) for what, name in reported if name.lower() not in own]
    if not differing:
        return passed("%s calls itself %s" % (host, ", ".join(name for _what, name in reported)), expected)
    parts = []
    for what, name in differing:
        owners = {h: src for h, src in (analysis["owners"].get(name.lower()) or {}).items() if h != host}
        parts.append("%s %s%s" % (what, name, " (%s of %s)" % (" and ".join(
            "the %s" % src for src in dict.fromkeys(owners.values())), ", ".join(sorted(owners))) if owners else ""))
    return warned("%s calls itself %s, not one of its inventory names (%s); a name a node reports is never "
                  "trusted: it is in no known_hosts block" % (host, "; ".join(parts), ", ".join(
                      analysis["names"].get(host) or [])), expected,
                  "if %s really is a name of %s, add it to ssh_trust_extra_names for %s; otherwise give %s its own "
                  "hostname (hostnamectl set-hostname %s)" % (" / ".join(name for _w, name in differing), host, host,
                                                              host, host), causes=[HOSTNAME_CAUSE])


def _served_check(host, facts, settings, cluster, analysis):
    """The host keys peers saw with ssh-keyscan against the key files read on ``host``."""
    expected = "the host keys the sshd on %s serves are the key files read on %s (what known_hosts holds)" % (host,
                                                                                                          host)
    if not as_bool(setting(settings, "mesh")):
        return skipped("ssh_trust_mesh is false: no peer scanned %s's sshd" % host, expected)
    if not facts.get("keys"):
        return skipped("%s's host key files could not be read (see ssh_trust.host_keys)" % host, expected)
    rows = _mesh_view(cluster, analysis)["served"].get(host) or {}
    scanned = {peer: row for peer, row in rows.items() if row.get("keys")}
    if not scanned:
        return skipped("no peer got %s's host keys with ssh-keyscan in this run%s" % (host, (": " + _summary(
            "%s: %s" % (peer, row.get("error") or "no key") for peer, row in sorted(rows.items()))) if rows else
            " (bring-up does not probe; preflight.yml does)"), expected)
    read = {}
    for key in facts.get("keys") or []:
        read[key["public_key"].split()[1] if len(key["public_key"].split()) > 1 else ""] = key
    unknown, seen_types = [], set()
    for peer, row in sorted(scanned.items()):
        for text in row["keys"]:
            key_type, blob = text.split()[:2]
            seen_types.add(key_type)
            if blob not in read:
                unknown.append("%s %s (seen by %s at %s)" % (key_type, safe_fingerprint(blob), peer, row["target"]))
    files = ", ".join("%s %s (%s)" % (k["type"], k["fingerprint"], k.get("path")) for k in facts["keys"])
    sshd = facts.get("sshd") or {}
    where = describe_sshd(sshd)
    fix = ("find the configuration the sshd on %s really runs with (ps -o args= -C sshd: its -f and -h) and point "
           "ssh_trust_sshd_config (or ssh_trust_host_key_files) at it, or leave both empty so the listening sshd is "
           "found; then %s. If no key file on %s holds the served key, something else answers on %s's address"
           % (host, BRINGUP, host, host))
    if unknown and sshd.get("needs_root"):
        return needs_root("%s, so the key files of the sshd on %s, which serves %s, are unknown; the fallback's (%s, "
                          "from %s) do not hold them" % (sshd["needs_root"], host, _summary(dict.fromkeys(unknown)),
                                                         files, where), expected)
    if unknown:
        return failed("the sshd on %s serves %s, which is none of the key files read on %s (%s, from %s): peers "
                      "would find a key that their known_hosts does not hold" % (
                          host, _summary(dict.fromkeys(unknown)), host, files, where), expected, fix)
    unserved = [k for k in facts["keys"] if k["type"] not in seen_types]
    result = _served_result(host, facts, scanned, seen_types, unserved, expected, fix)
    return assumed(result, assumption(sshd), ASSUMED_FIX) if assumption(sshd) else result


def _served_result(host, facts, scanned, seen_types, unserved, expected, fix):
    if unserved:
        return warned("%s's key file(s) %s are not served by its sshd (peers saw only %s): known_hosts lists keys "
                      "no client is shown" % (host, ", ".join("%s %s (%s)" % (k["type"], k["fingerprint"],
                                                                               k.get("path")) for k in unserved),
                                              ", ".join(sorted(seen_types))), expected, fix)
    return passed("the sshd on %s serves the key(s) read from its files (%s), as %s saw with ssh-keyscan" % (
        host, ", ".join(k["fingerprint"] for k in facts["keys"]), ", ".join(sorted(scanned))), expected)


def _host_key_unchanged_check(host, facts, analysis):
    expected = "%s presents the host key every node's known-hosts block already holds for it" % host
    if host in analysis["plan"]["unreadable"]:
        return skipped("%s's host keys could not be read (see ssh_trust.host_keys)" % host, expected)
    changes = [c for c in analysis["plan"]["changed_keys"] if c["node"] == host]
    text = "; ".join("%s %s (known as %s in the blocks of %s) -> %s (read from %s itself)" % (
        c["key_type"], c["old_fingerprint"], ", ".join(c["names"]), ", ".join(c["seen_on"]), c["new_fingerprint"],
        host) for c in changes)
    held = [c for c in changes if not c["accepted"]]
    sshd = facts.get("sshd") or {}
    if held and sshd.get("needs_root"):
        return needs_root("%s, so whether %s's host key changed is unknown: the key files read instead (%s) differ "
                          "from what the known-hosts blocks hold: %s" % (sshd["needs_root"], host, describe_sshd(sshd),
                                                                          text), expected)
    if held:
        return failed("%s's host key changed: %s; the old key stays in the cluster known-hosts block until accepted"
                      % (host, text), expected, held[0]["fix"], old_fingerprint=held[0]["old_fingerprint"],
                      new_fingerprint=held[0]["new_fingerprint"])
    if changes:
        result = passed("%s's changed host key was accepted (ssh_trust_accept_changed): %s" % (host, text), expected)
    else:
        result = passed("%s presents the known host key(s) %s" % (host, ", ".join(
            k["fingerprint"] for k in facts.get("keys") or [])), expected)
    return assumed(result, assumption(sshd), ASSUMED_FIX) if assumption(sshd) else result


def _known_hosts_decision(host, facts, settings, analysis):
    known = facts.get("known_hosts") or {}
    path = known.get("path") or setting(settings, "known_hosts_file")
    expected = "%s on %s holds the current host keys of every node in its managed block" % (path, host)
    if known.get("error"):
        return failed("%s on %s: %s" % (path, host, known["error"]), expected,
                      "edit %s on %s so it holds one BEGIN ... END pair of the managed block (or none), then %s"
                      % (path, host, BRINGUP))
    result = analysis["blocks"].get(host)
    if result is None:
        return skipped("%s on %s was not compared" % (path, host), expected)
    held = sorted({c["node"] for c in result["changed_keys"] if not c["accepted"]})
    checked = known_hosts_check(host, path, result, policy(settings, "drift_policy"), held_back=held)
    if not analysis["assumed"]:
        return checked
    return assumed(checked, _assumed_text(analysis), ASSUMED_FIX)


def _assumed_text(analysis):
    """Which nodes' host keys were read from a fallback, and why: the same for every node's known_hosts check,
    so it is worded once per cluster view (the analysis is memoised)."""
    if "assumed_text" not in analysis:
        guessed = analysis["assumed"]
        analysis["assumed_text"] = "the host keys of %s were read from a fallback (%s)" % (
            _nodes(sorted(guessed)), _summary("%s: %s" % (node, text) for node, text in sorted(guessed.items())))
    return analysis["assumed_text"]


def _cluster_key_users(facts, settings):
    users = as_list(setting(settings, "cluster_key_users"))
    state = (facts.get("cluster_key") or {}).get("users")
    return users, state


def _ssh_dirs_check(host, facts, settings):
    """Every cluster key user's home and ~/.ssh on ``host``: nothing bring-up would have to write
    through (a link) or that sshd's StrictModes would refuse (writable by others)."""
    users, state = _cluster_key_users(facts, settings)
    expected = ("the home and ~/.ssh of %s on %s are directories of their own (not group- or world-writable, "
                "~/.ssh no symlink)" % (", ".join(users), host))
    if not as_bool(setting(settings, "cluster_key")):
        return skipped("ssh_trust_cluster_key is false: no user's ~/.ssh is written", expected)
    if state is None:
        return skipped("the cluster key users were not read on %s" % host, expected)
    refusals, lacking = [], []
    for user in users:
        entry = state.get(user) or {}
        if entry.get("needs_root"):
            lacking.append(entry["needs_root"])
        elif entry.get("exists") and entry.get("ssh"):
            refusal = ssh_dir_refusal(host, user, entry["uid"], entry["ssh"])
            if refusal:
                refusals.append(refusal)
    if refusals:
        return failed("; ".join(r["found"] for r in refusals), expected, " ".join(r["fix"] for r in refusals),
                      refused=True)
    if lacking:
        return needs_root("; ".join(lacking), expected)
    return passed("the home and ~/.ssh of %s on %s are safe to hold keys" % (
        ", ".join(u for u in users if (state.get(u) or {}).get("exists")) or "no user", host), expected)


def _authorized_drift(user, entry, wanted, known, options, drift):
    """What ``user``'s authorized_keys lacks or holds too many of (``wanted``: node -> (public key,
    fingerprint) of the user's cluster key there), appended to ``drift``."""
    lines = entry.get("authorized") or []
    held = {(line["node"], line["public_key"]) for line in lines}
    lacking = sorted(node for node, (public_key, _fp) in wanted.items() if (node, public_key) not in held)
    stale = []
    for line in lines:
        node = line["node"]
        if not node or node not in known or (node in wanted and wanted[node][0] != line["public_key"]):
            stale.append("%s%s" % (line["fingerprint"], " (node=%s)" % node if node else " (no node=, the old "
                                                                                        "shared key?)"))
    if lacking:
        drift.append("%s's authorized_keys lacks the key of %s from %s" % (user, user, _nodes(lacking)))
    if stale:
        drift.append("%s's authorized_keys still holds cluster key line(s) no node has: %s" % (
            user, _summary(stale)))
    wrong = [line for line in lines if (line["node"], line["public_key"]) in
             {(n, k) for n, (k, _f) in wanted.items()} and line["options"] != options]
    if wrong:
        drift.append("%s authorizes the cluster keys with options %r, not %r" % (user, wrong[0]["options"],
                                                                               options))


def _cluster_key_check(host, facts, settings, cluster, analysis):
    users, state = _cluster_key_users(facts, settings)
    name = setting(settings, "cluster_key_name")
    expected = ("%s on %s each hold a key pair of their own in ~/.ssh/%s (0600, owned by the user) and authorize "
                "their own key from every node" % (", ".join(users), host, name))
    if not as_bool(setting(settings, "cluster_key")):
        return skipped("ssh_trust_cluster_key is false: node-to-node logins use keys the users bring", expected)
    if state is None:
        return skipped("the cluster key was not read on %s" % host, expected)
    missing_users = ["%s (%s)" % (u, (state.get(u) or {}).get("problem") or "no such user") for u in users
                     if not (state.get(u) or {}).get("exists")]
    if missing_users:
        return failed("%s: %s" % (host, "; ".join(missing_users)), expected,
                      "create the user(s) on %s first or change ssh_trust_cluster_key_users" % host)
    known = set(cluster.get("all_hosts") or []) | set(cluster.get("hosts") or [])
    options = ('from="%s"' % ",".join(analysis["plan"]["cluster_key"]["from"])
               if as_bool(setting(settings, "cluster_key_restrict_from")) and analysis["plan"]["cluster_key"]["from"]
               else "")
    fails, drift, fixes, unread = [], [], [], []
    for user in users:
        entry = state[user]
        if entry.get("needs_root"):
            unread.append(entry["needs_root"])
            continue
        if ssh_dir_refusal(host, user, entry["uid"], entry["ssh"]):
            drift.append("%s's ~/.ssh was not examined (see ssh_trust.ssh_dirs)" % user)
            continue
        if not entry.get("private"):
            drift.append("%s has no %s" % (user, entry["path"]))
        elif entry.get("private_mode") != 0o600 or entry.get("private_uid") != entry["uid"]:
            drift.append("%s is mode %04o, owned by uid %s (ssh refuses a private key others can read)" % (
                entry["path"], entry.get("private_mode") or 0, entry.get("private_uid")))
        if not entry.get("fingerprint"):
            drift.append("%s has no %s.pub%s" % (user, entry["path"], " (%s)" % entry["problem"]
                                                 if entry.get("problem") else ""))
        else:
            holders = [h for h in analysis["key_holders"].get(entry["fingerprint"]) or [] if h != (host, user)]
            others = sorted({"%s on %s" % (u, n) for n, u in holders if u != user})
            copies = sorted({n for n, u in holders if u == user})
            if others:
                fails.append("%s's key %s is also the key of %s: one user's key handed to another" % (
                    user, entry["fingerprint"], ", ".join(others)))
                fixes.append("on %s remove %s and %s.pub (never copy another user's key), then %s" % (
                    host, entry["path"], entry["path"], BRINGUP))
            elif copies:
                drift.append("%s's key %s is the same pair as on %s (a copied key: one stolen copy opens every node)"
                             % (user, entry["fingerprint"], _nodes(copies)))
                fixes.append("on %s remove %s and %s.pub so bring-up generates a pair of its own" % (
                    host, entry["path"], entry["path"]))
        _authorized_drift(user, entry, analysis["user_keys"].get(user) or {}, known, options, drift)
    fixes.append("%s with ssh_trust_cluster_key: true" % BRINGUP)
    if fails:
        return failed("%s: %s" % (host, "; ".join(fails + drift)), expected, "; ".join(dict.fromkeys(fixes)))
    if drift:
        return check(policy(settings, "drift_policy"), "%s: %s" % (host, "; ".join(drift)), expected,
                     "; ".join(dict.fromkeys(fixes)))
    if unread:
        return needs_root("; ".join(unread), expected)
    return passed("%s on %s hold their own cluster key (%s) and authorize it from %s" % (
        ", ".join(users), host, ", ".join("%s %s" % (u, state[u]["fingerprint"]) for u in users),
        _nodes(sorted({n for u in users for n in analysis["user_keys"].get(u) or {}}))), expected)


def _client_dropin_check(host, facts, settings, analysis):
    client = facts.get("client") or {}
    wanted = analysis["plan"]["dropin"].get(host) or {"state": "unknown"}
    dropin = client.get("dropin") or setting(settings, "ssh_config_dropin")
    ssh_config = client.get("ssh_config") or setting(settings, "ssh_config")
    drift = policy(settings, "drift_policy")
    if wanted["state"] == "absent":
        expected = "%s absent on %s (neither the cluster key nor the relaxation is on)" % (dropin, host)
        if client.get("dropin_text") is None:
            return passed(expected, expected)
        return check(drift, "%s exists on %s though nothing needs it" % (dropin, host), expected,
                     "%s: it removes the drop-in" % BRINGUP)
    expected = "%s on %s holds the cluster client settings for every cluster name" % (dropin, host)
    if wanted["state"] == "unsupported":
        return warned("%s on %s does not include ssh_config.d (%s): the cluster client settings are not read"
                      % (ssh_config, host, "no such file" if not client.get("ssh_config_exists") else
                         "Include %s" % (", ".join(client.get("includes") or []) or "none")), expected,
                      "add `Include /etc/ssh/ssh_config.d/*.conf` at the top of %s (as Debian 12 ships it), then "
                      "re-run bringup.yml" % ssh_config)
    if client.get("dropin_text") == wanted.get("content"):
        return passed(expected, expected)
    return check(drift, "%s on %s is %s" % (dropin, host, "missing" if client.get("dropin_text") is None
                                             else "out of date"), expected, BRINGUP)
