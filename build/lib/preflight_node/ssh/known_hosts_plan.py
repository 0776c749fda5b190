# -*- coding: utf-8 -*-
"""Planning the managed block of known_hosts (node layer, ``module_utils/preflight_node/ssh/known_hosts_plan.py``).

The bring-up writer ``library/known_hosts_block.py`` and the controller half of ssh_trust
(``cluster_preflight/capabilities/ssh_trust/cluster_plan.py``) plan the block here: :func:`normalize_entries`
validates the wanted nodes and keys, :func:`plan_block` works out the new block, :func:`join_block` puts it
back into the file.  Reading and parsing known_hosts (and finding the block, :func:`split_block`) is in
``module_utils/preflight_node/ssh/primitives.py``, the part the ssh_trust reader ships.
"""

from __future__ import annotations

import hashlib
import re

from .primitives import (ENCODING, ERRORS, MARKER, NODE_TAG, SshTrustError, host_token, markers, parse_known_hosts_line,
                         parse_public_key, safe_fingerprint, split_block)


KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
_NAME = re.compile(r"^[A-Za-z0-9_.:%\-\[\]]+$")


def sha256_text(text):
    if text is None:
        return None
    return hashlib.sha256(text.encode(ENCODING, ERRORS)).hexdigest()


def join_block(before, body, after, begin, end):
    """The file text with the block between ``before`` and ``after``; an empty body removes the block."""
    if not body:
        return before + after
    if before and not before.endswith("\n"):
        before += "\n"
    return before + begin + "\n" + "".join(line + "\n" for line in body) + end + "\n" + after


def normalize_entries(entries):
    """Validate the desired entries; returns ``[{node, tokens, keys:[{type, blob, fingerprint}]}]``."""
    result = []
    owner = {}
    for entry in entries or []:
        node = str(entry.get("node") or "").strip()
        if not node or any(c.isspace() for c in node):
            raise SshTrustError("entry %r has no valid node name" % (entry,))
        port = int(entry.get("port") or 22)
        tokens = []
        for name in entry.get("names") or []:
            name = str(name).strip()
            if not name:
                continue
            if not _NAME.match(name):
                raise SshTrustError("%s: %r is not a host name or address" % (node, name))
            token = host_token(name, port)
            if token.lower() in owner and owner[token.lower()] != node:
                raise SshTrustError("%s is a name of both %s and %s; each name must belong to one node. Fix the "
                                    "inventory (ansible_host, preflight_node_addr) or the hostnames"
                                    % (name, owner[token.lower()], node))
            owner[token.lower()] = node
            if token not in tokens:
                tokens.append(token)
        if not tokens:
            raise SshTrustError("%s: no names to write its host keys for" % node)
        keys = []
        for text in entry.get("keys") or []:
            key = parse_public_key(text)
            if key["type"] not in [k["type"] for k in keys]:
                keys.append(key)
        if not keys:
            raise SshTrustError("%s: no host public keys were collected" % node)
        result.append({"node": node, "tokens": tokens, "keys": keys})
    if len({e["node"] for e in result}) != len(result):
        raise SshTrustError("a node appears twice in entries")
    return result


def render_line(node, tokens, key):
    return "%s %s %s %s%s" % (",".join(tokens), key["type"], key["blob"], NODE_TAG, node)


def _line_node(entry, desired_by_token):
    """The node an old block line belongs to: its tag, else the node owning one of its names."""
    if entry["node"]:
        return entry["node"]
    for pattern in entry["patterns"]:
        if pattern.lower() in desired_by_token:
            return desired_by_token[pattern.lower()]
    return ""


def accept_command(node, tokens, new_fp, key_type, path=KNOWN_HOSTS):
    """The operator's fix text for a host key that changed."""
    removals = "; ".join("ssh-keygen -R %s -f %s" % (token, path) for token in tokens)
    return ("verify that %s is %s's real %s host key (on its console: ssh-keygen -lf "
            "/etc/ssh/ssh_host_%s_key.pub), then accept it for the whole cluster with "
            "`ansible-playbook bringup.yml -e ssh_trust_accept_changed=%s` (by hand on one node: %s); "
            "a controller that knows the old key needs `ssh-keygen -R %s` as well"
            % (new_fp, node, key_type, key_type_file(key_type), node, removals, tokens[0]))


def key_type_file(key_type):
    """``ed25519`` for ``ssh-ed25519``: the word in /etc/ssh/ssh_host_<word>_key."""
    if key_type.startswith("ecdsa"):
        return "ecdsa"
    return {"ssh-ed25519": "ed25519", "ssh-rsa": "rsa", "ssh-dss": "dsa"}.get(key_type, key_type)


def _index_old_lines(old_body, desired_by_token):
    """``(old_lines, relevant)``: every old body line as ``(line, parsed, owner)``, and per node the old
    lines that concern it (tagged with it, or listing one of its names).  An index, so that comparing a
    block of n nodes costs O(n), not O(n^2)."""
    old_lines = []
    relevant = {}
    for line in old_body:
        parsed = parse_known_hosts_line(line)
        owner = _line_node(parsed, desired_by_token) if parsed else ""
        old_lines.append((line, parsed, owner))
        if not parsed or parsed["marker"]:
            continue
        nodes = [owner] + [desired_by_token[p.lower()] for p in parsed["patterns"] if p.lower() in desired_by_token]
        for node in dict.fromkeys(n for n in nodes if n):
            relevant.setdefault(node, []).append((line, parsed, owner))
    return old_lines, relevant


