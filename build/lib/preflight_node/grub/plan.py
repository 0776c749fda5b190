# -*- coding: utf-8 -*-
"""Planning an edit of the grub defaults (node layer, ``module_utils/preflight_node/grub/plan.py``).

The files are read by ``module_utils/preflight_node/grub/defaults.py`` (:func:`read_files`, :func:`read_cmdline`:
all the iommu reader ships) and evaluated the way grub-mkconfig sources them by
``module_utils/preflight_node/grub/shell.py``; :func:`plan` here works out the edits that give the wanted
kernel arguments without touching anything.  Edits touch only the value of the assignment being changed:
the quote style, the other arguments, a trailing comment and every other byte of the file stay as they
were.  The checks judging a plan are in ``module_utils/preflight_node/grub/checks.py``.  The writer
(``library/grub_cmdline.py``) and the iommu decider (``cluster_preflight/capabilities/iommu/``) share
all of them, so an audit reports exactly what bring-up would change.
"""

from __future__ import annotations

import os
import re

from .shell import GrubFiles, ShellParseError, contributing


CMDLINE_VARIABLES = ("GRUB_CMDLINE_LINUX", "GRUB_CMDLINE_LINUX_DEFAULT")
# A kernel argument this module writes must survive every quote style as is.
_SAFE_ARG_RE = re.compile(r"^[^\s'\"\\$`#;&|<>()]+$")


def split_args(value):
    return value.split()


def arg_key(arg):
    return arg.split("=", 1)[0]


def matches_absent(arg, absent):
    """True if kernel argument ``arg`` is one that ``absent`` names.

    An entry with ``=`` names that exact argument; an entry without names
    every argument with that key (``amd_iommu`` matches ``amd_iommu=off``).
    """
    for entry in absent:
        if "=" in entry:
            if arg == entry:
                return True
        elif arg == entry or arg_key(arg) == entry:
            return True
    return False


def is_safe_arg(arg):
    return bool(_SAFE_ARG_RE.match(arg))


def _tokens(raw):
    return [(m.start(), m.end(), m.group(0)) for m in re.finditer(r"\s+|\S+", raw)]


def _literal(token, kind):
    if kind == "single":
        return True
    return not any(char in token for char in "$`\\")


def remove_args(text, assignment, absent):
    """New value text of ``assignment`` without the literal args ``absent`` names.

    Returns ``(new_value_raw, removed)``; only whole, literal arguments are
    removed (one built from ``$VAR`` or glued to a neighbouring quote is left
    for the caller to report).
    """
    segments = assignment.segments
    raws = [text[seg.start:seg.end] for seg in segments]
    removed = []
    new_raws = []
    for index, (seg, raw) in enumerate(zip(segments, raws)):
        parts = _tokens(raw)
        keep = [True] * len(parts)
        for pos, (start, end, token) in enumerate(parts):
            if token.isspace() or not _literal(token, seg.kind) or not matches_absent(token, absent):
                continue
            glued_left = start == 0 and index > 0 and raws[index - 1] and not raws[index - 1][-1].isspace()
            glued_right = (end == len(raw) and index + 1 < len(raws) and raws[index + 1]
                           and not raws[index + 1][0].isspace())
            if glued_left or glued_right:
                continue
            keep[pos] = False
            removed.append(token)
            # Take one neighbouring run of blanks with the argument.
            if pos > 0 and keep[pos - 1] and parts[pos - 1][2].isspace():
                keep[pos - 1] = False
            elif pos + 1 < len(parts) and parts[pos + 1][2].isspace():
                keep[pos + 1] = False
        new_raws.append("".join(part[2] for part, kept in zip(parts, keep) if kept))
    return _render(segments, new_raws), removed


def _render(segments, raws):
    out = []
    for seg, raw in zip(segments, raws):
        if seg.kind == "single":
            out.append("'%s'" % raw)
        elif seg.kind == "double":
            out.append('"%s"' % raw)
        else:
            out.append(raw)
    return "".join(out)


