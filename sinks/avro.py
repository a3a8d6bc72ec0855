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
the first event that uses it.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from typing import Any

import fastavro

from decoder.change import ChangeEvent
from sinks.envelope import envelope, text_of
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
        {"name": "version", "type": "string"},
        {"name": "connector", "type": "string"},
        {"name": "name", "type": "string"},
        {"name": "ts_ms", "type": "long"},
        {"name": "snapshot", "type": "string"},
        {"name": "db", "type": "string"},
        {"name": "schema", "type": "string"},
        {"name": "table", "type": "string"},
        {"name": "txId", "type": "long"},
        {"name": "lsn", "type": "long"},
        {"name": "commit_lsn", "type": "long"},
        {"name": "ordinal", "type": "long"},
        {"name": "table_oid", "type": "long"},
        {"name": "table_version", "type": "string"},
    ],
}


def field_name(column: Column, position: int) -> str:
    if _AVRO_NAME.match(column.name):
        return column.name
    return f"{_NOT_NAME.sub('_', column.name)}_{position}"


def _namespace(table: TableVersion) -> str:
    parts = [_NOT_NAME.sub("_", p) for p in ("pgcdc", table.schema, table.name)]
    return ".".join(p if p and not p[0].isdigit() else f"_{p}" for p in parts)


def _row_schema(name: str, table: TableVersion, columns: tuple[Column, ...]) -> dict[str, Any]:
    return {
        "type": "record", "name": name, "namespace": _namespace(table),
        "fields": [
            {"name": field_name(c, i), "type": ["null", _PRIMITIVE.get(c.type_name, "string")],
             "default": None, "pgcdc.column": c.name}
            for i, c in enumerate(columns)
        ],
    }


def key_schema(table: TableVersion) -> dict[str, Any]:
    positions = {c.name: i for i, c in enumerate(table.columns)}
    schema = _row_schema("Key", table, table.key_columns)
    for field, column in zip(schema["fields"], table.key_columns, strict=True):
        field["name"] = field_name(column, positions[column.name])
    return schema


def value_schema(table: TableVersion) -> dict[str, Any]:
    row = _row_schema("Row", table, table.columns)
    return {
        "type": "record", "name": "Envelope", "namespace": _namespace(table),
        "fields": [
            {"name": "before", "type": ["null", row], "default": None},
            {"name": "after", "type": ["null", f"{_namespace(table)}.Row"], "default": None},
            {"name": "source", "type": _SOURCE},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": "long"},
            {"name": "unchanged", "type": {"type": "array", "items": "string"}},
        ],
    }


def _converter(column: Column) -> Callable[[Any], Any]:
    if column.type_name in ("float4", "float8"):
        return float
    if column.type_name in _PRIMITIVE:
        return lambda v: v
    return text_of


class _Version:
    """The parsed schemas and converters of one table version."""

    __slots__ = ("key", "value", "fields", "key_fields")

    def __init__(self, table: TableVersion) -> None:
        self.key = fastavro.parse_schema(key_schema(table))
        self.value = fastavro.parse_schema(value_schema(table))
        self.fields = [(c.name, field_name(c, i), _converter(c))
                       for i, c in enumerate(table.columns)]
        keys = {c.name for c in table.key_columns}
        self.key_fields = [f for f in self.fields if f[0] in keys]


def _record(row: dict[str, Any] | None,
            fields: list[tuple[str, str, Callable[[Any], Any]]]) -> dict[str, Any] | None:
    if row is None:
        return None
    out = {}
    for name, avro_name, convert in fields:
        value = row.get(name)
        out[avro_name] = None if value is None else convert(value)
    return out


class AvroEncoder:
    """Keys and values of change events in Avro, per table version."""

    format = "avro"

    def __init__(self) -> None:
        self._versions: dict[tuple[int, str], _Version] = {}

    def _version(self, table: TableVersion) -> _Version:
        cached = self._versions.get((table.oid, table.version))
        if cached is None:
            cached = self._versions[(table.oid, table.version)] = _Version(table)
        return cached

    def schemas(self, table: TableVersion) -> dict[str, str]:
        """The writer schemas of a version, as published in the catalog log."""
        return {"key_schema": json.dumps(key_schema(table), separators=(",", ":")),
                "value_schema": json.dumps(value_schema(table), separators=(",", ":"))}

    def key(self, event: ChangeEvent) -> bytes:
        version = self._version(event.table)
        out = io.BytesIO()
        fastavro.schemaless_writer(out, version.key, _record(event.key, version.key_fields))
        return out.getvalue()

    def value(self, event: ChangeEvent, *, server_name: str, now_ms: int) -> bytes:
        version = self._version(event.table)
        record = envelope(event, server_name=server_name, now_ms=now_ms)
        record["before"] = _record(event.before, version.fields)
        record["after"] = _record(event.after, version.fields)
        out = io.BytesIO()
        fastavro.schemaless_writer(out, version.value, record)
        return out.getvalue()


def decode_value(table: TableVersion, raw: bytes) -> dict[str, Any]:
    """Read one value back (for consumers and tests)."""
    schema = fastavro.parse_schema(value_schema(table))
    record = fastavro.schemaless_reader(io.BytesIO(raw), schema, None)
    assert isinstance(record, dict)
    return record
