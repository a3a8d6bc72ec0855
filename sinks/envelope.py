"""The JSON envelope of a change event: Debezium's, in Debezium's encoding or pgcdc's.

The value is Debezium's payload as its ``JsonConverter`` writes it with
``schemas.enable=false``: ``before``, ``after``, ``source``, ``op``, ``ts_ms``.  How
column values are written depends on :class:`~sinks.debezium_json.JsonOptions`:

* ``mode="debezium"`` (``--format json``'s default): Debezium 3.6's encodings under its
  ``decimal.handling.mode``, ``time.precision.mode``, ``interval.handling.mode`` and
  ``binary.handling.mode`` (sinks/debezium_json.py says which value becomes what), so
  that ``before``, ``after``, ``op`` and ``source`` equal Debezium's record for the
  types Debezium and pgcdc both map (tests/unit/test_debezium_json.py and
  tests/integration/test_debezium_json.py compare them with records Debezium 3.6.1
  wrote).  ``source`` has Debezium's fields in Debezium's order (``version``
  ``pgcdc-1`` and ``connector`` ``pgcdc`` name the producer; ``sequence`` is
  ``["<commit LSN>","<LSN>"]``; ``txId`` is ``null`` for a read, which belongs to no
  transaction; ``xmin``, ``origin`` and ``origin_lsn`` are ``null``), the top level
  adds ``transaction`` (``null``), ``ts_us`` and ``ts_ns``.  Records carry the header
  ``pgcdc.format: debezium-json``.
* ``mode="pgcdc"`` (``--json-mode pgcdc``; what pgcdc's Spark job reads, header
  ``pgcdc.format: json``): values as pgcdc writes them, no Debezium setting gives
  these: numbers stay numbers (a float NaN or infinity as ``NaN``/``Infinity``, as
  Python's json writes them); ``numeric`` and ``money`` are exact decimal strings
  (``"NaN"``, ``"Infinity"`` included); dates, times and timestamps ISO 8601 strings
  (a value Python cannot hold, ``infinity``, BC, year > 9999, is the server's text);
  ``interval`` its ISO 8601 string as PostgreSQL prints it (``"P1Y2M3DT4H5M6.5S"``,
  months and days kept apart); ``bytea`` base64; ``uuid`` a string; ``inet`` and
  ``cidr`` PostgreSQL's text; json/jsonb, xml, bit strings, MAC addresses, text search
  types and enum labels their text; ``pg_lsn`` a number.  ``source.txId`` is 0 for a
  read.

In both modes: a range is ``{"lower", "upper", "lower_inc", "upper_inc", "empty"}``
with ``null`` for an unbounded side, a multirange a list of those; geometric values
are objects of their fields (a line ``{"a", "b", "c"}``, a segment ``{"start", "end"}``,
a box ``{"high", "low"}``, a path ``{"points", "closed"}``, a polygon ``{"points"}``, a
circle ``{"center", "radius"}``; a point ``{"x", "y"}``, in Debezium's encoding
Debezium's ``{"x", "y", "wkb", "srid"}``); arrays are (nested) lists; composites objects
of their fields (Debezium writes ranges as text: not followed).  ``source.db`` is the
database name; ``source.snapshot`` is ``"false"`` for a streamed change and, for a read,
Debezium's mark: ``"first"`` / ``"last"`` for the initial load's first / last read event,
``"first_in_data_collection"`` / ``"last_in_data_collection"`` for every other table's,
``"true"`` for the others (sinks/snapshot_marks.py).  pgcdc adds, inside
``source``, ``commit_lsn``, ``ordinal``, ``table_oid`` and ``table_version``, and at the
top ``unchanged``: the columns whose TOASTed value was not resent (absent from ``after``
in pgcdc's mode, Debezium's placeholder ``__debezium_unavailable_value`` in Debezium's).

Every mapping is a function of the value and its column's type alone, so equal rows
encode to equal bytes.  In Debezium's encoding, :meth:`JsonEncoder.encoder_for` writes each
event with sinks/_fastjson.c when it is built (the same bytes: tests/unit/test_fastjson.py;
``PGCDC_PURE_PYTHON=1`` turns it off).

The key is a JSON object of the primary-key columns in key order, encoded as the
values are.  JSON escapes every separator, quote and control character, so two
different keys of one table never encode alike.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import json.encoder
import os
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from datetime import date, datetime, time
from decimal import Decimal
from ipaddress import IPv4Interface, IPv4Network, IPv6Interface, IPv6Network
from typing import Any
from uuid import UUID

from core import wire
from core.wire import AFTER, BEFORE, CONNECTOR, OP, PRODUCER_VERSION, SOURCE, UNCHANGED
from decoder.change import ChangeEvent, unix_millis
from decoder.pgoutput import PG_EPOCH_OFFSET_US
from decoder.values import (
    Box,
    Circle,
    Interval,
    Line,
    LineSegment,
    Path,
    Point,
    Polygon,
    Range,
    inet_text,
)
from sinks.debezium_json import PGCDC_JSON, JsonOptions, RowConverter, fast_kind
from sinks.snapshot_marks import MarkedRead, snapshot_of
from snapshot_builder.catalog import Column, TableVersion

_Convert = Callable[[Any], Any]


def _b64(value: bytes) -> str:
    return binascii.b2a_base64(value, newline=False).decode("ascii")


def _b64_of_buffer(value: bytearray | memoryview) -> str:
    return base64.b64encode(bytes(value)).decode("ascii")


def _fields_of(kind: type) -> _Convert:
    names = tuple(f.name for f in fields(kind))
    return lambda value: {name: getattr(value, name) for name in names}


def _json_form(kind: type) -> tuple[_Convert | None, bool]:
    """How values of one type become JSON (the module docstring), and whether that is a string.

    ``None``: json cannot write the type.  The answer depends on the type alone, so it
    is computed once per type; see :func:`_default`.
    """
    if issubclass(kind, Decimal):
        return str, True
    if issubclass(kind, datetime | date | time | Interval):
        return getattr(kind, "isoformat"), True  # noqa: B009
    if issubclass(kind, bytes):
        return _b64, True
    if issubclass(kind, bytearray | memoryview):
        return _b64_of_buffer, True
    if issubclass(kind, UUID):
        return str, True
    if issubclass(kind, IPv4Interface | IPv6Interface | IPv4Network | IPv6Network):
        return inet_text, True
    if issubclass(kind, Range | Point | Line | LineSegment | Box | Path | Polygon | Circle) \
            and is_dataclass(kind):
        return _fields_of(kind), False
    return None, False


_DEFAULTS: dict[type, _Convert] = {}


def _cannot_encode(value: Any) -> Any:
    msg = f"cannot encode {type(value).__name__} as JSON"
    raise TypeError(msg)


def _default(value: Any) -> Any:
    """The JSON form of a decoded value json cannot write itself (see the module docstring)."""
    convert = _DEFAULTS.get(type(value))
    if convert is None:
        convert = _DEFAULTS[type(value)] = _json_form(type(value))[0] or _cannot_encode
    return convert(value)


_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=_default)
# The C encoder json.dumps builds anew on every call, built once: the same text.  Circular
# references cannot occur in decoded values, so no markers are kept (check_circular=False).
_c_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)
_c_encode: Any = _JSON.iterencode if _c_make_encoder is None else _c_make_encoder(
    None, _default, json.encoder.encode_basestring, None, ":", ",", False, False, True)


def _dumps(value: Any) -> str:
    if _c_make_encoder is None:  # pragma: no cover - CPython always has the C accelerator
        return _JSON.encode(value)
    return "".join(_c_encode(value, 0))


def encode_key(event: ChangeEvent, options: JsonOptions = PGCDC_JSON) -> bytes:
    row = event.after if event.after is not None else event.before
    if row is None:
        return b"{}"
    return _shape(event.table, "", options).key(row).encode()


def envelope(event: ChangeEvent, *, server_name: str, now_ms: int,
             options: JsonOptions = PGCDC_JSON) -> dict[str, Any]:
    """The envelope of one event as a dict (what :func:`encode_value` writes)."""
    table = event.table
    if options.mode == "debezium":
        return _debezium_envelope(event, server_name, now_ms, options)
    return {
        BEFORE: event.before,
        AFTER: event.after,
        SOURCE: {
            **_source_head(event, server_name, options),
            wire.SOURCE_SCHEMA: table.schema,
            wire.SOURCE_TABLE: table.name,
            wire.SOURCE_TX_ID: event.xid,
            wire.SOURCE_LSN: event.lsn,
            wire.SOURCE_COMMIT_LSN: event.commit_lsn,
            wire.SOURCE_ORDINAL: event.ordinal,
            wire.SOURCE_TABLE_OID: table.oid,
            wire.SOURCE_TABLE_VERSION: table.version,
        },
        OP: event.op,
        wire.TS_MS: now_ms,
        UNCHANGED: list(event.unchanged),
    }


def _source_head(event: ChangeEvent, server_name: str, options: JsonOptions) -> dict[str, Any]:
    """The source block's first members, the same in both modes and in this order."""
    return {
        wire.SOURCE_VERSION: PRODUCER_VERSION,
        wire.SOURCE_CONNECTOR: CONNECTOR,
        wire.SOURCE_NAME: server_name,
        wire.SOURCE_TS_MS: unix_millis(event.commit_time),
        wire.SOURCE_SNAPSHOT: snapshot_of(event),
        wire.SOURCE_DB: options.database,
    }


