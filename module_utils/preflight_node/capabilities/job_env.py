# -*- coding: utf-8 -*-
"""Capability ``job_env``, the node half's reader (``module_utils/preflight_node/capabilities/job_env.py``, shipped
in the ``preflight_facts`` and ``preflight_local`` calls): the node as a training job will find it, in the job
user's context.

``read`` gathers, as pure reads:

* ``names``: the node's own hostname and the rendezvous (master) name, each resolved **as the job user** with
  ``getent ahosts`` (glibc's getaddrinfo through NSS, the call gloo and c10d make; the addresses in getaddrinfo's
  order, the first being the one a job uses);
* ``shm``: ``/dev/shm`` (its mount, size and free room from ``statvfs``, whether the job user may create files in
  it, judged from its mode bits and the account's groups: nothing is written);
* ``memlock``: the job user's locked-memory limit in a login session (``runuser -l``, so pam_limits applies), the
  memlock lines of the pam_limits files and the drop-in bring-up writes, and what Slurm gives a job
  (``module_utils/preflight_node/limits/slurm.py``).

What the controller decides from them (with the interfaces ``nic_discovery`` read, the RDMA devices ``fabric``
read, the GPUs ``gpu_health`` and ``allreduce`` counted) is ``cluster_preflight/capabilities/job_env/``.

Facts::

    {"hostname": str, "master_name": str, "job_user": str, "names": {name: resolution}, "shm": {...},
     "memlock": {"session": {...}, "limits": limits.read_limits facts, "slurm": {...}}, "privileged": bool}
"""

from __future__ import annotations

import os
import pwd
import socket
import stat

from ..host.ops import TIMEOUT_RC, job_refused
from ..host.ownership import account_ids, user_name
from ..limits import session as limits
from ..limits import slurm as slurm_limits
from ..privilege import privileged

CAPABILITY = "job_env"

GETENT_TIMEOUT = 10
# getent's exit status for a key it does not find (getent(1)).
GETENT_NOT_FOUND = 2
# A constant script: the soft, then the hard locked-memory limit (KiB, or "unlimited") of a login session.
SESSION_MEMLOCK = "ulimit -l; ulimit -H -l"
ST_RDONLY = getattr(os, "ST_RDONLY", 1)


# ---------------------------------------------------------------------------------------------
# who the job runs as

def job_account(ops):
    """``(name, run_as, refused)``: the job user's name, the account ``ops.run`` switches to (None: this process's
    own) and why job-side commands may not run at all ("" when they may)."""
    job = getattr(ops, "job", None) or {}
    refused = job_refused(ops)
    run_as = getattr(ops, "job_user", None)
    name = job.get("name") or run_as or user_name(os.geteuid())
    return str(name), (None if refused else run_as), refused


# ---------------------------------------------------------------------------------------------
# names

def parse_ahosts(text):
    """The addresses of ``getent ahosts`` output in its order, each once (one line per address and socket type;
    the STREAM lines are the ones a TCP connection uses)."""
    addresses = []
    for line in (text or "").splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[1] == "STREAM" and fields[0] not in addresses:
            addresses.append(fields[0])
    if not addresses:  # an older getent prints no socket type
        for line in (text or "").splitlines():
            fields = line.split()
            if fields and fields[0] not in addresses:
                addresses.append(fields[0])
    return addresses


def resolve(name, ops, account):
    """``{name, addresses, how, error, kind}``: ``name`` resolved as the job user (``account``:
    :func:`job_account`).  ``getent ahosts`` asks for every family, as gloo and c10d do; it adds AI_ADDRCONFIG,
    which drops IPv6 answers only on a node with no IPv6 address at all, where a job could not use them either.
    ``kind`` says why there is no answer: ``not_run`` (no job user), ``tool`` (no getent, it could not run),
    ``timeout`` (the resolver did not answer: a job's lookup would hang too), ``unknown`` (the name does not
    resolve); None with addresses."""
    user, run_as, refused = account
    result = {"name": name, "addresses": [], "how": "getent ahosts %s as %s" % (name, user), "error": None,
              "kind": None}
    if refused:
        return dict(result, error=refused, kind="not_run")
    getent = ops.which("getent")
    if not getent:
        return dict(result, kind="tool", error="getent (glibc's libc-bin) is not installed, so no name can be "
                                               "resolved as the job user")
    rc, out, err = ops.run([getent, "ahosts", name], timeout=GETENT_TIMEOUT, user=run_as)
    if rc == GETENT_NOT_FOUND:
        return dict(result, kind="unknown", error="getent ahosts %s as %s finds no address" % (name, user))
    if rc == TIMEOUT_RC:
        return dict(result, kind="timeout", error="getent ahosts %s as %s gave no answer in %d s (a resolver that "
                                                  "does not answer)" % (name, user, GETENT_TIMEOUT))
    if rc != 0:
        return dict(result, kind="tool", error="getent ahosts %s as %s gave rc %d: %s" % (
            name, user, rc, (err.strip() or out.strip())[-200:]))
    addresses = parse_ahosts(out)
    return dict(result, addresses=addresses, kind=None if addresses else "unknown",
                error=None if addresses else "getent ahosts %s as %s printed no address" % (name, user))


# ---------------------------------------------------------------------------------------------
# /dev/shm

