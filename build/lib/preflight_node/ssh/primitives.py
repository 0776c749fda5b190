# -*- coding: utf-8 -*-
"""SSH primitives of the node layer: files, public keys, known_hosts lines and finding the managed block.

Node layer (``module_utils/preflight_node/ssh/primitives.py``, shipped in module calls): the reading half, what the
node half of the capability (``module_utils/preflight_node/capabilities/ssh_trust.py``) and the other ssh node modules
(``sshd.py``: the running sshd and its host keys; ``ssh_mesh.py``: the node-to-node ssh mesh;
``ssh_keys.py``: a user's ~/.ssh and authorized_keys) need.  Planning the managed block in
/etc/ssh/ssh_known_hosts (for the module ``known_hosts_block`` and the controller half
``cluster_preflight/capabilities/ssh_trust*.py``) is in ``module_utils/preflight_node/ssh/known_hosts_plan.py``.
Nothing here decides a check.

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
import struct


ENCODING = "utf-8"
ERRORS = "surrogateescape"
MARKER = "# {mark} preflight ssh_trust: cluster host keys (managed block; change the inventory, not these lines)"
NODE_TAG = "node="


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
