"""Binary column values of the scalar types: numbers, text-like, network, geometric, uuid.

Each type's send function output (``src/backend/utils/adt/*.c``, ``*_send``) into the
value its text decoder (decoder/text_parsers.py) returns; decoder/binary.py has the format
overview, the containers (arrays, ranges, composites) and the table by OID, which takes
:data:`SCALARS` from here, :mod:`decoder.binary_time` and :mod:`decoder.binary_text_search`.
A decoder raises ``ValueError``, ``struct.error`` (and the like) on bytes that are not its
type's format; :class:`decoder.binary.BinaryDecoders` names the type in the error.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from decimal import Decimal
from ipaddress import IPv4Interface, IPv4Network, IPv6Interface, IPv6Network
from typing import Any, Final
from uuid import UUID

from decoder import values as v
from decoder.values import Box, Circle, Line, LineSegment, Path, Point, Polygon

BinaryDecoder = Callable[[bytes], Any]

_i16 = struct.Struct("!h").unpack
_i32 = struct.Struct("!i").unpack
_i64 = struct.Struct("!q").unpack
_u32 = struct.Struct("!I").unpack
_u64 = struct.Struct("!Q").unpack
_f32 = struct.Struct("!f").unpack
_f64 = struct.Struct("!d").unpack
_pack_f32 = struct.Struct("!f").pack
i32_at: Final = struct.Struct("!i").unpack_from
u16_at: Final = struct.Struct("!H").unpack_from
_NUMERIC_HEAD = struct.Struct("!hhHH").unpack_from


def cut(buf: bytes, pos: int, length: int) -> bytes:
    """The ``length`` bytes at ``pos``, which must lie inside ``buf``."""
    end = pos + length
    if length < 0 or end > len(buf):
        msg = f"a length of {length} at {pos} runs past the {len(buf)} bytes of the value"
        raise ValueError(msg)
    return buf[pos:end]


def done(buf: bytes, pos: int) -> None:
    """The value ends at ``pos``."""
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
        done(raw, 8)
        return _NUMERIC_SPECIAL[sign]
    if sign not in (0, _NUMERIC_NEG) or ndigits < 0:
        msg = f"numeric sign {sign:#x}, {ndigits} digits"
        raise ValueError(msg)
    done(raw, 8 + 2 * ndigits)
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
    (count,) = i32_at(raw, 0)
    if count < 0:
        msg = f"bit length {count}"
        raise ValueError(msg)
    done(raw, 4 + (count + 7) // 8)
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
    (count,) = i32_at(raw, pos)
    done(raw, pos + 4 + 16 * max(count, 0))
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


SCALARS: Final[dict[int, BinaryDecoder]] = {
    v.BOOL: _bool, v.BYTEA: bytes, v.CHAR: _char, v.NAME: _text, v.INT8: _int8,
    v.INT2: _int2, v.INT4: _int4, v.TEXT: _text, v.OID: _uint4, v.XID: _uint4,
    v.CID: _uint4, v.JSON: _text, v.XML: _text, v.POINT: _point, v.LSEG: _lseg,
    v.PATH: _path, v.BOX: _box, v.POLYGON: _polygon, v.LINE: _line, v.CIDR: _cidr,
    v.FLOAT4: _float4, v.FLOAT8: _float8, v.CIRCLE: _circle, v.MACADDR8: _macaddr(8),
    v.MONEY: _money, v.MACADDR: _macaddr(6), v.INET: _inet, v.BPCHAR: _text,
    v.VARCHAR: _text, v.BIT: _bits, v.VARBIT: _bits, v.NUMERIC: _numeric, v.UUID: _uuid,
    v.PG_LSN: _uint8, v.JSONB: _jsonb, v.XID8: _uint8,
}
"""The decoders of this module by type OID."""
