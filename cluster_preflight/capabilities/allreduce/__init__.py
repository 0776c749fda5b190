# -*- coding: utf-8 -*-
"""Capability ``allreduce``, the controller half: the multi-node torch all-reduce gate.

The reader (the training Python and its torch, the accelerators, the rendezvous port's holder) is the
node half, ``module_utils/preflight_node/capabilities/allreduce.py``.

* ``candidates`` (controller): which nodes are ready to run ranks, with the
  readiness checks of every node.
* ``launch_plan`` (controller): the one launch of the whole cluster: the nodes
  still reachable and ready, the master, the world size, each node's arguments
  for the ``allreduce`` module.

The outcome of a run (``summarize``, the suspects, the signatures) is
``cluster_preflight/capabilities/allreduce/outcome.py``; the versions compared across nodes
(``version_checks``) are ``cluster_preflight/capabilities/allreduce/versions.py``.
"""

from __future__ import annotations

import os
import re
import secrets

from preflight_node.capabilities.allreduce import CAPABILITY  # noqa: F401  (the registry reads it here)
from preflight_node.checks import blocked, failed, passed, skipped, warned
from preflight_node.net.port_checks import held_check
from preflight_node.privilege import needs_root

from cluster_preflight.capabilities.allreduce.versions import torch_lt_2_1
from cluster_preflight.capabilities.allreduce.localize import bandwidth_deadline
from ..common import Args, Node, Problems, Settings


# --------------------------------------------------------------------------
# Settings


def validate(settings: Settings) -> Problems:
    problems = []

    def bad(name, found, expected, fix):
        problems.append({"name": name, "found": found, "expected": expected, "fix": fix})

    for name in ("allreduce_floor_busbw_gbps_gloo", "allreduce_floor_busbw_gbps_nccl"):
        value = settings.get(name, 0)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            bad(name, value, "0 (off) or a busbw in GB/s", "set %s to 0 or a floor such as 0.01 (gloo) / 1.0 (nccl)"
                % name)
    relative = settings.get("allreduce_floor_relative")
    if not isinstance(relative, (int, float)) or isinstance(relative, bool) or not 0 <= relative <= 1:
        bad("allreduce_floor_relative", relative, "a fraction of the median pair's busbw, 0 (off) to 1",
            "leave allreduce_floor_relative at 0.7, or set 0 to switch the relative floor off")
    grace = settings.get("allreduce_slow_grace")
    if not isinstance(grace, (int, float)) or isinstance(grace, bool) or grace < 0:
        bad("allreduce_slow_grace", grace, "0 or more seconds of start-up on top of the time at the floor",
            "leave allreduce_slow_grace at 10")
    port = settings.get("allreduce_master_port")
    if not isinstance(port, int) or not 1 <= port <= 65535:
        bad("allreduce_master_port", port, "a TCP port 1-65535",
            "set preflight_master_port (or allreduce_master_port) to a free port, the seeds use 6000")
    if settings["allreduce_nproc_per_node"] < 0:
        bad("allreduce_nproc_per_node", settings.get("allreduce_nproc_per_node"),
            "0 (one rank per accelerator, or allreduce_cpu_nproc on CPU) or more",
            "set preflight_nproc_per_node to 0 or a positive number of ranks")
    if settings["allreduce_cpu_nproc"] < 1:
        bad("allreduce_cpu_nproc", settings.get("allreduce_cpu_nproc"), "1 or more", "set allreduce_cpu_nproc: 2")
    timeout, hard = settings["allreduce_timeout"], settings["allreduce_hard_timeout"]
    if not 0 < timeout < hard:
        bad("allreduce_timeout", "allreduce_timeout=%s, allreduce_hard_timeout=%s" % (timeout, hard),
            "0 < allreduce_timeout < allreduce_hard_timeout",
            "the hard timeout bounds the whole launch: make it larger than the per-collective timeout")
    if settings["allreduce_stack_budget"] <= 0:
        bad("allreduce_stack_budget", settings.get("allreduce_stack_budget"), "more than 0 seconds",
            "set allreduce_stack_budget: 20")
    for name, example in (("allreduce_sizes", "[1048576, 4194304, 16777216]"),
                          ("allreduce_sizes_nccl", "[16777216, 134217728, 536870912, 1073741824]")):
        sizes = settings.get(name) or []
        if not sizes or any(size < 1 for size in sizes):
            bad(name, sizes, "at least one size, each 1 byte or more", "set %s, e.g. %s" % (name, example))
    if settings["allreduce_iters"] < 1:
        bad("allreduce_iters", settings.get("allreduce_iters"), "1 or more", "set allreduce_iters: 5")
    if settings["allreduce_warmup"] < 0:
        bad("allreduce_warmup", settings.get("allreduce_warmup"), "0 or more", "set allreduce_warmup: 2")
    if settings["allreduce_min_busbw_gbps"] < 0:
        bad("allreduce_min_busbw_gbps", settings.get("allreduce_min_busbw_gbps"), "0 (report only) or more",
            "set allreduce_min_busbw_gbps to a floor in GB/s, or 0")
    if settings["allreduce_poll_interval"] <= 0:
        bad("allreduce_poll_interval", settings.get("allreduce_poll_interval"), "more than 0 seconds",
            "set allreduce_poll_interval: 0.1")
    if not str(settings.get("allreduce_python") or "").strip():
        bad("allreduce_python", "empty", "the training environment's Python on the node",
            "set preflight_training_python in the inventory (the Python that imports torch)")
    for key in settings.get("allreduce_env") or {}:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", str(key)):
            bad("allreduce_env", key, "environment variable names", "remove or rename %r" % key)
    return problems


