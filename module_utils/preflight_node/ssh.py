# -*- coding: utf-8 -*-
"""SSH primitives of the node layer: files, public keys, known_hosts lines and the managed block.

Node layer (``module_utils/preflight_node/ssh.py``, shipped in module calls).  Shared by the node
half of the capability (``module_utils/preflight_node/ssh_trust.py``), the other ssh node modules
(``sshd.py``: the running sshd and its host keys; ``ssh_mesh.py``: the node-to-node ssh mesh;
``ssh_keys.py``: a user's ~/.ssh and authorized_keys), the controller half
(``cluster_preflight/capabilities/ssh_trust*.py``) and the module ``known_hosts_block`` (the managed
block in /etc/ssh/ssh_known_hosts).  Nothing here decides a check.

Text is handled as ``str`` decoded with ``surrogateescape`` so that lines the
block does not own are written back byte for byte, whatever their encoding or
line ending.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import hashlib
import hmac
import os
import re
import struct


ENCODING = "utf-8"
ERRORS = "surrogateescape"
KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
MARKER = "# {mark} preflight ssh_trust: cluster host keys (managed block; change the inventory, not these lines)"
NODE_TAG = "node="
_NAME = re.compile(r"^[A-Za-z0-9_.:%\-\[\]]+$")


class SshTrustError(ValueError):
    """Bad input or a file this code cannot safely edit; the message says which and how to fix it."""


# --------------------------------------------------------------------------
# Paths and files


def rooted(root, path):
    """The file-system path of logical ``path`` under ``root`` (tests use a sandbox root)."""
    if not root or root == "/":
        return path
    return os.path.join(root, path.lstrip("/"))


def read_text(path):
    """Text of ``path`` (surrogateescape), or ``None`` when it does not exist."""
    try:
        with open(path, "r", encoding=ENCODING, errors=ERRORS, newline="") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def sha256_text(text):
    if text is None:
        return None
    return hashlib.sha256(text.encode(ENCODING, ERRORS)).hexdigest()


def split_lines(text):
    """Lines with their ``\\n`` kept; only ``\\n`` splits (a ``\\r`` stays part of its line)."""
    if not text:
        return []
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def read_file(path):
    """``(text or None, problem or None)``: a missing file is ``(None, None)``, an unreadable one names why."""
    try:
        return read_text(path), None
    except (OSError, UnicodeError) as exc:
        return None, "%s cannot be read: %s" % (path, getattr(exc, "strerror", None) or exc)


# --------------------------------------------------------------------------
# Public keys and fingerprints


def fingerprint(blob):
    """``SHA256:...`` of a base64 key blob, as ``ssh-keygen -lf`` prints it."""
    raw = base64.b64decode(blob.encode("ascii"), validate=True)
    return "SHA256:" + base64.b64encode(hashlib.sha256(raw).digest()).decode("ascii").rstrip("=")


def parse_public_key(text):
    """``{type, blob, comment, fingerprint}`` from ``TYPE BASE64 [COMMENT]``; raises SshTrustError."""
    fields = (text or "").strip().split(None, 2)
    if len(fields) < 2:
        raise SshTrustError("not an ssh public key (expected 'TYPE BASE64 [COMMENT]'): %r" % (text or "")[:80])
    key_type, blob = fields[0], fields[1]
    try:
        raw = base64.b64decode(blob.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise SshTrustError("%s key blob is not base64: %s" % (key_type, exc)) from exc
    if len(raw) < 4:
        raise SshTrustError("%s key blob is too short" % key_type)
    (length,) = struct.unpack(">I", raw[:4])
    inner = raw[4:4 + length].decode("ascii", "replace")
    if inner != key_type:
        raise SshTrustError("key type %s does not match the type inside its blob (%s)" % (key_type, inner))
    return {"type": key_type, "blob": blob, "comment": fields[2].strip() if len(fields) > 2 else "",
            "fingerprint": fingerprint(blob)}


# --------------------------------------------------------------------------
# known_hosts lines


def host_token(name, port=22):
    """How ssh writes a host in known_hosts: ``name`` on port 22, else ``[name]:port``."""
    port = int(port or 22)
    return name if port == 22 else "[%s]:%d" % (name, port)


def parse_known_hosts_line(line):
    """A known_hosts line as a dict, or ``None`` for blank lines, comments and lines ssh would skip.

    Keys: marker (``@cert-authority``/``@revoked`` or ``""``), patterns (list), hashed (bool),
    type, blob, comment, node (the ``node=`` tag of a managed line, or ``""``)."""
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
        return None
    fields = stripped.split()
    marker = ""
    if fields[0].startswith("@"):
        marker = fields.pop(0)
    if len(fields) < 3:
        return None
    patterns = fields[0].split(",")
    comment = " ".join(fields[3:])
    node = ""
    for word in fields[3:]:
        if word.startswith(NODE_TAG):
            node = word[len(NODE_TAG):]
    return {"marker": marker, "patterns": patterns, "hashed": fields[0].startswith("|1|"),
            "type": fields[1], "blob": fields[2], "comment": comment, "node": node}


def hashed_matches(pattern, token):
    """Whether a hashed host (``|1|salt|hash``, HashKnownHosts) stands for ``token``."""
    parts = pattern.split("|")
    if len(parts) != 4 or parts[1] != "1":
        return False
    try:
        salt = base64.b64decode(parts[2])
        expected = base64.b64decode(parts[3])
    except (binascii.Error, ValueError):
        return False
    digest = hmac.new(salt, token.encode(ENCODING, ERRORS), hashlib.sha1).digest()
    return hmac.compare_digest(digest, expected)


def patterns_match(patterns, token):
    """ssh's rule for a host field: some pattern matches and no negated (``!``) one does."""
    token_l = token.lower()
    matched = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = pattern[1:] if negated else pattern
        if body.startswith("|1|"):
            hit = hashed_matches(body, token)
        else:
            hit = fnmatch.fnmatchcase(token_l, body.lower())
        if hit and negated:
            return False
        matched = matched or hit
    return matched


