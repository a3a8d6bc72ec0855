"""Generated columns (issue 15: never differ from the source silently): PostgreSQL 15 does not
publish them, so pgcdc names each published table that has some when it starts."""

from __future__ import annotations

import logging

import psycopg
import pytest

from decoder.slot import current_wal_lsn
from pgcdc import start_checks
from pgcdc.pipeline import Pipeline, PipelineConfig
from tests.recording_sink import RecordingSink

Conn = psycopg.Connection[tuple[object, ...]]


def test_a_table_with_generated_columns_is_named_at_start(
        pg_conn: Conn, pg_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    pg_conn.execute("CREATE TABLE g (id int PRIMARY KEY, a int, "
                    "twice int GENERATED ALWAYS AS (a * 2) STORED, "
                    "\"Odd name\" text GENERATED ALWAYS AS (a::text) STORED)")
    pg_conn.execute("CREATE TABLE plain (id int PRIMARY KEY)")
    start_checks._warned_generated.clear()
    sink = RecordingSink()
    pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.g", "public.plain"]), sink)
    with caplog.at_level(logging.WARNING, logger="pgcdc.start_checks"):
        pipeline.prepare()
    warnings = [r.getMessage() for r in caplog.records if r.name == "pgcdc.start_checks"]
    assert len(warnings) == 1, warnings
    assert 'public.g has generated column(s) twice, "Odd name"' in warnings[0]
    assert "docs/lake-ddl.md" in warnings[0]
    pg_conn.execute("INSERT INTO g (id, a) VALUES (1, 5)")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    (event,) = [e for e in sink.events if e.op == "c"]
    assert event.after == {"id": 1, "a": 5}  # what PostgreSQL published: no generated value


def test_a_publication_leaving_out_operations_is_named_at_start(
        pg_conn: Conn, pg_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 15: a publication ``WITH (publish = 'insert, update')`` never sends deletes or
    truncates: the lake keeps deleted rows, so pgcdc says so, with the fix."""
    pg_conn.execute("CREATE TABLE audit (id int PRIMARY KEY)")
    pg_conn.execute("CREATE PUBLICATION \"Audit pub\" FOR TABLE audit "
                    "WITH (publish = 'insert, update')")
    pipeline = Pipeline(PipelineConfig(pg_dsn, slot="audit_pub", publication="Audit pub"),
                        RecordingSink())
    with caplog.at_level(logging.WARNING, logger="pgcdc.start_checks"):
        pipeline.prepare()
    warnings = [r.getMessage() for r in caplog.records if r.name == "pgcdc.start_checks"]
    assert len(warnings) == 1, warnings
    assert "publication Audit pub does not publish delete, truncate" in warnings[0]
    assert "ALTER PUBLICATION \"Audit pub\" SET (publish = 'insert, update, delete, truncate')" \
        in warnings[0]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert start_checks.warn_unpublished_operations(conn, "pgcdc") == []
