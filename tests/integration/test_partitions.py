"""Partitioned tables published via their root (``publish_via_partition_root``): rows
moved between partitions and a table attached as a partition (its rows join the root with
no row change in the WAL: pgcdc reads the root again) and a partition detached (its rows
leave the root unseen: the root is read again whole, the partition, now published on its
own, read again) reach the lake equal.

Leaf partitions (pgcdc's own publication) need nothing of this: each is a table of its
own, attached or detached, and the lake model covers tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgcdc.clone import compare
from pgcdc.services.postgres import PostgresServer
from streaming import job
from tests.lake_model import APPLY, CAPTURE, Program, Rig


def _published_equal(program: Program) -> list[str]:
    """The published tables of ``public``, each asserted equal in the lake."""
    config = job.JobConfig(program.rig.kafka, program.lake, program.checkpoint,
                           topic_prefix=program.prefix)
    published = {str(r[0]) for r in program.conn.execute(
        "SELECT tablename::text FROM pg_publication_tables "
        "WHERE pubname = 'pgcdc' AND schemaname = 'public'").fetchall()}
    tables = [s for s in job.read_catalog(program.rig.spark, config).tables()
              if s.schema == "public" and s.name in published]
    with psycopg.connect(program.dsn) as conn:
        results = compare(conn, program.rig.spark, program.lake, tables)
    assert all(r.equal for r in results), (results, "\n".join(program.statements))
    return sorted(s.name for s in tables)


@pytest.mark.timeout(900)
def test_a_root_published_table_follows_its_partitions(
        pg_server: PostgresServer, kafka_servers: str, spark: Any, tmp_path: Path) -> None:
    program = Program(Rig(pg_server, kafka_servers, spark, tmp_path))
    try:
        program.run(
            "ALTER PUBLICATION pgcdc SET (publish_via_partition_root = true)",
            "CREATE TABLE p (id int, r int, a text, PRIMARY KEY (id, r)) PARTITION BY RANGE (r)",
            "CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (10)",
            "CREATE TABLE p2 PARTITION OF p FOR VALUES FROM (10) TO (20)",
            "INSERT INTO p SELECT g, g % 20, 'a' FROM generate_series(1, 40) g",
            "CREATE TABLE lone (id int, r int, a text, PRIMARY KEY (id, r))",
            "INSERT INTO lone VALUES (100, 25, 'x'), (101, 26, 'y')", CAPTURE, APPLY,
            "UPDATE p SET r = r + 10 WHERE r < 5",  # rows move from p1 to p2
            "ALTER TABLE p ATTACH PARTITION lone FOR VALUES FROM (20) TO (30)",
            "INSERT INTO p VALUES (200, 27, 'z')", CAPTURE, APPLY,
            # rewrites of every partition (a volatile default, a retype): the root is read again
            "ALTER TABLE p ADD COLUMN v int DEFAULT (random() * 1000)::int",
            "ALTER TABLE p ALTER COLUMN a TYPE varchar(20) USING a || '!'", CAPTURE, APPLY)
        assert _published_equal(program) == ["p"]  # lone's rows read again into p

        # p1's rows leave p unseen: p is read again whole, p1 (published on its own now)
        # read again
        program.run("ALTER TABLE p DETACH PARTITION p1", "INSERT INTO p1 VALUES (300, 1, 'w')",
                    "UPDATE p SET a = 'b' WHERE id < 20", CAPTURE, APPLY)
        assert _published_equal(program) == ["p", "p1"]

        # in one transaction p2 moves from p to another root, q (its rows leave p and join
        # q unseen); then p3 is dropped and lone truncated (their rows leave p unseen: a
        # publication via the root sends no truncate of a partition)
        program.run("CREATE TABLE q (LIKE p INCLUDING ALL) PARTITION BY RANGE (r)",
                    "CREATE TABLE p3 PARTITION OF p FOR VALUES FROM (30) TO (40)",
                    "INSERT INTO p SELECT g, 30 + g % 10, 'c' FROM generate_series(500, 519) g",
                    CAPTURE, APPLY,
                    "ALTER TABLE p DETACH PARTITION p2; "
                    "ALTER TABLE q ATTACH PARTITION p2 FOR VALUES FROM (10) TO (20)",
                    "DROP TABLE p3", "TRUNCATE lone", "INSERT INTO q VALUES (600, 11, 'q', 6)",
                    CAPTURE, APPLY)
        assert _published_equal(program) == ["p", "p1", "q"]
    finally:
        program.close()
