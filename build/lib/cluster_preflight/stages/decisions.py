# -*- coding: utf-8 -*-
"""Every cross-node decision of the preflight, as pure functions of what the nodes reported.

``preflight_decide`` (the action plugin) runs :func:`decide` once per stage on the controller over the
registered results in ``hostvars``.  Each stage reads them for every node the play targeted and returns
``{ok, blockers, checks_by_host, ...plan}``; ``checks_by_host`` maps a node to ``{capability: {name: check}}``.
A stage never fails the play: what blocks the gate is a blocker, what went wrong on a node is a check on
that node.
"""

from __future__ import annotations

import math
import traceback

from cluster_preflight import capabilities
from cluster_preflight.plays import stage_results
from cluster_preflight.capabilities.allreduce import candidates, launch_plan, readiness
from cluster_preflight.capabilities.allreduce.outcome import summarize
from cluster_preflight.capabilities.allreduce.versions import version_checks
from preflight_node.checks import CheckError, decision, error, put
from preflight_node.net.port_probe import retry_slack
from cluster_preflight.stages.view import ClusterView, without_gc
from cluster_preflight.engine import engine_of
from cluster_preflight.capabilities.port_mesh.peers import DEFAULT_DEGREE, DEFAULT_FULL_MESH_MAX, peers_by_host
from cluster_preflight.capabilities.allreduce import localize
from cluster_preflight.stages.run_lock import lock_args, renewal
from cluster_preflight.capabilities.allreduce import single_node
from cluster_preflight.capabilities import nic_discovery as preflight_nic_discovery
from cluster_preflight.capabilities import port_mesh as preflight_port_mesh
from cluster_preflight.capabilities import profile as preflight_profile
from cluster_preflight.capabilities.profile import known_good as profiles
from cluster_preflight.capabilities import ssh_trust as preflight_ssh_trust

STAGES = ("inputs", "plan", "launch", "final", "local")


def _guarded(checks_by_host, hosts, capability, function, *args, **kwargs):
    """Run a decider; one that raises gives ``<capability>.error`` on ``hosts`` instead."""
    try:
        return function(*args, **kwargs)
    except Exception as exc:  # pylint: disable=broad-except
        found = "the %s decision raised %s: %s" % (capability, type(exc).__name__, exc)
        for host in hosts:
            _put(checks_by_host, host, capability, {"error": error(
                capability, found, "a defect of the preflight: report it with %s" % traceback.format_exc()[-600:])})
        return None


def _put(checks_by_host, host, capability, checks):
    try:
        put(checks_by_host, host, capability, checks)
    except CheckError as exc:
        put(checks_by_host, host, capabilities.RUN_ROLE, {"contract_%s" % capability: error(
            capability, str(exc), "a defect of the preflight: report it with the verdict file")})


def stage_inputs(view):
    """Every node's settings must be valid before anything runs on any node.  Also this run's lock (the
    ``lock`` argument of the gate's node calls, ``module_utils/preflight_node/host/lock.py``)."""
    invalid = sorted(host for host in view.hosts if not view.field(host, stage_results.SETTINGS, "ok", copy=False))
    blockers = ["invalid settings on %s (see each node's <capability>.inputs check)" % ", ".join(invalid)] \
        if invalid else []
    # One engine for the run (preflight.yml includes its node stages; every node's setting agrees or it is invalid).
    run = (view.settings.get(view.hosts[0]) or {}).get(capabilities.RUN_ROLE) if view.hosts else None
    return decision(blockers=blockers, invalid_hosts=invalid, lock={} if invalid else lock_args(view),
                    engine=engine_of(run))


