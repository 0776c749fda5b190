# -*- coding: utf-8 -*-
"""SSH host keys, the cluster known-hosts block and the node-to-node ssh mesh: the primitives.

Shared by the capability ``module_utils/preflight_node/ssh_trust.py`` (reader, probe,
decider) and the modules ``ssh_host_keys`` (read a node's own host keys),
``known_hosts_block`` (the managed block in /etc/ssh/ssh_known_hosts) and
``ssh_mesh`` (ssh from a node to every peer with host-key checking on).
Commands run through an ``ops`` object (``module_utils/preflight_node/ops.py``) as
argv lists; nothing here decides a check.

Text is handled as ``str`` decoded with ``surrogateescape`` so that lines the
block does not own are written back byte for byte, whatever their encoding or
line ending.
"""

from __future__ import annotations

import base64
import binascii
import concurrent.futures
import fnmatch
import getopt
import glob
import hashlib
import hmac
import os
import re
import stat
import struct
import time

from .proc import socket_owners


ENCODING = "utf-8"
ERRORS = "surrogateescape"
KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
SSHD_CONFIG = "/etc/ssh/sshd_config"
# sshd's host keys when its configuration names none (sshd_config(5), HostKey).
DEFAULT_HOST_KEYS = ("/etc/ssh/ssh_host_rsa_key", "/etc/ssh/ssh_host_ecdsa_key", "/etc/ssh/ssh_host_ed25519_key")
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
    old_lines = []
    # The old lines that concern a node: tagged with it, or listing one of its names.  An index,
    # so that comparing a block of n nodes costs O(n), not O(n^2).
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

    return {"text": join_block(before, body, after, begin, end), "block": body, "old_block": old_body,
            "present": present, "changed_keys": changed_keys, "missing": missing, "dropped": dropped}


# --------------------------------------------------------------------------
# sshd's host keys


def _sshd_config_words(line):
    line = line.strip()
    if not line or line.startswith("#"):
        return None, []
    match = re.match(r"^(\S+?)(?:\s*=\s*|\s+)(.*)$", line)
    if not match:
        return line.lower(), []
    return match.group(1).lower(), match.group(2).split()


def sshd_host_key_paths(root, config=SSHD_CONFIG, depth=0, defaults=True):
    """HostKey paths of an sshd configuration (with its Includes), in order; the sshd default
    list when none is named (and ``defaults``: sshd adds them only when no -h key was given
    either).  Stops at the first Match block, where HostKey is not allowed."""
    paths = []
    full = rooted(root, config)
    text = read_text(full)
    if text is None:
        if depth == 0:
            raise SshTrustError("sshd configuration %s does not exist" % config)
        return paths
    for line in split_lines(text):
        keyword, args = _sshd_config_words(line)
        if keyword == "match":
            break
        if keyword == "hostkey" and args:
            paths.append(args[0])
        elif keyword == "include" and depth < 8:
            for pattern in args:
                if not pattern.startswith("/"):
                    pattern = os.path.join("/etc/ssh", pattern)
                for match in sorted(glob.glob(rooted(root, pattern))):
                    logical = "/" + os.path.relpath(match, root).lstrip("/") if root not in ("", "/") else match
                    paths.extend(sshd_host_key_paths(root, logical, depth + 1))
    if depth == 0 and not paths and defaults:
        paths = list(DEFAULT_HOST_KEYS)
    seen = []
    for path in paths:
        if path not in seen:
            seen.append(path)
    return seen


def read_file(path):
    """``(text or None, problem or None)``: a missing file is ``(None, None)``, an unreadable one names why."""
    try:
        return read_text(path), None
    except (OSError, UnicodeError) as exc:
        return None, "%s cannot be read: %s" % (path, getattr(exc, "strerror", None) or exc)


# --------------------------------------------------------------------------
# The running sshd: the process listening on the port, its -f / -h / -o, and `sshd -T`
#
# The keys to distribute are the ones the running sshd serves.  Assuming /etc/ssh/sshd_config
# is wrong for an sshd started with -f elsewhere (the test bed's, a container's, a second sshd
# on another port): every peer would then hold keys the daemon never presents, and strict ssh
# between nodes fails right after bring-up.

# sshd(8)'s getopt string (OpenSSH 9): the options that take an argument are followed by ':'.
SSHD_GETOPT = "C:E:b:c:f:g:h:k:o:p:u:46DQRTdeiqrtV"
# What `sshd -T` needs to evaluate Match blocks on versions that insist on a connection spec.
SSHD_TEST_CONNECTION = "user=root,host=localhost,addr=127.0.0.1"
_TCP_LISTEN = "0A"


def listening_inodes(root, port):
    """Socket inodes listening on TCP ``port`` (IPv4 and IPv6) in this network namespace."""
    inodes = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        text, _problem = read_file(rooted(root, table))
        for line in (text or "").splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _TCP_LISTEN:
                continue
            try:
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
            except (IndexError, ValueError):
                continue
            if local_port == int(port) and fields[9] != "0" and fields[9] not in inodes:
                inodes.append(fields[9])
    return inodes


