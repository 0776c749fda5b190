# -*- coding: utf-8 -*-
"""Waiting, bounded, for a job that runs in the background on a node.

A background job (the all-reduce started with ``background: true``, or an Ansible
``async`` task) writes ``{"started": 1}`` to its results file while it runs and its
final result when it is done.  ``job_wait`` and the ``wait_for`` option of
``preflight_probes`` read it here.
"""

from __future__ import annotations

import json
import os
import time

from ..checks import failed


def read_finished(path):
    """The job's final result, or None while it runs (or before its file exists)."""
    try:
        with open(path) as handle:
            data = json.loads(handle.read())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or "started" in data:
        return None
    return data


def wait_for(path, timeout, poll=0.1):
    """``(result or None, seconds waited)``; the results file is removed once read."""
    start = time.monotonic()
    deadline = start + timeout
    data = read_finished(path)
    while data is None and time.monotonic() < deadline:
        time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
        data = read_finished(path)
    if data is not None:
        try:
            os.unlink(path)
        except OSError:
            pass
        data.pop("invocation", None)
    return data, round(time.monotonic() - start, 3)


def no_result(what, host, path, waited, timeout):
    """The finding for a job that gave no result within ``timeout``."""
    if os.path.exists(path):
        state = "its result file %s still says it is running" % path
    else:
        state = "its result file %s does not exist (the job never started, or its file was removed)" % path
    return failed(
        "no result from %s on %s after %.0f s; %s" % (what, host, waited, state),
        "the result of %s within %.0f s" % (what, timeout),
        "look on %s for the job's processes (ps -ef --forest) and for async_wrapper's notes in the syslog; "
        "the job's own hard bound should have ended it, so a job still running is stuck in its clean-up"
        % host)
