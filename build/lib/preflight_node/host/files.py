# -*- coding: utf-8 -*-
"""Atomic file writes shared by every module that edits a node's files.

Two things every writer gets from here, so none of them can forget them:

* A symlink where a file is to be written is refused, never written over (a rename would replace
  the link with a regular file, silently breaking a layout such as Debian's
  ``/etc/sysctl.d/99-sysctl.conf -> ../sysctl.conf``) nor through (the file it points to belongs to
  someone else: ``/etc/sysctl.conf``, a mask to ``/dev/null``, a file on a shared mount).  Every
  writer here owns a file of its own or edits a file in place, and no OS layout we know links
  either, so there is no opt-in: the fix is to point the module at a regular file.  Writers call
  :func:`refuse_symlinks` while deciding, before anything is written (in check mode too, since the
  real run would fail), and :func:`write_atomic` checks again as it writes.
* A write that the node refuses (read-only ``/etc``, no permission, a full disk, an immutable
  file) ends the task with ``fail_json`` saying found / expected / fix, the node and the path,
  never a traceback.
"""

from __future__ import annotations

import errno
import os
import tempfile


# The options both drop-in writers (library/sysctl_setting.py, library/limits_dropin.py) share: where the node
# is, whether to keep a backup, what to do with drift found in audit, the check's name and the header comment.
DROPIN_OPTIONS = dict(
    root=dict(type="path", default="/"),
    backup=dict(type="bool", default=False),
    policy=dict(type="str", default="fail", choices=["warn", "fail"]),
    check_name=dict(type="str"),
    comment=dict(type="str", default=""),
)

def node_name():
    return os.uname().nodename


def symlink_problem(full, logical=None, fix=None):
    """``{found, expected, fix, link, target}`` when ``full`` (the file-system path; ``logical`` is
    the one to report) is a symlink, else None."""
    if not os.path.islink(full):
        return None
    logical = logical or full
    target = os.readlink(full)
    resolved = os.path.normpath(os.path.join(os.path.dirname(logical), target))
    if target == "/dev/null":
        what = "a mask (a link to /dev/null)"
    elif not os.path.exists(full):
        what = "a dangling symlink to %s" % target
    else:
        what = "a symlink to %s (%s)" % (target, resolved)
    return {
        "found": "%s on %s is %s" % (logical, node_name(), what),
        "expected": "%s a regular file or absent: it is written whole (a temp file renamed over it), which would "
                    "replace the link, and followed the link would overwrite %s, which this module does not own"
                    % (logical, resolved),
        "fix": fix or ("if the link is stale, remove it (rm %s) and re-run; otherwise point the module at a "
                       "file of its own and leave %s as it is" % (logical, logical)),
        "link": logical,
        "target": target,
    }


def refuse_symlinks(module, paths, fix=None, **result):
    """``fail_json`` naming the first of ``paths`` (``(full, logical)`` pairs) that is a symlink;
    ``changed`` is false unless ``result`` says what was already written."""
    result.setdefault("changed", False)
    for full, logical in paths:
        problem = symlink_problem(full, logical, fix)
        if problem:
            module.fail_json(msg="Refusing to write through or over a symlink. Found: %s. Expected: %s. Fix: %s."
                                 % (problem["found"], problem["expected"], problem["fix"]),
                             found=problem["found"], expected=problem["expected"], fix=problem["fix"],
                             link=problem["link"], link_target=problem["target"], **result)


def _errno_of(exc):
    """The errno of ``exc`` or of the OSError it was raised from (``atomic_move`` and
    ``backup_local`` wrap theirs in a plain Exception)."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno:
            return exc.errno, exc.strerror or str(exc)
        exc = exc.__cause__ or exc.__context__
    return None, None


def write_problem(exc, logical, action="write"):
    """``{found, expected, fix}`` for a write of ``logical`` that raised ``exc``."""
    code, reason = _errno_of(exc)
    node = node_name()
    directory = os.path.dirname(logical) or "."
    found = "cannot %s %s on %s: %s" % (action, logical, node, reason or exc)
    expected = "%s writable by the bring-up" % directory
    if code == errno.EROFS:
        fix = ("the file system holding %s is read-only on %s (an image-based or read-only root): put the file "
               "into the image that provides it, or give %s a writable overlay, then re-run" % (directory, node,
                                                                                               directory))
    elif code in (errno.EACCES, errno.EPERM):
        fix = ("run the bring-up as root (preflight_become: true); if it already does, look for an immutable "
               "attribute (lsattr -d %s %s; chattr -i) or a security policy denying the write" % (directory,
                                                                                                 logical))
    elif code in (errno.ENOSPC, errno.EDQUOT):
        fix = "free space on the file system holding %s on %s, then re-run" % (directory, node)
    else:
        fix = "fix what the error names for %s on %s, then re-run" % (logical, node)
    return {"found": found, "expected": expected, "fix": fix}


def fail_write(module, exc, logical, action="write", **result):
    """``fail_json`` for a write that raised ``exc``; ``changed`` as in :func:`refuse_symlinks`."""
    result.setdefault("changed", False)
    problem = write_problem(exc, logical, action)
    module.fail_json(msg="Found: %s. Expected: %s. Fix: %s." % (problem["found"], problem["expected"],
                                                                 problem["fix"]),
                     found=problem["found"], expected=problem["expected"], fix=problem["fix"], path=logical,
                     **result)


def write_atomic(module, path, text, mode=0o644, backup=False, logical=None, fix=None, result=None):
    """Write ``text`` to ``path`` through a temp file in the same directory and
    ``module.atomic_move``, so a reader never sees half a file.

    Bytes that are not UTF-8 survive (surrogateescape), line endings are
    written as given, an existing file keeps its mode, a new one gets exactly
    ``mode`` whatever the umask.  ``logical`` is the path to report (``path``
    under a test root), ``fix`` the symlink fix of the caller, ``result`` what
    a failure returns besides found / expected / fix.  A symlink at ``path``
    and a write the node refuses end the task (see the module docstring).
    Returns the backup file name (``backup=True`` and the file existed) or None.
    """
    logical = logical or path
    result = dict(result or {})
    refuse_symlinks(module, [(path, logical)], fix, **result)
    directory = os.path.dirname(path) or "."
    temp = None
    try:
        if not os.path.isdir(directory):
            os.makedirs(directory, 0o755)
        backup_file = None
        existed = os.path.exists(path)
        if backup and existed:
            backup_file = module.backup_local(path)
        handle, temp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=directory)
        with os.fdopen(handle, "wb") as stream:
            stream.write(text.encode("utf-8", "surrogateescape"))
        os.chmod(temp, (os.stat(path).st_mode & 0o7777) if existed else mode)
        # atomic_move gives a file it creates 0666 minus the umask; a tight umask meanwhile means the
        # file is never more open than 0600 before it gets its mode.
        umask = os.umask(0o077)
        try:
            module.atomic_move(temp, path, unsafe_writes=False)
        finally:
            os.umask(umask)
        if not existed:
            os.chmod(path, mode)
    except Exception as exc:  # pylint: disable=broad-except  # atomic_move raises plain Exceptions
        fail_write(module, exc, logical, **result)
    finally:
        if temp and os.path.exists(temp):
            os.unlink(temp)
    return backup_file
