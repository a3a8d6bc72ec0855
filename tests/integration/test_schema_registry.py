"""Avro in the Confluent wire format with a real schema registry (issue 17.2, T20): real
PostgreSQL, Kafka and Apicurio Registry; every topic read with Confluent's own
``AvroDeserializer`` and ``SchemaRegistryClient`` (a consumer nobody here wrote), across an
ALTER; a change the subject's compatibility rule refuses stops pgcdc with the subject and the
registry's message, the slot left where delivery stopped; a frozen registry is retried; and
pgcdc's Spark job reads the wire format into a lake equal to the source."""

from __future__ import annotations

import base64
import http.server
import io
import json
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from core.wire import catalog_topic, topic_name
from decoder.slot import current_wal_lsn, slot_info
from pgcdc import cli
from pgcdc.pipeline import Pipeline, PipelineConfig
from pgcdc.services.registry import SchemaRegistryServer
from sinks.kafka import KafkaSink
from sinks.registry import (
    RegistryRefusedError,
    RegistryUnavailableError,
    SchemaRegistry,
)
from streaming import job
from tests.running import running, wait

Conn = psycopg.Connection[tuple[object, ...]]


class _Topic:
    """A topic read to its end with confluent_kafka and Confluent's Avro deserializer."""

    def __init__(self, servers: str, registry_url: str) -> None:
        self.servers = servers
        self.client = SchemaRegistryClient({"url": registry_url})
        self.deserialize = AvroDeserializer(self.client)

    def raw(self, topic: str) -> list[Any]:
        consumer = Consumer({"bootstrap.servers": self.servers, "group.id": "registry-test",
                             "enable.auto.commit": False})
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
            consumer.assign([TopicPartition(topic, 0, low)])
            records: list[Any] = []
            deadline = time.monotonic() + 60
            while len(records) < high - low:
                assert time.monotonic() < deadline, f"{topic}: {len(records)} of {high - low}"
                message = consumer.poll(1.0)
                if message is not None:
                    assert message.error() is None, message.error()
                    records.append(message)
            return records
        finally:
            consumer.close()

    def read(self, topic: str) -> list[tuple[dict[str, Any], dict[str, Any] | None, Any]]:
        """(key, value, the record) of each record; a tombstone's value is None."""
        out = []
        for record in self.raw(topic):
            key = self.deserialize(record.key(), SerializationContext(topic, MessageField.KEY))
            value = None if record.value() is None else self.deserialize(
                record.value(), SerializationContext(topic, MessageField.VALUE))
            out.append((key, value, record))
        return out

    def versions(self, subject: str) -> list[int]:
        return list(self.client.get_versions(subject))


def _schema_id(raw: bytes) -> int:
    magic, schema_id = struct.unpack(">bI", raw[:5])
    assert magic == 0
    return int(schema_id)


def _catalog_readers(topics: _Topic, prefix: str) -> dict[str, Any]:
    """Each table version's writer schema, from pgcdc's catalog topic (the second reader)."""
    readers = {}
    for record in topics.raw(catalog_topic(prefix)):
        entry = json.loads(record.value())
        assert entry["value_format"] == "avro-confluent"
        readers[entry["version"]] = fastavro.parse_schema(json.loads(entry["value_schema"]))
    return readers


def _sink(servers: str, prefix: str, registry: SchemaRegistryServer, **options: Any) -> KafkaSink:
    return KafkaSink(servers, topic_prefix=prefix,
                     schema_registry=SchemaRegistry(registry.url, **options))


