"""The initial load straight into Delta (streaming/bulk_load.py, ``pgcdc snapshot --lake``):
Spark tasks read the tables under the slot's exported snapshot and write the lake, then
the stream (``pgcdc run``, ``pgcdc spark``) applies only what changed after the snapshot;
the lake equals the source (the clone oracle), a table of every type lands as the same Spark
values as its copy streamed through Kafka, and a load killed between tables resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from core.failpoints import EXIT_CODE
from core.wire import table_topic_pattern
from decoder.slot import current_wal_lsn, slot_info
from loads.initial_load import LoadConfig
from loads.load_state import plan_chunks
from pgcdc.clone import compare
from pgcdc.exit_codes import EXIT_TRANSIENT
from pgcdc.pipeline import Pipeline, PipelineConfig
from pgcdc.services.postgres import PostgresServer
from sinks.kafka import KafkaSink
from streaming import job
from streaming.apply import apply_batch
from streaming.bulk_load import LakeNotEmptyError, load_lake, marker, spec_of
from streaming.evolution import quote, table_properties
from streaming.multiset import APPLIED_PROPERTY, LOADED_PROPERTY, OCCURRENCE
from streaming.schema import COMMIT_LSN, ORDINAL, TEXT
from tests.integration.test_spark_types import _create, _insert

pytestmark = pytest.mark.spark

Conn = psycopg.Connection[tuple[object, ...]]


def _stream_and_apply(dsn: str, servers: str, prefix: str, tables: list[str], conn: Conn,
                      tmp_path: Path, spark: Any, batch_id: int) -> Any:
    """What ``pgcdc run`` (no load of its own) and ``pgcdc spark`` do after the lake load:
    stream the slot from where the load left it, apply the topics; returns the catalog."""
    sink = KafkaSink(servers, topic_prefix=prefix)
    pipeline = Pipeline(PipelineConfig(dsn, tables=tables, progress_file=tmp_path / "p.json",
                                       catalog_dir=tmp_path / "catalog"), sink)
    pipeline.prepare()
    pipeline.run(until_lsn=current_wal_lsn(conn))
    sink.close()
    lake = (tmp_path / "lake").as_uri()
    config = job.JobConfig(servers, lake, (tmp_path / "cp").as_uri(), topic_prefix=prefix)
    catalog = job.read_catalog(spark, config)
    topic = (spark.read.format("kafka").option("kafka.bootstrap.servers", servers)
             .option("subscribePattern", table_topic_pattern(prefix))
             .option("startingOffsets", "earliest").option("includeHeaders", "true").load())
    apply_batch(spark, topic, batch_id, catalog=catalog, lake=lake, app_id="bulk")
    return catalog


def _texts(frame: Any) -> list[Any]:
    """A lake table's rows by ``id``, each value as text (Python cannot hold every Spark
    value: BC dates)."""
    rows: list[Any] = frame.orderBy("id").selectExpr(*[
        f"to_json({quote(c)}) AS {quote(c)}" if t.startswith("map") else
        f"CAST({quote(c)} AS STRING) AS {quote(c)}" for c, t in frame.dtypes]).collect()
    return rows


def _config(dsn: str, tmp_path: Path, tables: list[str]) -> LoadConfig:
    return LoadConfig(dsn, tmp_path / "load.json", tables=tables, chunk_pages=2,
                      progress_file=tmp_path / "p.json", catalog_dir=tmp_path / "catalog")


def _load_argv(dsn: str, tables: list[str], lake: str, tmp_path: Path, prefix: str,
               *options: str) -> list[str]:
    """``pgcdc snapshot --lake``, one table at a time, its files in ``tmp_path``."""
    return [sys.executable, "-m", "pgcdc", "snapshot", "--dsn", dsn, "--tables",
            ",".join(tables), "--lake", lake, "--readers", "1", *options,
            "--load-state", str(tmp_path / "load.json"),
            "--progress-file", str(tmp_path / "p.json"),
            "--catalog-dir", str(tmp_path / "catalog"), "--topic-prefix", prefix]


def _crashed_load(dsn: str, tables: list[str], lake: str, tmp_path: Path, prefix: str,
                  fail_point: str, *options: str) -> Any:
    """``pgcdc snapshot --lake`` (one table at a time) crashed at ``fail_point``: its state."""
    argv = _load_argv(dsn, tables, lake, tmp_path, prefix, *options)
    crash = subprocess.run(argv, capture_output=True, timeout=600, check=False, env={
        **os.environ, "PGCDC_FAIL_POINT": fail_point})
    assert crash.returncode == EXIT_CODE, crash.stderr.decode()[-3000:]
    return json.loads((tmp_path / "load.json").read_text())


def _keyless_and_keyed(conn: Conn) -> list[str]:
    """A keyless table ``k`` of 60 rows (duplicates among them) and a keyed ``a`` of 50."""
    conn.execute("CREATE TABLE k (a int, b text)")
    conn.execute("ALTER TABLE k REPLICA IDENTITY FULL")
    conn.execute("INSERT INTO k SELECT g % 3, 'x' FROM generate_series(1, 60) g")
    conn.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
    conn.execute("INSERT INTO a SELECT g, 'v' || g FROM generate_series(1, 50) g")
    return ["public.a", "public.k"]


def _loaded(dsn: str, tmp_path: Path, tables: list[str], lake: str, spark: Any, prefix: str, *,
            attempts: int) -> Any:
    """The lake load run (or resumed) to its end in this process: its state, ``attempts``
    snapshots taken in all."""
    assert load_lake(_config(dsn, tmp_path, tables), lake, spark=spark, topic_prefix=prefix)
    state = json.loads((tmp_path / "load.json").read_text())
    assert state["status"] == "complete" and len(state["attempts"]) == attempts
    return state


def _assert_clone(dsn: str, spark: Any, lake: str, catalog: Any, names: set[str]) -> None:
    specs = [s for s in catalog.known_tables() if s.qualified_name in names]
    assert len(specs) == len(names)
    with psycopg.connect(dsn) as conn:
        results = compare(conn, spark, lake, specs)
    assert results and all(r.source.rows > 0 for r in results), results
    assert all(r.equal for r in results), [r for r in results if not r.equal]


@pytest.mark.timeout(1200)  # 16 and 8 min on the shared 2-core machine at load 40-50
def test_lake_load_then_stream(pg_conn: Conn, pg_dsn: str, kafka_servers: str,
                               topic_prefix: str, spark: Any, tmp_path: Path) -> None:
    rows = _create(pg_conn)
    _insert(pg_conn, rows)
    pg_conn.execute("CREATE TABLE everything_k (LIKE everything INCLUDING ALL)")
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text, n numeric(10,2))")
    pg_conn.execute("INSERT INTO t SELECT g, repeat('x', g % 50), g / 3.0 "
                    "FROM generate_series(1, 1000) g")
    pg_conn.execute("CREATE TABLE k (a int, b text)")  # keyless: a multiset
    pg_conn.execute("ALTER TABLE k REPLICA IDENTITY FULL")
    pg_conn.execute("INSERT INTO k SELECT g % 7, CASE WHEN g % 5 = 0 THEN NULL ELSE 'b' END "
                    "FROM generate_series(1, 500) g")
    tables = ["public.everything", "public.everything_k", "public.t", "public.k"]
    lake = (tmp_path / "lake").as_uri()

    state = _loaded(pg_dsn, tmp_path, tables, lake, spark, topic_prefix, attempts=1)
    assert sum(len(t["chunks"]) for t in state["tables"].values()) > len(tables)  # chunked
    load_lsn = state["consistent_point"] - 1
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the slot waits at its snapshot
        info = slot_info(conn, "pgcdc")
        assert info is not None and info.confirmed_flush_lsn == state["consistent_point"]
    for name, count in (("t", 1000), ("k", 500), ("everything", rows), ("everything_k", 0)):
        frame = spark.read.format("delta").load(f"{lake}/public.{name}")
        positions = frame.groupBy(COMMIT_LSN).count().collect()
        assert [(r[0], r[1]) for r in positions] == ([(load_lsn, count)] if count else [])
        assert frame.select(ORDINAL).distinct().count() == count  # every read its own
    k_path = f"{lake}/public.k"
    assert table_properties(spark, k_path)[LOADED_PROPERTY] == str(load_lsn)
    occurrences = spark.read.format("delta").load(k_path).groupBy("a", "b").agg(
        {OCCURRENCE: "max", "*": "count"}).collect()
    assert all(r[f"max({OCCURRENCE})"] == r["count(1)"] for r in occurrences)

    # after the snapshot: the copy of every type goes through Kafka; changes of every kind
    pg_conn.execute("INSERT INTO everything_k SELECT * FROM everything")
    pg_conn.execute("UPDATE t SET v = 'new' WHERE id % 10 = 0")
    pg_conn.execute("DELETE FROM t WHERE id % 13 = 0")
    pg_conn.execute("INSERT INTO t VALUES (5000, 'late', 1.5)")
    pg_conn.execute("DELETE FROM k WHERE ctid = (SELECT min(ctid) FROM k WHERE a = 3)")
    pg_conn.execute("UPDATE k SET b = 'c' WHERE ctid = (SELECT min(ctid) FROM k WHERE a = 4)")
    pg_conn.execute("INSERT INTO k VALUES (1, 'b'), (1, 'b'), (NULL, NULL)")
    catalog = _stream_and_apply(pg_dsn, kafka_servers, topic_prefix, tables, pg_conn, tmp_path,
                                spark, 0)

    # loaded in bulk and streamed through Kafka: the same Spark values, the same types
    def values(name: str) -> Any:
        frame = spark.read.format("delta").load(f"{lake}/public.{name}")
        return frame.drop(COMMIT_LSN, ORDINAL)

    bulk, streamed = values("everything"), values("everything_k")
    assert bulk.dtypes == streamed.dtypes
    assert len(bulk.columns) > 40
    bulk_rows, streamed_rows = _texts(bulk), _texts(streamed)
    assert len(bulk_rows) == rows
    differ = sorted({(c, r[c], s[c]) for r, s in zip(bulk_rows, streamed_rows, strict=True)
                     for c in bulk.columns if r[c] != s[c]}, key=str)
    assert not differ, differ[:10]
    # (the clone oracle reads some of these types otherwise than test_spark_types does, for
    # the streamed copy as well: the two tables of every type are compared with each other)
    _assert_clone(pg_dsn, spark, lake, catalog, {"public.t", "public.k"})
    assert bulk.where(f"{TEXT} IS NOT NULL AND size({TEXT}) > 0").count() == \
        streamed.where(f"{TEXT} IS NOT NULL AND size({TEXT}) > 0").count()

    # a second load into a lake that holds the tables is refused
    with pytest.raises(LakeNotEmptyError, match="already holds rows"):
        from streaming.bulk_load import LakeLoad
        (tmp_path / "load.json").unlink()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot('pgcdc')")
        (tmp_path / "p.json").unlink()
        LakeLoad(LoadConfig(pg_dsn, tmp_path / "load.json", tables=["public.t"],
                            catalog_dir=tmp_path / "catalog2"), spark, lake).run()


@pytest.mark.timeout(1200)  # 16 and 8 min on the shared 2-core machine at load 40-50
def test_lake_load_killed_between_tables_resumes(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, spark: Any,
        tmp_path: Path) -> None:
    """Killed after the keyless table and the first keyed table's commit, with only part of
    that table's chunks recorded: the next run keeps both (the commit is found by its
    marker), loads the rest under a new snapshot, and the stream makes the lake equal."""
    pg_conn.execute("CREATE TABLE k (a int, b text)")
    pg_conn.execute("ALTER TABLE k REPLICA IDENTITY FULL")
    pg_conn.execute("INSERT INTO k SELECT g % 3, 'x' FROM generate_series(1, 300) g")
    for name in ("a", "b"):
        pg_conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text)")
        pg_conn.execute(f"INSERT INTO {name} SELECT g, 'v' || g FROM generate_series(1, 1500) g")
    tables = ["public.a", "public.b", "public.k"]
    lake = (tmp_path / "lake").as_uri()
    pages = pg_conn.execute(
        "SELECT pg_relation_size('k') / current_setting('block_size')::int").fetchone()
    assert pages is not None
    k_chunks = len(plan_chunks(int(str(pages[0])), 2))
    state = _crashed_load(pg_dsn, tables, lake, tmp_path, topic_prefix,
                          f"after_snapshot_chunk:{k_chunks + 1}", "--chunk-pages", "2")
    by_name = {t["name"]: t for t in state["tables"].values()}
    assert by_name["k"]["complete"] and not by_name["a"]["complete"]
    assert sum(c["done"] is not None for c in by_name["a"]["chunks"]) == 1
    assert len(by_name["a"]["chunks"]) > 1
    assert not (tmp_path / "lake" / "public.b").exists()

    # between the runs: changes the stream must bring, rows the new snapshot sees
    pg_conn.execute("UPDATE a SET v = 'changed' WHERE id <= 100")
    pg_conn.execute("DELETE FROM b WHERE id > 1400")
    pg_conn.execute("INSERT INTO b SELECT g, 'new' FROM generate_series(2000, 2050) g")
    pg_conn.execute("INSERT INTO k VALUES (1, 'x')")
    # DDL: of a loaded table (its version after the load's), and of one the next run
    # reads under its new snapshot (read with the new shape, streamed from the old one);
    # none that changes stored rows (a default: read again, which this stream does not)
    pg_conn.execute("ALTER TABLE a RENAME COLUMN v TO v2")
    pg_conn.execute("ALTER TABLE b ADD COLUMN c int")
    pg_conn.execute("ALTER TABLE b DROP COLUMN v")
    pg_conn.execute("INSERT INTO b VALUES (3000, 7)")

    state = _loaded(pg_dsn, tmp_path, tables, lake, spark, topic_prefix, attempts=2)
    a_writes = spark.sql(f"DESCRIBE HISTORY delta.`{lake}/public.a`").where(
        f"userMetadata = '{marker_of(state, 'a')}'").count()
    assert a_writes == 1  # found, not written again
    b_ordinals = spark.read.format("delta").load(f"{lake}/public.b").selectExpr(
        f"min({ORDINAL} >> 55)").collect()[0][0]
    assert b_ordinals == 1  # read under the second attempt's snapshot

    catalog = _stream_and_apply(pg_dsn, kafka_servers, topic_prefix, tables, pg_conn, tmp_path,
                                spark, 0)
    _assert_clone(pg_dsn, spark, lake, catalog, {"public.a", "public.b", "public.k"})


@pytest.mark.timeout(1200)
def test_lake_load_of_a_keyless_table_resumed_after_writes(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, spark: Any,
        tmp_path: Path) -> None:
    """Killed with the keyless table's lake table created and marked loaded but no row
    written (bench seed 55: the resume was refused, and once left the table empty); then
    rows inserted twice over, deleted, truncated, a column added.  The resume reads the
    table at a cut of its own, under a SHARE lock, while a writer keeps inserting; the
    stream's changes before the cut are left out, the later ones counted: the lake equals
    the source."""
    tables = _keyless_and_keyed(pg_conn)
    lake = (tmp_path / "lake").as_uri()
    state = _crashed_load(pg_dsn, tables, lake, tmp_path, topic_prefix, "before_lake_write:1")
    assert len(state["attempts"]) == 1 and not any(t["complete"]
                                                   for t in state["tables"].values())
    k_path = f"{lake}/public.k"
    assert table_properties(spark, k_path)[LOADED_PROPERTY]  # created, marked, empty
    assert spark.read.format("delta").load(k_path).count() == 0

    # between the runs: each of these is both in the stream and seen by the resume's read
    pg_conn.execute("INSERT INTO k SELECT 1, 'x' FROM generate_series(1, 3)")
    pg_conn.execute("DELETE FROM k WHERE ctid = (SELECT min(ctid) FROM k WHERE a = 2)")
    pg_conn.execute("TRUNCATE k")
    pg_conn.execute("INSERT INTO k SELECT g % 4, 'y' FROM generate_series(1, 40) g")
    pg_conn.execute("ALTER TABLE k ADD COLUMN c int")
    pg_conn.execute("INSERT INTO k VALUES (1, 'y', 7), (1, 'y', 7)")
    pg_conn.execute("UPDATE k SET c = 9 WHERE ctid = (SELECT min(ctid) FROM k WHERE a = 3)")
    pg_conn.execute("UPDATE a SET v = 'changed' WHERE id <= 10")

    # and during the resume: a writer the table's SHARE lock holds back, then lets through
    stop = threading.Event()
    written: list[int] = []

    def write() -> None:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            while not stop.is_set():
                conn.execute("INSERT INTO k VALUES (2, 'w', 1), (2, 'w', 1)")
                written.append(2)
                time.sleep(0.05)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        assert load_lake(_config(pg_dsn, tmp_path, tables), lake, spark=spark,
                         topic_prefix=topic_prefix)
    finally:
        stop.set()
        writer.join(30)
    assert written
    state = json.loads((tmp_path / "load.json").read_text())
    assert state["status"] == "complete" and len(state["attempts"]) == 2
    properties = table_properties(spark, k_path)
    cut = int(properties[LOADED_PROPERTY])
    assert cut >= state["consistent_point"]  # the table's own cut, after the slot's
    assert properties[APPLIED_PROPERTY].startswith(f"{cut}/")
    pg_conn.execute("DELETE FROM k WHERE ctid = (SELECT min(ctid) FROM k WHERE a = 2)")
    pg_conn.execute("INSERT INTO k VALUES (0, 'y', NULL)")

    catalog = _stream_and_apply(pg_dsn, kafka_servers, topic_prefix, tables, pg_conn, tmp_path,
                                spark, 0)
    _assert_clone(pg_dsn, spark, lake, catalog, {"public.a", "public.k"})


@pytest.mark.timeout(1200)
def test_lake_load_killed_before_its_history_begins_again(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, spark: Any,
        tmp_path: Path) -> None:
    """Killed after it made the slot and stored its state, before the catalog history began:
    the definitions at the slot's consistent point are gone with the DDL made since (the
    stream stopped with "DDL happened without the pgcdc event trigger"), and nothing was read
    yet, so the next run makes the slot again and loads under its snapshot."""
    tables = _keyless_and_keyed(pg_conn)
    lake = (tmp_path / "lake").as_uri()
    crashed = _crashed_load(pg_dsn, tables, lake, tmp_path, topic_prefix, "before_load_history")
    assert crashed["attempts"] == [] and not (tmp_path / "catalog" / "catalog.log").exists()

    pg_conn.execute("UPDATE a SET v = 'before' WHERE id <= 5")
    pg_conn.execute("ALTER TABLE a ADD COLUMN c int DEFAULT 5")
    pg_conn.execute("ALTER TABLE a RENAME COLUMN v TO v2")
    pg_conn.execute("INSERT INTO a VALUES (100, 'new', 1)")
    pg_conn.execute("INSERT INTO k VALUES (1, 'x'), (1, 'x')")
    pg_conn.execute("ALTER TABLE k ADD COLUMN c text DEFAULT 'd'")

    state = _loaded(pg_dsn, tmp_path, tables, lake, spark, topic_prefix, attempts=1)
    assert state["consistent_point"] > crashed["consistent_point"]  # a slot made again
    pg_conn.execute("UPDATE a SET v2 = 'streamed' WHERE id BETWEEN 6 AND 8")
    pg_conn.execute("DELETE FROM k WHERE ctid = (SELECT min(ctid) FROM k WHERE a = 1)")
    catalog = _stream_and_apply(pg_dsn, kafka_servers, topic_prefix, tables, pg_conn, tmp_path,
                                spark, 0)
    _assert_clone(pg_dsn, spark, lake, catalog, {"public.a", "public.k"})


def marker_of(state: dict[str, Any], name: str) -> str:
    from loads.load_state import LoadState

    loaded = LoadState.from_json(state)
    oid = next(oid for oid, t in loaded.tables.items() if t.name == name)
    return marker(loaded, oid)


def test_jdbc_read_is_inside_the_snapshot(pg_conn: Conn, pg_dsn: str, spark: Any) -> None:
    """The JVM's read (streaming/jdbc_read.py) sees the exported snapshot, not what was
    committed after it, one partition per chunk, each row with its chunk's ordinal."""
    from loads.load_state import CHUNK_BITS, ROW_BITS
    from snapshot_builder.catalog import Column, TableVersion
    from streaming import jdbc_read

    pg_conn.execute("CREATE TABLE js (id int PRIMARY KEY, v text)")
    pg_conn.execute("INSERT INTO js SELECT g, 'old' FROM generate_series(1, 3000) g")
    row = pg_conn.execute("SELECT 'js'::regclass::oid").fetchone()
    assert row is not None
    table = TableVersion(int(str(row[0])), "public", "js", "d", (
        Column("id", 23, "int4", -1, True), Column("v", 25, "text", -1, False)))
    with psycopg.connect(pg_dsn) as holder:  # the load's coordinator, in its snapshot
        holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        exported = holder.execute("SELECT pg_export_snapshot()").fetchone()
        assert exported is not None
        pg_conn.execute("UPDATE js SET v = 'new'")
        pg_conn.execute("INSERT INTO js VALUES (5000, 'late')")
        source, why = jdbc_read.jdbc_source(holder)
        assert source is not None, why
        assert jdbc_read.probe(spark, source) == ""
        chunks = [(0, 0, 4), (1, 4, 8), (2, 8, None)]
        frame, values = jdbc_read.chunk_rows(
            spark, source, spec=spec_of(table, 0), row_filter="id <> 7",
            snapshot=str(exported[0]), lock_timeout_ms=1000, chunks=chunks, attempt=3,
            enums=frozenset())
        rows = frame.selectExpr(f"{values['id'][0]} AS id", f"{values['v'][0]} AS v",
                                "_ordinal").collect()
    assert sorted(r["id"] for r in rows) == [i for i in range(1, 3001) if i != 7]
    assert {r["v"] for r in rows} == {"old"}
    ordinals = [r["_ordinal"] for r in rows]
    assert len(set(ordinals)) == len(rows)
    assert {o >> (CHUNK_BITS + ROW_BITS) for o in ordinals} == {3}
    by_chunk: dict[int, list[int]] = {}
    for o in ordinals:
        by_chunk.setdefault((o >> ROW_BITS) & ((1 << CHUNK_BITS) - 1), []).append(
            o & ((1 << ROW_BITS) - 1))
    assert sorted(by_chunk) == [0, 1, 2]  # every chunk read, each its rows from 0
    assert all(sorted(places) == list(range(len(places))) for places in by_chunk.values())


