# -*- coding: utf-8 -*-
"""Read and edit grub defaults files (``/etc/default/grub`` and its drop-ins).

grub-mkconfig *sources* ``/etc/default/grub`` and then, on Debian and Ubuntu,
every ``/etc/default/grub.d/*.cfg`` with ``/bin/sh``.  What ends up on the
kernel command line is therefore the value of ``GRUB_CMDLINE_LINUX`` and
``GRUB_CMDLINE_LINUX_DEFAULT`` after all those files ran, last assignment
winning.  This module evaluates that without running a shell: it understands
plain assignments (``NAME=value``, ``export NAME=value``), single and double
quotes, backslash escapes, ``$NAME`` / ``${NAME}`` / ``${NAME:-word}`` of
variables assigned earlier, comments and line continuations.  Anything else
(``if``, command substitution, ...) is skipped and reported, never executed.

Edits touch only the value of the assignment being changed: the quote style,
the other arguments, a trailing comment and every other byte of the file stay
as they were.
"""

from __future__ import annotations

import os
import re

from .checks import check, passed, warned

CMDLINE_VARIABLES = ("GRUB_CMDLINE_LINUX", "GRUB_CMDLINE_LINUX_DEFAULT")

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=")
# Characters that end an unquoted shell word.
_WORD_END = " \t\n;&|<>()"
# Words that only mark a variable for export or read-only: the assignment
# after them still takes effect in the sourcing shell.
_DECLARATIONS = ("export", "readonly")
# A kernel argument this module writes must survive every quote style as is.
_SAFE_ARG_RE = re.compile(r"^[^\s'\"\\$`#;&|<>()]+$")


class ShellParseError(ValueError):
    """The file is not valid shell (for example an unterminated quote)."""

    def __init__(self, message, path, line):
        super().__init__("%s line %d: %s" % (path, line, message))
        self.path = path
        self.line = line


class Segment(object):
    """One quoted or unquoted piece of a shell word.

    ``start``/``end`` delimit the piece's inner text in the file (quotes
    excluded), so it can be rewritten without touching its quotes.
    """

    __slots__ = ("kind", "start", "end")

    def __init__(self, kind, start, end):
        self.kind = kind  # "plain", "single" or "double"
        self.start = start
        self.end = end

    def __repr__(self):
        return "Segment(%r, %d, %d)" % (self.kind, self.start, self.end)


class Assignment(object):
    """One ``NAME=value`` found in a file, with where its value lies."""

    def __init__(self, path, name, line, value_start, value_end, segments):
        self.path = path
        self.name = name
        self.line = line
        self.value_start = value_start
        self.value_end = value_end
        self.segments = segments
        self.value = ""
        self.refs = set()
        self.unsupported = []

    @property
    def self_reference(self):
        """True when the value builds on the variable's previous value."""
        return self.name in self.refs

    def __repr__(self):
        return "Assignment(%s:%d %s=%r)" % (self.path, self.line, self.name, self.value)


def line_of(text, offset):
    return text.count("\n", 0, offset) + 1


def _skip_braces(text, pos, path):
    """``text[pos]`` is the ``{`` of ``${``; return the offset after its ``}``."""
    close = text.find("}", pos)
    if close < 0:
        raise ShellParseError("unterminated ${", path, line_of(text, pos))
    return close + 1


def _skip_parens(text, pos, path):
    """``text[pos]`` is the ``(`` of ``$(``; return the offset after the match."""
    depth = 0
    i = pos
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ShellParseError("unterminated $(", path, line_of(text, pos))


def _skip_backquote(text, pos, path):
    close = pos + 1
    while close < len(text) and text[close] != "`":
        close += 2 if text[close] == "\\" else 1
    if close >= len(text):
        raise ShellParseError("unterminated `", path, line_of(text, pos))
    return close + 1


