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
import signal
import subprocess

TIMEOUT_RC = 124
NOT_FOUND_RC = 127
C_LOCALE = {"LANG": "C", "LC_ALL": "C"}


class NodeOps(object):
    """``run`` and ``which`` for the readers and probes of a module running on a node.

    Commands do not go through ``AnsibleModule.run_command``: it stops reading when
    ``select()`` has waited a second without output and the command has just exited, so
    the output of a command that takes over a second to print and then exits is lost (seen
    with ``ssh -G`` on a loaded node: exit 0, empty output).  Here every command gets its
    own session, its whole output, and is killed with everything it started when its time
    bound expires.
    """

    def __init__(self, module):
        self.module = module

    def which(self, name, paths=()):
        """Absolute path of program ``name`` (also searched in ``paths``), or None."""
        if os.path.isabs(name):
            return name if os.access(name, os.X_OK) else None
        return self.module.get_bin_path(name, opt_dirs=list(paths))

    def run(self, argv, timeout=20.0, env=None, cwd=None, data=None):
        """``(rc, stdout, stderr)``; rc 124 when ``timeout`` expired, 127 when the program is missing."""
        return run_bounded_command([str(part) for part in argv], timeout, env=env, cwd=cwd, data=data)


def run_bounded_command(argv, timeout, env=None, cwd=None, data=None):
    """Run ``argv`` (a list, never a shell string) in a session of its own, C locale, bounded."""
    environ = dict(os.environ, **C_LOCALE)
    environ.update(env or {})
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=environ,
                                start_new_session=True)
    except (OSError, ValueError) as exc:  # a missing program, or a cwd that is gone
        return NOT_FOUND_RC, "", str(exc)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        out, err = proc.communicate(input=payload, timeout=max(float(timeout), 0.1))
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        _kill_session(proc)
        out, err = proc.communicate()
        rc = TIMEOUT_RC
        err = (err or b"") + (b"\nkilled after %g s" % float(timeout))
    return rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def _kill_session(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
