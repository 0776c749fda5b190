"""Cleanup of namespace test beds (tests/testbed.py) by state file.

Test-side helper, not shipped: the state files under /run/preflight-testbed, teardown of
a run id (own bed, or leftovers of a killed run), and the at-exit teardown of live beds.
"""

import atexit
import contextlib
import json
import os
import shutil

from testbed_net import (PREFIX, STATE_DIR, TestbedError, _alive, _kill_pids, _link_names,
                         _netns_list, _netns_pids, _nspid, _run, _state_lock)


# --------------------------------------------------------------------------
# Cleanup of beds by state file (own bed, or leftovers of a killed run)


def _state_path(runid):
    return os.path.join(STATE_DIR, f"{runid}.json")


def _read_states():
    states = []
    if not os.path.isdir(STATE_DIR):
        return states
    for entry in sorted(os.listdir(STATE_DIR)):
        if not entry.endswith(".json") or entry.startswith("."):
            continue
        path = os.path.join(STATE_DIR, entry)
        try:
            with open(path, encoding="utf-8") as handle:
                state = json.load(handle)
        except (OSError, ValueError):
            state = {"runid": entry[:-5], "owner_pid": 0, "broken": True}
        states.append(state)
    return states


def _state_alive(state):
    return _alive(state.get("owner_pid"), state.get("owner_start"))


def _close_control_masters(cp_dir):
    """End ssh ControlPersist masters that Ansible left for the bed's nodes."""
    if not cp_dir or not os.path.isdir(cp_dir):
        return
    for entry in os.listdir(cp_dir):
        path = os.path.join(cp_dir, entry)
        with contextlib.suppress(TestbedError):
            _run(["ssh", "-F", "/dev/null", "-o", f"ControlPath={path}", "-O", "exit",
                  "placeholder"], timeout=5, check=False)


def _teardown_runid(runid, state=None):
    """Remove every trace of run `runid`: processes, namespaces, links, dirs."""
    state = state or {}
    ns_prefix = f"{PREFIX}-{runid}-"
    link_prefix = f"{PREFIX}{runid}"
    errors = []
    _close_control_masters(state.get("cp_dir"))
    namespaces = set(state.get("namespaces", []))
    namespaces.update(n for n in _netns_list() if n.startswith(ns_prefix))
    for namespace in sorted(namespaces):
        # Killing a node's PID 1 kills its whole PID namespace; whatever else
        # was started in the network namespace goes with the same signal.
        for _ in range(3):
            pids = _netns_pids(namespace)
            if not pids:
                break
            inits = [p for p in pids if len(_nspid(p)) > 1 and _nspid(p)[-1] == 1]
            _kill_pids(inits + [p for p in pids if p not in inits])
        leftover = _netns_pids(namespace)
        if leftover:
            errors.append(f"{namespace}: processes survive SIGKILL: {leftover}")
        proc = _run(["ip", "netns", "del", namespace], timeout=10, check=False)
        if proc.returncode != 0 and namespace in _netns_list():
            errors.append(f"ip netns del {namespace}: {proc.stderr.strip()}")
    for pid, start in state.get("launchers", []):
        if _alive(pid, start):
            _kill_pids([pid])
    for name in _link_names():
        if name.startswith(link_prefix):
            proc = _run(["ip", "link", "del", name], timeout=10, check=False)
            if proc.returncode != 0 and name in _link_names():
                errors.append(f"ip link del {name}: {proc.stderr.strip()}")
    for key in ("workdir", "cp_dir"):
        if state.get(key) and state.get(f"own_{key}", key == "cp_dir"):
            shutil.rmtree(state[key], ignore_errors=True)
    if not errors:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_state_path(runid))
    return errors


def cleanup_stale(include_live=False):
    """Remove beds whose owner process is dead (all beds if include_live).

    Also removes namespaces and links carrying the prefix of a run id that has
    no state file left.  Returns the run ids removed."""
    removed = []
    with _state_lock():
        states = _read_states()
        live = set()
        for state in states:
            runid = state["runid"]
            if _state_alive(state) and not include_live:
                live.add(runid)
                continue
            if not _teardown_runid(runid, state):
                removed.append(runid)
        orphan_ids = set()
        for name in _netns_list():
            parts = name.split("-")
            if len(parts) >= 3 and parts[0] == PREFIX and _is_runid(parts[1]):
                orphan_ids.add(parts[1])
        for name in _link_names():
            if name.startswith(PREFIX) and _is_runid(name[3:7]):
                orphan_ids.add(name[3:7])
        for runid in sorted(orphan_ids - live - set(removed)):
            if not os.path.exists(_state_path(runid)):
                _teardown_runid(runid)
                removed.append(runid)
    return removed


def _is_runid(text):
    return len(text) == 4 and all(c in "0123456789abcdef" for c in text)


_LIVE_BEDS = []


def _down_live_beds():
    for bed in list(_LIVE_BEDS):
        if bed.owner_pid != os.getpid():
            continue  # a forked child exiting must not tear down its parent's bed
        with contextlib.suppress(Exception):
            bed.down()


atexit.register(_down_live_beds)
