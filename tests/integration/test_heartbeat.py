"""T11: an idle publication while other tables and another database write WAL; heartbeats.

The slot advances over WAL pgcdc has no use for, but only while nothing is in flight: a
held sink keeps it below the undelivered commit whatever heartbeats and keepalives say.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql

from core.errors import ConfigError
from decoder.lsn import parse_lsn
from decoder.slot import current_wal_lsn, slot_info
from pgcdc.acknowledgement import HEARTBEAT_PREFIX, Acknowledger
from pgcdc.config import load_settings
from pgcdc.metrics import render
from pgcdc.pipeline import Pipeline, PipelineConfig, Progress
from pgcdc.services.postgres import PostgresServer
from sinks.kafka import KafkaSink
from tests.oracle import raw_records
from tests.recording_sink import RecordingSink

Conn = psycopg.Connection[tuple[object, ...]]


@pytest.fixture
def other_db(pg_server: PostgresServer) -> Iterator[Conn]:
    """Another database of the same cluster, with a table to write WAL into."""
    name = f"other_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server.dsn(), autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        with psycopg.connect(pg_server.dsn(name), autocommit=True) as conn:
            conn.execute("CREATE TABLE busy (id bigserial PRIMARY KEY, v text)")
            yield conn
    finally:
        with psycopg.connect(pg_server.dsn(), autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def _confirmed(conn: Conn) -> int:
    info = slot_info(conn, "pgcdc")
    assert info is not None and info.confirmed_flush_lsn is not None
    return info.confirmed_flush_lsn


def _write_elsewhere(pg_conn: Conn, other: Conn) -> None:
    """WAL the publication does not see: another table, another database."""
    pg_conn.execute("INSERT INTO unpublished SELECT generate_series(1, 200)")
    other.execute("INSERT INTO busy (v) SELECT 'x' FROM generate_series(1, 200)")


def _wait(predicate: Callable[[], bool], what: str, *, pg_conn: Conn, other: Conn,
          timeout: float = 60) -> None:
    """Write WAL elsewhere until ``predicate`` holds (at most ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        _write_elsewhere(pg_conn, other)
        time.sleep(0.1)


class _Running:
    """A pipeline streaming on a thread of its own."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        try:
            self.pipeline.run(stop=self.stop)
        except BaseException as exc:  # reported by the test
            self.error = exc

    def __enter__(self) -> _Running:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive()
        assert self.error is None, self.error


def _pipeline(dsn: str, sink: RecordingSink | KafkaSink, *, heartbeat: float,
              capture_ddl: bool = True) -> Pipeline:
    pipeline = Pipeline(PipelineConfig(dsn, tables=["public.published"], status_interval=0.2,
                                       heartbeat_interval=heartbeat, capture_ddl=capture_ddl),
                        sink)
    pipeline.prepare()
    return pipeline


@pytest.fixture
def tables(pg_conn: Conn) -> None:
    pg_conn.execute("CREATE TABLE published (id int PRIMARY KEY)")
    pg_conn.execute("CREATE TABLE unpublished (id int)")


@pytest.mark.usefixtures("tables")
@pytest.mark.parametrize("heartbeat", [0.0, 0.2], ids=["keepalives-only", "heartbeats"])
def test_idle_slot_advances_while_other_databases_write(pg_conn: Conn, pg_dsn: str,
                                                        other_db: Conn, heartbeat: float) -> None:
    """T11: the walsender reads the whole cluster's WAL, so its keepalives already move an
    idle slot over another database's WAL; heartbeats, when on, come back and are counted,
    and neither kind of position needs anything of the publication."""
    sink = RecordingSink()
    pipeline = _pipeline(pg_dsn, sink, heartbeat=heartbeat)
    start = _confirmed(pg_conn)
    _write_elsewhere(pg_conn, other_db)
    target = current_wal_lsn(other_db)
    with _Running(pipeline):
        _wait(lambda: _confirmed(pg_conn) >= target, "the slot to pass the other WAL",
              pg_conn=pg_conn, other=other_db)
        if heartbeat:
            _wait(lambda: pipeline.progress.heartbeats_received >= 3, "three heartbeats",
                  pg_conn=pg_conn, other=other_db)
    assert _confirmed(pg_conn) >= target > start
    assert sink.events == []
    assert sink.messages == [], "a heartbeat is never handed to the sink"
    progress = pipeline.progress
    if heartbeat:
        assert progress.heartbeats_sent >= progress.heartbeats_received >= 3
        assert 'pgcdc_heartbeats_total{stage="received"}' in render(pipeline)
        assert "HeartbeatError" not in progress.errors
    else:
        assert (progress.heartbeats_sent, progress.heartbeats_received) == (0, 0)


@pytest.mark.usefixtures("tables")
def test_heartbeats_never_move_the_slot_past_an_undelivered_commit(
        pg_conn: Conn, pg_dsn: str, other_db: Conn) -> None:
    """T11 safety: heartbeats written after a held transaction come back, yet the slot stays
    below its commit until the sink makes it durable; then it advances again."""
    sink = RecordingSink(hold=True)
    pipeline = _pipeline(pg_dsn, sink, heartbeat=0.2)
    progress = pipeline.progress
    with _Running(pipeline):
        pg_conn.execute("INSERT INTO published VALUES (1)")
        _wait(lambda: bool(sink.ends), "the held transaction", pg_conn=pg_conn, other=other_db)
        commit_lsn = sink.events[0].commit_lsn
        seen = progress.heartbeats_received  # every later heartbeat is after the commit
        checks = 0
        deadline = time.monotonic() + 60
        while progress.heartbeats_received < seen + 5:
            assert time.monotonic() < deadline, "timed out waiting for heartbeats"
            _write_elsewhere(pg_conn, other_db)
            # below the held commit record, so PostgreSQL would send the transaction again
            assert _confirmed(pg_conn) < commit_lsn
            checks += 1
            time.sleep(0.1)
        assert _confirmed(pg_conn) < commit_lsn
        assert checks >= 1
        sink.release()
        end = sink.ends[0]
        _wait(lambda: _confirmed(pg_conn) >= end, "the released commit",
              pg_conn=pg_conn, other=other_db)
        later = current_wal_lsn(other_db)
        _wait(lambda: _confirmed(pg_conn) >= later, "the slot to advance once idle again",
              pg_conn=pg_conn, other=other_db)
    assert [e.key for e in sink.events] == [{"id": 1}]
    assert sink.messages == []


def test_heartbeat_positions_count_only_while_idle_and_within_a_session() -> None:
    """The acknowledgement rule, as pure logic: a heartbeat's LSN is a flush candidate only
    while idle, never past a prepared transaction's hold, and forgotten on reconnect."""
    sink = RecordingSink()
    acks = Acknowledger(PipelineConfig("unused"), sink, Progress(), None, _no_connection)
    acks.start(100)
    acks.heartbeat(500)
    acks.advance(idle=False, hold=None)
    assert acks.flushed == 100, "something in flight: the heartbeat may be ahead of it"
    acks.advance(idle=True, hold=300)
    assert acks.flushed == 300, "a prepared transaction holds the slot at its PREPARE"
    acks.reset()  # a new session: the old heartbeat may be past undelivered transactions
    acks.advance(idle=True, hold=None)
    assert acks.flushed == 300
    acks.heartbeat(400)
    acks.advance(idle=True, hold=None)
    assert acks.flushed == 400
    assert acks.progress.heartbeats_received == 2


def _no_connection() -> Conn:
    msg = "pure logic: no connection"
    raise AssertionError(msg)


@pytest.mark.usefixtures("tables")
def test_heartbeats_stay_off_the_messages_topic(pg_conn: Conn, pg_dsn: str,
                                                kafka_servers: str, topic_prefix: str) -> None:
    sink = KafkaSink(kafka_servers, topic_prefix=topic_prefix, value_format="json")
    pipeline = _pipeline(pg_dsn, sink, heartbeat=0.2)
    try:
        with _Running(pipeline):
            row = pg_conn.execute(
                "SELECT pg_logical_emit_message(false, 'app.note', 'hello')::text").fetchone()
            assert row is not None
            note = parse_lsn(str(row[0]))
            deadline = time.monotonic() + 60
            while pipeline.progress.heartbeats_received < 3 or _confirmed(pg_conn) < note:
                assert time.monotonic() < deadline, "timed out waiting for heartbeats"
                pg_conn.execute("INSERT INTO unpublished VALUES (1)")
                time.sleep(0.1)
    finally:
        sink.close()
    records = raw_records(kafka_servers, f"{topic_prefix}._messages", timeout=60)
    prefixes = [json.loads(r.value)["prefix"] for r in records]
    assert prefixes == ["app.note"]
    assert HEARTBEAT_PREFIX not in {r.key.decode() for r in records}


def test_heartbeat_interval_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"'service.heartbeat_interval' must be >= 0"):
        load_settings({"dsn": "dbname=x"}, environ={"PGCDC_HEARTBEAT_INTERVAL": "-1"})
    settings = load_settings({"dsn": "dbname=x", "heartbeat_interval": 2.5}, environ={})
    assert settings.service.heartbeat_interval == 2.5


