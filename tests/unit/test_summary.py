"""What a summary says besides the matrix (cluster_preflight/outputs/summary.py, the summary callback, the command
line):
findings grouped by root cause, findings blocked by another failure that say so, the profile each node was
compared with, and a bring-up's changes."""

import json
import os
import types

from ansible.plugins.loader import callback_loader

from cluster_preflight.outputs import summary
from cluster_preflight.verdict.value import ROOT
from cluster_preflight.capabilities import profile
from cluster_preflight.capabilities.ssh_trust.mesh import CAUSES
from report_helpers import synthetic_verdict

HOSTS = ["gpu-node-1", "gpu-node-2", "gpu-node-3"]


def _put(verdict, host, name, status, found, fix, **details):
    check = {"status": status, "found": found, "expected": "as it should be", "fix": fix}
    if details:
        check["details"] = details
    verdict["nodes"][host]["checks"][name] = check
    if status in ("warn", "fail") and verdict["nodes"][host]["status"] == "pass":
        verdict["nodes"][host]["status"] = status


def ssh_verdict():
    """After bring-up on a cluster whose names do not resolve on the nodes, node-to-node login not opted in."""
    verdict = synthetic_verdict(hosts=HOSTS)
    both = [CAUSES["dns"], CAUSES["auth_denied"]]
    for host in HOSTS:
        peers = [peer for peer in HOSTS if peer != host]
        _put(verdict, host, "ssh_trust.inbound", "warn", "no peer could log in to %s: %s -> %s dns" % (
            host, peers[0], host), "make %s resolvable on its peers (/etc/hosts or DNS)" % host, causes=both)
        _put(verdict, host, "ssh_trust.login", "warn", "%s -> %s: denied" % (host, peers[0]),
             "give %s's user a key %s accepts" % (host, peers[0]), causes=both)
        _put(verdict, host, "ssh_trust.pdsh", "warn", "pdsh from %s failed for %s dns" % (host, peers[1]),
             "see the login checks of %s" % host, causes=[CAUSES["dns"]])
        _put(verdict, host, "core_dumps.core_pattern", "warn", "running core on %s" % host,
             "on %s: sysctl -w kernel.core_pattern=/tmp/core-%%e.%%p (the bring-up does it)" % host)
    return verdict


def test_findings_of_one_root_cause_are_one_group():
    groups = summary.group_findings(ssh_verdict())
    assert [(group.kind, group.title, len(group.items)) for group in groups] == [
        ("same", "core_dumps.core_pattern", 3),
        ("causes", CAUSES["dns"]["title"] + "; " + CAUSES["auth_denied"]["title"], 6),
        ("causes", CAUSES["dns"]["title"], 3)]
    assert "ssh_trust_cluster_key: true" in groups[1].fix and "/etc/hosts or DNS" in groups[1].fix
    # The fix names the group's nodes: never a placeholder.
    assert groups[0].fix == "on all 3 nodes: sysctl -w kernel.core_pattern=/tmp/core-%e.%p (the bring-up does it)"


def test_the_summary_prints_a_group_once_with_its_checks_nodes_example_and_fix():
    lines = summary.finding_lines(ssh_verdict())
    assert len(lines) == 9  # 12 findings in three groups of three lines, instead of 24 lines
    assert lines[:3] == ["  [warn] core_dumps.core_pattern on all 3 nodes (3 findings)",
                         "    e.g. gpu-node-1 core_dumps.core_pattern: running core on gpu-node-1",
                         "    fix: on all 3 nodes: sysctl -w kernel.core_pattern=/tmp/core-%e.%p (the bring-up does it)"]
    assert lines[3] == ("  [warn] %s; %s: 6 findings (ssh_trust.inbound, ssh_trust.login) on all 3 nodes"
                        % (CAUSES["dns"]["title"], CAUSES["auth_denied"]["title"]))
    assert lines[4].startswith("    e.g. gpu-node-1 ssh_trust.inbound: no peer could log in to gpu-node-1")
    assert lines[5].startswith("    fix: Add every node's inventory name")


def test_a_finding_alone_reads_as_it_always_has():
    verdict = synthetic_verdict(hosts=HOSTS, failed=("gpu-node-2",))
    assert summary.finding_lines(verdict) == ["  gpu-node-2 allreduce.ranks [fail]: allreduce broken on gpu-node-2: "
                                              "value 1", "    fix: fix allreduce on gpu-node-2, then re-run"]