def _m(name: str, *, first: bool = False) -> str:
    """A member's name in the envelope's text: ``,"name":`` (``{"name":`` when ``first``)."""
    return ("{" if first else ",") + _dumps(name) + ":"


# the envelope's constant texts (the shapes' below), from core/wire.py's names
_BEFORE_, _AFTER_, _UNCHANGED_ = _m(BEFORE, first=True), _m(AFTER), _m(UNCHANGED)
_SOURCE_HEAD = (_m(SOURCE) + _m(wire.SOURCE_VERSION, first=True) + _dumps(PRODUCER_VERSION)
                + _m(wire.SOURCE_CONNECTOR) + _dumps(CONNECTOR) + _m(wire.SOURCE_NAME))
_SOURCE_TS_MS_, _SNAPSHOT_, _DB_ = _m(wire.SOURCE_TS_MS), _m(wire.SOURCE_SNAPSHOT), \
    _m(wire.SOURCE_DB)
_SCHEMA_, _TABLE_, _TX_ID_ = _m(wire.SOURCE_SCHEMA), _m(wire.SOURCE_TABLE), _m(wire.SOURCE_TX_ID)
_LSN_, _COMMIT_LSN_, _ORDINAL_ = _m(wire.SOURCE_LSN), _m(wire.SOURCE_COMMIT_LSN), \
    _m(wire.SOURCE_ORDINAL)
