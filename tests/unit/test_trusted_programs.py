"""Root runs only root's programs (module_utils/preflight_node/host/ownership.py, docs/security.md): the sshd listening
on the
ssh port, py-spy for the gate's hung ranks and for diagnose, gdb on a core.  An unprivileged account (nobody)
plants what root would otherwise run: a fake sshd of its own on the port, a py-spy next to an interpreter, a core in
a world-writable directory.  Each fake leaves a marker when root runs it.  Needs root.
"""

import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import time
import uuid

import pytest

from attacker_helpers import write_script
from fake_ops import LocalOps
from preflight_node import diagnose as diag
from preflight_node.allreduce_run import gate_run
from preflight_node.host import ownership as trust
from preflight_node.ssh import sshd as psd
from preflight_node.ssh.checks import host_keys_check

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the attacks are against root; nobody is the attacker")

NOBODY = pwd.getpwnam("nobody")


def _script(path, body, owner=NOBODY):
    return write_script(path, body, owner)


def _marker_script(path, marker, owner=NOBODY):
    """A program that notes who ran it in ``marker`` (world-writable, so nobody's runs can note too)."""
    return _script(path, 'id -u >> "%s"\n' % marker, owner)


def _ran_as(marker):
    if not os.path.exists(marker):
        return []
    with open(marker) as handle:
        return [int(line) for line in handle.read().split()]


def _new_marker(directory):
    marker = os.path.join(directory, "ran")
    with open(marker, "w"):
        pass
    os.chmod(marker, 0o666)
    return marker


# -- the fake sshd ---------------------------------------------------------------------------------------

