"""Network, process and state helpers of the namespace test bed (tests/testbed.py).

Test-side helper, not shipped: the address-plan constants, ``TestbedError``, the bounded
command runner, /proc and netns probes, ``unavailable_reason`` and the ``Node`` record.
"""

import contextlib
import dataclasses
import fcntl
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time


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
# A node of the bed (tests/testbed.py builds them)


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

