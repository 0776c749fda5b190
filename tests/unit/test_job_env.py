"""The job_env capability: the reader (FakeOps, a sandbox /proc and /etc, this machine's /dev/shm), the names a job
resolves (hostname, master name, address family across the nodes), /dev/shm, the locked-memory limit (login
session, pam_limits files, what Slurm propagates), validate and the switch.  The interfaces of the job's environment
are tests/unit/test_job_env_ifaces.py; bring-up's drop-in tests/unit/test_job_env_role.py."""

import json
import os

import pytest

from cluster_preflight import capabilities as registry
from cluster_preflight.capabilities import job_env as controller
from cluster_preflight.capabilities.job_env import names
from preflight_node.capabilities import job_env
from preflight_node.host.ops import NO_JOB_USER, TIMEOUT_RC
from preflight_node.limits import slurm as slurm_limits
from fake_ops import FakeOps
from capability_helpers import assert_contract, assert_one_problem, role_settings, statuses, write

HOST = "pfn2"
GETENT = "/usr/bin/getent"
RUNUSER = "/usr/sbin/runuser"
MIB = 1 << 20


def settings(**overrides):
    """The role's defaults (the master name rendered) with ``overrides`` and the job's environment."""
    values = role_settings("job_env", job_env_master_name="pfn1", preflight_job_env={})
    values.update(overrides)
    return values


def ahosts(*addresses):
    return "".join("%s STREAM x\n%s DGRAM\n%s RAW\n" % (address, address, address) for address in addresses)


def answer(*addresses, kind=None, error=None):
    return {"name": "?", "addresses": list(addresses), "how": "getent ahosts", "error": error,
            "kind": kind if kind or addresses else "unknown"}


def nic(*cidrs, up=True, cls="ethernet"):
    return {"ipv4": [c for c in cidrs if ":" not in c], "ipv6": [c for c in cidrs if ":" in c], "is_up": up,
            "class": cls}


def nic_facts(**nics):
    return {"nics": nics, "rdma_devices": {}}


def shm(available_mib=8192, **overrides):
    facts = {"path": "/dev/shm", "exists": True, "is_dir": True, "mode": "1777", "owner": "root",
             "mount_point": "/dev/shm", "fs_type": "tmpfs", "options": "rw", "read_only": False,
             "size_bytes": 16384 * MIB, "available_bytes": available_mib * MIB, "writable": True, "user": "trainer",
             "error": None}
    facts.update(overrides)
    return facts


def node_facts(host, hostname_answer=None, master_answer=None, memlock=None, **extra):
    """job_env facts of ``host`` (its hostname is the host's name, the master pfn1)."""
    names_seen = {host: hostname_answer or answer("198.18.0.%s" % host[-1])}
    names_seen.setdefault("pfn1", master_answer or answer("198.18.0.1"))
    facts = {"hostname": host, "master_name": "pfn1", "job_user": "trainer", "names": names_seen, "shm": shm(),
             "memlock": memlock or {"session": session("unlimited"), "limits": None, "slurm": {"slurmd": False}},
             "privileged": True}
    facts.update(extra)
    return facts


def session(soft, hard=None, **extra):
    return dict({"user": "trainer", "soft": soft, "hard": hard or soft, "how": "runuser -l trainer", "error": None,
                 "not_run": False}, **extra)


def cluster_of(facts_by_host, nics_by_host=None, others=None, node_addr=None):
    """The ``cluster`` view the final stage hands a decider: job_env facts, every capability's facts per node."""
    hosts = sorted(facts_by_host)
    nics_by_host = nics_by_host if nics_by_host is not None else {
        host: nic_facts(eth0=nic("198.18.0.%s/24" % host[-1])) for host in hosts}
    every = {host: dict({"nic_discovery": nics_by_host.get(host)}, **((others or {}).get(host) or {}))
             for host in hosts}
    return {"hosts": hosts, "all_hosts": hosts, "facts": facts_by_host, "settings": {},
            "nodes": {host: {"name": host, "node_addr": (node_addr or {}).get(host, "198.18.0.%s" % host[-1])}
                      for host in hosts}, "node_facts": every, "probes": {}, "lost": {}}


def decide(host, cluster, **overrides):
    chosen = settings(**overrides)
    checks = controller.decide(host, cluster["facts"][host], chosen, cluster=cluster)
    assert_contract("job_env", checks, host)
    return checks


