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

One setting is read by :func:`read_setting` (JSON-safe facts: the running
value, the drop-in, the boot order and every assignment of the key); this
file is the reading half only, so a node's facts call ships nothing else.
It is judged by ``decide_setting`` and planned by ``plan_setting`` in
``module_utils/preflight_node/sysctl/write.py``.  The audit (capabilities
``kernel_debug`` and ``core_dumps``: ``module_utils/preflight_node/<name>.py``
reads, ``cluster_preflight/capabilities/<name>.py`` decides) and the bring-up
writer (``library/sysctl_setting.py``) call exactly these, so they can never
disagree about a node.

This layer is generic: a key that needs more (extra facts, a description of
its value, its own fix, extra checks) gets it from the rules its own module
registers with :func:`register_rules`; ``kernel.core_pattern``'s are in
``module_utils/preflight_node/cores/pattern.py``, registered when that module is
imported (the writer sysctl_setting and the controller import it; the core_dumps
reader reads core_uses_pid itself).
"""

from __future__ import annotations

import fnmatch
import os


CORE_PATTERN = "kernel.core_pattern"
PTRACE_SCOPE = "kernel.yama.ptrace_scope"

DEFAULT_SYSCTL_DIRS = (
    "/etc/sysctl.d",
    "/run/sysctl.d",
    "/usr/local/lib/sysctl.d",
    "/usr/lib/sysctl.d",
    "/lib/sysctl.d",
    "/etc/sysctl.conf",
)

# key -> the rules its own module registered (see :func:`register_rules`).
_KEY_RULES = {}


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


def register_rules(key, rules):
    """What ``key`` adds to the generic treatment, a dict of optional callables: ``read(root, proc_root)``
    -> extra facts merged into :func:`read_setting`'s; ``describe(value)`` -> the value as the report
    shows it; ``runtime_fix(value)`` -> the fix for a running value that differs, or None for the
    generic one; ``checks(facts, desired, check_name)`` -> extra checks after :func:`decide_setting`'s."""
    _KEY_RULES[normalize_key(key)] = dict(rules)


def _rule(key, name):
    """The callable ``name`` registered for ``key``, or None."""
    return (_KEY_RULES.get(normalize_key(key)) or {}).get(name)


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


def boot_files(root, search, extra=None, errors=None):
    """The sysctl files in the order they are applied at boot.

    ``search`` is the list of directories and plain files (see the module
    docstring).  ``extra`` is a logical path to include even if it does not
    exist yet (the drop-in about to be written).  Returns a list of dicts
    ``{path, target, shadowed_by}``; files shadowed by a namesake in an
    earlier directory are listed with ``shadowed_by`` set and are not applied.
    A directory that cannot be listed is appended to ``errors`` (a list of
    ``{path, error}``) when given, and raises otherwise.
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
            try:
                names = [name for name in os.listdir(full) if name.endswith(".conf")]
            except OSError as exc:
                if errors is None:
                    raise
                errors.append({"path": entry, "error": _strerror(exc)})
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


def assignments(root, files, name, contents=None, errors=None):
    """Every assignment of ``name`` in boot order: list of dicts
    ``{path, target, line, value, order}``.  ``contents`` overrides the text of
    logical paths (the drop-in as it would be after a change).  A file that
    cannot be read is appended to ``errors`` when given, and raises otherwise."""
    contents = contents or {}
    found = []
    for order, entry in enumerate(files):
        if entry["target"] == "/dev/null":
            continue
        if entry["path"] in contents:
            text = contents[entry["path"]]
        else:
            try:
                text = read_text(root, entry["target"])
            except OSError as exc:
                if errors is None:
                    raise
                errors.append({"path": entry["path"], "error": _strerror(exc)})
                continue
        if not text:
            continue
        for lineno, key, value in parse(text):
            if key_matches(key, name):
                found.append({"path": entry["path"], "target": entry["target"], "line": lineno,
                              "value": normalize_value(value), "order": order})
    return found


def dropin_value(text, name):
    """The value the drop-in text sets for ``name`` (last one), or ``None``."""
    value = None
    for _lineno, key, found in parse(text or ""):
        if key_matches(key, name):
            value = normalize_value(found)
    return value


def _strerror(exc):
    return "%s" % (exc.strerror or exc) if isinstance(exc, OSError) else str(exc)


def _safe_text(text):
    """Text that survives JSON: bytes that are not UTF-8 become U+FFFD."""
    if text is None:
        return None
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def read_setting(root, proc_root, key, dropin, search=DEFAULT_SYSCTL_DIRS):
    """Everything about one sysctl on this node, as JSON-safe facts.

    ``{key, dropin, runtime_path, runtime, missing_reason, runtime_error,
    dropin_text, dropin_value, dropin_error, boot_files, shadowed,
    assignments, unreadable}`` and what the key's registered ``read`` rule adds
    (for kernel.core_pattern: ``core_uses_pid``).
    ``runtime`` is None when the kernel has no such key (``missing_reason``
    says why) or when it cannot be read (``runtime_error``).  ``boot_files``
    lists the files applied at boot in order (the drop-in included even when
    it does not exist yet), ``assignments`` every assignment of the key in
    them as they are on disk, ``unreadable`` the files and directories that
    could not be read.  Nothing here raises for what a node may lack.
    """
    key = normalize_key(key)
    dropin = os.path.normpath(dropin)
    search = [os.path.normpath(entry) for entry in search]
    runtime_path = os.path.join(proc_root, proc_relpath(key))
    facts = {"key": key, "dropin": dropin, "runtime_path": runtime_path, "runtime": None,
             "missing_reason": None, "runtime_error": None, "dropin_text": None, "dropin_value": None,
             "dropin_error": None}
    try:
        text = read_text(root, runtime_path)
        if text is None:
            facts["missing_reason"] = missing_reason(key, runtime_path)
        else:
            facts["runtime"] = normalize_value(text)
    except OSError as exc:
        facts["runtime_error"] = "%s cannot be read: %s" % (runtime_path, _strerror(exc))
    try:
        text = read_text(root, dropin)
        facts["dropin_text"] = _safe_text(text)
        facts["dropin_value"] = dropin_value(text, key)
    except OSError as exc:
        facts["dropin_error"] = "%s cannot be read: %s" % (dropin, _strerror(exc))
    unreadable = []
    files, shadowed = boot_files(root, search, extra=dropin, errors=unreadable)
    found = assignments(root, files, key, errors=unreadable)
    facts.update(boot_files=files, shadowed=shadowed, assignments=found, unreadable=unreadable)
    read_more = _rule(key, "read")
    if read_more:
        facts.update(read_more(root, proc_root))
    return facts
