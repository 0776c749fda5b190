# -*- coding: utf-8 -*-
"""Capability ``allreduce``, the controller half: the multi-node torch all-reduce gate.

The reader (the training Python and its torch, the accelerators, the rendezvous port's holder) is the
node half, ``module_utils/preflight_node/allreduce.py``.

* ``candidates`` (controller): which nodes are ready to run ranks, with the
  readiness checks of every node.
* ``launch_plan`` (controller): the one launch of the whole cluster: the nodes
  still reachable and ready, the master, the world size, each node's arguments
  for the ``allreduce`` module.
* ``summarize`` (controller): every node's rank results → the gate's outcome,
  the suspect ranks and nodes, collateral failures of healthy peers, the
  world size compared with the plan, and the known failure signatures found in
  each node's logs (``signatures``, see ``preflight_signatures``).
* ``version_checks`` (controller): torch / NCCL / CUDA / HIP / Python of every
  node compared across the cluster (``versions``): the odd node is named.
"""

from __future__ import annotations

import re

from preflight_node.allreduce import CAPABILITY  # noqa: F401  (the registry reads it here)
from preflight_node.checks import blocked, check, failed, not_applicable, passed, skipped, warned, worst
from preflight_node.privilege import needs_root

from cluster_preflight.localize import bandwidth_deadline
from cluster_preflight.nic_select import usable_fabrics
from cluster_preflight.signatures import match as match_signatures, transport as signature_transport

# Exit codes of ranks that torchrun itself terminated after another rank failed.
TERMINATED_BY_AGENT = (-15, 143)
BARRIER_RE = re.compile(r"[Rr]anks?\s+([\d,\s]+?)\s+failed to pass monitoredBarrier")
PEER_LOST_RE = re.compile(r"Connection (closed|reset) by peer|Broken pipe|recv.*failed|closed by remote|"
                          r"Socket Timeout|timed out|Timeout", re.I)
STAGE_ORDER = ("not started", "start", "init", "correctness", "barrier", "bandwidth", "done")


# --------------------------------------------------------------------------
# Settings


def validate(settings):
    problems = []

    def bad(name, found, expected, fix):
        problems.append({"name": name, "found": found, "expected": expected, "fix": fix})

    for name in ("allreduce_floor_busbw_gbps_gloo", "allreduce_floor_busbw_gbps_nccl"):
        value = settings.get(name, 0)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            bad(name, value, "0 (off) or a busbw in GB/s", "set %s to 0 or a floor such as 0.01 (gloo) / 1.0 (nccl)"
                % name)
    relative = settings.get("allreduce_floor_relative", 0.7)
    if not isinstance(relative, (int, float)) or isinstance(relative, bool) or not 0 <= relative <= 1:
        bad("allreduce_floor_relative", relative, "a fraction of the median pair's busbw, 0 (off) to 1",
            "leave allreduce_floor_relative at 0.7, or set 0 to switch the relative floor off")
    grace = settings.get("allreduce_slow_grace", 10)
    if not isinstance(grace, (int, float)) or isinstance(grace, bool) or grace < 0:
        bad("allreduce_slow_grace", grace, "0 or more seconds of start-up on top of the time at the floor",
            "leave allreduce_slow_grace at 10")
    port = settings.get("allreduce_master_port")
    if not isinstance(port, int) or not 1 <= port <= 65535:
        bad("allreduce_master_port", port, "a TCP port 1-65535",
            "set preflight_master_port (or allreduce_master_port) to a free port, the seeds use 6000")
    if settings.get("allreduce_nproc_per_node", 0) < 0:
        bad("allreduce_nproc_per_node", settings.get("allreduce_nproc_per_node"),
            "0 (one rank per accelerator, or allreduce_cpu_nproc on CPU) or more",
            "set preflight_nproc_per_node to 0 or a positive number of ranks")
    if settings.get("allreduce_cpu_nproc", 1) < 1:
        bad("allreduce_cpu_nproc", settings.get("allreduce_cpu_nproc"), "1 or more", "set allreduce_cpu_nproc: 2")
    timeout, hard = settings.get("allreduce_timeout", 30), settings.get("allreduce_hard_timeout", 120)
    if not 0 < timeout < hard:
        bad("allreduce_timeout", "allreduce_timeout=%s, allreduce_hard_timeout=%s" % (timeout, hard),
            "0 < allreduce_timeout < allreduce_hard_timeout",
            "the hard timeout bounds the whole launch: make it larger than the per-collective timeout")
    if settings.get("allreduce_stack_budget", 20) <= 0:
        bad("allreduce_stack_budget", settings.get("allreduce_stack_budget"), "more than 0 seconds",
            "set allreduce_stack_budget: 20")
    sizes = settings.get("allreduce_sizes") or []
    if not sizes or any(size < 1 for size in sizes):
        bad("allreduce_sizes", sizes, "at least one size, each 1 byte or more",
            "set allreduce_sizes, e.g. [1048576, 4194304, 16777216]")
    if settings.get("allreduce_iters", 1) < 1:
        bad("allreduce_iters", settings.get("allreduce_iters"), "1 or more", "set allreduce_iters: 5")
    if settings.get("allreduce_warmup", 0) < 0:
        bad("allreduce_warmup", settings.get("allreduce_warmup"), "0 or more", "set allreduce_warmup: 2")
    if settings.get("allreduce_min_busbw_gbps", 0) < 0:
        bad("allreduce_min_busbw_gbps", settings.get("allreduce_min_busbw_gbps"), "0 (report only) or more",
            "set allreduce_min_busbw_gbps to a floor in GB/s, or 0")
    if settings.get("allreduce_poll_interval", 0.1) <= 0:
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


