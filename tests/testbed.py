#!/usr/bin/env python3
"""Multi-node test bed: N fake cluster nodes on this one machine.

Each node is a network namespace attached by veth to bridges the bed creates,
with its own mount, UTS and PID namespaces: its own ``/etc`` (an overlay over
the host's, so whatever the node writes there stays in the bed's directory),
its own hostname, its own process table, and its own ``sshd`` as PID 1.  The
project's playbooks then run against the nodes over real SSH with host-key
checking on.  Everything else (``/usr``, ``/work``, the venv) is the host's, so
the venv's python with torch runs inside the nodes as it does on the host.

Address plan (only 198.18.0.0/15, see RFC 2544), ``k`` chosen per run:

* management ``eth0``: 198.18.<k>.<i>/24, bridge holds .254 (the controller)
* fabric rail ``j`` (``fab<j>``): 198.19.<k + 64*j>.<i>/24, bridge holds .254
* ``docker0`` inside a node (optional): 198.18.254.1/24 on every node, as the
  real docker0 carries the same address on every node
* an administratively DOWN port ``eth1`` (optional): 198.18.253.<i>/24

Every name carries the prefix ``pft`` plus a 4-hex run id; a state file
``/run/preflight-testbed/<runid>.json`` records the owner process, and each
start first removes the beds whose owner is dead.

Library use::

    with Testbed(nodes=3, fabric=True) as bed:
        bed.ssh(bed.nodes[0], ["hostname"])

pytest use: ``testbed_fixture(request, **options)`` (see its docstring).

Command line::

    python tests/testbed.py up --nodes 3 --fabric     # runs until Ctrl-C/SIGTERM
    python tests/testbed.py status
    python tests/testbed.py down --all
"""

import argparse
import atexit
import contextlib
import dataclasses
import fcntl
import ipaddress
import json
import os
import random
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from bed_lifecycle import UpDown

PREFIX = "pft"
STATE_DIR = "/run/preflight-testbed"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINING_PYTHON = os.path.join(ROOT, ".venv", "bin", "python")
ANSIBLE_CFG = os.path.join(ROOT, "ansible.cfg")
SSHD = "/usr/sbin/sshd"

MGMT_IFNAME = "eth0"
FABRIC_IFPREFIX = "fab"
DOWN_IFNAME = "eth1"
DOCKER_IFNAME = "docker0"
DOCKER_PORT_IFNAME = "vethdocker0"
DOCKER_CIDR = "198.18.254.1/24"
DOWN_NET = "198.18.253"
HOST_OCTET = 254
# k indexes the management /24 (198.18.k) and fabric rail j lives at
# 198.19.(k + 64*j); 1..63 leaves 198.18.64-255 free for node-internal nets.
SUBNET_SLOTS = range(1, 64)
MAX_RAILS = 4
MAX_NODES = 200

# Runs inside the node's fresh mount/UTS/PID namespaces.  Constant script,
# every value arrives as a positional parameter: hostname, sshd config, log,
# then pairs of (overlay options, mount point).
NODE_INIT = r"""
set -e
host=$1; cfg=$2; log=$3; shift 3
while [ "$#" -ge 2 ]; do
  mount -t overlay overlay -o "$1" "$2"
  shift 2
done
hostname "$host"
exec /usr/sbin/sshd -D -f "$cfg" -E "$log"
"""

TOOLS = ("ip", "nsenter", "unshare", "ssh", "ssh-keygen", "iptables", "tc")


class TestbedError(RuntimeError):
    """A step of bringing the bed up or down failed."""


# --------------------------------------------------------------------------
# Small helpers


def _run(argv, timeout=20, check=True, **kwargs):
    """Run argv with a bound; raise TestbedError naming the command on failure."""
    if kwargs.get("input") is None:
        kwargs.pop("input", None)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    try:
        proc = subprocess.run(argv, timeout=timeout, check=False, **kwargs)
    except subprocess.TimeoutExpired as exc:
        raise TestbedError(f"timed out after {timeout}s: {shlex.join(argv)}") from exc
    if check and proc.returncode != 0:
        raise TestbedError(
            f"rc={proc.returncode}: {shlex.join(argv)}: {(proc.stderr or '').strip()}"
        )
    return proc


def _proc_start_time(pid):
    """Start time of pid in clock ticks since boot, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            data = handle.read()
    except OSError:
        return None
    # comm may contain spaces and parentheses: fields start after the last ')'.
    return int(data.rsplit(")", 1)[1].split()[19])


def _alive(pid, start_time):
    if not pid:
        return False
    now = _proc_start_time(pid)
    return now is not None and (start_time is None or now == start_time)


def _nspid(pid):
    """The NSpid line of /proc/pid/status as ints ([host] or [host, ..., inner])."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("NSpid:"):
                    return [int(x) for x in line.split()[1:]]
    except OSError:
        pass
    return []


def _netns_pids(namespace):
    proc = _run(["ip", "netns", "pids", namespace], timeout=10, check=False)
    if proc.returncode != 0:
        return []
    return [int(x) for x in proc.stdout.split() if x.isdigit()]