def _comm(proc, entry):
    try:
        with open(os.path.join(proc, entry, "comm"), encoding=ENCODING, errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def socket_holders(root, inodes):
    """``(pids, denied)``: the processes holding one of the socket ``inodes`` (from their
    ``/proc/<pid>/fd`` links), and how many processes' descriptors could not be read (not root).
    The processes called sshd are looked at first; every process only when none of them holds it
    (a node with thousands of processes then costs one pass over their descriptors)."""
    proc = rooted(root, "/proc")
    try:
        entries = [entry for entry in os.listdir(proc) if entry.isdigit()]
    except OSError:
        return [], 0
    sshd = [entry for entry in entries if _comm(proc, entry) == "sshd"]
    pids, denied = _holders(proc, sshd, inodes)
    if pids:
        return pids, denied
    return _holders(proc, entries, inodes)


def _holders(proc, entries, inodes):
    owners, denied = socket_owners(proc, entries, inodes)
    return sorted({pid for pids in owners.values() for pid in pids}), denied


def sshd_command_line(text):
    """sshd's argv from ``/proc/<pid>/cmdline``.  sshd rewrites its title to one string,
    ``sshd: /usr/sbin/sshd -D -f CFG [listener] 0 of 10-100 startups``: split that back."""
    parts = [part for part in (text or "").split("\0") if part]
    if len(parts) == 1 and " " in parts[0]:
        title = parts[0]
        if title.startswith("sshd: "):
            title = title[len("sshd: "):]
        parts = title.split(" [listener]")[0].split()
    return parts


def sshd_options(argv):
    """``(config, host_keys, options, problem)`` from sshd's argv: ``-f FILE`` (None: the
    default), every ``-h KEY`` and every ``-o OPTION``, in order."""
    try:
        pairs, _rest = getopt.getopt(list(argv[1:]), SSHD_GETOPT)
    except getopt.GetoptError as exc:
        return None, [], [], "cannot parse sshd's options %r: %s" % (" ".join(argv), exc)
    config, keys, options = None, [], []
    for flag, value in pairs:
        if flag == "-f":
            config = value
        elif flag == "-h":
            keys.append(value)
        elif flag == "-o":
            options.append(value)
    return config, keys, options, None


def _proc_text(root, pid, name):
    try:
        with open(rooted(root, "/proc/%d/%s" % (pid, name)), "rb") as handle:
            return handle.read().decode(ENCODING, "replace")
    except OSError:
        return ""


def _proc_exe(root, pid):
    try:
        exe = os.readlink(rooted(root, "/proc/%d/exe" % pid))
    except OSError:
        return ""
    return exe[:-len(" (deleted)")] if exe.endswith(" (deleted)") else exe


def discover_sshd(root, port, ops=None):
    """The sshd listening on TCP ``port``, found from ``/proc/net/tcp{,6}`` (socket inode) and
    ``/proc/<pid>/fd`` (the process holding it).

    Returns ``{port, pid, exe, argv, config, host_key_args, options, problem}``; ``problem`` says
    why no sshd was found (nothing listens, descriptors unreadable without root, the socket is
    held by something else such as systemd's socket activation).  Never raises."""
    found = {"port": int(port), "pid": None, "exe": "", "argv": [], "config": SSHD_CONFIG, "host_key_args": [],
             "options": [], "problem": ""}
    inodes = listening_inodes(root, port)
    if not inodes:
        found["problem"] = "no process listens on TCP port %d (/proc/net/tcp, /proc/net/tcp6)" % int(port)
        return found
    pids, denied = socket_holders(root, inodes)
    if not pids:
        found["problem"] = ("no process found holding the socket that listens on port %d (%s)" % (int(port), (
            "the descriptors of %d process(es) could not be read: run as root (preflight_become: true)" % denied)
            if denied else "it is held outside this node's process table"))
        return found
    holders = []
    for pid in pids:
        argv = sshd_command_line(_proc_text(root, pid, "cmdline"))
        exe = _proc_exe(root, pid)
        holders.append((pid, argv, exe))
    sshd = [h for h in holders if os.path.basename(h[2]) == "sshd"
            or (h[1] and os.path.basename(h[1][0]) == "sshd")]
    if not sshd:
        found["problem"] = ("port %d is held by %s, not by an sshd (socket activation? then each connection's "
                            "sshd reads its unit's -f, by default %s)" % (int(port), ", ".join(
                                "pid %d (%s)" % (pid, " ".join(argv) or exe or "?") for pid, argv, exe in holders),
                                SSHD_CONFIG))
        return found
    pid, argv, exe = sshd[0]
    config, keys, options, problem = sshd_options(argv)
    found.update(pid=pid, exe=exe, argv=argv, config=config or SSHD_CONFIG, host_key_args=keys, options=options,
                 problem=problem or "")
    if len(sshd) > 1:
        found["other_pids"] = [h[0] for h in sshd[1:]]
    return found


def sshd_test_host_keys(ops, sshd_bin, config, host_key_args=(), options=(), timeout=10):
    """``(paths, problem)``: the HostKey files of ``sshd -T -f CONFIG [-h KEY]... [-o OPT]...``,
    sshd's own reading of its configuration (Includes, defaults, the -h keys), retried with
    ``-C user=root,host=localhost,addr=127.0.0.1`` for versions that need it with Match blocks."""
    argv = [sshd_bin, "-T", "-f", config]
    for key in host_key_args or ():
        argv += ["-h", key]
    for option in options or ():
        argv += ["-o", option]
    problem = None
    for attempt in (argv, argv + ["-C", SSHD_TEST_CONNECTION]):
        rc, out, err = ops.run(attempt, timeout=timeout)
        if rc == 0:
            paths = []
            for line in (out or "").splitlines():
                fields = line.split(None, 1)
                if len(fields) == 2 and fields[0].lower() == "hostkey" and fields[1].strip() not in paths:
                    paths.append(fields[1].strip())
            if paths:
                return paths, None
            problem = "%s listed no HostKey" % " ".join(attempt[:4])
        else:
            problem = "%s failed (rc %s): %s" % (" ".join(attempt[:4]), rc, (err or "").strip()[-300:])
    return [], problem


def _configured_paths(root, config, host_key_args, options, ops, sshd_bin):
    """``(paths, how, problem)`` for an sshd started with ``-f config -h ... -o ...``."""
    if ops is not None and sshd_bin:
        paths, problem = sshd_test_host_keys(ops, sshd_bin, rooted(root, config), host_key_args, options)
        if paths:
            return paths, "sshd -T", None
    else:
        problem = "no sshd binary to run sshd -T"
    # No usable sshd -T (not root, no binary): read the file as sshd would, -h and -o HostKey first.
    explicit = list(host_key_args or ())
    for option in options or ():
        keyword, args = _sshd_config_words(option)
        if keyword == "hostkey" and args:
            explicit.append(args[0])
    try:
        parsed = sshd_host_key_paths(root, config, defaults=not explicit)
    except (SshTrustError, OSError, UnicodeError) as exc:
        return [], "parsed", "sshd configuration %s cannot be read: %s (%s)" % (
            config, getattr(exc, "strerror", None) or exc, problem)
    seen = []
    for path in explicit + parsed:
        if path not in seen:
            seen.append(path)
    return seen, "parsed (%s)" % problem, None


def host_key_sources(root, sshd_config="", host_key_files=(), ops=None, port=22):
    """``(paths, problem, sshd)``: the host key files to read, why there are none, and where they
    were found (``sshd``: ``{source, config, how, port, pid, argv, discovery}``).

    In order: ``host_key_files`` (ssh_trust_host_key_files); ``sshd_config``
    (ssh_trust_sshd_config, an explicit override); else the sshd listening on ``port``
    (:func:`discover_sshd`), whose ``-f``/``-h``/``-o`` go to ``sshd -T``; else, when no sshd could
    be found, the default configuration, with ``discovery`` saying why.  A missing or unreadable
    configuration is a problem to report, never an exception."""
    sshd = {"source": "", "config": "", "how": "", "port": int(port or 22), "pid": None, "argv": [],
            "discovery": ""}
    if host_key_files:
        sshd.update(source="ssh_trust_host_key_files", how="listed")
        return list(host_key_files), None, sshd
    sshd_bin = ops.which("sshd", ["/usr/sbin", "/sbin"]) if ops is not None else None
    if sshd_config:
        sshd.update(source="ssh_trust_sshd_config", config=sshd_config)
        if not os.path.exists(rooted(root, sshd_config)):
            return [], "sshd configuration %s does not exist (ssh_trust_sshd_config)" % sshd_config, sshd
        paths, how, problem = _configured_paths(root, sshd_config, (), (), ops, sshd_bin)
        sshd["how"] = how
        return paths, problem, sshd
    found = discover_sshd(root, port, ops)
    sshd.update(pid=found["pid"], argv=found["argv"], config=found["config"])
    if found["pid"] and not found["problem"]:
        sshd["source"] = "listener"
        if found.get("other_pids"):
            sshd["other_pids"] = found["other_pids"]
        exe = found["exe"] if found["exe"] and os.path.exists(rooted(root, found["exe"])) else sshd_bin
        if not os.path.exists(rooted(root, found["config"])):
            return [], ("sshd configuration %s (sshd pid %d: %s) does not exist" % (
                found["config"], found["pid"], " ".join(found["argv"]))), sshd
        paths, how, problem = _configured_paths(root, found["config"], found["host_key_args"], found["options"],
                                                ops, exe)
        sshd["how"] = how
        return paths, problem, sshd
    sshd.update(source="default", config=SSHD_CONFIG, discovery=found["problem"])
    if not os.path.exists(rooted(root, SSHD_CONFIG)):
        return [], ("sshd configuration %s does not exist (no openssh-server, or sshd runs with another -f) and "
                    "%s" % (SSHD_CONFIG, found["problem"])), sshd
    paths, how, problem = _configured_paths(root, SSHD_CONFIG, (), (), ops, sshd_bin)
    sshd["how"] = how
    return paths, problem, sshd


def read_host_key(root, path, ops, timeout=10):
    """``(key or None, problem or None)`` for one host key path (private or ``.pub``).

    key is ``{type, public_key, fingerprint, path}``.  A key without its ``.pub`` is derived
    with ``ssh-keygen -y``, which reads the private half itself; it is never read here."""
    private = path[:-4] if path.endswith(".pub") else path
    public = private + ".pub"
    text, problem = read_file(rooted(root, public))
    if problem:
        return None, problem
    source = public
    if text is None:
        if not os.path.exists(rooted(root, private)):
            return None, "%s: no such host key (neither it nor %s exists)" % (private, public)
        keygen = ops.which("ssh-keygen")
        if not keygen:
            return None, "%s has no .pub and ssh-keygen is not installed to derive it" % private
        rc, out, err = ops.run([keygen, "-y", "-f", rooted(root, private)], timeout=timeout)
        if rc != 0:
            return None, "%s: ssh-keygen -y failed: %s" % (private, (err or "rc %s" % rc).strip()[:200])
        text, source = out, private + " (public half derived with ssh-keygen -y)"
    try:
        key = parse_public_key(text)
    except SshTrustError as exc:
        return None, "%s: %s" % (public, exc)
    return {"type": key["type"], "public_key": "%s %s" % (key["type"], key["blob"]),
            "fingerprint": key["fingerprint"], "path": source}, None


def read_host_keys(root, paths, ops):
    """``(keys, problems)``: one key per type, in the order of ``paths``."""
    keys, problems = [], []
    for path in paths:
        key, problem = read_host_key(root, path, ops)
        if problem:
            problems.append(problem)
        elif key["type"] not in [k["type"] for k in keys]:
            keys.append(key)
    return keys, problems


# --------------------------------------------------------------------------
# The ssh client configuration


def ssh_config_includes(root, ssh_config):
    """Include patterns of an ssh client configuration, as absolute logical paths, in order.

    Relative patterns are relative to /etc/ssh for a system configuration (ssh_config(5))."""
    text, _problem = read_file(rooted(root, ssh_config))
    patterns = []
    for line in split_lines(text or ""):
        keyword, args = _sshd_config_words(line)
        if keyword != "include":
            continue
        for pattern in args:
            if pattern.startswith("~"):
                continue
            patterns.append(pattern if pattern.startswith("/") else os.path.join("/etc/ssh", pattern))
    return patterns


def included(patterns, path):
    """Whether the file ``path`` is read through one of the Include ``patterns``."""
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)