def read_args(settings, node):
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


def torch_lt_2_1(version):
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return bool(match) and (int(match.group(1)), int(match.group(2))) < (2, 1)


def job_user_check(host, job):
    """``job_user``: who job-side code runs as on ``host`` (``job``: the node's resolve_job_user result)."""
    expected = "job-side code (torch probe, ranks, py-spy, core probe) runs as the job's own unprivileged user"
    fix_named = "set preflight_job_user in the inventory to the account training jobs run as"
    if not job:
        return failed("%s did not say which user job-side code runs as" % host, expected,
                      "run the preflight again; if it repeats, see preflight_facts on %s" % host)
    name, how, note = job.get("name"), job.get("how"), job.get("note") or ""
    if how == "missing":
        return failed("job user %s does not exist on %s (%s)" % (name, host, note), expected,
                      "create %s on %s, or correct preflight_job_user" % (name, host))
    if how == "cannot_switch":
        # A requirement of the check (root switches users), not a fault of the node: never a fail.
        return needs_root("job user %s wanted on %s but %s; job-side code ran as the login instead, so what it "
                          "proved is not the job user's view (connect as %s, or set preflight_become)" % (
                              name, host, note, name), expected)
    who = "%s (uid %s)" % (name, job.get("uid"))
    if how == "auto_root":
        return warned("no job user named; %s, so job-side code ran as root on %s" % (note, host), expected,
                      "%s, and make the training Python readable by that user" % fix_named)
    if how == "auto":
        return warned("no job user named; job-side code ran as %s on %s" % (who, host), expected, fix_named)
    if job.get("uid") == 0:
        return warned("job user is root on %s: the checks prove what root can do, not a job's user" % host,
                      expected, fix_named)
    return passed("job-side code runs as %s on %s (%s)" % (who, host, "preflight_job_user" if how == "named"
                                                           else "the connecting user"), expected)


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


def readiness(host, facts, settings):
    """The checks that say whether ``host`` can run its ranks; ``(checks, ready)``."""
    checks = {"job_user": job_user_check(host, facts.get("job_user"))}
    python = facts.get("python_path")
    fix_python = ("set preflight_training_python in the inventory to the Python of the training environment on "
                  "%s, or install torch into it (pip install torch==<version>)" % host)
    user = (facts.get("job_user") or {}).get("name") or "the connecting user"
    if facts.get("python_hang"):
        checks["python"] = python_hang_check(host, python, facts["python_hang"])
    elif facts.get("probe_error") or not facts.get("python"):
        checks["python"] = failed("training Python %s on %s cannot run as %s: %s" % (
            python, host, user, facts.get("probe_error") or "no answer"),
            "a Python interpreter the job user can run", fix_python + "; readable and executable by %s" % user)
    else:
        checks["python"] = passed("Python %s at %s on %s" % (
            facts["python"]["version"], facts["python"]["executable"], host), "an executable Python interpreter")
        torch = facts.get("torch")
        if not torch:
            checks["torch"] = failed("no torch module in %s on %s (as %s)" % (python, host, user),
                                     "torch importable by the training Python", fix_python)
        else:
            checks["torch"] = passed("torch %s (cuda %s, hip %s) at %s on %s" % (
                torch.get("version"), torch.get("cuda"), torch.get("hip"), torch.get("path"), host),
                "torch importable by the training Python")
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


def run_deadline(args, settings, world_size):
    """:func:`bandwidth_deadline` of one launch's ``args`` (a launch plan's shape) at ``world_size`` ranks."""
    floor = settings.get("allreduce_floor_busbw_gbps_%s" % (args.get("backend") or "gloo"), 0) or 0
    return bandwidth_deadline(args["sizes"], args["iters"], args["warmup"], world_size, floor,
                              settings.get("allreduce_slow_grace", 10))


