# -*- coding: utf-8 -*-
"""Node layer: whether a system service is installed, enabled and running, with or without systemd.

A minimal node (a container, a namespace node, an image booted with another init) has no systemd to ask, and a
service can be running without its unit (started by hand, by a vendor script): both are facts.  The state is read
twice, each read pure:

* systemd, when it is the node's init (``<proc_root>/1/comm`` is ``systemd``, what ``sd_booted`` tells by other
  means): ``systemctl show <unit> --property=...`` gives LoadState (``not-found``: no such unit installed),
  ActiveState/SubState and UnitFileState (enabled at boot or not);
* the process table: the processes whose ``comm`` is the service's program (the kernel keeps the first 15
  characters of a program's name: ``nv-fabricmanager`` is ``nv-fabricmanage``), readable by any account.

Used by the ``gpu_health`` reader (the NVSwitch fabric manager) and by the bring-up module
``library/service_enabled.py``, so the audit and bring-up read the service alike.
"""

from __future__ import annotations

import os

COMM_LENGTH = 15
PROPERTIES = ("LoadState", "ActiveState", "SubState", "UnitFileState")
SYSTEMCTL = "systemctl"


def _read(path):
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            return handle.read(4096).strip()
    except (IOError, OSError):
        return None


def systemd_is_init(proc_root="/proc"):
    """Whether systemd is the node's init (PID 1 of the PID namespace ``proc_root`` shows)."""
    return _read(os.path.join(proc_root, "1", "comm")) == "systemd"


def processes(proc_root, program):
    """The pids whose ``comm`` is ``program`` (as the kernel shortens it), sorted."""
    wanted = program[:COMM_LENGTH]
    found = []
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return found
    for entry in entries:
        if entry.isdigit() and _read(os.path.join(proc_root, entry, "comm")) == wanted:
            found.append(int(entry))
    return sorted(found)


def parse_show(text):
    """``systemctl show --property=...`` output (``Name=value`` lines) as a dict."""
    values = {}
    for line in str(text or "").splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip():
            values[name.strip()] = value.strip()
    return values


def unit_state(ops, systemctl, unit, timeout):
    """``(values, error)`` of ``systemctl show <unit>``: ``values`` has :data:`PROPERTIES` (None on error)."""
    argv = [systemctl, "show", unit, "--no-pager", "--property=" + ",".join(PROPERTIES)]
    rc, out, err = ops.run(argv, timeout=timeout)
    values = parse_show(out)
    if rc != 0 or "LoadState" not in values:
        why = "timed out after %s s" % timeout if rc == 124 else "exited %s" % rc
        return None, "%s %s: %s" % (" ".join(argv), why, " ".join((err or out or "no output").split())[:200])
    return values, None


def read(ops, unit, program, proc_root="/proc", timeout=10, systemctl=None):
    """``{unit, program, systemd, unit_state, unit_error, installed, enabled, active, pids}`` of one service.

    ``installed``: the unit is known to systemd, else the program is on the search path (None when neither can
    tell); ``enabled``: the unit starts at boot (None without systemd); ``active``: systemd says it is active, else
    (no systemd) a process of the program runs."""
    facts = {"unit": unit, "program": program, "systemd": systemd_is_init(proc_root), "unit_state": None,
             "unit_error": None, "installed": None, "enabled": None, "active": None,
             "pids": processes(proc_root, program)}
    command = ops.which(systemctl or SYSTEMCTL) if facts["systemd"] else None
    if command:
        facts["unit_state"], facts["unit_error"] = unit_state(ops, command, unit, timeout)
    state = facts["unit_state"]
    if state is not None:
        facts["installed"] = state.get("LoadState") != "not-found"
        facts["enabled"] = state.get("UnitFileState") in ("enabled", "enabled-runtime", "static", "alias")
        facts["active"] = state.get("ActiveState") == "active"
    else:
        facts["installed"] = True if ops.which(program) or facts["pids"] else None
        facts["active"] = bool(facts["pids"])
    return facts
