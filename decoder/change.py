"""A decoded change: one row event with everything needed to address and apply it.

``(commit_lsn, ordinal)`` orders and de-duplicates events (DESIGN.md invariant
2); ``lsn`` alone does not, because it is not monotonic across interleaved
transactions.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from decoder import pgoutput
from decoder.errors import DecodeError
from decoder.pgoutput import PG_EPOCH_OFFSET_US, UNCHANGED_TOAST, TupleData
from decoder.text_parsers import decoder_for
from decoder.tuples import Columns, TupleError, decode_row
from snapshot_builder.catalog import TableVersion

Row = dict[str, Any]

CREATE: Final = "c"
UPDATE: Final = "u"
DELETE: Final = "d"
TRUNCATE: Final = "t"
READ: Final = "r"



def unix_millis(pg_microseconds: int) -> int:
    return (pg_microseconds + PG_EPOCH_OFFSET_US) // 1000


class ChangeEvent(NamedTuple):
    """Immutable; a named tuple because one is built per change (a frozen dataclass
    costs four times as much to build)."""

    op: str
    table: TableVersion
    before: Row | None
    after: Row | None
    unchanged: tuple[str, ...]  # columns whose TOASTed value the server did not resend
    commit_lsn: int
    lsn: int
    ordinal: int
    xid: int
    commit_time: int  # microseconds since 2000-01-01 UTC

    @property
    def key(self) -> Row:
        """The primary key (replica identity key) values of the row."""
        row = self.after if self.after is not None else self.before
        if row is None:
            return {}
        return {c.name: row.get(c.name) for c in self.table.key_columns}


class RowDecoder:
    """Turns tuple data of one table version into a dict of typed values.

    ``binary``: the binary decoder of a column type, from its OID and name
    (decoder/binary.py), for values the server sends in binary (the ``binary`` option);
    without it they stay bytes.
    """

    __slots__ = ("columns",)

    def __init__(self, table: TableVersion,
                 lookup: Callable[[int], Callable[[str], Any]] = decoder_for,
                 binary: Callable[[int, str], Callable[[bytes], Any]] | None = None) -> None:
        # str is the identity on text, bytes on binary: None spares the call.
        if binary is None:
            self.columns: Columns = tuple(
                (c.name, _unless(lookup(c.type_oid), str)) for c in table.columns)
        else:
            self.columns = tuple(
                (c.name, _unless(lookup(c.type_oid), str),
                 _unless(binary(c.type_oid, c.type_name), bytes)) for c in table.columns)

    def decode(self, data: TupleData) -> tuple[Row, tuple[str, ...]]:
        row: Row = {}
        unchanged: list[str] = []
        for column, raw in zip(self.columns, data, strict=True):
            name, decode = column[0], column[1]
            if raw is UNCHANGED_TOAST:
                unchanged.append(name)
            elif decode is not None and isinstance(raw, str):
                row[name] = decode(raw)
            elif len(column) == 3 and column[2] is not None and isinstance(raw, bytes):
                row[name] = column[2](raw)
            else:
                row[name] = raw
        return row, tuple(unchanged)


def _unless(decode: Callable[[Any], Any], identity: type) -> Callable[[Any], Any] | None:
    return None if decode is identity else decode


_u32 = struct.Struct("!I").unpack_from
_INSERT, _UPDATE, _DELETE = b"IUD"
_NEW, _KEY, _OLD = b"NKO"


class _Malformed(Exception):
    pass


Change = tuple[str, TableVersion, Row | None, Row | None, tuple[str, ...]]
"""(op, table version, before, after, unchanged columns)."""


def decode_change(payload: bytes,
                  current: Callable[[int], tuple[TableVersion, RowDecoder]], *,
                  streaming: bool = False) -> Change:
    """An Insert, Update or Delete message (outside a streamed block) straight to rows.

    The same result as :func:`decoder.pgoutput.parse` followed by
    :meth:`RowDecoder.decode` on each tuple, in one pass and without the message
    object: this is the path almost every byte of the stream takes.  ``streaming``: the
    message comes from a streamed block, with the transaction's xid after the tag.  On
    malformed input the parser itself is asked, so the error is the parser's own, with its
    tag and offset.
    """
    tag = payload[0]
    at = 5 if streaming else 1  # the relation OID, after the tag (and the xid)
    try:
        (oid,) = _u32(payload, at)
        table, decoder = current(oid)
        columns = decoder.columns
        kind = payload[at + 4]
        start = at + 5
        before: Row | None = None
        after: Row | None = None
        unchanged: tuple[str, ...] = ()
        if tag == _INSERT and kind == _NEW:
            op = CREATE
            after, unchanged, pos = decode_row(payload, start, columns)
        elif tag == _UPDATE:
            op = UPDATE
            pos = start
            if kind == _KEY or kind == _OLD:
                before, _, pos = decode_row(payload, start, columns)
                if payload[pos] != _NEW:
                    raise _Malformed
                pos += 1
            elif kind != _NEW:
                raise _Malformed
            after, unchanged, pos = decode_row(payload, pos, columns)
        elif tag == _DELETE and (kind == _KEY or kind == _OLD):
            op = DELETE
            before, _, pos = decode_row(payload, start, columns)
        else:
            raise _Malformed
        if pos != len(payload):
            raise _Malformed
    except Exception as exc:
        # Malformed bytes get the parser's own error, whatever failed first here (a
        # column's decoder may have met a cut value before the cut was noticed).
        pgoutput.parse(payload, streaming=streaming)
        if isinstance(exc, TupleError):  # well-formed, but not the table version's shape
            reason, offset = exc.args
            raise DecodeError(reason, tag=chr(tag), offset=offset) from None
        if isinstance(exc, _Malformed | IndexError | struct.error):
            msg = "not an Insert, Update or Delete the parser reads alike"
            raise DecodeError(msg, tag=chr(tag), offset=0) from None
        raise
    return op, table, before, after, unchanged