def stage_plan(view, probes=True):
    checks_by_host = {}
    hosts = view.read_hosts()
    for host in hosts:
        for name, problem in sorted(view.facts(host)[1].items()):
            _put(checks_by_host, host, name, {"error": error(
                name, "the %s reader raised on %s: %s" % (name, host, problem.get("found")),
                "read the traceback in the check's details and report it; the other capabilities still "
                "checked %s" % host, traceback=problem.get("traceback"))})
    run = (view.settings[hosts[0]].get(capabilities.RUN_ROLE) or {}) if hosts else {}
    pairing = peers_by_host(hosts, run.get("preflight_mesh_full_max", DEFAULT_FULL_MESH_MAX),
                            run.get("preflight_mesh_degree", DEFAULT_DEGREE))
    result = {"hosts": hosts, "lost": view.lost(["facts"])}
    if any("ssh_trust" in view.settings[host] for host in hosts):
        trust = _guarded(checks_by_host, hosts, "ssh_trust", preflight_ssh_trust.plan, {
            "hosts": hosts, "all_hosts": view.all_hosts, "nodes": view.nodes,
            "facts": view.capability_facts("ssh_trust", hosts),
            "settings": view.capability_settings("ssh_trust", hosts), "probes": {}, "lost": result["lost"]})
        result["ssh_trust"] = trust or {}
    if probes:
        result["probe_args_by_host"] = _probe_args(view, hosts, checks_by_host, pairing)
    if not any("nic_discovery" in view.settings[host] for host in view.hosts):
        return decision(checks_by_host=checks_by_host, **result)
    nic_hosts = [host for host in hosts if view.facts(host)[0].get("nic_discovery") is not None]
    nic = _guarded(checks_by_host, nic_hosts, "nic_discovery", preflight_nic_discovery.plan, nic_hosts,
                   view.capability_facts("nic_discovery", nic_hosts),
                   view.capability_settings("nic_discovery", nic_hosts), view.nodes) or {
        "ok": False, "blockers": ["the interface choice failed (see nic_discovery.error)"], "checks_by_host": {},
        "addr_by_host": {}}
    for host, checks in nic.pop("checks_by_host").items():
        _put(checks_by_host, host, "nic_discovery", checks)
    torch_hosts = [host for host in hosts if view.facts(host)[0].get("allreduce") is not None]
    ready = _guarded(checks_by_host, torch_hosts, "allreduce", candidates, torch_hosts,
                     view.capability_facts("allreduce", torch_hosts),
                     view.capability_settings("allreduce", torch_hosts)) or {"checks_by_host": {}, "ready": []}
    for host, checks in ready["checks_by_host"].items():
        _put(checks_by_host, host, "allreduce", checks)
    lock = (view.result(view.hosts[0], stage_results.INPUTS) or {}).get("lock") or {}
    run_id = lock.get("run_id") or ""
    single = _guarded(checks_by_host, ready["ready"], "allreduce", single_node.plan, ready["ready"],
                      view.capability_facts("allreduce", ready["ready"]),
                      view.capability_settings("allreduce", ready["ready"]), run_id) or {"args_by_host": {},
                                                                                         "floors": {}}
    mesh = _guarded(checks_by_host, hosts, "port_mesh", preflight_port_mesh.plan, hosts, nic,
                    view.capability_settings("port_mesh", hosts), view.forks, pairing) or {
        "ok": False, "blockers": ["the port mesh plan failed (see port_mesh.error)"], "checks_by_host": {},
        "run": False, "hosts": [], "args_by_host": {}, "async_seconds": 0, "wait_timeout": 0}
    for host, checks in mesh.pop("checks_by_host").items():
        _put(checks_by_host, host, "port_mesh", checks)
    if mesh.get("run") and run.get("preflight_retest_port_mesh", True):
        mesh = mesh_with_retry(mesh)
    # Each node call renews the run lock for its own bound (module_utils/preflight_node/host/lock.py).
    for args in (mesh.get("args_by_host") or {}).values():
        args["lock"] = renewal(lock, mesh.get("wait_timeout") or 60)
    for args in (single.get("args_by_host") or {}).values():
        args["lock"] = renewal(lock, args.get("wait_timeout") or 300)
    blockers = list(nic.get("blockers") or [])
    return decision(blockers=blockers, checks_by_host=checks_by_host, nic=nic, port_mesh=mesh,
                    ready=ready["ready"], single=single, **result)


# capability -> {probe argument: the run-wide setting that switches its retry on}.
RETEST_PROBES = {"ssh_trust": {"retry_timeouts": "preflight_retest_ssh"}}


def mesh_with_retry(mesh):
    """The port mesh plan with every probe's ``retry`` on (a pair not connected within the window is tried once
    more before blame), its wait bound extended by the retry's pause and one more connect attempt."""
    mesh = dict(mesh, args_by_host={host: dict(args, retry=True) for host, args in mesh["args_by_host"].items()})
    slack = max([retry_slack(args["connect_timeout"]) for args in mesh["args_by_host"].values()] or [0])
    mesh["wait_timeout"] = int(mesh["wait_timeout"] + math.ceil(slack))
    if mesh.get("async_seconds"):
        mesh["async_seconds"] = mesh["wait_timeout"]
    return mesh


