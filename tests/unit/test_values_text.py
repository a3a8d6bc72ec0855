"""Text values of every built-in type, array/record/range literals, the type registry, and JSON.

The literals here are what PostgreSQL 15 prints with the replication session's
settings (DateStyle=ISO, TimeZone=UTC, IntervalStyle=iso_8601,
extra_float_digits=3); tests/integration/test_values_roundtrip.py checks the
same decoders against a live server.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from ipaddress import IPv4Interface, IPv4Network, IPv6Interface, IPv6Network
from typing import Any
from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st

from decoder import text_parsers, values
from decoder.change import ChangeEvent
from decoder.type_registry import TypeRegistry
from decoder.values import Box, Circle, Interval, Line, LineSegment, Path, Point, Polygon, Range
from sinks.envelope import encode_value
from snapshot_builder.catalog import Column, TableVersion

A = text_parsers.ARRAY_OIDS


def _decode(oid: int, text: str) -> Any:
    return text_parsers.decoder_for(oid)(text)


def _naive(*args: int) -> datetime:
    return datetime(*args)  # noqa: DTZ001 - timestamp without time zone


# --- scalars -----------------------------------------------------------------------------

@pytest.mark.parametrize(("oid", "text", "expected"), [
    (values.BOOL, "t", True),
    (values.BOOL, "f", False),
    (values.INT2, "32767", 32767),
    (values.INT4, "-2147483648", -2147483648),
    (values.INT8, "-9223372036854775808", -9223372036854775808),
    (values.OID, "4294967295", 4294967295),
    (values.XID8, "18446744073709551615", 18446744073709551615),
    (values.FLOAT4, "1.1", 1.1),
    (values.FLOAT4, "-0", -0.0),
    (values.FLOAT8, "4.9e-324", 5e-324),
    (values.FLOAT8, "1.7976931348623157e+308", 1.7976931348623157e308),
    (values.NUMERIC, "-0.0000000000000000000000000000000000000001", Decimal("-1e-40")),
    (values.NUMERIC, "9" * 1000, Decimal("9" * 1000)),
    (values.NUMERIC, "Infinity", Decimal("Infinity")),
    (values.NUMERIC, "-Infinity", Decimal("-Infinity")),
    (values.MONEY, "$1,234.56", Decimal("1234.56")),
    (values.MONEY, "-$1.00", Decimal("-1.00")),
    (values.MONEY, "$0.00", Decimal("0.00")),
    (values.MONEY, "-$92,233,720,368,547,758.08", Decimal("-92233720368547758.08")),
    (values.MONEY, "1.234,56 €", "1.234,56 €"),  # another lc_monetary: its text
    (values.TEXT, "", ""),
    (values.TEXT, 'žluťoučký 🐍 "{}" \\ \n', 'žluťoučký 🐍 "{}" \\ \n'),
    (values.BPCHAR, "ab   ", "ab   "),
    (values.CHAR, "\\303", "\\303"),
    (values.NAME, "pg_catalog", "pg_catalog"),
    (values.BYTEA, "\\x", b""),
    (values.BYTEA, "\\x00ff10", b"\x00\xff\x10"),
    (values.UUID, "00000000-0000-0000-0000-000000000000", UUID(int=0)),
    (values.JSON, '{"b": 1,  "a": [1, 2]}', '{"b": 1,  "a": [1, 2]}'),
    (values.XML, '<a x="1">é</a>', '<a x="1">é</a>'),
    (values.DATE, "0001-01-01", date(1, 1, 1)),
    (values.DATE, "9999-12-31", date(9999, 12, 31)),
    (values.DATE, "infinity", "infinity"),
    (values.DATE, "-infinity", "-infinity"),
    (values.DATE, "10000-01-01", "10000-01-01"),
    (values.TIME, "00:00:00", time(0)),
    (values.TIME, "24:00:00", "24:00:00"),  # PostgreSQL allows it, Python does not
    (values.TIMETZ, "12:34:56.789-08", time(12, 34, 56, 789000,
                                           tzinfo=timezone(timedelta(hours=-8)))),
    (values.TIMETZ, "00:00:00+05:30:15", time(0, tzinfo=timezone(timedelta(seconds=19815)))),
    (values.TIMESTAMP, "0001-01-01 00:00:00", _naive(1, 1, 1)),
    (values.TIMESTAMP, "4714-11-24 00:00:00 BC", "4714-11-24 00:00:00 BC"),
    (values.TIMESTAMP, "294276-12-31 23:59:59.999999", "294276-12-31 23:59:59.999999"),
    (values.TIMESTAMPTZ, "9999-12-31 23:59:59.999999+00",
     datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)),
    (values.TIMESTAMPTZ, "-infinity", "-infinity"),
    (values.INET, "192.168.1.5/24", IPv4Interface("192.168.1.5/24")),
    (values.INET, "192.168.1.5", IPv4Interface("192.168.1.5/32")),
    (values.INET, "::ffff:1.2.3.4", IPv6Interface("::ffff:1.2.3.4/128")),
    (values.INET, "2001:db8::1/64", IPv6Interface("2001:db8::1/64")),
    (values.CIDR, "10.0.0.0/8", IPv4Network("10.0.0.0/8")),
    (values.CIDR, "2001:db8::/32", IPv6Network("2001:db8::/32")),
    (values.MACADDR, "08:00:2b:01:02:03", "08:00:2b:01:02:03"),
    (values.MACADDR8, "08:00:2b:01:02:03:04:05", "08:00:2b:01:02:03:04:05"),
    (values.BIT, "0101", "0101"),
    (values.VARBIT, "", ""),
    (values.TSVECTOR, "'a''b' 'x y':1A,2B", "'a''b' 'x y':1A,2B"),
    (values.TSQUERY, "'fat' & ( 'rat' | !'cat' )", "'fat' & ( 'rat' | !'cat' )"),
    (values.PG_LSN, "0/0", 0),
    (values.PG_LSN, "16/B374D848", 0x16_B374D848),
    (values.PG_LSN, "FFFFFFFF/FFFFFFFF", 2**64 - 1),
    (values.POINT, "(1,-2.5)", Point(1.0, -2.5)),
    (values.POINT, "(1e+15,-1.5e-07)", Point(1e15, -1.5e-07)),
    (values.LINE, "{1,-2,3}", Line(1.0, -2.0, 3.0)),
    (values.LSEG, "[(1,2),(3,4)]", LineSegment(Point(1, 2), Point(3, 4))),
    (values.BOX, "(3,4),(1,2)", Box(Point(3, 4), Point(1, 2))),
    (values.PATH, "[(1,2),(3,4)]", Path((Point(1, 2), Point(3, 4)), closed=False)),
    (values.PATH, "((1,2))", Path((Point(1, 2),), closed=True)),
    (values.POLYGON, "((0,0),(0,1),(1,0))", Polygon((Point(0, 0), Point(0, 1), Point(1, 0)))),
    (values.CIRCLE, "<(1,2),0.5>", Circle(Point(1, 2), 0.5)),
    (values.INTERVAL, "PT0S", Interval(0, 0, 0)),
    (values.INTERVAL, "1 year 2 mons", "1 year 2 mons"),  # another IntervalStyle: its text
])
def test_scalar(oid: int, text: str, expected: object) -> None:
    decoded = _decode(oid, text)
    assert decoded == expected
    assert type(decoded) is type(expected)


@pytest.mark.parametrize("oid", [values.FLOAT4, values.FLOAT8])
def test_float_specials(oid: int) -> None:
    assert math.isnan(_decode(oid, "NaN"))
    assert _decode(oid, "Infinity") == math.inf
    assert _decode(oid, "-Infinity") == -math.inf


def test_numeric_nan_and_geometric_specials() -> None:
    assert _decode(values.NUMERIC, "NaN").is_nan()
    point = _decode(values.POINT, "(NaN,-Infinity)")
    assert math.isnan(point.x) and point.y == -math.inf


def test_bytea_escape_format() -> None:
    assert _decode(values.BYTEA, "a\\\\b\\001\\377") == b"a\\b\x01\xff"


@pytest.mark.parametrize(("oid", "name"), [
    (values.INT4, "int4"), (values.FLOAT8, "float8"), (A[values.INT4], "_int4"),
    (A[values.BOX], "_box"), (values.TSTZMULTIRANGE, "tstzmultirange"),
    (A[values.INT4MULTIRANGE], "_int4multirange"), (5038, "oid:5038"),
])
def test_type_names(oid: int, name: str) -> None:
    assert text_parsers.type_name(oid) == name


def test_unknown_types_keep_their_text() -> None:
    assert text_parsers.decoder_for(5038)("724:724:") == "724:724:"  # pg_snapshot
    assert text_parsers.decoder_for(987654)("(1,2") == "(1,2"


# --- intervals ---------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "months", "days", "micros"), [
    ("P1Y2M3DT4H5M6.5S", 14, 3, ((4 * 60 + 5) * 60 + 6) * 1_000_000 + 500_000),
    ("P-1Y-2M3DT-4H-5M-6.5S", -14, 3, -(((4 * 60 + 5) * 60 + 6) * 1_000_000 + 500_000)),
    ("PT-0.5S", 0, 0, -500_000),
    ("PT0.000001S", 0, 0, 1),
    ("P1M-1D", 1, -1, 0),
    ("P-1Y-1M", -13, 0, 0),
    ("PT2562047788H54.775807S", 0, 0, 2**63 - 1),
    ("P-178000000Y", -178000000 * 12, 0, 0),
    ("P-2147483648D", 0, -2147483648, 0),
])
def test_interval(text: str, months: int, days: int, micros: int) -> None:
    decoded = _decode(values.INTERVAL, text)
    assert decoded == Interval(months, days, micros)
    assert decoded.isoformat() == text


@given(st.integers(-(2**31), 2**31 - 1), st.integers(-(2**31), 2**31 - 1),
       st.integers(-(2**63), 2**63 - 1))
def test_interval_isoformat_round_trips(months: int, days: int, micros: int) -> None:
    interval = Interval(months, days, micros)
    assert _decode(values.INTERVAL, interval.isoformat()) == interval


def test_interval_as_timedelta() -> None:
    assert Interval(0, 2, -1).to_timedelta() == timedelta(days=2, microseconds=-1)
    with pytest.raises(ValueError, match="months"):
        Interval(1, 0, 0).to_timedelta()


# --- arrays ------------------------------------------------------------------------------

@pytest.mark.parametrize(("oid", "text", "expected"), [
    (A[values.INT4], "{}", []),
    (A[values.INT4], "{1,2,3}", [1, 2, 3]),
    (A[values.INT4], "{{1,NULL},{NULL,4}}", [[1, None], [None, 4]]),
    (A[values.INT4], "{{{1},{2}},{{3},{4}}}", [[[1], [2]], [[3], [4]]]),
    (A[values.INT4], "[0:1]={1,2}", [1, 2]),
    (A[values.INT4], "[1:2][3:4]={{1,2},{3,4}}", [[1, 2], [3, 4]]),
    (A[values.TEXT], '{"a b","c\\"d",NULL,"NULL","","x\\\\y",null,"{}","a,b"}',
     ["a b", 'c"d', None, "NULL", "", "x\\y", "null", "{}", "a,b"]),
    (A[values.TEXT], '{"\\\\",",","\\"\\"","\n","ž 🐍"}', ["\\", ",", '""', "\n", "ž 🐍"]),
    (A[values.TEXT], '{{"{",NULL},{"}",""}}', [["{", None], ["}", ""]]),
    (A[values.BOX], "{(3,4),(1,2);(1,1),(0,0)}",
     [Box(Point(3, 4), Point(1, 2)), Box(Point(1, 1), Point(0, 0))]),
    (A[values.POINT], '{"(1,2)",NULL}', [Point(1, 2), None]),
    (A[values.BYTEA], '{"\\\\x00ff","\\\\x"}', [b"\x00\xff", b""]),
    (A[values.JSONB], '{"{\\"a\\": 1}",null}', ['{"a": 1}', "null"]),
    (A[values.DATE], "{2024-02-29,infinity,NULL}", [date(2024, 2, 29), "infinity", None]),
    (A[values.TIMESTAMPTZ], '{"2024-01-01 00:00:00+00","4714-11-24 00:00:00+00 BC"}',
     [datetime(2024, 1, 1, tzinfo=UTC), "4714-11-24 00:00:00+00 BC"]),
    (A[values.NUMERIC], "{-Infinity,Infinity,1.50}",
     [Decimal("-Infinity"), Decimal("Infinity"), Decimal("1.50")]),
    (A[values.INTERVAL], "{P1D,PT-1S}", [Interval(0, 1, 0), Interval(0, 0, -1_000_000)]),
    (A[values.INT4RANGE], '{"[1,3)",empty}', [Range(1, 3, True, False), values.EMPTY_RANGE]),
    (A[values.INT4MULTIRANGE], '{"{[1,3),[5,7)}","{}"}',
     [(Range(1, 3, True, False), Range(5, 7, True, False)), ()]),
    (A[values.INET], "{10.0.0.1,::1/128}", [IPv4Interface("10.0.0.1"), IPv6Interface("::1")]),
])
def test_array(oid: int, text: str, expected: list[Any]) -> None:
    decoded = _decode(oid, text)
    assert decoded == expected
    assert type(decoded) is list


def test_arrays_of_nan() -> None:
    nan, inf = _decode(A[values.FLOAT8], "{NaN,-Infinity}")
    assert math.isnan(nan) and inf == -math.inf
    (number,) = _decode(A[values.NUMERIC], "{NaN}")
    assert number.is_nan()


@pytest.mark.parametrize("text", ["", "1,2", "{1,2", "{{1,2}", "{1,2}}", '{"a}', "{a\"b}"])
def test_malformed_arrays_stay_text(text: str) -> None:
    assert _decode(A[values.INT4], text) == text
    with pytest.raises(ValueError):  # noqa: PT011 - the message names the literal
        text_parsers.parse_array(text)


def _array_literal(value: list[Any]) -> str:
    """array_out's quoting: empty, NULL-like, delimiter, braces, quotes, backslash, blanks."""
    parts = []
    for item in value:
        if isinstance(item, list):
            parts.append(_array_literal(item))
        elif item is None:
            parts.append("NULL")
        elif (item == "" or item.upper() == "NULL" or item.strip(" \t\n\r\v\f") != item
              or any(c in item for c in '{},"\\ \t\n\r\v\f')):
            parts.append('"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"')
        else:
            parts.append(item)
    return "{" + ",".join(parts) + "}"


