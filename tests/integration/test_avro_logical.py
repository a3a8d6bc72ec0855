"""Typed Avro (``--avro-types logical``, issue 17.1) through a real schema registry: real
PostgreSQL, Kafka and Apicurio Registry; every record read with Confluent's own
``AvroDeserializer`` (a consumer nobody here wrote), typed Python values for a table of
many types, across an ALTER that adds a column and one that retypes a column, with the
stream's values in text and in binary."""

from __future__ import annotations

from datetime import UTC, date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest

from core.wire import topic_name
from decoder.slot import current_wal_lsn
from pgcdc.pipeline import Pipeline, PipelineConfig
from pgcdc.services.registry import SchemaRegistryServer
from sinks.avro_logical import LogicalTypes
from sinks.kafka import KafkaSink
from sinks.registry import SchemaRegistry
from tests.integration.test_schema_registry import _Topic

Conn = psycopg.Connection[tuple[object, ...]]

_SETUP = """
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE TYPE pt AS (x int, label text, tags int[]);
CREATE DOMAIN amount AS numeric(10,2);
CREATE TABLE many (
    id int PRIMARY KEY, n numeric(12,3), n_free numeric, d date, t time, ts timestamp,
    tstz timestamptz, u uuid, j jsonb, b bytea, f8 float8, ok bool, big int8,
    ints int[], nums numeric(5,2)[], texts text[], m mood, moods mood[], p pt, ps pt[],
    r int4range, tr tstzrange, a amount, iv interval, addr inet)
"""

_ROW = """
INSERT INTO many VALUES (1, 12345.678, '3.14159265358979323846', '2024-02-29',
    '13:14:15.123456', '2024-02-29 13:14:15.123456', '2024-02-29 13:14:15.123456+00',
    'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"a": 1}', '\\xdeadbeef', 2.5, true,
    9007199254740993, '{{1,NULL},{3,4}}', '{1.50,NULL}', '{"x","y z"}', 'happy',
    '{sad,NULL,happy}', ROW(7, 'a b', '{1,2}'), ARRAY[ROW(1, 'x', '{}')::pt, NULL],
    '[1,10)', '["2024-01-01 00:00:00+00",)', -1234.5, '1 day 02:03:04', '192.168.1.10/24'),
    (2, 'NaN', '-Infinity', NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'NaN',
     NULL, NULL, '{}', '{NaN}', NULL, NULL, NULL, ROW(NULL, NULL, NULL), NULL, 'empty',
     NULL, 'NaN', NULL, NULL)
"""


