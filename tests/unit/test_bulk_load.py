"""The lake load's rows are the Avro sink's values (streaming/bulk_load.py): what a Spark task
hands on for a decoded row equals what the stream's Avro value carries for it."""

from __future__ import annotations

import math
import struct
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest

from decoder.change import ChangeEvent
from decoder.values import Interval, Range
from loads.load_state import LoadState
from sinks.avro import AvroEncoder, decode_value, field_name
from snapshot_builder.catalog import Column, TableVersion
from streaming.bulk_load import avro_row, marker, spec_of
from streaming.multiset import keyless

TABLE = TableVersion(9, "public", "every kind", "d", (
    Column("id", 20, "int8", -1, True),
    Column("small", 21, "int2", -1, False),
    Column("n", 23, "int4", -1, False),
    Column("o", 26, "oid", -1, False),
    Column("ok", 16, "bool", -1, False),
    Column("f4", 700, "float4", -1, False),
    Column("f8", 701, "float8", -1, False),
    Column("raw", 17, "bytea", -1, False),
    Column("amount", 1700, "numeric", 655366, False),
    Column("at", 1184, "timestamptz", -1, False),
    Column("day", 1082, "date", -1, False),
    Column("span", 1186, "interval", -1, False),
    Column("tags", 1009, "_text", -1, False),
    Column("r", 3904, "int4range", -1, False),
    Column("note", 25, "text", -1, False),
))

ROWS: list[dict[str, Any]] = [
    {"id": 1, "small": -3, "n": 2**31 - 1, "o": 4294967295, "ok": True, "f4": 0.1,
     "f8": math.nan, "raw": b"\x00\xff", "amount": Decimal("12.50"),
     "at": datetime(2024, 1, 2, 3, 4, 5, 600, tzinfo=UTC), "day": date(1, 1, 1),
     "span": Interval(14, 3, 5_000_000), "tags": ["a", None, 'q"'],
     "r": Range(1, 10, True, False), "note": "tab\there"},
    {"id": 2, "small": None, "n": None, "o": None, "ok": False, "f4": -math.inf, "f8": 1e308,
     "raw": b"", "amount": Decimal("NaN"), "at": "infinity", "day": "5874897-12-31",
     "span": None, "tags": [], "r": Range(None, None, False, False, empty=True),
     "note": ""},
    {"id": 3, **{c.name: None for c in TABLE.columns if c.name != "id"}},
]


def _float32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


@pytest.mark.parametrize("row", ROWS, ids=lambda r: str(r["id"]))
def test_a_task_hands_on_the_avro_values(row: dict[str, Any]) -> None:
    event = ChangeEvent("r", TABLE, None, row, (), 99, 99, 0, 0, 0)
    streamed = decode_value(TABLE, AvroEncoder().value(event, server_name="s", now_ms=0))
    loaded = avro_row(TABLE)(row)
    for i, column in enumerate(TABLE.columns):
        want, got = streamed["after"][field_name(column, i)], loaded[i]
        if column.type_name == "float4" and got is not None:
            got = _float32(got)  # Spark's FloatType holds it as Avro's float does
        if isinstance(want, float) and math.isnan(want):
            assert isinstance(got, float) and math.isnan(got), column.name
        else:
            assert got == want and type(got) is type(want), (column.name, got, want)


def test_spec_marker_and_keys() -> None:
    spec = spec_of(TABLE, 99, "app")
    assert spec.version == TABLE.version and spec.lsn == 99
    assert spec.topic.startswith("app.public.every_kind")
    assert [c.name for c in spec.key_columns] == ["id"] and not keyless(spec)
    state = LoadState("s1", "1", "db", "pub", 0x16B3748)
    assert marker(state, 9) == "pgcdc load s1 16B3748 9"
    assert marker(state, 9) != marker(LoadState("s1", "1", "db", "pub", 0x16B3749), 9)