nested = st.recursive(
    st.lists(st.none() | st.text(max_size=8), max_size=4),
    lambda inner: st.lists(inner, min_size=1, max_size=3),
    max_leaves=20,
)


@given(nested)
def test_array_literals_round_trip(value: list[Any]) -> None:
    assert text_parsers.parse_array(_array_literal(value)) == value


@given(st.lists(st.none() | st.integers(-(2**63), 2**63 - 1), max_size=20))
def test_int_arrays_round_trip(value: list[int | None]) -> None:
    literal = _array_literal([None if v is None else str(v) for v in value])
    assert _decode(A[values.INT8], literal) == value


# --- records and ranges ------------------------------------------------------------------

def _quoted(text: str, specials: str) -> str:
    """record_out / range_out: quote when needed, double every quote and backslash."""
    if text and not any(c in specials or c in " \t\n\r\v\f" for c in text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '""') + '"'


def _record_literal(fields: list[str | None]) -> str:
    return "(" + ",".join("" if f is None else _quoted(f, '"\\(),') for f in fields) + ")"


def _range_literal(value: Range) -> str:
    if value.empty:
        return "empty"

    def bound(b: str | None) -> str:
        return "" if b is None else _quoted(b, '"\\()[],')

    return (("[" if value.lower_inc else "(") + bound(value.lower) + "," + bound(value.upper)
            + ("]" if value.upper_inc else ")"))