def healthy_cluster():
    return cluster_of({host: node_facts(host) for host in ("pfn1", "pfn2", "pfn3")})


# --- registry, settings, switch ---------------------------------------------------------------------------------


def test_job_env_is_declared_once_and_read_everywhere():
    assert "job_env" in registry.NAMES and "job_env" in registry.LOCAL_NAMES and "job_env" in registry.BRINGUP_NAMES
    assert registry.NAMES.index("job_env") == registry.NAMES.index("fabric") + 1


def test_a_healthy_node_passes_and_cpu_nodes_judge_no_rdma():
    checks = decide(HOST, healthy_cluster())
    assert statuses(checks) == {"hostname": "pass", "master_name": "pass", "address_family": "pass",
                                "socket_ifname": "not_applicable", "ib_hca": "not_applicable",
                                "visible_devices": "not_applicable", "dev_shm": "pass", "memlock": "not_applicable"}
    assert "198.18.0.2" in checks["hostname"]["found"] and "no room judged" in checks["dev_shm"]["expected"]


@pytest.mark.parametrize("value", [False, "false"])
def test_switched_off_is_skipped_and_nothing_is_read(value):
    chosen = settings(job_env_enabled=value)
    assert controller.read_args(chosen, {"name": HOST}) is None
    checks = controller.decide(HOST, None, chosen)
    assert statuses(checks) == {"enabled": "skipped"} and "job_env_enabled is false on pfn2" in checks["enabled"][
        "found"]


def test_no_facts_fail_naming_the_node():
    checks = controller.decide(HOST, None, settings(), cluster=healthy_cluster())
    assert statuses(checks) == {"no_facts": "fail"} and HOST in checks["no_facts"]["found"]


def test_the_defaults_validate_and_bad_inputs_are_named():
    assert controller.validate(settings()) == []
    assert_one_problem(controller.validate(settings(job_env_memlock_min="lots")), "job_env_memlock_min", "lots")
    assert_one_problem(controller.validate(settings(job_env_memlock_value="1024")), "job_env_memlock_value", "1024")
    assert controller.validate(settings(job_env_memlock_min="65536", job_env_memlock_value="131072")) == []
    assert_one_problem(controller.validate(settings(job_env_memlock_dropin="/etc/limits.conf")),
                       "job_env_memlock_dropin", "/etc/limits.conf")
    assert_one_problem(controller.validate(settings(job_env_memlock_domains=["bad domain"])),
                       "job_env_memlock_domains", "bad domain")
    assert_one_problem(controller.validate(settings(job_env_shm_path="dev/shm")), "job_env_shm_path", "dev/shm")


@pytest.mark.parametrize("env, words", [
    ({"NCCL_SOCKET_IFNAME": "^"}, "names nothing"),
    ({"NCCL_IB_HCA": "mlx5_0:one"}, "port after ':'"),
    ({"GLOO_SOCKET_IFNAME": " , "}, "names no interface"),
    ({"NCCL_SOCKET_FAMILY": "AF_UNIX"}, "AF_INET"),
    ({"1BAD": "x"}, "1BAD"),
    ({"NCCL_DEBUG": ["INFO"]}, "NCCL_DEBUG"),
])
def test_the_job_environment_is_judged_before_anything_runs(env, words):
    problems = registry.validate_run(dict(role_settings("preflight"), preflight_job_env=env))
    assert [problem["name"] for problem in problems] == ["preflight_job_env"], problems
    assert words in problems[0]["found"]


def test_a_good_job_environment_validates():
    env = {"NCCL_SOCKET_IFNAME": "^docker,lo", "GLOO_SOCKET_IFNAME": "fab0,fab1", "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1",
           "NCCL_IB_GID_INDEX": 3, "NCCL_SOCKET_FAMILY": "AF_INET"}
    assert registry.validate_run(dict(role_settings("preflight"), preflight_job_env=env)) == []


def test_every_capability_gets_the_job_environment_from_one_place():
    assert registry.shared({"preflight_job_env": {"NCCL_IB_HCA": "mlx5"}}) == {
        "preflight_job_env": {"NCCL_IB_HCA": "mlx5"}}
    assert registry.shared({}) == {"preflight_job_env": {}}
    assert controller.job_env({"preflight_job_env": {"NCCL_IB_GID_INDEX": 3}}) == {"NCCL_IB_GID_INDEX": "3"}
    assert controller.job_env({}) == {}


