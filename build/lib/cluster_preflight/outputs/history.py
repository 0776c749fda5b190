# -*- coding: utf-8 -*-
"""The run history: every gate, health check and bring-up verdict in one SQLite database.

Controller layer only (stdlib ``sqlite3``; never shipped to a node).  The database is
``<results_dir>/history.sqlite`` unless ``preflight_history_db`` names another path ("none" switches it
off).  It is opened in WAL mode with a busy timeout, so several runs on one controller can record at the
same moment, and every write is one transaction.  Its schema is versioned (``PRAGMA user_version``) and
grows only through :data:`MIGRATIONS`, applied in order.

:func:`record` never raises: a corrupt, locked, read-only or misplaced database gives a warning text
(found / expected / fix) and the verdict stands as it is.  The query functions (:func:`timeline`,
:func:`flaky`, :func:`busbw_trend`, :func:`last_pass`, :func:`first_failure`, :func:`recent_statuses`)
open the database read-only and raise :class:`HistoryError` with one line when it cannot be read.

Every run carries its cluster (:func:`cluster_key`: the ``preflight_cluster`` name, else the inventory it ran on)
and its kind; a bring-up in check mode is kind ``bringup-check`` (:data:`CHECK_KIND`).  The queries take
``cluster`` (None: every cluster) and ``kinds`` (default :data:`REAL_KINDS`: a dry run proves nothing about a node).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import pathlib
import re
import sqlite3
import time

from cluster_preflight.verdict.value import findings_of

DB_FILE = "history.sqlite"
OFF = "none"
BUSY_TIMEOUT_MS = 5000
FILE_MODE = 0o640
# The kind a verdict file stands for, as the database names it (the action plugin's kinds on the left).
KINDS = {"preflight": "gate", "gate": "gate", "healthcheck": "healthcheck", "bringup": "bringup"}
# A bring-up run in check mode (``--check``): recorded, but no run a node is judged by.
CHECK_KIND = "bringup-check"
REAL_KINDS = ("gate", "healthcheck", "bringup")
ALL_KINDS = REAL_KINDS + (CHECK_KIND,)
FAILING = ("fail",)
GOOD = ("pass", "warn")

# Each migration brings the schema from version N-1 to N; never edit one that has shipped, add the next.
MIGRATIONS = (
    (1, (
        """CREATE TABLE runs (
               id INTEGER PRIMARY KEY,
               run_id TEXT NOT NULL,
               kind TEXT NOT NULL CHECK (kind IN ('gate', 'healthcheck', 'bringup')),
               started TEXT,
               finished TEXT NOT NULL,
               status TEXT NOT NULL,
               hosts INTEGER NOT NULL,
               bound_seconds INTEGER,
               versions TEXT NOT NULL DEFAULT '{}',
               verdict_path TEXT,
               UNIQUE (run_id, kind))""",
        """CREATE TABLE node_results (
               run INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
               node TEXT NOT NULL,
               status TEXT NOT NULL,
               summary TEXT NOT NULL DEFAULT '',
               PRIMARY KEY (run, node))""",
        """CREATE TABLE findings (
               run INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
               node TEXT NOT NULL,
               "check" TEXT NOT NULL,
               status TEXT NOT NULL,
               found TEXT NOT NULL DEFAULT '',
               expected TEXT NOT NULL DEFAULT '',
               fix TEXT NOT NULL DEFAULT '')""",
        """CREATE TABLE busbw (
               run INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
               scope TEXT NOT NULL CHECK (scope IN ('node', 'pair', 'all')),
               subject TEXT NOT NULL,
               size_bytes INTEGER,
               busbw_gbps REAL NOT NULL)""",
        "CREATE INDEX runs_finished ON runs (finished)",
    )),
    (2, (
        # Whether the node answered at every stage (NULL for runs recorded before), and the indexes the
        # per-node queries walk (a node's runs newest first; a node's failures of one check).
        "ALTER TABLE node_results ADD COLUMN reachable INTEGER",
        "CREATE INDEX node_results_node ON node_results (node, run)",
        "CREATE INDEX findings_node_check ON findings (node, \"check\", run)",
        "CREATE INDEX busbw_subject ON busbw (subject, run)",
    )),
    (3, (
        # The cluster a run belongs to (cluster_key: a name, else its inventory; NULL for runs recorded
        # before), the inventory it ran on, and whether it was a dry run (check mode).
        "ALTER TABLE runs ADD COLUMN cluster TEXT",
        "ALTER TABLE runs ADD COLUMN inventory TEXT",
        "ALTER TABLE runs ADD COLUMN check_mode INTEGER NOT NULL DEFAULT 0",
        "CREATE INDEX runs_cluster ON runs (cluster, finished)",
    )),
)
SCHEMA_VERSION = MIGRATIONS[-1][0]


class HistoryError(RuntimeError):
    """The history database cannot be read; the message is one line."""


def cluster_key(cluster):
    """The key a run's cluster is filed under: ``cluster`` (a verdict's ``cluster``: ``{name, inventory}``) by its
    name when it has one, else by its inventory sources; None when the run says neither."""
    cluster = cluster or {}
    name = str(cluster.get("name") or "").strip()
    if name:
        return name
    sources = [str(source) for source in cluster.get("inventory") or [] if source]
    return ",".join(sources) or None


def db_path(setting, results_dir):
    """The database a run uses: ``setting`` (``preflight_history_db``) as given, ``<results_dir>/history.sqlite``
    when it is empty, ``None`` when it is "none"."""
    text = str(setting or "").strip()
    if text.lower() == OFF:
        return None
    return os.path.abspath(text) if text else os.path.join(os.path.abspath(results_dir), DB_FILE)


# --------------------------------------------------------------------------
# Opening and migrating


def connect(path, readonly=False):
    """A connection to ``path`` in autocommit mode (transactions are explicit), WAL, busy timeout set.
    ``readonly`` opens it with ``mode=ro`` and never creates it."""
    if readonly:
        if not os.path.isfile(path):
            raise HistoryError("no run history at %s (a run records one; preflight_history_db moves it)" % path)
        # As a URI, so that the path's own characters (#, ?, %) are quoted, never read as URI syntax.
        uri = pathlib.Path(os.path.abspath(path)).as_uri() + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000.0, isolation_level=None)
    else:
        if not os.path.exists(path) and os.path.isdir(os.path.dirname(path) or "."):
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, FILE_MODE))  # the runs name every node: 0640
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000.0, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA busy_timeout = %d" % BUSY_TIMEOUT_MS)
    conn.execute("PRAGMA foreign_keys = ON")
    if not readonly:
        _wal(conn)
    return conn


def _wal(conn):
    # Switching to WAL takes a lock that the busy handler does not always wait for: retry within the timeout.
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000.0
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def schema_version(conn):
    return conn.execute("PRAGMA user_version").fetchone()[0]


def migrate(conn, upto=SCHEMA_VERSION):
    """Apply every migration above the database's version up to ``upto``, each in its own transaction
    (another process migrating at the same time is waited for, and what it did is not done twice)."""
    for version, statements in MIGRATIONS:
        if version > upto or schema_version(conn) >= version:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            if schema_version(conn) < version:
                for statement in statements:
                    conn.execute(statement)
                conn.execute("PRAGMA user_version = %d" % version)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return schema_version(conn)


# --------------------------------------------------------------------------
# Recording a verdict


def node_summary(verdict, host):
    """The node's first finding as ``check: found`` (a failure before a blocked check before a warning)."""
    items = [item for item in findings_of({"hosts": [host], "nodes": {host: verdict["nodes"][host]}})]
    order = {"fail": 0, "unverified": 1, "warn": 2}
    items.sort(key=lambda item: order.get(item.status, 3))
    return "%s: %s" % (items[0].check, items[0].found) if items else ""


