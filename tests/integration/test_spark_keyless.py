"""Issue 15, point 2: a keyless REPLICA IDENTITY FULL table is a multiset in the lake.

Three identical rows stay three; a DELETE or UPDATE of one of them changes exactly one,
through several micro-batches, a batch applied twice, the same offsets applied by another
query, and pgcdc's events sent twice into Kafka (the same WAL range captured again, as a
restart resends it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, cast

import psycopg
import pytest

from core import failpoints
from core.wire import table_topic_pattern
from decoder.slot import current_wal_lsn, slot_info
from loads.incremental import IncrementalSnapshots, send_signal
from loads.initial_load import InitialLoad, LoadConfig
from loads.load_state import LoadStateError
from pgcdc.clone import compare
from pgcdc.pipeline import Pipeline, PipelineConfig
from sinks.kafka import KafkaSink
from streaming import evolution, job, multiset
from streaming.apply import apply_batch, parse_envelopes
from streaming.multiset import APPLIED_PROPERTY, OCCURRENCE
from tests.recording_sink import NoSink

pytestmark = pytest.mark.spark

Conn = psycopg.Connection[tuple[object, ...]]

TABLES = ["public.k", "public.kp"]
AGAIN = "pgcdc_again"  # a second slot: the same WAL range captured twice


def _capture(dsn: str, servers: str, prefix: str, conn: Conn, slot: str = "pgcdc",
             tables: list[str] | None = None) -> None:
    sink = KafkaSink(servers, topic_prefix=prefix)
    Pipeline(PipelineConfig(dsn, slot=slot, tables=tables or TABLES), sink).run(
        until_lsn=current_wal_lsn(conn))
    sink.close()


def _frozen(spark: Any, servers: str, prefix: str) -> Any:
    """What the change topics hold now, as a DataFrame that later writes do not change."""
    topic = (spark.read.format("kafka").option("kafka.bootstrap.servers", servers)
             .option("subscribePattern", table_topic_pattern(prefix))
             .option("startingOffsets", "earliest").option("includeHeaders", "true").load())
    return spark.createDataFrame(topic.collect(), topic.schema)


def _since(everything: Any, before: Any) -> Any:
    """The records of ``everything`` that ``before`` does not hold (the next micro-batch)."""
    return everything.join(before.select("topic", "partition", "offset"),
                           ["topic", "partition", "offset"], "left_anti")


def _source_counts(conn: Conn, table: str) -> list[tuple[object, ...]]:
    return sorted(conn.execute(f"SELECT a, b, c::text, md5(big), count(*) "  # noqa: S608
                               f"FROM {table} GROUP BY 1, 2, 3, 4").fetchall(), key=repr)


def _lake_counts(spark: Any, lake: str, table: str) -> list[tuple[object, ...]]:
    rows = spark.read.format("delta").load(f"{lake}/{table}").selectExpr(
        "a", "b", "coalesce(CAST(c AS STRING), _pgcdc_text['c']) AS c",
        "md5(big) AS big").groupBy("a", "b", "c", "big").count().collect()
    return sorted((tuple(r) for r in rows), key=repr)


def test_keyless_full_table_keeps_duplicates(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, spark: Any,
        tmp_path: Any) -> None:
    # k: no key at all; kp: FULL with a primary key (a set, which the multiset path keeps)
    pg_conn.execute("CREATE TABLE k (a int, b text, c numeric(10,2), big text)")
    pg_conn.execute("ALTER TABLE k REPLICA IDENTITY FULL")
    pg_conn.execute("CREATE TABLE kp (a int PRIMARY KEY, b text, c numeric(10,2), big text)")
    pg_conn.execute("ALTER TABLE kp REPLICA IDENTITY FULL")
    for slot in ("pgcdc", AGAIN):
        Pipeline(PipelineConfig(pg_dsn, slot=slot, tables=TABLES), NoSink()).prepare()
    # an incompressible value, stored out of line: an update that leaves it alone sends it
    # as an unchanged TOASTed column
    big = "(SELECT string_agg(md5(g::text || %s), '') FROM generate_series(1, 300) g)"

    pg_conn.execute("INSERT INTO k VALUES (1, 'x', 1.50, 'small'), (1, 'x', 1.50, 'small'), "
                    "(1, 'x', 1.50, 'small'), (2, NULL, NULL, NULL), (2, NULL, NULL, NULL), "
                    "(NULL, NULL, NULL, NULL), (4, 'nan', 'NaN', NULL), (4, 'nan', 'NaN', NULL), "
                    "(4, 'nan', NULL, NULL)")  # a NaN row is not a NULL row
    pg_conn.execute(f"INSERT INTO k SELECT 3, 'toast', 3.00, {big} "  # noqa: S608
                    "FROM generate_series(1, 3)", ("t",))
    pg_conn.execute("INSERT INTO kp SELECT g, 'p', g, NULL FROM generate_series(1, 5) g")
    _capture(pg_dsn, kafka_servers, topic_prefix, pg_conn)

    lake = (tmp_path / "lake").as_uri()
    config = job.JobConfig(kafka_servers, lake, (tmp_path / "cp").as_uri(),
                           topic_prefix=topic_prefix)
    first = _frozen(spark, kafka_servers, topic_prefix)
    catalog = job.read_catalog(spark, config)
    assert {s.qualified_name: s.replica_identity for s in catalog.tables()} == {
        "public.k": "f", "public.kp": "f"}
    apply_batch(spark, first, 0, catalog=catalog, lake=lake, app_id="keyless")

    def check(stage: str) -> None:
        with psycopg.connect(pg_dsn) as conn:
            results = compare(conn, spark, lake, job.read_catalog(spark, config).tables())
            assert all(r.equal for r in results), (stage, results)
            assert _lake_counts(spark, lake, "public.k") == _source_counts(conn, "k"), stage

    check("three identical rows")
    assert spark.read.format("delta").load(f"{lake}/public.k").count() == 12
    # k as a lake table written before occurrences were (the keyed path's): no occurrence
    # column, no watermark; the next batch goes on from its rows' newest position
    table = f"delta.`{lake}/public.k`"
    assert sorted(r[0] for r in spark.read.format("delta").load(f"{lake}/public.k")
                  .where("a = 1").select(OCCURRENCE).collect()) == [1, 2, 3]
    spark.sql(f"ALTER TABLE {table} UNSET TBLPROPERTIES ('{APPLIED_PROPERTY}')")
    spark.sql(f"ALTER TABLE {table} DROP COLUMN {OCCURRENCE}")
    multiset._APPLIED.clear()  # a new driver
    evolution.forget(f"{lake}/public.k")

    # one of three deleted, one of two updated (to NULLs, and to an existing content), one
    # of the TOASTed rows updated with its big value unchanged, more duplicates inserted
    pg_conn.execute("DELETE FROM k WHERE ctid = (SELECT ctid FROM k WHERE a = 1 LIMIT 1)")
    pg_conn.execute("UPDATE k SET b = 'y' WHERE ctid = (SELECT ctid FROM k WHERE a = 2 LIMIT 1)")
    pg_conn.execute("UPDATE k SET a = NULL, b = NULL, c = NULL, big = NULL "
                    "WHERE ctid = (SELECT ctid FROM k WHERE a = 1 LIMIT 1)")
    pg_conn.execute("UPDATE k SET c = 4.25 WHERE ctid = (SELECT ctid FROM k WHERE a = 3 LIMIT 1)")
    pg_conn.execute("DELETE FROM k WHERE ctid = (SELECT ctid FROM k WHERE c = 'NaN' LIMIT 1)")
    pg_conn.execute("INSERT INTO k VALUES (1, 'x', 1.50, 'small'), (1, 'x', 1.50, 'small'), "
                    "(NULL, NULL, NULL, NULL)")
    with pg_conn.transaction():  # inserted and deleted again inside one batch
        pg_conn.execute("INSERT INTO k VALUES (5, 'gone', NULL, NULL), (5, 'gone', NULL, NULL)")
        pg_conn.execute("DELETE FROM k WHERE ctid = (SELECT ctid FROM k WHERE a = 5 LIMIT 1)")
    pg_conn.execute("UPDATE kp SET b = 'q' WHERE a <= 2")
    pg_conn.execute("DELETE FROM kp WHERE a = 5")
    _capture(pg_dsn, kafka_servers, topic_prefix, pg_conn)
    # a restart resends: the other slot captures everything from the start once more
    _capture(pg_dsn, kafka_servers, topic_prefix, pg_conn, slot=AGAIN)
    second = _frozen(spark, kafka_servers, topic_prefix)
    batch = _since(second, first)
    catalog = job.read_catalog(spark, config)

    def positions(records: Any) -> Any:
        decoding: Any = catalog  # (the CatalogLog interface parse_envelopes reads)
        return parse_envelopes(records, decoding).selectExpr(
            "source.table_oid AS oid", "source.commit_lsn AS lsn", "source.ordinal AS ordinal")

    # the batch holds the first batch's events again, and its own twice
    assert positions(batch).join(positions(first), ["oid", "lsn", "ordinal"],
                                 "left_semi").count() == first.count()
    assert positions(batch).groupBy("oid", "lsn", "ordinal").count().where(
        "count = 2").count() > 0
    apply_batch(spark, batch, 1, catalog=catalog, lake=lake, app_id="keyless")
    check("one duplicate deleted, one updated, more inserted")
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute("SELECT count(*) FROM k WHERE a = 1").fetchone()
    assert row is not None and row[0] == 3  # 3 - 1 deleted - 1 updated + 2 inserted
    stored = spark.read.format("delta").load(f"{lake}/public.k")
    # rows from before occurrences: a changed content is numbered anew, the others stay
    assert sorted(r[0] for r in stored.where("a = 2").select(OCCURRENCE).collect()) == [1, 1]
    assert sorted(r[0] for r in stored.where("a = 1").select(OCCURRENCE).collect()) == [1, 2, 3]
    assert [r[0] for r in stored.where("a = 4 AND _pgcdc_text IS NULL").select(OCCURRENCE)
            .collect()] == [None]  # (4, 'nan', NULL, NULL), untouched

    # a truncate, then rows again, over two more batches
    pg_conn.execute("UPDATE k SET b = 'doomed' WHERE ctid = (SELECT ctid FROM k LIMIT 1)")
    pg_conn.execute("TRUNCATE k")
    pg_conn.execute("INSERT INTO k VALUES (1, 'x', 1.50, 'small'), (1, 'x', 1.50, 'small'), "
                    "(7, NULL, NULL, NULL)")
    _capture(pg_dsn, kafka_servers, topic_prefix, pg_conn)
    third = _frozen(spark, kafka_servers, topic_prefix)
    catalog = job.read_catalog(spark, config)
    apply_batch(spark, _since(third, second), 2, catalog=catalog, lake=lake, app_id="keyless")
    check("truncated")
    pg_conn.execute("DELETE FROM k WHERE ctid = (SELECT ctid FROM k WHERE a = 1 LIMIT 1)")
    pg_conn.execute("INSERT INTO k VALUES (7, NULL, NULL, NULL)")
    _capture(pg_dsn, kafka_servers, topic_prefix, pg_conn)
    fourth = _since(_frozen(spark, kafka_servers, topic_prefix), third)
    assert apply_batch(spark, fourth, 3, catalog=catalog, lake=lake,
                       app_id="keyless") == {"public.k": 2}  # occurrence 2 out, 7's 2 in
    check("after the truncate")
    table = spark.sql(f"DESCRIBE DETAIL delta.`{lake}/public.k`").collect()[0]
    assert APPLIED_PROPERTY in table["properties"]

    # the same batch again (a retried batch: Delta skips it), and every batch again under
    # another query over the same lake (the watermark leaves them out)
    assert apply_batch(spark, fourth, 3, catalog=catalog, lake=lake,
                       app_id="keyless") == {"public.k": 0}
    for n, again in enumerate([first, batch, _since(third, second), fourth]):
        applied = apply_batch(spark, again, n, catalog=catalog, lake=lake, app_id="replay")
        assert set(applied.values()) == {0}, (n, applied)
    check("replayed")

    # and everything (with its duplicates) in one batch, into a fresh lake
    fresh = (tmp_path / "fresh").as_uri()
    apply_batch(spark, _frozen(spark, kafka_servers, topic_prefix), 0, catalog=catalog,
                lake=fresh, app_id="fresh")
    with psycopg.connect(pg_dsn) as conn:
        results = compare(conn, spark, fresh, catalog.tables())
    assert all(r.equal for r in results), results
    assert {r.table: r.source.rows for r in results} == {"public.k": 3, "public.kp": 4}


def test_initial_load_of_duplicates_in_any_order_and_replayed(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, spark: Any,
        tmp_path: Any) -> None:
    """The initial load's reads of identical rows: each counts once, whatever the order the
    load's chunks arrive in, and a replay of them (another query over the same lake) adds
    none, before and after streamed changes."""
    pg_conn.execute("CREATE TABLE k (a int, b text)")
    pg_conn.execute("ALTER TABLE k REPLICA IDENTITY FULL")
    pg_conn.execute("INSERT INTO k SELECT g % 7, repeat('x', 200) FROM generate_series(1, 2000) g")
    sink = KafkaSink(kafka_servers, topic_prefix=topic_prefix)
    summary = InitialLoad(LoadConfig(pg_dsn, tmp_path / "load.json", tables=["public.k"],
                                     readers=2, chunk_pages=4), sink).run()
    sink.close()
    assert summary.complete
    assert len(next(iter(summary.state.tables.values())).chunks) > 5

    lake = (tmp_path / "lake").as_uri()
    config = job.JobConfig(kafka_servers, lake, (tmp_path / "cp").as_uri(),
                           topic_prefix=topic_prefix)
    catalog = job.read_catalog(spark, config)
    loaded = _frozen(spark, kafka_servers, topic_prefix)
    half = loaded.count() // 2
    # the later chunks first: load workers write in any order
    apply_batch(spark, loaded.where(f"offset >= {half}"), 0, catalog=catalog, lake=lake,
                app_id="load")
    apply_batch(spark, loaded.where(f"offset < {half}"), 1, catalog=catalog, lake=lake,
                app_id="load")

    def check(stage: str) -> None:
        with psycopg.connect(pg_dsn) as conn:
            results = compare(conn, spark, lake, job.read_catalog(spark, config).tables())
        assert all(r.equal for r in results), (stage, results)
        assert results[0].source.rows > 0

    check("loaded")
    assert apply_batch(spark, loaded, 0, catalog=catalog, lake=lake,
                       app_id="replay") == {"public.k": 0}
    check("reads replayed")

    pg_conn.execute("DELETE FROM k WHERE ctid = (SELECT ctid FROM k WHERE a = 3 LIMIT 1)")
    pg_conn.execute("UPDATE k SET b = 'y' WHERE ctid = (SELECT ctid FROM k WHERE a = 4 LIMIT 1)")
    pg_conn.execute("INSERT INTO k VALUES (5, repeat('x', 200))")
    _capture(pg_dsn, kafka_servers, topic_prefix, pg_conn, tables=["public.k"])
    everything = _frozen(spark, kafka_servers, topic_prefix)
    catalog = job.read_catalog(spark, config)
    apply_batch(spark, _since(everything, loaded), 2, catalog=catalog, lake=lake, app_id="load")
    check("streamed")
    assert apply_batch(spark, everything, 1, catalog=catalog, lake=lake,
                       app_id="replay") == {"public.k": 0}
    check("everything replayed")


def test_incremental_snapshot_of_a_full_table_adds_no_duplicate(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, spark: Any,
        tmp_path: Any) -> None:
    """An incremental snapshot of a FULL table (by a surrogate key) while streaming: its reads
    say the rows are there, they add no second copy of a row the lake holds."""
    pg_conn.execute("CREATE TABLE s (id int NOT NULL UNIQUE, v text)")
    pg_conn.execute("ALTER TABLE s REPLICA IDENTITY FULL")
    Pipeline(PipelineConfig(pg_dsn, tables=["public.s"]), NoSink()).prepare()
    pg_conn.execute("INSERT INTO s SELECT g, 'v' || g FROM generate_series(1, 50) g")
    _capture(pg_dsn, kafka_servers, topic_prefix, pg_conn, tables=["public.s"])
    lake = (tmp_path / "lake").as_uri()
    config = job.JobConfig(kafka_servers, lake, (tmp_path / "cp").as_uri(),
                           topic_prefix=topic_prefix)
    first = _frozen(spark, kafka_servers, topic_prefix)
    apply_batch(spark, first, 0, catalog=job.read_catalog(spark, config), lake=lake,
                app_id="snapshot")

    sink = KafkaSink(kafka_servers, topic_prefix=topic_prefix)
    incremental = IncrementalSnapshots(pg_dsn, sink, state_file=tmp_path / "snapshots.json",
                                       chunk_size=20, poll_interval=0.1)
    pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.s"], status_interval=0.2),
                        sink, incremental=incremental)
    pipeline.prepare()
    stop = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            pipeline.run(stop=stop)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    incremental.start()
    try:
        pg_conn.execute("UPDATE s SET v = 'changed' WHERE id <= 5")
        send_signal(pg_conn, "execute-snapshot", {"tables": ["public.s"],
                                                  "surrogate_key": ["id"]})
        deadline = time.monotonic() + 120
        while not list(incremental.state.done) and not failure and incremental.error is None:
            assert time.monotonic() < deadline, "timed out waiting for the snapshot"
            time.sleep(0.05)
    finally:
        incremental.stop()
        stop.set()
        thread.join(60)
        sink.close()
    assert not failure and incremental.error is None, (failure, incremental.error)
    assert list(incremental.state.done)[0]["status"] == "complete"
    pg_conn.execute("INSERT INTO s VALUES (51, 'after')")
    _capture(pg_dsn, kafka_servers, topic_prefix, pg_conn, tables=["public.s"])

    everything = _frozen(spark, kafka_servers, topic_prefix)
    batch = _since(everything, first)
    reads = parse_envelopes(batch, cast(Any, job.read_catalog(spark, config))).where(
        "op = 'r'").count()
    assert reads >= 40  # the snapshot's rows, but those the stream changed meanwhile
    apply_batch(spark, batch, 1, catalog=job.read_catalog(spark, config), lake=lake,
                app_id="snapshot")
    with psycopg.connect(pg_dsn) as conn:
        (result,) = compare(conn, spark, lake, job.read_catalog(spark, config).tables())
    assert result.equal and result.source.rows == 51, result


def test_initial_load_of_a_keyless_table_resumed_after_writes_ends_exact(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, spark: Any,
        tmp_path: Any) -> None:
    """An initial load killed after a few chunks, with rows inserted, updated and deleted
    before it resumes.  Resumed as it was, a keyless table counted rows twice downstream
    (2,951 lake rows for 2,003: reads made durable but not recorded done read again, and
    rows written since the consistent point both read and streamed): the plain resume now
    stops with the cure, and handed to incremental snapshots the table is read whole, a
    truncate first, and the lake ends equal."""
    pg_conn.execute("CREATE TABLE k (a int, b text)")
    pg_conn.execute("ALTER TABLE k REPLICA IDENTITY FULL")
    pg_conn.execute("INSERT INTO k SELECT g % 7, repeat('x', 200) FROM generate_series(1, 2000) g")
    state = tmp_path / "load.json"
    common = ["--dsn", pg_dsn, "--tables", "public.k", "--bootstrap-servers", kafka_servers,
              "--topic-prefix", topic_prefix, "--load-state", str(state), "--catalog-dir",
              str(tmp_path / "catalog"), "--progress-file", str(tmp_path / "progress.json")]
    crashed = subprocess.run(
        [sys.executable, "-m", "pgcdc", "snapshot", *common, "--readers", "1",
         "--chunk-pages", "4"], env={**os.environ, "PGCDC_FAIL_POINT": "after_snapshot_chunk:3"},
        capture_output=True, timeout=120, check=False)
    assert crashed.returncode == failpoints.EXIT_CODE, crashed.stderr.decode()
    # after the consistent point, before the resumed attempt's snapshot
    pg_conn.execute("INSERT INTO k SELECT 8, repeat('n', 200) FROM generate_series(1, 5)")
    pg_conn.execute("UPDATE k SET b = 'u' WHERE ctid IN (SELECT ctid FROM k WHERE a = 1 "
                    "ORDER BY ctid DESC LIMIT 3)")
    pg_conn.execute("DELETE FROM k WHERE ctid IN (SELECT ctid FROM k WHERE a = 2 "
                    "ORDER BY ctid DESC LIMIT 2)")
    with pytest.raises(LoadStateError, match="public.k has no key.*--incremental-snapshots"):
        InitialLoad(LoadConfig(pg_dsn, state, tables=["public.k"], readers=1, chunk_pages=4,
                               catalog_dir=tmp_path / "catalog"), NoSink()).run()

    incremental = tmp_path / "incremental.json"
    run = subprocess.Popen(
        [sys.executable, "-m", "pgcdc", "run", *common, "--initial-load",
         "--incremental-snapshots", "--incremental-state", str(incremental)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not (incremental.exists() and (read := json.loads(incremental.read_text()))["done"]
                   and not read["jobs"]):
            assert run.poll() is None, run.communicate()[1].decode()
            assert time.monotonic() < deadline, "the whole read did not end"
            time.sleep(0.5)
        target = current_wal_lsn(pg_conn)
        while (slot_info(pg_conn, "pgcdc").confirmed_flush_lsn or 0) < target:  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "pgcdc did not catch up"
            time.sleep(0.2)
    finally:
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=60)
    assert run.returncode == 0, err.decode()
    assert "completed by incremental snapshots while streaming: public.k (whole)" in err.decode()
    assert read["done"][0]["status"] == "complete", read

    lake = (tmp_path / "lake").as_uri()
    config = job.JobConfig(kafka_servers, lake, (tmp_path / "cp").as_uri(),
                           topic_prefix=topic_prefix, trigger_seconds=None)
    job.start(spark, config).awaitTermination()
    with psycopg.connect(pg_dsn) as conn:
        results = compare(conn, spark, lake, job.read_catalog(spark, config).tables())
    assert results and all(r.equal for r in results), results
