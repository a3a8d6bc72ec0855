"""Avro keys and values per table version (T15 for Avro keys)."""

from __future__ import annotations

import io
import json
import math
import os
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decoder.change import ChangeEvent
from sinks import avro
from sinks.avro import AvroEncoder, decode_value, field_name, key_schema, value_schema
from snapshot_builder.catalog import Column, TableVersion
from tests.unit.test_envelope import events, reference_envelope, reference_text_of

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


# --- the specialised writer against fastavro -----------------------------------------------
#
# What AvroEncoder gave before it wrote its own bytes: records built per event, written by
# fastavro.schemaless_writer.  Both keys and values must be byte for byte the same.

_PRIMITIVE = {"bool", "int2", "int4", "int8", "oid", "bytea"}


def _oracle_record(row: dict[str, Any] | None,
                   table: TableVersion, columns: tuple[Column, ...]) -> dict[str, Any] | None:
    if row is None:
        return None
    positions = {c.name: i for i, c in enumerate(table.columns)}
    out = {}
    for column in columns:
        value = row.get(column.name)
        if value is not None:
            if column.type_name in ("float4", "float8"):
                value = float(value)
            elif column.type_name not in _PRIMITIVE:
                value = reference_text_of(value)
        out[field_name(column, positions[column.name])] = value
    return out


def _fastavro(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def _read_all(schema: dict[str, Any], raw: bytes) -> dict[str, Any]:
    buffer = io.BytesIO(raw)
    record = fastavro.schemaless_reader(buffer, fastavro.parse_schema(schema), None)
    assert buffer.tell() == len(raw)  # every byte read, nothing left over
    assert isinstance(record, dict)
    return record


# The compiled encoder (sinks/_fastavro.c, the default when built) and the Python one must
# both give fastavro's bytes; each is shared, so its per-version cache is exercised across
# examples.
_PURE = os.environ.get("PGCDC_PURE_PYTHON") == "1"
_ENCODERS = {False: AvroEncoder(compiled=False)}
if not _PURE:
    _ENCODERS[True] = AvroEncoder(compiled=True)
_BOTH = pytest.mark.parametrize("compiled", [
    pytest.param(True, marks=pytest.mark.skipif(
        _PURE, reason="PGCDC_PURE_PYTHON=1: only the Python encoder is loaded")),
    False])


@pytest.mark.skipif(_PURE, reason="PGCDC_PURE_PYTHON=1: only the Python encoder is loaded")
def test_the_compiled_encoder_is_built() -> None:
    """`make setup` builds sinks/_fastavro.c; a silent fallback would hide a 2x slower sink."""
    assert avro.COMPILED_ENCODER, ("sinks._fastavro is not built: run `pip install -e .` "
                                   "with gcc present")


@_BOTH
@settings(max_examples=300, deadline=None)
@given(events(), st.text(alphabet=st.characters(codec="utf-8"), max_size=20),
       st.integers(-2**63, 2**63 - 1))
def test_bytes_equal_fastavro(compiled: bool, event: ChangeEvent, server: str,
                              now_ms: int) -> None:
    encoder = _ENCODERS[compiled]
    table = event.table
    row = event.after if event.after is not None else event.before
    key, value = encoder.encode(event, server_name=server, now_ms=now_ms)
    assert key == encoder.key(event)
    assert key == _fastavro(key_schema(table),
                            _oracle_record(row or {}, table, table.key_columns) or {})
    record = reference_envelope(event, server_name=server, now_ms=now_ms)
    record["before"] = _oracle_record(event.before, table, table.columns)
    record["after"] = _oracle_record(event.after, table, table.columns)
    assert value == encoder.value(event, server_name=server, now_ms=now_ms)
    assert value == _fastavro(value_schema(table), record)
    assert _read_all(key_schema(table), key) == _oracle_record(row or {}, table,
                                                               table.key_columns)
    back = _read_all(value_schema(table), value)
    assert back["source"]["commit_lsn"] == event.commit_lsn
    assert back["unchanged"] == list(event.unchanged)
    assert (back["before"] is None) == (event.before is None)


_TEXT_TABLE = TableVersion(10, "s", "texts", "d", (
    Column("id", 20, "int8", -1, True),
    Column("at", 1184, "timestamptz", -1, False),
    Column("day", 1082, "date", -1, False),
    Column("ints", 1007, "_int4", -1, False),
    Column("amount", 1700, "numeric", -1, False),
))
# what sinks/_fastavro.c writes itself (plain int lists, however nested; a datetime in UTC or
# without zone; a date; a Decimal) and the look-alikes it must leave to text_of
_INT_LISTS = st.recursive(st.lists(st.none() | st.integers(-2**70, 2**70), max_size=4),
                          lambda inner: st.lists(inner | st.none(), max_size=3), max_leaves=10)
_TEXT_VALUES = {
    "at": st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(0)),
                                                  timezone(timedelta(hours=-3, seconds=7))]))
    | st.datetimes() | st.dates(),
    "day": st.dates() | st.datetimes(),
    "ints": _INT_LISTS | st.lists(st.booleans() | st.floats() | st.text(max_size=3), max_size=3)
    | st.lists(_INT_LISTS | st.just(["x"]), max_size=3),
    "amount": st.decimals(allow_nan=True, allow_infinity=True) | st.integers(),
}


