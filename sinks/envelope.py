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
* ``bytea`` is base64; ``uuid``, ``inet`` and ``cidr`` are strings
  (``"192.168.0.1/32"``, ``"10.0.0.0/8"``); json/jsonb, xml, bit strings, MAC
  addresses, text search types and enum labels are their text; ``pg_lsn`` is
  a number;
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
import json
from dataclasses import fields
from datetime import date, datetime, time
from decimal import Decimal
from ipaddress import IPv4Interface, IPv4Network, IPv6Interface, IPv6Network
from typing import Any
from uuid import UUID

from decoder.change import ChangeEvent, unix_millis
from decoder.values import Box, Circle, Interval, Line, LineSegment, Path, Point, Polygon, Range
from snapshot_builder.catalog import TableVersion

CONNECTOR = "pgcdc"


def _default(value: Any) -> Any:
    """The JSON form of a decoded value json cannot write itself (see the module docstring)."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime | date | time | Interval):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, UUID | IPv4Interface | IPv6Interface | IPv4Network | IPv6Network):
        return str(value)
    if isinstance(value, Range | Point | Line | LineSegment | Box | Path | Polygon | Circle):
        return {field.name: getattr(value, field.name) for field in fields(value)}
    msg = f"cannot encode {type(value).__name__} as JSON"
    raise TypeError(msg)


_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=_default).encode


def encode_key(event: ChangeEvent) -> bytes:
    return _dumps(event.key).encode()


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


def encode_value(event: ChangeEvent, *, server_name: str, now_ms: int) -> bytes:
    return _dumps(envelope(event, server_name=server_name, now_ms=now_ms)).encode()


def text_of(value: Any) -> str:
    """A value as the text the JSON envelope gives it (strings as they are, structured
    values as JSON): the form of every column an Avro schema types as string."""
    if isinstance(value, str):
        return value
    try:
        out = _default(value)
    except TypeError:
        out = value
    return out if isinstance(out, str) else _dumps(out)


class JsonEncoder:
    """Keys and values of change events as JSON (the Debezium envelope above)."""

    format = "json"

    def schemas(self, table: TableVersion) -> dict[str, str]:
        return {}

    def key(self, event: ChangeEvent) -> bytes:
        return encode_key(event)

    def value(self, event: ChangeEvent, *, server_name: str, now_ms: int) -> bytes:
        return encode_value(event, server_name=server_name, now_ms=now_ms)
