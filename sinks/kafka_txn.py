"""The exactly-once Kafka sink: source transactions grouped into Kafka transactions.

:class:`TransactionalKafkaSink` is the :class:`~sinks.kafka.KafkaSink` with a
transactional producer (``transactional.id``, idempotence on).  What it promises,
to consumers reading with ``isolation.level=read_committed`` only: every event of
a committed source transaction appears exactly once, in commit order, across any
number of crashes and restarts of pgcdc (docs/exactly-once.md has the limits).

How:

* several source transactions go into one Kafka transaction, which commits once
  ``commit_interval_ms`` have passed or ``commit_events`` messages are in it, and
  only at a source transaction's end: a source transaction is never split;
* the same Kafka transaction writes the end LSN of the last source transaction
  it holds to the compacted ``<prefix>._offsets`` topic (key: the slot name), so
  the events and the position they reach become visible together or not at all;
* durable means committed: :meth:`durable_lsn` is the end LSN of the last
  committed Kafka transaction, so the slot never passes it;
* at start (after ``init_transactions``, which aborts whatever a previous
  instance left open), the last committed end LSN ``L`` is read back from
  ``<prefix>._offsets``; a source transaction the slot replays whose end LSN is
  at most ``L`` (its commit LSN below ``L``) is already in Kafka and is dropped.

Order of acknowledgement (sinks/sink.py), here: the events and the ``_offsets``
record are produced in the open Kafka transaction; ``commit_transaction``
succeeds; only then :meth:`durable_lsn` reports the end LSN; the pipeline stores
it and sends it to PostgreSQL.  A crash anywhere before the commit loses the Kafka
transaction (aborted, invisible to read_committed consumers) and the slot resends
it; a crash after the commit and before the slot hears of it makes the slot
resend transactions that the ``_offsets`` record says are in, and they are
dropped.

Table versions (``<prefix>._catalog``) and the catalog history are written outside
the transactions, by a plain idempotent producer and flushed at once: they are
keyed, idempotent, and must exist before any event that names them is visible.

Errors: the first one is kept.  An abortable one (a failed delivery, a commit the
broker refused) raises :class:`~sinks.acks.DeliveryError`; the pipeline calls
:meth:`reset`, which aborts the Kafka transaction (or recreates the producer,
whose ``init_transactions`` fences any zombie), reads ``L`` again and resends
from the slot's position.  Another producer with the same ``transactional.id``
fences this one: :class:`ProducerFencedError`, terminal.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from core.errors import TerminalError
from decoder.change import READ, ChangeEvent
from decoder.lsn import format_lsn
from decoder.pgoutput import LogicalMessage
from sinks.acks import AckTracker, DeliveryError
from sinks.kafka import KafkaSink

log = logging.getLogger(__name__)

OFFSETS_SUFFIX = "_offsets"
_FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                           KafkaError.INVALID_PRODUCER_EPOCH})
_COMMIT_ATTEMPTS = 10  # a retriable commit is tried again this many times
_T = TypeVar("_T")


class ProducerFencedError(TerminalError):
    def __init__(self, transactional_id: str, detail: object) -> None:
        super().__init__(
            f"another producer with transactional.id {transactional_id!r} fenced this pgcdc "
            f"({detail}): two pgcdc processes write for the same slot and prefix; stop one, "
            "or give each its own sink.transactional_id (PGCDC_TRANSACTIONAL_ID)")


class TransactionTimedOutError(DeliveryError):
    """The broker aborted a Kafka transaction open longer than ``transaction.timeout.ms``;
    librdkafka reports it as fencing, since the coordinator bumped the producer's epoch."""

    def __init__(self, seconds: float, timeout: float, detail: object) -> None:
        super().__init__(
            f"the Kafka transaction was open for {seconds:.0f} s, longer than "
            f"transaction.timeout.ms ({timeout * 1000:.0f} ms), and the broker aborted it "
            f"({detail}); resending from the durable position. If one source transaction "
            "takes that long to write, raise sink.kafka's transaction.timeout.ms (at most "
            "the brokers' transaction.max.timeout.ms)")


