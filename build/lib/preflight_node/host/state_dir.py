# -*- coding: utf-8 -*-
"""Where root keeps state on a node: directories only its own account can change, or nothing at all.

Root trusts what it reads back from its state (a lease says which run holds the node, a verdict lets a prolog
skip its checks) and runs Ansible in it (inventory, local temp).  A directory another account created first,
or may write, or can swap through a parent it may write, hands that account those decisions.  So before any
use, at every start, :func:`private_dir` checks the directory with ``lstat`` (never following a link):

* the directory itself: a real directory (not a link), owned by the effective uid, writable by no group and no
  other account; when it does not exist it is created (mode 0700) and checked the same way;
* every directory above it (symbolic links in the path above are resolved first, then each real directory is
  checked): owned by root or the effective uid, and writable by no group or other account unless sticky
  (``/tmp``: others may add entries there, never rename or remove ours).

A directory that fails is refused with :class:`UnsafeState` (one line: what was found, what is expected, how
to fix it) and is never used: nothing is read from or written to it.  :func:`trusted_file` applies the parents'
rule to a configuration file root reads (a file others may write chooses what root runs).
"""

from __future__ import annotations

import os
import pwd
import stat


class UnsafeState(ValueError):
    """A state path root must not use; the message is one line (found, expected, fix)."""


def _owner(uid):
    try:
        return "%s (uid %d)" % (pwd.getpwuid(uid).pw_name, uid)
    except KeyError:
        return "uid %d" % uid


def _writable_by_others(mode):
    return bool(mode & (stat.S_IWGRP | stat.S_IWOTH))


def _entry_problem(path, info, regular, owners, sticky_ok=False, where=""):
    """Why the entry ``path`` (its ``lstat``/``stat`` result ``info``) may be changed by an account outside
    ``owners`` (uids), or is not the kind expected (``regular`` file, else directory), or ""."""
    if not (stat.S_ISREG(info.st_mode) if regular else stat.S_ISDIR(info.st_mode)):
        return "%s is not a %s" % (path, "regular file" if regular else "directory")
    if info.st_uid not in owners:
        return "%s%s is owned by %s, not by %s" % (path, where, _owner(info.st_uid),
                                                   " or ".join(_owner(uid) for uid in owners))
    if _writable_by_others(info.st_mode) and not (sticky_ok and info.st_mode & stat.S_ISVTX):
        return "%s%s is writable by other accounts (mode %04o%s)" % (
            path, where, stat.S_IMODE(info.st_mode), ", not sticky" if sticky_ok else "")
    return ""


def _parent_problem(path, euid):
    """Why a directory above the state path lets another account swap what lies below it, or ""."""
    try:
        real = os.path.realpath(path)
    except OSError as exc:
        return "%s cannot be resolved: %s" % (path, exc.strerror or exc)
    parts = [part for part in real.split(os.sep) if part]
    current = os.sep
    for part in [""] + parts:
        current = os.path.join(current, part) if part else current
        try:
            info = os.lstat(current)
        except OSError as exc:
            return "%s cannot be checked: %s" % (current, exc.strerror or exc)
        problem = _entry_problem(current, info, False, sorted({0, euid}), sticky_ok=True, where=", above it,")
        if problem:
            return problem
    return ""


def dir_problem(path, euid=None):
    """Why ``path`` (which exists) is not a directory of the effective uid's alone, or ""."""
    euid = os.geteuid() if euid is None else euid
    try:
        info = os.lstat(path)
    except OSError as exc:
        return "%s cannot be checked: %s" % (path, exc.strerror or exc)
    if stat.S_ISLNK(info.st_mode):
        return "%s is a symbolic link (to %s)" % (path, os.readlink(path))
    return _entry_problem(path, info, False, [euid]) or _parent_problem(os.path.dirname(os.path.abspath(path)),
                                                                         euid)


def private_dir(path, fix, euid=None):
    """``path``, once it is a directory of the effective uid's alone (created 0700 when missing, its parent
    must exist); else :class:`UnsafeState` whose message ends with `` -- fix: `` and ``fix``."""
    euid = os.geteuid() if euid is None else euid
    path = os.path.abspath(path)
    problem = _parent_problem(os.path.dirname(path), euid)
    if not problem:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            problem = "%s cannot be created: %s" % (path, exc.strerror or exc)
    problem = problem or dir_problem(path, euid)
    if problem:
        raise UnsafeState("%s: refused, nothing read or written there -- fix: %s" % (problem, fix))
    return path


def trusted_file(path, euid=None):
    """Why root must not read the configuration file ``path`` (another account may write it, or a directory
    above it), or "".  A file that does not exist is "" (the caller decides what that means)."""
    euid = os.geteuid() if euid is None else euid
    real = os.path.realpath(path)
    try:
        info = os.stat(real)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        return "%s cannot be checked: %s" % (path, exc.strerror or exc)
    return _entry_problem(path, info, True, sorted({0, euid})) or _parent_problem(os.path.dirname(real), euid)