# --------------------------------------------------------------------------
# ssh mesh classification

SSH_STATUSES = ("ok", "host_key_unknown", "host_key_changed", "auth_denied", "refused", "timeout", "dns",
                "unreachable", "error")
_NEW_FP = re.compile(r"The fingerprint for the (\S+) key sent by the remote host is\s*(SHA256:[A-Za-z0-9+/]+)")
_OFFENDING = re.compile(r"Offending (\S+) key in (\S+):(\d+)")


def classify_ssh(rc, stderr, timed_out=False):
    """``(status, detail)`` of one ``ssh -o BatchMode=yes -o StrictHostKeyChecking=yes PEER true``.

    detail holds what stderr tells: ``new_fingerprint``, ``key_type``, ``offending_file``,
    ``offending_line`` for a changed key."""
    text = stderr or ""
    detail = {}
    match = _NEW_FP.search(text)
    if match:
        detail["key_type"] = match.group(1)
        detail["new_fingerprint"] = match.group(2)
    match = _OFFENDING.search(text)
    if match:
        detail["offending_file"] = match.group(2)
        detail["offending_line"] = int(match.group(3))
    if ("REMOTE HOST IDENTIFICATION HAS CHANGED" in text or re.search(r"Host key for \S+ has changed", text)
            or "POSSIBLE DNS SPOOFING DETECTED" in text):
        return "host_key_changed", detail
    if "Host key verification failed" in text or re.search(r"No \S+ host key is known for", text):
        return "host_key_unknown", detail
    if rc == 0 and not timed_out:
        return "ok", detail
    if "Permission denied" in text or "Too many authentication failures" in text:
        return "auth_denied", detail
    if "Could not resolve hostname" in text or "Name or service not known" in text \
            or "Temporary failure in name resolution" in text:
        return "dns", detail
    if "Connection refused" in text:
        return "refused", detail
    if timed_out or "timed out" in text or "Operation timed out" in text:
        return "timeout", detail
    if "No route to host" in text or "Network is unreachable" in text:
        return "unreachable", detail
    return "error", detail