def _changed_keys(desired, relevant, accept, path):
    """``(changed_keys, held_back)``: the nodes whose key differs from the one the old block holds,
    and those of them not accepted (their old lines stay)."""
    changed_keys = []
    held_back = set()
    for entry in desired:
        if entry["node"] not in relevant:
            continue
        tokens_l = {t.lower() for t in entry["tokens"]}
        wanted = {k["type"]: k for k in entry["keys"]}
        for _line, parsed, owner in relevant[entry["node"]]:
            overlap = [p for p in parsed["patterns"] if p.lower() in tokens_l]
            if owner != entry["node"] and not overlap:
                continue
            key = wanted.get(parsed["type"])
            if key is None or key["blob"] == parsed["blob"]:
                continue
            if any(k["blob"] == parsed["blob"] for k in entry["keys"]):
                continue
            accepted = entry["node"] in accept
            names = overlap or [t for t in entry["tokens"]]
            record = {"node": entry["node"], "names": names, "key_type": parsed["type"],
                      "old_fingerprint": safe_fingerprint(parsed["blob"]), "new_fingerprint": key["fingerprint"],
                      "accepted": accepted,
                      "fix": accept_command(entry["node"], entry["tokens"], key["fingerprint"], parsed["type"], path)}
            if record not in changed_keys:
                changed_keys.append(record)
            if not accepted:
                held_back.add(entry["node"])
    return changed_keys, held_back


def _new_body(desired, old_lines, held_back, keep):
    """``(body, dropped)``: the new block's lines, sorted by node, and the nodes whose lines go."""
    groups = {}
    for entry in desired:
        if entry["node"] in held_back:
            continue
        if "lines" not in entry:  # kept on the normalised entry: a caller comparing many files renders once
            entry["lines"] = [render_line(entry["node"], entry["tokens"], key) for key in entry["keys"]]
        groups[entry["node"]] = entry["lines"]
    desired_nodes = {e["node"] for e in desired}
    dropped = []
    for line, parsed, owner in old_lines:
        if owner in held_back or (owner in keep and owner not in desired_nodes):
            groups.setdefault("\0" + owner, []).append(line)
        elif owner and owner not in desired_nodes and owner not in dropped:
            dropped.append(owner)
    body, seen = [], set()
    for name in sorted(groups, key=lambda n: n.lstrip("\0")):
        for line in groups[name]:
            if line not in seen:
                seen.add(line)
                body.append(line)
    return body, dropped


def _missing(desired, old_lines, relevant):
    """Per node the names whose current key the old block lacks: ``[{node, names}]``."""
    missing = []
    old_pairs = set()
    for _line, parsed, _owner in old_lines:
        if parsed and not parsed["marker"]:
            for pattern in parsed["patterns"]:
                old_pairs.add((pattern.lower(), parsed["type"], parsed["blob"]))
    for entry in desired:
        if not old_pairs:
            lacking = list(entry["tokens"])
        elif entry["node"] not in relevant:
            lacking = list(entry["tokens"])
        else:
            lacking = [t for t in entry["tokens"]
                       if any((t.lower(), k["type"], k["blob"]) not in old_pairs for k in entry["keys"])]
        if lacking:
            missing.append({"node": entry["node"], "names": lacking})
    return missing


def plan_block(text, entries, keep_nodes=(), accept_changed=(), marker=MARKER, path=KNOWN_HOSTS, desired=None):
    """Work out the block for ``entries`` against the current file ``text``.

    Returns a dict: ``text`` (the new file text), ``block`` (new body lines), ``old_block``,
    ``present`` (the block existed), ``changed_keys`` (a node's key differs from the one the
    block holds: node, names, key_type, old/new fingerprint, accepted, fix), ``missing``
    (per node the names whose current key the block lacks), ``dropped`` (nodes whose lines
    go because they are neither in entries nor kept).  ``desired`` is ``entries`` already
    passed through :func:`normalize_entries` (a caller comparing many files saves the work).

    A changed key of a node not in ``accept_changed`` is never replaced: that node's old
    lines stay as they are.  Nodes in ``keep_nodes`` without an entry (not reachable this
    run) keep their old lines unchanged.  Every line outside the markers is kept as is."""
    begin, end = markers(marker)
    if desired is None:
        desired = normalize_entries(entries)
    accept = {str(n) for n in accept_changed or []}
    keep = {str(n) for n in keep_nodes or []}
    before, old_body, after, present = split_block(text, begin, end)
    desired_by_token = {}
    for entry in desired:
        for token in entry["tokens"]:
            desired_by_token[token.lower()] = entry["node"]
    old_lines, relevant = _index_old_lines(old_body, desired_by_token)
    changed_keys, held_back = _changed_keys(desired, relevant, accept, path)
    body, dropped = _new_body(desired, old_lines, held_back, keep)
    missing = _missing(desired, old_lines, relevant)
    return {"text": join_block(before, body, after, begin, end), "block": body, "old_block": old_body,
            "present": present, "changed_keys": changed_keys, "missing": missing, "dropped": dropped}
