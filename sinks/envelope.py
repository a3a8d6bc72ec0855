"""The JSON envelope of a change event, compatible with Debezium's PostgreSQL connector.

The value is Debezium's payload (``before``, ``after``, ``source``, ``op``,
``ts_ms``) as emitted with ``value.converter.schemas.enable=false``, so
Debezium consumers (Flink's ``debezium-json``, Kafka Connect's unwrap
transform, Spark jobs) read it unchanged.  pgcdc adds, inside ``source``,
``commit_lsn``, ``ordinal``, ``table_oid`` and ``table_version``, and at the top
``unchanged``: the columns whose TOASTed value was not resent.

Values map to JSON as Debezium maps them by default: numbers stay numbers,
``numeric`` is a string (exact), timestamps are ISO 8601 strings, ``bytea`` is
base64, json/jsonb are their text.

The key is a JSON object of the primary-key columns in key order.  JSON
escapes every separator, quote and control character, so two different keys of
one table never encode alike.
"""

from __future__ import annotations

import base64
import json
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any
from uuid import UUID

from decoder.change import ChangeEvent, unix_millis

CONNECTOR = "pgcdc"


def _default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, UUID):
        return str(value)
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
