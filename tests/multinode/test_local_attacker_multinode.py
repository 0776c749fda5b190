"""Local attackers on the namespace test bed (docs/security.md): what an unprivileged account on a node can make of
the root that runs the gate and diagnose there.  Each node gets the account ``pfmal`` (in its own ``/etc`` and
``/home``) and a root-only secret, ``/etc/pf-secret`` (0600, in the node's own ``/etc``).  One bed, one playbook
run per scenario:

* the job user's training Python swaps the gate's files (rank results, rank logs, torchrun's log) for links to the
  secret once its ranks are done: nothing of the secret reaches the results, the secret is not changed, and the
  verdict fails that node saying what it refused to read (with ``fs.protected_symlinks`` 0 and 1);
* a fake ``sshd`` of pfmal's own (perl under another name) listens on ``ssh_trust_port``: root never runs it (it
  would leave a marker only root can write) and ``ssh_trust.host_keys`` names it;
* pfmal plants a core in a world-writable core directory: diagnose's gdb (a witness that notes its uid, then runs
  the real gdb) reads it as pfmal, never as root;
* pfmal listens on the gate's rendezvous port first: that node is unverified naming pfmal's pid and command, never
  failed (so never drained), and its peer is not blamed.
"""

import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile

import pytest

from gate_helpers import cmdline, send_signal
from job_env import job_python
from playbook import run_playbook
from testbed import testbed_fixture

pytestmark = pytest.mark.timeout(900)

USER = "pfmal"
NODES = 2
SECRET_WORD = "PFSECRET-c0ffee"
SECRET = "/etc/pf-secret"
SECRET_TEXT = json.dumps({"status": "ok", "stage": "done", "correct": True, "error": SECRET_WORD}) + "\n"
FAST = {"ssh_trust_mesh": False, "allreduce_timeout": 15, "allreduce_hard_timeout": 60,
        "allreduce_sizes": [1048576], "allreduce_iters": 2, "allreduce_warmup": 1, "allreduce_localize": False}

# The job's "training Python" on the first node: the real one, which once torchrun is done swaps what the gate
# reads back for links to root's secret (in the job's working directory too, where the combined log once was).
SWAPPING_PYTHON = r"""#!/bin/sh
case " $* " in
*" torch.distributed.run "*)
  out=""; logs=""; prev=""
  for arg in "$@"; do case "$prev" in --out) out="$arg";; --log-dir) logs="$arg";; esac; prev="$arg"; done
  %(python)s "$@"; rc=$?
  for file in "$out"/rank*.json; do ln -sf %(secret)s "$file"; done
  find "$logs" -name 'std*.log' -exec ln -sf %(secret)s {} \;
  ln -sf %(secret)s "$PWD/torchrun.log" 2>/dev/null
  exit $rc;;
esac
exec %(python)s "$@"
"""

# pfmal's "sshd": perl under another name.  Run by pfmal it listens; run by root as ``sshd -T -f <this file>``
# (perl: taint mode, no sitecustomize, then this script) it would leave a marker in /etc, which only root can write.
FAKE_SSHD = r"""
if ($< == 0) { open(my $f, '>', '/etc/pf-sshd-ran'); print $f "root ran it\n"; close $f;
               print "hostkey /home/pfmal/key\n"; exit 0; }
use IO::Socket::INET;
my $s = IO::Socket::INET->new(LocalAddr => '0.0.0.0', LocalPort => %d, Listen => 5, ReuseAddr => 1) or die;
sleep 300;
"""
FAKE_SSHD_PORT = 2299

# An ELF64 core header (ET_CORE) and nothing else, written by pfmal.
PLANT_CORE = ("import sys\nh = bytearray(64); h[:7] = b'\\x7fELF\\x02\\x01\\x01'; h[16] = 4\n"
              "open(sys.argv[1], 'wb').write(bytes(h))\n")


@pytest.fixture(scope="module")
def bed(request):
    python = job_python()
    if python is None:
        pytest.skip("no Python with torch that an unprivileged account can run on this machine")
    bed = testbed_fixture(request, nodes=NODES, private_dirs=("/etc", "/home"), training_python=python,
                          group_vars={"preflight_job_user": USER})
    for node in bed.nodes:
        bed.run(node, ["useradd", "--create-home", "--shell", "/bin/bash", USER], check=True)
        bed.run(node, ["sh", "-c", 'umask 077 && cat > "$1"', "-", SECRET], input=SECRET_TEXT, check=True)
    return bed