def busbw_rows(verdict):
    """``(scope, subject, size_bytes, busbw_gbps)``: the all-node run per size, each node's slowest rank per
    size, and every localisation launch (a pair ``a+b``, a loopback its node; their largest size only)."""
    gate = verdict.get("allreduce") or {}
    rows = [("all", "all", row.get("size_bytes"), row["busbw_gbps"]) for row in gate.get("sizes") or []
            if row.get("busbw_gbps") is not None]
    slowest = {}
    for rank in gate.get("ranks") or []:
        for row in rank.get("bandwidth") or []:
            if rank.get("host") and row.get("busbw_gbps") is not None:
                key = (rank["host"], row.get("size_bytes"))
                slowest[key] = min(slowest.get(key, row["busbw_gbps"]), row["busbw_gbps"])
    rows += [("node", host, size, value) for (host, size), value in sorted(slowest.items(), key=str)]
    for item in (verdict.get("localize") or {}).get("rounds") or []:
        for launch in item.get("launches") or []:
            hosts = list(launch.get("hosts") or [])
            if launch.get("busbw_gbps") is None or not hosts:
                continue
            scope = "pair" if len(hosts) > 1 else "node"
            rows.append((scope, "+".join(sorted(hosts)), None, launch["busbw_gbps"]))
    return rows


