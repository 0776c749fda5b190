"""One fault, one cause printed once: a node call that could not start (Ansible's interpreter discovery chose a
pyenv shim that does not run) is named with the node's own words and the fix, by bring-up as by the gate; every
capability it left without a result is a consequence counted under it, in the summary, the verdict's ``causes``,
bringup.json and the run history (which does not call a configuration mistake a flaky node)."""

import json
import re

from cluster_preflight import capabilities as registry
from cluster_preflight.outputs import history, summary
from cluster_preflight.plays import stage_results as registers
from cluster_preflight.stages.view import ClusterView
from verdict_build_helpers import build, every_capability_passes, gate, records, run_action

HOSTS = ["pfn1", "pfn2", "pfn3"]
SHIM = "/root/.pyenv/shims/python3.13"
# What a node answers when discovery picked a pyenv shim of a version that is not selected (as it reads on a node
# whose root PATH starts with ~/.pyenv/shims), as Ansible registers it.
SHIM_FAILED = {
    "failed": True, "rc": 127, "_ansible_parsed": False,
    "msg": "Module result deserialization failed: No start of json char found",
    "module_stdout": "",
    "module_stderr": "pyenv: python3.13: command not found\n\nThe `python3.13' command exists in these Python "
                     "versions:\n  3.13.0\n\nNote: See 'pyenv help global' for tips on allowing multiple\nPython "
                     "versions to be found at the same time.\n",
    "ansible_facts": {"discovered_interpreter_python": SHIM},
}


def shim_verdict(stages=("settings", "facts", "port_mesh", "port_mesh_wait", "launch", "probes")):
    by_host = {host: records(facts=dict(SHIM_FAILED)) for host in HOSTS}
    return build(HOSTS, by_host, [{"checks_by_host": {}}, gate("skipped")], stages=stages)


def test_the_failed_node_call_names_the_discovered_interpreter_what_the_node_said_and_the_fix():
    verdict = shim_verdict()
    check = verdict["nodes"]["pfn2"]["checks"]["preflight.facts"]
    assert check["status"] == "fail" and "(rc 127); the node said: pyenv: python3.13: command not found" in check["found"]
    assert check["fix"].startswith("Ansible's interpreter discovery chose %s on pfn2 (ansible_python_interpreter "
                                   "is not set) and it does not run there (rc 127)" % SHIM)
    assert "ansible_python_interpreter: /usr/bin/python3" in check["fix"]
    assert check["details"]["configuration"] is True
    # The shim's output is not that of a crashed module: nothing says "a timeout means ...".
    assert "timeout" not in check["fix"]


def test_every_consequence_points_at_its_cause_without_repeating_the_error_or_a_placeholder():
    verdict = shim_verdict()
    consequences = {name: check for name, check in verdict["nodes"]["pfn1"]["checks"].items()
                    if name.endswith(".no_result")}
    assert len(consequences) == len(registry.NAMES)
    for name, check in consequences.items():
        assert check["details"]["caused_by"] == ["preflight.facts"], name
        assert "pyenv" not in check["found"] and "deserialization" not in check["found"], check
        assert check["found"].endswith("pfn1 was failed while reading its facts (preflight.facts says why)")
        assert check["fix"] == "fix preflight.facts on pfn1 (its finding says how), then re-run"
    assert "<node>" not in json.dumps(verdict)


def test_the_summary_prints_the_cause_once_first_and_counts_its_consequences():
    verdict = shim_verdict()
    lines = summary.finding_lines(verdict)
    text = "\n".join(lines)
    assert lines[0] == "  [fail] preflight.facts on all 3 nodes (3 findings)"
    assert lines[1].startswith("    e.g. pfn1 preflight.facts: facts failed on pfn1 while reading its facts: Module "
                               "result deserialization failed")
    assert lines[2].startswith("    fix: Ansible's interpreter discovery chose %s on all 3 nodes" % SHIM)
    count = 3 * len(registry.NAMES)
    assert re.match(r"    \+ %d consequences of it \(not checked or no result, nothing more to fix\): "
                    r"\w+\.no_result, .* on all 3 nodes$" % count, lines[3]), lines[3]
    # The error is printed once (the example), never once per capability; the fix once.
    assert text.count("command not found") == 1 and text.count("ansible_python_interpreter: /usr/bin/python3") == 1
    assert "<node>" not in text and "a defect of the preflight" not in text
    assert len(lines) <= 5, lines


