"""The profile capability (cluster_preflight/capabilities/profile/), the profile file
(cluster_preflight/capabilities/profile/known_good.py) and baseline (cluster_preflight/cli/baseline.py): every node
against its group's
known-good profile or the majority, and a profile recorded from a run that passed compares equal with it."""

import json

import pytest
import yaml

from cluster_preflight.cli import baseline
from cluster_preflight.capabilities.profile import known_good as profiles
from cluster_preflight.capabilities import profile
from preflight_node.checks import node_status
from capability_helpers import assert_contract, role_settings

H100 = {"gpu.vendor": "nvidia", "gpu.count": 8, "gpu.model": "NVIDIA H100 80GB HBM3", "gpu.driver_version": "550.90.07",
        "gpu.cuda_version": "12.4", "gpu.pcie_gen_max": 5, "gpu.pcie_width_min": 16, "rdma.devices": 8,
        "rdma.active_ports": 8, "rdma.rate_gbps": 400, "rdma.link_layer": "InfiniBand", "torch.version": "2.13.0",
        "nccl.version": "2.27.3", "allreduce.backend": "nccl", "allreduce.transport": "NET/IB",
        "allreduce.largest_size": 1073741824, "allreduce.busbw_gbps": 370.0,
        "allreduce.single_node_busbw_gbps": 460.0}


def settings(**overrides):
    return role_settings("profile", **overrides)


def write_profile(tmp_path, fields, name="h100.yml"):
    path = tmp_path / name
    path.write_text(profiles.dump(fields, "gpu_h100", "/results/x/verdict.json", ["n1", "n2"], "2026-11-25T00:00:00Z"))
    return str(path)


def decide(fields_by_host, settings_by_host):
    checks = profile.decide_all(list(fields_by_host), fields_by_host, settings_by_host)
    for host, node_checks in checks.items():
        assert_contract("profile", node_checks, host)
    return checks


def test_a_node_like_its_profile_passes_every_field(tmp_path):
    path = write_profile(tmp_path, H100)
    checks = decide({"n1": dict(H100)}, {"n1": settings(profile_file=path)})["n1"]
    assert set(checks) == {profiles.check_name(name) for name in H100} | {"summary"}
    assert all(result["status"] == "pass" for result in checks.values())
    assert checks["summary"]["details"]["fields"] == H100


@pytest.mark.parametrize("field, found, check", [
    ("gpu.count", 7, "gpu_count"),
    ("gpu.driver_version", "535.54.03", "gpu_driver_version"),
    ("rdma.rate_gbps", 200, "rdma_rate_gbps"),
    ("rdma.active_ports", 7, "rdma_active_ports"),
    ("gpu.pcie_width_min", 8, "gpu_pcie_width_min"),
    ("allreduce.transport", "NET/Socket", "allreduce_transport"),
    ("allreduce.single_node_busbw_gbps", 300.0, "allreduce_single_node_busbw_gbps"),
])
def test_each_difference_fails_that_field_with_found_expected_and_fix(tmp_path, field, found, check):
    path = write_profile(tmp_path, H100)
    node = dict(H100, **{field: found})
    checks = decide({"n3": node, "n1": dict(H100)}, {"n3": settings(profile_file=path), "n1": settings(profile_file=path)})
    failed = {name for name, result in checks["n3"].items() if result["status"] == "fail"}
    assert failed == {check}
    result = checks["n3"][check]
    assert field in result["found"] and str(found) in result["found"] and "n3" in result["found"]
    assert path in result["expected"] and result["fix"]
    assert node_status(checks["n1"]) == "pass"


def test_busbw_within_the_tolerance_passes_and_below_it_fails(tmp_path):
    path = write_profile(tmp_path, H100)
    within = dict(H100, **{"allreduce.busbw_gbps": 300.0})  # 370 less 20% = 296
    below = dict(H100, **{"allreduce.busbw_gbps": 290.0})
    checks = decide({"a": within, "b": below}, {"a": settings(profile_file=path), "b": settings(profile_file=path)})
    assert checks["a"]["allreduce_busbw_gbps"]["status"] == "pass"
    assert checks["b"]["allreduce_busbw_gbps"]["status"] == "fail"
    assert "296" in checks["b"]["allreduce_busbw_gbps"]["expected"]


