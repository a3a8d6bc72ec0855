"""Column values in pgoutput's binary format: each type's send function output, into the
same Python values as the text decoders of decoder/values.py.

With the ``binary`` option (PostgreSQL 14+), the server sends a column as ``'b'``, the
bytes of its type's ``typsend`` function (the format psycopg's binary loaders read), for
every type that has one; types without one still come as text.  A value decodes to
exactly what its text would have decoded to, so a table reads the same whichever format
the stream uses:

* what stays the server's text in text mode stays that text here, spelled as the
  replication session prints it (``DateStyle=ISO``, ``TimeZone=UTC``): ``infinity``
  dates and timestamps, BC dates and years past 9999, the time ``24:00:00``;
* float4 is the double nearest to its shortest decimal (what ``float4out`` prints), not
  the float4's exact binary value;
* jsonb, xml, tsvector and tsquery are their server text, rebuilt from the binary
  structure as ``jsonb_out``/``tsvectorout``/``tsqueryout`` print it; int2vector,
  oidvector and pg_snapshot too, as text mode keeps them;
* money is in cents (``lc_monetary=C``, as the session prints it).

Formats (``src/backend/utils/adt/*.c``, ``*_send``): integers, OIDs and floats
big-endian; ``numeric`` is ndigits, weight, sign, dscale, then base-10000 digits;
dates are days and timestamps microseconds since 2000-01-01, with ``INT_MAX``/
``INT64_MAX`` (and the minimums) for +-infinity; ``interval`` is microseconds, days,
months; arrays are ndim, a NULL flag, the element OID, (size, lower bound) per
dimension, then each element with its length (-1: NULL); ranges are a flags byte and
the present bounds; records are the field count, then per field its type OID and value.

A type without a binary decoder here (an extension's, say) cannot be read when the
server sends it in binary: :class:`BinaryDecoders` gives it a decoder that raises
:class:`BinaryFormatError`, naming the type and the fix (``source.binary = off``).
``source.binary = auto`` (decoder/transfer.py) asks :meth:`BinaryDecoders.supports`
first and streams text when a published column has such a type.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from ipaddress import IPv4Interface, IPv4Network, IPv6Interface, IPv6Network
from math import prod
from typing import Any, Final
from uuid import UUID

from decoder import values as v
from decoder.extensions import parse_ewkb
from decoder.values import (
    EMPTY_RANGE,
    Box,
    Circle,
    Interval,
    Line,
    LineSegment,
    Path,
    Point,
    Polygon,
    Range,
    TypeRegistry,
)
from pgcdc.errors import TerminalError

BinaryDecoder = Callable[[bytes], Any]


class BinaryFormatError(TerminalError):
    """A column arrived in binary and cannot be decoded: no decoder for its type, or bytes
    that are not its type's send format."""

    def __init__(self, type_name: str, reason: str | None = None) -> None:
        self.type_name = type_name
        if reason is None:
            text = (f"a value of type {type_name} arrived in binary format, which pgcdc "
                    "cannot decode: set source.binary = off (or auto, which streams text "
                    "when a published column has such a type) and restart")
        else:
            text = (f"malformed binary value of type {type_name}: {reason}; this is a bug or "
                    "a protocol mismatch: report it with the server version, and set "
                    "source.binary = off to stream text meanwhile")
        super().__init__(text)


_i16 = struct.Struct("!h").unpack
_i32 = struct.Struct("!i").unpack
_i64 = struct.Struct("!q").unpack
_u32 = struct.Struct("!I").unpack
_u64 = struct.Struct("!Q").unpack
_f32 = struct.Struct("!f").unpack
_f64 = struct.Struct("!d").unpack
_pack_f32 = struct.Struct("!f").pack
_i32_at = struct.Struct("!i").unpack_from
_u32_at = struct.Struct("!I").unpack_from
_u16_at = struct.Struct("!H").unpack_from
_f64_at = struct.Struct("!d").unpack_from
_NUMERIC_HEAD = struct.Struct("!hhHH").unpack_from
_ARRAY_HEAD = struct.Struct("!iiI").unpack_from
_FIELD_HEAD = struct.Struct("!Ii").unpack_from
_INTERVAL = struct.Struct("!qii").unpack
_TIMETZ = struct.Struct("!qi").unpack
_SNAPSHOT_HEAD = struct.Struct("!iqq").unpack_from