def _probe_args(view, hosts, checks_by_host, pairing):
    """Node -> capability -> the arguments of its probe (peers: ``pairing`` over the nodes that were read)."""
    nodes = {host: view.nodes[host] for host in hosts}
    plans = {}
    probe_args = {}
    for host in hosts:
        probe_args[host] = {}
        for name in view.settings[host]:
            module = capabilities.BY_NAME.get(name)
            if module is None or not hasattr(module, "probe_args") or name in view.facts(host)[1]:
                continue
            # One view per capability, shared by every node (the peers' settings, e.g. their ssh port).
            if name not in plans:
                plans[name] = {"hosts": hosts, "nodes": nodes, "peers": pairing,
                               "settings": view.capability_settings(name, hosts)}
            args = _guarded(checks_by_host, [host], name, module.probe_args, view.settings[host][name],
                            view.nodes[host], plans[name])
            if args is not None:
                if name in RETEST_PROBES:
                    # Retest before blame: a run-wide setting (roles/preflight) the probe reads as its own.
                    run = view.settings[host].get(capabilities.RUN_ROLE) or {}
                    args = dict(args, **{key: bool(run.get(setting, True))
                                         for key, setting in RETEST_PROBES[name].items()})
                probe_args[host][name] = args
    return probe_args


def _mesh_results(view, host):
    """A node's port_probe result, from the foreground task or the background job's wait."""
    for register in (stage_results.PORT_MESH_WAIT, stage_results.PORT_MESH_PROBE):
        state, _message = view.outcome(host, register)
        result = view.read(host, register)
        if state == "ok" and isinstance(result, dict) and "results" in result:
            return result
    return None


def stage_launch(view):
    plan = view.read(view.hosts[0], stage_results.PLAN) if view.hosts else None
    plan = plan or {"hosts": [], "nic": {}, "port_mesh": {"run": False}, "ready": [], "blockers": []}
    checks_by_host = {}
    lost = view.lost(["facts", "port_mesh", "port_mesh_wait", "single"])
    mesh_hosts = plan["port_mesh"].get("hosts") or []
    probes = {host: _mesh_results(view, host) for host in mesh_hosts if host not in lost}
    for host in mesh_hosts:
        if host not in lost and probes.get(host) is None and plan["port_mesh"].get("run"):
            lost[host] = "the port mesh probe gave no result"
    report = _guarded(checks_by_host, mesh_hosts, "port_mesh", preflight_port_mesh.report, plan["port_mesh"],
                      probes, lost) or {"ok": False, "blockers": ["the port mesh report failed (see port_mesh.error)"],
                                        "checks_by_host": {}, "suspect_nodes": []}
    for host, checks in report["checks_by_host"].items():
        _put(checks_by_host, host, "port_mesh", checks)
    excluded = dict(lost)
    for host in report.get("suspect_nodes") or []:
        excluded.setdefault(host, "the port mesh blames it (see port_mesh.reach)")
    singles = _single_outcomes(view, plan.get("single") or {}, checks_by_host, excluded)
    gate_hosts = [host for host in plan["hosts"]]
    blockers = list(plan.get("blockers") or []) + list(report.get("blockers") or [])
    gate = _guarded(
        checks_by_host, gate_hosts, "allreduce", launch_plan, gate_hosts, plan.get("ready") or [],
        {host: reason for host, reason in excluded.items() if host in gate_hosts},
        view.capability_facts("allreduce", gate_hosts), view.capability_settings("allreduce", gate_hosts),
        view.nodes, plan.get("nic") or {}, blockers) or {"launch": False, "hosts": [], "args_by_host": {},
                                                         "skip_reason": "the launch plan failed", "checks_by_host": {}}
    for host, checks in gate.pop("checks_by_host").items():
        _put(checks_by_host, host, "allreduce", checks)
    lock = (view.result(view.hosts[0], stage_results.INPUTS) or {}).get("lock") or {}
    for args in (gate.get("args_by_host") or {}).values():
        # The launch and every localisation launch copied from it renew the lock for the run's bound.
        args.update(run_id=lock.get("run_id") or "", lock=renewal(lock, args.get("wait_timeout") or 300))
    reachable = [host for host in plan["hosts"] if host not in lost]
    run = (view.settings.get(view.hosts[0]) or {}).get(capabilities.RUN_ROLE) or {} if view.hosts else {}
    waits = [args.get("wait_timeout") or 0 for args in (gate.get("args_by_host") or {}).values()]
    probes_lock = renewal(lock, float(run.get("preflight_probes_timeout") or 120) + max(waits or [0]))
    return decision(ok=gate.get("launch", False), blockers=gate.get("blockers") or [],
                    checks_by_host=checks_by_host, gate=gate, port_mesh=report, reachable=reachable, lost=lost,
                    single=singles, probes_lock=probes_lock,
                    release_with_probes=not _may_localise(view, gate))


