"""The compiled binary decoders (decoder/_fastrow.c, ``BinaryDecoder``) against the Python
ones (decoder/binary.py): the same value, of the same type, or the same error, for every
input, and the same rows from the compiled tuple loop as from the reference loop.

Each compiled decoder carries its Python decoder as ``fallback``; C hands it every value it
cannot read exactly (infinity, BC, years past 9999, NaN numerics, malformed bytes), so the
comparison runs on values of every kind: generated valid ones, the edges, and mutated or
random bytes.  tests/integration/test_values_roundtrip.py checks the real server's bytes.
"""

from __future__ import annotations

import math
import random
import struct
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.numeric import DecimalBinaryDumper

from decoder import text_parsers, tuples
from decoder import values as v
from decoder.binary import BinaryDecoders, BinaryFormatError, decoder_for
from decoder.type_registry import TypeRegistry

pytestmark = pytest.mark.skipif(not tuples.COMPILED,
                                reason="decoder._fastrow not loaded (test_fastrow.py fails then)")

KINDS = {
    v.BOOL: "bool", v.INT2: "int2", v.INT4: "int4", v.INT8: "int8", v.OID: "uint4",
    v.XID: "uint4", v.CID: "uint4", v.PG_LSN: "uint8", v.XID8: "uint8", v.FLOAT4: "float4",
    v.FLOAT8: "float8", v.TEXT: "text", v.VARCHAR: "text", v.BPCHAR: "text", v.NAME: "text",
    v.JSON: "text", v.XML: "text", v.JSONB: "jsonb", v.UUID: "uuid", v.NUMERIC: "numeric",
    v.DATE: "date", v.TIMESTAMP: "timestamp", v.TIMESTAMPTZ: "timestamptz",
}
"""Every built-in type read in C, and its kind there (bytea is kept as bytes, no call)."""

_EPOCH_ORDINAL = date(2000, 1, 1).toordinal()
_DAY_US = 86_400_000_000
_FIRST_DAY = 1 - _EPOCH_ORDINAL  # 0001-01-01, in days since 2000-01-01
_LAST_DAY = date.max.toordinal() - _EPOCH_ORDINAL  # 9999-12-31


def _compiled(oid: int, registry: TypeRegistry | None = None) -> Any:
    decode = BinaryDecoders(registry).decoder_for(oid) if registry else decoder_for(oid)
    assert type(decode).__name__ == "BinaryDecoder", \
        f"{text_parsers.type_name(oid)} is not compiled"
    return decode


