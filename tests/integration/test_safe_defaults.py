"""pgcdc run writes heartbeats by default, and --heartbeat-interval 0 turns them off (issue 18):
seen in the WAL itself, through a test_decoding slot created before the run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg

Conn = psycopg.Connection[tuple[object, ...]]


def _heartbeats(pg_conn: Conn, watcher: str) -> int:
    rows = pg_conn.execute("SELECT data FROM pg_logical_slot_get_changes(%s, NULL, NULL)",
                           (watcher,)).fetchall()
    return sum(1 for (data,) in rows if "prefix: pgcdc.heartbeat" in str(data))


def _run(dsn: str, tmp: Path, *extra: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pgcdc", "run", "--dsn", dsn, "--sink", "null", "--tables",
         "public.t", "--progress-file", str(tmp / "p.json"), "--catalog-dir",
         str(tmp / "catalog"), "--exit-when-caught-up", *extra],
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


def test_heartbeats_are_written_by_default_and_zero_turns_them_off(
        pg_conn: Conn, pg_dsn: str, tmp_path: Path) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    _run(pg_dsn, tmp_path)  # creates pgcdc's slot
    pg_conn.execute("SELECT pg_create_logical_replication_slot('watcher', 'test_decoding')")
    try:
        pg_conn.execute("INSERT INTO t VALUES (1)")
        _run(pg_dsn, tmp_path, "--heartbeat-interval", "0")
        assert _heartbeats(pg_conn, "watcher") == 0
        pg_conn.execute("INSERT INTO t VALUES (2)")
        _run(pg_dsn, tmp_path)  # the default: the first status update writes one
        assert _heartbeats(pg_conn, "watcher") >= 1
    finally:
        pg_conn.execute("SELECT pg_drop_replication_slot('watcher')")
