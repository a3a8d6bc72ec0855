"""The JSON envelope of a change event, compatible with Debezium's PostgreSQL connector.

The value is Debezium's payload (``before``, ``after``, ``source``, ``op``,
``ts_ms``) as emitted with ``value.converter.schemas.enable=false``, so
Debezium consumers (Flink's ``debezium-json``, Kafka Connect's unwrap
transform, Spark jobs) read it unchanged.  pgcdc adds, inside ``source``,
``commit_lsn``, ``ordinal``, ``table_oid`` and ``table_version``, and at the top
``unchanged``: the columns whose TOASTed value was not resent.

Values map to JSON as Debezium maps them by default, with its string modes
where the default would lose information:

* numbers stay numbers (a float NaN or infinity as ``NaN``/``Infinity``, as
  Python's json writes them); ``numeric`` and ``money`` are exact decimal
  strings (``"NaN"``, ``"Infinity"`` included);
* dates, times and timestamps are ISO 8601 strings; a value Python cannot hold
  (``infinity``, BC, year > 9999) is the server's text;
* ``interval`` is its ISO 8601 string as PostgreSQL prints it
  (``"P1Y2M3DT4H5M6.5S"``, Debezium's ``interval.handling.mode=string``):
  months and days are kept, not folded into microseconds;
* ``bytea`` is base64; ``uuid`` is a string; ``inet`` and ``cidr`` are PostgreSQL's
  text (``"192.168.0.1"``, ``"::ffff:1.2.3.4"``, ``"10.0.0.0/8"``); json/jsonb, xml,
  bit strings, MAC addresses, text search types and enum labels are their text;
  ``pg_lsn`` is a number;
* a range is ``{"lower", "upper", "lower_inc", "upper_inc", "empty"}`` with
  ``null`` for an unbounded side, a multirange is a list of those;
* geometric values are objects of their fields: a point is ``{"x", "y"}``,
  a line ``{"a", "b", "c"}``, a segment ``{"start", "end"}``, a box
  ``{"high", "low"}``, a path ``{"points", "closed"}``, a polygon
  ``{"points"}``, a circle ``{"center", "radius"}``;
* arrays are (nested) lists; composites are objects of their fields.

Every mapping is a function of the value alone, so equal rows encode to equal
bytes.

The key is a JSON object of the primary-key columns in key order.  JSON
escapes every separator, quote and control character, so two different keys of
one table never encode alike.
"""

from __future__ import annotations

import base64
import binascii
import json
import json.encoder
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from datetime import date, datetime, time
from decimal import Decimal
from ipaddress import IPv4Interface, IPv4Network, IPv6Interface, IPv6Network
from typing import Any
from uuid import UUID

from decoder.change import ChangeEvent, unix_millis
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
from snapshot_builder.catalog import TableVersion

CONNECTOR = "pgcdc"

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


def encode_key(event: ChangeEvent) -> bytes:
    row = event.after if event.after is not None else event.before
    if row is None:
        return b"{}"
    return _shape(event.table, "").key(row).encode()


def envelope(event: ChangeEvent, *, server_name: str, now_ms: int) -> dict[str, Any]:
    table = event.table
    return {
        "before": event.before,
        "after": event.after,
        "source": {
            "version": "pgcdc-1",
            "connector": CONNECTOR,
            "name": server_name,
            "ts_ms": unix_millis(event.commit_time),
            "snapshot": "false" if event.op != "r" else "true",
            "db": "",
            "schema": table.schema,
            "table": table.name,
            "txId": event.xid,
            "lsn": event.lsn,
            "commit_lsn": event.commit_lsn,
            "ordinal": event.ordinal,
            "table_oid": table.oid,
            "table_version": table.version,
        },
        "op": event.op,
        "ts_ms": now_ms,
        "unchanged": list(event.unchanged),
    }


