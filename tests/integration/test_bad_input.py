"""Bad input gets an error that names the cause and the fix (T17, foundation cases)."""

from __future__ import annotations

import threading

import psycopg
import pytest

from decoder.errors import (
    MissingIdentityError,
    PublicationMissingError,
    SlotInUseError,
    WalLevelError,
)
from pgcdc.errors import JavaMissingError
from pgcdc.pipeline import Pipeline, PipelineConfig
from pgcdc.services.kafka import java_binary
from pgcdc.services.ports import free_port
from pgcdc.services.postgres import PostgresServer
from sinks.kafka import KafkaSink, KafkaUnreachableError
from tests.recording_sink import RecordingSink

Conn = psycopg.Connection[tuple[object, ...]]


def test_wal_level_not_logical() -> None:
    with PostgresServer(settings={"wal_level": "replica"}) as server:
        pipeline = Pipeline(PipelineConfig(server.dsn()), RecordingSink())
        with pytest.raises(WalLevelError, match="wal_level=replica.*wal_level = logical"):
            pipeline.prepare()


def test_slot_already_active(pg_conn: Conn, pg_dsn: str) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    first = Pipeline(PipelineConfig(pg_dsn, tables=["public.t"]), RecordingSink())
    first.prepare()
    stop = threading.Event()
    thread = threading.Thread(target=first.run, kwargs={"stop": stop})
    thread.start()
    try:
        for _ in range(100):
            row = pg_conn.execute("SELECT active_pid FROM pg_replication_slots").fetchone()
            if row and row[0]:
                break
            stop.wait(0.1)
        assert row and row[0]
        second = Pipeline(PipelineConfig(pg_dsn, tables=["public.t"]), RecordingSink())
        with pytest.raises(SlotInUseError, match=rf"active for PID {row[0]}.*--slot"):
            second.prepare()
    finally:
        stop.set()
        thread.join(30)


def test_table_without_primary_key(pg_conn: Conn, pg_dsn: str) -> None:
    pg_conn.execute("CREATE TABLE keyless (a int)")
    pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.keyless"]), RecordingSink())
    with pytest.raises(MissingIdentityError, match=r"public\.keyless.*primary key.*REPLICA"):
        pipeline.prepare()
    # the fix the message names works
    pg_conn.execute("ALTER TABLE keyless REPLICA IDENTITY FULL")
    pipeline.prepare()


def test_missing_publication(pg_dsn: str) -> None:
    config = PipelineConfig(pg_dsn, publication="nope", create_publication=False)
    with pytest.raises(PublicationMissingError, match='"nope".*CREATE PUBLICATION'):
        Pipeline(config, RecordingSink()).prepare()


def test_kafka_unreachable() -> None:
    servers = f"127.0.0.1:{free_port()}"
    with pytest.raises(KafkaUnreachableError, match=rf"{servers}.*--bootstrap-servers"):
        KafkaSink(servers)


def test_java_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(JavaMissingError, match="Java 17.*install"):
        java_binary()