def _versions(verdict):
    try:
        versions = {"cluster_preflight": importlib.metadata.version("cluster-preflight")}
    except importlib.metadata.PackageNotFoundError:  # a checkout used without its editable install
        versions = {}
    versions.update((key, value) for key, value in ((verdict.get("allreduce") or {}).get("versions") or {}).items()
                    if value is not None)
    return versions


def _insert(conn, verdict, kind, verdict_path, started):
    conn.execute("DELETE FROM runs WHERE run_id = ? AND kind = ?", (str(verdict.get("run_id") or ""), kind))
    cluster = verdict.get("cluster") or {}
    cursor = conn.execute(
        "INSERT INTO runs (run_id, kind, started, finished, status, hosts, bound_seconds, versions, verdict_path, "
        "cluster, inventory, check_mode) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (str(verdict.get("run_id") or ""), kind, started, verdict.get("finished") or _now(), verdict["status"],
         len(verdict["hosts"]), verdict.get("bound_seconds"), json.dumps(_versions(verdict), sort_keys=True),
         verdict_path, cluster_key(cluster), ",".join(str(item) for item in cluster.get("inventory") or []) or None,
         int(bool(verdict.get("check_mode")))))
    run = cursor.lastrowid
    conn.executemany("INSERT INTO node_results (run, node, status, summary, reachable) VALUES (?, ?, ?, ?, ?)",
                     [(run, host, verdict["nodes"][host]["status"], node_summary(verdict, host),
                       None if verdict["nodes"][host].get("reachable") is None
                       else int(bool(verdict["nodes"][host]["reachable"])))
                      for host in verdict["hosts"]])
    conn.executemany("INSERT INTO findings (run, node, \"check\", status, found, expected, fix) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?)",
                     [(run, item.host, item.check, item.status, item.found, item.expected, item.fix)
                      for item in findings_of(verdict)])
    conn.executemany("INSERT INTO busbw (run, scope, subject, size_bytes, busbw_gbps) VALUES (?, ?, ?, ?, ?)",
                     [(run,) + row for row in busbw_rows(verdict)])
    return run


def _now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def problem_text(path, exc):
    """A warning (found / expected / fix) for a database that could not take this run."""
    text = str(exc)
    if isinstance(exc, sqlite3.DatabaseError) and ("not a database" in text or "malformed" in text):
        found = "%s is not a readable SQLite database (%s)" % (path, text)
        fix = ("move it aside (mv %s %s.corrupt): the next run starts a new history there; or set "
               "preflight_history_db to another path" % (path, path))
    elif "locked" in text or "busy" in text:
        found = "%s stayed locked by another process for over %d ms (%s)" % (path, BUSY_TIMEOUT_MS, text)
        fix = ("find the process holding it (fuser %s) and let it finish or stop it; the next run records "
               "again" % path)
    elif "readonly" in text or "read-only" in text or isinstance(exc, PermissionError):
        found = "%s is read-only for uid %d (%s)" % (path, os.geteuid(), text)
        fix = "make %s and its directory writable by this user, or set preflight_history_db to a path that is" % path
    elif not os.path.isdir(os.path.dirname(path) or "."):
        found = "the directory of %s does not exist or is not a directory" % path
        fix = "create %s, or set preflight_history_db to a path in an existing directory" % os.path.dirname(path)
    else:
        found = "%s could not be written: %s" % (path, text)
        fix = "fix what the error names, or set preflight_history_db to another path (\"none\" switches it off)"
    return ("run history not recorded. Found: %s. Expected: a writable SQLite database at %s (schema version %d). "
            "Fix: %s. The verdict is unchanged." % (found, path, SCHEMA_VERSION, fix))


def record(path, verdict, kind, verdict_path, started=None):
    """Add ``verdict`` (a gate, health check or bring-up verdict dict) to the database at ``path``.

    Returns ``{recorded, warning}``; never raises: whatever goes wrong is the warning text (found /
    expected / fix), and the run's verdict does not change.  The same ``run_id`` and kind again replace
    the earlier rows.  ``started``: when the run began (ISO text), when known."""
    if not path:
        return {"recorded": False, "warning": None}
    conn = None
    try:
        conn = connect(path)
        migrate(conn)
        conn.execute("BEGIN IMMEDIATE")
        try:
            _insert(conn, verdict, KINDS.get(kind, kind), verdict_path, started)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return {"recorded": True, "warning": None}
    except Exception as exc:  # pylint: disable=broad-except  # a history problem never changes the verdict
        return {"recorded": False, "warning": problem_text(path, exc)}
    finally:
        if conn is not None:
            try:
                conn.close()
            except Exception:  # pylint: disable=broad-except
                pass


