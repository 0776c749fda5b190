"""The controller reads what the nodes registered in place (``cluster_preflight/stages/view.py``: no copy per node),
so no step may write into it: a synthetic cluster as ``bench/controller_scale.py`` builds it (every capability,
one rank per node), with a node lost, a probe and a reader that raised and a failed rank, goes through the
decisions, the localisation's start and the verdict; what ``hostvars`` holds is the same after every step."""

import copy
import importlib.util
import json
import os

import pytest

from cluster_preflight.stages.view import ClusterView
from verdict_build_helpers import run_action

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench",
                     "controller_scale.py")
COUNT = 8
# What the core_dumps probe returns where a crash left its core file (preflight_node/probes).
CORE_PROBE = {"outcome": "found", "core_pattern": "core", "core_uses_pid": False, "run_as": "", "who": "root",
              "uid": 0, "note": "", "timeout": 10.0, "wcoredump": True, "child_pid": 4242,
              "expected_path": "/tmp/core-probe-x/core", "core_file": "/tmp/core-probe-x/core", "core_removed": True,
              "core_dir": "/tmp/core-probe-x", "core_dir_exists": None, "core_dir_writable": None,
              "core_dir_mode": None, "core_dir_listing": None, "suid_dumpable": None, "destination": None,
              "error": None, "session_rlimit_core": {"soft": "0", "hard": "unlimited"}, "needs_root": ""}


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("controller_scale_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Steps(object):
    """Every step run over ``hostvars``, each checked to leave what was registered before it as it was."""

    def __init__(self, hostvars):
        self.hostvars = hostvars

    def __call__(self, name, function, register=None):
        before = copy.deepcopy(self.hostvars)
        result = function()
        assert self.hostvars == before, "%s wrote into what the nodes registered" % name
        if register:
            for host in self.hostvars:
                self.hostvars[host][register] = result
        return result


def probe_faults(hosts, hostvars):
    """A node lost before the probes (n0002), a probe that raised (n0003) and a rank that failed (n0004)."""
    hostvars[hosts[2]]["preflight_probes"] = {"unreachable": True, "msg": "Failed to connect to the host via ssh"}
    hostvars[hosts[3]]["preflight_probes"]["errors"] = {"ssh_trust": {"found": "ValueError: x", "traceback": "t"}}
    rank = hostvars[hosts[4]]["preflight_probes"]["job"]["ranks"][0]
    rank.update(status="error", stage="allreduce", correct=False, error="RuntimeError: Connection reset by peer")


def test_no_decision_localisation_or_verdict_writes_into_the_registered_results(bench, tmp_path):
    settings = bench.settings_of_every_capability()
    template = bench.template_facts(str(tmp_path), settings)
    hosts, hostvars, task_vars, _probe = bench.build_cluster(COUNT, settings, template, CORE_PROBE)
    step = Steps(hostvars)
    step("inputs", lambda: bench.decisions.decide("inputs", task_vars), "preflight_inputs")
    # A reader that raised (n0001).
    hostvars[hosts[1]]["preflight_facts"]["errors"] = {"iommu": {"found": "OSError: boom", "traceback": "t"}}
    plan = step("plan", lambda: bench.decisions.decide("plan", task_vars), "preflight_plan")
    assert plan["ok"], plan["blockers"]
    bench.register_mesh(hosts, hostvars, plan)
    launch = step("launch", lambda: bench.decisions.decide("launch", task_vars), "preflight_launch")
    assert launch["ok"], launch["blockers"]
    bench.register_probes(hosts, hostvars, settings, CORE_PROBE)
    probe_faults(hosts, hostvars)
    final = step("final", lambda: bench.decisions.decide("final", task_vars), "preflight_final")
    assert final["allreduce"]["status"] == "fail", final["allreduce"]
    localized = step("localize", lambda: bench.localization.start(ClusterView(task_vars)), "allreduce_localize")
    assert localized["needed"], localized
    result = step("verdict", lambda: run_action({"results_dir": str(tmp_path / "results"), "run_id": "run"},
                                                hostvars))
    with open(result["verdict_file"]) as handle:
        verdict = json.load(handle)
    assert verdict["status"] == "fail" and set(hosts[1:5]) <= set(verdict["failed_hosts"]), verdict["failed_hosts"]
    assert "preflight.decide_final" not in verdict["nodes"][hosts[0]]["checks"]
