"""pgoutput TupleData: cut out of a message, and straight into a typed row.

Two functions, each in two implementations with identical results and errors:

- :func:`tuple_data` returns the raw column values (``str`` for text, ``bytes``
  for binary, ``None`` for NULL, the *unchanged* marker for an unchanged
  TOASTed value) and the position after the tuple;
- :func:`decode_row` walks the tuple once and returns the typed row (each text
  value passed through its column's decoder, each binary value through its
  column's binary decoder when it has one), the names of the unchanged
  columns, and the position after the tuple.

The reference is the Python below.  ``decoder/_fastrow.c`` compiles the same
loop (the decoder's profile in docs/benchmarks.md shows the per-column
interpreter overhead as the largest single cost); it is used when it is built,
unless ``PGCDC_PURE_PYTHON=1``.  ``tests/unit/test_fastrow.py`` checks both
against each other on generated and malformed input.

Malformed input raises :class:`TupleError` with ``(reason, offset)``; the
message parser turns it into its :class:`~decoder.errors.DecodeError`.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import Any, Final

Row = dict[str, Any]
Column = (tuple[str, Callable[[str], Any] | None]
          | tuple[str, Callable[[str], Any] | None, Callable[[bytes], Any] | None])
Columns = tuple[Column, ...]
"""One ``(name, decode)`` pair or ``(name, decode, decode_binary)`` triple per column:
``decode`` reads a text value (``None`` keeps the text), ``decode_binary`` a binary one
(``'b'``, the ``binary`` option; decoder/binary.py); without it, or ``None``, the bytes
are kept."""

_i16 = struct.Struct("!h").unpack_from
_i32 = struct.Struct("!i").unpack_from


class PyTupleError(ValueError):
    """Malformed tuple data: ``args`` are ``(reason, offset)``."""


def _start(buf: bytes, pos: int) -> tuple[int, int]:
    end = len(buf)
    if not 0 <= pos <= end:
        msg = f"position {pos} outside a buffer of {end} bytes"
        raise IndexError(msg)
    if pos + 2 > end:
        raise PyTupleError(f"needs 2 more bytes, {end - pos} left", pos)
    (ncols,) = _i16(buf, pos)
    pos += 2
    if ncols < 0:
        raise PyTupleError(f"negative column count {ncols}", pos)
    return ncols, pos


def _column(buf: bytes, pos: int, end: int) -> tuple[int, object, int]:
    """(kind byte, value, position after it) of the column at ``pos``."""
    if pos >= end:
        raise PyTupleError("tuple data ends before its last column", pos)
    kind = buf[pos]
    pos += 1
    if kind == 0x74 or kind == 0x62:  # 't' text, 'b' binary
        if pos + 4 > end:
            raise PyTupleError("column length cut short", pos)
        (length,) = _i32(buf, pos)
        pos += 4
        if length < 0 or pos + length > end:
            raise PyTupleError(f"column length {length} exceeds the message", pos)
        raw = bytes(buf[pos : pos + length])
        pos += length
        if kind == 0x62:
            return kind, raw, pos
        try:
            return kind, raw.decode("utf-8"), pos
        except UnicodeDecodeError as exc:
            raise PyTupleError(f"text column is not valid UTF-8: {exc}", pos) from None
    if kind == 0x6E or kind == 0x75:  # 'n' NULL, 'u' unchanged TOAST
        return kind, None, pos
    raise PyTupleError(f"unknown tuple column kind {kind:#x}", pos - 1)


def py_tuple_data(buf: bytes, pos: int, unchanged: object) -> tuple[tuple[Any, ...], int]:
    ncols, pos = _start(buf, pos)
    end = len(buf)
    values: list[object] = []
    for _ in range(ncols):
        kind, value, pos = _column(buf, pos, end)
        values.append(unchanged if kind == 0x75 else value)
    return tuple(values), pos


def py_decode_row(buf: bytes, pos: int, columns: Columns) -> tuple[Row, tuple[str, ...], int]:
    ncols, pos = _start(buf, pos)
    if ncols != len(columns):
        raise PyTupleError(
            f"tuple has {ncols} columns, its table version has {len(columns)}", pos)
    end = len(buf)
    row: Row = {}
    unchanged: list[str] = []
    for column in columns:
        name, decode = column[0], column[1]
        kind, value, pos = _column(buf, pos, end)
        if kind == 0x75:
            unchanged.append(name)
        elif kind == 0x74 and decode is not None:
            row[name] = decode(value)  # type: ignore[arg-type]
        elif kind == 0x62 and len(column) == 3 and column[2] is not None:
            row[name] = column[2](value)  # type: ignore[arg-type]
        else:
            row[name] = value
    return row, tuple(unchanged), pos


def _compiled() -> Any:
    if os.environ.get("PGCDC_PURE_PYTHON") == "1":
        return None
    try:
        from decoder import _fastrow
    except ImportError:  # not built: the reference serves, only slower
        return None
    return _fastrow


_fast = _compiled()
COMPILED: Final = _fast is not None
TupleError: Final[type[ValueError]] = _fast.TupleError if _fast else PyTupleError
tuple_data: Final[Callable[[bytes, int, object], tuple[tuple[Any, ...], int]]] = (
    _fast.tuple_data if _fast else py_tuple_data)
decode_row: Final[Callable[[bytes, int, Columns], tuple[Row, tuple[str, ...], int]]] = (
    _fast.decode_row if _fast else py_decode_row)
CompiledBinaryDecoder: Final[Callable[..., Callable[[bytes], Any]] | None] = (
    _fast.BinaryDecoder if _fast else None)
"""``decoder._fastrow.BinaryDecoder(kind, fallback, element=None, element_oid=0)``: a
binary value of a common type read in C (decoder/binary.py makes one per column whose
type it reads), or None when the compiled loop is not loaded."""
