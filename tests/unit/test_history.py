"""The run history (cluster_preflight/outputs/history.py): recording, the queries, concurrent writers, a database
that cannot take the run (never an exception), and the migrations."""

import multiprocessing
import os
import sqlite3
import tempfile

import pytest

from cluster_preflight.outputs import history
from report_helpers import synthetic_verdict

HOSTS = ["n1", "n2", "n3"]


def _run(db, number, failed=(), kind="preflight", busbw=None):
    verdict = synthetic_verdict(hosts=HOSTS, failed=failed, run_id="run%02d" % number,
                                finished="2026-11-%02dT10:00:00Z" % number, busbw=busbw, localize=True)
    result = history.record(db, verdict, kind, "/results/run%02d/verdict.json" % number)
    assert result == {"recorded": True, "warning": None}
    return verdict


@pytest.fixture
def db(tmp_path):
    return str(tmp_path / "history.sqlite")


def test_record_writes_every_table(db):
    _run(db, 1, failed=("n2",))
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == history.SCHEMA_VERSION
    run = conn.execute("SELECT run_id, kind, status, hosts, bound_seconds, versions, verdict_path FROM runs").fetchall()
    assert run == [("run01", "gate", "fail", 3, 600, run[0][5], "/results/run01/verdict.json")]
    assert '"torch": "2.13.0+cpu"' in run[0][5]
    nodes = dict(conn.execute("SELECT node, status FROM node_results").fetchall())
    assert nodes == {"n1": "pass", "n2": "fail", "n3": "pass"}
    summary = conn.execute("SELECT summary FROM node_results WHERE node = 'n2'").fetchone()[0]
    assert summary == "allreduce.ranks: allreduce broken on n2: value 1"
    findings = conn.execute('SELECT node, "check", status, found, expected, fix FROM findings').fetchall()
    assert findings == [("n2", "allreduce.ranks", "fail", "allreduce broken on n2: value 1", "allreduce as configured",
                         "fix allreduce on n2, then re-run")]
    scopes = dict(conn.execute("SELECT scope, COUNT(*) FROM busbw GROUP BY scope").fetchall())
    assert scopes == {"all": 2, "node": 2 * len(HOSTS), "pair": 1}  # two sizes per node; the failed loopback: none
    assert os.stat(db).st_mode & 0o777 == 0o640


def test_the_same_run_again_replaces_its_rows(db):
    _run(db, 1, failed=("n2",))
    _run(db, 1)
    assert [row["status"] for row in history.timeline(db, node="n2")] == ["pass"]


def test_timeline_per_node_newest_first_with_since_and_limit(db):
    for number in range(1, 6):
        _run(db, number, failed=("n2",) if number == 3 else ())
    rows = history.timeline(db, node="n2", limit=3)
    assert [(row["run_id"], row["status"]) for row in rows] == [("run05", "pass"), ("run04", "pass"),
                                                                ("run03", "fail")]
    assert rows[2]["summary"].startswith("allreduce.ranks: ")
    since = history.parse_since("2026-11-04")
    assert {row["run_id"] for row in history.timeline(db, since=since)} == {"run04", "run05"}
    assert len(history.timeline(db, limit=2)) == 2 * len(HOSTS)


def test_parse_since_takes_dates_and_ages():
    import datetime

    now = datetime.datetime(2026, 11, 25, 12, 0, tzinfo=datetime.timezone.utc)
    assert history.parse_since("24h", now) == "2026-11-24T12:00:00Z"
    assert history.parse_since("7d", now) == "2026-11-18T12:00:00Z"
    assert history.parse_since("2026-11-20T08:30:00Z") == "2026-11-20T08:30:00Z"
    with pytest.raises(ValueError, match="neither an ISO date"):
        history.parse_since("last tuesday")


