#!/usr/bin/env python3
"""Controller cost at scale: the decisions and the verdict over synthetic clusters, no SSH.

Builds what 1,000 to 10,000 nodes would have registered (every capability's facts, probe results,
port mesh results, all-reduce ranks), runs the controller's steps as the play does and prints the
seconds of each: ``preflight_decide`` inputs, plan, launch and final; the localisation's start
(``localize``: the all-node run passed, nothing to localise); the verdict task (``verdict``: the
verdict built; ``outputs``: the run directory with verdict.json, JUnit, Prometheus and the host
lists; ``report``: the run history and report.html); and what the summary callback prints from the
verdict file (``summary``).  The last column is the linearity: the time per node at each size over
the time per node at ``--reference`` nodes (run first when not among the sizes).  Targets: <= 10 s
for 10,000 nodes from inputs to verdict, linear (the ratio near 1).  ``--clock cpu`` times this process's CPU
seconds instead of wall seconds (a shared machine).  Use the project's venv:
    .venv/bin/python bench/controller_scale.py [--sizes 4000,10000] [--reference 1000] [--clock cpu]
"""

import argparse
import base64
import copy
import hashlib
import importlib.util
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "tests", "unit", "fixtures", "nic"))

import conftest  # noqa: E402,F401  pylint: disable=wrong-import-position,unused-import (the node layer under both names)
from cluster_preflight import capabilities  # noqa: E402
from cluster_preflight.plays import stage_results  # noqa: E402
from cluster_preflight.outputs import finish  # noqa: E402
from cluster_preflight.stages import decisions, localization  # noqa: E402
from preflight_node import probes as node_probes  # noqa: E402
from preflight_node import readers as node_halves  # noqa: E402
from cluster_preflight.capabilities.port_mesh.peers import peers_by_host  # noqa: E402
from cluster_preflight.stages.view import ClusterView, without_gc  # noqa: E402
from cluster_preflight.verdict.accounting import build_verdict, failure_lines, write_run_dir  # noqa: E402
from cluster_preflight.outputs.formats import launch_names, write_outputs  # noqa: E402
from cluster_preflight.verdict.printable import printable_verdict  # noqa: E402
from cluster_preflight.outputs.report import after_verdict  # noqa: E402
from cluster_preflight.verdict.file import load  # noqa: E402
from capability_helpers import role_settings  # noqa: E402
from fake_ops import LocalOps  # noqa: E402
from fake_sysfs import cluster_node  # noqa: E402


def plugin(directory, name):
    """A callback plugin's module, loaded from its file as Ansible does."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, directory, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


summary_plugin = plugin("callback_plugins", "preflight_summary")


def settings_of_every_capability():
    settings = {name: role_settings(name) for name in (capabilities.RUN_ROLE,) + capabilities.NAMES}
    settings["nic_discovery"]["nic_discovery_override"] = ""
    settings["port_mesh"]["port_mesh_port"] = 6000
    settings["allreduce"].update(allreduce_python=sys.executable, allreduce_master_port=6000,
                                 allreduce_nproc_per_node=1)
    settings["core_dumps"]["core_dumps_dir"] = "/tmp"
    settings["ssh_trust"]["ssh_trust_login_policy"] = "warn"
    for name in ("preflight_master_port", "preflight_nproc_per_node"):
        settings[capabilities.RUN_ROLE][name] = 6000 if name.endswith("port") else 1
    return settings


def template_facts(workdir, settings):
    """One node's facts, read once: this machine's for the node-local capabilities, a fake
    fabric node's for the NICs; the nodes below differ by addresses and host keys."""
    node = {"name": "n0", "ansible_host": "198.18.0.1", "node_addr": "198.18.0.1", "user": "root", "ssh_port": 22}
    facts = {}
    for name in ("kernel_debug", "core_dumps", "iommu", "debug_tools", "ssh_trust", "job_env"):
        args = capabilities.get(name).read_args(settings[name], node)
        if args is not None:
            facts[name] = node_halves.get(name).read(args, LocalOps())
    tree = cluster_node(os.path.join(workdir, "nic"), index=1)
    facts["nic_discovery"] = node_halves.get("nic_discovery").read(
        {"sysfs_root": tree.sys, "proc_root": tree.proc, "addr_source": "proc", "ip_json_file": None}, LocalOps())
    facts["allreduce"] = {
        "python_path": sys.executable, "python": {"version": "3.11.7", "executable": sys.executable},
        "torch": {"version": "2.13.0", "cuda": None, "hip": None, "path": "/venv/torch"}, "probe_error": None,
        "accelerators": {"nvidia": 0, "amd": 0}, "cuda_launch_blocking": None,
        "port": {"free": True, "detail": "port 6000 can be bound on 0.0.0.0", "holder": None},
        "hostname": "n0", "backend": "gloo", "nproc_per_node": 1, "gpus": [], "gpus_error": None,
        # Who the ranks run as (preflight_node.resolve_job_user): a named unprivileged job user, as the
        # README's example inventory sets with preflight_job_user; readiness fails a node without it.
        "job_user": {"name": "trainer", "uid": 1000, "run_as": "trainer", "how": "named", "note": "",
                     "python": sys.executable}}
    return facts


