"""The initial load marks its read events as Debezium does (loads/read_marks.py):
``source.snapshot`` is ``first`` for the load's first read, ``last`` for its last, ``true``
for every other one, with reader threads and with worker processes (the compiled Avro path
and JSON's Python path), across tables and chunks; ``last`` is the last read of its topic
and ``first`` the first of its own."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest

from core.wire import topic_name
from decoder.change import READ
from loads.initial_load import InitialLoad, LoadConfig
from sinks.debezium_json import JsonOptions
from sinks.kafka import KafkaSink
from tests.oracle import read_topic

Conn = psycopg.Connection[tuple[object, ...]]
TABLES = {"marks_a": 3000, "marks_b": 1500, "marks_empty": 0}


@pytest.mark.parametrize(("workers", "value_format"),
                         [(0, "avro"), (2, "avro"), (2, "json")],
                         ids=["threads-avro", "2-workers-avro", "2-workers-json"])
def test_one_first_one_last(pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str,
                            tmp_path: Path, workers: int, value_format: str) -> None:
    for name, rows in TABLES.items():
        pg_conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, payload text)")
        pg_conn.execute(f"INSERT INTO {name} SELECT g, repeat('m', 100) "  # noqa: S608
                        "FROM generate_series(1, %s) g", (rows,))
    json_options = JsonOptions(mode="debezium") if value_format == "json" else None
    factory = partial(KafkaSink, kafka_servers, topic_prefix=topic_prefix,
                      value_format=value_format, json_options=json_options)
    sink = factory()
    load = InitialLoad(LoadConfig(pg_dsn, tmp_path / "load.json",
                                  tables=[f"public.{n}" for n in TABLES], readers=3,
                                  chunk_pages=4, workers=workers, sink_factory=factory), sink)
    try:
        summary = load.run()
    finally:
        sink.close()
    assert summary.complete
    chunks = sum(len(t.chunks) for t in summary.state.tables.values())
    assert chunks > 6  # several chunks per table, read in parallel

    marks: dict[str, list[str]] = {}
    for name, rows in TABLES.items():
        if not rows:
            continue
        events = read_topic(kafka_servers, topic_name(topic_prefix, "public", name))
        assert all(e["op"] == READ for e in events)
        assert sorted(e["key"]["id"] for e in events) == list(range(1, rows + 1))
        marks[name] = [e["source"]["snapshot"] for e in events]  # in the partition's order
    every: list[Any] = [m for table in marks.values() for m in table]
    assert every.count("first") == 1 and every.count("last") == 1
    assert set(every) == {"first", "true", "last"}
    for table in marks.values():  # each topic has one partition: its order is the writes'
        if "first" in table:
            assert table[0] == "first"
        if "last" in table:
            assert table[-1] == "last"
