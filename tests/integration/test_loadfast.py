"""The initial load's compiled path (sinks/loadfast.py) gives Kafka the slow path's records.

The same table, every column kind the compiled code writes itself and some it leaves to
Python, edge values included, loaded twice by worker processes into a three-partition
topic: once as it runs by default, once with ``PGCDC_LOAD_FAST=0``.  Every record must
have the same key bytes, partition, headers and value (but for what differs between two
loads by nature: the load's LSN, its commit time, the processing time ``ts_ms`` and the
server name, which is the topic prefix).
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from core.wire import topic_name
from loads.initial_load import InitialLoad, LoadConfig
from sinks import loadfast as loadfast_module
from sinks.kafka import KafkaSink
from sinks.loadfast import FastLoad, copy_lines, libpq_path
from tests.oracle import raw_records, read_topic

Conn = psycopg.Connection[tuple[object, ...]]

EDGE_ROWS = """
INSERT INTO kinds VALUES
 (100001, E'tab\\there\\nnew line \\\\ back', -32768, 2147483647, -9223372036854775808,
  0.0000001, 'infinity', '-infinity', 'infinity', 'NaN', 'Infinity', true,
  '{"k": [1, 2.50], "s": "a\\tb"}', '{{1,2},{3,4}}', '{}', '\\x00ff', '1 mon 2 days 00:00:01.5',
  '{"a,b",NULL}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 'happy', 4294967295, '[1,5)'),
 (100002, '', 0, 0, 0, -0.00001234, '0044-03-15 12:00:00+00 BC', '10000-01-01 00:00:00',
  '0044-03-15 BC', '-Infinity', '3.4028235e+38', false, 'null', '{NULL}', '{-1,NULL,0}', '',
  '-1 day', '{}', NULL, 'sad', 0, 'empty'),
 (100003, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL, NULL)
"""


def _load(dsn: str, servers: str, prefix: str, slot: str, state: Path) -> None:
    factory = partial(KafkaSink, servers, topic_prefix=prefix, partitions=3)
    sink = factory()
    summary = InitialLoad(LoadConfig(dsn, state, slot=slot, tables=["public.kinds"],
                                     chunk_pages=4, workers=2, sink_factory=factory),
                          sink).run()
    sink.close()
    assert summary.complete


def _comparable(event: dict[str, Any]) -> dict[str, Any]:
    # the snapshot mark: which row is the load's first and last depends on timing
    varies = ("ts_ms", "lsn", "commit_lsn", "name", "snapshot")
    source = {k: v for k, v in event["source"].items() if k not in varies}
    after = {k: "NaN" if isinstance(v, float) and math.isnan(v) else v  # NaN != NaN
             for k, v in event["after"].items()}
    return {**{k: v for k, v in event.items() if k not in ("ts_ms", "_raw_key")},
            "source": source, "after": after}


def test_compiled_load_gives_the_slow_paths_records(pg_conn: Conn, pg_dsn: str,
                                                     kafka_servers: str, topic_prefix: str,
                                                     tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    pg_conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
    pg_conn.execute("""CREATE TABLE kinds (id int8 PRIMARY KEY, name text, small int2, n int4,
                       big int8, amount numeric, at timestamptz, local timestamp, day date,
                       ratio float8, f4 float4, ok bool, doc jsonb, grid int4[], bigs int8[],
                       raw bytea, span interval, tags text[], u uuid, m mood, o oid,
                       r int4range)""")
    pg_conn.execute("""INSERT INTO kinds
        SELECT g, 'row ' || g || repeat(E'\\t', g % 3), (g % 30000)::int2, g * 7, g::int8 * 1000003,
               g * 1.25 / 7, '2024-01-01 00:00:00+00'::timestamptz + g * interval '1.5 s',
               '2024-01-01'::timestamp + g * interval '1 min', '2020-01-01'::date + g % 900,
               g / 3.0, (g / 7.0)::float4, g % 2 = 0, jsonb_build_object('n', g),
               ARRAY[g % 10, NULL, -g], ARRAY[g::int8 * 100000000000], decode(md5(g::text), 'hex'),
               g * interval '1 hour', ARRAY['t' || g], md5(g::text)::uuid,
               (ARRAY['sad', 'ok', 'happy'])[g % 3 + 1]::mood, g, int4range(g, g + 10)
          FROM generate_series(1, 3000) g""")
    pg_conn.execute(EDGE_ROWS)
    pg_conn.execute("CREATE PUBLICATION pgcdc FOR TABLE kinds")
    assert FastLoad.for_sink(KafkaSink(kafka_servers, topic_prefix=f"{topic_prefix}_probe")) \
        is not None, "the compiled path is not available: this test would compare nothing"

    _load(pg_dsn, kafka_servers, f"{topic_prefix}_fast", "fast", tmp_path / "fast.json")
    monkeypatch.setenv("PGCDC_LOAD_FAST", "0")
    _load(pg_dsn, kafka_servers, f"{topic_prefix}_slow", "slow", tmp_path / "slow.json")

    raw, decoded = {}, {}
    for path in ("fast", "slow"):
        topic = topic_name(f"{topic_prefix}_{path}", "public", "kinds")
        records = raw_records(kafka_servers, topic, 60)
        raw[path] = sorted((r.key, r.partition, sorted(r.headers)) for r in records)
        events = read_topic(kafka_servers, topic)
        marks = [e["source"]["snapshot"] for e in events]
        assert (marks.count("first"), marks.count("last")) == (1, 1), path
        decoded[path] = sorted((_comparable(e) for e in events),
                               key=lambda e: e["source"]["ordinal"])
    assert len(decoded["fast"]) == 3003
    assert raw["fast"] == raw["slow"]
    assert decoded["fast"] == decoded["slow"]
    assert len({r[1] for r in raw["fast"]}) == 3  # the keys spread over every partition



def test_copy_lines_from_libpq_equal_psycopgs(pg_conn: Conn) -> None:
    """The COPY read through libpq itself gives psycopg's lines, leaves the connection in
    its state (mode, transaction) when read to the end or left half read, and reports a
    refused COPY with the server's message."""
    path = libpq_path()
    assert path is not None and loadfast_module._loadfast is not None  # noqa: SLF001
    pg_conn.execute("CREATE TABLE lines (id int, t text)")
    pg_conn.execute("INSERT INTO lines SELECT g, E'a\\tb ' || g FROM generate_series(1, 5000) g")
    query = sql.SQL("COPY (SELECT * FROM lines ORDER BY id) TO STDOUT")
    with pg_conn.cursor() as cur, cur.copy(query) as copy:
        expected = [bytes(line) for line in copy]
    nonblocking = pg_conn.pgconn.nonblocking
    with pg_conn.transaction():
        with copy_lines(pg_conn, query) as lines:
            assert [bytes(line) for line in lines] == expected
        assert pg_conn.pgconn.nonblocking == nonblocking
        with copy_lines(pg_conn, query) as lines:
            assert next(lines) == expected[0]  # left after one row: the rest is dropped
        assert pg_conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert pg_conn.execute("SELECT count(*) FROM lines").fetchone() == (5000,)
    with pytest.raises(psycopg.OperationalError, match='relation "missing" does not exist'), \
            copy_lines(pg_conn, sql.SQL("COPY missing TO STDOUT")):
        pass
    assert pg_conn.execute("SELECT 1").fetchone() == (1,)


def test_a_copy_cut_off_by_the_server_is_an_operational_error(pg_conn: Conn,
                                                              pg_dsn: str) -> None:
    """A COPY whose backend is terminated halfway fails as psycopg's would: OperationalError,
    transient for the load (the chunk is not done; the load resumes)."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        pid = conn.info.backend_pid
        query = sql.SQL("COPY (SELECT g, repeat('x', 100) FROM generate_series(1, 5000000) g) "
                        "TO STDOUT")
        with pytest.raises(psycopg.OperationalError, match="COPY"), \
                copy_lines(conn, query) as lines:
            assert next(lines).startswith(b"1\t")
            pg_conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            for _ in lines:
                pass
