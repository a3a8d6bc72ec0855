"""T15: Kafka keys are deterministic and injective; values follow the Debezium envelope."""

from __future__ import annotations

import base64
import json
from dataclasses import fields
from datetime import UTC, date, datetime, time
from decimal import Decimal
from ipaddress import IPv4Interface, IPv4Network, IPv6Interface, IPv6Network
from typing import Any
from uuid import UUID

from hypothesis import given, settings
from hypothesis import strategies as st

from decoder.change import ChangeEvent, unix_millis
from decoder.values import Box, Circle, Interval, Line, LineSegment, Path, Point, Polygon, Range
from sinks.envelope import encode_key, encode_value, text_of
from snapshot_builder.catalog import Column, TableVersion

TABLE = TableVersion(42, "public", "t", "d", (
    Column("k1", 25, "text", -1, True),
    Column("k2", 25, "text", -1, True),
    Column("v", 1700, "numeric", -1, False),
))

key_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)


def _event(k1: str | None, k2: str | None, **after: object) -> ChangeEvent:
    row = {"k1": k1, "k2": k2, **after}
    return ChangeEvent("c", TABLE, None, row, (), 100, 90, 0, 7, 0)


@given(key_text, key_text, key_text, key_text)
def test_keys_are_injective(a1: str, a2: str, b1: str, b2: str) -> None:
    ka, kb = encode_key(_event(a1, a2)), encode_key(_event(b1, b2))
    assert (ka == kb) == ((a1, a2) == (b1, b2))


@given(key_text, key_text)
def test_keys_decode_back(k1: str, k2: str) -> None:
    key = encode_key(_event(k1, k2))
    assert json.loads(key) == {"k1": k1, "k2": k2}
    assert encode_key(_event(k1, k2)) == key  # deterministic


def test_separator_lookalikes_do_not_collide() -> None:
    assert encode_key(_event("a,b", "c")) != encode_key(_event("a", "b,c"))
    assert encode_key(_event("a\0", "")) != encode_key(_event("a", "\0"))
    assert encode_key(_event(None, "x")) != encode_key(_event("null", "x"))


def test_value_envelope() -> None:
    event = ChangeEvent("u", TABLE, {"k1": "a", "k2": "b", "v": None},
                        {"k1": "a", "k2": "b", "v": Decimal("1.10"),
                         "at": datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
                         "raw": b"\x00\x01", "id": UUID(int=5)},
                        ("big",), 0x1_0000_0010, 0x1_0000_0008, 3, 99, 1_000_000)
    value = json.loads(encode_value(event, server_name="app", now_ms=5))
    assert value["op"] == "u"
    assert value["after"]["v"] == "1.10"
    assert value["after"]["at"] == "2024-01-02T03:04:05.000006+00:00"
    assert value["after"]["raw"] == "AAE="
    assert value["after"]["id"] == "00000000-0000-0000-0000-000000000005"
    assert value["before"] == {"k1": "a", "k2": "b", "v": None}
    assert value["unchanged"] == ["big"]
    source = value["source"]
    assert (source["commit_lsn"], source["ordinal"], source["lsn"]) == (
        0x1_0000_0010, 3, 0x1_0000_0008)
    assert (source["txId"], source["table_oid"], source["table_version"]) == (
        99, 42, TABLE.version)
    assert source["ts_ms"] == 946_684_801_000  # 2000-01-01 + 1 s, in Unix milliseconds
    assert value["ts_ms"] == 5


# --- the fast encoder against the one it replaced ------------------------------------------
#
# A copy of sinks/envelope.py's encoding before it was specialised per table version: the
# specialised encoder must give exactly its bytes.  tests/unit/test_avro.py uses the same
# generated events and `reference_text_of` for its own oracle.

def _reference_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime | date | time | Interval):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, UUID | IPv4Interface | IPv6Interface | IPv4Network | IPv6Network):
        return str(value)
    if isinstance(value, Range | Point | Line | LineSegment | Box | Path | Polygon | Circle):
        return {field.name: getattr(value, field.name) for field in fields(value)}
    msg = f"cannot encode {type(value).__name__} as JSON"
    raise TypeError(msg)


_reference_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False,
                                    default=_reference_default).encode


def reference_envelope(event: ChangeEvent, *, server_name: str, now_ms: int) -> dict[str, Any]:
    table = event.table
    return {
        "before": event.before,
        "after": event.after,
        "source": {
            "version": "pgcdc-1",
            "connector": "pgcdc",
            "name": server_name,
            "ts_ms": unix_millis(event.commit_time),
            "snapshot": "false" if event.op != "r" else "true",
            "db": "",
            "schema": table.schema,
            "table": table.name,
            "txId": event.xid,
            "lsn": event.lsn,
            "commit_lsn": event.commit_lsn,
            "ordinal": event.ordinal,
            "table_oid": table.oid,
            "table_version": table.version,
        },
        "op": event.op,
        "ts_ms": now_ms,
        "unchanged": list(event.unchanged),
    }


def reference_encode_key(event: ChangeEvent) -> bytes:
    return _reference_dumps(event.key).encode()


def reference_encode_value(event: ChangeEvent, *, server_name: str, now_ms: int) -> bytes:
    return _reference_dumps(reference_envelope(event, server_name=server_name,
                                               now_ms=now_ms)).encode()