@pytest.fixture
def shared_dir():
    """A directory on the host's /tmp, which every node shares; root's, others may enter it."""
    path = tempfile.mkdtemp(prefix="pft-attacker-")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=[0, 1], ids=["protected_symlinks=0", "protected_symlinks=1"])
def protected_symlinks(request):
    """fs.protected_symlinks (global, not per namespace) set for the test and restored."""
    path = "/proc/sys/fs/protected_symlinks"
    with open(path) as handle:
        before = handle.read().strip()
    subprocess.run(["sysctl", "-q", "-w", "fs.protected_symlinks=%d" % request.param], check=True)
    yield request.param
    subprocess.run(["sysctl", "-q", "-w", "fs.protected_symlinks=%s" % before], check=True)


def _secret_intact(bed, node):
    done = bed.run(node, ["stat", "-c", "%u %a %h", SECRET], check=True)
    assert done.stdout.split() == ["0", "600", "1"], done.stdout
    assert bed.run(node, ["cat", SECRET], check=True).stdout == SECRET_TEXT


def _everything_written(result):
    texts = [result.stdout]
    for top, _dirs, files in os.walk(result.results_dir):
        for name in files:
            path = os.path.join(top, name)
            if not os.path.islink(path):
                with open(path, "rb") as handle:
                    texts.append(handle.read().decode(errors="replace"))
    return "\n".join(texts)


def test_the_job_users_python_swapping_its_files_for_links_gets_nothing_of_roots(bed, shared_dir, tmp_path,
                                                                                  protected_symlinks):
    attacker, honest = bed.nodes
    wrapper = os.path.join(shared_dir, "python")
    with open(wrapper, "w") as handle:
        handle.write(SWAPPING_PYTHON % {"python": bed.training_python, "secret": SECRET})
    os.chmod(wrapper, 0o755)
    inventory = bed.write_inventory(path=str(tmp_path / "inventory.yml"),
                                    host_vars={attacker.name: {"preflight_training_python": wrapper}})
    result = run_playbook(tmp_path, inventory=inventory, timeout=600, extravars=FAST)
    verdict = result.verdict
    assert verdict is not None, result.stdout[-3000:]
    assert SECRET_WORD not in _everything_written(result), "root's secret reached the results"
    for node in bed.nodes:
        _secret_intact(bed, node)
    mine = verdict["nodes"][attacker.name]
    assert mine["status"] == "fail", json.dumps(mine, indent=1)[:3000]
    ranks = mine["checks"]["allreduce.ranks"]
    assert "is a symbolic link: not read" in ranks["found"] and "replaced the gate's result files" in ranks["fix"]
    # The job's own node is named; its peer's ranks did finish, and it is never failed for the other's doing.
    assert verdict["nodes"][honest.name]["status"] != "fail", json.dumps(verdict["nodes"][honest.name])[:3000]
    assert {item["host"] for item in verdict["allreduce"]["suspects"]} == {attacker.name}


def test_a_fake_sshd_on_the_ssh_port_is_never_run_and_is_named(bed, shared_dir, tmp_path):
    node = bed.nodes[0]
    home = "/home/%s" % USER
    bed.run(node, ["cp", "/usr/bin/perl", home + "/sshd"], check=True)
    bed.run(node, ["sh", "-c", 'cat > "$1"', "-", home + "/evil.pl"], input=FAKE_SSHD % FAKE_SSHD_PORT, check=True)
    bed.run(node, ["chown", "%s:%s" % (USER, USER), home + "/sshd", home + "/evil.pl"], check=True)
    start = "import os; os.execv('%s/sshd', ['sshd', '-f', '%s/evil.pl'])" % (home, home)
    listener = bed.spawn(node, ["runuser", "-u", USER, "--", "/usr/bin/python3", "-c", start])
    try:
        bed.run(node, ["sh", "-c", "for i in $(seq 100); do ss -ltn | grep -q ':%d ' && exit 0; sleep 0.1; done; "
                                   "exit 1" % FAKE_SSHD_PORT], check=True)
        inventory = bed.write_inventory(path=str(tmp_path / "inventory.yml"))
        result = run_playbook(tmp_path, inventory=inventory, timeout=600, limit=node.name,
                              extravars=dict(FAST, ssh_trust_port=FAKE_SSHD_PORT))
    finally:
        for pid in bed.host_pids(node):
            if "evil.pl" in " ".join(cmdline(pid)):
                send_signal(pid, signal.SIGKILL)
        listener.wait(10)
    assert bed.run(node, ["test", "-e", "/etc/pf-sshd-ran"]).returncode == 1, "root ran pfmal's sshd"
    assert result.verdict is not None, result.stdout[-3000:]
    check = result.verdict["nodes"][node.name]["checks"]["ssh_trust.host_keys"]
    assert check["status"] == "warn" and "not root's sshd" in check["found"], check
    assert "runs as uid" in check["found"] and "ss -ltnp" in check["fix"], check
    assert "/home/pfmal/key" not in json.dumps(result.verdict)


