"""How readers and probes run commands on a node (module_utils/preflight_node.py)."""

import os
import time

from ansible.module_utils.preflight_node import NOT_FOUND_RC, TIMEOUT_RC, run_bounded_command


def test_output_of_a_command_that_is_slow_to_print_is_kept():
    """run_command loses it when select() waited a second and the command exits just then."""
    rc, out, err = run_bounded_command(["sh", "-c", "sleep 1.2; echo late; echo err >&2"], 10)
    assert (rc, out, err) == (0, "late\n", "err\n")


def test_c_locale_input_and_environment():
    rc, out, _ = run_bounded_command(["sh", "-c", 'cat; echo "$LANG $EXTRA"'], 10, env={"EXTRA": "x"}, data="in\n")
    assert rc == 0 and out == "in\nC x\n"


def test_time_bound_kills_the_command_and_what_it_started(tmp_path):
    marker = tmp_path / "grandchild.pid"
    rc, _out, err = run_bounded_command(["sh", "-c", 'sleep 60 & echo $! > "$0"; wait', str(marker)], 1)
    assert rc == TIMEOUT_RC and "killed after 1 s" in err
    pid = int(marker.read_text())
    deadline = time.monotonic() + 5
    while os.path.exists("/proc/%d" % pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists("/proc/%d" % pid) or open("/proc/%d/stat" % pid).read().split()[2] == "Z"


def test_a_missing_program_is_rc_127_not_an_exception(tmp_path):
    rc, out, err = run_bounded_command([str(tmp_path / "nope")], 5)
    assert rc == NOT_FOUND_RC and out == "" and "nope" in err


def test_a_command_as_another_user_gets_its_ids_and_none_of_roots_environment(monkeypatch):
    import pwd

    import pytest
    if os.geteuid() != 0:
        pytest.skip("switching user needs root")
    monkeypatch.setenv("ROOT_SECRET", "x")
    rc, out, _ = run_bounded_command(["sh", "-c", 'id -u; echo "$HOME ${ROOT_SECRET:-none} $LANG"'], 10,
                                     user="nobody")
    entry = pwd.getpwnam("nobody")
    assert rc == 0 and out.split("\n")[:2] == [str(entry.pw_uid), "%s none C" % entry.pw_dir]
    assert run_bounded_command(["true"], 5, user="no-such-user-here")[0] == NOT_FOUND_RC
