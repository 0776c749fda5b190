"""``python -m cluster_preflight baseline`` (cluster_preflight/cli/main.py, cluster_preflight/cli/baseline.py): which
run a
profile is recorded from (the latest passing run of this cluster, the runs named with ``--from``, or a gate run now
with ``--run-gate``, never ``results/latest``), refusing any run that did not pass or wrote no verdict, combining
several runs for the floors, and wiring the profile into the inventory's group_vars."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from cluster_preflight.cli import main as cli, playbooks
from cluster_preflight.capabilities.profile import known_good as profiles
from cluster_preflight.verdict.value import ROOT, load_verdict

FIELDS = {"torch.version": "2.13.0", "allreduce.backend": "gloo", "allreduce.largest_size": 65536,
          "allreduce.busbw_gbps": 0.5}


def write_inventory(directory, hosts=("n1", "n2"), group_vars=None):
    directory.mkdir(parents=True, exist_ok=True)
    inventory = directory / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"cluster": {
        "hosts": {host: {"ansible_host": "198.18.0.%d" % (index + 1)} for index, host in enumerate(hosts)},
        "vars": group_vars or {}}}}}))
    return str(inventory)


def write_run(results, run_id, status="pass", busbw=0.5, inventory=None, hosts=("n1", "n2"), name=None,
              changeable_by=""):
    """A gate's run directory with a verdict whose nodes carry their profile fields, and who besides root can
    change their job-side code (``changeable_by``: "" for root alone; None: the verdict does not say)."""
    run_dir = results / run_id
    run_dir.mkdir(parents=True)
    nodes = {}
    for host in hosts:
        fields = dict(FIELDS, **{"allreduce.busbw_gbps": busbw[host] if isinstance(busbw, dict) else busbw})
        checks = {"profile.summary": {"status": "pass", "found": "fields", "expected": "", "fix": "",
                                      "details": {"fields": fields, "profile": None}}}
        if changeable_by is not None:
            checks["allreduce.python"] = {"status": "pass", "found": "Python 3.11", "expected": "a Python", "fix": "",
                                          "details": {"changeable_by": changeable_by}}
        if status == "fail" and host == hosts[0]:
            checks["allreduce.ranks"] = {"status": "fail", "found": "rank 0 died", "expected": "ranks finish",
                                         "fix": "see the rank log"}
        nodes[host] = {"status": "fail" if "allreduce.ranks" in checks else "pass", "reachable": True,
                       "checks": checks}
    healthy = [host for host in hosts if nodes[host]["status"] == "pass"]
    verdict = {"status": status, "run_id": run_id, "run_dir": str(run_dir), "finished": "2026-11-26T10:00:00Z",
               "hosts": list(hosts), "healthy_hosts": healthy, "failed_hosts": [h for h in hosts if h not in healthy],
               "unverified_hosts": [], "warn_hosts": [], "busy_hosts": [], "unreachable_hosts": [], "nodes": nodes,
               "allreduce": {"status": status, "ranks": [], "suspects": []}}
    if inventory:
        verdict["cluster"] = {"name": name or os.path.realpath(inventory), "inventory": [os.path.realpath(inventory)]}
    (run_dir / "verdict.json").write_text(json.dumps(verdict))
    return run_dir


def point_latest(results, run_dir):
    link = results / "latest"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(run_dir.name)


def fake_gate(monkeypatch, results, run_id, status="pass", busbw=0.5, inventory=None, write=True):
    """``playbooks.run_playbook`` replaced by a gate that writes ``run_id`` (or no verdict at all)."""
    calls = []

    def run_playbook(playbook, **kwargs):
        calls.append((playbook, kwargs))
        if not write:
            return playbooks.Result(playbook=playbook, rc=2, status="failed", verdict=None, exit_code=3,
                                    error="preflight.yml wrote no verdict (ansible-playbook rc 2): stopped")
        run_dir = write_run(results, run_id, status=status, busbw=busbw, inventory=inventory)
        verdict = load_verdict(str(run_dir))
        return playbooks.Result(playbook=playbook, rc=0 if status == "pass" else 2, status="successful",
                                verdict=verdict, exit_code=0 if status == "pass" else 2)

    monkeypatch.setattr(playbooks, "run_playbook", run_playbook)
    return calls


def recorded(profile_dir, group="cluster"):
    return profiles.load(str(profile_dir / ("%s.yml" % group)))


def test_run_gate_records_from_the_run_it_made_never_from_results_latest(tmp_path, monkeypatch, capsys):
    results = tmp_path / "results"
    inventory = write_inventory(tmp_path / "inv")
    # results/latest is another run that passed, with another bandwidth: it must not be what is recorded.
    point_latest(results, write_run(results, "20261126T090000Z", busbw=9.0, inventory=inventory))
    fake_gate(monkeypatch, results, "20261126T100000Z", busbw=0.5, inventory=inventory)
    code = cli.main(["baseline", "-i", inventory, "--results-dir", str(results), "--run-gate", "--quiet"])
    assert code == 0, capsys.readouterr()
    data = recorded(tmp_path / "inv" / "profiles")
    assert data["fields"]["allreduce.busbw_gbps"] == 0.5
    assert data["recorded_from"] == [str(results / "20261126T100000Z" / "verdict.json")]


def test_run_gate_refuses_a_run_that_wrote_no_verdict_even_when_latest_passed(tmp_path, monkeypatch, capsys):
    results = tmp_path / "results"
    inventory = write_inventory(tmp_path / "inv")
    point_latest(results, write_run(results, "20261126T090000Z", inventory=inventory))
    fake_gate(monkeypatch, results, "20261126T100000Z", write=False)
    code = cli.main(["baseline", "-i", inventory, "--results-dir", str(results), "--run-gate", "--quiet"])
    err = capsys.readouterr().err
    assert code != 0
    assert "wrote no verdict" in err and "BASELINE NOT RECORDED" in err
    assert not (tmp_path / "inv" / "profiles").exists()


def test_by_default_the_latest_passing_gate_of_this_cluster_is_recorded_and_named(tmp_path, capsys):
    results = tmp_path / "results"
    inventory = write_inventory(tmp_path / "clusters" / "a")
    other = write_inventory(tmp_path / "clusters" / "b")
    write_run(results, "20261126T080000Z", busbw=0.4, inventory=inventory)
    chosen = write_run(results, "20261126T090000Z", busbw=0.45, inventory=inventory)
    write_run(results, "20261126T100000Z", status="fail", inventory=inventory)   # newer, but failed
    write_run(results, "20261126T110000Z", busbw=7.0, inventory=other)           # newer, another cluster
    write_run(results, "20261126T120000Z", busbw=8.0)                            # no cluster: an older checkout's
    point_latest(results, results / "20261126T120000Z")
    assert cli.main(["baseline", "-i", inventory, "--results-dir", str(results)]) == 0
    out = capsys.readouterr().out
    assert "from the latest gate of cluster %s that passed: %s" % (os.path.realpath(inventory),
                                                                    chosen / "verdict.json") in out
    assert recorded(tmp_path / "clusters" / "a" / "profiles")["fields"]["allreduce.busbw_gbps"] == 0.45


def test_by_default_it_refuses_when_this_cluster_has_no_passing_gate(tmp_path, capsys):
    results = tmp_path / "results"
    inventory = write_inventory(tmp_path / "inv")
    write_run(results, "20261126T090000Z", status="fail", inventory=inventory)
    point_latest(results, write_run(results, "20261126T100000Z"))
    assert cli.main(["baseline", "-i", inventory, "--results-dir", str(results)]) == 3
    err = capsys.readouterr().err
    assert "BASELINE NOT RECORDED: no gate of cluster %s passed in %s" % (os.path.realpath(inventory), results) in err
    assert "--run-gate" in err and not (tmp_path / "inv" / "profiles").exists()


def test_a_named_run_that_did_not_pass_or_wrote_no_verdict_is_refused(tmp_path, capsys):
    results = tmp_path / "results"
    inventory = write_inventory(tmp_path / "inv")
    good = write_run(results, "20261126T090000Z", inventory=inventory)
    bad = write_run(results, "20261126T100000Z", status="fail", inventory=inventory)
    empty = results / "20261126T110000Z"
    empty.mkdir()
    assert cli.main(["baseline", "-i", inventory, "--from", str(good), str(bad)]) == 4
    assert "is fail, not pass" in capsys.readouterr().err
    assert cli.main(["baseline", "-i", inventory, "--from", str(good), "--from", str(empty)]) == 3
    assert "no verdict at" in capsys.readouterr().err
    assert cli.main(["baseline", "-i", inventory, "--from", str(good), "--run-gate"]) == 4
    assert not (tmp_path / "inv" / "profiles").exists()


def test_several_runs_give_each_node_its_median_and_the_group_the_lowest_node(tmp_path, capsys):
    results = tmp_path / "results"
    inventory = write_inventory(tmp_path / "inv", hosts=("n1", "n2", "n3"))
    runs = [write_run(results, "20261126T0%d0000Z" % index, inventory=inventory, hosts=("n1", "n2", "n3"),
                      busbw=busbw) for index, busbw in enumerate((
                          {"n1": 0.50, "n2": 0.48, "n3": 0.51},
                          {"n1": 0.38, "n2": 0.47, "n3": 0.49},     # one noisy run on n1
                          {"n1": 0.49, "n2": 0.46, "n3": 0.50}), start=1)]
    assert cli.main(["baseline", "-i", inventory, "--from"] + [str(run) for run in runs]) == 0
    out = capsys.readouterr().out
    data = recorded(tmp_path / "inv" / "profiles")
    # n1's median is 0.49 (the 0.38 run does not set the floor), n2's 0.47: the group's floor is n2's.
    assert data["fields"]["allreduce.busbw_gbps"] == 0.47
    assert data["recorded_from"] == [str(run / "verdict.json") for run in runs]
    assert "from 3 runs named with --from" in out
    assert "allreduce.busbw_gbps: recorded 0.47, the lowest node's median over 3 runs" in out
    assert "n1=0.5/0.38/0.49" in out


def test_the_profile_is_wired_into_the_groups_vars_once_and_never_over_another(tmp_path, capsys):
    results = tmp_path / "results"
    inventory = write_inventory(tmp_path / "inv")
    run = write_run(results, "20261126T090000Z", inventory=inventory)
    assert cli.main(["baseline", "-i", inventory, "--from", str(run)]) == 0
    group_vars = tmp_path / "inv" / "group_vars" / "cluster.yml"
    assert yaml.safe_load(group_vars.read_text()) == {"profile_file": "{{ inventory_dir }}/profiles/cluster.yml"}
    assert "wired: %s created with: profile_file: \"{{ inventory_dir }}/profiles/cluster.yml\"" % group_vars in (
        capsys.readouterr().out)
    # Ansible itself gives the group's nodes that value.
    shown = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-inventory"), "-i", inventory,
                            "--host", "n1"], capture_output=True, text=True, timeout=120, check=True,
                           env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg")))
    assert json.loads(shown.stdout)["profile_file"] == "{{ inventory_dir }}/profiles/cluster.yml"
    assert cli.main(["baseline", "-i", inventory, "--from", str(run), "--force"]) == 0
    assert "wired already" in capsys.readouterr().out
    # A group_vars file with other variables gets the line added, every other line kept.
    group_vars.write_text("# site settings\npreflight_job_user: trainer   # the jobs' account\n")
    assert cli.main(["baseline", "-i", inventory, "--from", str(run), "--force"]) == 0
    assert group_vars.read_text() == ("# site settings\npreflight_job_user: trainer   # the jobs' account\n"
                                      "profile_file: \"{{ inventory_dir }}/profiles/cluster.yml\"\n")
    capsys.readouterr()
    # Another profile already set: left alone, the exact line printed.
    group_vars.write_text("profile_file: /srv/profiles/old.yml\n")
    assert cli.main(["baseline", "-i", inventory, "--from", str(run), "--force"]) == 0
    out = capsys.readouterr().out
    assert "NOT wired: group cluster already has profile_file /srv/profiles/old.yml" in out
    assert 'set: profile_file: "{{ inventory_dir }}/profiles/cluster.yml"' in out
    assert group_vars.read_text() == "profile_file: /srv/profiles/old.yml\n"
    assert cli.main(["baseline", "-i", inventory, "--from", str(run), "--force", "--no-wire"]) == 0
    assert "not wired (--no-wire)" in capsys.readouterr().out


def test_a_directory_inventory_needs_out_outside_it(tmp_path, capsys):
    results = tmp_path / "results"
    inventory = write_inventory(tmp_path / "inv")
    run = write_run(results, "20261126T090000Z", inventory=inventory)
    assert cli.main(["baseline", "-i", str(tmp_path / "inv"), "--from", str(run)]) == 4
    assert "would be read as inventory" in capsys.readouterr().err
    out = tmp_path / "profiles"
    assert cli.main(["baseline", "-i", str(tmp_path / "inv"), "--from", str(run), "--out", str(out)]) == 0
    assert "NOT wired" in capsys.readouterr().out and (out / "cluster.yml").exists()


def test_a_child_group_gets_its_own_line_and_a_value_set_in_the_inventory_file_is_kept(tmp_path, capsys):
    results = tmp_path / "results"
    directory = tmp_path / "inv"
    directory.mkdir()
    inventory = directory / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"cluster": {"children": {
        "gpu_a": {"hosts": {"n1": {}}},
        "gpu_b": {"hosts": {"n2": {}}, "vars": {"profile_file": "/srv/b.yml"}}}}}}}))
    run = write_run(results, "20261126T090000Z", inventory=str(inventory))
    assert cli.main(["baseline", "-i", str(inventory), "--from", str(run)]) == 0
    out = capsys.readouterr().out
    assert sorted(os.listdir(directory / "group_vars")) == ["cluster.yml", "gpu_a.yml"]
    assert "NOT wired: group gpu_b already has profile_file /srv/b.yml from the inventory" in out
    assert yaml.safe_load((directory / "group_vars" / "gpu_a.yml").read_text()) == {
        "profile_file": "{{ inventory_dir }}/profiles/gpu_a.yml"}


def test_a_run_whose_job_side_code_came_from_a_personal_account_s_environment_is_refused_unless_told(tmp_path,
                                                                                                    capsys):
    """The job user's own code measured the bandwidth: a floor recorded from it is that account's word."""
    results = tmp_path / "results"
    inventory = write_inventory(tmp_path / "inv")
    personal = "/home/alice (mode 0755, owner alice, group alice) is owned by alice, not root"
    point_latest(results, write_run(results, "20261126T100000Z", busbw=900.0, inventory=inventory,
                                    changeable_by=personal))
    code = cli.main(["baseline", "-i", inventory, "--results-dir", str(results), "--quiet"])
    out = capsys.readouterr()
    assert code != 0 and not (tmp_path / "inv" / "profiles").exists(), out
    assert "owned by alice" in out.out + out.err and "--allow-personal-env" in out.out + out.err, out
    code = cli.main(["baseline", "-i", inventory, "--results-dir", str(results), "--quiet", "--allow-personal-env"])
    assert code == 0, capsys.readouterr()
    assert recorded(tmp_path / "inv" / "profiles")["fields"]["allreduce.busbw_gbps"] == 900.0


def test_a_run_that_does_not_say_whose_environment_ran_the_job_side_code_is_refused(tmp_path, capsys):
    results = tmp_path / "results"
    inventory = write_inventory(tmp_path / "inv")
    point_latest(results, write_run(results, "20261126T100000Z", inventory=inventory, changeable_by=None))
    code = cli.main(["baseline", "-i", inventory, "--results-dir", str(results), "--quiet"])
    out = capsys.readouterr()
    assert code != 0 and "does not say" in out.out + out.err, out