def _netns_list():
    proc = _run(["ip", "-j", "netns", "list"], timeout=10, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        return []
    return [entry["name"] for entry in json.loads(proc.stdout)]


def _link_names():
    proc = _run(["ip", "-j", "link", "show"], timeout=10)
    return [entry["ifname"] for entry in json.loads(proc.stdout or "[]")]


def _kill_pids(pids, timeout=5.0):
    """SIGKILL pids and wait until they are gone (zombies count as gone)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    pending = list(pids)
    while pending and time.monotonic() < deadline:
        pending = [p for p in pending if _proc_state(p) not in (None, "Z", "X")]
        if pending:
            time.sleep(0.05)
    return pending


def _proc_state(pid):
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _write_atomic(path, text, mode=0o644):
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _state_lock():
    os.makedirs(STATE_DIR, mode=0o755, exist_ok=True)
    with open(os.path.join(STATE_DIR, ".lock"), "a+", encoding="ascii") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _to_yaml(data):
    try:
        import yaml  # pylint: disable=import-outside-toplevel
    except ImportError:  # JSON is YAML, keeps the bed usable without PyYAML
        return json.dumps(data, indent=2) + "\n"
    return yaml.safe_dump(data, default_flow_style=False, sort_keys=False, width=4096)


def unavailable_reason():
    """Why a bed cannot run here (None when it can)."""
    if os.geteuid() != 0:
        return "the test bed needs root (network namespaces, mounts)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if not os.access(SSHD, os.X_OK):
        missing.append(SSHD)
    if missing:
        return ("missing tools: " + ", ".join(missing)
                + " (apt-get install -y openssh-server iptables iproute2)")
    proc = _run(["ip", "netns", "list"], timeout=10, check=False)
    if proc.returncode != 0:
        return "`ip netns` does not work here: " + proc.stderr.strip()
    return None


# --------------------------------------------------------------------------
# Cleanup of beds by state file (own bed, or leftovers of a killed run)


def _state_path(runid):
    return os.path.join(STATE_DIR, f"{runid}.json")


def _read_states():
    states = []
    if not os.path.isdir(STATE_DIR):
        return states
    for entry in sorted(os.listdir(STATE_DIR)):
        if not entry.endswith(".json") or entry.startswith("."):
            continue
        path = os.path.join(STATE_DIR, entry)
        try:
            with open(path, encoding="utf-8") as handle:
                state = json.load(handle)
        except (OSError, ValueError):
            state = {"runid": entry[:-5], "owner_pid": 0, "broken": True}
        states.append(state)
    return states


def _state_alive(state):
    return _alive(state.get("owner_pid"), state.get("owner_start"))


def _close_control_masters(cp_dir):
    """End ssh ControlPersist masters that Ansible left for the bed's nodes."""
    if not cp_dir or not os.path.isdir(cp_dir):
        return
    for entry in os.listdir(cp_dir):
        path = os.path.join(cp_dir, entry)
        with contextlib.suppress(TestbedError):
            _run(["ssh", "-F", "/dev/null", "-o", f"ControlPath={path}", "-O", "exit",
                  "placeholder"], timeout=5, check=False)


def _teardown_runid(runid, state=None):
    """Remove every trace of run `runid`: processes, namespaces, links, dirs."""
    state = state or {}
    ns_prefix = f"{PREFIX}-{runid}-"
    link_prefix = f"{PREFIX}{runid}"
    errors = []
    _close_control_masters(state.get("cp_dir"))
    namespaces = set(state.get("namespaces", []))
    namespaces.update(n for n in _netns_list() if n.startswith(ns_prefix))
    for namespace in sorted(namespaces):
        # Killing a node's PID 1 kills its whole PID namespace; whatever else
        # was started in the network namespace goes with the same signal.
        for _ in range(3):
            pids = _netns_pids(namespace)
            if not pids:
                break
            inits = [p for p in pids if len(_nspid(p)) > 1 and _nspid(p)[-1] == 1]
            _kill_pids(inits + [p for p in pids if p not in inits])
        leftover = _netns_pids(namespace)
        if leftover:
            errors.append(f"{namespace}: processes survive SIGKILL: {leftover}")
        proc = _run(["ip", "netns", "del", namespace], timeout=10, check=False)
        if proc.returncode != 0 and namespace in _netns_list():
            errors.append(f"ip netns del {namespace}: {proc.stderr.strip()}")
    for pid, start in state.get("launchers", []):
        if _alive(pid, start):
            _kill_pids([pid])
    for name in _link_names():
        if name.startswith(link_prefix):
            proc = _run(["ip", "link", "del", name], timeout=10, check=False)
            if proc.returncode != 0 and name in _link_names():
                errors.append(f"ip link del {name}: {proc.stderr.strip()}")
    for key in ("workdir", "cp_dir"):
        if state.get(key) and state.get(f"own_{key}", key == "cp_dir"):
            shutil.rmtree(state[key], ignore_errors=True)
    if not errors:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_state_path(runid))
    return errors


def cleanup_stale(include_live=False):
    """Remove beds whose owner process is dead (all beds if include_live).

    Also removes namespaces and links carrying the prefix of a run id that has
    no state file left.  Returns the run ids removed."""
    removed = []
    with _state_lock():
        states = _read_states()
        live = set()
        for state in states:
            runid = state["runid"]
            if _state_alive(state) and not include_live:
                live.add(runid)
                continue
            if not _teardown_runid(runid, state):
                removed.append(runid)
        orphan_ids = set()
        for name in _netns_list():
            parts = name.split("-")
            if len(parts) >= 3 and parts[0] == PREFIX and _is_runid(parts[1]):
                orphan_ids.add(parts[1])
        for name in _link_names():
            if name.startswith(PREFIX) and _is_runid(name[3:7]):
                orphan_ids.add(name[3:7])
        for runid in sorted(orphan_ids - live - set(removed)):
            if not os.path.exists(_state_path(runid)):
                _teardown_runid(runid)
                removed.append(runid)
    return removed


