"""``pgcdc spark`` applies typed Avro (``pgcdc run --avro-types logical``, issue 17.1): real
PostgreSQL, Kafka and Spark.  One program of writes and DDL (a table of many types with
``NaN``, infinities, BC dates; a keyless ``REPLICA IDENTITY FULL`` table with duplicates;
an ``ADD COLUMN`` with a default and a retype), captured in typed Avro by a ``pgcdc run``
killed with -9 mid-way and finished by another, then ``pgcdc spark --available-now``:
the lake equals the source (``pgcdc.clone``), and equals, column types and values, the
lake the same program makes through text mode."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pgcdc.services.postgres import PostgresServer
from sinks.avro_logical import LogicalTypes
from sinks.kafka import KafkaSink
from streaming import job
from streaming.apply import table_path
from streaming.schema import COMMIT_LSN, ORDINAL, TEXT
from tests.lake_model import CAPTURE, Program, Rig

pytestmark = pytest.mark.spark

_SETUP = [
    "CREATE TYPE mood AS ENUM ('sad', 'happy')",
    "CREATE DOMAIN amount AS numeric(10,2)",
    "CREATE TABLE many (id int PRIMARY KEY, n numeric(12,3), n_free numeric, d date, "
    "t time, t3 time(3), ts timestamp, tstz timestamptz, u uuid, j jsonb, js json, b bytea, "
    "f8 float8, f4 real, ok bool, big int8, small int2, m mood, a amount, iv interval, "
    "addr inet, note text, c char(3), cash money, t1 time(1))",
    "CREATE TABLE bag (k int, v text, n numeric(6,2), d date)",
    "ALTER TABLE bag REPLICA IDENTITY FULL",
]

_ROWS = [
    "INSERT INTO many VALUES (1, 12345.678, '3.14159265358979323846', '2024-02-29', "
    "'13:14:15.123456', '13:14:15', '2024-02-29 13:14:15.123456', "
    "'2024-02-29 13:14:15.123456+00', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', "
    "'{\"a\": [1, \"é\\n\"]}', '{\"b\" :  2}', '\\xdeadbeef', 2.5, 1.25, true, "
    "9007199254740993, -7, 'happy', -1234.5, '1 day 02:03:04', '192.168.1.10/24', "
    "E'tab\\there \"quoted\" ünï', 'ab', -1.5, '13:14:15.5')",
    "INSERT INTO many VALUES (2, 'NaN', '-Infinity', 'infinity', '24:00:00', '00:00:00', "
    "'infinity', '-infinity', NULL, 'null', NULL, '\\x', 'NaN', '-Infinity', false, "
    "-9223372036854775808, 32767, 'sad', 'NaN', '-1 mon', '::ffff:1.2.3.4', '', NULL, NULL, "
    "'23:59:59.9')",
    "INSERT INTO many VALUES (3, -0.001, 'NaN', '0044-03-15 BC', '00:00:00.000001', NULL, "
    "'0044-03-15 12:00:00.5 BC', '0001-01-01 00:00:00+00 BC', NULL, NULL, NULL, NULL, "
    "'Infinity', 3.4e38, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1234567.89, "
    "'00:00:00')",
    "INSERT INTO many (id, d, ts, tstz) VALUES (4, '-infinity', '10000-01-01 00:00:00', "
    "'12345-06-07 08:09:10.000011+00'), (5, '12345-06-07', '-infinity', 'infinity')",
    "INSERT INTO bag SELECT g % 3, 'v' || (g % 3), CASE WHEN g % 3 = 0 THEN 'NaN' "
    "ELSE g * 1.5 END, date '2024-01-01' + g % 3 FROM generate_series(1, 9) g",
    "INSERT INTO bag VALUES (NULL, NULL, NULL, NULL), (NULL, NULL, NULL, NULL)",
]

_CHANGES = [
    "UPDATE many SET n = 'NaN', d = '0001-01-01 BC', note = note || '!' WHERE id = 1",
    "UPDATE many SET n = 1.5, a = 2 WHERE id = 2",
    "DELETE FROM many WHERE id = 5",
    "UPDATE bag SET v = 'w' WHERE ctid = (SELECT ctid FROM bag WHERE k = 1 LIMIT 1)",
    "DELETE FROM bag WHERE ctid = (SELECT ctid FROM bag WHERE k = 2 LIMIT 1)",
    "ALTER TABLE many ADD COLUMN extra int DEFAULT 7",
    "ALTER TABLE bag ADD COLUMN seen timestamptz DEFAULT '2024-05-06 07:08:09+00'",
    "INSERT INTO many (id, extra) VALUES (6, NULL)",
    "ALTER TABLE many ALTER COLUMN small TYPE numeric(8,1)",  # a retype: the table read again
    "UPDATE many SET small = 'NaN' WHERE id = 1",
    "INSERT INTO bag (k, v) VALUES (1, 'v1'), (1, 'v1')",
    "UPDATE bag SET n = 'NaN' WHERE k = 1",
]


class _Typed(Program):
    """A lake-model program whose captures write typed Avro (``logical``) or text."""

    def __init__(self, rig: Rig, *, logical: bool) -> None:
        super().__init__(rig)
        self.logical = logical

    def _sink(self) -> KafkaSink:
        logical = LogicalTypes.reading(self.dsn) if self.logical else None
        return KafkaSink(self.rig.kafka, topic_prefix=self.prefix, logical=logical)

    def run_killed(self, statements: list[str]) -> None:
        """``statements`` while a ``pgcdc run`` process (typed Avro if ``logical``)
        captures them, killed with -9 after the last (mid-stream: nothing waits for it)."""
        argv = [sys.executable, "-m", "pgcdc", "run", "--dsn", self.dsn, "--slot", self.slot,
                "--sink", "kafka", "--bootstrap-servers", self.rig.kafka,
                "--topic-prefix", self.prefix, "--avro-types",
                "logical" if self.logical else "text", "--progress-file",
                str(self.home / "progress.json"), "--catalog-dir", str(self.home / "catalog"),
                "--incremental-snapshots", "--incremental-state",
                str(self.home / "incremental.json")]
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(2.0)
        for statement in statements:
            self.run(statement)
            time.sleep(0.3)
        assert process.poll() is None, process.communicate()[1].decode()
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=30)


def _lake(program: Program, spark: Any) -> dict[str, Any]:
    config = job.JobConfig(program.rig.kafka, program.lake, program.checkpoint,
                           topic_prefix=program.prefix)
    specs = job.read_catalog(spark, config).tables()
    assert {s.avro_types for s in specs if s.schema == "public"} == \
        {"logical" if isinstance(program, _Typed) and program.logical else "text"}
    return {s.qualified_name: spark.read.format("delta").load(table_path(program.lake, s))
            for s in specs if s.schema == "public"}


def test_typed_avro_reaches_the_lake_as_text_mode_does(
        pg_server: PostgresServer, kafka_servers: str, spark: Any, tmp_path: Path) -> None:
    rig = Rig(pg_server, kafka_servers, spark, tmp_path)
    programs: dict[bool, _Typed] = {}
    try:
        for logical in (True, False):
            program = programs[logical] = _Typed(rig, logical=logical)
            program.run(*_SETUP, *_ROWS)
            program.run_killed(_CHANGES[:7])  # the first ALTERs while pgcdc run streams
            program.run(CAPTURE, *_CHANGES[7:])
            program.check()  # capture, pgcdc spark --available-now, compare every table
        typed, text = _lake(programs[True], spark), _lake(programs[False], spark)
        assert sorted(typed) == sorted(text) == ["public.bag", "public.many"]
        for name, frame in typed.items():
            other = text[name]
            assert frame.schema == other.schema, name  # the same Delta column types
            values = [f"`{c}`" for c in frame.columns if c not in (COMMIT_LSN, ORDINAL, TEXT)]
            values.append(f"array_sort(map_entries({TEXT})) AS {TEXT}")  # a map: no EXCEPT
            mine, theirs = frame.selectExpr(*values), other.selectExpr(*values)
            assert mine.count() == theirs.count() > 0
            assert mine.exceptAll(theirs).count() == 0 and theirs.exceptAll(mine).count() == 0
        # the values a typed column cannot hold, in the row's _pgcdc_text as in text mode
        texts = typed["public.many"].where("id = 1").selectExpr(
            "_pgcdc_text['n'] AS n", "_pgcdc_text['small'] AS s").collect()
        assert [tuple(r) for r in texts] == [("NaN", "NaN")]
    finally:
        for program in programs.values():
            program.close()
