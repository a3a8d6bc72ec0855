"""The wire contract (core/wire.py, issue 19): what the producer writes (sinks/) and what
``pgcdc spark`` reads (streaming/) are the names core/wire.py holds (pure logic: the bytes
themselves are the encoders' tests, tests/unit/test_envelope.py, test_avro.py, ...)."""

from __future__ import annotations

import json

import pytest

from core import wire
from decoder.change import ChangeEvent
from sinks.avro import AvroEncoder, value_schema
from sinks.debezium_json import JsonOptions
from sinks.envelope import JsonEncoder, envelope
from sinks.kafka import catalog_record
from streaming.decode import SOURCE_READ as _SOURCE_READ
from streaming.schema import TableSpec
from tests.unit.test_avro_logical import TABLE, TEXTS, _encoder, _row

EVENT = ChangeEvent("u", TABLE, None, _row(TEXTS), ("j",), 100, 90, 3, 5, 1_000_000)
# every name core/wire.py holds (headers, fields, keys, values)
NAMES = {v for k, v in vars(wire).items() if k.isupper() and isinstance(v, str)}


@pytest.mark.parametrize("mode", ["pgcdc", "debezium"])
def test_the_json_envelope_is_written_and_read_by_the_wires_names(mode: str) -> None:
    options = JsonOptions(mode=mode)  # type: ignore[arg-type]
    value = json.loads(JsonEncoder(options).value(EVENT, server_name="app", now_ms=1))
    fields = envelope(EVENT, server_name="app", now_ms=1, options=options)
    assert list(value) == list(fields)  # the fast text and the dict name the same fields
    assert list(value[wire.SOURCE]) == list(fields[wire.SOURCE])
    assert set(value) <= NAMES and set(value[wire.SOURCE]) <= NAMES
    # what the apply reads of it is there
    assert {wire.OP, wire.BEFORE, wire.AFTER, wire.UNCHANGED, wire.SOURCE} <= set(value)
    assert {name for name, _ in _SOURCE_READ} <= set(value[wire.SOURCE])
    assert value[wire.SOURCE][wire.SOURCE_CONNECTOR] == wire.CONNECTOR
    assert value[wire.SOURCE][wire.SOURCE_TABLE_VERSION] == TABLE.version


def test_the_avro_envelope_has_the_json_envelopes_fields() -> None:
    schema = value_schema(TABLE)
    pgcdc = json.loads(JsonEncoder().value(EVENT, server_name="app", now_ms=1))
    assert [f["name"] for f in schema["fields"]] == list(pgcdc)
    source = next(f["type"] for f in schema["fields"] if f["name"] == wire.SOURCE)
    assert [f["name"] for f in source["fields"]] == list(pgcdc[wire.SOURCE])
    row = schema["fields"][0]["type"][1]
    assert [f[wire.COLUMN_ATTRIBUTE] for f in row["fields"]] == [c.name for c in TABLE.columns]


@pytest.mark.parametrize("form", ["json", "avro", "typed"])
def test_the_catalog_record_reads_back(form: str) -> None:
    encoder = JsonEncoder() if form == "json" else AvroEncoder() if form == "avro" \
        else _encoder()[0]
    raw = catalog_record(TABLE, 42, "p.public.many", encoder)
    record = json.loads(raw)
    assert set(record) <= NAMES
    assert all(set(c) <= NAMES for c in record[wire.CATALOG_COLUMNS])
    spec = TableSpec.from_json(raw)
    assert (spec.oid, spec.schema, spec.name, spec.version, spec.lsn, spec.topic) == \
        (TABLE.oid, TABLE.schema, TABLE.name, TABLE.version, 42, "p.public.many")
    assert [(c.name, c.type_name, c.typmod, c.is_key) for c in spec.columns] == \
        [(c.name, c.type_name, c.typmod, c.is_key) for c in TABLE.columns]
    assert spec.replica_identity == TABLE.replica_identity
    assert spec.value_format == (wire.FORMAT_JSON if form == "json" else wire.FORMAT_AVRO)
    assert (spec.value_schema is None) == (form == "json")
    assert spec.avro_types == (wire.AVRO_TYPES_LOGICAL if form == "typed"
                               else wire.AVRO_TYPES_TEXT)
    assert wire.catalog_key(TABLE.oid, TABLE.version) == f"42.{TABLE.version}".encode()
