"""service_enabled (bring-up's fabric manager) against a fake systemctl that keeps a unit's state in a file, and a
proc sandbox whose PID 1 is systemd (or not): check mode, apply, re-apply, diff; not installed; no systemd; a unit that
does not start."""

import json
import os
import stat
import sys

import pytest

import service_enabled

FAKE_SYSTEMCTL = '''#!%s
"""Fake systemctl written by tests/unit/test_service_enabled.py: the unit's state lives in state.json."""
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
path = os.path.join(here, "state.json")
with open(path) as handle:
    state = json.load(handle)
with open(os.path.join(here, "calls.log"), "a") as handle:
    handle.write(" ".join(sys.argv[1:]) + "\\n")
verb, unit = sys.argv[1], sys.argv[2].replace(".service", "")
if verb == "show":
    if unit != state["unit"]:
        print("LoadState=not-found\\nActiveState=inactive\\nSubState=dead\\nUnitFileState=")
    else:
        print("LoadState=loaded\\nActiveState=%%s\\nSubState=%%s\\nUnitFileState=%%s" %% (
            state["active"], state["sub"], state["file"]))
    sys.exit(0)
if verb == "enable":
    state["file"] = "enabled"
elif verb == "start":
    state["active"], state["sub"] = ("failed", "failed") if state.get("fails") else ("active", "running")
else:
    sys.exit(2)
with open(path, "w") as handle:
    json.dump(state, handle)
'''


@pytest.fixture
def node(tmp_path):
    """``(args, state path, calls path)``: a fake systemctl, an inactive disabled unit, PID 1 systemd."""
    bin_dir, proc = tmp_path / "bin", tmp_path / "proc"
    bin_dir.mkdir()
    (proc / "1").mkdir(parents=True)
    (proc / "1" / "comm").write_text("systemd\n")
    program = bin_dir / "systemctl"
    program.write_text(FAKE_SYSTEMCTL % sys.executable)
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    (bin_dir / "state.json").write_text(json.dumps({"unit": "nvidia-fabricmanager", "active": "inactive",
                                                    "sub": "dead", "file": "disabled"}))
    args = {"name": "nvidia-fabricmanager", "program": "nv-fabricmanager", "proc_root": str(proc),
            "systemctl": str(program), "timeout": 20}
    return args, bin_dir / "state.json", bin_dir / "calls.log"


def calls(path):
    return path.read_text().splitlines() if path.exists() else []


def test_four_steps_check_apply_reapply_diff(run_module, node):
    args, state, log = node
    before = state.read_text()
    result, failed = run_module(service_enabled, args, check_mode=True, diff=True)
    assert not failed and result["changed"] is True and result["managed"] is True and result["installed"] is True
    assert state.read_text() == before, "check mode must change nothing"
    assert all(line.startswith("show ") for line in calls(log))
    assert result["diff"]["before"] == "enabled: False\nactive: False\n"
    assert result["diff"]["after"] == "enabled: True\nactive: True\n"
    assert "would be enabled and started" in result["msg"]

    result, failed = run_module(service_enabled, args)
    assert not failed and result["changed"] is True, result
    assert json.loads(state.read_text())["file"] == "enabled" and result["after"]["active"] is True
    assert "enable nvidia-fabricmanager.service" in calls(log) and "start nvidia-fabricmanager.service" in calls(log)

    count = len(calls(log))
    result, failed = run_module(service_enabled, args, diff=True)
    assert not failed and result["changed"] is False
    assert result["diff"]["before"] == result["diff"]["after"]
    assert all(line.startswith("show ") for line in calls(log)[count:])


def test_a_unit_systemd_does_not_know_is_left_alone(run_module, node):
    args, state, log = node
    result, failed = run_module(service_enabled, dict(args, name="nvidia-imex"))
    assert not failed and result["changed"] is False and result["installed"] is False
    assert "nvidia-imex.service is not installed" in result["msg"]
    assert all(line.startswith("show ") for line in calls(log))


def test_without_systemd_there_is_nothing_to_enable(run_module, node):
    args, _state, log = node
    proc = os.path.join(args["proc_root"], "1", "comm")
    with open(proc, "w") as handle:
        handle.write("sshd\n")
    result, failed = run_module(service_enabled, args)
    assert not failed and result["changed"] is False and result["managed"] is False
    assert "systemd is not the init" in result["msg"] and calls(log) == []


def test_a_unit_that_does_not_start_fails_saying_where_to_look(run_module, node):
    args, state, _log = node
    state.write_text(json.dumps(dict(json.loads(state.read_text()), fails=True)))
    result, failed = run_module(service_enabled, args)
    assert failed and "did not become active (ActiveState failed)" in result["msg"]
    assert "journalctl -u nvidia-fabricmanager" in result["msg"]
