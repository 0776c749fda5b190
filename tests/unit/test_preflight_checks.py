import pytest

from preflight_node import checks as pc


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


# -- the contract shared by modules, decisions and the verdict ------------------

@pytest.mark.parametrize("bad, words", [
    ({"status": "ok", "found": "x", "expected": "y", "fix": ""}, "unknown status 'ok'"),
    ({"status": "fail", "found": "x", "expected": "y", "fix": ""}, "a fail without a fix"),
    ({"status": "pass", "found": 3, "expected": "y", "fix": ""}, "found is int"),
    ("pass", "not a dict"),
    ({}, "unknown status None"),
])
def test_a_malformed_check_becomes_a_fail_that_says_how(bad, words):
    result = pc.normalize(bad, "n1 / kernel_debug.ptrace_scope")
    assert result["status"] == "fail"
    assert words in result["found"] and "n1 / kernel_debug.ptrace_scope" in result["found"]
    assert result["fix"]


def test_a_well_formed_check_keeps_its_fields_and_details():
    result = pc.normalize(pc.warned("a", "b", "c", peers=["n2"]), "n1 / x.y")
    assert result == {"status": "warn", "found": "a", "expected": "b", "fix": "c", "details": {"peers": ["n2"]}}


def test_checks_are_namespaced_by_capability_and_a_taken_name_is_an_error():
    flat = {}
    pc.add(flat, "kernel_debug", "ptrace_scope", pc.passed("0", "0"))
    pc.add(flat, "core_dumps", "ptrace_scope", pc.failed("1", "0", "fix"))
    assert set(flat) == {"kernel_debug.ptrace_scope", "core_dumps.ptrace_scope"}
    with pytest.raises(pc.CheckError, match="two checks named kernel_debug.ptrace_scope on n1"):
        pc.add(flat, "kernel_debug", "ptrace_scope", pc.passed("0", "0"), "n1")
    assert flat["kernel_debug.ptrace_scope"]["status"] == "pass", "a pass never overwrites"


@pytest.mark.parametrize("capability, name", [("Kernel", "x"), ("kernel_debug", "a.b"), ("kernel_debug", ""),
                                              ("kernel-debug", "x"), ("kernel_debug", None)])
def test_names_outside_the_contract_are_refused(capability, name):
    with pytest.raises(pc.CheckError):
        pc.qualify(capability, name)


def test_put_refuses_a_second_check_with_the_same_name_for_a_node():
    by_host = pc.put({}, "n1", "allreduce", {"ranks": pc.passed("ok", "ok")})
    with pytest.raises(pc.CheckError):
        pc.put(by_host, "n1", "allreduce", {"ranks": pc.passed("ok", "ok")})
    pc.put(by_host, "n2", "allreduce", {"ranks": pc.passed("ok", "ok")})


def test_blocked_is_unverified_unless_something_failed():
    checks = {"a.x": pc.passed("1", "1"), "b.y": pc.blocked("not run: n2 is down")}
    assert pc.node_status(checks) == "unverified"
    checks["c.z"] = pc.failed("3", "1", "fix it")
    assert pc.node_status(checks) == "fail"
    assert pc.node_status({"a.x": pc.warned("2", "1", "fix", blocked=True)}) == "unverified"


def test_an_unknown_status_counts_as_the_worst():
    assert pc.worst(["pass", "bogus"]) == "fail"
    assert pc.node_status({"a.x": {"status": "bogus"}}) == "fail"


def test_decision_shape():
    assert pc.decision() == {"ok": True, "blockers": [], "checks_by_host": {}}
    assert pc.decision(blockers=["x"], plan=1)["ok"] is False