def _cluster_addr(nic_plan, host, node):
    return (nic_plan.get("addr_by_host") or {}).get(host) or node["node_addr"]


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
    gate_hosts = [host for host in hosts if host in ready and host not in excluded]
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
        port = facts_by_host[master].get("port") or {}
        settings = settings_by_host[master]
        expected = "rendezvous port %d free on the master %s" % (settings["allreduce_master_port"], master)
        if port.get("free", True):
            checks_by_host.setdefault(master, {})["master_port"] = passed(port.get("detail", ""), expected)
        else:
            checks_by_host.setdefault(master, {})["master_port"] = failed(
                "%s (master %s)" % (port.get("detail"), master), expected,
                "stop that process on %s or choose another port with preflight_master_port" % master)
            blockers.append("the rendezvous port is taken on the master %s" % master)
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
    for index, host in enumerate(gate_hosts):
        settings = settings_by_host[host]
        plan["args_by_host"][host] = {
            "python": settings["allreduce_python"],
            "nnodes": len(gate_hosts),
            "node_rank": index,
            "nproc_per_node": nproc,
            "master_addr": master_addr,
            "master_port": settings["allreduce_master_port"],
            "backend": backends[host],
            "timeout": settings["allreduce_timeout"],
            "hard_timeout": settings["allreduce_hard_timeout"],
            "stack_budget": settings["allreduce_stack_budget"],
            "sizes": settings["allreduce_sizes"],
            "iters": settings["allreduce_iters"],
            "warmup": settings["allreduce_warmup"],
            # The worker's own 4 MiB correctness check (localisation rounds use less).
            "check_elements": 0,
            "min_busbw_gbps": settings["allreduce_min_busbw_gbps"],
            "socket_ifname": ifname,
            "role": host,
            # The ranks and py-spy of them run as the node's job user (None: the connecting user).
            "run_as": (facts_by_host[host].get("job_user") or {}).get("run_as") or "",
            "env": settings["allreduce_env"],
            "keep_scratch": settings["allreduce_keep_scratch"],
            "selftest_fault": settings["allreduce_selftest_fault"],
            "selftest_rank": settings["allreduce_selftest_rank"],
            "async": int(settings["allreduce_hard_timeout"] + settings["allreduce_stack_budget"]) + 60,
            "wait_timeout": int(settings["allreduce_hard_timeout"] + settings["allreduce_stack_budget"]) + 60,
            "poll": settings["allreduce_poll_interval"],
        }
        args = plan["args_by_host"][host]
        args["bandwidth_deadline"] = run_deadline(args, settings, nproc * len(gate_hosts))
    plan.update(master_addr=master_addr, master_port=settings_by_host[master]["allreduce_master_port"],
                world_size=nproc * len(gate_hosts), nproc_per_node=nproc, backend=backends[master],
                socket_ifname=ifname or None)
    return dict(plan, ok=True, blockers=[], checks_by_host=checks_by_host)


# --------------------------------------------------------------------------
# Outcome (controller)


def _peer_named_ranks(ranks):
    named = set()
    for entry in ranks:
        for match in BARRIER_RE.finditer(entry.get("error") or ""):
            named.update(int(part) for part in re.findall(r"\d+", match.group(1)))
    return named