def _cut(buf: bytes, pos: int, length: int) -> bytes:
    end = pos + length
    if length < 0 or end > len(buf):
        msg = f"a length of {length} at {pos} runs past the {len(buf)} bytes of the value"
        raise ValueError(msg)
    return buf[pos:end]


def _done(buf: bytes, pos: int) -> None:
    if pos != len(buf):
        msg = f"{len(buf) - pos} bytes left over after the value"
        raise ValueError(msg)


# --- numbers ----------------------------------------------------------------------------------

def _bool(raw: bytes) -> bool:
    if raw == b"\x01":
        return True
    if raw == b"\x00":
        return False
    msg = f"bool of {raw!r}"
    raise ValueError(msg)


def _int2(raw: bytes) -> int:
    return int(_i16(raw)[0])


def _int4(raw: bytes) -> int:
    return int(_i32(raw)[0])


def _int8(raw: bytes) -> int:
    return int(_i64(raw)[0])


def _uint4(raw: bytes) -> int:
    return int(_u32(raw)[0])


def _uint8(raw: bytes) -> int:
    return int(_u64(raw)[0])


def _float8(raw: bytes) -> float:
    return float(_f64(raw)[0])


def _float4(raw: bytes) -> float:
    """The float4 as ``float4out`` prints it (shortest decimal that reads back the same
    float4), read as a double: what the text decoder gets."""
    (exact,) = _f32(raw)
    if exact != exact or exact in (float("inf"), float("-inf")) or exact == 0:
        return float(exact)
    for digits in range(1, 10):
        shortest = float(f"{exact:.{digits}g}")
        try:
            if _f32(_pack_f32(shortest))[0] == exact:
                return shortest
        except OverflowError:  # rounded past the largest float4
            continue
    return float(exact)


_NUMERIC_NEG, _NUMERIC_NAN, _NUMERIC_PINF, _NUMERIC_NINF = 0x4000, 0xC000, 0xD000, 0xF000
_NUMERIC_SPECIAL: Final = {_NUMERIC_NAN: Decimal("NaN"), _NUMERIC_PINF: Decimal("Infinity"),
                           _NUMERIC_NINF: Decimal("-Infinity")}


def _numeric(raw: bytes) -> Decimal:
    """Base-10000 digits; ``weight`` is the power of the first, ``dscale`` the display scale."""
    ndigits, weight, sign, dscale = _NUMERIC_HEAD(raw, 0)
    if sign in _NUMERIC_SPECIAL:
        _done(raw, 8)
        return _NUMERIC_SPECIAL[sign]
    if sign not in (0, _NUMERIC_NEG) or ndigits < 0:
        msg = f"numeric sign {sign:#x}, {ndigits} digits"
        raise ValueError(msg)
    _done(raw, 8 + 2 * ndigits)
    groups = struct.unpack_from(f"!{ndigits}H", raw, 8)
    if any(group > 9999 for group in groups):
        msg = "numeric digit over 9999"
        raise ValueError(msg)
    digits = "".join([f"{group:04d}" for group in groups]) or "0"
    exponent = 4 * (weight - ndigits + 1) if ndigits else 0
    if exponent > -dscale:  # whole groups: add the zeros the display scale shows
        digits += "0" * (exponent + dscale)
    elif exponent < -dscale:  # the last group's zeros beyond the display scale
        cut = -dscale - exponent
        if digits[-cut:].strip("0"):
            msg = f"numeric digits beyond its display scale {dscale}"
            raise ValueError(msg)
        digits = digits[:-cut] or "0"
    return Decimal(f"{'-' if sign == _NUMERIC_NEG else ''}{digits}E-{dscale}")


def _money(raw: bytes) -> Decimal:
    """Cents, as the session prints money (``lc_monetary=C``: two decimals)."""
    return Decimal(f"{_i64(raw)[0]}E-2")


