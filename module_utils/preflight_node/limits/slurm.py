# -*- coding: utf-8 -*-
"""What locked-memory limit Slurm gives a job on this node (node layer, read by ``job_env``'s reader).

A Slurm step's processes are started by ``slurmstepd``, which inherits ``slurmd``'s limits.  With
``PropagateResourceLimits`` (slurm.conf; ALL when unset) naming MEMLOCK, the step gets the limit of the shell that
ran ``srun``/``sbatch`` on the submit host, but never above slurmd's own hard limit (slurmd logs "Can't propagate
RLIMIT_MEMLOCK"); without it the step keeps slurmd's.  So two facts decide it: slurmd's own limits
(``/proc/<pid>/limits``, world-readable) and whether MEMLOCK is propagated (the slurm.conf slurmd runs with: its
``-f`` option, ``SLURM_CONF`` in its environment, else the usual places).  Only reads; what a node lacks (no
slurmd, a slurm.conf that cannot be read) is a fact.
"""

from __future__ import annotations

import os
import stat

# The limit names of PropagateResourceLimits (slurm.conf(5)).
LIMITS = ("AS", "CORE", "CPU", "DATA", "FSIZE", "MEMLOCK", "NOFILE", "NPROC", "RSS", "STACK")
PROC_LIMIT = "Max locked memory"


def _read(path, limit=1 << 20):
    with open(path, "rb") as handle:
        return handle.read(limit)


def slurmd_pids(proc_root):
    """The pids of every process named ``slurmd`` (its ``comm``) that root runs: any account can name a process
    slurmd, and what root reads next (its slurm.conf) must not be a path another account chose."""
    pids = []
    try:
        names = os.listdir(proc_root)
    except OSError:
        return pids
    for name in names:
        if not name.isdigit():
            continue
        try:
            comm = _read(os.path.join(proc_root, name, "comm"), 64).decode("utf-8", "replace").strip()
        except OSError:
            continue
        try:
            owner = os.stat(os.path.join(proc_root, name)).st_uid
        except OSError:
            continue
        if comm == "slurmd" and owner == 0:
            pids.append(int(name))
    return sorted(pids)


def _kib(text):
    """A /proc limits value (bytes or ``unlimited``) as limits.conf writes memlock: KiB, or ``unlimited``."""
    if text == "unlimited":
        return "unlimited"
    try:
        return str(int(text) // 1024)
    except ValueError:
        return None


def proc_memlock(proc_root, pid):
    """``(soft, hard, error)`` of a process's locked-memory limit, in KiB or ``unlimited``."""
    path = os.path.join(proc_root, str(pid), "limits")
    try:
        text = _read(path).decode("utf-8", "replace")
    except OSError as exc:
        return None, None, "%s: %s" % (path, exc.strerror or exc)
    for line in text.splitlines():
        if line.startswith(PROC_LIMIT):
            fields = line[len(PROC_LIMIT):].split()
            if len(fields) >= 2:
                return _kib(fields[0]), _kib(fields[1]), None
    return None, None, "%s has no '%s' line" % (path, PROC_LIMIT)


def conf_of(proc_root, pid, candidates, root="/"):
    """``(path, how)`` of the slurm.conf ``pid`` (a slurmd) reads: its ``-f FILE``, ``SLURM_CONF`` in its environment,
    else the first of ``candidates`` that exists; ``(None, why)`` when none is known."""
    try:
        argv = _read(os.path.join(proc_root, str(pid), "cmdline")).split(b"\0")
    except OSError:
        argv = []
    argv = [part.decode("utf-8", "replace") for part in argv if part]
    for index, part in enumerate(argv):
        if part == "-f" and index + 1 < len(argv):
            return argv[index + 1], "slurmd -f"
        if part.startswith("-f") and len(part) > 2:
            return part[2:], "slurmd -f"
    try:
        environ = _read(os.path.join(proc_root, str(pid), "environ")).split(b"\0")
    except OSError:
        environ = []
    for item in environ:
        if item.startswith(b"SLURM_CONF="):
            return item.split(b"=", 1)[1].decode("utf-8", "replace"), "SLURM_CONF of slurmd"
    for path in candidates:
        if os.path.isfile(_rooted(root, path)):
            return path, "found at %s" % path
    return None, "no slurm.conf in %s" % ", ".join(candidates) if candidates else "no slurm.conf to read"


def _rooted(root, path):
    return os.path.join(root, path.lstrip("/")) if root and root != "/" else path


def _read_conf(path):
    """The text of slurm.conf at ``path``: a regular file root owns (never a FIFO that would hang the read, nor a
    file another account could have put there), else OSError saying why."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(0, "not a regular file")
        if info.st_uid != 0:
            raise OSError(0, "owned by uid %d, not root" % info.st_uid)
        with os.fdopen(os.dup(descriptor), "rb") as handle:
            return handle.read(1 << 20).decode("utf-8", "replace")
    finally:
        os.close(descriptor)


def parse_propagation(text):
    """``{propagate, except, memlock}`` from slurm.conf text: the two settings (keys are case-insensitive, the
    last one wins) and whether MEMLOCK is propagated (ALL when neither is set)."""
    propagate, excepted = None, None
    for raw in (text or "").splitlines():
        line = raw.split("#", 1)[0].strip()
        key, sep, value = line.partition("=")
        if not sep:
            continue
        key, value = key.strip().lower(), value.strip().split()[0] if value.strip() else ""
        if key == "propagateresourcelimits":
            propagate = value
        elif key == "propagateresourcelimitsexcept":
            excepted = value
    named = [item.strip().upper() for item in (propagate or "ALL").split(",") if item.strip()]
    left_out = [item.strip().upper() for item in (excepted or "").split(",") if item.strip()]
    if excepted is not None:
        memlock = "MEMLOCK" not in left_out and "ALL" not in left_out
    else:
        memlock = "ALL" in named or "MEMLOCK" in named
    return {"propagate": propagate, "except": excepted, "memlock": memlock and "NONE" not in named}


def read(proc_root, candidates, root="/"):
    """``{slurmd, pid, soft, hard, error, conf, conf_how, conf_error, propagation}``: slurmd's own locked-memory
    limits and whether MEMLOCK is propagated to jobs; ``slurmd`` False (and nothing else read) without one."""
    pids = slurmd_pids(proc_root)
    facts = {"slurmd": bool(pids), "pid": pids[0] if pids else None, "soft": None, "hard": None, "error": None,
             "conf": None, "conf_how": None, "conf_error": None, "propagation": None}
    if not pids:
        return facts
    facts["soft"], facts["hard"], facts["error"] = proc_memlock(proc_root, pids[0])
    conf, how = conf_of(proc_root, pids[0], candidates, root)
    facts["conf_how"] = how
    if conf:
        facts["conf"] = conf
        try:
            text = _read_conf(_rooted(root, conf))
        except OSError as exc:
            facts["conf_error"] = "%s cannot be read: %s" % (conf, exc.strerror or exc)
        else:
            facts["propagation"] = parse_propagation(text)
    else:
        facts["conf_error"] = how
    return facts