@given(st.lists(st.none() | st.text(max_size=8), min_size=1, max_size=6))
def test_record_literals_round_trip(fields: list[str | None]) -> None:
    assert text_parsers.parse_record(_record_literal(fields)) == fields


def test_record_literal() -> None:
    assert text_parsers.parse_record('(1,"a b",,"","x""y","p\\\\q","{1,2}","(2,z)")') == [
        "1", "a b", None, "", 'x"y', "p\\q", "{1,2}", "(2,z)"]


ranges = st.builds(
    lambda lower, upper, lower_inc, upper_inc: Range(
        lower, upper, lower_inc and lower is not None, upper_inc and upper is not None),
    st.none() | st.text(max_size=6), st.none() | st.text(max_size=6), st.booleans(), st.booleans(),
) | st.just(values.EMPTY_RANGE)


@given(ranges)
def test_range_literals_round_trip(value: Range) -> None:
    assert text_parsers.parse_range(_range_literal(value)) == value


@given(st.lists(ranges, max_size=4))
def test_multirange_literals_round_trip(value: list[Range]) -> None:
    literal = "{" + ",".join(_range_literal(r) for r in value) + "}"
    assert text_parsers.parse_multirange(literal) == tuple(value)


@pytest.mark.parametrize(("oid", "text", "expected"), [
    (values.INT4RANGE, "empty", Range(None, None, False, False, True)),
    (values.INT4RANGE, "[1,10)", Range(1, 10, True, False)),
    (values.INT4RANGE, "(,5)", Range(None, 5, False, False)),
    (values.NUMRANGE, "(,)", Range(None, None, False, False)),
    (values.NUMRANGE, "[-Infinity,Infinity]",
     Range(Decimal("-Infinity"), Decimal("Infinity"), True, True)),
    (values.NUMRANGE, "(0.5,1.5]", Range(Decimal("0.5"), Decimal("1.5"), False, True)),
    (values.DATERANGE, "[2020-01-01,infinity)", Range(date(2020, 1, 1), "infinity", True, False)),
    (values.TSRANGE, '["2020-01-01 00:00:00",)', Range(_naive(2020, 1, 1), None, True, False)),
    (values.TSTZRANGE, '["2020-01-01 00:00:00+00","2020-01-02 00:00:00.5+00"]',
     Range(datetime(2020, 1, 1, tzinfo=UTC), datetime(2020, 1, 2, 0, 0, 0, 500000, tzinfo=UTC),
           True, True)),
    (values.INT8MULTIRANGE, "{}", ()),
    (values.INT8MULTIRANGE, "{(,3),[5,7),[9,)}",
     (Range(None, 3, False, False), Range(5, 7, True, False), Range(9, None, True, False))),
    (values.TSMULTIRANGE, '{["2020-01-01 00:00:00","2020-01-02 00:00:00")}',
     (Range(_naive(2020, 1, 1), _naive(2020, 1, 2), True, False),)),
    (values.INT4RANGE, "[1,2", "[1,2"),  # malformed: its text
    (values.INT4MULTIRANGE, "{[1,2)", "{[1,2)"),
])
def test_range(oid: int, text: str, expected: object) -> None:
    decoded = _decode(oid, text)
    assert decoded == expected
    assert type(decoded) is type(expected)


