"""Avro keys and values per table version (T15 for Avro keys)."""

from __future__ import annotations

import io
import json
import math
from datetime import UTC, datetime
from decimal import Decimal

import fastavro
from hypothesis import given
from hypothesis import strategies as st

from decoder.change import ChangeEvent
from sinks.avro import AvroEncoder, decode_value, key_schema, value_schema
from snapshot_builder.catalog import Column, TableVersion

TABLE = TableVersion(7, "sales", "order lines", "d", (
    Column("order id", 20, "int8", -1, True),
    Column("line", 23, "int4", -1, True),
    Column("amount", 1700, "numeric", 655366, False),
    Column("at", 1184, "timestamptz", -1, False),
    Column("raw", 17, "bytea", -1, False),
    Column("ratio", 701, "float8", -1, False),
    Column("tags", 1009, "_text", -1, False),
    Column("ok", 16, "bool", -1, False),
))


def _event(op: str = "c", **row: object) -> ChangeEvent:
    base = {"order id": 1, "line": 2}
    after = {**base, **row} if op != "d" else None
    before = base if op in ("d", "u") else None
    return ChangeEvent(op, TABLE, before, after, ("big",) if op == "u" else (), 100, 90, 3, 5,
                       1_000_000)


def test_value_round_trip() -> None:
    encoder = AvroEncoder()
    event = _event(amount=Decimal("12.50"), at=datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),
                   raw=b"\x00\xff", ratio=math.inf, tags=["a", None, 'q"'], ok=True)
    value = decode_value(TABLE, encoder.value(event, server_name="app", now_ms=9))
    after = value["after"]
    assert after["order_id_0"] == 1 and after["line"] == 2
    assert after["amount"] == "12.50"
    assert after["at"] == "2024-01-02T03:04:05+00:00"
    assert after["raw"] == b"\x00\xff"
    assert after["ratio"] == math.inf
    assert json.loads(after["tags"]) == ["a", None, 'q"']
    assert after["ok"] is True
    assert value["before"] is None
    assert value["source"]["commit_lsn"] == 100 and value["source"]["ordinal"] == 3
    assert value["source"]["table_version"] == TABLE.version
    assert value["op"] == "c" and value["ts_ms"] == 9


def test_delete_and_unchanged() -> None:
    encoder = AvroEncoder()
    value = decode_value(TABLE, encoder.value(_event("d"), server_name="a", now_ms=0))
    assert value["after"] is None and value["before"]["order_id_0"] == 1
    assert value["before"]["amount"] is None
    updated = decode_value(TABLE, encoder.value(_event("u", ok=False), server_name="a",
                                                now_ms=0))
    assert updated["unchanged"] == ["big"]


def test_real_column_names_travel_with_the_schema() -> None:
    schema = value_schema(TABLE)
    row = schema["fields"][0]["type"][1]
    assert [(f["name"], f["pgcdc.column"]) for f in row["fields"]][:2] == [
        ("order_id_0", "order id"), ("line", "line")]
    assert schema["namespace"] == "pgcdc.sales.order_lines"
    assert [f["name"] for f in key_schema(TABLE)["fields"]] == ["order_id_0", "line"]
    fastavro.parse_schema(schema)  # a valid Avro schema


def test_schemas_differ_exactly_between_versions() -> None:
    encoder = AvroEncoder()
    wider = TableVersion(7, "sales", "order lines", "d",
                         (*TABLE.columns, Column("note", 25, "text", -1, False)))
    assert encoder.schemas(TABLE) != encoder.schemas(wider)
    same = TableVersion(7, "sales", "order lines", "d", TABLE.columns)
    assert encoder.schemas(TABLE) == encoder.schemas(same)


@given(st.integers(-2**63, 2**63 - 1), st.integers(-2**31, 2**31 - 1),
       st.integers(-2**63, 2**63 - 1), st.integers(-2**31, 2**31 - 1))
def test_avro_keys_are_injective(a1: int, a2: int, b1: int, b2: int) -> None:
    encoder = AvroEncoder()
    def key(x: int, y: int) -> bytes:
        return encoder.key(ChangeEvent("c", TABLE, None, {"order id": x, "line": y}, (), 1, 1,
                                       0, 1, 0))
    ka, kb = key(a1, a2), key(b1, b2)
    assert (ka == kb) == ((a1, a2) == (b1, b2))
    parsed = fastavro.parse_schema(key_schema(TABLE))
    assert fastavro.schemaless_reader(io.BytesIO(ka), parsed, None) == {
        "order_id_0": a1, "line": a2}
