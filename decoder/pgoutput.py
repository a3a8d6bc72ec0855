"""The pgoutput logical replication protocol, versions 1 to 4: data in, data out, no I/O.

One frozen dataclass per message; one parser per tag byte in ``_PARSERS``;
``parse(buf, streaming=...)`` turns the payload of one XLogData message into a
message object.  Inside a streamed block (between Stream Start and Stream
Stop) the data messages carry the xid of their transaction first; the caller
knows whether it is inside such a block and says so.

A tuple column is a small closed union: ``None`` (NULL), :data:`UNCHANGED_TOAST`
(an unchanged TOASTed value the server did not send), ``str`` (text format) or
``bytes`` (binary format).

Reference: PostgreSQL's "Logical Replication Message Formats".
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from decoder import tuples
from decoder.errors import DecodeError

# PostgreSQL timestamps count microseconds from 2000-01-01 00:00 UTC.
PG_EPOCH_OFFSET_US: Final = 946_684_800_000_000


class _UnchangedToast:
    """The marker for a TOASTed value the server did not resend."""

    __slots__ = ()
    _instance: _UnchangedToast | None = None

    def __new__(cls) -> _UnchangedToast:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Final = _UnchangedToast()

TupleValue = None | _UnchangedToast | str | bytes
TupleData = tuple[TupleValue, ...]

# --- tag bytes: the first byte of every message ---------------------------------------------
# The parser table below is keyed by them; the reorder buffer (decoder/reorder.py) routes on
# them before parsing, so that a row change reaches its decoder as bytes.

TAG_BEGIN: Final = ord("B")
TAG_COMMIT: Final = ord("C")
TAG_ORIGIN: Final = ord("O")
TAG_RELATION: Final = ord("R")
TAG_TYPE: Final = ord("Y")
TAG_INSERT: Final = ord("I")
TAG_UPDATE: Final = ord("U")
TAG_DELETE: Final = ord("D")
TAG_TRUNCATE: Final = ord("T")
TAG_MESSAGE: Final = ord("M")
TAG_STREAM_START: Final = ord("S")
TAG_STREAM_STOP: Final = ord("E")
TAG_STREAM_COMMIT: Final = ord("c")
TAG_STREAM_ABORT: Final = ord("A")
TAG_BEGIN_PREPARE: Final = ord("b")
TAG_PREPARE: Final = ord("P")
TAG_COMMIT_PREPARED: Final = ord("K")
TAG_ROLLBACK_PREPARED: Final = ord("r")
TAG_STREAM_PREPARE: Final = ord("p")


# --- messages -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int
    commit_time: int  # microseconds since 2000-01-01 UTC
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int


@dataclass(frozen=True, slots=True)
class Origin:
    origin_lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class RelationColumn:
    flags: int  # 1: part of the replica identity key
    name: str
    type_oid: int
    typmod: int

    @property
    def is_key(self) -> bool:
        return bool(self.flags & 1)


@dataclass(frozen=True, slots=True)
class Relation:
    xid: int | None
    oid: int
    namespace: str
    name: str
    replica_identity: str  # 'd' default, 'n' nothing, 'f' full, 'i' index
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True, slots=True)
class Type:
    xid: int | None
    oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    xid: int | None
    relation_oid: int
    new: TupleData


@dataclass(frozen=True, slots=True)
class Update:
    xid: int | None
    relation_oid: int
    old_kind: str | None  # 'K' old key, 'O' old tuple (REPLICA IDENTITY FULL), None
    old: TupleData | None
    new: TupleData


@dataclass(frozen=True, slots=True)
class Delete:
    xid: int | None
    relation_oid: int
    old_kind: str  # 'K' or 'O'
    old: TupleData


TRUNCATE_CASCADE: Final = 1
TRUNCATE_RESTART_IDENTITY: Final = 2


@dataclass(frozen=True, slots=True)
class Truncate:
    xid: int | None
    options: int
    relation_oids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    xid: int | None
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


@dataclass(frozen=True, slots=True)
class StreamStart:
    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    pass


@dataclass(frozen=True, slots=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    xid: int
    subxid: int
    abort_lsn: int | None  # protocol 4 with parallel streaming only
    abort_time: int | None


@dataclass(frozen=True, slots=True)
class BeginPrepare:
    prepare_lsn: int
    end_lsn: int
    prepare_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class Prepare:
    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class CommitPrepared:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class RollbackPrepared:
    flags: int
    prepare_end_lsn: int
    rollback_end_lsn: int
    prepare_time: int
    rollback_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class StreamPrepare:
    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_time: int
    xid: int
    gid: str


Message = (
    Begin
    | Commit
    | Origin
    | Relation
    | Type
    | Insert
    | Update
    | Delete
    | Truncate
    | LogicalMessage
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
    | BeginPrepare
    | Prepare
    | CommitPrepared
    | RollbackPrepared
    | StreamPrepare
)


# --- parsing --------------------------------------------------------------------------------

_u8 = struct.Struct("!B").unpack_from
_i16 = struct.Struct("!h").unpack_from
_u32 = struct.Struct("!I").unpack_from
_u64 = struct.Struct("!Q").unpack_from


class _Reader:
    """A cursor over one message; every read checks the bounds it needs."""

    __slots__ = ("buf", "pos", "tag", "end")

    def __init__(self, buf: bytes, tag: str) -> None:
        self.buf = buf
        self.pos = 1
        self.tag = tag
        self.end = len(buf)

    def fail(self, reason: str) -> DecodeError:
        return DecodeError(reason, tag=self.tag, offset=self.pos)

    def need(self, n: int) -> None:
        if self.pos + n > self.end:
            raise self.fail(f"needs {n} more bytes, {self.end - self.pos} left")

    def u8(self) -> int:
        self.need(1)
        (v,) = _u8(self.buf, self.pos)
        self.pos += 1
        return int(v)

    def i16(self) -> int:
        self.need(2)
        (v,) = _i16(self.buf, self.pos)
        self.pos += 2
        return int(v)

    def u32(self) -> int:
        self.need(4)
        (v,) = _u32(self.buf, self.pos)
        self.pos += 4
        return int(v)

    def u64(self) -> int:
        self.need(8)
        (v,) = _u64(self.buf, self.pos)
        self.pos += 8
        return int(v)

    def unpack(self, unpack: struct.Struct, size: int) -> tuple[int, ...]:
        self.need(size)
        values = unpack.unpack_from(self.buf, self.pos)
        self.pos += size
        return tuple(int(v) for v in values)

    def cstring(self) -> str:
        nul = self.buf.find(b"\0", self.pos)
        if nul < 0:
            raise self.fail("string without terminating NUL")
        raw = self.buf[self.pos : nul]
        self.pos = nul + 1
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"string is not valid UTF-8: {exc}") from None

    def take(self, n: int) -> bytes:
        if n < 0:
            raise self.fail(f"negative length {n}")
        self.need(n)
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return bytes(raw)

    def xid_if(self, streaming: bool) -> int | None:
        return self.u32() if streaming else None

    def done(self) -> None:
        if self.pos != self.end:
            raise self.fail(f"{self.end - self.pos} trailing bytes")

    def tuple_data(self) -> TupleData:
        try:
            values, self.pos = tuples.tuple_data(self.buf, self.pos, UNCHANGED_TOAST)
        except tuples.TupleError as exc:
            reason, self.pos = exc.args
            raise self.fail(reason) from None
        return values


_S_BEGIN = struct.Struct("!QqI")
_S_COMMIT = struct.Struct("!BQQq")
_S_STREAM_COMMIT = struct.Struct("!IBQQq")
_S_PREPARE = struct.Struct("!BQQqI")
_S_BEGIN_PREPARE = struct.Struct("!QQqI")
_S_ROLLBACK = struct.Struct("!BQQqqI")
_S_COLUMN = struct.Struct("!Ii")
_S_ABORT_V4 = struct.Struct("!Qq")


def _begin_msg(r: _Reader, streaming: bool) -> Begin:
    lsn, ts, xid = r.unpack(_S_BEGIN, 20)
    return Begin(lsn, ts, xid)


def _commit_msg(r: _Reader, streaming: bool) -> Commit:
    flags, commit_lsn, end_lsn, ts = r.unpack(_S_COMMIT, 25)
    return Commit(flags, commit_lsn, end_lsn, ts)


def _origin_msg(r: _Reader, streaming: bool) -> Origin:
    lsn = r.u64()
    return Origin(lsn, r.cstring())


def _relation_msg(r: _Reader, streaming: bool) -> Relation:
    xid = r.xid_if(streaming)
    oid = r.u32()
    namespace = r.cstring()
    name = r.cstring()
    identity = chr(r.u8())
    ncols = r.i16()
    if ncols < 0:
        raise r.fail(f"negative column count {ncols}")
    columns = []
    for _ in range(ncols):
        flags = r.u8()
        col_name = r.cstring()
        type_oid, typmod = r.unpack(_S_COLUMN, 8)
        columns.append(RelationColumn(flags, col_name, type_oid, typmod))
    return Relation(xid, oid, namespace, name, identity, tuple(columns))


def _type_msg(r: _Reader, streaming: bool) -> Type:
    xid = r.xid_if(streaming)
    oid = r.u32()
    namespace = r.cstring()
    return Type(xid, oid, namespace, r.cstring())


def _expect(r: _Reader, allowed: bytes) -> str:
    kind = r.u8()
    if kind not in allowed:
        r.pos -= 1
        raise r.fail(f"expected one of {allowed.decode()!r}, got {kind:#x}")
    return chr(kind)


def _insert_msg(r: _Reader, streaming: bool) -> Insert:
    xid = r.xid_if(streaming)
    oid = r.u32()
    _expect(r, b"N")
    return Insert(xid, oid, r.tuple_data())


def _update_msg(r: _Reader, streaming: bool) -> Update:
    xid = r.xid_if(streaming)
    oid = r.u32()
    kind = _expect(r, b"KON")
    old_kind: str | None = None
    old: TupleData | None = None
    if kind != "N":
        old_kind = kind
        old = r.tuple_data()
        _expect(r, b"N")
    return Update(xid, oid, old_kind, old, r.tuple_data())


def _delete_msg(r: _Reader, streaming: bool) -> Delete:
    xid = r.xid_if(streaming)
    oid = r.u32()
    kind = _expect(r, b"KO")
    return Delete(xid, oid, kind, r.tuple_data())


def _truncate_msg(r: _Reader, streaming: bool) -> Truncate:
    xid = r.xid_if(streaming)
    count = r.u32()
    options = r.u8()
    r.need(4 * count)
    oids = tuple(r.u32() for _ in range(count))
    return Truncate(xid, options, oids)


def _message_msg(r: _Reader, streaming: bool) -> LogicalMessage:
    # Only transactional messages inside a streamed block carry the xid, but the
    # flag comes after it: PostgreSQL writes the xid whenever it streams.
    xid = r.xid_if(streaming)
    flags = r.u8()
    lsn = r.u64()
    prefix = r.cstring()
    length = r.u32()
    return LogicalMessage(xid, bool(flags & 1), lsn, prefix, r.take(length))


def _stream_start_msg(r: _Reader, streaming: bool) -> StreamStart:
    xid = r.u32()
    return StreamStart(xid, r.u8() == 1)


def _stream_stop_msg(r: _Reader, streaming: bool) -> StreamStop:
    return StreamStop()


def _stream_commit_msg(r: _Reader, streaming: bool) -> StreamCommit:
    xid, flags, commit_lsn, end_lsn, ts = r.unpack(_S_STREAM_COMMIT, 29)
    return StreamCommit(xid, flags, commit_lsn, end_lsn, ts)


def _stream_abort_msg(r: _Reader, streaming: bool) -> StreamAbort:
    xid = r.u32()
    subxid = r.u32()
    if r.pos == r.end:
        return StreamAbort(xid, subxid, None, None)
    abort_lsn, abort_time = r.unpack(_S_ABORT_V4, 16)
    return StreamAbort(xid, subxid, abort_lsn, abort_time)


def _begin_prepare_msg(r: _Reader, streaming: bool) -> BeginPrepare:
    lsn, end, ts, xid = r.unpack(_S_BEGIN_PREPARE, 28)
    return BeginPrepare(lsn, end, ts, xid, r.cstring())


def _prepare_fields(r: _Reader) -> tuple[int, int, int, int, int, str]:
    flags, lsn, end, ts, xid = r.unpack(_S_PREPARE, 29)
    return flags, lsn, end, ts, xid, r.cstring()


def _prepare_msg(r: _Reader, streaming: bool) -> Prepare:
    return Prepare(*_prepare_fields(r))


def _commit_prepared_msg(r: _Reader, streaming: bool) -> CommitPrepared:
    return CommitPrepared(*_prepare_fields(r))


def _stream_prepare_msg(r: _Reader, streaming: bool) -> StreamPrepare:
    return StreamPrepare(*_prepare_fields(r))


def _rollback_prepared_msg(r: _Reader, streaming: bool) -> RollbackPrepared:
    flags, prep_end, rb_end, prep_ts, rb_ts, xid = r.unpack(_S_ROLLBACK, 37)
    return RollbackPrepared(flags, prep_end, rb_end, prep_ts, rb_ts, xid, r.cstring())


_PARSERS: dict[int, Callable[[_Reader, bool], Message]] = {
    TAG_BEGIN: _begin_msg,
    TAG_COMMIT: _commit_msg,
    TAG_ORIGIN: _origin_msg,
    TAG_RELATION: _relation_msg,
    TAG_TYPE: _type_msg,
    TAG_INSERT: _insert_msg,
    TAG_UPDATE: _update_msg,
    TAG_DELETE: _delete_msg,
    TAG_TRUNCATE: _truncate_msg,
    TAG_MESSAGE: _message_msg,
    TAG_STREAM_START: _stream_start_msg,
    TAG_STREAM_STOP: _stream_stop_msg,
    TAG_STREAM_COMMIT: _stream_commit_msg,
    TAG_STREAM_ABORT: _stream_abort_msg,
    TAG_BEGIN_PREPARE: _begin_prepare_msg,
    TAG_PREPARE: _prepare_msg,
    TAG_COMMIT_PREPARED: _commit_prepared_msg,
    TAG_ROLLBACK_PREPARED: _rollback_prepared_msg,
    TAG_STREAM_PREPARE: _stream_prepare_msg,
}


def parse(buf: bytes, *, streaming: bool = False) -> Message:
    """Parse one pgoutput message; raise :class:`DecodeError` if it is malformed."""
    if not buf:
        raise DecodeError("empty message", tag=None, offset=0)
    tag = buf[0]
    parser = _PARSERS.get(tag)
    if parser is None:
        raise DecodeError(f"unknown message tag {tag:#x}", tag=chr(tag), offset=0)
    reader = _Reader(buf, chr(tag))
    message = parser(reader, streaming)
    reader.done()
    return message
