"""The Spark apply on real Kafka, Spark and Delta: schema evolution inside one micro-batch,
key churn within a batch, and a driver killed mid-run (T14)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from core.wire import table_topic_pattern
from decoder.slot import current_wal_lsn
from pgcdc.clone import compare
from pgcdc.pipeline import Pipeline, PipelineConfig
from sinks.kafka import KafkaSink
from streaming import job
from streaming.apply import apply_batch
from tests.integration.test_spark_scale import _transactions
from tests.recording_sink import NoSink

pytestmark = pytest.mark.spark

Conn = psycopg.Connection[tuple[object, ...]]


def _capture(dsn: str, servers: str, prefix: str, tables: list[str], conn: Conn) -> None:
    sink = KafkaSink(servers, topic_prefix=prefix)
    Pipeline(PipelineConfig(dsn, tables=tables), sink).run(until_lsn=current_wal_lsn(conn))
    sink.close()


def _capture_ddl(dsn: str, servers: str, prefix: str, tables: list[str], conn: Conn,
                 history: Path) -> None:
    """As pgcdc runs: the catalog history (captured DDL, column identities) kept in ``history``
    from one run to the next."""
    sink = KafkaSink(servers, topic_prefix=prefix)
    pipeline = Pipeline(PipelineConfig(dsn, tables=tables, catalog_dir=history), sink)
    pipeline.prepare()
    pipeline.run(until_lsn=current_wal_lsn(conn))
    sink.close()


def _whole_topic(spark: Any, servers: str, prefix: str) -> Any:
    return (spark.read.format("kafka").option("kafka.bootstrap.servers", servers)
            .option("subscribePattern", table_topic_pattern(prefix))
            .option("startingOffsets", "earliest").option("includeHeaders", "true").load())


def _prepare(dsn: str, tables: list[str]) -> None:
    Pipeline(PipelineConfig(dsn, tables=tables), NoSink()).prepare()


def test_versions_mixed_in_one_batch_and_key_churn(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, spark: Any,
        tmp_path: Path) -> None:
    pg_conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok')")
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY, n int, m mood, gone text)")
    _prepare(pg_dsn, ["public.t"])
    pg_conn.execute("INSERT INTO t SELECT g, g, 'ok', 'x' FROM generate_series(1, 50) g")
    pg_conn.execute("ALTER TABLE t ADD COLUMN note text")
    pg_conn.execute("ALTER TABLE t ALTER COLUMN n TYPE bigint")
    pg_conn.execute("ALTER TYPE mood ADD VALUE 'happy'")
    pg_conn.execute("ALTER TABLE t DROP COLUMN gone")
    pg_conn.execute("INSERT INTO t SELECT g, 10000000000 + g, 'happy', 'new' "
                    "FROM generate_series(51, 80) g")
    pg_conn.execute("UPDATE t SET note = 'touched' WHERE id % 7 = 0")
    with pg_conn.transaction():  # delete and re-insert one key in one batch
        pg_conn.execute("DELETE FROM t WHERE id = 3")
        pg_conn.execute("INSERT INTO t VALUES (3, -3, 'sad', 'again')")
    pg_conn.execute("DELETE FROM t WHERE id = 4")
    pg_conn.execute("UPDATE t SET n = n + 1 WHERE id = 5")
    _capture(pg_dsn, kafka_servers, topic_prefix, ["public.t"], pg_conn)

    lake = (tmp_path / "lake").as_uri()
    config = job.JobConfig(kafka_servers, lake, (tmp_path / "cp").as_uri(),
                           topic_prefix=topic_prefix)
    catalog = job.read_catalog(spark, config)
    applied = apply_batch(spark, _whole_topic(spark, kafka_servers, topic_prefix), 0,
                          catalog=catalog, lake=lake, app_id="mixed")
    # rows the MERGE wrote: the latest change of each of the 80 keys but key 4's delete,
    # which finds no row in the new table
    assert applied == {"public.t": 79}
    with psycopg.connect(pg_dsn) as conn:
        (result,) = compare(conn, spark, lake, catalog.tables())
    assert result.equal, result
    delta = spark.read.format("delta").load(f"{lake}/public.t")
    types = dict(delta.dtypes)
    assert types["n"] == "bigint" and types["note"] == "string"
    assert "gone" not in types  # created at the newest version, which no longer has it

    # the new lake table's rows were appended, not MERGEd into it while it was empty
    def operations() -> list[str]:
        return [str(r["operation"]) for r in
                spark.sql(f"DESCRIBE HISTORY delta.`{lake}/public.t`").collect()]

    written = operations()
    assert written[0] == "WRITE" and "MERGE" not in written, written
    # with the batch's idempotent-write ids: the batch again (a driver that died before the
    # streaming commit) finds the table, and Delta skips its MERGE
    txns = _transactions(tmp_path / "lake" / "public.t")
    assert [t for v in sorted(txns) for t in txns[v]] == [("mixed", 0)], txns
    assert apply_batch(spark, _whole_topic(spark, kafka_servers, topic_prefix), 0,
                       catalog=catalog, lake=lake, app_id="mixed") == {"public.t": 0}
    assert operations() == written
    with psycopg.connect(pg_dsn) as conn:
        (result,) = compare(conn, spark, lake, catalog.tables())
    assert result.equal, result


def test_driver_killed_mid_run_recovers(pg_conn: Conn, pg_dsn: str, kafka_servers: str,
                                        topic_prefix: str, spark: Any, tmp_path: Path) -> None:
    """T14: kill -9 the Spark driver (a ``pgcdc spark`` process) between micro-batches'
    commits, restart, same result (with compaction every second batch). The restarted
    driver is the job in this process: it holds nothing of the killed one's lake or
    checkpoint, as a new process would not, and spares a second JVM's start."""
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
    _prepare(pg_dsn, ["public.t"])
    # four overlapping rounds of upserts and deletes: 191 changes, four batches of at most 60
    # (killed after the first or second, two or three left for the restart)
    for round_ in range(4):
        pg_conn.execute("INSERT INTO t SELECT g, %s FROM generate_series(%s::int, %s::int) g "
                        "ON CONFLICT (id) DO UPDATE SET v = excluded.v",
                        (round_, round_ * 20, round_ * 20 + 40))
        pg_conn.execute("DELETE FROM t WHERE id %% 11 = %s", (round_,))
    _capture(pg_dsn, kafka_servers, topic_prefix, ["public.t"], pg_conn)

    lake, checkpoint = (tmp_path / "lake").as_uri(), (tmp_path / "cp").as_uri()
    argv = [sys.executable, "-m", "pgcdc", "spark", "--bootstrap-servers", kafka_servers,
            "--topic-prefix", topic_prefix, "--lake", lake, "--checkpoint", checkpoint,
            "--available-now", "--max-offsets-per-trigger", "60", "--optimize-every", "2"]
    log = tmp_path / "delta_log"
    first = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    delta_log = tmp_path / "lake" / "public.t" / "_delta_log"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and first.poll() is None:
        if len(list(delta_log.glob("*.json"))) >= 3:  # created, then two batches committed
            break
        time.sleep(0.05)
    assert first.poll() is None, "the first driver finished before it could be killed"
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    commits_at_kill = len(list(delta_log.glob("*.json")))
    log.write_text(str(commits_at_kill))

    # the same job as the argv above: available-now, 60 offsets a batch, OPTIMIZE every 2
    config = job.JobConfig(kafka_servers, lake, checkpoint, topic_prefix=topic_prefix,
                           trigger_seconds=None, max_offsets_per_trigger=60, optimize_every=2)
    second = job.start(spark, config)
    second.awaitTermination(600)
    assert second.exception() is None
    assert len(list(delta_log.glob("*.json"))) > commits_at_kill
    with psycopg.connect(pg_dsn) as conn:
        (result,) = compare(conn, spark, lake, job.read_catalog(spark, config).tables())
    assert result.source.rows > 0
    assert result.equal, result
    operations = [r["operation"] for r in spark.sql(
        f"DESCRIBE HISTORY delta.`{lake}/public.t`").collect()]
    assert "OPTIMIZE" in operations  # --optimize-every 2: compacted between batches