def append_args(text, assignment, args):
    """New value text of ``assignment`` with ``args`` appended, quote style kept."""
    segments = assignment.segments
    raws = [text[seg.start:seg.end] for seg in segments]
    addition = " ".join(args)
    joined = "".join(raws)
    if not segments:
        return '"%s"' % addition
    last = segments[-1]
    if last.kind in ("single", "double"):
        separator = " " if joined and not joined[-1].isspace() else ""
        raws[-1] = raws[-1] + separator + addition
        return _render(segments, raws)
    if len(segments) == 1 and "\\" not in joined:
        # A bare word such as GRUB_CMDLINE_LINUX=quiet: quoting it keeps its value.
        return '"%s %s"' % (joined, addition)
    return _render(segments, raws) + '" %s"' % addition


def replace_value(text, assignment, new_value):
    return text[:assignment.value_start] + new_value + text[assignment.value_end:]


def new_assignment(text, name, args):
    """``text`` with ``name="args"`` appended on a line of its own."""
    prefix = "" if not text or text.endswith("\n") else "\n"
    return text + prefix + '%s="%s"\n' % (name, " ".join(args))


def dropin_text(variable, args, header):
    """A drop-in that appends ``args`` to ``variable`` when sourced."""
    lines = ["# %s" % line for line in header]
    lines.append('%s="$%s %s"' % (variable, variable, " ".join(args)))
    return "\n".join(lines) + "\n"


def parse_proc_cmdline(text):
    return text.split()


DROPIN_HEADER = (
    "Managed by Ansible (grub_cmdline module of the cluster preflight); rewritten whole on every run.",
    "grub-mkconfig sources this file after /etc/default/grub.",
)
# How grub.cfg is regenerated, by distribution family (first found wins).
AUTO_UPDATE_COMMANDS = (
    ("update-grub", []),
    ("grub2-mkconfig", ["-o", "/boot/grub2/grub.cfg"]),
    ("grub-mkconfig", ["-o", "/boot/grub/grub.cfg"]),
)


def wanted_args(args, absent=(), variable="GRUB_CMDLINE_LINUX_DEFAULT", absent_variables=CMDLINE_VARIABLES,
                dropin_name="90-preflight-cmdline.cfg", grub_default="/etc/default/grub"):
    """What the grub defaults should carry; ``grub_default`` is the path named in fix texts."""
    return {"args": list(args), "absent": list(absent), "variable": variable,
            "absent_variables": list(absent_variables), "dropin_name": dropin_name, "grub_default": grub_default}


def argument_problems(wanted):
    """Why ``wanted`` cannot be written safely, as ``(found, expected, fix)`` triples."""
    problems = []
    for arg in wanted["args"] + wanted["absent"]:
        if not is_safe_arg(arg):
            problems.append((
                "kernel argument %r is not allowed: it must not contain blanks, quotes, '$', backslashes or "
                "shell operators" % arg, "one kernel argument per list entry, such as iommu=soft",
                "split it into separate entries or drop the characters named"))
    clashes = [arg for arg in wanted["args"] if matches_absent(arg, wanted["absent"])]
    if clashes:
        problems.append((
            "absent names %s, which args asks to add" % ", ".join(clashes),
            "no argument both wanted and unwanted", "drop it from one of the two"))
    name = wanted["dropin_name"]
    if "/" in name or not name.endswith(".cfg") or name == ".cfg":
        problems.append((
            "dropin_name %r must be a file name ending in .cfg (grub-mkconfig sources only *.cfg from the drop-in "
            "directory)" % name, "a file name such as 90-preflight-iommu.cfg", "rename it to end in .cfg"))
    return problems


def resolve_mode(mode, snapshot):
    """``auto`` -> ``dropin`` when the drop-in directory exists, else ``inplace``."""
    if mode == "auto":
        return "dropin" if snapshot["dropin_dir_exists"] else "inplace"
    return mode


def effective_of(env):
    return dict((name, split_args(env.get(name, ""))) for name in CMDLINE_VARIABLES)


