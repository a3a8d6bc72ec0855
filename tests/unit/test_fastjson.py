"""sinks/_fastjson.c writes the bytes sinks/envelope.py's Python path writes (Debezium's JSON)."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from decoder.change import ChangeEvent
from decoder.values import Interval
from sinks import envelope
from sinks.debezium_json import JsonOptions, UnrepresentableValueError
from snapshot_builder.catalog import Column, TableVersion

pytestmark = pytest.mark.skipif(envelope._fastjson is None, reason="sinks._fastjson not built")

_NUMERIC_12_3 = (12 << 16 | 3) + 4
COLUMNS = (
    Column("id", 20, "int8", -1, True), Column("k2", 25, "text", -1, True),
    Column("n", 1700, "numeric", _NUMERIC_12_3, False),
    Column("nf", 1700, "numeric", -1, False), Column("f4", 700, "float4", -1, False),
    Column("f8", 701, "float8", -1, False), Column("t", 25, "text", -1, False),
    Column("b", 17, "bytea", -1, False), Column("ok", 16, "bool", -1, False),
    Column("d", 1082, "date", -1, False), Column("tm", 1083, "time", -1, False),
    Column("tm3", 1083, "time", 3, False), Column("tz", 1266, "timetz", -1, False),
    Column("ts", 1114, "timestamp", -1, False), Column("ts3", 1114, "timestamp", 3, False),
    Column("tstz", 1184, "timestamptz", -1, False),
    Column("tstz0", 1184, "timestamptz", 0, False),
    Column("tstz3", 1184, "timestamptz", 3, False), Column("iv", 1186, "interval", -1, False),
    Column("u", 2950, "uuid", -1, False), Column("ints", 1007, "_int4", -1, False),
    Column("texts", 1009, "_text", -1, False), Column("dates", 1182, "_date", -1, False),
    Column("m", 790, "money", -1, False), Column("dom", 90_000, "amount", -1, False,
                                                 base_type="numeric", base_typmod=_NUMERIC_12_3),
)
TABLE = TableVersion(16_600, "s", "t\"x", "d", COLUMNS)
OPTIONS = [JsonOptions(database="db"), JsonOptions(decimal="string", interval="string",
                                                   time="isostring", binary="hex"),
           JsonOptions(decimal="double", time="connect", binary="base64-url-safe",
                       database="é\"q"),
           JsonOptions(time="adaptive_time_microseconds", binary="base64")]

_texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_decimals = st.one_of(
    st.decimals(allow_nan=False, allow_infinity=False, places=3,
                min_value=Decimal("-999999999.999"), max_value=Decimal("999999999.999")),
    st.sampled_from([Decimal("0"), Decimal("-0.000"), Decimal("1E+3"), Decimal("1.5E-2"),
                     Decimal("12.30")]))
_datetimes = st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31))  # noqa: DTZ001
_offsets = st.sampled_from([UTC, timezone(timedelta(hours=2)), timezone(-timedelta(hours=5))])
VALUES: dict[str, st.SearchStrategy[Any]] = {
    "id": st.integers(-2**63, 2**63 - 1), "k2": _texts, "n": _decimals,
    "nf": st.one_of(_decimals, st.decimals(allow_nan=False, allow_infinity=False)),
    "f4": st.floats(width=32), "f8": st.floats(), "t": _texts, "b": st.binary(max_size=10),
    "ok": st.booleans(), "d": st.one_of(st.dates(), st.just("infinity")),
    "tm": st.one_of(st.times(), st.just("24:00:00")), "tm3": st.times(),
    "tz": st.times(timezones=_offsets),
    "ts": st.one_of(_datetimes, st.just("-infinity")), "ts3": _datetimes,
    "tstz": st.datetimes(timezones=_offsets), "tstz0": st.datetimes(timezones=st.just(UTC)),
    "tstz3": st.datetimes(timezones=st.just(UTC)),
    "iv": st.builds(Interval, st.integers(-1000, 1000), st.integers(-1000, 1000),
                    st.integers(-10**12, 10**12)),
    "u": st.uuids(), "ints": st.lists(st.one_of(st.none(), st.integers(-2**31, 2**31 - 1))),
    "texts": st.lists(st.lists(st.one_of(st.none(), _texts), max_size=2), max_size=2),
    "dates": st.lists(st.one_of(st.none(), st.dates()), max_size=3),
    "m": st.decimals(allow_nan=False, allow_infinity=False, places=2,
                     min_value=Decimal("-1e12"), max_value=Decimal("1e12")),
    "dom": _decimals,
}


def _python(event: ChangeEvent, options: JsonOptions) -> tuple[bytes, bytes]:
    shape = envelope._shape(event.table, "srv", options)
    assert isinstance(shape, envelope._DebeziumShape)
    row = event.after if event.after is not None else event.before
    key = b"{}" if row is None else shape.key(row).encode()
    return key, shape.value(event, 1_700_000_000_123).encode()


def _compiled(event: ChangeEvent, options: JsonOptions,
              now_ms: int = 1_700_000_000_123) -> tuple[bytes, bytes] | None:
    """The C encoder's answer; None: it handed the event to the Python path."""
    shape = envelope._shape(event.table, "srv", options)
    assert isinstance(shape, envelope._DebeziumShape)
    return envelope._fastjson.encode((*shape.spec, lambda *_: None), event, now_ms)