def keys_for(text, token, key_type=None):
    """Plain (unmarked) entries of a known_hosts text for ``token``: list of (line number, entry)."""
    found = []
    for number, line in enumerate(split_lines(text or ""), 1):
        entry = parse_known_hosts_line(line)
        if entry is None or entry["marker"]:
            continue
        if key_type and entry["type"] != key_type:
            continue
        if patterns_match(entry["patterns"], token):
            found.append((number, entry))
    return found


def safe_fingerprint(blob):
    try:
        return fingerprint(blob)
    except (binascii.Error, ValueError):
        return "(unreadable key)"


# --------------------------------------------------------------------------
# The managed block


def markers(marker=MARKER):
    if "{mark}" not in marker:
        raise SshTrustError("marker %r must contain {mark}" % marker)
    return marker.replace("{mark}", "BEGIN"), marker.replace("{mark}", "END")


def split_block(text, begin, end):
    """``(before, block_lines, after, present)``: the managed block's body lines and the
    untouched text around it.  A BEGIN without END (or the reverse, or two blocks) raises,
    since there is no safe way to tell which lines are ours."""
    lines = split_lines(text or "")
    stripped = [line.rstrip("\r\n") for line in lines]
    begins = [i for i, line in enumerate(stripped) if line == begin]
    ends = [i for i, line in enumerate(stripped) if line == end]
    if not begins and not ends:
        return text or "", [], "", False
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
        raise SshTrustError(
            "the managed block markers are broken (%d BEGIN line(s) at %s, %d END line(s) at %s); "
            "expected exactly one BEGIN followed by one END. Fix: edit the file so it holds one "
            "'%s' ... '%s' pair (or none), then re-run"
            % (len(begins), [i + 1 for i in begins] or "-", len(ends), [i + 1 for i in ends] or "-", begin, end))
    first, last = begins[0], ends[0]
    return "".join(lines[:first]), [line.rstrip("\r\n") for line in lines[first + 1:last]], \
        "".join(lines[last + 1:]), True


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