def test_a_core_a_user_plants_is_read_by_gdb_as_that_user_never_as_root(bed, shared_dir, tmp_path):
    node = bed.nodes[0]
    cores = os.path.join(shared_dir, "cores")
    os.mkdir(cores)
    os.chmod(cores, 0o1777)
    bed.run(node, ["runuser", "-u", USER, "--", "/usr/bin/python3", "-c", PLANT_CORE, cores + "/core.666"], check=True)
    # gdb as the operator names it: a witness (root's, in a directory only root changes) notes its uid.
    witness_log = os.path.join(shared_dir, "gdb-ran")
    with open(witness_log, "w"):
        pass
    os.chmod(witness_log, 0o666)
    witness = os.path.join(shared_dir, "gdb")
    with open(witness, "w") as handle:
        handle.write('#!/bin/sh\nid -u >> %s\nexec %s "$@"\n' % (witness_log, shutil.which("gdb") or "/usr/bin/gdb"))
    os.chmod(witness, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    inventory = bed.write_inventory(path=str(tmp_path / "inventory.yml"))
    result = run_playbook(tmp_path, playbook="diagnose.yml", inventory=inventory, timeout=300, limit=node.name,
                          extravars={"diagnose_core_dir": cores, "diagnose_gdb": witness,
                                     "diagnose_core_timeout": 30, "diagnose_stack_budget": 5})
    uid = int(bed.run(node, ["id", "-u", USER], check=True).stdout)
    with open(witness_log) as handle:
        ran_as = [int(line) for line in handle.read().split()]
    assert result.rc == 0, result.stdout[-3000:]
    reports = [os.path.join(top, "diagnose.json") for top, _dirs, files in os.walk(result.results_dir)
               if "diagnose.json" in files]
    with open(reports[0]) as handle:
        report = json.load(handle)
    core = report["cores"][node.name]
    assert ran_as and set(ran_as) == {uid}, "gdb ran as %s on pfmal's core (pfmal is uid %d): %s" % (
        ran_as, uid, json.dumps(report)[-2000:])
    assert core["path"] == cores + "/core.666" and core["gdb_user"] == USER and core["uid"] == uid, core


SQUAT = ("import socket, sys, time\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
         "s.bind(('0.0.0.0', int(sys.argv[1])))\ns.listen(8)\ntime.sleep(600)\n")
SQUAT_PORT = 6391


def test_an_account_listening_on_the_rendezvous_port_first_leaves_the_node_unverified_never_failed(bed, tmp_path):
    honest, squatted = bed.nodes
    listener = bed.spawn(squatted, ["runuser", "-u", USER, "--", "/usr/bin/python3", "-c", SQUAT, str(SQUAT_PORT)])
    try:
        bed.run(squatted, ["sh", "-c", "for i in $(seq 100); do ss -ltn | grep -q ':%d ' && exit 0; sleep 0.1; done; "
                                       "exit 1" % SQUAT_PORT], check=True)
        inventory = bed.write_inventory(path=str(tmp_path / "inventory.yml"))
        result = run_playbook(tmp_path, inventory=inventory, timeout=600,
                              extravars=dict(FAST, preflight_master_port=SQUAT_PORT))
    finally:
        for pid in bed.host_pids(squatted):
            if "sleep(600)" in " ".join(cmdline(pid)):
                send_signal(pid, signal.SIGKILL)
        listener.wait(10)
    verdict = result.verdict
    assert verdict is not None, result.stdout[-3000:]
    # Never failed, so never drained; the squatted node is unverified, its peer not blamed.
    assert verdict["failed_hosts"] == [], json.dumps(verdict["nodes"], indent=1)[:4000]
    assert verdict["nodes"][squatted.name]["status"] == "unverified", verdict["nodes"][squatted.name]
    assert verdict["nodes"][honest.name]["status"] in ("pass", "warn"), verdict["nodes"][honest.name]
    listen = verdict["nodes"][squatted.name]["checks"]["port_mesh.listen"]
    assert listen["status"] == "skipped" and listen["details"]["blocked"], listen
    assert "of account %s" % USER in listen["found"] and "sleep(600)" in listen["found"], listen