@pytest.mark.usefixtures("tables")
def test_a_refused_heartbeat_is_reported_and_streaming_goes_on(
        pg_conn: Conn, pg_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """A role that may not write logical messages: a warning naming the fix, an error count,
    and every change still arrives."""
    _pipeline(pg_dsn, RecordingSink(), heartbeat=0, capture_ddl=False)  # publication, slot
    role = f"nohb_{uuid.uuid4().hex[:8]}"
    pg_conn.execute(sql.SQL("CREATE ROLE {} LOGIN REPLICATION").format(sql.Identifier(role)))
    pg_conn.execute(sql.SQL("GRANT SELECT ON published TO {}").format(sql.Identifier(role)))
    pg_conn.execute("REVOKE EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) "
                    "FROM PUBLIC")
    sink = RecordingSink()
    try:
        pipeline = _pipeline(pg_dsn.replace("user=postgres", f"user={role}"), sink,
                             heartbeat=0.2, capture_ddl=False)
        with _Running(pipeline):
            pg_conn.execute("INSERT INTO published VALUES (1)")
            deadline = time.monotonic() + 60
            while not sink.events or pipeline.progress.errors.get("HeartbeatError", 0) < 3:
                assert time.monotonic() < deadline, "timed out waiting for the change"
                time.sleep(0.1)
    finally:
        pg_conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        pg_conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    assert [e.key for e in sink.events] == [{"id": 1}]
    assert pipeline.progress.heartbeats_sent == 0
    warnings = [r.getMessage() for r in caplog.records if "heartbeat" in r.getMessage()]
    assert len(warnings) == 1, "warned once, not at every interval"
    assert "EXECUTE on pg_logical_emit_message" in warnings[0]
    assert "permission denied" in warnings[0]
