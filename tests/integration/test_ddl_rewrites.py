"""DDL that changes stored rows without row changes in the WAL reaches the lake (issue 15.1).

``ADD COLUMN ... DEFAULT`` gives every existing row the default (a constant one without
rewriting the table), a volatile default and ``ALTER COLUMN ... TYPE ... USING`` rewrite the
table; none of it is a row change in the WAL.  pgcdc sees each through DDL capture and reads
the table again (an incremental snapshot), so the lake ends equal to the source: real
PostgreSQL -> pgcdc -> Kafka -> Spark -> Delta, compared with the consistent-clone oracle.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from decoder.slot import current_wal_lsn
from loads.incremental import IncrementalSnapshots
from pgcdc.clone import compare, lake_rows, source_rows
from pgcdc.pipeline import Pipeline, PipelineConfig
from sinks.kafka import KafkaSink
from streaming import job
from tests.running import running, wait

pytestmark = pytest.mark.spark

Conn = psycopg.Connection[tuple[object, ...]]


@contextmanager
def _streaming(dsn: str, sink: KafkaSink, tmp_path: Path, tables: list[str], *,
               incremental: bool) -> Iterator[tuple[Pipeline, IncrementalSnapshots | None]]:
    """pgcdc run (with DDL capture and a catalog folder) in a thread."""
    snapshots = IncrementalSnapshots(dsn, sink, state_file=tmp_path / "inc.json",
                                     chunk_size=7, poll_interval=0.1) if incremental else None
    pipeline = Pipeline(PipelineConfig(dsn, tables=tables, status_interval=0.2,
                                       catalog_dir=tmp_path / "catalog"), sink,
                        incremental=snapshots)
    pipeline.prepare()
    with running(pipeline):
        if snapshots is not None:
            snapshots.start()
        try:
            yield pipeline, snapshots
        finally:
            if snapshots is not None:
                snapshots.stop()
    assert snapshots is None or snapshots.error is None, snapshots.error


def _until(condition: Callable[[], bool], what: str, timeout: float = 180) -> None:
    wait(condition, timeout, what)


def _apply(spark: Any, servers: str, prefix: str, tmp_path: Path) -> str:
    lake = (tmp_path / "lake").as_uri()
    config = job.JobConfig(servers, lake, (tmp_path / "cp").as_uri(), topic_prefix=prefix,
                           trigger_seconds=None)
    job.start(spark, config).awaitTermination()
    return lake


def _lake_equals_source(spark: Any, pg_dsn: str, servers: str, prefix: str, lake: str,
                        tmp_path: Path) -> list[Any]:
    """The comparison of every table; the rows that differ are in the assertion's message."""
    config = job.JobConfig(servers, lake, (tmp_path / "cp").as_uri(), topic_prefix=prefix)
    specs = job.read_catalog(spark, config).tables()
    with psycopg.connect(pg_dsn) as conn:
        results = compare(conn, spark, lake, specs)
        for spec, result in zip(specs, results, strict=True):
            if not result.equal:
                source, lake_ = set(source_rows(conn, spec)), set(lake_rows(spark, lake, spec))
                only = sorted(map(str, source - lake_))[:5], sorted(map(str, lake_ - source))[:5]
                raise AssertionError(f"{result}: only in the source {only[0]}, only in the "
                                     f"lake {only[1]}")
    return results