def test_flaky_counts_failures_in_the_window(db):
    for number in range(1, 13):
        _run(db, number, failed=("n3",) + (("n2",) if number in (2, 9, 11, 12) else ()))
    found = history.flaky(db, window=10)
    assert [item["text"] for item in found] == ["n2 failed 3 of its last 10 runs"]  # n3 always fails: broken
    assert history.flaky(db, window=2) == []  # n2 failed both of its last 2: not flaky, failing


def test_first_failure_is_the_start_of_the_current_streak(db):
    for number, failed in ((1, ("n2",)), (2, ()), (3, ("n2",)), (4, ("n2",)), (5, ("n2",))):
        _run(db, number, failed=failed)
    first = history.first_failure(db, "n2", "allreduce.ranks")
    assert (first["run_id"], first["runs"], first["found"]) == ("run03", 3, "allreduce broken on n2: value 1")
    assert history.first_failure(db, "n1", "allreduce.ranks") is None
    _run(db, 6)
    assert history.first_failure(db, "n2", "allreduce.ranks") is None


def test_last_pass_per_node_and_for_the_run(db):
    _run(db, 1)
    _run(db, 2, failed=("n2",))
    assert history.last_pass(db, "n2")["run_id"] == "run01"
    assert history.last_pass(db, "n1")["run_id"] == "run02"
    assert history.last_pass(db)["run_id"] == "run01"
    assert history.last_pass(db, "nowhere") is None


def test_busbw_trend_at_the_largest_size(db):
    for number, value in ((1, 20.0), (2, 12.5), (3, 19.0)):
        _run(db, number, busbw={"n1": value})
    trend = history.busbw_trend(db, "n1", scope="node")
    assert [(point["run_id"], point["busbw_gbps"], point["size_bytes"]) for point in trend] == [
        ("run01", 20.0, 16777216), ("run02", 12.5, 16777216), ("run03", 19.0, 16777216)]
    assert [point["busbw_gbps"] for point in history.busbw_trend(db, "n1+n2", scope="pair")] == [8.5] * 3
    assert history.subjects(db, "pair") == ["n1+n2"]


def test_recent_statuses_oldest_first(db):
    for number in range(1, 4):
        _run(db, number, failed=("n2",) if number == 2 else ())
    assert history.recent_statuses(db, ["n2"], limit=10) == {"n2": ["pass", "fail", "pass"]}


def _record_many(db, first, barrier):
    barrier.wait()
    results = []
    for number in range(first, first + 5):
        verdict = synthetic_verdict(hosts=HOSTS, run_id="p%02d" % number, finished="2026-11-%02dT10:00:00Z" % number)
        results.append(history.record(db, verdict, "healthcheck", "x"))
    return results


def _child(db, first, barrier, queue):
    queue.put(_record_many(db, first, barrier))


def test_two_processes_record_at_the_same_time(db):
    context = multiprocessing.get_context("fork")
    barrier, queue = context.Barrier(2), context.Queue()
    children = [context.Process(target=_child, args=(db, first, barrier, queue)) for first in (1, 11)]
    for child in children:
        child.start()
    results = [queue.get(timeout=60) for _ in children]
    for child in children:
        child.join(60)
    assert all(item == {"recorded": True, "warning": None} for batch in results for item in batch)
    runs = {row["run_id"] for row in history.timeline(db, node="n1", limit=100)}
    assert runs == {"p%02d" % number for number in list(range(1, 6)) + list(range(11, 16))}


def test_a_corrupt_database_is_a_warning(db):
    with open(db, "wb") as handle:
        handle.write(b"this is not sqlite\x00\xff" * 200)
    result = history.record(db, synthetic_verdict(hosts=HOSTS), "preflight", "x")
    assert result["recorded"] is False
    assert "is not a readable SQLite database" in result["warning"]
    assert "Fix: move it aside (mv %s %s.corrupt)" % (db, db) in result["warning"]
    with pytest.raises(history.HistoryError, match="cannot"):
        history.timeline(db)


