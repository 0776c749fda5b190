"""write_atomic, the one writer under every module that edits a node's files: a symlink is refused
(never written over or through), a write the node refuses is a clean failure with found / expected /
fix, a new file gets exactly its mode whatever the umask."""

import errno
import os
import stat

import pytest

from ansible.module_utils import basic
from preflight_node.host import files as pf
from capability_helpers import saved_umask


class Exit(Exception):
    def __init__(self, result):
        super().__init__(result.get("msg"))
        self.result = result


class FakeModule(object):
    """What write_atomic uses of an AnsibleModule; atomic_move and backup_local are Ansible's own."""

    check_mode = False

    def __init__(self):
        self.backups = []

    def fail_json(self, msg, **kwargs):
        raise Exit(dict(kwargs, msg=msg, failed=True))

    def atomic_move(self, src, dest, unsafe_writes=False):
        return basic.AnsibleModule.atomic_move(self, src, dest, unsafe_writes=unsafe_writes)

    def backup_local(self, path):
        return basic.AnsibleModule.backup_local(self, path)

    def preserved_copy(self, src, dest):
        return basic.AnsibleModule.preserved_copy(self, src, dest)

    def selinux_enabled(self):
        return False


def snapshot(root):
    """Every entry under root: symlinks by target, files by content and mode."""
    found = {}
    for directory, dirs, files in os.walk(str(root)):
        for name in dirs + files:
            full = os.path.join(directory, name)
            if os.path.islink(full):
                found[full] = ("link", os.readlink(full))
            elif os.path.isfile(full):
                with open(full, "rb") as handle:
                    found[full] = ("file", handle.read(), stat.S_IMODE(os.lstat(full).st_mode))
    return found


umask = pytest.fixture(saved_umask)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o644), (0o000, 0o600), (0o000, 0o644)])
def test_a_new_file_gets_exactly_its_mode_whatever_the_umask(tmp_path, umask, mask, mode):
    umask(mask)
    path = str(tmp_path / "etc" / "x.conf")
    os.makedirs(os.path.dirname(path))
    assert pf.write_atomic(FakeModule(), path, "a = 1\n", mode=mode) is None
    assert stat.S_IMODE(os.stat(path).st_mode) == mode
    assert open(path).read() == "a = 1\n"
    assert os.listdir(os.path.dirname(path)) == ["x.conf"], "no temp file left behind"


def test_an_existing_file_keeps_its_mode_and_foreign_bytes_survive(tmp_path):
    path = tmp_path / "x.conf"
    path.write_text("old\n")
    path.chmod(0o600)
    pf.write_atomic(FakeModule(), str(path), "caf\udce9\n", mode=0o644)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes() == b"caf\xe9\n"


@pytest.mark.parametrize("target, words", [
    ("../sysctl.conf", "is a symlink to ../sysctl.conf (/etc/sysctl.conf)"),
    ("/dev/null", "is a mask (a link to /dev/null)"),
    ("gone.conf", "is a dangling symlink to gone.conf"),
])
def test_a_symlink_is_refused_naming_the_link_and_its_target(tmp_path, target, words):
    etc = tmp_path / "etc"
    (etc / "sysctl.d").mkdir(parents=True)
    (etc / "sysctl.conf").write_text("vm.swappiness = 10\n")
    link = etc / "sysctl.d" / "99-sysctl.conf"
    os.symlink(target, str(link))
    before = snapshot(tmp_path)
    with pytest.raises(Exit) as caught:
        pf.write_atomic(FakeModule(), str(link), "kernel.x = 1\n", logical="/etc/sysctl.d/99-sysctl.conf",
                        backup=True)
    result = caught.value.result
    assert snapshot(tmp_path) == before, "neither the link nor its target is touched, no backup, no temp file"
    assert words in result["found"] and result["found"].startswith("/etc/sysctl.d/99-sysctl.conf on ")
    assert result["link"] == "/etc/sysctl.d/99-sysctl.conf" and result["link_target"] == target
    assert "regular file" in result["expected"] and result["fix"]
    assert all(part in result["msg"] for part in ("Found:", "Expected:", "Fix:"))


def raise_in_mkstemp(monkeypatch, code):
    def refuse(*_args, **_kwargs):
        raise OSError(code, os.strerror(code))
    monkeypatch.setattr(pf.tempfile, "mkstemp", refuse)


def raise_in_atomic_move(monkeypatch, code, wrapped):
    def refuse(self, src, dest, unsafe_writes=False):
        if not wrapped:
            raise OSError(code, os.strerror(code))
        # What Ansible's atomic_move does with an error it does not work around.
        try:
            raise OSError(code, os.strerror(code))
        except OSError as exc:
            raise Exception("Could not replace %r with %r." % (dest, src)) from exc
    monkeypatch.setattr(FakeModule, "atomic_move", refuse)


@pytest.mark.parametrize("where", ["mkstemp", "atomic_move", "atomic_move wrapped"])
@pytest.mark.parametrize("code, fix_words", [
    (errno.EROFS, "read-only"),
    (errno.EACCES, "preflight_become"),
    (errno.EPERM, "chattr -i"),
    (errno.ENOSPC, "free space"),
])
def test_a_refused_write_is_a_clean_failure_with_found_expected_fix(tmp_path, monkeypatch, where, code, fix_words):
    path = tmp_path / "x.conf"
    path.write_text("old\n")
    if where == "mkstemp":
        raise_in_mkstemp(monkeypatch, code)
    else:
        raise_in_atomic_move(monkeypatch, code, wrapped=where.endswith("wrapped"))
    with pytest.raises(Exit) as caught:
        pf.write_atomic(FakeModule(), str(path), "new\n", logical="/etc/x.conf", result={"changed": False})
    result = caught.value.result
    assert result["found"].startswith("cannot write /etc/x.conf on ") and os.strerror(code) in result["found"]
    assert result["expected"] == "/etc writable by the bring-up"
    assert fix_words in result["fix"] and result["path"] == "/etc/x.conf" and result["changed"] is False
    assert path.read_text() == "old\n"
    assert sorted(os.listdir(str(tmp_path))) == ["x.conf"], "the temp file is removed"
