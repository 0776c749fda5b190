# -*- coding: utf-8 -*-
"""Where a sysctl's value comes from: now (/proc/sys) and at the next boot.

Boot order, as systemd-sysctl(8) and sysctl.d(5) define it: every ``*.conf``
in the sysctl.d directories is collected; of files with the same basename
only the one in the directory listed first is used (/etc overrides /run,
/usr/local/lib and /usr/lib); a file in /etc that is a symlink to /dev/null
masks its namesake.  The survivors are applied in lexical order of their
basenames, so for one key the last file wins.  procps ``sysctl --system``
reads the same directories and applies /etc/sysctl.conf last; plain-file
entries in the search list (``*.conf`` paths that are not directories) are
therefore applied after all directory files, in the order given.

Every path here is a logical path (``/etc/sysctl.d/x.conf``) that is joined
to ``root`` only for file-system access, so tests run on a sandbox tree.
"""

from __future__ import annotations

import fnmatch
import os

from ansible.module_utils.preflight_files import write_atomic

DEFAULT_SYSCTL_DIRS = (
    "/etc/sysctl.d",
    "/run/sysctl.d",
    "/usr/local/lib/sysctl.d",
    "/usr/lib/sysctl.d",
    "/lib/sysctl.d",
    "/etc/sysctl.conf",
)

MANAGED_HEADER = (
    "# Managed by the cluster preflight (module sysctl_setting). This file holds only %s;\n"
    "# local edits are overwritten: change the preflight variables instead.\n"
)


def normalize_key(key):
    """``kernel/yama/ptrace_scope`` and ``kernel.yama.ptrace_scope`` are the
    same key; like sysctl.d(5), a key whose first separator is ``/`` has
    ``/`` and ``.`` swapped."""
    key = key.strip()
    slash, dot = key.find("/"), key.find(".")
    if slash != -1 and (dot == -1 or slash < dot):
        key = key.translate(str.maketrans("/.", "./"))
    return key


def proc_relpath(name):
    """``kernel.yama.ptrace_scope`` -> ``sys/kernel/yama/ptrace_scope``."""
    return "sys/" + normalize_key(name).replace(".", "/")


def normalize_value(value):
    """Values are compared word by word: /proc/sys separates fields with tabs."""
    return " ".join(str(value).split())


def rooted(root, path):
    """The file-system path of logical ``path`` under ``root``."""
    if not root or root == "/":
        return path
    return os.path.join(root, path.lstrip("/"))


def resolve(root, path, depth=0):
    """Follow a final-component symlink inside ``root`` (absolute targets are
    re-rooted).  Returns the logical target path."""
    full = rooted(root, path)
    if depth > 20 or not os.path.islink(full):
        return path
    target = os.readlink(full)
    if not target.startswith("/"):
        target = os.path.normpath(os.path.join(os.path.dirname(path), target))
    if target == "/dev/null":
        return target
    return resolve(root, target, depth + 1)


def read_text(root, path):
    """Text of a logical path, or ``None`` when it does not exist."""
    try:
        with open(rooted(root, path), "r", encoding="utf-8", errors="surrogateescape") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def read_runtime(root, proc_root, name):
    """``(logical_path, value or None)``; ``None`` when the kernel has no such key."""
    path = os.path.join(proc_root, proc_relpath(name))
    text = read_text(root, path)
    if text is None:
        return path, None
    return path, normalize_value(text)


def missing_reason(name, path):
    """Why a key is not applicable on this kernel, for the report."""
    key = normalize_key(name)
    if key.startswith("kernel.yama."):
        return "kernel has no Yama LSM: %s does not exist" % path
    return "kernel has no %s: %s does not exist" % (key, path)


def parse(text):
    """Assignments of a sysctl.d file: list of ``(lineno, key, value)``."""
    result = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if "=" not in line:
            continue
        key, value = line.split("=", 1)
        key = key.strip()
        if key.startswith("-"):
            key = key[1:].strip()  # "-key" only silences a failure to set it
        result.append((lineno, normalize_key(key), value.strip()))
    return result


def key_matches(file_key, name):
    """sysctl.d keys may be globs (``net.ipv4.conf.*.rp_filter``)."""
    name = normalize_key(name)
    if file_key == name:
        return True
    return any(char in file_key for char in "*?[") and fnmatch.fnmatchcase(name, file_key)


def boot_files(root, search, extra=None):
    """The sysctl files in the order they are applied at boot.

    ``search`` is the list of directories and plain files (see the module
    docstring).  ``extra`` is a logical path to include even if it does not
    exist yet (the drop-in about to be written).  Returns a list of dicts
    ``{path, target, shadowed_by}``; files shadowed by a namesake in an
    earlier directory are listed with ``shadowed_by`` set and are not applied.
    """
    by_name = {}
    shadowed = []
    plain = []
    for entry in search:
        full = rooted(root, entry)
        if entry.endswith(".conf") and not os.path.isdir(full):
            plain.append(entry)
            continue
        names = []
        if os.path.isdir(full):
            names = [name for name in os.listdir(full) if name.endswith(".conf")]
        if extra and os.path.dirname(extra) == entry.rstrip("/") and os.path.basename(extra) not in names:
            names.append(os.path.basename(extra))
        for name in names:
            path = os.path.join(entry, name)
            if name in by_name:
                shadowed.append({"path": path, "target": path, "shadowed_by": by_name[name]["path"]})
                continue
            by_name[name] = {"path": path, "target": resolve(root, path), "shadowed_by": None}
    ordered = [by_name[name] for name in sorted(by_name)]
    for path in plain:
        if os.path.exists(rooted(root, path)) or path == extra:
            ordered.append({"path": path, "target": resolve(root, path), "shadowed_by": None})
    return ordered, shadowed


def assignments(root, files, name, contents=None):
    """Every assignment of ``name`` in boot order: list of dicts
    ``{path, target, line, value, order}``.  ``contents`` overrides the text of
    logical paths (the drop-in as it would be after a change)."""
    contents = contents or {}
    found = []
    for order, entry in enumerate(files):
        if entry["target"] == "/dev/null":
            continue
        if entry["path"] in contents:
            text = contents[entry["path"]]
        else:
            text = read_text(root, entry["target"])
        if not text:
            continue
        for lineno, key, value in parse(text):
            if key_matches(key, name):
                found.append({"path": entry["path"], "target": entry["target"], "line": lineno,
                              "value": normalize_value(value), "order": order})
    return found


def render_dropin(name, value, comment=""):
    """The whole drop-in: managed header, optional comment lines, our key."""
    lines = [MANAGED_HEADER % normalize_key(name)]
    for line in str(comment or "").splitlines():
        lines.append(("# " + line.strip()).rstrip() + "\n")
    lines.append("%s = %s\n" % (normalize_key(name), value))
    return "".join(lines)


def dropin_value(text, name):
    """The value the drop-in text sets for ``name`` (last one), or ``None``."""
    value = None
    for _lineno, key, found in parse(text or ""):
        if key_matches(key, name):
            value = normalize_value(found)
    return value


def location(entry):
    """``/etc/sysctl.d/99-x.conf:3`` (and the symlink target when different)."""
    text = "%s:%d" % (entry["path"], entry["line"])
    if entry.get("target") and entry["target"] != entry["path"]:
        text += " (-> %s)" % entry["target"]
    return text


def write_dropin(module, path, text, backup=False, mode=0o644):
    """Write a drop-in atomically; returns the backup file name or ``None``."""
    return write_atomic(module, path, text, mode=mode, backup=backup)
