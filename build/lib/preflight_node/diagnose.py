# -*- coding: utf-8 -*-
"""Diagnose a training job that runs or hangs now, the node half: its processes, their stacks, the newest core.

On each node (``library/diagnose_stacks.py``): :func:`find_processes` reads ``/proc`` for the
launchers (torchrun, deepspeed, accelerate) and their ranks, or for what a pattern names;
:func:`take_stacks` runs ``py-spy dump`` on all of them at once within one budget, each as the
account that owns the process (never root for a job user's rank: the dump then proves what that
user could do); :func:`.cores.core_backtrace` runs gdb on the newest core file of a directory, bounded,
as the core's owner.  py-spy and gdb run as root only when root alone can change them
(:func:`choose_program`): one next to a user's interpreter or in a directory others write is refused and
said (``refused``).  :func:`read` ties them together and is the module's whole result.

The controller half, ``cluster_preflight/stages/diagnosis.py`` (used by ``action_plugins/preflight_diagnose.py``),
groups the ranks of every node by the innermost frame of their main thread and names the suspects.

Pure functions of their inputs (a ``/proc`` root, dump texts) so tables test them.
"""

from __future__ import annotations

import math
import os
import pwd
import re
import threading
import time

from .cores.newest import core_backtrace, core_program, newest_core  # noqa: F401  (the diagnosis' core half)
from .host.proc import cmdline_of, environ_of, proc_stat, py_spy_dump_all
from .host.ownership import untrusted

LAUNCHERS = ("torchrun", "deepspeed", "accelerate")
# python -m <module> forms of the launchers.
LAUNCHER_MODULES = {
    "torch.distributed.run": "torchrun", "torch.distributed.launch": "torchrun",
    "deepspeed.launcher.runner": "deepspeed", "deepspeed.launcher.launch": "deepspeed",
    "accelerate.commands.launch": "accelerate", "accelerate.commands.accelerate_cli": "accelerate",
}
PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)*)?[a-z]?$")
# What the torch launchers give every rank; only these are kept from a process's environment.
RANK_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "TORCHELASTIC_RUN_ID")
# Tools of the diagnosis itself: never a target.
OWN_TOOLS = ("py-spy", "gdb")
STATE_NAMES = {"R": "running", "S": "sleeping", "D": "uninterruptible sleep", "T": "stopped", "t": "tracing stop",
               "Z": "zombie", "X": "dead", "I": "idle"}
# States that make a rank a suspect by themselves, and why.
SUSPECT_STATES = {
    "T": "stopped (state T: SIGSTOP, Ctrl-Z or a debugger): its peers wait for it",
    "t": "held by a tracer (state t: a debugger stopped it): its peers wait for it",
    "D": "in uninterruptible sleep (state D: blocked in the kernel, a driver or a file system)",
    "Z": "exited but not reaped (state Z): its peers wait for a rank that is gone",
}
# Source files of native frames (py-spy --native may give them a line too).
NATIVE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".h", ".hpp", ".cu", ".cuh", ".rs", ".s", ".S")
# Bytes of one dump or backtrace kept in the result.
TEXT_LIMIT = 200000

_THREAD = re.compile(r'^Thread (?P<id>\S+)(?: \((?P<status>[^)]*)\))?(?::\s*"(?P<name>.*)")?\s*$')
_FRAME = re.compile(r"^\s{2,}(?P<name>.+?) \((?P<where>[^()]*)\)\s*$")


# ---------------------------------------------------------------------------------------------------
# Processes


def _status_ids(pid, proc_root):
    """(uid, gid, groups) of ``pid`` from /proc/<pid>/status (real ids), or None."""
    try:
        with open(os.path.join(proc_root, str(pid), "status")) as handle:
            text = handle.read()
    except (OSError, IOError):
        return None
    ids = {}
    for line in text.splitlines():
        key, _sep, value = line.partition(":")
        if key in ("Uid", "Gid", "Groups"):
            ids[key] = [int(part) for part in value.split() if part.isdigit()]
    if not ids.get("Uid") or not ids.get("Gid"):
        return None
    return ids["Uid"][0], ids["Gid"][0], ids.get("Groups") or []


