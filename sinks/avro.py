"""Avro encoding of change events: one writer schema per table version.

The value schema is the Debezium envelope (``before``, ``after``, ``source``,
``op``, ``ts_ms``, plus ``unchanged``) with a ``Row`` record whose fields are
the table version's columns, each nullable.  Column types map to Avro as:

* ``bool`` -> boolean; ``int2``/``int4`` -> int; ``int8``/``oid`` -> long;
  ``float4`` -> float; ``float8`` -> double; ``bytea`` -> bytes;
* every other type -> string, with the same text as the JSON envelope
  (``numeric`` exact, timestamps ISO 8601 or the server's text for
  ``infinity``, structured values as JSON).

Field names must be Avro names; a column whose name is not one gets a
sanitized name (``_`` for each other character, ``_<position>`` appended) and
keeps its real name in the field attribute ``pgcdc.column``.  The key schema is
a record of the key columns.  Avro binary encoding of a fixed schema is
injective, so two keys never encode alike.

Messages carry no schema id in their bytes (no registry is needed): the
``pgcdc.table_version`` header names the version, and the catalog log
(``<prefix>._catalog``) publishes each version's key and value schemas before
the first event that uses it.  With a schema registry (``--schema-registry-url``,
sinks/registry.py) the same bytes follow the Confluent wire format's 5-byte header.
"""

from __future__ import annotations

import functools
import io
import json
import math
import numbers
import operator
import os
import re
import struct
from collections.abc import Callable
from typing import Any, Final

import fastavro

from core import wire
from core.wire import CONNECTOR, PRODUCER_VERSION
from decoder.change import ChangeEvent, unix_millis
from decoder.pgoutput import PG_EPOCH_OFFSET_US
from sinks.avro_logical import LogicalTypes, boolean_writer, compiled_kind, varint
from sinks.envelope import text_of
from sinks.snapshot_marks import MarkedRead
from snapshot_builder.catalog import Column, TableVersion

_AVRO_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NOT_NAME = re.compile(r"[^A-Za-z0-9_]")

_PRIMITIVE: dict[str, str] = {
    "bool": "boolean", "int2": "int", "int4": "int", "int8": "long", "oid": "long",
    "float4": "float", "float8": "double", "bytea": "bytes",
}

_SOURCE = {
    "type": "record", "name": "Source", "namespace": "pgcdc",
    "fields": [
        {"name": wire.SOURCE_VERSION, "type": "string"},
        {"name": wire.SOURCE_CONNECTOR, "type": "string"},
        {"name": wire.SOURCE_NAME, "type": "string"},
        {"name": wire.SOURCE_TS_MS, "type": "long"},
        {"name": wire.SOURCE_SNAPSHOT, "type": "string"},
        {"name": wire.SOURCE_DB, "type": "string"},
        {"name": wire.SOURCE_SCHEMA, "type": "string"},
        {"name": wire.SOURCE_TABLE, "type": "string"},
        {"name": wire.SOURCE_TX_ID, "type": "long"},
        {"name": wire.SOURCE_LSN, "type": "long"},
        {"name": wire.SOURCE_COMMIT_LSN, "type": "long"},
        {"name": wire.SOURCE_ORDINAL, "type": "long"},
        {"name": wire.SOURCE_TABLE_OID, "type": "long"},
        {"name": wire.SOURCE_TABLE_VERSION, "type": "string"},
    ],
}


def field_name(column: Column, position: int) -> str:
    if _AVRO_NAME.match(column.name):
        return column.name
    return f"{_NOT_NAME.sub('_', column.name)}_{position}"


def _namespace(table: TableVersion) -> str:
    parts = [_NOT_NAME.sub("_", p) for p in ("pgcdc", table.schema, table.name)]
    return ".".join(p if p and not p[0].isdigit() else f"_{p}" for p in parts)


