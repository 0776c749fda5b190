"""The job's context (job_env) end to end on the namespace test bed: six nodes with their own /etc, mounts and
network, the gate over real SSH, the all-reduce real (gloo), the job user's login sessions real (runuser, PAM).

Bring-up (the real bringup.yml, job_env alone) writes the memlock drop-in on every node.  Then one gate run with
the cluster's job environment naming the second fabric rail (``GLOO_SOCKET_IFNAME=fab1``, ``NCCL_SOCKET_IFNAME=
=fab1``) and two HCAs (``NCCL_IB_HCA``, on every node's fake fabric), and a fault on each node but the first, each on
a node of its own:

* pfn2: its hostname resolves to Debian's 127.0.1.1 alias first (a line in its /etc/hosts);
* pfn3: it has no fab1 (renamed in its namespace), so the job environment names an interface it lacks;
* pfn4: a 64 MiB tmpfs on /dev/shm (in its mount namespace), less than the 256 MiB the job needs;
* pfn5: a pam_limits line after the drop-in that caps the job user's memlock at 64 KiB (every node has a fake RDMA
  fabric, tests/fabric_tree.py, so every node's memlock is judged: the others pass with the drop-in's limit);
* pfn6: its /etc/hosts gives every node's name an IPv6 address first (every node holds one on eth0).

Each broken node fails with exactly its cause and fix, pfn3 gets no ranks (its peers are still proven over
fab1), and pfn1 passes; the gate's all-reduce ran with the job's environment."""

import json
import os

import pytest

import fabric_tree
from gate_helpers import explain
from playbook import newest_run_dir, run_playbook
from testbed import testbed_fixture

pytestmark = pytest.mark.timeout(900)

NODES = 6
# The job's need in /dev/shm on these CPU nodes (the GPU floor does not apply without GPUs): a job setting.
SHM_MIN_MB = 256
JOB_ENV = {"GLOO_SOCKET_IFNAME": "fab1", "NCCL_SOCKET_IFNAME": "=fab1", "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1",
           "NCCL_DEBUG": "WARN"}
EXTRA = {"ssh_trust_mesh": False, "preflight_nproc_per_node": 1}
LOW_MEMLOCK = "/etc/security/limits.d/99-site-memlock.conf"
# The memlock floor and what bring-up writes, in KiB.  NCCL's figure is unlimited (the role's default), but the
# kernel these beds run on may refuse root a hard memlock limit above its own 8 MiB (pam_limits then leaves the
# session at 8192 without a word): the bed's jobs need, and get, 8 MiB.
MEMLOCK = {"job_env_memlock_min": "8192", "job_env_memlock_value": "8192"}
DROPIN = "/etc/security/limits.d/90-preflight-memlock.conf"


@pytest.fixture(scope="module")
def bed(request):
    return testbed_fixture(request, nodes=NODES, fabric_rails=2)


@pytest.fixture(scope="module")
def brought_up(bed, tmp_path_factory):
    """bringup.yml with job_env alone: the memlock drop-in on every node, audited by the same checks."""
    directory = tmp_path_factory.mktemp("bringup")
    inventory = bed.write_inventory(path=str(directory / "inventory.yml"), group_vars=MEMLOCK)
    result = run_playbook(directory, playbook="bringup.yml", inventory=inventory, timeout=600,
                          extravars={"preflight_bringup_capabilities": ["job_env"]})
    assert result.rc == 0, result.stdout[-3000:]
    return result


