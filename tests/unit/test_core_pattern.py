"""module_utils/preflight_corepattern: what a core_pattern means and where its file lands."""

import os

import pytest

from preflight_node.cores import pattern as cp

APPORT = "|/usr/share/apport/apport -p%p -s%s -c%c -d%d -P%P -u%u -g%g -- %E"
COREDUMP = "|/lib/systemd/systemd-coredump %P %u %g %s %t 9223372036854775808 %h"


def test_tokens_handle_literal_percent_and_trailing_percent():
    assert cp.tokens("/tmp/core-%e.%%p.%") == [("lit", "/tmp/core-"), ("spec", "e"), ("lit", ".%p.")]
    assert not cp.has_pid("/tmp/core-%%p")
    assert cp.has_pid("/tmp/core-%e.%p")


@pytest.mark.parametrize("pattern, handler, where, listing", [
    (APPORT, "apport", "/var/crash", "/var/lib/apport/coredump"),
    (COREDUMP, "systemd-coredump", "/var/lib/systemd/coredump", "coredumpctl list"),
])
def test_pipe_destinations_say_where_cores_go_and_how_to_override(pattern, handler, where, listing):
    dest = cp.destination(pattern)
    assert dest["handler"] == handler
    assert where in dest["where"]
    assert listing in dest["where"] + dest["list_command"]
    assert "sysctl -w kernel.core_pattern=" in dest["override"]
    assert cp.describe(pattern).startswith("cores are piped to " + handler)


def test_file_pattern_has_no_pipe_destination():
    assert cp.destination("/tmp/core-%e.%p") is None
    assert cp.describe("/var/cores/core-%p") == "cores are written to /var/cores"
    assert "working directory" in cp.describe("core")


def test_validate_desired_rejects_pipes_long_and_empty_patterns():
    assert cp.validate_desired("/tmp/core-%e.%p.%h.%t") == []
    errors = cp.validate_desired(APPORT)
    assert len(errors) == 1 and "pipes cores to /usr/share/apport/apport" in errors[0]
    assert "bytes" in cp.validate_desired("/tmp/" + "x" * 130)[0]
    assert cp.validate_desired("  ")


def fields(**extra):
    base = {"p": 4242, "i": 4242, "P": 4242, "I": 4242, "u": 1000, "g": 1000, "s": 11,
            "h": "node/1", "e": "sleep", "f": "sleep", "E": "/usr/bin/sleep", "c": "0", "d": None, "C": None}
    base.update(extra)
    return base


def test_expansion_matches_the_kernel_name_and_escapes_slashes(tmp_path):
    (tmp_path / "core-sleep.4242.node!1.1700000001").write_text("")
    (tmp_path / "core-sleep.4243.node!1.1700000001").write_text("")  # another pid
    (tmp_path / "core-sleep.4242.node!1.1600000000").write_text("")  # outside the time window
    absolute, regexes, shown = cp.component_regexes(str(tmp_path) + "/core-%e.%p.%h.%t", fields())
    assert absolute
    assert shown == str(tmp_path) + "/core-sleep.4242.node!1.<epoch seconds>"
    found = cp.find_matches("/nonexistent", absolute, regexes, time_window=(1700000000, 1700000002))
    assert found == [str(tmp_path / "core-sleep.4242.node!1.1700000001")]


def test_relative_pattern_and_core_uses_pid(tmp_path):
    (tmp_path / "core.4242").write_text("")
    (tmp_path / "core").write_text("")
    absolute, regexes, shown = cp.component_regexes("core", fields(core_uses_pid=True))
    assert not absolute and shown == "core.4242"
    assert cp.find_matches(str(tmp_path), absolute, regexes) == [str(tmp_path / "core.4242")]
    _absolute, regexes, shown = cp.component_regexes("core", fields(core_uses_pid=False))
    assert cp.find_matches(str(tmp_path), False, regexes) == [str(tmp_path / "core")]


def test_unknown_initial_namespace_pid_matches_any_number_and_unknown_specifiers_drop(tmp_path):
    (tmp_path / "c.77.sleep").write_text("")
    _absolute, regexes, shown = cp.component_regexes(str(tmp_path) + "/c.%P.%e%Z", fields(P=None))
    assert "<PID in the initial PID namespace>" in shown
    assert cp.find_matches("/", True, regexes) == [str(tmp_path / "c.77.sleep")]


def test_specifier_in_directory_part_is_walked(tmp_path):
    os.makedirs(str(tmp_path / "1000"))
    (tmp_path / "1000" / "core.4242").write_text("")
    absolute, regexes, _shown = cp.component_regexes(str(tmp_path) + "/%u/core.%p", fields())
    assert cp.find_matches("/", absolute, regexes) == [str(tmp_path / "1000" / "core.4242")]
    assert cp.dir_has_specifier(str(tmp_path) + "/%u/core.%p")


def test_dot_and_double_slash_components_name_the_same_directory(tmp_path):
    os.makedirs(str(tmp_path / "work"))
    (tmp_path / "core.4242").write_text("")
    _absolute, regexes, _shown = cp.component_regexes("./../core.%p", fields())
    assert cp.find_matches(str(tmp_path / "work"), False, regexes) == [str(tmp_path / "core.4242")]
    absolute, regexes, _shown = cp.component_regexes(str(tmp_path) + "//core.%p", fields())
    assert cp.find_matches("/", absolute, regexes) == [str(tmp_path / "core.4242")]