def _scan_word(text, pos, path):
    """Scan one shell word from ``pos``; return ``(end, segments)``."""
    segments = []
    n = len(text)
    while pos < n and text[pos] not in _WORD_END:
        char = text[pos]
        if char == "'":
            close = text.find("'", pos + 1)
            if close < 0:
                raise ShellParseError("unterminated single quote", path, line_of(text, pos))
            segments.append(Segment("single", pos + 1, close))
            pos = close + 1
        elif char == '"':
            i = pos + 1
            while i < n and text[i] != '"':
                if text[i] == "\\":
                    i += 2
                elif text.startswith("${", i):
                    i = _skip_braces(text, i + 1, path)
                elif text.startswith("$(", i):
                    i = _skip_parens(text, i + 1, path)
                elif text[i] == "`":
                    i = _skip_backquote(text, i, path)
                else:
                    i += 1
            if i >= n:
                raise ShellParseError("unterminated double quote", path, line_of(text, pos))
            segments.append(Segment("double", pos + 1, i))
            pos = i + 1
        else:
            start = pos
            while pos < n and text[pos] not in _WORD_END and text[pos] not in "'\"":
                if text[pos] == "\\":
                    pos += 2
                elif text.startswith("${", pos):
                    pos = _skip_braces(text, pos + 1, path)
                elif text.startswith("$(", pos):
                    pos = _skip_parens(text, pos + 1, path)
                elif text[pos] == "`":
                    pos = _skip_backquote(text, pos, path)
                else:
                    pos += 1
            pos = min(pos, n)
            segments.append(Segment("plain", start, pos))
    return pos, segments


def _expand(raw, kind, env, refs, unsupported):
    """The value of one segment's inner text ``raw`` under ``env``."""
    if kind == "single":
        return raw
    out = []
    i = 0
    n = len(raw)
    while i < n:
        char = raw[i]
        if char == "\\":
            nxt = raw[i + 1:i + 2]
            if nxt == "\n":
                i += 2  # line continuation
            elif kind == "plain":
                out.append(nxt)
                i += 2
            elif nxt in ('$', '`', '"', '\\'):
                out.append(nxt)
                i += 2
            else:
                out.append(char)
                i += 1
        elif char == "$":
            match = _NAME_RE.match(raw, i + 1)
            if raw.startswith("${", i):
                close = raw.find("}", i)
                inner = raw[i + 2:close]
                name, sep, default = inner.partition(":-")
                if not _NAME_RE.fullmatch(name) or (not sep and inner != name):
                    unsupported.append("${%s}" % inner)
                    out.append(raw[i:close + 1])
                else:
                    refs.add(name)
                    value = env.get(name, "")
                    out.append(value if (value or not sep) else default)
                i = close + 1
            elif match:
                refs.add(match.group(0))
                out.append(env.get(match.group(0), ""))
                i = match.end()
            elif raw.startswith("$(", i):
                unsupported.append("command substitution")
                out.append(char)
                i += 1
            elif i + 1 < n:
                unsupported.append("$" + raw[i + 1])
                out.append(char)
                i += 1
            else:
                out.append(char)
                i += 1
        elif char == "`":
            unsupported.append("command substitution")
            out.append(char)
            i += 1
        else:
            out.append(char)
            i += 1
    return "".join(out)


def _skip_blank(text, pos):
    """Skip spaces, tabs and backslash-newline continuations."""
    n = len(text)
    while pos < n:
        if text[pos] in " \t":
            pos += 1
        elif text.startswith("\\\n", pos):
            pos += 2
        else:
            break
    return pos


