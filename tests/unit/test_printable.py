"""cluster_preflight/verdict/printable.py: what others wrote, made safe for a terminal and the outputs."""

import pytest

from cluster_preflight.verdict.printable import printable, printable_tree, printable_verdict


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


def verdict_like():
    shared = {"status": "fail", "suspects": [{"host": "n2", "reason": "rank 1: \x1b[31mboom"}]}
    checks = {"allreduce.ranks": {"status": "fail", "found": "l1\r\n\x1b[2Jl2", "expected": "ok", "fix": "x",
                                  "details": {"ranks": [{"error": "\x07bell"}], "n": 3}},
              "ssh_trust.mesh": {"status": "pass", "found": "ok", "expected": "ok", "fix": ""}}
    return {"status": "fail", "hosts": ["n1", "n2\u202e"], "allreduce": shared, "bound_seconds": None,
            "nodes": {"n1": {"status": "fail", "reachable": True, "checks": checks},
                      "n2\u202e": {"status": "pass", "reachable": True, "checks": {
                          "a.b": {"status": "pass", "found": "\x9b2J", "expected": "", "fix": ""}}}}}


@pytest.mark.parametrize("change", [
    lambda verdict: None,
    lambda verdict: verdict["nodes"]["n1"]["checks"].update({"bad\x1bname": {"status": "pass"}}),
    lambda verdict: verdict["nodes"]["n1"]["checks"]["ssh_trust.mesh"].update({"other\x07": "x"}),
    lambda verdict: verdict["nodes"]["n1"]["checks"].update({"a.c": ["not", "a check\x1b"]}),
    lambda verdict: verdict["nodes"].update({"n3": "not a node\x1b[1m"}),
])
def test_a_verdict_is_made_printable_as_printable_tree_makes_it(change):
    verdict = verdict_like()
    change(verdict)
    expected = printable_tree(verdict)
    cleaned = printable_verdict(verdict)
    assert cleaned == expected


def test_a_verdicts_own_checks_are_cleaned_in_place_the_decisions_data_copied():
    verdict = verdict_like()
    checks, details = verdict["nodes"]["n1"]["checks"], verdict["nodes"]["n1"]["checks"]["allreduce.ranks"]["details"]
    cleaned = printable_verdict(verdict)
    assert cleaned["nodes"]["n1"]["checks"] is checks
    assert checks["allreduce.ranks"]["found"] == "l1\nl2"
    assert cleaned["allreduce"] is not verdict["allreduce"] and cleaned["allreduce"]["suspects"][0]["reason"] == \
        "rank 1: boom"
    assert verdict["allreduce"]["suspects"][0]["reason"] == "rank 1: \x1b[31mboom", "the decisions' data stays"
    assert checks["allreduce.ranks"]["details"] is not details and details["ranks"][0]["error"] == "\x07bell"


EVIL_MODULE = r"""#!/usr/bin/python
from ansible.module_utils.basic import AnsibleModule
module = AnsibleModule(argument_spec={})
module.warn("careful\x1b[2K\rPREFLIGHT PASS (a warning)")
module.fail_json(msg="boom\x1b[2K\x1b[1A\rPREFLIGHT PASS\x1b]0;owned\x07 \u009b2J\u202eesrever",
                 exception="Traceback\nValueError: \x1b[2K\rPREFLIGHT PASS (an exception)")
"""


def test_a_node_call_s_message_reaches_ansible_s_own_display_without_its_escape_sequences(tmp_path):
    """A failed node call's msg, warning and exception as Ansible itself prints them ("[ERROR]: Task failed: ...",
    "[WARNING]: ..."), with the project's ansible.cfg: no sequence of the node's reaches the terminal; Ansible's
    own colours stay."""
    import os
    import re
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    (tmp_path / "library").mkdir()
    (tmp_path / "library" / "evil.py").write_text(EVIL_MODULE)
    (tmp_path / "play.yml").write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n"
                                       "    - name: A node call that fails\n      evil:\n      ignore_errors: true\n")
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(root, "ansible.cfg"), ANSIBLE_LIBRARY=str(tmp_path / "library"),
               ANSIBLE_FORCE_COLOR="1")
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c",
                           "local", "-e", "ansible_python_interpreter=%s" % sys.executable, str(tmp_path / "play.yml")],
                          capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=120)
    out = done.stdout + done.stderr
    assert "A node call that fails" in out and "PREFLIGHT PASS" in out, out
    without_colours = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", without_colours), \
        repr(without_colours)
    assert "\x1b[0;31m" in out, "Ansible's own colours went too"
