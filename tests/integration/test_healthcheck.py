"""healthcheck.yml: the fast node-local mode on the embedded default (localhost)."""

import json
import os
import stat

import pytest

from playbook import newest_run_dir, run_playbook
from preflight_node import registry

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NODE_TASKS = ("Read the node and run its node-local probes in one call",)


def report(result):
    with open(os.path.join(newest_run_dir(result.results_dir), "healthcheck.json"), encoding="utf-8") as handle:
        return json.load(handle)


def test_node_local_checks_in_one_module_call_within_the_budget(tmp_path):
    result = run_playbook(tmp_path, playbook="healthcheck.yml")
    assert result.rc == 0, result.stdout[-3000:]
    verdict = report(result)
    checks = verdict["nodes"]["localhost"]["checks"]
    assert verdict["status"] == "pass" and "allreduce" not in verdict
    assert checks["preflight.budget"]["status"] == "pass" and "of the 30 s budget" in checks["preflight.budget"]["found"]
    # Every node-local capability of the registry, and no other.
    assert {name.split(".")[0] for name in checks} == {"preflight"} | set(registry.names_for("healthcheck"))
    assert checks["core_dumps.core_probe"]["status"] == "pass"  # the probe ran in the same call
    assert checks["allreduce.torch"]["status"] == "pass"
    # One module call on the node; everything else is decided on the controller.
    node_calls = [event for event in result.events if event.get("event") == "runner_on_ok"
                  and event["event_data"].get("resolved_action", "").split(".")[-1] not in (
                      "preflight_settings", "preflight_decide", "preflight_verdict", "debug")]
    assert [event["event_data"]["task"] for event in node_calls] == [
        "Read the node and run its node-local probes in one call, bounded by the budget."]
    assert not os.path.islink(os.path.join(result.results_dir, "latest")), "a health check never moves latest"
    assert "HEALTH CHECK PASS" in result.stdout


def test_a_hanging_node_is_cut_within_the_budget_and_named(tmp_path):
    """A training Python that hangs: the one node call is cut so the report still comes within the budget."""
    slow = tmp_path / "python"
    slow.write_text("#!/bin/sh\nsleep 60\n")
    slow.chmod(slow.stat().st_mode | stat.S_IXUSR)
    result = run_playbook(tmp_path, playbook="healthcheck.yml",
                          extravars={"preflight_training_python": str(slow), "preflight_healthcheck_budget": 10})
    assert result.rc != 0
    verdict = report(result)
    assert verdict["failed_hosts"] == ["localhost"]
    checks = verdict["nodes"]["localhost"]["checks"]
    assert checks["preflight.facts"]["status"] == "fail" and "Timed out after 2 second" in checks["preflight.facts"]["found"]
    assert checks["preflight.budget"]["status"] == "pass", checks["preflight.budget"]
    assert "reading its facts" in checks["core_dumps.no_result"]["found"]