def _exe_name(pid, proc_root):
    try:
        return os.path.basename(os.readlink(os.path.join(proc_root, str(pid), "exe")))
    except OSError:
        return ""


def is_python(argv, exe_name=""):
    return bool(argv) and (PYTHON_NAME.match(os.path.basename(argv[0])) is not None
                           or PYTHON_NAME.match(exe_name or "") is not None)


def launcher_of(argv, exe_name=""):
    """Which launcher ``argv`` runs (torchrun, deepspeed, accelerate), or None."""
    if not argv:
        return None
    if os.path.basename(argv[0]) in LAUNCHERS:
        return os.path.basename(argv[0])
    if not is_python(argv, exe_name):
        return None
    args = argv[1:]
    for index, arg in enumerate(args):
        if arg == "-m" and index + 1 < len(args):
            return LAUNCHER_MODULES.get(args[index + 1])
        if arg.startswith("-m") and len(arg) > 2:
            return LAUNCHER_MODULES.get(arg[2:])
        if arg.startswith("-"):
            continue
        # The first operand is the script: /venv/bin/python /venv/bin/torchrun ...
        return os.path.basename(arg) if os.path.basename(arg) in LAUNCHERS else None
    return None


def _rank_from_argv(argv):
    """LOCAL_RANK from --local_rank=N / --local-rank N (torch.distributed.launch, deepspeed), or None."""
    for index, arg in enumerate(argv):
        for flag in ("--local_rank", "--local-rank"):
            if arg.startswith(flag + "="):
                value = arg.split("=", 1)[1]
                return int(value) if value.isdigit() else None
            if arg == flag and index + 1 < len(argv) and argv[index + 1].isdigit():
                return int(argv[index + 1])
    return None