def find_suspects(rank_rows, lost=()):
    """Which ranks caused a failed gate, and why.  ``rank_rows`` carry ``host``.

    Primary causes, strongest first: a node lost while its ranks ran; wrong
    data; a rank that died on its own (not terminated by torchrun after a peer
    failed); a stopped or hung process; ranks that peers name as missing from
    the monitored barrier; a node whose ranks never started.  Ranks that only
    lost their peer are collateral.
    """
    suspects = []
    if any(row["host"] in lost for row in rank_rows):
        # A node that went away explains its peers' failed rendezvous and collectives; only wrong
        # data or a stopped process elsewhere is a fault of its own.
        for row in rank_rows:
            if row["host"] in lost:
                reason = "gave no result: %s" % lost[row["host"]]
            elif row.get("status") == "wrong":
                reason = "returned wrong all-reduce data (%s wrong elements)" % (
                    (row.get("correctness") or {}).get("wrong"))
            elif str(row.get("process_state", "")).startswith("stopped"):
                reason = "process %s at stage %s" % (row["process_state"], row.get("stage"))
            else:
                continue
            suspects.append({"host": row["host"], "rank": row["rank"], "reason": reason})
        return suspects
    for row in rank_rows:
        reason = None
        if row.get("status") == "wrong":
            reason = "returned wrong all-reduce data (%s wrong elements)" % (row.get("correctness") or {}).get("wrong")
        elif row.get("status") == "died" and row.get("exitcode") not in TERMINATED_BY_AGENT:
            reason = "died at stage %s with exit code %s" % (row.get("stage"), row.get("exitcode"))
        elif str(row.get("process_state", "")).startswith("stopped"):
            reason = "process %s at stage %s" % (row["process_state"], row.get("stage"))
        elif row.get("status") == "missing" and row.get("stage") == "not started":
            reason = "never started (its node's torchrun did not launch it)"
        if reason:
            suspects.append({"host": row["host"], "rank": row["rank"], "reason": reason})
    if not suspects:
        for row in rank_rows:
            if row.get("status") == "slow" and row.get("slow"):
                suspects.append({"host": row["host"], "rank": row["rank"], "reason": (
                    "slow: the bandwidth stage outlived its deadline of %.1f s (the sizes at the floor busbw) at "
                    "busbw %.4f GB/s" % (row["slow"].get("deadline_seconds") or 0,
                                         row["slow"].get("busbw_reached_gbps") or 0))})
    if not suspects:
        named = _peer_named_ranks(rank_rows)
        for row in rank_rows:
            if row["rank"] in named:
                suspects.append({"host": row["host"], "rank": row["rank"],
                                 "reason": "named by its peers as missing from the monitored barrier"})
    if not suspects and any(row.get("status") == "error" for row in rank_rows):
        for row in rank_rows:
            if row.get("status") == "hung":
                suspects.append({"host": row["host"], "rank": row["rank"],
                                 "reason": "hung at stage %s while its peers timed out waiting for it (stack in "
                                           "%s.stacks.txt)" % (row.get("stage"), row["host"])})
    if not suspects:
        bad = [row for row in rank_rows if row.get("status") != "ok"]
        own = [row for row in bad if not PEER_LOST_RE.search(row.get("error") or "")]
        stages = [row.get("stage") for row in bad]
        if bad and own and len(own) < len(bad):
            bad = own
        elif bad and len(set(stages)) > 1:
            # Everyone failed the same way: the ranks that got least far are the likeliest cause.
            earliest = min(stages, key=lambda stage: STAGE_ORDER.index(stage) if stage in STAGE_ORDER else 0)
            bad = [row for row in bad if row.get("stage") == earliest]
        for row in bad:
            suspects.append({"host": row["host"], "rank": row["rank"],
                             "reason": "%s at stage %s: %s" % (row.get("status"), row.get("stage"),
                                                               (row.get("error") or "no error recorded")[:200])})
    return suspects


# Suspects the all-node run names by evidence of their own, which a later run cannot disprove: wrong data (a
# corruption may be intermittent), a rank that died by itself (an OOM kill, a crash), a rank held stopped.
OWN_FAULTS = ("returned wrong all-reduce data", "died at stage", "process stopped")


def own_faults(results_by_host):
    """``{host: reason}`` of the nodes the all-node run names by their own ranks' evidence (:data:`OWN_FAULTS`);
    ``results_by_host``: host -> the ``allreduce`` module's result.  Localisation leaves them out (they fail on
    that evidence) and proves the others."""
    rows = [dict(entry, host=host) for host, result in sorted(results_by_host.items()) if isinstance(result, dict)
            for entry in result.get("ranks") or [] if isinstance(entry, dict)]
    faults = {}
    for suspect in find_suspects(rows):
        if suspect["reason"].startswith(OWN_FAULTS):
            faults.setdefault(suspect["host"], "rank %s %s" % (suspect["rank"], suspect["reason"]))
    return faults


def _missing_rows(host, plan):
    """Rank rows for a node whose result never came back."""
    args = plan["args_by_host"][host]
    first = args["node_rank"] * args["nproc_per_node"]
    return [{"rank": first + local, "local_rank": local, "stage": "unknown", "status": "no_result",
             "host": host, "error": None} for local in range(args["nproc_per_node"])]


def node_fabrics(nic_facts):
    """The fabric kinds a node can use, from its ``nic_discovery`` facts (None: not read)."""
    if not isinstance(nic_facts, dict):
        return None
    return sorted(usable_fabrics(nic_facts.get("nics") or {}, nic_facts.get("rdma_devices") or {}))


def _log_texts(result):
    logs = result.get("rank_logs") or []
    if isinstance(logs, dict):
        logs = list(logs.values())
    return [result.get("log") or ""] + [entry.get("text") or "" for entry in logs if isinstance(entry, dict)]


