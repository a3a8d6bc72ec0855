"""The Kafka sink against a real broker, read back with a different client (kafka-python)."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC
from pathlib import Path
from typing import Any

import psycopg
import pytest

from core.wire import catalog_topic, topic_name
from decoder.slot import current_wal_lsn, slot_info
from pgcdc import cli
from pgcdc.pipeline import Pipeline, PipelineConfig
from pgcdc.services.kafka import KafkaBroker
from sinks.kafka import KafkaSink
from tests.oracle import raw_records, read_topic

Conn = psycopg.Connection[tuple[object, ...]]


def _read_all(servers: str, topic: str, expected: int) -> list[Any]:
    """Every record up to the topic's end offsets (at least ``expected`` of them)."""
    records = raw_records(servers, topic, timeout=60)
    assert len(records) >= expected, f"{topic}: {len(records)} records, expected {expected}"
    return records


def test_events_reach_kafka_keyed_ordered_and_described(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    pg_conn.execute("CREATE TABLE items (a int, b text, qty int, PRIMARY KEY (a, b))")
    sink = KafkaSink(kafka_servers, topic_prefix=topic_prefix, partitions=3,
                     value_format="json")
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
    everything = _read_all(kafka_servers, topic_name(topic_prefix, "public", "items"),
                           expected + 5)
    assert len(everything) == expected + 5
    records = [r for r in everything if r.value is not None]
    assert len(records) == expected
    tombstones = [(i, r.key) for i, r in enumerate(everything) if r.value is None]
    assert len(tombstones) == 5, "each delete is followed by a tombstone"
    for i, key in tombstones:
        previous = [r for r in everything[:i] if r.key == key][-1]
        assert json.loads(previous.value)["op"] == "d"
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

    # pgcdc status counts what each topic holds
    assert cli.main(["status", "--dsn", pg_dsn, "--bootstrap-servers", kafka_servers,
                     "--topic-prefix", topic_prefix, "--progress-file", str(tmp_path / "p.json"),
                     "--catalog-dir", str(tmp_path / "catalog"), "--json"]) == 0
    topics = json.loads(capsys.readouterr().out)["topics"]
    assert topics[topic_name(topic_prefix, "public", "items")] == expected + 5
    assert topics[catalog_topic(topic_prefix)] == len(catalog)


def test_broker_outage_recreates_producer_without_loss(
        pg_conn: Conn, pg_dsn: str, kafka_broker: KafkaBroker, topic_prefix: str) -> None:
    """T12: deliveries time out while the broker is frozen; the slot does not move, the
    producer is recreated, and everything arrives once the broker is back."""
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    sink = KafkaSink(kafka_broker.bootstrap_servers, topic_prefix=topic_prefix,
                     value_format="json",
                     producer_config={"message.timeout.ms": 2000, "request.timeout.ms": 1000})
    pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.t"], status_interval=0.2,
                                       max_retries=30, retry_max_delay=2.0), sink)
    pipeline.prepare()
    pg_conn.execute("INSERT INTO t VALUES (0)")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))  # topic and catalog exist now

    stop = threading.Event()
    errors: list[BaseException] = []
    thread = threading.Thread(target=lambda: _run_into(pipeline, stop, errors))
    kafka_broker.pause()
    try:
        thread.start()
        pg_conn.execute("INSERT INTO t SELECT generate_series(1, 50)")
        samples = []
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            info = slot_info(pg_conn, "pgcdc")
            assert info is not None and info.confirmed_flush_lsn is not None
            samples.append(info.confirmed_flush_lsn)
            time.sleep(0.2)
    finally:
        kafka_broker.resume()
    end = current_wal_lsn(pg_conn)
    deadline = time.monotonic() + 90
    while pipeline.progress.durable_lsn < end and time.monotonic() < deadline and not errors:
        time.sleep(0.2)
    stop.set()
    thread.join(60)
    sink.close()
    assert not errors, errors
    assert pipeline.progress.reconnects >= 1
    records = _read_all(kafka_broker.bootstrap_servers,
                        topic_name(topic_prefix, "public", "t"), 51)
    assert {json.loads(r.key)["id"] for r in records} == set(range(51))
    # while the insert was undelivered, the slot stayed below its commit record, so
    # PostgreSQL would send it again (a keepalive may move it to mid-transaction WAL)
    commit_lsn = {json.loads(r.value)["source"]["commit_lsn"] for r in records
                  if json.loads(r.key)["id"] > 0}
    assert len(commit_lsn) == 1
    assert max(samples) < commit_lsn.pop()


def _run_into(pipeline: Pipeline, stop: threading.Event, errors: list[BaseException]) -> None:
    try:
        pipeline.run(stop=stop)
    except BaseException as exc:
        errors.append(exc)


