"""Binary column values (decoder/binary.py) from hand-built send-function bytes.

Edge values of each format, the text a value keeps when Python cannot hold it (spelled
as the replication session prints it), the errors on bytes that are not the type's
format, and the compiled and reference tuple loops with a binary decoder per column.
The real server's bytes are checked by tests/integration/test_values_roundtrip.py.
"""

from __future__ import annotations

import math
import struct
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from ipaddress import IPv4Interface, IPv6Interface, IPv6Network
from typing import Any
from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg.types.numeric import DecimalBinaryDumper

from core.errors import ConfigError
from decoder import binary, text_parsers, tuples
from decoder import values as v
from decoder.binary import BinaryDecoders, BinaryFormatError, decoder_for
from decoder.type_registry import TypeRegistry
from decoder.values import EMPTY_RANGE, Box, Interval, Path, Point, Range
from pgcdc.config import load_settings


def _decode(oid: int, raw: bytes) -> Any:
    return decoder_for(oid)(raw)


def _numeric(ndigits: int, weight: int, sign: int, dscale: int, *digits: int) -> bytes:
    return struct.pack(f"!hhHH{len(digits)}H", ndigits, weight, sign, dscale, *digits)


def test_integers_bool_oid_lsn() -> None:
    assert _decode(v.BOOL, b"\x01") is True and _decode(v.BOOL, b"\x00") is False
    assert _decode(v.INT2, b"\x80\x00") == -32768
    assert _decode(v.INT4, b"\x7f\xff\xff\xff") == 2**31 - 1
    assert _decode(v.INT8, b"\x80" + bytes(7)) == -(2**63)
    assert _decode(v.OID, b"\xff" * 4) == 2**32 - 1
    assert _decode(v.PG_LSN, struct.pack("!Q", 0x16_B374D848)) == 0x16_B374D848


def test_floats_as_their_text_reads() -> None:
    assert _decode(v.FLOAT4, struct.pack("!f", 1.1)) == 1.1  # not 1.100000023841858
    assert _decode(v.FLOAT4, struct.pack("!f", 1e-45)) == 1e-45
    assert _decode(v.FLOAT4, struct.pack("!f", 3.4028234663852886e38)) == 3.4028235e38
    assert math.isnan(_decode(v.FLOAT4, struct.pack("!f", math.nan)))
    assert _decode(v.FLOAT4, struct.pack("!f", -math.inf)) == -math.inf
    assert _decode(v.FLOAT8, struct.pack("!d", 5e-324)) == 5e-324
    assert math.isnan(_decode(v.FLOAT8, struct.pack("!d", math.nan)))


@pytest.mark.parametrize(("raw", "text"), [
    (_numeric(0, 0, 0xC000, 0), "NaN"),
    (_numeric(0, 0, 0xD000, 0), "Infinity"),
    (_numeric(0, 0, 0xF000, 0), "-Infinity"),
    (_numeric(0, 0, 0, 0), "0"),
    (_numeric(0, 0, 0, 3), "0.000"),
    (_numeric(2, 0, 0, 1, 12, 5000), "12.5"),  # the last group's zeros beyond dscale
    (_numeric(1, 2, 0x4000, 0, 1), "-100000000"),  # whole groups of zeros not sent
    (_numeric(1, -10, 0x4000, 38, 100), "-0.00000000000000000000000000000000000001"),
])
def test_numeric_edges(raw: bytes, text: str) -> None:
    got = _decode(v.NUMERIC, raw)
    assert str(got) == str(Decimal(text))


def test_numeric_of_a_thousand_digits_is_exact() -> None:
    raw = _numeric(250, 249, 0, 0, *([9999] * 250))
    assert _decode(v.NUMERIC, raw) == Decimal("9" * 1000)


@given(st.decimals(allow_nan=False, allow_infinity=False, places=None))
def test_numeric_reads_what_psycopg_writes(value: Decimal) -> None:
    dumped = DecimalBinaryDumper(Decimal).dump(value)
    assert dumped is not None
    raw = bytes(dumped)
    got = _decode(v.NUMERIC, raw)
    assert got == value
    assert got.as_tuple().exponent == -struct.unpack_from("!H", raw, 6)[0]  # the dscale


def test_money_in_cents() -> None:
    assert str(_decode(v.MONEY, struct.pack("!q", -123456))) == "-1234.56"
    assert str(_decode(v.MONEY, struct.pack("!q", 0))) == "0.00"


