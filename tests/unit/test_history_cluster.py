"""The run history per cluster (cluster_preflight/outputs/history.py, cluster_preflight/cli/history.py): runs carry
their
cluster (a name, or the inventory) and kind, check-mode bring-ups are recorded as such, and the queries, the
``history`` command and the report's recent runs keep to one cluster and to real runs unless asked; a database
whose path holds URI characters (``#``, ``?``, ``%``) opens."""

import json
import os
import sqlite3

import pytest

from cluster_preflight.outputs import history
from report_helpers import synthetic_verdict


@pytest.mark.parametrize("directory", ["runs#1", "what?", "a%41b"])
def test_a_history_path_with_uri_characters_opens(tmp_path, directory):
    db = str(tmp_path / directory / "history.sqlite")
    os.makedirs(os.path.dirname(db))
    verdict = synthetic_verdict(hosts=["n1"], run_id="run01", finished="2026-11-01T10:00:00Z")
    assert history.record(db, verdict, "preflight", "/results/run01/verdict.json")["recorded"]
    assert [row["run_id"] for row in history.timeline(db, node="n1")] == ["run01"]
    assert history.last_pass(db)["run_id"] == "run01"


def _record(db, number, cluster, kind="preflight", failed=(), check_mode=False, hosts=("n1", "n2")):
    verdict = synthetic_verdict(hosts=list(hosts), failed=failed, run_id="run%02d" % number,
                                finished="2026-11-%02dT10:00:00Z" % number)
    verdict["cluster"] = cluster
    if check_mode:
        verdict["check_mode"] = True
    assert history.record(db, verdict, kind, "/results/run%02d/verdict.json" % number)["recorded"]


@pytest.fixture
def two_clusters(tmp_path):
    """Cluster A (by inventory) and cluster B (by name) share node names; A has a dry-run bring-up."""
    db = str(tmp_path / "history.sqlite")
    a = {"name": "", "inventory": ["/srv/clusters/a/hosts.yml"]}
    b = {"name": "lab-b", "inventory": ["/srv/clusters/b/hosts.yml"]}
    _record(db, 1, a)
    _record(db, 2, b, failed=("n1",))
    _record(db, 3, a, kind="bringup", check_mode=True, failed=("n2",))
    _record(db, 4, a, kind="bringup")
    _record(db, 5, b, kind="healthcheck", hosts=("n1", "n3"))
    return db


def test_runs_carry_their_cluster_and_kind(two_clusters):
    conn = sqlite3.connect(two_clusters)
    rows = conn.execute("SELECT run_id, kind, cluster, inventory, check_mode FROM runs ORDER BY run_id").fetchall()
    assert rows == [("run01", "gate", "/srv/clusters/a/hosts.yml", "/srv/clusters/a/hosts.yml", 0),
                    ("run02", "gate", "lab-b", "/srv/clusters/b/hosts.yml", 0),
                    ("run03", "bringup", "/srv/clusters/a/hosts.yml", "/srv/clusters/a/hosts.yml", 1),
                    ("run04", "bringup", "/srv/clusters/a/hosts.yml", "/srv/clusters/a/hosts.yml", 0),
                    ("run05", "healthcheck", "lab-b", "/srv/clusters/b/hosts.yml", 0)]
    conn.close()


def test_the_queries_keep_to_one_cluster_and_real_runs_by_default(two_clusters):
    a = "/srv/clusters/a/hosts.yml"
    rows = history.timeline(two_clusters, cluster=a)
    # Cluster B's runs of the same node names are not there, nor the dry run.
    assert [(row["node"], row["run_id"], row["kind"]) for row in rows] == [
        ("n1", "run04", "bringup"), ("n1", "run01", "gate"), ("n2", "run04", "bringup"), ("n2", "run01", "gate")]
    assert {row["node"] for row in history.timeline(two_clusters, cluster="lab-b")} == {"n1", "n2", "n3"}
    assert history.recent_statuses(two_clusters, ["n1"], cluster="lab-b") == {"n1": ["fail", "pass"]}
    assert history.recent_statuses(two_clusters, ["n1"], cluster=a) == {"n1": ["pass", "pass"]}
    assert history.flaky(two_clusters, cluster=a) == []
    assert history.last_pass(two_clusters, cluster="lab-b")["run_id"] == "run05"
    assert history.last_pass(two_clusters, cluster="lab-b", kinds=["gate"]) is None
    assert history.last_pass(two_clusters, node="n2", cluster=a, kinds=["gate"])["run_id"] == "run01"


