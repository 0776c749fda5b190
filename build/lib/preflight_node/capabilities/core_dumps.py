# -*- coding: utf-8 -*-
"""Capability ``core_dumps``, the node half's reader (``module_utils/preflight_node/capabilities/core_dumps.py``,
shipped in
the ``preflight_facts`` and ``preflight_local`` calls): a crashing rank leaves a core file its job user can find.

``read`` reads ``kernel.core_pattern`` (now, in its drop-in, at the next boot), the core directory and the
core limits login sessions get.  The crash probe (``probe``: crash a throw-away child with SIGSEGV and find
its core) is ``module_utils/preflight_node/capabilities/core_dumps_probe.py``, and ``probe_check`` (controller,
``cluster_preflight/capabilities/core_dumps/``) turns its result into the ``core_probe`` check.
The role ``roles/core_dumps`` holds the variables and the bring-up writers (``sysctl_setting``,
``limits_dropin``, the core directory), which share the readers used here
(``module_utils/preflight_node/sysctl/values.py``, ``module_utils/preflight_node/limits/session.py``).
What the controller decides from the facts (validate, read_args, probe_args, decide) is in
``cluster_preflight/capabilities/core_dumps/``.

Facts (``read``)::

    {"core_pattern": sysctl.read_setting(...) facts,
     "core_dir": {path, exists, is_dir, mode, uid, gid, owner, group, error} or None (relative pattern),
     "limits": limits.read_limits(...) facts or None (limits switched off)}
"""

from __future__ import annotations

import grp
import os
import pwd
import stat

from ..cores.pattern import read_uses_pid
from ..limits import session as limits
from ..sysctl import values as sysctl
from ..host.ops import job_refused
# The account name of a uid (the probe names who crashed).
from ..host.ownership import user_name as who  # noqa: F401
from ..privilege import file_errors, privileged, refused

CAPABILITY = "core_dumps"


# ---------------------------------------------------------------------------------------------
# read (node)

def _read_dir(root, path):
    facts = {"path": path, "exists": False, "is_dir": False, "mode": None, "uid": None, "gid": None,
             "owner": None, "group": None, "error": None}
    try:
        info = os.stat(sysctl.rooted(root, path))
    except FileNotFoundError:
        return facts
    except OSError as exc:
        facts["error"] = "%s cannot be read: %s" % (path, exc.strerror or exc)
        return facts
    facts.update(exists=True, is_dir=stat.S_ISDIR(info.st_mode), mode="%04o" % stat.S_IMODE(info.st_mode),
                 uid=info.st_uid, gid=info.st_gid)
    try:
        facts["owner"] = pwd.getpwuid(info.st_uid).pw_name
    except KeyError:
        pass
    try:
        facts["group"] = grp.getgrgid(info.st_gid).gr_name
    except KeyError:
        pass
    return facts


# Prints the core limit a new login session gets (soft, then hard); a constant, no variable in it.
SESSION_LIMITS = "ulimit -c; ulimit -H -c"


def login_core_limit(ops):
    """The core limit the job user's login session gets (pam_limits applied): ``runuser -l`` as root,
    else this process's own session (Ansible's ssh login).  ``{user, soft, hard, how, error}``."""
    job = getattr(ops, "job", None) or {}
    user = getattr(ops, "job_user", None) or job.get("name") or who(os.geteuid())
    result = {"user": user, "soft": None, "hard": None, "how": None, "error": None}
    not_allowed = job_refused(ops)
    if not_allowed:
        # No login session of root is opened in the job user's stead.
        return dict(result, user=job.get("name") or "", error=not_allowed, not_run=True)
    if os.geteuid() == 0:
        runuser = ops.which("runuser", paths=("/usr/sbin", "/sbin"))
        if not runuser:
            result["error"] = "runuser (util-linux) is not installed, so no login session of %s can be opened" % user
            return result
        # -s: the account's shell may be nologin; -l: a login session through PAM, so pam_limits applies.
        argv, result["how"] = [runuser, "-l", user, "-s", "/bin/sh", "-c", SESSION_LIMITS], "runuser -l %s" % user
    else:
        argv, result["how"] = ["/bin/sh", "-c", SESSION_LIMITS], "the connecting ssh session"
    rc, out, err = ops.run(argv, timeout=20)
    values = out.split()
    if rc != 0 or len(values) < 2:
        result["error"] = "%s gave rc %d: %s" % (result["how"], rc, (err.strip() or out.strip())[-200:])
        return result
    result["soft"], result["hard"] = values[-2], values[-1]
    return result


def read(args, ops):
    """The pattern, the core directory and the core limits on this node (pure reads)."""
    root = args["root"]
    pattern = sysctl.read_setting(root, args["proc_root"], sysctl.CORE_PATTERN, args["dropin"], args["sysctl_dirs"])
    pattern.update(read_uses_pid(root, args["proc_root"]))
    facts = {
        "core_pattern": pattern,
        "core_dir": _read_dir(root, os.path.normpath(args["core_dir"])) if args["core_dir"] else None,
        "limits": None,
    }
    if args.get("limits"):
        spec = args["limits"]
        facts["limits"] = limits.read_limits(root, spec["path"], spec["limits_conf"], spec["limits_dir"],
                                             spec["pam_dir"], item="core")
        facts["session"] = login_core_limit(ops) if root == "/" else None
    facts["privileged"] = privileged()
    facts["needs_root"] = refused(file_errors(facts["core_pattern"]) + file_errors(facts["core_dir"])
                                  + file_errors(facts["limits"]), facts["privileged"])
    return facts