def test_defaults_and_rewrites_reach_the_lake(pg_conn: Conn, pg_dsn: str, kafka_servers: str,
                                              topic_prefix: str, spark: Any,
                                              tmp_path: Path) -> None:
    pg_conn.execute("CREATE TABLE acct (id int PRIMARY KEY, n int, label text)")
    pg_conn.execute("INSERT INTO acct SELECT g, g, 'l' || g FROM generate_series(1, 40) g")
    sink = KafkaSink(kafka_servers, topic_prefix=topic_prefix)
    try:
        with _streaming(pg_dsn, sink, tmp_path, ["public.acct"], incremental=True) as (
                pipeline, snapshots):
            assert snapshots is not None
            pg_conn.execute("INSERT INTO acct VALUES (41, 41, 'streamed')")
            # a constant default: no rewrite, every existing row has it
            pg_conn.execute("ALTER TABLE acct ADD COLUMN amount numeric(10,2) DEFAULT 4")
            # a volatile default: a rewrite, a value per row
            pg_conn.execute("ALTER TABLE acct ADD COLUMN r float8 DEFAULT random()")
            # a retype with USING: a rewrite with new values (a type Delta widens in place)
            pg_conn.execute("ALTER TABLE acct ALTER COLUMN n TYPE bigint USING n * 1000")
            with pg_conn.transaction():  # rows written in the same transaction as the DDL
                pg_conn.execute("INSERT INTO acct (id, n, label) VALUES (42, 42, 'same txn')")
                pg_conn.execute("ALTER TABLE acct ADD COLUMN flag bool DEFAULT true")
            pg_conn.execute("UPDATE acct SET label = 'after' WHERE id % 5 = 0")
            # a retype Delta cannot make in place (string -> int): the lake table is rewritten
            pg_conn.execute("ALTER TABLE acct ALTER COLUMN label TYPE int "
                            "USING length(label) * 10")
            pg_conn.execute("UPDATE acct SET label = -1 WHERE id = 7")
            lsn = current_wal_lsn(pg_conn)
            _until(lambda: pipeline.progress.durable_lsn >= lsn, "the stream")
            _until(lambda: snapshots.idle and len(snapshots.state.done) >= 1,
                   "the tables read again")
            assert all(d["status"] == "complete" for d in snapshots.state.done), \
                snapshots.state.done
            lsn = current_wal_lsn(pg_conn)
            _until(lambda: pipeline.progress.durable_lsn >= lsn, "everything durable")
            assert pipeline.progress.rewrites.get("public.acct:read_again", 0) >= 1, \
                pipeline.progress.rewrites
    finally:
        sink.close()
    lake = _apply(spark, kafka_servers, topic_prefix, tmp_path)
    (result,) = _lake_equals_source(spark, pg_dsn, kafka_servers, topic_prefix, lake, tmp_path)
    assert result.source.rows == 42
    assert result.equal, result


