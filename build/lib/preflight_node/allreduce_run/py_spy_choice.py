# -*- coding: utf-8 -*-
"""Which py-spy root may run for the stacks of a gate's ranks (module_utils/preflight_node/host/ownership.py), and the
check that says which were refused.  Shipped node code, used by gate_run.py and rank_run.py."""

from __future__ import annotations

import os
import shutil

from ..checks import warned
from ..host.ownership import untrusted


def find_py_spy(params, account=None):
    """``(py-spy to run, [{path, why}] refused)``: ``params["py_spy"]``, else the one next to the training Python,
    else the one on PATH.  py-spy runs as the ranks' user (``account``; None: this module's): as root only a
    program root alone controls (module_utils/preflight_node/host/ownership.py), so a user's py-spy next to a venv it
    can
    write is refused and the next one tried."""
    # (path, named by the operator): a named one may lie anywhere root alone controls; a found one also in the
    # system's directories or the project's own venv.
    candidates = [(params["py_spy"], True)] if params["py_spy"] else []
    candidates += [(os.path.join(os.path.dirname(params["python"]), "py-spy"), False), (shutil.which("py-spy"), False)]
    as_root = (account.pw_uid if account is not None else os.geteuid()) == 0
    refused = []
    for path, named in candidates:
        if not path or not os.access(path, os.X_OK) or path in [item["path"] for item in refused]:
            continue
        why = untrusted(path, anywhere=named) if as_root else ""
        if not why:
            return path, refused
        refused.append({"path": path, "why": why})
    return None, refused


def py_spy_check(host, refused, used):
    """``py_spy``: a py-spy the gate would have run as root but did not, since root does not own it alone."""
    return warned("py-spy %s on %s was not run as root: %s; %s" % (
        ", ".join(item["path"] for item in refused), host, "; ".join(item["why"] for item in refused),
        "used %s instead" % used if used else "no other py-spy was found, so hung ranks get no stack"),
        "py-spy for the ranks' stacks is a root-owned program no other account can change",
        "install py-spy with bringup.yml (role debug_tools: /opt/preflight-tools, linked into /usr/local/bin), or "
        "point allreduce at a root-owned one; name an unprivileged preflight_job_user so py-spy runs as that user")