def test_every_record_reads_back_through_the_registry_across_an_alter(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str,
        schema_registry: SchemaRegistryServer) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY, name text, amount numeric(10,2), "
                    "big int8, ratio float8, flag bool, raw bytea, at timestamptz, tags text[])")
    sink = _sink(kafka_servers, topic_prefix, schema_registry)
    pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.t"]), sink)
    pipeline.prepare()
    pg_conn.execute("INSERT INTO t VALUES (1, 'one', 12.50, 9007199254740993, 0.25, true, "
                    "'\\x00ff', '2024-02-29 12:34:56.789+00', '{a,\"b c\"}'), "
                    "(2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)")
    pg_conn.execute("UPDATE t SET name = 'uno', amount = -0.01 WHERE id = 1")
    pg_conn.execute("ALTER TABLE t ADD COLUMN extra int")
    pg_conn.execute("INSERT INTO t (id, name, extra) VALUES (3, 'três', 42)")
    pg_conn.execute("DELETE FROM t WHERE id = 2")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    sink.close()

    topic = topic_name(topic_prefix, "public", "t")
    topics = _Topic(kafka_servers, schema_registry.url)
    records = topics.read(topic)
    values = [(key, value) for key, value, _ in records if value is not None]
    assert [(v["op"], k["id"]) for k, v in values] == [("c", 1), ("c", 2), ("u", 1), ("c", 3),
                                                       ("d", 2)]
    assert [r for _, v, r in records if v is None][0].key() == records[-2][2].key()  # tombstone
    first = values[0][1]["after"]
    assert first == {"id": 1, "name": "one", "amount": "12.50", "big": 9007199254740993,
                     "ratio": 0.25, "flag": True, "raw": b"\x00\xff",
                     "at": first["at"], "tags": first["tags"]}
    assert first["at"].startswith("2024-02-29T12:34:56.789")
    assert json.loads(first["tags"]) == ["a", "b c"]
    assert values[1][1]["after"] == dict.fromkeys(first, None) | {"id": 2}
    assert values[2][1]["after"]["name"] == "uno" and values[2][1]["after"]["amount"] == "-0.01"
    after_alter = values[3][1]["after"]
    assert after_alter["extra"] == 42 and after_alter["name"] == "três"
    assert "extra" not in values[2][1]["after"]
    assert values[4][1]["before"]["id"] == 2 and values[4][1]["after"] is None

    # the subjects by topic name; the value schema has a version per table version, the key
    # schema (unchanged by the ALTER) one
    assert topics.versions(f"{topic}-value") == [1, 2]
    assert topics.versions(f"{topic}-key") == [1]
    latest = topics.client.get_latest_version(f"{topic}-value")
    assert _schema_id(records[-2][2].value()) == latest.schema_id
    assert _schema_id(records[0][2].value()) != latest.schema_id
    assert {_schema_id(r.key()) for _, _, r in records} == {
        topics.client.get_latest_version(f"{topic}-key").schema_id}
    # the same records through pgcdc's catalog topic: the registered schema is the writer's
    readers = _catalog_readers(topics, topic_prefix)
    for _, value, record in records:
        if value is not None:
            version = dict(record.headers())["pgcdc.table_version"].decode()
            assert dict(record.headers())["pgcdc.format"] == b"avro-confluent"
            decoded = fastavro.schemaless_reader(io.BytesIO(record.value()[5:]),
                                                 readers[version], None)
            assert decoded == value


def _run_cli(dsn: str, servers: str, prefix: str, registry_url: str, tmp: Path,
             *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgcdc", "run", "--dsn", dsn, "--tables", "public.u",
         "--bootstrap-servers", servers, "--topic-prefix", prefix,
         "--schema-registry-url", registry_url, "--progress-file", str(tmp / "p.json"),
         "--catalog-dir", str(tmp / "catalog"), "--load-state", str(tmp / "load.json"),
         "--exit-when-caught-up", *extra], capture_output=True, text=True, timeout=180,
        check=False)


