"""The Kafka sink against a real broker, read back with a different client (kafka-python)."""

from __future__ import annotations

import json
from typing import Any

import psycopg
from kafka import KafkaConsumer

from decoder.slot import current_wal_lsn, slot_info
from pgcdc.pipeline import Pipeline, PipelineConfig
from sinks.kafka import KafkaSink, catalog_topic, topic_name

Conn = psycopg.Connection[tuple[object, ...]]


def _read_all(servers: str, topic: str, expected: int) -> list[Any]:
    consumer = KafkaConsumer(topic, bootstrap_servers=servers, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=5000)
    try:
        records = []
        for record in consumer:
            records.append(record)
            if len(records) >= expected:
                break
        return records
    finally:
        consumer.close()


def test_events_reach_kafka_keyed_ordered_and_described(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str) -> None:
    pg_conn.execute("CREATE TABLE items (a int, b text, qty int, PRIMARY KEY (a, b))")
    sink = KafkaSink(kafka_servers, topic_prefix=topic_prefix, partitions=3)
    pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.items"]), sink)
    pipeline.prepare()
    with pg_conn.transaction():
        for i in range(20):
            pg_conn.execute("INSERT INTO items VALUES (%s, %s, 0)", (i % 4, f"k:{i % 5}\x01,"))
    for _ in range(3):
        pg_conn.execute("UPDATE items SET qty = qty + 1")
    pg_conn.execute("DELETE FROM items WHERE a = 0")
    end = current_wal_lsn(pg_conn)
    pipeline.run(until_lsn=end)
    sink.close()
    info = slot_info(pg_conn, "pgcdc")
    assert info is not None and info.confirmed_flush_lsn is not None
    assert info.confirmed_flush_lsn >= end

    expected = 20 + 3 * 20 + 5
    records = _read_all(kafka_servers, topic_name(topic_prefix, "public", "items"), expected)
    assert len(records) == expected
    by_key: dict[tuple[int, str], list[tuple[int, int, str]]] = {}
    versions = set()
    for record in records:
        key = json.loads(record.key)
        value = json.loads(record.value)
        assert list(key) == ["a", "b"]
        row = value["after"] or value["before"]
        assert (row["a"], row["b"]) == (key["a"], key["b"])
        source = value["source"]
        by_key.setdefault((key["a"], key["b"]), []).append(
            (source["commit_lsn"], source["ordinal"], value["op"]))
        versions.add(dict(record.headers)["pgcdc.table_version"].decode())
        assert source["table_version"] in versions
        assert source["schema"] == "public" and source["table"] == "items"
    assert len(by_key) == 20
    for history in by_key.values():
        positions = [(lsn, ordinal) for lsn, ordinal, _ in history]
        assert positions == sorted(positions), "per-key order holds"
        assert history[0][2] == "c"
    deleted = [k for k, h in by_key.items() if h[-1][2] == "d"]
    assert sorted(deleted) == sorted(k for k in by_key if k[0] == 0)

    catalog = _read_all(kafka_servers, catalog_topic(topic_prefix), 1)
    described = json.loads(catalog[0].value)
    assert described["version"] in versions
    assert [(c["name"], c["key"]) for c in described["columns"]] == [
        ("a", True), ("b", True), ("qty", False)]