# --------------------------------------------------------------------------
# Reader (node)


def read_args(settings: Settings, node: Node) -> Args:
    return {
        "python": settings["allreduce_python"],
        "backend": settings["allreduce_backend"],
        "nproc_per_node": settings["allreduce_nproc_per_node"],
        "cpu_nproc": settings["allreduce_cpu_nproc"],
        "master_port": settings["allreduce_master_port"],
        "dev_root": "/dev",
        "sysfs_root": "/sys",
        "proc_root": "/proc",
    }


# --------------------------------------------------------------------------
# Deciders (controller)


ROOT_ON_PURPOSE = ("name the account your training jobs run as in preflight_job_user instead of root, unless they "
                   "really run as root")


def job_user_check(host, job):
    """``job_user``: who job-side code runs as on ``host`` (``job``: the node's resolve_job_user result)."""
    expected = "job-side code (torch probe, ranks, py-spy, core probe) runs as the job's own unprivileged user"
    fix_named = "set preflight_job_user in the inventory to the account training jobs run as"
    if not job:
        return failed("%s did not say which user job-side code runs as" % host, expected,
                      "run the preflight again; if it repeats, see preflight_facts on %s" % host)
    name, how, note = job.get("name"), job.get("how"), job.get("note") or ""
    if how == "missing":
        return failed("job user %s does not exist on %s (%s); no job-side code was run" % (name, host, note),
                      expected, "create %s on %s, or correct preflight_job_user" % (name, host))
    if how == "cannot_switch":
        # A requirement of the check (root switches users), not a fault of the node: never a fail.
        return needs_root("job user %s wanted on %s but %s; job-side code ran as the login instead, so what it "
                          "proved is not the job user's view (connect as %s, or set preflight_become)" % (
                              name, host, note, name), expected)
    if how == "unavailable":
        return unavailable_check(host, job, expected)
    who = "%s (uid %s)" % (name, job.get("uid"))
    if how == "auto":
        return warned("no job user named; job-side code ran as %s on %s" % (who, host), expected, fix_named)
    if job.get("uid") == 0:
        return root_check(host, job, expected)
    return passed("job-side code runs as %s on %s (%s)" % (who, host, "preflight_job_user" if how == "named"
                                                           else "the connecting user"), expected)


