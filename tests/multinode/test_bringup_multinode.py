"""Node bring-up (playbooks/bringup.yml) and its audit (playbooks/preflight.yml)
on the namespace test bed: three nodes, each with its own /etc, over real SSH.

One bed goes through the life of a cluster in stages, each a module-scoped
fixture that depends on the one before it, so a test that needs a late stage
gets every earlier one, in order, whatever tests are selected:

  seeded      foreign limits.conf and sysctl.conf on one node, core_pattern at
              the kernel default "core"
  before      preflight.yml before bring-up, policy warn, with an apport
              pattern in another sysctl file of one node (removed after); then
              policy fail
  brought_up  bringup.yml check+diff (writes nothing), apply, re-apply
  audited     preflight.yml after bring-up
  hand_edit   one node's drop-in edited by hand, bringup.yml check+diff, edit undone

Every playbook run costs tens of seconds on the bed, so the conflicting file
rides along with the first audit instead of getting a run of its own.

Environment facts this file relies on (see tests/testbed.py):
  * nodes share this machine's files except /etc: the debug tools bring-up
    installs (apt packages, the py-spy tools venv under /opt) must already be
    on the host, so bring-up finds them and changes nothing outside /etc;
  * kernel.core_pattern (and core_uses_pid, Yama's ptrace_scope) are global
    sysctls: they are saved first and restored on every way out.
"""

import atexit
import hashlib
import os
import re
import stat
import subprocess
import time

import pytest

from playbook import run_playbook, task_results
from job_env import job_python
from testbed import unavailable_reason, testbed_fixture

pytestmark = [pytest.mark.multinode, pytest.mark.timeout(600)]

NODES = 3
FOREIGN_NODE = 2   # gets the foreign limits.conf / sysctl.conf
EDIT_NODE = 2      # gets the hand-edited drop-in
CONFLICT_NODE = 3  # gets /etc/sysctl.d/99-zz.conf

# The seeds' values (pytorch-debug-async-cuda-and-core-files.md), not the role defaults:
# the test checks that bring-up delivers what the seeds ask for.
SEED_PATTERN = "/tmp/core-%e.%p.%h.%t"
SYSCTL_DROPIN = "/etc/sysctl.d/60-preflight-core.conf"
LIMITS_DROPIN = "/etc/security/limits.d/90-preflight-core.conf"
PTRACE_DROPIN = "/etc/sysctl.d/60-preflight-ptrace.conf"
CONFLICT_FILE = "/etc/sysctl.d/99-zz.conf"
APPORT_PATTERN = "|/usr/share/apport/apport %p"
HAND_PATTERN = "/var/tmp/hand-edited-core.%p"

PROC_SYSCTLS = {
    "kernel.core_pattern": "/proc/sys/kernel/core_pattern",
    "kernel.core_uses_pid": "/proc/sys/kernel/core_uses_pid",
    # Only on kernels with the Yama LSM; bring-up (opted in below) would set it globally.
    "kernel.yama.ptrace_scope": "/proc/sys/kernel/yama/ptrace_scope",
}
YAMA = os.path.exists(PROC_SYSCTLS["kernel.yama.ptrace_scope"])

# What bring-up installs: present on the host beforehand (scripts/test does it), so the
# nodes, which share /usr and /opt with the host, find them and install nothing.
HOST_PACKAGES = ("gdb", "strace", "pdsh", "nmap", "python3-venv", "python3-packaging")
PYSPY_VENV_BIN = "/opt/preflight-tools/bin/py-spy"
PYSPY_LINK = "/usr/local/bin/py-spy"
# The debug_tools role's apt task refreshes lists older than its cache_valid_time (3600 s),
# judged by the mtime of /var/lib/apt/lists (no update-success-stamp on Debian); three nodes
# doing that at once on the shared /var/lib/apt fail on its lock.  So the lists are refreshed
# here first when they are older than half an hour, which leaves the module time to run.
APT_LISTS = "/var/lib/apt/lists"
APT_FRESH_SECONDS = 1800