def test_text_like() -> None:
    assert _decode(v.TEXT, "žluť 🐍".encode()) == "žluť 🐍"
    assert _decode(v.BPCHAR, b"ab   ") == "ab   "
    assert _decode(v.CHAR, b"a") == "a"
    assert _decode(v.CHAR, b"\xc8") == "\\310"  # as charout prints it
    assert _decode(v.CHAR, b"\x00") == ""
    assert _decode(v.BYTEA, b"\x00\xff") == b"\x00\xff"
    assert _decode(v.UUID, bytes(range(16))) == UUID(bytes=bytes(range(16)))
    assert _decode(v.JSONB, b'\x01{"a": 1}') == '{"a": 1}'
    assert _decode(v.MACADDR, bytes([8, 0, 0x2B, 1, 2, 3])) == "08:00:2b:01:02:03"
    assert _decode(v.MACADDR8, bytes(range(8))) == "00:01:02:03:04:05:06:07"
    assert _decode(v.VARBIT, struct.pack("!i", 0)) == ""
    assert _decode(v.VARBIT, struct.pack("!i", 10) + bytes([0b10110000, 0b01000000])) == \
        "1011000001"


def test_tsvector_as_tsvectorout_prints_it() -> None:
    raw = (struct.pack("!i", 3) + b"a'b\x00" + struct.pack("!H", 0)
           + b"back\\\x00" + struct.pack("!HH", 1, 3)
           + b"x y\x00" + struct.pack("!HHH", 2, (3 << 14) | 1, (2 << 14) | 2))
    assert _decode(v.TSVECTOR, raw) == "'a''b' 'back\\\\':3 'x y':1A,2B"


def _val(operand: str, weight: int = 0, prefix: int = 0) -> bytes:
    return bytes([1, weight, prefix]) + operand.encode() + b"\x00"


def _opr(operator: int, distance: int | None = None) -> bytes:
    return bytes([2, operator]) + (struct.pack("!h", distance) if distance is not None else b"")


def test_tsquery_as_tsqueryout_prints_it() -> None:
    # fat & (rat | !cat): prefix order is operator, right operand, left operand
    items = [_opr(2), _opr(3), _opr(1), _val("cat"), _val("rat"), _val("fat")]
    raw = struct.pack("!i", len(items)) + b"".join(items)
    assert _decode(v.TSQUERY, raw) == "'fat' & ( 'rat' | !'cat' )"
    items = [_opr(4, 2), _val("b", weight=8 | 1), _val("a'", prefix=1)]
    raw = struct.pack("!i", len(items)) + b"".join(items)
    assert _decode(v.TSQUERY, raw) == "'a''':* <2> 'b':AD"
    assert _decode(v.TSQUERY, struct.pack("!i", 0)) == ""


def _days(d: date) -> bytes:
    return struct.pack("!i", d.toordinal() - date(2000, 1, 1).toordinal())


def test_dates_and_the_text_python_cannot_hold() -> None:
    assert _decode(v.DATE, _days(date(2024, 2, 29))) == date(2024, 2, 29)
    assert _decode(v.DATE, _days(date(1, 1, 1))) == date(1, 1, 1)
    assert _decode(v.DATE, struct.pack("!i", 2**31 - 1)) == "infinity"
    assert _decode(v.DATE, struct.pack("!i", -(2**31))) == "-infinity"
    assert _decode(v.DATE, struct.pack("!i", -730119 - 366)) == "0001-01-01 BC"  # 1 BC: leap
    assert _decode(v.DATE, struct.pack("!i", -2451545 + 38)) == "4713-01-01 BC"
    after_9999 = date(9999, 12, 31).toordinal() + 1 - date(2000, 1, 1).toordinal()
    assert _decode(v.DATE, struct.pack("!i", after_9999)) == "10000-01-01"


