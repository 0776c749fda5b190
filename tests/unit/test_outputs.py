"""JUnit, Prometheus and host lists written from a verdict (cluster_preflight/outputs/formats.py).

The verdict is ``fixtures/verdicts/mixed.json``: the structure of a real gate verdict, trimmed, over
five nodes -- gpu01 pass, gpu02 warn, gpu03 unverified (a check blocked by gpu04), gpu04 unreachable,
gpu05 failed (no torch) -- with a 3-node, 2-ranks-per-node all-reduce that passed.
"""

import copy
import json
import os
import stat
import xml.etree.ElementTree as ET

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster_preflight.outputs import formats as outputs
from cluster_preflight.verdict.file import problems

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "verdicts", "mixed.json")


@pytest.fixture
def verdict():
    with open(FIXTURE) as handle:
        loaded = json.load(handle)
    assert problems(loaded) == [], "the fixture must be a verdict scripts/verdict accepts"
    return loaded


def expected_counts(verdict):
    """What junit.xml must count, worked out from the verdict's checks directly."""
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for host in verdict["hosts"]:
        for check in verdict["nodes"][host]["checks"].values():
            counts["tests"] += 1
            blocked = (check.get("details") or {}).get("blocked")
            if check["status"] == "fail":
                counts["failures"] += 1
            elif blocked:
                counts["errors"] += 1
            elif check["status"] in ("not_applicable", "skipped"):
                counts["skipped"] += 1
    return counts