FOREIGN_LIMITS = (
    "# /etc/security/limits.conf -- site settings, kept by hand.\n"
    "#<domain>      <type>  <item>         <value>\n"
    "@hpc            soft    nofile          65536\n"
    "@hpc\thard\tnofile\t65536\n"
    "\n"
    "   # an indented comment the bring-up must not touch\n"
    "@hpc            -       memlock         unlimited"  # no newline at the end, on purpose
)
FOREIGN_SYSCTL = (
    "# /etc/sysctl.conf -- site settings, kept by hand.\n"
    "vm.swappiness = 10\n"
    "; a semicolon comment\n"
    "net.core.somaxconn=4096\n"
    "\t# a tab-indented comment\n"
    "kernel.panic = 30   \n"
    "# end"  # no newline at the end, on purpose
)

CORE_CHECKS = ("core_pattern", "core_pattern_persisted", "core_pattern_boot", "core_pattern_pid",
               "core_dir", "core_limits", "core_limits_session", "core_probe")
# Drift before bring-up: what the audit must report under the drift policy (the job user's login
# session has no core limit before the limits drop-in exists).
DRIFT_CHECKS = ("core_pattern", "core_pattern_persisted", "core_pattern_boot", "core_limits", "core_limits_session")
DEBUG_TOOLS = ("gdb", "strace", "pdsh", "nmap", "py_spy")

# Keep the all-reduce gate of preflight.yml short: it is not what this file tests
# (tests/multinode/test_gate_multinode.py is), but every audit runs it.
GATE_VARS = {
    # Job-side code (torch probe, ranks, core and ptrace probes) runs as an unprivileged job user, as an
    # operator names it; the audit proves the bring-up for that user.
    "preflight_job_user": "nobody",
    "preflight_nproc_per_node": 1,
    "allreduce_sizes": [65536],
    "allreduce_iters": 2,
    "allreduce_warmup": 1,
}
# An operator who wants debuggers to attach opts in (the default leaves ptrace_scope alone).
# ssh_trust's node-to-node login mesh (and its pdsh run) needs a user key on every node, which on
# this bed, whose nodes share this machine's /root, would land in this machine's /root; it is
# switched off here and covered by tests/multinode/test_ssh_trust.py on a bed with private /root.
# Its known-hosts block is still brought up and audited with everything else.
GROUP_VARS = dict(GATE_VARS, kernel_debug_ptrace_scope_enabled=True, ssh_trust_mesh=False)
PLAYBOOK_TIMEOUT = 240


# ---------------------------------------------------------------------------
# Helpers


def read_proc(path):
    with open(path, encoding="ascii") as handle:
        return handle.read().rstrip("\n")


def write_proc(path, value):
    with open(path, "w", encoding="ascii") as handle:
        handle.write(value)


class SysctlGuard:
    """Saves the global sysctls bring-up touches and puts them back, once."""

    def __init__(self):
        self.saved = {path: read_proc(path) for path in PROC_SYSCTLS.values() if os.path.exists(path)}
        self.restored = False

    def restore(self):
        if self.restored:
            return
        errors = []
        for path, value in self.saved.items():
            try:
                if read_proc(path) != value:
                    write_proc(path, value)
            except OSError as exc:
                errors.append("%s: %s" % (path, exc))
        self.restored = True
        if errors:
            raise RuntimeError("could not restore " + "; ".join(errors))


def tree_digest(top):
    """{relative path: (kind, mode, content digest or link target)} of everything under top."""
    result = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in sorted(dirnames) + sorted(filenames):
            path = os.path.join(dirpath, name)
            info = os.lstat(path)
            rel = os.path.relpath(path, top)
            if stat.S_ISLNK(info.st_mode):
                result[rel] = ("link", None, os.readlink(path))
            elif stat.S_ISREG(info.st_mode):
                with open(path, "rb") as handle:
                    digest = hashlib.sha256(handle.read()).hexdigest()
                result[rel] = ("file", stat.S_IMODE(info.st_mode), digest)
            elif stat.S_ISDIR(info.st_mode):
                result[rel] = ("dir", stat.S_IMODE(info.st_mode), None)
            else:  # overlay whiteouts are character devices 0/0
                result[rel] = ("other", info.st_mode, info.st_rdev)
    return result