# every type streaming/jdbc_read.py reads on the JVM, with the values at its edges
_JDBC_TYPES = """CREATE TABLE jv (id int PRIMARY KEY, b bool, s smallint, i int, l bigint,
    d float8, by bytea, o oid, t text, vc varchar(10), bc char(5), nm name, ch "char", j json,
    jb jsonb, x xml, mac macaddr, mac8 macaddr8, bt bit(3), vb varbit, tv tsvector, tq tsquery,
    u uuid, dt date, n numeric(12,3), tz timestamptz, ts timestamp, ai int[], asm smallint[],
    al bigint[], m jv_mood, f4 real, nu numeric)"""
_JDBC_ROWS = [
    "(1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
    "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
    "NULL, NULL, NULL)",
    "(2, false, -32768, 2147483647, -9223372036854775808, 'NaN', '\\x00ff', 4294967295, "
    "E'quote '' \" \\\\ tab\\t nl\\n \\u00e9 \\U0001F600', '', 'a', 'n\"m', 'x', "
    "'{\"a\" : [1, 2]}', '{\"b\": 1, \"a\": [true, null]}', '<a>1</a>', '08:00:2b:01:02:03', "
    "'08:00:2b:01:02:03:04:05', B'101', B'1', 'a fat cat', 'fat & cat', "
    "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11', 'infinity', 'NaN', 'infinity', '-infinity', "
    "'[0:1]={1,2}', '{}', '{{1,NULL},{3,4}}', 'happy', 'NaN', 'NaN')",
    "(3, true, 32767, -2147483648, 9223372036854775807, 'Infinity', '', 0, 'x', 'abcdefghij', "
    "'abcde', '', E'\\\\001', 'null', '[]', '', '00:00:00:00:00:00', "
    "'00:00:00:00:00:00:00:00', B'000', B'', '', 'a', "
    "'00000000-0000-0000-0000-000000000000', '0044-03-15 BC', '-123456789.123', "
    "'0044-03-15 12:00:00.5+00 BC', '10000-01-01 00:00:00', '{NULL}', '{-32768,32767}', "
    "'{9223372036854775807}', 'sad', 'Infinity', 'Infinity')",
    "(4, true, 0, 0, 0, '-Infinity', '\\x', 1, ' lead and trail ', ' ', ' ', 'x', ' ', "
    "'\"s\"', '\"s\"', '<b/>', 'ff:ff:ff:ff:ff:ff', 'ff:ff:ff:ff:ff:ff:ff:ff', B'111', "
    "B'0101', 'z', 'z', 'ffffffff-ffff-ffff-ffff-ffffffffffff', '10000-01-01', '0.001', "
    "'294250-01-01 00:00:00+00', '0001-01-01 00:00:00', '{{{1}}}', '{1,NULL,3}', '{}', 'ok', "
    "'-Infinity', '-Infinity')",
    "(5, false, 1, 1, 1, '-0', '\\x0102', 2, 'x', 'x', 'x', 'x', 'x', '1.5e300', '1.5e300', "
    "'x', '01:02:03:04:05:06', '01:02:03:04:05:06:07:08', B'010', B'10', 'x', 'x', "
    "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '0001-01-01', '999999999.999', "
    "'9999-12-31 23:59:59.999999+00', '9999-12-31 23:59:59.999999', '{1}', '{1}', '{1}', "
    "'ok', 3.4028235e38, '0.00000000')",
    "(6, true, 2, 2, 2, 4.9e-324, '\\xff', 3, 'y', 'y', 'y', 'y', 'y', '1', '1', 'y', "
    "'01:02:03:04:05:06', '01:02:03:04:05:06:07:08', B'011', B'11', 'y', 'y', "
    "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '-infinity', '-0.001', "
    "'2024-06-01 12:00:00.000001+05:30', '2024-02-29 23:59:59.999999', '{1}', '{1}', '{1}', "
    "'happy', 1e-45, '-0.0000001230')",
    "(7, true, 3, 3, 3, 1e-310, '\\xff', 3, 'y', 'y', 'y', 'y', 'y', '1', '1', 'y', "
    "'01:02:03:04:05:06', '01:02:03:04:05:06:07:08', B'011', B'11', 'y', 'y', "
    "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '2024-02-29', '0', "
    "'-infinity', '0001-01-01 00:00:00 BC', '{1}', '{1}', '{1}', 'sad', 1.1, '123.4500')",
]