# --- the reader -----------------------------------------------------------------------------------------------


def reader_ops(hostname_out=None, master_rc=0, session_out="unlimited\nunlimited\n"):
    commands = {(GETENT, "ahosts", "pfn1"): (master_rc, ahosts("198.18.0.1") if master_rc == 0 else "", ""),
                (RUNUSER, "-l"): (0, session_out, "")}
    ops = FakeOps(programs={"getent": GETENT, "runuser": RUNUSER}, commands=commands)
    ops.job, ops.job_user = {"name": "trainer", "how": "named", "run_as": "trainer"}, "trainer"
    return ops


def read_args(tmp_path, **overrides):
    args = controller.read_args(settings(job_env_root=str(tmp_path), job_env_proc_root=str(tmp_path / "proc"),
                                         **overrides), {"name": HOST})
    return json.loads(json.dumps(args))


def test_the_reader_resolves_as_the_job_user_and_reads_shm_and_limits(tmp_path, monkeypatch):
    monkeypatch.setattr(job_env.socket, "gethostname", lambda: HOST)
    write(tmp_path, "/proc/self/mountinfo", "22 1 0:20 / /dev/shm rw,nosuid,nodev shared:3 - tmpfs tmpfs rw\n")
    write(tmp_path, "/etc/security/limits.conf", "*  hard  memlock  64\n")
    ops = reader_ops()
    ops.commands[(GETENT, "ahosts", HOST)] = (0, ahosts("127.0.1.1", "198.18.0.2"), "")
    facts = json.loads(json.dumps(job_env.read(read_args(tmp_path, job_env_shm_path=str(tmp_path)), ops)))
    assert facts["hostname"] == HOST and facts["master_name"] == "pfn1" and facts["job_user"] == "trainer"
    assert facts["names"][HOST]["addresses"] == ["127.0.1.1", "198.18.0.2"]
    assert facts["names"]["pfn1"]["addresses"] == ["198.18.0.1"]
    # Every command that resolves runs as the job user.
    assert [user for argv, user in zip(ops.calls, ops.users) if argv[0] == GETENT] == ["trainer", "trainer"]
    assert facts["shm"]["exists"] and facts["shm"]["available_bytes"] > 0 and facts["shm"]["size_bytes"] > 0
    lines = facts["memlock"]["limits"]["lines"]
    assert [(line["domain"], line["value"]) for line in lines] == [("*", "64")]
    assert facts["memlock"]["slurm"] == dict(slurm_limits.read(str(tmp_path / "proc"), []), slurmd=False)


@pytest.mark.parametrize("rc, kind", [(2, "unknown"), (TIMEOUT_RC, "timeout"), (1, "tool")])
def test_a_name_without_answer_says_why(rc, kind):
    ops = reader_ops(master_rc=rc)
    found = job_env.resolve("pfn1", ops, job_env.job_account(ops))
    assert found["addresses"] == [] and found["kind"] == kind and found["error"]


def test_no_job_user_means_nothing_runs_as_anyone():
    ops = reader_ops()
    ops.job, ops.job_user = {"name": "nobody", "how": "unavailable", "run_as": None}, NO_JOB_USER
    account = job_env.job_account(ops)
    assert job_env.resolve("pfn1", ops, account)["kind"] == "not_run"
    assert job_env.login_memlock(ops, account)["not_run"] is True
    assert ops.calls == []


def test_no_getent_is_a_tool_missing():
    ops = FakeOps()
    assert job_env.resolve("pfn1", ops, ("trainer", None, ""))["kind"] == "tool"


def test_getent_output_keeps_its_order():
    assert job_env.parse_ahosts(ahosts("2001:db8::3", "198.18.0.3")) == ["2001:db8::3", "198.18.0.3"]
    assert job_env.parse_ahosts("198.18.0.3      pfn3\n") == ["198.18.0.3"]


