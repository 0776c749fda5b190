# -*- coding: utf-8 -*-
"""A user's ~/.ssh: its states as sshd's StrictModes sees them, the cluster key lines of authorized_keys,
and reading and writing inside it as root without following links.

Node layer (``module_utils/preflight_node/ssh_keys.py``, shipped in module calls): used by the reader
of ``module_utils/preflight_node/ssh_trust.py``, the module ``ssh_cluster_key`` (the writer) and the
controller half (``cluster_preflight/capabilities/ssh_trust_checks.py`` judges ~/.ssh with the same
:func:`ssh_dir_refusal`).
"""

from __future__ import annotations

import binascii
import os
import re
import stat
import time

from .ssh import ENCODING, ERRORS, NODE_TAG, SshTrustError, parse_public_key, rooted, split_lines


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