_TABLE_OID_, _TABLE_VERSION_ = _m(wire.SOURCE_TABLE_OID), _m(wire.SOURCE_TABLE_VERSION)
_OP_, _TS_MS_, _TS_US_, _TS_NS_ = "}" + _m(OP), _m(wire.TS_MS), _m(wire.TS_US), _m(wire.TS_NS)


class _Shape:
    """The constant text of one table version's JSON envelope, for one server name.

    The text is what ``_dumps(envelope(...))`` gives, cut where the event's own values go.
    """

    __slots__ = ("server_name", "database", "source", "snapshot", "read_snapshot", "tail",
                 "key_names", "constant", "spec")

    def __init__(self, table: TableVersion, server_name: str, database: str) -> None:
        self.server_name = server_name
        self.database = database
        self.source = _SOURCE_HEAD + _dumps(server_name) + _SOURCE_TS_MS_
        constant = (_DB_ + _dumps(database) + _SCHEMA_ + _dumps(table.schema) + _TABLE_
                    + _dumps(table.name) + _TX_ID_)
        self.snapshot = _SNAPSHOT_ + _dumps("false") + constant
        self.read_snapshot = _SNAPSHOT_ + _dumps("true") + constant
        self.tail = (_TABLE_OID_ + _dumps(table.oid) + _TABLE_VERSION_ + _dumps(table.version)
                     + _OP_)
        self.key_names = tuple((c.name, ("{" if i == 0 else ",") + _dumps(c.name) + ":")
                               for i, c in enumerate(table.key_columns))
        self.constant = constant
        # what sinks/_fastjson.c's encode_pgcdc needs: the key's columns and the constant
        # texts between the event's own parts, in the order value() writes them
        self.spec = (tuple((prefix, name) for name, prefix in self.key_names),
                     (_BEFORE_, _AFTER_, self.source, self.snapshot, self.read_snapshot, _LSN_,
                      _COMMIT_LSN_, _ORDINAL_, self.tail, _TS_MS_, _UNCHANGED_, "}"))

    def marked(self, event: ChangeEvent) -> str:
        """The snapshot part of a read event of a subclass (sinks/snapshot_marks.py)."""
        if not isinstance(event, MarkedRead):
            return self.read_snapshot
        return _SNAPSHOT_ + _dumps(event.snapshot) + self.constant

    def key(self, row: dict[str, Any]) -> str:
        if not self.key_names:
            return "{}"
        return "".join([prefix + _dumps(row.get(name)) for name, prefix in self.key_names]) + "}"

    def value(self, event: ChangeEvent, now_ms: int) -> str:
        before, after, xid, lsn = event.before, event.after, event.xid, event.lsn
        commit_lsn, ordinal, commit_time = event.commit_lsn, event.ordinal, event.commit_time
        if not (type(xid) is type(lsn) is type(commit_lsn) is type(ordinal)
                is type(commit_time) is type(now_ms) is int):
            return _dumps(envelope(event, server_name=self.server_name, now_ms=now_ms,
                                   options=JsonOptions(mode="pgcdc", database=self.database)))
        # an int's JSON text is its str(); a bool or other int type took the path above
        return "".join((
            _BEFORE_, "null" if before is None else _dumps(before),
            _AFTER_, "null" if after is None else _dumps(after),
            self.source, str(unix_millis(commit_time)),
            (self.snapshot if event.op != "r" else self.read_snapshot
             if type(event) is ChangeEvent else self.marked(event)), str(xid),
            _LSN_, str(lsn), _COMMIT_LSN_, str(commit_lsn),
            _ORDINAL_, str(ordinal), self.tail, _dumps(event.op),
            _TS_MS_, str(now_ms),
            _UNCHANGED_, _dumps(list(event.unchanged)) if event.unchanged else "[]", "}",
        ))


