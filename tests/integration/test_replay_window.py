"""Restarts whose replay window holds DDL transactions (issue 15.5): ``pgcdc run`` killed
with -9 after it persisted a later catalog version, before the flush passed a transaction
whose DDL changed nothing; the restart must succeed and every change arrive, in Kafka and
in the lake."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from core.wire import topic_name
from decoder.slot import current_wal_lsn, slot_info
from pgcdc.clone import compare
from streaming import job
from tests.oracle import PgcdcProcess, read_topic

pytestmark = pytest.mark.spark

Conn = psycopg.Connection[tuple[object, ...]]


def _entries(catalog: Path) -> int:
    log = catalog / "catalog.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def _folded(events: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The topic folded by key: the last image of each row that was not deleted."""
    rows: dict[int, dict[str, Any]] = {}
    for event in events:
        key = event["key"]["id"]
        if event["op"] == "d":
            rows.pop(key, None)
        else:
            rows[key] = event["after"]
    return rows


def test_restart_after_kill_with_a_no_op_ddl_transaction_in_the_replay_window(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, spark: Any,
        tmp_path: Path) -> None:
    pg_conn.execute("CREATE TABLE ledger (id int PRIMARY KEY, v text)")
    pg_conn.execute("CREATE TABLE other (id int PRIMARY KEY)")
    pg_conn.execute("CREATE PUBLICATION pgcdc FOR TABLE ledger, other")
    progress = tmp_path / "progress.json"
    catalog = progress.with_suffix(".catalog")
    pgcdc = PgcdcProcess(pg_dsn, kafka_servers, topic_prefix, progress)
    pgcdc.catch_up(pg_conn)  # the slot (two-phase), the publication, the catalog history
    versions = _entries(catalog)
    pg_conn.execute("INSERT INTO ledger SELECT g, 'before' FROM generate_series(1, 10) g")

    # A prepared transaction holds the flush below its PREPARE until its outcome: everything
    # after it is what the slot sends again after the kill.  (Another table: its lock would
    # hold the ALTER TABLEs back.)
    held = psycopg.connect(pg_dsn, autocommit=True)
    held.execute("BEGIN")
    held.execute("INSERT INTO other VALUES (1)")
    held.execute("PREPARE TRANSACTION 'held'")
    held.close()
    window = current_wal_lsn(pg_conn)
    with pg_conn.transaction():  # a large transaction whose DDL changes nothing
        pg_conn.execute("INSERT INTO ledger SELECT g, 'large' FROM generate_series(11, 3000) g")
        pg_conn.execute("ALTER TABLE ledger ADD COLUMN IF NOT EXISTS v text")
        pg_conn.execute("UPDATE ledger SET v = 'large, updated' WHERE id % 10 = 0")
    pg_conn.execute("ALTER TABLE ledger ADD COLUMN w int")  # a version after it
    pg_conn.execute("INSERT INTO ledger SELECT g, 'after', g FROM generate_series(3001, 3010) g")

    pgcdc.start()
    deadline = time.monotonic() + 120
    while _entries(catalog) == versions:
        assert time.monotonic() < deadline, "pgcdc did not record the version of ADD COLUMN w"
        assert pgcdc.proc is not None and pgcdc.proc.poll() is None, pgcdc.wait(5)[1]
        time.sleep(0.05)
    pgcdc.kill()
    info = slot_info(pg_conn, "pgcdc")
    assert info is not None and info.confirmed_flush_lsn is not None
    assert info.confirmed_flush_lsn < window, "the slot passed the no-op DDL transaction"

    pg_conn.execute("COMMIT PREPARED 'held'")
    pg_conn.execute("DELETE FROM ledger WHERE id % 7 = 0")
    pgcdc.catch_up(pg_conn)  # before the fix: exit 3, "belongs to another slot"
    assert _entries(catalog) == versions + 1  # nothing appended twice

    source = {int(str(r[0])): {"id": r[0], "v": r[1], "w": r[2]}
              for r in pg_conn.execute("SELECT id, v, w FROM ledger").fetchall()}
    events = read_topic(kafka_servers, topic_name(topic_prefix, "public", "ledger"))
    folded = {key: {"w": None, **row} for key, row in _folded(events).items()}
    assert len(source) == 2580 and folded == source

    lake, checkpoint = (tmp_path / "lake").as_uri(), (tmp_path / "cp").as_uri()
    # the job `pgcdc spark --available-now` runs, in this process's Spark session (the
    # command itself is tested in test_spark_logs and test_spark_apply)
    config = job.JobConfig(kafka_servers, lake, checkpoint, topic_prefix=topic_prefix,
                           trigger_seconds=None)
    query = job.start(spark, config)
    query.awaitTermination(600)
    assert query.exception() is None
    with psycopg.connect(pg_dsn) as conn:
        results = compare(conn, spark, lake, job.read_catalog(spark, config).tables())
    assert sorted((r.table, r.source.rows) for r in results) == [
        ("public.ledger", 2580), ("public.other", 1)]
    assert all(r.equal for r in results), results
