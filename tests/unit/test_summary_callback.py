"""The preflight_summary callback (callback_plugins/preflight_summary.py) fed a verdict file.

The verdict is ``fixtures/verdicts/mixed.json`` (gpu01 pass, gpu02 warn, gpu03 unverified, gpu04
unreachable, gpu05 no torch; a 3-node all-reduce that passed).
"""

import json
import os
import shutil
import types

import pytest
from ansible.plugins.loader import callback_loader

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "verdicts", "mixed.json")
callback_loader.add_directory(os.path.join(ROOT, "callback_plugins"))


class Capture:
    """Stands in for Ansible's Display: keeps what the callback prints."""

    def __init__(self):
        self.lines = []

    def display(self, msg="", color=None, **kwargs):
        self.lines.append((msg, color))

    def __getattr__(self, name):  # warning, vvv, ...: not what this test looks at
        return lambda *args, **kwargs: None


def task_result(action, result):
    """What a callback receives for a task: ``_task.action`` and ``_result``."""
    return types.SimpleNamespace(_task=types.SimpleNamespace(action=action), _result=result,
                                 _host=types.SimpleNamespace(get_name=lambda: "localhost"))


@pytest.fixture
def callback():
    plugin = callback_loader.get("preflight_summary")
    capture = Capture()
    plugin._display = capture
    plugin.printed = capture.lines
    plugin.v2_playbook_on_start(types.SimpleNamespace(_file_name=os.path.join(ROOT, "preflight.yml")))
    return plugin


@pytest.fixture
def verdict_file(tmp_path):
    run_dir = tmp_path / "20261123T150000Z"
    run_dir.mkdir()
    shutil.copy(FIXTURE, str(run_dir / "verdict.json"))
    return str(run_dir / "verdict.json")


def text(callback):
    return [line for line, _ in callback.printed]


def row(callback, host):
    found = [line.split() for line in text(callback) if line.split()[:1] == [host]]
    assert len(found) == 1, text(callback)
    return found[0]


def test_matrix_after_a_failed_verdict_task(callback, verdict_file):
    callback.v2_runner_on_ok(task_result("ansible.builtin.debug", {"msg": "unrelated"}))
    callback.v2_runner_on_failed(task_result("preflight_verdict", {
        "failed": True, "verdict_status": "fail", "run_dir": os.path.dirname(verdict_file),
        "verdict_file": verdict_file}))
    callback.v2_playbook_on_stats(None)
    lines = text(callback)
    assert "PREFLIGHT SUMMARY: FAIL, 2/5 nodes healthy" in lines
    at = next(index for index, line in enumerate(lines) if line.startswith("node"))
    # Headers split at their first underscore (core over dumps); iommu and kernel_debug, n/a on every node, are
    # named under the matrix instead of taking a column each.
    assert lines[at - 1].split() == ["core", "ssh"]
    assert lines[at].split() == ["node", "status", "preflight", "allreduce", "dumps", "trust"]
    assert lines[at - 1].index("core") == lines[at].index("dumps")
    assert row(callback, "gpu01") == ["gpu01", "pass", "pass", "pass", "pass", "pass"]
    assert row(callback, "gpu02") == ["gpu02", "warn", "pass", "pass", "warn", "pass"]
    assert row(callback, "gpu03") == ["gpu03", "unverified", "pass", "pass", "pass", "unverified"]
    assert row(callback, "gpu04") == ["gpu04", "fail", "fail", "fail", "-", "-"]
    assert row(callback, "gpu05") == ["gpu05", "fail", "pass", "fail", "pass", "pass"]
    assert "not applicable on any node (not shown): iommu, kernel_debug" in lines
    assert max(len(line) for line in lines[at - 1:at + 6]) < 70
    assert ("all-reduce: pass, world size 6 of 6 planned, backend gloo, busbw 1.800 GB/s (algbw 1.080 GB/s) "
            "at 16777216 bytes") in lines
    assert "run directory: /work/main/results/20261123T150000Z" in lines
    assert "verdict: %s" % verdict_file in lines
    # Rows are coloured by node status, so a failed node stands out.
    by_host = {line.split()[0]: color for line, color in callback.printed if line.split()[:1]}
    assert by_host["gpu04"] != by_host["gpu01"]


def test_passing_run_and_a_skipped_allreduce(callback, verdict_file):
    with open(verdict_file) as handle:
        verdict = json.load(handle)
    verdict["allreduce"] = {"status": "skipped", "reason": "no node is ready", "launched": False, "ranks": [],
                            "suspects": []}
    with open(verdict_file, "w") as handle:
        json.dump(verdict, handle)
    callback.v2_runner_on_ok(task_result("ansible.legacy.preflight_verdict", {"verdict_file": verdict_file}))
    callback.v2_playbook_on_stats(None)
    assert "all-reduce: skipped (no node is ready)" in text(callback)


def test_healthcheck_report_is_labelled_and_has_no_allreduce(callback, tmp_path):
    with open(FIXTURE) as handle:
        verdict = json.load(handle)
    del verdict["allreduce"]
    path = str(tmp_path / "healthcheck.json")
    with open(path, "w") as handle:
        json.dump(verdict, handle)
    callback.v2_runner_on_ok(task_result("preflight_verdict", {"verdict_file": path}))
    callback.v2_playbook_on_stats(None)
    assert text(callback)[1] == "HEALTH CHECK SUMMARY: FAIL, 2/5 nodes healthy"
    assert "all-reduce: not part of this playbook" in text(callback)


def test_truncated_verdict_is_one_line_not_a_traceback(callback, verdict_file):
    with open(verdict_file) as handle:
        data = handle.read()
    with open(verdict_file, "w") as handle:
        handle.write(data[:200])
    callback.v2_runner_on_failed(task_result("preflight_verdict", {"verdict_file": verdict_file}))
    callback.v2_playbook_on_stats(None)
    assert [line for line in text(callback) if line] == [
        next(line for line in text(callback) if "is not a complete verdict" in line)]


def test_no_verdict_task_in_a_preflight_playbook_is_said(callback):
    callback.v2_playbook_on_stats(None)
    assert text(callback) == ["PREFLIGHT SUMMARY: no verdict was written (the run stopped before its verdict task; "
                              "see the errors above)"]


def test_other_playbooks_are_left_alone(callback):
    callback.v2_playbook_on_start(types.SimpleNamespace(_file_name="/srv/site.yml"))
    callback.v2_runner_on_ok(task_result("ansible.builtin.command", {"stdout": ""}))
    callback.v2_playbook_on_stats(None)
    assert text(callback) == []


def test_it_is_an_aggregate_callback_that_must_be_enabled(callback):
    # runner replaces the stdout callback: a stdout-type summary would never load under it.
    assert callback.CALLBACK_TYPE == "aggregate" and callback.CALLBACK_NEEDS_ENABLED is True
