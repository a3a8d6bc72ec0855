"""Bad input gets an error that names the cause and the fix (T17, foundation cases)."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest

from core.errors import ConfigError, JavaMissingError
from core.java import java_binary
from decoder.errors import (
    MissingIdentityError,
    PublicationMissingError,
    SlotInUseError,
    SlotInvalidatedError,
    WalLevelError,
)
from pgcdc.exit_codes import EXIT_TERMINAL, EXIT_USAGE
from pgcdc.pipeline import Pipeline, PipelineConfig
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


def test_a_table_to_publish_that_does_not_exist(pg_conn: Conn, pg_dsn: str,
                                                tmp_path: Path) -> None:
    """A configuration error (exit 2) naming the table and the fix, and nothing left behind."""
    from pgcdc import cli

    pg_conn.execute("CREATE TABLE present (id int PRIMARY KEY)")
    config = PipelineConfig(pg_dsn, tables=["public.present", "public.absent"])
    with pytest.raises(ConfigError, match=r'"public.absent" does not exist.*schema\.table'):
        Pipeline(config, RecordingSink()).prepare()
    assert cli.main(["run", "--dsn", pg_dsn, "--tables", "public.absent", "--sink", "null",
                     "--progress-file", str(tmp_path / "progress"),
                     "--catalog-dir", str(tmp_path / "catalog")]) == EXIT_USAGE
    assert pg_conn.execute("SELECT count(*) FROM pg_publication").fetchone() == (0,)
    assert pg_conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone() == (0,)


def test_kafka_unreachable() -> None:
    servers = f"127.0.0.1:{free_port()}"
    with pytest.raises(KafkaUnreachableError, match=rf"{servers}.*--bootstrap-servers"):
        KafkaSink(servers)


def test_java_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(JavaMissingError, match="Java 17.*install"):
        java_binary()


def test_invalidated_slot_is_a_typed_data_loss_error() -> None:
    """T9: the slot fell behind max_slot_wal_keep_size and PostgreSQL invalidated it."""
    with PostgresServer(settings={"max_slot_wal_keep_size": "'1MB'", "min_wal_size": "'32MB'",
                                  "max_wal_size": "'32MB'"}) as server:
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, pad text)")
            pipeline = Pipeline(PipelineConfig(server.dsn(), tables=["public.t"]),
                                RecordingSink())
            pipeline.prepare()
            for _ in range(5):
                conn.execute("INSERT INTO t SELECT g, repeat('x', 500) FROM "
                             "generate_series(1, 3000) g ON CONFLICT (id) DO UPDATE "
                             "SET pad = excluded.pad")
                conn.execute("SELECT pg_switch_wal()")
            conn.execute("CHECKPOINT")
            row = conn.execute("SELECT wal_status FROM pg_replication_slots").fetchone()
            assert row == ("lost",)
        again = Pipeline(PipelineConfig(server.dsn(), tables=["public.t"]), RecordingSink())
        with pytest.raises(SlotInvalidatedError, match="invalidated.*re-snapshot"):
            again.prepare()


def test_status_says_when_changes_were_lost(pg_conn: Conn, pg_dsn: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """``pgcdc status`` exits 3 with what was lost and what to do; a healthy slot exits 0
    with its lag filled (0 s when nothing is unconfirmed)."""
    import json

    from decoder.slot import current_wal_lsn, drop_slot
    from pgcdc import cli

    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    config = PipelineConfig(pg_dsn, tables=["public.t"], progress_file=tmp_path / "progress",
                            catalog_dir=tmp_path / "catalog", status_interval=0.1)
    pipeline = Pipeline(config, RecordingSink())
    pipeline.prepare()
    pg_conn.execute("INSERT INTO t VALUES (1)")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    argv = ["status", "--dsn", pg_dsn, "--progress-file", str(tmp_path / "progress"),
            "--catalog-dir", str(tmp_path / "catalog")]
    assert cli.main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["progress_check"] == "ok"
    assert report["lag_seconds"] == 0.0 or report["lag_bytes"] > 0
    assert cli.main(argv) == 0  # the readable table
    lines = capsys.readouterr().out.splitlines()
    assert any(line.split() == ["progress_check", "ok"] for line in lines), lines
    drop_slot(pg_conn, "pgcdc")
    assert cli.main(argv) == EXIT_TERMINAL
    captured = capsys.readouterr()
    assert "DATA LOSS: the slot is gone" in captured.err and "--initial-load" in captured.err