# --- text-like --------------------------------------------------------------------------------

def _text(raw: bytes) -> str:
    return raw.decode("utf-8")


def _char(raw: bytes) -> str:
    """``"char"``: ``charout`` prints a byte over 127 as ``\\ooo`` and NUL as nothing."""
    (byte,) = raw
    if byte == 0:
        return ""
    return f"\\{byte:03o}" if byte > 127 else chr(byte)


def _jsonb(raw: bytes) -> str:
    if raw[:1] != b"\x01":
        msg = f"jsonb format version {raw[:1]!r}, pgcdc reads version 1"
        raise ValueError(msg)
    return raw[1:].decode("utf-8")


def _bits(raw: bytes) -> str:
    (count,) = _i32_at(raw, 0)
    if count < 0:
        msg = f"bit length {count}"
        raise ValueError(msg)
    _done(raw, 4 + (count + 7) // 8)
    if count == 0:
        return ""
    return format(int.from_bytes(raw[4:], "big"), f"0{8 * (len(raw) - 4)}b")[:count]


def _macaddr(size: int) -> BinaryDecoder:
    def decode(raw: bytes) -> str:
        if len(raw) != size:
            msg = f"{len(raw)} bytes, not {size}"
            raise ValueError(msg)
        return ":".join([f"{byte:02x}" for byte in raw])

    return decode


def _quote_lexeme(lexeme: str) -> str:
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


def _cstring(raw: bytes, pos: int) -> tuple[str, int]:
    end = raw.index(b"\x00", pos)
    return raw[pos:end].decode("utf-8"), end + 1


_WEIGHTS: Final = ("", "C", "B", "A")  # a position's weight: D (0, not printed) to A (3)


def _tsvector(raw: bytes) -> str:
    """``tsvectorout``: quoted lexemes, each with its positions and weights."""
    (count,) = _i32_at(raw, 0)
    pos, out = 4, []
    for _ in range(count):
        lexeme, pos = _cstring(raw, pos)
        (npos,) = _u16_at(raw, pos)
        positions = struct.unpack_from(f"!{npos}H", raw, pos + 2)
        pos += 2 + 2 * npos
        word = _quote_lexeme(lexeme)
        if npos:
            word += ":" + ",".join([f"{p & 0x3FFF}{_WEIGHTS[p >> 14]}" for p in positions])
        out.append(word)
    _done(raw, pos)
    return " ".join(out)


_QI_VAL, _QI_OPR = 1, 2
_OP_NOT, _OP_AND, _OP_OR, _OP_PHRASE = 1, 2, 3, 4
_PRIORITY: Final = {_OP_NOT: 4, _OP_AND: 2, _OP_OR: 1, _OP_PHRASE: 3}


def _tsquery(raw: bytes) -> str:
    """``tsqueryout``: the items come in prefix order (operator, right, left), printed in
    infix with the parentheses ``infix()`` in tsquery.c puts."""
    (count,) = _i32_at(raw, 0)
    # (item type, operator or weight, distance or prefix flag, operand)
    items: list[tuple[int, int, int, str]] = []
    pos = 4
    for _ in range(count):
        kind = raw[pos]
        if kind == _QI_VAL:
            weight, prefix = raw[pos + 1], raw[pos + 2]
            operand, pos = _cstring(raw, pos + 3)
            items.append((kind, weight, prefix, operand))
        elif kind == _QI_OPR:
            operator = raw[pos + 1]
            if operator not in _PRIORITY:
                msg = f"tsquery operator {operator}"
                raise ValueError(msg)
            distance = struct.unpack_from("!h", raw, pos + 2)[0] if operator == _OP_PHRASE else 0
            pos += 4 if operator == _OP_PHRASE else 2
            items.append((kind, operator, distance, ""))
        else:
            msg = f"tsquery item type {kind}"
            raise ValueError(msg)
    _done(raw, pos)
    if not items:
        return ""
    at = 0

    def infix(parent: int, right_phrase: bool) -> str:
        nonlocal at
        kind, operator, extra, operand = items[at]
        at += 1
        if kind == _QI_VAL:
            text = _quote_lexeme(operand)
            if operator or extra:
                text += ":" + ("*" if extra else "") + "".join(
                    letter for bit, letter in ((8, "A"), (4, "B"), (2, "C"), (1, "D"))
                    if operator & bit)
            return text
        priority = _PRIORITY[operator]
        if operator == _OP_NOT:
            text = "!" + infix(priority, False)
            return f"( {text} )" if priority < parent else text
        right = infix(priority, operator == _OP_PHRASE)
        left = infix(priority, False)
        if operator == _OP_PHRASE:
            sign = "<->" if extra == 1 else f"<{extra}>"
        else:
            sign = "&" if operator == _OP_AND else "|"
        text = f"{left} {sign} {right}"
        parens = priority < parent or (operator == _OP_PHRASE and right_phrase)
        return f"( {text} )" if parens else text

    text = infix(-1, False)
    if at != len(items):
        msg = f"{len(items) - at} tsquery items outside the tree"
        raise ValueError(msg)
    return text


# --- dates and times --------------------------------------------------------------------------

_EPOCH_DATE: Final = date(2000, 1, 1)
_EPOCH_ORDINAL: Final = _EPOCH_DATE.toordinal()
_EPOCH: Final = datetime(2000, 1, 1)  # noqa: DTZ001 - timestamp without time zone
_EPOCH_UTC: Final = datetime(2000, 1, 1, tzinfo=UTC)
_POSTGRES_EPOCH_JDATE: Final = 2451545
_DAY_US: Final = 86_400_000_000
_INT32_MAX, _INT32_MIN = 2**31 - 1, -(2**31)
_INT64_MAX, _INT64_MIN = 2**63 - 1, -(2**63)


def _j2date(julian_day: int) -> tuple[int, int, int]:
    """PostgreSQL's ``j2date`` (datetime.c): year (0 and below: BC), month, day."""
    julian = julian_day + 32044
    quad = julian // 146097
    extra = (julian - quad * 146097) * 4 + 3
    julian += 60 + quad * 3 + extra // 146097
    quad = julian // 1461
    julian -= quad * 1461
    y = julian * 4 // 1461
    julian = ((julian + 305) % 365 if y != 0 else (julian + 306) % 366) + 123
    y += quad * 4
    quad = julian * 2141 // 65536
    return y - 4800, (quad + 10) % 12 + 1, julian - 7834 * quad // 256


def _date_text(days: int) -> tuple[str, bool]:
    """``YYYY-MM-DD`` of a day since 2000-01-01, and whether it is BC."""
    year, month, day = _j2date(days + _POSTGRES_EPOCH_JDATE)
    if year <= 0:
        return f"{1 - year:04d}-{month:02d}-{day:02d}", True
    return f"{year:04d}-{month:02d}-{day:02d}", False


def _time_text(micros: int) -> str:
    seconds, fraction = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    text = f"{hour:02d}:{minute:02d}:{second:02d}"
    return text + f".{fraction:06d}".rstrip("0") if fraction else text


def _date(raw: bytes) -> date | str:
    (days,) = _i32(raw)
    if 1 <= _EPOCH_ORDINAL + days <= 3652059:  # date.min .. date.max
        return date.fromordinal(_EPOCH_ORDINAL + days)
    if days == _INT32_MAX:
        return "infinity"
    if days == _INT32_MIN:
        return "-infinity"
    text, bc = _date_text(days)
    return text + " BC" if bc else text


def _timestamp_text(micros: int, zone: str) -> str:
    if micros == _INT64_MAX:
        return "infinity"
    if micros == _INT64_MIN:
        return "-infinity"
    days, micros = divmod(micros, _DAY_US)
    text, bc = _date_text(days)
    return f"{text} {_time_text(micros)}{zone}{' BC' if bc else ''}"


def _timestamp(raw: bytes) -> datetime | str:
    (micros,) = _i64(raw)
    try:
        return _EPOCH + timedelta(microseconds=micros)
    except OverflowError:  # outside years 1 to 9999
        return _timestamp_text(micros, "")


def _timestamptz(raw: bytes) -> datetime | str:
    (micros,) = _i64(raw)
    try:
        return _EPOCH_UTC + timedelta(microseconds=micros)
    except OverflowError:
        return _timestamp_text(micros, "+00")


def _time(raw: bytes) -> time | str:
    (micros,) = _i64(raw)
    if not 0 <= micros <= _DAY_US:
        msg = f"time of {micros} microseconds"
        raise ValueError(msg)
    if micros == _DAY_US:
        return "24:00:00"
    seconds, fraction = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    return time(minutes // 60, minutes % 60, second, fraction)


def _zone_text(west: int) -> str:
    """``EncodeTimezone``: the offset east of UTC, ``+HH``, ``+HH:MM`` or ``+HH:MM:SS``."""
    sign = "+" if west <= 0 else "-"
    minutes, second = divmod(abs(west), 60)
    hour, minute = divmod(minutes, 60)
    if second:
        return f"{sign}{hour:02d}:{minute:02d}:{second:02d}"
    return f"{sign}{hour:02d}:{minute:02d}" if minute else f"{sign}{hour:02d}"


def _timetz(raw: bytes) -> time | str:
    micros, west = _TIMETZ(raw)  # the zone in seconds west of UTC
    local = _time(raw[:8])
    if isinstance(local, str):
        return local + _zone_text(west)
    return local.replace(tzinfo=timezone(timedelta(seconds=-west)))


def _interval(raw: bytes) -> Interval:
    micros, days, months = _INTERVAL(raw)
    return Interval(months, days, micros)


# --- network, geometry, others ----------------------------------------------------------------

_AF_INET, _AF_INET6 = 2, 3  # PGSQL_AF_INET, PGSQL_AF_INET6


def _inet_parts(raw: bytes) -> tuple[bytes, int, bool]:
    family, bits, is_cidr, size = raw[:4]
    if (family, size) not in ((_AF_INET, 4), (_AF_INET6, 16)) or len(raw) != 4 + size:
        msg = f"address family {family} with {size} bytes"
        raise ValueError(msg)
    return raw[4:], bits, family == _AF_INET


def _inet(raw: bytes) -> IPv4Interface | IPv6Interface:
    address, bits, v4 = _inet_parts(raw)
    return IPv4Interface((address, bits)) if v4 else IPv6Interface((address, bits))


def _cidr(raw: bytes) -> IPv4Network | IPv6Network:
    address, bits, v4 = _inet_parts(raw)
    return IPv4Network((address, bits)) if v4 else IPv6Network((address, bits))


def _floats(raw: bytes, count: int, pos: int = 0) -> tuple[float, ...]:
    return struct.unpack_from(f"!{count}d", raw, pos)


def _exact(raw: bytes, size: int) -> bytes:
    if len(raw) != size:
        msg = f"{len(raw)} bytes, not {size}"
        raise ValueError(msg)
    return raw


def _point(raw: bytes) -> Point:
    return Point(*_floats(_exact(raw, 16), 2))


def _line(raw: bytes) -> Line:
    return Line(*_floats(_exact(raw, 24), 3))


def _lseg(raw: bytes) -> LineSegment:
    x1, y1, x2, y2 = _floats(_exact(raw, 32), 4)
    return LineSegment(Point(x1, y1), Point(x2, y2))


def _box(raw: bytes) -> Box:
    x1, y1, x2, y2 = _floats(_exact(raw, 32), 4)
    return Box(Point(x1, y1), Point(x2, y2))


def _point_list(raw: bytes, pos: int) -> tuple[Point, ...]:
    (count,) = _i32_at(raw, pos)
    _done(raw, pos + 4 + 16 * max(count, 0))
    numbers = _floats(raw, 2 * count, pos + 4)
    return tuple(Point(x, y) for x, y in zip(numbers[::2], numbers[1::2], strict=True))


def _path(raw: bytes) -> Path:
    return Path(_point_list(raw, 1), closed=bool(raw[0]))


def _polygon(raw: bytes) -> Polygon:
    return Polygon(_point_list(raw, 0))


def _circle(raw: bytes) -> Circle:
    x, y, radius = _floats(_exact(raw, 24), 3)
    return Circle(Point(x, y), radius)


def _uuid(raw: bytes) -> UUID:
    return UUID(bytes=raw)


def _vector(element: BinaryDecoder, element_oid: int) -> BinaryDecoder:
    """int2vector and oidvector (array_send's format): their text, numbers joined by spaces."""
    array = _array(element, element_oid)

    def decode(raw: bytes) -> str:
        return " ".join(map(str, array(raw)))

    return decode


def _snapshot(raw: bytes) -> str:
    """pg_snapshot / txid_snapshot: ``xmin:xmax:xip,...`` as their text."""
    count, xmin, xmax = _SNAPSHOT_HEAD(raw, 0)
    _done(raw, 20 + 8 * max(count, 0))
    running = struct.unpack_from(f"!{count}q", raw, 20)
    return f"{xmin}:{xmax}:{','.join(map(str, running))}"


# --- arrays, ranges, composites ---------------------------------------------------------------

def _array(element: BinaryDecoder | None, element_oid: int) -> BinaryDecoder:
    """Nested lists, lower bounds dropped; ``element=None`` keeps each element's bytes,
    ``element_oid=0`` accepts any element type."""

    def decode(raw: bytes) -> list[Any]:
        ndim, _flags, oid = _ARRAY_HEAD(raw, 0)
        if element_oid and oid != element_oid:
            msg = f"array of type OID {oid}, the column's element type is OID {element_oid}"
            raise ValueError(msg)
        if ndim == 0:
            _done(raw, 12)
            return []
        if not 0 < ndim <= 6:
            msg = f"array of {ndim} dimensions"
            raise ValueError(msg)
        sizes = [_i32_at(raw, 12 + 8 * i)[0] for i in range(ndim)]
        pos = 12 + 8 * ndim
        items: list[Any] = []
        append = items.append
        for _ in range(prod(sizes)):
            (length,) = _i32_at(raw, pos)
            pos += 4
            if length == -1:
                append(None)
                continue
            value = _cut(raw, pos, length)
            append(value if element is None else element(value))
            pos += length
        _done(raw, pos)
        for size in reversed(sizes[1:]):
            items = [items[i : i + size] for i in range(0, len(items), size)]
        return items

    return decode


_RANGE_EMPTY, _RANGE_LB_INC, _RANGE_UB_INC, _RANGE_LB_INF, _RANGE_UB_INF = 1, 2, 4, 8, 16


def _range_at(raw: bytes, bound: BinaryDecoder) -> Range:
    flags = raw[0]
    if flags & _RANGE_EMPTY:
        _done(raw, 1)
        return EMPTY_RANGE
    pos = 1
    lower = upper = None
    if not flags & _RANGE_LB_INF:
        (length,) = _i32_at(raw, pos)
        lower = bound(_cut(raw, pos + 4, length))
        pos += 4 + length
    if not flags & _RANGE_UB_INF:
        (length,) = _i32_at(raw, pos)
        upper = bound(_cut(raw, pos + 4, length))
        pos += 4 + length
    _done(raw, pos)
    return Range(lower, upper, bool(flags & _RANGE_LB_INC), bool(flags & _RANGE_UB_INC))


def _range(bound: BinaryDecoder) -> BinaryDecoder:
    def decode(raw: bytes) -> Range:
        return _range_at(raw, bound)

    return decode


def _multirange(bound: BinaryDecoder) -> BinaryDecoder:
    def decode(raw: bytes) -> tuple[Range, ...]:
        (count,) = _i32_at(raw, 0)
        pos, ranges = 4, []
        for _ in range(count):
            (length,) = _i32_at(raw, pos)
            ranges.append(_range_at(_cut(raw, pos + 4, length), bound))
            pos += 4 + length
        _done(raw, pos)
        return tuple(ranges)

    return decode


def _composite(fields: tuple[tuple[str, int, BinaryDecoder], ...]) -> BinaryDecoder:
    def decode(raw: bytes) -> dict[str, Any]:
        (count,) = _i32_at(raw, 0)
        if count != len(fields):
            msg = f"{count} fields, the type has {len(fields)}"
            raise ValueError(msg)
        pos, out = 4, dict[str, Any]()
        for name, field_oid, field in fields:
            oid, length = _FIELD_HEAD(raw, pos)
            if oid != field_oid:
                msg = f"field {name} of type OID {oid}, the type says {field_oid}"
                raise ValueError(msg)
            pos += 8
            if length == -1:
                out[name] = None
                continue
            out[name] = field(_cut(raw, pos, length))
            pos += length
        _done(raw, pos)
        return out

    return decode


def _hstore(raw: bytes) -> dict[str, str | None]:
    """hstore_send: the pair count, then per pair the key and the value (-1: NULL)."""
    (count,) = _i32_at(raw, 0)
    pos, out = 4, dict[str, str | None]()
    for _ in range(count):
        (length,) = _i32_at(raw, pos)
        key = _cut(raw, pos + 4, length).decode("utf-8")
        pos += 4 + length
        (length,) = _i32_at(raw, pos)
        pos += 4
        if length == -1:
            out[key] = None
            continue
        out[key] = _cut(raw, pos, length).decode("utf-8")
        pos += length
    _done(raw, pos)
    return out


def _ewkb(raw: bytes) -> dict[str, Any]:
    """PostGIS geometry_send / geography_send: the EWKB whose hex is their text."""
    return parse_ewkb(raw.hex())


EXTENSIONS: Final[dict[str, BinaryDecoder]] = {
    "hstore": _hstore, "geometry": _ewkb, "geography": _ewkb,
}
"""Binary decoders of extension base types, by ``pg_type.typname`` (decoder/extensions.py
has their text decoders)."""

_SCALARS: Final[dict[int, BinaryDecoder]] = {
    v.BOOL: _bool, v.BYTEA: bytes, v.CHAR: _char, v.NAME: _text, v.INT8: _int8,
    v.INT2: _int2, v.INT4: _int4, v.TEXT: _text, v.OID: _uint4, v.XID: _uint4,
    v.CID: _uint4, v.JSON: _text, v.XML: _text, v.POINT: _point, v.LSEG: _lseg,
    v.PATH: _path, v.BOX: _box, v.POLYGON: _polygon, v.LINE: _line, v.CIDR: _cidr,
    v.FLOAT4: _float4, v.FLOAT8: _float8, v.CIRCLE: _circle, v.MACADDR8: _macaddr(8),
    v.MONEY: _money, v.MACADDR: _macaddr(6), v.INET: _inet, v.BPCHAR: _text,
    v.VARCHAR: _text, v.DATE: _date, v.TIME: _time, v.TIMESTAMP: _timestamp,
    v.TIMESTAMPTZ: _timestamptz, v.INTERVAL: _interval, v.TIMETZ: _timetz, v.BIT: _bits,
    v.VARBIT: _bits, v.NUMERIC: _numeric, v.UUID: _uuid, v.PG_LSN: _uint8,
    v.TSVECTOR: _tsvector, v.TSQUERY: _tsquery, v.JSONB: _jsonb, v.XID8: _uint8,
}
_RANGE_SUBTYPES: Final = {
    v.INT4RANGE: v.INT4, v.NUMRANGE: v.NUMERIC, v.TSRANGE: v.TIMESTAMP,
    v.TSTZRANGE: v.TIMESTAMPTZ, v.DATERANGE: v.DATE, v.INT8RANGE: v.INT8,
}
_MULTIRANGE_SUBTYPES: Final = {
    v.INT4MULTIRANGE: v.INT4, v.NUMMULTIRANGE: v.NUMERIC, v.TSMULTIRANGE: v.TIMESTAMP,
    v.TSTZMULTIRANGE: v.TIMESTAMPTZ, v.DATEMULTIRANGE: v.DATE, v.INT8MULTIRANGE: v.INT8,
}
INT2VECTOR, OIDVECTOR, TXID_SNAPSHOT, PG_SNAPSHOT = 22, 30, 2970, 5038
_OTHERS: Final[dict[int, BinaryDecoder]] = {
    INT2VECTOR: _vector(_int2, v.INT2), OIDVECTOR: _vector(_uint4, v.OID),
    TXID_SNAPSHOT: _snapshot,
    PG_SNAPSHOT: _snapshot,
}


def _builtins() -> dict[int, BinaryDecoder]:
    out = dict(_SCALARS)
    for oid, subtype in _RANGE_SUBTYPES.items():
        out[oid] = _range(_SCALARS[subtype])
    for oid, subtype in _MULTIRANGE_SUBTYPES.items():
        out[oid] = _multirange(_SCALARS[subtype])
    out |= _OTHERS
    for element, array in v.ARRAY_OIDS.items():
        out[array] = _array(out[element], element)
    return out


_BUILTINS: Final = _builtins()


# --- the types of one database ----------------------------------------------------------------

_ERRORS = (ValueError, LookupError, struct.error, OverflowError, TypeError)


class BinaryDecoders:
    """Binary decoders for the built-in types and those of a :class:`TypeRegistry`.

    :meth:`decoder_for` gives a column's decoder: it raises
    :class:`BinaryFormatError` naming the type on bytes it cannot read, and for a type
    without a binary decoder on every value.  Built once per OID, rebuilt after the
    registry learns new types.
    """

    __slots__ = ("registry", "_built", "_generation")

    def __init__(self, registry: TypeRegistry | None = None) -> None:
        self.registry = registry if registry is not None else TypeRegistry()
        self._built: dict[int, BinaryDecoder | None] = {}
        self._generation = self.registry.generation

    def supports(self, oid: int) -> bool:
        """Whether values of the type (and of every type it is built from) decode."""
        return self._raw(oid) is not None

    def decoder_for(self, oid: int, name: str | None = None) -> BinaryDecoder:
        """The decoder of a column of type ``oid``, with the type's name in its errors
        (the registry's, else ``name``: the column's type name in the catalog)."""
        decode = self._raw(oid)
        if oid in self.registry or self.registry.shape(oid) is not None or not name:
            name = self.registry.type_name(oid)
        if decode is None:
            def undecodable(raw: bytes) -> Any:
                raise BinaryFormatError(name)

            return undecodable
        if decode is bytes:  # bytea: the bytes as they are
            return bytes

        def checked(raw: bytes) -> Any:
            try:
                return decode(raw)
            except _ERRORS as exc:
                raise BinaryFormatError(name, str(exc) or type(exc).__name__) from None

        return checked

    def _raw(self, oid: int) -> BinaryDecoder | None:
        if self._generation != self.registry.generation:
            self._built.clear()
            self._generation = self.registry.generation
        return self._build(oid, set())

    def _build(self, oid: int, building: set[int]) -> BinaryDecoder | None:
        decode = _BUILTINS.get(oid)
        if decode is not None:
            return decode
        if oid in self._built:
            return self._built[oid]
        shape = self.registry.shape(oid)
        if shape is None or oid in building:
            return None
        building.add(oid)
        try:
            decode = self._from_shape(shape, building)
        finally:
            building.discard(oid)
        self._built[oid] = decode
        return decode

    def _from_shape(self, shape: v.TypeShape, building: set[int]) -> BinaryDecoder | None:
        kind = shape.kind
        if kind == "enum":
            return _text
        if kind == "base":
            typname = (shape.name or "").rsplit(".", 1)[-1]
            return EXTENSIONS.get(typname)
        if kind == "text":
            return None
        if kind == "composite":
            fields = []
            for name, field_oid in shape.fields:
                field = self._build(field_oid, building)
                if field is None:
                    return None
                fields.append((name, field_oid, field))
            return _composite(tuple(fields))
        part = self._build(shape.of, building)
        if part is None:
            return None
        if kind == "domain":
            return part
        if kind == "array":
            return _array(part, shape.of)
        if kind == "range":
            return _range(part)
        if kind == "multirange":
            return _multirange(part)
        return None


def decoder_for(oid: int, name: str | None = None) -> BinaryDecoder:
    """The binary decoder of a built-in type (see :meth:`BinaryDecoders.decoder_for`)."""
    return _DEFAULT.decoder_for(oid, name)


_DEFAULT: Final = BinaryDecoders()