def test_shm_writability_follows_the_mode_bits_for_the_job_user(tmp_path):
    shared = tmp_path / "shm"
    shared.mkdir()
    os.chmod(str(shared), 0o755)
    facts = job_env.read_shm(str(shared), "/proc", ("nobody", "nobody", ""))
    assert facts["writable"] is False and facts["mode"] == "0755"
    os.chmod(str(shared), 0o1777)
    assert job_env.read_shm(str(shared), "/proc", ("nobody", "nobody", ""))["writable"] is True
    assert job_env.read_shm(str(tmp_path / "missing"), "/proc", ("nobody", None, ""))["exists"] is False


def test_the_mount_holding_a_path_is_the_longest_mount_point(tmp_path):
    write(tmp_path, "/self/mountinfo", "1 0 0:1 / / rw - ext4 /dev/sda1 rw\n"
                                       "2 1 0:2 / /dev rw - devtmpfs udev rw\n"
                                       "3 2 0:3 / /dev/shm rw,nosuid - tmpfs tmpfs rw,size=65536k\n")
    assert job_env.mount_of("/dev/shm", str(tmp_path))["fs_type"] == "tmpfs"
    assert job_env.mount_of("/dev/shmx", str(tmp_path))["mount_point"] == "/dev"


# --- names ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("hostname_answer, status, words", [
    (answer("198.18.0.2"), "pass", "198.18.0.2"),
    (answer("127.0.1.1", "198.18.0.2"), "fail", "gloo binds 127.0.1.1"),
    (answer("198.19.9.9"), "fail", "none of which an interface of pfn2 holds"),
    (answer("198.19.9.9", "198.18.0.2"), "pass", "198.19.9.9, 198.18.0.2"),
    (answer(), "fail", "does not resolve"),
    (answer(kind="timeout", error="getent ahosts pfn2 as trainer gave no answer in 10 s"), "fail", "hangs there"),
    (answer(kind="tool", error="getent (glibc's libc-bin) is not installed"), "skipped", "not checked"),
    (answer(kind="not_run", error="no account may run job-side code"), "skipped", "not checked"),
])
def test_the_hostname_resolves_to_an_address_of_the_node_never_to_loopback(hostname_answer, status, words):
    cluster = healthy_cluster()
    cluster["facts"][HOST] = node_facts(HOST, hostname_answer=hostname_answer)
    check = decide(HOST, cluster)["hostname"]
    assert check["status"] == status and words in check["found"], check
    if status == "fail" and "hangs" not in words:
        assert "198.18.0.2 pfn2" in check["fix"] and "127.0.1.1 pfn2" in check["fix"]
    if status == "skipped":
        assert check["details"]["blocked"]


def test_loopback_is_right_where_the_gate_itself_runs_over_loopback():
    cluster = cluster_of({"localhost": node_facts("localhost", hostname_answer=answer("127.0.0.1"))},
                         {"localhost": nic_facts(lo=nic("127.0.0.1/8", cls="loopback"))},
                         node_addr={"localhost": "127.0.0.1"})
    cluster["facts"]["localhost"]["master_name"] = "localhost"
    cluster["facts"]["localhost"]["names"] = {"localhost": answer("127.0.0.1")}
    checks = decide("localhost", cluster)
    assert checks["hostname"]["status"] == "pass" and "over loopback" in checks["hostname"]["found"]
    assert checks["master_name"]["status"] == "pass"


@pytest.mark.parametrize("master_answer, status, words", [
    (answer("198.18.0.1"), "pass", "198.18.0.1"),
    (answer("127.0.1.1"), "fail", "not to the master pfn1"),
    (answer("198.18.0.77"), "fail", "which the master pfn1 does not hold"),
    (answer(), "fail", "gai error"),
])
def test_the_master_name_resolves_to_an_address_the_master_holds(master_answer, status, words):
    cluster = healthy_cluster()
    cluster["facts"][HOST] = node_facts(HOST, master_answer=master_answer)
    # The jobs' environment states the name: every fault of it fails.
    check = decide(HOST, cluster, preflight_job_env={"MASTER_ADDR": "pfn1"})["master_name"]
    assert check["status"] == status and words in check["found"], check
    if status == "fail":
        assert check["fix"].startswith("on pfn2: correct the entry for pfn1")


