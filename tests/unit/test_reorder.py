"""The reorder buffer (decoder/reorder.py): pgoutput messages in, committed transactions out.

Pure logic: the messages are encoded by tests/pgoutput_encoder.py, fed as a replication
stream would feed them, and a recording consumer notes what is handed over."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from decoder import pgoutput as pg
from decoder.reorder import REPLAY_TICK, ReorderBuffer, Transaction
from tests.pgoutput_encoder import encode

OID = 16384
RELATION = pg.Relation(None, OID, "public", "t", "d",
                       (pg.RelationColumn(1, "id", 23, -1), pg.RelationColumn(0, "v", 25, -1)))


@dataclass
class Recorder:
    """A consumer that notes every hand-over, rows parsed back into messages."""

    buffer: ReorderBuffer | None = None
    log: list[tuple[object, ...]] = field(default_factory=list)

    def on_begin(self, transaction: Transaction) -> None:
        assert self.buffer is not None and self.buffer.current is transaction
        self.log.append(("begin", transaction.xid, transaction.commit_lsn,
                         transaction.streamed))

    def on_change(self, payload: bytes, lsn: int, streaming: bool) -> None:
        assert self.buffer is not None and self.buffer.current is not None, \
            "a change only inside a committed transaction"
        self.log.append(("change", pg.parse(payload, streaming=streaming), lsn))

    def on_message(self, message: pg.Message, lsn: int) -> None:
        self.log.append(("message", message, lsn))

    def on_prepared_schema(self, message: pg.Relation | pg.Type, lsn: int) -> None:
        self.log.append(("schema", message, lsn))

    def on_commit(self, end_lsn: int) -> None:
        assert self.buffer is not None and self.buffer.current is not None
        self.log.append(("commit", end_lsn))

    def on_abort(self) -> None:
        self.log.append(("abort",))

    def on_replay_tick(self) -> None:
        self.log.append(("tick",))

    def take(self) -> list[tuple[object, ...]]:
        taken, self.log = self.log, []
        return taken

    @property
    def rows(self) -> list[object]:
        return [entry[1].new[0] for entry in self.log
                if entry[0] == "change"]


def _buffer(tmp_path: Path, memory_limit: int = 1 << 20) -> tuple[ReorderBuffer, Recorder]:
    recorder = Recorder()
    buffer = ReorderBuffer(recorder, memory_limit=memory_limit, directory=str(tmp_path))
    recorder.buffer = buffer
    return buffer, recorder


def _feed(buffer: ReorderBuffer, *messages: tuple[pg.Message, int], streaming: bool = False,
          ) -> None:
    for message, lsn in messages:
        buffer.feed(encode(message, streaming=streaming), lsn)


def _insert(value: int, xid: int | None = None) -> pg.Insert:
    return pg.Insert(xid, OID, (str(value), f"v{value}"))


def _streamed_block(buffer: ReorderBuffer, xid: int, first: bool,
                    *messages: tuple[pg.Message, int]) -> None:
    _feed(buffer, (pg.StreamStart(xid, first), 0))
    _feed(buffer, *messages, streaming=True)
    _feed(buffer, (pg.StreamStop(), 0))


def test_a_plain_transaction_passes_straight_through(tmp_path: Path) -> None:
    buffer, recorder = _buffer(tmp_path)
    _feed(buffer, (pg.Begin(0x500, 0, 7), 0), (RELATION, 0), (_insert(1), 0x100),
          (pg.Commit(0, 0x500, 0x510, 7), 0x500))
    assert recorder.take() == [
        ("begin", 7, 0x500, False), ("message", RELATION, 0),
        ("change", _insert(1), 0x100), ("commit", 0x510)]
    assert buffer.current is None and buffer.idle and buffer.hold_lsn() is None


def test_a_streamed_transaction_waits_for_its_commit_without_its_aborted_subtransaction(
        tmp_path: Path) -> None:
    buffer, recorder = _buffer(tmp_path)
    xid, sub = 700, 701
    _streamed_block(buffer, xid, True, (pg.Origin(0, "upstream"), 0),
                    (replace(RELATION, xid=xid), 0),
                    (_insert(1, xid), 0x100), (_insert(2, sub), 0x110))
    assert not buffer.idle and recorder.take() == []
    # another transaction commits meanwhile: handed over at once
    _feed(buffer, (pg.Begin(0x300, 0, 9), 0), (_insert(50), 0x200),
          (pg.Commit(0, 0x300, 0x310, 9), 0x300))
    assert recorder.rows == ["50"]
    recorder.take()
    _streamed_block(buffer, xid, False, (_insert(3, sub), 0x400), (_insert(4, xid), 0x410))
    # the Origin, which carries no xid, survives the subtransaction's abort
    _feed(buffer, (pg.StreamAbort(xid, sub, None, None), 0))
    assert recorder.take() == []
    _feed(buffer, (pg.StreamCommit(xid, 0, 0x900, 0x910, 11), 0))
    log = recorder.take()
    assert log[0] == ("begin", xid, 0x900, True)
    assert [e[0] for e in log] == ["begin", "message", "message", "change", "change", "commit"]
    assert log[1] == ("message", pg.Origin(0, "upstream"), 0)
    assert isinstance(log[2][1], pg.Relation) and log[2][1].xid == xid
    assert [(e[1].new[0], e[2]) for e in log if e[0] == "change"] == [
        ("1", 0x100), ("4", 0x410)]
    assert log[-1] == ("commit", 0x910)
    assert buffer.idle and not list(tmp_path.iterdir())


def test_a_streamed_transaction_aborted_whole_is_dropped(tmp_path: Path) -> None:
    buffer, recorder = _buffer(tmp_path, memory_limit=0)  # every message in the file
    _streamed_block(buffer, 800, True, (_insert(1, 800), 0x100))
    assert buffer.streamed[800].spilled and len(list(tmp_path.iterdir())) == 1
    _feed(buffer, (pg.StreamAbort(800, 800, None, None), 0))
    assert recorder.take() == [("abort",)]
    assert buffer.idle and not list(tmp_path.iterdir())
    # an abort of a transaction never seen (streamed before a reconnect): nothing to drop
    _feed(buffer, (pg.StreamAbort(801, 801, None, None), 0))
    assert recorder.take() == []


def _prepared(buffer: ReorderBuffer, gid: str, xid: int, prepare_lsn: int,
              *values: int) -> None:
    _feed(buffer, (pg.BeginPrepare(prepare_lsn, prepare_lsn + 8, 5, xid, gid), 0),
          (RELATION, 0), *((_insert(v), prepare_lsn - 0x10 + v) for v in values),
          (pg.Prepare(0, prepare_lsn, prepare_lsn + 8, 5, xid, gid), prepare_lsn))


def test_a_prepared_transaction_rolled_back_hands_over_only_its_schema(
        tmp_path: Path) -> None:
    buffer, recorder = _buffer(tmp_path)
    _prepared(buffer, "g2", 900, 0x1000, 1, 2)
    # pgoutput counts the Relation sent at PREPARE as sent: it is handed over then
    assert recorder.take() == [("schema", RELATION, 0)]
    assert buffer.hold_lsn() == 0x1000 and not buffer.idle
    assert set(buffer.prepared) == {"g2"} and buffer.buffered_bytes > 0
    _feed(buffer, (pg.RollbackPrepared(0, 0x1008, 0x1100, 5, 6, 900, "g2"), 0x1100))
    assert recorder.take() == [("abort",)]
    assert buffer.hold_lsn() is None and buffer.idle and buffer.buffered_bytes == 0


def test_a_prepared_transaction_committed_after_a_reconnect(tmp_path: Path) -> None:
    """The flush LSN is held below the PREPARE (hold_lsn), so after a lost connection the
    server sends the prepared transaction again, then its COMMIT PREPARED."""
    buffer, recorder = _buffer(tmp_path)
    _prepared(buffer, "g1", 901, 0x2000, 1, 2)
    _prepared(buffer, "g3", 902, 0x3000, 3)
    assert buffer.hold_lsn() == 0x2000
    buffer.reset()  # the connection was lost
    assert buffer.idle and buffer.hold_lsn() is None and buffer.prepared == {}
    recorder.take()
    _prepared(buffer, "g1", 901, 0x2000, 1, 2)
    _prepared(buffer, "g3", 902, 0x3000, 3)
    recorder.take()
    # committed in the other order than prepared
    _feed(buffer, (pg.CommitPrepared(0, 0x4000, 0x4010, 8, 902, "g3"), 0x4000))
    assert buffer.hold_lsn() == 0x2000
    _feed(buffer, (pg.CommitPrepared(0, 0x5000, 0x5010, 8, 901, "g1"), 0x5000))
    log = recorder.take()
    assert [e for e in log if e[0] in ("begin", "commit")] == [
        ("begin", 902, 0x4000, False), ("commit", 0x4010),
        ("begin", 901, 0x5000, False), ("commit", 0x5010)]
    assert [(e[1], e[2]) for e in log if e[0] == "message"] == [(RELATION, 0)] * 2
    assert [e[1].new[0] for e in log if e[0] == "change"] == [
        "3", "1", "2"]
    assert buffer.idle and buffer.hold_lsn() is None


def test_commit_prepared_of_an_unknown_transaction_hands_over_an_empty_one(
        tmp_path: Path) -> None:
    buffer, recorder = _buffer(tmp_path)
    _feed(buffer, (pg.CommitPrepared(0, 0x4000, 0x4010, 8, 903, "gone"), 0x4000))
    assert recorder.take() == [("begin", 903, 0x4000, False), ("commit", 0x4010)]


def test_a_streamed_transaction_prepared_then_committed(tmp_path: Path) -> None:
    buffer, recorder = _buffer(tmp_path)
    xid = 950
    relation = replace(RELATION, xid=xid)
    _streamed_block(buffer, xid, True, (relation, 0), (_insert(1, xid), 0x100))
    _feed(buffer, (pg.StreamPrepare(0, 0x6000, 0x6008, 5, xid, "gs"), 0x6000))
    assert recorder.take() == [("schema", relation, 0)]
    assert buffer.hold_lsn() == 0x6000 and not buffer.streamed
    _feed(buffer, (pg.CommitPrepared(0, 0x7000, 0x7010, 8, xid, "gs"), 0x7000))
    assert recorder.take() == [("begin", xid, 0x7000, False), ("message", relation, 0),
                               ("change", _insert(1, xid), 0x100), ("commit", 0x7010)]


@pytest.mark.parametrize("memory_limit", [0, 4000])
def test_a_spilled_transaction_replays_in_order(tmp_path: Path, memory_limit: int) -> None:
    """Past its memory limit a transaction goes to a file (in memory up to the limit, the
    rest there); the replay reads both in order, tells the consumer every REPLAY_TICK
    messages, and removes the file."""
    buffer, recorder = _buffer(tmp_path, memory_limit=memory_limit)
    xid, sub = 1000, 1001
    count = 3 * REPLAY_TICK + 10
    for block in range(3):
        inserts = [(_insert(v, sub if v % 7 == 0 else xid), 0x10000 + v)
                   for v in range(block * count // 3, (block + 1) * count // 3)]
        _streamed_block(buffer, xid, block == 0, *inserts)
    assert buffer.streamed[xid].spilled
    assert buffer.buffered_bytes <= memory_limit + 4000
    assert [p.suffix for p in tmp_path.iterdir()] == [".spill"]
    _feed(buffer, (pg.StreamAbort(xid, sub, None, None), 0),
          (pg.StreamCommit(xid, 0, 0x90000, 0x90010, 11), 0))
    kept = [str(v) for v in range(count) if v % 7 != 0]
    assert recorder.rows == kept
    assert sum(1 for e in recorder.log if e[0] == "tick") == len(kept) // REPLAY_TICK
    assert buffer.idle and not list(tmp_path.iterdir())


def test_reset_in_a_streamed_block_forgets_it(tmp_path: Path) -> None:
    buffer, recorder = _buffer(tmp_path, memory_limit=0)
    _feed(buffer, (pg.StreamStart(1100, True), 0), (_insert(1, 1100), 0x100), streaming=True)
    _feed(buffer, (pg.BeginPrepare(0x10, 0x18, 5, 1101, "g"), 0))
    buffer.reset()
    assert buffer.idle and not list(tmp_path.iterdir())
    # the server starts again from the confirmed position: a plain transaction
    _feed(buffer, (pg.Begin(0x500, 0, 7), 0), (_insert(2), 0x100),
          (pg.Commit(0, 0x500, 0x510, 7), 0x500))
    assert recorder.rows == ["2"]

