"""safe_directory (the core directory of bring-up) against a sandbox tree, as root on a node where other accounts
live: check -> apply -> re-apply -> diff, and no link followed, no path another account controls, by a mode or
owner change."""

import os
import pwd
import stat

import pytest

import safe_directory

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sets an owner: root only")


def _mode(path):
    return stat.S_IMODE(os.lstat(str(path)).st_mode)


@pytest.fixture
def sandbox(tmp_path):
    """A node's tree: /var/tmp world-writable and sticky, as on every distribution; /etc root's, 0755."""
    (tmp_path / "var" / "tmp").mkdir(parents=True)
    os.chmod(str(tmp_path / "var" / "tmp"), 0o1777)
    (tmp_path / "etc").mkdir()
    os.chmod(str(tmp_path / "etc"), 0o755)
    (tmp_path / "etc" / "shadow").write_text("root:x:\n")
    return tmp_path


def args(root, path="/var/tmp/cores", mode="1777"):
    return {"path": path, "mode": mode, "owner": "root", "group": "root", "root": str(root)}


def test_four_steps_check_apply_reapply_diff(run_module, sandbox):
    result, failed = run_module(safe_directory, args(sandbox), check_mode=True, diff=True)
    assert not failed and result["changed"] is True
    assert not (sandbox / "var/tmp/cores").exists(), "check mode created the directory"
    assert result["diff"]["before"] == {"state": "absent"}
    assert result["diff"]["after"]["mode"] == "1777"

    result, failed = run_module(safe_directory, args(sandbox), diff=True)
    assert not failed and result["changed"] is True
    assert _mode(sandbox / "var/tmp/cores") == 0o1777 and os.lstat(str(sandbox / "var/tmp/cores")).st_uid == 0
    assert result["state"] == {"state": "directory", "mode": "1777", "uid": 0, "gid": 0}

    result, failed = run_module(safe_directory, args(sandbox), diff=True)
    assert not failed and result["changed"] is False
    assert result["diff"]["before"] == result["diff"]["after"]

    os.chmod(str(sandbox / "var/tmp/cores"), 0o755)
    result, failed = run_module(safe_directory, args(sandbox), check_mode=True, diff=True)
    assert result["changed"] and result["diff"]["before"]["mode"] == "0755" and _mode(sandbox / "var/tmp/cores") == 0o755


def test_missing_parents_are_made_root_s_0755(run_module, sandbox):
    result, failed = run_module(safe_directory, args(sandbox, "/var/crash/preflight/cores"))
    assert not failed and result["changed"]
    assert _mode(sandbox / "var/crash") == 0o755 and _mode(sandbox / "var/crash/preflight/cores") == 0o1777


@pytest.mark.parametrize("check_mode", [True, False])
def test_a_link_planted_in_a_world_writable_parent_is_never_followed(run_module, sandbox, check_mode):
    """A user's /var/tmp/cores -> /etc: following it would make /etc world-writable."""
    os.symlink(str(sandbox / "etc"), str(sandbox / "var/tmp/cores"))
    os.lchown(str(sandbox / "var/tmp/cores"), 65534, 65534)
    result, failed = run_module(safe_directory, args(sandbox), check_mode=check_mode)
    assert failed and "symbolic link" in result["found"] and "never followed" in result["found"]
    assert _mode(sandbox / "etc") == 0o755 and os.lstat(str(sandbox / "etc")).st_uid == 0


def test_a_link_on_the_way_is_not_followed_either(run_module, sandbox):
    os.symlink(str(sandbox / "etc"), str(sandbox / "var/tmp/x"))
    result, failed = run_module(safe_directory, args(sandbox, "/var/tmp/x/cores"))
    assert failed and "/var/tmp/x is a symbolic link" in result["found"]
    assert not (sandbox / "etc" / "cores").exists()


def test_a_directory_another_account_made_first_is_refused(run_module, sandbox):
    (sandbox / "var/tmp/cores").mkdir()
    nobody = pwd.getpwnam("nobody")
    os.chown(str(sandbox / "var/tmp/cores"), nobody.pw_uid, nobody.pw_gid)
    result, failed = run_module(safe_directory, args(sandbox))
    assert failed and "owned by uid %d" % nobody.pw_uid in result["found"]
    assert os.lstat(str(sandbox / "var/tmp/cores")).st_uid == nobody.pw_uid


def test_a_parent_others_can_write_without_the_sticky_bit_is_refused(run_module, sandbox):
    (sandbox / "srv").mkdir()
    os.chmod(str(sandbox / "srv"), 0o777)
    result, failed = run_module(safe_directory, args(sandbox, "/srv/cores"))
    assert failed and "/srv is writable by others" in result["found"]
    assert not (sandbox / "srv" / "cores").exists()


def test_a_file_in_the_way_and_a_bad_mode_fail_with_found_expected_fix(run_module, sandbox):
    (sandbox / "var/tmp/cores").write_text("")
    result, failed = run_module(safe_directory, args(sandbox))
    assert failed and "exists and is not a directory" in result["found"] and "Fix:" in result["msg"]
    result, failed = run_module(safe_directory, args(sandbox, mode="rwx"))
    assert failed and "octal" in result["msg"]