def _is_runid(text):
    return len(text) == 4 and all(c in "0123456789abcdef" for c in text)


# --------------------------------------------------------------------------
# The bed


@dataclasses.dataclass
class Node:
    """One fake node.  ``name`` is also its hostname and inventory name."""

    index: int
    name: str
    namespace: str
    address: str
    fabric_addresses: list
    dir: str
    port: int = 22
    host_pid: int = 0
    host_start: int = None
    interfaces: dict = dataclasses.field(default_factory=dict)

    @property
    def hostname(self):
        return self.name

    @property
    def fabric_address(self):
        return self.fabric_addresses[0] if self.fabric_addresses else None

    @property
    def node_addr(self):
        """Address the nodes talk to each other on (fabric if any)."""
        return self.fabric_address or self.address

    def as_dict(self):
        return {
            "index": self.index, "name": self.name, "hostname": self.hostname,
            "namespace": self.namespace, "address": self.address,
            "fabric_address": self.fabric_address,
            "fabric_addresses": list(self.fabric_addresses), "port": self.port,
            "host_pid": self.host_pid, "interfaces": dict(self.interfaces),
        }


_LIVE_BEDS = []


def _down_live_beds():
    for bed in list(_LIVE_BEDS):
        if bed.owner_pid != os.getpid():
            continue  # a forked child exiting must not tear down its parent's bed
        with contextlib.suppress(Exception):
            bed.down()


atexit.register(_down_live_beds)