class TransactionsUnavailableError(TerminalError):
    def __init__(self, servers: str, transactional_id: str, detail: object) -> None:
        super().__init__(
            f"cannot start Kafka transactions at {servers} (transactional.id "
            f"{transactional_id!r}): {detail}; the brokers need a transaction state log they "
            "can create (transaction.state.log.replication.factor and "
            "transaction.state.log.min.isr at most the number of brokers), or run without "
            "--exactly-once")


class OffsetsTopicError(TerminalError):
    pass


def offsets_topic(prefix: str) -> str:
    return f"{prefix}.{OFFSETS_SUFFIX}"


def default_transactional_id(prefix: str, slot: str) -> str:
    """Stable across restarts of the same pipeline, so a new instance fences the old one."""
    return f"pgcdc.{prefix}.{slot}"


def _fenced(error: KafkaError) -> bool:
    return error.code() in _FENCED_CODES or "fenced" in str(error.str()).lower()


def _kafka_error(exc: BaseException) -> KafkaError | None:
    """The KafkaError behind an exception of the client: a KafkaException, or the
    SystemError confluent-kafka raises when a fatal error interrupts its callbacks."""
    for candidate in (exc, exc.__cause__):
        if isinstance(candidate, KafkaException) and isinstance(candidate.args[0], KafkaError):
            return candidate.args[0]
    return None


