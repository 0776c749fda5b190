# -*- coding: utf-8 -*-
"""What a capability's reader or probe may do on a node besides reading files.

Readers and probes (``read(args, ops)`` / ``probe(args, ops)`` in
``preflight_<capability>.py``) get an ``ops`` object instead of an
``AnsibleModule``: commands run through it as argv lists with a time bound,
programs are looked up through it.  Tests pass a fake with the same two
methods, so readers stay pure functions of their inputs.
"""

from __future__ import annotations

import os
import pwd

try:
    from typing import Protocol
except ImportError:  # a node's Python before 3.8: the interface is documentation there
    Protocol = object

from . import reap

from . import ownership as trust

TIMEOUT_RC = 124
NOT_FOUND_RC = 127
# Not run: the same program hung earlier in this node call (NodeOps.run); stderr says when and for how long.
HUNG_EARLIER_RC = 125
# Not run: job-side code with no account allowed to run it (NodeOps.run with user=NO_JOB_USER).
NOT_RUN_RC = 126
# The job user of a node call where no account may run job-side code (resolve_job_user's how: REFUSED): never a
# valid account name, so nothing runs as it, least of all as root.
NO_JOB_USER = "(no job user)"
REFUSED = ("unavailable", "missing")
C_LOCALE = {"LANG": "C", "LC_ALL": "C"}
# The markers of the commands and runs this one is part of, kept in a command's environment when it switches
# user (everything else of root's environment is left out), so a kill of the whole (the health check's budget,
# the gate's tree) still finds it: ``reap.COMMAND_MARKER_ENV``, ``proc.MARKER_ENV``.
KEPT_MARKERS = (reap.COMMAND_MARKER_ENV, "PREFLIGHT_RUN_MARKER")


class Ops(Protocol):
    """What a reader or probe acts through: :class:`NodeOps` on a node, a fake in the tests (``tests/fake_ops.py``,
    ``tests/capability_helpers.py``'s ``read_with_commands``).  Commands are argv lists, never a shell line."""

    def which(self, name, paths=()):
        """The path of program ``name`` (searched in ``paths`` first), or None."""

    def run(self, argv, timeout=20.0, env=None, cwd=None, data=None, user=None):
        """``(rc, stdout, stderr)`` of ``argv`` run within ``timeout`` seconds (rc 124 when it was killed at its bound,
        127 when the program is missing), as ``user`` when given (job-side code)."""


class NodeOps(object):
    """``run`` and ``which`` for the readers and probes of a module running on a node.

    Commands do not go through ``AnsibleModule.run_command``: it stops reading when
    ``select()`` has waited a second without output and the command has just exited, so
    the output of a command that takes over a second to print and then exits is lost (seen
    with ``ssh -G`` on a loaded node: exit 0, empty output).  Here every command gets its
    own session, its whole output, and is killed with everything it started when its time
    bound expires.
    """

    def __init__(self, module, job_user=None, watch=None):
        self.module = module
        # The account job-side code runs as (see resolve_job_user); None: this module's own user.
        self.job_user = job_user
        self.job = None
        # Programs whose hang holds for the whole call: the training Python (this call's ``job``
        # parameter).  One that hangs at start-up (a sitecustomize importing torch, a hung file system
        # under its environment) hangs again for every reader and probe, each waiting out its own bound.
        # Only these are remembered: ssh or ssh-keyscan may time out toward one peer and not the next.
        params = getattr(module, "params", None)
        job = params.get("job") if isinstance(params, dict) else None
        if watch is None:
            watch = [job.get("python")] if isinstance(job, dict) else []
        self.watched = {str(program) for program in watch if program}
        # program -> {program, seconds, user}: what timed out earlier in this call, or in this run's earlier
        # call on the node (``job["hangs"]``: the facts call's, handed to the probes call).
        # A program whose process did not die from SIGKILL (stuck in the kernel) is remembered whatever it is.
        self.hangs = {str(key): dict(value) for key, value in ((job or {}).get("hangs") or {}).items()
                      if isinstance(value, dict) and (str(key) in self.watched or value.get("stuck"))}

    def which(self, name, paths=()):
        """Absolute path of program ``name`` (also searched in ``paths``), or None."""
        if os.path.isabs(name):
            return name if os.access(name, os.X_OK) else None
        return self.module.get_bin_path(name, opt_dirs=list(paths))

    def run(self, argv, timeout=20.0, env=None, cwd=None, data=None, user=None):
        """``(rc, stdout, stderr)``; rc 124 when ``timeout`` expired, 127 when the program is missing,
        125 at once (nothing run) when a watched program hung earlier in this call, or any program whose
        process did not die from its kill (:func:`hang_of`).
        With ``user`` (a name), the command runs as that user with a minimal environment."""
        argv = [str(part) for part in argv]
        earlier = self.hangs.get(argv[0]) if argv else None
        if earlier:
            return HUNG_EARLIER_RC, "", hang_text(earlier)
        if user == NO_JOB_USER:
            return NOT_RUN_RC, "", "not run: %s" % job_refused(self)
        rc, out, err, stuck = run_reaped(argv, timeout, env=env, cwd=cwd, data=data, user=user)
        if argv and (stuck or (rc == TIMEOUT_RC and argv[0] in self.watched)):
            # A program that hangs for the whole call, or one that did not even die from SIGKILL (stuck in the
            # kernel: every later run of it would hang there too) is not run again in this call.
            self.hangs[argv[0]] = {"program": argv[0], "seconds": float(timeout), "user": user or _me()}
            if stuck:
                self.hangs[argv[0]]["stuck"] = reap.stuck_text(stuck)
        return rc, out, err


