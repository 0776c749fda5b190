# -*- coding: utf-8 -*-
"""Read the grub defaults files (``/etc/default/grub`` and its drop-ins) and the running kernel's command
line; node layer, the reading half.

:func:`read_files` and :func:`read_cmdline` are all the iommu reader
(``module_utils/preflight_node/capabilities/iommu.py``)
ships.  The edit the bring-up writer (``library/grub_cmdline.py``) makes is planned by
``module_utils/preflight_node/grub/plan.py`` (evaluating the files with
``module_utils/preflight_node/grub/shell.py``) and judged by ``module_utils/preflight_node/grub/checks.py``.
"""

from __future__ import annotations

import os


def rooted(root, path):
    """The file-system path of logical ``path`` under ``root`` (tests use a sandbox root)."""
    if not root or root == "/":
        return path
    return os.path.join(root, path.lstrip("/"))


def read_text(path, errors="surrogateescape"):
    """The file's text, or None if it does not exist; other errors raise.

    The writer keeps foreign bytes (surrogateescape); the reader, whose text
    travels as JSON, replaces them.
    """
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("utf-8", errors)
    except FileNotFoundError:
        return None


def read_files(grub_default, dropin_dir, errors="surrogateescape"):
    """The grub defaults file and every ``*.cfg`` drop-in, as a JSON-safe dict.

    ``{grub_default, dropin_dir, dropin_dir_exists, dropins, texts, errors}``:
    ``dropins`` in the order grub-mkconfig sources them, ``texts`` maps each
    path to its text (None: absent), ``errors`` a path that could not be read
    to why.  Nothing raises for a node that lacks the files.
    """
    snapshot = {"grub_default": grub_default, "dropin_dir": dropin_dir,
                "dropin_dir_exists": os.path.isdir(dropin_dir), "dropins": [], "texts": {}, "errors": {}}
    if snapshot["dropin_dir_exists"]:
        try:
            names = os.listdir(dropin_dir)
        except OSError as exc:
            snapshot["errors"][dropin_dir] = str(exc)
            names = []
        snapshot["dropins"] = sorted(os.path.join(dropin_dir, name) for name in names
                                     if name.endswith(".cfg") and os.path.isfile(os.path.join(dropin_dir, name)))
    for path in [grub_default] + snapshot["dropins"]:
        try:
            snapshot["texts"][path] = read_text(path, errors)
        except (OSError, ValueError) as exc:
            snapshot["texts"][path] = None
            snapshot["errors"][path] = str(exc)
    return snapshot


def read_cmdline(path):
    """``{path, text, error}`` of the running kernel's command line; never raises."""
    try:
        with open(path, "rb") as handle:
            return {"path": path, "text": handle.read().decode("utf-8", "replace"), "error": None}
    except (OSError, ValueError) as exc:
        return {"path": path, "text": None, "error": str(exc)}