def test_transaction_metadata_and_logical_messages(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str) -> None:
    pg_conn.execute("CREATE TABLE a (id int PRIMARY KEY)")
    pg_conn.execute("CREATE TABLE b (id int PRIMARY KEY)")
    sink = KafkaSink(kafka_servers, topic_prefix=topic_prefix, transaction_topic=True)
    pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.a", "public.b"]), sink)
    pipeline.prepare()
    with pg_conn.transaction():
        pg_conn.execute("INSERT INTO a VALUES (1), (2)")
        pg_conn.execute("SELECT pg_logical_emit_message(true, 'app', 'in txn')")
        pg_conn.execute("INSERT INTO b VALUES (1)")
    pg_conn.execute("SELECT pg_logical_emit_message(false, 'app', 'alone')")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    sink.close()

    txns = [json.loads(r.value) for r in _read_all(kafka_servers, sink.transaction_topic or "",
                                                   2)]
    assert [t["status"] for t in txns] == ["BEGIN", "END"]
    assert txns[0]["id"] == txns[1]["id"]
    assert txns[1]["event_count"] == 3
    assert sorted((c["data_collection"], c["event_count"])
                  for c in txns[1]["data_collections"]) == [("public.a", 2), ("public.b", 1)]

    messages = [json.loads(r.value) for r in _read_all(kafka_servers, sink.messages_topic, 2)]
    assert [(m["prefix"], m["transactional"], m["content"]) for m in messages] == [
        ("app", True, "aW4gdHhu"), ("app", False, "YWxvbmU=")]
    assert messages[0]["commit_lsn"] is not None and messages[1]["commit_lsn"] is None


def test_avro_values_read_back_equal_the_source(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str) -> None:
    """The benchmark's column types (and the compiled encoder's other fast cases) through the
    default Avro format, read back with kafka-python and fastavro from the schemas in the
    catalog topic; the expected text comes from psycopg's own conversion of a plain SELECT."""
    pg_conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok')")
    pg_conn.execute(
        "CREATE TABLE kinds (id bigint PRIMARY KEY, amount numeric(12, 2), at timestamptz,"
        " local timestamp, day date, label text, doc jsonb, tags integer[], grid int[][],"
        " mood mood, ratio float8, raw bytea, ok bool)")
    sink = KafkaSink(kafka_servers, topic_prefix=topic_prefix)  # Avro, the default
    assert sink.encoder.format == "avro"
    pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.kinds"]), sink)
    pipeline.prepare()
    pg_conn.execute("SET timezone = 'America/Sao_Paulo'")  # the stream is in UTC regardless
    pg_conn.execute(
        "INSERT INTO kinds SELECT i, i * 1.25 - 3, timestamptz '2024-02-29 23:59:59.5+00'"
        " + i * interval '1 day 1 microsecond', timestamp '0999-01-01 00:00:00' + i * interval"
        " '1 hour', date '2000-01-01' + i, 'item ' || i || ' ü€', jsonb_build_object('i', i),"
        " ARRAY[i, -i, NULL], ARRAY[[i, 2], [3, NULL]], (ARRAY['sad', 'ok'])[1 + i % 2]::mood,"
        " i / 3.0, decode(lpad(to_hex(i), 2, '0'), 'hex'), i % 2 = 0"
        " FROM generate_series(1, 40) AS i")
    pg_conn.execute("INSERT INTO kinds (id) VALUES (0)")  # every column null
    pg_conn.execute("UPDATE kinds SET amount = -amount, tags = '{}' WHERE id BETWEEN 1 AND 5")
    pg_conn.execute("DELETE FROM kinds WHERE id > 35")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    sink.close()

    changes = read_topic(kafka_servers, topic_name(topic_prefix, "public", "kinds"))
    assert [c["op"] for c in changes] == ["c"] * 41 + ["u"] * 5 + ["d"] * 5
    last: dict[int, dict[str, Any] | None] = {}
    for change in changes:
        row = change["after"] if change["op"] != "d" else change["before"]
        assert change["key"] == {"id": row["id"]}
        last[row["id"]] = change["after"]
    cursor = pg_conn.execute("SELECT * FROM kinds ORDER BY id")
    names = [d.name for d in cursor.description or ()]
    expected = {}
    for values in cursor.fetchall():
        row = dict(zip(names, values, strict=True))
        expected[row["id"]] = {
            name: (value if value is None or name in ("id", "ratio", "raw", "ok")
                   else json.dumps(value, separators=(",", ":")) if name in ("tags", "grid")
                   else value.isoformat() if name in ("at", "local", "day")
                   else str(value))
            for name, value in row.items()}
        if row["at"] is not None:
            expected[row["id"]]["at"] = row["at"].astimezone(UTC).isoformat()
        if row["doc"] is not None:  # jsonb is its text, as the server prints it
            expected[row["id"]]["doc"] = pg_conn.execute(
                "SELECT doc::text FROM kinds WHERE id = %s", (row["id"],)).fetchone()[0]
    assert {k: v for k, v in last.items() if v is not None} == expected
    assert expected[3]["at"] == "2024-03-03T23:59:59.500003+00:00"
    assert expected[2]["grid"] == "[[2,2],[3,null]]" and expected[4]["tags"] == "[]"