def hang_of(ops, program):
    """``{program, seconds, user}`` when ``program`` hung earlier in this node call, else None (also for
    an ``ops`` that remembers nothing, such as a test's fake)."""
    return (getattr(ops, "hangs", None) or {}).get(str(program))


def job_account(job):
    """The ``user`` to hand ``ops.run`` for job-side code, from :func:`resolve_job_user`'s result: the account to
    switch to, None for this process's own user, or :data:`NO_JOB_USER` when no account may run it."""
    return NO_JOB_USER if (job or {}).get("how") in REFUSED else (job or {}).get("run_as")


def job_refused(ops):
    """Why job-side code may not run in this node call ("" when it may): no account is allowed to run it."""
    job = getattr(ops, "job", None) or {}
    if job.get("how") not in REFUSED:
        return ""
    return "no account may run job-side code on this node (allreduce.job_user)"


def hang_text(hang):
    if hang.get("stuck"):
        return "not run: %s hung for %g s earlier in this call (as %s) and did not die from its kill (%s)" % (
            hang["program"], hang["seconds"], hang["user"], hang["stuck"])
    return "not run: %s hung for %g s earlier in this call (as %s) and was killed" % (
        hang["program"], hang["seconds"], hang["user"])


def _me():
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


# The account job-side code runs as when the module runs as root and no job user was named.
AUTO_JOB_USER = "nobody"
# Whether an account can use the training environment: run its Python and find torch, without importing it.
FIND_TORCH_ONLY = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('torch') else 3)"
JOB_USER_PROBE_TIMEOUT = 30
# Bytes kept of each output stream of a command run as another account (the job's user: its torch probe, its
# login shell's ulimit, its ptrace probe print a few lines; what its environment makes them print beyond that is
# dropped, and the cut said): reap.Kept.
JOB_OUTPUT_MAX_BYTES = 1024 * 1024


def resolve_job_user(job, ops):
    """Who runs job-side code (the torch probe, the ranks, py-spy of them, the core crash) on this node.

    ``job``: ``{"user": the wanted account or "", "named": whether preflight_job_user named it,
    "python": the training Python or ""}`` (from ``preflight_settings``).  Root is for system
    configuration only: running as root with no user wanted, an unprivileged account
    (:data:`AUTO_JOB_USER`) is used when it can run the training Python and find torch; when it cannot,
    no job-side code runs at all (``unavailable``): root runs it only when ``preflight_job_user: root``
    names it.  Returns ``{name, uid, run_as, how, note}``: ``run_as`` is the name to switch to (None: stay
    this process's user); ``how`` is ``named`` (preflight_job_user), ``connecting`` (the user Ansible
    connects as), ``auto``, ``unavailable`` or ``missing`` (no job-side code runs: :data:`REFUSED`) or
    ``cannot_switch`` (another account wanted, and no root to switch).  ``python_blocked``
    (:func:`.trust.blocker`) says which path component keeps a switched-to account from the training
    Python; ``python_untrusted`` why root running it trusts another account (a root job user).

    ``job["resolved"]``: the facts call's resolution on this node, handed back by the controller to a later call.
    It is checked against this node's own settings, never taken on the controller's word: where the node can
    resolve without running anything (an account named, or no root) it resolves again; where it would have to run
    the training Python as nobody it takes the forwarded one only when that is the one outcome the node could have
    given (nobody with nobody's uid, or none at all), so it never waits again for a Python that hung there.  One
    that contradicts the settings is refused (``forwarded_refused`` says so) and the node's own is used.
    """
    job = job or {}
    forwarded = job.get("resolved")
    if not (isinstance(forwarded, dict) and forwarded.get("how")):
        return _resolve(job, ops)
    if not job.get("user") and os.geteuid() == 0 and _auto_agrees(forwarded):
        return dict(forwarded)
    own = _resolve(job, ops)
    if any(own.get(key) != forwarded.get(key) for key in ("name", "run_as", "how", "uid")):
        own["forwarded_refused"] = (
            "the job user handed back to this node (%s, run as %s, %s) contradicts its own settings (%s): the node's "
            "own resolution is used" % (forwarded.get("name"), forwarded.get("run_as") or "this module's user",
                                        forwarded.get("how"), own.get("run_as") or own.get("how")))
    return own