@_BOTH
@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries({"id": st.integers(-2**63, 2**63 - 1)},
                             optional={k: st.none() | v for k, v in _TEXT_VALUES.items()}))
def test_texts_of_typed_values_equal_fastavro(compiled: bool, row: dict[str, Any]) -> None:
    event = ChangeEvent("c", _TEXT_TABLE, None, row, (), 1, 2, 3, 4, 5)
    record = reference_envelope(event, server_name="x", now_ms=0)
    record["after"] = _oracle_record(row, _TEXT_TABLE, _TEXT_TABLE.columns)
    assert _ENCODERS[compiled].value(event, server_name="x", now_ms=0) == _fastavro(
        value_schema(_TEXT_TABLE), record)


def test_a_nested_int_list_is_json() -> None:
    row = {"id": 1, "ints": [[1, None], [], [-2**63, 2**63]], "day": date(1, 2, 3),
           "at": datetime(987, 6, 5, 4, 3, 2, 1, tzinfo=UTC)}
    for encoder in _ENCODERS.values():
        after = decode_value(_TEXT_TABLE, encoder.value(
            ChangeEvent("c", _TEXT_TABLE, None, row, (), 1, 2, 3, 4, 5), server_name="x",
            now_ms=0))["after"]
        assert after["ints"] == "[[1,null],[],[-9223372036854775808,9223372036854775808]]"
        assert after["day"] == "0001-02-03"
        assert after["at"] == "0987-06-05T04:03:02.000001+00:00"


@_BOTH
def test_unusual_events_fall_back_to_the_same_bytes(compiled: bool) -> None:
    """Envelope numbers beyond a long, a row that is not a dict, unchanged names that are
    not in the table: the compiled encoder hands these to the Python one."""
    encoder = _ENCODERS[compiled]
    base = _event("u", ok=True)
    reference = AvroEncoder(compiled=False)
    for event in (base._replace(unchanged=("not a column", "é")),
                  base._replace(before={"order id": 9, "line": 1}),
                  base._replace(op="x")):
        assert encoder.encode(event, server_name="s", now_ms=1) == (
            reference.key(event), reference.value(event, server_name="s", now_ms=1))
    for bad in (base._replace(lsn=2**64 - 1), base._replace(xid="7"),
                base._replace(after=[("order id", 1)])):
        errors = []
        for enc in (encoder, reference):
            with pytest.raises((ValueError, AttributeError, TypeError)) as info:
                enc.encode(bad, server_name="s", now_ms=1)
            errors.append((type(info.value), str(info.value)))
        assert errors[0] == errors[1]


@given(st.floats(width=32) | st.floats(), st.floats(allow_nan=True))
def test_float_extremes_equal_fastavro(f4: float, f8: float) -> None:
    event = _event(ratio=f8)
    table = TableVersion(8, "s", "t", "d", (Column("id", 20, "int8", -1, True),
                                            Column("r", 700, "float4", -1, False)))
    small = ChangeEvent("c", table, None, {"id": 1, "r": f4}, (), 1, 1, 0, 1, 0)
    for ev in (event, small):
        record = reference_envelope(ev, server_name="x", now_ms=0)
        record["after"] = _oracle_record(ev.after, ev.table, ev.table.columns)
        assert AvroEncoder().value(ev, server_name="x", now_ms=0) == _fastavro(
            value_schema(ev.table), record)


@_BOTH
def test_values_fastavro_rejects_are_rejected(compiled: bool) -> None:
    encoder = _ENCODERS[compiled]
    for bad in ({"order id": 2**63}, {"order id": True}, {"order id": 1, "line": 2**31},
                {"order id": 1, "ok": 1}, {"order id": 1, "raw": "text"}):
        with pytest.raises(ValueError, match="is not an Avro"):
            encoder.value(_event(**bad), server_name="a", now_ms=0)


@pytest.mark.parametrize("size", [0, 1, 63, 64, 65, 127, 128, 8191, 8192, 2**14, 2**21 + 3])
@_BOTH
def test_length_prefixes_at_varint_boundaries_equal_fastavro(compiled: bool, size: int) -> None:
    event = _event(tags=["x" * size], raw=b"\xff" * size, amount="x" * size)
    wide = ChangeEvent("c", TABLE, None, {"order id": 2**(size % 63), "tags": "é" * size}, (),
                       size, -size, 2**63 - 1, 0, -(2**62))
    for ev in (event, wide):
        record = reference_envelope(ev, server_name="s" * size, now_ms=-(2**63))
        record["after"] = _oracle_record(ev.after, TABLE, TABLE.columns)
        assert _ENCODERS[compiled].value(ev, server_name="s" * size,
                                         now_ms=-(2**63)) == _fastavro(
            value_schema(TABLE), record)