def test_timestamps() -> None:
    assert _decode(v.TIMESTAMP, struct.pack("!q", 1)) == datetime(2000, 1, 1, 0, 0, 0, 1)  # noqa: DTZ001
    assert _decode(v.TIMESTAMPTZ, struct.pack("!q", -1)) == datetime(
        1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    assert _decode(v.TIMESTAMP, struct.pack("!q", 2**63 - 1)) == "infinity"
    assert _decode(v.TIMESTAMPTZ, struct.pack("!q", -(2**63))) == "-infinity"
    # 0001-01-01 00:00:00+01 is 0001-12-31 23:00:00+00 BC in UTC
    bc = (date(1, 1, 1).toordinal() - 730120) * 86_400_000_000 - 3_600_000_000
    assert _decode(v.TIMESTAMPTZ, struct.pack("!q", bc)) == "0001-12-31 23:00:00+00 BC"
    late = (date(9999, 12, 31).toordinal() + 1 - 730120) * 86_400_000_000 + 500_000
    assert _decode(v.TIMESTAMP, struct.pack("!q", late)) == "10000-01-01 00:00:00.5"


def test_times_and_intervals() -> None:
    assert _decode(v.TIME, struct.pack("!q", 86_399_999_999)) == time(23, 59, 59, 999999)
    assert _decode(v.TIME, struct.pack("!q", 86_400_000_000)) == "24:00:00"
    east = _decode(v.TIMETZ, struct.pack("!qi", 45_296_789_000, -19800))
    assert east == time(12, 34, 56, 789000, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    assert _decode(v.TIMETZ, struct.pack("!qi", 86_400_000_000, 57540)) == "24:00:00-15:59"
    assert _decode(v.TIMETZ, struct.pack("!qi", 86_400_000_000, -3600)) == "24:00:00+01"
    assert _decode(v.INTERVAL, struct.pack("!qii", -500_000, 3, -14)) == Interval(-14, 3, -500_000)


def test_network_and_geometry() -> None:
    assert _decode(v.INET, bytes([2, 32, 0, 4, 192, 168, 1, 5])) == IPv4Interface("192.168.1.5")
    assert _decode(v.INET, bytes([3, 64, 0, 16]) + bytes(15) + b"\x01") == IPv6Interface("::1/64")
    assert _decode(v.CIDR, bytes([3, 32, 1, 16, 0x20, 1, 0x0D, 0xB8]) + bytes(12)) == \
        IPv6Network("2001:db8::/32")
    assert _decode(v.POINT, struct.pack("!dd", 1.5, math.inf)) == Point(1.5, math.inf)
    assert _decode(v.BOX, struct.pack("!4d", 3, 4, 1, 2)) == Box(Point(3, 4), Point(1, 2))
    assert _decode(v.PATH, b"\x01" + struct.pack("!i4d", 2, 0, 0, 1, 1)) == Path(
        (Point(0, 0), Point(1, 1)), closed=True)


def _array(element_oid: int, dims: list[int], items: list[bytes | None]) -> bytes:
    head = struct.pack("!iiI", len(dims), any(i is None for i in items), element_oid)
    head += b"".join(struct.pack("!ii", size, 1) for size in dims)
    return head + b"".join(struct.pack("!i", -1) if i is None else struct.pack("!i", len(i)) + i
                           for i in items)


def test_arrays_of_any_dimension_with_nulls() -> None:
    ints = [struct.pack("!i", n) for n in (1, 2, 3)]
    raw = _array(v.INT4, [2, 2, 1], [ints[0], None, ints[1], ints[2]])
    assert _decode(1007, raw) == [[[1], [None]], [[2], [3]]]
    assert _decode(1007, struct.pack("!iiI", 0, 0, v.INT4)) == []
    assert _decode(1182, _array(v.DATE, [1], [struct.pack("!i", 2**31 - 1)])) == ["infinity"]
    with pytest.raises(BinaryFormatError, match="malformed binary value of type _int4: array "
                                                "of type OID 20"):
        _decode(1007, _array(v.INT8, [1], [bytes(8)]))


def _range(flags: int, *bounds: bytes) -> bytes:
    return bytes([flags]) + b"".join(struct.pack("!i", len(b)) + b for b in bounds)


def test_ranges_and_multiranges() -> None:
    one, ten = struct.pack("!i", 1), struct.pack("!i", 10)
    assert _decode(v.INT4RANGE, _range(0x02, one, ten)) == Range(1, 10, True, False)
    assert _decode(v.INT4RANGE, _range(0x01)) == EMPTY_RANGE
    assert _decode(v.INT4RANGE, _range(0x08 | 0x10)) == Range(None, None, False, False)
    assert _decode(v.INT4RANGE, _range(0x08, ten)) == Range(None, 10, False, False)
    multi = _range(0x02, one, ten)
    raw = struct.pack("!i", 2) + struct.pack("!i", len(multi)) + multi + struct.pack("!i", 1) \
        + _range(0x01)
    assert _decode(v.INT4MULTIRANGE, raw) == (Range(1, 10, True, False), EMPTY_RANGE)


def test_custom_types_through_a_registry() -> None:
    registry = TypeRegistry()
    registry.register_enum(20001, name="mood")
    registry.register_domain(20002, v.INT4, name="posint")
    registry.register_composite(20003, [("m", 20001), ("p", 20002), ("t", v.TEXT)], name="c")
    registry.register_array(20004, 20003, name="_c")
    registry.register_text(20005, name="citext")
    registry.register_composite(20006, [("x", 20005)], name="has_citext")
    decoders = BinaryDecoders(registry)
    record = (struct.pack("!i", 3) + struct.pack("!Ii", 20001, 3) + b"sad"
              + struct.pack("!Ii", 20002, 4) + struct.pack("!i", 7) + struct.pack("!Ii", 25, -1))
    assert decoders.decoder_for(20003)(record) == {"m": "sad", "p": 7, "t": None}
    assert decoders.decoder_for(20004)(_array(20003, [2], [record, None])) == [
        {"m": "sad", "p": 7, "t": None}, None]
    assert decoders.supports(20004)
    assert not decoders.supports(20005) and not decoders.supports(20006)
    with pytest.raises(BinaryFormatError, match="type has_citext arrived in binary format.*"
                                                "set source.binary = off"):
        decoders.decoder_for(20006)(b"")
    registry.register_enum(20007, name="late")  # a registration after building
    assert decoders.supports(20007)


def test_hstore_and_pg_snapshot() -> None:
    registry = TypeRegistry()
    registry.register_base(20010, str, name="public.hstore")
    raw = struct.pack("!i", 2) + struct.pack("!i", 1) + b"a" + struct.pack("!i", 1) + b"1" \
        + struct.pack("!i", 1) + b"b" + struct.pack("!i", -1)
    assert BinaryDecoders(registry).decoder_for(20010)(raw) == {"a": "1", "b": None}
    assert _decode(binary.PG_SNAPSHOT, struct.pack("!iqqqq", 2, 10, 20, 11, 12)) == "10:20:11,12"
    assert _decode(binary.INT2VECTOR, _array(v.INT2, [3], [struct.pack("!h", n)
                                                          for n in (1, 2, -3)])) == "1 2 -3"


@pytest.mark.parametrize(("oid", "raw", "reason"), [
    (v.INT4, b"\x00\x00\x01", "unpack requires a buffer of 4 bytes"),
    (v.BOOL, b"\x02", "bool of"),
    (v.JSONB, b"\x02{}", "jsonb format version"),
    (v.NUMERIC, _numeric(1, 0, 0x1234, 0, 1), "numeric sign 0x1234"),
    (v.UUID, bytes(15), "bytes is not a 16-char string"),
    (v.TIME, struct.pack("!q", -1), "time of -1 microseconds"),
    (v.TEXT, b"\xff", "can't decode byte 0xff"),
])
def test_malformed_values_name_their_type(oid: int, raw: bytes, reason: str) -> None:
    with pytest.raises(BinaryFormatError, match=f"malformed binary value of type "
                                                f"{text_parsers.type_name(oid)}: .*{reason}"):
        _decode(oid, raw)


def test_a_type_without_a_decoder_is_named_in_the_error() -> None:
    with pytest.raises(BinaryFormatError, match="type regclass arrived in binary format"):
        decoder_for(2205, "regclass")(b"\x00\x00\x00\x01")


def _tuple(*columns: bytes | None) -> bytes:
    out = struct.pack("!h", len(columns))
    for raw in columns:
        out += b"n" if raw is None else b"b" + struct.pack("!i", len(raw)) + raw
    return out


@pytest.mark.parametrize("loop", [tuples.py_decode_row, tuples.decode_row])
def test_the_tuple_loops_call_the_binary_decoders(loop: Any) -> None:
    columns: tuples.Columns = (("id", int, decoder_for(v.INT4)), ("raw", None, None),
                               ("n", None, decoder_for(v.NUMERIC)), ("kept", int))
    buf = _tuple(struct.pack("!i", 7), b"\x00", None, b"\x01")
    row, unchanged, end = loop(buf, 0, columns)
    assert row == {"id": 7, "raw": b"\x00", "n": None, "kept": b"\x01"}
    assert (unchanged, end) == ((), len(buf))
    with pytest.raises(BinaryFormatError, match="type int4"):
        loop(_tuple(b"\x00", None, None, None), 0, columns)


def test_the_binary_setting() -> None:
    base = {"dsn": "dbname=x"}
    assert load_settings(base, environ={}).source.binary == "auto"  # the default
    assert load_settings({**base, "binary": "off"}, environ={"PGCDC_BINARY": "on"}
                         ).source.binary == "off"
    with pytest.raises(ConfigError, match="source.binary.*from PGCDC_BINARY"):
        load_settings(base, environ={"PGCDC_BINARY": "yes"})
