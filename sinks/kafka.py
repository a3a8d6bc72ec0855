"""The Kafka sink: one topic per table, keyed by primary key, idempotent producer, acks=all.

Topics: ``<prefix>.<schema>.<table>`` for changes (a name with characters a topic name
cannot hold gets a digest of its own, see :func:`core.wire.topic_name`) (Avro by default, one writer
schema per table version, see sinks/avro.py; or the Debezium JSON envelope,
sinks/envelope.py), each delete followed by a tombstone (null value) unless
disabled; ``<prefix>._catalog`` for table versions; ``<prefix>._catalog_history`` for the
catalog's change log (every version, by LSN); ``<prefix>._messages`` for
logical decoding messages; optionally ``<prefix>._transactions`` with BEGIN and
END events (per-table counts), as Debezium's transaction metadata.

Durable means acknowledged by every in-sync replica (``acks=all``) of an
idempotent producer.  Delivery reports arrive on :meth:`KafkaSink.poll`; the
:class:`~sinks.acks.AckTracker` turns them into a durable LSN in commit order.
The first failed delivery is kept and raised by :meth:`KafkaSink.durable_lsn`,
after which nothing more becomes durable, so the slot never passes a message
that might be lost (a "possibly persisted" one included).

Table definitions go to the catalog topic ``<prefix>._catalog`` and are
flushed synchronously before the first event of that version is produced, so
a consumer always finds the version an event names.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from core import failpoints, wire
from core.errors import ConfigError, TerminalError, TransientError
from core.wire import (
    FORMAT_HEADER,
    MESSAGE_COMMIT_LSN,
    MESSAGE_CONTENT,
    MESSAGE_LSN,
    MESSAGE_PREFIX,
    MESSAGE_TRANSACTIONAL,
    MESSAGE_XID,
    MESSAGES_SUFFIX,
    TABLE_VERSION_HEADER,
    TRANSACTIONS_SUFFIX,
    TXN_DATA_COLLECTION,
    TXN_DATA_COLLECTIONS,
    TXN_EVENT_COUNT,
    TXN_ID,
    TXN_STATUS,
    TXN_TS_MS,
    catalog_history_topic,
    catalog_key,
    catalog_topic,
    topic_name,
)
from decoder.change import ChangeEvent
from decoder.pgoutput import LogicalMessage
from sinks.acks import AckTracker, DeliveryError
from sinks.avro import AvroEncoder
from sinks.avro_logical import LogicalTypes
from sinks.debezium_json import PGCDC_JSON, JsonOptions
from sinks.envelope import JsonEncoder
from sinks.registry import RegistryAvroEncoder, SchemaRegistry
from snapshot_builder.catalog import TableVersion

log = logging.getLogger(__name__)

_SLICE = 0.5  # seconds: a wait for Kafka looks at the stop this often (KafkaSink._wait)
# a broker that cannot be reached (not a refusal): transient, like a delivery timing out
_UNREACHABLE = (KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN,
                KafkaError.REQUEST_TIMED_OUT, KafkaError.NOT_CONTROLLER)


class Encoder(Protocol):
    format: str

    def schemas(self, table: TableVersion) -> dict[str, str]: ...

    def key(self, event: ChangeEvent) -> bytes: ...

    def value(self, event: ChangeEvent, *, server_name: str, now_ms: int) -> bytes: ...

    def encode(self, event: ChangeEvent, *, server_name: str,
               now_ms: int) -> tuple[bytes, bytes]: ...

    def encoder_for(self, table: TableVersion,
                    server_name: str) -> Callable[[ChangeEvent, int], tuple[bytes, bytes]]: ...


_Route = tuple[TableVersion, str, list[tuple[str, str | bytes | None]],
               Callable[[ChangeEvent, int], tuple[bytes, bytes]]]
"""A table version, its topic, its events' headers and their encoder."""


def catalog_record(table: TableVersion, lsn: int, topic: str, encoder: Encoder) -> bytes:
    """The catalog record of a table version (core/wire.py): its ``to_dict``, the LSN it
    was published at, its events' topic and format, and the encoder's writer schemas."""
    value = {**table.to_dict(), wire.CATALOG_LSN: lsn, wire.CATALOG_TOPIC: topic,
             wire.CATALOG_VALUE_FORMAT: encoder.format, **encoder.schemas(table)}
    return json.dumps(value, separators=(",", ":")).encode()


