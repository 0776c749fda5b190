"""Shared helpers of the allreduce capability unit tests (tests/unit/test_allreduce.py,
tests/unit/test_allreduce_outcome.py): the role settings and the one launch plan of
cluster_preflight/capabilities/allreduce/ for a list of hosts.  Test-side, not shipped."""

import sys

from capability_helpers import role_settings
from cluster_preflight.capabilities import allreduce as ar

VENV_PYTHON = sys.executable


def settings(**overrides):
    """The role's defaults (as preflight_settings hands them over), with the run-wide templates resolved to what the
    tests run with, then ``overrides``."""
    values = role_settings("allreduce")
    values.update({"allreduce_python": VENV_PYTHON, "allreduce_master_port": 6000, "allreduce_backend": "auto",
                   "allreduce_nproc_per_node": 0, "allreduce_cpu_nproc": 2, "allreduce_timeout": 30.0,
                   "allreduce_hard_timeout": 120.0, "allreduce_stack_budget": 20.0,
                   "allreduce_sizes": [1048576, 4194304], "allreduce_sizes_nccl": [16777216, 1073741824],
                   "allreduce_iters": 5, "allreduce_warmup": 2,
                   "allreduce_min_busbw_gbps": 0.0, "allreduce_poll_interval": 0.1, "allreduce_env": {},
                   "allreduce_keep_scratch": False, "allreduce_selftest_fault": "none", "allreduce_selftest_rank": -1})
    values.update(overrides)
    return values


def facts_of(nproc=2, backend="gloo", free=True):
    return {"nproc_per_node": nproc, "backend": backend,
            "port": {"free": free, "detail": "port 6000 can be bound" if free else "port 6000 in use by pid 7"}}


def nodes(hosts):
    return {host: {"name": host, "ansible_host": "198.18.0.%d" % i, "node_addr": "198.18.0.%d" % i}
            for i, host in enumerate(hosts, 1)}


def plan_for(hosts, ready=None, excluded=None, facts=None, blockers=(), nic=None, settings_by_host=None):
    facts = facts or {host: facts_of() for host in hosts}
    nic = nic if nic is not None else {"addr_by_host": {h: "198.19.0.%d" % i for i, h in enumerate(hosts, 1)},
                                       "gloo_socket_ifname": "fab0"}
    return ar.launch_plan(hosts, ready if ready is not None else list(hosts), excluded or {}, facts,
                          settings_by_host or {host: settings() for host in hosts}, nodes(hosts), nic, blockers)
