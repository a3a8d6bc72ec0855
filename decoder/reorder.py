"""The reorder buffer: pgoutput messages in, committed transactions out, whole and in order.

PostgreSQL hands a transaction to a logical replication client in one of three shapes:

* plain: Begin, its messages, Commit, sent once it has committed; handed on as it arrives;
* streamed (the ``streaming`` option): a large transaction in blocks while it still runs,
  each between Stream Start and Stream Stop and interleaved with other transactions, then
  Stream Commit, or Stream Abort of the transaction or of one of its subtransactions;
* prepared (``two_phase``): Begin Prepare .. Prepare at PREPARE TRANSACTION (or Stream
  Prepare, for one streamed so far), then Commit Prepared or Rollback Prepared, any time
  later and after other transactions.

A streamed or prepared transaction must not reach the consumer before it commits, and then
must reach it whole and in the order of its messages.  The buffer keeps its raw messages in a
:class:`~decoder.transactions.Spill` (memory up to a bound, a temporary file past it) and
replays them at the commit; a rolled-back subtransaction's messages are skipped, an aborted
or rolled-back transaction is dropped whole.

The :class:`Consumer` sees one committed transaction at a time (``on_begin``, its messages,
``on_commit``; :attr:`ReorderBuffer.current` is that transaction meanwhile), and the
messages outside any transaction (a Relation between transactions, a non-transactional
logical message) in between.  Insert, Update and Delete reach it as their raw bytes, which
decoder/change.py turns into rows in one pass; every other message parsed.  One thing
reaches it before a commit: a Relation or Type inside a prepared transaction, at its
PREPARE (``on_prepared_schema``), because pgoutput counts a schema sent there as sent for
every later transaction.

The flush position: PostgreSQL sends a prepared transaction again only if its PREPARE is
not confirmed, so :meth:`ReorderBuffer.hold_lsn` caps the flush LSN while one awaits its
outcome.  After a lost connection, :meth:`ReorderBuffer.reset` forgets everything in
progress: the server sends it all again from the confirmed position.
"""

from __future__ import annotations

from typing import Final, Protocol

from decoder import pgoutput as pg
from decoder.transactions import Spill, streamed_xid

# a long replay tells the consumer every so many messages (it answers the server meanwhile)
REPLAY_TICK: Final = 100

_ROW_TAGS: Final = frozenset((pg.TAG_INSERT, pg.TAG_UPDATE, pg.TAG_DELETE))
_SCHEMA_TAGS: Final = frozenset((pg.TAG_RELATION, pg.TAG_TYPE))


class Transaction:
    """The committed transaction being handed to the consumer."""

    __slots__ = ("xid", "commit_lsn", "commit_time", "streamed")

    def __init__(self, xid: int, commit_lsn: int, commit_time: int, *,
                 streamed: bool = False) -> None:
        self.xid = xid
        self.commit_lsn = commit_lsn
        self.commit_time = commit_time  # microseconds since 2000-01-01 UTC
        self.streamed = streamed  # sent in streamed blocks and committed by Stream Commit

    def __repr__(self) -> str:
        return (f"Transaction(xid={self.xid}, commit_lsn={self.commit_lsn}, "
                f"streamed={self.streamed})")


class Consumer(Protocol):
    """What the buffer hands committed transactions to (the pipeline)."""

    def on_begin(self, transaction: Transaction) -> None:
        """A committed transaction starts; its messages follow, then :meth:`on_commit`."""

    def on_change(self, payload: bytes, lsn: int, streaming: bool) -> None:
        """An Insert, Update or Delete of the current transaction, as its raw bytes
        (``streaming``: from a streamed block, the xid after the tag)."""

    def on_message(self, message: pg.Message, lsn: int) -> None:
        """A Relation, Type, Truncate, Origin or logical message: of the current
        transaction, or outside any when :attr:`ReorderBuffer.current` is None."""

    def on_prepared_schema(self, message: pg.Relation | pg.Type, lsn: int) -> None:
        """A Relation or Type inside a prepared transaction, at its PREPARE."""

    def on_commit(self, end_lsn: int) -> None:
        """The current transaction's last message was handed over (``end_lsn``: the end of
        its commit record, the position to confirm once it is durable)."""

    def on_abort(self) -> None:
        """A streamed transaction aborted, or a prepared one rolled back: dropped whole."""

    def on_replay_tick(self) -> None:
        """A long replay handed over another :data:`REPLAY_TICK` messages."""


