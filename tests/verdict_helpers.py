"""Verdicts the Slurm tests hand to cluster_preflight/slurm/drain.py and scripts/slurm-drain
(tests/unit/test_slurm.py, tests/multinode/test_slurm_multinode.py): test-side helper, not shipped."""

import copy


def verdict_report(statuses, passing, failing):
    """A verdict over ``statuses`` (node -> pass/warn/fail/unverified): every node holds the ``passing``
    checks, a failed node also the ``failing`` ones (each node its own copies)."""
    nodes = {}
    for node, status in statuses.items():
        checks = copy.deepcopy(passing)
        if status == "fail":
            checks.update(copy.deepcopy(failing))
        nodes[node] = {"status": status, "checks": checks}
    hosts = list(statuses)
    return {"status": "pass" if all(s in ("pass", "warn") for s in statuses.values()) else "fail",
            "hosts": hosts, "nodes": nodes,
            "healthy_hosts": [h for h in hosts if statuses[h] in ("pass", "warn")],
            "failed_hosts": [h for h in hosts if statuses[h] == "fail"],
            "unverified_hosts": [h for h in hosts if statuses[h] == "unverified"],
            "unreachable_hosts": []}