def signature_check(host, result, fabric, backend, full):
    """``signatures``: the known failure signatures in ``host``'s torchrun log and rank logs.

    ``full``: the all-reduce failed or a rank of ``host`` did not finish: every
    signature is looked for; otherwise only the NCCL transport (``nccl``).  The
    status is the worst of the matched signatures.  Nothing matched: None on a
    healthy gloo run (nothing to report), ``not_applicable`` saying so otherwise.
    """
    texts = _log_texts(result)
    findings = match_signatures(texts, fabric=bool(fabric), categories=None if full else ("transport",))
    if fabric:
        fabric_text = "fabric %s" % ", ".join(fabric)
    else:
        fabric_text = "no fabric" if fabric is not None else "fabric not read"
    expected = "no known failure signature in %s's torchrun and rank logs%s" % (
        host, "; NCCL on the fabric where the node has one" if backend == "nccl" else "")
    if not findings:
        lines = sum(len(text.splitlines()) for text in texts)
        if full:
            return not_applicable("no known failure signature in the %d log lines of %s (%s); read %s.log and its "
                                  "rank logs in the run directory" % (lines, host, fabric_text, host), expected)
        if backend != "nccl":
            return None
        return not_applicable("NCCL printed no transport line in the %d log lines of %s (NCCL_DEBUG is not INFO, "
                              "or the line fell out of the log tail)" % (lines, host), expected)
    used = signature_transport(findings)
    status = worst(finding["status"] for finding in findings)
    found = "%s (%s)%s: %s" % (host, fabric_text, ", NCCL transport %s" % used if used else "", "; ".join(
        "%s: %s [%s%s]" % (finding["id"], finding["cause"], finding["line"],
                           " and %d more line(s)" % (finding["count"] - 1) if finding["count"] > 1 else "")
        for finding in findings))
    fixes = []
    for finding in findings:
        if finding["status"] in ("warn", "fail") and finding["fix"] not in fixes:
            fixes.append(finding["fix"])
    return check(status, found, expected, " | ".join(fixes), findings=findings, transport=used, fabric=fabric)


# Signatures of a node that could not reach the rendezvous store (cluster_preflight/signatures.py).
STORE_UNREACHED = ("store_connect_timeout", "connection_timed_out", "connection_refused", "no_route_to_host",
                   "network_unreachable")
RENDEZVOUS_EXPECTED = "every node's torchrun reaches the rendezvous store on the master and starts its ranks"


def rendezvous_fault(plan, rows, signatures, lost, mesh_reached=None):
    """When no rank started anywhere and the logs say the rendezvous store was out of reach: whose fault.

    ``signatures``: host -> its ``signatures`` check (``details.findings``).  Every node, the master
    included, failed to reach the store: the master's port is at fault (closed after the port mesh,
    taken by another program, or never served).  Only some nodes, not the master: those nodes (outbound
    firewall or routing).  Returns ``None`` when this is not a rendezvous fault or cannot be told, else
    ``{hosts, checks}`` with a ``rendezvous`` check per blamed host."""
    if lost or not rows or any(row.get("status") != "missing" or row.get("stage") != "not started" for row in rows):
        return None
    hosts, master = list(plan.get("hosts") or []), plan.get("master")
    addr, port = plan.get("master_addr"), plan.get("master_port")
    unreached = [host for host in hosts if any(
        finding.get("id") in STORE_UNREACHED
        for finding in ((signatures.get(host) or {}).get("details") or {}).get("findings") or [])]
    if not unreached or master not in hosts:
        return None
    endpoint = "%s:%s" % (addr, port)
    checks = {}
    if set(unreached) == set(hosts):
        mesh = ("; the port mesh reached %s on port %s before the launch, so the port was closed after that check "
                "(a firewall rule added during the run), another program took it, or %s's torchrun did not serve "
                "it" % (master, port, master)) if master in (mesh_reached or ()) else (
                    "; a firewall on %s drops the port, another program holds it, or %s's torchrun did not serve it"
                    % (master, master))
        found = ("%s hosts the rendezvous store at %s and no node reached it: %s timed out or failed connecting to "
                 "it, %s itself included, and no rank started%s" % (
                     master, endpoint, ", ".join(hosts), master, mesh))
        fix = ("on %s: look for a DROP or REJECT of TCP %s (iptables -S INPUT; nft list ruleset) and remove it, check "
               "that nothing else holds the port (ss -ltnp 'sport = :%s'), and read %s.log in the run directory for "
               "its torchrun's own error; then re-run the preflight" % (master, port, port, master))
        checks[master] = failed(found, RENDEZVOUS_EXPECTED, fix, endpoint=endpoint, unreached=unreached)
        return {"hosts": [master], "checks": checks}
    if master in unreached:
        return None
    reached = [host for host in hosts if host not in unreached]
    for host in unreached:
        checks[host] = failed(
            "%s could not reach the rendezvous store on %s at %s while %s did, and no rank started" % (
                host, master, endpoint, ", ".join(reached)), RENDEZVOUS_EXPECTED,
            "on %s: check outbound firewall rules and the route to %s (iptables -S OUTPUT; ip route get %s; "
            "nc -vz %s %s), then re-run the preflight" % (host, addr, addr, addr, port),
            endpoint=endpoint)
    return {"hosts": unreached, "checks": checks}


