# -*- coding: utf-8 -*-
"""A directory made with a mode and an owner as root, never through a path another account controls (node layer).

The core directory is sticky and world-writable (1777) and usually lives under a world-writable parent
(``/tmp``, ``/var/tmp``).  A path-based ``mkdir -p``, ``chown``, ``chmod`` follows a symbolic link a user planted
there (``/var/tmp/cores -> /etc``) and makes ``/etc`` world-writable.  Here every component is opened from the
root down with ``O_NOFOLLOW`` (a link is refused, never followed), each existing component must be root's (or
the wanted owner's) and not writable by others unless sticky, and the mode and owner are set through the open
descriptor (``fchown``, ``fchmod``), so no path is resolved again between the check and the change.

:func:`inspect` decides (check mode stops there); :func:`ensure` acts and returns what :func:`inspect` sees after.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import stat

OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
# Mode of a missing parent directory this creates (as mkdir -p would, root's).
PARENT_MODE = 0o755


class Refused(Exception):
    """The path cannot be made safely; the message says what was found there."""


def ids(owner, group):
    """``(uid, gid)`` of the names (or numbers) ``owner`` and ``group``; KeyError names a missing one."""
    uid = int(owner) if str(owner).isdigit() else pwd.getpwnam(str(owner)).pw_uid
    gid = int(group) if str(group).isdigit() else grp.getgrnam(str(group)).gr_gid
    return uid, gid


def _components(path):
    parts = [part for part in os.path.normpath(path).split("/") if part]
    if not os.path.isabs(path) or not parts or ".." in parts:
        raise Refused("%s is not an absolute path of a directory below /" % path)
    return parts


def _check_parent(fd, logical, uid):
    """A component others must not control: owned by root or ``uid``, not writable by others unless sticky."""
    info = os.fstat(fd)
    if info.st_uid not in (0, uid):
        raise Refused("%s is owned by uid %d, an account other than root and the wanted owner: it controls what "
                      "the path resolves to" % (logical, info.st_uid))
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        raise Refused("%s is writable by others (mode %04o) and not sticky: any account can replace what is in it"
                      % (logical, stat.S_IMODE(info.st_mode)))


def _open(name, parent_fd, logical):
    try:
        return os.open(name, OPEN_DIR, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        # O_DIRECTORY | O_NOFOLLOW on a link gives ELOOP or ENOTDIR, depending on the kernel: ask what it is.
        if stat.S_ISLNK(os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode):
            raise Refused("%s is a symbolic link: it is never followed to set a mode or an owner" % logical)
        raise Refused("%s exists and is not a directory" % logical)


def _walk(path, root, uid, create):
    """Open every component of ``path`` below ``root`` without following a link; returns ``(fd of the last one
    or None, missing components)``.  ``create``: make the missing ones (parents 0755, the last one 0700 until
    its mode is set)."""
    parts = _components(path)
    fd = os.open(root or "/", os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    logical = ""
    try:
        for index, part in enumerate(parts):
            logical += "/" + part
            last = index == len(parts) - 1
            try:
                child = _open(part, fd, logical)
            except FileNotFoundError:
                if not create:
                    return None, parts[index:]
                try:
                    os.mkdir(part, 0o700 if last else PARENT_MODE, dir_fd=fd)
                except FileExistsError:
                    pass  # someone was faster: what is there now is opened and judged like anything else
                child = _open(part, fd, logical)
            os.close(fd)
            fd = child
            if not last:
                _check_parent(fd, logical, uid)
        return fd, []
    except BaseException:
        os.close(fd)
        raise


def describe(info):
    return {"state": "directory", "mode": "%04o" % stat.S_IMODE(info.st_mode), "uid": info.st_uid,
            "gid": info.st_gid}


def inspect(path, mode, uid, gid, root="/"):
    """``{before, changed, missing}``: what ``path`` is (``before``: ``state`` absent or directory, ``mode``,
    ``uid``, ``gid``) and whether :func:`ensure` would change it.  :class:`Refused` when it cannot be made
    safely (a link, a file, a component another account controls)."""
    fd, missing = _walk(path, root, uid, create=False)
    if fd is None:
        return {"before": {"state": "absent"}, "changed": True, "missing": ["/".join(missing)]}
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    _check_owner(info, path, uid)
    changed = stat.S_IMODE(info.st_mode) != mode or (info.st_uid, info.st_gid) != (uid, gid)
    return {"before": describe(info), "changed": changed, "missing": []}


def _check_owner(info, path, uid):
    if info.st_uid not in (0, uid):
        raise Refused("%s exists and is owned by uid %d, not by root nor the wanted owner: another account made "
                      "it (look at what it holds before you remove it)" % (path, info.st_uid))


def ensure(path, mode, uid, gid, root="/"):
    """Make ``path`` a directory with ``mode``, owned ``uid``:``gid`` (see the module's docstring); returns
    :func:`describe` of it after."""
    fd, _missing = _walk(path, root, uid, create=True)
    try:
        info = os.fstat(fd)
        _check_owner(info, path, uid)
        if (info.st_uid, info.st_gid) != (uid, gid):
            os.fchown(fd, uid, gid)
        if stat.S_IMODE(info.st_mode) != mode:
            os.fchmod(fd, mode)  # after fchown, which clears the sticky/set-id bits on some systems
        return describe(os.fstat(fd))
    finally:
        os.close(fd)
