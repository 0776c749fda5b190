"""A real Slurm cluster on the namespace test bed (tests/testbed.py): munged, slurmctld, one slurmd
per node.

* munged runs on the host with its own key and socket in the cluster's temporary directory
  (``AuthInfo=socket=...``), so a system munged, if any, is neither used nor disturbed; the nodes
  share the host's filesystem, so their slurmd reach the same socket.
* slurmctld runs in the host's network namespace on the management bridge's address, in a UTS
  namespace of its own whose hostname is the ``SlurmctldHost`` name (slurmctld refuses to start on
  a host whose name is not the controller's).
* one ``slurmd -N <node>`` per bed node, inside the node (its hostname = its ``NodeName``,
  ``NodeAddr`` = its management address); spool, pid and log files are per node (``%n``).
* Every path is under one temporary directory, removed by :meth:`SlurmCluster.down`, which also
  ends every daemon it started (by the pid it started, or found in a node's namespace by the
  cluster's own configuration path on its command line).

Use::

    with Testbed(nodes=2) as bed, SlurmCluster(bed) as slurm:
        slurm.scontrol("update", "nodename=pfn1", "state=drain", "reason=admin: disk")
        slurm.node_state("pfn1")   # {"state": "IDLE+DRAIN", "reason": "admin: disk", ...}

The facts this follows are in /work/shared/FACTS.md ("Slurm").
"""

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from bed_lifecycle import UpDown

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
from cluster_preflight.slurm import drain as preflight_slurm  # noqa: E402  pylint: disable=wrong-import-position

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "salloc", "scontrol", "sinfo")
SLURMD_PORT = 6818