def _debezium_envelope(event: ChangeEvent, server_name: str, now_ms: int,
                       options: JsonOptions) -> dict[str, Any]:
    table = event.table
    rows = RowConverter(table, options)
    commit_us = event.commit_time + PG_EPOCH_OFFSET_US
    return {
        BEFORE: None if event.before is None else rows.convert(event.before),
        AFTER: None if event.after is None else rows.convert(event.after, event.unchanged),
        SOURCE: {
            **_source_head(event, server_name, options),
            wire.SOURCE_SEQUENCE: f'["{event.commit_lsn}","{event.lsn}"]',
            wire.SOURCE_TS_US: commit_us,
            wire.SOURCE_TS_NS: commit_us * 1000,
            wire.SOURCE_SCHEMA: table.schema,
            wire.SOURCE_TABLE: table.name,
            wire.SOURCE_TX_ID: event.xid or None,
            wire.SOURCE_LSN: event.lsn,
            wire.SOURCE_XMIN: None,
            wire.SOURCE_ORIGIN: None,
            wire.SOURCE_ORIGIN_LSN: None,
            wire.SOURCE_COMMIT_LSN: event.commit_lsn,
            wire.SOURCE_ORDINAL: event.ordinal,
            wire.SOURCE_TABLE_OID: table.oid,
            wire.SOURCE_TABLE_VERSION: table.version,
        },
        wire.TRANSACTION: None,
        OP: event.op,
        wire.TS_MS: now_ms,
        wire.TS_US: now_ms * 1000,
        wire.TS_NS: now_ms * 1_000_000,
        UNCHANGED: list(event.unchanged),
    }


# Debezium's source.sequence, a JSON text of two LSNs as strings, up to the first LSN
_SEQUENCE_OPEN = _m(wire.SOURCE_SEQUENCE) + '"[\\"'
_SOURCE_TS_US_, _SOURCE_TS_NS_ = _m(wire.SOURCE_TS_US), _m(wire.SOURCE_TS_NS)