def _same(a: Any, b: Any) -> bool:
    """Equal values of the same type, down to a float's bits, a Decimal's digits and
    exponent, a datetime's tzinfo and a UUID's state."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return struct.pack("!d", a) == struct.pack("!d", b)
    if isinstance(a, Decimal):
        return bool(a.as_tuple() == b.as_tuple())
    if isinstance(a, UUID):
        return (a.int, a.is_safe) == (b.int, b.is_safe)
    if isinstance(a, datetime):
        return bool(a == b and a.tzinfo is b.tzinfo and a.fold == b.fold)
    return bool(a == b and repr(a) == repr(b))


def _outcome(decode: Any, raw: bytes) -> tuple[str, Any]:
    try:
        return "ok", decode(raw)
    except BinaryFormatError as exc:
        return "error", str(exc)


def _check(decode: Any, raw: bytes) -> Any:
    """The compiled decoder's outcome on ``raw`` is its Python decoder's; returns it."""
    fast, slow = _outcome(decode, raw), _outcome(decode.fallback, raw)
    assert fast[0] == slow[0], (raw, fast, slow)
    if fast[0] == "ok":
        assert _same(fast[1], slow[1]), (raw, fast, slow)
    else:
        assert fast[1] == slow[1]
    return fast


def test_the_hot_types_are_compiled() -> None:
    for oid, kind in KINDS.items():
        assert _compiled(oid).kind == kind
        array = _compiled(text_parsers.ARRAY_OIDS[oid])
        assert (array.kind, array.element, array.element_oid) == ("array", kind, oid)
    assert decoder_for(v.BYTEA) is bytes
    assert _compiled(1001).element == "bytea"  # bytea[]
    for oid in (v.INTERVAL, v.TIME, v.MONEY, v.INT4RANGE, 1187):  # Python only
        assert type(decoder_for(oid)).__name__ == "function"


def test_enums_domains_and_their_arrays_are_compiled() -> None:
    registry = TypeRegistry()
    registry.register_enum(30001, name="mood")
    registry.register_array(30002, 30001, name="_mood")
    registry.register_domain(30003, v.NUMERIC, name="price")
    registry.register_domain(30004, 30003, name="dear_price")
    registry.register_array(30005, 30004, name="_dear_price")
    registry.register_domain(30006, 1007, name="int_list")
    registry.register_composite(30007, [("m", 30001)], name="has_mood")
    registry.register_array(30008, 30007, name="_has_mood")
    expected = {30001: ("text", None, 0), 30002: ("array", "text", 30001),
                30003: ("numeric", None, 0), 30004: ("numeric", None, 0),
                30005: ("array", "numeric", 30004), 30006: ("array", "int4", v.INT4)}
    for oid, shape in expected.items():
        decode = _compiled(oid, registry)
        assert (decode.kind, decode.element, decode.element_oid) == shape
    decoders = BinaryDecoders(registry)
    assert type(decoders.decoder_for(30007)).__name__ == "function"
    assert type(decoders.decoder_for(30008)).__name__ == "function"
    mood = _compiled(30002, registry)
    raw = _array(30001, [2], [b"sad", None])
    assert _check(mood, raw) == ("ok", ["sad", None])
    assert _check(mood, _array(v.TEXT, [1], [b"sad"]))[0] == "error"  # not the enum's OID
    assert "type _mood" in _check(mood, _array(v.TEXT, [1], [b"sad"]))[1]


# --- scalars ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("oid", "fmt"), [(v.INT2, "!h"), (v.INT4, "!i"), (v.INT8, "!q"),
                                          (v.OID, "!I"), (v.PG_LSN, "!Q")])
def test_integers_at_their_limits_and_other_lengths(oid: int, fmt: str) -> None:
    decode = _compiled(oid)
    bits = 8 * struct.calcsize(fmt)
    unsigned = fmt[-1].isupper()
    low, high = (0, 2**bits - 1) if unsigned else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    for n in (low, low + 1, -1 if low else 1, 0, high - 1, high):
        assert _check(decode, struct.pack(fmt, n)) == ("ok", n)
    for size in range(10):
        _check(decode, bytes(range(1, size + 1)))


@given(st.integers(-(2**15), 2**15 - 1), st.integers(-(2**31), 2**31 - 1),
       st.integers(-(2**63), 2**63 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1))
def test_integers(i2: int, i4: int, i8: int, u4: int, u8: int) -> None:
    assert _check(_compiled(v.INT2), struct.pack("!h", i2)) == ("ok", i2)
    assert _check(_compiled(v.INT4), struct.pack("!i", i4)) == ("ok", i4)
    assert _check(_compiled(v.INT8), struct.pack("!q", i8)) == ("ok", i8)
    assert _check(_compiled(v.XID), struct.pack("!I", u4)) == ("ok", u4)
    assert _check(_compiled(v.XID8), struct.pack("!Q", u8)) == ("ok", u8)


def test_bool() -> None:
    decode = _compiled(v.BOOL)
    assert _check(decode, b"\x01") == ("ok", True)
    assert _check(decode, b"\x00") == ("ok", False)
    for raw in (b"", b"\x02", b"\xff", b"\x00\x00", b"\x01\x00"):
        assert _check(decode, raw)[0] == "error"


def test_float4_bit_patterns() -> None:
    """float4 decodes to its shortest decimal's double: 100,000 random bit patterns (every
    exponent, subnormals, NaN payloads, infinities) and the edges."""
    decode = _compiled(v.FLOAT4)
    rng = random.Random(20261124)
    patterns = [rng.getrandbits(32) for _ in range(100_000)]
    patterns += [0, 0x80000000, 1, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000,
                 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF, 0x3F8CCCCD]
    for bits in patterns:
        _check(decode, struct.pack("!I", bits))
    assert _check(decode, struct.pack("!f", 1.1)) == ("ok", 1.1)
    assert _check(decode, struct.pack("!f", 3.4028234663852886e38)) == ("ok", 3.4028235e38)


@given(st.floats(width=32) | st.floats(width=32).map(lambda x: -x))
def test_float4(value: float) -> None:
    _check(_compiled(v.FLOAT4), struct.pack("!f", value))


@given(st.binary(min_size=8, max_size=8) | st.floats().map(lambda x: struct.pack("!d", x)))
def test_float8(raw: bytes) -> None:
    kind, value = _check(_compiled(v.FLOAT8), raw)
    assert kind == "ok" and (math.isnan(value) or struct.pack("!d", value) == raw)


# --- text-like --------------------------------------------------------------------------------

@given(st.text() | st.binary(max_size=20).map(lambda b: b.decode("latin-1")))
def test_text_and_jsonb(text: str) -> None:
    raw = text.encode("utf-8", "surrogatepass")
    expected = ("ok", text) if not any(0xD800 <= ord(c) <= 0xDFFF for c in text) else None
    for oid in (v.TEXT, v.VARCHAR, v.BPCHAR, v.NAME, v.JSON, v.XML):
        got = _check(_compiled(oid), raw)
        assert expected is None or got == expected
    got = _check(_compiled(v.JSONB), b"\x01" + raw)
    assert expected is None or got == expected


@given(st.binary(max_size=24))
def test_text_jsonb_uuid_bool_on_any_bytes(raw: bytes) -> None:
    for oid in (v.TEXT, v.JSONB, v.UUID, v.BOOL, v.INT4, v.FLOAT4, v.DATE, v.TIMESTAMPTZ,
                v.NUMERIC):
        _check(_compiled(oid), raw)


def test_invalid_utf8_and_jsonb_versions_name_the_type() -> None:
    assert "malformed binary value of type text" in _check(_compiled(v.TEXT), b"a\xffb")[1]
    assert "jsonb format version" in _check(_compiled(v.JSONB), b"\x02{}")[1]
    assert "jsonb format version" in _check(_compiled(v.JSONB), b"")[1]


@given(st.binary(min_size=16, max_size=16))
def test_uuid(raw: bytes) -> None:
    kind, value = _check(_compiled(v.UUID), raw)
    assert kind == "ok" and value == UUID(bytes=raw) and str(value) == str(UUID(bytes=raw))
    assert hash(value) == hash(UUID(bytes=raw))


# --- numeric ----------------------------------------------------------------------------------

def _numeric(ndigits: int, weight: int, sign: int, dscale: int, *digits: int) -> bytes:
    return struct.pack(f"!hhHH{len(digits)}H", ndigits, weight, sign, dscale, *digits)


@settings(max_examples=500)
@given(st.decimals(places=None) | st.decimals(allow_nan=False, allow_infinity=False,
                                                places=None).map(lambda d: d.scaleb(-40)))
def test_numeric_from_psycopg(value: Decimal) -> None:
    dumped = DecimalBinaryDumper(Decimal).dump(value)
    assert dumped is not None
    kind, got = _check(_compiled(v.NUMERIC), bytes(dumped))
    assert kind == "ok" and (got.is_nan() if value.is_nan() else got == value)


@settings(max_examples=500)
@given(st.integers(-1, 6), st.integers(-40, 40), st.sampled_from([0, 0x4000, 0xC000, 0xD000,
                                                                  0xF000, 0x1234]),
       st.integers(0, 60) | st.integers(0, 0xFFFF), st.lists(st.integers(0, 10_050), max_size=6),
       st.booleans())
def test_numeric_headers(ndigits: int, weight: int, sign: int, dscale: int, digits: list[int],
                         exact: bool) -> None:
    """Every combination of header and digits, consistent or not: trailing zeros beyond
    the display scale, digits over 9999, a digit count that is not the value's length."""
    if exact:
        digits = digits[: max(ndigits, 0)] + [0] * (max(ndigits, 0) - len(digits))
    raw = struct.pack(f"!hhHH{len(digits)}H", ndigits, weight, sign, dscale, *digits)
    _check(_compiled(v.NUMERIC), raw)