def _may_localise(view, gate):
    """Whether node calls may follow the probes call (localisation rounds, the confirmation run): the run lock
    is then released by a task of its own at the end, else by the probes call."""
    hosts = gate.get("hosts") or []
    settings = view.capability_settings("allreduce", hosts[:1]).get(hosts[0]) if hosts else {}
    return bool(gate.get("launch")) and len(hosts) >= 2 and bool(settings.get("allreduce_localize", True))


def stage_final(view):
    first = view.hosts[0] if view.hosts else None
    plan = (view.read(first, stage_results.PLAN) if first else None) or {"hosts": [], "probe_args_by_host": {}}
    launch = (view.read(first, stage_results.LAUNCH) if first else None) or {"gate": {"launch": False},
                                                                            "reachable": []}
    checks_by_host = {}
    hosts = plan.get("hosts") or []
    lost = view.lost(stage_results.STAGE_ORDER)
    probes = {}
    for host in hosts:
        probe_args = (plan.get("probe_args_by_host") or {}).get(host) or {}
        state, message = view.outcome(host, stage_results.PROBES)
        result = view.read(host, stage_results.PROBES) if state == "ok" else None
        probes[host] = (result or {}).get("probes") or {}
        for name in probe_args:
            if result is None:
                _put(checks_by_host, host, name, {"no_result": error(
                    name, "the %s probe gave no result on %s: %s" % (
                        name, host, lost.get(host) or "%s (%s)" % (state, message[:300])),
                    "bring the node back (see preflight.reachable) and re-run the preflight")})
            elif name in result.get("errors", {}):
                problem = result["errors"][name]
                _put(checks_by_host, host, name, {"probe_error": error(
                    name, "the %s probe raised on %s: %s" % (name, host, problem.get("found")),
                    "read the traceback in the check's details and report it",
                    traceback=problem.get("traceback"))})
    for name in capabilities.NAMES:
        module = capabilities.BY_NAME[name]
        if not hasattr(module, "decide"):
            continue
        # Only nodes whose facts came back: a capability absent from them was switched off there.
        read = view.read_hosts()
        deciding = [host for host in read if name in view.settings[host] and name not in view.facts(host)[1]]
        cluster = {"hosts": read, "all_hosts": view.all_hosts, "nodes": view.nodes,
                   "facts": view.capability_facts(name, read), "settings": view.capability_settings(name, read),
                   "probes": {host: probes.get(host, {}).get(name) for host in read}, "lost": lost}
        for host in deciding:
            checks = _guarded(checks_by_host, [host], name, module.decide, host, cluster["facts"][host],
                              cluster["settings"][host], probe=cluster["probes"][host], cluster=cluster)
            if checks is not None:
                _put(checks_by_host, host, name, checks)
    gate = launch.get("gate") or {"launch": False}
    # Lost before or while the all-node run was collected (a node lost in the confirmation run is not lost there).
    first_lost = view.lost(stage_results.STAGE_ORDER[:stage_results.STAGE_ORDER.index("probes") + 1])
    results, gate_lost = {}, {}
    for host in gate.get("hosts") or []:
        if host in first_lost:
            gate_lost[host] = first_lost[host]
            continue
        job = (view.read(host, stage_results.PROBES) or {}).get("job")
        if isinstance(job, dict) and job.get("failed"):
            gate_lost[host] = "the all-reduce failed on %s: %s" % (host, str(job.get("msg"))[:300])
        elif isinstance(job, dict) and isinstance(job.get("ranks"), list):
            results[host] = job
        elif isinstance(job, dict) and (job.get("checks") or {}).get("no_result"):
            gate_lost[host] = job["checks"]["no_result"]["found"]
    mesh_reached = {host for host, checks in ((launch.get("port_mesh") or {}).get("checks_by_host") or {}).items()
                    if (checks.get("reach") or {}).get("status") == "pass"}
    nic_facts = view.capability_facts("nic_discovery", gate.get("hosts") or [])
    summary, gate_checks = summarize(gate, results, gate_lost, nic_facts=nic_facts, mesh_reached=mesh_reached)
    logs = {host: _logs(result) for host, result in results.items()}
    gate_checks = _reconciled(view, first, summary, gate_checks, nic_facts, logs, mesh_reached)
    for host, checks in gate_checks.items():
        _put(checks_by_host, host, "allreduce", checks)
    # Versions across every node that was read (reader facts, then what the ranks ran): needs all nodes.
    torch_hosts = [host for host in view.read_hosts() if view.facts(host)[0].get("allreduce") is not None]
    versions = _guarded(checks_by_host, torch_hosts, "allreduce", version_checks, torch_hosts,
                        view.capability_facts("allreduce", torch_hosts), results,
                        view.capability_settings("allreduce", torch_hosts)) or {}
    for host, check in versions.items():
        _put(checks_by_host, host, "allreduce", {"versions": check})
    summary["single_node"] = launch.get("single") or {}
    for host in (plan.get("single") or {}).get("args_by_host") or {}:
        result = _single_result(view, host)
        if isinstance(result, dict):
            logs["%s.single" % host] = _logs(result)
    profile_hosts = [host for host in view.read_hosts() if "profile" in view.settings[host]]
    compared = _guarded(checks_by_host, profile_hosts, "profile", _profile_checks, view, profile_hosts, summary,
                        checks_by_host, (launch.get("checks_by_host") or {})) or {}
    for host, checks in compared.items():
        _put(checks_by_host, host, "profile", checks)
    return decision(checks_by_host=checks_by_host, allreduce=summary, lost=lost, logs=logs)


