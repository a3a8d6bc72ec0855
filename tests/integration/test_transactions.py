"""Streamed (in-progress) transactions, two-phase commit and reconnects on a real server."""

from __future__ import annotations

import time

import psycopg
import pytest

from decoder.slot import current_wal_lsn, slot_info
from pgcdc.pipeline import Pipeline, PipelineConfig
from tests.recording_sink import RecordingSink
from tests.running import running, wait

Conn = psycopg.Connection[tuple[object, ...]]


def _pipeline(dsn: str, sink: RecordingSink, **options: object) -> Pipeline:
    config = PipelineConfig(dsn, tables=["public.t"], status_interval=0.2,
                            decoding_work_mem="64kB", spill_memory=16 << 10)
    for key, value in options.items():
        setattr(config, key, value)
    pipeline = Pipeline(config, sink)
    pipeline.prepare()
    return pipeline




@pytest.fixture
def table(pg_conn: Conn) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY, pad text)")


@pytest.mark.usefixtures("table")
def test_large_streamed_transaction_interleaved(pg_conn: Conn, pg_dsn: str) -> None:
    sink = RecordingSink()
    pipeline = _pipeline(pg_dsn, sink)
    with psycopg.connect(pg_dsn) as long, psycopg.connect(pg_dsn, autocommit=True) as short:
        long.execute("INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(1, 3000) g")
        short.execute("INSERT INTO t VALUES (-1, 'short')")
        long.execute("SAVEPOINT s1")
        long.execute("INSERT INTO t SELECT g, 'rolled back' FROM generate_series(3001, 3500) g")
        long.execute("ROLLBACK TO SAVEPOINT s1")
        long.execute("INSERT INTO t SELECT g, repeat('y', 200) FROM generate_series(3501, 6000) g")
        long.commit()
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    keys = [e.key["id"] for e in sink.events]
    assert keys[0] == -1, "the short transaction committed first"
    assert keys[1:] == list(range(1, 3001)) + list(range(3501, 6001))
    assert [e.ordinal for e in sink.events[1:]] == list(range(5500))
    assert len({e.commit_lsn for e in sink.events[1:]}) == 1
    assert pipeline.progress.streamed_transactions >= 1
    assert pipeline.reorder.buffered_bytes == 0


@pytest.mark.usefixtures("table")
def test_aborted_streamed_transaction_is_discarded(pg_conn: Conn, pg_dsn: str) -> None:
    sink = RecordingSink()
    pipeline = _pipeline(pg_dsn, sink)
    with psycopg.connect(pg_dsn) as long:
        long.execute("INSERT INTO t SELECT g, repeat('z', 300) FROM generate_series(1, 3000) g")
        long.rollback()
    pg_conn.execute("INSERT INTO t VALUES (1, 'after')")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    assert [(e.key, e.after and e.after["pad"]) for e in sink.events] == [({"id": 1}, "after")]
    assert pipeline.progress.aborted_transactions >= 1


@pytest.mark.usefixtures("table")
def test_prepared_transaction_waits_for_commit_prepared(pg_conn: Conn, pg_dsn: str) -> None:
    sink = RecordingSink()
    pipeline = _pipeline(pg_dsn, sink)
    assert pipeline._two_phase
    with psycopg.connect(pg_dsn, autocommit=True) as other:
        other.execute("BEGIN")
        other.execute("INSERT INTO t VALUES (1, 'prepared'), (2, 'prepared')")
        other.execute("PREPARE TRANSACTION 'g1'")
        other.execute("BEGIN")
        other.execute("INSERT INTO t VALUES (3, 'rolled back')")
        other.execute("PREPARE TRANSACTION 'g2'")
    pg_conn.execute("INSERT INTO t VALUES (4, 'plain')")
    with running(pipeline):
        wait(lambda: sink.events)
        time.sleep(1.0)
        assert [e.key["id"] for e in sink.events] == [4]
        hold = pipeline.reorder.hold_lsn()
        assert hold is not None
        info = slot_info(pg_conn, "pgcdc")
        assert info is not None and info.confirmed_flush_lsn is not None
        assert info.confirmed_flush_lsn <= hold, "the slot never passes an open PREPARE"
        pg_conn.execute("COMMIT PREPARED 'g1'")
        pg_conn.execute("ROLLBACK PREPARED 'g2'")
        end = current_wal_lsn(pg_conn)
        wait(lambda: pipeline.progress.durable_lsn >= end)
    ids = [e.key["id"] for e in sink.events]
    assert ids == [4, 1, 2]
    assert sink.events[1].commit_lsn > sink.events[0].commit_lsn
    assert pipeline.reorder.hold_lsn() is None


@pytest.mark.usefixtures("table")
def test_reconnects_after_walsender_is_terminated(pg_conn: Conn, pg_dsn: str) -> None:
    sink = RecordingSink()
    pipeline = _pipeline(pg_dsn, sink)
    with running(pipeline):
        pg_conn.execute("INSERT INTO t SELECT g, 'a' FROM generate_series(1, 100) g")
        wait(lambda: len(sink.events) >= 100)
        pg_conn.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots")
        pg_conn.execute("INSERT INTO t SELECT g, 'b' FROM generate_series(101, 200) g")
        end = current_wal_lsn(pg_conn)
        wait(lambda: pipeline.progress.durable_lsn >= end)
    assert pipeline.progress.reconnects >= 1
    assert sorted({e.key["id"] for e in sink.events}) == list(range(1, 201))


class _SlowSink(RecordingSink):
    """Takes its time over every event, as a busy broker would."""

    def write(self, event: object) -> None:
        time.sleep(0.0005)
        super().write(event)  # type: ignore[arg-type]


@pytest.mark.usefixtures("table")
def test_long_replay_keeps_answering_the_server(pg_conn: Conn, pg_dsn: str) -> None:
    """Replaying a large streamed transaction takes longer than wal_sender_timeout; the
    server must still hear from pgcdc, or it drops the connection and decodes it all again."""
    pg_conn.execute("ALTER SYSTEM SET wal_sender_timeout = '1s'")
    pg_conn.execute("SELECT pg_reload_conf()")
    try:
        sink = _SlowSink()
        pipeline = _pipeline(pg_dsn, sink)
        pg_conn.execute("INSERT INTO t SELECT g, repeat('r', 200) FROM generate_series(1, 6000) g")
        pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    finally:
        pg_conn.execute("ALTER SYSTEM RESET wal_sender_timeout")
        pg_conn.execute("SELECT pg_reload_conf()")
    assert pipeline.progress.streamed_transactions >= 1
    assert len(sink.events) == 6000
    assert pipeline.progress.reconnects == 0