@pytest.mark.parametrize("binary", ["off", "on"])
def test_typed_records_through_the_registry_across_alters(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str,
        schema_registry: SchemaRegistryServer, binary: str) -> None:
    """``binary``: the stream's values in text or in binary (decoder/binary.py): both
    decoders give the encoder the same Python values."""
    pg_conn.execute(_SETUP)
    registry = SchemaRegistry(schema_registry.url)
    sink = KafkaSink(kafka_servers, topic_prefix=topic_prefix, schema_registry=registry,
                     logical=LogicalTypes.reading(pg_dsn))
    pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.many"], binary=binary), sink)
    pipeline.prepare()
    assert pipeline.binary is (binary == "on")
    pg_conn.execute(_ROW)
    pg_conn.execute("UPDATE many SET n = -0.5, ints = '{{{1}}}' WHERE id = 1")
    pg_conn.execute("ALTER TABLE many ADD COLUMN extra date")
    pg_conn.execute("INSERT INTO many (id, extra) VALUES (3, '2000-01-01')")
    pg_conn.execute("ALTER TABLE many ALTER COLUMN big TYPE numeric(20,0)")
    pg_conn.execute("UPDATE many SET big = big + 1 WHERE id = 1")
    pg_conn.execute("DELETE FROM many WHERE id = 2")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    sink.close()

    topic = topic_name(topic_prefix, "public", "many")
    topics = _Topic(kafka_servers, schema_registry.url)
    values = [(key, value) for key, value, _ in topics.read(topic) if value is not None]
    assert [(v["op"], k["id"]) for k, v in values] == [
        ("c", 1), ("c", 2), ("u", 1), ("c", 3), ("u", 1), ("d", 2)]
    first, second = values[0][1]["after"], values[1][1]["after"]
    assert first == {
        "id": 1, "n": Decimal("12345.678"), "n_free": "3.14159265358979323846",
        "d": date(2024, 2, 29), "t": time(13, 14, 15, 123456),
        "ts": datetime(2024, 2, 29, 13, 14, 15, 123456),  # noqa: DTZ001
        "tstz": datetime(2024, 2, 29, 13, 14, 15, 123456, tzinfo=UTC),
        "u": UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"), "j": '{"a": 1}',
        "b": b"\xde\xad\xbe\xef", "f8": 2.5, "ok": True, "big": 9007199254740993,
        "ints": [[1, None], [3, 4]], "nums": [Decimal("1.50"), None], "texts": ["x", "y z"],
        "m": "happy", "moods": ["sad", None, "happy"],
        "p": {"x": 7, "label": "a b", "tags": [1, 2]},
        "ps": [{"x": 1, "label": "x", "tags": []}, None],
        "r": {"lower": 1, "upper": 10, "lower_inc": True, "upper_inc": False, "empty": False},
        "tr": {"lower": datetime(2024, 1, 1, tzinfo=UTC), "upper": None, "lower_inc": True,
               "upper_inc": False, "empty": False},
        "a": Decimal("-1234.50"), "iv": "P1DT2H3M4S", "addr": "192.168.1.10/24"}
    # NaN is never NULL; -Infinity spelled
    assert (second["n"], second["n_free"], second["a"], second["nums"]) == \
        ("NaN", "-Infinity", "NaN", ["NaN"])
    assert second["ints"] == [] and second["p"] == {"x": None, "label": None, "tags": None}
    assert second["r"] == {"lower": None, "upper": None, "lower_inc": False,
                           "upper_inc": False, "empty": True}
    assert values[2][1]["after"]["ints"] == [[[1]]] and \
        values[2][1]["after"]["n"] == Decimal("-0.500")
    assert values[3][1]["after"]["extra"] == date(2000, 1, 1)  # the added column, typed
    assert values[4][1]["after"]["big"] == Decimal("9007199254740994")  # retyped: a decimal
    assert values[5][1]["before"]["id"] == 2 and values[5][1]["after"] is None
    # three value schemas (the ALTERs), one key schema, under the topic's subjects
    assert len(topics.versions(f"{topic}-value")) == 3
    assert len(topics.versions(f"{topic}-key")) == 1



def test_a_composite_altered_gives_its_tables_a_new_schema(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str,
        schema_registry: SchemaRegistryServer) -> None:
    """Issue 17: ``ALTER TYPE ... ADD/DROP ATTRIBUTE`` of a composite a published table
    holds stopped ``pgcdc run`` (the table's version, and so its schema, stayed).  Now each
    table holding it gets a new version, whose schema has the attributes as the stream
    decodes them (the catalog's, whatever ``pg_type`` says by the time it is written)."""
    pg_conn.execute("CREATE TYPE pair AS (a int, b text); "
                    "CREATE TABLE holds (id int PRIMARY KEY, p pair, ps pair[])")
    registry = SchemaRegistry(schema_registry.url)
    sink = KafkaSink(kafka_servers, topic_prefix=topic_prefix, schema_registry=registry,
                     logical=LogicalTypes.reading(pg_dsn))
    pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.holds"]), sink)
    pipeline.prepare()
    pg_conn.execute("INSERT INTO holds VALUES (1, ROW(1, 'x'), ARRAY[ROW(2, 'y')::pair])")
    pg_conn.execute("ALTER TYPE pair ADD ATTRIBUTE c date")
    pg_conn.execute("INSERT INTO holds VALUES (2, ROW(3, 'z', '2024-01-02'), NULL)")
    pg_conn.execute("ALTER TYPE pair DROP ATTRIBUTE a")
    pg_conn.execute("INSERT INTO holds VALUES (3, ROW('w', NULL), NULL)")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))  # decoded after every ALTER was made
    sink.close()

    topic = topic_name(topic_prefix, "public", "holds")
    topics = _Topic(kafka_servers, schema_registry.url)
    afters = [value["after"] for _, value, _ in topics.read(topic) if value is not None]
    assert afters == [
        {"id": 1, "p": {"a": 1, "b": "x"}, "ps": [{"a": 2, "b": "y"}]},
        {"id": 2, "p": {"a": 3, "b": "z", "c": date(2024, 1, 2)}, "ps": None},
        {"id": 3, "p": {"b": "w", "c": None}, "ps": None}]
    assert len(topics.versions(f"{topic}-value")) == 3