def test_a_missing_directory_is_a_warning(tmp_path):
    parent = tmp_path / "a-file"
    parent.write_text("not a directory")
    result = history.record(str(parent / "history.sqlite"), synthetic_verdict(hosts=HOSTS), "preflight", "x")
    assert result["recorded"] is False
    assert "does not exist or is not a directory" in result["warning"]
    assert "Expected: a writable SQLite database" in result["warning"]


def _record_as_nobody(db, queue):
    os.setgid(65534)
    os.setuid(65534)
    queue.put(history.record(db, synthetic_verdict(hosts=HOSTS), "preflight", "x"))


def test_a_read_only_database_is_a_warning():
    place = tempfile.mkdtemp(dir="/tmp", prefix="history-ro-")
    try:
        db = os.path.join(place, "history.sqlite")
        _run(db, 1)
        os.chmod(db, 0o444)
        os.chmod(place, 0o555)
        if os.geteuid() == 0:  # root writes whatever the mode: record as an account that may only read
            context = multiprocessing.get_context("fork")
            queue = context.Queue()
            child = context.Process(target=_record_as_nobody, args=(db, queue))
            child.start()
            result = queue.get(timeout=60)
            child.join(60)
        else:
            result = history.record(db, synthetic_verdict(hosts=HOSTS), "preflight", "x")
        assert result["recorded"] is False
        assert "is read-only for uid" in result["warning"]
        assert "run01" in {row["run_id"] for row in history.timeline(db)}
    finally:
        os.chmod(place, 0o755)
        for name in os.listdir(place):
            os.unlink(os.path.join(place, name))
        os.rmdir(place)


def test_a_locked_database_is_a_warning(db, monkeypatch):
    _run(db, 1)
    monkeypatch.setattr(history, "BUSY_TIMEOUT_MS", 200)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        result = history.record(db, synthetic_verdict(hosts=HOSTS, run_id="run02"), "preflight", "x")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert result["recorded"] is False
    assert "stayed locked by another process for over 200 ms" in result["warning"]


def test_switched_off_and_default_paths(tmp_path):
    assert history.db_path("none", str(tmp_path)) is None
    assert history.db_path("", str(tmp_path)) == str(tmp_path / "history.sqlite")
    assert history.db_path(str(tmp_path / "x.db"), "results") == str(tmp_path / "x.db")
    assert history.record(None, synthetic_verdict(hosts=HOSTS), "preflight", "x") == {"recorded": False,
                                                                                      "warning": None}


def test_migrations_from_an_empty_database(db):
    conn = history.connect(db)
    assert history.schema_version(conn) == 0
    assert history.migrate(conn) == history.SCHEMA_VERSION == len(history.MIGRATIONS)
    columns = {row[1] for row in conn.execute("PRAGMA table_info(node_results)")}
    assert "reachable" in columns
    conn.close()


def test_migration_from_schema_version_1_keeps_its_runs(db):
    conn = history.connect(db)
    assert history.migrate(conn, upto=1) == 1
    conn.execute("INSERT INTO runs (run_id, kind, finished, status, hosts) VALUES ('old', 'gate', "
                 "'2026-11-01T00:00:00Z', 'pass', 1)")
    conn.execute("INSERT INTO node_results (run, node, status) VALUES (1, 'n1', 'pass')")
    assert "reachable" not in {row[1] for row in conn.execute("PRAGMA table_info(node_results)")}
    conn.close()
    with pytest.raises(history.HistoryError, match="schema version 1"):
        history.timeline(db)
    _run(db, 2)
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == history.SCHEMA_VERSION
    assert conn.execute("SELECT reachable FROM node_results WHERE node = 'n1' ORDER BY run").fetchall() == [
        (None,), (1,)]
    # A run recorded before runs carried their cluster has none, and is no dry run.
    assert conn.execute("SELECT cluster, check_mode FROM runs WHERE run_id = 'old'").fetchone() == (None, 0)
    conn.close()
    assert [row["run_id"] for row in history.timeline(db, node="n1")] == ["run02", "old"]