class _Shape:
    """The constant text of one table version's JSON envelope, for one server name.

    The text is what ``_dumps(envelope(...))`` gives, cut where the event's own values go.
    """

    __slots__ = ("server_name", "source", "snapshot", "read_snapshot", "tail", "key_names")

    def __init__(self, table: TableVersion, server_name: str) -> None:
        self.server_name = server_name
        self.source = (',"source":{"version":"pgcdc-1","connector":' + _dumps(CONNECTOR)
                       + ',"name":' + _dumps(server_name) + ',"ts_ms":')
        constant = ',"db":"","schema":' + _dumps(table.schema) + ',"table":' \
            + _dumps(table.name) + ',"txId":'
        self.snapshot = ',"snapshot":"false"' + constant
        self.read_snapshot = ',"snapshot":"true"' + constant
        self.tail = (',"table_oid":' + _dumps(table.oid) + ',"table_version":'
                     + _dumps(table.version) + '},"op":')
        self.key_names = tuple((c.name, ("{" if i == 0 else ",") + _dumps(c.name) + ":")
                               for i, c in enumerate(table.key_columns))

    def key(self, row: dict[str, Any]) -> str:
        if not self.key_names:
            return "{}"
        return "".join([prefix + _dumps(row.get(name)) for name, prefix in self.key_names]) + "}"

    def value(self, event: ChangeEvent, now_ms: int) -> str:
        before, after, xid, lsn = event.before, event.after, event.xid, event.lsn
        commit_lsn, ordinal, commit_time = event.commit_lsn, event.ordinal, event.commit_time
        if not (type(xid) is type(lsn) is type(commit_lsn) is type(ordinal)
                is type(commit_time) is type(now_ms) is int):
            return _dumps(envelope(event, server_name=self.server_name, now_ms=now_ms))
        # an int's JSON text is its str(); a bool or other int type took the path above
        return "".join((
            '{"before":', "null" if before is None else _dumps(before),
            ',"after":', "null" if after is None else _dumps(after),
            self.source, str(unix_millis(commit_time)),
            self.read_snapshot if event.op == "r" else self.snapshot, str(xid),
            ',"lsn":', str(lsn), ',"commit_lsn":', str(commit_lsn),
            ',"ordinal":', str(ordinal), self.tail, _dumps(event.op),
            ',"ts_ms":', str(now_ms),
            ',"unchanged":', _dumps(list(event.unchanged)) if event.unchanged else "[]", "}",
        ))


_SHAPES: dict[tuple[int, str, str, str], _Shape] = {}


def _shape(table: TableVersion, server_name: str) -> _Shape:
    found = _SHAPES.get((table.oid, table.layout, table.meta, server_name))
    if found is None:
        found = _SHAPES[(table.oid, table.layout, table.meta, server_name)] = _Shape(
            table, server_name)
    return found


def encode_value(event: ChangeEvent, *, server_name: str, now_ms: int) -> bytes:
    return _shape(event.table, server_name).value(event, now_ms).encode()


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


class JsonEncoder:
    """Keys and values of change events as JSON (the Debezium envelope above)."""

    format = "json"

    def schemas(self, table: TableVersion) -> dict[str, str]:
        return {}

    def key(self, event: ChangeEvent) -> bytes:
        return encode_key(event)

    def value(self, event: ChangeEvent, *, server_name: str, now_ms: int) -> bytes:
        return encode_value(event, server_name=server_name, now_ms=now_ms)

    def encode(self, event: ChangeEvent, *, server_name: str,
               now_ms: int) -> tuple[bytes, bytes]:
        """The key and the value of one event."""
        return encode_key(event), encode_value(event, server_name=server_name, now_ms=now_ms)

    def encoder_for(self, table: TableVersion,
                    server_name: str) -> Callable[[ChangeEvent, int], tuple[bytes, bytes]]:
        """:meth:`encode` for the events of one table version."""
        def encode(event: ChangeEvent, now_ms: int) -> tuple[bytes, bytes]:
            return encode_key(event), encode_value(event, server_name=server_name,
                                                   now_ms=now_ms)
        return encode