def _field_names(table: TableVersion, columns: tuple[Column, ...]) -> list[str]:
    """The Avro field names of ``columns`` (a name made of a column's position in the table)."""
    positions = {c.name: i for i, c in enumerate(table.columns)}
    return [field_name(c, positions[c.name]) for c in columns]


def _row_schema(name: str, table: TableVersion, columns: tuple[Column, ...],
                logical: LogicalTypes | None = None) -> dict[str, Any]:
    names = _field_names(table, columns)
    if logical is None:
        types = [["null", text_avro_type(c)] for c in columns]
    else:  # typed Avro (sinks/avro_logical.py)
        slots = logical.slots(_namespace(table), table.qualified_name, columns, names)
        types = [["null", *slot.branches] for slot in slots]
    return {
        "type": "record", "name": name, "namespace": _namespace(table),
        "fields": [
            {"name": n, "type": t, "default": None, wire.COLUMN_ATTRIBUTE: c.name}
            for n, t, c in zip(names, types, columns, strict=True)
        ],
    }


def key_schema(table: TableVersion, logical: LogicalTypes | None = None) -> dict[str, Any]:
    """The key's writer schema; ``logical``: typed Avro (``--avro-types logical``)."""
    return _row_schema("Key", table, table.key_columns, logical)


def value_schema(table: TableVersion, logical: LogicalTypes | None = None) -> dict[str, Any]:
    """The value's writer schema; ``logical``: typed Avro (``--avro-types logical``)."""
    row = _row_schema("Row", table, table.columns, logical)
    return {
        "type": "record", "name": "Envelope", "namespace": _namespace(table),
        "fields": [
            {"name": wire.BEFORE, "type": ["null", row], "default": None},
            {"name": wire.AFTER, "type": ["null", f"{_namespace(table)}.Row"], "default": None},
            {"name": wire.SOURCE, "type": _SOURCE},
            {"name": wire.OP, "type": "string"},
            {"name": wire.TS_MS, "type": "long"},
            {"name": wire.UNCHANGED, "type": {"type": "array", "items": "string"}},
        ],
    }


# --- the binary encoding ----------------------------------------------------------------------
#
# Each event is written straight into a bytearray by writers chosen once per table version:
# the bytes fastavro.schemaless_writer gives for the schemas above (tests/unit/test_avro.py
# checks them against it), without its per-call schema walk and union matching.  Avro binary:
# a long or int is a zigzag varint, a float or double little-endian IEEE, bytes and strings
# their length (a long) and data; a union is its branch index (a long), then the value;
# a record is its fields in order; an array its item count, the items, then 0.

_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_pack_float = struct.Struct("<f").pack
_pack_double = struct.Struct("<d").pack

FieldWriter = Callable[[bytearray, Any], None]
"""Appends a non-null value to Avro bytes as one nullable field: its union branch (1, zigzag
``0x02``), then the value; a ValueError for a value not of its type."""


def _mismatch(value: Any, avro_type: str) -> ValueError:
    return ValueError(f"{value!r} (type {type(value)}) is not an Avro {avro_type}")


