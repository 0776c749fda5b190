"""cluster_preflight/printable.py: what others wrote, made safe for a terminal and the outputs."""

import pytest

from cluster_preflight.printable import printable, printable_tree


@pytest.mark.parametrize("text, one_line, lines", [
    ("a\x1b[31mred\x1b[0m b", "ared b", "ared b"),  # colours (CSI)
    ("x\x1b]0;window title\x07y", "xy", "xy"),  # OSC: the window title
    ("x\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\y", "xlinky", "xlinky"),  # OSC 8 hyperlink, ST-terminated
    ("\x9b2Jz", "z", "z"),  # 8-bit CSI: clear the screen
    ("\x1bPq#0;2;0;0;0\x1b\\ok", "ok", "ok"),  # DCS (sixel)
    ("\x1b7saved\x1b8", "saved", "saved"),  # short ESC sequences
    ("FAIL\rPASS", "FAIL PASS", "FAIL\nPASS"),  # a carriage return that would overwrite the line
    ("tab\there\r\nnext\x08\x7f", "tab here next", "tab\there\nnext"),
    ("\u202eevil\u2066x\u2069", "evilx", "evilx"),  # bidi overrides and isolates (Trojan Source)
    ("é ü 日本 TAB", "é ü 日本 TAB", "é ü 日本 TAB"),  # text stays text
    (42, "42", "42"),
])
def test_escape_sequences_and_control_characters_go_and_text_stays(text, one_line, lines):
    assert printable(text) == one_line
    assert printable(text, lines=True) == lines


def test_a_whole_verdict_is_cleaned_keys_and_values_line_breaks_kept():
    data = {"nodes": {"n1\x1b[1m": {"checks": {"a.b": {"found": "l1\n\x1b[2Jl2", "n": 3, "ok": True}}}},
            "hosts": ["n1\x07"]}
    assert printable_tree(data) == {"nodes": {"n1": {"checks": {"a.b": {"found": "l1\nl2", "n": 3, "ok": True}}}},
                                    "hosts": ["n1"]}
