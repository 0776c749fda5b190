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

TIMEOUT_RC = 124
NOT_FOUND_RC = 127
C_LOCALE = {"LANG": "C", "LC_ALL": "C"}


class NodeOps(object):
    """``run`` and ``which`` backed by an AnsibleModule (``run_command``, ``get_bin_path``)."""

    def __init__(self, module):
        self.module = module
        self._timeout_bin = module.get_bin_path("timeout")

    def which(self, name, paths=()):
        """Absolute path of program ``name`` (also searched in ``paths``), or None."""
        if os.path.isabs(name):
            return name if os.access(name, os.X_OK) else None
        return self.module.get_bin_path(name, opt_dirs=list(paths))

    def run(self, argv, timeout=20.0, env=None, cwd=None, data=None):
        """``(rc, stdout, stderr)``; rc 124 when ``timeout`` expired, 127 when the program is missing."""
        argv = [str(part) for part in argv]
        if self._timeout_bin:
            argv = [self._timeout_bin, "--kill-after=2", "%g" % max(float(timeout), 0.1)] + argv
        environ = dict(C_LOCALE)
        environ.update(env or {})
        try:
            return self.module.run_command(argv, environ_update=environ, cwd=cwd, data=data,
                                           expand_user_and_vars=False, handle_exceptions=False)
        except (OSError, ValueError) as exc:  # a missing program, or a cwd that is gone
            return NOT_FOUND_RC, "", str(exc)
