"""Local attackers against the state root keeps on a node, on the namespace test bed (one bed of two nodes, each
with an unprivileged account, ``mallory``, in its own /etc; one script or gate run per scenario):

* mallory creates the Slurm scripts' state directory first (a directory of hers, or a link to one, in a sticky
  world-writable directory like /var/tmp) with a forged pass of the node finished in 2099: the prolog with
  ``--max-age`` refuses it (exit 2, one line) and reads and writes nothing there; she cannot create the default,
  /var/lib/preflight-slurm.
* mallory tries to create, link or flock the run lock's lease (all refused: its directory is root's alone); a root
  process holds a foreign flock on one node's lease and the other's lease is garbage: the gate still runs both
  nodes and passes, each with a ``preflight.lock`` warn.
* a gate started from another controller (its own hostname) is SIGKILLed while its ranks run: the next gate finds
  the nodes busy until at most the bound of that gate's last call (not its whole run) and names the command that
  frees them; once that time has passed, a gate takes the nodes over and passes.

Each scenario runs with fs.protected_symlinks set for it (0 and 1; restored after), under the bed lock.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from gate_helpers import assert_no_gate_processes, explain, rank_processes, trusted_bed
from playbook import run_playbook
from report_helpers import synthetic_verdict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.timeout(900)

NODES = 2
ATTACKER = "mallory"
PROTECTED_SYMLINKS = "/proc/sys/fs/protected_symlinks"
FUTURE = "2099-01-01T00:00:00Z"
FAST = {"allreduce_timeout": 8, "allreduce_hard_timeout": 15, "allreduce_stack_budget": 5,
        "allreduce_sizes": [262144], "allreduce_iters": 2, "allreduce_warmup": 1}
# A gate the lock must let through: the ranks' start has room on a loaded machine (FAST's 15 s bound did not).
ROOMY = dict(FAST, allreduce_timeout=30, allreduce_hard_timeout=60)
# The gate that is lost: its calls' bounds short, its ranks busy until their hard bound.
LOST = dict(FAST, allreduce_iters=100000, allreduce_floor_busbw_gbps_gloo=0, preflight_probes_timeout=5,
            preflight_lock_grace=5)
LOST_CONTROLLER = "pf-lost-ctl"
# Seconds the lost gate's last call may hold a node: the probes call (5) waiting for the all-reduce
# (hard 15 + stacks 5 + 60), plus the grace (5) and the call's start.
LOST_HORIZON = 5 + 15 + 5 + 60 + 5 + 10
TIMES = []


@pytest.fixture(scope="module")
def bed(request, tmp_path_factory):
    bed = trusted_bed(request, tmp_path_factory, nodes=NODES)
    for node in bed.nodes:
        bed.run(node, ["useradd", "--shell", "/bin/sh", ATTACKER], check=True)
    yield bed
    for name, seconds in TIMES:
        print("local attacker scenario %-60s %6.1f s" % (name, seconds))


@pytest.fixture(autouse=True)
def clean_leases(bed):
    yield
    for name in os.listdir(bed.lock_dir):
        os.unlink(os.path.join(bed.lock_dir, name))


@contextlib.contextmanager
def protected_symlinks(value):
    with open(PROTECTED_SYMLINKS, encoding="ascii") as handle:
        before = handle.read().strip()
    with open(PROTECTED_SYMLINKS, "w", encoding="ascii") as handle:
        handle.write(str(value))
    try:
        yield
    finally:
        with open(PROTECTED_SYMLINKS, "w", encoding="ascii") as handle:
            handle.write(before)


def as_attacker(bed, node, argv, data=None):
    return bed.run(node, ["runuser", "-u", ATTACKER, "--", *argv], input=data, cwd="/")


@contextlib.contextmanager
def sticky_directory():
    """A world-writable sticky directory, as /var/tmp is, that the nodes share with the host."""
    base = tempfile.mkdtemp(prefix="pf-attacker-", dir="/tmp")
    try:
        os.chmod(base, 0o755)
        sticky = os.path.join(base, "vartmp")
        os.mkdir(sticky)
        os.chmod(sticky, 0o1777)
        yield sticky
    finally:
        shutil.rmtree(base)


def tree(path):
    """Every file below ``path`` (following no link) with its bytes."""
    found = {}
    for folder, _dirs, files in os.walk(path):
        for name in files:
            with open(os.path.join(folder, name), "rb") as handle:
                found[os.path.relpath(os.path.join(folder, name), path)] = handle.read()
    return found


@pytest.mark.parametrize("protected", [0, 1])
@pytest.mark.parametrize("planted", ["her directory", "a link to her directory"])
def test_a_state_directory_a_user_made_first_with_a_forged_pass_is_refused(bed, protected, planted):
    node = bed.nodes[0]
    forged = json.dumps(synthetic_verdict(hosts=[node.name], finished=FUTURE))
    with protected_symlinks(protected), sticky_directory() as sticky:
        state = os.path.join(sticky, "preflight-slurm")
        hers = os.path.join(sticky, "hers") if planted.startswith("a link") else state
        assert as_attacker(bed, node, ["mkdir", hers]).returncode == 0
        assert as_attacker(bed, node, ["sh", "-c", 'cat > "$1"', "-", os.path.join(hers, "last.json")],
                           data=forged).returncode == 0
        if hers != state:
            assert as_attacker(bed, node, ["ln", "-s", hers, state]).returncode == 0
        # The default state directory is root's to make: she cannot make it first.
        assert as_attacker(bed, node, ["mkdir", "/var/lib/pf-attacker-probe"]).returncode != 0
        before = tree(hers)
        env = dict(os.environ, SLURMD_NODENAME=node.name, PREFLIGHT_SLURM_RESULTS=state, PREFLIGHT_MAX_AGE="6h")
        started = time.monotonic()
        done = bed.run(node, [os.path.join(ROOT, "scripts", "slurm-prolog")], timeout=90, env=env)
        TIMES.append(("prolog, %s, protected_symlinks=%d" % (planted, protected), time.monotonic() - started))
        assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stdout, done.stderr)
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            "preflight: %s: preflight.state_dir: the results directory %s " % (node.name, state)), done.stderr
        assert "refused, nothing read or written there -- fix: " in lines[0]
        assert ("is a symbolic link" if hers != state else "is owned by %s" % ATTACKER) in lines[0]
        assert tree(hers) == before, "root wrote into (or through) her directory"


HOLD = "import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDONLY)\nfcntl.flock(fd, fcntl.LOCK_SH)\n" \
       "print('held', flush=True)\ntime.sleep(600)\n"


def lease(bed, node):
    return os.path.join(bed.lock_dir, "cluster-preflight.%s.lease" % node.name)


@pytest.mark.parametrize("protected", [0, 1])
def test_a_foreign_flock_and_a_garbage_lease_never_keep_the_gate_off_a_node(bed, tmp_path, protected):
    names = [node.name for node in bed.nodes]
    garbage, flocked = (bed.nodes[0], bed.nodes[1]) if protected == 0 else (bed.nodes[1], bed.nodes[0])
    with protected_symlinks(protected):
        # What worked while leases lived in /run/lock: make the lease first, plant a link there, flock it.
        for argv in (["touch", lease(bed, flocked)], ["ln", "-s", "/etc/shadow", lease(bed, flocked)],
                     ["flock", "--shared", "--nonblock", lease(bed, flocked), "true"]):
            refused = as_attacker(bed, flocked, argv)
            assert refused.returncode != 0 and "Permission denied" in refused.stderr, (argv, refused.stderr)
        assert not os.path.lexists(lease(bed, flocked))
        # A lease that is no lease (only root can write there: a defect, a full disk, an older version).
        with open(lease(bed, garbage), "w", encoding="utf-8") as handle:
            handle.write('{"run_id": "x:1:1", "since": 1, "expires": "soon"}')
        os.chmod(lease(bed, garbage), 0o600)
        # A flock that is no run's: a root process that opened the lease and never lets go.
        with open(lease(bed, flocked), "w", encoding="utf-8"):
            pass
        os.chmod(lease(bed, flocked), 0o600)
        holder = subprocess.Popen([sys.executable, "-c", HOLD, lease(bed, flocked)], stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "held"
            inventory = bed.write_inventory(path=str(tmp_path / "inventory.yml"))
            started = time.monotonic()
            # The lock is what this run tests: its ranks get room to start (ROOMY), not FAST's bounds.
            result = run_playbook(tmp_path, inventory=inventory, extravars=ROOMY, timeout=600)
            TIMES.append(("foreign flock and garbage lease, protected_symlinks=%d" % protected,
                          time.monotonic() - started))
        finally:
            holder.kill()
            holder.wait()
    verdict = result.verdict
    assert verdict is not None, result.stdout[-3000:]
    assert result.rc == 0 and verdict["status"] == "pass", explain(result)
    assert verdict["healthy_hosts"] == names and verdict["busy_hosts"] == [], explain(result)
    assert verdict["allreduce"]["launched"] and sorted(verdict["allreduce"]["hosts"]) == sorted(names)
    read = verdict["nodes"][garbage.name]["checks"]["preflight.lock"]
    assert read["status"] == "warn" and "could not be read" in read["found"] and "not a time" in read["found"], read
    held = verdict["nodes"][flocked.name]["checks"]["preflight.lock"]
    assert held["status"] == "warn" and "held the flock" in held["found"], held
    assert not os.path.lexists(lease(bed, garbage)), "the run released the lease it took"
    with open(lease(bed, flocked), encoding="utf-8") as handle:
        assert handle.read() == "", "the run wrote a lease whose flock it never had"


def _far_gate(bed, directory, extravars):
    """``ansible-playbook preflight.yml`` from another controller: its own hostname (a UTS namespace), so
    this controller cannot tell whether it still lives."""
    inventory = bed.write_inventory(path=str(directory / "inventory.yml"))
    binary = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_HOST_KEY_CHECKING="True",
               ANSIBLE_NOCOLOR="1", PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    argv = ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', LOST_CONTROLLER, binary,
            os.path.join(ROOT, "preflight.yml"), "-i", inventory,
            "-e", json.dumps(dict(extravars, preflight_results_dir=str(directory / "results")))]
    log = open(directory / "far.log", "w", encoding="utf-8")  # pylint: disable=consider-using-with
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(directory),
                            start_new_session=True), log


def _gate(bed, directory):
    directory.mkdir()
    return run_playbook(directory, inventory=bed.write_inventory(path=str(directory / "inventory.yml")),
                        extravars=FAST, timeout=600)


def _read_leases(bed):
    leases = {}
    for node in bed.nodes:
        with open(lease(bed, node), encoding="utf-8") as handle:
            leases[node.name] = json.load(handle)
    return leases


def test_a_gate_from_a_lost_controller_frees_the_nodes_within_the_bound_of_its_last_call(bed, tmp_path):
    names = [node.name for node in bed.nodes]
    with protected_symlinks(1):
        (tmp_path / "far").mkdir()
        far, log = _far_gate(bed, tmp_path / "far", LOST)
        try:
            deadline = time.monotonic() + 180
            while not all(rank_processes(bed, node) for node in bed.nodes):
                assert far.poll() is None and time.monotonic() < deadline, (tmp_path / "far" / "far.log").read_text()
                time.sleep(0.1)
        finally:
            os.killpg(far.pid, signal.SIGKILL)
            far.wait()
            log.close()
        killed = time.time()
        leases = _read_leases(bed)
        run_id = leases[names[0]]["run_id"]
        assert run_id.startswith(LOST_CONTROLLER + ":"), leases
        until = max(item["expires"] for item in leases.values())
        # The lease reaches the stage in flight (the all-reduce its probes call waits for), not the whole run.
        assert until - killed <= LOST_HORIZON, leases
        TIMES.append(("lost controller: its leases held the nodes after the kill", until - killed))

        # The next gate, at once: busy, until when, and the command that frees the nodes now.
        result = _gate(bed, tmp_path / "next")
        verdict = result.verdict
        assert verdict is not None and verdict["busy_hosts"] == names and verdict["failed_hosts"] == [], \
            explain(result)
        for name in names:
            busy = verdict["nodes"][name]["checks"]["preflight.busy"]
            assert "run %s from controller %s" % (run_id, LOST_CONTROLLER) in busy["found"], busy
            assert time.strftime("until at most %Y-%m-%dT%H:%M:%SZ", time.gmtime(leases[name]["expires"])) \
                in busy["found"]
            assert "-e preflight_lock_take_over=%s" % run_id in busy["fix"] and "rm -f %s" % os.path.join(
                bed.lock_dir, "cluster-preflight.%s.lease" % name) in busy["fix"], busy

        # Its node-side work ended by its own bounds; once its lease has passed, the nodes are free.
        assert_no_gate_processes(bed, seconds=max(until - time.time(), 1))
        time.sleep(max(until - time.time(), 0) + 1)
        result = _gate(bed, tmp_path / "later")
    waited = time.time() - killed
    TIMES.append(("lost controller: kill to the next passing verdict", waited))
    verdict = result.verdict
    assert result.rc == 0 and verdict["status"] == "pass" and verdict["busy_hosts"] == [], explain(result)
    for name in names:
        took = verdict["nodes"][name]["checks"]["preflight.lock"]["found"]
        assert "took over the lease of run %s" % run_id in took and "its lease expired" in took, took
    assert os.listdir(bed.lock_dir) == [], "the passing run released its leases"
