"""limits_dropin against a sandbox /etc/security and /etc/pam.d."""

import errno
import hashlib
import os

import pytest

import limits_dropin
from capability_helpers import link_hashes, read_text as read, write

DROPIN = "/etc/security/limits.d/90-preflight-core.conf"
LIMITS_CONF = (
    "# /etc/security/limits.conf\n"
    "#\n"
    "#<domain>      <type>  <item>         <value>\n"
    "#*               soft    core            0\n"
    "@student        -       maxlogins       4\n"
    "*               soft    nofile          65536   # site default\n"
    "\t\n"
    "# End of file\n"
)


def tree_hashes(root):
    result = {}
    for directory, _dirs, files in os.walk(str(root)):
        for name in files:
            with open(os.path.join(directory, name), "rb") as handle:
                result[os.path.join(directory, name)] = hashlib.sha256(handle.read()).hexdigest()
    return result


@pytest.fixture
def sandbox(tmp_path):
    write(tmp_path, "/etc/security/limits.conf", LIMITS_CONF)
    os.makedirs(str(tmp_path / "etc/security/limits.d"))
    write(tmp_path, "/etc/pam.d/sshd", "# PAM for sshd\nsession    required     pam_limits.so\n")
    write(tmp_path, "/etc/pam.d/cron", "#session required pam_limits.so\n")
    return tmp_path


def args(root, **extra):
    result = {"root": str(root)}
    result.update(extra)
    return result


def managed_lines(text):
    return [line.split() for line in text.splitlines() if line and not line.startswith("#")]


def test_four_steps_check_apply_reapply_diff(run_module, sandbox):
    before = tree_hashes(sandbox)
    result, failed = run_module(limits_dropin, args(sandbox), check_mode=True, diff=True)
    assert not failed
    assert result["changed"] is True
    assert tree_hashes(sandbox) == before
    assert result["checks"]["core_limits"]["status"] == "fail"
    assert "does not exist" in result["checks"]["core_limits"]["found"]
    assert result["diff"]["before"] == ""
    assert "*          hard  core     unlimited\n" in result["diff"]["after"]

    result, failed = run_module(limits_dropin, args(sandbox))
    assert not failed and result["changed"] is True
    assert managed_lines(read(sandbox, DROPIN)) == [
        ["*", "soft", "core", "unlimited"], ["*", "hard", "core", "unlimited"],
        ["root", "soft", "core", "unlimited"], ["root", "hard", "core", "unlimited"]]
    assert read(sandbox, DROPIN).startswith("# Managed by the cluster preflight")
    assert {name: check["status"] for name, check in result["checks"].items()} == {
        "core_limits": "pass", "core_limits_conflicts": "pass", "core_limits_pam": "pass"}
    assert result["pam_services"] == ["/etc/pam.d/sshd"]

    applied = tree_hashes(sandbox)
    result, failed = run_module(limits_dropin, args(sandbox), diff=True)
    assert not failed and result["changed"] is False
    assert result["diff"]["before"] == result["diff"]["after"]
    assert tree_hashes(sandbox) == applied


def test_limits_conf_untouched_byte_for_byte(run_module, sandbox):
    path = os.path.join(str(sandbox), "etc/security/limits.conf")
    with open(path, "rb") as handle:
        original = handle.read()
    _result, failed = run_module(limits_dropin, args(sandbox, backup=True))
    assert not failed
    with open(path, "rb") as handle:
        assert handle.read() == original


def test_backup_of_a_replaced_dropin(run_module, sandbox):
    write(sandbox, DROPIN, "* soft core 0\n")
    result, failed = run_module(limits_dropin, args(sandbox, backup=True))
    assert not failed and result["changed"]
    with open(result["backup_file"]) as handle:
        assert handle.read() == "* soft core 0\n"
    result, failed = run_module(limits_dropin, args(sandbox, backup=True))
    assert "backup_file" not in result


def test_foreign_lines_in_the_dropin_are_drift(run_module, sandbox):
    _result, _failed = run_module(limits_dropin, args(sandbox))
    with open(os.path.join(str(sandbox), DROPIN.lstrip("/")), "a") as handle:
        handle.write("alice hard nofile 10\n")
    result, _failed = run_module(limits_dropin, args(sandbox, state="audit", policy="warn"))
    assert result["checks"]["core_limits"]["status"] == "warn"
    assert "other lines" in result["checks"]["core_limits"]["found"]


@pytest.mark.parametrize("extra, bad", [
    ({"types": ["soft", "sofft"]}, "'sofft'"),
    ({"item": "cores"}, "'cores'"),
    ({"value": "lots"}, "'lots'"),
    ({"value": "-5"}, "'-5'"),
    ({"item": "nice", "value": "40"}, "'40'"),
    ({"domains": ["bad domain"]}, "'bad domain'"),
    ({"path": "/etc/security/limits.d/90-core"}, "90-core"),
    ({"path": "/etc/security/limits.conf"}, "limits.conf"),
])
def test_bad_input_fails_up_front_naming_the_value_and_the_man_page(run_module, sandbox, extra, bad):
    before = tree_hashes(sandbox)
    result, failed = run_module(limits_dropin, args(sandbox, **extra))
    assert failed
    assert bad in result["msg"]
    assert "man limits.conf" in result["msg"]
    assert tree_hashes(sandbox) == before


