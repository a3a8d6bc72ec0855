"""``pgcdc run --format json`` against real PostgreSQL and Kafka gives Debezium's records.

The table and the statements of tests/golden/debezium-3.6.1 (a copy of ../shared/reference:
what Debezium 3.6.1's PostgreSQL connector wrote for them, under three settings), run through
the CLI with the same settings; each record's key, and its value's ``before``, ``after``, ``op`` and
``source``, must equal Debezium's, leaving out only the fields the reference lists as
varying (and ``source.version``/``source.connector``, which name the producer).
``source.db`` is compared with this test's database (the recording's was ``postgres``).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from core.wire import topic_name
from tests.oracle import raw_records

Conn = psycopg.Connection[tuple[object, ...]]

REFERENCE = Path(__file__).resolve().parents[1] / "golden" / "debezium-3.6.1"
SETTINGS = {
    "defaults.json": [],
    "decimal-interval-string.json": ["--decimal-handling-mode", "string",
                                     "--interval-handling-mode", "string"],
    "string-modes-isostring.json": ["--decimal-handling-mode", "string",
                                    "--interval-handling-mode", "string",
                                    "--time-precision-mode", "isostring"],
}
VARYING = {"ts_ms", "ts_us", "ts_ns", "txId", "lsn", "sequence", "name", "version", "connector"}
PGCDC_FIELDS = {"commit_lsn", "ordinal", "table_oid", "table_version"}

TABLE = """
CREATE TYPE env.color AS ENUM ('red', 'green', 'blue');
CREATE TABLE env.t (
    id integer PRIMARY KEY,
    c_int2 smallint, c_int4 integer, c_int8 bigint,
    c_numeric numeric(12,3), c_numeric_free numeric, c_float4 real, c_float8 double precision,
    c_text text, c_varchar varchar(20), c_bytea bytea, c_bool boolean,
    c_date date, c_time time, c_timetz timetz, c_timestamp timestamp, c_timestamptz timestamptz,
    c_interval interval, c_uuid uuid, c_json json, c_jsonb jsonb,
    c_int_array integer[], c_text_array text[], c_enum env.color, c_inet inet, c_money money
)"""
STATEMENTS = [
    """INSERT INTO env.t VALUES (1, -32768, 2147483647, 9007199254740993, 12345.678,
       3.14159265358979323846, 1.5, 2.718281828459045, 'héllo "q"', 'v', '\\xdeadbeef', true,
       '2024-02-29', '13:14:15.123456', '13:14:15.5+02', '2024-02-29 13:14:15.123456',
       '2024-02-29 13:14:15.123456+00', '1 year 2 months 3 days 04:05:06.789',
       'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"a": 1, "b": [1, 2]}', '{"b": [1, 2], "a": 1}',
       '{1,2,NULL}', '{"x","y z"}', 'green', '192.168.1.10/24', '1234.56')""",
    "UPDATE env.t SET c_text = 'changed', c_int4 = 7, c_numeric = -0.5 WHERE id = 1",
    "DELETE FROM env.t WHERE id = 1",
]


def _comparable(value: dict[str, Any], database: str | None = None) -> dict[str, Any]:
    source = {k: v for k, v in value["source"].items() if k not in VARYING | PGCDC_FIELDS}
    if database is not None:
        source["db"] = database
    return {"before": value["before"], "after": value["after"], "op": value["op"],
            "source": source}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_records_equal_debezium_s(name: str, pg_conn: Conn, pg_dsn: str, kafka_servers: str,
                                  topic_prefix: str, tmp_path: Path) -> None:
    recorded = json.loads((REFERENCE / name).read_text())
    pg_conn.execute("CREATE SCHEMA env")
    pg_conn.execute(TABLE)
    # rows before the start: the initial load reads them, marked first, true, last
    pg_conn.execute("CREATE TABLE env.loaded (id integer PRIMARY KEY)")
    pg_conn.execute("INSERT INTO env.loaded VALUES (1), (2), (3)")
    database = pg_conn.execute("SELECT current_database()").fetchone()
    assert database is not None
    argv = [sys.executable, "-m", "pgcdc", "run", "--dsn", pg_dsn, "--sink", "kafka",
            "--bootstrap-servers", kafka_servers, "--topic-prefix", topic_prefix,
            "--format", "json", "--tables", "env.t,env.loaded",
            "--progress-file", str(tmp_path / "progress.json"),
            "--catalog-dir", str(tmp_path / "catalog"),
            "--load-state", str(tmp_path / "load.json"), "--initial-load", *SETTINGS[name]]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    topic = topic_name(topic_prefix, "env", "t")
    try:
        deadline = time.monotonic() + 60
        while pg_conn.execute("SELECT count(*) FROM pg_replication_slots WHERE database = "
                              "current_database()").fetchone() == (0,):
            assert proc.poll() is None, proc.communicate(timeout=5)[1].decode()
            assert time.monotonic() < deadline, "pgcdc created no slot"
            time.sleep(0.2)
        for statement in STATEMENTS:
            pg_conn.execute(statement)
        records: list[Any] = []
        while len(records) < len(recorded):
            assert proc.poll() is None, proc.communicate(timeout=5)[1].decode()
            assert time.monotonic() < deadline + 60, f"{len(records)} records in {topic}"
            time.sleep(0.5)
            try:
                records = raw_records(kafka_servers, topic, timeout=30)
            except (TimeoutError, AssertionError, ValueError):  # ValueError: no topic yet
                records = []
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()

    assert len(records) == len(recorded)
    for got, want in zip(records, recorded, strict=True):
        assert json.loads(got.key) == want["key"]
        assert dict(got.headers)["pgcdc.format"] == b"debezium-json"
        if want["value"] is None:
            assert got.value is None  # the tombstone
            continue
        value = json.loads(got.value)
        assert _comparable(value) == _comparable(want["value"], database[0])
        assert set(want["value"]) <= set(value)
        assert set(want["value"]["source"]) - {"version", "connector"} <= set(value["source"])

    # the load's reads: Debezium's source of a snapshot record, snapshot first/true/last
    reads = [json.loads(r.value) for r in raw_records(
        kafka_servers, topic_name(topic_prefix, "env", "loaded"), timeout=30)]
    assert [r["op"] for r in reads] == ["r"] * 3
    assert [r["source"]["snapshot"] for r in reads] == ["first", "true", "last"]
    streamed = _comparable(recorded[0]["value"], database[0])["source"]
    for read in reads:
        source = _comparable(read)["source"]
        assert source == {**streamed, "snapshot": source["snapshot"], "table": "loaded"}
        assert read["source"]["txId"] is None  # a read belongs to no transaction