def test_a_dry_run_is_recorded_as_such_and_shown_only_when_asked(two_clusters):
    a = "/srv/clusters/a/hosts.yml"
    rows = history.timeline(two_clusters, node="n2", cluster=a, kinds=history.ALL_KINDS)
    assert [(row["run_id"], row["kind"], row["status"]) for row in rows] == [
        ("run04", "bringup", "pass"), ("run03", "bringup-check", "fail"), ("run01", "gate", "pass")]
    assert history.first_failure(two_clusters, "n2", "allreduce.ranks") is None
    assert history.latest_cluster(two_clusters) == "lab-b"
    assert history.latest_cluster(two_clusters, kinds=["bringup"]) == a
    with pytest.raises(ValueError, match="unknown run kind"):
        history.timeline(two_clusters, kinds=["nightly"])


def test_the_verdict_action_files_each_run_under_its_cluster_and_a_dry_run_as_such(tmp_path):
    from verdict_build_helpers import records, run_action  # pylint: disable=import-outside-toplevel

    results = tmp_path / "results"
    inventory = tmp_path / "clusters" / "a" / "hosts.yml"
    hostvars = {"n1": records(), "n2": records()}
    dry = run_action({"kind": "bringup", "results_dir": str(results), "run_id": "r1", "fail": False}, hostvars,
                     check_mode=True, ansible_inventory_sources=[str(inventory)])
    real = run_action({"kind": "bringup", "results_dir": str(results), "run_id": "r2", "fail": False}, hostvars,
                      ansible_inventory_sources=[str(inventory)])
    other = run_action({"kind": "bringup", "results_dir": str(results), "run_id": "r3", "fail": False}, hostvars,
                       ansible_inventory_sources=[str(tmp_path / "clusters" / "b" / "hosts.yml")])
    with open(dry["verdict_file"]) as handle:
        saved = json.load(handle)
    assert saved["check_mode"] is True
    assert saved["cluster"] == {"name": "", "inventory": [str(inventory)]}
    assert json.load(open(real["verdict_file"]))["check_mode"] is False
    db = str(results / "history.sqlite")
    assert [row["run_id"] for row in history.timeline(db, node="n1", cluster=str(inventory))] == ["r2"]
    assert [(row["run_id"], row["kind"]) for row in history.timeline(
        db, node="n1", cluster=str(inventory), kinds=history.ALL_KINDS)] == [("r2", "bringup"), ("r1", "bringup-check")]
    assert [row["run_id"] for row in history.timeline(db, node="n1")] == ["r3", "r2"]
    assert other["verdict_file"]


def test_the_history_command_shows_one_cluster_by_default(two_clusters, capsys):
    from cluster_preflight.cli import main as cli  # pylint: disable=import-outside-toplevel

    assert cli.main(["history", "--db", two_clusters, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    # The newest run is cluster lab-b's health check: its nodes, not cluster A's runs under the same names.
    assert data["cluster"] == "lab-b" and "the newest run's" in data["scope"]
    assert {node: [run["run_id"] for run in runs] for node, runs in data["timelines"].items()} == {
        "n1": ["run05", "run02"], "n2": ["run02"], "n3": ["run05"]}
    assert cli.main(["history", "--db", two_clusters, "--cluster", "/srv/clusters/a/hosts.yml",
                     "--kind", "bringup", "--kind", "bringup-check"]) == 0
    out = capsys.readouterr().out
    assert "Cluster: /srv/clusters/a/hosts.yml; runs: bringup, bringup-check" in out
    assert "bringup-check fail" in out and " gate " not in out
    assert cli.main(["history", "--db", two_clusters, "--all-clusters", "--node", "n1", "--json"]) == 0
    assert [run["run_id"] for run in json.loads(capsys.readouterr().out)["timelines"]["n1"]] == [
        "run05", "run04", "run02", "run01"]


def test_the_history_command_takes_the_cluster_of_an_inventory(tmp_path, capsys):
    from cluster_preflight.cli import main as cli  # pylint: disable=import-outside-toplevel

    db = str(tmp_path / "history.sqlite")
    named = tmp_path / "b" / "hosts.yml"
    named.parent.mkdir()
    named.write_text("cluster:\n  hosts:\n    n1: {}\n  vars:\n    preflight_cluster: lab-b\n")
    plain = tmp_path / "a" / "hosts.yml"
    plain.parent.mkdir()
    plain.write_text("cluster:\n  hosts:\n    n1: {}\n")
    _record(db, 1, {"name": "", "inventory": [str(plain)]})
    _record(db, 2, {"name": "lab-b", "inventory": ["/elsewhere/hosts.yml"]}, failed=("n1",))
    assert cli.main(["history", "--db", db, "-i", str(plain), "--json"]) == 0
    assert [run["run_id"] for run in json.loads(capsys.readouterr().out)["timelines"]["n1"]] == ["run01"]
    assert cli.main(["history", "--db", db, "-i", str(named), "--json"]) == 0
    assert [run["run_id"] for run in json.loads(capsys.readouterr().out)["timelines"]["n1"]] == ["run02"]