def test_a_default_without_incremental_snapshots_is_a_loud_warning(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """Not followed (no incremental snapshots): a warning naming the table and the fix, and a
    metric, never silence."""
    pg_conn.execute("CREATE TABLE plain (id int PRIMARY KEY)")
    pg_conn.execute("INSERT INTO plain SELECT generate_series(1, 5)")
    sink = KafkaSink(kafka_servers, topic_prefix=topic_prefix)
    try:
        with _streaming(pg_dsn, sink, tmp_path, ["public.plain"], incremental=False) as (
                pipeline, _):
            pg_conn.execute("ALTER TABLE plain ADD COLUMN c int DEFAULT 7")
            pg_conn.execute("ALTER TABLE plain ADD COLUMN d int")  # no default: nothing to do
            pg_conn.execute("CREATE TABLE elsewhere (id int PRIMARY KEY)")  # not published
            pg_conn.execute("INSERT INTO elsewhere VALUES (1)")
            pg_conn.execute("ALTER TABLE elsewhere ADD COLUMN c int DEFAULT 7")
            lsn = current_wal_lsn(pg_conn)
            _until(lambda: pipeline.progress.durable_lsn >= lsn, "the stream")
    finally:
        sink.close()
    assert pipeline.progress.rewrites == {"public.plain:not_followed": 1}
    warnings = [r.getMessage() for r in caplog.records if "public.plain" in r.getMessage()]
    assert any("column(s) c added with a default" in w and "--incremental-snapshots" in w
               for w in warnings), warnings


def _writer(dsn: str, stop: threading.Event, written: list[int]) -> None:
    """Inserts and deletes duplicates (and NULL rows) of the keyless table until stopped
    (bounded): one statement per transaction, so a whole read may fall between any two."""
    import random
    import time

    rng = random.Random(15)
    deadline = time.monotonic() + 600
    with psycopg.connect(dsn, autocommit=True) as conn:
        for n in range(1_000_000):
            if stop.is_set() or time.monotonic() > deadline:
                break
            k = rng.randrange(4)
            if rng.random() < 0.6:
                conn.execute("INSERT INTO bag (k, a) VALUES (%s, %s), (%s, %s)",
                             (k, k, None if k == 0 else k, None))
            else:  # one of identical rows
                conn.execute("DELETE FROM bag WHERE ctid = (SELECT ctid FROM bag WHERE k = %s "
                             "AND a = %s LIMIT 1)", (k, k))
            written.append(n)


def test_a_keyless_table_is_read_again_whole_while_it_is_written(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, spark: Any,
        tmp_path: Path) -> None:
    """A keyless FULL table (duplicates, NULLs) whose rows a constant default and a retype
    USING change is read again whole (a truncate, then every row) under a SHARE lock, while
    a writer keeps inserting and deleting duplicates: no streamed change falls inside a read
    (none is read again for that), and the lake equals the source as a multiset."""
    pg_conn.execute("CREATE TABLE bag (k int, a int)")
    pg_conn.execute("ALTER TABLE bag REPLICA IDENTITY FULL")
    pg_conn.execute("INSERT INTO bag SELECT g % 4, g % 4 FROM generate_series(1, 30) g, "
                    "generate_series(1, 2) n")
    pg_conn.execute("INSERT INTO bag VALUES (NULL, NULL), (NULL, NULL), (5, NULL)")
    sink = KafkaSink(kafka_servers, topic_prefix=topic_prefix)
    stop = threading.Event()
    written: list[int] = []
    writer = threading.Thread(target=_writer, args=(pg_dsn, stop, written), daemon=True)
    try:
        with _streaming(pg_dsn, sink, tmp_path, ["public.bag"], incremental=True) as (
                pipeline, snapshots):
            assert snapshots is not None
            writer.start()
            _until(lambda: len(written) >= 20, "the writer")
            pg_conn.execute("ALTER TABLE bag ADD COLUMN c int DEFAULT 5")
            _until(lambda: len(snapshots.state.done) >= 1, "the first read")
            pg_conn.execute("ALTER TABLE bag ALTER COLUMN a TYPE bigint USING a * 10 + 1")
            _until(lambda: snapshots.idle and len(snapshots.state.done) >= 2,
                   "the tables read again")
            assert writer.is_alive()  # it wrote before, between and after both reads
            stop.set()
            writer.join(60)
            assert not writer.is_alive()
            assert [d["status"] for d in snapshots.state.done] == ["complete", "complete"], \
                snapshots.state.done
            assert snapshots.whole_retried == 0  # the SHARE lock: no change in a read's window
            assert snapshots.chunks_emitted == 2
            lsn = current_wal_lsn(pg_conn)
            _until(lambda: pipeline.progress.durable_lsn >= lsn, "everything durable")
            assert pipeline.progress.rewrites == {"public.bag:read_again": 2}, \
                pipeline.progress.rewrites
    finally:
        stop.set()
        sink.close()
    assert len(written) > 20
    lake = _apply(spark, kafka_servers, topic_prefix, tmp_path)
    (result,) = _lake_equals_source(spark, pg_dsn, kafka_servers, topic_prefix, lake, tmp_path)
    row = pg_conn.execute("SELECT count(*), (SELECT count(*) FROM (SELECT DISTINCT * FROM bag) "
                          "d) FROM bag").fetchone()
    assert row is not None
    rows, distinct = int(str(row[0])), int(str(row[1]))
    assert distinct < rows  # duplicates in the source
    assert result.source.rows == rows
    assert result.equal, result
