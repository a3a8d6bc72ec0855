"""The initial load marks its read events as Debezium 3 does (loads/read_marks.py):
``source.snapshot`` is ``first`` for the load's first read, ``last`` for its last,
``first_in_data_collection`` / ``last_in_data_collection`` for the first / last read of
every other table, ``true`` for every other one, with reader threads and with worker
processes (the compiled Avro path and JSON's Python path), across tables and chunks: in
each table's topic (one partition) its first mark is its first read and its last mark its
last, as Debezium's own chunked-snapshot test asserts per table."""

from __future__ import annotations

import threading
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest

from core.errors import TransientError
from core.wire import topic_name
from decoder.change import READ, ChangeEvent
from loads.initial_load import InitialLoad, LoadConfig
from loads.load_progress import LoadProgress
from loads.load_state import CHUNK_BITS, ROW_BITS, LoadStateStore
from sinks.debezium_json import JsonOptions
from sinks.kafka import KafkaSink
from tests.oracle import read_topic

Conn = psycopg.Connection[tuple[object, ...]]
TABLES = {"marks_a": 3000, "marks_b": 1500, "marks_c": 700, "marks_one": 1, "marks_empty": 0}
FIRSTS = ("first", "first_in_data_collection")
LASTS = ("last", "last_in_data_collection")


@pytest.mark.parametrize(("workers", "value_format"),
                         [(0, "avro"), (2, "avro"), (2, "json")],
                         ids=["threads-avro", "2-workers-avro", "2-workers-json"])
def test_each_table_has_one_first_and_one_last(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, tmp_path: Path,
        workers: int, value_format: str) -> None:
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
    chunks = {t.name: len(t.chunks) for t in summary.state.tables.values()}
    assert all(chunks[name] > 2 for name in ("marks_a", "marks_b", "marks_c"))  # in parallel

    marks: dict[str, list[str]] = {}
    for name, rows in TABLES.items():
        if not rows:
            continue  # an empty table: no reads, no marks
        events = read_topic(kafka_servers, topic_name(topic_prefix, "public", name))
        assert all(e["op"] == READ for e in events)
        assert sorted(e["key"]["id"] for e in events) == list(range(1, rows + 1))
        marks[name] = [e["source"]["snapshot"] for e in events]  # in the partition's order
    every: list[Any] = [m for table in marks.values() for m in table]
    assert every.count("first") == 1 and every.count("last") == 1  # one load
    for name, table in marks.items():  # each topic has one partition: its order is the writes'
        if len(table) == 1:  # both the table's first and last: Debezium's precedence
            assert table[0] in ("first", "last", "last_in_data_collection"), name
            continue
        assert table[0] in FIRSTS and table[-1] in LASTS, (name, table[0], table[-1])
        assert set(table[1:-1]) == {"true"}, name
    # Debezium's pattern: the load's first table FIRST ... LAST_IN_DATA_COLLECTION, the others
    # FIRST_IN_DATA_COLLECTION ... LAST_IN_DATA_COLLECTION, the one that ends it ... LAST
    assert sum(t[0] == "first" for t in marks.values()) == 1
    assert sum(t[-1] == "last" for t in marks.values()) == 1


def _attempt(event: dict[str, Any]) -> int:
    return int(event["source"]["ordinal"]) >> (CHUNK_BITS + ROW_BITS)


class RefusingSink(KafkaSink):
    """A worker's sink that fails after ``limit`` writes, as a sink that lost Kafka would
    (the compiled Avro path bypasses ``write``: used with JSON)."""

    def __init__(self, *args: Any, limit: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limit = limit

    def write(self, event: ChangeEvent) -> None:
        self.limit -= 1
        if self.limit < 0:
            raise RefusedError("the test's sink refuses more reads")
        super().write(event)


class RefusedError(TransientError):
    pass


@pytest.mark.parametrize("workers", [0, 2], ids=["threads-stopped", "2-workers-failed"])
def test_a_resumed_load_marks_each_table_once(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, tmp_path: Path,
        workers: int) -> None:
    """A load stopped (threads) or failed (a worker's sink) part way writes no ``last`` and
    no last mark of a table whose chunks are not all done; resumed, it writes a table's
    first mark again only if none of that table's rows was durable (a table with durable
    rows had its first mark durable before them), and every table ends with exactly one
    last mark."""
    tables = {"resume_a": 3000, "resume_b": 1500, "resume_c": 700}
    for name, rows in tables.items():
        pg_conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, payload text)")
        pg_conn.execute(f"INSERT INTO {name} SELECT g, repeat('m', 100) "  # noqa: S608
                        "FROM generate_series(1, %s) g", (rows,))
    value_format = "json" if workers else "avro"
    json_options = JsonOptions(mode="debezium") if workers else None
    factory = partial(KafkaSink, kafka_servers, topic_prefix=topic_prefix,
                      value_format=value_format, json_options=json_options)
    refusing = partial(RefusingSink, kafka_servers, topic_prefix=topic_prefix,
                       value_format=value_format, json_options=json_options, limit=600)
    config = LoadConfig(pg_dsn, tmp_path / "load.json", tables=[f"public.{n}" for n in tables],
                        readers=2, chunk_pages=2, batch_rows=100, workers=workers,
                        sink_factory=refusing, progress_interval=0.0)
    stop = threading.Event()

    def halfway(progress: LoadProgress) -> None:
        if progress.rows >= 1000:
            stop.set()

    sink = factory()
    try:
        if workers:
            with pytest.raises(RefusedError):
                InitialLoad(config, sink).run()
        else:
            InitialLoad(config, sink).run(stop=stop, on_progress=halfway)
    finally:
        sink.close()
    stopped = LoadStateStore(config.state_file).load()
    assert stopped is not None
    durable = {t.name: t.rows for t in stopped.tables.values()}
    complete = {t.name for t in stopped.tables.values() if t.complete}
    assert 0 < sum(durable.values()) < sum(tables.values())
    sink = factory()
    try:
        resumed = InitialLoad(replace(config, sink_factory=factory), sink).run()
    finally:
        sink.close()
    assert resumed.complete

    every: list[str] = []
    for name, rows in tables.items():
        events = read_topic(kafka_servers, topic_name(topic_prefix, "public", name))
        assert {e["key"]["id"] for e in events} == set(range(1, rows + 1))
        marks = [(_attempt(e), e["source"]["snapshot"]) for e in events]
        every += [m for _, m in marks]
        assert marks[-1][1] in LASTS, (name, marks[-1])  # the table's one last mark, at its end
        assert sum(m in LASTS for _, m in marks) == 1, name
        # the attempt that completes a table writes its last mark; a stopped one none
        assert (marks[-1][0] == 0) == (name in complete), name
        again = [m for a, m in marks if a == 1 and m in FIRSTS]
        assert len(again) == (1 if durable[name] == 0 else 0), (name, durable[name], again)
        firsts = [m for _, m in marks if m in FIRSTS]
        assert firsts and marks[0][1] in FIRSTS, name  # the first read of the topic is marked
    assert every.count("last") == 1 and every.count("first") == 1