def test_same_check_different_fixes_stay_apart():
    verdict = synthetic_verdict(hosts=HOSTS)
    _put(verdict, "gpu-node-1", "core_dumps.core_limits", "warn", "x", "write the limits file on gpu-node-1")
    _put(verdict, "gpu-node-2", "core_dumps.core_limits", "warn", "y", "remove the override on gpu-node-2")
    assert len(summary.group_findings(verdict)) == 2


def test_a_field_not_measured_because_of_another_failure_is_blocked_by_it_not_a_profile_edit(tmp_path):
    from cluster_preflight.capabilities.profile import known_good as profiles  # pylint: disable=import-outside-toplevel

    path = tmp_path / "cluster.yml"
    fields = {"torch.version": "2.13.0", "allreduce.backend": "gloo", "allreduce.busbw_gbps": 0.5}
    path.write_text(profiles.dump(fields, "cluster", "/r/verdict.json", ["gpu-node-1"], "2026-11-26T00:00:00Z"))
    settings = {"profile_enabled": True, "profile_file": str(path), "profile_busbw_tolerance": 0.2}
    # gpu-node-2 was left out of the all-reduce for a blocked port: its run fields were not measured.
    checks = profile.decide_all(["gpu-node-1", "gpu-node-2"], {"gpu-node-1": dict(fields),
                                                               "gpu-node-2": {"torch.version": "2.13.0"}},
                                {"gpu-node-1": settings, "gpu-node-2": settings},
                                {"gpu-node-2": ["port_mesh.reach", "allreduce.launch"]})
    busbw = checks["gpu-node-2"]["allreduce_busbw_gbps"]
    assert busbw["status"] == "skipped" and busbw["details"]["blocked"] is True
    assert busbw["found"] == "allreduce.busbw_gbps was not measured on gpu-node-2: blocked by port_mesh.reach, " \
                             "allreduce.launch"
    assert "remove" not in busbw["fix"] and "profile needs no change" in busbw["fix"]
    assert busbw["details"]["blocked_by"] == ["port_mesh.reach", "allreduce.launch"]
    # Without a failure that explains it, the old advice stands.
    alone = profile.decide_all(["gpu-node-2"], {"gpu-node-2": {"torch.version": "2.13.0"}}, {"gpu-node-2": settings})
    assert "remove allreduce.busbw_gbps from the profile" in alone["gpu-node-2"]["allreduce_busbw_gbps"]["fix"]
    # In the summary, the node's blocked fields are one group under their cause.
    verdict = synthetic_verdict(hosts=["gpu-node-1", "gpu-node-2"])
    verdict["nodes"]["gpu-node-2"]["checks"].update(
        {"profile." + name: check for name, check in checks["gpu-node-2"].items()})
    lines = summary.finding_lines(verdict)
    assert lines[0] == ("  [unverified] gpu-node-2: blocked by port_mesh.reach, allreduce.launch: 2 findings "
                        "(profile.allreduce_backend, profile.allreduce_busbw_gbps) on gpu-node-2")


def test_the_profile_line_names_the_file_or_says_none_was_set():
    verdict = synthetic_verdict(hosts=HOSTS)
    for host in HOSTS:
        verdict["nodes"][host]["checks"]["profile.summary"] = {
            "status": "pass", "found": "", "expected": "", "fix": "",
            "details": {"fields": {}, "profile": "/c/profiles/cluster.yml" if host != "gpu-node-3" else None}}
    assert summary.profile_lines(verdict) == [
        "profile: gpu-node-1, gpu-node-2 compared with /c/profiles/cluster.yml",
        "profile: none set for gpu-node-3 (profile_file is empty): compared with each other, busbw with no known-good "
        "value; record one: python -m cluster_preflight baseline -i INVENTORY (docs/profile.md)"]
    assert "profile: all 3 nodes compared with" not in "\n".join(summary.notes(verdict))


def test_a_bring_up_says_what_it_changed_and_a_dry_run_that_it_wrote_nothing():
    verdict = synthetic_verdict(hosts=HOSTS)
    del verdict["allreduce"]
    verdict["changed"] = {"gpu-node-1": 5, "gpu-node-2": 5, "gpu-node-3": 4}
    assert summary.changes_line(verdict) == "14 changes made (gpu-node-1 5, gpu-node-2 5, gpu-node-3 4)"
    verdict["check_mode"] = True
    assert summary.notes(verdict) == ["changes: check mode, nothing was written: 14 changes would be made "
                                      "(gpu-node-1 5, gpu-node-2 5, gpu-node-3 4)"]
    verdict.update(check_mode=False, changed={host: 0 for host in HOSTS})
    assert summary.changes_line(verdict) == "changed=0 on every node: nothing needed changing"