@settings(max_examples=300, deadline=None)
@given(row=st.fixed_dictionaries({}, optional=VALUES), op=st.sampled_from("crud"),
       options=st.sampled_from(OPTIONS), xid=st.integers(0, 2**32 - 1),
       unchanged=st.sets(st.sampled_from([c.name for c in COLUMNS[2:]]), max_size=3))
@example(row={"tstz": datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=2)))}, op="c",
         options=OPTIONS[0], xid=0, unchanged=set())  # 1 BC in UTC: CI once failed on it
def test_same_bytes_as_python(row: dict[str, Any], op: str, options: JsonOptions, xid: int,
                              unchanged: set[str]) -> None:
    row = {name: value for name, value in row.items() if name not in unchanged}
    before, after = (row, None) if op == "d" else (None, row)
    event = ChangeEvent(op, TABLE, before, after, tuple(sorted(unchanged)) if after else (),
                        123_456_789, 123_456_700, 5, xid, 700_000_000_000_000)
    try:
        expected = _python(event, options)
    except UnrepresentableValueError as exc:
        with pytest.raises(UnrepresentableValueError, match=str(exc)[:20]):
            _compiled(event, options)
        return
    assert _compiled(event, options) == expected
    json.loads(expected[1])  # NaN aside, which Python's json reads too


def test_specials_and_fallbacks() -> None:
    row = {"id": 2**70, "k2": "a", "n": Decimal("NaN"), "f8": float("nan"),
           "t": "\x00\x1f\"\\é\u2028", "u": UUID(int=5), "tstz": datetime(2024, 1, 1, tzinfo=UTC)}
    options = JsonOptions(decimal="string")
    event = ChangeEvent("c", TABLE, None, row, (), 1, 1, 0, 0, 0)
    assert _compiled(event, options) == _python(event, options)
    with pytest.raises(UnrepresentableValueError):
        _compiled(event, JsonOptions())
    for now_ms in (0, 1, 999):  # ts_us and ts_ns are ts_ms's digits and zeros: not for 0
        compiled = _compiled(event, options, now_ms)
        assert compiled is None or compiled[1] == envelope._shape(TABLE, "srv", options).value(
            event, now_ms).encode()
    odd = event._replace(lsn=True)  # not a plain int: left to the Python path
    assert _compiled(odd, options) is None
    encode = envelope.JsonEncoder(options).encoder_for(TABLE, "srv")
    assert encode(odd, 5) == (_python(odd, options)[0],
                              envelope._shape(TABLE, "srv", options).value(odd, 5).encode())


def test_values_past_the_stack_buffers() -> None:
    row = {"id": 1, "k2": "k" * 300 + "\n", "t": "é\"" * 5000, "b": bytes(range(256)) * 20}
    event = ChangeEvent("c", TABLE, None, row, (), 1, 1, 0, 0, 1)
    for options in OPTIONS:
        assert _compiled(event, options) == _python(event, options)


def test_reference_row_and_timestamps() -> None:
    row = {"id": 1, "k2": "k", "d": date(2024, 2, 29), "tm": time(13, 14, 15, 123456),
           "ts": datetime(2024, 2, 29, 13, 14, 15, 123456, tzinfo=UTC).replace(tzinfo=None),
           "tstz": datetime(2024, 2, 29, 13, 14, 15, 123456, tzinfo=UTC),
           "tstz0": datetime(2024, 2, 29, 13, 14, 15, 500000, tzinfo=UTC),
           "n": Decimal("12345.678")}
    event = ChangeEvent("r", TABLE, None, row, (), 1, 1, 0, 0, 0)
    compiled = _compiled(event, JsonOptions())
    assert compiled == _python(event, JsonOptions())
    assert compiled is not None
    after = json.loads(compiled[1])["after"]
    assert (after["d"], after["tm"], after["ts"], after["tstz"], after["tstz0"], after["n"]) == (
        19782, 47655123456, 1709212455123456, "2024-02-29T13:14:15.123456Z",
        "2024-02-29T13:14:15.5Z", "ALxhTg==")


# --- pgcdc's own JSON (--json-mode pgcdc): sinks/_fastjson.c's encode_pgcdc ---------------