def host_key_verified(status):
    """Whether ssh got past host-key verification (a login failure after it still counts)."""
    return status in ("ok", "auth_denied")


# --------------------------------------------------------------------------
# The ssh mesh: ssh from this node to every peer, all at once, each call bounded

TIMEOUT_RCS = (124, 128 + 9)
# Options that would turn the check into something else than what it measures.
FORBIDDEN_SSH_OPTIONS = ("stricthostkeychecking", "userknownhostsfile", "globalknownhostsfile", "batchmode",
                         "checkhostip", "updatehostkeys", "knownhostscommand", "proxycommand", "localcommand",
                         "permitlocalcommand")


def forbidden_ssh_options(options):
    """The ``Key=Value`` options in ``options`` that would relax or bypass what the mesh measures."""
    bad = []
    for option in options or []:
        key = str(option).replace("=", " ").split()[0].lower() if str(option).strip() else ""
        if not key or key in FORBIDDEN_SSH_OPTIONS:
            bad.append(option)
    return bad


def _client_args(port, user, extra):
    argv = []
    for option in extra or []:
        argv += ["-o", option]
    if int(port or 22) != 22:
        argv += ["-p", str(port)]
    if user:
        argv += ["-l", user]
    return argv


def ssh_argv(ssh_bin, target, port=22, user="", connect_timeout=5, extra=()):
    """One ``ssh ... TARGET true`` with host-key checking on that writes no known_hosts file."""
    return ([ssh_bin, "-n", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
             "-o", "ConnectTimeout=%d" % int(connect_timeout), "-o", "UpdateHostKeys=no",
             "-o", "ControlMaster=no", "-o", "ControlPath=none"]
            + _client_args(port, user, extra) + ["--", target, "true"])


def config_argv(ssh_bin, target, port=22, user="", extra=()):
    """``ssh -G TARGET``: the client's effective configuration for a target, without connecting."""
    return [ssh_bin, "-G"] + _client_args(port, user, extra) + ["--", target]


def parse_ssh_g(text):
    """The settings of ``ssh -G`` output the client-configuration check reads."""
    config = {"stricthostkeychecking": "", "globalknownhostsfile": [], "userknownhostsfile": [], "identityfile": []}
    for line in (text or "").splitlines():
        fields = line.split()
        if not fields:
            continue
        key = fields[0].lower()
        if key == "stricthostkeychecking" and len(fields) > 1:
            config[key] = fields[1].lower()
        elif key in ("globalknownhostsfile", "userknownhostsfile"):
            config[key].extend(fields[1:])
        elif key == "identityfile" and len(fields) > 1:
            config[key].append(" ".join(fields[1:]))
    return config


