# -*- coding: utf-8 -*-
"""Atomic file writes shared by every module that edits a node's files."""

from __future__ import annotations

import os
import tempfile


def write_atomic(module, path, text, mode=0o644, backup=False):
    """Write ``text`` to ``path`` through a temp file in the same directory and
    ``module.atomic_move``, so a reader never sees half a file.

    Bytes that are not UTF-8 survive (surrogateescape), line endings are
    written as given, an existing file keeps its mode, a new one gets ``mode``.
    Returns the backup file name (``backup=True`` and the file existed) or None.
    """
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o755)
    backup_file = None
    if backup and os.path.exists(path):
        backup_file = module.backup_local(path)
    handle, temp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=directory)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(text.encode("utf-8", "surrogateescape"))
        os.chmod(temp, (os.stat(path).st_mode & 0o7777) if os.path.exists(path) else mode)
        module.atomic_move(temp, path, unsafe_writes=False)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
    return backup_file