def test_the_verdict_and_bringup_json_keep_the_causes_as_data(tmp_path):
    hostvars = {host: records(facts=dict(SHIM_FAILED)) for host in HOSTS}
    for host in HOSTS:
        # Bring-up's audit read after the changes is skipped where nothing could be applied.
        hostvars[host][registers.AUDIT_FACTS] = {"skipped": True, "false_condition": "preflight_applying",
                                                 "changed": False}
    result = run_action({"kind": "bringup", "results_dir": str(tmp_path / "results"), "run_id": "r1", "fail": False},
                        hostvars)
    report = json.loads(open(result["verdict_file"]).read())
    assert report["nodes"]["pfn1"]["checks"]["preflight.facts"]["status"] == "fail"
    assert "a defect of the preflight" not in json.dumps(report)
    assert report["nodes"]["pfn1"]["checks"]["preflight.reachable"]["status"] == "pass"
    first = report["causes"][0]
    assert first["checks"] == ["preflight.facts"] and first["nodes"] == HOSTS and first["findings"] == 3
    assert SHIM in first["fix"] and "<node>" not in first["fix"]
    assert first["consequences"]["count"] == 3 * len(registry.BRINGUP_NAMES)
    assert len(report["causes"]) == 1
    # Its changes line never says "nothing would change" of nodes it could not even read.
    line = summary.changes_line(dict(report, changed={host: 0 for host in HOSTS}, check_mode=True))
    assert line == ("check mode, nothing was written; nothing checked on all 3 nodes: their facts could not be read "
                    "or they did not answer (see the findings)")


def test_bring_up_reads_the_audit_facts_where_they_ran_and_the_first_read_where_they_did_not():
    ok = {"changed": False, "facts": {"core_dumps": {"x": 1}}, "errors": {}}
    view = ClusterView({"ansible_play_hosts_all": ["a", "b"], "hostvars": {
        "a": {registers.FACTS: dict(SHIM_FAILED), registers.AUDIT_FACTS: {"skipped": True}},
        "b": {registers.FACTS: {"changed": False, "facts": {}, "errors": {}}, registers.AUDIT_FACTS: ok}}})
    assert view.outcome("a", registers.FACTS)[0] == "failed"
    assert view.facts("b")[0] == {"core_dumps": {"x": 1}}


def test_the_history_names_the_cause_and_does_not_call_a_configuration_mistake_flaky(tmp_path):
    db = str(tmp_path / "history.sqlite")
    broken = shim_verdict()
    broken.update(run_id="r1", finished="2026-11-28T08:00:00Z")
    assert history.record(db, broken, "preflight", "x")["recorded"]
    healthy = build(HOSTS, {host: records() for host in HOSTS}, [{"checks_by_host": every_capability_passes(HOSTS)},
                                                                 gate()])
    healthy.update(run_id="r2", finished="2026-11-28T08:10:00Z")
    assert history.record(db, healthy, "preflight", "y")["recorded"]
    rows = [row for row in history.timeline(db, node="pfn1") if row["run_id"] == "r1"]
    assert rows[0]["summary"].startswith("preflight.facts: facts failed on pfn1")
    assert history.flaky(db) == []
    configuration = history.configuration_failures(db)
    assert [item["node"] for item in configuration] == HOSTS and all(item["passed_since"] for item in configuration)
    # A node's own fault (one node, its all-reduce) still counts.
    sick = build(HOSTS, {host: records() for host in HOSTS}, [{"checks_by_host": every_capability_passes(HOSTS)},
                                                              gate()])
    sick["nodes"]["pfn2"]["checks"]["gpu_health.xid"] = {"status": "fail", "found": "Xid 79", "expected": "none",
                                                         "fix": "drain pfn2"}
    sick["nodes"]["pfn2"]["status"] = "fail"
    sick.update(run_id="r3", finished="2026-11-28T08:20:00Z")
    history.record(db, sick, "preflight", "z")
    assert [item["text"] for item in history.flaky(db)] == [
        "pfn2 failed 1 of its last 3 runs (and 1 more on the run's configuration, not counted)"]