def test_late_change_never_resurrects_a_deleted_row(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, spark: Any,
        tmp_path: Path) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    _prepare(pg_dsn, ["public.t"])
    pg_conn.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    pg_conn.execute("DELETE FROM t WHERE id = 1")
    pg_conn.execute("UPDATE t SET v = 'c' WHERE id = 2")
    _capture(pg_dsn, kafka_servers, topic_prefix, ["public.t"], pg_conn)

    lake = (tmp_path / "lake").as_uri()
    config = job.JobConfig(kafka_servers, lake, (tmp_path / "cp").as_uri(),
                           topic_prefix=topic_prefix)
    catalog = job.read_catalog(spark, config)
    everything = _whole_topic(spark, kafka_servers, topic_prefix)
    apply_batch(spark, everything, 0, catalog=catalog, lake=lake, app_id="late",
                changelog=True)
    # the same inserts arrive again, alone, in a later batch (a replay split by a boundary)
    late_inserts = everything.where("offset < 2")
    apply_batch(spark, late_inserts, 1, catalog=catalog, lake=lake, app_id="late")
    rows = spark.read.format("delta").load(f"{lake}/public.t").orderBy("id").collect()
    assert [(r["id"], r["v"]) for r in rows] == [(2, "c")]
    with psycopg.connect(pg_dsn) as conn:
        (result,) = compare(conn, spark, lake, catalog.tables())
    assert result.equal, result
    changelog = spark.read.format("delta").load(f"{lake}/public.t__changelog")
    assert sorted(r["_pgcdc_op"] for r in changelog.collect()) == ["c", "c", "d", "u"]