def etc_state(bed):
    """{node name: tree_digest of what the node holds in its own /etc}."""
    return {node.name: tree_digest(bed.etc_path(node)) for node in bed.nodes}


def upper(bed, node, path):
    """Host-side path of what the node holds in its own /etc at logical path."""
    return os.path.join(bed.etc_path(node), os.path.relpath(path, "/etc"))


def read_bytes(path):
    with open(path, "rb") as handle:
        return handle.read()


def node_write(bed, node, path, text):
    """Write a file as a process of the node does (through its overlay /etc)."""
    bed.run(node, ["mkdir", "-p", os.path.dirname(path)], check=True, timeout=10)
    # Testbed.run() always sets stdin, so the text goes through a spawned tee's pipe.
    proc = bed.spawn(node, ["tee", path], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        _out, err = proc.communicate(text, timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    assert proc.returncode == 0, "%s: writing %s failed: %s" % (bed.node(node).name, path, err)


def node_read(bed, node, path):
    proc = bed.run(node, ["cat", path], timeout=10)
    return proc.stdout if proc.returncode == 0 else None


def assignments(text):
    """(key, value) of every non-comment line of a sysctl.d file."""
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and line[0] not in "#;" and "=" in line:
            key, value = line.split("=", 1)
            found.append((key.strip(), value.strip()))
    return found


def limit_entries(text):
    return {tuple(line.split()) for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")}


def explain(result):
    return "rc=%s stats=%s\n%s" % (result.rc, result.stats, result.stdout[-4000:])


def changed_by_host(result):
    return {host: (result.stats.get("changed") or {}).get(host, 0) for host in result.stats.get("ok", {})}


def changes_of(seeded, brought_up, step):
    """The bed, bring-up's ``step`` run and its changed count by host, that run having ended rc 0 with
    every node in its stats."""
    bed, _ = seeded
    result = brought_up[step]
    assert result.rc == 0, explain(result)
    changed = changed_by_host(result)
    assert sorted(changed) == [node.name for node in bed.nodes], explain(result)
    return bed, result, changed


def node_checks(result, host):
    return result.verdict["nodes"][host]["checks"]


def capability_checks(result, host, capability):
    """{check name: check} of one capability on one node, from the verdict."""
    prefix = capability + "."
    return {name[len(prefix):]: check for name, check in node_checks(result, host).items()
            if name.startswith(prefix)}


def host_etc_state():
    """This machine's own copies of the files bring-up writes (the nodes must not touch them)."""
    paths = (SYSCTL_DROPIN, LIMITS_DROPIN, PTRACE_DROPIN, CONFLICT_FILE,
             "/etc/sysctl.conf", "/etc/security/limits.conf")
    return {path: read_bytes(path) if os.path.exists(path) else None for path in paths}


def host_prerequisites_missing():
    missing = []
    for package in HOST_PACKAGES:
        proc = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True,
                              timeout=20, check=False)
        if "install ok installed" not in proc.stdout:
            missing.append(package)
    if not os.access(PYSPY_VENV_BIN, os.X_OK) or os.path.realpath(PYSPY_LINK) != PYSPY_VENV_BIN:
        missing.append("py-spy in %s linked from %s" % (os.path.dirname(os.path.dirname(PYSPY_VENV_BIN)), PYSPY_LINK))
    return missing


def ensure_fresh_apt_lists():
    if time.time() - os.stat(APT_LISTS).st_mtime < APT_FRESH_SECONDS:
        return
    try:
        proc = subprocess.run(["apt-get", "update", "-qq"], capture_output=True, text=True, timeout=240,
                              check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.skip("apt lists are stale and apt-get update did not finish in 240 s")
    if proc.returncode != 0:
        pytest.skip("apt lists are stale and apt-get update failed: " + proc.stderr.strip()[-300:])
    # apt-get update leaves the directory's mtime alone when no list changed; the apt module
    # would then still see stale lists.  Record the refresh where the module looks for it.
    os.utime(APT_LISTS)


def play(bed, tmp_path_factory, name, playbook, **kwargs):
    directory = tmp_path_factory.mktemp(name)
    return run_playbook(directory, playbook=playbook, inventory=bed.inventory_path, timeout=PLAYBOOK_TIMEOUT,
                        **kwargs)


# ---------------------------------------------------------------------------
# Stages (module scope, each depends on the one before)


@pytest.fixture(scope="module")
def seeded(request):
    """The bed with foreign site files on one node and core_pattern at the kernel default."""
    reason = unavailable_reason()
    if reason:
        pytest.skip("test bed unavailable: " + reason)
    missing = host_prerequisites_missing()
    if missing:
        pytest.skip("bring-up would install on this machine (nodes share /usr and /opt); pre-install: "
                    + ", ".join(missing) + " (scripts/test does)")
    ensure_fresh_apt_lists()
    guard = SysctlGuard()
    request.addfinalizer(guard.restore)
    atexit.register(guard.restore)  # also on an interrupted session
    host_before = host_etc_state()
    # The state of a node nobody has brought up, whatever an earlier run left behind.
    write_proc(PROC_SYSCTLS["kernel.core_pattern"], "core")
    write_proc(PROC_SYSCTLS["kernel.core_uses_pid"], "0")
    python = job_python("nobody")
    if python is None:
        pytest.skip("no Python with torch that an unprivileged job user can run on this machine")
    bed = testbed_fixture(request, nodes=NODES, training_python=python)
    bed.write_inventory(group_vars=GROUP_VARS)
    node_write(bed, FOREIGN_NODE, "/etc/security/limits.conf", FOREIGN_LIMITS)
    node_write(bed, FOREIGN_NODE, "/etc/sysctl.conf", FOREIGN_SYSCTL)
    foreign = {}
    for path in ("/etc/security/limits.conf", "/etc/sysctl.conf"):
        full = upper(bed, FOREIGN_NODE, path)
        foreign[path] = (read_bytes(full), os.stat(full).st_mtime_ns)
    return bed, {"guard": guard, "host_before": host_before, "foreign": foreign}


@pytest.fixture(scope="module")
def before(seeded, tmp_path_factory):
    """preflight.yml on nodes nobody has brought up: policy warn (one node with a conflicting
    sysctl file), then policy fail.  What the nodes hold in /etc is recorded after each."""
    bed, _ = seeded
    conflict_node = bed.node(CONFLICT_NODE)
    node_write(bed, conflict_node, CONFLICT_FILE, "kernel.core_pattern=%s\n" % APPORT_PATTERN)
    etc = {}
    try:
        etc["before_warn"] = etc_state(bed)
        warn = play(bed, tmp_path_factory, "audit-before-warn", "playbooks/preflight.yml")
        etc["after_warn"] = etc_state(bed)
    finally:
        bed.run(conflict_node, ["rm", "-f", CONFLICT_FILE], check=True, timeout=10)
    assert not os.path.exists(upper(bed, conflict_node, CONFLICT_FILE))
    etc["before_fail"] = etc_state(bed)
    fail = play(bed, tmp_path_factory, "audit-before-fail", "playbooks/preflight.yml",
                extravars={"core_dumps_drift_policy": "fail"})
    etc["after_fail"] = etc_state(bed)
    return {"warn": warn, "fail": fail, "conflict_node": conflict_node.name, "etc": etc,
            "pattern_after": read_proc(PROC_SYSCTLS["kernel.core_pattern"])}


@pytest.fixture(scope="module")
def brought_up(seeded, before, tmp_path_factory):
    """bringup.yml: check+diff with the state hashed around it, apply, re-apply."""
    bed, _ = seeded
    state = {}
    state["etc_before_check"] = etc_state(bed)
    state["pattern_before_check"] = read_proc(PROC_SYSCTLS["kernel.core_pattern"])
    state["check"] = play(bed, tmp_path_factory, "bringup-check", "playbooks/bringup.yml", check=True, diff=True)
    state["etc_after_check"] = etc_state(bed)
    state["pattern_after_check"] = read_proc(PROC_SYSCTLS["kernel.core_pattern"])
    state["apply"] = play(bed, tmp_path_factory, "bringup-apply", "playbooks/bringup.yml")
    state["pattern_after_apply"] = read_proc(PROC_SYSCTLS["kernel.core_pattern"])
    state["files"] = {}
    for node in bed.nodes:
        state["files"][node.name] = {
            path: {"upper": read_bytes(upper(bed, node, path)) if os.path.exists(upper(bed, node, path)) else None,
                   "inside": node_read(bed, node, path)}
            for path in (SYSCTL_DROPIN, LIMITS_DROPIN, PTRACE_DROPIN)}
    state["reapply"] = play(bed, tmp_path_factory, "bringup-reapply", "playbooks/bringup.yml")
    return state


@pytest.fixture(scope="module")
def audited(seeded, brought_up, tmp_path_factory):
    bed, _ = seeded
    return play(bed, tmp_path_factory, "audit-after", "playbooks/preflight.yml")


@pytest.fixture(scope="module")
def hand_edit(seeded, audited, tmp_path_factory):
    """One node's core drop-in edited by hand, then a check+diff bring-up; the edit is undone after."""
    bed, _ = seeded
    node = bed.node(EDIT_NODE)
    path = upper(bed, node, SYSCTL_DROPIN)
    original = read_bytes(path)
    edited = "# edited by hand on %s\nkernel.core_pattern = %s\n" % (node.name, HAND_PATTERN)
    node_write(bed, node, SYSCTL_DROPIN, edited)
    try:
        result = play(bed, tmp_path_factory, "bringup-diff", "playbooks/bringup.yml", check=True, diff=True)
        after_run = read_bytes(path)
    finally:
        node_write(bed, node, SYSCTL_DROPIN, original.decode())
    assert read_bytes(path) == original, "could not undo the hand edit on " + node.name
    return {"result": result, "edited": edited, "after_run": after_run, "node": node.name}


# ---------------------------------------------------------------------------
# Bring-up: check mode, apply, re-apply, diff


def test_check_mode_reports_changes_on_every_node_and_writes_nothing(seeded, brought_up):
    bed, result, changed = changes_of(seeded, brought_up, "check")
    assert all(count > 0 for count in changed.values()), changed
    pattern_task = task_results(result, "Ensure kernel.core_pattern is set")
    assert sorted(pattern_task) == sorted(changed)
    for host, res in pattern_task.items():
        assert res["changed"] is True, (host, res)
        dropin_diff = next(item for item in res["diff"] if item["before_header"] == SYSCTL_DROPIN)
        assert dropin_diff["before"] == "" and "kernel.core_pattern = %s" % SEED_PATTERN in dropin_diff["after"]
    for name in changed:
        state = brought_up["etc_after_check"][name]
        assert state == brought_up["etc_before_check"][name], name
        assert os.path.relpath(SYSCTL_DROPIN, "/etc") not in state, name
        assert os.path.relpath(LIMITS_DROPIN, "/etc") not in state, name
    assert brought_up["pattern_after_check"] == brought_up["pattern_before_check"] == "core"


def test_apply_writes_the_dropins_into_each_node_and_sets_the_seed_pattern(seeded, brought_up):
    bed, extra = seeded
    result = brought_up["apply"]
    assert result.rc == 0, explain(result)
    changed = changed_by_host(result)
    assert sorted(changed) == [node.name for node in bed.nodes] and all(changed.values()), changed
    assert brought_up["pattern_after_apply"] == SEED_PATTERN
    for node in bed.nodes:
        files = brought_up["files"][node.name]
        sysctl = files[SYSCTL_DROPIN]
        assert sysctl["upper"] is not None, "%s: %s not in the node's own /etc" % (node.name, SYSCTL_DROPIN)
        assert sysctl["inside"] == sysctl["upper"].decode(), node.name
        assert assignments(sysctl["inside"]) == [("kernel.core_pattern", SEED_PATTERN)], sysctl["inside"]
        assert sysctl["inside"].startswith("# Managed by the cluster preflight")
        limits = files[LIMITS_DROPIN]
        assert limits["upper"] is not None and limits["inside"] == limits["upper"].decode(), node.name
        assert limit_entries(limits["inside"]) == {
            (domain, kind, "core", "unlimited") for domain in ("*", "root") for kind in ("soft", "hard")}
        ptrace = files[PTRACE_DROPIN]
        if YAMA:
            assert assignments(ptrace["inside"]) == [("kernel.yama.ptrace_scope", "0")]
        else:  # no Yama LSM: not applicable, nothing written
            assert ptrace["upper"] is None and ptrace["inside"] is None, node.name
    for host, res in task_results(result, "Ensure kernel.yama.ptrace_scope").items():
        assert res.get("not_applicable") is (not YAMA), (host, res)
    # The nodes wrote their own /etc only: this machine's files are as they were.
    assert host_etc_state() == extra["host_before"]


def test_reapply_changes_nothing_on_any_node(seeded, brought_up):
    bed, result, changed = changes_of(seeded, brought_up, "reapply")
    assert changed == {node.name: 0 for node in bed.nodes}, explain(result)


def test_diff_run_shows_a_hand_edit_on_that_node_only(seeded, hand_edit):
    bed, _ = seeded
    result = hand_edit["result"]
    node = hand_edit["node"]
    assert result.rc == 0, explain(result)
    assert changed_by_host(result) == {n.name: (1 if n.name == node else 0) for n in bed.nodes}, explain(result)
    pattern_task = task_results(result, "Ensure kernel.core_pattern is set")
    assert sorted(pattern_task) == [n.name for n in bed.nodes]
    for host, res in pattern_task.items():
        dropin_diff = next(item for item in res["diff"] if item["before_header"] == SYSCTL_DROPIN)
        if host == node:
            assert res["changed"] is True
            assert dropin_diff["before"] == hand_edit["edited"]
            assert assignments(dropin_diff["after"]) == [("kernel.core_pattern", SEED_PATTERN)]
        else:
            assert res["changed"] is False and dropin_diff["before"] == dropin_diff["after"], host
    # The operator sees one drop-in diff, that node's, with the hand edit; check mode left it alone.
    assert result.stdout.count("+++ after: " + SYSCTL_DROPIN) == 1, result.stdout[-3000:]
    assert result.stdout.count(HAND_PATTERN) == 1, result.stdout[-3000:]
    assert hand_edit["after_run"].decode() == hand_edit["edited"]


def test_foreign_site_files_survive_bringup_byte_for_byte(seeded, brought_up):
    bed, extra = seeded
    assert brought_up["apply"].rc == 0 and brought_up["reapply"].rc == 0
    for path, (content, mtime) in extra["foreign"].items():
        full = upper(bed, FOREIGN_NODE, path)
        assert read_bytes(full) == content, path
        assert os.stat(full).st_mtime_ns == mtime, "%s was rewritten (same bytes)" % path
        assert node_read(bed, FOREIGN_NODE, path).encode() == content, path
    assert extra["foreign"]["/etc/sysctl.conf"][0] == FOREIGN_SYSCTL.encode()
    assert extra["foreign"]["/etc/security/limits.conf"][0] == FOREIGN_LIMITS.encode()


# ---------------------------------------------------------------------------
# The audit (preflight.yml) before and after bring-up


def test_audit_after_bringup_passes_every_node(seeded, audited):
    bed, _ = seeded
    result = audited
    assert result.rc == 0 and result.verdict["status"] == "pass", explain(result)
    assert result.verdict["failed_hosts"] == [] and result.verdict["warn_hosts"] == [], explain(result)
    names = [node.name for node in bed.nodes]
    assert result.verdict["healthy_hosts"] == names
    for host in names:
        core = capability_checks(result, host, "core_dumps")
        assert set(CORE_CHECKS) <= set(core), core
        for name, check in core.items():
            assert check["status"] == "pass", (host, name, check)
        probe = core["core_probe"]["found"]
        # %h is the node's own hostname: the core was written inside that node, then removed.
        match = re.search(r"(/tmp/core-sleep\.\d+\.%s\.\d+) written by .* and removed" % re.escape(host), probe)
        assert match, probe
        assert not os.path.exists(match.group(1)), match.group(1)
        ptrace = capability_checks(result, host, "kernel_debug")["ptrace_scope"]
        if YAMA:
            assert ptrace["status"] == "pass", ptrace
        else:
            assert ptrace["status"] == "not_applicable" and "no Yama" in ptrace["found"], ptrace
        # The job user attaches to its own process whatever the LSM says: proven, not inferred.
        attach = capability_checks(result, host, "kernel_debug")["ptrace_attach"]
        assert attach["status"] == "pass" and attach["found"].startswith("nobody (uid "), attach
        iommu = capability_checks(result, host, "iommu")
        for name in ("grub", "cmdline"):
            assert iommu[name]["status"] == "not_applicable", (host, name)
        tools = capability_checks(result, host, "debug_tools")
        for tool in DEBUG_TOOLS:
            check = tools["tool_" + tool]
            assert check["status"] == "pass", (host, tool, check)
        trust = capability_checks(result, host, "ssh_trust")
        assert trust["known_hosts"]["status"] == "pass", trust["known_hosts"]
        assert trust["host_keys"]["status"] == "pass", trust["host_keys"]


def test_audit_before_bringup_reports_drift_as_warn(seeded, before):
    bed, _ = seeded
    result = before["warn"]
    names = [node.name for node in bed.nodes]
    assert result.rc == 0 and result.verdict["status"] == "pass", explain(result)
    assert result.verdict["failed_hosts"] == [] and sorted(result.verdict["warn_hosts"]) == names
    for host in names:
        checks = capability_checks(result, host, "core_dumps")
        for name in DRIFT_CHECKS:
            assert checks[name]["status"] == "warn" and checks[name]["fix"], (host, name, checks[name])
        # Drift does not stop a crash from dumping: the probe still proves cores are written.
        assert checks["core_probe"]["status"] == "pass", checks["core_probe"]
    # An audit writes nothing on a node, nor the global core_pattern.
    etc = before["etc"]
    assert etc["after_warn"] == etc["before_warn"] and etc["after_fail"] == etc["before_fail"]
    for host in names:
        assert os.path.relpath(SYSCTL_DROPIN, "/etc") not in etc["after_fail"][host], host
        assert os.path.relpath(LIMITS_DROPIN, "/etc") not in etc["after_fail"][host], host
    assert before["pattern_after"] == "core"


def test_audit_before_bringup_with_fail_policy_fails_naming_nodes_and_checks(seeded, before):
    bed, _ = seeded
    result = before["fail"]
    names = [node.name for node in bed.nodes]
    assert result.rc != 0 and result.verdict["status"] == "fail", explain(result)
    assert sorted(result.verdict["failed_hosts"]) == names
    assert "PREFLIGHT FAILED" in result.stdout
    for host in names:
        checks = node_checks(result, host)
        # Exactly the drift fails: the policy turns warnings into failures and nothing else.
        assert {name for name, check in checks.items() if check["status"] == "fail"} == {
            "core_dumps." + name for name in DRIFT_CHECKS}, checks
        for name in DRIFT_CHECKS:
            assert checks["core_dumps." + name]["fix"], (host, name)
            assert "%s / core_dumps.%s: found " % (host, name) in result.stdout, (host, name)
        # The policy is core_dumps'; kernel_debug keeps its own (warn), so ptrace_scope never fails here.
        ptrace = checks["kernel_debug.ptrace_scope"]
        assert ptrace["status"] != "fail", ptrace
        if not YAMA:
            assert ptrace["status"] == "not_applicable", ptrace


def test_conflicting_sysctl_file_is_reported_for_that_node_only(seeded, before):
    bed, _ = seeded
    result = before["warn"]
    node = before["conflict_node"]
    assert result.rc == 0, explain(result)
    for other in bed.nodes:
        boot = capability_checks(result, other.name, "core_dumps")["core_pattern_boot"]
        if other.name == node:
            assert boot["status"] == "warn", boot
            assert CONFLICT_FILE in boot["found"] and APPORT_PATTERN in boot["found"], boot
            assert "%s:1" % CONFLICT_FILE in boot["fix"], boot
        else:
            # Drift too (nothing sets the pattern at boot yet), but no conflict and no such file.
            assert CONFLICT_FILE not in boot["found"] and "overrides" not in boot["found"], (other.name, boot)
