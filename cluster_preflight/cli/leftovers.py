# -*- coding: utf-8 -*-
"""What a stopped run left running on the controller, found and ended (controller layer).

ansible-runner ends a cancelled or timed-out ``ansible-playbook`` with SIGKILL to its process group.  What left that
group lives on: a node call over the ``local`` connection that detached on purpose (the all-reduce's background
runner, in a session of its own, with torchrun and the ranks under it), an ``srun`` step the srun engine started in a
session of its own, ssh's ControlPersist masters.  Each carries, in its environment, what finds it here:

* :data:`MARKER_ENV`: set by :func:`cluster_preflight.playbooks.run_playbook` for ``ansible-playbook`` and kept by
  everything it starts that keeps its environment;
* the run lock's ``PREFLIGHT_RUN_ID`` (``<controller>:<ansible-playbook pid>:<start>``,
  ``module_utils/preflight_node/host/lock.py``), which the node call gives torchrun and the ranks even when they run as
  the job's user with an environment of their own.

:func:`stop` ends them: an ``srun`` first gets Ctrl-C twice (Slurm then cancels its step on every node), then every
one SIGTERM (the background runner stops its tree and removes its scratch directory), SIGKILL for what is left after
a grace, each wait bounded; what still does not go (a process stuck in the kernel) is described, not waited for.

On the nodes of an ssh engine's run nothing here reaches: what the run left there ends at its own hard bound, and the
run lock's lease lets the next run from this controller take the nodes over at once and end it (a run whose
``ansible-playbook`` is gone is dead, ``lock.py``).
"""

from __future__ import annotations

import os
import signal
import socket
import time
from typing import Iterable, List

from preflight_node.host.lock import RUN_ENV
from preflight_node.host.proc import all_pids, cmdline_of, environ_of, proc_stat

MARKER_ENV = "PREFLIGHT_CONTROLLER_RUN"
# Seconds between SIGTERM and SIGKILL, and at most after SIGKILL.
GRACE = 3.0
SETTLE = 2.0
# Seconds between the two Ctrl-C an srun needs to cancel its step.
SRUN_INTERRUPTS = 0.3


def run_prefix(pid: int) -> str:
    """The start of the run lock's run id of the ``ansible-playbook`` whose pid is ``pid`` on this controller."""
    return "%s:%d:" % (socket.gethostname(), pid)


def _ancestors(proc_root: str) -> set:
    """This process and its parents: never ours to end."""
    found, pid = set(), os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        stat = proc_stat(pid, proc_root)
        pid = stat[1] if stat else 0
    return found


def find(marker: str, prefixes: Iterable[str] = (), proc_root: str = "/proc") -> List[int]:
    """The live processes that carry ``MARKER_ENV=marker``, or a run id starting with one of ``prefixes``."""
    prefixes = tuple(prefix for prefix in prefixes if prefix)
    mine = _ancestors(proc_root)
    found = []
    for pid in all_pids(proc_root):
        if pid in mine:
            continue
        stat = proc_stat(pid, proc_root)
        if stat is None or stat[0] == "Z":
            continue
        env = environ_of(pid, proc_root)
        if (marker and env.get(MARKER_ENV) == marker) or (prefixes and env.get(RUN_ENV, "").startswith(prefixes)):
            found.append(pid)
    return found


def _signal(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _alive(pids, proc_root):
    return [pid for pid in pids if (proc_stat(pid, proc_root) or ("Z",))[0] != "Z"]


def _wait(pids, seconds, proc_root):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and _alive(pids, proc_root):
        time.sleep(0.05)
    return _alive(pids, proc_root)


def describe(pid: int, proc_root: str = "/proc") -> str:
    stat = proc_stat(pid, proc_root)
    return "pid %d (%s, state %s)" % (pid, " ".join(cmdline_of(pid, proc_root))[:120] or (stat or ("", 0, "?"))[2],
                                     stat[0] if stat else "gone")


def stop(marker: str, prefixes: Iterable[str] = (), grace: float = GRACE, settle: float = SETTLE,
         proc_root: str = "/proc") -> dict:
    """End what a stopped run left running (see the module); ``{ended: [pid], survivors: [text]}``, within about
    ``grace + settle`` seconds whatever happens."""
    prefixes = tuple(prefixes)
    pids = find(marker, prefixes, proc_root)
    if not pids:
        return {"ended": [], "survivors": []}
    sruns = [pid for pid in pids if os.path.basename((cmdline_of(pid, proc_root) or [""])[0]) == "srun"]
    for _ in range(2):
        _signal(sruns, signal.SIGINT)
        time.sleep(SRUN_INTERRUPTS if sruns else 0)
    _signal(pids, signal.SIGTERM)
    _signal(pids, signal.SIGCONT)  # a stopped process takes its SIGTERM only once it runs
    left = _wait(pids, grace, proc_root)
    # What the first ones started while they went, and what ignored SIGTERM.
    left = sorted(set(left) | set(find(marker, prefixes, proc_root)))
    _signal(left, signal.SIGKILL)
    left = _wait(left, settle, proc_root)
    return {"ended": sorted(set(pids) - set(left)), "survivors": [describe(pid, proc_root) for pid in left]}
