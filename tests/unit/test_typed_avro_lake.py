"""streaming/typed_avro.py: which typed Avro columns ``pgcdc spark`` applies, the reader
schema it decodes them with, the Spark SQL it spells arrays and records with, and the
refusal of what it does not know (pure logic; the values through Spark:
tests/integration/test_spark_typed_avro.py)."""

from __future__ import annotations

import dataclasses
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
    "b": "bytes", "f4": "text", "f8": "text", "ok": "text", "big": "text", "ints": "json",
    "texts": "json", "nums": "json", "mood": "string", "pt": "json", "pts": "json",
    "r": "json", "tr": "json", "fr": "json", "mr": "json", "fmr": "json",
    "amount": "decimal", "iv": "string",
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


def test_every_column_is_applied() -> None:
    spec = _spec()
    assert typed_avro.refused(spec) == [] and typed_avro.refusal(spec) is None
    text = TableSpec.from_dict(dict(TABLE.to_dict(), **AvroEncoder().schemas(TABLE)))
    assert typed_avro.refused(text) == [] and typed_avro.refusal(text) is None


def _unknown_inside(spec: TableSpec) -> TableSpec:
    """``spec`` whose ``ints`` elements are of a logical type this job does not know."""
    assert spec.value_schema is not None
    schema = json.loads(spec.value_schema)
    for field in typed_avro.row_fields(schema):
        if field["pgcdc.column"] == "ints":
            items = field["type"][1]["items"]
            items[1] = {"type": "long", "logicalType": "timestamp-nanos"}
    return dataclasses.replace(spec, value_schema=json.dumps(schema))


def test_an_unknown_logical_type_inside_an_array_is_refused_by_name_and_type() -> None:
    spec = _unknown_inside(_spec())
    assert typed_avro.refused(spec) == ["ints (_int4)"]
    message = typed_avro.refusal(spec)
    assert message is not None
    assert "public.many" in message and "ints (_int4)" in message
    assert "--avro-types text" in message and "texts (" not in message


def test_arrays_and_records_are_spelled_from_their_own_schema() -> None:
    spec = _spec()
    assert spec.value_schema is not None
    fields = {f["pgcdc.column"]: f for f in typed_avro.row_fields(json.loads(spec.value_schema))}
    ints = typed_avro.text("e.after.`ints`", fields["ints"])
    assert ints.startswith("CASE WHEN e.after.`ints` IS NOT NULL THEN concat('[', array_join(")
    assert ".member0" in ints and ".member1" in ints  # an element or a nested array
    assert typed_avro.text("e.after.`ints`", fields["ints"]) == ints  # deterministic
    composite = typed_avro.json_text("e.after.`pt`", fields["pt"])
    assert """'{"x":'""" in composite and """',"label":'""" in composite
    assert """',"tags":'""" in composite and "e.after.`pt`.`tags`" in composite
    ranged = typed_avro.json_text("r", fields["r"])
    assert """'{"lower":'""" in ranged
    assert all(f"',\"{name}\":'" in ranged for name in ("upper", "lower_inc", "upper_inc",
                                                          "empty"))
    # a record named once and referred to by name below: resolved within the field
    named = {"name": "x", "pgcdc.column": "x", "type": ["null", {"type": "array", "items": [
        "null", {"type": "record", "name": "R", "namespace": "ns", "fields": [
            {"name": "a", "type": ["null", "int"]}]},
        {"type": "array", "items": ["null", "ns.R"]}]}]}
    assert typed_avro.kind(named) == "json"
    assert typed_avro.json_text("c", named).count("""'{"a":'""") == 2
    dangling = dict(named, type=["null", {"type": "array", "items": ["null", "ns.Other"]}])
    assert typed_avro.kind(dangling) is None


def test_sql_string_literals() -> None:
    assert typed_avro.sql_string("it's a \\ and \"") == "'it\\'s a \\\\ and \"'"


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