def test_the_default_master_name_that_does_not_resolve_warns_and_says_how_to_state_the_jobs_name():
    """The first inventory name is a guess at what jobs use: a cluster whose jobs use Slurm's node names or addresses
    is not failed for it; a loopback or stale answer of it still fails."""
    cluster = healthy_cluster()
    cluster["facts"][HOST] = node_facts(HOST, master_answer=answer())
    check = decide(HOST, cluster)["master_name"]
    assert check["status"] == "warn" and "job_env_master_name's default" in check["found"], check
    assert "MASTER_ADDR in preflight_job_env" in check["fix"]
    cluster["facts"][HOST] = node_facts(HOST, master_answer=answer("127.0.1.1"))
    assert decide(HOST, cluster)["master_name"]["status"] == "fail"
    # Stated by the operator under another name than the first node's: fails.
    cluster["facts"][HOST] = node_facts(HOST, master_answer=answer())
    assert decide(HOST, dict(cluster, hosts=["pfn3", "pfn1", "pfn2"]))["master_name"]["status"] == "fail"


def test_master_addr_of_the_jobs_environment_is_the_name_resolved_on_the_nodes():
    chosen = settings(preflight_job_env={"MASTER_ADDR": "head-0"})
    assert controller.read_args(chosen, {"name": HOST})["master_name"] == "head-0"
    assert controller.read_args(settings(), {"name": HOST})["master_name"] == "pfn1"


def test_on_the_master_itself_loopback_reaches_its_own_store():
    cluster = healthy_cluster()
    cluster["facts"]["pfn1"]["names"]["pfn1"] = answer("127.0.1.1", "198.18.0.1")
    checks = decide("pfn1", cluster)
    assert checks["master_name"]["status"] == "pass"
    assert checks["hostname"]["status"] == "fail", "the master's own hostname is judged by hostname"


def test_a_master_name_that_is_no_node_of_the_run_is_resolved_but_not_compared():
    cluster = healthy_cluster()
    cluster["facts"][HOST] = node_facts(HOST)
    cluster["facts"][HOST]["master_name"] = "vip-master"
    cluster["facts"][HOST]["names"]["vip-master"] = answer("198.18.0.250")
    check = decide(HOST, cluster)["master_name"]
    assert check["status"] == "pass" and "no node of this run is named vip-master" in check["found"]


def test_an_empty_master_name_is_not_applicable():
    cluster = healthy_cluster()
    cluster["facts"][HOST]["master_name"] = ""
    assert decide(HOST, cluster)["master_name"]["status"] == "not_applicable"


def test_the_node_whose_names_resolve_to_ipv6_is_named_alone():
    v6 = {host: node_facts(host) for host in ("pfn1", "pfn2", "pfn3")}
    v6["pfn3"] = node_facts("pfn3", hostname_answer=answer("2001:db8::3", "198.18.0.3"),
                            master_answer=answer("2001:db8::1", "198.18.0.1"))
    nics = {host: nic_facts(eth0=nic("198.18.0.%s/24" % host[-1], "2001:db8::%s/64" % host[-1]))
            for host in v6}
    cluster = cluster_of(v6, nics)
    results = {host: decide(host, cluster) for host in v6}
    assert {host: checks["address_family"]["status"] for host, checks in results.items()} == {
        "pfn1": "pass", "pfn2": "pass", "pfn3": "fail"}
    bad = results["pfn3"]["address_family"]
    assert "pfn1 resolves to IPv6 first" in bad["found"] and "pfn3 resolves to IPv6 first" in bad["found"]
    assert "IPv4: pfn1, pfn2; IPv6: pfn3" in bad["found"]
    assert bad["fix"].startswith("on pfn3:") and "gai.conf" in bad["fix"]
    # The other checks of that node hold: its names resolve to addresses the nodes hold.
    assert results["pfn3"]["hostname"]["status"] == "pass" and results["pfn3"]["master_name"]["status"] == "pass"
    assert "IPv4: pfn1, pfn2; IPv6: pfn3" in results["pfn1"]["address_family"]["found"]


def test_no_name_resolved_has_no_family_to_judge():
    cluster = healthy_cluster()
    cluster["facts"][HOST] = node_facts(HOST, hostname_answer=answer(), master_answer=answer())
    assert decide(HOST, cluster)["address_family"]["status"] == "not_applicable"


def test_names_family_helpers():
    assert names.family("2001:db8::1") == "IPv6" and names.family("198.19.0.1") == "IPv4" and names.family("x") is None
    assert names.is_loopback("127.0.1.1") and names.is_loopback("::1") and not names.is_loopback("198.19.0.1")
    assert names.held(nic_facts(eth0=nic("198.19.0.1/24", "fe80::1/64"))) == {"198.19.0.1", "fe80::1"}
    assert names.held(None) is None