def parse(text, path, env):
    """Run the assignments of ``text`` against ``env`` (updated in place).

    Returns ``(assignments, notes)``: every assignment with its position and
    value, and a list of notes about statements that were skipped.
    """
    assignments = []
    notes = []
    words = []
    unsupported_syntax = []
    pos = 0
    n = len(text)

    def finish():
        if not words and not unsupported_syntax:
            return
        first_line = line_of(text, words[0][0]) if words else line_of(text, unsupported_syntax[0])
        index = 0
        if words and text[words[0][0]:words[0][1]] in _DECLARATIONS:
            index = 1
        rest = words[index:]
        plain_assignments = (
            not unsupported_syntax and rest
            and all(segs and segs[0].kind == "plain" and _ASSIGN_RE.match(text, segs[0].start)
                    and _ASSIGN_RE.match(text, segs[0].start).end() <= segs[0].end
                    for _start, _end, segs in rest))
        if plain_assignments:
            for start, end, segs in rest:
                match = _ASSIGN_RE.match(text, segs[0].start)
                value_start = match.end()
                value_segments = list(segs)
                value_segments[0] = Segment("plain", value_start, segs[0].end)
                if value_segments[0].start == value_segments[0].end:
                    value_segments.pop(0)
                item = Assignment(path, match.group(1), line_of(text, start), value_start, end, value_segments)
                item.value = "".join(
                    _expand(text[seg.start:seg.end], seg.kind, env, item.refs, item.unsupported)
                    for seg in value_segments)
                env[item.name] = item.value
                assignments.append(item)
                if item.unsupported:
                    notes.append("%s line %d: %s uses %s, which is not evaluated" % (
                        path, item.line, item.name, ", ".join(sorted(set(item.unsupported)))))
        elif index == 1 and not unsupported_syntax and all(_NAME_RE.fullmatch(text[s:e]) for s, e, _segs in rest):
            pass  # "export NAME" changes no value
        else:
            notes.append("%s line %d: skipped a statement that is not a plain assignment" % (path, first_line))
        del words[:]
        del unsupported_syntax[:]

    while True:
        pos = _skip_blank(text, pos)
        if pos >= n:
            finish()
            break
        char = text[pos]
        if char in "\n;":
            finish()
            pos += 1
        elif char == "#":
            newline = text.find("\n", pos)
            pos = n if newline < 0 else newline
        elif char in "&|<>()":
            unsupported_syntax.append(pos)
            pos += 1
        else:
            end, segments = _scan_word(text, pos, path)
            words.append((pos, end, segments))
            pos = end
    return assignments, notes


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


class GrubFiles(object):
    """The grub defaults file and its drop-ins, with pending contents.

    ``contents`` maps a path to its text (``None``: the file does not exist
    or is to be removed).  ``order`` is the order grub-mkconfig sources them.
    """

    def __init__(self, order, contents):
        self.order = list(order)
        self.contents = dict(contents)

    def evaluate(self, exclude=()):
        """Run every file in order; return ``(env, assignments, notes)``."""
        env = {}
        assignments = []
        notes = []
        for path in self.order:
            text = self.contents.get(path)
            if text is None or path in exclude:
                continue
            found, file_notes = parse(text, path, env)
            assignments.extend(found)
            notes.extend(file_notes)
        return env, assignments, notes


def contributing(assignments, name):
    """The assignments of ``name`` whose text reaches its final value.

    The last assignment wins; if it builds on ``$name``, the one before it
    contributes too, and so on.
    """
    own = [item for item in assignments if item.name == name]
    chain = []
    for item in reversed(own):
        chain.append(item)
        if not item.self_reference:
            break
    return chain


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


# --- Reading the files, planning the change, judging the result ---------------------------------------
# Shared by the writer (library/grub_cmdline.py) and the decider (module_utils/preflight_node/iommu.py), so an
# audit reports exactly what bring-up would change.

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
REGENERATE_HINT = "update-grub (grub2-mkconfig -o /boot/grub2/grub.cfg on RHEL)"


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


def describe_args(words):
    return " ".join(words) if words else "(none)"


def _on(host):
    return " on %s" % host if host else ""


def expected_text(wanted):
    text = "%s has %s" % (wanted["variable"], describe_args(wanted["args"]))
    if wanted["absent"]:
        text += "; %s carry none of %s" % ("/".join(wanted["absent_variables"]), describe_args(wanted["absent"]))
    return text


def manual_fix(wanted):
    by_hand = []
    if wanted["args"]:
        by_hand.append("add %s to %s in %s" % (" ".join(wanted["args"]), wanted["variable"], wanted["grub_default"]))
    if wanted["absent"]:
        by_hand.append("remove %s from %s" % (" ".join(wanted["absent"]), " and ".join(wanted["absent_variables"])))
    return "run bringup.yml, or %s, then run %s and reboot the node" % (" and ".join(by_hand), REGENERATE_HINT)


def describe_effective(wanted):
    text = "%s has %s" % (wanted["variable"], describe_args(wanted["args"]))
    if wanted["absent"]:
        text += ", and no %s" % " ".join(wanted["absent"])
    return text