@pytest.mark.timeout(1200)
def test_jdbc_read_lands_as_the_python_read(pg_conn: Conn, pg_dsn: str, spark: Any,
                                            tmp_path: Path, caplog: Any,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A table of every type the JVM reads, edge values included, loaded on the JVM and by
    the Python tasks (whose values are the stream's: test_lake_load_then_stream): the same
    lake rows, value for value, ordinals included."""
    pg_conn.execute("CREATE TYPE jv_mood AS ENUM ('sad', 'ok', 'happy')")
    pg_conn.execute(_JDBC_TYPES)
    pg_conn.execute(f"INSERT INTO jv VALUES {', '.join(_JDBC_ROWS)}")
    pg_conn.execute("""INSERT INTO jv SELECT g, g % 2 = 0, g % 100, g, g::bigint * 1000003, g / 7.0,
                       int4send(g), g, 'row ' || g, g::text, g::text, 'n' || g, 'c',
                       json_build_object('g', g), jsonb_build_object('g', g, 'h', g % 5),
                       ('<g>' || g || '</g>')::xml, '08:00:2b:01:02:03', '08:00:2b:01:02:03:04:05',
                       B'110', B'1011', ('tv ' || g)::tsvector, 'q', gen_random_uuid(),
                       '2020-01-01'::date + g, g / 3.0, '2024-01-01'::timestamptz + g * interval
                       '1.5 s', '2024-01-01'::timestamp - g * interval '1 h', ARRAY[g, g % 3],
                       ARRAY[(g % 30000)::smallint], ARRAY[g::bigint, NULL],
                       (ARRAY['sad', 'ok', 'happy'])[g % 3 + 1]::jv_mood, (g / 7.0)::real,
                       g::numeric / 10 ^ (g % 12)
                     FROM generate_series(8, 3000) g""")
    frames = []
    for read, jdbc in (("jvm", "1"), ("python", "0")):
        monkeypatch.setenv("PGCDC_LAKE_LOAD_JDBC", jdbc)
        lake = (tmp_path / read / "lake").as_uri()
        config = LoadConfig(pg_dsn, tmp_path / read / "load.json", tables=["public.jv"],
                            slot=f"jv_{read}", chunk_pages=16,
                            progress_file=tmp_path / read / "p.json",
                            catalog_dir=tmp_path / read / "catalog")
        caplog.clear()
        with caplog.at_level("INFO", logger="streaming.bulk_load"):
            assert load_lake(config, lake, spark=spark)
        how = "with the JDBC driver" if read == "jvm" else "in Python tasks"
        assert f"reading public.jv {how}" in caplog.text
        state = json.loads((tmp_path / read / "load.json").read_text())
        assert sum(len(t["chunks"]) for t in state["tables"].values()) > 2
        frames.append(spark.read.format("delta").load(f"{lake}/public.jv").drop(COMMIT_LSN))
    jvm, python = frames
    assert jvm.dtypes == python.dtypes

    jvm_rows, python_rows = _texts(jvm), _texts(python)
    assert len(jvm_rows) == 3000
    differ = sorted({(c, r[c], p[c]) for r, p in zip(jvm_rows, python_rows, strict=True)
                     for c in jvm.columns if r[c] != p[c]}, key=str)
    assert not differ, differ[:10]
    untyped = jvm.where(f"size({TEXT}) > 0").select("id", TEXT).orderBy("id").collect()
    assert [(r["id"], r[TEXT]) for r in untyped] == [  # what Spark's types cannot hold
        (2, {"n": "NaN"}), (4, {"tz": "294250-01-01 00:00:00+00"})]


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("reader", ["jdbc", "python"])
def test_lake_load_through_a_postgres_crash(reader: str, own_pg_server: PostgresServer,
                                            kafka_servers: str, topic_prefix: str, spark: Any,
                                            tmp_path: Path) -> None:
    """PostgreSQL crashes (``pg_ctl stop -m immediate``) while ``pgcdc snapshot --lake`` has
    written one table and is about to read the other: the load's exported snapshot is gone
    with the crash, so it stops with an error that says to run it again (never a table
    marked loaded with rows missing); the next run loads the rest under a new snapshot, and
    the stream makes the lake equal to the source, DDL made after the crash included.  The
    tables are read by the JDBC driver, or (a composite column) by Python tasks, whose error
    reaches the driver as another kind of exception (bench seed 71000214000013: exit 1)."""
    with psycopg.connect(own_pg_server.dsn(), autocommit=True) as conn:
        # the module's cluster: a database each, and the other variant's slot gone
        conn.execute(f"CREATE DATABASE crash_{reader}")
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                     "WHERE NOT active")
    dsn = own_pg_server.dsn(f"crash_{reader}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = _keyless_and_keyed(conn)
        if reader == "python":  # a type the JDBC read leaves to Python tasks
            conn.execute("CREATE TYPE pair AS (a int, b text)")
            for table in ("a", "k"):
                conn.execute(f"ALTER TABLE {table} ADD COLUMN p pair DEFAULT ROW(1, 'p')")
    lake = (tmp_path / "lake").as_uri()
    pause = tmp_path / "paused"
    argv = _load_argv(dsn, tables, lake, tmp_path, topic_prefix, "--chunk-pages", "2")
    with (tmp_path / "load.log").open("wb") as err:
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env={
            **os.environ, "PGCDC_FAIL_POINT": "before_lake_write:2",
            "PGCDC_FAIL_PAUSE": str(pause)})
    try:
        deadline = time.monotonic() + 600
        while not pause.exists():  # the first table written, the second's about to be read
            assert process.poll() is None, (tmp_path / "load.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the load never reached its second table"
            time.sleep(0.1)
        own_pg_server.stop("immediate")
        own_pg_server.start()
        pause.unlink()
        code = process.wait(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
    log = (tmp_path / "load.log").read_text()
    assert code == EXIT_TRANSIENT, log[-3000:]
    assert "run the same command again" in log, log[-3000:]
    state = json.loads((tmp_path / "load.json").read_text())
    done = [t["name"] for t in state["tables"].values() if t["complete"]]
    assert len(done) == 1, state["tables"]  # the second table is not recorded loaded

    with psycopg.connect(dsn, autocommit=True) as conn:
        # after the crash: changes and DDL the stream brings, rows the new snapshot sees
        # (no DDL that changes stored rows: a default needs --incremental-snapshots)
        conn.execute("UPDATE a SET v = 'after' WHERE id <= 10")
        conn.execute("DELETE FROM a WHERE id > 45")
        conn.execute("INSERT INTO k (a, b) VALUES (1, 'x'), (1, 'x')")
        conn.execute("ALTER TABLE a ADD COLUMN c int")
        conn.execute("ALTER TABLE a RENAME COLUMN v TO v2")
        conn.execute("ALTER TABLE k ADD COLUMN c int")
        conn.execute("INSERT INTO k (a, b, c) VALUES (2, 'y', 5)")
        conn.execute("INSERT INTO a (id, v2, c) VALUES (100, 'new', 1)")
        _loaded(dsn, tmp_path, tables, lake, spark, topic_prefix, attempts=2)
        conn.execute("UPDATE a SET c = 9 WHERE id % 7 = 0")
        conn.execute("DELETE FROM k WHERE ctid = (SELECT min(ctid) FROM k WHERE a = 1)")
        catalog = _stream_and_apply(dsn, kafka_servers, topic_prefix, tables, conn, tmp_path,
                                    spark, 0)
    _assert_clone(dsn, spark, lake, catalog, {"public.a", "public.k"})
