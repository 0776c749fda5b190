# -*- coding: utf-8 -*-
"""Capability ``kernel_debug``, the node half's probe
(``module_utils/preflight_node/capabilities/kernel_debug_probe.py``,
shipped in the ``preflight_probes`` and ``preflight_local`` calls): can the job user attach to its own rank?

``probe`` attaches with ptrace (PTRACE_SEIZE) as the job user, with the training Python.  The reader
(``read``: ``kernel.yama.ptrace_scope`` and the extra sysctls) is
``module_utils/preflight_node/capabilities/kernel_debug.py``;
the ``ptrace_attach`` check the controller builds from the result is in
``cluster_preflight/capabilities/kernel_debug/``.
"""

from __future__ import annotations

import json
import os
import pwd
import sys

from ..host.ops import HUNG_EARLIER_RC, TIMEOUT_RC, hang_of, job_refused

CAPABILITY = "kernel_debug"
YAMA_FILE = ("sys", "kernel", "yama", "ptrace_scope")

# Run as the job user by the training Python: attach (PTRACE_SEIZE: the target does not even stop) to a
# process of the same user that is NOT its descendant, as py-spy attaches to a rank torchrun started.
# The target's parent exits first, so the target is re-parented away from the attacher.  Constant source.
ATTACH_PROBE = r"""
import ctypes, errno, json, os, signal, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.ptrace.restype = ctypes.c_long
PTRACE_SEIZE = 0x4206
read_end, write_end = os.pipe()
child = os.fork()
if child == 0:
    os.close(read_end)
    if os.fork():
        os._exit(0)
    os.write(write_end, str(os.getpid()).encode())
    os.close(write_end)
    time.sleep(60)
    os._exit(0)
os.close(write_end)
os.waitpid(child, 0)
target = int(os.read(read_end, 32) or b"0")
rc = libc.ptrace(PTRACE_SEIZE, target, None, None)
err = ctypes.get_errno() if rc != 0 else 0
os.kill(target, signal.SIGKILL)
print(json.dumps({"uid": os.getuid(), "target": target, "attached": rc == 0,
                  "errno": errno.errorcode.get(err, str(err)) if err else "", "error": os.strerror(err) if err else
                  ""}))
"""


def read_yama(proc_root):
    """The running Yama ptrace scope (an int), or None on a kernel without Yama."""
    try:
        with open(os.path.join(proc_root, *YAMA_FILE)) as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return None


def yama_allows(scope, uid):
    """Whether Yama lets ``uid`` attach to its own process that is not its descendant (py-spy to a rank):
    scope 0 classic, 1 descendants only (CAP_SYS_PTRACE, i.e. root, excepted), 2 CAP_SYS_PTRACE only, 3 never."""
    if scope is None or scope == 0:
        return True
    if scope == 3:
        return False
    return uid == 0


def _login():
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def probe(args, ops):
    """Attach with ptrace as the job user (``ops.job_user``; this process's user when None), using the
    training Python (``ops.job["python"]``) or this module's.  ``{user, uid, yama_scope, attached, errno,
    error}``, with ``python_hang`` (``{seconds, user, earlier}``) when that Python hung now or earlier in
    this node call (then it is not run again); what the node lacks is in ``error``, never an exception."""
    job = getattr(ops, "job", None) or {}
    python = job.get("python") or sys.executable
    # Another job user wanted and no root to switch: the probe runs as this login, which proves nothing
    # of the job user's view (``unswitched`` names whom it should have been).
    unswitched = job.get("name") if not getattr(ops, "job_user", None) and job.get("how") == "cannot_switch" else ""
    me = _login()
    result = {"user": getattr(ops, "job_user", None) or (me if unswitched else job.get("name")) or me, "uid": None,
              "yama_scope": read_yama(args.get("proc_root") or "/proc"), "attached": None, "errno": "",
              "error": "", "python": python, "unswitched": unswitched or ""}
    timeout = float(args.get("timeout") or 15)
    if job.get("python_blocked") or (job_refused(ops) and not hang_of(ops, python)):
        # Never run as root instead: no account may run it here, or the job's user cannot reach it.
        result.update(not_run=job_refused(ops), python_blocked=job.get("python_blocked"))
        return result
    rc, out, err = ops.run([python, "-c", ATTACH_PROBE], timeout=timeout, user=getattr(ops, "job_user", None))
    if rc in (TIMEOUT_RC, HUNG_EARLIER_RC):
        hang = hang_of(ops, python) or {}
        result["python_hang"] = {"seconds": hang.get("seconds", timeout), "user": hang.get("user") or result["user"],
                                 "earlier": rc == HUNG_EARLIER_RC}
        result["error"] = (err.strip() or "no answer")[-300:]
        return result
    try:
        answer = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        result["error"] = "the ptrace probe could not run as %s with %s: rc %d, %s" % (
            result["user"], python, rc, (err.strip() or out.strip() or "no output")[-300:])
        return result
    result.update(uid=answer.get("uid"), attached=bool(answer.get("attached")), errno=answer.get("errno") or "",
                  error=answer.get("error") or "")
    return result