def six_faults(bed, root):
    """A fault on each of pfn2..pfn6 (see the module's docstring); returns the host vars and an undo."""
    slot = bed.nodes[0].address.split(".")[2]
    first = bed.nodes[0]
    host_vars = {}
    for node in bed.nodes:
        tree = fabric_tree.make_tree(str(root / node.name / "fab"), ports=2)
        host_vars[node.name] = {"fabric_sysfs_root": tree}
    # pfn2: Debian's hostname alias.
    hosts = os.path.join(bed.etc_path(bed.nodes[1]), "hosts")
    with open(hosts) as handle:
        original = handle.read()
    with open(hosts, "a") as handle:
        handle.write("127.0.1.1\t%s\n" % bed.nodes[1].hostname)
    # pfn3: no fab1.
    bed.ip(bed.nodes[2], ["link", "set", "fab1", "down"])
    bed.ip(bed.nodes[2], ["link", "set", "fab1", "name", "fabx"])
    bed.ip(bed.nodes[2], ["link", "set", "fabx", "up"])
    # pfn4: a small /dev/shm of its own.
    bed.run(bed.nodes[3], ["mount", "-t", "tmpfs", "-o", "size=64m,mode=1777", "tmpfs", "/dev/shm"], check=True)
    # pfn5: a later pam_limits file caps root's memlock (the bed's job user is root).
    with open(os.path.join(bed.etc_path(bed.nodes[4]), LOW_MEMLOCK.split("/etc/", 1)[1]), "w") as handle:
        handle.write("root  -  memlock  64\n")
    # pfn6: IPv6 first for every name; every node holds its IPv6 address.
    for node in bed.nodes:
        bed.ip(node, ["-6", "addr", "add", "2001:db8:%s::%d/64" % (slot, node.index), "dev", "eth0", "nodad"])
    v6 = os.path.join(bed.etc_path(bed.nodes[5]), "hosts")
    with open(v6) as handle:
        text = handle.read()
    with open(v6, "w") as handle:
        handle.write("".join("2001:db8:%s::%d\t%s\n" % (slot, node.index, node.hostname) for node in bed.nodes) + text)

    def undo():
        with open(hosts, "w") as handle:
            handle.write(original)
        bed.ip(bed.nodes[2], ["link", "set", "fabx", "down"], check=False)
        bed.ip(bed.nodes[2], ["link", "set", "fabx", "name", "fab1"], check=False)
        bed.ip(bed.nodes[2], ["link", "set", "fab1", "up"], check=False)
        bed.run(bed.nodes[3], ["umount", "/dev/shm"])
        os.unlink(os.path.join(bed.etc_path(bed.nodes[4]), LOW_MEMLOCK.split("/etc/", 1)[1]))
        with open(v6, "w") as handle:
            handle.write(text)
        for node in bed.nodes:
            bed.ip(node, ["-6", "addr", "del", "2001:db8:%s::%d/64" % (slot, node.index), "dev", "eth0"],
                   check=False)
    assert first.name == "pfn1"
    return host_vars, undo


def job_env_checks(verdict, host):
    return {name: check for name, check in verdict["nodes"][host]["checks"].items() if name.startswith("job_env.")}


def failed(verdict, host):
    return sorted(name for name, check in verdict["nodes"][host]["checks"].items() if check["status"] == "fail")


def test_bring_up_writes_the_memlock_drop_in_on_every_node(bed, brought_up):
    with open(os.path.join(newest_run_dir(brought_up.results_dir), "bringup.json")) as handle:
        report = json.load(handle)
    for node in bed.nodes:
        assert "root       hard  memlock  8192" in bed.run(node, ["cat", DROPIN], check=True).stdout
        checks = report["nodes"][node.name]["checks"]
        assert checks["job_env.memlock"]["status"] in ("pass", "not_applicable"), checks["job_env.memlock"]
        login = bed.run(node, ["runuser", "-l", "root", "-s", "/bin/sh", "-c", "ulimit -l"], check=True).stdout
        assert login.strip() == "8192", (node.name, login)