class ReorderBuffer:
    """Every transaction not yet handed over: the open one, the streamed ones in progress and
    the prepared ones awaiting their outcome (see the module's docstring)."""

    def __init__(self, consumer: Consumer, *, memory_limit: int,
                 directory: str | None = None) -> None:
        self.consumer = consumer
        self.memory_limit = memory_limit  # bytes of each pending transaction kept in memory
        self.directory = directory  # where a spill file goes; None: the temporary folder
        self.current: Transaction | None = None  # being handed to the consumer
        self.streamed: dict[int, Spill] = {}  # xid -> its blocks so far
        self.prepared: dict[str, tuple[Spill, int]] = {}  # gid -> (spill, prepare LSN)
        self._stream: Spill | None = None  # inside a Stream Start .. Stream Stop block
        self._preparing: Spill | None = None  # between Begin Prepare and Prepare
        self._change = consumer.on_change  # almost every message goes there

    def feed(self, payload: bytes, lsn: int) -> None:
        """One pgoutput message (an XLogData payload) that starts at ``lsn``."""
        tag = payload[0]
        if self._stream is not None and tag != pg.TAG_STREAM_STOP:
            self._stream.add(streamed_xid(payload), lsn, payload)
            return
        if tag in _ROW_TAGS and self._preparing is None:
            self._change(payload, lsn, False)  # almost every message
            return
        message = pg.parse(payload)
        if self._preparing is not None and not isinstance(message, pg.Prepare):
            self._preparing.add(self._preparing.xid, lsn, payload)
            if isinstance(message, pg.Relation | pg.Type):
                self.consumer.on_prepared_schema(message, lsn)
            return
        if isinstance(message, pg.Begin):
            self.current = Transaction(message.xid, message.final_lsn, message.commit_time)
            self.consumer.on_begin(self.current)
        elif isinstance(message, pg.Commit):
            self._commit(message.end_lsn)
        elif isinstance(message, pg.StreamStart | pg.StreamStop | pg.StreamCommit
                        | pg.StreamAbort):
            self._on_stream(message)
        elif isinstance(message, pg.BeginPrepare | pg.Prepare | pg.StreamPrepare
                        | pg.CommitPrepared | pg.RollbackPrepared):
            self._on_two_phase(message)
        else:
            self.consumer.on_message(message, lsn)

    @property
    def idle(self) -> bool:
        """No transaction open, no streamed block, nothing pending."""
        return (self.current is None and self._stream is None and self._preparing is None
                and not self.streamed and not self.prepared)

    def hold_lsn(self) -> int | None:
        """The flush LSN must not pass this while a prepared transaction awaits its outcome:
        PostgreSQL resends a prepared transaction only if its PREPARE is not confirmed."""
        if not self.prepared:
            return None
        return min(lsn for _, lsn in self.prepared.values())

    @property
    def buffered_bytes(self) -> int:
        """Memory the pending transactions hold (what they spilled to files not counted)."""
        spills = list(self.streamed.values()) + [s for s, _ in self.prepared.values()]
        return sum(s.buffered_bytes for s in spills)

    def reset(self) -> None:
        """Forget everything in progress (after a reconnect the server sends it all again)."""
        self.current = None
        self._stream = None
        self._preparing = None
        for spill in self.streamed.values():
            spill.discard()
        for spill, _ in self.prepared.values():
            spill.discard()
        self.streamed.clear()
        self.prepared.clear()

    def _new_spill(self, xid: int, *, streaming: bool) -> Spill:
        return Spill(xid, streaming=streaming, memory_limit=self.memory_limit,
                     directory=self.directory)

    def _on_stream(self, message: pg.StreamStart | pg.StreamStop | pg.StreamCommit
                   | pg.StreamAbort) -> None:
        if isinstance(message, pg.StreamStart):
            spill = self.streamed.get(message.xid)
            if spill is None:
                spill = self.streamed[message.xid] = self._new_spill(message.xid,
                                                                     streaming=True)
            self._stream = spill
        elif isinstance(message, pg.StreamStop):
            self._stream = None
        elif isinstance(message, pg.StreamCommit):
            self._replay(self.streamed.pop(message.xid, None),
                         Transaction(message.xid, message.commit_lsn, message.commit_time,
                                     streamed=True), message.end_lsn)
        else:
            spill = self.streamed.get(message.xid)
            if spill is None:
                return
            if message.subxid == message.xid:
                spill.discard()
                del self.streamed[message.xid]
                self.consumer.on_abort()
            else:
                spill.abort_subtransaction(message.subxid)

    def _on_two_phase(self, message: pg.BeginPrepare | pg.Prepare | pg.StreamPrepare
                      | pg.CommitPrepared | pg.RollbackPrepared) -> None:
        if isinstance(message, pg.BeginPrepare):
            self._preparing = self._new_spill(message.xid, streaming=False)
        elif isinstance(message, pg.Prepare):
            spill, self._preparing = self._preparing, None
            if spill is not None:
                self.prepared[message.gid] = (spill, message.prepare_lsn)
        elif isinstance(message, pg.StreamPrepare):
            streamed = self.streamed.pop(message.xid, None)
            if streamed is not None:
                self.prepared[message.gid] = (streamed, message.prepare_lsn)
                for lsn, payload in streamed.replay():  # the schemas count as sent now
                    if payload[0] in _SCHEMA_TAGS:
                        schema = pg.parse(payload, streaming=True)
                        assert isinstance(schema, pg.Relation | pg.Type)
                        self.consumer.on_prepared_schema(schema, lsn)
        elif isinstance(message, pg.CommitPrepared):
            entry = self.prepared.pop(message.gid, None)
            self._replay(entry[0] if entry else None,
                         Transaction(message.xid, message.commit_lsn, message.commit_time),
                         message.end_lsn)
        else:
            entry = self.prepared.pop(message.gid, None)
            if entry is not None:
                entry[0].discard()
            self.consumer.on_abort()

    def _replay(self, spill: Spill | None, transaction: Transaction, end_lsn: int) -> None:
        """Hand over a transaction kept until its commit, then close it."""
        self.current = transaction
        self.consumer.on_begin(transaction)
        if spill is not None:
            try:
                streaming = spill.streaming
                change, consumer = self._change, self.consumer
                for count, (lsn, payload) in enumerate(spill.replay(), 1):
                    if payload[0] in _ROW_TAGS:
                        change(payload, lsn, streaming)
                    else:
                        consumer.on_message(pg.parse(payload, streaming=streaming), lsn)
                    if count % REPLAY_TICK == 0:
                        consumer.on_replay_tick()
            finally:
                spill.discard()
        self._commit(end_lsn)

    def _commit(self, end_lsn: int) -> None:
        self.consumer.on_commit(end_lsn)
        self.current = None