def grub_check(outcome, wanted, drift_status, host=None, applied=False, regenerate_problem=None):
    """The grub defaults check for a :func:`plan` outcome.

    ``applied``: the planned change was written (bring-up); otherwise a
    pending change is drift, reported with ``drift_status`` (audit, check mode).
    """
    expected = expected_text(wanted)
    if outcome["state"] == "unreadable":
        return check(
            drift_status, "cannot read %s%s: %s" % (outcome["path"], _on(host), outcome["error"]), expected,
            "make %s readable to the preflight (connect as root or set preflight_become), then re-run"
            % outcome["path"])
    if outcome["state"] == "no_grub":
        return check(
            drift_status, "no %s%s: grub does not appear to be its boot loader" % (
                wanted["grub_default"], _on(host) or " on this node"),
            expected, "add %s to the kernel command line of the node's boot loader and reboot"
            % describe_args(wanted["args"]))
    if outcome["state"] == "parse_error":
        exc = outcome["error"]
        return check(
            "fail", "cannot evaluate the grub defaults%s: %s" % (_on(host), exc), expected,
            "fix the shell syntax of %s line %d (grub-mkconfig fails on it too)" % (exc.path, exc.line))
    changed = outcome["changed_paths"]
    if outcome["findings_after"]:
        return check(
            drift_status,
            "%s%s even after this module's edits (arguments built from variables or glued to other text are not "
            "edited, and a later file can override an earlier one)" % ("; ".join(outcome["findings_after"]), _on(host)),
            expected, "edit the lines named by hand: %s" % manual_fix(wanted))
    if changed and not applied:
        before = outcome["findings_before"] or ["%s need rewriting" % ", ".join(changed)]
        return check(drift_status, "%s%s" % ("; ".join(before), _on(host)), expected, manual_fix(wanted),
                     files=changed)
    if regenerate_problem:
        return warned(
            "grub defaults%s now carry the change but %s" % (_on(host), regenerate_problem),
            "%s in grub.cfg" % expected,
            "regenerate grub.cfg (%s) and reboot the node" % REGENERATE_HINT)
    return passed("%s (%s)%s" % (describe_effective(wanted), "changed: " + ", ".join(changed) if changed
                                 else "no change needed", _on(host)), expected)


def running_args(cmdline):
    """The running kernel's arguments from ``{text, error}``, or None when unreadable."""
    if not cmdline or cmdline.get("text") is None:
        return None
    return parse_proc_cmdline(cmdline["text"])


def read_cmdline(path):
    """``{path, text, error}`` of the running kernel's command line; never raises."""
    try:
        with open(path, "rb") as handle:
            return {"path": path, "text": handle.read().decode("utf-8", "replace"), "error": None}
    except (OSError, ValueError) as exc:
        return {"path": path, "text": None, "error": str(exc)}


def reboot_required(running, wanted):
    """Whether the running kernel lacks a wanted argument or carries an unwanted one (None: unknown)."""
    if running is None:
        return None
    return (any(arg not in running for arg in wanted["args"])
            or any(matches_absent(arg, wanted["absent"]) for arg in running))


def cmdline_check(cmdline, wanted, grub_ready, host=None):
    """The running kernel check; ``grub_ready``: a reboot alone would fix it."""
    without = ", without %s" % " ".join(wanted["absent"]) if wanted["absent"] else ""
    expected = "running kernel booted with %s%s" % (describe_args(wanted["args"]), without)
    running = running_args(cmdline)
    if running is None:
        return warned("cannot read %s%s: %s" % (cmdline["path"], _on(host), cmdline.get("error")), expected,
                      "check that %s is readable on the node (procfs mounted)" % cmdline["path"])
    not_running = [arg for arg in wanted["args"] if arg not in running]
    unwanted = [arg for arg in running if matches_absent(arg, wanted["absent"])]
    if not not_running and not unwanted:
        return passed("running kernel command line has %s%s%s" % (describe_args(wanted["args"]), without, _on(host)),
                      expected)
    found = []
    if not_running:
        found.append("running kernel command line lacks %s" % " ".join(not_running))
    if unwanted:
        found.append("running kernel command line carries %s" % " ".join(unwanted))
    if grub_ready:
        fix = "reboot the node so it boots with the new kernel command line"
    else:
        fix = "run bringup.yml to fix the grub defaults and regenerate grub.cfg, then reboot the node"
    return warned("; ".join(found) + _on(host), expected, fix)
