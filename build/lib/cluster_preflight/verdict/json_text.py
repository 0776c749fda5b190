# -*- coding: utf-8 -*-
"""A verdict as the JSON text the project writes: ``json.dumps(value, indent=2, sort_keys=True)``, faster.

The standard library encodes indented JSON in pure Python, one generator per container; a 10,000-node verdict
(some 200 MB of text) spends seconds there.  :func:`indented` writes the same text character for character for
data of JSON's own types (``dict`` with text keys, ``list``, ``str``, ``int``, ``float``, ``bool``, ``None``)
with the standard library's own string escaping (a container of scalars through its C encoder, in one call),
and hands anything else (a tuple, a key that is not text, a subclass) to ``json.dumps`` itself, so the result
is always what ``json.dumps`` gives.

Standard library only (controller layer).
"""

from __future__ import annotations

import json
from json.encoder import c_make_encoder, encode_basestring_ascii

INDENT = "  "
# A container whose items are all of these exact types holds no container: it is written in one call of the
# standard library's C encoder (where it has one), with the indented text's separators at its depth.
_SCALARS = frozenset((str, int, float, bool, type(None)))
_TEXT = frozenset((str,))
# inner indent -> the C encoder of a container of scalars at that depth.
_FLAT = {}


class _Other(Exception):
    """A value :func:`indented` leaves to ``json.dumps``."""


def indented(value, end=""):
    """``json.dumps(value, indent=2, sort_keys=True) + end`` (a file's last line break: no copy of the text to add
    it)."""
    out = []
    try:
        _item(value, "", out)
    except (_Other, RecursionError):
        return json.dumps(value, indent=2, sort_keys=True) + end
    out.append(end)
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


def _flat(value, indent, inner):
    """``value`` (a dict or a list, not empty, of scalars: :data:`_SCALARS`) as the standard library indents it:
    its C encoder writes the items with the separators of this depth, the brackets get their own lines."""
    encoder = _FLAT.get(inner)
    if encoder is None:
        encoder = _FLAT[inner] = c_make_encoder(None, None, encode_basestring_ascii, None, ": ", ",\n" + inner,
                                                True, False, True)
    text = "".join(encoder(value, 0))
    return text[0] + "\n" + inner + text[1:-1] + "\n" + indent + text[-1]


def _container(value, indent, out):
    """``value`` (a dict or a list, not empty or empty) at ``indent``, appended to ``out``."""
    inner = indent + INDENT
    if type(value) is dict:
        if not value:
            out.append("{}")
            return
        if not _TEXT.issuperset(map(type, value)):
            raise _Other()
        if c_make_encoder is not None and _SCALARS.issuperset(map(type, value.values())):
            out.append(_flat(value, indent, inner))
            return
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
    if c_make_encoder is not None and _SCALARS.issuperset(map(type, value)):
        out.append(_flat(value, indent, inner))
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
