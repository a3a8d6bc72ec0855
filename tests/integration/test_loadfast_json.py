"""The initial load's compiled path writes Kafka the slow path's JSON records.

Two tables, every column kind the compiled code writes itself and some it leaves to
Python, edge values included, loaded twice by worker processes into three-partition
topics with ``--format json``, in Debezium's encoding (the default) and in pgcdc's: once
as it runs by default (COPY text to JSON in sinks/_loadfast.c), once with
``PGCDC_LOAD_FAST=0`` (the stream's decoders, then sinks/envelope.py's encoder).  Record
for record, by key: the same key bytes, partition, headers and value bytes, but for what
differs between two loads by nature (the load's LSN, its commit time, the processing time
and the server name, which is the topic prefix), masked in the value's text, and the
snapshot marks, whose rows depend on timing (each load has the same marks, counted per
table).
"""

from __future__ import annotations

import re
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest

from core.wire import topic_name
from loads.initial_load import InitialLoad, LoadConfig
from sinks.debezium_json import JsonOptions
from sinks.kafka import KafkaSink
from sinks.loadfast import FastLoad
from tests.oracle import raw_records

Conn = psycopg.Connection[tuple[object, ...]]
OPTIONS = {"debezium": JsonOptions(database="shop"), "pgcdc": JsonOptions(mode="pgcdc",
                                                                          database="shop")}
# the start of one record's value (the table "other", key c7) in each encoding
C7 = {"debezium": b'{"before":null,"after":{"code":"c7","since":18269,"active":false},'
                  b'"source":{"version":',
      "pgcdc": b'{"before":null,"after":{"code":"c7","since":"2020-01-08","active":false},'
               b'"source":{"version":'}

KINDS = """CREATE TABLE kinds (id int8 PRIMARY KEY, name text, small int2, n int4, big int8,
           amount numeric, price numeric(12,2), at timestamptz, at0 timestamptz(0),
           local timestamp, local3 timestamp(3), day date, clock time, clock3 time(3),
           ratio float8, f4 float4, ok bool, doc jsonb, grid int4[], bigs int8[], raw bytea,
           span interval, tags text[], u uuid, m mood, o oid, r int4range, cash money,
           zone timetz)"""
ROWS = """INSERT INTO kinds
    SELECT g, 'row ' || g || repeat(E'\\t', g % 3) || chr(233), (g % 30000)::int2, g * 7,
           g::int8 * 1000003, g * 1.25 / 7, g * 1.25, '2024-01-01 00:00:00+00'::timestamptz
           + g * interval '1.5 s', '2024-01-01'::timestamptz + g * interval '1.5 s',
           '1969-12-31'::timestamp + g * interval '1.0001 min',
           '1969-12-31'::timestamp + g * interval '1.0001 min', '1960-01-01'::date + g % 9000,
           '00:00:00'::time + g * interval '17.123457 s', '00:00:00'::time + g * interval '17.5 s',
           g / 3.0, (g / 7.0)::float4, g % 2 = 0, jsonb_build_object('n', g, 's', E'q"\\\\'),
           ARRAY[g % 10, NULL, -g], ARRAY[g::int8 * 100000000000], decode(md5(g::text), 'hex'),
           g * interval '1 hour', ARRAY['t' || g], md5(g::text)::uuid,
           (ARRAY['sad', 'ok', 'happy'])[g % 3 + 1]::mood, g, int4range(g, g + 10), g * 0.5,
           '10:00:00+02'::timetz
      FROM generate_series(1, 3000) g"""
EDGES = """INSERT INTO kinds VALUES
 (100001, E'tab\\there\\nnew line \\\\ back', -32768, 2147483647, -9223372036854775808,
  0.0000001, -0.00, 'infinity', '-infinity', 'infinity', '-infinity', 'infinity', '24:00:00',
  '23:59:59.999', 'NaN', 'Infinity', true, '{"k": [1, 2.50], "s": "a\\tb"}', '{{1,2},{3,4}}',
  '{}', '\\x00ff', '1 mon 2 days 00:00:01.5', '{"a,b",NULL}',
  'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 'happy', 4294967295, '[1,5)', -0.01, '00:00:00-01'),
 (100002, '', 0, 0, 0, -0.00001234, 9999999999.99, '0044-03-15 12:00:00+00 BC',
  '2024-02-29 23:59:59.5+00', '10000-01-01 00:00:00', '0001-01-01 00:00:00.0005',
  '0044-03-15 BC', '00:00:00', '00:00:00.0005', '-Infinity', '3.4028235e+38', false, 'null',
  '{NULL}', '{-1,NULL,0}', '', '-1 day', '{}', NULL, 'sad', 0, 'empty', 0, '23:59:59+14'),
 (100003, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"""
