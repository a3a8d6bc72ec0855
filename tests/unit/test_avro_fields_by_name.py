"""``pgcdc spark`` reads an Avro writer schema by name, never by position (issue 19): an
envelope whose fields, row fields or union branches come in another order, or with a field
added, still gives each value to its own column (pure logic: the SQL the apply decodes
with, streaming/apply.py ``avro_envelope``; through Spark: tests/integration/
test_spark_typed_avro.py and the Avro apply tests)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sinks.avro import AvroEncoder
from streaming import typed_avro
from streaming.apply import avro_envelope, avro_texts
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


@pytest.mark.parametrize("typed", [False, True], ids=["text", "typed"])
def test_each_column_reads_the_field_of_its_own_name(typed: bool) -> None:
    encoder = _encoder()[0] if typed else AvroEncoder()
    schemas = encoder.schemas(TABLE)
    spec = _spec(schemas)
    moved = _spec(dict(schemas, value_schema=_reordered(schemas["value_schema"])))
    assert spec.value_schema is not None and moved.value_schema is not None
    if typed:  # the columns the typed apply spells (typed_avro.refused: the others)
        keep = [f for f in typed_avro.row_fields(json.loads(spec.value_schema))
                if typed_avro.kind(f) is not None]
        texts = dict(avro_texts(keep, "e.after", typed=True))
        moved_fields = [f for f in typed_avro.row_fields(json.loads(moved.value_schema))
                        if typed_avro.kind(f) is not None]
        assert dict(avro_texts(moved_fields, "e.after", typed=True)) == texts
        assert texts["d"].count("e.after.`d`") > 0 and "e.after.`t`" not in texts["d"]
        return
    original = dict(avro_texts(typed_avro.row_fields(json.loads(spec.value_schema)), "e.after",
                               typed=False))
    assert original["b"] == "base64(e.after.`b`)"  # bytea
    assert original["id"] == "CAST(e.after.`id` AS STRING)"
    assert dict(avro_texts(typed_avro.row_fields(json.loads(moved.value_schema)), "e.after",
                           typed=False)) == original
    reader, columns = avro_envelope(moved)
    assert reader == moved.value_schema  # text mode decodes with the writer schema itself
    after = next(c for c in columns if c.endswith(" AS after"))
    assert all(text in after for text in original.values())


def test_a_schema_that_is_no_envelope_is_named() -> None:
    with pytest.raises(ValueError, match="'Other'.*no row record"):
        typed_avro.row_fields({"type": "record", "name": "Other",
                               "fields": [{"name": "op", "type": "string"}]})
