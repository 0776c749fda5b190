# -*- coding: utf-8 -*-
"""A user's ~/.ssh, read: its states as sshd's StrictModes sees them, the cluster key lines of authorized_keys,
and opening and reading inside it as root without following links.

Node layer (``module_utils/preflight_node/ssh/keys.py``, shipped in module calls): the reading half, used by
the reader of ``module_utils/preflight_node/capabilities/ssh_trust.py`` and the module ``ssh_cluster_key`` (the writer).
Judging ~/.ssh (:func:`ssh_dir_refusal`), planning authorized_keys and writing inside ~/.ssh are in
``module_utils/preflight_node/ssh/keys_write.py``.
"""

from __future__ import annotations

import os
import re
import stat

from .primitives import ENCODING, ERRORS, NODE_TAG, SshTrustError, parse_public_key, rooted


# --------------------------------------------------------------------------
# A user's ~/.ssh: what sshd's StrictModes and a safe writer look at
#
# ~/.ssh belongs to the user, who can swap it for a symlink (to /root/.ssh, to /etc) at any
# time.  Root must never write through such a link, and sshd's StrictModes ignores the keys of a
# home or ~/.ssh that others can write.  The reader and the writer judge with the same function
# (``ssh_dir_refusal``, in ssh_keys_write.py); the writer then works only through descriptors opened without
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


# --------------------------------------------------------------------------
# Reading in a user's ~/.ssh as root without following links (writing: ssh_keys_write.py)


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


def private_key_state(dir_fd, name):
    """``{exists, kind, mode, uid}`` of a private key in ``dir_fd`` (lstat only: never opened, never read)."""
    try:
        return _stat_state(os.stat(name, dir_fd=dir_fd, follow_symlinks=False))
    except FileNotFoundError:
        return {"exists": False}
