"""``pgcdc spark`` reads an Avro writer schema by name, never by position (issue 19): an
envelope whose fields, row fields or union branches come in another order, or with a field
added, still gives each value to its own column (pure logic: the SQL the apply decodes
with, streaming/decode.py ``_reader`` and ``avro_text``; through Spark: tests/integration/
test_spark_typed_avro.py and the Avro apply tests)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sinks.avro import AvroEncoder
from streaming import typed_avro
from streaming.decode import _reader, avro_text
from streaming.schema import TableSpec
from tests.unit.test_avro_logical import TABLE, _encoder


def _spec(schemas: dict[str, str]) -> TableSpec:
    return TableSpec.from_dict(json.loads(json.dumps(dict(TABLE.to_dict(), **schemas))))


def _reordered(schema: str) -> str:
    """The same envelope with its fields in another order and one more in front, ``after``
    (now defining the row record) before ``before``, the row's fields reversed and every
    union's ``null`` last: what a later writer may publish."""
    envelope = json.loads(schema)
    fields = {f["name"]: f for f in envelope["fields"]}
    before, after = fields.pop("before"), fields.pop("after")
    row = next(b for b in before["type"] if isinstance(b, dict))
    row["fields"] = [dict(f, type=[*f["type"][1:], "null"]) for f in reversed(row["fields"])]
    after["type"] = [row, "null"]
    before["type"] = [f"{row['namespace']}.Row", "null"]
    envelope["fields"] = [{"name": "ts_us", "type": "long"}, fields.pop("op"), after, before,
                          *fields.values()]
    return json.dumps(envelope)


def _columns(fields: list[dict[str, Any]]) -> list[str]:
    return [f["pgcdc.column"] for f in fields]


@pytest.mark.parametrize("typed", [False, True], ids=["text", "typed"])
def test_the_row_record_is_found_by_name(typed: bool) -> None:
    encoder = _encoder()[0] if typed else AvroEncoder()
    schema = encoder.schemas(TABLE)["value_schema"]
    fields = typed_avro.row_fields(json.loads(schema))
    assert _columns(fields) == [c.name for c in TABLE.columns]
    moved = typed_avro.row_fields(json.loads(_reordered(schema)))
    assert _columns(moved) == list(reversed(_columns(fields)))
    assert {f["pgcdc.column"]: typed_avro.kind(f) for f in moved} == \
        {f["pgcdc.column"]: typed_avro.kind(f) for f in fields}


def _texts(spec: TableSpec, *, typed: bool) -> dict[str, str]:
    """Per column, the SQL of its value's text in the decoded ``e.after`` (the columns the
    typed apply spells: typed_avro.refused names the others)."""
    _, fields, _ = _reader(spec)
    return {name: avro_text(f"e.after.`{f['name']}`", f, typed=typed)
            for name, f in fields.items() if not typed or typed_avro.kind(f) is not None}


@pytest.mark.parametrize("typed", [False, True], ids=["text", "typed"])
def test_each_column_reads_the_field_of_its_own_name(typed: bool) -> None:
    encoder = _encoder()[0] if typed else AvroEncoder()
    schemas = encoder.schemas(TABLE)
    spec = _spec(schemas)
    moved = _spec(dict(schemas, value_schema=_reordered(schemas["value_schema"])))
    assert spec.value_schema is not None and moved.value_schema is not None
    texts = _texts(spec, typed=typed)
    assert _texts(moved, typed=typed) == texts
    assert set(texts) >= {"id", "d"}
    if typed:
        assert texts["d"].count("e.after.`d`") > 0 and "e.after.`t`" not in texts["d"]
        return
    assert texts["b"] == "base64(e.after.`b`)"  # bytea
    assert texts["id"] == "CAST(e.after.`id` AS STRING)"
    reader, _, _ = _reader(moved)
    assert reader == moved.value_schema  # text mode decodes with the writer schema itself


def test_a_schema_that_is_no_envelope_is_named() -> None:
    with pytest.raises(ValueError, match="'Other'.*no row record"):
        typed_avro.row_fields({"type": "record", "name": "Other",
                               "fields": [{"name": "op", "type": "string"}]})