def reach_checks(host, job, python):
    """``job_user`` and ``python`` as bring-up judges them (its facts call resolves the job user but does not run the
    training Python): whether the job's account exists and whether the mode bits on the way to ``python`` let it run
    it (``job``: the node's resolve_job_user result).  The same names and words as the gate's, so the fault reads the
    same in bringup.json and verdict.json; the gate then runs it and imports torch (allreduce.python, .torch)."""
    checks = {"job_user": job_user_check(host, job)}
    user = (job or {}).get("name") or "the connecting user"
    expected = "a Python interpreter the job user can run"
    if (job or {}).get("python_blocked"):
        blocked_at = job["python_blocked"]
        checks["python"] = failed("training Python %s on %s cannot be run by %s: %s" % (
            python, host, user, blocked_at.get("found")), expected,
            "%s; or set preflight_training_python to a Python %s can run" % (
                access_fix(blocked_at, python, user, host), user))
    elif (job or {}).get("how") in ("missing", "unavailable", "cannot_switch") or not python:
        checks["python"] = skipped("training Python %s on %s was not judged: see allreduce.job_user" % (
            python or "(none set)", host), expected)
    else:
        checks["python"] = passed("%s can reach the training Python %s on %s (every directory on the way searchable, "
                                  "the interpreter executable); the gate runs it and imports torch" % (
                                      user, python, host), expected)
    return checks


def root_check(host, job, expected):
    """Job-side code as root, which only ``preflight_job_user: root`` (or an account with uid 0) asks for:
    acknowledged, and still a warning, since it proves nothing of an unprivileged job's view."""
    python = job.get("python") or "the training Python"
    trusting = ("; whoever can change %s runs code as root: %s" % (python, job["python_untrusted"])
                if job.get("python_untrusted") else "")
    asked = "as preflight_job_user: root asks" if job.get("name") == "root" else (
        "as preflight_job_user %s (uid 0) asks" % job.get("name"))
    return warned("job-side code runs as root on %s, %s; the checks prove what root can do, not what an "
                  "unprivileged job can%s" % (host, asked, trusting), expected,
                  ROOT_ON_PURPOSE + ("; and make %s changeable by root alone" % python if trusting else ""))


def unavailable_check(host, job, expected):
    """No job user named, and no unprivileged account can run the training Python: nothing job-side ran (root
    runs job code only when asked).  The gate's setting, not the node's fault: blocked, never failed."""
    python = job.get("python") or "the training Python"
    blocked_at = job.get("python_blocked") or {}
    reach = (" (%s)" % access_fix(blocked_at, python, "that account", host)) if blocked_at else ""
    return blocked(
        "no job user named for %s, and no unprivileged account can run the training Python there: %s; so no "
        "job-side code (torch probe, ranks, py-spy, core and ptrace probes) was run: running it as root needs "
        "preflight_job_user: root" % (host, job.get("note") or "nobody cannot"), expected,
        "set preflight_job_user to the account your training jobs run as on %s, one that can run %s%s; or, to run "
        "job-side code as root on purpose, set preflight_job_user: root" % (host, python, reach))


def _venv_of(python):
    """The directory of the venv ``python`` belongs to (``/root/train/.venv`` for ``/root/train/.venv/bin/python``),
    or None when it is not in a ``bin`` directory."""
    parent = os.path.dirname(str(python or ""))
    return os.path.dirname(parent) if os.path.basename(parent) == "bin" else None


def access_fix(blocked_at, python, user, host=""):
    """How to let ``user`` run ``python`` past the component ``blocked_at`` (``trust.blocker``'s answer), the least
    privilege first: a venv made from the node's system interpreter, which opens nothing; then letting that one
    account through the one directory with an ACL; never ``chmod o+x`` (it opens the directory to every account).
    Only commands a minimal node has, as root (no sudo), or the package to install."""
    where = blocked_at.get("path") or python
    on = " on %s" % host if host else ""
    if blocked_at.get("kind") == "missing":
        return ("%s does not exist%s: set preflight_training_python to the training venv's bin/python there" % (
            where, on))
    venv = _venv_of(python)
    new = "/opt/%s" % (os.path.basename(venv or "").lstrip(".") or "train-venv")
    concrete = bool(user) and " " not in user
    account = user if concrete else "the job's account"
    text = ("%s stops %s from running %s%s. Least privilege first: as root%s, make the training venv from the "
            "system interpreter, which %s can run, somewhere it can reach: /usr/bin/python3 -m venv %s && "
            "%s/bin/pip install torch and the job's packages (the same versions as in %s; Debian and Ubuntu need "
            "apt-get install python3-venv first), then set preflight_training_python: %s/bin/python" % (
                where, account, python, on, on, account, new, new, venv or python, new))
    if concrete:
        text += (". Or keep the venv and let %s alone through %s: setfacl -m u:%s:x %s (setfacl is in the package "
                 "acl: apt-get install acl, or dnf install acl)" % (user, where, user, where))
    return text + ". Not chmod o+x %s: that opens it to every account on the node" % where


