"""A typed Avro version's values reach their lake columns without text in between (issues
16.2 and 17.1): pure logic, the Spark SQL streaming/decode.py builds per column.  Through
Spark, the lake a typed program makes equals the text mode's:
tests/integration/test_spark_typed_avro.py."""

from __future__ import annotations

import json

from sinks.avro import AvroEncoder
from streaming import typed_avro
from streaming.decode import _from_typed, _reader, from_text
from streaming.schema import TableSpec
from tests.unit.test_avro_logical import TABLE, _encoder

# text functions the text path spells values with, and casts from it
_TEXT_SIGNS = ("AS STRING)", "format_string", "base64", "concat(", "regexp")


def _spec(schemas: dict[str, str]) -> TableSpec:
    return TableSpec.from_dict(json.loads(json.dumps(dict(TABLE.to_dict(), **schemas))))


def _typed_columns() -> dict[str, tuple[str, str]]:
    spec = _spec(_encoder()[0].schemas(TABLE))
    _, fields, typed = _reader(spec)
    assert typed
    return {c.name: _from_typed(c, f"e.after.`{fields[c.name]['name']}`", fields[c.name])
            for c in spec.columns if typed_avro.kind(fields[c.name]) is not None}


def test_typed_values_are_not_spelled_as_text() -> None:
    columns = _typed_columns()
    spec = TableSpec(TABLE)
    straight = [c.name for c in spec.columns if c.spark_type != "string" and c.name in columns]
    assert {"id", "n", "d", "ts", "tstz", "b", "f4", "f8", "ok"} <= set(straight)
    for name in straight:
        value, _ = columns[name]
        assert not any(sign in value for sign in _TEXT_SIGNS), (name, value)
    assert columns["d"][0] == "date_from_unix_date(e.after.`d`)"
    assert columns["tstz"][0] == "timestamp_micros(e.after.`tstz`)"
    value, text = columns["n"]  # the decimal as it is; its NaN branch the untyped text
    assert value == "CAST(e.after.`n`.member0 AS decimal(12,3))"
    assert "e.after.`n`.member1" in text


def test_text_mode_is_cast_from_its_text() -> None:
    spec = _spec(AvroEncoder().schemas(TABLE))
    _, fields, typed = _reader(spec)
    assert not typed
    column = next(c for c in spec.columns if c.name == "d")
    value, _ = from_text(column, f"CAST(e.after.`{fields['d']['name']}` AS STRING)",
                         stale=False)
    assert "CAST(e.after.`d` AS STRING)" in value
