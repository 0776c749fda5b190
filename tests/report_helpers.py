"""Synthetic verdicts for the run history and report tests (tests/unit/test_history.py,
tests/unit/test_report.py, tests/integration/test_report_browser.py) and bench/report_scale.py:
any number of nodes, chosen ones failing, each with its all-reduce ranks' bus bandwidth.
Test-side, not shipped."""

import copy

SIZES = (1048576, 16777216)
CAPABILITIES = ("allreduce", "core_dumps", "iommu", "kernel_debug", "preflight", "ssh_trust")


def _check(status, host, capability):
    found = {"pass": "%s fine on %s" % (capability, host), "fail": "%s broken on %s: value 1" % (capability, host),
             "warn": "%s drifted on %s: value 2" % (capability, host),
             "not_applicable": "no such device on %s" % host, "skipped": "switched off for %s" % host}[status]
    return {"status": status, "found": found, "expected": "%s as configured" % capability,
            "fix": "fix %s on %s, then re-run" % (capability, host) if status in ("fail", "warn") else ""}


def synthetic_verdict(count=None, hosts=None, failed=(), warned=(), run_id="20261125T000000Z",
                      finished="2026-11-25T00:00:00Z", busbw=None, localize=False):
    """A verdict of ``hosts`` (or ``node0000``.. for ``count`` nodes): the ``failed`` nodes fail
    ``allreduce.ranks``, the ``warned`` ones warn on ``core_dumps.core_pattern``; every node has two
    ranks at ``busbw[host]`` GB/s (default 10 + its index / 10), and ``localize`` adds one round."""
    hosts = list(hosts or ["node%04d" % index for index in range(count)])
    nodes, ranks = {}, []
    for index, host in enumerate(hosts):
        checks = {"%s.state" % cap: _check("pass", host, cap) for cap in CAPABILITIES}
        checks["iommu.state"] = _check("not_applicable", host, "iommu")
        checks["kernel_debug.state"] = _check("skipped", host, "kernel_debug")
        status = "pass"
        if host in warned:
            checks["core_dumps.core_pattern"] = _check("warn", host, "core_dumps")
            status = "warn"
        if host in failed:
            checks["allreduce.ranks"] = _check("fail", host, "allreduce")
            status = "fail"
        nodes[host] = {"status": status, "reachable": True, "checks": checks}
        value = (busbw or {}).get(host, 10 + index / 10.0)
        for local in range(2):
            ranks.append({"host": host, "rank": 2 * index + local, "local_rank": local, "status": "ok",
                          "bandwidth": [{"size_bytes": size, "busbw_gbps": value * (0.5 if size == SIZES[0] else 1),
                                         "algbw_gbps": value / 2, "time_us": 100.0} for size in SIZES]})
    healthy = [host for host in hosts if nodes[host]["status"] in ("pass", "warn")]
    verdict = {
        "status": "pass" if len(healthy) == len(hosts) else "fail", "run_id": run_id,
        "run_dir": "/tmp/results/%s" % run_id, "finished": finished, "hosts": hosts, "healthy_hosts": healthy,
        "failed_hosts": [host for host in hosts if host in failed], "unverified_hosts": [],
        "warn_hosts": [host for host in hosts if host in warned and host not in failed], "busy_hosts": [],
        "unreachable_hosts": [], "nodes": nodes, "bound_seconds": 600,
        "allreduce": {"status": "fail" if failed else "pass", "world_size": 2 * len(hosts),
                      "planned_world_size": 2 * len(hosts), "hosts": hosts, "ranks": ranks, "suspects": [],
                      "sizes": copy.deepcopy(ranks[0]["bandwidth"]) if ranks else [],
                      "versions": {"torch": "2.13.0+cpu", "python": "3.11.7"}},
    }
    if localize and len(hosts) >= 2:
        verdict["localize"] = {
            "trigger": "the all-node all-reduce failed", "bad": sorted(failed), "good": [], "lost": [],
            "unproven": [], "kinds": {}, "rounds": [{"round": 1, "launches": [
                {"kind": "pair", "hosts": hosts[:2], "verdict": "done", "busbw_gbps": 8.5, "why": ""},
                {"kind": "loopback", "hosts": [hosts[-1]], "verdict": "fail", "busbw_gbps": None,
                 "why": "rank 1 died"}]}]}
    return verdict