def test_numeric_edges() -> None:
    decode = _compiled(v.NUMERIC)
    for raw in (_numeric(0, 0, 0xC000, 0), _numeric(0, 0, 0xD000, 0), _numeric(0, 0, 0xF000, 0),
                _numeric(0, 0, 0, 0), _numeric(0, 0, 0, 3), _numeric(2, 0, 0, 1, 12, 5000),
                _numeric(1, 2, 0x4000, 0, 1), _numeric(1, -10, 0x4000, 38, 100),
                _numeric(250, 249, 0, 0, *([9999] * 250)), _numeric(1, 32767, 0, 0, 1),
                _numeric(1, -32768, 0, 16383, 1), _numeric(1, 0, 0, 0, 10000),
                _numeric(2, 0, 0, 2, 1, 1), _numeric(1, -3, 0, 4, 5), b"\x00" * 7):
        _check(decode, raw)
    assert _check(decode, _numeric(2, 0, 0, 2, 1234, 5600)) == ("ok", Decimal("1234.56"))
    assert str(_check(decode, _numeric(0, 0, 0, 3))[1]) == "0.000"


# --- dates and timestamps ---------------------------------------------------------------------

def test_every_day_edge_and_a_sweep_of_days() -> None:
    decode = _compiled(v.DATE)
    days = [_FIRST_DAY - 1, _FIRST_DAY, _LAST_DAY, _LAST_DAY + 1, 0, -1, 2**31 - 1, -(2**31),
            -2451545, -2451545 + 38, -730119 - 366, 59, 60, 36_524, 36_525]
    days += range(_FIRST_DAY - 2_000, _LAST_DAY + 2_000, 97)
    for day in days:
        _check(decode, struct.pack("!i", day))
    assert _check(decode, struct.pack("!i", _FIRST_DAY)) == ("ok", date(1, 1, 1))
    assert _check(decode, struct.pack("!i", _LAST_DAY)) == ("ok", date(9999, 12, 31))
    assert _check(decode, struct.pack("!i", _LAST_DAY + 1)) == ("ok", "10000-01-01")