def python_hang_check(host, python, hang):
    """``python``: the training Python hung (killed at its bound) in this node call; the one failure
    that says so, and what to look for.  Other checks that need it are ``blocked`` (see the readers)."""
    return failed(
        "training Python %s on %s hung: no answer in %g s as %s (killed); every later check of this node call "
        "that needs it was not run" % (python, host, hang.get("seconds") or 0, hang.get("user")),
        "the training Python starts and answers in a few seconds",
        "on %s, run %s -c 'import sys; print(sys.version)' by hand as %s and see where it waits (py-spy dump "
        "--pid <pid>): a hung network file system under its environment (stat its site-packages; mount), a "
        "sitecustomize or .pth that imports torch and blocks in GPU driver init (nvidia-smi, dmesg), or a lock; "
        "or set preflight_training_python to an environment that starts" % (host, python, hang.get("user")))


def python_checks(host, facts, job):
    """``python`` and ``torch``: the training Python ran as the job's user and found torch."""
    checks = {}
    python = facts.get("python_path")
    fix_python = ("set preflight_training_python in the inventory to the Python of the training environment on "
                  "%s, or install the torch your jobs use into it (as root on %s: %s -m pip install torch, with the "
                  "version they pin)" % (host, host, python or "the training Python"))
    user = job.get("name") or "the connecting user"
    if facts.get("python_blocked"):
        blocked_at = facts["python_blocked"]
        checks["python"] = failed("training Python %s on %s cannot be run by %s: %s" % (
            python, host, user, blocked_at.get("found")), "a Python interpreter the job user can run",
            "%s; or set preflight_training_python to a Python %s can run" % (
                access_fix(blocked_at, python, user, host), user))
    elif facts.get("python_hang"):
        checks["python"] = python_hang_check(host, python, facts["python_hang"])
    elif facts.get("probe_error") or not facts.get("python"):
        checks["python"] = failed("training Python %s on %s cannot run as %s: %s" % (
            python, host, user, _without_prefix(facts.get("probe_error"), user) or "no answer"),
            "a Python interpreter the job user can run", fix_python + "; readable and executable by %s" % user)
    else:
        # Who besides root could change the job-side code (the run's figures are then that account's word): said
        # with the check, read by ``baseline``.
        changeable = {"changeable_by": facts["changeable_by"]} if isinstance(facts.get("changeable_by"), str) else {}
        checks["python"] = passed("Python %s at %s on %s" % (
            facts["python"]["version"], facts["python"]["executable"], host), "an executable Python interpreter",
            **changeable)
        torch = facts.get("torch")
        if not torch:
            checks["torch"] = failed("no torch module in %s on %s (as %s)" % (python, host, user),
                                     "torch importable by the training Python", fix_python)
        else:
            checks["torch"] = passed("torch %s (cuda %s, hip %s) at %s on %s" % (
                torch.get("version"), torch.get("cuda"), torch.get("hip"), torch.get("path"), host),
                "torch importable by the training Python")
    return checks


def _without_prefix(text, user):
    """A command's error without the runner's own "cannot run as <user>: " (the finding says it once)."""
    prefix = "cannot run as %s: " % user
    return text[len(prefix):] if text and text.startswith(prefix) else text