class Testbed(UpDown):
    """N fake nodes with real sshd each.  Use as a context manager.

    Options:
      nodes            number of nodes (hostnames <hostname_prefix>1..N)
      workdir          directory for keys, configs and overlays (a fresh
                       temporary one by default, removed on down())
      fabric           add a fabric network (``fab0``) per node
      fabric_rails     number of fabric links per node (fab0..fab<n-1>), each
                       on its own bridge and subnet (implies fabric)
      docker_bridge    add a ``docker0`` bridge inside nodes: True for all, or
                       an iterable of node indexes (1-based) / names
      down_iface       add an administratively DOWN ``eth1`` with an address:
                       True for all, or an iterable of node indexes / names
      isolate          {node index or name: [interface names]}: these links
                       exist and are UP in the node but are not attached to
                       their bridge, so nothing answers on them
      default_route    give nodes a default route via the management bridge
      private_dirs     host directories each node gets its own overlay of
                       ("/etc" always; add "/root" to keep ~/.ssh per node)
      hostname_prefix  node hostname prefix (default "pfn")
      host_vars        {node index or name: {var: value}} merged per host
      group_vars       {var: value} merged into group ``cluster``
      training_python  interpreter for the inventory (default: the venv's)
    """

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, nodes=3, workdir=None, fabric=False, docker_bridge=False,
                 down_iface=False, isolate=None, fabric_rails=None, default_route=True,
                 private_dirs=("/etc",), hostname_prefix="pfn", host_vars=None,
                 group_vars=None, training_python=TRAINING_PYTHON, ready_timeout=20):
        if not 1 <= int(nodes) <= MAX_NODES:
            raise ValueError(f"nodes must be 1..{MAX_NODES}, got {nodes}")
        rails = int(fabric_rails) if fabric_rails is not None else (1 if fabric else 0)
        if not 0 <= rails <= MAX_RAILS:
            raise ValueError(f"fabric_rails must be 0..{MAX_RAILS}, got {fabric_rails}")
        self.node_count = int(nodes)
        self.fabric_rails = rails
        self.fabric = rails > 0
        self._workdir_arg = workdir
        self._docker = docker_bridge
        self._down_iface = down_iface
        self._isolate = dict(isolate or {})
        self.default_route = default_route
        dirs = ["/etc"] + [d for d in private_dirs if os.path.normpath(d) != "/etc"]
        self.private_dirs = [os.path.normpath(d) for d in dirs]
        self.hostname_prefix = hostname_prefix
        self.host_vars = dict(host_vars or {})
        self.group_vars = dict(group_vars or {})
        self.training_python = training_python
        self.ready_timeout = ready_timeout
        self.runid = None
        self.slot = None
        self.nodes = []
        self.workdir = None
        self.inventory_path = None
        self.ssh_key = None
        self.known_hosts = None
        self.cp_dir = None
        self.lock_dir = None
        self._own_workdir = workdir is None
        self.owner_pid = os.getpid()
        self._launchers = {}
        self._state = None

    # -- lifecycle -----------------------------------------------------------

    def up(self):
        """Create the bed; on any failure remove what was created and raise."""
        if self.runid is not None:
            raise TestbedError(f"bed {self.runid} is already up")
        reason = unavailable_reason()
        if reason:
            raise TestbedError(reason)
        self.owner_pid = os.getpid()
        cleanup_stale()
        try:
            self._allocate()
            self._create_network()
            self._prepare_files()
            for node in self.nodes:
                self._launch(node)
            for node in self.nodes:
                self._wait_ready(node)
            self._save_state()
            self.write_inventory()
        except BaseException:
            self.down()
            raise
        return self

    def down(self):
        """Kill every process of the bed and remove everything it created."""
        if self.runid is None:
            return
        for node in self.nodes:
            if self._running(node):
                _kill_pids([node.host_pid])
        errors = _teardown_runid(self.runid, self._state_dict())
        for launcher in self._launchers.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                launcher.wait(timeout=5)
        self._launchers.clear()
        if self in _LIVE_BEDS:
            _LIVE_BEDS.remove(self)
        if errors:
            raise TestbedError("teardown incomplete: " + "; ".join(errors))
        self.runid = None

    # -- bring-up steps ------------------------------------------------------

    def _allocate(self):
        with _state_lock():
            taken = {s.get("slot") for s in _read_states()}
            used_nets = self._host_networks()
            free = []
            for slot in SUBNET_SLOTS:
                nets = [ipaddress.ip_network(n) for n in self._subnets_for(slot)]
                if slot not in taken and not any(
                        n.overlaps(u) for n in nets for u in used_nets):
                    free.append(slot)
            if not free:
                raise TestbedError("no free 198.18.0.0/15 subnet slot for a new bed")
            self.slot = random.choice(free)
            while True:
                runid = secrets.token_hex(2)
                if (not os.path.exists(_state_path(runid))
                        and not any(n.startswith(f"{PREFIX}{runid}") for n in _link_names())
                        and not any(n.startswith(f"{PREFIX}-{runid}-") for n in _netns_list())):
                    break
            self.runid = runid
            if self._workdir_arg:
                self.workdir = os.path.abspath(self._workdir_arg)
                os.makedirs(self.workdir, exist_ok=True)
            else:
                self.workdir = tempfile.mkdtemp(prefix=f"{PREFIX}-{runid}-")
            self.cp_dir = tempfile.mkdtemp(prefix=f"{PREFIX}{runid}cp-")
            _LIVE_BEDS.append(self)
            self._build_nodes()
            # Written before anything exists so a killed run is always found.
            self._save_state()

    def _subnets_for(self, slot):
        nets = [f"198.18.{slot}.0/24"]
        nets += [f"198.19.{slot + 64 * rail}.0/24" for rail in range(self.fabric_rails)]
        return nets

    @staticmethod
    def _host_networks():
        proc = _run(["ip", "-j", "-4", "addr", "show"], timeout=10)
        nets = []
        for link in json.loads(proc.stdout or "[]"):
            for addr in link.get("addr_info", []):
                nets.append(ipaddress.ip_network(
                    f"{addr['local']}/{addr['prefixlen']}", strict=False))
        proc = _run(["ip", "-j", "-4", "route", "show", "table", "all"], timeout=10,
                    check=False)
        for route in json.loads(proc.stdout or "[]") if proc.returncode == 0 else []:
            dst = route.get("dst", "")
            if dst and dst != "default" and route.get("type", "unicast") == "unicast":
                with contextlib.suppress(ValueError):
                    nets.append(ipaddress.ip_network(dst, strict=False))
        return nets

    def _selected(self, option, node_index, name):
        if option is True:
            return True
        if not option:
            return False
        return node_index in option or name in option

    def _build_nodes(self):
        self.nodes = []
        for i in range(1, self.node_count + 1):
            name = f"{self.hostname_prefix}{i}"
            fabric = [f"198.19.{self.slot + 64 * rail}.{i}" for rail in range(self.fabric_rails)]
            node = Node(index=i, name=name, namespace=f"{PREFIX}-{self.runid}-n{i}",
                        address=f"198.18.{self.slot}.{i}", fabric_addresses=fabric,
                        dir=os.path.join(self.workdir, "nodes", name))
            node.interfaces[MGMT_IFNAME] = self._link(f"m{i}")
            for rail in range(self.fabric_rails):
                node.interfaces[f"{FABRIC_IFPREFIX}{rail}"] = self._link(f"f{i}r{rail}")
            if self._selected(self._docker, i, name):
                node.interfaces[DOCKER_PORT_IFNAME] = self._link(f"c{i}")
            if self._selected(self._down_iface, i, name):
                node.interfaces[DOWN_IFNAME] = self._link(f"d{i}")
            self.nodes.append(node)
        for key, ifnames in self._isolate.items():
            node = self.node(key)
            for ifname in ifnames:
                if ifname not in node.interfaces:
                    raise ValueError(f"isolate: {node.name} has no interface {ifname}")

    def _link(self, suffix):
        name = f"{PREFIX}{self.runid}{suffix}"
        if len(name) > 15:
            raise ValueError(f"interface name too long: {name}")
        return name

    def _bridge(self, kind):
        return self._link(f"b{kind}")

    def _create_network(self):
        bridges = [("m", f"198.18.{self.slot}.{HOST_OCTET}/24")]
        bridges += [(f"f{rail}", f"198.19.{self.slot + 64 * rail}.{HOST_OCTET}/24")
                    for rail in range(self.fabric_rails)]
        for kind, cidr in bridges:
            bridge = self._bridge(kind)
            _run(["ip", "link", "add", bridge, "type", "bridge"])
            _run(["ip", "addr", "add", cidr, "dev", bridge])
            _run(["ip", "link", "set", bridge, "up"])
        for node in self.nodes:
            self._create_node_network(node)

    def _create_node_network(self, node):
        ns = node.namespace
        _run(["ip", "netns", "add", ns])
        nsip = ["ip", "-n", ns]
        _run(nsip + ["link", "set", "lo", "up"])
        isolated = set()
        for key, ifnames in self._isolate.items():
            if self.node(key) is node:
                isolated.update(ifnames)

        def veth(inner, host_side, bridge, cidr, up=True):
            _run(["ip", "link", "add", host_side, "type", "veth",
                  "peer", "name", inner, "netns", ns])
            if bridge and inner not in isolated:
                _run(["ip", "link", "set", host_side, "master", bridge])
            if up:
                _run(["ip", "link", "set", host_side, "up"])
            if cidr:
                _run(nsip + ["addr", "add", cidr, "dev", inner])
            if up:
                _run(nsip + ["link", "set", inner, "up"])

        veth(MGMT_IFNAME, node.interfaces[MGMT_IFNAME], self._bridge("m"),
             f"{node.address}/24")
        for rail, addr in enumerate(node.fabric_addresses):
            ifname = f"{FABRIC_IFPREFIX}{rail}"
            veth(ifname, node.interfaces[ifname], self._bridge(f"f{rail}"), f"{addr}/24")
        if self.default_route:
            _run(nsip + ["route", "add", "default", "via",
                         f"198.18.{self.slot}.{HOST_OCTET}", "dev", MGMT_IFNAME])
        if DOCKER_PORT_IFNAME in node.interfaces:
            # A docker0 with one container attached: UP, carrier, an address
            # that is the same on every node and reaches no other node.
            _run(nsip + ["link", "add", DOCKER_IFNAME, "type", "bridge"])
            _run(nsip + ["addr", "add", DOCKER_CIDR, "dev", DOCKER_IFNAME])
            _run(nsip + ["link", "set", DOCKER_IFNAME, "up"])
            veth(DOCKER_PORT_IFNAME, node.interfaces[DOCKER_PORT_IFNAME], None, None)
            _run(nsip + ["link", "set", DOCKER_PORT_IFNAME, "master", DOCKER_IFNAME])
        if DOWN_IFNAME in node.interfaces:
            veth(DOWN_IFNAME, node.interfaces[DOWN_IFNAME], None,
                 f"{DOWN_NET}.{node.index}/24", up=False)

    def _prepare_files(self):
        os.makedirs(self.workdir, exist_ok=True)
        os.chmod(self.workdir, 0o711)
        if not self._own_workdir:
            # A reused --workdir must not carry an earlier run's /etc changes.
            for sub in ("nodes", "controller"):
                shutil.rmtree(os.path.join(self.workdir, sub), ignore_errors=True)
        # The nodes share the host's /run: the bed's own lock directory keeps the gate's run locks (leases
        # named after each node's hostname) apart from another bed's nodes of the same names, as every real
        # node has its own /run/lock.  Writable by every account, like /run/lock.
        self.lock_dir = os.path.join(self.workdir, "run-lock")
        os.makedirs(self.lock_dir, exist_ok=True)
        os.chmod(self.lock_dir, 0o1777)
        controller = os.path.join(self.workdir, "controller")
        os.makedirs(controller, mode=0o700, exist_ok=True)
        self.ssh_key = os.path.join(controller, "id_ed25519")
        self._keygen(self.ssh_key, f"{PREFIX}-{self.runid}-controller")
        with open(self.ssh_key + ".pub", encoding="ascii") as handle:
            controller_pub = handle.read().strip()
        authorized = os.path.join(self.workdir, "authorized_keys")
        _write_atomic(authorized, controller_pub + "\n", 0o600)
        hosts_lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        for node in self.nodes:
            hosts_lines.append(f"{node.address}\t{node.hostname}")
            hosts_lines += [f"{a}\t{node.hostname}-fab{r}"
                            for r, a in enumerate(node.fabric_addresses)]
        known = []
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privsep dir
        for node in self.nodes:
            os.makedirs(node.dir, mode=0o700, exist_ok=True)
            key = os.path.join(node.dir, "ssh_host_ed25519_key")
            self._keygen(key, node.hostname)
            with open(key + ".pub", encoding="ascii") as handle:
                keytype, blob = handle.read().split()[:2]
            names = [node.hostname, node.address] + node.fabric_addresses
            known.append(f"{','.join(names)} {keytype} {blob}")
            for directory in self.private_dirs:
                tag = self._dir_tag(directory)
                os.makedirs(os.path.join(node.dir, f"{tag}-upper"), exist_ok=True)
                os.makedirs(os.path.join(node.dir, f"{tag}-work"), exist_ok=True)
            etc = self.etc_path(node)
            _write_atomic(os.path.join(etc, "hostname"), node.hostname + "\n")
            _write_atomic(os.path.join(etc, "hosts"), "\n".join(hosts_lines) + "\n")
            _write_atomic(os.path.join(etc, "machine-id"), secrets.token_hex(16) + "\n",
                          0o444)
            self._write_sshd_config(node, authorized)
        self.known_hosts = os.path.join(controller, "known_hosts")
        _write_atomic(self.known_hosts, "\n".join(known) + "\n", 0o600)
        self.inventory_path = os.path.join(self.workdir, "inventory.yml")

    @staticmethod
    def _dir_tag(directory):
        return directory.strip("/").replace("/", "_") or "root"

    @staticmethod
    def _keygen(path, comment):
        if os.path.exists(path):
            os.unlink(path)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path + ".pub")
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path])

    def _write_sshd_config(self, node, authorized):
        keys_files = [authorized]
        if "/root" in self.private_dirs:
            keys_files.append(".ssh/authorized_keys")
        lines = ["# sshd of test-bed node " + node.hostname, "Port 22"]
        lines += [f"ListenAddress {a}" for a in [node.address] + node.fabric_addresses]
        lines += [
            f"HostKey {os.path.join(node.dir, 'ssh_host_ed25519_key')}",
            f"PidFile {os.path.join(node.dir, 'sshd.pid')}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            f"AuthorizedKeysFile {' '.join(keys_files)}",
            "X11Forwarding no",
            "PrintMotd no",
            "AcceptEnv LANG LC_*",
            "MaxStartups 100:30:200",
            "MaxSessions 100",
            "Subsystem sftp internal-sftp",
        ]
        _write_atomic(os.path.join(node.dir, "sshd_config"), "\n".join(lines) + "\n")

    def _launch(self, node):
        args = [node.hostname, os.path.join(node.dir, "sshd_config"),
                os.path.join(node.dir, "sshd.log")]
        for directory in self.private_dirs:
            tag = self._dir_tag(directory)
            opts = (f"lowerdir={directory},upperdir={os.path.join(node.dir, tag + '-upper')},"
                    f"workdir={os.path.join(node.dir, tag + '-work')}")
            args += [opts, directory]
        argv = ["ip", "netns", "exec", node.namespace,
                "unshare", "--mount", "--uts", "--pid", "--fork", "--mount-proc",
                "--propagation", "private",
                "sh", "-c", NODE_INIT, f"{PREFIX}-node-init"] + args
        log = open(os.path.join(node.dir, "launcher.log"), "ab")  # pylint: disable=consider-using-with
        try:
            # Own session: a Ctrl-C in the terminal reaches the bed's owner,
            # which tears down, not the nodes directly.
            self._launchers[node.name] = subprocess.Popen(  # pylint: disable=consider-using-with
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True)
        finally:
            log.close()
        node.host_pid = 0
        node.host_start = None

    def _wait_ready(self, node):
        deadline = time.monotonic() + self.ready_timeout
        launcher = self._launchers[node.name]
        while time.monotonic() < deadline:
            if launcher.poll() is not None:
                raise TestbedError(
                    f"{node.name}: node init exited rc={launcher.returncode}: "
                    + self._tail(os.path.join(node.dir, "launcher.log"))
                    + self._tail(os.path.join(node.dir, "sshd.log")))
            if not node.host_pid:
                node.host_pid = self._find_init(node)
                node.host_start = _proc_start_time(node.host_pid) if node.host_pid else None
            if node.host_pid and self._port_open(node.address, node.port, 0.5):
                return
            time.sleep(0.05)
        raise TestbedError(f"{node.name}: sshd not listening on {node.address}:22 "
                           f"after {self.ready_timeout}s: "
                           + self._tail(os.path.join(node.dir, "sshd.log")))

    @staticmethod
    def _running(node):
        """Whether the node's PID 1 (its sshd) is the process we started."""
        return (_alive(node.host_pid, node.host_start)
                and _proc_state(node.host_pid) not in ("Z", "X"))

    @staticmethod
    def _find_init(node):
        for pid in _netns_pids(node.namespace):
            nspid = _nspid(pid)
            if len(nspid) > 1 and nspid[-1] == 1:
                return pid
        return 0

    @staticmethod
    def _port_open(addr, port, timeout):
        try:
            with socket.create_connection((addr, port), timeout=timeout):
                return True
        except OSError:
            return False

    @staticmethod
    def _tail(path, limit=2000):
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                return handle.read()[-limit:]
        except OSError:
            return ""

    def _state_dict(self):
        launchers = [[p.pid, _proc_start_time(p.pid)] for p in self._launchers.values()]
        return {
            "runid": self.runid,
            "owner_pid": os.getpid(),
            "owner_start": _proc_start_time(os.getpid()),
            "owner_cmdline": " ".join(sys.argv)[:300],
            "slot": self.slot,
            "created": time.time(),
            "workdir": self.workdir,
            "own_workdir": self._own_workdir,
            "cp_dir": self.cp_dir,
            "own_cp_dir": True,
            "inventory": self.inventory_path,
            "namespaces": [n.namespace for n in self.nodes],
            "nodes": [n.as_dict() for n in self.nodes],
            "launchers": launchers,
        }

    def _save_state(self):
        self._state = self._state_dict()
        _write_atomic(_state_path(self.runid), json.dumps(self._state, indent=2) + "\n")

    # -- inventory -----------------------------------------------------------

    def inventory(self, host_vars=None, group_vars=None):
        """The inventory as a dict (group ``cluster``), extra vars merged."""
        ssh_args = (f"-o UserKnownHostsFile={self.known_hosts} "
                    "-o StrictHostKeyChecking=yes")
        merged_host_vars = {}
        for source in (self.host_vars, host_vars or {}):
            for key, values in source.items():
                merged_host_vars.setdefault(self.node(key).name, {}).update(values)
        hosts = {}
        for node in self.nodes:
            hostvars = {
                "ansible_host": node.address,
                "ansible_port": node.port,
                "ansible_user": "root",
                "ansible_ssh_private_key_file": self.ssh_key,
                "ansible_ssh_common_args": ssh_args,
                "ansible_control_path_dir": self.cp_dir,
                "ansible_python_interpreter": self.training_python,
                "preflight_training_python": self.training_python,
                "preflight_node_addr": node.node_addr,
                "preflight_lock_dir": self.lock_dir,
                # The node's sshd runs with -f from the bed's directory, not /etc/ssh: ssh_trust finds
                # that from the listening process, as on a real node.
            }
            hostvars.update(merged_host_vars.get(node.name, {}))
            hosts[node.name] = hostvars
        group = {"hosts": hosts}
        merged_group_vars = {**self.group_vars, **(group_vars or {})}
        if merged_group_vars:
            group["vars"] = merged_group_vars
        return {"all": {"children": {"cluster": group}}}

    def write_inventory(self, host_vars=None, group_vars=None, path=None):
        """Write the inventory YAML (default: ``inventory_path``); return its path."""
        path = path or self.inventory_path
        _write_atomic(path, _to_yaml(self.inventory(host_vars, group_vars)))
        return path

    # -- access to nodes -----------------------------------------------------

    def node(self, key):
        """A node by Node, 1-based index or name."""
        if isinstance(key, Node):
            return key
        for node in self.nodes:
            if key in (node.index, node.name, node.namespace):
                return node
        raise KeyError(f"no node {key!r} in bed {self.runid}")

    def etc_path(self, node):
        """Host-side directory holding what the node wrote under its /etc."""
        return self.overlay_path(node, "/etc")

    def overlay_path(self, node, directory):
        node = self.node(node)
        return os.path.join(node.dir, self._dir_tag(os.path.normpath(directory)) + "-upper")

    def host_pids(self, node):
        """Host-side pids of every process in the node's network namespace."""
        return _netns_pids(self.node(node).namespace)

    def _enter_argv(self, node, argv, cwd=None):
        node = self.node(node)
        if not self._running(node):
            raise TestbedError(f"{node.name}: node is stopped (no PID 1)")
        enter = ["nsenter", "--target", str(node.host_pid), "--net", "--mount", "--uts",
                 "--pid", "--wd=" + (cwd or "/"), "--"]
        if isinstance(argv, str):
            argv = ["sh", "-c", argv]
        return enter + list(argv)

    def run(self, node, argv, timeout=30, check=False, input=None, env=None, cwd=None):
        """Run argv as a process of the node (its net, mount, UTS and PID
        namespaces: what an ssh session there sees).  Returns CompletedProcess."""
        # pylint: disable=redefined-builtin
        full = self._enter_argv(node, argv, cwd)
        kwargs = {"input": input} if input is not None else {}
        try:
            return _run(full, timeout=timeout, check=check, env=env, **kwargs)
        except TestbedError as exc:
            raise TestbedError(f"{self.node(node).name}: {exc}") from exc

    def spawn(self, node, argv, cwd=None, **popen_kwargs):
        """Start argv in the background inside the node; returns the Popen.

        It dies with the node at down() at the latest."""
        popen_kwargs.setdefault("stdin", subprocess.DEVNULL)
        popen_kwargs.setdefault("stdout", subprocess.PIPE)
        popen_kwargs.setdefault("stderr", subprocess.PIPE)
        popen_kwargs.setdefault("text", True)
        return subprocess.Popen(self._enter_argv(node, argv, cwd),  # pylint: disable=consider-using-with
                                **popen_kwargs)

    def ssh_argv(self, node, command=None, address=None, user="root", options=()):
        """argv of a real ssh to the node with the bed's key and known_hosts."""
        node = self.node(node)
        argv = ["ssh", "-F", "/dev/null"]
        for option in options:  # ssh keeps the first value given for an option
            argv += ["-o", option]
        argv += ["-i", self.ssh_key,
                "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", "ControlMaster=no", "-o", "ControlPath=none",
                "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR",
                "-p", str(node.port)]
        argv.append(f"{user}@{address or node.address}")
        if command is not None:
            argv += ["--", command if isinstance(command, str) else shlex.join(command)]
        return argv

    def ssh(self, node, command, timeout=30, check=False, address=None, input=None):
        """Run a command on the node over real ssh (argv list or shell string)."""
        # pylint: disable=redefined-builtin
        kwargs = {"input": input} if input is not None else {}
        return _run(self.ssh_argv(node, command, address=address), timeout=timeout,
                    check=check, **kwargs)

    def iptables(self, node, args, timeout=20, check=True):
        return self.run(node, ["iptables", "-w", "5"] + list(args), timeout=timeout,
                        check=check)

    def tc(self, node, args, timeout=20, check=True):
        return self.run(node, ["tc"] + list(args), timeout=timeout, check=check)

    def ip(self, node, args, timeout=20, check=True):
        return self.run(node, ["ip"] + list(args), timeout=timeout, check=check)

    # -- faults --------------------------------------------------------------

    def stop_sshd(self, node):
        """Stop the node: its sshd is PID 1, so every process of it dies.
        Network and /etc stay; start_sshd() brings it back like a reboot."""
        node = self.node(node)
        if self._running(node):
            _kill_pids([node.host_pid])
        launcher = self._launchers.pop(node.name, None)
        if launcher is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                launcher.wait(timeout=5)
        node.host_pid = 0
        node.host_start = None
        self._save_state()

    def start_sshd(self, node):
        node = self.node(node)
        if self._running(node):
            return
        self._launch(node)
        self._wait_ready(node)
        self._save_state()

    def detach(self, node, ifname):
        """Pull the node's cable on ifname: the host end leaves its bridge."""
        node = self.node(node)
        _run(["ip", "link", "set", node.interfaces[ifname], "nomaster"])

    def attach(self, node, ifname):
        node = self.node(node)
        bridge = self._bridge_of(ifname)
        if bridge is None:
            raise ValueError(f"{ifname} is not a bridged link")
        _run(["ip", "link", "set", node.interfaces[ifname], "master", bridge])

    def _bridge_of(self, ifname):
        if ifname == MGMT_IFNAME:
            return self._bridge("m")
        if ifname.startswith(FABRIC_IFPREFIX):
            return self._bridge(f"f{int(ifname[len(FABRIC_IFPREFIX):])}")
        return None

    def make_unreachable(self, node):
        """Detach every bridged link of the node: it keeps running, but
        connections to it time out (no refusal), as with a hung host."""
        node = self.node(node)
        for ifname in node.interfaces:
            if self._bridge_of(ifname):
                self.detach(node, ifname)

    def make_reachable(self, node):
        node = self.node(node)
        isolated = set()
        for key, ifnames in self._isolate.items():
            if self.node(key) is node:
                isolated.update(ifnames)
        for ifname in node.interfaces:
            if self._bridge_of(ifname) and ifname not in isolated:
                self.attach(node, ifname)

    # -- environment for ansible --------------------------------------------

    def ansible_env(self, base=None):
        """Environment to run the project's ansible against the bed."""
        env = dict(os.environ if base is None else base)
        venv_bin = os.path.join(ROOT, ".venv", "bin")
        env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
        env["ANSIBLE_CONFIG"] = ANSIBLE_CFG
        env["ANSIBLE_INVENTORY"] = self.inventory_path
        return env