# --- the registry ------------------------------------------------------------------------

MOOD, POSINT, SMALL, INNER, OUTER, INNERS, OUTERS, MOODS, FRANGE, FMULTI, EXT, EXTS = range(
    90001, 90013)


def _registry() -> TypeRegistry:
    """Registered out of dependency order on purpose."""
    registry = TypeRegistry()
    registry.register_array(OUTERS, OUTER, name="public._outer_t")
    registry.register_composite(OUTER, [
        ("id", SMALL), ("m", MOOD), ("inner", INNER), ("inners", INNERS),
        ("scores", A[values.NUMERIC]), ("span", values.INT4RANGE), ("nothing", values.TEXT),
    ], name="public.outer_t")
    registry.register_domain(SMALL, POSINT, name="public.small_posint")
    registry.register_domain(POSINT, values.INT4, name="public.posint")
    registry.register_enum(MOOD, name="public.mood")
    registry.register_array(MOODS, MOOD)
    registry.register_array(INNERS, INNER)
    registry.register_composite(INNER, [("tag", values.TEXT), ("tags", A[values.TEXT]),
                                        ("at", values.TIMESTAMPTZ)])
    registry.register_range(FRANGE, SMALL)
    registry.register_multirange(FMULTI, SMALL)
    registry.register_text(EXT, name="public.citext")
    registry.register_array(EXTS, EXT)
    return registry