def mount_of(path, proc_root):
    """``{mount_point, fs_type, options}`` of the mount holding ``path`` (the longest mount point above it in
    ``/proc/self/mountinfo``), or None when that cannot be read."""
    try:
        with open(os.path.join(proc_root, "self", "mountinfo")) as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    best = None
    for line in lines:
        head, _sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if len(fields) < 6 or len(rest) < 1:
            continue
        point = fields[4].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best["mount_point"])):
            best = {"mount_point": point, "fs_type": rest[0], "options": fields[5]}
    return best


def _writable_by(info, account_name):
    """Whether the account may create a file in the directory ``info`` (its lstat), by its mode bits; None when
    the account is unknown here."""
    try:
        entry = pwd.getpwnam(account_name)
    except KeyError:
        return None
    uid, gids = account_ids(entry)
    if uid == 0:
        return True
    if info.st_uid == uid:
        bits = info.st_mode >> 6
    elif info.st_gid in gids:
        bits = info.st_mode >> 3
    else:
        bits = info.st_mode
    return bits & 0o3 == 0o3  # write and search


def read_shm(path, proc_root, account):
    """``{path, exists, is_dir, mode, owner, mount_point, fs_type, options, read_only, size_bytes,
    available_bytes, writable, error}`` of ``path`` (``/dev/shm``) for the job user (``account``)."""
    user = account[0]
    facts = {"path": path, "exists": False, "is_dir": False, "mode": None, "owner": None, "mount_point": None,
             "fs_type": None, "options": None, "read_only": None, "size_bytes": None, "available_bytes": None,
             "writable": None, "user": user, "error": None}
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return facts
    except OSError as exc:
        return dict(facts, error="%s cannot be examined: %s" % (path, exc.strerror or exc))
    facts.update(exists=True, is_dir=stat.S_ISDIR(info.st_mode), mode="%04o" % stat.S_IMODE(info.st_mode),
                 owner=user_name(info.st_uid))
    mount = mount_of(os.path.realpath(path), proc_root) or {}
    facts.update(mount_point=mount.get("mount_point"), fs_type=mount.get("fs_type"), options=mount.get("options"))
    try:
        vfs = os.statvfs(path)
    except OSError as exc:
        return dict(facts, error="statvfs %s: %s" % (path, exc.strerror or exc))
    facts.update(size_bytes=vfs.f_blocks * vfs.f_frsize, available_bytes=vfs.f_bavail * vfs.f_frsize,
                 read_only=bool(vfs.f_flag & ST_RDONLY))
    if facts["is_dir"]:
        facts["writable"] = None if facts["read_only"] is None else (
            not facts["read_only"] and _writable_by(info, user))
    return facts


# ---------------------------------------------------------------------------------------------
# locked memory

def login_memlock(ops, account):
    """The locked-memory limit of the job user's login session (pam_limits applied): ``runuser -l`` as root, else
    this process's own session.  ``{user, soft, hard, how, error, not_run}`` (values in KiB or ``unlimited``)."""
    user, _run_as, refused = account
    result = {"user": user, "soft": None, "hard": None, "how": None, "error": None, "not_run": False}
    if refused:
        # No login session of root is opened in the job user's stead.
        return dict(result, error=refused, not_run=True)
    if os.geteuid() == 0:
        runuser = ops.which("runuser", paths=("/usr/sbin", "/sbin"))
        if not runuser:
            return dict(result, error="runuser (util-linux) is not installed, so no login session of %s can be "
                                      "opened" % user)
        # -s: the account's shell may be nologin; -l: a login session through PAM, so pam_limits applies.
        argv, result["how"] = [runuser, "-l", user, "-s", "/bin/sh", "-c", SESSION_MEMLOCK], "runuser -l %s" % user
    else:
        argv, result["how"] = ["/bin/sh", "-c", SESSION_MEMLOCK], "the connecting ssh session"
    rc, out, err = ops.run(argv, timeout=20)
    values = out.split()
    if rc != 0 or len(values) < 2:
        return dict(result, error="%s gave rc %d: %s" % (result["how"], rc, (err.strip() or out.strip())[-200:]))
    result["soft"], result["hard"] = values[-2], values[-1]
    return result


def read_memlock(args, ops, account):
    spec = args["limits"]
    found = {"session": login_memlock(ops, account) if args["root"] == "/" else None,
             "limits": limits.read_limits(args["root"], spec["path"], spec["limits_conf"], spec["limits_dir"],
                                          spec["pam_dir"], item="memlock"),
             "slurm": slurm_limits.read(args["proc_root"], args.get("slurm_confs") or [], args["root"])}
    return found


# ---------------------------------------------------------------------------------------------
# read (node)

def rdma_devices(sysfs_root):
    """The RDMA devices of the node (``<sysfs_root>/class/infiniband``), sorted; what bring-up's audit knows of the
    fabric (the gate's own judgement uses the fabric and nic_discovery facts)."""
    try:
        return sorted(os.listdir(os.path.join(sysfs_root, "class", "infiniband")))
    except OSError:
        return []


def read(args, ops):
    """The names, /dev/shm and the locked-memory limits of this node, in the job user's context (pure reads)."""
    account = job_account(ops)
    hostname = socket.gethostname()
    master = str(args.get("master_name") or "")
    names = {}
    for name in dict.fromkeys(item for item in (hostname, master) if item):
        names[name] = resolve(name, ops, account)
    return {
        "hostname": hostname,
        "master_name": master,
        "job_user": account[0],
        "names": names,
        "shm": read_shm(args["shm_path"], args["proc_root"], account),
        "memlock": read_memlock(args, ops, account),
        "rdma_devices": rdma_devices(args.get("sysfs_root") or "/sys"),
        "privileged": privileged(),
    }