@pytest.mark.spark
def test_the_spark_job_applies_typed_arrays_and_records(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, spark: Any,
        tmp_path: Path) -> None:
    """``pgcdc spark`` applies a typed column whose Avro is an array or a record as the
    text mode's JSON text (streaming/typed_avro.py; every type and the comparison with text
    mode: tests/integration/test_spark_typed_avro.py), through the command line."""
    from pgcdc import cli

    pg_conn.execute("CREATE TYPE spot AS (x int, label text)")
    pg_conn.execute("CREATE TABLE typed (id int PRIMARY KEY, amount numeric(12,3), d date, "
                    "tags int[], s spot)")
    sink = KafkaSink(kafka_servers, topic_prefix=topic_prefix,
                     logical=LogicalTypes.reading(pg_dsn))
    pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.typed"]), sink)
    pipeline.prepare()
    pg_conn.execute("INSERT INTO typed SELECT g, g * 1.5, '2024-01-01', ARRAY[g, NULL], "
                    "ROW(g, 'a \"' || g)::spot FROM generate_series(1, 5) g")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    sink.close()
    lake, checkpoint = (tmp_path / "lake").as_uri(), (tmp_path / "cp").as_uri()
    code = cli.main(["spark", "--bootstrap-servers", kafka_servers, "--topic-prefix",
                     topic_prefix, "--lake", lake, "--checkpoint", checkpoint,
                     "--available-now", "--spark-log", str(tmp_path / "spark.log")])
    assert code == 0
    rows = spark.read.format("delta").load((tmp_path / "lake" / "public.typed").as_uri()) \
        .select("id", "tags", "s").orderBy("id").collect()
    assert [tuple(r) for r in rows] == [
        (g, f"[{g},null]", f'{{"x":{g},"label":"a \\"{g}"}}') for g in range(1, 6)]


def test_the_initial_load_in_typed_avro(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str,
        schema_registry: SchemaRegistryServer, tmp_path: Path) -> None:
    """``pgcdc snapshot --avro-types logical`` with worker processes (each with its own
    sink, the load's slow path: the compiled load writes text mode only): every row read
    back typed with Confluent's deserializer, equal to the source."""
    import subprocess
    import sys

    pg_conn.execute("CREATE TYPE tone AS ENUM ('low', 'high')")
    pg_conn.execute("CREATE TABLE loaded (id int PRIMARY KEY, n numeric(10,2), d date, "
                    "ts timestamptz, tags int[], t tone, note text)")
    pg_conn.execute("INSERT INTO loaded SELECT g, g * 1.25, date '2024-01-01' + g, "
                    "timestamptz '2024-01-01 00:00:00+00' + g * interval '1 minute', "
                    "ARRAY[g, NULL, -g], CASE WHEN g % 2 = 0 THEN 'high' END::tone, "
                    "'row ' || g FROM generate_series(1, 300) g")
    pg_conn.execute("UPDATE loaded SET n = 'NaN' WHERE id = 7")
    command = [sys.executable, "-m", "pgcdc", "snapshot", "--dsn", pg_dsn,
               "--tables", "public.loaded", "--bootstrap-servers", kafka_servers,
               "--topic-prefix", topic_prefix, "--load-state", str(tmp_path / "load.json"),
               "--progress-file", str(tmp_path / "progress.json"),
               "--catalog-dir", str(tmp_path / "catalog"), "--readers", "2", "--workers", "2",
               "--chunk-pages", "1", "--avro-types", "logical",
               "--schema-registry-url", schema_registry.url]
    done = subprocess.run(command, capture_output=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")

    topics = _Topic(kafka_servers, schema_registry.url)
    reads = [value for _, value, _ in topics.read(topic_name(topic_prefix, "public", "loaded"))
             if value is not None]
    assert {value["op"] for value in reads} == {"r"}
    assert sorted(value["source"]["snapshot"] for value in reads).count("first") == 1
    got = {value["after"]["id"]: value["after"] for value in reads}
    with pg_conn.cursor() as cur:
        cur.execute("SELECT id, n, d, ts, tags, t::text, note FROM loaded")
        source = {row[0]: dict(zip(("id", "n", "d", "ts", "tags", "t", "note"), row,
                                   strict=True)) for row in cur}
    source[7]["n"] = "NaN"  # numeric(10,2)'s NaN branch (psycopg reads Decimal('NaN'))
    assert got == source