OTHER = """CREATE TABLE other (code text PRIMARY KEY, since date, active bool);
           INSERT INTO other SELECT 'c' || g, '2020-01-01'::date + g, g % 2 = 0
             FROM generate_series(1, 500) g"""

# the parts of a value two loads write differently by nature
_VARIES = re.compile(rb'"(ts_ms|ts_us|ts_ns|lsn|commit_lsn)":\d+'
                     rb'|"sequence":"\[\\"\d+\\",\\"\d+\\"\]"|"snapshot":"[a-z_]+"')


def _load(dsn: str, servers: str, prefix: str, slot: str, state: Path,
          options: JsonOptions) -> None:
    factory = partial(KafkaSink, servers, topic_prefix=prefix, partitions=3,
                      value_format="json", json_options=options)
    sink = factory()
    summary = InitialLoad(LoadConfig(dsn, state, slot=slot, tables=["public.kinds",
                                                                    "public.other"],
                                     chunk_pages=4, workers=2, sink_factory=factory),
                          sink).run()
    sink.close()
    assert summary.complete


def _records(servers: str, prefix: str, table: str) -> tuple[dict[bytes, Any], Counter[str]]:
    """The topic's records by key (key -> partition, headers, masked value) and its marks."""
    records = raw_records(servers, topic_name(prefix, "public", table), 60)
    name = b'"name":"' + prefix.encode() + b'"'
    marks = Counter(re.search(rb'"snapshot":"([a-z_]+)"', r.value)[1].decode()  # type: ignore[index]
                    for r in records)
    by_key = {r.key: (r.partition, sorted(r.headers),
                      _VARIES.sub(lambda m: m[0].split(b":")[0] + b":_",
                                  r.value.replace(name, b'"name":_')))
              for r in records}
    assert len(by_key) == len(records), "a key written twice"
    return by_key, marks


@pytest.mark.parametrize("mode", ["debezium", "pgcdc"])
def test_compiled_json_load_gives_the_slow_paths_bytes(pg_conn: Conn, pg_dsn: str,
                                                       kafka_servers: str, topic_prefix: str,
                                                       tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       mode: str) -> None:
    pg_conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
    for statement in (KINDS, ROWS, EDGES, OTHER,
                      "CREATE PUBLICATION pgcdc FOR TABLE kinds, other"):
        pg_conn.execute(statement)
    options = OPTIONS[mode]
    probe = KafkaSink(kafka_servers, topic_prefix=f"{topic_prefix}_probe", value_format="json",
                      json_options=options)
    assert FastLoad.for_sink(probe) is not None, \
        "the compiled path is not available: this test would compare nothing"
    probe.close()

    _load(pg_dsn, kafka_servers, f"{topic_prefix}_fast", "fast", tmp_path / "fast.json",
          options)
    monkeypatch.setenv("PGCDC_LOAD_FAST", "0")
    _load(pg_dsn, kafka_servers, f"{topic_prefix}_slow", "slow", tmp_path / "slow.json",
          options)

    marks: dict[str, Counter[str]] = {"fast": Counter(), "slow": Counter()}
    for table, rows in (("kinds", 3003), ("other", 500)):
        fast, fast_marks = _records(kafka_servers, f"{topic_prefix}_fast", table)
        slow, slow_marks = _records(kafka_servers, f"{topic_prefix}_slow", table)
        assert len(fast) == rows
        assert fast.keys() == slow.keys()
        different = [key for key in fast if fast[key] != slow[key]]
        assert different == [], (fast[different[0]], slow[different[0]])
        assert len({partition for partition, _, _ in fast.values()}) == 3
        for path, counted in (("fast", fast_marks), ("slow", slow_marks)):
            # one first and one last read per table (which rows: timing)
            assert counted["first"] + counted["first_in_data_collection"] == 1, (path, table)
            assert counted["last"] + counted["last_in_data_collection"] == 1, (path, table)
            marks[path] += counted
    assert marks["fast"] == marks["slow"]
    assert marks["fast"]["first"] == marks["fast"]["last"] == 1
    # what the masks leave is the encoder's text, not only alike in both loads
    _, _, value = fast[b'{"code":"c7"}']
    assert value.startswith(C7[mode])
    assert b',"db":"shop",' in value
    assert (b',"txId":null,' if mode == "debezium" else b',"txId":0,') in value
