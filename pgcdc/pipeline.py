"""The streaming loop: replication slot -> pgoutput -> typed events -> sink -> flush LSN.

The order of acknowledgement (sinks/sink.py) happens here, in
:meth:`Pipeline._send_status`: the flush LSN sent to PostgreSQL is the sink's
durable LSN and nothing else.  A keepalive's ``wal_end`` may move an idle slot
forward only when no transaction is open and nothing is in flight; while idle,
each status update asks the server for such a keepalive, so a slot whose
publication sees no changes still advances while other tables write WAL.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from decoder import pgoutput as pg
from decoder.change import CREATE, DELETE, TRUNCATE, UPDATE, ChangeEvent, RowDecoder
from decoder.errors import DecodeError
from decoder.lsn import format_lsn
from decoder.replication import Keepalive, ReplicationConnection, XLogData
from decoder.slot import check_identity, check_wal_level, ensure_publication, ensure_slot
from sinks.sink import Sink
from snapshot_builder.catalog import RelationCatalog, TableVersion

log = logging.getLogger(__name__)


@dataclass
class PipelineConfig:
    dsn: str
    slot: str = "pgcdc"
    publication: str = "pgcdc"
    tables: list[str] | None = None
    create_slot: bool = True
    create_publication: bool = True
    status_interval: float = 1.0


@dataclass
class Progress:
    events: int = 0
    transactions: int = 0
    received_lsn: int = 0
    durable_lsn: int = 0
    by_table: dict[str, int] = field(default_factory=dict)


class _OpenTransaction:
    __slots__ = ("xid", "commit_lsn", "commit_time", "ordinal")

    def __init__(self, begin: pg.Begin) -> None:
        self.xid = begin.xid
        self.commit_lsn = begin.final_lsn
        self.commit_time = begin.commit_time
        self.ordinal = 0


class Pipeline:
    def __init__(self, config: PipelineConfig, sink: Sink) -> None:
        self.config = config
        self.sink = sink
        self.catalog = RelationCatalog()
        self.progress = Progress()
        self._decoders: dict[int, RowDecoder] = {}
        self._txn: _OpenTransaction | None = None
        self._keepalive_end = 0
        self._flushed = 0
        self._last_status = 0.0

    # --- set-up ---------------------------------------------------------------------------

    def prepare(self) -> None:
        """Check the server and create the publication and slot as configured."""
        cfg = self.config
        with psycopg.connect(cfg.dsn, autocommit=True) as conn:
            check_wal_level(conn)
            ensure_publication(conn, cfg.publication, cfg.tables, create=cfg.create_publication)
            check_identity(conn, cfg.publication)
            info = ensure_slot(conn, cfg.slot, create=cfg.create_slot)
        self._flushed = info.confirmed_flush_lsn or 0
        self.progress.durable_lsn = self._flushed

    # --- the loop -------------------------------------------------------------------------

    def run(self, *, stop: threading.Event | None = None, until_lsn: int | None = None,
            on_progress: Callable[[Progress], None] | None = None) -> Progress:
        """Stream until ``stop`` is set or everything up to ``until_lsn`` is durable."""
        stop = stop or threading.Event()
        stream = ReplicationConnection(self.config.dsn)
        stream.connect()
        try:
            stream.start(self.config.slot, 0, {
                "proto_version": "1",
                "publication_names": self.config.publication,
            })
            last_report = 0.0
            while not stop.is_set():
                message = stream.read(timeout=0.1)
                if isinstance(message, XLogData):
                    self._handle(pg.parse(message.payload), message)
                    self.progress.received_lsn = max(self.progress.received_lsn, message.wal_end)
                elif isinstance(message, Keepalive):
                    self._keepalive_end = max(self._keepalive_end, message.wal_end)
                    self.progress.received_lsn = max(self.progress.received_lsn, message.wal_end)
                    if message.reply_requested:
                        self._send_status(stream, force=True)
                self.sink.poll(0)
                self._send_status(stream)
                now = time.monotonic()
                if on_progress is not None and now - last_report >= 1.0:
                    on_progress(self.progress)
                    last_report = now
                if until_lsn is not None and self._flushed >= until_lsn:
                    break
            self.sink.flush(30)
            self._send_status(stream, force=True)
        finally:
            stream.close()
        return self.progress

    # --- messages -------------------------------------------------------------------------

    def _handle(self, message: pg.Message, frame: XLogData) -> None:
        if isinstance(message, pg.Insert | pg.Update | pg.Delete):
            self._change(message, frame.wal_start)
        elif isinstance(message, pg.Begin):
            self._txn = _OpenTransaction(message)
        elif isinstance(message, pg.Commit):
            self.sink.end_transaction(message.end_lsn)
            self._txn = None
            self.progress.transactions += 1
        elif isinstance(message, pg.Relation):
            table, new = self.catalog.observe(message)
            if new or message.oid not in self._decoders:
                self.sink.publish_table(table, frame.wal_start)
                self._decoders[message.oid] = RowDecoder(table)
        elif isinstance(message, pg.Truncate):
            for oid in message.relation_oids:
                self._emit(TRUNCATE, self._table(oid), None, None, (), frame.wal_start)
        elif isinstance(message, pg.Type):
            self.catalog.observe_type(message)
        elif isinstance(message, pg.Origin | pg.LogicalMessage):
            log.debug("ignoring %s at %s", type(message).__name__, format_lsn(frame.wal_start))
        else:
            msg = f"{type(message).__name__} was not negotiated (protocol version 1)"
            raise DecodeError(msg, tag=chr(frame.payload[0]), offset=0)

    def _table(self, oid: int) -> TableVersion:
        table = self.catalog.table(oid)
        if table is None:
            msg = f"change for relation {oid} before its Relation message"
            raise DecodeError(msg, tag=None, offset=0)
        return table

    def _change(self, message: pg.Insert | pg.Update | pg.Delete, lsn: int) -> None:
        table = self._table(message.relation_oid)
        decoder = self._decoders[message.relation_oid]
        if isinstance(message, pg.Insert):
            after, unchanged = decoder.decode(message.new)
            self._emit(CREATE, table, None, after, unchanged, lsn)
        elif isinstance(message, pg.Update):
            before = decoder.decode(message.old)[0] if message.old is not None else None
            after, unchanged = decoder.decode(message.new)
            self._emit(UPDATE, table, before, after, unchanged, lsn)
        else:
            before = decoder.decode(message.old)[0]
            self._emit(DELETE, table, before, None, (), lsn)

    def _emit(self, op: str, table: TableVersion, before: dict[str, object] | None,
              after: dict[str, object] | None, unchanged: tuple[str, ...], lsn: int) -> None:
        txn = self._txn
        if txn is None:
            msg = f"{op!r} change outside a transaction"
            raise DecodeError(msg, tag=None, offset=0)
        self.sink.write(ChangeEvent(op, table, before, after, unchanged, txn.commit_lsn, lsn,
                                    txn.ordinal, txn.xid, txn.commit_time))
        txn.ordinal += 1
        self.progress.events += 1
        name = table.qualified_name
        self.progress.by_table[name] = self.progress.by_table.get(name, 0) + 1

    # --- acknowledgement ------------------------------------------------------------------

    def _send_status(self, stream: ReplicationConnection, *, force: bool = False) -> None:
        """Step 3 of the acknowledgement order: flush only what the sink made durable."""
        durable = self.sink.durable_lsn()
        if durable is not None and durable > self._flushed:
            self._flushed = durable
        idle = self._txn is None and self.sink.in_flight() == 0
        if idle and self._keepalive_end > self._flushed:
            self._flushed = self._keepalive_end
        now = time.monotonic()
        if not force and now - self._last_status < self.config.status_interval:
            return
        self._last_status = now
        self.progress.durable_lsn = self._flushed
        # While idle, ask for a keepalive: its wal_end lets an idle slot advance.
        stream.send_status(self.progress.received_lsn, self._flushed, self._flushed, reply=idle)