def _int(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def read_process(pid, proc_root="/proc"):
    """What /proc says about ``pid``: argv, state, parent, real ids, the rank variables; None if gone."""
    stat = proc_stat(pid, proc_root)
    if stat is None:
        return None
    ids = _status_ids(pid, proc_root)
    env_path = os.path.join(proc_root, str(pid), "environ")
    readable = os.access(env_path, os.R_OK)
    env = environ_of(pid, proc_root) if readable else {}
    argv = cmdline_of(pid, proc_root)
    return {"pid": pid, "ppid": stat[1], "state": stat[0], "comm": stat[2], "argv": argv,
            "exe": _exe_name(pid, proc_root), "uid": ids[0] if ids else None, "gid": ids[1] if ids else None,
            "groups": ids[2] if ids else [], "env_readable": readable and bool(env),
            "env": {key: env[key] for key in RANK_ENV if key in env}}


def _own_lineage(proc_root):
    """This process and its ancestors (the module, its interpreter, the shell and sshd that started it)."""
    own, pid = set(), os.getpid()
    while pid and pid not in own:
        own.add(pid)
        stat = proc_stat(pid, proc_root)
        pid = stat[1] if stat else 0
    return own


def find_processes(proc_root="/proc", pattern="", uid=None, exclude=None):
    """The training processes of this node, sorted by pid.

    Without ``pattern``: the launchers (torchrun, deepspeed, accelerate, also as ``python -m``) and
    the ranks: Python processes with RANK or LOCAL_RANK in their environment, or (environment not
    readable) below a launcher.  With ``pattern`` (a regular expression searched in the command
    line): the processes it matches.  ``uid``: only that account's processes.  A process whose
    parent is a rank with the same command line (a DataLoader worker) is a ``child``, not a rank.
    Each entry: the fields of :func:`read_process` plus ``role`` (launcher, rank, child),
    ``launcher``, ``rank``, ``local_rank``, ``world_size``.
    """
    exclude = set(_own_lineage(proc_root) if exclude is None else exclude)
    regex = re.compile(pattern) if pattern else None
    table = {}
    for name in _listdir(proc_root):
        if name.isdigit() and int(name) not in exclude:
            entry = read_process(int(name), proc_root)
            if entry is not None and entry["argv"] and entry["state"] not in ("X",):
                table[entry["pid"]] = entry
    launchers = {pid: launcher_of(entry["argv"], entry["exe"]) for pid, entry in table.items()}

    def under_launcher(entry):
        seen, ppid = set(), entry["ppid"]
        while ppid in table and ppid not in seen:
            if launchers.get(ppid):
                return launchers[ppid]
            seen.add(ppid)
            ppid = table[ppid]["ppid"]
        return None

    found = {}
    for pid, entry in table.items():
        if os.path.basename(entry["argv"][0]) in OWN_TOOLS:
            continue
        if uid is not None and entry["uid"] != uid:
            continue
        launcher = launchers[pid]
        if regex is not None:
            if not regex.search(" ".join(entry["argv"])):
                continue
            role = "launcher" if launcher else "rank"
        elif launcher:
            role = "launcher"
        elif is_python(entry["argv"], entry["exe"]) and (
                "RANK" in entry["env"] or "LOCAL_RANK" in entry["env"]
                or (not entry["env_readable"] and under_launcher(entry))):
            role = "rank"
        else:
            continue
        env = entry["env"]
        local_rank = _int(env.get("LOCAL_RANK"))
        if local_rank is None:
            local_rank = _rank_from_argv(entry["argv"])
        found[pid] = dict(entry, role=role, launcher=launcher or under_launcher(entry) or "",
                          rank=_int(env.get("RANK")), local_rank=local_rank, world_size=_int(env.get("WORLD_SIZE")))
    for pid, entry in found.items():
        parent = found.get(entry["ppid"])
        if entry["role"] == "rank" and parent and parent["role"] == "rank" and parent["argv"] == entry["argv"]:
            entry["role"] = "child"
    return [found[pid] for pid in sorted(found)]


def _listdir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


# ---------------------------------------------------------------------------------------------------
# py-spy dumps


def is_python_frame(where):
    """``file.py:12`` (a Python frame) rather than ``libc.so.6`` or ``foo.cpp:12`` (native)."""
    path, sep, line = where.rpartition(":")
    return bool(sep) and line.isdigit() and not path.endswith(NATIVE_SUFFIXES)


def parse_dump(text):
    """``py-spy dump`` text -> ``{"threads": [{id, status, name, frames}], "error": str}``.

    Frames are innermost first, as py-spy prints them; each ``{"text", "name", "where", "python"}``.
    ``error`` is set (and ``threads`` empty) when the text holds no stack: py-spy's own error line."""
    threads, current = [], None
    for line in (text or "").splitlines():
        match = _THREAD.match(line)
        if match:
            current = {"id": match.group("id"), "status": match.group("status") or "",
                       "name": match.group("name") or "", "frames": []}
            threads.append(current)
            continue
        frame = _FRAME.match(line)
        if frame and current is not None:
            current["frames"].append({"text": line.strip(), "name": frame.group("name"), "where": frame.group("where"),
                                      "python": is_python_frame(frame.group("where"))})
    if threads:
        return {"threads": threads, "error": ""}
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    error = next((line for line in lines if line.startswith("Error")), lines[0] if lines else "py-spy printed nothing")
    return {"threads": [], "error": error[:300]}


def main_thread(parsed, pid=None):
    """The main thread of a parsed dump: named MainThread, else the one whose id is the pid, else the first."""
    threads = parsed.get("threads") or []
    for thread in threads:
        if thread["name"] == "MainThread":
            return thread
    for thread in threads:
        if pid is not None and thread["id"] in (str(pid), hex(pid)):
            return thread
    return threads[0] if threads else None


def where_stuck(text, pid=None):
    """Where a process is, from its dump: ``{frame, native_frame, thread, error}``.

    ``frame`` is the innermost Python frame of the main thread (``all_reduce
    (torch/distributed/distributed_c10d.py:3252)``); ``native_frame`` the innermost named native frame
    above it when the dump has native frames (``pthread_cond_wait (libc.so.6)``)."""
    parsed = parse_dump(text)
    thread = main_thread(parsed, pid)
    if thread is None:
        return {"frame": "", "native_frame": "", "thread": "", "error": parsed["error"]}
    python = [frame for frame in thread["frames"] if frame["python"]]
    native = [frame for frame in thread["frames"] if not frame["python"] and not frame["name"].startswith("0x")]
    if not python and not native:
        return {"frame": "", "native_frame": "", "thread": thread["name"] or thread["id"],
                "error": "the main thread has no frame (it is starting or exiting)"}
    return {"frame": python[0]["text"] if python else "", "native_frame": native[0]["text"] if native else "",
            "thread": thread["name"] or thread["id"], "error": ""}


def credentials_for(entry, euid=None):
    """``(credentials, env, user)`` to run py-spy as the owner of ``entry``: its real uid, gid and groups.

    As root only: another account cannot switch ids, so py-spy then runs as this process's user."""
    euid = os.geteuid() if euid is None else euid
    uid = entry.get("uid")
    try:
        account = pwd.getpwuid(uid) if uid is not None else None
    except KeyError:
        account = None
    user = account.pw_name if account else str(uid)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C", "LC_ALL": "C",
           "HOME": account.pw_dir if account else "/", "USER": user, "LOGNAME": user}
    if euid != 0 or uid is None or uid == euid:
        try:
            me = pwd.getpwuid(euid).pw_name
        except KeyError:
            me = str(euid)
        return None, None, me
    return {"user": uid, "group": entry.get("gid"), "extra_groups": list(entry.get("groups") or [])}, env, user


