"""What a reader without root could not observe: blocked ("needs root"), never failed; a comparison with a
fallback never passes (module_utils/preflight_node/privilege.py, and blocked()'s fix)."""

from preflight_node import checks as pc
from preflight_node import privilege as pp

DENIED = "/etc/sysctl.d/99-x.conf cannot be read: Permission denied"


def test_blocked_carries_a_fix_and_stays_compatible():
    old = pc.blocked("not checked: node2 is down", "node2 up")
    assert old["status"] == "skipped" and old["fix"] == "" and pc.is_blocked(old)
    new = pc.blocked("needs root: x", "y", "set preflight_become: true (or connect as root)")
    assert new["fix"].startswith("set preflight_become") and pc.is_blocked(new)
    assert pc.normalize(new, "n1 / a.b") == new
    assert pc.node_status({"a.b": new, "a.c": pc.passed("fine", "fine")}) == "unverified"


def test_only_a_refusal_without_root_needs_root():
    pairs = [("/etc/sysctl.d/99-x.conf", DENIED), ("/etc/y", "Input/output error"), ("", "Permission denied")]
    assert pp.refused(pairs, is_privileged=False) == [{"path": "/etc/sysctl.d/99-x.conf", "error": DENIED}]
    assert pp.refused(pairs, is_privileged=True) == []
    assert pp.denied("Operation not permitted") and not pp.denied("No such file or directory")
    assert pp.unprivileged({"privileged": False}) and not pp.unprivileged({}) and not pp.unprivileged(None)


def test_file_errors_reads_every_shape_the_shared_readers_give():
    assert pp.file_errors({"runtime_path": "/proc/sys/a", "runtime_error": "e1", "dropin": "/etc/d", "dropin_error":
                           "e2", "unreadable": [{"path": "/etc/u", "error": "e3"}]}) == [
        ("/proc/sys/a", "e1"), ("/etc/d", "e2"), ("/etc/u", "e3")]
    assert pp.file_errors({"path": "/etc/l", "error": "e4", "unreadable": []}) == [("/etc/l", "e4")]
    assert pp.file_errors({"errors": {"/etc/default/grub": "e5"}}) == [("/etc/default/grub", "e5")]
    assert pp.file_errors(None) == []


def test_a_warn_or_fail_about_a_refused_file_is_blocked_the_rest_kept():
    checks = {"a": pc.failed(DENIED, "readable", "fix it"), "b": pc.failed("/etc/other is wrong", "right", "fix"),
              "c": pc.passed("/etc/sysctl.d/99-x.conf holds it", "it")}
    result = pp.block_refused(checks, [{"path": "/etc/sysctl.d/99-x.conf", "error": DENIED}])
    assert result["a"]["status"] == "skipped" and pc.is_blocked(result["a"])
    assert result["a"]["found"].startswith("needs root: ") and result["a"]["fix"] == pp.BECOME_FIX
    assert result["b"]["status"] == "fail" and result["c"]["status"] == "pass"
    assert pp.block_refused(checks, []) is checks


def test_a_comparison_with_a_fallback_is_at_most_a_warning():
    note = "compared with /etc/ssh/*.pub, assumed because the running sshd could not be found without root"
    result = pp.assumed(pc.passed("same keys", "the served keys"), note, pp.BECOME_FIX)
    assert result["status"] == "warn" and result["found"] == "same keys; " + note and result["fix"] == pp.BECOME_FIX
    kept = pp.assumed(pc.failed("other keys", "the served keys", "fix"), note, pp.BECOME_FIX)
    assert kept["status"] == "fail" and kept["found"].endswith(note) and kept["fix"] == "fix"
