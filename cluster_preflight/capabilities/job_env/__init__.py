# -*- coding: utf-8 -*-
"""Capability ``job_env``, the controller half: the node as a training job finds it.

The reader (``read``: names resolved as the job user, ``/dev/shm``, the job user's locked-memory limits and what
Slurm gives a job) is the node half, ``module_utils/preflight_node/capabilities/job_env.py``; the role
``roles/job_env`` holds the variables and bring-up's memlock drop-in.  Here: ``validate``, ``read_args``, ``decide`` (pure) and
``validate_job_env`` (the run-wide ``preflight_job_env``, every capability's ``settings["preflight_job_env"]``).

``decide`` also reads what other capabilities read on the node (the controller passes every node's facts as
``cluster["node_facts"]``): the interfaces (``nic_discovery``), the RDMA devices (``fabric``, else
``nic_discovery``) and the GPUs (``gpu_health``, ``allreduce``).  The names are judged in ``names.py``,
the interfaces in ``interfaces.py``, the GPUs the jobs' environment makes visible in ``devices.py``.
"""

from __future__ import annotations

import re

from preflight_node.capabilities import job_env as node_half
from preflight_node.limits import session as limits
from preflight_node.limits import write as limits_write
from preflight_node.checks import blocked, failed, not_applicable, passed, skipped, warned

from ..common import switched_on
from . import devices
from . import interfaces as ifaces
from . import names

CAPABILITY = node_half.CAPABILITY
SETTING = "preflight_job_env"
MIB = 1 << 20
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MEMO = {}
CHECKS = ("hostname", "master_name", "address_family", "socket_ifname", "ib_hca", "visible_devices", "dev_shm",
          "memlock")


# ---------------------------------------------------------------------------------------------
# validate (controller)

def _problem(name, found, expected, fix):
    return {"name": name, "found": str(found), "expected": str(expected), "fix": str(fix)}


def job_env(settings):
    """The job's environment of a capability's ``settings`` (``{}`` when none is named), values as text."""
    return {str(key): str(value) for key, value in ((settings or {}).get(SETTING) or {}).items()}


def validate_job_env(env):
    """Problems with ``preflight_job_env``: variable names, values a shell would pass, NCCL's and gloo's syntax."""
    if not isinstance(env, dict):
        return [_problem(SETTING, env, "a mapping of environment variables", "write it as NAME: value lines")]
    problems = []
    for key, value in env.items():
        if not _ENV_NAME.match(str(key)):
            problems.append(_problem(SETTING, key, "environment variable names", "remove or rename %r" % key))
        elif isinstance(value, (dict, list)) or value is None:
            problems.append(_problem(SETTING, "%s: %r" % (key, value), "a text or number value",
                                     "give %s one value, as the job's environment would" % key))
    if problems:
        return problems
    for variable, why in ifaces.syntax_problems(job_env({SETTING: env})):
        problems.append(_problem(SETTING, "%s: %s" % (variable, why), "NCCL's list syntax (prefix, =exact, "
                                 "^exclude, device:port) or gloo's comma list of interface names",
                                 "correct %s in preflight_job_env (NCCL's environment variables documentation)"
                                 % variable))
    return problems


def _memlock_value(text):
    """A memlock value in KiB, None for unlimited; ValueError otherwise."""
    text = str(text).strip().lower()
    if text in limits_write.UNLIMITED:
        return None
    if not text.isdigit():
        raise ValueError(text)
    return int(text)


def _covers(value, floor):
    """Whether the limit ``value`` is at least ``floor`` (both KiB, None: unlimited)."""
    return value is None or (floor is not None and value >= floor)