def reference_text_of(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        out = _reference_default(value)
    except TypeError:
        out = value
    return out if isinstance(out, str) else _reference_dumps(out)


# One column of every kind the decoder produces; names that are not Avro names included.
KINDS = TableVersion(9, "odd schema", "every kind", "d", (
    Column("id", 20, "int8", -1, True),
    Column("tenant id", 23, "int4", -1, True),
    Column("flag", 16, "bool", -1, False),
    Column("small", 21, "int2", -1, False),
    Column("oid", 26, "oid", -1, False),
    Column("f4", 700, "float4", -1, False),
    Column("f8", 701, "float8", -1, False),
    Column("raw", 17, "bytea", -1, False),
    Column("label", 25, "text", -1, False),
    Column("amount", 1700, "numeric", -1, False),
    Column("at", 1184, "timestamptz", -1, False),
    Column("local", 1114, "timestamp", -1, False),
    Column("day", 1082, "date", -1, False),
    Column("clock", 1083, "time", -1, False),
    Column("span", 1186, "interval", -1, False),
    Column("doc", 3802, "jsonb", -1, False),
    Column("ints", 1007, "_int4", -1, False),
    Column("nested", 16500, "public.pair", -1, False),
    Column("uid", 2950, "uuid", -1, False),
    Column("where", 600, "point", -1, False),
    Column("during", 3904, "int4range", -1, False),
    Column("mood", 16400, "public.mood", -1, False),
    Column("ünïcode €", 25, "text", -1, False),
))

_LONG = st.integers(-2**63, 2**63 - 1)
_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=80)
_json_like = st.recursive(
    st.none() | st.booleans() | _LONG | st.floats() | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12)
_ints = st.integers(-2**31, 2**31 - 1)
VALUES: dict[str, st.SearchStrategy[Any]] = {
    "id": _LONG,
    "tenant id": _ints,
    "flag": st.booleans(),
    "small": st.integers(-2**15, 2**15 - 1),
    "oid": st.integers(0, 2**32 - 1),
    "f4": st.floats(width=32) | st.floats(),  # beyond float32 too: fastavro's C cast
    "f8": st.floats(),
    "raw": st.binary(max_size=300),
    "label": _text | st.text(alphabet=st.characters(codec="utf-8"), min_size=60,
                             max_size=200),
    "amount": st.decimals(allow_nan=True, allow_infinity=True),
    "at": st.datetimes(timezones=st.just(UTC)),
    "local": st.datetimes(),
    "day": st.dates(),
    "clock": st.times(),
    "span": st.builds(Interval, _ints, _ints, _LONG),
    "doc": _text,
    "ints": st.lists(st.none() | _ints, max_size=5),
    "nested": _json_like,
    "uid": st.uuids(),
    "where": st.builds(Point, st.floats(), st.floats()),
    "during": st.builds(Range, st.none() | _ints, st.none() | _ints, st.booleans(),
                        st.booleans(), st.booleans()),
    "mood": st.sampled_from(["sad", "ok", "great"]),
    "ünïcode €": _text,
}
# a column may be null, or missing (an unchanged TOASTed value)
rows = st.fixed_dictionaries({}, optional={name: st.none() | strategy
                                           for name, strategy in VALUES.items()})


@st.composite
def events(draw: st.DrawFn, table: TableVersion = KINDS) -> ChangeEvent:
    op = draw(st.sampled_from(["c", "u", "d", "r"]))
    before = draw(st.none() | rows) if op in ("u", "d") else None
    after = draw(rows) if op != "d" else None
    unchanged = tuple(draw(st.lists(st.sampled_from([c.name for c in table.columns]),
                                    max_size=3, unique=True)))
    return ChangeEvent(op, table, before, after, unchanged,
                       draw(_LONG), draw(_LONG), draw(_LONG), draw(st.integers(0, 2**32 - 1)),
                       draw(st.integers(-2**62, 2**62)))


@settings(max_examples=300, deadline=None)
@given(events(), _text, _LONG)
def test_fast_json_bytes_equal_the_reference(event: ChangeEvent, server: str,
                                             now_ms: int) -> None:
    assert encode_key(event) == reference_encode_key(event)
    assert encode_value(event, server_name=server, now_ms=now_ms) == reference_encode_value(
        event, server_name=server, now_ms=now_ms)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(list(VALUES)), unique=True).flatmap(
    lambda names: st.tuples(*(VALUES[n] for n in names))))
def test_text_of_equals_the_reference(values: tuple[Any, ...]) -> None:
    for value in values:
        assert text_of(value) == reference_text_of(value)


def test_fast_json_handles_rows_unlike_the_table() -> None:
    # extra keys, another order, bool and int subclasses: all as json.dumps writes them
    event = ChangeEvent("u", TABLE, {"v": True, "k2": "b", "other": [1.5, None]},
                        {"zz": {"a": Decimal("1")}, "k1": "x"}, (), 1, 2, 3, 4, 5)
    assert encode_value(event, server_name="s", now_ms=True) == reference_encode_value(  # type: ignore[arg-type]
        event, server_name="s", now_ms=True)  # type: ignore[arg-type]
    assert encode_key(event) == reference_encode_key(event) == b'{"k1":"x","k2":null}'
    assert encode_key(ChangeEvent("d", TABLE, None, None, (), 1, 2, 3, 4, 5)) == b"{}"