def fake_key(seed):
    blob = b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + hashlib.sha256(seed.encode()).digest()
    text = "ssh-ed25519 " + base64.b64encode(blob).decode()
    fingerprint = "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return {"type": "ssh-ed25519", "public_key": text, "fingerprint": fingerprint, "path": "/etc/ssh/k.pub"}


def addr(index, net):
    return "%s.%d.%d" % (net, index // 250, index % 250 + 1)


def node_facts(template, host, index):
    facts = dict(template)
    nics = copy.deepcopy(template["nic_discovery"])
    for name, nic in nics["nics"].items():
        if nic.get("ipv4") and name != "lo":
            net = "198.19" if name.startswith("ib") else "198.18"
            nic["ipv4"] = ["%s/16" % addr(index, net)]
    facts["nic_discovery"] = nics
    trust = dict(template["ssh_trust"], hostname=host, fqdn=host, short_name=host, keys=[fake_key(host)], problems=[])
    facts["ssh_trust"] = trust
    facts["allreduce"] = dict(template["allreduce"], hostname=host)
    # The job's context: each node resolves its own name and the master's to their addresses.
    resolved = {"how": "getent ahosts", "error": None, "kind": None}
    facts["job_env"] = dict(template["job_env"], hostname=host, master_name="n0000", names={
        host: dict(resolved, name=host, addresses=[addr(index, "198.18")]),
        "n0000": dict(resolved, name="n0000", addresses=[addr(0, "198.18")])})
    return facts


def build_cluster(count, settings, template, core_probe):
    hosts = ["n%04d" % index for index in range(count)]
    hostvars = {}
    for index, host in enumerate(hosts):
        node = {"name": host, "ansible_host": addr(index, "198.18"), "node_addr": addr(index, "198.18"),
                "user": "root", "ssh_port": 22}
        hostvars[host] = {"preflight_settings": {"ok": True, "errors": [], "settings": settings, "node": node,
                                                 "capabilities": list(capabilities.NAMES)},
                          "preflight_facts": {"facts": node_facts(template, host, index), "errors": {}}}
    task_vars = {"ansible_play_hosts_all": hosts, "groups": {"cluster": hosts}, "ansible_forks": 64,
                 "hostvars": hostvars}
    return hosts, hostvars, task_vars, core_probe


STAGES = ("inputs", "plan", "launch", "final", "localize", "verdict", "outputs", "report", "summary")
# The steps the target is about: the decisions and the verdict.
TARGET = STAGES[:STAGES.index("verdict") + 1]
# What the steps are timed with: wall seconds, or this process's CPU seconds (--clock cpu: the same work, less
# of what other processes on a shared machine take from it).
CLOCK = [time.perf_counter]


def run_size(count, settings, template, core_probe, workdir):
    """Seconds per step of one synthetic cluster of ``count`` nodes, as the play runs them."""
    hosts, hostvars, task_vars, core_probe = build_cluster(count, settings, template, core_probe)
    times = {}

    def stage(name, register):
        started = CLOCK[0]()
        result = decisions.decide(name, task_vars)
        times[name] = CLOCK[0]() - started
        for host in hosts:
            hostvars[host][register] = result
        return result

    stage("inputs", "preflight_inputs")
    plan = stage("plan", "preflight_plan")
    assert plan["ok"], plan["blockers"]
    register_mesh(hosts, hostvars, plan)
    launch = stage("launch", "preflight_launch")
    assert launch["ok"], launch["blockers"]
    register_probes(hosts, hostvars, settings, core_probe)
    final = stage("final", "preflight_final")
    assert final["allreduce"]["status"] == "pass", final["allreduce"]
    started = CLOCK[0]()
    with without_gc():  # as the localisation action runs it: the all-node run passed, nothing to localise
        localized = localization.start(ClusterView(task_vars))
    times["localize"] = CLOCK[0]() - started
    assert not localized["needed"], localized
    for host in hosts:
        hostvars[host]["allreduce_localize"] = localized
    verdict = verdict_of(hosts, task_vars, workdir, count, times)
    return times, verdict


def register_mesh(hosts, hostvars, plan):
    """Every node's port mesh result: every planned peer open."""
    for host in hosts:
        args = plan["port_mesh"]["args_by_host"].get(host)
        rows = [{"source": host, "destination": peer["name"], "addr": peer["addr"], "port": 6000, "result": "open",
                 "detail": "open"} for peer in (args or {}).get("peers", [])]
        hostvars[host]["port_mesh_probe"] = {"results": rows, "checks": {"port_listen": {
            "status": "pass", "found": "listening", "expected": "listening", "fix": ""}}}


def register_probes(hosts, hostvars, settings, core_probe):
    """Every node's probes call: the core crash, the ssh mesh to its planned peers, its rank of the all-reduce."""
    pairing = peers_by_host(hosts, settings[capabilities.RUN_ROLE]["preflight_mesh_full_max"],
                            settings[capabilities.RUN_ROLE]["preflight_mesh_degree"])
    for index, host in enumerate(hosts):
        peers = [{"node": peer} for peer in pairing[host]]
        ssh = {"source": host, "ssh": "/usr/bin/ssh", "connect": True, "problem": "", "peers": peers,
               "results": [{"source": host, "destination": peer["node"], "target": peer["node"], "status": "ok",
                            "rc": 0, "stderr": ""} for peer in peers],
               "client_config": {peer["node"]: {"stricthostkeychecking": "true",
                                                "globalknownhostsfile": ["/etc/ssh/ssh_known_hosts"],
                                                "userknownhostsfile": [], "identityfile": []} for peer in peers},
               "pdsh": {"state": "off"}}
        job = {"ranks": [{"rank": index, "local_rank": 0, "status": "ok", "stage": "done", "correct": True,
                          "bandwidth": [{"size_bytes": 4194304, "busbw_gbps": 1.5, "algbw_gbps": 0.75,
                                         "time_us": 5000.0}], "error": None}],
               "checks": {"ranks": {"status": "pass", "found": "ok", "expected": "ok", "fix": ""}}, "log": ""}
        hostvars[host]["preflight_probes"] = {"probes": {"core_dumps": core_probe, "ssh_trust": ssh}, "errors": {},
                                             "job": job}


def verdict_of(hosts, task_vars, workdir, count, times):
    """The verdict task's steps, timed: the verdict built (``verdict``), its run directory written with JUnit,
    Prometheus and the host lists (``outputs``), the run history and report.html (``report``); then what the
    summary callback prints from the file (``summary``)."""
    kind = "preflight"
    decision_names, stages, applying, filename = finish.KINDS[kind]
    results_dir = os.path.join(workdir, "results-%d" % count)
    started = CLOCK[0]()
    with without_gc():
        view = ClusterView(task_vars)
        decisions = [view.read(hosts[0], name) or {} for name in decision_names]
        register_of = stage_results.STAGE_REGISTERS
        records = {host: {register_of[name]: view.registered(host, register_of[name]) for name in stages} for host in hosts}
        run_dir = os.path.join(results_dir, "run")
        verdict = printable_verdict(build_verdict(hosts, records, decisions, applying, stages, "run", run_dir))
        verdict["hostfile"] = launch_names(verdict, {host: view.nodes[host]["node_addr"] for host in hosts})
        failure_lines(verdict)
    times["verdict"] = CLOCK[0]() - started
    started = CLOCK[0]()
    reports = []

    def outputs(data, where):
        begun = CLOCK[0]()
        write_outputs(data, where, kind=kind)
        reports.append(CLOCK[0]() - begun)

    with without_gc():
        write_run_dir(verdict, {}, results_dir, run_dir, filename, reports=outputs)
    # verdict.json is part of the verdict; JUnit, Prometheus and the host lists are the outputs.
    times["outputs"] = reports[0]
    times["verdict"] += CLOCK[0]() - started - reports[0]
    started = CLOCK[0]()
    with without_gc():
        _outputs, warnings = after_verdict(verdict, kind, run_dir, os.path.join(run_dir, filename), results_dir)
    times["report"] = CLOCK[0]() - started
    assert not warnings, warnings
    started = CLOCK[0]()
    with without_gc():  # as the summary callback reads it
        lines = summary_plugin.summary_lines(load(os.path.join(run_dir, filename)), os.path.join(run_dir, filename))
    times["summary"] = CLOCK[0]() - started
    assert len(lines) > count
    return verdict


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,4000,10000")
    parser.add_argument("--reference", type=int, default=1000,
                        help="the size the time per node of every other size is compared with (run first)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall seconds, or this process's CPU seconds (on a shared machine)")
    args = parser.parse_args()
    CLOCK[0] = time.perf_counter if args.clock == "wall" else time.process_time
    sizes = [int(size) for size in args.sizes.split(",")]
    if args.reference and args.reference not in sizes:
        sizes.insert(0, args.reference)
    settings = settings_of_every_capability()
    with tempfile.TemporaryDirectory(prefix="preflight-bench-scale-") as workdir:
        template = template_facts(workdir, settings)
        core = capabilities.get("core_dumps")
        core_probe = node_probes.get("core_dumps").probe(core.probe_args(settings["core_dumps"], {"name": "n0"}, {}),
                                                         LocalOps())
        print("%s seconds; target: inputs to verdict" % args.clock)
        print(" ".join(["%6s" % "nodes"] + ["%8s" % name for name in STAGES] + ["%8s" % "target", "%9s" % "total",
                                                                                   "per node", "  linearity"]))
        reference = None
        for count in sizes:
            times, verdict = run_size(count, settings, template, core_probe, workdir)
            total = sum(times.values())
            per_node = total / count
            if count == args.reference:
                reference = per_node
            ratio = "" if reference is None or count == args.reference else \
                "  x%.2f per node vs %d nodes" % (per_node / reference, args.reference)
            print(" ".join(["%6d" % count] + ["%8.2f" % times[name] for name in STAGES] +
                           ["%8.2f" % sum(times[name] for name in TARGET), "%8.2fs" % total,
                            "%6.2f ms%s" % (1000 * per_node, ratio)]), flush=True)
            assert verdict["status"] in ("pass", "fail") and len(verdict["hosts"]) == count


if __name__ == "__main__":
    main()