def parse_pdsh(hosts, out, err):
    """``(ok_hosts, {host: stderr lines})`` from pdsh's ``host: line`` output."""
    ok = []
    for line in (out or "").splitlines():
        host = line.split(":", 1)[0].strip()
        if host in hosts and host not in ok:
            ok.append(host)
    errors = {}
    for line in (err or "").splitlines():
        text = line
        if text.startswith("pdsh@"):
            text = text.split(":", 1)[1].strip() if ":" in text else text
        host = text.split(":", 1)[0].strip()
        if host in hosts:
            errors.setdefault(host, []).append(text.split(":", 1)[1].strip() if ":" in text else text)
            continue
        match = re.search(r'gethostbyname\("([^"]+)"\) failed', text)
        if match and match.group(1) in hosts:
            errors.setdefault(match.group(1), []).append("Could not resolve hostname %s (pdsh: %s)"
                                                         % (match.group(1), text))
    return ok, errors


def short_stderr(text, limit=600):
    """stderr without ssh's ``@@@`` banner, cut to its last ``limit`` characters."""
    text = (text or "").strip()
    text = "\n".join(line for line in text.splitlines() if not line.startswith("@"))
    return text if len(text) <= limit else "..." + text[-limit:]


def offending_fingerprint(root, detail):
    """Fingerprint of the known_hosts line ssh named as offending, or ``None``."""
    path, number = detail.get("offending_file"), detail.get("offending_line")
    if not path:
        return None
    text, _problem = read_file(rooted(root, path))
    lines = split_lines(text or "")
    if not 0 < number <= len(lines):
        return None
    entry = parse_known_hosts_line(lines[number - 1])
    return safe_fingerprint(entry["blob"]) if entry else None


def _ssh_row(ops, argv, timeout, root, row):
    rc, _out, err = ops.run(argv, timeout=timeout)
    timed_out = rc in TIMEOUT_RCS
    status, detail = classify_ssh(rc, err, timed_out)
    row.update(status=status, rc=rc, stderr=short_stderr(err))
    if timed_out and status == "timeout":
        row["stderr"] = (row["stderr"] + "\n" if row["stderr"] else "") + "killed after %ss" % timeout
    for key in ("key_type", "new_fingerprint"):
        if key in detail:
            row[key] = detail[key]
    if "offending_file" in detail:
        row["offending"] = "%s:%d" % (detail["offending_file"], detail["offending_line"])
        old = offending_fingerprint(root, detail)
        if old:
            row["old_fingerprint"] = old
    return row


def _ssh_config(ops, argv, timeout):
    rc, out, err = ops.run(argv, timeout=timeout)
    if rc != 0:
        return {"error": short_stderr(err) or "ssh -G exited %s" % rc}
    return parse_ssh_g(out)


def _pdsh(ops, pdsh_bin, hosts, user, connect_timeout, timeout):
    argv = [pdsh_bin, "-t", str(int(connect_timeout)), "-u", str(max(int(timeout) - 2, 1))]
    if user:
        argv += ["-l", user]
    argv += ["-w", ",".join(hosts), "date"]
    env = {"PDSH_RCMD_TYPE": "ssh",
           "PDSH_SSH_ARGS_APPEND": "-o BatchMode=yes -o ConnectTimeout=%d -o UpdateHostKeys=no" % int(connect_timeout)}
    rc, out, err = ops.run(argv, timeout=timeout, env=env)
    ok, errors = parse_pdsh(hosts, out, err)
    timed_out = rc in TIMEOUT_RCS
    failed = {}
    for host in hosts:
        if host in ok:
            continue
        text = "\n".join(errors.get(host, [])) or ("pdsh killed after %ss" % timeout if timed_out else "no output")
        status, _detail = classify_ssh(255, text, timed_out)
        failed[host] = {"status": status, "stderr": text}
    return {"state": "ran", "hosts": list(hosts), "argv": argv, "rc": rc, "ok": ok, "failed": failed,
            "stderr": short_stderr(err)}


KEYSCAN_TYPES = "rsa,ecdsa,ed25519"


def keyscan_argv(keyscan_bin, target, port=22, timeout=5):
    """``ssh-keyscan``: the host keys a peer's sshd presents (compared with its key files, never trusted)."""
    return [keyscan_bin, "-T", str(int(timeout)), "-p", str(int(port or 22)), "-t", KEYSCAN_TYPES, "--", target]


def parse_keyscan(out):
    """``TYPE BASE64`` of every key ``ssh-keyscan`` printed, one per type, in order."""
    keys, types = [], set()
    for line in (out or "").splitlines():
        fields = line.split()
        if len(fields) < 3 or line.startswith("#"):
            continue
        if fields[1] not in types:
            types.add(fields[1])
            keys.append("%s %s" % (fields[1], fields[2]))
    return keys


def _keyscan(ops, argv, timeout, target):
    rc, out, err = ops.run(argv, timeout=timeout)
    keys = parse_keyscan(out)
    row = {"target": target, "keys": keys, "error": ""}
    if not keys:
        row["error"] = short_stderr(err, 300) or ("ssh-keyscan exited %s with no key" % rc)
    return row