def test_each_nodes_job_context_fault_is_named_alone_with_its_cause_and_fix(bed, brought_up, tmp_path):
    host_vars, undo = six_faults(bed, tmp_path)
    try:
        inventory = bed.write_inventory(path=str(tmp_path / "inventory.yml"), host_vars=host_vars,
                                        group_vars=dict(MEMLOCK, preflight_job_env=JOB_ENV,
                                                        job_env_shm_min_mb=SHM_MIN_MB))
        result = run_playbook(tmp_path, inventory=inventory, extravars=EXTRA, timeout=800)
    finally:
        undo()
    verdict = result.verdict
    assert verdict is not None, explain(result)
    names = [node.name for node in bed.nodes]
    assert verdict["failed_hosts"] == names[1:], explain(result)
    assert verdict["healthy_hosts"] == names[:1], explain(result)

    # pfn1: every job_env check holds (its fake fabric and the drop-in's memlock included).
    healthy = job_env_checks(verdict, "pfn1")
    assert {name: check["status"] for name, check in healthy.items()} == {
        "job_env.hostname": "pass", "job_env.master_name": "pass", "job_env.address_family": "pass",
        "job_env.socket_ifname": "pass", "job_env.ib_hca": "pass", "job_env.visible_devices": "not_applicable",
        "job_env.dev_shm": "pass", "job_env.memlock": "pass"}, healthy
    assert "fab1" in healthy["job_env.socket_ifname"]["found"]
    assert "selects mlx5_0:1 (ACTIVE), mlx5_1:1 (ACTIVE)" in healthy["job_env.ib_hca"]["found"]
    assert "ulimit -l is 8192" in healthy["job_env.memlock"]["found"]

    for name in names[1:]:
        assert job_env_checks(verdict, name)["job_env.memlock"]["status"] == ("fail" if name == "pfn5" else "pass")
    # Each broken node fails its own check, and only that one.
    assert failed(verdict, "pfn2") == ["job_env.hostname"]
    check = job_env_checks(verdict, "pfn2")["job_env.hostname"]
    assert "gloo binds 127.0.1.1" in check["found"] and "'127.0.1.1 pfn2' line" in check["fix"]
    assert "the line '%s pfn2'" % bed.nodes[1].address in check["fix"]
    assert check["fix"].startswith("on pfn2:")

    assert failed(verdict, "pfn3") == ["job_env.socket_ifname"]
    check = job_env_checks(verdict, "pfn3")["job_env.socket_ifname"]
    assert "GLOO_SOCKET_IFNAME=fab1: pfn3 has no interface fab1 with an address" in check["found"]
    assert "pfn3 has: " in check["found"] and "fabx (UP" in check["found"] and check["fix"].startswith("on pfn3:")
    run = verdict["nodes"]["pfn3"]["checks"]["allreduce.run"]
    assert run["status"] == "skipped" and "job_env.socket_ifname" in run["found"]

    assert failed(verdict, "pfn4") == ["job_env.dev_shm"]
    check = job_env_checks(verdict, "pfn4")["job_env.dev_shm"]
    assert "less than the 256 MiB" in check["found"] and "64 MiB" in check["found"]

    assert failed(verdict, "pfn5") == ["job_env.memlock"]
    check = job_env_checks(verdict, "pfn5")["job_env.memlock"]
    assert "ulimit -l is 64" in check["found"] and "set by 'root - memlock 64' at %s:1" % LOW_MEMLOCK in check["found"]
    assert "remove or change %s:1" % LOW_MEMLOCK in check["fix"]

    assert failed(verdict, "pfn6") == ["job_env.address_family"]
    check = job_env_checks(verdict, "pfn6")["job_env.address_family"]
    assert "resolves to IPv6 first" in check["found"] and "IPv6: pfn6" in check["found"]
    assert check["fix"].startswith("on pfn6:")

    # The gate's own all-reduce ran with the job's environment, on the five nodes that could start it.
    allreduce = verdict["allreduce"]
    assert allreduce["status"] == "pass" and allreduce["hosts"] == [name for name in names if name != "pfn3"]
    for name in allreduce["hosts"]:
        assert verdict["nodes"][name]["checks"]["allreduce.correctness"]["status"] == "pass"