def test_registry_enum_domain_and_their_arrays() -> None:
    registry = _registry()
    assert registry.decoder_for(MOOD)('happy "quoted') == 'happy "quoted'
    assert registry.decoder_for(MOODS)('{sad,"happy \\"quoted",NULL}') == [
        "sad", 'happy "quoted', None]
    assert registry.decoder_for(SMALL)("42") == 42
    assert registry.decoder_for(EXTS)('{a,"B c"}') == ["a", "B c"]


def test_registry_composite_with_nested_arrays() -> None:
    inner = '(x,"{a,\\"b c\\",NULL}","2024-01-01 00:00:00+00")'
    text = ('(5,ok,"' + inner.replace('"', '""').replace("\\", "\\\\") + '",'
            '"{""(y,{},)"",NULL}","{{1.5,NULL},{NaN,2}}","[1,3)",)')
    decoded = _registry().decoder_for(OUTER)(text)
    assert decoded["id"] == 5
    assert decoded["m"] == "ok"
    assert decoded["inner"] == {"tag": "x", "tags": ["a", "b c", None],
                                "at": datetime(2024, 1, 1, tzinfo=UTC)}
    assert decoded["inners"] == [{"tag": "y", "tags": [], "at": None}, None]
    assert decoded["scores"][0] == [Decimal("1.5"), None]
    assert decoded["scores"][1][0].is_nan()
    assert decoded["span"] == Range(1, 3, True, False)
    assert decoded["nothing"] is None
    assert list(decoded) == ["id", "m", "inner", "inners", "scores", "span", "nothing"]