class _DebeziumShape:
    """As :class:`_Shape`, for Debezium's encoding (sinks/debezium_json.py): the text is
    what ``_dumps(envelope(..., options=options))`` gives."""

    __slots__ = ("server_name", "options", "rows", "keys", "source", "names", "tail", "spec")

    def __init__(self, table: TableVersion, server_name: str, options: JsonOptions) -> None:
        self.server_name = server_name
        self.options = options
        self.rows = RowConverter(table, options)
        converters = dict(self.rows.columns)
        self.keys = tuple((c.name, ("{" if i == 0 else ",") + _dumps(c.name) + ":",
                           converters.get(c.name)) for i, c in enumerate(table.key_columns))
        self.source = _SOURCE_HEAD + _dumps(server_name) + _SOURCE_TS_MS_
        self.names = _SCHEMA_ + _dumps(table.schema) + _TABLE_ + _dumps(table.name) + _TX_ID_
        self.tail = (_m(wire.SOURCE_XMIN) + "null" + _m(wire.SOURCE_ORIGIN) + "null"
                     + _m(wire.SOURCE_ORIGIN_LSN) + "null" + _COMMIT_LSN_,
                     _TABLE_OID_ + _dumps(table.oid) + _TABLE_VERSION_ + _dumps(table.version)
                     + "}" + _m(wire.TRANSACTION) + "null" + _m(OP))
        # what sinks/_fastjson.c's encode needs: the columns, the key's, the constant texts
        placeholders = self.rows.placeholders

        def column(prefix: str, c: Column) -> tuple[Any, ...]:
            kind, arg = fast_kind(c, options)
            return (prefix, c.name, kind, arg, converters[c.name], _dumps(placeholders[c.name]))
        self.spec = (
            tuple(column(("{" if i == 0 else ",") + _dumps(c.name) + ":", c)
                  for i, c in enumerate(table.columns)),
            tuple(column(prefix, c) for c, (_, prefix, _) in zip(table.key_columns, self.keys,
                                                                  strict=True)),
            (self.source, _DB_ + _dumps(options.database) + _SEQUENCE_OPEN,
             self.names, self.tail[0], self.tail[1]))

    def key(self, row: dict[str, Any]) -> str:
        if not self.keys:
            return "{}"
        parts = []
        for name, prefix, convert in self.keys:
            value = row.get(name)
            parts.append(prefix + _dumps(value if convert is None or value is None
                                         else convert(value)))
        return "".join(parts) + "}"

    def value(self, event: ChangeEvent, now_ms: int) -> str:
        before, after, xid, lsn = event.before, event.after, event.xid, event.lsn
        commit_lsn, ordinal, commit_time = event.commit_lsn, event.ordinal, event.commit_time
        if not (type(xid) is type(lsn) is type(commit_lsn) is type(ordinal)
                is type(commit_time) is type(now_ms) is int):
            return _dumps(_debezium_envelope(event, self.server_name, now_ms, self.options))
        rows = self.rows
        commit_us = commit_time + PG_EPOCH_OFFSET_US
        now_us = now_ms * 1000
        return "".join((
            _BEFORE_, "null" if before is None else _dumps(rows.convert(before)),
            _AFTER_, "null" if after is None
            else _dumps(rows.convert(after, event.unchanged)),
            self.source, str(commit_us // 1000),
            _SNAPSHOT_, '"', snapshot_of(event), '"', _DB_, _dumps(self.options.database),
            _SEQUENCE_OPEN, str(commit_lsn), '\\",\\"', str(lsn), '\\"]"',
            _SOURCE_TS_US_, str(commit_us), _SOURCE_TS_NS_, str(commit_us * 1000),
            self.names, str(xid) if xid else "null", _LSN_, str(lsn),
            self.tail[0], str(commit_lsn), _ORDINAL_, str(ordinal), self.tail[1],
            _dumps(event.op), _TS_MS_, str(now_ms), _TS_US_, str(now_us),
            _TS_NS_, str(now_us * 1000),
            _UNCHANGED_, _dumps(list(event.unchanged)) if event.unchanged else "[]", "}",
        ))


_SHAPES: dict[tuple[int, str, str, str, JsonOptions], _Shape | _DebeziumShape] = {}


def _shape(table: TableVersion, server_name: str,
           options: JsonOptions) -> _Shape | _DebeziumShape:
    key = (table.oid, table.layout, table.meta, server_name, options)
    found = _SHAPES.get(key)
    if found is None:
        found = _SHAPES[key] = _Shape(table, server_name, options.database) \
            if options.mode == "pgcdc" else _DebeziumShape(table, server_name, options)
    return found


def encode_value(event: ChangeEvent, *, server_name: str, now_ms: int,
                 options: JsonOptions = PGCDC_JSON) -> bytes:
    return _shape(event.table, server_name, options).value(event, now_ms).encode()


_TEXTS: dict[type, Callable[[Any], str]] = {}


def _same(value: str) -> str:
    return value


def _text_converter(kind: type) -> Callable[[Any], str]:
    if issubclass(kind, str):
        return _same
    convert, is_text = _json_form(kind)
    if convert is None:
        return _dumps
    if is_text:
        return convert
    return lambda value: _dumps(convert(value))


def text_of(value: Any) -> str:
    """A value as the text the JSON envelope gives it (strings as they are, structured
    values as JSON): the form of every column an Avro schema types as string."""
    convert = _TEXTS.get(type(value))
    if convert is None:
        convert = _TEXTS[type(value)] = _text_converter(type(value))
    return convert(value)


def _compiled() -> Any:
    """sinks/_fastjson.c when built and not turned off (``PGCDC_PURE_PYTHON=1``)."""
    if os.environ.get("PGCDC_PURE_PYTHON") == "1":
        return None
    try:
        from sinks import _fastjson
    except ImportError:  # not built: the Python path writes the same bytes
        return None
    if ChangeEvent._fields != ("op", "table", "before", "after", "unchanged", "commit_lsn",
                               "lsn", "ordinal", "xid", "commit_time"):
        msg = f"ChangeEvent's fields changed to {ChangeEvent._fields}: update sinks/_fastjson.c"
        raise RuntimeError(msg)
    _fastjson.init(Decimal, _dumps)
    return _fastjson


_fastjson = _compiled()


class JsonEncoder:
    """Keys and values of change events as JSON: the envelope above, its values in
    Debezium's encoding (sinks/debezium_json.py) or pgcdc's (``options.mode``)."""

    def __init__(self, options: JsonOptions = PGCDC_JSON) -> None:
        self.options = options
        self.format = options.header  # the pgcdc.format header: json or debezium-json

    def schemas(self, table: TableVersion) -> dict[str, str]:
        return {}

    def key(self, event: ChangeEvent) -> bytes:
        return encode_key(event, self.options)

    def value(self, event: ChangeEvent, *, server_name: str, now_ms: int) -> bytes:
        return encode_value(event, server_name=server_name, now_ms=now_ms,
                            options=self.options)

    def encode(self, event: ChangeEvent, *, server_name: str,
               now_ms: int) -> tuple[bytes, bytes]:
        """The key and the value of one event."""
        return self.key(event), self.value(event, server_name=server_name, now_ms=now_ms)

    def encoder_for(self, table: TableVersion,
                    server_name: str) -> Callable[[ChangeEvent, int], tuple[bytes, bytes]]:
        """:meth:`encode` for the events of one table version."""
        shape = _shape(table, server_name, self.options)
        key_shape = _shape(table, "", self.options)
        def encode(event: ChangeEvent, now_ms: int) -> tuple[bytes, bytes]:
            row = event.after if event.after is not None else event.before
            key = b"{}" if row is None else key_shape.key(row).encode()
            return key, shape.value(event, now_ms).encode()
        if _fastjson is not None and isinstance(shape, _DebeziumShape):
            # what the C code does not write (numbers of other types) goes to encode
            return functools.partial(_fastjson.encode, (*shape.spec, encode))
        if _fastjson is not None:
            return functools.partial(_fastjson.encode_pgcdc, (*shape.spec, encode))
        return encode