def test_a_refused_schema_stops_with_the_subject_and_the_slot_stays(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str,
        schema_registry: SchemaRegistryServer, tmp_path: Path) -> None:
    """The initial load (its compiled path) and the stream in the wire format; a retype the
    subject's BACKWARD rule refuses stops ``pgcdc run`` (exit 3) naming the subject and the
    registry's reason, before any record of it; with the rule relaxed the same command
    resumes."""
    from sinks.loadfast import FastLoad

    eligible = _sink(kafka_servers, topic_prefix, schema_registry)
    assert FastLoad.for_sink(eligible) is not None, "the load would not take the compiled path"
    eligible.close()
    pg_conn.execute("CREATE TABLE u (id int PRIMARY KEY, v int)")
    pg_conn.execute("INSERT INTO u SELECT g, g * 10 FROM generate_series(1, 50) g")
    loaded = _run_cli(pg_dsn, kafka_servers, topic_prefix, schema_registry.url, tmp_path,
                      "--initial-load", "--workers", "0")
    assert loaded.returncode == 0, loaded.stderr
    pg_conn.execute("INSERT INTO u VALUES (51, 510)")
    streamed = _run_cli(pg_dsn, kafka_servers, topic_prefix, schema_registry.url, tmp_path)
    assert streamed.returncode == 0, streamed.stderr
    topic = topic_name(topic_prefix, "public", "u")
    topics = _Topic(kafka_servers, schema_registry.url)
    rows = {key["id"]: value["after"]["v"] for key, value, _ in topics.read(topic)}
    assert rows == {i: i * 10 for i in range(1, 52)}
    delivered = current_wal_lsn(pg_conn)

    subject = f"{topic}-value"
    topics.client.set_compatibility(subject_name=subject, level="BACKWARD")
    pg_conn.execute("ALTER TABLE u ALTER COLUMN v TYPE text")
    pg_conn.execute("INSERT INTO u VALUES (52, 'fifty-two')")
    refused = _run_cli(pg_dsn, kafka_servers, topic_prefix, schema_registry.url, tmp_path)
    assert refused.returncode == 3, refused.stderr
    assert f"refused the new schema of subject '{subject}' (HTTP 409)" in refused.stderr
    # the registry's own message (Apicurio's words) is passed on
    assert "Incompatible artifact: " + subject in refused.stderr, refused.stderr
    assert "--topic-prefix" in refused.stderr and "compatibility" in refused.stderr
    info = slot_info(pg_conn, "pgcdc")
    assert info is not None and info.confirmed_flush_lsn is not None
    assert info.confirmed_flush_lsn <= delivered
    assert len(topics.raw(topic)) == 51  # nothing of the refused version
    assert topics.versions(subject) == [1]

    topics.client.set_compatibility(subject_name=subject, level="NONE")
    resumed = _run_cli(pg_dsn, kafka_servers, topic_prefix, schema_registry.url, tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    last = topics.read(topic)[-1][1]
    assert last is not None and last["after"] == {"id": 52, "v": "fifty-two"}
    assert topics.versions(subject) == [1, 2]


def test_a_frozen_registry_is_retried_and_delivery_resumes(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str,
        schema_registry: SchemaRegistryServer) -> None:
    pg_conn.execute("CREATE TABLE w (id int PRIMARY KEY)")
    sink = _sink(kafka_servers, topic_prefix, schema_registry, timeout=1.0)
    pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.w"], status_interval=0.2,
                                       retry_max_delay=1.0), sink)
    pipeline.prepare()
    pg_conn.execute("INSERT INTO w VALUES (1)")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    delivered = current_wal_lsn(pg_conn)
    schema_registry.pause()
    try:
        pg_conn.execute("ALTER TABLE w ADD COLUMN v text")
        pg_conn.execute("INSERT INTO w VALUES (2, 'two')")
        end = current_wal_lsn(pg_conn)
        with running(pipeline):
            wait(lambda: pipeline.progress.errors.get("RegistryUnavailableError", 0) >= 2,
                 what="two failed registrations")
            info = slot_info(pg_conn, "pgcdc")
            assert info is not None and info.confirmed_flush_lsn is not None
            assert info.confirmed_flush_lsn <= delivered
            schema_registry.resume()
            wait(lambda: pipeline.progress.durable_lsn >= end, what="delivery after the pause")
    finally:
        schema_registry.resume()
        sink.close()
    topic = topic_name(topic_prefix, "public", "w")
    topics = _Topic(kafka_servers, schema_registry.url)
    assert [value["after"] for _, value, _ in topics.read(topic) if value is not None] == [
        {"id": 1}, {"id": 2, "v": "two"}]
    assert topics.versions(f"{topic}-value") == [1, 2]