# --- /dev/shm ---------------------------------------------------------------------------------------------------


def gpu_cluster(gpus, **shm_overrides):
    cluster = healthy_cluster()
    cluster["facts"][HOST]["shm"] = shm(**shm_overrides)
    cluster["node_facts"][HOST]["gpu_health"] = {"gpus": [{}] * gpus}
    return cluster


@pytest.mark.parametrize("gpus, overrides, setting, status, words", [
    (8, {"available_mib": 4096}, {}, "pass", "4096 MiB of 16384 MiB free"),
    (8, {"available_mib": 64}, {}, "fail", "less than the 1024 MiB"),
    (0, {"available_mib": 64}, {}, "pass", "64 MiB"),
    (0, {"available_mib": 64}, {"job_env_shm_min_mb": 256}, "fail", "less than the 256 MiB"),
    (2, {"available_mib": 200}, {}, "fail", "less than the 256 MiB"),
    (0, {"writable": False}, {}, "fail", "cannot create files in it"),
    (0, {"read_only": True}, {}, "fail", "read-only"),
    (0, {"exists": False}, {}, "fail", "does not exist"),
    (0, {"mount_point": "/"}, {}, "warn", "not a mount of its own"),
    (0, {"writable": None}, {}, "skipped", "was not read"),
    (0, {"error": "statvfs /dev/shm: Permission denied"}, {}, "skipped", "not checked"),
])
def test_dev_shm_has_room_for_ncclS_segments_and_the_job_user_may_write_it(gpus, overrides, setting, status, words):
    check = decide(HOST, gpu_cluster(gpus, **overrides), **setting)["dev_shm"]
    assert check["status"] == status and words in check["found"], check
    if status == "fail":
        assert check["fix"].startswith("on pfn2:")


def test_the_gpus_are_counted_from_the_gpu_tool_or_the_devices():
    cluster = healthy_cluster()
    assert controller.gpu_count(cluster, HOST) == 0
    cluster["node_facts"][HOST]["allreduce"] = {"accelerators": {"nvidia": 4, "amd": 0}}
    assert controller.gpu_count(cluster, HOST) == 4
    cluster["node_facts"][HOST]["gpu_health"] = {"gpus": [{}] * 8}
    assert controller.gpu_count(cluster, HOST) == 8


# --- locked memory ----------------------------------------------------------------------------------------------


def rdma_cluster(memlock):
    cluster = healthy_cluster()
    cluster["facts"][HOST] = node_facts(HOST, memlock=memlock)
    cluster["node_facts"][HOST]["fabric"] = {"present": True, "devices": {
        "mlx5_0": {"ports": [{"port": 1, "state": "ACTIVE"}]}}}
    return cluster


def limits_facts(lines=(), text=None):
    path = "/etc/security/limits.d/90-preflight-memlock.conf"
    files = ["/etc/security/limits.conf", "/etc/security/limits.d/50-site.conf", path]
    return {"path": path, "limits_conf": files[0], "limits_dir": "/etc/security/limits.d", "pam_dir": "/etc/pam.d",
            "limits_dir_exists": True, "text": text, "error": None, "files": files,
            "lines": [dict(line, order=files.index(line["file"])) for line in lines], "unreadable": [],
            "pam_services": ["/etc/pam.d/runuser"]}


LOW_LINE = {"file": "/etc/security/limits.d/50-site.conf", "lineno": 3, "domain": "trainer", "type": "-",
            "item": "memlock", "value": "64"}
SLURMD = {"slurmd": True, "pid": 812, "soft": "unlimited", "hard": "unlimited", "error": None,
          "conf": "/etc/slurm/slurm.conf", "conf_how": "found", "conf_error": None,
          "propagation": {"propagate": None, "except": None, "memlock": True}}