def test_the_callback_records_the_changes_in_bringup_json_and_prints_them(tmp_path):
    callback_loader.add_directory(os.path.join(ROOT, "callback_plugins"))
    plugin = callback_loader.get("preflight_summary")
    printed = []
    plugin._display = types.SimpleNamespace(display=lambda msg="", color=None, **kwargs: printed.append(msg))
    plugin.v2_playbook_on_start(types.SimpleNamespace(_file_name=os.path.join(ROOT, "bringup.yml")))
    verdict = synthetic_verdict(hosts=HOSTS)
    del verdict["allreduce"]
    verdict["check_mode"] = True
    path = tmp_path / "bringup.json"
    path.write_text(json.dumps(verdict))
    path.chmod(0o640)
    plugin.v2_runner_on_ok(types.SimpleNamespace(_task=types.SimpleNamespace(action="preflight_verdict"),
                                                 _result={"verdict_file": str(path)}))
    plugin.v2_playbook_on_stats(types.SimpleNamespace(changed={"gpu-node-1": 2, "gpu-node-3": 1}))
    assert json.loads(path.read_text())["changed"] == {"gpu-node-1": 2, "gpu-node-2": 0, "gpu-node-3": 1}
    assert oct(path.stat().st_mode & 0o777) == "0o640"
    assert "changes: check mode, nothing was written: 3 changes would be made (gpu-node-1 2, gpu-node-2 0, " \
           "gpu-node-3 1)" in printed


def test_the_command_line_keeps_each_diff_without_the_task_banner():
    from cluster_preflight.cli import playbooks  # pylint: disable=import-outside-toplevel

    collector = playbooks._Collector()  # pylint: disable=protected-access
    collector({"event": "runner_on_file_diff", "event_data": {"host": "gpu-node-1", "task": "Ensure the pattern."},
               "stdout": "\r\nTASK [core_dumps : Ensure the pattern.] ***\r\n--- before: /etc/a.conf\r\n"
                         "+++ after: /etc/a.conf\r\n@@ -0,0 +1 @@\r\n+x = 1\r\n"})
    assert collector.diffs == [("gpu-node-1", "Ensure the pattern.",
                                "--- before: /etc/a.conf\n+++ after: /etc/a.conf\n@@ -0,0 +1 @@\n+x = 1")]


def test_a_fix_naming_its_node_reads_right_for_a_group():
    verdict = synthetic_verdict(hosts=HOSTS)
    for host in HOSTS:
        _put(verdict, host, "profile.allreduce_busbw_gbps", "fail", "slow on %s" % host,
             "see the localisation rounds (node %s)" % host)
    group = summary.group_findings(verdict)[0]
    assert group.fix == "see the localisation rounds (all 3 nodes)"


def test_the_command_line_takes_the_verdict_file_only_from_the_verdict_task():
    """A node's module result is the node's word: a verdict_file (or report_file) in it is never the run's."""
    from cluster_preflight.cli import playbooks  # pylint: disable=import-outside-toplevel

    collector = playbooks._Collector()  # pylint: disable=protected-access
    forged = {"verdict_file": "/tmp/forged/verdict.json", "report_file": "/tmp/forged/diagnose.json",
              "outputs": {"junit": "/tmp/forged/junit.xml"}, "lines": ["PREFLIGHT PASS"]}
    for action in ("preflight_facts", "ansible.legacy.port_probe", "preflight_srun"):
        collector({"event": "runner_on_ok", "event_data": {"host": "n1", "task": "a node call", "task_action": action,
                                                           "res": dict(forged)}})
    assert collector.verdict_file is None and collector.report_file is None and collector.outputs is None
    collector({"event": "runner_on_failed", "event_data": {"host": "n1", "task": "Write the verdict.",
                                                           "task_action": "ansible.legacy.preflight_verdict",
                                                           "res": {"verdict_file": "/r/1/verdict.json"}}})
    collector({"event": "runner_on_ok", "event_data": {"host": "n1", "task": "Diagnose.",
                                                       "task_action": "preflight_diagnose",
                                                       "res": {"report_file": "/r/2/diagnose.json", "lines": ["x"]}}})
    assert collector.verdict_file == "/r/1/verdict.json" and collector.report_file == "/r/2/diagnose.json"
