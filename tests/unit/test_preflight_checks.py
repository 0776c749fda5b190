import pytest

from ansible.module_utils import preflight_checks as pc


def test_fail_requires_fix():
    with pytest.raises(ValueError):
        pc.check("fail", "x", "y")


def test_unknown_status_rejected():
    with pytest.raises(ValueError):
        pc.check("ok", "x", "y")


def test_node_status_orders_fail_over_warn_and_ignores_not_applicable():
    checks = {
        "a": pc.passed("1", "1"),
        "b": pc.not_applicable("no Yama LSM"),
        "c": pc.warned("2", "1", "set it"),
    }
    assert pc.node_status(checks) == "warn"
    checks["d"] = pc.failed("3", "1", "fix it")
    assert pc.node_status(checks) == "fail"
    assert pc.node_status({"a": pc.skipped("switched off")}) == "pass"


def test_describe_names_host_found_expected_fix():
    msg = pc.describe("node1", "torch_import", pc.failed("no torch", "torch 2.13.0", "pip install torch"))
    assert "node1" in msg and "Found: no torch" in msg and "Expected: torch 2.13.0" in msg
    assert "Fix: pip install torch" in msg