SLURM_CONF = """# Test cluster of the preflight's Slurm tests (tests/slurm_bed.py); removed after the tests.
ClusterName={cluster}
SlurmctldHost={ctl_name}({ctl_addr})
SlurmctldPort={ctl_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SchedulerType=sched/backfill
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdTimeout=60
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool/%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class SlurmError(RuntimeError):
    """The cluster could not be brought up (the message has the daemons' log tails)."""


def unavailable_reason():
    missing = [name for name in DAEMONS if shutil.which(name) is None
               and not os.access(os.path.join("/usr/sbin", name), os.X_OK)]
    if missing:
        return "missing %s (apt-get install slurm-wlm munge)" % ", ".join(missing)
    return None


def _which(name):
    return shutil.which(name) or os.path.join("/usr/sbin", name)


def _free_port(address):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


class SlurmCluster(UpDown):
    """slurmctld + one slurmd per node of ``bed`` + munged; see the module docstring."""

    def __init__(self, bed, ready_timeout=60, cpus=1):
        self.bed = bed
        self.ready_timeout = ready_timeout
        # CPUs declared per node: a step with K tasks per node needs K (the bed's nodes share the host's cores).
        self.cpus = int(cpus)
        self.dir = None
        self.conf = None
        self._procs = []
        self.ctl_name = None

    # -- lifecycle ------------------------------------------------------------------------------

    def up(self):
        reason = unavailable_reason()
        if reason:
            raise SlurmError(reason)
        try:
            self._up()
        except BaseException:
            self.down()
            raise
        return self

    def _up(self):
        tag = secrets.token_hex(2)
        self.dir = tempfile.mkdtemp(prefix="pfslurm-%s-" % tag)
        os.chmod(self.dir, 0o711)
        for sub in ("state", "spool"):
            os.makedirs(os.path.join(self.dir, sub), mode=0o700)
        key = os.path.join(self.dir, "munge.key")
        with open(key, "wb") as handle:
            handle.write(os.urandom(1024))
        os.chmod(key, 0o600)
        self.munge_socket = os.path.join(self.dir, "munge.sock")
        self._start([_which("munged"), "--foreground", "--force", "--socket=" + self.munge_socket,
                     "--key-file=" + key, "--pid-file=" + os.path.join(self.dir, "munged.pid"),
                     "--log-file=" + os.path.join(self.dir, "munged.log"),
                     "--seed-file=" + os.path.join(self.dir, "munged.seed")], "munged")
        self._wait(lambda: os.path.exists(self.munge_socket), "munged did not create its socket", "munged.out")
        ctl_addr = "198.18.%d.254" % self.bed.slot
        self.ctl_name = "pfctl%s" % tag
        nodes = "\n".join("NodeName=%s NodeAddr=%s CPUs=%d State=UNKNOWN" % (node.name, node.address, self.cpus)
                          for node in self.bed.nodes)
        self.conf = os.path.join(self.dir, "slurm.conf")
        with open(self.conf, "w", encoding="utf-8") as handle:
            handle.write(SLURM_CONF.format(cluster="pf%s" % tag, ctl_name=self.ctl_name, ctl_addr=ctl_addr,
                                           ctl_port=_free_port(ctl_addr), slurmd_port=SLURMD_PORT,
                                           munge_socket=self.munge_socket, dir=self.dir, nodes=nodes))
        # slurmctld only starts on the host named SlurmctldHost: a UTS namespace of its own gives it that name.
        self._start([_which("slurmctld"), "-D", "-f", self.conf], "slurmctld", hostname=self.ctl_name)
        self._wait(lambda: self.run(["scontrol", "ping"], timeout=5).stdout.count("UP") >= 1,
                   "slurmctld does not answer scontrol ping", "slurmctld.log")
        for node in self.bed.nodes:
            os.makedirs(os.path.join(self.dir, "spool", node.name), mode=0o700)
            self._node_cgroup(node)
            self._start_slurmd(node)
        self._wait(self._all_idle, "not every slurmd registered idle", "slurmctld.log")

    def _start_slurmd(self, node):
        log = open(os.path.join(self.dir, "slurmd-launch-%s.out" % node.name), "ab")  # pylint: disable=consider-using-with
        try:
            self._procs.append(("slurmd " + node.name, self.bed.spawn(
                node, [_which("slurmd"), "-D", "-f", self.conf, "-N", node.name], stdout=log, stderr=log,
                env=self.env())))
        finally:
            log.close()

    def stop_slurmd(self, node):
        """Kill the node's slurmd (and the steps it runs), as ``systemctl stop slurmd`` would end it; the node
        itself runs on."""
        for pid in self._node_daemons(node):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for name, proc in list(self._procs):
            if name == "slurmd " + node.name:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
                self._procs.remove((name, proc))

    def start_slurmd(self, node, timeout=120):
        """Start the node's slurmd again and wait until Slurm has it idle (a node down for a while returns as
        ``ReturnToService=2`` allows)."""
        self._start_slurmd(node)
        self.wait_state(node.name, lambda state: state["state"].upper().rstrip("*") == "IDLE", timeout=timeout)

    def _node_cgroup(self, node):
        """slurmd initialises its cgroup plugin whatever ProctrackType says, and a bed node's /sys is the
        fresh sysfs of ``ip netns exec`` without /sys/fs/cgroup: give the node a v1 layout (a tmpfs and the
        named ``systemd`` hierarchy, as on this host), in the node's own mount namespace only."""
        if self.bed.run(node, ["mountpoint", "-q", "/sys/fs/cgroup"]).returncode == 0:
            return
        for argv in (["mount", "-t", "tmpfs", "-o", "mode=755", "pfcgroup", "/sys/fs/cgroup"],
                     ["mkdir", "-p", "/sys/fs/cgroup/systemd"],
                     ["mount", "-t", "cgroup", "-o", "none,name=systemd", "cgroup", "/sys/fs/cgroup/systemd"]):
            done = self.bed.run(node, argv)
            if done.returncode != 0:
                raise SlurmError("%s: %s: %s" % (node.name, " ".join(argv), done.stderr.strip()))

    def _start(self, argv, name, hostname=None):
        out = open(os.path.join(self.dir, "%s.out" % name), "ab")  # pylint: disable=consider-using-with
        try:
            if hostname:
                # A UTS namespace of its own named ``hostname``: set the name, then exec (argv only, no shell).
                argv = ["unshare", "--uts", "--", sys.executable, "-c",
                        "import os, socket, sys; socket.sethostname(sys.argv[1]); os.execv(sys.argv[2], sys.argv[2:])",
                        hostname] + argv
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,  # pylint: disable=consider-using-with
                                    env=self.env(), start_new_session=True)
        finally:
            out.close()
        self._procs.append((name, proc))
        return proc

    def _wait(self, ready, what, log):
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            for name, proc in self._procs:
                if proc.poll() is not None:
                    own = (["slurmd-%s.log" % name.split()[1], "slurmd-launch-%s.out" % name.split()[1]]
                           if name.startswith("slurmd ") else ["%s.out" % name])
                    raise SlurmError("%s exited rc=%s: %s" % (name, proc.returncode,
                                                              " | ".join(self.tail(item, 800) for item in own)))
            with contextlib.suppress(Exception):
                if ready():
                    return
            time.sleep(0.2)
        raise SlurmError("%s within %d s: %s" % (what, self.ready_timeout, self.tail(log)))

    def _all_idle(self):
        states = self.states()
        return set(states) == {node.name for node in self.bed.nodes} and all(
            item["state"] == "idle" for item in states.values())

    def down(self):
        """End every daemon this cluster started, then remove its directory."""
        for name, proc in reversed(self._procs):
            if name.startswith("slurmd") and self.conf:
                # The Popen is nsenter; slurmd (and its job steps) live in the node's namespaces.
                node = name.split()[1]
                with contextlib.suppress(Exception):
                    for pid in self._node_daemons(node):
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for name, proc in reversed(self._procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(timeout=5)
        self._procs = []
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def _node_daemons(self, node):
        """Host pids of this cluster's slurmd in a node (found by our configuration path) and the
        job steps (slurmstepd) there."""
        pids = []
        for pid in self.bed.host_pids(node):
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as handle:
                    argv = handle.read().split(b"\0")
            except OSError:
                continue
            if self.conf.encode() in argv or (argv and argv[0].startswith(b"slurmstepd")):
                pids.append(pid)
        return pids

    # -- using it ------------------------------------------------------------------------------------

    def env(self, base=None):
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = self.conf or ""
        env["PATH"] = os.pathsep.join([os.path.join(ROOT, ".venv", "bin"), env.get("PATH", ""), "/usr/sbin"])
        for name in list(env):
            if name.startswith(("SLURM_JOB", "SLURM_NODELIST", "SLURMD_")):
                del env[name]
        return env

    def run(self, argv, timeout=30, node=None, env=None, cwd=None):
        """argv on the host (or inside ``node``) with the cluster's SLURM_CONF."""
        env = self.env(env)
        if node is not None:
            return self.bed.run(node, argv, timeout=timeout, env=env, cwd=cwd)
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, check=False,
                              stdin=subprocess.DEVNULL, cwd=cwd)

    def scontrol(self, *args):
        done = self.run(["scontrol"] + list(args))
        if done.returncode != 0:
            raise SlurmError("scontrol %s: rc %d: %s" % (" ".join(args), done.returncode, done.stderr.strip()))
        return done.stdout

    def states(self):
        done = self.run(["sinfo", "-h", "-N", "-o", preflight_slurm.SINFO_FORMAT], timeout=10)
        return preflight_slurm.parse_sinfo(done.stdout) if done.returncode == 0 else {}

    def node_state(self, node):
        """``{"state", "reason", "reason_user"}`` of ``node`` from ``scontrol show node``."""
        return preflight_slurm.parse_scontrol_nodes(self.scontrol("show", "node", node))[node]

    def wait_state(self, node, predicate, timeout=30):
        deadline = time.monotonic() + timeout
        state = None
        while time.monotonic() < deadline:
            state = self.node_state(node)
            if predicate(state):
                return state
            time.sleep(0.2)
        raise AssertionError("%s never reached the expected state; last %r" % (node, state))

    def tail(self, name, limit=1500):
        try:
            with open(os.path.join(self.dir or "", name), encoding="utf-8", errors="replace") as handle:
                return handle.read()[-limit:]
        except OSError:
            return ""


def slurm_fixture(request, bed, cpus=1):
    """A SlurmCluster on ``bed`` for a fixture, torn down with the fixture's scope (skips, with the
    reason, where Slurm is not installed)."""
    import pytest  # pylint: disable=import-outside-toplevel

    reason = unavailable_reason()
    if reason:
        pytest.skip("Slurm unavailable: %s" % reason)
    cluster = SlurmCluster(bed, cpus=cpus)
    request.addfinalizer(cluster.down)
    cluster.up()
    return cluster
