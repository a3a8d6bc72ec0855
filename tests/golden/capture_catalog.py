"""Capture the catalog history records pgcdc publishes (``<prefix>._catalog_history``, one
``Entry.to_json`` a line) from a real server into a golden file (run by hand, rarely).

    python -m tests.golden.capture_catalog

Writes ``tests/golden/catalog_topic/catalog_history_pg.jsonl`` for a workload with what the lake
must follow: a table with a quote and a semicolon in its name, a column added, an enum type, the
table dropped and created again under its name, another table dropped for good.  The Spark job
replays these records (streaming/catalog.py); tests/unit/test_spark_catalog.py checks that both
sides agree on them.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import psycopg

from decoder.slot import current_wal_lsn
from pgcdc.pipeline import Pipeline, PipelineConfig
from pgcdc.services.postgres import PostgresServer
from sinks.null import NullSink

HERE = Path(__file__).parent

WORKLOAD = [
    'CREATE TABLE "we""ird;name" (id int PRIMARY KEY, v text NOT NULL DEFAULT \'x\')',
    "CREATE TABLE gone (id bigint PRIMARY KEY, note varchar(20))",
    "INSERT INTO \"we\"\"ird;name\" VALUES (1, 'a')",
    "ALTER TABLE \"we\"\"ird;name\" ADD COLUMN n numeric(10,2)",
    "CREATE TYPE mood AS ENUM ('sad', 'ok')",
    "ALTER TABLE gone ADD COLUMN m mood",
    'DROP TABLE "we""ird;name"',
    'CREATE TABLE "we""ird;name" (id int PRIMARY KEY, v text NOT NULL DEFAULT \'x\')',
    "INSERT INTO \"we\"\"ird;name\" VALUES (2, 'b')",
    "DROP TABLE gone",
]


def main() -> None:
    with PostgresServer() as server, tempfile.TemporaryDirectory() as tmp:
        dsn = server.dsn()
        folder = Path(tmp) / "catalog"
        Pipeline(PipelineConfig(dsn, catalog_dir=folder), NullSink()).prepare()
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in WORKLOAD:
                conn.execute(statement)
            end = current_wal_lsn(conn)
        pipeline = Pipeline(PipelineConfig(dsn, catalog_dir=folder), NullSink())
        pipeline.prepare()
        pipeline.run(until_lsn=end)
        pipeline.builder.history.close()
        out = HERE / "catalog_topic" / "catalog_history_pg.jsonl"
        out.write_bytes((folder / "catalog.log").read_bytes())
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
