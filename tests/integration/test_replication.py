"""The decoder and the streaming loop against a real PostgreSQL."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal

import psycopg
import pytest

from decoder.names import format_table_name
from decoder.slot import current_wal_lsn, slot_info
from pgcdc.pipeline import Pipeline, PipelineConfig, ShutdownIncompleteError
from tests.recording_sink import RecordingSink
from tests.running import run_held

Conn = psycopg.Connection[tuple[object, ...]]


def _pipeline(dsn: str, sink: RecordingSink, tables: list[str]) -> Pipeline:
    pipeline = Pipeline(PipelineConfig(dsn, tables=tables, status_interval=0.2), sink)
    pipeline.prepare()
    return pipeline


def _confirmed(conn: Conn) -> int:
    info = slot_info(conn, "pgcdc")
    assert info is not None and info.confirmed_flush_lsn is not None
    return info.confirmed_flush_lsn


def test_changes_are_typed_and_addressable(pg_conn: Conn, pg_dsn: str) -> None:
    pg_conn.execute("""CREATE TABLE t (id int PRIMARY KEY, name text, price numeric(10,2),
                       at timestamptz, day date, ok bool, raw bytea, u uuid, doc jsonb,
                       f float8)""")
    sink = RecordingSink()
    pipeline = _pipeline(pg_dsn, sink, ["public.t"])
    u = uuid.uuid4()
    with pg_conn.transaction():
        pg_conn.execute("INSERT INTO t VALUES (1, 'a''b', 12.50, '2024-02-29 10:11:12.123456+02',"
                        " '2024-02-29', true, '\\x00ff', %s, '{\"k\": [1, 2]}', 'NaN')", (u,))
        pg_conn.execute("INSERT INTO t (id) VALUES (2)")
    pg_conn.execute("UPDATE t SET name = 'x' WHERE id = 1")
    pg_conn.execute("DELETE FROM t WHERE id = 2")
    end = current_wal_lsn(pg_conn)
    pipeline.run(until_lsn=end)

    ops = [(e.op, e.key) for e in sink.events]
    assert ops == [("c", {"id": 1}), ("c", {"id": 2}), ("u", {"id": 1}), ("d", {"id": 2})]
    first = sink.events[0].after
    assert first is not None
    assert first["name"] == "a'b"
    assert first["price"] == Decimal("12.50")
    assert first["at"] == datetime(2024, 2, 29, 8, 11, 12, 123456, tzinfo=UTC)
    assert first["day"] == date(2024, 2, 29)
    assert first["ok"] is True
    assert first["raw"] == b"\x00\xff"
    assert first["u"] == u
    assert first["doc"] == '{"k": [1, 2]}'
    assert first["f"] != first["f"]  # NaN
    assert sink.events[1].after == {"id": 2, "name": None, "price": None, "at": None,
                                    "day": None, "ok": None, "raw": None, "u": None,
                                    "doc": None, "f": None}
    # addressing: one transaction shares commit_lsn and xid, ordinals count up
    a, b, c, d = sink.events
    assert a.commit_lsn == b.commit_lsn and a.xid == b.xid
    assert (a.ordinal, b.ordinal, c.ordinal, d.ordinal) == (0, 1, 0, 0)
    assert a.commit_lsn < c.commit_lsn < d.commit_lsn
    assert a.lsn < b.lsn <= a.commit_lsn
    assert {e.table.oid for e in sink.events} == {sink.tables[0].oid}
    assert _confirmed(pg_conn) >= end


def test_flush_waits_for_the_sink(pg_conn: Conn, pg_dsn: str) -> None:
    """DESIGN.md invariant 1: the slot never passes what the sink has not made durable."""
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    sink = RecordingSink(hold=True)
    pipeline = _pipeline(pg_dsn, sink, ["public.t"])
    stop = threading.Event()
    thread = threading.Thread(target=pipeline.run, kwargs={"stop": stop})
    thread.start()
    try:
        pg_conn.execute("INSERT INTO t VALUES (1)")
        # unrelated WAL after the change, so a careless keepalive would move the slot
        pg_conn.execute("CREATE TABLE other (x int)")
        pg_conn.execute("INSERT INTO other SELECT generate_series(1, 1000)")
        assert sink.received.wait(30)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:  # several status intervals
            # below the held transaction's commit record, so PostgreSQL would resend it
            # (an idle keepalive may legitimately move it over WAL written before it)
            assert _confirmed(pg_conn) < sink.events[0].commit_lsn
            time.sleep(0.1)
        assert sink.ends, "the transaction's commit arrived"
        sink.release()
        deadline = time.monotonic() + 30
        while _confirmed(pg_conn) < sink.ends[0] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _confirmed(pg_conn) >= sink.ends[0]
    finally:
        stop.set()
        thread.join(30)


def test_undelivered_transactions_are_sent_again(pg_conn: Conn, pg_dsn: str) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    held = RecordingSink(hold=True)
    pipeline = _pipeline(pg_dsn, held, ["public.t"])
    pipeline.config.shutdown_grace = 0.5
    pg_conn.execute("INSERT INTO t VALUES (1, 'one'), (2, 'two')")
    stop = threading.Event()
    incomplete: list[ShutdownIncompleteError] = []
    thread = threading.Thread(target=run_held, args=(pipeline, stop, incomplete))
    thread.start()
    assert held.received.wait(30)
    time.sleep(0.5)
    stop.set()
    thread.join(30)
    assert [e.key for e in held.events] == [{"id": 1}, {"id": 2}]
    assert len(incomplete) == 1 and incomplete[0].undelivered >= 1

    again = RecordingSink()
    end = current_wal_lsn(pg_conn)
    _pipeline(pg_dsn, again, ["public.t"]).run(until_lsn=end)
    assert [(e.key, e.commit_lsn, e.ordinal) for e in again.events] == [
        (e.key, e.commit_lsn, e.ordinal) for e in held.events]


def test_idle_slot_advances_while_other_tables_write(pg_conn: Conn, pg_dsn: str) -> None:
    """T11: nothing published changes, other tables write WAL, the slot still advances."""
    pg_conn.execute("CREATE TABLE published (id int PRIMARY KEY)")
    pg_conn.execute("CREATE TABLE unpublished (id int PRIMARY KEY)")
    sink = RecordingSink()
    pipeline = _pipeline(pg_dsn, sink, ["public.published"])
    start = _confirmed(pg_conn)
    pg_conn.execute("INSERT INTO unpublished SELECT generate_series(1, 5000)")
    target = current_wal_lsn(pg_conn)
    stop = threading.Event()
    thread = threading.Thread(target=pipeline.run, kwargs={"stop": stop})
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while _confirmed(pg_conn) < target and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _confirmed(pg_conn) >= target > start
        assert sink.events == []
    finally:
        stop.set()
        thread.join(30)


@pytest.mark.parametrize("name", ['we;ird "name', "Robert'); DROP TABLE t;--"])
def test_hostile_table_names(pg_conn: Conn, pg_dsn: str, name: str) -> None:
    pg_conn.execute(psycopg.sql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(
        psycopg.sql.Identifier(name)))
    sink = RecordingSink()
    pipeline = _pipeline(pg_dsn, sink, [format_table_name("public", name)])
    pg_conn.execute(psycopg.sql.SQL("INSERT INTO {} VALUES (7)").format(
        psycopg.sql.Identifier(name)))
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    assert [(e.table.name, e.key) for e in sink.events] == [(name, {"id": 7})]
