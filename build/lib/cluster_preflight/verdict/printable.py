# -*- coding: utf-8 -*-
"""Text others control, made safe for an operator's terminal and for the outputs (controller layer).

A rank's error, a log line, a py-spy frame (a function name in the job's own code), a hostname a node
reports, a verdict file someone else wrote: any of them may carry terminal escape sequences (move the
cursor, rewrite a line so a ``FAIL`` reads ``PASS``, set the window title, or worse on old terminals)
or bidirectional-text controls that make the text read differently from what it is.  Every place where
such text leaves the project -- printed to a terminal, written into the run directory, put into a drain
reason -- passes it through :func:`printable` (or :func:`printable_tree` for a whole verdict).

Standard library only: ``scripts/verdict`` and the Slurm scripts use it without Ansible.
"""

from __future__ import annotations

import re

# ECMA-48 sequences, 7-bit (ESC ...) and 8-bit (C1) forms: control strings (OSC, DCS, SOS, PM, APC) up to their
# terminator, CSI with its parameters, and the short ESC sequences.
_SEQUENCES = re.compile(
    r"(?:\x1b[\]PX^_]|[\x9d\x90\x98\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC, DCS, SOS, PM, APC
    r"|(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"  # CSI
    r"|\x1b[ -/]*[0-~]?"  # the rest: ESC plus an intermediate and a final byte
)
# What is left of C0 (but tab and line feed) and C1, DEL, and the bidirectional embeddings, overrides and isolates.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_LINE_BREAKS = re.compile(r"\r\n?|[\n\t\v\f]")
# Every character either form of printable() changes or drops starts with one of these (an escape sequence
# starts with ESC or a C1 control): text without them is printable as it is.
_UNSAFE = {True: _CONTROLS, False: re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")}


def printable(text, lines=False):
    """``text`` (anything; ``str()`` of it) without escape sequences or control characters.

    ``lines``: keep line breaks (``\\r\\n`` and a lone ``\\r`` become ``\\n``) and tabs, for a log or a stack;
    otherwise every line break and tab becomes a space (one line)."""
    text = str(text)
    if not _UNSAFE[bool(lines)].search(text):
        return text
    text = _SEQUENCES.sub("", text)
    if lines:
        return _CONTROLS.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    return _CONTROLS.sub("", _LINE_BREAKS.sub(" ", text))


def printable_tree(value):
    """A copy of ``value`` (JSON-like: dicts, lists, strings, numbers) with every string, keys included, made
    :func:`printable` (line breaks kept: a found text may hold a stack)."""
    kind = type(value)
    if kind is dict:
        # The verdict's own shape, walked without a call per string or number (a large cluster's verdict holds
        # millions): text that needs nothing is kept as it is.
        out = {}
        for key, item in value.items():
            if type(key) is not str or _CONTROLS.search(key):
                key = printable_tree(key) if isinstance(key, str) else key
            kind = type(item)
            out[key] = (item if not _CONTROLS.search(item) else printable(item, lines=True)) if kind is str \
                else item if kind in _NUMBERS else printable_tree(item)
        return out
    if kind is list:
        return [(item if not _CONTROLS.search(item) else printable(item, lines=True)) if type(item) is str
                else item if type(item) in _NUMBERS else printable_tree(item) for item in value]
    if isinstance(value, str):
        return printable(value, lines=True)
    if isinstance(value, dict):
        return {printable_tree(key) if isinstance(key, str) else key: printable_tree(item)
                for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [printable_tree(item) for item in value]
    return value


_NUMBERS = frozenset((int, float, bool, type(None)))
_TEXT = frozenset((str,))
# A check's fields (preflight_node/checks.py): names that need nothing.
_CHECK_FIELDS = frozenset(("status", "found", "expected", "fix", "details"))


def printable_verdict(verdict):
    """:func:`printable_tree` of a verdict as ``cluster_preflight/verdict/accounting.py`` builds it, without copying its
    nodes' checks: every check there is a dict of the accounting's own (``checks.normalize`` makes each), so its text
    is made printable in place (a 10,000-node verdict holds half a million checks); a check's ``details``, the
    all-reduce's summary and everything else may be the decisions' own data and are copied as :func:`printable_tree`
    copies them."""
    out = {}
    for key, value in verdict.items():
        if key == "nodes" and type(value) is dict:
            value = {printable_tree(host): _printable_node(node) for host, node in value.items()}
        else:
            value = printable_tree(value)
        out[printable_tree(key)] = value
    return out


def _printable_node(node):
    if type(node) is not dict:
        return printable_tree(node)
    out = {}
    for key, value in node.items():
        own = key == "checks" and type(value) is dict and _own_checks(value)
        out[printable_tree(key)] = _printable_checks(value) if own else printable_tree(value)
    return out


def _own_checks(checks):
    """Whether ``checks`` is ``{name: check}`` with names that need nothing and checks of a check's own fields."""
    return _TEXT.issuperset(map(type, checks)) and not _CONTROLS.search("".join(checks)) and all(
        type(check) is dict and check.keys() <= _CHECK_FIELDS for check in checks.values())


def _printable_checks(checks):
    """``checks`` (the accounting's own: see :func:`_own_checks`) with their text made printable in place."""
    for check in checks.values():
        for field, value in check.items():
            if type(value) is str:
                if _CONTROLS.search(value):
                    check[field] = printable(value, lines=True)
            elif type(value) not in _NUMBERS:
                check[field] = printable_tree(value)
    return checks
