# -*- coding: utf-8 -*-
"""Planning, judging and writing one sysctl (node layer, ``module_utils/preflight_node/sysctl/write.py``).

The facts come from :func:`read_setting` in ``module_utils/preflight_node/sysctl/values.py`` (the reader, which
is all a node's facts call ships).  Here: validating a key and a drop-in path, :func:`plan_setting` (what
the bring-up writer ``library/sysctl_setting.py`` does), :func:`decide_setting` (facts + desired value
-> checks; used by the writer and by the deciders ``cluster_preflight/capabilities/kernel_debug/`` and
``cluster_preflight/capabilities/core_dumps/``) and :func:`write_dropin`.  A key's own describe /
runtime_fix / checks rules are the ones registered with ``sysctl.register_rules`` (kernel.core_pattern's
in ``module_utils/preflight_node/cores/pattern.py``).
"""

from __future__ import annotations

import os

from ..checks import check, not_applicable, passed, warned
from ..host.files import write_atomic
from .values import _rule, missing_reason, normalize_key, normalize_value


MANAGED_HEADER = (
    "# Managed by the cluster preflight (module sysctl_setting). This file holds only %s;\n"
    "# local edits are overwritten: change the preflight variables instead.\n"
)


def render_dropin(name, value, comment=""):
    """The whole drop-in: managed header, optional comment lines, our key."""
    lines = [MANAGED_HEADER % normalize_key(name)]
    for line in str(comment or "").splitlines():
        lines.append(("# " + line.strip()).rstrip() + "\n")
    lines.append("%s = %s\n" % (normalize_key(name), value))
    return "".join(lines)


def location(entry):
    """``/etc/sysctl.d/99-x.conf:3`` (and the symlink target when different)."""
    text = "%s:%d" % (entry["path"], entry["line"])
    if entry.get("target") and entry["target"] != entry["path"]:
        text += " (-> %s)" % entry["target"]
    return text


def write_dropin(module, path, text, backup=False, mode=0o644, logical=None, fix=None):
    """Write a drop-in atomically; returns the backup file name or ``None``.  A symlink at ``path``
    or a write the node refuses ends the task with found / expected / fix
    (``module_utils/preflight_node/host/files.py``)."""
    return write_atomic(module, path, text, mode=mode, backup=backup, logical=logical, fix=fix)


def dropin_link_fix(dropin):
    """The fix for a drop-in path that is a symlink.  systemd-sysctl reads links too, but a link there
    is someone else's: Debian's 99-sysctl.conf -> ../sysctl.conf, a mask to /dev/null."""
    return ("set dropin to a file of its own in %s, or remove the link if it is stale (rm %s); a link there is "
            "someone else's (on Debian 99-sysctl.conf links to /etc/sysctl.conf, which this module never "
            "rewrites; a link to /dev/null masks a file of that name on purpose)" % (os.path.dirname(dropin), dropin))


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
