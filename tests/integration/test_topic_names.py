"""One table, one topic (issue 15.6): tables whose names the old mapping wrote alike
(``public."orders.dot"`` and ``public.orders_dot``) each get a topic of their own, whether
they are published at the start or appear later (a CREATE TABLE or a RENAME under FOR ALL
TABLES), and the lake equals the source for every one of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from core.wire import topic_name
from decoder.slot import current_wal_lsn
from pgcdc.clone import compare
from pgcdc.pipeline import Pipeline, PipelineConfig
from pgcdc.services.postgres import PostgresServer
from sinks.kafka import KafkaSink
from streaming import job
from tests.lake_model import Program, Rig
from tests.oracle import read_topic
from tests.recording_sink import NoSink

pytestmark = pytest.mark.spark

Conn = psycopg.Connection[tuple[object, ...]]


def _write(conn: Conn, table: str, first: int, last: int, value: str) -> None:
    conn.execute(sql.SQL("INSERT INTO {} SELECT g, %s || g FROM generate_series(%s::int, "
                         "%s::int) g").format(sql.Identifier(table)), (value, first, last))


def _stream(dsn: str, servers: str, prefix: str, conn: Conn, catalog: Path) -> None:
    sink = KafkaSink(servers, topic_prefix=prefix)
    pipeline = Pipeline(PipelineConfig(dsn, tables=None, catalog_dir=catalog), sink)
    pipeline.prepare()  # FOR ALL TABLES, DDL capture
    pipeline.run(until_lsn=current_wal_lsn(conn))
    sink.close()


def test_tables_named_alike_never_share_a_topic(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, spark: Any,
        tmp_path: Path) -> None:
    for table in ("orders.dot", "orders_dot", "items_x", "items_z", "tmp"):
        pg_conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)")
                        .format(sql.Identifier(table)))
    catalog = tmp_path / "catalog"
    Pipeline(PipelineConfig(pg_dsn, tables=None, catalog_dir=catalog), NoSink()).prepare()
    _write(pg_conn, "orders.dot", 1, 5, "dotted ")  # the same keys in both tables
    _write(pg_conn, "orders_dot", 1, 3, "plain ")
    _write(pg_conn, "items_x", 1, 2, "x ")
    _write(pg_conn, "items_z", 1, 2, "z ")
    _write(pg_conn, "tmp", 1, 2, "tmp ")
    _stream(pg_dsn, kafka_servers, topic_prefix, pg_conn, catalog)
    # mid-stream: a table created, another renamed, each to a name written like an existing one
    pg_conn.execute('CREATE TABLE "items.x" (id int PRIMARY KEY, v text)')
    _write(pg_conn, "items.x", 1, 4, "new ")
    pg_conn.execute('ALTER TABLE tmp RENAME TO "items.z"')
    _write(pg_conn, "items.z", 3, 4, "renamed ")
    pg_conn.execute("""UPDATE "items.z" SET v = 'renamed!' WHERE id = 1""")
    _write(pg_conn, "items_x", 3, 3, "x ")
    pg_conn.execute("DELETE FROM orders_dot WHERE id = 2")
    _stream(pg_dsn, kafka_servers, topic_prefix, pg_conn, catalog)

    oids = dict(pg_conn.execute("SELECT relname::text, oid::bigint FROM pg_class WHERE relname "
                                "IN ('orders.dot', 'orders_dot', 'items_x', 'items_z', "
                                "'items.x', 'items.z')").fetchall())
    assert len(oids) == 6
    # the name a topic was made of -> the table now; tmp's events (before the rename) first
    names = {"tmp": "items.z", **{str(k): str(k) for k in oids}}
    folded: dict[object, dict[int, Any]] = {}
    for name, table in names.items():
        events = read_topic(kafka_servers, topic_name(topic_prefix, "public", name))
        assert events, name
        # one table per topic, and so one key space
        assert {e["source"]["table_oid"] for e in events} == {oids[table]}, name
        rows = folded.setdefault(table, {})
        for event in events:
            if event["op"] == "d":
                rows.pop(event["key"]["id"], None)
            else:
                rows[event["key"]["id"]] = event["after"]["v"]
    for table, rows in folded.items():
        source = pg_conn.execute(sql.SQL("SELECT id, v FROM {}").format(sql.Identifier(table)))
        assert rows == dict(source.fetchall()), table

    lake, checkpoint = (tmp_path / "lake").as_uri(), (tmp_path / "cp").as_uri()
    # the job `pgcdc spark --available-now` runs, in this process's Spark session (the
    # command itself is tested in test_spark_logs and test_spark_apply)
    config = job.JobConfig(kafka_servers, lake, checkpoint, topic_prefix=topic_prefix,
                           trigger_seconds=None)
    query = job.start(spark, config)
    query.awaitTermination(600)
    assert query.exception() is None
    tables = job.read_catalog(spark, config).tables()
    assert sorted(spec.name for spec in tables) == sorted(oids)
    with psycopg.connect(pg_dsn) as conn:
        results = compare(conn, spark, lake, tables)
    assert all(result.equal for result in results), results


def test_tables_named_alike_never_share_a_lake_table(
        pg_server: PostgresServer, kafka_servers: str, spark: Any, tmp_path: Path) -> None:
    program = Program(Rig(pg_server, kafka_servers, spark, tmp_path))
    try:
        program.run('CREATE TABLE "orders dot" (id int PRIMARY KEY, v text)',
                    "CREATE TABLE orders_dot (id int PRIMARY KEY, v text)",
                    """INSERT INTO "orders dot" VALUES (1, 'spaced'), (2, 'spaced')""",
                    "INSERT INTO orders_dot VALUES (1, 'plain')")
        program.check()  # their own topics; then the lake
    finally:
        program.close()