def validate(settings):
    """Problems with the job_env inputs beyond types and choices, each ``{name, found, expected, fix}``."""
    problems = []
    values = {}
    for name in ("job_env_memlock_min", "job_env_memlock_value"):
        try:
            values[name] = _memlock_value(settings[name])
        except ValueError:
            problems.append(_problem(name, settings[name], "unlimited or a size in KiB",
                                     "set %s to unlimited (NCCL's recommendation) or a number of KiB" % name))
    if len(values) == 2 and not _covers(values["job_env_memlock_value"], values["job_env_memlock_min"]):
        problems.append(_problem("job_env_memlock_value", settings["job_env_memlock_value"],
                                 "at least job_env_memlock_min (%s)" % settings["job_env_memlock_min"],
                                 "raise job_env_memlock_value, or lower job_env_memlock_min"))
    domains = [str(domain).strip() for domain in settings["job_env_memlock_domains"] or []]
    for error in limits_write.validate(domains, ["soft", "hard"], "memlock", "unlimited"):
        problems.append(_problem("job_env_memlock_domains", error, "limits.conf(5) domains (*, root, @group, a user)",
                                 "correct job_env_memlock_domains (%s)" % limits_write.MAN))
    problem = limits_write.path_problem(settings["job_env_memlock_dropin"])
    if problem:
        problems.append(_problem("job_env_memlock_dropin", problem,
                                 "a *.conf file of its own in %s" % limits.LIMITS_DIR,
                                 "set job_env_memlock_dropin to e.g. /etc/security/limits.d/90-preflight-memlock.conf"))
    for name in ("job_env_shm_mb_per_gpu", "job_env_shm_min_mb"):
        if settings[name] < 0:
            problems.append(_problem(name, settings[name], "0 MiB or more", "set %s to 0 or a size in MiB" % name))
    for name in ("job_env_shm_path", "job_env_root", "job_env_proc_root", "job_env_sysfs_root"):
        if not str(settings[name] or "").startswith("/"):
            problems.append(_problem(name, settings[name], "an absolute path", "leave %s at its default" % name))
    if settings["job_env_task_timeout"] < 1:
        problems.append(_problem("job_env_task_timeout", settings["job_env_task_timeout"], "1 second or more",
                                 "set job_env_task_timeout to e.g. 60"))
    return problems


# ---------------------------------------------------------------------------------------------
# node call arguments (controller)

def read_args(settings, node):
    """What ``read`` needs on ``node``; None when job_env_enabled is false."""
    if not switched_on(settings["job_env_enabled"]):
        return None
    return {
        # MASTER_ADDR of the jobs' environment is the name they use, when the operator states it there.
        "master_name": str((settings.get(SETTING) or {}).get("MASTER_ADDR") or settings["job_env_master_name"] or ""),
        "shm_path": settings["job_env_shm_path"],
        "proc_root": settings["job_env_proc_root"],
        "sysfs_root": settings["job_env_sysfs_root"],
        "root": settings["job_env_root"],
        "limits": {"path": settings["job_env_memlock_dropin"], "limits_conf": limits.LIMITS_CONF,
                   "limits_dir": limits.LIMITS_DIR, "pam_dir": limits.PAM_DIR},
        "slurm_confs": [str(path) for path in settings["job_env_slurm_confs"] or []],
    }


# ---------------------------------------------------------------------------------------------
# decide (controller, pure)

def _other(cluster, host, capability):
    return (((cluster or {}).get("node_facts") or {}).get(host) or {}).get(capability)


def gpu_count(cluster, host):
    """The GPUs of ``host`` as the gate counted them: the GPU tool's (gpu_health), else the devices (allreduce)."""
    listed = len(((_other(cluster, host, "gpu_health") or {}).get("gpus")) or [])
    devices = (_other(cluster, host, "allreduce") or {}).get("accelerators") or {}
    return max(listed, sum(value for value in devices.values() if isinstance(value, int)))