def _auto_agrees(forwarded):
    """Whether ``forwarded`` is an outcome this node gives as root with no job user wanted: nobody (with nobody's
    uid, switched to), or no account at all."""
    if forwarded.get("how") in REFUSED:
        return True
    try:
        uid = pwd.getpwnam(AUTO_JOB_USER).pw_uid
    except KeyError:
        return False
    return (forwarded.get("how") == "auto" and forwarded.get("name") == AUTO_JOB_USER
            and forwarded.get("run_as") == AUTO_JOB_USER and forwarded.get("uid") == uid)


def expected_account(job):
    """The account this node's settings (``job``, the node calls' ``job`` argument) let job-side code run as: the
    one wanted (``preflight_job_user``, else the connecting login), else this module's own login when it is not
    root, else :data:`AUTO_JOB_USER`.  Root only when ``preflight_job_user: root`` names it."""
    wanted = str((job or {}).get("user") or "")
    if wanted:
        return wanted
    return _me() if os.geteuid() != 0 else AUTO_JOB_USER


def account_problem(run_as, job):
    """Why job-side code may not run as ``run_as`` (the launch plan's account) under this node's settings ``job``,
    or "": the account must be named, and be the one the settings name (:func:`expected_account`)."""
    if not isinstance(job, dict) or "user" not in job:
        return ("no job settings came with the launch (job): the node cannot check run_as %s against them; a "
                "defect of the preflight" % (run_as or "(none)"))
    if not run_as:
        return ("the launch names no account to run the ranks as (run_as); job-side code never runs as this "
                "module's user by default")
    wanted = expected_account(job)
    if run_as == "root" and not (job.get("named") and wanted == "root"):
        return ("run_as root: job-side code runs as root only with preflight_job_user: root named; this node's "
                "settings name %s" % wanted)
    if run_as != wanted:
        return "run_as %s: this node's settings name %s for job-side code (preflight_job_user)" % (run_as, wanted)
    return ""


def _resolve(job, ops):
    """:func:`resolve_job_user` without a forwarded resolution."""
    wanted = str(job.get("user") or "")
    euid = os.geteuid()
    me = _me()
    python = str(job.get("python") or "")
    info = {"name": me, "uid": euid, "run_as": None, "note": "", "python": python,
            "how": "named" if job.get("named") else "connecting"}
    if wanted:
        try:
            entry = pwd.getpwnam(wanted)
        except KeyError:
            return dict(info, name=wanted, uid=None, how="missing",
                        note="no account %s on this node (getent passwd %s finds nothing)" % (wanted, wanted))
        if entry.pw_uid == euid:
            if euid == 0 and python:
                return dict(info, name=wanted, python_untrusted=trust.untrusted(python, anywhere=True))
            return dict(info, name=wanted)
        if euid != 0:
            return dict(info, name=wanted, uid=entry.pw_uid, how="cannot_switch",
                        note="connected as %s without root, so commands cannot run as %s" % (me, wanted))
        return dict(info, name=wanted, uid=entry.pw_uid, run_as=wanted, python_blocked=_refused_to(python, entry))
    if euid != 0:
        return info
    return _auto_job_user(info, python, ops)


def _refused_to(python, entry):
    """The path component that keeps the account ``entry`` from the training Python, when its permissions do (a
    Python that is not there is not an account's problem: running it says so, as allreduce.python)."""
    blocked = trust.blocker(python, entry) if python else None
    return blocked if blocked and blocked.get("kind") == "permission" else None