def read_committed_lsn(config: dict[str, Any], topic: str, slot: str,
                       timeout: float = 60.0) -> int | None:
    """The end LSN the last committed Kafka transaction recorded for ``slot`` in ``topic``
    (read with ``isolation.level=read_committed``); ``None`` if there is none."""
    consumer = Consumer({**config, "group.id": f"pgcdc-offsets-{uuid.uuid4()}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    try:
        metadata = consumer.list_topics(topic, timeout=timeout)
        partitions = sorted(metadata.topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        at_end: set[int] = set()
        found: int | None = None
        deadline = time.monotonic() + timeout
        while len(at_end) < len(partitions):
            if time.monotonic() > deadline:
                msg = (f"reading {topic} did not reach its end within {timeout:.0f} s: a "
                       "transaction of another producer may hold it open; check the brokers")
                raise OffsetsTopicError(msg)
            record = consumer.poll(0.5)
            if record is None:
                continue
            error = record.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(record.partition() or 0)
                    continue
                msg = f"cannot read {topic}: {error}"
                raise OffsetsTopicError(msg)
            at_end.discard(record.partition() or 0)
            key, value = record.key(), record.value()
            if key is None or key.decode() != slot:
                continue
            found = None if value is None else int(json.loads(value)["end_lsn"])
        return found
    finally:
        consumer.close()


class TransactionalKafkaSink(KafkaSink):
    _in_transaction: bool  # a Kafka transaction is open
    _source_open: bool  # a source transaction has events in it
    _skipping: bool  # the open source transaction is a replay, dropped
    _pending_end: int | None  # the end LSN of its last complete source transaction
    _began: float  # time.monotonic() at its start
    _messages: int  # produced in it
    _last: tuple[int, int] | None  # (commit_lsn, ordinal) of the last event written in it
    _last_lsn: int  # the LSN of the last transactional message written in it

    def __init__(self, bootstrap_servers: str, *, slot: str, topic_prefix: str = "pgcdc",
                 transactional_id: str | None = None, commit_interval_ms: int = 1000,
                 commit_events: int = 10_000, **kwargs: Any) -> None:
        self.slot = slot
        self.transactional_id = transactional_id or default_transactional_id(topic_prefix, slot)
        self.commit_interval = commit_interval_ms / 1000
        self.commit_events = commit_events
        producer_config = dict(kwargs.pop("producer_config", None) or {})
        # at most the brokers' transaction.max.timeout.ms (15 min by default); sink.kafka
        # may set it; a message must not outlive its transaction
        timeout = int(producer_config.get("transaction.timeout.ms") or (
            kwargs.get("client_config") or {}).get("transaction.timeout.ms", 120_000))
        producer_config["transaction.timeout.ms"] = timeout
        self.transaction_timeout = timeout / 1000
        producer_config.setdefault("message.timeout.ms", min(120_000, timeout))
        producer_config["transactional.id"] = self.transactional_id
        super().__init__(bootstrap_servers, topic_prefix=topic_prefix,
                         producer_config=producer_config, **kwargs)
        plain = {k: v for k, v in self._producer_config.items()
                 if not k.startswith("transaction")}
        self._plain = Producer(plain)  # table versions and catalog history, outside transactions
        # the consumer of the offsets topic connects as the producers do (sink.kafka)
        self._client_config = {**(kwargs.get("client_config") or {}),
                               "bootstrap.servers": bootstrap_servers}
        self.offsets_topic = self._ensure_topic(offsets_topic(topic_prefix), partitions=1,
                                                compact=True)
        self._error: Exception | None = None
        self._init_transactions()
        self._committed = self._read_committed()
        self._durable = self._committed
        self._start_batch()

    # --- Sink protocol --------------------------------------------------------------------

    def publish_catalog(self, version: int, lsn: int, entry: str) -> None:
        if self.catalog_history_topic not in self._topics:
            self._ensure_topic(self.catalog_history_topic, partitions=1, compact=True)
        self._plain.produce(self.catalog_history_topic, key=str(version).encode(),
                            value=entry.encode())
        if self._plain.flush(60):
            msg = f"could not publish catalog history version {version} within 60 s"
            raise DeliveryError(msg)

    def write(self, event: ChangeEvent) -> None:
        self._raise_error()
        if self._replayed(event.commit_lsn):
            return
        position = (event.commit_lsn, event.ordinal)
        if event.op != READ and self._went_back(event.commit_lsn, event.ordinal, None):
            self._restarted(position)  # (the initial load's chunks interleave their rows)
        self._begin()
        self._source_open = True
        super().write(event)
        self._last = position

    def write_message(self, message: LogicalMessage, *, lsn: int, commit_lsn: int | None,
                      xid: int | None) -> None:
        self._raise_error()
        if commit_lsn is None:  # stands alone: in Kafka already if before the position
            if self._committed is not None and lsn < self._committed:
                return
        elif self._replayed(commit_lsn):
            return
        elif self._went_back(commit_lsn, None, lsn):
            self._restarted((commit_lsn, -1))
        self._begin()
        super().write_message(message, lsn=lsn, commit_lsn=commit_lsn, xid=xid)
        if commit_lsn is not None:
            self._source_open = True
            same = self._last is not None and self._last[0] == commit_lsn
            self._last = (commit_lsn, self._last[1] if self._last and same else -1)
            self._last_lsn = lsn

    def end_transaction(self, end_lsn: int) -> None:
        self._raise_error()
        if self._skipping or not self._source_open:
            # a replayed transaction already in Kafka, or one with nothing to write
            self._skipping = False
            if not self._in_transaction:
                self._durable = max(self._durable or 0, end_lsn)
            elif self._committed is None or end_lsn > self._committed:
                self._pending_end = end_lsn
            return
        super().end_transaction(end_lsn)
        self._source_open = False
        self._pending_end = end_lsn
        if (self._messages >= self.commit_events
                or time.monotonic() - self._began >= self.commit_interval):
            self._commit()

    def durable_lsn(self) -> int | None:
        self._raise_error()
        return self._durable

    def in_flight(self) -> int:
        """Messages of the open Kafka transaction (not committed yet)."""
        return self._messages

    def poll(self, timeout: float = 0.0) -> None:
        self._raise_error()
        self._kafka("polling", lambda: self._producer.poll(timeout))
        if (self._in_transaction and not self._source_open
                and time.monotonic() - self._began >= self.commit_interval):
            self._commit()

    def flush(self, timeout: float) -> None:
        """Commit the open Kafka transaction when no source transaction is half written;
        else deliver what is queued (uncommitted)."""
        self._raise_error()
        if self._in_transaction and not self._source_open:
            self._commit()
        else:
            self._kafka("flushing", lambda: self._producer.flush(timeout))

    def reset(self) -> None:
        """Abort the open Kafka transaction (a fatal error: a new producer, whose
        ``init_transactions`` fences the old one), read back the committed position and
        start clean; the pipeline resends from the slot's position."""
        error, self._error = self._error, None
        if isinstance(error, ProducerFencedError):
            raise error
        fatal = error is not None and (_fatal(error) or isinstance(error, TransactionTimedOutError))
        if self._in_transaction and not fatal:
            try:
                self._producer.abort_transaction(30)
            except (KafkaException, SystemError) as exc:
                kafka_error = _kafka_error(exc)
                if kafka_error is not None and _fenced(kafka_error) and not self._timed_out():
                    # another instance: a new producer would fence it in turn
                    self._error = ProducerFencedError(self.transactional_id, kafka_error)
                    raise self._error from exc
                log.warning("aborting the kafka transaction failed: %s", exc)
                fatal = True
        if fatal:
            try:
                self._producer.purge()
            except (KafkaException, SystemError) as exc:
                log.warning("purging the failed kafka producer: %s", exc)
            self._producer = Producer(self._producer_config)
            self._init_transactions()
            log.warning("kafka transactional producer recreated")
        self._committed = self._read_committed()
        self._durable = max(self._durable or 0, self._committed or 0) or None
        self._start_batch()
        self._txn_id = None
        log.warning("kafka transaction aborted; resending from the durable position %s",
                    format_lsn(self._committed or 0))

    def close(self) -> None:
        """Commit what is complete, abort a half-written source transaction, then let the
        clients go."""
        if not hasattr(self, "_plain"):
            return  # closed already
        if self._in_transaction and self._error is None:
            try:
                if self._source_open:
                    self._producer.abort_transaction(30)
                else:
                    self._commit()
            except (KafkaException, DeliveryError, TerminalError) as exc:
                log.warning("closing the kafka transaction failed: %s", exc)
        self._plain.flush(30)
        del self._plain
        try:
            super().close()
        except (KafkaException, SystemError) as exc:  # a fenced or failed producer
            log.warning("closing the kafka producer: %s", exc)

    # --- transactions ---------------------------------------------------------------------

    def _produce(self, topic: str, key: bytes, value: bytes | None,
                 headers: list[tuple[str, str | bytes | None]]) -> None:
        super()._produce(topic, key, value, headers)
        self._messages += 1

    def _sync_producer(self) -> Producer:
        return self._plain

    def _producer_failed(self, exc: KafkaException) -> Exception:
        return self._keep(exc.args[0], "producing")

    def _start_batch(self) -> None:
        self._in_transaction = False
        self._source_open = False
        self._skipping = False
        self._pending_end = None
        self._began = time.monotonic()
        self._messages = 0
        self._last = None
        self._last_lsn = 0
        self._tracker = AckTracker()

    def _went_back(self, commit_lsn: int, ordinal: int | None, lsn: int | None) -> bool:
        """Whether this event (``ordinal``) or transactional message (``lsn``) comes again:
        source transactions arrive in commit order, each one's events by ordinal."""
        if self._last is None or commit_lsn > self._last[0]:
            return False
        if commit_lsn < self._last[0] or not self._source_open:
            return True  # an earlier or the last complete source transaction, again
        if ordinal is not None:
            return ordinal <= self._last[1]
        return lsn is not None and lsn <= self._last_lsn

    def _restarted(self, position: tuple[int, int]) -> None:
        """The stream went back inside the open Kafka transaction: the pipeline reconnected
        (a lost replication connection does not reset the sink) and resends what this
        transaction holds already.  Abort it and resend from the durable position."""
        if self._error is None:
            last = self._last or (0, -1)
            self._error = DeliveryError(
                "the replication stream restarted inside an open Kafka transaction (at "
                f"{format_lsn(position[0])}#{position[1]}, after {format_lsn(last[0])}#{last[1]}"
                "); aborting it and resending from the durable position")
        raise self._error

    def _replayed(self, commit_lsn: int) -> bool:
        """Whether a source transaction committed below the last committed end LSN (so it
        is in Kafka already)."""
        if self._committed is not None and commit_lsn < self._committed:
            self._skipping = True
            return True
        return False

    def _begin(self) -> None:
        if self._in_transaction:
            return
        self._kafka("beginning a transaction", self._producer.begin_transaction)
        self._in_transaction = True
        self._began = time.monotonic()

    def _commit(self) -> None:
        """Write the position into the Kafka transaction and commit it; durable after."""
        if self._pending_end is not None:
            value = {"slot": self.slot, "end_lsn": self._pending_end,
                     "lsn": format_lsn(self._pending_end)}
            self._produce(self.offsets_topic, self.slot.encode(),
                          json.dumps(value, separators=(",", ":")).encode(), [])
        for attempt in range(1, _COMMIT_ATTEMPTS + 1):
            try:
                self._producer.commit_transaction()
                break
            except (KafkaException, SystemError) as exc:
                error = _kafka_error(exc)
                if error is None:
                    raise
                if error.retriable() and not error.txn_requires_abort() \
                        and attempt < _COMMIT_ATTEMPTS:
                    log.warning("committing the kafka transaction: %s; retrying", error)
                    continue
                raise self._keep(error, "committing") from exc
        self._raise_error()  # a delivery error reported during the commit's flush
        if self._pending_end is not None:
            self._committed = self._pending_end
            self._durable = max(self._durable or 0, self._pending_end)
        self._start_batch()

    def _timed_out(self) -> bool:
        """Whether the open Kafka transaction is older than ``transaction.timeout.ms``."""
        return (self._in_transaction
                and time.monotonic() - self._began >= self.transaction_timeout)

    def _kafka(self, doing: str, call: Callable[[], _T]) -> _T:
        """A call of the transactional producer; its error is kept (the first) and raised."""
        try:
            return call()
        except (KafkaException, SystemError) as exc:
            error = _kafka_error(exc)
            if error is None:
                raise
            raise self._keep(error, doing) from exc

    def _keep(self, error: KafkaError, doing: str) -> Exception:
        """Remember the first error and return it to raise."""
        if self._error is None:
            if _fenced(error) and self._timed_out():
                # the coordinator timed the transaction out (which bumps the epoch too): not
                # another instance, which would have fenced a younger transaction as well
                self._error = TransactionTimedOutError(time.monotonic() - self._began,
                                                       self.transaction_timeout, error)
            elif _fenced(error):
                self._error = ProducerFencedError(self.transactional_id, error)
            else:
                self._error = DeliveryError(f"kafka transaction failed while {doing}: {error}")
                self._error.__cause__ = KafkaException(error)
        return self._error

    def _raise_error(self) -> None:
        if self._error is None:
            try:
                self._tracker.durable_lsn()  # raises the first failed delivery
            except DeliveryError as exc:
                cause = exc.__cause__
                error = cause.args[0] if isinstance(cause, KafkaException) else cause
                if isinstance(error, KafkaError):
                    self._keep(error, "delivering")
                else:
                    self._error = exc
        if self._error is not None:
            raise self._error

    def _init_transactions(self) -> None:
        try:
            self._producer.init_transactions(60)
        except KafkaException as exc:
            raise TransactionsUnavailableError(self.bootstrap_servers, self.transactional_id,
                                               exc.args[0]) from exc

    def _read_committed(self) -> int | None:
        lsn = read_committed_lsn(self._client_config, self.offsets_topic, self.slot)
        log.info("kafka transactions: %s holds %s for slot %s", self.offsets_topic,
                 format_lsn(lsn) if lsn is not None else "nothing", self.slot)
        return lsn


def _fatal(error: Exception) -> bool:
    kafka_error = _kafka_error(error.__cause__) if error.__cause__ is not None else None
    return kafka_error is not None and bool(kafka_error.fatal())