def summarize(plan, results_by_host, lost=None, nic_facts=None, mesh_reached=None):
    """The gate's outcome from every launched node's result.

    ``results_by_host``: host -> the ``allreduce`` module's result (``ranks``,
    ``checks``, ``log``, ``rank_logs``); a launched node missing from it gave no
    result.  ``lost``: ``{host: reason}`` of nodes that stopped answering after
    the launch.  ``nic_facts``: host -> its ``nic_discovery`` facts (whether it
    has a fabric, for the NCCL transport).  Returns ``(summary, checks_by_host)``.

    ``signatures`` (see :func:`signature_check`): on a failed all-reduce on
    every node with a result; on a passed one only the NCCL transport, so it is
    absent on a healthy gloo run.  A healthy peer's failed signatures in a
    failed run are collateral (``warn``, blocked) like its other checks.
    """
    lost = dict(lost or {})
    fabrics = {host: node_fabrics((nic_facts or {}).get(host)) for host in plan.get("hosts") or []}
    summary = {
        "launched": bool(plan.get("launch")), "world_size": plan.get("world_size"),
        "planned_world_size": plan.get("world_size"), "backend": plan.get("backend"),
        "hosts": list(plan.get("hosts") or []), "master": plan.get("master"),
        "master_addr": plan.get("master_addr"), "master_port": plan.get("master_port"),
        "socket_ifname": plan.get("socket_ifname"),
        "correct": None, "sizes": [], "versions": None, "ranks": [], "suspects": [],
    }
    checks_by_host = {}
    if not plan.get("launch"):
        summary["status"] = "skipped"
        summary["reason"] = plan.get("skip_reason") or "the all-reduce was not launched"
        return summary, checks_by_host
    rows = []
    for host in plan["hosts"]:
        result = results_by_host.get(host)
        if not isinstance(result, dict) or not isinstance(result.get("ranks"), list):
            lost.setdefault(host, "no result came back from %s" % host)
            rows.extend(_missing_rows(host, plan))
            continue
        for entry in result["ranks"]:
            row = dict(entry, host=host)
            row.pop("stack", None)
            rows.append(row)
        checks_by_host[host] = dict(result.get("checks") or {})
    rows.sort(key=lambda row: row["rank"])
    summary["ranks"] = rows
    reported = len([row for row in rows if row.get("status") != "no_result"])
    summary["world_size"] = reported
    complete = reported == plan["world_size"]
    ok = complete and all(row.get("status") == "ok" for row in rows)
    summary["correct"] = bool(rows) and all(row.get("correct") for row in rows)
    rank0 = next((row for row in rows if row["rank"] == 0), rows[0] if rows else {})
    summary["versions"] = rank0.get("versions")
    summary["sizes"] = rank0.get("bandwidth") or []
    summary["status"] = "pass" if ok and summary["correct"] else "fail"
    expected_world = "world size %d: %d node(s) x %d rank(s), as planned" % (
        plan["world_size"], len(plan["hosts"]), plan["nproc_per_node"])
    rows_by_host = {}
    for row in rows:
        rows_by_host.setdefault(row["host"], []).append(row)
    for host in plan["hosts"]:
        mine = rows_by_host.get(host, [])
        seen = len([row for row in mine if row.get("status") != "no_result"])
        world = "%d of the %d planned ranks reported (%s from %s)" % (reported, plan["world_size"], seen, host)
        checks_by_host.setdefault(host, {})["world_size"] = (
            passed(world, expected_world) if complete else
            (failed(world, expected_world, "a node's ranks never reported: see the suspects and %s.log" % host)
             if host in lost else
             warned(world, expected_world, "ranks of another node never reported (see the suspects); "
                                           "re-run the gate once it is fixed", blocked=True)))
    healthy = summary["status"] == "pass"
    signatures = {}
    for host in plan["hosts"]:
        result = results_by_host.get(host)
        if host in lost or not isinstance(result, dict):
            continue
        full = not healthy or any(row.get("status") != "ok" for row in rows_by_host.get(host, ()))
        found = signature_check(host, result, fabrics.get(host), plan.get("backend"), full)
        if found is not None:
            signatures[host] = checks_by_host[host]["signatures"] = found
    if healthy:
        return summary, checks_by_host
    rendezvous = rendezvous_fault(plan, rows, signatures, lost, mesh_reached)
    if rendezvous:
        summary["rendezvous"] = {"blamed": rendezvous["hosts"], "endpoint": "%s:%s" % (
            plan.get("master_addr"), plan.get("master_port"))}
        for host, found in rendezvous["checks"].items():
            checks_by_host.setdefault(host, {})["rendezvous"] = found
        suspects = [{"host": row["host"], "rank": row["rank"],
                     "reason": "never started: its node could not bring up the rendezvous (see allreduce.rendezvous)"}
                    for row in rows if row["host"] in rendezvous["hosts"]]
    else:
        suspects = find_suspects(rows, lost)
    summary["suspects"] = suspects
    blamed = {item["host"] for item in suspects}
    names = ", ".join("rank %d on %s (%s)" % (s["rank"], s["host"], s["reason"]) for s in suspects)
    for host in plan["hosts"]:
        if host in blamed:
            continue
        # A healthy peer's own failure was caused by the suspect: collateral, not blame.
        own = checks_by_host[host]
        for name in ("ranks", "correctness", "bandwidth"):
            if own.get(name, {}).get("status") == "fail":
                own[name] = warned(
                    "%s (collateral: %s)" % (own[name]["found"], names or "a peer failed"),
                    own[name]["expected"],
                    "fix the suspect node(s) and re-run; to confirm %s, run the gate with the suspect node(s) "
                    "taken out of the inventory group" % host, blocked=True)
        mine = signatures.get(host)
        if mine and mine["status"] == "fail":
            own["signatures"] = warned(
                "%s (collateral: %s)" % (mine["found"], names or "a peer failed"), mine["expected"],
                "%s; fix the suspect node(s) first: these lines are likely a consequence" % mine["fix"],
                blocked=True, **mine.get("details", {}))
    for item in suspects:
        host = item["host"]
        checks_by_host.setdefault(host, {})["suspect_rank_%d" % item["rank"]] = failed(
            "rank %d on %s %s" % (item["rank"], host, item["reason"]),
            "every rank completes the all-reduce with exact results",
            "drain %s; read %s.log and %s.stacks.txt in the run directory for its traceback or hang stack; "
            "re-run the gate with it taken out of the inventory group to confirm the rest" % (host, host, host))
    return summary, checks_by_host



