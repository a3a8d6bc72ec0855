"""Prepared transactions with DDL inside (found by the lake model, T18): at PREPARE the
stream describes the table with the transaction's own, uncommitted DDL; pgcdc keeps the
catalog's definition until COMMIT PREPARED replays the transaction with its DDL.  It used to
stop with "DDL happened without the pgcdc event trigger"."""

from __future__ import annotations

from pathlib import Path

import psycopg

from decoder.slot import current_wal_lsn
from pgcdc.pipeline import Pipeline, PipelineConfig
from tests.recording_sink import RecordingSink

Conn = psycopg.Connection[tuple[object, ...]]


def test_ddl_inside_prepared_transactions(pg_conn: Conn, pg_dsn: str, tmp_path: Path) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY, a int)")
    config = PipelineConfig(pg_dsn, tables=["public.t"], status_interval=0.2,
                            catalog_dir=tmp_path / "catalog")
    Pipeline(config, RecordingSink()).prepare()  # the slot (two-phase) first
    for number, (gid, outcome) in enumerate(
            (("kept", "COMMIT"), ("gone", "ROLLBACK"), ("also", "COMMIT")), 1):
        for statement in ("BEGIN", f"INSERT INTO t (id, a) VALUES ({number}, 1)",
                          f"ALTER TABLE t ADD COLUMN {gid} text",
                          f"UPDATE t SET {gid} = 'p' WHERE id = {number}",
                          f"PREPARE TRANSACTION '{gid}'", f"{outcome} PREPARED '{gid}'"):
            pg_conn.execute(statement.encode())
        pg_conn.execute("INSERT INTO t (id, a) VALUES (%s, 2)", (10 * number,))
    sink = RecordingSink()
    pipeline = Pipeline(config, sink)
    pipeline.prepare()
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))

    events = [([c.name for c in e.table.columns], e.op, e.after) for e in sink.events]
    assert events == [
        (["id", "a"], "c", {"id": 1, "a": 1}),  # the first prepared transaction
        (["id", "a", "kept"], "u", {"id": 1, "a": 1, "kept": "p"}),
        (["id", "a", "kept"], "c", {"id": 10, "a": 2, "kept": None}),
        (["id", "a", "kept"], "c", {"id": 20, "a": 2, "kept": None}),  # nothing of "gone"
        (["id", "a", "kept"], "c", {"id": 3, "a": 1, "kept": None}),
        (["id", "a", "kept", "also"], "u", {"id": 3, "a": 1, "kept": None, "also": "p"}),
        (["id", "a", "kept", "also"], "c", {"id": 30, "a": 2, "kept": None, "also": None})]
    last = pipeline.builder.history.latest.table(sink.events[-1].table.oid)
    assert last is not None and [c.name for c in last.columns] == [
        "id", "a", "kept", "also"]