@pytest.mark.parametrize("memlock, status, words", [
    ({"session": session("unlimited"), "limits": limits_facts(), "slurm": {"slurmd": False}}, "pass",
     "ulimit -l is unlimited"),
    ({"session": session("64"), "limits": limits_facts([LOW_LINE]), "slurm": {"slurmd": False}}, "fail",
     "'trainer - memlock 64' at /etc/security/limits.d/50-site.conf:3"),
    ({"session": session("unlimited"), "limits": limits_facts(), "slurm": dict(SLURMD, soft="64", hard="64")},
     "fail", "at most slurmd's hard limit 64"),
    ({"session": session("unlimited"), "limits": limits_facts(), "slurm": dict(
        SLURMD, soft="64", propagation={"propagate": None, "except": "MEMLOCK", "memlock": False})},
     "fail", "slurmd's own limit 64"),
    ({"session": session("unlimited"), "limits": limits_facts(), "slurm": dict(SLURMD, soft="64")},
     "pass", "propagates MEMLOCK"),
    ({"session": session("unlimited"), "limits": limits_facts(), "slurm": dict(SLURMD, error="/proc/812/limits: gone")},
     "pass", "its limits could not be read"),
    ({"session": session(None, not_run=True, error="no account may run job-side code"), "limits": limits_facts(),
      "slurm": {"slurmd": False}}, "skipped", "was not opened"),
    ({"session": session(None, error="runuser (util-linux) is not installed"), "limits": limits_facts(),
      "slurm": {"slurmd": False}}, "skipped", "could not be read"),
])
def test_the_job_users_locked_memory_on_an_rdma_node(memlock, status, words):
    check = decide(HOST, rdma_cluster(memlock))["memlock"]
    assert check["status"] == status and words in check["found"], check
    if status == "fail":
        assert "90-preflight-memlock.conf" in check["fix"] and check["fix"].startswith("on pfn2:")
    if "50-site.conf" in words:
        assert "remove or change /etc/security/limits.d/50-site.conf:3" in check["fix"]


def test_a_floor_in_kib_passes_a_limit_above_it():
    memlock = {"session": session("2097152"), "limits": limits_facts(), "slurm": {"slurmd": False}}
    check = decide(HOST, rdma_cluster(memlock), job_env_memlock_min="1048576", job_env_memlock_value="2097152")
    assert check["memlock"]["status"] == "pass"


@pytest.mark.parametrize("listed, status", [(["mlx5_0"], "fail"), ([], "not_applicable"), (None, "fail")])
def test_without_interface_facts_bring_ups_audit_judges_the_files(listed, status):
    """Bring-up's audit reads no interfaces: the RDMA devices job_env's reader listed say whether memlock matters;
    a reader that listed nothing (older facts) judges what bring-up writes."""
    memlock = {"session": None, "limits": limits_facts(), "slurm": {"slurmd": False}}
    cluster = healthy_cluster()
    cluster["facts"][HOST] = node_facts(HOST, memlock=memlock, rdma_devices=listed)
    cluster["node_facts"] = {}
    check = decide(HOST, cluster)["memlock"]
    assert check["status"] == status
    if status == "fail":
        assert "does not exist" in check["found"]
    if listed is None:
        assert decide(HOST, cluster, job_env_memlock_dropin_enabled=False)["memlock"]["status"] == "not_applicable"


# --- what Slurm propagates ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, memlock", [
    ("", True),
    ("PropagateResourceLimits=NONE\n", False),
    ("propagateresourcelimits=MEMLOCK,CORE\n", True),
    ("PropagateResourceLimits=CORE\n", False),
    ("PropagateResourceLimitsExcept=MEMLOCK  # IB nodes set their own\n", False),
    ("PropagateResourceLimitsExcept=CORE\n", True),
])
def test_slurm_propagation_of_memlock(text, memlock):
    assert slurm_limits.parse_propagation(text)["memlock"] is memlock