# --------------------------------------------------------------------------
# Versions across nodes (controller)

VERSION_KEYS = ("torch", "nccl", "cuda", "hip", "python")
VERSIONS_EXPECTED = "the same torch, NCCL, CUDA, HIP and Python on every node of the job"
# NCCL 2.14.3 (pinned by pip torch 1.13-2.0.x) hangs with CUDA_LAUNCH_BLOCKING=1; fixed in 2.17.
NCCL_HANG_FIXED = (2, 17)


def node_versions(facts, ranks=()):
    """``{key: text}`` of one node: what its ranks ran (``versions``), else what its reader found.

    A key is absent when unknown (NCCL before a run, a node whose Python could
    not be asked); ``none`` when known to be absent (cuda of a CPU build).
    """
    known = {}
    facts = facts or {}
    if facts.get("python"):
        known["python"] = facts["python"].get("version")
    torch = facts.get("torch")
    if torch:
        for key, field in (("torch", "version"), ("cuda", "cuda"), ("hip", "hip")):
            known[key] = torch.get(field)
    seen = {}
    for row in ranks or ():
        versions = row.get("versions")
        if not isinstance(versions, dict):
            continue
        for key in VERSION_KEYS:
            if key in versions:
                seen.setdefault(key, set()).add("none" if versions[key] is None else str(versions[key]))
    for key, values in seen.items():
        # A node whose ranks disagree with each other shows both values and so differs from every peer.
        known[key] = "/".join(sorted(values))
    return {key: "none" if value is None else str(value) for key, value in known.items()}


def _release(text):
    match = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def known_hang(versions):
    """Why ``versions`` hang with CUDA_LAUNCH_BLOCKING=1 (NVIDIA/nccl issue 750), or None."""
    nccl = _release(versions.get("nccl"))
    if nccl and nccl < NCCL_HANG_FIXED:
        return "NCCL %s" % versions["nccl"]
    gpu = versions.get("cuda", "none") != "none" or versions.get("hip", "none") != "none"
    if gpu and "nccl" not in versions and torch_lt_2_1(versions.get("torch")):
        return "torch %s (pins NCCL 2.14.3)" % versions["torch"]
    return None