def _encoder(value_format: str, json_options: JsonOptions | None,
             registry: SchemaRegistry | None = None,
             logical: LogicalTypes | None = None) -> Encoder:
    if logical is not None and value_format != "avro":
        msg = f"--avro-types logical goes with --format avro, not {value_format}"
        raise ConfigError(msg)
    if registry is not None:
        if value_format != "avro":
            msg = (f"a schema registry (--schema-registry-url) goes with --format avro, not "
                   f"{value_format}: the registry holds Avro schemas")
            raise ConfigError(msg)
        return RegistryAvroEncoder(registry, logical=logical)
    if value_format == "avro":
        return AvroEncoder(logical=logical)
    if value_format == "json":
        return JsonEncoder(PGCDC_JSON if json_options is None else json_options)
    msg = f"unknown value format {value_format!r}: choose avro or json"
    raise ConfigError(msg)


LIBRDKAFKA = logging.getLogger("librdkafka")
"""The logger of librdkafka's own lines (the client's ``logger`` property)."""


def _client_error(err: KafkaError) -> None:
    """librdkafka's error callback: a fatal error is logged as one (the next produce or
    delivery raises it too); the others (a broker unreachable, a request timed out) are
    retried by the client itself and logged at INFO: pgcdc's stall warning
    (pgcdc/sink_watch.py) is the one line an operator needs."""
    if err.fatal():
        log.error("kafka client: fatal error %s", err.str())
    else:
        log.info("kafka client: %s", err.str())


class KafkaUnreachableError(TransientError):
    def __init__(self, servers: str, detail: str) -> None:
        super().__init__(
            f"cannot reach Kafka at {servers}: {detail}; check that the brokers run and that "
            "--bootstrap-servers (PGCDC_BOOTSTRAP_SERVERS) names them"
        )


class KafkaSinkError(TerminalError):
    pass


def _quoted(schema: str, table: str) -> str:
    """``schema.table`` as SQL writes it (quoted where needed), for a message."""
    return ".".join(part if re.fullmatch(r"[a-z_][a-z0-9_]*", part)
                    else '"' + part.replace('"', '""') + '"' for part in (schema, table))


