# -*- coding: utf-8 -*-
"""A verdict as the JSON text the project writes: ``json.dumps(value, indent=2, sort_keys=True)``, faster.

The standard library encodes indented JSON in pure Python, one generator per container; a 10,000-node verdict
(some 200 MB of text) spends seconds there.  :func:`indented` writes the same text character for character for
data of JSON's own types (``dict`` with text keys, ``list``, ``str``, ``int``, ``float``, ``bool``, ``None``)
with the standard library's own string escaping, and hands anything else (a tuple, a key that is not text, a
subclass) to ``json.dumps`` itself, so the result is always what ``json.dumps`` gives.

Standard library only (controller layer).
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring_ascii

INDENT = "  "


class _Other(Exception):
    """A value :func:`indented` leaves to ``json.dumps``."""


def indented(value):
    """``json.dumps(value, indent=2, sort_keys=True)``."""
    out = []
    try:
        _item(value, "", out)
    except (_Other, RecursionError):
        return json.dumps(value, indent=2, sort_keys=True)
    return "".join(out)


def _scalar(value):
    kind = type(value)
    if kind is str:
        return encode_basestring_ascii(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if kind is int:
        return int.__repr__(value)
    if kind is float:
        if value != value:
            return "NaN"
        if value in (float("inf"), float("-inf")):
            return "Infinity" if value > 0 else "-Infinity"
        return float.__repr__(value)
    raise _Other()


def _container(value, indent, out):
    """``value`` (a dict or a list, not empty or empty) at ``indent``, appended to ``out``."""
    inner = indent + INDENT
    if type(value) is dict:
        if not value:
            out.append("{}")
            return
        if any(type(key) is not str for key in value):
            raise _Other()
        opening = "{\n" + inner
        for key in sorted(value):
            out.append(opening + encode_basestring_ascii(key) + ": ")
            opening = ",\n" + inner
            _item(value[key], inner, out)
        out.append("\n" + indent + "}")
        return
    if not value:
        out.append("[]")
        return
    opening = "[\n" + inner
    for item in value:
        out.append(opening)
        opening = ",\n" + inner
        _item(item, inner, out)
    out.append("\n" + indent + "]")


def _item(value, indent, out):
    kind = type(value)
    if kind is str:
        out.append(encode_basestring_ascii(value))
    elif kind is dict or kind is list:
        _container(value, indent, out)
    else:
        out.append(_scalar(value))