def readiness(host, facts, settings):
    """The checks that say whether ``host`` can run its ranks; ``(checks, ready)``."""
    job = facts.get("job_user") or {}
    checks = {"job_user": job_user_check(host, job)}
    if facts.get("not_run") or job.get("how") in ("unavailable", "missing"):
        # No account may run job-side code here: one finding (job_user), nothing run, never ready.
        checks["python"] = skipped("training Python %s on %s was not run: see allreduce.job_user" % (
            facts.get("python_path"), host), "a Python interpreter the job user can run")
        return checks, False
    checks.update(python_checks(host, facts, job))
    python = facts.get("python_path")
    torch = facts.get("torch") or {}
    accel = facts.get("accelerators") or {}
    n_accel = int(accel.get("nvidia", 0)) + int(accel.get("amd", 0))
    gpu_build = bool(torch.get("cuda") or torch.get("hip"))
    if n_accel and torch and not gpu_build:
        checks["accelerator_build"] = failed(
            "%d accelerator(s) on %s but torch %s is a CPU-only build" % (n_accel, host, torch.get("version")),
            "a CUDA or ROCm build of torch on a GPU node", "install the CUDA/ROCm wheel of torch into %s" % python)
    elif facts.get("backend") == "nccl" and not n_accel:
        checks["accelerator_build"] = failed(
            "backend nccl requested but no accelerator is visible on %s" % host,
            "NVIDIA (/dev/nvidiaN) or AMD (KFD) devices for nccl",
            "use backend gloo on CPU nodes, or check the GPU driver (nvidia-smi / rocm-smi)")
    else:
        checks["accelerator_build"] = passed(
            "%d accelerator(s), torch build %s, backend %s on %s" % (
                n_accel, "GPU" if gpu_build else "CPU", facts.get("backend"), host),
            "a torch build that matches the node's accelerators")
    blocking = facts.get("cuda_launch_blocking") == "1" or str(
        (settings.get("allreduce_env") or {}).get("CUDA_LAUNCH_BLOCKING", "")) == "1"
    if torch and torch_lt_2_1(torch.get("version")) and blocking:
        checks["cuda_launch_blocking"] = failed(
            "CUDA_LAUNCH_BLOCKING=1 with torch %s (NCCL 2.14.3) on %s" % (torch.get("version"), host),
            "CUDA_LAUNCH_BLOCKING unset, or torch >= 2.1 (NCCL >= 2.17)",
            "unset CUDA_LAUNCH_BLOCKING or upgrade torch: NCCL 2.14.3 hangs with it (NVIDIA/nccl issue 750)")
    ready = not any(result["status"] == "fail" for result in checks.values())
    return checks, ready


def candidates(hosts, facts_by_host, settings_by_host):
    """Readiness of every node that was read: ``{checks_by_host, ready, blockers}``."""
    checks_by_host, ready = {}, []
    for host in hosts:
        facts = facts_by_host.get(host)
        if facts is None:
            continue
        checks, ok = readiness(host, facts, settings_by_host.get(host) or {})
        checks_by_host[host] = checks
        if ok:
            ready.append(host)
    return {"checks_by_host": checks_by_host, "ready": ready}


def floor(settings: dict, backend: str, single: bool = False) -> dict:
    """The bandwidth floor of a run on ``backend``, built once from the allreduce settings and handed to whatever
    judges or bounds that run: ``{absolute, relative, grace}`` (GB/s busbw, 0: none; the fraction of the median
    pair's busbw the localisation rounds hold a launch to; the seconds of start-up a launch's bandwidth deadline adds
    to its time at the absolute floor).  The launch plan carries the all-node run's (``floor``), which the launch's
    arguments and the localisation rounds use; ``single``: a node's run alone over its own GPUs
    (``allreduce_floor_single_busbw_gbps_<backend>``, no relative floor)."""
    backend = backend or "gloo"
    if single:
        return {"absolute": float(settings["allreduce_floor_single_busbw_gbps_%s" % backend]), "relative": 0.0,
                "grace": float(settings["allreduce_slow_grace"])}
    return {"absolute": float(settings["allreduce_floor_busbw_gbps_%s" % backend]),
            "relative": float(settings["allreduce_floor_relative"]), "grace": float(settings["allreduce_slow_grace"])}


def run_deadline(args: dict, run_floor: dict, world_size: int) -> float:
    """:func:`bandwidth_deadline` of one launch's ``args`` (a launch plan's shape) at ``world_size`` ranks, held to
    ``run_floor`` (:func:`floor`)."""
    return bandwidth_deadline(args["sizes"], args["iters"], args["warmup"], world_size, run_floor["absolute"],
                              run_floor["grace"])