# The user's "sshd": perl under another name. Run by nobody it listens; run by root as ``sshd -T -f <this file>``
# (perl -T -f: taint mode, no sitecustomize, then the script) it would leave the marker and name a key of its own.
FAKE_SSHD = r"""
if ($< == 0) { open(my $f, '>>', '%(marker)s'); print $f "0\n"; close $f; print "hostkey %(key)s\n"; exit 0; }
use IO::Socket::INET;
my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => %(port)d, Listen => 5, ReuseAddr => 1) or die;
sleep 60;
"""


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.skipif(not os.path.exists("/usr/bin/perl"), reason="needs perl")
@pytest.mark.parametrize("own_binary", [True, False], ids=["its-own-binary-named-sshd", "roots-perl-titled-sshd"])
def test_a_fake_sshd_a_user_runs_on_the_ssh_port_is_never_run_nor_its_config_read(public_dir, own_binary):
    port, marker = _free_port(), _new_marker(public_dir)
    key = os.path.join(public_dir, "users_key")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True, timeout=30)
    config = os.path.join(public_dir, "evil.pl")
    with open(config, "w") as handle:
        handle.write(FAKE_SSHD % {"marker": marker, "key": key, "port": port})
    program = "/usr/bin/perl"
    if own_binary:
        program = os.path.join(public_dir, "sshd")
        shutil.copy("/usr/bin/perl", program)
        os.chown(program, NOBODY.pw_uid, NOBODY.pw_gid)
    listener = subprocess.Popen(["sshd", "-f", config], executable=program, user=NOBODY.pw_uid,
                                group=NOBODY.pw_gid, extra_groups=[], cwd="/", start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not psd.listening_inodes("/", port) and time.monotonic() < deadline:
            time.sleep(0.05)
        paths, _problem, sshd = psd.host_key_sources("/", "", (), LocalOps(), port)
    finally:
        listener.kill()
        listener.wait(10)
    assert _ran_as(marker) == [], "root ran the user's sshd"
    assert key not in paths and key + ".pub" not in json.dumps(sshd)
    assert sshd["source"] == "default" and sshd["impostor"]["pid"] == listener.pid
    assert "not root's sshd" in sshd["discovery"] and "uid %d" % NOBODY.pw_uid in sshd["discovery"]
    check = host_keys_check("n1", [], [], sshd)
    assert check["status"] == "warn" and "pid %d" % listener.pid in check["fix"] and "ss -ltnp" in check["fix"]


def test_roots_own_sshd_from_a_program_others_can_change_is_not_run(public_dir):
    """A listener of root's whose program lies where root alone does not control it: sshd -T runs with the
    packaged sshd instead, and the finding says why."""
    sshd = _marker_script(os.path.join(public_dir, "sshd"), _new_marker(public_dir))
    program, refused = psd._program("/", sshd, "/usr/sbin/sshd")
    assert program == "/usr/sbin/sshd" and "owned by nobody" in refused and sshd in refused


# -- py-spy and gdb --------------------------------------------------------------------------------------

def test_the_gate_runs_a_py_spy_next_to_the_training_python_only_as_the_ranks_user_or_when_root_owns_it(public_dir):
    """The ranks hang; their stacks are taken with the py-spy next to the training Python, which nobody owns.
    Run as root (preflight_job_user: root) it is refused and reported; run as nobody it is nobody's own tool."""
    bin_dir = os.path.join(public_dir, "venv", "bin")
    os.makedirs(bin_dir)
    marker = _new_marker(public_dir)
    _marker_script(os.path.join(bin_dir, "py-spy"), marker)
    # torchrun's stand-in: two "ranks" whose command line names the worker, as the gate finds its ranks.
    python = _script(os.path.join(bin_dir, "python"), 'for a in "$@"; do case "$a" in *allreduce_worker.py) w="$a";; '
                     'esac; done\nsh -c "sleep 30" "$w" & sh -c "sleep 30" "$w" &\nwait\n', owner=None)
    params = {name: spec.get("default") for name, spec in gate_run.ARGUMENT_SPEC.items()}
    params.update(python=python, worker_source="# worker\n", nnodes=1, node_rank=0, nproc_per_node=2,
                  master_addr="127.0.0.1", timeout=0.5, hard_timeout=1.5, stack_budget=3.0, role="n1", run_as="")
    as_root = gate_run.bounded_run(params, "n1", uuid.uuid4().hex)
    assert 0 not in _ran_as(marker), "root ran a py-spy another account can change"
    check = as_root["checks"]["py_spy"]
    assert check["status"] == "warn" and os.path.join(bin_dir, "py-spy") in check["found"]
    assert "owned by nobody" in check["found"]
    params["run_as"] = "nobody"
    gate_run.bounded_run(params, "n1", uuid.uuid4().hex)
    assert set(_ran_as(marker)) == {NOBODY.pw_uid}, "as the job's user, its own py-spy is what a user would run"


def _fake_rank(proc_root, pid, exe, uid=0):
    base = os.path.join(proc_root, str(pid))
    os.makedirs(base)
    with open(os.path.join(base, "stat"), "w") as handle:
        handle.write("%d (python3) S 1 %d %d 0 -1 0\n" % (pid, pid, pid))
    with open(os.path.join(base, "cmdline"), "wb") as handle:
        handle.write(b"%s\0train.py\0" % exe.encode())
    with open(os.path.join(base, "environ"), "wb") as handle:
        handle.write(b"RANK=0\0LOCAL_RANK=0\0WORLD_SIZE=2\0")
    with open(os.path.join(base, "status"), "w") as handle:
        handle.write("Uid:\t%d\t%d\t%d\t%d\nGid:\t0\t0\t0\t0\nGroups:\t\n" % (uid, uid, uid, uid))
    os.symlink(exe, os.path.join(base, "exe"))


class _NoPySpyOps(LocalOps):
    def __init__(self):
        super().__init__(missing=("py-spy",))
        self.users = []

    def run(self, argv, timeout=20.0, env=None, cwd=None, data=None, user=None):
        self.users.append((argv[0], user))
        return super().run(argv, timeout, env=env, cwd=cwd, data=data, user=user)


def test_diagnose_never_runs_a_py_spy_found_next_to_a_ranks_interpreter_that_root_does_not_own(public_dir):
    bin_dir = os.path.join(public_dir, "venv", "bin")
    os.makedirs(bin_dir)
    marker = _new_marker(public_dir)
    spy = _marker_script(os.path.join(bin_dir, "py-spy"), marker)
    proc_root = os.path.join(public_dir, "proc")
    _fake_rank(proc_root, 4242, os.path.join(bin_dir, "python3"))
    result = diag.read({"pattern": "", "user": "", "stack_budget": 5, "native": False}, _NoPySpyOps(), proc_root)
    assert _ran_as(marker) == [], "root ran a py-spy planted next to a rank's interpreter"
    assert result["py_spy"] == "" and any(spy in text and "owned by nobody" in text for text in result["refused"])


def _elf_core(path):
    """An ELF64 little-endian header of type core (ET_CORE), and nothing else."""
    header = bytearray(64)
    header[:7] = b"\x7fELF\x02\x01\x01"
    header[16:18] = (4).to_bytes(2, "little")
    with open(path, "wb") as handle:
        handle.write(bytes(header))


class _RecordingOps(object):
    def __init__(self):
        self.calls = []

    def which(self, name, paths=()):
        return shutil.which(name)

    def run(self, argv, timeout=20.0, env=None, cwd=None, data=None, user=None):
        self.calls.append((list(argv), user))
        return 1, "", "recorded, not run"


def test_gdb_reads_a_core_a_user_planted_as_that_user_never_as_root(public_dir):
    cores = os.path.join(public_dir, "cores")
    os.mkdir(cores)
    os.chmod(cores, 0o1777)
    planted = os.path.join(cores, "core.4242")
    _elf_core(planted)
    os.chown(planted, NOBODY.pw_uid, NOBODY.pw_gid)
    ops = _RecordingOps()
    found = diag.core_backtrace(cores, "core*", "/usr/bin/gdb", 5, ops)
    assert [user for _argv, user in ops.calls] == ["nobody"], "gdb ran as %s" % ops.calls
    assert found["found"] and found["gdb_user"] == "nobody"
    # A root-owned name for root's file, made by another account's hard link, is not read at all.
    root_file = os.path.join(public_dir, "roots")
    _elf_core(root_file)
    os.utime(planted, (1, 1))
    os.link(root_file, os.path.join(cores, "core.9999"))
    ops = _RecordingOps()
    found = diag.core_backtrace(cores, "core*", "/usr/bin/gdb", 5, ops)
    assert ops.calls == [] and "2 links" in found["error"], found


def test_a_named_gdb_or_py_spy_that_another_account_can_change_is_refused_for_the_packaged_one(public_dir):
    mine = _marker_script(os.path.join(public_dir, "gdb"), _new_marker(public_dir))
    refused = []
    assert diag.choose_program("gdb", mine, ["/usr/bin/gdb"], refused) == "/usr/bin/gdb"
    assert len(refused) == 1 and mine in refused[0] and "owned by nobody" in refused[0]
    assert diag.choose_program("gdb", mine, [], [], euid=NOBODY.pw_uid) == mine, "not root: nothing to guard"


# -- the rule itself ---------------------------------------------------------------------------------------

def test_what_root_may_run(public_dir):
    assert trust.untrusted("/usr/bin/id") == ""
    assert "owned by nobody" in trust.untrusted(_marker_script(os.path.join(public_dir, "a"), "/dev/null"))
    root_owned = _script(os.path.join(public_dir, "b"), "exit 0\n", owner=None)
    assert "outside the system's directories" in trust.untrusted(root_owned)
    # Named by the operator it may lie anywhere root alone controls: /tmp is sticky, public_dir root's.
    assert trust.untrusted(root_owned, anywhere=True) == ""
    group_dir = os.path.join(public_dir, "shared")
    os.mkdir(group_dir)
    os.chmod(group_dir, 0o775)
    inside = _script(os.path.join(group_dir, "c"), "exit 0\n", owner=None)
    assert "is writable by its group" in trust.untrusted(inside, anywhere=True)
    # A link root owns, in a directory nobody owns: nobody can point it elsewhere.
    users = os.path.join(public_dir, "users")
    os.mkdir(users)
    os.chown(users, NOBODY.pw_uid, NOBODY.pw_gid)
    os.symlink("/usr/bin/id", os.path.join(users, "id"))
    assert "owned by nobody" in trust.untrusted(os.path.join(users, "id"))
    writable = _script(os.path.join(public_dir, "d"), "exit 0\n", owner=None)
    os.chmod(writable, stat.S_IRWXU | stat.S_IRWXG | stat.S_IROTH | stat.S_IXOTH)
    assert "writable by its group" in trust.untrusted(writable, anywhere=True)


def test_the_component_that_keeps_an_account_from_a_file(public_dir):
    home = os.path.join(public_dir, "home")
    os.makedirs(os.path.join(home, "bin"))
    os.chmod(home, 0o700)
    real = _script(os.path.join(home, "bin", "python3"), "exit 0\n", owner=None)
    link = os.path.join(public_dir, "python")
    os.symlink(real, link)
    found = trust.blocker(link, NOBODY)
    assert found["path"] == home and "mode 0700" in found["found"] and found["links"] == ["%s -> %s" % (link, real)]
    assert trust.blocker(link, pwd.getpwnam("root")) is None
    os.chmod(home, 0o711)
    assert trust.blocker(link, NOBODY) is None
    os.chmod(real, 0o700)
    assert "cannot execute it" in trust.blocker(link, NOBODY)["found"]
    assert "No such file" in trust.blocker(os.path.join(public_dir, "none"), NOBODY)["found"]


def test_the_interpreters_own_venv_is_root_s_place_also_without_site(tmp_path):
    """The srun engine runs the node code with ``python -I -S``: no ``site``, so ``sys.prefix`` is the base Python's;
    the venv the interpreter lives in is still the one its programs (py-spy next to it) may come from."""
    module_utils = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "module_utils")
    code = "import sys; sys.path.insert(0, %r); from preflight_node.host import ownership; print(ownership.own_venv())" % module_utils
    venv = os.path.realpath(os.path.dirname(os.path.dirname(sys.executable)))
    plain = subprocess.run([os.path.join(venv, "bin", "python"), "-I", "-S", "-c", code], capture_output=True,
                           text=True, timeout=60, check=True).stdout.strip()
    assert os.path.realpath(plain) == venv and os.path.isfile(os.path.join(venv, "pyvenv.cfg"))
    outside = subprocess.run([os.path.realpath(os.path.join(venv, "bin", "python")), "-I", "-S", "-c", code],
                             capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    assert outside == "None", "the base interpreter outside any venv names no venv"