def test_a_field_the_profile_wants_but_the_run_did_not_measure_leaves_the_node_unverified(tmp_path):
    path = write_profile(tmp_path, H100)
    node = dict(H100, **{"gpu.count": None})
    checks = decide({"n1": node}, {"n1": settings(profile_file=path)})["n1"]
    assert checks["gpu_count"]["status"] == "skipped" and checks["gpu_count"]["details"]["blocked"]
    assert node_status(checks) == "unverified"


def test_without_a_profile_the_lone_outlier_is_named_and_its_peers_pass():
    nodes = {"n%d" % index: dict(H100) for index in range(1, 5)}
    nodes["n3"]["gpu.count"] = 7
    nodes["n4"]["allreduce.single_node_busbw_gbps"] = 200.0
    checks = decide(nodes, {host: settings() for host in nodes})
    assert checks["n3"]["gpu_count"]["status"] == "fail" and "majority of the 4 nodes" in checks["n3"]["gpu_count"][
        "expected"]
    assert node_status(checks["n1"]) == node_status(checks["n2"]) == "pass"
    # The run-wide fields are never an outlier (every node of a run shares them), and bandwidth needs a known-good
    # value: a median of peers is none (the gate's floors and localisation judge it).
    assert "allreduce_busbw_gbps" not in checks["n1"] and "allreduce_single_node_busbw_gbps" not in checks["n4"]
    assert node_status(checks["n4"]) == "pass"


def test_without_a_profile_two_nodes_have_no_majority_to_compare_with():
    nodes = {"n1": dict(H100), "n2": dict(H100, **{"gpu.count": 7})}
    checks = decide(nodes, {host: settings() for host in nodes})
    assert set(checks["n2"]) == {"summary"} and "0 fields compared" in checks["n2"]["summary"]["found"]


def test_switched_off_is_skipped_and_a_broken_file_fails_the_node(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text("fields: [not, a, mapping]\n")
    checks = decide({"a": dict(H100), "b": dict(H100)},
                    {"a": settings(profile_enabled=False), "b": settings(profile_file=str(broken))})
    assert checks["a"] == {"enabled": checks["a"]["enabled"]} and checks["a"]["enabled"]["status"] == "skipped"
    assert checks["b"]["file"]["status"] == "fail" and "no 'fields' mapping" in checks["b"]["file"]["found"]


@pytest.mark.parametrize("text, expected", [
    (None, "cannot read"),
    ("fields: {gpu.count: 8}\n", "profile_version None"),
    ("profile_version: 1\nfields: {gpu.cores: 8}\n", "unknown fields: gpu.cores"),
    ("profile_version: 1\nfields: {gpu.count: [8\n", "is not YAML"),
])
def test_validate_says_what_is_wrong_with_the_profile_file(tmp_path, text, expected):
    path = tmp_path / "p.yml"
    if text is not None:
        path.write_text(text)
    problems = profile.validate(settings(profile_file=str(path)))
    assert len(problems) == 1 and expected in problems[0]["found"] and problems[0]["fix"]


def test_validate_refuses_a_relative_path_and_bad_numbers():
    names = [problem["name"] for problem in profile.validate(settings(profile_file="profiles/x.yml",
                                                                       profile_busbw_tolerance=1.5,
                                                                       profile_majority_min_nodes=1))]
    assert names == ["profile_file", "profile_busbw_tolerance", "profile_majority_min_nodes"]
    assert profile.validate(settings()) == []


def verdict(status="pass", fields_by_host=None):
    """A verdict whose nodes carry their profile fields, their job-side code root's alone (changeable_by "")."""
    return {"status": status, "nodes": {host: {"status": status, "checks": {"profile.summary": {
        "status": "pass", "found": "x", "expected": "x", "fix": "", "details": {"fields": fields}},
        "allreduce.python": {"status": "pass", "found": "x", "expected": "x", "fix": "",
                             "details": {"changeable_by": ""}}}}
        for host, fields in (fields_by_host or {}).items()}}


def test_baseline_folds_a_group_majority_for_exact_fields_and_the_lowest_for_floors(tmp_path):
    fields = {"n1": dict(H100), "n2": dict(H100, **{"rdma.rate_gbps": 200, "gpu.driver_version": "535.54.03"}),
              "n3": dict(H100, **{"allreduce.single_node_busbw_gbps": 450.0})}
    written = baseline.record(verdict(fields_by_host=fields), "/r/verdict.json", {"gpu_h100": ["n1", "n2", "n3"],
                                                                                  "cpu": ["c1"]}, str(tmp_path))
    assert [(group, hosts) for group, _path, hosts, _notes in written] == [("gpu_h100", ["n1", "n2", "n3"])]
    data = profiles.load(written[0][1])
    assert data["fields"]["rdma.rate_gbps"] == 200 and data["fields"]["allreduce.single_node_busbw_gbps"] == 450.0
    assert data["fields"]["gpu.driver_version"] == "550.90.07"
    assert any("n2=535.54.03" in note for note in written[0][3])
    assert (tmp_path / "gpu_h100.yml").stat().st_mode & 0o777 == 0o644


def test_a_recorded_profile_compares_equal_with_the_run_it_came_from(tmp_path):
    fields = {"n1": dict(H100), "n2": dict(H100)}
    (_group, path, _hosts, _notes), = baseline.record(verdict(fields_by_host=fields), "/r/v.json",
                                                     {"g": ["n1", "n2"]}, str(tmp_path))
    checks = decide(fields, {host: settings(profile_file=path) for host in fields})
    assert all(node_status(node) == "pass" for node in checks.values())


def test_baseline_refuses_a_run_that_did_not_pass_and_keeps_an_existing_profile(tmp_path):
    with pytest.raises(baseline.BaselineError, match="not pass"):
        baseline.record(verdict("fail", {"n1": H100}), "/r/v.json", {"g": ["n1"]}, str(tmp_path))
    (tmp_path / "g.yml").write_text("keep me\n")
    with pytest.raises(baseline.BaselineError, match="--force"):
        baseline.record(verdict(fields_by_host={"n1": H100}), "/r/v.json", {"g": ["n1"]}, str(tmp_path))
    assert (tmp_path / "g.yml").read_text() == "keep me\n"
    baseline.record(verdict(fields_by_host={"n1": H100}), "/r/v.json", {"g": ["n1"]}, str(tmp_path), force=True)
    assert yaml.safe_load((tmp_path / "g.yml").read_text())["fields"]["gpu.count"] == 8


def test_inventory_groups_come_from_ansibles_inventory_loader(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"cluster": {"children": {"gpu_h100": {"hosts": {"n1": {}, "n2": {}}},
                                                              "cpu": {"hosts": {"c1": {}}}}}}))
    groups = baseline.inventory_groups(str(inventory))
    assert sorted(groups["gpu_h100"]) == ["n1", "n2"] and sorted(groups["cluster"]) == ["c1", "n1", "n2"]
    assert "all" not in groups and "ungrouped" not in groups