def _cluster_addr(nic_plan, host, node):
    return (nic_plan.get("addr_by_host") or {}).get(host) or node["node_addr"]


def _master_port_check(master, facts, settings, checks_by_host, blockers):
    """``master_port`` on the master: its rendezvous port is free, else a blocker of the launch (a fail when root's
    own program holds it; blocked, never a fail, when another account's listener does)."""
    port = facts.get("port") or {}
    expected = "rendezvous port %d free on the master %s" % (settings["allreduce_master_port"], master)
    holder = port.get("holder") if isinstance(port.get("holder"), dict) else {}
    if port.get("free", True):
        checks_by_host.setdefault(master, {})["master_port"] = passed(port.get("detail", ""), expected)
    elif holder.get("foreign"):
        checks_by_host.setdefault(master, {})["master_port"] = held_check(
            master, settings["allreduce_master_port"], holder, expected, what="the all-reduce's rendezvous")
        blockers.append("another account holds the rendezvous port on the master %s" % master)
    else:
        checks_by_host.setdefault(master, {})["master_port"] = failed(
            "%s (master %s)" % (port.get("detail"), master), expected,
            "stop that process on %s or choose another port with preflight_master_port" % master)
        blockers.append("the rendezvous port is taken on the master %s" % master)


def _node_args(host, index, gate_hosts, settings, facts, nproc, master_addr, backend, ifname, run_floor, token):
    """The ``allreduce`` module's arguments for ``host``, node rank ``index`` of ``gate_hosts``, its bandwidth
    deadline held to the run's ``run_floor`` (:func:`floor`); ``token``: the launch's secret for the rendezvous
    store's keys."""
    args = {
        "python": settings["allreduce_python"],
        "nnodes": len(gate_hosts),
        "node_rank": index,
        "nproc_per_node": nproc,
        "master_addr": master_addr,
        "master_port": settings["allreduce_master_port"],
        "backend": backend,
        "timeout": settings["allreduce_timeout"],
        "hard_timeout": settings["allreduce_hard_timeout"],
        "stack_budget": settings["allreduce_stack_budget"],
        # GPUs show their fabric's peak only at large sizes (up to 1 GiB); CPU ranks keep to small ones.
        "sizes": settings["allreduce_sizes_nccl" if backend == "nccl" else "allreduce_sizes"],
        "iters": settings["allreduce_iters"],
        "warmup": settings["allreduce_warmup"],
        # The worker's own 4 MiB correctness check (localisation rounds use less).
        "check_elements": 0,
        "min_busbw_gbps": settings["allreduce_min_busbw_gbps"],
        "socket_ifname": ifname,
        "role": host,
        # The ranks and py-spy of them run as the node's job user, always named (the node checks it against its own
        # settings; the connecting login when no switch is needed).
        "run_as": (facts.get("job_user") or {}).get("run_as") or (facts.get("job_user") or {}).get("name") or "",
        "env": gate_env(settings),
        "keep_scratch": settings["allreduce_keep_scratch"],
        "selftest_fault": settings["allreduce_selftest_fault"],
        "selftest_rank": settings["allreduce_selftest_rank"],
        "async": int(settings["allreduce_hard_timeout"] + settings["allreduce_stack_budget"]) + 60,
        "wait_timeout": int(settings["allreduce_hard_timeout"] + settings["allreduce_stack_budget"]) + 60,
        "poll": settings["allreduce_poll_interval"],
        "store_token": token,
    }
    args["bandwidth_deadline"] = run_deadline(args, run_floor, nproc * len(gate_hosts))
    # Each collective late against the floor ends the stage at once
    # (module_utils/preflight_node/allreduce_run/gate_run.py).
    args["bandwidth_grace"] = run_floor["grace"]
    return args


# The job environment's variables the gate's run does not take: its logs are what the gate diagnoses from (NCCL's
# INFO lines name the transport; a debug file would take them out of the rank logs).  allreduce_env may set them.
GATE_LOGGING = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")