def run_mesh(ops, source, peers, user="", connect_timeout=5, timeout=20, parallel=32, ssh_options=(),
             connect=True, pdsh="auto", pdsh_hosts=(), ssh_bin="ssh", pdsh_bin="pdsh", root="/",
             keyscan=True, keyscan_bin="ssh-keyscan"):
    """ssh from this node to every target of every peer, at most ``parallel`` at once.

    ``peers`` is ``[{node, targets, port}]``.  Every target gets ``ssh -G`` (the client's
    effective configuration, no connection); with ``connect`` also one ssh with
    BatchMode and StrictHostKeyChecking=yes, and pdsh to ``pdsh_hosts`` when installed and
    ``pdsh`` is ``auto``.  Each command is killed after ``timeout`` seconds, so the whole
    run takes at most about ``ceil((targets * 2 + 1) / parallel) * (timeout + 2)`` seconds.

    With ``connect`` and ``keyscan``, also ``ssh-keyscan`` of each peer's first target: the
    host keys its sshd really presents, so the controller can compare them with the key files
    read on that peer (``served``; never written anywhere, never trusted).

    Returns ``{source, ssh, connect, peers, results, client_config, pdsh, served, keyscan,
    problem}``: ``peers`` the nodes it was given; ``results``
    one row per (peer, target) with the classified ``status``; ``client_config`` per
    target; ``pdsh`` with ``state`` ``ran``/``off``/``no_hosts``/``not_installed``/``no_ssh``.
    A missing ssh client is ``problem``, not an exception."""
    report = {"source": source, "ssh": None, "connect": bool(connect), "results": [], "client_config": {},
              "peers": [{"node": peer["node"]} for peer in peers or []],
              "pdsh": {"state": "off" if (not connect or pdsh == "never") else "no_hosts"}, "problem": "",
              "served": {}, "keyscan": "off" if not (connect and keyscan) else "no_peers"}
    ssh = ops.which(ssh_bin)
    if not ssh:
        report["problem"] = "no ssh client (%s) on %s; install openssh-client" % (ssh_bin, source)
        if report["pdsh"]["state"] == "no_hosts":
            report["pdsh"] = {"state": "no_ssh"}
        return report
    report["ssh"] = ssh
    jobs, config_jobs = [], {}
    for peer in peers or []:
        port = int(peer.get("port") or 22)
        for target in dict.fromkeys(t for t in peer.get("targets") or [] if t):
            if connect:
                row = {"source": source, "destination": peer["node"], "target": target}
                jobs.append((ssh_argv(ssh, target, port, user, connect_timeout, ssh_options), row))
            if target not in config_jobs:
                config_jobs[target] = config_argv(ssh, target, port, user, ssh_options)
    hosts = [h for h in pdsh_hosts or [] if h]
    pdsh_path = None
    if connect and pdsh != "never" and hosts:
        pdsh_path = ops.which(pdsh_bin)
        if not pdsh_path:
            report["pdsh"] = {"state": "not_installed", "program": pdsh_bin, "hosts": hosts}
    scans = {}
    if connect and keyscan and peers:
        keyscan_path = ops.which(keyscan_bin)
        if not keyscan_path:
            report["keyscan"] = "not_installed"
        else:
            report["keyscan"] = "ran"
            for peer in peers:
                targets = [t for t in peer.get("targets") or [] if t]
                if targets:
                    scans[peer["node"]] = (keyscan_argv(keyscan_path, targets[0], peer.get("port") or 22,
                                                        connect_timeout), targets[0])
    count = len(jobs) + len(config_jobs) + len(scans) + (1 if pdsh_path else 0)
    if not count:
        return report
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(int(parallel), count))) as pool:
        pdsh_future = pool.submit(_pdsh, ops, pdsh_path, hosts, user, connect_timeout, timeout) if pdsh_path else None
        scan_futures = {node: pool.submit(_keyscan, ops, argv, timeout, target)
                        for node, (argv, target) in scans.items()}
        config_futures = {target: pool.submit(_ssh_config, ops, argv, timeout) for target, argv in config_jobs.items()}
        futures = [pool.submit(_ssh_row, ops, argv, timeout, root, row) for argv, row in jobs]
        report["results"] = [future.result() for future in futures]
        report["client_config"] = {target: future.result() for target, future in config_futures.items()}
        report["served"] = {node: future.result() for node, future in scan_futures.items()}
        if pdsh_future is not None:
            report["pdsh"] = pdsh_future.result()
    return report


# --------------------------------------------------------------------------
# A user's ~/.ssh: what sshd's StrictModes and a safe writer look at
#
# ~/.ssh belongs to the user, who can swap it for a symlink (to /root/.ssh, to /etc) at any
# time.  Root must never write through such a link, and sshd's StrictModes ignores the keys of a
# home or ~/.ssh that others can write.  The reader and the writer judge with the same function
# (:func:`ssh_dir_refusal`); the writer then works only through descriptors opened without
# following links and checked again with fstat, so a link swapped in between is not followed.


def _stat_state(st):
    if stat.S_ISDIR(st.st_mode):
        kind = "dir"
    elif stat.S_ISREG(st.st_mode):
        kind = "file"
    elif stat.S_ISLNK(st.st_mode):
        kind = "symlink"
    else:
        kind = "other"
    return {"exists": True, "kind": kind, "mode": stat.S_IMODE(st.st_mode), "uid": st.st_uid}


def path_state(full, follow=False):
    """``{exists, kind, mode, uid[, target]}`` of a path (``lstat`` unless ``follow``)."""
    try:
        st = os.stat(full) if follow else os.lstat(full)
    except FileNotFoundError:
        return {"exists": False}
    except OSError as exc:
        return {"exists": None, "error": exc.strerror or str(exc)}
    state = _stat_state(st)
    if state["kind"] == "symlink":
        try:
            state["target"] = os.readlink(full)
        except OSError:
            state["target"] = "?"
    return state


def user_ssh_state(root, home):
    """The states of ``home`` (followed: a home that is a link is sshd's business), ``home/.ssh`` and
    ``home/.ssh/authorized_keys`` (not followed)."""
    ssh_dir = os.path.join(home, ".ssh")
    return {"home": home, "home_state": path_state(rooted(root, home), follow=True), "ssh_dir": ssh_dir,
            "ssh_dir_state": path_state(rooted(root, ssh_dir)),
            "authorized_keys_state": path_state(rooted(root, os.path.join(ssh_dir, "authorized_keys")))}