def test_the_all_node_fields_come_from_the_confirmation_run_when_a_sick_peer_failed_the_first_one():
    sizes = [{"size_bytes": 1 << 20, "busbw_gbps": 0.2}, {"size_bytes": 16 << 20, "busbw_gbps": 0.5}]
    passed_run = {"status": "pass", "backend": "gloo", "hosts": ["n1", "n2"], "sizes": sizes}
    assert profiles.run_fields(passed_run, "n2") == {"allreduce.backend": "gloo", "allreduce.largest_size": 16 << 20,
                                                     "allreduce.busbw_gbps": 0.5}
    failed_run = {"status": "fail", "backend": "gloo", "hosts": ["n1", "n2", "n3"], "sizes": [],
                  "confirm": {"status": "pass", "hosts": ["n1", "n2"], "sizes": sizes}}
    assert profiles.run_fields(failed_run, "n1")["allreduce.busbw_gbps"] == 0.5
    # The node named bad was not in the confirmation run: nothing measured for it.
    assert profiles.run_fields(failed_run, "n3") == {}
    assert profiles.run_fields(dict(failed_run, confirm={"status": "fail", "hosts": ["n1", "n2"]}), "n1") == {}
    # Every node at once: the same fields, each node's a dict of its own (the node's own fields are added to it).
    every = profiles.run_fields_by_host(failed_run, ["n1", "n2", "n3"])
    assert every == {host: profiles.run_fields(failed_run, host) for host in ("n1", "n2", "n3")}
    assert every["n1"] is not every["n2"]


def test_one_rank_records_no_busbw_in_the_profile():
    """A one-GPU node's gate (world size 1) measures no link: its busbw is never a known-good value."""
    sizes = [{"size_bytes": 1 << 30, "busbw_gbps": 38503.9, "algbw_gbps": 38503.9}]
    alone = {"status": "pass", "backend": "nccl", "hosts": ["g1"], "sizes": sizes, "world_size": 1}
    assert profiles.run_fields(alone, "g1") == {"allreduce.backend": "nccl", "allreduce.largest_size": None,
                                                "allreduce.busbw_gbps": None}