def _single_outcomes(view, single, checks_by_host, excluded):
    """The single-node runs of the plan judged (``allreduce.single_node``); a node that failed alone joins
    ``excluded`` (the all-node run goes on without it).  Returns ``{host: summary}``."""
    hosts = list(single.get("args_by_host") or {})
    judged = _guarded(checks_by_host, hosts, "allreduce", single_node.judge_all, single,
                      {host: _single_result(view, host) for host in hosts})
    if not judged:
        return {}
    for host, checks in judged[0].items():
        _put(checks_by_host, host, "allreduce", checks)
    for host, reason in judged[2].items():
        excluded.setdefault(host, reason)
    return judged[1]


def _single_result(view, host):
    """``host``'s single-node run result, or why there is none (text)."""
    state, message = view.outcome(host, stage_results.SINGLE)
    return view.result(host, stage_results.SINGLE) if state == "ok" else "%s: %s" % (state, message[:300])


def _profile_checks(view, hosts, summary, checks_by_host, launch_checks):
    """Every node's ``profile`` checks: its fields (GPU and fabric facts, versions, the runs' busbw and transport)
    against its group's known-good profile or the majority (``cluster_preflight/capabilities/profile/``); a field
    not measured is blocked by the node's failures of this stage and of the launch's (a blocked port)."""
    rows = {}
    for row in summary.get("ranks") or []:
        rows.setdefault(row.get("host"), []).append(row)
    fields_by_host = profiles.run_fields_by_host(summary, hosts)
    # Every capability whose facts feed a profile has ``profile_fields(facts)``.
    feeding = [(name, module.profile_fields) for name, module in capabilities.BY_NAME.items()
               if hasattr(module, "profile_fields")]
    for host in hosts:
        facts = view.facts(host)[0] or {}
        sources = {name: (function, facts.get(name)) for name, function in feeding}
        signatures = ((checks_by_host.get(host) or {}).get("allreduce") or {}).get("signatures")
        fields_by_host[host].update(profiles.node_fields(host, sources, facts.get("allreduce"), rows.get(host),
                                                         signatures, (summary.get("single_node") or {}).get(host)))
    failures = {host: preflight_profile.failures_of(launch_checks.get(host)) + preflight_profile.failures_of(
        checks_by_host.get(host)) for host in hosts}
    return preflight_profile.decide_all(hosts, fields_by_host, view.capability_settings("profile", hosts),
                                        {host: list(dict.fromkeys(names)) for host, names in failures.items()})


def _logs(result):
    return {"log": result.get("log"), "ranks": result.get("ranks") or [], "rank_logs": result.get("rank_logs") or {}}


CONFIRM_REGISTER = stage_results.CONFIRM


