"""streaming/typed_avro.py: which typed Avro columns ``pgcdc spark`` applies, the reader
schema it decodes them with, and the refusal of the rest (pure logic; the values through
Spark: tests/integration/test_spark_typed_avro.py)."""

from __future__ import annotations

import json

import pytest

from core.wire import catalog_topic
from sinks.avro import AvroEncoder
from streaming import typed_avro
from streaming.schema import TableSpec
from tests.unit.test_avro_logical import TABLE, _encoder

# the kind of each column of tests/unit/test_avro_logical.py's table of every type
KINDS = {
    "id": "text", "n": "decimal", "n_free": "string", "n_wide": "string", "d": "date",
    "t": "time", "ts": "timestamp", "tstz": "timestamptz", "u": "string", "j": "string",
    "b": "bytes", "f4": "text", "f8": "text", "ok": "text", "big": "text", "ints": None,
    "texts": None, "nums": None, "mood": "string", "pt": None, "pts": None, "r": None,
    "tr": None, "fr": None, "mr": None, "fmr": None, "amount": "decimal", "iv": "string",
    "addr": "string", "txt": "string", "Row": "string",
}


def _spec() -> TableSpec:
    _, logical = _encoder()
    record = dict(TABLE.to_dict(), lsn=1, topic=catalog_topic("p"), value_format="avro",
                  **AvroEncoder(logical=logical).schemas(TABLE))
    return TableSpec.from_dict(json.loads(json.dumps(record)))


def test_the_kind_of_every_typed_column() -> None:
    spec = _spec()
    assert spec.value_schema is not None
    fields = typed_avro.row_fields(json.loads(spec.value_schema))
    assert {f["pgcdc.column"]: typed_avro.kind(f) for f in fields} == KINDS


def test_arrays_and_records_are_refused_by_name_and_type() -> None:
    spec = _spec()
    refused = [c for c, k in KINDS.items() if k is None]
    assert typed_avro.refused(spec) == [
        f"{c.name} ({c.type_name})" for c in spec.columns if c.name in refused]
    message = typed_avro.refusal(spec)
    assert message is not None
    assert "public.many" in message and "ints (_int4), texts (_text)" in message
    assert "--avro-types text" in message and "n (" not in message
    # a text-mode version is applied whatever its types
    text = TableSpec.from_dict(dict(TABLE.to_dict(), **AvroEncoder().schemas(TABLE)))
    assert typed_avro.refused(text) == [] and typed_avro.refusal(text) is None


def test_the_reader_schema_reads_dates_and_times_as_numbers() -> None:
    spec = _spec()
    assert spec.value_schema is not None
    plain = typed_avro.reader_schema(spec.value_schema)
    for logical in ("date", "time-micros", "timestamp-micros", "local-timestamp-micros"):
        assert f'"{logical}"' in spec.value_schema and f'"{logical}"' not in plain
    assert '"decimal"' in plain and '"uuid"' in plain  # decoded typed
    fields = {f["pgcdc.column"]: f for f in typed_avro.row_fields(json.loads(plain))}
    assert fields["d"]["type"] == ["null", {"type": "int"}]
    assert fields["ts"]["type"] == ["null", {"type": "long"}]


def test_a_kind_it_does_not_know_is_not_spelled() -> None:
    field = {"name": "x", "pgcdc.column": "x",
             "type": ["null", {"type": "long", "logicalType": "timestamp-nanos"}]}
    assert typed_avro.kind(field) is None
    with pytest.raises(ValueError, match="column x"):
        typed_avro.text("e.after.x", field)