def _odd_hosts(values_by_host):
    """``(majority value or None, hosts that differ from it)``; no single majority: every host is odd."""
    counts = {}
    for value in values_by_host.values():
        counts[value] = counts.get(value, 0) + 1
    if len(counts) < 2:
        return next(iter(counts), None), []
    top = max(counts.values())
    leaders = [value for value, count in counts.items() if count == top]
    if len(leaders) > 1:
        return None, sorted(values_by_host)
    return leaders[0], sorted(host for host, value in values_by_host.items() if value != leaders[0])


def version_checks(hosts, facts_by_host, results_by_host=None, settings_by_host=None):
    """``{host: versions check}``: each node's versions against the other nodes'.

    ``hosts``: the nodes that were read; ``facts_by_host``: their allreduce
    reader facts (torch before any launch); ``results_by_host``: the launched
    nodes' ``allreduce`` results, whose ranks' ``versions`` win (what ran, and
    NCCL).  A value that differs from the majority fails on the odd node(s),
    naming the majority; without a single majority (two nodes that differ) every
    node fails.  A node matching the majority passes and names the odd ones.  A
    version that hangs with CUDA_LAUNCH_BLOCKING=1 warns (that it is set is the
    ``cuda_launch_blocking`` check's fail).
    """
    results_by_host = results_by_host or {}
    settings_by_host = settings_by_host or {}
    versions = {host: node_versions(facts_by_host.get(host), (results_by_host.get(host) or {}).get("ranks"))
                for host in hosts}
    drift = {}  # key -> (majority, odd hosts, values_by_host)
    for key in VERSION_KEYS:
        values = {host: known[key] for host, known in versions.items() if key in known}
        majority, odd = _odd_hosts(values)
        if odd:
            drift[key] = (majority, odd, values)
    checks = {}
    for host in hosts:
        mine = versions[host]
        if not mine:
            checks[host] = skipped("the versions on %s are unknown: its training Python could not be asked (see "
                                   "allreduce.python)" % host, VERSIONS_EXPECTED)
            continue
        have = ", ".join("%s %s" % (key, mine[key]) for key in VERSION_KEYS if key in mine)
        odd_keys = [key for key, (_m, odd, _v) in drift.items() if host in odd]
        if odd_keys:
            parts, wanted = [], []
            for key in odd_keys:
                majority, odd, values = drift[key]
                others = sorted(h for h in values if h != host)
                if majority is None:
                    parts.append("%s %s on %s, but %s (no majority)" % (key, mine[key], host, ", ".join(
                        "%s on %s" % (values[h], h) for h in others)))
                else:
                    agree = [h for h in values if values[h] == majority]
                    parts.append("%s %s on %s, but %s on %d other node(s) (%s)" % (
                        key, mine[key], host, majority, len(agree), ", ".join(sorted(agree))))
                    wanted.append("%s %s" % (key, majority))
            python = (facts_by_host.get(host) or {}).get("python_path") or "the training Python"
            if wanted:
                fix = ("bring %s in line with the other nodes (%s) in %s, e.g. pip install torch==<the others' "
                       "version>, or point preflight_training_python at the environment the other nodes use; "
                       "drain %s until then: mixed versions hang or fail collectives" % (
                           host, ", ".join(wanted), python, host))
            else:
                fix = ("choose one version and install it on every node (%s on %s): there is no majority to "
                       "tell which node is odd; mixed versions hang or fail collectives" % (python, host))
            checks[host] = failed("; ".join(parts), VERSIONS_EXPECTED, fix, odd=odd_keys, versions=mine)
            continue
        others = sorted({h for _m, odd, _v in drift.values() for h in odd})
        found = "%s on %s" % (have, host)
        found += ("; the same on all %d node(s)" % len(hosts) if not others else
                  "; as the majority; differs on %s (see their allreduce.versions)" % ", ".join(others))
        hang = known_hang(mine)
        if hang:
            blocking = (settings_by_host.get(host) or {}).get("allreduce_env") or {}
            checks[host] = warned(
                "%s; %s hangs with CUDA_LAUNCH_BLOCKING=1 (NVIDIA/nccl issue 750)%s" % (
                    found, hang, "; it is set: see allreduce.cuda_launch_blocking" if str(
                        blocking.get("CUDA_LAUNCH_BLOCKING", "")) == "1" or (facts_by_host.get(host) or {}).get(
                        "cuda_launch_blocking") == "1" else ""),
                "%s; NCCL >= 2.17 (torch >= 2.1)" % VERSIONS_EXPECTED,
                "upgrade torch to 2.1 or later on every node (NCCL >= 2.17), or never debug with "
                "CUDA_LAUNCH_BLOCKING=1 on these nodes", versions=mine)
        else:
            checks[host] = passed(found, VERSIONS_EXPECTED, versions=mine)
    return checks