@given(st.integers(-(2**31), 2**31 - 1))
def test_dates(day: int) -> None:
    _check(_compiled(v.DATE), struct.pack("!i", day))


_MICROS = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(_FIRST_DAY * _DAY_US - 10**9, (_LAST_DAY + 1) * _DAY_US + 10**9),
    st.integers(-(10**15), 10**15),
    st.sampled_from([_FIRST_DAY * _DAY_US, _FIRST_DAY * _DAY_US - 1, (_LAST_DAY + 1) * _DAY_US,
                     (_LAST_DAY + 1) * _DAY_US - 1, 2**63 - 1, -(2**63), 0, -1]),
)


@settings(max_examples=500)
@given(_MICROS)
def test_timestamps(micros: int) -> None:
    raw = struct.pack("!q", micros)
    for oid in (v.TIMESTAMP, v.TIMESTAMPTZ):
        kind, value = _check(_compiled(oid), raw)
        assert kind == "ok"
        if isinstance(value, datetime):
            epoch = datetime(2000, 1, 1, tzinfo=value.tzinfo)
            assert (value - epoch).total_seconds() * 1_000_000 == pytest.approx(micros, abs=1e3)


# --- arrays -----------------------------------------------------------------------------------

def _array(element_oid: int, dims: list[int], items: list[bytes | None]) -> bytes:
    head = struct.pack("!iiI", len(dims), any(i is None for i in items), element_oid)
    head += b"".join(struct.pack("!ii", size, 1) for size in dims)
    return head + b"".join(struct.pack("!i", -1) if i is None else struct.pack("!i", len(i)) + i
                           for i in items)


_ELEMENTS: dict[int, st.SearchStrategy[bytes]] = {
    v.INT4: st.integers(-(2**31), 2**31 - 1).map(lambda n: struct.pack("!i", n)),
    v.INT8: st.integers(-(2**63), 2**63 - 1).map(lambda n: struct.pack("!q", n)),
    v.TEXT: st.text(max_size=6).map(lambda t: t.encode("utf-8", "surrogatepass")),
    v.FLOAT4: st.binary(min_size=4, max_size=4),
    v.DATE: st.integers(_FIRST_DAY - 5, _LAST_DAY + 5).map(lambda n: struct.pack("!i", n)),
    v.TIMESTAMPTZ: _MICROS.map(lambda n: struct.pack("!q", n)),
    v.NUMERIC: st.decimals(allow_nan=False, allow_infinity=False, places=2).map(
        lambda d: bytes(DecimalBinaryDumper(Decimal).dump(d) or b"")),
    v.UUID: st.binary(min_size=16, max_size=16),
    v.BYTEA: st.binary(max_size=5),
    v.BOOL: st.sampled_from([b"\x00", b"\x01"]),
}


@st.composite
def _arrays(draw: st.DrawFn) -> tuple[int, bytes]:
    element = draw(st.sampled_from(sorted(_ELEMENTS)))
    dims = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    items = draw(st.lists(st.none() | _ELEMENTS[element], min_size=math.prod(dims),
                          max_size=math.prod(dims)))
    return element, _array(element, dims, items)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(_arrays(), st.data())
def test_arrays(array: tuple[int, bytes], data: st.DataObject) -> None:
    element, raw = array
    decode = _compiled(text_parsers.ARRAY_OIDS[element])
    assert _check(decode, raw)[0] == "ok" or element == v.TEXT  # lone surrogates: error
    mutated = bytearray(raw)
    at = data.draw(st.integers(0, len(raw) - 1))
    mutated[at] = data.draw(st.integers(0, 255))
    _check(decode, bytes(mutated))
    _check(decode, raw[: data.draw(st.integers(0, len(raw)))])
    _check(decode, raw + data.draw(st.binary(min_size=1, max_size=4)))


