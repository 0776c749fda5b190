#!/usr/bin/env python3
"""Controller cost at scale: the decisions and the verdict over synthetic clusters, no SSH.

Builds what 10, 100, 1000 and 4000 nodes would have registered (every capability's facts,
probe results, port mesh results, all-reduce ranks), runs the controller's steps as the
play does (preflight_decide inputs, plan, launch, final; the verdict, written to a temporary
run directory) and prints the seconds each takes and the growth per node.  Target: <= 10 s
for 1000 nodes, near-linear growth.  Use the project's venv:
    .venv/bin/python bench/controller_scale.py [--sizes 10,100,1000,4000]
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
from cluster_preflight import capabilities as registry  # noqa: E402
from preflight_node import probes as node_probes  # noqa: E402
from preflight_node import readers as node_halves  # noqa: E402
from cluster_preflight.pairs import peers_by_host  # noqa: E402
from cluster_preflight.cluster import without_gc  # noqa: E402
from cluster_preflight.accounting import build_verdict, failure_lines, write_run_dir  # noqa: E402
from capability_helpers import role_settings  # noqa: E402
from fake_ops import LocalOps  # noqa: E402
from fake_sysfs import cluster_node  # noqa: E402

spec = importlib.util.spec_from_file_location("preflight_decide", os.path.join(ROOT, "action_plugins",
                                                                              "preflight_decide.py"))
decide_plugin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(decide_plugin)


def settings_of_every_capability():
    settings = {name: role_settings(name) for name in (registry.RUN_ROLE,) + registry.NAMES}
    settings["nic_discovery"]["nic_discovery_override"] = ""
    settings["port_mesh"]["port_mesh_port"] = 6000
    settings["allreduce"].update(allreduce_python=sys.executable, allreduce_master_port=6000,
                                 allreduce_nproc_per_node=1)
    settings["core_dumps"]["core_dumps_dir"] = "/tmp"
    settings["ssh_trust"]["ssh_trust_login_policy"] = "warn"
    for name in ("preflight_master_port", "preflight_nproc_per_node"):
        settings[registry.RUN_ROLE][name] = 6000 if name.endswith("port") else 1
    return settings


def template_facts(workdir, settings):
    """One node's facts, read once: this machine's for the node-local capabilities, a fake
    fabric node's for the NICs; the nodes below differ by addresses and host keys."""
    node = {"name": "n0", "ansible_host": "198.18.0.1", "node_addr": "198.18.0.1", "user": "root", "ssh_port": 22}
    facts = {}
    for name in ("kernel_debug", "core_dumps", "iommu", "debug_tools", "ssh_trust"):
        args = registry.get(name).read_args(settings[name], node)
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
    return facts


def build_cluster(count, settings, template, core_probe):
    hosts = ["n%04d" % index for index in range(count)]
    hostvars = {}
    for index, host in enumerate(hosts):
        node = {"name": host, "ansible_host": addr(index, "198.18"), "node_addr": addr(index, "198.18"),
                "user": "root", "ssh_port": 22}
        hostvars[host] = {"preflight_settings": {"ok": True, "errors": [], "settings": settings, "node": node,
                                                 "capabilities": list(registry.NAMES)},
                          "preflight_facts": {"facts": node_facts(template, host, index), "errors": {}}}
    task_vars = {"ansible_play_hosts_all": hosts, "groups": {"cluster": hosts}, "ansible_forks": 64,
                 "hostvars": hostvars}
    return hosts, hostvars, task_vars, core_probe


def run_size(count, settings, template, core_probe, workdir):
    hosts, hostvars, task_vars, core_probe = build_cluster(count, settings, template, core_probe)
    times = {}

    def stage(name, register):
        started = time.perf_counter()
        result = decide_plugin.decide(name, task_vars)
        times[name] = time.perf_counter() - started
        for host in hosts:
            hostvars[host][register] = result
        return result

    stage("inputs", "preflight_inputs")
    plan = stage("plan", "preflight_plan")
    assert plan["ok"], plan["blockers"]
    for host in hosts:
        args = plan["port_mesh"]["args_by_host"].get(host)
        rows = [{"source": host, "destination": peer["name"], "addr": peer["addr"], "port": 6000, "result": "open",
                 "detail": "open"} for peer in (args or {}).get("peers", [])]
        hostvars[host]["port_mesh_probe"] = {"results": rows, "checks": {"port_listen": {
            "status": "pass", "found": "listening", "expected": "listening", "fix": ""}}}
    launch = stage("launch", "preflight_launch")
    assert launch["ok"], launch["blockers"]
    pairing = peers_by_host(hosts, settings[registry.RUN_ROLE]["preflight_mesh_full_max"],
                            settings[registry.RUN_ROLE]["preflight_mesh_degree"])
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
                          "bandwidth": [], "error": None}],
               "checks": {"ranks": {"status": "pass", "found": "ok", "expected": "ok", "fix": ""}}, "log": ""}
        hostvars[host]["preflight_probes"] = {"probes": {"core_dumps": core_probe, "ssh_trust": ssh}, "errors": {},
                                             "job": job}
    final = stage("final", "preflight_final")
    started = time.perf_counter()
    with without_gc():  # as the verdict action runs it
        verdict = verdict_of(hosts, hostvars, workdir, count)
    times["verdict"] = time.perf_counter() - started
    assert final["allreduce"]["status"] == "pass", final["allreduce"]
    return times, verdict


def verdict_of(hosts, hostvars, workdir, count):
    records = {host: {registry.STAGE_REGISTERS[name]: hostvars[host].get(registry.STAGE_REGISTERS[name])
                      for name in ("settings", "facts", "port_mesh", "launch", "probes")} for host in hosts}
    decisions = [hostvars[hosts[0]][name] for name in ("preflight_inputs", "preflight_plan", "preflight_launch",
                                                         "preflight_final")]
    verdict = build_verdict(hosts, records, decisions, registry.NAMES,
                            ("settings", "facts", "port_mesh", "launch", "probes"), "bench", workdir)
    failure_lines(verdict)
    write_run_dir(verdict, {}, workdir, os.path.join(workdir, "run-%d" % count))
    return verdict


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100,1000,4000")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    settings = settings_of_every_capability()
    with tempfile.TemporaryDirectory(prefix="preflight-bench-scale-") as workdir:
        template = template_facts(workdir, settings)
        core = registry.get("core_dumps")
        core_probe = node_probes.get("core_dumps").probe(core.probe_args(settings["core_dumps"], {"name": "n0"}, {}), LocalOps())
        print("%6s %8s %8s %8s %8s %8s %9s %s" % ("nodes", "inputs", "plan", "launch", "final", "verdict", "total",
                                                  "per node"))
        previous = None
        for count in sizes:
            times, verdict = run_size(count, settings, template, core_probe, workdir)
            total = sum(times.values())
            growth = "" if previous is None else "  x%.1f for x%.0f nodes" % (total / previous[1],
                                                                              count / previous[0])
            print("%6d %8.2f %8.2f %8.2f %8.2f %8.2f %8.2fs %6.2f ms%s" % (
                count, times["inputs"], times["plan"], times["launch"], times["final"], times["verdict"], total,
                1000 * total / count, growth), flush=True)
            assert verdict["status"] in ("pass", "fail") and len(verdict["hosts"]) == count
            previous = (count, total)


if __name__ == "__main__":
    main()
