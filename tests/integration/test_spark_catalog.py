"""The Spark job resolves tables through the builder's catalog history (issue 15): real
PostgreSQL -> pgcdc -> Kafka -> apply_batch -> Delta, compared with the source.

* point 4: after an initial load, a column added later reaches the lake (with DDL capture,
  through the history; without it, through the ``_catalog`` records, whose LSNs are true);
* point 3b: with ``FOR ALL TABLES`` / ``FOR TABLES IN SCHEMA``, a dropped table leaves the lake
  (or moves to the archive) and a table created again under its name starts empty, whether
  both lives arrive in one micro-batch or in two.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from core.wire import catalog_history_topic, table_topic_pattern
from decoder.slot import current_wal_lsn
from loads.initial_load import InitialLoad, LoadConfig
from pgcdc.clone import compare
from pgcdc.pipeline import Pipeline, PipelineConfig
from sinks.kafka import KafkaSink
from streaming import job
from streaming.apply import apply_batch, table_path
from streaming.ownership import archive_path
from tests.recording_sink import NoSink

pytestmark = pytest.mark.spark

Conn = psycopg.Connection[tuple[object, ...]]

NAME = 'we"ird;name'  # a quote and a semicolon
QUOTED = sql.Identifier(NAME)


def _stream(dsn: str, servers: str, prefix: str, conn: Conn, *, tables: list[str] | None,
            history: Path | None) -> None:
    """``pgcdc run`` until everything written so far is in Kafka (the catalog history kept in
    ``history``; None: DDL capture off)."""
    sink = KafkaSink(servers, topic_prefix=prefix)
    pipeline = Pipeline(PipelineConfig(dsn, tables=tables, catalog_dir=history,
                                       capture_ddl=history is not None), sink)
    pipeline.prepare()
    pipeline.run(until_lsn=current_wal_lsn(conn))
    sink.close()


def _topics(spark: Any, servers: str, prefix: str) -> Any:
    """What the change topics hold now, as a DataFrame that later writes do not change."""
    frame = (spark.read.format("kafka").option("kafka.bootstrap.servers", servers)
             .option("subscribePattern", table_topic_pattern(prefix))
             .option("startingOffsets", "earliest").option("includeHeaders", "true").load())
    return spark.createDataFrame(frame.collect(), frame.schema)


def _since(everything: Any, before: Any) -> Any:
    return everything.join(before.select("topic", "partition", "offset"),
                           ["topic", "partition", "offset"], "left_anti")


@pytest.mark.parametrize(("capture", "workers"), [(True, 0), (True, 2), (False, 0)],
                         ids=["history", "history-2-workers", "records"])
def test_column_added_after_the_initial_load_reaches_the_lake(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, spark: Any,
        tmp_path: Path, capture: bool, workers: int) -> None:
    """Issue 15 point 4, as reported: a load (by reader threads, or by worker processes each
    with its own sink, as ``pgcdc run --initial-load`` runs it), then ADD COLUMN b and a row
    using it."""
    pg_conn.execute("CREATE TABLE ev (id int PRIMARY KEY, a text)")
    pg_conn.execute("INSERT INTO ev VALUES (1, 'a')")
    history = tmp_path / "catalog" if capture else None
    factory = partial(KafkaSink, kafka_servers, topic_prefix=topic_prefix)
    sink = factory()
    load = InitialLoad(LoadConfig(pg_dsn, tmp_path / "load.json", tables=["public.ev"],
                                  readers=1, workers=workers, sink_factory=factory,
                                  capture_ddl=capture, catalog_dir=history), sink)
    assert load.run().complete
    sink.close()
    pg_conn.execute("ALTER TABLE ev ADD COLUMN b int")
    pg_conn.execute("INSERT INTO ev VALUES (2, 'b', 7)")
    _stream(pg_dsn, kafka_servers, topic_prefix, pg_conn, tables=["public.ev"],
            history=history)

    lake = (tmp_path / "lake").as_uri()
    config = job.JobConfig(kafka_servers, lake, (tmp_path / "cp").as_uri(),
                           topic_prefix=topic_prefix)
    catalog = job.read_catalog(spark, config)
    (spec,) = catalog.tables()
    assert catalog.knows(spec.oid) is capture
    # every published version counts from a true LSN, the stream's after the load's
    published = catalog.log.versions(spec.oid)
    assert len(published) == 2 and 0 < published[0].lsn < published[1].lsn
    assert [c.name for c in spec.columns] == ["id", "a", "b"]
    apply_batch(spark, _topics(spark, kafka_servers, topic_prefix), 0, catalog=catalog,
                lake=lake, app_id="load")
    rows = spark.read.format("delta").load(table_path(lake, spec)).orderBy("id").collect()
    assert [(r["id"], r["a"], r["b"]) for r in rows] == [(1, "a", None), (2, "b", 7)]
    with psycopg.connect(pg_dsn) as conn:
        (result,) = compare(conn, spark, lake, [spec])
    assert result.equal, result


def _publication(conn: Conn, kind: str) -> list[str] | None:
    """The publication pgcdc streams: FOR ALL TABLES (pgcdc creates it without --tables),
    FOR TABLES IN SCHEMA public (created here), or a list of tables (``--tables``: pgcdc
    creates it, and follows a listed table dropped and created again into it)."""
    if kind == "schema":
        conn.execute("CREATE PUBLICATION pgcdc FOR TABLES IN SCHEMA public")
    if kind == "list":
        return [QUOTED.as_string(conn), "public.gone", "public.stays"]
    return None


def _first_life(conn: Conn) -> None:
    conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(QUOTED))
    conn.execute("CREATE TABLE gone (id int PRIMARY KEY, v text)")
    conn.execute("CREATE TABLE stays (id int PRIMARY KEY, v text)")


def _first_rows(conn: Conn) -> None:
    conn.execute(sql.SQL("INSERT INTO {} SELECT g, 'old' || g FROM generate_series(1, 8) g")
                 .format(QUOTED))
    conn.execute(sql.SQL("UPDATE {} SET v = 'old!' WHERE id % 3 = 0").format(QUOTED))
    conn.execute("INSERT INTO gone SELECT g, 'g' || g FROM generate_series(1, 4) g")
    conn.execute("INSERT INTO stays VALUES (1, 'x')")


def _second_life(conn: Conn) -> None:
    """Dropped and created again with the same definition (so the same table version), rows
    at some of the old keys; ``gone`` dropped for good."""
    conn.execute(sql.SQL("DROP TABLE {}").format(QUOTED))
    conn.execute("DROP TABLE gone")
    conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(QUOTED))
    conn.execute(sql.SQL("INSERT INTO {} SELECT g, 'new' || g FROM generate_series(6, 10) g")
                 .format(QUOTED))
    conn.execute(sql.SQL("UPDATE {} SET v = 'new!' WHERE id = 7").format(QUOTED))
    conn.execute(sql.SQL("DELETE FROM {} WHERE id = 10").format(QUOTED))
    conn.execute("UPDATE stays SET v = 'y'")


def _check_lake(spark: Any, conn_dsn: str, catalog: Any, lake: str) -> None:
    tables = catalog.tables()
    assert sorted(t.name for t in tables) == ["stays", NAME]
    with psycopg.connect(conn_dsn) as conn:
        results = compare(conn, spark, lake, tables)
    assert all(r.equal for r in results), results
    assert all(r.source.rows > 0 for r in results)
    from delta.tables import DeltaTable

    (gone, _) = next((s, lsn) for s, lsn in catalog.drops() if s.name == "gone")
    assert not DeltaTable.isDeltaTable(spark, table_path(lake, gone))
    weird = next(t for t in tables if t.name == NAME)
    props = spark.sql(f"SHOW TBLPROPERTIES delta.`{table_path(lake, weird)}`").collect()
    assert {r["key"]: r["value"] for r in props}["pgcdc.oid"] == str(weird.oid)


@pytest.mark.parametrize("publication", ["all", "schema", "list"])
def test_dropped_and_recreated_table_in_one_batch(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, spark: Any,
        tmp_path: Path, publication: str) -> None:
    """Both lives of a table in one micro-batch: the old one is applied, then dropped, and the
    new one starts empty; a table dropped for good leaves the lake."""
    history = tmp_path / "catalog"
    _first_life(pg_conn)
    tables = _publication(pg_conn, publication)
    Pipeline(PipelineConfig(pg_dsn, tables=tables, catalog_dir=history), NoSink()).prepare()
    _first_rows(pg_conn)
    _second_life(pg_conn)
    _stream(pg_dsn, kafka_servers, topic_prefix, pg_conn, tables=tables, history=history)

    lake = (tmp_path / "lake").as_uri()
    config = job.JobConfig(kafka_servers, lake, (tmp_path / "cp").as_uri(),
                           topic_prefix=topic_prefix)
    catalog = job.read_catalog(spark, config)
    # the wire carries the history's own serialization: the records are the log's lines
    records = (spark.read.format("kafka").option("kafka.bootstrap.servers", kafka_servers)
               .option("subscribe", catalog_history_topic(topic_prefix))
               .option("startingOffsets", "earliest").load()
               .selectExpr("offset", "CAST(value AS STRING) AS v").orderBy("offset").collect())
    assert [r["v"] for r in records] == (history / "catalog.log").read_text().splitlines()
    everything = _topics(spark, kafka_servers, topic_prefix)
    versions = {(r[0], r[1]) for r in everything.selectExpr(
        "topic", "CAST(element_at(filter(headers, h -> h.key = 'pgcdc.table_version'), 1)"
        ".value AS STRING)").collect()}
    assert len({v for t, v in versions if "we_ird" in t}) == 1  # one version, two lives
    applied = apply_batch(spark, everything, 0, catalog=catalog, lake=lake, app_id="lives")
    assert set(applied) == {"public.stays", f"public.{NAME}", "public.gone"}
    _check_lake(spark, pg_dsn, catalog, lake)
    # the batch again (a retry after a crash): the same lake
    apply_batch(spark, everything, 0, catalog=catalog, lake=lake, app_id="lives")
    _check_lake(spark, pg_dsn, catalog, lake)


def test_dropped_and_recreated_table_across_batches_archived(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, spark: Any,
        tmp_path: Path) -> None:
    """The first life applied in one batch (its drop not yet in the catalog), the second in a
    later one, with the job's archive option: the old lake tables move to the archive."""
    history = tmp_path / "catalog"
    _first_life(pg_conn)
    Pipeline(PipelineConfig(pg_dsn, catalog_dir=history), NoSink()).prepare()
    _first_rows(pg_conn)
    _stream(pg_dsn, kafka_servers, topic_prefix, pg_conn, tables=None, history=history)
    lake = (tmp_path / "lake").as_uri()
    config = job.JobConfig(kafka_servers, lake, (tmp_path / "cp").as_uri(),
                           topic_prefix=topic_prefix, archive_dropped=True)
    first = _topics(spark, kafka_servers, topic_prefix)
    old = job.read_catalog(spark, config)
    apply_batch(spark, first, 0, catalog=old, lake=lake, app_id="lives", archive=True)
    old_weird = next(t for t in old.tables() if t.name == NAME)
    old_gone = next(t for t in old.tables() if t.name == "gone")

    _second_life(pg_conn)
    _stream(pg_dsn, kafka_servers, topic_prefix, pg_conn, tables=None, history=history)
    everything = _topics(spark, kafka_servers, topic_prefix)
    stale: list[Any] = [old]

    def catalog_for(versions: set[str]) -> Any:  # the job's cache: read again when asked
        if not versions or any(stale[0].by_version(v) is None for v in versions):
            stale[0] = job.read_catalog(spark, config)
        return stale[0]

    apply_batch(spark, _since(everything, first), 1, catalog=catalog_for, lake=lake,
                app_id="lives", archive=True)
    catalog = job.read_catalog(spark, config)
    _check_lake(spark, pg_dsn, catalog, lake)
    for spec, rows in ((old_weird, 8), (old_gone, 4)):
        archived = f"{archive_path(lake, table_path(lake, spec), spec.oid)}/" \
                   f"{table_path(lake, spec).rsplit('/', 1)[-1]}"
        assert spark.read.format("delta").load(archived).count() == rows