def test_slurmds_own_limit_and_conf_are_read_from_proc(tmp_path):
    proc = tmp_path / "proc"
    write(proc, "/812/comm", "slurmd\n")
    write(proc, "/812/limits", "Limit                     Soft Limit           Hard Limit           Units\n"
                               "Max locked memory         65536                65536                bytes\n")
    conf = write(tmp_path, "/etc/slurm/bed.conf", "PropagateResourceLimitsExcept=MEMLOCK\n")
    with open(str(proc / "812" / "cmdline"), "wb") as handle:
        handle.write(b"/usr/sbin/slurmd\0-f\0" + conf.encode() + b"\0")
    write(proc, "/900/comm", "sshd\n")
    facts = slurm_limits.read(str(proc), ["/etc/slurm/slurm.conf"])
    assert facts["slurmd"] and facts["pid"] == 812 and (facts["soft"], facts["hard"]) == ("64", "64")
    assert facts["conf"] == conf and facts["propagation"]["memlock"] is False
    assert slurm_limits.read(str(tmp_path / "none"), [])["slurmd"] is False


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another account needs root")
def test_a_process_another_account_named_slurmd_leads_root_nowhere(tmp_path):
    """Any account can name a process slurmd: root reads the limits and slurm.conf of root's slurmd alone, and a
    slurm.conf that is not a regular file root owns (a FIFO would hang the read) is refused, not read."""
    proc = tmp_path / "proc"
    write(proc, "/700/comm", "slurmd\n")
    write(proc, "/700/cmdline", "slurmd\0-f\0/home/mallory/fifo\0")
    os.chown(str(proc / "700"), 65534, 65534)
    assert slurm_limits.read(str(proc), [])["slurmd"] is False
    fifo = str(tmp_path / "slurm.fifo")
    os.mkfifo(fifo)
    write(proc, "/812/comm", "slurmd\n")
    write(proc, "/812/cmdline", "slurmd\0-f\0%s\0" % fifo)
    facts = slurm_limits.read(str(proc), [])
    assert facts["slurmd"] and facts["propagation"] is None and "not a regular file" in facts["conf_error"]
    theirs = write(tmp_path, "/etc/slurm/theirs.conf", "PropagateResourceLimits=NONE\n")
    os.chown(theirs, 65534, 65534)
    write(proc, "/812/cmdline", "slurmd\0-f\0%s\0" % theirs)
    assert "not root" in slurm_limits.read(str(proc), [])["conf_error"]


# --- the GPUs the jobs' environment makes visible -----------------------------------------------------------------


@pytest.mark.parametrize("value, status, words", [
    ("0,1,2,3", "pass", "4 distinct GPUs visible to each rank; a job starts at most 4 ranks"),
    ("GPU-5f1c2e9a-0b7d-4c11-9a2e-1d3f5b7c9e01,1", "pass", "2 distinct GPUs"),
    ("0,1,1,2", "fail", "GPU 1 is named twice: two ranks on one GPU ('Duplicate GPU detected')"),
    ("0,1,8", "fail", "GPU 8 does not exist there (indices 0 to 7): CUDA stops reading there, so only 0, 1 are"),
    ("gpu0,1", "fail", "entry 1, 'gpu0', is neither a GPU index nor a UUID: CUDA stops reading there, so no GPU"),
    ("", "fail", "no GPU is visible to the job's ranks"),
])
def test_cuda_visible_devices_of_the_jobs_environment_names_each_gpu_once_and_only_gpus_the_node_has(
        value, status, words):
    cluster = healthy_cluster()
    cluster["node_facts"][HOST]["gpu_health"] = {"gpus": [{}] * 8}
    check = decide(HOST, cluster, preflight_job_env={"CUDA_VISIBLE_DEVICES": value})["visible_devices"]
    assert check["status"] == status and words in check["found"], check
    if status == "fail":
        assert "distinct GPU indices below 8" in check["fix"]


def test_cuda_visible_devices_is_not_judged_without_the_variable_or_on_a_node_without_gpus():
    cluster = healthy_cluster()
    assert decide(HOST, cluster, preflight_job_env={"CUDA_VISIBLE_DEVICES": "0,0"})["visible_devices"]["status"] \
        == "not_applicable", "a CPU node: nothing to select"
    cluster["node_facts"][HOST]["gpu_health"] = {"gpus": [{}] * 8}
    check = decide(HOST, cluster)["visible_devices"]
    assert check["status"] == "not_applicable" and "takes its own by LOCAL_RANK" in check["found"]


def test_the_duplicate_gpu_cause_names_the_check_that_catches_it_before_the_job():
    from cluster_preflight.capabilities.allreduce import signatures  # pylint: disable=import-outside-toplevel
    line = "node4:88:88 [3] init.cc:880 NCCL WARN Duplicate GPU detected : rank 3 and rank 7 both on CUDA device 41000"
    cause = signatures.primary(signatures.match(line))
    assert cause["id"] == "duplicate_gpu" and cause["checks"] == ["job_env.visible_devices"]
