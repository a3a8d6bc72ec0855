"""``pgcdc spark`` applies typed Avro (``pgcdc run --avro-types logical``, issue 17.1): real
PostgreSQL, Kafka and Spark.  One program of writes and DDL (a table of many types with
``NaN``, infinities, BC dates, arrays (NULL elements, two and three dimensions, quotes,
numeric), a composite, an array of composites, ranges, a multirange, a domain over an
array; a keyless ``REPLICA IDENTITY FULL`` table with duplicates and an array column added
mid-way; an ``ADD COLUMN`` with a default and a retype), captured in typed Avro by a
``pgcdc run`` killed with -9 mid-way and finished by another, then ``pgcdc spark
--available-now``: the lake equals the source (``pgcdc.clone``, every column: numeric,
float and timestamptz arrays, ranges and the multirange by their documented JSON), and
equals, column types and values, the lake the same program makes through text mode.  And
the JSON text streaming/typed_avro.py builds from typed arrays and records, through Spark,
is the text mode's (sinks/envelope.py ``text_of``) for values of every element type."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from decoder import values as oids
from decoder.text_parsers import decoder_for
from pgcdc.services.postgres import PostgresServer
from sinks.envelope import text_of
from snapshot_builder.catalog import Column, TableVersion
from streaming import job, typed_avro
from streaming.apply import table_path
from streaming.schema import COMMIT_LSN, ORDINAL, TEXT
from tests.lake_model import CAPTURE, Program, Rig
from tests.unit.test_avro_logical import TABLE, TEXTS, _encoder, _event, _numeric, _row

pytestmark = pytest.mark.spark

_SETUP = [
    "CREATE TYPE mood AS ENUM ('sad', 'happy')",
    "CREATE DOMAIN amount AS numeric(10,2)",
    "CREATE TYPE pair AS (k int, label text, tags int[])",
    "CREATE DOMAIN intlist AS int[]",
    "CREATE TABLE many (id int PRIMARY KEY, n numeric(12,3), n_free numeric, d date, "
    "t time, t3 time(3), ts timestamp, tstz timestamptz, u uuid, j jsonb, js json, b bytea, "
    "f8 float8, f4 real, ok bool, big int8, small int2, m mood, a amount, iv interval, "
    "addr inet, note text, c char(3), cash money, t1 time(1), ia int[], ta text[], "
    "na numeric(10,8)[], p pair, ps pair[], r4 int4range, "
    "rz tstzrange, mr int4multirange, il intlist, fa float8[], za timestamptz[], "
    "tt timetz, tta timetz[], bx box, pa path[])",
    "CREATE TABLE bag (k int, v text, n numeric(6,2), d date)",
    "ALTER TABLE bag REPLICA IDENTITY FULL",
]

_ROWS = [
    "INSERT INTO many VALUES (1, 12345.678, '3.14159265358979323846', '2024-02-29', "
    "'13:14:15.123456', '13:14:15', '2024-02-29 13:14:15.123456', "
    "'2024-02-29 13:14:15.123456+00', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', "
    "'{\"a\": [1, \"é\\n\"]}', '{\"b\" :  2}', '\\xdeadbeef', 2.5, 1.25, true, "
    "9007199254740993, -7, 'happy', -1234.5, '1 day 02:03:04', '192.168.1.10/24', "
    "E'tab\\there \"quoted\" ünï', 'ab', -1.5, '13:14:15.5', '{{1,NULL},{3,4}}', "
    "ARRAY['a \"q\"', 'x,y', NULL, E'back\\\\slash\\ttab', 'NULL', 'é'], "
    "'{0.00000010,1.5,NaN,NULL,0}', ROW(1, 'say \"hi\", ok', '{7,NULL}'), "
    "ARRAY[ROW(NULL, NULL, NULL)::pair, NULL, ROW(2, '', '{}')::pair], '[1,10)', "
    "'[2024-01-01 00:00:00+00,)', '{[1,3),[7,9)}', '{5,NULL}')",
    "INSERT INTO many VALUES (2, 'NaN', '-Infinity', 'infinity', '24:00:00', '00:00:00', "
    "'infinity', '-infinity', NULL, 'null', NULL, '\\x', 'NaN', '-Infinity', false, "
    "-9223372036854775808, 32767, 'sad', 'NaN', '-1 mon', '::ffff:1.2.3.4', '', NULL, NULL, "
    "'23:59:59.9', '{}', '{}', NULL, ROW(NULL, NULL, NULL), '{}', 'empty', "
    "'(,)', '{}', '{}')",
    "INSERT INTO many VALUES (3, -0.001, 'NaN', '0044-03-15 BC', '00:00:00.000001', NULL, "
    "'0044-03-15 12:00:00.5 BC', '0001-01-01 00:00:00+00 BC', NULL, NULL, NULL, NULL, "
    "'Infinity', 3.4e38, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1234567.89, "
    "'00:00:00', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
    "INSERT INTO many (id, d, ts, tstz) VALUES (4, '-infinity', '10000-01-01 00:00:00', "
    "'12345-06-07 08:09:10.000011+00'), (5, '12345-06-07', '-infinity', 'infinity')",
    "INSERT INTO bag SELECT g % 3, 'v' || (g % 3), CASE WHEN g % 3 = 0 THEN 'NaN' "
    "ELSE g * 1.5 END, date '2024-01-01' + g % 3 FROM generate_series(1, 9) g",
    "INSERT INTO bag VALUES (NULL, NULL, NULL, NULL), (NULL, NULL, NULL, NULL)",
]

_CHANGES = [
    "UPDATE many SET n = 'NaN', d = '0001-01-01 BC', note = note || '!' WHERE id = 1",
    "UPDATE many SET ia = ia || ARRAY[[5,6]], p.label = 'new \"label\"', r4 = 'empty', "
    "rz = '[-infinity,infinity]', mr = '{}', na = '{}' WHERE id = 1",
    "UPDATE many SET ta = '{{a,b},{NULL,\"c d\"}}', ps = NULL, il = '{{1},{2}}' WHERE id = 2",
    "UPDATE many SET n = 1.5, a = 2 WHERE id = 2",
    "DELETE FROM many WHERE id = 5",
    "UPDATE bag SET v = 'w' WHERE ctid = (SELECT ctid FROM bag WHERE k = 1 LIMIT 1)",
    "DELETE FROM bag WHERE ctid = (SELECT ctid FROM bag WHERE k = 2 LIMIT 1)",
    "ALTER TABLE many ADD COLUMN extra int DEFAULT 7",
    "ALTER TABLE bag ADD COLUMN seen timestamptz DEFAULT '2024-05-06 07:08:09+00'",
    "ALTER TABLE bag ADD COLUMN tags text[] DEFAULT '{x,\"y z\",NULL}'",
    "INSERT INTO many (id, extra) VALUES (6, NULL)",
    "ALTER TABLE many ALTER COLUMN small TYPE numeric(8,1)",  # a retype: the table read again
    "UPDATE many SET small = 'NaN' WHERE id = 1",
    "INSERT INTO bag (k, v) VALUES (1, 'v1'), (1, 'v1')",
    "UPDATE bag SET n = 'NaN' WHERE k = 1",
    "UPDATE many SET ia = '{{{1}}}', p = ROW(3, E'q\"\\\\', '{1}'), r4 = '(,5]', "
    "mr = '{[1,2]}', na = '{0.00000001}' WHERE id = 2",
    "UPDATE bag SET tags = '{}' WHERE k = 2",
    # what the lake keeps as JSON, compared with to_json's by pgcdc.clone
    "INSERT INTO many (id, na, r4, rz, mr, fa, za, tt, tta, bx, pa) VALUES (7, "
    "'{0.00000010,1.5,NaN,NULL,0}', "
    "'[1,10)', '[\"0001-01-01 00:00:00+00 BC\",\"2024-01-01 00:00:00.5+00\")', "
    "'{[1,3),[7,9)}', '{0.1,-0,NaN,-Infinity,1e+16,5e-324}', '{\"2024-02-29 13:14:15.5+00\","
    "\"0001-01-01 00:00:00+00 BC\",infinity,\"12345-06-07 08:09:10.000011+00\"}', "
    "'13:14:15.5+02', '{13:14:15.5+02,00:00:00-01:30,NULL}', '(3,4),(1.5,-0)', "
    "ARRAY['[(1,2),(3,4)]'::path, '((1,2),(3,4),(5,1e-07))', NULL])",
]
_KILLED = 10  # the first changes, their ALTERs included, while pgcdc run streams

class _Typed(Program):
    """A lake-model program whose captures write typed Avro (``logical``) or text."""

    def __init__(self, rig: Rig, *, logical: bool) -> None:
        super().__init__(rig)
        self.logical = logical
        self.encoding = "logical" if logical else "avro"  # the captures' sink (Program._sink)

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
            program.run_killed(_CHANGES[:_KILLED])  # the first ALTERs while pgcdc run streams
            program.run(CAPTURE, *_CHANGES[_KILLED:])
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
        shapes = typed["public.many"].where("id = 1").selectExpr("ia", "ta", "p", "r4").collect()
        assert [tuple(r) for r in shapes] == [(
            "[[1,null],[3,4],[5,6]]", '["a \\"q\\"","x,y",null,"back\\\\slash\\ttab","NULL","é"]',
            '{"k":1,"label":"new \\"label\\"","tags":[7,null]}',
            '{"lower":null,"upper":null,"lower_inc":false,"upper_inc":false,"empty":true}')]
    finally:
        for program in programs.values():
            program.close()


_ARRAYS = (  # name, OID, type name, typmod
    ("id", oids.INT4, "int4", -1), ("bools", 1000, "_bool", -1), ("blobs", 1001, "_bytea", -1),
    ("i2", 1005, "_int2", -1), ("i8", 1016, "_int8", -1), ("words", 1009, "_text", -1),
    ("f4s", 1021, "_float4", -1), ("f8s", 1022, "_float8", -1),
    ("tiny", 1231, "_numeric", _numeric(10, 8)), ("nfree", 1231, "_numeric", -1),
    ("days", 1182, "_date", -1), ("times", 1183, "_time", -1),
    ("stamps", 1115, "_timestamp", -1), ("zoned", 1185, "_timestamptz", -1),
    ("ivs", 1187, "_interval", -1), ("ids", 2951, "_uuid", -1), ("lsns", 3221, "_pg_lsn", -1),
    ("xids", 1011, "_xid", -1), ("pts", 1017, "_point", -1), ("docs", 3807, "_jsonb", -1),
    ("cash", 791, "_money", -1), ("nr", oids.NUMRANGE, "numrange", -1),
    ("tsr", oids.TSRANGE, "tsrange", -1), ("dr", oids.DATERANGE, "daterange", -1),
    ("i8mr", oids.INT8MULTIRANGE, "int8multirange", -1),
    ("tzmr", oids.TSTZMULTIRANGE, "tstzmultirange", -1),
)
_ARRAY_TABLE = TableVersion(43, "public", "arrays", "d", tuple(
    Column(name, oid, type_name, typmod, name == "id") for name, oid, type_name, typmod in _ARRAYS))

_CONTROL = "".join(chr(c) for c in range(1, 32))
_ARRAY_ROWS: list[dict[str, str | None]] = [
    {"id": "1", "bools": "{t,f,NULL}", "blobs": '{"\\\\xdeadbeef",NULL,"\\\\x"}',
     "i2": "{{1,2},{NULL,-32768}}", "i8": "{{{9223372036854775807}}}",
     "words": '{"a \\"b\\" \\\\ c",NULL,"é,ü","NULL","","' + _CONTROL + '"}',
     "f4s": "{0.1,3.4e+38,-0,NaN,Infinity,-Infinity,1e-45,1.5,123456790,1e-05}",
     "f8s": "{0.1,1e+16,1e+15,0.0001,1e-05,-0,NaN,-Infinity,2.82879384806159e+17,"
            "1.7976931348623157e+308,5e-324,100,123.456}",
     "tiny": "{0.00000010,0.00000000,-0.00000001,1.50000000,0.00000100,NaN,NULL}",
     "nfree": "{1E-7,0.0000001,3.14159265358979323846,-0,NaN,Infinity,-Infinity}",
     "days": "{2024-02-29,infinity,-infinity,\"0044-03-15 BC\",12345-06-07,0001-01-01}",
     "times": "{00:00:00,13:14:15.5,24:00:00,23:59:59.999999}",
     "stamps": '{"2024-02-29 13:14:15.123456","2024-02-29 13:14:15",infinity,-infinity,'
               '"0044-03-15 12:00:00.5 BC","10000-01-01 00:00:00","0001-01-01 00:00:00"}',
     "zoned": '{"2024-02-29 13:14:15.5+00","0001-01-01 00:00:00+00 BC",infinity,'
              '"12345-06-07 08:09:10.000011+00","0500-01-01 00:00:00+00"}',
     "ivs": "{P1Y2M3DT4H5M6.5S,PT0S}", "ids": "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}",
     "lsns": "{16/B374D848,0/0}", "xids": "{1,4294967295}",
     "pts": '{"(1,2)","(1.5,-0)"}', "docs": '{"{\\"a\\": [1, \\"é\\\\n\\"]}",null}',
     "cash": '{"$1,234.56","-$1.00"}', "nr": "[1.50,)", "tsr": '["2024-01-01 00:00:00",infinity)',
     "dr": "empty", "i8mr": "{[1,3),[7,)}", "tzmr": "{}"},
    {"id": "2", "bools": "{}", "words": '{{a,"\\\\u000B\x0b\\\\\\\\u001F"},{c,NULL}}',
     "f8s": "{}", "nr": "(,)",
     "tsr": "empty", "dr": "[2024-01-01,2024-02-01)", "i8mr": "{}"},
]


def _cases() -> list[tuple[TableVersion, Any, dict[str, Any]]]:
    """(table, typed encoder, row as the text mode decodes it) of each case:
    tests/unit/test_avro_logical.py's table of every type (a composite with an array, an
    array of composites, a user range and multirange over float8) twice, and a table of
    arrays of every element type and of ranges, with the values Python and Spark spell
    differently."""
    out = []
    encoder, _ = _encoder()
    for texts in [TEXTS, {**TEXTS, "pt": "(,\"a \\\"q\\\" ,\",)", "pts": "{}", "ints": "{}",
                          "texts": "{NULL}", "fr": "empty", "fmr": "{}", "r": "(,)"}]:
        out.append((TABLE, encoder, _row(texts)))
    for texts in _ARRAY_ROWS:
        row = {c.name: None if texts.get(c.name) is None
               else decoder_for(c.type_oid)(texts[c.name])  # type: ignore[arg-type]
               for c in _ARRAY_TABLE.columns}
        out.append((_ARRAY_TABLE, encoder, row))
    return out


def _differences(spark: Any) -> list[tuple[str, str | None, str | None]]:
    """(column, expected, got) of every array or record column of :func:`_cases` whose
    JSON text through Spark is not the text mode's."""
    from pyspark.sql.avro.functions import from_avro

    wrong = []
    for table, encoder, row in _cases():
        schema = encoder.schemas(table)["value_schema"]
        fields = typed_avro.row_fields(json.loads(schema))
        data = encoder.value(_event(row, table=table), server_name="s", now_ms=1)
        frame = spark.createDataFrame([(bytearray(data),)], "value binary").select(
            from_avro("value", typed_avro.reader_schema(schema)).alias("e"))
        json_fields = [f for f in fields if typed_avro.kind(f) == "json"]
        exprs = [f"{typed_avro.text('e.after.`' + f['name'] + '`', f)} AS `{f['name']}`"
                 for f in json_fields]
        got = frame.selectExpr(*exprs).collect()[0].asDict()
        for f in json_fields:
            value = row[f["pgcdc.column"]]
            expected = None if value is None else text_of(value)
            if got[f["name"]] != expected:
                wrong.append((f["pgcdc.column"], expected, got[f["name"]]))
    return wrong


def test_typed_arrays_and_records_are_spelled_as_text_mode_does(spark: Any) -> None:
    """streaming/typed_avro.py ``json_text`` through Spark: each typed array, composite,
    range and multirange decoded from the typed writer's record gives exactly the JSON
    text the text mode's record holds for it (``text_of`` of the value the text decoder
    gives for PostgreSQL's text): NULL elements, nested arrays, escapes and control
    characters, floats' shortest digits and exponents, ``Decimal``'s ``1.0E-7`` and
    ``0E-8``, isoformat timestamps and the texts Python cannot hold."""
    assert _differences(spark) == []
