"""A pgoutput encoder for the tests: the exact inverse of :func:`decoder.pgoutput.parse`.

``encode(message, streaming=...)`` writes one message the way PostgreSQL's
``logicalrep_write_*`` functions do (protocol versions 1 to 4, "Logical
Replication Message Formats").  Inside a streamed block Relation, Type, Insert,
Update, Delete, Truncate and Message carry the int32 xid right after the tag;
such a message must then have an xid, and outside a streamed block it must not.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from decoder.pgoutput import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Type,
    Update,
)

_U8 = struct.Struct("!B")
_I16 = struct.Struct("!h")
_U32 = struct.Struct("!I")
_I32 = struct.Struct("!i")
_U64 = struct.Struct("!Q")
_I64 = struct.Struct("!q")


def _cstring(value: str) -> bytes:
    raw = value.encode("utf-8")
    if b"\0" in raw:
        raise ValueError(f"a protocol string cannot hold NUL: {value!r}")
    return raw + b"\0"


def _xid(message: Any, streaming: bool) -> bytes:
    xid = message.xid
    if streaming != (xid is not None):
        where = "inside" if streaming else "outside"
        raise ValueError(f"{type(message).__name__} {where} a streamed block with xid={xid!r}")
    return _U32.pack(xid) if streaming else b""


def _tuple(values: TupleData) -> bytes:
    out = [_I16.pack(len(values))]
    for value in values:
        if value is None:
            out.append(b"n")
        elif value is UNCHANGED_TOAST:
            out.append(b"u")
        elif isinstance(value, str):
            raw = value.encode("utf-8")
            out.append(b"t" + _I32.pack(len(raw)) + raw)
        elif isinstance(value, bytes):
            out.append(b"b" + _I32.pack(len(value)) + value)
        else:
            raise TypeError(f"not a tuple column value: {value!r}")
    return b"".join(out)


def _begin(m: Begin, streaming: bool) -> bytes:
    return b"B" + _U64.pack(m.final_lsn) + _I64.pack(m.commit_time) + _U32.pack(m.xid)


def _commit(m: Commit, streaming: bool) -> bytes:
    return (
        b"C" + _U8.pack(m.flags) + _U64.pack(m.commit_lsn) + _U64.pack(m.end_lsn)
        + _I64.pack(m.commit_time)
    )


def _origin(m: Origin, streaming: bool) -> bytes:
    return b"O" + _U64.pack(m.origin_lsn) + _cstring(m.name)


def _relation(m: Relation, streaming: bool) -> bytes:
    out = [
        b"R", _xid(m, streaming), _U32.pack(m.oid), _cstring(m.namespace), _cstring(m.name),
        _U8.pack(ord(m.replica_identity)), _I16.pack(len(m.columns)),
    ]
    for col in m.columns:
        out += [_U8.pack(col.flags), _cstring(col.name), _U32.pack(col.type_oid),
                _I32.pack(col.typmod)]
    return b"".join(out)


def _type(m: Type, streaming: bool) -> bytes:
    return b"Y" + _xid(m, streaming) + _U32.pack(m.oid) + _cstring(m.namespace) + _cstring(m.name)


def _insert(m: Insert, streaming: bool) -> bytes:
    return b"I" + _xid(m, streaming) + _U32.pack(m.relation_oid) + b"N" + _tuple(m.new)


def _update(m: Update, streaming: bool) -> bytes:
    head = b"U" + _xid(m, streaming) + _U32.pack(m.relation_oid)
    if m.old_kind is None:
        if m.old is not None:
            raise ValueError("an Update without old_kind cannot carry an old tuple")
        return head + b"N" + _tuple(m.new)
    if m.old_kind not in ("K", "O") or m.old is None:
        raise ValueError(f"bad old tuple: kind {m.old_kind!r}, values {m.old!r}")
    return head + m.old_kind.encode() + _tuple(m.old) + b"N" + _tuple(m.new)


def _delete(m: Delete, streaming: bool) -> bytes:
    if m.old_kind not in ("K", "O"):
        raise ValueError(f"bad old tuple kind {m.old_kind!r}")
    return (
        b"D" + _xid(m, streaming) + _U32.pack(m.relation_oid) + m.old_kind.encode()
        + _tuple(m.old)
    )


def _truncate(m: Truncate, streaming: bool) -> bytes:
    return (
        b"T" + _xid(m, streaming) + _U32.pack(len(m.relation_oids)) + _U8.pack(m.options)
        + b"".join(_U32.pack(oid) for oid in m.relation_oids)
    )


def _message(m: LogicalMessage, streaming: bool) -> bytes:
    return (
        b"M" + _xid(m, streaming) + _U8.pack(1 if m.transactional else 0) + _U64.pack(m.lsn)
        + _cstring(m.prefix) + _U32.pack(len(m.content)) + m.content
    )


def _stream_start(m: StreamStart, streaming: bool) -> bytes:
    return b"S" + _U32.pack(m.xid) + _U8.pack(1 if m.first_segment else 0)


def _stream_stop(m: StreamStop, streaming: bool) -> bytes:
    return b"E"


def _stream_commit(m: StreamCommit, streaming: bool) -> bytes:
    return (
        b"c" + _U32.pack(m.xid) + _U8.pack(m.flags) + _U64.pack(m.commit_lsn)
        + _U64.pack(m.end_lsn) + _I64.pack(m.commit_time)
    )


def _stream_abort(m: StreamAbort, streaming: bool) -> bytes:
    head = b"A" + _U32.pack(m.xid) + _U32.pack(m.subxid)
    if m.abort_lsn is None and m.abort_time is None:
        return head
    if m.abort_lsn is None or m.abort_time is None:
        raise ValueError("abort_lsn and abort_time come together or not at all")
    return head + _U64.pack(m.abort_lsn) + _I64.pack(m.abort_time)


def _begin_prepare(m: BeginPrepare, streaming: bool) -> bytes:
    return (
        b"b" + _U64.pack(m.prepare_lsn) + _U64.pack(m.end_lsn) + _I64.pack(m.prepare_time)
        + _U32.pack(m.xid) + _cstring(m.gid)
    )


def _prepare_like(tag: bytes, m: Prepare | StreamPrepare) -> bytes:
    return (
        tag + _U8.pack(m.flags) + _U64.pack(m.prepare_lsn) + _U64.pack(m.end_lsn)
        + _I64.pack(m.prepare_time) + _U32.pack(m.xid) + _cstring(m.gid)
    )


def _prepare(m: Prepare, streaming: bool) -> bytes:
    return _prepare_like(b"P", m)


def _stream_prepare(m: StreamPrepare, streaming: bool) -> bytes:
    return _prepare_like(b"p", m)


def _commit_prepared(m: CommitPrepared, streaming: bool) -> bytes:
    return (
        b"K" + _U8.pack(m.flags) + _U64.pack(m.commit_lsn) + _U64.pack(m.end_lsn)
        + _I64.pack(m.commit_time) + _U32.pack(m.xid) + _cstring(m.gid)
    )


def _rollback_prepared(m: RollbackPrepared, streaming: bool) -> bytes:
    return (
        b"r" + _U8.pack(m.flags) + _U64.pack(m.prepare_end_lsn) + _U64.pack(m.rollback_end_lsn)
        + _I64.pack(m.prepare_time) + _I64.pack(m.rollback_time) + _U32.pack(m.xid)
        + _cstring(m.gid)
    )


_ENCODERS: dict[type, Callable[[Any, bool], bytes]] = {
    Begin: _begin,
    Commit: _commit,
    Origin: _origin,
    Relation: _relation,
    Type: _type,
    Insert: _insert,
    Update: _update,
    Delete: _delete,
    Truncate: _truncate,
    LogicalMessage: _message,
    StreamStart: _stream_start,
    StreamStop: _stream_stop,
    StreamCommit: _stream_commit,
    StreamAbort: _stream_abort,
    BeginPrepare: _begin_prepare,
    Prepare: _prepare,
    CommitPrepared: _commit_prepared,
    RollbackPrepared: _rollback_prepared,
    StreamPrepare: _stream_prepare,
}

def encode(message: Message, streaming: bool = False) -> bytes:
    """The pgoutput bytes of ``message``; ``streaming`` as for :func:`decoder.pgoutput.parse`."""
    encoder = _ENCODERS.get(type(message))
    if encoder is None:
        raise TypeError(f"not a pgoutput message: {message!r}")
    return encoder(message, streaming)