def gate_env(settings):
    """The environment of the gate's ranks: the jobs' own (``preflight_job_env``, but its logging), under
    ``allreduce_env``, which wins for the gate's run."""
    env = {str(key): str(value) for key, value in (settings.get("preflight_job_env") or {}).items()
           if str(key) not in GATE_LOGGING}
    env.update(settings.get("allreduce_env") or {})
    return env


# The variables that name the interface of the collectives; a run over lo names lo instead of the job's.
SOCKET_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def alone_args(host, facts, settings):
    """The ``allreduce`` module's arguments for ``host`` running its ranks alone over ``lo`` (its single-node run,
    planned before any peer is): the all-node launch's shape, one node."""
    args = _node_args(host, 0, [host], settings, facts, facts["nproc_per_node"], "127.0.0.1", facts["backend"], "lo",
                      floor(settings, facts["backend"], single=True), secrets.token_hex(16))
    args["env"] = dict(args["env"], **{name: "lo" for name in SOCKET_VARIABLES if name in args["env"]})
    return args


def launch_plan(hosts, ready, excluded, facts_by_host, settings_by_host, nodes, nic_plan, blockers=()):
    """The single launch of the gate.

    ``hosts``: targeted nodes in inventory order; ``ready``: those whose
    readiness passed; ``excluded``: ``{host: reason}`` of nodes left out
    (lost, blamed by the port mesh).  Returns a decision with ``launch``,
    ``hosts``, ``master``, ``master_addr``, ``world_size``, ``args_by_host``
    and, per excluded or not-ready node, a check saying why it has no ranks.
    """
    checks_by_host = {}
    blockers = list(blockers)
    ready_hosts = set(ready)  # a list of every ready node: looked up once per node
    gate_hosts = [host for host in hosts if host in ready_hosts and host not in excluded]
    for host, reason in excluded.items():
        checks_by_host[host] = {"run": blocked("no ranks on %s: %s" % (host, reason),
                                               "every node runs its ranks in the all-reduce")}
    if not gate_hosts and not blockers:
        blockers.append("no node is ready to run the all-reduce (see the allreduce checks)")
    nprocs = {host: facts_by_host[host]["nproc_per_node"] for host in gate_hosts}
    backends = {host: facts_by_host[host]["backend"] for host in gate_hosts}
    if len(set(nprocs.values())) > 1:
        blockers.append("ranks per node differ (%s): a missing or hidden GPU?" % ", ".join(
            "%s=%s" % item for item in nprocs.items()))
    if len(set(backends.values())) > 1:
        blockers.append("backends differ across nodes (%s)" % ", ".join("%s=%s" % item for item in backends.items()))
    master = gate_hosts[0] if gate_hosts else None
    if master:
        _master_port_check(master, facts_by_host[master], settings_by_host[master], checks_by_host, blockers)
    plan = {"launch": not blockers, "hosts": gate_hosts if not blockers else [], "master": master,
            "master_addr": None, "world_size": 0, "nproc_per_node": None, "backend": None, "args_by_host": {},
            "skip_reason": "; ".join(blockers)}
    if blockers:
        for host in gate_hosts:
            checks_by_host.setdefault(host, {})["run"] = blocked(
                "the all-reduce was not launched: %s" % "; ".join(blockers),
                "the all-reduce runs on every ready node")
        return dict(plan, ok=False, blockers=blockers, checks_by_host=checks_by_host)
    master_addr = _cluster_addr(nic_plan, master, nodes[master])
    nproc = nprocs[master]
    ifname = nic_plan.get("gloo_socket_ifname") or ""
    # One floor for the one launch (the master's settings), carried by the plan to the localisation rounds.
    run_floor = floor(settings_by_host[master], backends[master])
    token = secrets.token_hex(16)
    for index, host in enumerate(gate_hosts):
        plan["args_by_host"][host] = _node_args(host, index, gate_hosts, settings_by_host[host], facts_by_host[host],
                                                nproc, master_addr, backends[host], ifname, run_floor, token)
    plan.update(master_addr=master_addr, master_port=settings_by_host[master]["allreduce_master_port"],
                world_size=nproc * len(gate_hosts), nproc_per_node=nproc, backend=backends[master],
                socket_ifname=ifname or None, floor=run_floor)
    return dict(plan, ok=True, blockers=[], checks_by_host=checks_by_host)
