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

Test-side, not shipped.  This file holds the bed (``Testbed``: bring-up,
state, inventory) and ``testbed_fixture``; what it uses lives next to it:
tests/testbed_net.py (constants, command/netns/proc helpers, ``Node``),
tests/testbed_cleanup.py (state files, teardown of leftover beds),
tests/testbed_ops.py (``TestbedOps``: per-node run/ssh/ip/iptables/tc) and
tests/testbed_cli.py (the command line ``main``).
"""

import contextlib
import ipaddress
import json
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from bed_lifecycle import UpDown
from testbed_cleanup import _LIVE_BEDS, _read_states, _state_path, _teardown_runid, cleanup_stale
from testbed_net import (DOCKER_CIDR, DOCKER_IFNAME, DOCKER_PORT_IFNAME, DOWN_IFNAME, DOWN_NET,
                         FABRIC_IFPREFIX, HOST_OCTET, MAX_NODES, MAX_RAILS, MGMT_IFNAME, NODE_INIT,
                         PREFIX, ROOT, SUBNET_SLOTS, TRAINING_PYTHON, Node, TestbedError, _alive,
                         _kill_pids, _link_names, _netns_list, _netns_pids, _nspid,
                         _proc_start_time, _proc_state, _run, _state_lock, _to_yaml,
                         _write_atomic, unavailable_reason)
from testbed_ops import TestbedOps

# Each node's /etc/resolv.conf (see _prepare_files).
RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"

# What importers use (tests/, bench/): the bed, and the helpers tests/test_testbed.py reads.
__all__ = ["ROOT", "TRAINING_PYTHON", "Node", "Testbed", "TestbedError", "cleanup_stale",
           "testbed_fixture", "unavailable_reason", "_link_names", "_netns_list",
           "_netns_pids", "_nspid", "_proc_state", "_state_path"]


class Testbed(TestbedOps, UpDown):
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
        # node has its own /run/cluster-preflight.  Root's alone, as the gate requires of it.
        self.lock_dir = os.path.join(self.workdir, "run-lock")
        os.makedirs(self.lock_dir, exist_ok=True)
        os.chmod(self.lock_dir, 0o700)
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
            # The host's nameserver is not reachable from the bed's bridge: every lookup of a name /etc/hosts does
            # not hold (c10d makes a reverse lookup per store connection; ssh and Python resolve peers) would wait
            # for DNS.  A resolver on the node's own loopback fails at once, as a reachable cluster DNS answers.
            _write_atomic(os.path.join(etc, "resolv.conf"), RESOLV_CONF)
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
        for hostvars in hosts.values():
            if hostvars["ansible_user"] == "root" and "preflight_job_user" not in {**merged_group_vars, **hostvars}:
                # The venv's interpreter lives under /root (0700): no other account can run it, and root runs job
                # code only when asked. Tests of the job's user name their own account.
                hostvars["preflight_job_user"] = "root"
        if merged_group_vars:
            group["vars"] = merged_group_vars
        return {"all": {"children": {"cluster": group}}}

    def write_inventory(self, host_vars=None, group_vars=None, path=None):
        """Write the inventory YAML (default: ``inventory_path``); return its path."""
        path = path or self.inventory_path
        _write_atomic(path, _to_yaml(self.inventory(host_vars, group_vars)))
        return path

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


if __name__ == "__main__":
    from testbed_cli import main

    sys.exit(main())
