"""Every input checked once, up front (cluster_preflight/settings/pipeline.py, cluster_preflight/settings/checks.py):
a variable with a role's prefix that nothing reads, a number that is not finite or out of its range, an inventory
name that is no file name -- each stops the run with found / expected / fix before any node is touched."""

import os
import sys

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar

from cluster_preflight.settings import pipeline
from verdict_build_helpers import build, records

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _settings(_args=None, **task_vars):
    """preflight_settings run for one node with ``task_vars`` (as -e or the inventory gives them) and the task's
    arguments ``_args``."""
    loader = DataLoader()
    host = task_vars.pop("inventory_hostname", "node01")
    base = {"inventory_hostname": host, "groups": {"all": [host], "cluster": [host]},
            "preflight_training_python": sys.executable}
    return pipeline.load(loader, Templar(loader), dict(base, **task_vars), dict(_args or {}))


def _errors(result):
    return {item["name"]: item for item in result["errors"]}


def test_the_defaults_are_valid():
    result = _settings()
    assert result["ok"] and result["errors"] == [] and result["input_warnings"] == []


def test_a_typo_in_a_variable_on_the_command_line_stops_the_run_with_a_did_you_mean():
    result = _settings(allreduce_floor_busbw_gbps_ncll="300")
    assert not result["ok"]
    error = _errors(result)["allreduce_floor_busbw_gbps_ncll"]
    assert error["fix"].startswith("did you mean allreduce_floor_busbw_gbps_nccl? ")
    assert "preflight_unknown_variables: warn" in error["fix"]
    assert "allreduce_floor_busbw_gbps_ncll" in result["msg"]


@pytest.mark.parametrize("name", ["preflight_jobuser", "core_dumps_patern", "gpu_health_tool_timout",
                                  "ssh_trust_port_", "diagnose_stack_budgett"])
def test_every_role_prefix_is_checked(name):
    assert name in _errors(_settings(**{name: "1"}))


def test_what_the_project_itself_reads_is_never_unknown():
    """The playbooks' own switches, internal variables and stage results, and other tools' variables."""
    result = _settings(preflight_group="cluster", preflight_results_dir="/tmp/r", preflight_become=True,
                       allreduce_module_args={}, preflight_facts={}, port_mesh_probe={}, ansible_user="root",
                       preflightish="x", my_allreduce_x=1)
    assert result["ok"], result["errors"]


def test_under_the_switch_an_unknown_variable_is_a_warning_on_the_node():
    result = _settings(allreduce_floor_busbw_gbps_ncll="300", preflight_unknown_variables="warn")
    assert result["ok"] and result["errors"] == []
    assert [item["name"] for item in result["input_warnings"]] == ["allreduce_floor_busbw_gbps_ncll"]
    verdict = build(["n1"], {"n1": records(settings=result)}, [{"checks_by_host": {}}])
    check = verdict["nodes"]["n1"]["checks"]["preflight.unknown_variables"]
    assert check["status"] == "warn"
    assert "allreduce_floor_busbw_gbps_ncll (did you mean allreduce_floor_busbw_gbps_nccl?)" in check["found"]


@pytest.mark.parametrize("name, value", [
    ("allreduce_floor_busbw_gbps_nccl", "nan"),  # NaN compares false with every busbw: the gate would be off
    ("allreduce_floor_busbw_gbps_gloo", "NaN"),
    ("allreduce_floor_relative", "nan"),
    ("allreduce_timeout", "inf"),  # passes "0 < timeout < hard" with an infinite hard timeout
    ("allreduce_hard_timeout", "inf"),
    ("allreduce_stack_budget", "-inf"),
    ("port_mesh_window", "1e308"),
    ("profile_busbw_tolerance", "nan"),
    ("preflight_facts_timeout", "99999999999999999999"),
    ("allreduce_sizes", [1048576, 10 ** 30]),
    ("gpu_health_xid_ignore", [79, -1]),
])
def test_a_number_that_is_not_finite_or_out_of_its_range_stops_the_run(name, value):
    result = _settings(**{name: value})
    assert not result["ok"], "%s=%r was accepted" % (name, value)
    error = _errors(result)[name]
    assert "from" in error["expected"] and name in error["fix"]


@pytest.mark.parametrize("host", ["../../x", "a/b", ".hidden", "bad name", "x\x1b[31m"])
def test_an_inventory_name_that_is_no_file_name_stops_the_run(host):
    result = _settings(inventory_hostname=host)
    assert not result["ok"]
    assert "not usable as a file name" in _errors(result)["inventory_hostname"]["found"]


@pytest.mark.parametrize("host", ["node01", "gpu-a1.example.com", "198.18.0.7", "fe80::1", "localhost", "n_1"])
def test_usual_host_names_and_addresses_are_file_names(host):
    assert _settings(inventory_hostname=host)["ok"]


def test_every_numeric_setting_has_a_range_and_every_range_a_setting():
    from cluster_preflight.settings import checks as settings_check

    from capability_helpers import role_inputs  # pylint: disable=import-outside-toplevel

    numeric, ranged = set(), set()
    for role in sorted(os.listdir(os.path.join(ROOT, "roles"))):
        options = role_inputs(role)[1]
        numeric |= {name for name, option in options.items() if settings_check.is_numeric(option)}
        ranged |= {name for name in settings_check.ranges_of(role) if name.startswith(role + "_")}
    assert numeric == ranged


def test_every_default_is_within_its_range():
    from cluster_preflight.settings import checks as settings_check

    from capability_helpers import role_inputs  # pylint: disable=import-outside-toplevel

    for role in sorted(os.listdir(os.path.join(ROOT, "roles"))):
        defaults = role_inputs(role)[0]
        for name, (low, high) in settings_check.ranges_of(role).items():
            value = defaults.get(name)
            if isinstance(value, (int, float)):
                assert low <= value <= high, (name, value)
            elif isinstance(value, list):
                assert all(low <= item <= high for item in value), (name, value)


def test_invalid_settings_stop_the_run_and_the_verdict_says_stopped():
    result = _settings(allreduce_floor_busbw_gbps_nccl="nan")
    verdict = build(["n1", "n2"], {"n1": records(settings=result), "n2": records()},
                    [{"invalid_hosts": ["n1"], "checks_by_host": {}}])
    assert verdict["stopped"] == "invalid settings on n1"
    assert verdict["nodes"]["n1"]["checks"]["allreduce.inputs"]["status"] == "fail"


@pytest.mark.parametrize("params", [{"stack_budget": float("nan")}, {"stack_budget": float("inf")},
                                    {"stack_budget": 20, "core_dir": "/var/cores", "core_timeout": float("nan")}])
def test_diagnose_refuses_a_bound_that_is_not_a_finite_number_of_seconds(params):
    """diagnose.yml validates its bounds in its node call (it has no settings stage)."""
    from preflight_node import diagnose

    assert diagnose.validate(params)