def _reconciled(view, first, summary, gate_checks, nic_facts, logs, mesh_reached):
    """The all-node run's checks once localisation concluded and the nodes left were confirmed
    (``preflight_localize.reconcile``); the confirmation run's summary goes into ``summary["confirm"]`` and its
    logs into ``logs`` as ``<node>.confirm``.  Unchanged when nothing was localised."""
    localized = (view.result(first, stage_results.LOCALIZE) or {}) if first else {}
    conclusion, plan = localized.get("localize") or {}, localized.get("confirm_plan")
    confirm = conclusion.get("confirm") or {}
    if not plan or confirm.get("status") in (None, "planned", "skipped"):
        return gate_checks
    results, lost = {}, {}
    for host in plan["hosts"]:
        state, message = view.outcome(host, CONFIRM_REGISTER)
        result = view.result(host, CONFIRM_REGISTER) if state == "ok" else None
        if isinstance(result, dict) and isinstance(result.get("ranks"), list):
            results[host] = result
            logs["%s.confirm" % host] = _logs(result)
        else:
            lost[host] = "%s while running the confirmation all-reduce: %s" % (state, (message or "no ranks")[:300])
    confirmed, confirm_checks = summarize(plan, results, lost, nic_facts=nic_facts, mesh_reached=mesh_reached)
    summary["confirm"] = dict({key: confirmed.get(key) for key in (
        "hosts", "world_size", "planned_world_size", "master", "master_addr", "master_port", "sizes", "suspects",
        "correct")}, status=confirm["status"], reason=confirm.get("reason"), busbw_gbps=confirm.get("busbw_gbps"))
    return localize.reconcile(gate_checks, conclusion, confirm_checks)


def stage_local(view):
    """Node-local checks only (healthcheck.yml): every node judged on its own facts and probes."""
    checks_by_host = {}
    for host in view.read_hosts():
        facts, errors = view.facts(host)
        result = view.result(host, stage_results.FACTS) or {}
        probes, probe_errors = result.get("probes") or {}, result.get("probe_errors") or {}
        settings = view.settings[host]
        for name, problem in sorted(errors.items()):
            _put(checks_by_host, host, name, {"error": error(
                name, "the %s reader raised on %s: %s" % (name, host, problem.get("found")),
                "read the traceback in the check's details and report it", traceback=problem.get("traceback"))})
        for name, problem in sorted(probe_errors.items()):
            _put(checks_by_host, host, name, {"probe_error": error(
                name, "the %s probe raised on %s: %s" % (name, host, problem.get("found")),
                "read the traceback in the check's details and report it", traceback=problem.get("traceback"))})
        alone = {"hosts": [host], "all_hosts": [host], "nodes": {host: view.nodes[host]}, "lost": {}}
        for name in capabilities.LOCAL_NAMES:
            if name not in settings or name in errors:
                continue
            module = capabilities.BY_NAME[name]
            if name == "nic_discovery":
                nic = _guarded(checks_by_host, [host], name, preflight_nic_discovery.plan, [host],
                               {host: facts.get(name)}, {host: settings[name]}, alone["nodes"])
                checks = (nic or {}).get("checks_by_host", {}).get(host)
            elif name == "allreduce":
                ready = _guarded(checks_by_host, [host], name, readiness, host, facts.get(name) or {}, settings[name])
                checks = ready[0] if ready else None
            else:
                cluster = dict(alone, facts={host: facts.get(name)}, settings={host: settings[name]},
                               probes={host: probes.get(name)})
                checks = _guarded(checks_by_host, [host], name, module.decide, host, facts.get(name), settings[name],
                                  probe=probes.get(name), cluster=cluster)
            if checks is not None:
                _put(checks_by_host, host, name, checks)
    return decision(checks_by_host=checks_by_host)


def decide(stage, task_vars, probes=True):
    """The decision of ``stage`` over what the nodes registered (``task_vars``' hostvars)."""
    try:
        with without_gc():
            view = ClusterView(task_vars)
            if stage == "plan":
                return stage_plan(view, probes=probes)
            return {"inputs": stage_inputs, "launch": stage_launch, "final": stage_final,
                "local": stage_local}[stage](view)
    except Exception as exc:  # pylint: disable=broad-except
        # A defect here must not cost the verdict: every node gets the error, the run goes on to it.
        found = "the %s decision raised %s: %s" % (stage, type(exc).__name__, exc)
        return decision(blockers=[found], checks_by_host={host: {capabilities.RUN_ROLE: {
            "decide_%s" % stage: error(capabilities.RUN_ROLE, found, "a defect of the preflight: report it with the "
                                       "verdict file", traceback=traceback.format_exc()[-2000:])}}
            for host in task_vars.get("ansible_play_hosts_all") or []})