def metrics(text):
    """{(name, frozenset(labels)): value} of every sample in Prometheus text."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(found, name, **labels):
    return found[(name, frozenset(labels.items()))]


def test_junit_counts_match_the_verdicts_checks(verdict, tmp_path):
    outputs.write_outputs(verdict, str(tmp_path))
    root = ET.parse(str(tmp_path / "junit.xml")).getroot()
    suites = root.findall("testsuite")
    assert [suite.get("name") for suite in suites] == verdict["hosts"]
    totals = {key: sum(int(suite.get(key)) for suite in suites) for key in ("tests", "failures", "errors", "skipped")}
    assert totals == expected_counts(verdict)
    assert totals == {"tests": 39, "failures": 3, "errors": 1, "skipped": 8}
    cases = root.findall("testsuite/testcase")
    assert len(cases) == totals["tests"]
    assert {(case.get("classname"), case.get("name")) for case in cases} == {
        (host, name) for host in verdict["hosts"] for name in verdict["nodes"][host]["checks"]}
    assert int(root.get("tests")) == 39 and int(root.get("failures")) == 3 and int(root.get("errors")) == 1


def test_junit_failure_carries_found_expected_fix(verdict, tmp_path):
    root = ET.fromstring(outputs.junit_xml(verdict).encode("utf-8"))
    case = root.find("testsuite[@name='gpu05']/testcase[@name='allreduce.torch']")
    failure = case.find("failure")
    check = verdict["nodes"]["gpu05"]["checks"]["allreduce.torch"]
    assert failure.get("message") == check["found"]
    assert "found: %s" % check["found"] in failure.text
    assert "expected: %s" % check["expected"] in failure.text
    assert "fix: %s" % check["fix"] in failure.text
    reach = root.find("testsuite[@name='gpu04']/testcase[@name='preflight.reachable']/failure")
    assert "Connection timed out" in reach.get("message")


def test_junit_blocked_is_an_error_warn_passes_with_output_na_is_skipped(verdict):
    root = ET.fromstring(outputs.junit_xml(verdict).encode("utf-8"))
    blocked = root.find("testsuite[@name='gpu03']/testcase[@name='ssh_trust.peers']")
    assert blocked.find("error").get("type") == "unverified" and blocked.find("failure") is None
    assert "gpu04 stopped answering" in blocked.find("error").get("message")
    warn = root.find("testsuite[@name='gpu02']/testcase[@name='core_dumps.core_pattern']")
    assert warn.find("failure") is None and warn.find("error") is None and warn.find("skipped") is None
    assert warn.find("system-out").text.startswith("WARN") and "fix: on gpu02" in warn.find("system-out").text
    skipped = root.find("testsuite[@name='gpu01']/testcase[@name='iommu.grub']/skipped")
    assert skipped.get("message").startswith("not_applicable: no AMD GPU")
    passed = root.find("testsuite[@name='gpu01']/testcase[@name='allreduce.correctness']")
    assert list(passed) == []


def test_junit_escapes_what_nodes_report(verdict):
    check = verdict["nodes"]["gpu05"]["checks"]["allreduce.torch"]
    check["found"] = "<script>&\"quoted\" \u2026 \x1b[31m"
    root = ET.fromstring(outputs.junit_xml(verdict).encode("utf-8"))
    message = root.find("testsuite[@name='gpu05']/testcase[@name='allreduce.torch']/failure").get("message")
    assert message.startswith("<script>&\"quoted\" \u2026")


def test_prometheus_values(verdict, tmp_path):
    paths = outputs.write_outputs(verdict, str(tmp_path))
    with open(paths["preflight.prom"]) as handle:
        found = metrics(handle.read())
    kind = "preflight"
    assert value(found, "preflight_check_status", kind=kind, host="gpu01", check="allreduce.correctness") == 0
    assert value(found, "preflight_check_status", kind=kind, host="gpu01", check="iommu.grub") == 1
    assert value(found, "preflight_check_status", kind=kind, host="gpu01", check="kernel_debug.ptrace_scope") == 2
    assert value(found, "preflight_check_status", kind=kind, host="gpu02", check="core_dumps.core_pattern") == 3
    assert value(found, "preflight_check_status", kind=kind, host="gpu03", check="ssh_trust.peers") == 4
    assert value(found, "preflight_check_status", kind=kind, host="gpu05", check="allreduce.torch") == 5
    checks = [key for key in found if key[0] == "preflight_check_status"]
    assert len(checks) == expected_counts(verdict)["tests"]
    for host in verdict["hosts"]:
        status = verdict["nodes"][host]["status"]
        for each in outputs.HOST_STATUSES:
            assert value(found, "preflight_host_status", kind=kind, host=host, status=each) == (each == status)
    assert value(found, "preflight_host_reachable", kind=kind, host="gpu04") == 0
    assert value(found, "preflight_host_reachable", kind=kind, host="gpu01") == 1
    assert value(found, "preflight_run_status", kind=kind, status="fail") == 1
    assert value(found, "preflight_run_status", kind=kind, status="pass") == 0
    # 2026-11-23T15:00:00Z
    assert value(found, "preflight_run_timestamp_seconds", kind=kind) == 1795446000
    assert value(found, "preflight_run_info", kind=kind, run_id="20261123T150000Z",
                 run_dir="/work/main/results/20261123T150000Z") == 1
    assert value(found, "preflight_allreduce_status", kind=kind, status="pass") == 1
    assert value(found, "preflight_allreduce_world_size", kind=kind) == 6
    assert value(found, "preflight_allreduce_planned_world_size", kind=kind) == 6
    assert value(found, "preflight_allreduce_busbw_bytes_per_second", kind=kind,
                 size_bytes="16777216") == pytest.approx(1.8e9)
    assert value(found, "preflight_allreduce_algbw_bytes_per_second", kind=kind,
                 size_bytes="1048576") == pytest.approx(0.82e9)
    assert value(found, "preflight_allreduce_duration_seconds", kind=kind,
                 size_bytes="16777216") == pytest.approx(0.015495)


def test_prometheus_without_allreduce_labels_the_kind(verdict):
    del verdict["allreduce"]
    found = metrics(outputs.prometheus_text(verdict, kind="healthcheck").decode("utf-8"))
    assert not [key for key in found if key[0].startswith("preflight_allreduce_")]
    assert value(found, "preflight_run_status", kind="healthcheck", status="fail") == 1


def test_host_lists_hold_only_healthy_nodes_with_their_ranks(verdict, tmp_path):
    paths = outputs.write_outputs(verdict, str(tmp_path))
    with open(paths["hostfile"]) as handle:
        assert handle.read() == "gpu01 slots=2\ngpu02 slots=2\n"
    with open(paths["hosts.txt"]) as handle:
        assert handle.read() == "gpu01\ngpu02\n"
    with open(paths["hosts.csv"]) as handle:
        assert handle.read() == "gpu01,gpu02\n"


def test_host_lists_follow_the_verdicts_order_not_the_healthy_lists(verdict):
    verdict["healthy_hosts"] = ["gpu02", "gpu01"]
    assert outputs.host_lists(verdict)["hosts.csv"] == "gpu01,gpu02\n"


def test_host_lists_are_empty_when_no_node_is_healthy(verdict):
    verdict["healthy_hosts"] = []
    assert outputs.host_lists(verdict) == {"hostfile": "", "hosts.txt": "", "hosts.csv": ""}


def test_hostfile_without_allreduce_has_bare_names(verdict):
    del verdict["allreduce"]
    assert outputs.host_lists(verdict)["hostfile"] == "gpu01\ngpu02\n"


def test_write_outputs_is_atomic_with_mode_0640(verdict, tmp_path):
    paths = outputs.write_outputs(verdict, str(tmp_path))
    assert sorted(paths) == sorted(["junit.xml", "preflight.prom", "hostfile", "hosts.txt", "hosts.csv"])
    for path in paths.values():
        assert os.path.isabs(path) and os.path.dirname(path) == str(tmp_path)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    assert sorted(os.listdir(str(tmp_path))) == sorted(paths), "no temp file left behind"
    # A second run replaces every file.
    again = copy.deepcopy(verdict)
    again["healthy_hosts"] = ["gpu01"]
    outputs.write_outputs(again, str(tmp_path))
    with open(paths["hosts.txt"]) as handle:
        assert handle.read() == "gpu01\n"


def test_write_outputs_renders_everything_before_writing(verdict, tmp_path):
    verdict["finished"] = "not a time"
    with pytest.raises(ValueError):
        outputs.write_outputs(verdict, str(tmp_path))
    assert os.listdir(str(tmp_path)) == []


def test_write_outputs_never_creates_the_run_dir(verdict, tmp_path):
    with pytest.raises(FileNotFoundError):
        outputs.write_outputs(verdict, str(tmp_path / "missing"))
    assert not (tmp_path / "missing").exists()