def _frozen(spark: Any, servers: str, prefix: str) -> Any:
    """What the change topics hold now, as a DataFrame that later writes do not change."""
    topic = _whole_topic(spark, servers, prefix)
    return spark.createDataFrame(topic.collect(), topic.schema)


def _since(everything: Any, before: Any) -> Any:
    """The records of ``everything`` that ``before`` does not hold (the next micro-batch)."""
    return everything.join(before.select("topic", "partition", "offset"),
                           ["topic", "partition", "offset"], "left_anti")


def test_renamed_columns_matched_by_identity(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, spark: Any,
        tmp_path: Path) -> None:
    """A rename keeps the column (Delta column mapping), with events of both names in one batch:
    a -> c, then b -> a (a name reused by another column), and the key id -> pk."""
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY, a text, b int, keep text)")
    history = tmp_path / "catalog"
    Pipeline(PipelineConfig(pg_dsn, tables=["public.t"], catalog_dir=history),
             NoSink()).prepare()
    pg_conn.execute("INSERT INTO t SELECT g, 'a' || g, g, 'k' FROM generate_series(1, 20) g")
    _capture_ddl(pg_dsn, kafka_servers, topic_prefix, ["public.t"], pg_conn, history)
    lake = (tmp_path / "lake").as_uri()
    config = job.JobConfig(kafka_servers, lake, (tmp_path / "cp").as_uri(),
                           topic_prefix=topic_prefix)
    before = _frozen(spark, kafka_servers, topic_prefix)
    apply_batch(spark, before, 0, catalog=job.read_catalog(spark, config), lake=lake,
                app_id="rename")

    pg_conn.execute("UPDATE t SET a = a || '!', b = -b WHERE id <= 5")  # old names
    pg_conn.execute("ALTER TABLE t RENAME COLUMN a TO c")
    pg_conn.execute("ALTER TABLE t RENAME COLUMN b TO a")
    pg_conn.execute("UPDATE t SET c = c || '?', a = a + 100 WHERE id > 15")
    pg_conn.execute("INSERT INTO t SELECT g, 'new' || g, g, 'k' FROM generate_series(21, 25) g")
    pg_conn.execute("ALTER TABLE t RENAME COLUMN id TO pk")
    pg_conn.execute("UPDATE t SET keep = 'z' WHERE pk IN (1, 16, 21)")
    pg_conn.execute("DELETE FROM t WHERE pk IN (2, 17)")
    _capture_ddl(pg_dsn, kafka_servers, topic_prefix, ["public.t"], pg_conn, history)
    catalog = job.read_catalog(spark, config)
    (spec,) = catalog.tables()
    assert len({v.version for v in catalog.versions(spec.oid)}) >= 3
    batch = _since(_frozen(spark, kafka_servers, topic_prefix), before)
    versions = {r[0] for r in batch.selectExpr(
        "CAST(element_at(filter(headers, h -> h.key = 'pgcdc.table_version'), 1).value "
        "AS STRING)").collect()}
    assert len(versions) >= 3  # rows of the old and the new versions in one micro-batch
    applied = apply_batch(spark, batch, 1, catalog=catalog, lake=lake, app_id="rename")
    assert applied == {"public.t": 15}  # ids 1-5, 16-20 updated, 21-25 inserted

    with psycopg.connect(pg_dsn) as conn:
        (result,) = compare(conn, spark, lake, catalog.tables())
    assert result.equal, result
    delta = spark.read.format("delta").load(f"{lake}/public.t")
    assert [n for n in delta.columns if not n.startswith("_pgcdc")] == ["pk", "c", "a", "keep"]
    row = delta.where("pk = 16").collect()[0]
    assert (row["c"], row["a"], row["keep"]) == ("a16?", 116, "z")
    operations = [r["operation"] for r in spark.sql(
        f"DESCRIBE HISTORY delta.`{lake}/public.t`").collect()]
    assert operations.count("RENAME COLUMN") >= 3  # renamed in place, not added anew


