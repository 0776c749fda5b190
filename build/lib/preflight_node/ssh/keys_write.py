# -*- coding: utf-8 -*-
"""Judging and writing a user's ~/.ssh for the cluster key.

Node layer, ``module_utils/preflight_node/ssh/keys_write.py``.

:func:`ssh_dir_refusal` says when a home or ~/.ssh must not be written through or hold keys (the module
``ssh_cluster_key``, the writer, and the controller half ``cluster_preflight/capabilities/ssh_trust/checks.py``
judge with it); :func:`plan_authorized_keys` plans the cluster key lines of authorized_keys; :func:`write_in_dir`
and :func:`tighten_private_key` write inside ~/.ssh through a descriptor opened by ``open_ssh_dir``.  Reading
~/.ssh (what the ssh_trust reader ships) is in ``module_utils/preflight_node/ssh/keys.py``.
"""

from __future__ import annotations

import binascii
import os
import stat
import time

from .primitives import ENCODING, ERRORS, NODE_TAG, parse_public_key, split_lines
from .keys import UnsafeDirectory, is_managed_line, parse_authorized_line, read_in_dir


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