def _writable_by_others(state):
    return bool(state.get("mode", 0) & 0o022)


def ssh_dir_refusal(node, user, uid, state):
    """``{found, expected, fix}`` when ``user``'s home or ``~/.ssh`` on ``node`` must not be written
    through or hold keys (a symlinked or non-directory ~/.ssh, a home or ~/.ssh writable by group or
    others or owned by someone else, a symlinked authorized_keys), else None."""
    home, ssh_dir = state["home"], state["ssh_dir"]
    problems, fixes = [], []
    owner = "%s (uid %s)" % (user, uid)
    for path, what, entry, directory_fix in (
            (home, "home", state["home_state"], "chmod go-w %s" % home),
            (ssh_dir, "~/.ssh", state["ssh_dir_state"], "chmod 700 %s" % ssh_dir)):
        if entry.get("exists") is None:
            problems.append("%s %s cannot be examined: %s" % (what, path, entry.get("error")))
            fixes.append("make %s readable to root" % path)
        elif not entry["exists"]:
            if what == "home":
                problems.append("home %s does not exist" % path)
                fixes.append("create %s (owned by %s, mode 0750 or tighter) or correct %s's home directory"
                             % (path, user, user))
        elif entry["kind"] == "symlink":
            problems.append("%s %s is a symlink to %s" % (what, path, entry.get("target", "?")))
            fixes.append("replace the link by a directory of %s's own (move the files it held: rm %s && mkdir -m 700 "
                         "%s && chown %s: %s)" % (user, path, path, user, path))
        elif entry["kind"] != "dir":
            problems.append("%s %s is not a directory (%s)" % (what, path, entry["kind"]))
            fixes.append("move %s away and create a directory there owned by %s, mode 0700" % (path, user))
        else:
            if _writable_by_others(entry):
                problems.append("%s %s is writable by group or others (mode %04o)" % (what, path, entry["mode"]))
                fixes.append(directory_fix)
            if entry["uid"] not in (uid, 0):
                problems.append("%s %s is owned by uid %s, neither %s nor root" % (what, path, entry["uid"], owner))
                fixes.append("chown %s %s" % (user, path))
    keys = state.get("authorized_keys_state") or {}
    if keys.get("exists") and keys["kind"] != "file":
        path = os.path.join(ssh_dir, "authorized_keys")
        problems.append("%s is %s" % (path, "a symlink to %s" % keys.get("target", "?") if keys["kind"] == "symlink"
                                      else "not a regular file (%s)" % keys["kind"]))
        fixes.append("replace %s by a regular file owned by %s, mode 0600" % (path, user))
    if not problems:
        return None
    return {"found": "%s's ssh directory on %s: %s" % (user, node, "; ".join(problems)),
            "expected": "%s's home and ~/.ssh on %s: directories owned by %s or root that group and others cannot "
                        "write (sshd's StrictModes ignores the keys otherwise), ~/.ssh and its authorized_keys no "
                        "symlink (bring-up never writes through one)" % (user, node, user),
            "fix": "on %s: %s; then re-run bringup.yml" % (node, "; ".join(dict.fromkeys(fixes)))}


# --------------------------------------------------------------------------
# authorized_keys: the cluster key lines, one per node, found by their comment

_AUTHORIZED_KEY = re.compile(r"(?:^|\s)((?:ssh|ecdsa|sk)-[A-Za-z0-9@.-]+)\s+([A-Za-z0-9+/]+=*)(?:\s|$)")


def parse_authorized_line(line):
    """``{options, type, public_key, fingerprint, comment, node}`` of an authorized_keys line, or None
    (blank, comment, or no key in it); ``fingerprint`` is ``(unreadable key)`` for a broken blob."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    match = _AUTHORIZED_KEY.search(text)
    if not match:
        return None
    comment = text[match.end():].strip()
    node = ""
    for word in comment.split():
        if word.startswith(NODE_TAG):
            node = word[len(NODE_TAG):]
    try:
        key = parse_public_key("%s %s" % (match.group(1), match.group(2)))
    except SshTrustError:
        return {"options": text[:match.start()].strip(), "type": match.group(1), "public_key": "",
                "fingerprint": "(unreadable key)", "comment": comment, "node": node}
    return {"options": text[:match.start()].strip(), "type": key["type"],
            "public_key": "%s %s" % (key["type"], key["blob"]), "fingerprint": key["fingerprint"],
            "comment": comment, "node": node}


def is_managed_line(line, comment):
    """Whether an authorized_keys line is one of the cluster key's: its last word is ``comment``."""
    text = line.strip()
    return bool(text) and not text.startswith("#") and text.split()[-1] == comment


def authorized_line(public_key, node, comment, options=""):
    """``[OPTIONS ]TYPE BASE64 node=NODE COMMENT``: one node's key for one user."""
    key = parse_public_key(public_key)
    return "%s%s %s %s%s %s" % (options + " " if options else "", key["type"], key["blob"], NODE_TAG, node, comment)