def plan(snapshot, wanted, mode):
    """Work out the new contents of every file for ``wanted`` in ``mode``; touches nothing.

    Returns ``{state, ...}``: ``state`` is ``no_grub`` (no grub defaults to edit), ``unreadable``
    (``error``, ``path``), ``parse_error`` (``error``: a ShellParseError) or ``planned`` with
    ``original``, ``files``, ``changed_paths``, ``effective``, ``added``, ``removed``, ``notes``,
    ``assignments``, ``findings_before`` and ``findings_after`` (empty when converged).
    """
    mode = resolve_mode(mode, snapshot)
    grub_default = snapshot["grub_default"]
    dropin_dir = snapshot["dropin_dir"]
    dropin_path = os.path.join(dropin_dir, wanted["dropin_name"])
    base = {"mode": mode, "dropin_path": dropin_path}
    if snapshot["errors"]:
        path = sorted(snapshot["errors"])[0]
        return dict(base, state="unreadable", path=path, error=snapshot["errors"][path])
    if snapshot["texts"].get(grub_default) is None and not (mode == "dropin" and snapshot["dropin_dir_exists"]):
        return dict(base, state="no_grub")
    order = [grub_default]
    dropins = list(snapshot["dropins"])
    if mode == "dropin" and dropin_path not in dropins:
        dropins.append(dropin_path)
    order.extend(sorted(dropins))
    original = dict((path, snapshot["texts"].get(path)) for path in order)
    files = GrubFiles(order, original)
    exclude = (dropin_path,) if mode == "dropin" else ()
    try:
        before_env, before_assignments, _notes = GrubFiles(order, original).evaluate()

        # Removals: edit the assignments that reach each variable's final value.
        _env, assignments, _notes = files.evaluate(exclude=exclude)
        edits = {}
        removed = []
        for name in wanted["absent_variables"]:
            for item in contributing(assignments, name):
                new_value, gone = remove_args(files.contents[item.path], item, wanted["absent"])
                if gone:
                    edits.setdefault(item.path, []).append((item, new_value))
                    removed.extend(gone)
        for path, path_edits in edits.items():
            text = files.contents[path]
            for item, new_value in sorted(path_edits, key=lambda edit: edit[0].value_start, reverse=True):
                text = replace_value(text, item, new_value)
            files.contents[path] = text

        # Additions: the drop-in, or the last assignment in the grub defaults file.
        env, assignments, _notes = files.evaluate(exclude=exclude)
        current = split_args(env.get(wanted["variable"], ""))
        added = []
        for arg in wanted["args"]:
            if arg not in current and arg not in added:
                added.append(arg)
        if mode == "dropin":
            files.contents[dropin_path] = dropin_text(wanted["variable"], added, DROPIN_HEADER) if added else None
        elif added:
            text = files.contents[grub_default] or ""
            own = [item for item in assignments if item.name == wanted["variable"] and item.path == grub_default]
            if own:
                files.contents[grub_default] = replace_value(text, own[-1], append_args(text, own[-1], added))
            else:
                files.contents[grub_default] = new_assignment(text, wanted["variable"], added)

        env, assignments, notes = files.evaluate()
    except ShellParseError as exc:
        return dict(base, state="parse_error", error=exc)
    effective = effective_of(env)
    changed_paths = [path for path in files.order if files.contents.get(path) != original.get(path)]
    return dict(
        base, state="planned", original=original, files=files, changed_paths=changed_paths, effective=effective,
        added=added, removed=removed, notes=notes, assignments=assignments,
        findings_before=findings(wanted, effective_of(before_env), before_assignments),
        findings_after=findings(wanted, effective, assignments))


def findings(wanted, effective, assignments):
    """Text of what the grub defaults lack or carry, empty when they match."""
    found = []
    variable = wanted["variable"]
    lacking = [arg for arg in wanted["args"] if arg not in effective[variable]]
    if lacking:
        found.append("%s lacks %s" % (variable, " ".join(lacking)))
    for name in wanted["absent_variables"]:
        unwanted = [arg for arg in effective[name] if matches_absent(arg, wanted["absent"])]
        if unwanted:
            where = ["%s line %d" % (item.path, item.line) for item in reversed(contributing(assignments, name))]
            found.append("%s carries %s (from %s)" % (name, " ".join(unwanted), ", ".join(where)))
    return found
