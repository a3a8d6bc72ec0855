"""Protocol v4 on a real PostgreSQL 16 (the ``pg16`` fixture: server binaries from Maven
Central): pgcdc asks for the highest version and parallel streaming, a large streamed
transaction decodes equal to the source, two-phase commit, ``origin 'none'`` leaves out
changes replicated from another origin, and a rolled-back subtransaction's Stream Abort
carries v4's abort LSN and time."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg import sql

from decoder import pgoutput as pg
from decoder.slot import current_wal_lsn, slot_info
from pgcdc.pipeline import Pipeline, PipelineConfig, protocol_for
from pgcdc.services.postgres import PostgresServer
from tests.recording_sink import RecordingSink
from tests.running import running, wait

Conn = psycopg.Connection[tuple[object, ...]]

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)

TABLE = """CREATE TABLE t (id int PRIMARY KEY, n numeric(12, 3), ts timestamptz, doc jsonb,
                           tags text[], pad text)"""
ROWS = """INSERT INTO t
          SELECT g, g * 1.5, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 s',
                 jsonb_build_object('g', g, 'even', g %% 2 = 0), ARRAY['a' || g, NULL, 'b'],
                 repeat('x', 200)
          FROM generate_series(%s::int, %s::int) g"""


def _pipeline(dsn: str, sink: RecordingSink, slot: str, **options: Any) -> Pipeline:
    config = PipelineConfig(dsn, slot=slot, tables=["public.t"], status_interval=0.2,
                            decoding_work_mem="64kB", spill_memory=64 << 10, **options)
    pipeline = Pipeline(config, sink)
    pipeline.prepare()
    return pipeline


def _source(conn: Conn) -> list[dict[str, Any]]:
    """The table as a plain SELECT returns it (psycopg, UTC); jsonb as the server's text,
    which is what pgcdc promises for it (decoder/values.py)."""
    conn.execute("SET TimeZone = 'UTC'")
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute("SELECT id, n, ts, doc::text AS doc, tags, pad FROM t ORDER BY id")\
            .fetchall()


def _pg_time(micros: int) -> datetime:
    return PG_EPOCH + timedelta(microseconds=micros)


@pytest.fixture
def table(pg16_dsn: str) -> None:
    with psycopg.connect(pg16_dsn, autocommit=True) as conn:
        conn.execute(TABLE)


@pytest.fixture
def conn(pg16_dsn: str) -> Any:
    with psycopg.connect(pg16_dsn, autocommit=True) as conn:
        yield conn


@pytest.mark.usefixtures("table")
def test_negotiates_protocol_4_with_parallel_streaming(pg16: PostgresServer, pg16_dsn: str,
                                                       conn: Conn) -> None:
    assert conn.info.server_version // 10000 == 16
    assert protocol_for(conn.info.server_version) == 4
    sink = RecordingSink()
    pipeline = _pipeline(pg16_dsn, sink, "negotiate_v4")
    conn.execute(ROWS, (1, 3))
    pipeline.run(until_lsn=current_wal_lsn(conn))
    assert [e.key["id"] for e in sink.events] == [1, 2, 3]
    # what the walsender received, from its log (log_replication_commands)
    commands = [line for line in pg16.logfile.read_text().splitlines()
                if 'START_REPLICATION SLOT "negotiate_v4"' in line]
    assert commands, pg16.log_tail()
    options = dict(re.findall(r'"(\w+)" \'([^\']*)\'', commands[-1]))
    v4 = {"proto_version": "4", "streaming": "parallel", "two_phase": "on", "messages": "true"}
    assert {key: options.get(key) for key in v4} == v4
    assert "origin" not in options, "the server's default (any) unless configured"


@pytest.mark.usefixtures("table")
def test_large_streamed_transaction_decodes_equal_to_the_source(pg16_dsn: str,
                                                                conn: Conn) -> None:
    sink = RecordingSink()
    pipeline = _pipeline(pg16_dsn, sink, "large_parallel")
    with psycopg.connect(pg16_dsn) as long:
        long.execute(ROWS, (1, 20_000))
        conn.execute(ROWS, (-3, -1))  # a short transaction commits in the middle
        long.execute("UPDATE t SET doc = doc || '{\"updated\": true}' WHERE id % 1000 = 0",
                     prepare=False)
        long.execute("DELETE FROM t WHERE id BETWEEN 19001 AND 20000")
        long.commit()
    pipeline.run(until_lsn=current_wal_lsn(conn))

    assert pipeline.progress.streamed_transactions >= 1, "the transaction was streamed"
    short, large = sink.events[:3], sink.events[3:]
    assert [e.key["id"] for e in short] == [-3, -2, -1]
    assert len({e.commit_lsn for e in large}) == 1
    assert [e.ordinal for e in large] == list(range(len(large)))
    assert [e.op for e in large].count("d") == 1000
    # replay the events onto an empty table: the result is the source, value by value
    replica: dict[int, dict[str, Any]] = {}
    for event in sink.events:
        key = event.key["id"]
        if event.after is None:
            del replica[key]
        else:
            replica[key] = dict(event.after)
    source = _source(conn)
    assert len(source) == 19_003
    assert [replica[row["id"]] for row in source] == source
    first = replica[1]
    assert first["n"] == Decimal("1.500")
    assert first["ts"] == datetime(2024, 1, 1, 0, 0, 1, tzinfo=UTC)
    assert first["tags"] == ["a1", None, "b"]
    assert json.loads(replica[1000]["doc"]) == {"g": 1000, "even": True, "updated": True}
    assert pipeline.reorder.buffered_bytes == 0


@pytest.mark.usefixtures("table")
def test_two_phase_commit(pg16_dsn: str, conn: Conn) -> None:
    sink = RecordingSink()
    pipeline = _pipeline(pg16_dsn, sink, "two_phase_v4")
    assert pipeline._two_phase
    with running(pipeline), psycopg.connect(pg16_dsn, autocommit=True) as other:
        other.execute("BEGIN")
        other.execute(ROWS, (1, 2))
        other.execute("PREPARE TRANSACTION 'small'")
        other.execute("BEGIN")
        other.execute(ROWS, (100, 5_000))  # streamed before its PREPARE: Stream Prepare
        other.execute("PREPARE TRANSACTION 'large'")
        other.execute("BEGIN")
        other.execute(ROWS, (10, 11))
        other.execute("PREPARE TRANSACTION 'undone'")
        conn.execute(ROWS, (50, 50))
        wait(lambda: len(pipeline.reorder.prepared) == 3 and sink.events)
        assert [e.key["id"] for e in sink.events] == [50], "nothing prepared before its commit"
        assert set(pipeline.reorder.prepared) == {"small", "large", "undone"}
        hold = pipeline.reorder.hold_lsn()
        slot = slot_info(conn, "two_phase_v4")
        assert hold is not None and slot is not None and slot.confirmed_flush_lsn is not None
        assert slot.confirmed_flush_lsn <= hold, "the slot never passes an open PREPARE"

        conn.execute("COMMIT PREPARED 'large'")
        conn.execute("ROLLBACK PREPARED 'undone'")
        conn.execute("COMMIT PREPARED 'small'")
        end = current_wal_lsn(conn)
        wait(lambda: pipeline.progress.durable_lsn >= end)
    ids = [e.key["id"] for e in sink.events]
    assert ids == [50, *range(100, 5_001), 1, 2]
    assert not pipeline.reorder.prepared
    assert pipeline.progress.aborted_transactions >= 1
    large = sink.events[1:-2]
    assert len({e.commit_lsn for e in large}) == 1
    assert sink.events[-1].commit_lsn > large[0].commit_lsn
    replica = {e.key["id"]: e.after for e in sink.events}
    source = _source(conn)
    assert [replica[row["id"]] for row in source] == source


@pytest.mark.usefixtures("table")
def test_origin_none_leaves_out_changes_from_another_origin(pg16_dsn: str, conn: Conn) -> None:
    origin = f"upstream_{conn.info.dbname}"  # origins belong to the cluster
    conn.execute("SELECT pg_replication_origin_create(%s)", (origin,))
    try:
        local, every = RecordingSink(), RecordingSink()
        only_local = _pipeline(pg16_dsn, local, "origin_none", origin="none")
        any_origin = _pipeline(pg16_dsn, every, "origin_any")
        conn.execute(ROWS, (1, 2))
        with psycopg.connect(pg16_dsn, autocommit=True) as applier:
            # what a replication apply worker does: mark its session's changes
            applier.execute("SELECT pg_replication_origin_session_setup(%s)", (origin,))
            applier.execute("BEGIN")  # large: streamed, an Origin message in its first block
            applier.execute(ROWS, (100, 3_099))
            applier.execute("UPDATE t SET pad = 'replicated' WHERE id = 1")
            applier.execute("COMMIT")
            applier.execute("SELECT pg_replication_origin_session_reset()")
        conn.execute(ROWS, (3, 3))
        conn.execute("DELETE FROM t WHERE id = 2")
        end = current_wal_lsn(conn)
        only_local.run(until_lsn=end)
        any_origin.run(until_lsn=end)
    finally:
        conn.execute("SELECT pg_replication_origin_drop(%s)", (origin,))

    assert [(e.op, e.key["id"]) for e in local.events] == [
        ("c", 1), ("c", 2), ("c", 3), ("d", 2)]
    assert [(e.op, e.key["id"]) for e in every.events] == [
        ("c", 1), ("c", 2), *(("c", i) for i in range(100, 3_100)), ("u", 1), ("c", 3),
        ("d", 2)]
    assert any_origin.progress.streamed_transactions == 1
    assert only_local.progress.streamed_transactions == 0, "filtered before decoding"
    # pgcdc moves past the filtered transaction: its slot confirms the end of the WAL
    assert only_local.progress.durable_lsn >= end


@pytest.mark.usefixtures("table")
def test_stream_abort_of_a_subtransaction_carries_abort_lsn_and_time(pg16_dsn: str,
                                                                     conn: Conn) -> None:
    sink = RecordingSink()
    pipeline = _pipeline(pg16_dsn, sink, "subxact_abort")
    conn.execute("SELECT pg_create_logical_replication_slot('peek', 'pgoutput')")
    with psycopg.connect(pg16_dsn) as long:
        long.execute(ROWS, (1, 1_000))
        long.execute("SAVEPOINT s1")
        long.execute(ROWS, (1_001, 4_000))  # past 64kB: streamed before its rollback
        before = _server_now(long)
        long.execute("ROLLBACK TO SAVEPOINT s1")
        after = _server_now(long)
        long.execute(ROWS, (4_001, 5_000))
        long.commit()
    pipeline.run(until_lsn=current_wal_lsn(conn))

    # pgcdc: the savepoint's rows are gone, the rest is the source
    ids = [e.key["id"] for e in sink.events]
    assert ids == [*range(1, 1_001), *range(4_001, 5_001)]
    assert [e.after for e in sink.events] == _source(conn)

    # the same stream, read through the SQL interface and parsed by the decoder
    messages = _peek(conn, "peek", {"proto_version": "4", "publication_names": "pgcdc",
                                    "streaming": "parallel"})
    commit = next(m for m in messages if isinstance(m, pg.StreamCommit))
    aborts = [m for m in messages if isinstance(m, pg.StreamAbort)]
    assert len(aborts) == 1
    (abort,) = aborts
    assert abort.xid == commit.xid and abort.subxid != abort.xid
    assert abort.abort_lsn is not None and abort.abort_time is not None
    first_stream = next(i for i, m in enumerate(messages) if isinstance(m, pg.StreamStart))
    assert first_stream < messages.index(abort), "the abort arrives while streaming"
    assert abort.abort_lsn < commit.commit_lsn, "the rollback's own LSN, not the commit's"
    assert before <= _pg_time(abort.abort_time) <= after




def _server_now(conn: Conn) -> datetime:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None and isinstance(row[0], datetime)
    return row[0]


def _peek(conn: Conn, slot: str, options: dict[str, str]) -> list[pg.Message]:
    """Decode ``slot`` through pg_logical_slot_peek_binary_changes, knowing (as a walsender
    client does) which messages sit inside a Stream Start .. Stream Stop block."""
    conn.execute("SET logical_decoding_work_mem = '64kB'")
    args = sql.SQL(", ").join(sql.Literal(x) for kv in options.items() for x in kv)
    rows = conn.execute(sql.SQL("SELECT data FROM pg_logical_slot_peek_binary_changes("
                                "{}, NULL, NULL, {})").format(sql.Literal(slot), args)).fetchall()
    messages, inside = [], False
    for (data,) in rows:
        assert isinstance(data, bytes)
        tag = chr(data[0])
        message = pg.parse(data, streaming=inside and tag not in "SE")
        inside = (inside or tag == "S") and tag != "E"
        messages.append(message)
    return messages
