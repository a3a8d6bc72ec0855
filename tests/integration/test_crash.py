"""Crashes of the pgcdc process: fail points (T3), a kill -9 loop under load (T4), and
stored progress behind the slot (T16).  pgcdc runs as a real separate process."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import psycopg
import pytest

from core import failpoints
from core.wire import topic_name
from tests.oracle import PgcdcProcess, Writer, read_topic, verify

Conn = psycopg.Connection[tuple[object, ...]]

KILL_CYCLES = int(os.environ.get("PGCDC_KILL_CYCLES", "30"))


@pytest.fixture
def ledger(pg_conn: Conn) -> None:
    pg_conn.execute("CREATE TABLE ledger (id int PRIMARY KEY, version int NOT NULL, payload text)")
    # the publication and slot exist before the first write, as after a deployment
    pg_conn.execute("CREATE PUBLICATION pgcdc FOR TABLE ledger")
    pg_conn.execute("SELECT pg_create_logical_replication_slot('pgcdc', 'pgoutput', false, true)")


@pytest.mark.usefixtures("ledger")
@pytest.mark.parametrize("point", failpoints.POINTS)
def test_crash_at_fail_point(point: str, pg_conn: Conn, pg_dsn: str, kafka_servers: str,
                             topic_prefix: str, tmp_path: Path) -> None:
    writer = Writer(pg_dsn, seed=len(point))
    writer.write(pg_conn, 20)
    pgcdc = PgcdcProcess(pg_dsn, kafka_servers, topic_prefix, tmp_path / "progress.json")
    pgcdc.start(fail_point=point)
    code, err = pgcdc.wait(timeout=120)
    assert code == failpoints.EXIT_CODE, f"the fail point was not reached ({code}):\n{err}"
    writer.write(pg_conn, 20)
    pgcdc.catch_up(pg_conn)
    events = read_topic(kafka_servers, topic_name(topic_prefix, "public", "ledger"))
    verdict = verify(events, writer.ledger, pg_conn)
    assert verdict.distinct >= 40


@pytest.mark.usefixtures("ledger")
def test_kill_9_loop_under_write_load(pg_conn: Conn, pg_dsn: str, kafka_servers: str,
                                      topic_prefix: str, tmp_path: Path) -> None:
    seed = int(os.environ.get("PGCDC_SEED", "20261122"))
    rng = random.Random(seed)
    writer = Writer(pg_dsn, seed=seed)
    pgcdc = PgcdcProcess(pg_dsn, kafka_servers, topic_prefix, tmp_path / "progress.json")
    writer.start()
    try:
        for _ in range(KILL_CYCLES):
            pgcdc.start()
            time.sleep(rng.uniform(0.8, 2.0))
            pgcdc.kill()
    finally:
        writer.stop()
    pgcdc.catch_up(pg_conn)
    events = read_topic(kafka_servers, topic_name(topic_prefix, "public", "ledger"))
    verdict = verify(events, writer.ledger, pg_conn)
    print(f"\nT4: {KILL_CYCLES} kill -9 cycles, seed {seed}, {writer.ledger.transactions} "
          f"transactions, {verdict.distinct} distinct events, {verdict.events} delivered, "
          f"duplicate ratio {verdict.duplicate_ratio:.3f}")
    assert writer.ledger.transactions > KILL_CYCLES


@pytest.mark.usefixtures("ledger")
def test_slot_ahead_of_stored_progress_is_data_loss(pg_conn: Conn, pg_dsn: str,
                                                    kafka_servers: str, topic_prefix: str,
                                                    tmp_path: Path) -> None:
    """T16: the slot advanced behind pgcdc's back, or dropped and recreated."""
    writer = Writer(pg_dsn, seed=16)
    writer.write(pg_conn, 5)
    progress = tmp_path / "progress.json"
    pgcdc = PgcdcProcess(pg_dsn, kafka_servers, topic_prefix, progress)
    pgcdc.catch_up(pg_conn)
    assert progress.exists()

    writer.write(pg_conn, 5)
    pg_conn.execute("SELECT pg_replication_slot_advance('pgcdc', pg_current_wal_lsn())")
    pgcdc.start()
    code, err = pgcdc.wait(timeout=60)
    assert code == 3
    assert "was advanced or recreated" in err and "re-snapshot" in err

    pg_conn.execute("SELECT pg_drop_replication_slot('pgcdc')")
    pgcdc.start()
    code, err = pgcdc.wait(timeout=60)
    assert code == 3
    assert 'slot "pgcdc" is gone' in err
    # and it did not silently create a new slot
    assert pg_conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone() == (0,)