def take_stacks(processes, py_spy, budget, native=False, dump_all=py_spy_dump_all, euid=None):
    """``py-spy dump`` every launcher and rank at once within ``budget`` seconds, each as its owner.

    A stopped, traced or D-state process is read without pausing it (``--nonblocking``: py-spy cannot
    pause it, and it cannot move while read), and then without native frames (py-spy cannot unwind
    without pausing).  Returns ``{pid: {finished, text, user, native, frame, native_frame, thread,
    error}}``."""
    targets = [entry for entry in processes if entry["role"] in ("launcher", "rank")]
    if not py_spy:
        return {entry["pid"]: {"finished": False, "text": "", "user": "", "native": False, "frame": "",
                               "native_frame": "", "thread": "",
                               "error": "py-spy not found on this node (install it: bringup.yml, role debug_tools)"}
                for entry in targets}
    groups = {}
    for entry in targets:
        credentials, env, user = credentials_for(entry, euid)
        nonblocking = entry["state"] in ("T", "t", "D")
        key = (repr(sorted((credentials or {}).items())), nonblocking)
        group = groups.setdefault(key, {"credentials": credentials, "env": env, "user": user,
                                        "nonblocking": nonblocking, "pids": []})
        group["pids"].append(entry["pid"])
    deadline = time.monotonic() + max(0.0, float(budget))
    outcomes, lock = {}, threading.Lock()

    def run(group):
        use_native = bool(native) and not group["nonblocking"]
        found = dump_all({pid: group["nonblocking"] for pid in group["pids"]}, py_spy,
                         max(0.0, deadline - time.monotonic()), native=use_native, env=group["env"],
                         credentials=group["credentials"])
        with lock:
            for pid, (finished, text) in found.items():
                outcomes[pid] = (finished, text, group["user"], use_native)

    threads = [threading.Thread(target=run, args=(group,), daemon=True) for group in groups.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        # Each py_spy_dump_all bounds itself by the same deadline; a little slack to return.
        thread.join(max(0.0, deadline - time.monotonic()) + 5)
    stacks = {}
    for entry in targets:
        finished, text, user, used_native = outcomes.get(
            entry["pid"], (False, "py-spy dump did not finish within the %g s stack budget" % float(budget), "", False))
        where = where_stuck(text, entry["pid"]) if finished else {
            "frame": "", "native_frame": "", "thread": "", "error": (text.strip().splitlines() or ["no output"])[0]}
        stacks[entry["pid"]] = dict(where, finished=finished, text=text[:TEXT_LIMIT], user=user, native=used_native)
    return stacks


def choose_program(name, named, found, refused, euid=None):
    """The first of ``named`` (the operator's path) and ``found`` (paths looked up) this process may run: as root
    only one root alone can change (module_utils/preflight_node/host/ownership.py; a found one also in the system's
    directories).  Each refused one is added to ``refused`` as a sentence."""
    as_root = (os.geteuid() if euid is None else euid) == 0
    for path, anywhere in [(named, True)] + [(path, False) for path in found]:
        if not path:
            continue
        why = untrusted(path, anywhere=anywhere) if as_root else ""
        if not why:
            return path
        refused.append("%s %s was not run as root: %s" % (name, path, why))
    return None


def _py_spy_candidates(processes, proc_root):
    """py-spy next to each target's interpreter (a training venv often carries one), in process order."""
    found = []
    for entry in processes:
        exe = os.path.realpath(os.path.join(proc_root, str(entry["pid"]), "exe"))
        candidate = os.path.join(os.path.dirname(exe), "py-spy")
        if candidate not in found and os.access(candidate, os.X_OK):
            found.append(candidate)
    return found


# ---------------------------------------------------------------------------------------------------
# The node's whole result


def validate(params):
    """Problems with the module's inputs, each a sentence with found / expected / fix."""
    problems = []
    if params.get("pattern"):
        try:
            re.compile(params["pattern"])
        except re.error as exc:
            problems.append("Found pattern %r (%s). Expected: a Python regular expression searched in each process's "
                            "command line. Fix: set diagnose_pattern to, e.g., 'train\\.py'" % (params["pattern"], exc))
    # NaN and infinity pass a "more than 0" test: a bound must be a finite number of seconds.
    if not 0 < float(params.get("stack_budget") or 0) < math.inf:
        problems.append("Found stack_budget %s. Expected: more than 0 seconds, finite. Fix: set diagnose_stack_budget: 20"
                        % params.get("stack_budget"))
    if params.get("core_dir") and not 0 < float(params.get("core_timeout") or 0) < math.inf:
        problems.append("Found core_timeout %s. Expected: more than 0 seconds, finite. Fix: set diagnose_core_timeout: 60"
                        % params.get("core_timeout"))
    return problems


def user_uid(user):
    """uid of ``user`` (a name or a number); raises KeyError when there is no such account."""
    if str(user).isdigit():
        return int(user)
    return pwd.getpwnam(str(user)).pw_uid


def public_process(entry, stack):
    """One process as the controller gets it (no environment beyond the rank variables)."""
    row = {key: entry[key] for key in ("pid", "ppid", "state", "role", "launcher", "rank", "local_rank", "world_size",
                                       "uid", "env_readable")}
    row["cmdline"] = " ".join(entry["argv"])[:500]
    row["state_name"] = STATE_NAMES.get(entry["state"], entry["state"])
    try:
        row["user"] = pwd.getpwuid(entry["uid"]).pw_name if entry["uid"] is not None else ""
    except KeyError:
        row["user"] = str(entry["uid"])
    row["env"] = dict(entry["env"])
    if stack is not None:
        row.update(frame=stack["frame"], native_frame=stack["native_frame"], thread=stack["thread"],
                   dump_error=stack["error"], dump_finished=stack["finished"], dump_user=stack["user"],
                   dump_native=stack["native"], stack=stack["text"])
    return row


def read(params, ops, proc_root="/proc"):
    """Everything the node says: its training processes with their stacks, and the newest core."""
    started = time.monotonic()
    uid = user_uid(params["user"]) if params.get("user") else None
    processes = find_processes(proc_root, params.get("pattern") or "", uid)
    refused = []
    py_spy = choose_program("py-spy", params.get("py_spy"), [ops.which("py-spy", ["/usr/local/bin"])], refused)
    if not py_spy:
        py_spy = choose_program("py-spy", None, _py_spy_candidates(processes, proc_root), refused)
    stacks = take_stacks(processes, py_spy, params["stack_budget"], native=params.get("native"))
    dumped = time.monotonic()
    result = {"hostname": os.uname()[1], "py_spy": py_spy or "", "dump_seconds": round(dumped - started, 3),
              "processes": [public_process(entry, stacks.get(entry["pid"])) for entry in processes],
              "core": None, "refused": refused}
    if params.get("core_dir"):
        gdb = choose_program("gdb", params.get("gdb"), [ops.which("gdb")], refused)
        result["core"] = core_backtrace(params["core_dir"], params.get("core_glob") or "core*", gdb,
                                        params["core_timeout"], ops)
    result["seconds"] = round(time.monotonic() - started, 3)
    return result