def plan_authorized_keys(text, comment, wanted, keep_nodes=()):
    """The authorized_keys text with the cluster key lines (those ending in ``comment``) replaced.

    ``wanted`` maps a node to its line (:func:`authorized_line`).  An old line of a node in
    ``keep_nodes`` that has no line in ``wanted`` (not reached this run) stays; every other old
    cluster key line goes (a departed node, the old shared key).  Foreign lines stay byte for byte;
    the cluster lines, sorted by node, go where the first one was, else at the end.

    Returns ``{text, lines, old_lines, added, removed}`` (``added``/``removed``: lines)."""
    keep = {str(n) for n in keep_nodes or ()}
    head, tail, old, placed = [], [], [], False
    kept = {}
    for line in split_lines(text or ""):
        if is_managed_line(line, comment):
            body = line.rstrip("\r\n")
            old.append(body)
            parsed = parse_authorized_line(body)
            node = parsed["node"] if parsed else ""
            if node and node in keep and node not in wanted:
                kept.setdefault(node, []).append(body)
            placed = True
            continue
        (tail if placed else head).append(line)
    lines = []
    for node in sorted(set(wanted) | set(kept)):
        for line in ([wanted[node]] if node in wanted else kept[node]):
            if line not in lines:
                lines.append(line)
    before = "".join(head)
    if lines and before and not before.endswith("\n"):
        before += "\n"
    new_text = before + "".join(line + "\n" for line in lines) + "".join(tail)
    return {"text": new_text, "lines": lines, "old_lines": old, "added": [l for l in lines if l not in old],
            "removed": [l for l in old if l not in lines]}


# --------------------------------------------------------------------------
# Writing in a user's ~/.ssh as root without following links


class UnsafeDirectory(SshTrustError):
    """~/.ssh changed between the check and the write (a link swapped in, modes opened)."""


def open_ssh_dir(root, home, uid=None):
    """A descriptor of ``home/.ssh``, opened without following a link at ``.ssh``; with ``uid``, also
    checked with fstat (owned by ``uid`` or root, not writable by group or others).  Raises
    UnsafeDirectory (FileNotFoundError when it does not exist)."""
    try:
        home_fd = os.open(rooted(root, home), os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise UnsafeDirectory("cannot open %s: %s" % (home, exc.strerror or exc)) from exc
    try:
        fd = os.open(".ssh", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=home_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise UnsafeDirectory("cannot open %s/.ssh without following a link: %s" % (home, exc.strerror or exc)) \
            from exc
    finally:
        os.close(home_fd)
    st = os.fstat(fd)
    if uid is not None and (st.st_mode & 0o022 or st.st_uid not in (uid, 0)):
        os.close(fd)
        raise UnsafeDirectory("%s/.ssh changed while it was being written (mode %04o, uid %d)"
                              % (home, stat.S_IMODE(st.st_mode), st.st_uid))
    return fd


def read_in_dir(dir_fd, name, uid=None, limit=1 << 20):
    """Text of ``name`` in the directory ``dir_fd`` (None when absent).  Raises UnsafeDirectory for a
    link, a file that is not regular, has other hard links, or (with ``uid``) belongs to neither
    ``uid`` nor root: the user could otherwise make root read any file into its results."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UnsafeDirectory("cannot open %s without following a link: %s" % (name, exc.strerror or exc)) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeDirectory("%s is not a regular file" % name)
        if st.st_nlink != 1:
            raise UnsafeDirectory("%s has %d hard links (a link to another file?)" % (name, st.st_nlink))
        if uid is not None and st.st_uid not in (uid, 0):
            raise UnsafeDirectory("%s is owned by uid %d, neither the user (uid %d) nor root" % (name, st.st_uid, uid))
        if st.st_size > limit:
            raise UnsafeDirectory("%s is %d bytes, more than %d" % (name, st.st_size, limit))
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode(ENCODING, ERRORS)


def _create_in_dir(dir_fd, name, data, uid, gid, mode):
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
    try:
        if os.geteuid() == 0:
            os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_in_dir(dir_fd, name, text, uid, gid, mode=0o600, backup=False):
    """Replace ``name`` in the directory ``dir_fd`` with ``text``: a new file (owner ``uid:gid``, exactly
    ``mode``) renamed over it, so the old file is never written through.  ``backup`` keeps the old
    content next to it first.  Returns the backup's name or None."""
    data = text.encode(ENCODING, ERRORS)
    backup_name = None
    if backup:
        old = read_in_dir(dir_fd, name, uid)
        if old is not None:
            backup_name = "%s.%d.%s~" % (name, os.getpid(), time.strftime("%Y-%m-%d@%H:%M:%S"))
            _create_in_dir(dir_fd, backup_name, old.encode(ENCODING, ERRORS), uid, gid, mode)
    temp = ".%s.%s" % (name, binascii.hexlify(os.urandom(6)).decode("ascii"))
    try:
        _create_in_dir(dir_fd, temp, data, uid, gid, mode)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(temp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    return backup_name


def private_key_state(dir_fd, name):
    """``{exists, kind, mode, uid}`` of a private key in ``dir_fd`` (lstat only: never opened, never read)."""
    try:
        return _stat_state(os.stat(name, dir_fd=dir_fd, follow_symlinks=False))
    except FileNotFoundError:
        return {"exists": False}


def tighten_private_key(dir_fd, name, uid):
    """Give the private key ``name`` (owned by ``uid``) mode 0600 through a descriptor opened without
    following a link (opened, never read).  A key owned by someone else or with other hard links is
    refused, never chowned: it could be any file of the system.  Returns whether it changed."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != uid:
            raise UnsafeDirectory("%s is not a private key file of the user's own (a %s owned by uid %d with %d "
                                  "link(s))" % (name, "regular file" if stat.S_ISREG(st.st_mode) else "special file",
                                                st.st_uid, st.st_nlink))
        if stat.S_IMODE(st.st_mode) == 0o600:
            return False
        os.fchmod(fd, 0o600)
        return True
    finally:
        os.close(fd)