def test_exactly_once_in_the_wire_format(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str,
        schema_registry: SchemaRegistryServer) -> None:
    """--exactly-once with a registry: the table versions are registered before the Kafka
    transaction that carries their records; a read_committed consumer decodes them."""
    from sinks.kafka_txn import TransactionalKafkaSink

    pg_conn.execute("CREATE TABLE x (id int PRIMARY KEY, v text)")
    sink = TransactionalKafkaSink(kafka_servers, slot="pgcdc", topic_prefix=topic_prefix,
                                  commit_interval_ms=200,
                                  schema_registry=SchemaRegistry(schema_registry.url))
    pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.x"]), sink)
    pipeline.prepare()
    pg_conn.execute("INSERT INTO x VALUES (1, 'one'), (2, 'two')")
    pg_conn.execute("ALTER TABLE x ADD COLUMN w int")
    pg_conn.execute("UPDATE x SET w = id * 2")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    sink.close()
    topic = topic_name(topic_prefix, "public", "x")
    topics = _Topic(kafka_servers, schema_registry.url)
    consumer = Consumer({"bootstrap.servers": kafka_servers, "group.id": "registry-txn",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        values: list[Any] = []
        deadline = time.monotonic() + 60
        while len(values) < 4:
            assert time.monotonic() < deadline, values
            message = consumer.poll(1.0)
            if message is not None and message.error() is None and message.value():
                values.append(topics.deserialize(message.value(), SerializationContext(
                    topic, MessageField.VALUE)))
    finally:
        consumer.close()
    assert [v["after"] for v in values] == [{"id": 1, "v": "one"}, {"id": 2, "v": "two"},
                                            {"id": 1, "v": "one", "w": 2},
                                            {"id": 2, "v": "two", "w": 4}]
    assert topics.versions(f"{topic}-value") == [1, 2]


def test_tls_with_the_registrys_ca(schema_registry: SchemaRegistryServer) -> None:
    assert schema_registry.ca is not None
    SchemaRegistry(schema_registry.tls_url, ca=schema_registry.ca).check()
    with pytest.raises(RegistryRefusedError, match="--schema-registry-ca"):
        SchemaRegistry(schema_registry.tls_url).check()
    with pytest.raises(RegistryRefusedError, match="/apis/ccompat/v7"):
        SchemaRegistry(schema_registry.url.removesuffix("/apis/ccompat/v7")).check()


class _BasicAuthGate:
    """An HTTP front of the registry that wants one user and password (Apicurio's own
    authentication needs an OpenID Connect server): a request with them is passed on, any
    other answered 401."""

    def __init__(self, upstream: str, user: str, password: str) -> None:
        expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.seen: list[str | None] = []
        seen = self.seen

        class Handler(http.server.BaseHTTPRequestHandler):
            def _relay(self) -> None:
                seen.append(self.headers.get("Authorization"))
                if self.headers.get("Authorization") != expected:
                    self._answer(401, b'{"error_code":401,"message":"Unauthorized"}')
                    return
                length = int(self.headers.get("Content-Length") or 0)
                request = urllib.request.Request(
                    upstream + self.path, data=self.rfile.read(length) if length else None,
                    method=self.command, headers={"Content-Type": self.headers.get(
                        "Content-Type", "application/json")})
                try:
                    with urllib.request.urlopen(request, timeout=10) as answer:
                        self._answer(answer.status, answer.read())
                except urllib.error.HTTPError as exc:
                    self._answer(exc.code, exc.read())

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = _relay

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_basic_auth_user_and_password(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str,
        schema_registry: SchemaRegistryServer) -> None:
    secret = "pa55:w@rd"  # a colon and an at sign: quoted in the URL form
    origin = schema_registry.url.removesuffix("/apis/ccompat/v7")
    gate = _BasicAuthGate(origin, "cdc", secret)
    base = f"127.0.0.1:{gate.port}/apis/ccompat/v7"
    try:
        pg_conn.execute("CREATE TABLE a (id int PRIMARY KEY)")
        sink = KafkaSink(kafka_servers, topic_prefix=topic_prefix, schema_registry=SchemaRegistry(
            f"http://{base}", user="cdc", password=secret))
        pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.a"]), sink)
        pipeline.prepare()
        pg_conn.execute("INSERT INTO a VALUES (1)")
        pipeline.run(until_lsn=current_wal_lsn(pg_conn))
        sink.close()
        topic = topic_name(topic_prefix, "public", "a")
        assert _Topic(kafka_servers, schema_registry.url).versions(f"{topic}-value") == [1]
        quoted = urllib.parse.quote(secret, safe="")
        SchemaRegistry(f"http://cdc:{quoted}@{base}").check()
        assert set(gate.seen) == {"Basic " + base64.b64encode(f"cdc:{secret}".encode()).decode()}
        with pytest.raises(RegistryRefusedError, match="refused the login") as caught:
            SchemaRegistry(f"http://cdc:wrong@{base}").check()
        assert "wrong" not in str(caught.value) and secret not in str(caught.value)
    finally:
        gate.close()


@pytest.mark.spark
def test_the_spark_job_reads_the_wire_format(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, spark: Any,
        schema_registry: SchemaRegistryServer, tmp_path: Path) -> None:
    from pgcdc.clone import compare

    pg_conn.execute("CREATE TABLE s (id int PRIMARY KEY, amount numeric(12,3), at timestamptz, "
                    "note text, raw bytea)")
    # first without a registry (plain Avro), then with it: the topic holds both, and the job
    # tells them apart by each record's pgcdc.format header
    plain = KafkaSink(kafka_servers, topic_prefix=topic_prefix)
    pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.s"]), plain)
    pipeline.prepare()
    pg_conn.execute("INSERT INTO s SELECT g, g * 1.125, '2024-01-01'::timestamptz + g * "
                    "interval '1 hour', 'n' || g, decode(lpad(to_hex(g), 2, '0'), 'hex') "
                    "FROM generate_series(1, 40) g")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    plain.close()
    sink = _sink(kafka_servers, topic_prefix, schema_registry)
    pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.s"]), sink)
    pg_conn.execute("UPDATE s SET note = NULL, amount = amount * 2 WHERE id % 3 = 0")
    pg_conn.execute("DELETE FROM s WHERE id % 7 = 0")
    pg_conn.execute("ALTER TABLE s ADD COLUMN extra text")
    pg_conn.execute("UPDATE s SET extra = 'x' || id WHERE id % 2 = 0")
    pg_conn.execute("INSERT INTO s VALUES (100, 1.5, NULL, 'late', NULL, 'e')")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    sink.close()
    lake, checkpoint = (tmp_path / "lake").as_uri(), (tmp_path / "cp").as_uri()
    assert cli.main(["spark", "--bootstrap-servers", kafka_servers, "--topic-prefix",
                     topic_prefix, "--lake", lake, "--checkpoint", checkpoint,
                     "--available-now", "--spark-log", str(tmp_path / "spark.log")]) == 0
    config = job.JobConfig(kafka_servers, lake, checkpoint, topic_prefix=topic_prefix)
    tables = job.read_catalog(spark, config).tables()
    assert [spec.name for spec in tables] == ["s"]
    results = compare(pg_conn, spark, lake, tables)
    assert all(result.equal for result in results), results
    formats = {dict(r.headers())["pgcdc.format"] for r in _Topic(
        kafka_servers, schema_registry.url).raw(topic_name(topic_prefix, "public", "s"))}
    assert formats == {b"avro", b"avro-confluent"}
    assert spark.read.format("delta").load(f"{lake}/public.s").count() == 36
    assert Decimal(str(spark.read.format("delta").load(f"{lake}/public.s")
                       .where("id = 100").first()["amount"])) == Decimal("1.5")


def test_an_unreachable_registry_at_start_is_transient(
        kafka_servers: str, topic_prefix: str) -> None:
    from pgcdc.services.ports import free_port

    with pytest.raises(RegistryUnavailableError, match="cannot reach the schema registry"):
        KafkaSink(kafka_servers, topic_prefix=topic_prefix, schema_registry=SchemaRegistry(
            f"http://127.0.0.1:{free_port()}/apis/ccompat/v7", timeout=2))