def test_dash_type_and_infinity_are_accepted(run_module, sandbox):
    result, failed = run_module(limits_dropin, args(sandbox, types=["-"], value="infinity", domains=["@gpu"]))
    assert not failed
    assert managed_lines(read(sandbox, DROPIN)) == [["@gpu", "-", "core", "infinity"]]


def test_conflicting_lines_that_win_are_findings(run_module, sandbox):
    with open(os.path.join(str(sandbox), "etc/security/limits.conf"), "a") as handle:
        handle.write("*    hard core 0\n")       # read before ours: ours wins for '*'
        handle.write("alice hard core 0\n")      # a user line wins for alice wherever it is
    write(sandbox, "/etc/security/limits.d/10-root.conf", "root hard core 0\n")   # earlier: ours wins
    write(sandbox, "/etc/security/limits.d/95-site.conf", "# site\n* - core 0\n")  # later: wins for '*'
    write(sandbox, "/etc/security/limits.d/96-ok.conf", "* soft core unlimited\n@gpu hard nofile 1\n")
    result, failed = run_module(limits_dropin, args(sandbox, policy="warn"))
    assert not failed
    found = sorted((c["file"], c["line"], c["overrides"]) for c in result["conflicts"])
    assert found == [
        ("/etc/security/limits.conf", 10, "* hard"),
        ("/etc/security/limits.d/95-site.conf", 2, "* hard"),
        ("/etc/security/limits.d/95-site.conf", 2, "* soft"),
    ]
    check = result["checks"]["core_limits_conflicts"]
    assert check["status"] == "warn"
    assert "'alice hard core 0' at /etc/security/limits.conf:10" in check["found"]
    assert "user alice" in check["found"]
    assert "/etc/security/limits.d/95-site.conf:2" in check["fix"]


def test_later_root_line_conflicts_for_root(run_module, sandbox):
    write(sandbox, "/etc/security/limits.d/99-root.conf", "root soft core 0\n")
    result, _failed = run_module(limits_dropin, args(sandbox))
    assert [(c["domain"], c["overrides"]) for c in result["conflicts"]] == [("root", "root soft")]
    assert result["checks"]["core_limits_conflicts"]["status"] == "fail"


def test_no_pam_limits_is_a_finding_and_no_pam_dir_not_applicable(run_module, sandbox):
    os.remove(os.path.join(str(sandbox), "etc/pam.d/sshd"))
    result, _failed = run_module(limits_dropin, args(sandbox, policy="warn"), check_mode=True)
    assert result["checks"]["core_limits_pam"]["status"] == "warn"
    assert "pam_limits.so" in result["checks"]["core_limits_pam"]["fix"]
    result, _failed = run_module(limits_dropin, args(sandbox, pam_dir="/nonexistent/pam.d"), check_mode=True)
    assert result["checks"]["core_limits_pam"]["status"] == "not_applicable"


def test_audit_writes_nothing(run_module, sandbox):
    before = tree_hashes(sandbox)
    result, failed = run_module(limits_dropin, args(sandbox, state="audit"), diff=True)
    assert not failed and result["changed"] is False
    assert "diff" not in result
    assert result["checks"]["core_limits"]["status"] == "fail"
    assert tree_hashes(sandbox) == before


# -- symlinks and a read-only /etc ---------------------------------------------------------------------


@pytest.mark.parametrize("check_mode", [True, False])
def test_a_symlinked_dropin_is_refused_and_nothing_is_written(run_module, sandbox, check_mode):
    write(sandbox, "/srv/shared/limits.conf", "* hard core 0\n")
    os.symlink(os.path.join(str(sandbox), "srv/shared/limits.conf"), os.path.join(str(sandbox), DROPIN.lstrip("/")))
    before = link_hashes(sandbox)
    result, failed = run_module(limits_dropin, args(sandbox), check_mode=check_mode)
    assert failed and result["changed"] is False
    assert link_hashes(sandbox) == before, "neither the link nor the shared file it points to is touched"
    assert result["link"] == DROPIN and result["link_target"].endswith("srv/shared/limits.conf")
    assert "is a symlink to" in result["found"] and "regular file" in result["expected"]
    assert "rm %s" % DROPIN in result["fix"]


def test_an_audit_of_a_symlinked_dropin_is_not_refused(run_module, sandbox):
    os.symlink("/dev/null", os.path.join(str(sandbox), DROPIN.lstrip("/")))
    result, failed = run_module(limits_dropin, args(sandbox, state="audit", policy="warn"))
    assert not failed and result["changed"] is False


def test_a_read_only_etc_is_a_clean_failure(run_module, sandbox, monkeypatch):
    from ansible.module_utils import basic

    def read_only(self, src, dest, unsafe_writes=False):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(basic.AnsibleModule, "atomic_move", read_only)
    before = tree_hashes(sandbox)
    result, failed = run_module(limits_dropin, args(sandbox))
    assert failed and result["changed"] is False
    assert result["found"].startswith("cannot write %s on " % DROPIN) and "Read-only file system" in result["found"]
    assert result["expected"] == "/etc/security/limits.d writable by the bring-up"
    assert "read-only" in result["fix"] and all(part in result["msg"] for part in ("Found:", "Expected:", "Fix:"))
    assert tree_hashes(sandbox) == before, "no drop-in, no temp file"
    result, failed = run_module(limits_dropin, args(sandbox), check_mode=True)
    assert not failed and result["changed"] is True