def test_registry_ranges_over_a_domain() -> None:
    registry = _registry()
    assert registry.decoder_for(FRANGE)("[1,5)") == Range(1, 5, True, False)
    assert registry.decoder_for(FMULTI)("{[1,2),[3,)}") == (Range(1, 2, True, False),
                                                           Range(3, None, True, False))


def test_registry_unknown_and_builtin() -> None:
    registry = TypeRegistry()
    registry.register_array(90100, 90101)  # the element type was never registered
    assert registry.decoder_for(90100)('{a,"b"}') == ["a", "b"]
    assert registry.decoder_for(90102)("anything") == "anything"
    assert registry.decoder_for(values.INT4) is text_parsers.decoder_for(values.INT4)
    assert registry.decoder_for(A[values.INT4])("{1}") == [1]
    assert values.INT4 in registry and 90100 in registry and 90101 not in registry
    assert registry.type_name(values.INT4) == "int4"
    assert registry.type_name(90102) == "oid:90102"
    assert _registry().type_name(EXT) == "public.citext"


def test_registry_later_registration_completes_earlier_types() -> None:
    registry = TypeRegistry()
    registry.register_domain(90200, 90201)
    assert registry.decoder_for(90200)("7") == "7"
    registry.register_domain(90201, values.INT8)
    assert registry.decoder_for(90200)("7") == 7


def test_registry_composite_without_attributes_and_cycles() -> None:
    registry = TypeRegistry()
    registry.register_composite(90300, [])
    assert registry.decoder_for(90300)("()") == {}
    registry.register_domain(90301, 90302)
    registry.register_domain(90302, 90301)  # impossible in a catalog; must not recurse forever
    assert registry.decoder_for(90301)("x") == "x"
    registry.register_composite(90303, [("a", values.INT4)])
    assert registry.decoder_for(90303)("()") == {"a": None}
    assert registry.decoder_for(90303)("(1,2)") == "(1,2)"  # wrong arity: its text


# --- JSON --------------------------------------------------------------------------------