# --------------------------------------------------------------------------
# Queries (read-only)


def parse_since(text, now=None):
    """``--since``: an ISO date or time (``2026-11-20``, ``2026-11-20T10:00:00Z``) or an age (``24h``, ``7d``,
    ``30m``, ``90s``) as the ``%Y-%m-%dT%H:%M:%SZ`` text the database compares; ValueError otherwise."""
    text = str(text).strip()
    match = re.fullmatch(r"(\d+)\s*([smhd])", text)
    now = now or datetime.datetime.now(datetime.timezone.utc)
    if match:
        seconds = int(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
        when = now - datetime.timedelta(seconds=seconds)
    else:
        try:
            when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError("since %r is neither an ISO date (2026-11-20) nor an age (24h, 7d)" % text) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.timezone.utc)
    return when.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _query(path, sql, params=()):
    try:
        conn = connect(path, readonly=True)
    except sqlite3.Error as exc:
        raise HistoryError("cannot open the run history %s: %s" % (path, exc)) from None
    try:
        version = schema_version(conn)
        if version < SCHEMA_VERSION:
            raise HistoryError("the run history %s has schema version %d, this checkout reads %d: the next run "
                               "migrates it" % (path, version, SCHEMA_VERSION))
        return [dict(row) for row in conn.execute(sql, params).fetchall()]
    except sqlite3.Error as exc:
        raise HistoryError("cannot read the run history %s: %s" % (path, exc)) from None
    finally:
        conn.close()


# The kind a run is shown as (a dry-run bring-up is ``bringup-check``), for a query over ``runs r``.
KIND_SQL = "(CASE WHEN r.check_mode THEN '%s' ELSE r.kind END)" % CHECK_KIND


def _runs_filter(cluster, kinds):
    """``(sql, params)``: the condition on ``runs r`` for one cluster (None: every cluster) and these kinds (None:
    :data:`REAL_KINDS`)."""
    kinds = tuple(kinds) if kinds else REAL_KINDS
    unknown = sorted(set(kinds) - set(ALL_KINDS))
    if unknown:
        raise ValueError("unknown run kind %s (kinds: %s)" % (", ".join(unknown), ", ".join(ALL_KINDS)))
    sql = "(? IS NULL OR r.cluster = ?) AND %s IN (%s)" % (KIND_SQL, ", ".join("?" * len(kinds)))
    return sql, (cluster, cluster) + kinds


def timeline(path, node=None, since=None, limit=20, cluster=None, kinds=None):
    """Each node's runs, newest first (at most ``limit`` per node): ``{node, run_id, kind, finished, status,
    summary, cluster}``; only ``node`` when given, only runs finished at or after ``since`` (see
    :func:`parse_since`), only ``cluster``'s runs of ``kinds`` (see :func:`_runs_filter`)."""
    where, params = _runs_filter(cluster, kinds)
    return _query(path, """
        SELECT node, run_id, kind, finished, status, summary, cluster FROM (
            SELECT n.node, r.run_id, %s AS kind, r.finished, n.status, n.summary, r.cluster,
                   ROW_NUMBER() OVER (PARTITION BY n.node ORDER BY r.finished DESC, r.id DESC) AS nth
            FROM node_results n JOIN runs r ON r.id = n.run
            WHERE (? IS NULL OR n.node = ?) AND (? IS NULL OR r.finished >= ?) AND %s)
        WHERE nth <= ? ORDER BY node, finished DESC""" % (KIND_SQL, where),
                  (node, node, since, since) + params + (int(limit),))


def recent_statuses(path, nodes=None, limit=10, cluster=None, kinds=None):
    """``{node: [status, ...]}``, oldest first, each node's last ``limit`` runs (for sparklines) of ``cluster``'s
    runs of ``kinds``."""
    wanted = set(nodes) if nodes is not None else None
    out = {}
    for row in reversed(timeline(path, limit=limit, cluster=cluster, kinds=kinds)):
        if wanted is None or row["node"] in wanted:
            out.setdefault(row["node"], []).append(row["status"])
    return out


def flaky(path, window=10, min_failures=1, cluster=None, kinds=None):
    """Nodes that failed at least ``min_failures`` of their last ``window`` runs and passed at least one:
    ``{node, failed, runs, text}`` ("gpu02 failed 3 of its last 10 runs"), most failures first."""
    where, params = _runs_filter(cluster, kinds)
    rows = _query(path, """
        SELECT node, SUM(status = 'fail') AS failed, SUM(status IN ('pass', 'warn')) AS good, COUNT(*) AS runs
        FROM (SELECT n.node, n.status,
                     ROW_NUMBER() OVER (PARTITION BY n.node ORDER BY r.finished DESC, r.id DESC) AS nth
              FROM node_results n JOIN runs r ON r.id = n.run WHERE %s)
        WHERE nth <= ? GROUP BY node""" % where, params + (int(window),))
    found = [{"node": row["node"], "failed": row["failed"], "runs": row["runs"],
              "text": "%s failed %d of its last %d runs" % (row["node"], row["failed"], row["runs"])}
             for row in rows if row["failed"] >= min_failures and row["good"]]
    return sorted(found, key=lambda item: (-item["failed"], item["node"]))