def test_the_job_follows_drops_and_recreates_across_small_batches(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, spark: Any,
        tmp_path: Path) -> None:
    """The Structured Streaming query itself (``pgcdc spark --available-now``), three offsets
    per micro-batch: each life of the table reaches the lake in several batches."""
    history = tmp_path / "catalog"
    _first_life(pg_conn)
    Pipeline(PipelineConfig(pg_dsn, catalog_dir=history), NoSink()).prepare()
    _first_rows(pg_conn)
    _second_life(pg_conn)
    _stream(pg_dsn, kafka_servers, topic_prefix, pg_conn, tables=None, history=history)
    lake = (tmp_path / "lake").as_uri()
    config = job.JobConfig(kafka_servers, lake, (tmp_path / "cp").as_uri(),
                           topic_prefix=topic_prefix, trigger_seconds=None,
                           max_offsets_per_trigger=3)
    batches: list[int] = []
    job.start(spark, config, on_batch=lambda batch_id, _: batches.append(batch_id))\
        .awaitTermination()
    assert len(batches) > 5
    _check_lake(spark, pg_dsn, job.read_catalog(spark, config), lake)


@pytest.mark.parametrize("keep", [False, True], ids=["dropped", "kept"])
def test_a_dropped_column_leaves_the_lake_and_its_name_starts_empty(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, spark: Any,
        tmp_path: Path, keep: bool) -> None:
    """A column dropped at the source is dropped in the lake (kept with the archive option,
    moved aside to ``<name>__dropped`` once a new column takes its name), in a keyed and a
    keyless table; a column added again under the name is another column: NULL in the old
    rows, never the dropped column's values."""
    history = tmp_path / "catalog"
    pg_conn.execute("CREATE TABLE k (id int PRIMARY KEY, a int, b int, c text)")
    pg_conn.execute("CREATE TABLE f (x int, b int)")
    pg_conn.execute("ALTER TABLE f REPLICA IDENTITY FULL")
    Pipeline(PipelineConfig(pg_dsn, catalog_dir=history), NoSink()).prepare()
    pg_conn.execute("INSERT INTO k SELECT g, g, g * 10, 'c' FROM generate_series(1, 6) g")
    pg_conn.execute("INSERT INTO f SELECT g % 2, g FROM generate_series(1, 6) g")
    _stream(pg_dsn, kafka_servers, topic_prefix, pg_conn, tables=None, history=history)
    lake = (tmp_path / "lake").as_uri()
    config = job.JobConfig(kafka_servers, lake, (tmp_path / "cp").as_uri(),
                           topic_prefix=topic_prefix, archive_dropped=keep)
    first = _topics(spark, kafka_servers, topic_prefix)
    apply_batch(spark, first, 0, catalog=job.read_catalog(spark, config), lake=lake,
                app_id="columns", archive=keep)

    for table in ("k", "f"):
        pg_conn.execute(f"ALTER TABLE {table} DROP COLUMN b")
        pg_conn.execute(f"ALTER TABLE {table} ADD COLUMN b int")  # another column, NULL
    pg_conn.execute("ALTER TABLE k DROP COLUMN c")
    pg_conn.execute("INSERT INTO k VALUES (7, 7, 70)")
    pg_conn.execute("INSERT INTO f VALUES (9, 90)")
    pg_conn.execute("DELETE FROM f WHERE x = 1 AND b IS NULL AND ctid IN "
                    "(SELECT ctid FROM f WHERE x = 1 LIMIT 1)")
    _stream(pg_dsn, kafka_servers, topic_prefix, pg_conn, tables=None, history=history)
    catalog = job.read_catalog(spark, config)
    apply_batch(spark, _since(_topics(spark, kafka_servers, topic_prefix), first), 1,
                catalog=catalog, lake=lake, app_id="columns", archive=keep)
    tables = [t for t in catalog.tables() if t.schema == "public"]
    with psycopg.connect(pg_dsn) as conn:
        results = compare(conn, spark, lake, tables)
    assert all(r.equal for r in results), results
    data = {"k": ["id", "a", "b"], "f": ["x", "b"]}
    aside = {"k": ["b__dropped", "c"], "f": ["b__dropped"]} if keep else {"k": [], "f": []}
    for spec in tables:
        frame = spark.read.format("delta").load(table_path(lake, spec))
        columns = [c for c in frame.columns if not c.startswith("_pgcdc")]
        assert sorted(columns) == sorted(data[spec.name] + aside[spec.name]), columns
        if keep and spec.name == "k":  # the dropped column's values stay in the old rows
            kept = sorted(r[0] for r in frame.select("b__dropped").collect()
                          if r[0] is not None)
            assert kept == [10, 20, 30, 40, 50, 60]