def test_truncate_is_a_table_tombstone(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, spark: Any,
        tmp_path: Path) -> None:
    """A truncate empties the table at its place in the stream; changes older than it that
    arrive again later (a replay) never bring rows back."""
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    _prepare(pg_dsn, ["public.t"])
    pg_conn.execute("INSERT INTO t SELECT g, 'old' FROM generate_series(1, 10) g")
    _capture(pg_dsn, kafka_servers, topic_prefix, ["public.t"], pg_conn)
    lake = (tmp_path / "lake").as_uri()
    config = job.JobConfig(kafka_servers, lake, (tmp_path / "cp").as_uri(),
                           topic_prefix=topic_prefix)
    before = _frozen(spark, kafka_servers, topic_prefix)
    apply_batch(spark, before, 0, catalog=job.read_catalog(spark, config), lake=lake,
                app_id="truncate")
    table = f"{lake}/public.t"
    assert spark.read.format("delta").load(table).count() == 10

    pg_conn.execute("UPDATE t SET v = 'doomed' WHERE id <= 3")
    pg_conn.execute("TRUNCATE t")
    pg_conn.execute("INSERT INTO t VALUES (1, 'after'), (11, 'after')")
    _capture(pg_dsn, kafka_servers, topic_prefix, ["public.t"], pg_conn)
    catalog = job.read_catalog(spark, config)
    everything = _frozen(spark, kafka_servers, topic_prefix)
    apply_batch(spark, _since(everything, before), 1, catalog=catalog, lake=lake,
                app_id="truncate")

    def lake_rows() -> list[tuple[int, str]]:
        return sorted((r["id"], r["v"]) for r in spark.read.format("delta").load(table)
                      .collect())

    assert lake_rows() == [(1, "after"), (11, "after")]
    # the inserts before the truncate are replayed (a new query over the same lake)
    apply_batch(spark, before, 0, catalog=catalog, lake=lake, app_id="replay")
    assert lake_rows() == [(1, "after"), (11, "after")]
    # and everything in one batch, into a fresh lake, gives the same
    fresh = (tmp_path / "fresh").as_uri()
    apply_batch(spark, everything, 0, catalog=catalog, lake=fresh, app_id="fresh")
    with psycopg.connect(pg_dsn) as conn:
        results = compare(conn, spark, lake, catalog.tables()) + compare(
            conn, spark, fresh, catalog.tables())
    assert all(r.equal for r in results), results
    apply_batch(spark, before, 1, catalog=catalog, lake=fresh, app_id="fresh")
    assert sorted((r["id"], r["v"]) for r in spark.read.format("delta")
                  .load(f"{fresh}/public.t").collect()) == [(1, "after"), (11, "after")]


def test_update_that_changes_the_key_moves_the_row(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, spark: Any,
        tmp_path: Path) -> None:
    """An UPDATE of the primary key leaves no row behind under the old key, in a later batch
    than the insert and with the old key reused in the same batch; a replay of the inserts
    brings none of the old keys back."""
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    _prepare(pg_dsn, ["public.t"])
    pg_conn.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 6) g")
    _capture(pg_dsn, kafka_servers, topic_prefix, ["public.t"], pg_conn)
    lake = (tmp_path / "lake").as_uri()
    config = job.JobConfig(kafka_servers, lake, (tmp_path / "cp").as_uri(),
                           topic_prefix=topic_prefix)
    before = _frozen(spark, kafka_servers, topic_prefix)
    assert apply_batch(spark, before, 0, catalog=job.read_catalog(spark, config), lake=lake,
                       app_id="moved") == {"public.t": 6}

    pg_conn.execute("UPDATE t SET id = 10 WHERE id = 1")
    pg_conn.execute("UPDATE t SET id = id + 100, v = 'moved' WHERE id IN (2, 3)")
    pg_conn.execute("INSERT INTO t VALUES (2, 'reused')")
    _capture(pg_dsn, kafka_servers, topic_prefix, ["public.t"], pg_conn)
    catalog = job.read_catalog(spark, config)
    everything = _frozen(spark, kafka_servers, topic_prefix)
    applied = apply_batch(spark, _since(everything, before), 1, catalog=catalog, lake=lake,
                          app_id="moved")
    # keys 1 and 3 deleted, 2 updated (re-inserted), 10, 102 and 103 inserted
    assert applied == {"public.t": 6}
    table = f"{lake}/public.t"

    def lake_rows() -> list[tuple[int, str]]:
        return sorted((r["id"], r["v"]) for r in spark.read.format("delta").load(table)
                      .collect())

    expected = [(2, "reused"), (4, "v4"), (5, "v5"), (6, "v6"), (10, "v1"), (102, "moved"),
                (103, "moved")]
    assert lake_rows() == expected
    with psycopg.connect(pg_dsn) as conn:
        (result,) = compare(conn, spark, lake, catalog.tables())
    assert result.equal, result
    # the inserts of keys 1-6 again (a new query over the same lake): an insert-only batch
    assert apply_batch(spark, before, 0, catalog=catalog, lake=lake,
                       app_id="replay") == {"public.t": 0}
    assert lake_rows() == expected
