# -*- coding: utf-8 -*-
"""The shell-syntax evaluator of the grub defaults (node layer, ``module_utils/preflight_node/grub/shell.py``).

grub-mkconfig *sources* ``/etc/default/grub`` and then, on Debian and Ubuntu,
every ``/etc/default/grub.d/*.cfg`` with ``/bin/sh``.  What ends up on the
kernel command line is therefore the value of ``GRUB_CMDLINE_LINUX`` and
``GRUB_CMDLINE_LINUX_DEFAULT`` after all those files ran, last assignment
winning.  This module evaluates that without running a shell: it understands
plain assignments (``NAME=value``, ``export NAME=value``), single and double
quotes, backslash escapes, ``$NAME`` / ``${NAME}`` / ``${NAME:-word}`` of
variables assigned earlier, comments and line continuations.  Anything else
(``if``, command substitution, ...) is skipped and reported, never executed.

Each :class:`Assignment` records where its value lies in the file (its
:class:`Segment` pieces), so the edits of ``module_utils/preflight_node/grub/plan.py``
can rewrite one value and leave every other byte as it was.
"""

from __future__ import annotations

import re

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=")
# Characters that end an unquoted shell word.
_WORD_END = " \t\n;&|<>()"
# Words that only mark a variable for export or read-only: the assignment
# after them still takes effect in the sourcing shell.
_DECLARATIONS = ("export", "readonly")


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


def _skip_one(text, pos, path):
    """The index after the escape, expansion or plain character that starts at ``pos`` (inside a word or
    a double-quoted string)."""
    if text[pos] == "\\":
        return pos + 2
    if text.startswith("${", pos):
        return _skip_braces(text, pos + 1, path)
    if text.startswith("$(", pos):
        return _skip_parens(text, pos + 1, path)
    if text[pos] == "`":
        return _skip_backquote(text, pos, path)
    return pos + 1


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
                i = _skip_one(text, i, path)
            if i >= n:
                raise ShellParseError("unterminated double quote", path, line_of(text, pos))
            segments.append(Segment("double", pos + 1, i))
            pos = i + 1
        else:
            start = pos
            while pos < n and text[pos] not in _WORD_END and text[pos] not in "'\"":
                pos = _skip_one(text, pos, path)
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