def test_json_encoding_of_every_value_type() -> None:
    after = {
        "interval": Interval(14, 3, -500_000),
        "inet": IPv4Interface("192.168.0.1"),
        "inet6": IPv6Interface("2001:db8::1/64"),
        "cidr": IPv4Network("10.0.0.0/8"),
        "money": Decimal("-1.00"),
        "lsn": 0x16_B374D848,
        "point": Point(1.5, -2),
        "line": Line(1, 2, 3),
        "lseg": LineSegment(Point(0, 0), Point(1, 1)),
        "box": Box(Point(1, 1), Point(0, 0)),
        "path": Path((Point(0, 0), Point(1, 1)), closed=True),
        "polygon": Polygon((Point(0, 0),)),
        "circle": Circle(Point(0, 0), 2),
        "range": Range(date(2024, 1, 1), None, True, False),
        "empty": values.EMPTY_RANGE,
        "multirange": (Range(Decimal("1.5"), Decimal("2"), True, False),),
        "array": [[1, None], [3, 4]],
        "composite": {"at": datetime(2024, 1, 1, tzinfo=UTC), "raw": b"\x00"},
        "infinite": "infinity",
    }
    table = TableVersion(1, "public", "t", "d", (Column("k", 23, "int4", -1, True),))
    event = ChangeEvent("c", table, None, after, (), 1, 1, 0, 1, 0)
    encoded = encode_value(event, server_name="s", now_ms=0)
    assert encoded == encode_value(event, server_name="s", now_ms=0)
    got = json.loads(encoded)["after"]
    assert got == {
        "interval": "P1Y2M3DT-0.5S",
        "inet": "192.168.0.1",
        "inet6": "2001:db8::1/64",
        "cidr": "10.0.0.0/8",
        "money": "-1.00",
        "lsn": 0x16_B374D848,
        "point": {"x": 1.5, "y": -2},
        "line": {"a": 1, "b": 2, "c": 3},
        "lseg": {"start": {"x": 0, "y": 0}, "end": {"x": 1, "y": 1}},
        "box": {"high": {"x": 1, "y": 1}, "low": {"x": 0, "y": 0}},
        "path": {"points": [{"x": 0, "y": 0}, {"x": 1, "y": 1}], "closed": True},
        "polygon": {"points": [{"x": 0, "y": 0}]},
        "circle": {"center": {"x": 0, "y": 0}, "radius": 2},
        "range": {"lower": "2024-01-01", "upper": None, "lower_inc": True, "upper_inc": False,
                  "empty": False},
        "empty": {"lower": None, "upper": None, "lower_inc": False, "upper_inc": False,
                  "empty": True},
        "multirange": [{"lower": "1.5", "upper": "2", "lower_inc": True, "upper_inc": False,
                        "empty": False}],
        "array": [[1, None], [3, 4]],
        "composite": {"at": "2024-01-01T00:00:00+00:00", "raw": "AA=="},
        "infinite": "infinity",
    }


@pytest.mark.parametrize(("text", "cidr", "expected"), [
    # what PostgreSQL 15's inet_out / cidr_out print for these literals
    ("192.168.1.5", False, "192.168.1.5"),
    ("192.168.1.5/32", False, "192.168.1.5"),
    ("192.168.1.5/24", False, "192.168.1.5/24"),
    ("10.0.0.0/8", True, "10.0.0.0/8"),
    ("10.1.2.3/32", True, "10.1.2.3/32"),
    ("::ffff:1.2.3.4", False, "::ffff:1.2.3.4"),
    ("::ffff:102:304/120", False, "::ffff:1.2.3.4/120"),
    ("::ffff:0.0.0.0", False, "::ffff:0.0.0.0"),
    ("::ffff:0:5", False, "::ffff:0.0.0.5"),
    ("::102:304", False, "::1.2.3.4"),
    ("::0.0.0.2", False, "::2"),
    ("::1", False, "::1"),
    ("::/0", True, "::/0"),
    ("::ffff:1.2.3.0/120", True, "::ffff:1.2.3.0/120"),
    ("2001:db8::1/64", False, "2001:db8::1/64"),
    ("2001:db8:0:0:1:0:0:1", False, "2001:db8::1:0:0:1"),
    ("2001:db8::/32", True, "2001:db8::/32"),
])
def test_inet_text_is_postgresql_text(text: str, cidr: bool, expected: str) -> None:
    value = text_parsers.decoder_for(values.CIDR if cidr else values.INET)(text)
    assert values.inet_text(value) == expected
    assert values.inet_text(text_parsers.decoder_for(values.INET if not cidr else values.CIDR)(
        expected)) == expected
