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
value, the drop-in, the boot order and every assignment of the key) and judged
by :func:`decide_setting` (pure: facts + desired value -> checks).  The audit
(capabilities ``kernel_debug`` and ``core_dumps``: ``module_utils/preflight_node/<name>.py`` reads,
``cluster_preflight/capabilities/<name>.py`` decides) and the bring-up writer
(``library/sysctl_setting.py``, which also uses :func:`plan_setting`) call
exactly these, so they can never disagree about a node.

This layer is generic: a key that needs more (extra facts, a description of
its value, its own fix, extra checks) gets it from the rules its own module
registers with :func:`register_rules`; ``kernel.core_pattern``'s are in
``module_utils/preflight_node/corepattern.py``, registered when that module is
imported (the core_dumps capability and the writer import it).
"""

from __future__ import annotations

import fnmatch
import os

from .checks import check, not_applicable, passed, warned
from .files import write_atomic

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


def write_dropin(module, path, text, backup=False, mode=0o644, logical=None, fix=None):
    """Write a drop-in atomically; returns the backup file name or ``None``.  A symlink at ``path``
    or a write the node refuses ends the task with found / expected / fix (``module_utils/preflight_node/files.py``)."""
    return write_atomic(module, path, text, mode=mode, backup=backup, logical=logical, fix=fix)


def dropin_link_fix(dropin):
    """The fix for a drop-in path that is a symlink.  systemd-sysctl reads links too, but a link there
    is someone else's: Debian's 99-sysctl.conf -> ../sysctl.conf, a mask to /dev/null."""
    return ("set dropin to a file of its own in %s, or remove the link if it is stale (rm %s); a link there is "
            "someone else's (on Debian 99-sysctl.conf links to /etc/sysctl.conf, which this module never "
            "rewrites; a link to /dev/null masks a file of that name on purpose)" % (os.path.dirname(dropin), dropin))


def _strerror(exc):
    return "%s" % (exc.strerror or exc) if isinstance(exc, OSError) else str(exc)


def _safe_text(text):
    """Text that survives JSON: bytes that are not UTF-8 become U+FFFD."""
    if text is None:
        return None
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def key_problem(key):
    """Why ``key`` is not a sysctl key (None when it is one)."""
    key = str(key or "").strip()
    if not key or any(char.isspace() for char in key) or "=" in key or key.startswith(("/", ".")):
        return "%r is not a sysctl key; expected something like kernel.yama.ptrace_scope" % key
    return None


def search_dirs(search):
    """The directories of a sysctl search list (plain ``*.conf`` entries left out)."""
    return [os.path.normpath(entry) for entry in search if not str(entry).endswith(".conf")]


def dropin_problem(dropin, search):
    """Why ``dropin`` would never be read at boot or is shared (None when it is fine)."""
    search = [os.path.normpath(str(entry)) for entry in search]
    directories = search_dirs(search)
    plain = [entry for entry in search if entry.endswith(".conf")]
    dropin = str(dropin or "")
    normalized = os.path.normpath(dropin) if dropin else ""
    if (not dropin.startswith("/") or not normalized.endswith(".conf") or normalized in plain
            or os.path.dirname(normalized) not in directories):
        return ("drop-in %s would never be read at boot or is a shared file: expected a *.conf file of its own "
                "in one of %s" % (dropin or "''", ", ".join(directories) or "the sysctl.d directories"))
    return None


def fix_command(key, value, dropin):
    """How to set ``key`` now and persist it, as one line for an operator."""
    return "sysctl -w %s='%s' and persist it as '%s = %s' in %s (the node bring-up does both)" % (
        key, value, key, value, dropin)


def describe_value(key, value):
    if value is None:
        return "unset"
    describe = _rule(key, "describe")
    return describe(value) if describe else value


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


def conflicts(facts, desired):
    """Assignments that would override the drop-in (holding ``desired``) at boot,
    and a namesake that shadows the drop-in itself."""
    key, dropin = facts["key"], facts["dropin"]
    desired = normalize_value(desired)
    found = []
    for entry in facts.get("shadowed") or []:
        if entry["path"] == dropin:
            found.append({"file": entry["shadowed_by"], "line": 0, "value": None, "target": entry["shadowed_by"],
                          "reason": "%s has the same basename in a directory read first, so %s is never read"
                                    % (entry["shadowed_by"], dropin)})
    order = next((index for index, entry in enumerate(facts.get("boot_files") or [])
                  if entry["path"] == dropin), None)
    if order is None:
        return found
    seen = {}
    for item in facts.get("assignments") or []:
        if item["path"] == dropin or item["order"] <= order:
            continue
        # The same file read twice (99-sysctl.conf -> ../sysctl.conf, then sysctl.conf) counts once.
        seen[(item["target"], item["line"])] = item
    for item in seen.values():
        if item["value"] != desired:
            found.append({"file": item["path"], "line": item["line"], "value": item["value"],
                          "target": item["target"],
                          "reason": "%s=%s in %s overrides %s at boot" % (
                              key, item["value"], location(item), os.path.basename(dropin))})
    return found


def effective(facts):
    """The assignment the next boot applies last: ``{value, file, line}`` or None."""
    found = facts.get("assignments") or []
    if not found:
        return None
    last = found[-1]
    return {"value": last["value"], "file": last["path"], "line": last["line"]}


def plan_setting(facts, desired, comment="", present=True, reload=True):
    """What the writer has to do: ``{dropin_after, write_file, set_runtime}``."""
    desired = normalize_value(desired)
    before = facts.get("dropin_text")
    after = render_dropin(facts["key"], desired, comment) if present else before
    return {
        "dropin_after": after,
        "write_file": bool(present and before != after),
        "set_runtime": bool(present and reload and facts.get("runtime") is not None
                            and facts["runtime"] != desired),
    }


def decide_setting(facts, desired, policy, check_name, reload=True):
    """Checks for one setting: ``<check_name>`` (running value),
    ``<check_name>_persisted`` (the drop-in), ``<check_name>_boot`` (what the
    next boot applies) and the checks the key's registered ``checks`` rule adds
    (for kernel.core_pattern: ``<check_name>_pid``).
    Only ``<check_name>`` (not_applicable) when the kernel has no such key.

    ``policy`` (warn/fail) is the status of a finding that means the desired
    value does not hold.  ``reload=False`` is the writer's choice to leave the
    running value alone: a running value that differs while the drop-in
    already holds the desired one is then a warning with ``sysctl -p``.
    """
    key, dropin = facts["key"], facts["dropin"]
    desired = normalize_value(desired)
    if facts.get("runtime") is None and not facts.get("runtime_error"):
        return {check_name: not_applicable(facts.get("missing_reason") or missing_reason(key, facts["runtime_path"]),
                                           "%s = %s" % (key, desired))}
    checks = {}
    fix = fix_command(key, desired, dropin)
    runtime = facts.get("runtime")
    if facts.get("runtime_error"):
        checks[check_name] = check(policy, facts["runtime_error"], desired,
                                   "read %s as root (preflight_become: true) or check how procfs is mounted"
                                   % facts["runtime_path"])
    elif runtime == desired:
        checks[check_name] = passed(describe_value(key, runtime), desired)
    elif not reload and facts.get("dropin_value") == desired:
        checks[check_name] = warned(
            "running %s (reload=false: the drop-in applies at the next boot)" % describe_value(key, runtime),
            desired, "sysctl -p %s" % dropin)
    else:
        own_fix = _rule(key, "runtime_fix")
        runtime_fix = (own_fix(runtime) if own_fix else None) or fix
        checks[check_name] = check(policy, "running %s" % describe_value(key, runtime), desired, runtime_fix)

    expected_persisted = "%s = %s in %s" % (key, desired, dropin)
    persisted = facts.get("dropin_value")
    if facts.get("dropin_error"):
        checks[check_name + "_persisted"] = check(policy, facts["dropin_error"], expected_persisted, fix)
    elif persisted == desired:
        checks[check_name + "_persisted"] = passed("%s sets %s" % (dropin, desired), expected_persisted)
    else:
        if persisted is not None:
            found = "%s sets %s" % (dropin, persisted)
        elif facts.get("dropin_text") is not None:
            found = "%s has no %s" % (dropin, key)
        else:
            found = "%s does not exist" % dropin
        checks[check_name + "_persisted"] = check(policy, found, expected_persisted, fix)

    checks[check_name + "_boot"] = _boot_check(facts, desired, policy, fix)
    more_checks = _rule(key, "checks")
    if more_checks:
        checks.update(more_checks(facts, desired, check_name))
    return checks


def _boot_check(facts, desired, policy, fix):
    key, dropin = facts["key"], facts["dropin"]
    expected = "%s = %s applied last at boot" % (key, desired)
    found_conflicts = conflicts(facts, desired)
    last = effective(facts)
    unreadable = facts.get("unreadable") or []
    if found_conflicts:
        return check(
            policy, "; ".join(item["reason"] for item in found_conflicts), expected,
            "remove or change %s in %s, or give %s a name that sorts after it" % (
                key, ", ".join("%s:%s" % (item["file"], item["line"]) for item in found_conflicts), dropin))
    if unreadable:
        return check(
            policy, "cannot tell what the next boot applies: %s" % "; ".join(
                "%s cannot be read (%s)" % (item["path"], item["error"]) for item in unreadable),
            expected, "make %s readable, or run the preflight as root (preflight_become: true)"
            % ", ".join(item["path"] for item in unreadable))
    if last is None:
        return check(policy, "no sysctl file sets %s: the kernel default applies at boot" % key, expected, fix)
    if last["value"] != desired:
        return check(policy, "%s from %s:%s at boot" % (describe_value(key, last["value"]), last["file"],
                                                        last["line"]), expected, fix)
    return passed("%s from %s:%s" % (last["value"], last["file"], last["line"]), expected)