def _mib(count):
    return "%d MiB" % (count // MIB) if count is not None else "unknown"


def shm_check(host, facts, settings, gpus):
    """``dev_shm``: /dev/shm is there, mounted, with the room NCCL's segments need for the node's GPUs, and the job
    user may create files in it."""
    shm = facts.get("shm") or {}
    path = shm.get("path") or settings["job_env_shm_path"]
    floor = max(int(settings["job_env_shm_min_mb"]), gpus * int(settings["job_env_shm_mb_per_gpu"]))
    room = "%d MiB free (%s)" % (floor, "%d GPUs x job_env_shm_mb_per_gpu %d" % (
        gpus, settings["job_env_shm_mb_per_gpu"]) if gpus else "job_env_shm_min_mb") if floor else "no room judged"
    expected = "%s mounted, writable by the job user %s, %s" % (path, shm.get("user"), room)
    mount_fix = ("on %s: mount it (fstab: 'tmpfs %s tmpfs defaults,size=%dm 0 0'; in a container: --shm-size=%dm "
                 "or --ipc=host)" % (host, path, max(floor, 1024), max(floor, 1024)))
    if shm.get("error"):
        return blocked("not checked: %s on %s" % (shm["error"], host), expected, mount_fix)
    if not shm.get("exists") or not shm.get("is_dir"):
        return failed("%s %s on %s: NCCL cannot create its shared memory segments ('Error while creating shared "
                      "memory segment')" % (path, "does not exist" if not shm.get("exists") else "is not a directory",
                                            host), expected, mount_fix)
    found = "%s on %s: %s (%s), %s of %s free, mode %s, owner %s" % (
        path, host, shm.get("fs_type") or "unknown file system", shm.get("mount_point") or "?",
        _mib(shm.get("available_bytes")), _mib(shm.get("size_bytes")), shm.get("mode"), shm.get("owner"))
    if shm.get("read_only"):
        return failed("%s; mounted read-only" % found, expected, "on %s: remount %s read-write" % (host, path))
    if shm.get("writable") is False:
        return failed("%s; the job user %s cannot create files in it" % (found, shm.get("user")), expected,
                      "on %s: chmod 1777 %s (what every distribution sets)" % (host, path))
    if floor and (shm.get("available_bytes") or 0) < floor * MIB:
        return failed("%s: less than the %d MiB NCCL's segments need here (posix_fallocate fails: 'No space left "
                      "on device')" % (found, floor), expected,
                      "on %s: remount %s larger (mount -o remount,size=%dm %s, and the size in /etc/fstab), or free "
                      "it of stale nccl-* segments of jobs that died" % (host, path, max(floor * 2, 1024), path))
    if shm.get("writable") is None:
        return blocked("%s; whether the job user %s may write it was not read (no such account here)" % (
            found, shm.get("user")), expected, names.JOB_USER_FIX)
    if shm.get("mount_point") != path:
        return warned("%s: not a mount of its own, so segments go to the file system of %s" % (
            found, shm.get("mount_point") or "/"), expected, mount_fix)
    return passed(found, expected)


def has_rdma(cluster, host):
    return bool(ifaces.rdma_devices(_other(cluster, host, "fabric"), _other(cluster, host, "nic_discovery")))


def rdma_hosts(cluster):
    """The nodes of ``cluster`` with an RDMA device, in its order; memoised per view."""
    node_facts = (cluster or {}).get("node_facts") or {}
    hosts = (cluster or {}).get("hosts") or []
    key = (id(node_facts), len(node_facts), len(hosts))
    hit = _MEMO.get("rdma")
    if not (hit and hit[0] == key and hit[1] is node_facts):
        hit = (key, node_facts, [host for host in hosts if has_rdma(cluster, host)])
        _MEMO["rdma"] = hit
    return hit[2]


def _at_least(value, floor):
    """Whether the limit ``value`` (text: KiB or unlimited) is at least ``floor`` (KiB, None: unlimited)."""
    try:
        return _covers(_memlock_value(value), floor)
    except ValueError:
        return False


def _slurm_part(slurm, floor):
    """``(problem or None, text)``: what Slurm gives a job's processes on this node, against the floor."""
    if not slurm or not slurm.get("slurmd"):
        return None, "no slurmd runs here (nothing Slurm propagates to check)"
    if slurm.get("error"):
        return None, "slurmd (pid %s) runs, its limits could not be read: %s" % (slurm.get("pid"), slurm["error"])
    limits_text = "slurmd (pid %s) has memlock %s (hard %s)" % (slurm.get("pid"), slurm.get("soft"), slurm.get("hard"))
    propagation = slurm.get("propagation")
    if propagation is None:
        how = "whether it propagates MEMLOCK is unknown (%s)" % (slurm.get("conf_error") or "no slurm.conf read")
        propagated = None
    else:
        propagated = propagation["memlock"]
        how = "%s %s MEMLOCK" % (slurm.get("conf"), "propagates" if propagated else "does not propagate")
    text = "%s; %s" % (limits_text, how)
    if not _at_least(slurm.get("hard"), floor):
        return ("Slurm's jobs get at most slurmd's hard limit %s" % slurm.get("hard")), text
    if propagated is False and not _at_least(slurm.get("soft"), floor):
        return ("Slurm's jobs get slurmd's own limit %s" % slurm.get("soft")), text
    return None, text


def _entries(settings):
    return limits_write.entries_for(settings["job_env_memlock_domains"], ("soft", "hard"), "memlock",
                                    settings["job_env_memlock_value"])


def _files_part(limits_facts, settings):
    """``(ok, text, conflicts)``: whether the pam_limits files give the wanted memlock (the drop-in holds its lines,
    nothing later or more specific overrides them), as the writer judges it."""
    if not limits_facts:
        return False, "the pam_limits files were not read", []
    checks = limits_write.decide_limits(limits_facts, _entries(settings), "fail", "memlock")
    conflicts = limits_write.conflicts(limits_facts, _entries(settings))
    bad = [item["found"] for item in checks.values() if item["status"] != "pass"]
    return not bad, "; ".join(bad) or checks["memlock"]["found"], conflicts


def memlock_check(host, facts, settings, rdma):
    """``memlock``: on RDMA nodes, the job user's locked-memory limit in a login session and what Slurm gives its
    jobs, unlimited or at least ``job_env_memlock_min``.  ``rdma`` None: not known,
    then the limit bring-up writes is judged."""
    wanted = str(settings["job_env_memlock_min"])
    floor = _memlock_value(wanted)
    memlock = facts.get("memlock") or {}
    session = memlock.get("session")
    expected = "the job user %s may lock %s of memory (ulimit -l) on RDMA nodes, in a login session and in Slurm's " \
               "jobs" % (facts.get("job_user"), "unlimited" if floor is None else "%d KiB" % floor)
    dropin_on = switched_on(settings["job_env_memlock_dropin_enabled"])
    if rdma is False or (rdma is None and not dropin_on):
        return not_applicable("no RDMA device on %s (nic_discovery, fabric): locked memory limits only RDMA "
                              "registrations" % host, expected)
    dropin = settings["job_env_memlock_dropin"]
    fix = ("on %s: run bringup.yml (it writes %s: memlock %s for %s), then start a new login session; for Slurm "
           "also LimitMEMLOCK=infinity in slurmd's unit (systemctl edit slurmd) and restart it" % (
               host, dropin, settings["job_env_memlock_value"], ", ".join(settings["job_env_memlock_domains"])))
    files_ok, files_text, conflicts = _files_part(memlock.get("limits"), settings)
    lines = list(dict.fromkeys("'%s %s %s %s' at %s:%s" % (item["domain"], item["type"], item["item"],
                                                          item["value"], item["file"], item["line"])
                               for item in conflicts))
    if conflicts:
        fix += "; remove or change %s (it wins over the drop-in)" % ", ".join(dict.fromkeys(
            "%s:%s" % (item["file"], item["line"]) for item in conflicts))
    problems, parts = [], []
    if session is None:
        # A sandbox root (tests, bring-up of an image): no login session to open, the files say it all.
        parts.append("pam_limits files: %s" % files_text)
        if not files_ok:
            problems.append("the pam_limits files' limit")
    elif session.get("not_run") or session.get("error"):
        parts.append("the login session %s: %s" % ("was not opened" if session.get("not_run") else
                                                   "could not be read", session.get("error")))
    else:
        parts.append("ulimit -l is %s (hard %s) in %s" % (session["soft"], session["hard"], session["how"]))
        if not _at_least(session["soft"], floor):
            problems.append("the login session's limit %s" % session["soft"])
            parts.append("set by %s" % "; ".join(lines) if lines else "pam_limits files: %s" % files_text)
    slurm_problem, slurm_text = _slurm_part(memlock.get("slurm"), floor)
    parts.append(slurm_text)
    if slurm_problem:
        problems.append(slurm_problem)
    found = "on %s: %s" % (host, "; ".join(parts))
    if problems:
        return failed("%s: %s below %s (ibv_reg_mr fails: 'Cannot allocate memory')" % (
            found, " and ".join(problems), "unlimited" if floor is None else "%d KiB" % floor), expected, fix)
    if session is not None and session.get("not_run"):
        return blocked(found, expected, names.JOB_USER_FIX)
    if session is not None and session.get("error"):
        return blocked(found, expected, "install util-linux (runuser) on %s, or check: runuser -l %s -s /bin/sh -c "
                       "'ulimit -l'" % (host, facts.get("job_user")))
    return passed(found, expected)


def _rdma(cluster, host, facts):
    """Whether ``host`` has an RDMA device: from fabric's or nic_discovery's facts (what the gate judges the fabric
    by), else from the devices job_env's own reader listed (bring-up's audit reads no interfaces); None when
    nothing says."""
    if _other(cluster, host, "fabric") is None and _other(cluster, host, "nic_discovery") is None:
        listed = facts.get("rdma_devices")
        return None if listed is None else bool(listed)
    return has_rdma(cluster, host)


def decide(host, facts, settings, probe=None, cluster=None):
    """``{name: check}`` for the job's context on ``host``: ``hostname``, ``master_name``, ``address_family``,
    ``socket_ifname``, ``ib_hca``, ``visible_devices``, ``dev_shm``, ``memlock``; only ``enabled`` (skipped) when
    switched off."""
    if not switched_on(settings["job_env_enabled"]):
        return {"enabled": skipped("job_env_enabled is false on %s: the job's context is not checked" % host,
                                   "job_env_enabled true to check it")}
    if not facts:
        return {"no_facts": failed("no job_env facts were read on %s" % host, "the job's context read on the node",
                                   "see the job_env.error or preflight checks of %s, then re-run" % host)}
    env = job_env(settings)
    node = ((cluster or {}).get("nodes") or {}).get(host) or {}
    peers_rdma = [other for other in rdma_hosts(cluster) if other != host]
    rdma = _rdma(cluster, host, facts)
    return {
        "hostname": names.hostname_check(host, facts, cluster),
        "master_name": names.master_check(host, facts, cluster, env),
        "address_family": names.family_check(host, facts, cluster),
        "socket_ifname": ifaces.socket_check(host, env, _other(cluster, host, "nic_discovery"), cluster,
                                             switched_on(settings["job_env_same_subnet"]), names.loopback_run(node)),
        "ib_hca": ifaces.ib_check(host, env, ifaces.rdma_devices(_other(cluster, host, "fabric"),
                                                                _other(cluster, host, "nic_discovery")), peers_rdma),
        "visible_devices": devices.visible_check(host, env, gpu_count(cluster, host)),
        "dev_shm": shm_check(host, facts, settings, gpu_count(cluster, host)),
        "memlock": memlock_check(host, facts, settings, rdma),
    }


def launch_exclusions(hosts, cluster):
    """``{host: reason}`` of the nodes the gate's own all-reduce leaves out: their job environment names no usable
    interface (``job_env.socket_ifname`` fails there), so their ranks could not start with it."""
    settings = (cluster or {}).get("settings") or {}
    nodes = (cluster or {}).get("nodes") or {}

    def options(host):
        mine = settings.get(host) or {}
        if not mine or not switched_on(mine.get("job_env_enabled", True)):
            return {}, True, False
        return job_env(mine), switched_on(mine.get("job_env_same_subnet", True)), names.loopback_run(nodes.get(host))
    return ifaces.excluded(hosts, cluster, options)
