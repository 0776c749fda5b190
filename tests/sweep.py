#!/usr/bin/env python3
"""After a test run (scripts/run-pytest): end every process that carries the run's ``PREFLIGHT_TEST_SESSION`` in its
environment, and remove the test beds whose owner is gone.

    python tests/sweep.py SESSION

pytest tears its fixtures down when it stops on a Ctrl-C or SIGTERM; this is for what it could not (killed by
SIGKILL, or past its grace): chromedriver and chromium, ansible-playbook and what it detached, torchrun and ranks,
a bed's sshd (the node's PID 1: its namespace goes with it) and Slurm daemons.  SIGTERM, then SIGKILL after a grace,
each wait bounded; it prints what it ended and what would not go.  Other runs' processes carry another session (or
none) and are never touched; beds are removed only when their owner process is dead (as every bed start does).
Test-side, not shipped."""

import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "module_utils"))

from preflight_node.host.proc import all_pids, cmdline_of, environ_of, proc_stat  # noqa: E402

ENV = "PREFLIGHT_TEST_SESSION"
GRACE = 5.0
SETTLE = 3.0


def marked(session):
    """The live processes of this session (never this one)."""
    found = []
    for pid in all_pids():
        if pid == os.getpid():
            continue
        stat = proc_stat(pid)
        if stat is None or stat[0] == "Z":
            continue
        if environ_of(pid).get(ENV) == session:
            found.append(pid)
    return found


def _signal(pids, number):
    for pid in pids:
        try:
            os.kill(pid, number)
        except (ProcessLookupError, PermissionError):
            pass


def _wait(pids, seconds):
    deadline = time.monotonic() + seconds
    left = list(pids)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [pid for pid in left if (proc_stat(pid) or ("Z",))[0] != "Z"]
    return left


def sweep(session):
    """``(ended, survivors)``: the pids of ``session`` ended, and the descriptions of those that did not go."""
    found = marked(session)
    names = {pid: " ".join(cmdline_of(pid))[:100] for pid in found}
    _signal(found, signal.SIGTERM)
    _signal(found, signal.SIGCONT)
    left = sorted(set(_wait(found, GRACE)) | set(marked(session)))
    names.update((pid, " ".join(cmdline_of(pid))[:100]) for pid in left if pid not in names)
    _signal(left, signal.SIGKILL)
    left = _wait(left, SETTLE)
    return [names[pid] for pid in found if pid not in left], ["pid %d (%s)" % (pid, names.get(pid)) for pid in left]


def main(argv):
    if len(argv) != 2 or not argv[1]:
        print("usage: tests/sweep.py SESSION", file=sys.stderr)
        return 2
    ended, survivors = sweep(argv[1])
    if ended:
        print("sweep: ended %d process(es) the test run left: %s" % (len(ended), "; ".join(ended[:10])),
              file=sys.stderr)
    if os.geteuid() == 0:
        try:
            from testbed_cleanup import cleanup_stale  # pylint: disable=import-outside-toplevel
            removed = cleanup_stale()
        except Exception as exc:  # pylint: disable=broad-except  # a sweep never fails the run it follows
            print("sweep: beds not checked: %s" % exc, file=sys.stderr)
        else:
            if removed:
                print("sweep: removed test beds whose owner is gone: %s" % ", ".join(removed), file=sys.stderr)
    if survivors:
        print("sweep: still running (stuck in the kernel?): %s" % "; ".join(survivors), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