def _integral(value: Any, avro_type: str, low: int, high: int) -> int:
    """The int of a value fastavro would accept for ``int``/``long`` (the slow path)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) \
            or not low <= int(value) <= high:
        raise _mismatch(value, avro_type)
    return int(value)


def py_long(out: bytearray, value: int) -> None:
    """A long outside a union (the envelope's own fields)."""
    if type(value) is not int or not _LONG_MIN <= value <= _LONG_MAX:
        value = _integral(operator.index(value), "long", _LONG_MIN, _LONG_MAX)
    varint(out, (value << 1) ^ (value >> 63))


def _string(text: str) -> bytes:
    data = text.encode()
    out = bytearray()
    varint(out, len(data) << 1)
    return bytes(out + data)


# Column writers: the union branch of a non-null value (1, zigzag 0x02), then the value.

_write_boolean = boolean_writer(lambda value: _mismatch(value, "boolean"))


def _write_int(out: bytearray, value: Any) -> None:
    if type(value) is not int or not _INT_MIN <= value <= _INT_MAX:
        value = _integral(value, "int", _INT_MIN, _INT_MAX)
    out.append(2)
    varint(out, (value << 1) ^ (value >> 31))


def _write_long(out: bytearray, value: Any) -> None:
    if type(value) is not int or not _LONG_MIN <= value <= _LONG_MAX:
        value = _integral(value, "long", _LONG_MIN, _LONG_MAX)
    out.append(2)
    varint(out, (value << 1) ^ (value >> 63))


def _write_float(out: bytearray, value: Any) -> None:
    number = float(value)
    out.append(2)
    try:
        out += _pack_float(number)
    except OverflowError:  # beyond float32: the C cast fastavro does gives an infinity
        out += _pack_float(math.copysign(math.inf, number))


def _write_double(out: bytearray, value: Any) -> None:
    out.append(2)
    out += _pack_double(float(value))


def _write_bytes(out: bytearray, value: Any) -> None:
    if not isinstance(value, bytes | bytearray):
        raise _mismatch(value, "bytes")
    out.append(2)
    varint(out, len(value) << 1)
    out += value


_SHORT_STRING = [bytes((2, size << 1)) for size in range(64)]  # branch and length of one


def _write_string(out: bytearray, value: Any) -> None:
    data = (value if type(value) is str else text_of(value)).encode()
    size = len(data)
    if size < 64:
        out += _SHORT_STRING[size]
    else:
        out.append(2)
        varint(out, size << 1)
    out += data


_WRITERS: dict[str, FieldWriter] = {
    "boolean": _write_boolean, "int": _write_int, "long": _write_long,
    "float": _write_float, "double": _write_double, "bytes": _write_bytes,
    "string": _write_string,
}



def text_avro_type(column: Column) -> str:
    """The Avro type of a column's values in text mode (``--avro-types text``, the module
    docstring): an Avro primitive, or ``string`` for every type that is not one."""
    return _PRIMITIVE.get(column.type_name, "string")


def field_writer(avro_type: str) -> FieldWriter:
    """How the encoder writes a non-null value of a text-mode field of ``avro_type`` (a
    value of :func:`text_avro_type`): the same bytes, for a writer of its own (the initial
    load's compiled path, sinks/loadfast.py, for the values it leaves to Python)."""
    return _WRITERS[avro_type]


_KINDS = {kind: code for code, kind in enumerate(
    ("boolean", "int", "long", "float", "double", "bytes", "string"))}  # as in _fastrow.c

_Fields = tuple[tuple[str, int, FieldWriter], ...]
"""Per column: its name, its Avro type's code in ``_KINDS``, and its writer."""


def py_write_row(out: bytearray, row: dict[str, Any], fields: _Fields) -> None:
    """The fields of a ``Row`` or ``Key`` record: a missing or null column is null (0)."""
    get = row.get
    for name, _, write in fields:
        value = get(name)
        if value is None:
            out.append(0)
        else:
            write(out, value)


def _fields(columns: tuple[Column, ...]) -> _Fields:
    kinds = (text_avro_type(c) for c in columns)
    return tuple((c.name, _KINDS[kind], _WRITERS[kind])
                 for c, kind in zip(columns, kinds, strict=True))


def _logical_fields(table: TableVersion, columns: tuple[Column, ...],
                    logical: LogicalTypes) -> _Fields:
    """Typed Avro's writers, each with the kind sinks/_fastavro.c writes itself (integers,
    strings, dates, timestamps, times, decimals up to 18 digits, arrays of integers); it
    calls the Python writer for the others (records, UUIDs, nested arrays, NaN, ...)."""
    slots = logical.slots(_namespace(table), table.qualified_name, columns,
                          _field_names(table, columns))
    return tuple((c.name, compiled_kind(slot), slot.write)
                 for c, slot in zip(columns, slots, strict=True))


# The Python encoder's loops (AvroEncoder(compiled=False), and the events the compiled
# encoder below leaves to it); sinks/_fastavro.c does the same in C.
_write_row: Callable[[bytearray, dict[str, Any], _Fields], None] = py_write_row
_envelope_long: Callable[[bytearray, int], None] = py_long

# A whole event, key and value, in one compiled call (sinks/_fastavro.c), when built: the
# Kafka path's profile (docs/benchmarks.md) shows the per-call overhead of the loops above
# and the Python text conversions of numeric, timestamptz and array values as the largest
# part of the sink's own time.  It reads the event by position and leaves whatever it does
# not write itself to the Python code above, so both give the same bytes and errors.
EventEncoder = Callable[[ChangeEvent, int], tuple[bytes, bytes]]
"""The key and value of an event of one table version, given ``now_ms``."""

_Plan = tuple[_Fields, _Fields, bytes, bytes, bytes, bytes, bytes, dict[str, bytes],
              dict[str, bytes], Callable[[Any], str], int, EventEncoder, bytes, bytes]
"""What sinks/_fastavro.c's ``encode`` needs of one table version and server name; then
the Python encoder, for the events it leaves to it, and the bytes before each key and each
value (:meth:`AvroEncoder.heads`)."""

Heads = tuple[bytes, bytes]
_NO_HEADS: Heads = (b"", b"")

_EVENT_FIELDS = ("op", "table", "before", "after", "unchanged", "commit_lsn", "lsn", "ordinal",
                 "xid", "commit_time")
if ChangeEvent._fields != _EVENT_FIELDS:  # pragma: no cover - guards the C code's positions
    msg = f"ChangeEvent's fields changed to {ChangeEvent._fields}: update sinks/_fastavro.c"
    raise ImportError(msg)
if PG_EPOCH_OFFSET_US % 1000:  # pragma: no cover - the C code adds whole milliseconds
    msg = "PG_EPOCH_OFFSET_US is not a whole number of milliseconds"
    raise ImportError(msg)


def _compiled_encoder() -> Callable[[_Plan, ChangeEvent, int], tuple[bytes, bytes]] | None:
    if os.environ.get("PGCDC_PURE_PYTHON") == "1":
        return None
    try:
        from sinks import _fastavro
    except ImportError:  # not built: the Python encoder serves, only slower
        return None
    return _fastavro.encode


_compiled_encode: Final = _compiled_encoder()
COMPILED_ENCODER: Final = _compiled_encode is not None


class _Version:
    """The writers of one table version, and the constant bytes of its envelope."""

    __slots__ = ("fields", "key_fields", "null_key", "names", "_heads", "_snapshot",
                 "_read_snapshot", "_names", "_table", "_plans")

    def __init__(self, table: TableVersion, logical: LogicalTypes | None = None) -> None:
        fastavro.parse_schema(key_schema(table, logical))  # both schemas are valid Avro
        fastavro.parse_schema(value_schema(table, logical))
        if logical is None:
            self.fields = _fields(table.columns)
            self.key_fields = _fields(table.key_columns)
        else:
            self.fields = _logical_fields(table, table.columns, logical)
            self.key_fields = _logical_fields(table, table.key_columns, logical)
        self.null_key = b"\x00" * len(self.key_fields)
        self.names = {c.name: _string(c.name) for c in table.columns}
        self._heads: dict[str, bytes] = {}
        # Source: ..., ts_ms, [snapshot, db, schema, table], txId, lsn, commit_lsn, ordinal,
        # [table_oid, table_version]
        middle = _string("") + _string(table.schema) + _string(table.name)
        self._snapshot = _string("false") + middle
        self._read_snapshot = _string("true") + middle
        self._names = middle  # db, schema, table: after the snapshot mark
        table_part = bytearray()
        _envelope_long(table_part, table.oid)
        self._table = bytes(table_part + _string(table.version))
        self._plans: dict[tuple[str, Heads], _Plan] = {}

    def plan(self, server_name: str, heads: Heads = _NO_HEADS) -> _Plan:
        """Everything sinks/_fastavro.c's ``encode`` needs, for one server name."""
        plan = self._plans.get((server_name, heads))
        if plan is None:
            plan = self._plans[(server_name, heads)] = (
                self.fields, self.key_fields, self.null_key, self.head(server_name),
                self._snapshot, self._read_snapshot, self._table, self.names, _OPS, text_of,
                PG_EPOCH_OFFSET_US // 1000, self.python_encoder(server_name, heads), *heads)
        return plan

    def python_encoder(self, server_name: str, heads: Heads = _NO_HEADS) -> EventEncoder:
        key_head, value_head = heads
        if not key_head and not value_head:
            def encode(event: ChangeEvent, now_ms: int) -> tuple[bytes, bytes]:
                return self.key(event), self.value(event, server_name, now_ms)
            return encode

        def framed(event: ChangeEvent, now_ms: int) -> tuple[bytes, bytes]:
            return (key_head + self.key(event),
                    value_head + self.value(event, server_name, now_ms))
        return framed

    def head(self, server_name: str) -> bytes:
        """Source.version, Source.connector and Source.name."""
        head = self._heads.get(server_name)
        if head is None:
            head = self._heads[server_name] = (
                _string(PRODUCER_VERSION) + _string(CONNECTOR) + _string(server_name))
        return head

    def read_frame(self, server_name: str, lsn: int, commit_time: int,
                   snapshot: str = "true") -> tuple[bytes, bytes]:
        """The constant bytes of a read event's value around its ordinal (sinks/_loadfast.c):
        what :meth:`value` writes after the Row record up to the ordinal, and from there up
        to ``ts_ms`` (the load's events: ``xid`` 0, ``lsn`` and ``commit_lsn`` the load's;
        ``snapshot`` the mark, sinks/snapshot_marks.py)."""
        middle = bytearray(self.head(server_name))
        _envelope_long(middle, unix_millis(commit_time))
        middle += _string(snapshot) + self._names
        for number in (0, lsn, lsn):  # txId, lsn, commit_lsn
            _envelope_long(middle, number)
        return bytes(middle), self._table + _OPS["r"]

    def key(self, event: ChangeEvent) -> bytes:
        row = event.after if event.after is not None else event.before
        if row is None:
            return self.null_key
        out = bytearray()
        _write_row(out, row, self.key_fields)
        return bytes(out)

    def value(self, event: ChangeEvent, server_name: str, now_ms: int) -> bytes:
        out = bytearray()
        fields = self.fields
        for row in (event.before, event.after):
            if row is None:
                out.append(0)
            else:
                out.append(2)
                _write_row(out, row, fields)
        out += self.head(server_name)
        _envelope_long(out, unix_millis(event.commit_time))
        op = event.op
        if op != "r":
            out += self._snapshot
        elif isinstance(event, MarkedRead):  # a marked read (sinks/snapshot_marks.py)
            out += _string(event.snapshot) + self._names
        else:
            out += self._read_snapshot
        _envelope_long(out, event.xid)
        _envelope_long(out, event.lsn)
        _envelope_long(out, event.commit_lsn)
        _envelope_long(out, event.ordinal)
        out += self._table
        out += _OPS.get(op) or _string(op)
        _envelope_long(out, now_ms)
        unchanged = event.unchanged
        if unchanged:
            varint(out, len(unchanged) << 1)
            names = self.names
            for name in unchanged:
                out += names.get(name) or _string(name)
        out.append(0)
        return bytes(out)


_OPS = {op: _string(op) for op in ("c", "u", "d", "r", "t")}


class AvroEncoder:
    """Keys and values of change events in Avro, per table version.

    ``compiled``: encode with sinks/_fastavro.c (the default when it is built) or with
    the Python code only; both give the same bytes and errors.  ``logical``: typed Avro
    (``--avro-types logical``, sinks/avro_logical.py; the compiled encoder writes the
    envelope and the common typed values, and calls the Python writer of the others);
    None: every column that is not an Avro primitive is a string (``--avro-types text``).
    """

    format = wire.FORMAT_AVRO

    def __init__(self, *, compiled: bool | None = None,
                 logical: LogicalTypes | None = None) -> None:
        self._versions: dict[tuple[int, str, str], _Version] = {}
        if compiled and not COMPILED_ENCODER:
            msg = "sinks._fastavro is not built: pip install -e . with a C compiler"
            raise ImportError(msg)
        self.logical = logical
        self._encode = _compiled_encode if compiled is not False else None

    @property
    def avro_types(self) -> str:
        """``logical`` (typed Avro) or ``text``: the catalog record's ``avro_types``."""
        return wire.AVRO_TYPES_TEXT if self.logical is None else wire.AVRO_TYPES_LOGICAL

    def _version(self, table: TableVersion) -> _Version:
        cached = self._versions.get((table.oid, table.layout, table.meta))
        if cached is None:
            cached = self._versions[(table.oid, table.layout, table.meta)] = \
                _Version(table, self.logical)
        return cached

    def schemas(self, table: TableVersion) -> dict[str, str]:
        """The writer schemas of a version, as published in the catalog log (with
        ``avro_types: logical`` for typed Avro; a record without it is ``text``)."""
        out = {wire.CATALOG_KEY_SCHEMA: json.dumps(key_schema(table, self.logical),
                                                   separators=(",", ":")),
               wire.CATALOG_VALUE_SCHEMA: json.dumps(value_schema(table, self.logical),
                                                     separators=(",", ":"))}
        if self.logical is not None:
            out[wire.CATALOG_AVRO_TYPES] = wire.AVRO_TYPES_LOGICAL
        return out

    def key(self, event: ChangeEvent) -> bytes:
        return self._version(event.table).key(event)

    def value(self, event: ChangeEvent, *, server_name: str, now_ms: int) -> bytes:
        return self.encode(event, server_name=server_name, now_ms=now_ms)[1]

    def encode(self, event: ChangeEvent, *, server_name: str,
               now_ms: int) -> tuple[bytes, bytes]:
        """The key and the value of one event."""
        return self.encoder_for(event.table, server_name)(event, now_ms)

    def heads(self, table: TableVersion) -> Heads:
        """The bytes before each key and each value of a version's events: none here; the
        Confluent wire format's schema ids with a registry (sinks/registry.py)."""
        return _NO_HEADS

    def read_frame(self, table: TableVersion, server_name: str, lsn: int,
                   commit_time: int, snapshot: str = "true") -> tuple[bytes, bytes]:
        """See :meth:`_Version.read_frame`."""
        return self._version(table).read_frame(server_name, lsn, commit_time, snapshot)

    def encoder_for(self, table: TableVersion, server_name: str) -> EventEncoder:
        """What :meth:`encode` does for the events of one table version, without looking the
        version up each time (the Kafka sink keeps one per table version)."""
        version = self._version(table)
        heads = self.heads(table)
        if self._encode is None:
            return version.python_encoder(server_name, heads)
        return functools.partial(self._encode, version.plan(server_name, heads))


def decode_value(table: TableVersion, raw: bytes,
                 logical: LogicalTypes | None = None) -> dict[str, Any]:
    """Read one value back (for consumers and tests)."""
    schema = fastavro.parse_schema(value_schema(table, logical))
    record = fastavro.schemaless_reader(io.BytesIO(raw), schema, None)
    assert isinstance(record, dict)
    return record