def test_array_edges() -> None:
    ints = _compiled(1007)
    one = struct.pack("!i", 1)
    cases = [
        struct.pack("!iiI", 0, 0, v.INT4), struct.pack("!iiI", 0, 0, v.INT4) + b"x",
        struct.pack("!iiI", 0, 0, v.INT8), _array(v.INT4, [0], []), _array(v.INT4, [2, 0], []),
        _array(v.INT4, [-1], []), _array(v.INT4, [1] * 6, [one]), _array(v.INT4, [1] * 7, [one]),
        struct.pack("!iiIii", 1, 0, v.INT4, 2**31 - 1, 1) + one,
        struct.pack("!iiIii", 1, 0, v.INT4, 1, 1) + struct.pack("!i", -2),
        struct.pack("!iiIii", -1, 0, v.INT4, 1, 1), b"", b"\x00" * 11,
        _array(v.INT4, [2, 3], [struct.pack("!i", n) for n in range(6)]),
    ]
    for raw in cases:
        _check(ints, raw)
    assert _check(ints, _array(v.INT4, [2, 3], [struct.pack("!i", n) for n in range(6)])) == (
        "ok", [[0, 1, 2], [3, 4, 5]])
    dates = _compiled(1182)
    raw = _array(v.DATE, [3], [struct.pack("!i", 0), None, struct.pack("!i", 2**31 - 1)])
    assert _check(dates, raw) == ("ok", [date(2000, 1, 1), None, "infinity"])  # the fallback


# --- the compiled tuple loop with compiled decoders -------------------------------------------

_COLUMN_OIDS = [v.INT8, v.NUMERIC, v.TIMESTAMPTZ, v.TEXT, v.JSONB, 1007, v.UUID, v.FLOAT4,
                v.DATE, v.BOOL, v.BYTEA, 1182]


def _column(oid: int) -> st.SearchStrategy[bytes]:
    """Valid values of a column type: a scalar, or a one-element array of one."""
    if oid == v.JSONB:
        return _ELEMENTS[v.TEXT].map(lambda raw: b"\x01" + raw)
    element = next((e for e, a in text_parsers.ARRAY_OIDS.items() if a == oid), None)
    if element is None:
        return _ELEMENTS[oid]
    return st.lists(st.none() | _ELEMENTS[element], min_size=1, max_size=3).map(
        lambda items: _array(element, [len(items)], items))


def _tuple(columns: list[bytes | None]) -> bytes:
    out = struct.pack("!h", len(columns))
    for raw in columns:
        out += b"n" if raw is None else b"b" + struct.pack("!i", len(raw)) + raw
    return out


def _row_outcome(loop: Any, buf: bytes, columns: tuples.Columns) -> tuple[str, Any]:
    try:
        return "ok", loop(buf, 0, columns)
    except BinaryFormatError as exc:
        return "error", str(exc)
    except (tuples.TupleError, tuples.PyTupleError) as exc:
        return "tuple", exc.args


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_decode_row_reads_binary_values_in_place(data: st.DataObject) -> None:
    """The compiled loop with compiled decoders (reading each value where it is in the
    message) gives the rows, and errors, of the reference loop with the Python decoders."""
    values = [data.draw(st.none() | _column(oid) | st.binary(max_size=9))
              for oid in _COLUMN_OIDS]
    compiled = tuple((f"c{i}", None, decoder_for(oid)) for i, oid in enumerate(_COLUMN_OIDS))
    python = tuple((name, None, getattr(decode, "fallback", decode))
                   for name, _, decode in compiled)
    buf = _tuple(values)
    if data.draw(st.booleans()):
        buf = buf[: data.draw(st.integers(0, len(buf)))]
    fast = _row_outcome(tuples.decode_row, buf, compiled)
    slow = _row_outcome(tuples.py_decode_row, buf, python)
    assert fast[0] == slow[0], (fast, slow)
    if fast[0] == "ok":
        row, slow_row = fast[1][0], slow[1][0]
        assert list(row) == list(slow_row)
        assert all(_same(row[name], slow_row[name]) for name in row), (row, slow_row)
        assert fast[1][1:] == slow[1][1:]
    else:
        assert fast[1] == slow[1]