def busbw_trend(path, subject, scope=None, cluster=None, kinds=None):
    """``subject``'s bus bandwidth run by run, oldest first: ``{run_id, kind, finished, scope, size_bytes,
    busbw_gbps}`` at the largest size each run measured (a pair is ``a+b``, names sorted; ``all`` the
    all-node run)."""
    where, params = _runs_filter(cluster, kinds)
    return _query(path, """
        SELECT r.run_id, %s AS kind, r.finished, b.scope, b.size_bytes, MIN(b.busbw_gbps) AS busbw_gbps
        FROM busbw b JOIN runs r ON r.id = b.run
        WHERE b.subject = ? AND (? IS NULL OR b.scope = ?) AND %s
          AND COALESCE(b.size_bytes, -1) = (SELECT COALESCE(MAX(size_bytes), -1) FROM busbw
                                            WHERE run = b.run AND subject = b.subject AND scope = b.scope)
        GROUP BY r.id, b.scope ORDER BY r.finished, r.id""" % (KIND_SQL, where), (subject, scope, scope) + params)


def subjects(path, scope, cluster=None, kinds=None):
    """Every subject the database has bus bandwidth of in ``scope`` (node, pair or all), by name."""
    where, params = _runs_filter(cluster, kinds)
    return [row["subject"] for row in _query(path, "SELECT DISTINCT b.subject FROM busbw b JOIN runs r ON r.id = b.run "
                                                   "WHERE b.scope = ? AND %s ORDER BY b.subject" % where,
                                             (scope,) + params)]


def last_pass(path, node=None, cluster=None, kinds=None):
    """The last run that passed (``node`` given: in which that node was pass or warn), or None:
    ``{run_id, kind, finished, verdict_path, cluster}``."""
    where, params = _runs_filter(cluster, kinds)
    if node is None:
        rows = _query(path, "SELECT r.run_id, %s AS kind, r.finished, r.verdict_path, r.cluster FROM runs r "
                            "WHERE r.status = 'pass' AND %s ORDER BY r.finished DESC, r.id DESC LIMIT 1"
                      % (KIND_SQL, where), params)
    else:
        rows = _query(path, "SELECT r.run_id, %s AS kind, r.finished, r.verdict_path, r.cluster FROM node_results n "
                            "JOIN runs r ON r.id = n.run WHERE n.node = ? AND n.status IN ('pass', 'warn') AND %s "
                            "ORDER BY r.finished DESC, r.id DESC LIMIT 1" % (KIND_SQL, where), (node,) + params)
    return rows[0] if rows else None


def latest_cluster(path, kinds=None):
    """The cluster of the newest run of ``kinds`` (None when it has none, or the database has no run)."""
    where, params = _runs_filter(None, kinds)
    rows = _query(path, "SELECT r.cluster FROM runs r WHERE %s ORDER BY r.finished DESC, r.id DESC LIMIT 1" % where,
                  params)
    return rows[0]["cluster"] if rows else None


def first_failure(path, node, check, cluster=None, kinds=None):
    """When ``node`` first failed ``check`` in its current streak of runs failing it (its latest run
    included): ``{run_id, kind, finished, found, runs}`` (``runs``: the streak's length), or None when its
    latest run does not fail ``check``.  A drain reason can then say since when."""
    where, params = _runs_filter(cluster, kinds)
    rows = _query(path, """
        SELECT r.run_id, %s AS kind, r.finished, f.found, f.status AS failing
        FROM node_results n JOIN runs r ON r.id = n.run
        LEFT JOIN findings f ON f.run = n.run AND f.node = n.node AND f."check" = ? AND f.status = 'fail'
        WHERE n.node = ? AND %s ORDER BY r.finished DESC, r.id DESC""" % (KIND_SQL, where), (check, node) + params)
    streak = []
    for row in rows:
        if row["failing"] is None:
            break
        streak.append(row)
    if not streak:
        return None
    first = streak[-1]
    return {"run_id": first["run_id"], "kind": first["kind"], "finished": first["finished"], "found": first["found"],
            "runs": len(streak)}