PGCDC = [JsonOptions(mode="pgcdc"), JsonOptions(mode="pgcdc", database="é\"q")]
# what a decoded value may be besides VALUES' (composites and ranges as dicts, tuples,
# numbers past 64 bits, times and datetimes in other zones)
_OTHERS = st.one_of(
    st.integers(-2**80, 2**80), st.tuples(st.integers(), _texts),
    st.dictionaries(_texts, st.one_of(st.none(), st.integers(), st.dates(), _decimals),
                    max_size=3),
    st.datetimes(timezones=_offsets), st.times(timezones=_offsets),
    st.decimals(), st.sampled_from([Decimal("NaN"), Decimal("-Infinity"), Decimal("sNaN")]))


def _pgcdc(event: ChangeEvent, options: JsonOptions, now_ms: int = 1_700_000_000_123
           ) -> tuple[tuple[bytes, bytes], tuple[bytes, bytes] | None]:
    """The Python path's key and value, and the C encoder's (None: it handed the event to
    the Python path)."""
    shape = envelope._shape(event.table, "srv", options)
    assert isinstance(shape, envelope._Shape)
    row = event.after if event.after is not None else event.before
    expected = (b"{}" if row is None else shape.key(row).encode(),
                shape.value(event, now_ms).encode())
    return expected, envelope._fastjson.encode_pgcdc((*shape.spec, lambda *_: None), event,
                                                     now_ms)


@settings(max_examples=300, deadline=None)
@given(row=st.fixed_dictionaries({}, optional=VALUES), others=st.dictionaries(
           st.sampled_from(["t", "u", "x1", "x2"]), _OTHERS, max_size=2),
       order=st.randoms(use_true_random=False), op=st.sampled_from("crud"),
       options=st.sampled_from(PGCDC), xid=st.integers(0, 2**32 - 1),
       commit_time=st.integers(-2**62, 2**62),
       unchanged=st.sets(st.sampled_from([c.name for c in COLUMNS[2:]]), max_size=3))
def test_pgcdc_mode_same_bytes_as_python(row: dict[str, Any], others: dict[str, Any],
                                         order: Any, op: str, options: JsonOptions, xid: int,
                                         commit_time: int, unchanged: set[str]) -> None:
    row = {name: value for name, value in {**row, **others}.items() if name not in unchanged}
    names = list(row)
    order.shuffle(names)  # an image's members in its own order, not the table's
    row = {name: row[name] for name in names}
    before, after = (row, None) if op == "d" else (None, row)
    if op == "u":
        before = {"id": row.get("id"), "k2": "old"}
    event = ChangeEvent(op, TABLE, before, after, tuple(sorted(unchanged)) if after else (),
                        123_456_789, 123_456_700, 5, xid, commit_time)
    expected, compiled = _pgcdc(event, options)
    assert compiled == expected


def test_pgcdc_mode_values_and_fallbacks() -> None:
    row = {"id": 1, "k2": "k", "d": date(44, 3, 15), "ts": datetime(9999, 12, 31, 23, 59, 59, 1),  # noqa: DTZ001
           "tstz": datetime(2024, 2, 29, 13, 14, 15, 500000, tzinfo=UTC),
           "tstz0": datetime(2024, 2, 29, tzinfo=UTC), "n": Decimal("1.0E-7"),
           "t": "\x00\x1f\"\\é\u2028", "f8": float("-inf"), "b": b"\x00\xff"}
    event = ChangeEvent("r", TABLE, None, row, (), 1, 1, 0, 0, 0)
    expected, compiled = _pgcdc(event, JsonOptions(mode="pgcdc"))
    assert compiled == expected
    after = json.loads(expected[1])["after"]
    assert (after["d"], after["ts"], after["tstz"], after["tstz0"], after["n"]) == (
        "0044-03-15", "9999-12-31T23:59:59.000001", "2024-02-29T13:14:15.500000+00:00",
        "2024-02-29T00:00:00+00:00", "1.0E-7")
    assert json.loads(expected[0]) == {"id": 1, "k2": "k"}
    big = {"id": 1, "k2": "x" * 5000, "t": "é" * 3000}  # past the stack buffers
    assert _pgcdc(ChangeEvent("c", TABLE, None, big, (), 1, 1, 0, 0, 0),
                  JsonOptions(mode="pgcdc"))[1] is not None
    for odd in (event._replace(lsn=True), event._replace(xid=2**70),  # not plain int64s
                event._replace(commit_time=2**63 - 1)):
        expected, compiled = _pgcdc(odd, JsonOptions(mode="pgcdc"))
        assert compiled is None
        encode = envelope.JsonEncoder(JsonOptions(mode="pgcdc")).encoder_for(TABLE, "srv")
        assert encode(odd, 1_700_000_000_123) == expected
    # the encoder a sink takes: the compiled one, and its bytes
    encode = envelope.JsonEncoder(JsonOptions(mode="pgcdc")).encoder_for(TABLE, "srv")
    assert encode(event, 1_700_000_000_123) == _pgcdc(event, JsonOptions(mode="pgcdc"))[0]
