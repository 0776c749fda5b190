# -*- coding: utf-8 -*-
"""Whose a path is: whether a program is root's alone, and what keeps an account from running a file.

Root runs only root's binaries (docs/security.md): a program root runs (sshd for ``sshd -T``, py-spy, gdb) is a
regular file owned by root and writable by nobody else, reached through directories only root can change, and
lies under a system directory or the project's own tools (:func:`untrusted`).  Anything else could be swapped
by another account between two runs, so root leaves it alone and the caller reports the mismatch.

When an account cannot run the training Python, :func:`blocker` names the path component that stops it, found
the way the kernel resolves a path (path_resolution(7)): one component at a time, following symbolic links, each
directory needing search permission and the file execute permission.  Only metadata is read (``lstat``,
``readlink``): nothing here opens a file.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
import sys

# Where root's programs live; the project's own tools are added by :func:`allowed_prefixes`.
SYSTEM_DIRS = ("/usr/", "/bin/", "/sbin/", "/lib/", "/lib64/")
TOOLS_DIR = "/opt/preflight-tools/"
MAX_LINKS = 40
_ACL = "system.posix_acl_access"


def allowed_prefixes():
    """Directories root's programs may come from: the system's, the debug tools' venv (role debug_tools) and the
    venv this module runs in (the project's own, where Ansible's interpreter is the project's)."""
    prefixes = list(SYSTEM_DIRS) + [TOOLS_DIR]
    venv = own_venv()
    if venv:
        prefixes.append(os.path.join(os.path.realpath(venv), ""))
    return prefixes


def own_venv():
    """The venv of the interpreter running this code, or None: ``sys.prefix`` when ``site`` ran, else (``python -I
    -S``, as the srun engine's tasks run) the directory above ``sys.executable`` when it holds ``pyvenv.cfg``, as
    ``site`` would have found it."""
    if sys.prefix != getattr(sys, "base_prefix", sys.prefix):
        return sys.prefix
    above = os.path.dirname(os.path.dirname(sys.executable or ""))
    return above if above and os.path.isfile(os.path.join(above, "pyvenv.cfg")) else None


def resolve(path):
    """The steps of resolving ``path`` (absolute) one component at a time: ``(kind, path, lstat, extra)`` with kind
    ``dir`` (a directory searched on the way), ``link`` (a symbolic link followed; extra: its target), ``file``
    (the last component), or ``missing`` / ``notdir`` / ``loop`` (extra: why), which end the walk."""
    steps, current, todo, links = [], "/", [part for part in path.split("/") if part], 0
    if not path.startswith("/"):
        return [("missing", path, None, "not an absolute path")]
    while todo:
        name = todo.pop(0)
        if name == ".":
            continue
        if name == "..":
            current = os.path.dirname(current)
            continue
        steps.append(("dir", current, os.lstat(current), None))
        candidate = os.path.join(current, name)
        try:
            info = os.lstat(candidate)
        except OSError as exc:
            steps.append(("missing", candidate, None, exc.strerror or str(exc)))
            return steps
        if stat.S_ISLNK(info.st_mode):
            links += 1
            if links > MAX_LINKS:
                steps.append(("loop", candidate, info, "more than %d symbolic links" % MAX_LINKS))
                return steps
            target = os.readlink(candidate)
            steps.append(("link", candidate, info, target))
            if target.startswith("/"):
                current = "/"
            todo = [part for part in target.split("/") if part] + todo
            continue
        if todo and not stat.S_ISDIR(info.st_mode):
            steps.append(("notdir", candidate, info, "not a directory"))
            return steps
        if todo:
            current = candidate
        else:
            steps.append(("file", candidate, info, None))
            return steps
    steps.append(("file", current, os.lstat(current), None))
    return steps


def describe(path, info):
    """``/root (mode 0700, owner root, group root)``."""
    return "%s (mode %04o, owner %s, group %s)" % (path, stat.S_IMODE(info.st_mode), user_name(info.st_uid),
                                                 _group(info.st_gid))


def untrusted(path, prefixes=None, anywhere=False):
    """Why root must not run ``path`` ("" when it may): see the module's docstring.  ``anywhere``: judge only who
    can change it, wherever it lies (a program the operator named, the training Python of a root job user).

    A directory others can write is accepted only with the sticky bit and when the entry looked up in it is
    root's: then only root can rename or remove that entry (``/tmp/<root's directory>``)."""
    try:
        steps = resolve(str(path))
    except OSError as exc:
        return "%s cannot be examined: %s" % (path, exc.strerror or exc)
    for index, (kind, where, info, extra) in enumerate(steps):
        if kind in ("missing", "notdir", "loop"):
            return "%s: %s" % (where, extra)
        if kind == "link":
            continue
        if info.st_uid != 0:
            return "%s is owned by %s, not root" % (describe(where, info), user_name(info.st_uid))
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not _protected(info, steps[index + 1:]):
            return "%s is writable by %s" % (describe(where, info), "others" if info.st_mode & stat.S_IWOTH
                                             else "its group")
        if kind == "file":
            if not stat.S_ISREG(info.st_mode) or not info.st_mode & 0o111:
                return "%s is not an executable regular file" % where
            allowed = prefixes or allowed_prefixes()
            if not anywhere and not any(where.startswith(prefix) for prefix in allowed):
                return "%s is outside the system's directories (%s)" % (where, ", ".join(
                    prefix.rstrip("/") for prefix in allowed))
    return ""


def _protected(info, rest):
    """Whether a directory others can write still keeps its next entry (the first of ``rest``) root's alone."""
    return (stat.S_ISDIR(info.st_mode) and bool(info.st_mode & stat.S_ISVTX) and bool(rest)
            and rest[0][2] is not None and rest[0][2].st_uid == 0)


def account_ids(entry):
    """``(uid, {gids})`` of a pwd entry: its primary group and every group that lists it."""
    gids = {entry.pw_gid}
    try:
        gids.update(group.gr_gid for group in grp.getgrall() if entry.pw_name in group.gr_mem)
    except (KeyError, OSError):
        pass
    return entry.pw_uid, gids


def _allows(info, uid, gids, bits):
    """Whether the mode bits grant ``bits`` (an rwx mask for the owner class: 0o1 search/execute) to uid/gids."""
    if uid == 0:
        return not (bits & 0o1 and stat.S_ISREG(info.st_mode)) or bool(info.st_mode & 0o111)
    if info.st_uid == uid:
        return (info.st_mode >> 6) & bits == bits
    if info.st_gid in gids:
        return (info.st_mode >> 3) & bits == bits
    return info.st_mode & bits == bits


def _has_acl(path):
    try:
        return _ACL in os.listxattr(path, follow_symlinks=False)
    except OSError:
        return False


def blocker(path, entry):
    """``{path, found, links, kind}`` for the first component that keeps the account ``entry`` (a pwd entry) from
    running ``path``, or None when the mode bits let it through (a component with an ACL is given the benefit of
    the doubt: only mode bits are judged here).  ``links``: the symbolic links followed on the way; ``kind``:
    ``permission`` (this account is refused), or ``missing`` (no account could run it: not there, not a file)."""
    found = _blocker(path, entry)
    if found is not None:
        found.setdefault("kind", "missing")
    return found


def _blocker(path, entry):
    uid, gids = account_ids(entry)
    links = []
    try:
        steps = resolve(str(path))
    except OSError as exc:
        return {"path": str(path), "found": "%s cannot be examined: %s" % (path, exc.strerror or exc), "links": links}
    for kind, where, info, extra in steps:
        if kind == "link":
            links.append("%s -> %s" % (where, extra))
        elif kind in ("missing", "notdir", "loop"):
            return {"path": where, "found": "%s: %s" % (where, extra), "links": links}
        elif kind == "dir" and not _allows(info, uid, gids, 0o1) and not _has_acl(where):
            return {"path": where, "links": links, "kind": "permission", "found": "%s: %s cannot enter it (no "
                    "search permission)" % (describe(where, info), entry.pw_name)}
        elif kind == "file":
            if not stat.S_ISREG(info.st_mode):
                return {"path": where, "found": "%s is not a regular file" % where, "links": links}
            if not _allows(info, uid, gids, 0o1) and not _has_acl(where):
                return {"path": where, "links": links, "kind": "permission", "found": "%s: %s cannot execute it" % (
                    describe(where, info), entry.pw_name)}
    return None


def user_name(uid):
    """The account name of ``uid``, or ``uid N`` when it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "uid %d" % uid


def _group(gid):
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return "gid %d" % gid