# --------------------------------------------------------------------------
# pytest glue (pytest is imported only when these are called)


def testbed_fixture(request, **options):
    """Start a Testbed for a fixture and tear it down with the fixture's scope.

    In a conftest.py::

        import pytest
        from testbed import testbed_fixture

        @pytest.fixture(scope="module")
        def cluster(request):
            return testbed_fixture(request, nodes=3, fabric=True)

    Skips (with the reason) when not root or tools are missing."""
    import pytest  # pylint: disable=import-outside-toplevel

    reason = unavailable_reason()
    if reason:
        pytest.skip(f"test bed unavailable: {reason}")
    bed = Testbed(**options)
    request.addfinalizer(bed.down)
    bed.up()
    return bed


testbed_fixture.__test__ = False


# --------------------------------------------------------------------------
# Command line


def _cmd_up(args):
    bed = Testbed(nodes=args.nodes, workdir=args.workdir, fabric=args.fabric,
                  fabric_rails=args.fabric_rails, docker_bridge=args.docker_bridge,
                  down_iface=args.down_iface)

    def on_term(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    try:
        bed.up()
        print(f"runid: {bed.runid}", flush=True)
        for node in bed.nodes:
            fab = f" fabric {','.join(node.fabric_addresses)}" if node.fabric_addresses else ""
            print(f"node: {node.name} {node.address}{fab} netns {node.namespace}", flush=True)
        print(f"ssh: {shlex.join(bed.ssh_argv(bed.nodes[0]))}", flush=True)
        print(f"inventory: {bed.inventory_path}", flush=True)
        while True:
            # sleep, not signal.pause(): a signal landing just before pause()
            # would leave it blocked for good; sleep bounds that to a second.
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        bed.down()
        print("down", flush=True)
    return 0


def _cmd_down(args):
    if args.all:
        removed = cleanup_stale(include_live=args.force)
    else:
        removed = []
        with _state_lock():
            for runid in args.runid:
                path = _state_path(runid)
                state = {}
                if os.path.exists(path):
                    with open(path, encoding="utf-8") as handle:
                        state = json.load(handle)
                if state and _state_alive(state) and not args.force:
                    print(f"{runid}: owner pid {state['owner_pid']} is alive; "
                          "stop it or use --force", file=sys.stderr)
                    continue
                errors = _teardown_runid(runid, state)
                if errors:
                    print(f"{runid}: " + "; ".join(errors), file=sys.stderr)
                else:
                    removed.append(runid)
    for runid in removed:
        print(f"removed {runid}")
    live = [s["runid"] for s in _read_states() if _state_alive(s)]
    if live and args.all and not args.force:
        print("still running (owner alive): " + " ".join(live))
    return 0


def _cmd_status(_args):
    states = _read_states()
    if not states:
        print("no beds")
    for state in states:
        owner = "alive" if _state_alive(state) else "DEAD (leftover)"
        nodes = ", ".join(f"{n['name']}={n['address']}" for n in state.get("nodes", []))
        print(f"{state['runid']}: owner pid {state.get('owner_pid')} {owner}; "
              f"nodes {nodes or '-'}; inventory {state.get('inventory')}")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a bed and keep it until Ctrl-C/SIGTERM")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--fabric", action="store_true", help="add fabric network fab0")
    up.add_argument("--fabric-rails", type=int, default=None,
                    help="number of fabric links per node (implies --fabric)")
    up.add_argument("--docker-bridge", action="store_true")
    up.add_argument("--down-iface", action="store_true")
    up.add_argument("--workdir", default=None)
    down = sub.add_parser("down", help="remove beds")
    down.add_argument("runid", nargs="*")
    down.add_argument("--all", action="store_true",
                      help="remove every leftover bed (owner process dead)")
    down.add_argument("--force", action="store_true",
                      help="also remove beds whose owner is still running")
    sub.add_parser("status", help="list beds")
    args = parser.parse_args(argv)
    if args.command == "down" and not args.all and not args.runid:
        parser.error("down needs RUNID... or --all")
    reason = unavailable_reason()
    if reason:
        print(f"testbed: {reason}", file=sys.stderr)
        return 2
    return {"up": _cmd_up, "down": _cmd_down, "status": _cmd_status}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