def _auto_job_user(info, python, ops):
    """As root with no job user named: :data:`AUTO_JOB_USER` when it can run the training Python, else none.  A
    training Python that is not there, or that runs but finds no torch, is the node's finding, not a missing
    account: nobody stays the job user, and the reader's run as nobody says what is wrong (allreduce.python,
    allreduce.torch)."""
    try:
        entry = pwd.getpwnam(AUTO_JOB_USER)
    except KeyError:
        return dict(info, how="unavailable", note="no account %s to run job-side code as" % AUTO_JOB_USER)
    blocked = trust.blocker(python, entry) if python else None
    if blocked and blocked["kind"] == "permission":
        return dict(info, how="unavailable", python_blocked=blocked, note="%s cannot use the training Python "
                    "%s: %s" % (AUTO_JOB_USER, python, blocked["found"]))
    if python and not blocked:
        rc, _out, err = ops.run([python, "-I", "-c", FIND_TORCH_ONLY], timeout=JOB_USER_PROBE_TIMEOUT, cwd="/",
                                user=AUTO_JOB_USER)
        if rc not in (0, 3):
            reason = (err.strip().splitlines() or ["exit code %d" % rc])[-1]
            if rc == TIMEOUT_RC:
                reason = "it hung: no answer in %g s, killed" % JOB_USER_PROBE_TIMEOUT
            return dict(info, how="unavailable", note="%s cannot use the training Python %s (%s)" % (
                AUTO_JOB_USER, python, reason[-200:]))
    return dict(info, name=AUTO_JOB_USER, uid=entry.pw_uid, run_as=AUTO_JOB_USER, how="auto")


def user_environment(entry, extra=None):
    """A minimal login-like environment for the account ``entry`` (a pwd entry): nothing of root's."""
    environ = {"HOME": entry.pw_dir, "USER": entry.pw_name, "LOGNAME": entry.pw_name,
               "PATH": "/usr/local/bin:/usr/bin:/bin", "SHELL": entry.pw_shell or "/bin/sh"}
    environ.update(C_LOCALE)
    environ.update(extra or {})
    return environ


def as_user(name):
    """Popen arguments that run a command as ``name`` (its uid, primary and supplementary groups)."""
    entry = pwd.getpwnam(name)
    try:
        import grp  # pylint: disable=import-outside-toplevel
        groups = sorted({group.gr_gid for group in grp.getgrall() if name in group.gr_mem} | {entry.pw_gid})
    except (ImportError, KeyError, OSError):
        groups = [entry.pw_gid]
    return entry, {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": groups}


def run_bounded_command(argv, timeout, env=None, cwd=None, data=None, user=None):
    """Run ``argv`` (a list, never a shell string) in a session of its own, C locale, bounded; as ``user``
    (a name) with a minimal environment when given.  ``(rc, stdout, stderr)``, see :func:`run_reaped`."""
    rc, out, err, _stuck = run_reaped(argv, timeout, env=env, cwd=cwd, data=data, user=user)
    return rc, out, err


def run_reaped(argv, timeout, env=None, cwd=None, data=None, user=None):
    """:func:`run_bounded_command` with a fourth value: what did not die within ``reap.REAP_TIMEOUT`` seconds of
    the kill (``reap.describe`` of each: a process stuck in the kernel, state ``D``), abandoned, never waited
    for.  The call returns within ``timeout`` plus twice that bound whatever the command does (a member that
    left its session and holds the output is killed by its marker); rc 124 when ``timeout`` expired."""
    credentials = {}
    if user:
        try:
            entry, credentials = as_user(user)
        except KeyError:
            return NOT_FOUND_RC, "", "no such user %s" % user, []
        environ = user_environment(entry, env)
        # A budget's marker goes through the switch of user, so a kill of the whole run still finds this.
        environ.update({name: os.environ[name] for name in KEPT_MARKERS if name in os.environ})
        # Not the caller's working directory, which the account may not be allowed to enter.
        cwd = cwd or "/"
    else:
        environ = dict(os.environ, **C_LOCALE)
        environ.update(env or {})
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        rc, out, err, timed_out, stuck = reap.capture(argv, timeout, env=environ, cwd=cwd, data=payload,
                                                      max_bytes=JOB_OUTPUT_MAX_BYTES if user else reap.OUTPUT_MAX_BYTES,
                                                      **credentials)
    except PermissionError as exc:  # switching user needs root
        return NOT_FOUND_RC, "", "cannot run as %s: %s" % (user, exc), []
    except (OSError, ValueError) as exc:  # a missing program, or a cwd that is gone
        return NOT_FOUND_RC, "", str(exc), []
    if timed_out:
        rc = TIMEOUT_RC
        err += b"\nkilled after %g s" % float(timeout)
    if stuck:
        err += ("; %s" % reap.stuck_text(stuck)).encode("utf-8")
    return rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), stuck