class KafkaSink:
    def __init__(self, bootstrap_servers: str, *, topic_prefix: str = "pgcdc",
                 partitions: int = 1, replication_factor: int = 1,
                 value_format: str = "avro", tombstones: bool = True,
                 transaction_topic: bool = False,
                 producer_config: dict[str, Any] | None = None,
                 client_config: dict[str, str] | None = None,
                 json_options: JsonOptions | None = None,
                 schema_registry: SchemaRegistry | None = None,
                 logical: LogicalTypes | None = None) -> None:
        # json_options: how value_format json writes values (sinks/debezium_json.py);
        # None is pgcdc's own encoding, which pgcdc's Spark job reads; schema_registry:
        # Avro in the Confluent wire format, schemas registered there (sinks/registry.py);
        # logical: typed Avro (--avro-types logical, sinks/avro_logical.py)
        self.bootstrap_servers = bootstrap_servers
        self.prefix = topic_prefix
        self.partitions = partitions
        self.replication_factor = replication_factor
        self.tombstones = tombstones
        self.encoder: Encoder = _encoder(value_format, json_options, schema_registry, logical)
        self.logical = logical  # its ``catalog``: the pipeline's types (a composite's attributes)
        self._format_header = (FORMAT_HEADER, self.encoder.format.encode())
        # client_config: security and connection properties (sink.kafka) for every client
        base: dict[str, str | int | float | bool] = {**(client_config or {}),
                                                     "bootstrap.servers": bootstrap_servers}
        refused: list[KafkaError] = []  # a failed login or TLS handshake, seen by error_cb

        def client_error(err: KafkaError) -> None:
            if err.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL):
                refused.append(err)

        # librdkafka's own log lines go through Python logging (so --log-format json covers
        # them), served by poll(); its errors too (_client_error)
        admin_config: dict[str, Any] = {**base, "error_cb": client_error, "logger": LIBRDKAFKA}
        self._admin = AdminClient(admin_config)
        try:
            self._check_reachable()
        except KafkaUnreachableError:
            self._admin.poll(0)  # serves error_cb
            if not refused:
                raise
            what = ("refused the login (check sink.kafka's sasl.mechanism, sasl.username and "
                    "sasl.password / PGCDC_KAFKA_SASL_PASSWORD)"
                    if refused[0].code() == KafkaError._AUTHENTICATION else
                    "failed the TLS handshake (check sink.kafka's ssl.ca.location: the CA "
                    "that signed the broker's certificate, and the broker's address)")
            msg = f"Kafka at {bootstrap_servers} {what}: {refused[0].str()}"
            raise KafkaSinkError(msg) from None
        config: dict[str, Any] = {
            **base,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 200_000,
            "message.timeout.ms": 120_000,
            "logger": LIBRDKAFKA,
            "error_cb": _client_error,
        }
        config.update(producer_config or {})
        self._producer_config = config
        self._producer = Producer(config)
        self._tracker = AckTracker()
        self._on_delivery: Callable[[KafkaError | None, object], None] | None = None
        self._on_delivery_handle: object = None
        self._topics: set[str] = set()
        self._partitions: dict[str, int] = {}  # partitions of the topics known, by name
        self._published: set[tuple[int, str]] = set()
        # versions whose publication failed (a delivery error: the pipeline retried), with
        # their LSN: published before their first event
        self._unpublished: dict[tuple[int, str], int] = {}
        self._table_topics: dict[int, str] = {}
        self._topic_names: dict[str, tuple[str, str]] = {}  # the one table name a topic holds
        # the topic, headers and encoder of each table version's events, by the id of its
        # TableVersion
        self._routes: dict[int, _Route] = {}
        self._stop: threading.Event | None = None  # stop_waiting_on
        self._waiting_since: float | None = None  # time.monotonic() when _wait began
        # seconds a table version or a new topic waits for Kafka before it counts as a
        # failed delivery (DeliveryError: the pipeline resets the sink and retries)
        self.request_timeout = 60.0
        self.catalog_topic = catalog_topic(topic_prefix)
        self._ensure_topic(self.catalog_topic, partitions=1, compact=True)
        self.messages_topic = f"{topic_prefix}.{MESSAGES_SUFFIX}"
        self.catalog_history_topic = catalog_history_topic(topic_prefix)
        self.transaction_topic = (f"{topic_prefix}.{TRANSACTIONS_SUFFIX}"
                                  if transaction_topic else None)
        self._txn_counts: dict[str, int] = {}
        self._txn_id: str | None = None
        self._txn_start = 0
        if schema_registry is not None:
            schema_registry.check()  # reachable, the login accepted, the API found

    # --- Sink protocol --------------------------------------------------------------------

    def publish_table(self, table: TableVersion, lsn: int) -> None:
        key = (table.oid, table.version)
        if key in self._published:
            return
        self._unpublished[key] = lsn
        topic = topic_name(self.prefix, table.schema, table.name)
        names = self._topic_names.setdefault(topic, (table.schema, table.name))
        if names != (table.schema, table.name):  # never: only if 128 bits of SHA-256 collide
            msg = (f"tables {_quoted(*names)} and {_quoted(table.schema, table.name)} would "
                   f"share the Kafka topic {topic} (their names' digests collide); rename one "
                   "of them")
            raise KafkaSinkError(msg)
        if isinstance(self.encoder, RegistryAvroEncoder):  # ids before anything names them
            self.encoder.register(table, topic)
        if table.keyless:  # its changes in one partition, in order (streaming/multiset.py)
            self._table_topics[table.oid] = self._ensure_topic(topic, partitions=1)
            self._check_one_partition(topic, table)
        else:
            self._table_topics[table.oid] = self._ensure_topic(topic, partitions=self.partitions)
        self._routes.clear()  # a table's topic may have changed (a rename)
        errors: list[KafkaError] = []
        producer = self._sync_producer()
        producer.produce(
            self.catalog_topic,
            key=catalog_key(table.oid, table.version),
            value=catalog_record(table, lsn, self._table_topics[table.oid], self.encoder),
            on_delivery=lambda err, _msg: errors.append(err) if err is not None else None,
        )
        what = f"table version {table.qualified_name}@{table.version}"
        remaining = self._wait(what, lambda: producer.flush(_SLICE))
        if remaining or errors:
            detail = errors[0] if errors else \
                f"{remaining} messages still queued after {self.request_timeout:g} s"
            msg = f"could not publish {what}: {detail}"
            raise DeliveryError(msg)
        self._published.add(key)
        del self._unpublished[key]

    def stop_waiting_on(self, stop: threading.Event) -> None:
        """A call that waits for Kafka (a table version, a topic) gives up as soon as
        ``stop`` is set (SIGTERM, the WAL-retention guard), raising DeliveryError, instead of
        holding the stop until the broker answers or ``request_timeout`` ends."""
        self._stop = stop

    def _wait(self, what: str, step: Callable[[], int]) -> int:
        """Call ``step`` (one short wait, returning what is still waited for: 0 when done)
        until done, ``request_timeout`` seconds have passed, or the stop is set."""
        self._waiting_since = time.monotonic()  # counts as unacknowledged meanwhile
        deadline = self._waiting_since + self.request_timeout
        try:
            while True:
                remaining = step()
                if not remaining or time.monotonic() >= deadline:
                    return remaining
                if self._stop is not None and self._stop.is_set():
                    msg = (f"stopping while waiting for Kafka at {self.bootstrap_servers} "
                           f"({what})")
                    raise DeliveryError(msg)
        finally:
            self._waiting_since = None

    def publish_catalog(self, version: int, lsn: int, entry: str) -> None:
        """The catalog history, one record per version (key: the version number), in
        ``<prefix>._catalog_history``; a consumer replays it into a CatalogHistory."""
        if self.catalog_history_topic not in self._topics:
            self._ensure_topic(self.catalog_history_topic, partitions=1, compact=True)
        self._produce(self.catalog_history_topic, str(version).encode(), entry.encode(), [])

    def write(self, event: ChangeEvent) -> None:
        table = event.table
        route = self._routes.get(id(table))
        if route is None or route[0] is not table:  # (the entry keeps its id from reuse)
            route = self._route(table)
        _, topic, headers, encode = route
        now_ms = int(time.time() * 1000)
        if self.transaction_topic is not None:
            self._count_in_transaction(event, topic, now_ms)
        key, value = encode(event, now_ms)
        self._produce(topic, key, value, headers)
        if event.op == "d" and self.tombstones:
            self._produce(topic, key, None, headers)  # lets a compacted topic drop the key

    def route(self, table: TableVersion) -> tuple[str, list[tuple[str, str | bytes | None]]]:
        """The topic and the headers of a published table version's events, as :meth:`write`
        sends them: for a producer of its own beside the sink's (sinks/loadfast.py)."""
        _, topic, headers, _ = self._route(table)
        return topic, headers

    @property
    def producer_config(self) -> dict[str, Any]:
        """The settings of the sink's producer (a copy): for a producer of its own beside it
        that partitions and acknowledges alike (sinks/loadfast.py)."""
        return dict(self._producer_config)

    def _route(self, table: TableVersion) -> _Route:
        """The topic, headers and encoder of a table version's events (cached by ``write``)."""
        unpublished = self._unpublished.get((table.oid, table.version))
        if unpublished is not None:  # its publication failed, and the pipeline retried since
            self.publish_table(table, unpublished)
        topic = self._table_topics.get(table.oid)
        if topic is None:
            msg = f"event for {table.qualified_name} before its table version was published"
            raise KafkaSinkError(msg)
        route = self._routes[id(table)] = (
            table, topic, [(TABLE_VERSION_HEADER, table.version.encode()), self._format_header],
            self.encoder.encoder_for(table, self.prefix))
        return route

    def write_message(self, message: LogicalMessage, *, lsn: int, commit_lsn: int | None,
                      xid: int | None) -> None:
        """A logical decoding message (pg_logical_emit_message) to ``<prefix>._messages``."""
        if self.messages_topic not in self._topics:
            self._ensure_topic(self.messages_topic, partitions=1)
        value = {MESSAGE_PREFIX: message.prefix, MESSAGE_TRANSACTIONAL: message.transactional,
                 MESSAGE_CONTENT: base64.b64encode(message.content).decode("ascii"),
                 MESSAGE_LSN: lsn, MESSAGE_COMMIT_LSN: commit_lsn, MESSAGE_XID: xid}
        self._produce(self.messages_topic, message.prefix.encode(),
                      json.dumps(value, separators=(",", ":")).encode(), [])

    def _produce(self, topic: str, key: bytes, value: bytes | None,
                 headers: list[tuple[str, str | bytes | None]]) -> None:
        handle = self._tracker.sent()
        delivered = self._on_delivery
        if delivered is None or self._on_delivery_handle is not handle:
            # one callback per source transaction (a handle), not one per message
            tracker = self._tracker

            def delivered(err: KafkaError | None, _msg: object) -> None:
                if err is None:
                    failpoints.hit("before_delivery_ack")
                    tracker.acked(handle)
                    failpoints.hit("after_delivery_ack")
                else:
                    tracker.failed(KafkaException(err))

            self._on_delivery, self._on_delivery_handle = delivered, handle
        while True:
            try:
                # positional (topic, value, key, partition, callback, on_delivery, timestamp,
                # headers): keyword matching costs more than the call itself; partition -1 is
                # the configured partitioner, timestamp 0 the current time
                self._producer.produce(topic, value, key, -1, delivered, None, 0, headers)
                failpoints.hit("after_produce")
                return
            except BufferError:
                self._producer.poll(0.05)
            except KafkaException as exc:  # e.g. a fatal idempotent-producer error
                raise self._producer_failed(exc) from exc

    def _sync_producer(self) -> Producer:
        """The producer of the records flushed at once (table versions)."""
        return self._producer

    def _producer_failed(self, exc: KafkaException) -> Exception:
        """The error to raise when ``produce`` itself fails."""
        return DeliveryError(f"kafka producer failed: {exc.args[0]}")

    # --- transaction metadata -------------------------------------------------------------

    def _count_in_transaction(self, event: ChangeEvent, topic: str, now_ms: int) -> None:
        assert self.transaction_topic is not None
        txn_id = f"{event.xid}:{event.commit_lsn}"
        if self._txn_id != txn_id:
            if self.transaction_topic not in self._topics:
                self._ensure_topic(self.transaction_topic, partitions=1)
            self._txn_id, self._txn_counts, self._txn_start = txn_id, {}, now_ms
            self._transaction_event("BEGIN", now_ms)
        name = f"{event.table.schema}.{event.table.name}"
        self._txn_counts[name] = self._txn_counts.get(name, 0) + 1

    def _transaction_event(self, status: str, now_ms: int) -> None:
        """Debezium's transaction metadata: BEGIN, then END with per-table event counts."""
        assert self.transaction_topic is not None and self._txn_id is not None
        value: dict[str, Any] = {TXN_STATUS: status, TXN_ID: self._txn_id, TXN_TS_MS: now_ms}
        if status == "END":
            value[TXN_EVENT_COUNT] = sum(self._txn_counts.values())
            value[TXN_DATA_COLLECTIONS] = [{TXN_DATA_COLLECTION: name, TXN_EVENT_COUNT: count}
                                           for name, count in self._txn_counts.items()]
        self._produce(self.transaction_topic, self._txn_id.encode(),
                      json.dumps(value, separators=(",", ":")).encode(), [])

    def end_transaction(self, end_lsn: int) -> None:
        if self.transaction_topic is not None and self._txn_id is not None:
            self._transaction_event("END", int(time.time() * 1000))
            self._txn_id = None
        self._tracker.end_transaction(end_lsn)

    def durable_lsn(self) -> int | None:
        return self._tracker.durable_lsn()

    def in_flight(self) -> int:
        return self._tracker.in_flight()

    def poll(self, timeout: float = 0.0) -> None:
        self._producer.poll(timeout)
        self._admin.poll(0)  # its log lines (LIBRDKAFKA)

    def unacknowledged_for(self) -> float:
        """Seconds the producer has held messages without an acknowledgement (sinks/acks.py
        AcknowledgementClock; read by the pipeline's stall watch, from its thread), or has
        waited for a table version or a topic, if longer: a stall all the same."""
        waited = self._tracker.unacknowledged_for()
        since = self._waiting_since
        return waited if since is None else max(waited, time.monotonic() - since)

    def flush(self, timeout: float) -> None:
        self._producer.flush(timeout)

    def reset(self) -> None:
        """Drop the producer and whatever it still holds; a new one starts clean.

        A message the old producer could not confirm may still have been written
        ("possibly persisted"); it is sent again, and consumers de-duplicate on
        ``(commit_lsn, ordinal)``.
        """
        self._producer.purge()
        self._producer.flush(5)
        self._producer = Producer(self._producer_config)
        self._tracker = AckTracker()
        self._on_delivery = None
        self._on_delivery_handle = None
        log.warning("kafka producer recreated; resending from the durable position")

    def close(self) -> None:
        """Flush, then let the clients go (librdkafka stops its threads and connections)."""
        if not hasattr(self, "_producer"):
            return  # closed already
        self._producer.flush(30)
        del self._producer
        del self._admin

    # --- topics ---------------------------------------------------------------------------

    def _check_reachable(self) -> None:
        try:
            self._admin.list_topics(timeout=10)
        except KafkaException as exc:
            raise KafkaUnreachableError(self.bootstrap_servers, str(exc.args[0])) from exc

    def _check_one_partition(self, topic: str, table: TableVersion) -> None:
        """A keyless table's topic (maybe made by hand, or when the table had a key) must
        have one partition: the Spark job applies its changes as a multiset, in order."""
        count = self._partitions.get(topic)
        if count is None:
            try:
                found = self._admin.list_topics(topic, timeout=self.request_timeout)
            except KafkaException as exc:
                raise KafkaUnreachableError(self.bootstrap_servers, str(exc.args[0])) from exc
            metadata = found.topics.get(topic)
            count = 0 if metadata is None or metadata.error else len(metadata.partitions)
            if count:
                self._partitions[topic] = count
        if count > 1:
            msg = (f"topic {topic} of table {_quoted(table.schema, table.name)} has {count} "
                   "partitions, and the table has no key (REPLICA IDENTITY FULL or no key "
                   "column): its changes must stay in one partition, in order, for the lake "
                   "to apply them as a multiset. Give the table a primary key (ALTER TABLE "
                   "... ADD PRIMARY KEY; REPLICA IDENTITY DEFAULT), or delete the topic: "
                   "pgcdc creates a keyless table's topic with one partition")
            raise KafkaSinkError(msg)

    def _ensure_topic(self, name: str, *, partitions: int, compact: bool = False) -> str:
        if name in self._topics:
            return name
        config = {"cleanup.policy": "compact"} if compact else {}
        timeout = self.request_timeout
        futures = self._admin.create_topics(
            [NewTopic(name, num_partitions=partitions,
                      replication_factor=self.replication_factor, config=config)],
            operation_timeout=timeout / 2, request_timeout=timeout,
        )
        future = futures[name]

        def step() -> int:
            try:
                future.result(timeout=_SLICE)
            except concurrent.futures.TimeoutError:
                return 1
            return 0

        # Kafka not answering is transient, as a delivery that times out: DeliveryError (the
        # pipeline resets the sink and resends from the durable position)
        silent = (f"cannot create topic {name}: Kafka at {self.bootstrap_servers} did not "
                  f"answer within {timeout:g} s")
        try:
            if self._wait(f"creating topic {name}", step):
                future.cancel()
                raise DeliveryError(silent)
            self._partitions[name] = partitions  # made now, as asked
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                pass
            elif error.code() in _UNREACHABLE:
                msg = f"{silent} ({error.str()})"
                raise DeliveryError(msg) from exc
            elif error.retriable():
                msg = f"cannot create topic {name}: {error.str()}"
                raise DeliveryError(msg) from exc
            else:
                msg = f"cannot create topic {name}: {error}"
                raise KafkaSinkError(msg) from exc
        self._topics.add(name)
        return name
