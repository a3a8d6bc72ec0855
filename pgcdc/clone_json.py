"""The clone oracle's JSON columns (pgcdc/clone.py): arrays, composites, ranges,
multiranges and geometric values (through domains) are JSON text in the lake (docs/types.md,
the *JSON* column); the source side is ``to_json`` of the value.  Both are read by the
column's type (:func:`json_shapes`), part by part (an array's elements, a composite's
attributes, a range's bounds), each side in its own documented spelling, into one canonical
JSON text (:func:`canonical_json`): numbers as decimals (``0.00000010`` and ``"1.0E-7"`` are
one value, ``1.5`` and ``1.50`` are not), floats by their value, timestamps in PostgreSQL's
text, bytea as hex, a range as its bounds and flags whether PostgreSQL spelled it ``[1,10)``
or pgcdc ``{"lower": 1, ...}``, a point ``(1,2)`` or ``{"x": 1.0, "y": 2.0}`` as its
coordinates.  A part its side's spelling does not read becomes a marker naming the side and
its text, equal to nothing the other side gives.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql

from streaming.schema import TableSpec


@dataclass(frozen=True, slots=True)
class Shape:
    """How a column's JSON is read: ``kind`` is ``array`` (``parts``: the element),
    ``composite`` (``parts``: the attributes, named by ``names``), ``range`` (``parts``: the
    subtype), ``multirange`` (``parts``: the range) or a scalar's type name (``int4``,
    ``numeric``, ``timestamptz``, ...; ``enum``; ``other`` for a type not of pg_catalog)."""

    kind: str
    parts: tuple[Shape, ...] = ()
    names: tuple[str, ...] = ()


# the kinds whose values the lake holds as JSON text (docs/types.md)
_JSON_KINDS = frozenset({"array", "composite", "range", "multirange", "point", "line", "lseg",
                         "box", "path", "polygon", "circle"})

_TYPE = """
SELECT t.typtype, t.typcategory, t.typelem, t.typbasetype, t.typrelid, t.typname,
       n.nspname = 'pg_catalog',
       (SELECT r.rngsubtype FROM pg_range r WHERE r.rngtypid = t.oid),
       (SELECT r.rngtypid FROM pg_range r WHERE r.rngmultitypid = t.oid)
FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE t.oid = %s
"""
_ATTRIBUTES = """
SELECT attname, atttypid FROM pg_attribute
WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum
"""
_COLUMNS = """
SELECT attname, atttypid FROM pg_attribute
WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped
"""


def _shape(conn: psycopg.Connection[Any], oid: int, known: dict[int, Shape]) -> Shape:
    """The shape of the type ``oid`` (a domain's: its base type's), from the catalog."""
    found = known.get(oid)
    if found is not None:
        return found
    row = conn.execute(_TYPE, (oid,)).fetchone()
    if row is None:
        msg = f"type {oid} is not in pg_type; it was dropped while the table was compared"
        raise LookupError(msg)
    typtype, category, elem, base, relid, name, builtin, subtype, range_type = row
    if typtype == "d":
        shape = _shape(conn, base, known)
    elif category == "A" and elem:
        shape = Shape("array", (_shape(conn, elem, known),))
    elif typtype == "c":
        attributes = conn.execute(_ATTRIBUTES, (relid,)).fetchall()
        shape = Shape("composite", tuple(_shape(conn, a[1], known) for a in attributes),
                      tuple(str(a[0]) for a in attributes))
    elif typtype == "r":
        shape = Shape("range", (_shape(conn, subtype, known),))
    elif typtype == "m":
        shape = Shape("multirange", (_shape(conn, range_type, known),))
    elif typtype == "e":
        shape = Shape("enum")
    else:
        shape = Shape(str(name) if builtin else "other")
    known[oid] = shape
    return shape


def json_shapes(conn: psycopg.Connection[Any], spec: TableSpec) -> dict[str, Shape]:
    """The shapes of the table's columns whose values the lake holds as JSON text: arrays,
    composites, ranges, multiranges and geometric types, through domains."""
    relation = sql.Identifier(spec.schema, spec.name).as_string(conn)
    known: dict[int, Shape] = {}
    out = {}
    for name, oid in conn.execute(_COLUMNS, (relation,)).fetchall():
        shape = _shape(conn, oid, known)
        if shape.kind in _JSON_KINDS:
            out[str(name)] = shape
    return out


class _Unreadable(ValueError):
    """A part of a JSON value that its side's documented spelling does not read."""


class _JsonInt(Decimal):
    """A JSON integer token, exact (``-0`` keeps its sign for a float)."""


class _JsonFloat(Decimal):
    """A JSON number token with a fraction or an exponent, exact."""


def _load(text: str) -> Any:
    """JSON with its numbers as decimals (exact digits) and Python's ``NaN``/``Infinity``
    tokens (pgcdc writes floats so) as floats."""
    return json.loads(text, parse_int=_JsonInt, parse_float=_JsonFloat, parse_constant=float)


_DECIMAL = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|NaN|-?Infinity")
_FLOAT = _DECIMAL  # PostgreSQL spells a float as a numeric: 1e-05, NaN, -Infinity
_INTEGER = re.compile(r"-?\d+")
_MONEY = re.compile(r"(-?)\$([\d,]*\d)(\.\d+)?")  # lc_monetary C: -$1,234.56
_LSN = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")
_DATE = re.compile(r"\d{4,}-\d\d-\d\d(?: BC)?|-?infinity")
_OFFSET = r"(Z|[-+]\d\d(?::?\d\d(?::?\d\d)?)?)"
_TIME = re.compile(r"(\d\d:\d\d:\d\d)(\.\d{1,6})?" + _OFFSET + "?")
_TIMESTAMP = re.compile(r"(\d{4,}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)(\.\d{1,6})?" + _OFFSET
                        + r"?( BC)?")
_HEX = re.compile(r"\\x((?:[0-9a-fA-F]{2})*)")


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise _Unreadable(value)
    return value


def _matched(pattern: re.Pattern[str], value: Any) -> re.Match[str]:
    found = pattern.fullmatch(_text(value))
    if found is None:
        raise _Unreadable(value)
    return found


def _integer(value: Any, lake: bool) -> int:
    """An integer: a JSON number in the lake; ``to_json``'s number, or the text of a range
    bound or of an ``xid``, in the source."""
    if isinstance(value, _JsonInt):
        return int(value)
    if lake:
        raise _Unreadable(value)
    return int(_matched(_INTEGER, value).group())


def _decimal(value: Any, lake: bool) -> str:
    """A numeric as ``str(Decimal)``, digits and scale kept (``0.00000010`` is ``1.0E-7``,
    ``0.00000000`` is ``0E-8``): the lake's JSON string (docs/types.md); the source's JSON
    number, ``"NaN"``/``"Infinity"`` string or range bound text."""
    if isinstance(value, Decimal) and not lake:
        return str(Decimal(value))
    return str(Decimal(_matched(_DECIMAL, value).group()))


def _money(value: Any, lake: bool) -> str:
    """The amount: the lake's decimal string; the source's ``-$1,234.56``."""
    if lake:
        return _decimal(value, lake)
    sign, whole, fraction = _matched(_MONEY, value).groups()
    return str(Decimal(sign + whole.replace(",", "") + (fraction or "")))


def _float(value: Any, single: bool) -> str:
    """A float by its value (``repr``; a float4 as the float4 it is): a JSON number or
    ``NaN``/``Infinity`` token, ``to_json``'s ``"NaN"`` strings, a range bound's text."""
    if isinstance(value, Decimal | float) and not isinstance(value, bool):
        number = float(value)
    else:
        number = float(_matched(_FLOAT, value).group())
    if single and math.isfinite(number):
        number = struct.unpack("<f", struct.pack("<f", number))[0]
    return repr(number)


def _offset(text: str | None) -> str:
    """A UTC offset as PostgreSQL prints it: ``+00``, ``+05:30``, ``-01:30:15``."""
    if text is None:
        return ""
    if text == "Z":
        return "+00"
    digits = text[1:].replace(":", "")
    out = text[0] + digits[:2]
    if digits[2:] not in ("", "00", "0000"):
        out += ":" + digits[2:4] + (":" + digits[4:] if digits[4:] not in ("", "00") else "")
    return out


def _fraction(text: str | None) -> str:
    return (text or "").rstrip("0").rstrip(".")


def _timestamp(value: Any, lake: bool) -> str:
    """A timestamp in PostgreSQL's text (DateStyle ISO, UTC): from ``isoformat``
    (``2024-02-29T13:14:15.500000+00:00``), ``to_json``'s (``...T13:14:15.5+00:00``, BC
    after the offset) or PostgreSQL's own (``... BC``, years past 9999, infinities)."""
    if value in ("infinity", "-infinity"):
        return str(value)
    day, clock, fraction, offset, era = _matched(_TIMESTAMP, value).groups()
    return f"{day} {clock}{_fraction(fraction)}{_offset(offset)}{era or ''}"


def _time(value: Any, lake: bool) -> str:
    """A time (with its offset, for ``timetz``) without trailing zeros in its fraction."""
    clock, fraction, offset = _matched(_TIME, value).groups()
    return f"{clock}{_fraction(fraction)}{_offset(offset)}"


def _date(value: Any, lake: bool) -> str:
    return _matched(_DATE, value).group()


def _bytea(value: Any, lake: bool) -> str:
    """Lowercase hex: the lake's base64, the source's ``\\x`` hex."""
    if not lake:
        return _matched(_HEX, value).group(1).lower()
    try:
        return base64.b64decode(_text(value), validate=True).hex()
    except binascii.Error as e:
        raise _Unreadable(value) from e


def _lsn(value: Any, lake: bool) -> int:
    """A WAL position as its number: the lake's JSON number, the source's ``16/B374D848``."""
    if lake:
        return _integer(value, lake)
    high, low = _matched(_LSN, value).groups()
    return int(high, 16) << 32 | int(low, 16)


def _boolean(value: Any, lake: bool) -> bool:
    if not isinstance(value, bool):
        raise _Unreadable(value)
    return value


def _jsonb(value: Any, lake: bool) -> Any:
    """A jsonb value, numbers exact: the lake's string of the server's text, parsed; the
    source's value as ``to_json`` embeds it."""
    if lake:
        try:
            return _load(_text(value))
        except json.JSONDecodeError as e:
            raise _Unreadable(value) from e
    return value


_COORDINATE = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|NaN|-?Infinity")
# a geometric value's text without its numbers: point, line, lseg, box, open and closed
# path, polygon, circle
_GEOMETRIC = re.compile(r"\(#,#\)|\{#,#,#\}|\[\(#,#\),\(#,#\)\]|\(#,#\),\(#,#\)"
                        r"|\[\(#,#\)(?:,\(#,#\))*\]|\(\(#,#\)(?:,\(#,#\))*\)|<\(#,#\),#>")
_FIELDS = {"point": ("x", "y"), "line": ("a", "b", "c"), "lseg": ("start", "end"),
           "box": ("high", "low"), "path": ("points",), "polygon": ("points",),
           "circle": ("center", "radius")}


def _coordinates(value: Any) -> list[float]:
    """The numbers of the lake's object of a geometric value, in its fields' order."""
    if isinstance(value, dict) and "x" in value:
        return [_geometric_number(value[k]) for k in ("x", "y")]
    if isinstance(value, list):
        return [n for v in value for n in _coordinates(v)]
    if isinstance(value, dict):
        raise _Unreadable(value)
    return [_geometric_number(value)]


def _geometric_number(value: Any) -> float:
    if not isinstance(value, Decimal | float) or isinstance(value, bool):
        raise _Unreadable(value)
    return float(value)


def _geometric(kind: str) -> Callable[[Any, bool], Any]:
    """A geometric value as its coordinates (floats, by value) and, for a path, whether it
    is closed: the lake's object of its fields (``{"x": 1.0, "y": 2.0}``, docs/types.md), the
    source's text (``(1,2)``, ``[(1,2),(3,4)]``, ``<(1,2),3>``)."""
    names = _FIELDS[kind]

    def read(value: Any, lake: bool) -> Any:
        if lake:
            if not isinstance(value, dict) or set(value) != set(names) | (
                    {"closed"} if kind == "path" else set()):
                raise _Unreadable(value)
            closed = value.get("closed")
            if kind == "path" and not isinstance(closed, bool):
                raise _Unreadable(value)
            numbers = [n for k in names for n in _coordinates(value[k])]
        else:
            text = _text(value)
            if _GEOMETRIC.fullmatch(_COORDINATE.sub("#", text)) is None:
                raise _Unreadable(value)
            numbers = [float(n) for n in _COORDINATE.findall(text)]
            closed = text.startswith("(") if kind == "path" else None
        return {"coordinates": [repr(n) for n in numbers], "closed": closed}
    return read


def _string(value: Any, lake: bool) -> Any:
    """Text types, enums, uuid, interval, inet, ...: the same JSON string on both sides."""
    return _text(value)


def _generic(value: Any) -> Any:
    """A value of a type without a documented JSON spelling here (a geometric type, an
    extension's): as JSON reads it, numbers as Python's ``json`` gives them."""
    if isinstance(value, _JsonInt):
        return int(value)
    if isinstance(value, _JsonFloat):
        return float(value)
    if isinstance(value, list):
        return [_generic(v) for v in value]
    if isinstance(value, dict):
        return {k: _generic(v) for k, v in value.items()}
    return value


_SCALARS: dict[str, Callable[[Any, bool], Any]] = {
    **dict.fromkeys(("int2", "int4", "int8", "oid", "xid", "xid8", "cid"), _integer),
    "numeric": _decimal, "money": _money,
    "float4": lambda v, lake: _float(v, True), "float8": lambda v, lake: _float(v, False),
    "bool": _boolean, "date": _date, "time": _time, "timetz": _time,
    "timestamp": _timestamp, "timestamptz": _timestamp, "bytea": _bytea, "pg_lsn": _lsn,
    "jsonb": _jsonb, **{kind: _geometric(kind) for kind in _FIELDS},
    **dict.fromkeys(("text", "varchar", "bpchar", "name", "char", "uuid", "interval", "inet",
                     "cidr", "macaddr", "macaddr8", "bit", "varbit", "enum", "xml",
                     "tsvector", "tsquery"), _string),
}

_RANGE_KEYS = ("lower", "upper", "lower_inc", "upper_inc", "empty")


def _bound(text: str, i: int, stops: str) -> tuple[str | None, int]:
    """A range bound as ``range_out`` writes it, from ``text[i]`` to one of ``stops``:
    ``None`` when unbounded; quoted with ``""`` and backslash escapes."""
    out: list[str] = []
    quoted = False
    bounded = False
    while i < len(text):
        c = text[i]
        if quoted:
            if c == "\\" and i + 1 < len(text):
                out.append(text[i + 1])
                i += 2
                continue
            if c == '"':
                if text[i + 1:i + 2] == '"':
                    out.append('"')
                    i += 2
                    continue
                quoted = False
            else:
                out.append(c)
        elif c in stops:
            return ("".join(out) if bounded else None), i
        elif c == '"':
            quoted = bounded = True
        elif c == "\\" and i + 1 < len(text):
            out.append(text[i + 1])
            bounded = True
            i += 1
        else:
            out.append(c)
            bounded = True
        i += 1
    raise _Unreadable(text)


def _range_text(text: str, i: int) -> tuple[tuple[str | None, str | None, bool, bool, bool], int]:
    """The range PostgreSQL printed at ``text[i]`` (``empty``, ``[1,10)``, ``(,)``,
    ``["2024-01-01 00:00:00+00",)``): (lower, upper, lower_inc, upper_inc, empty) and the
    index after it."""
    if text.startswith("empty", i):
        return (None, None, False, False, True), i + 5
    if i >= len(text) or text[i] not in "[(":
        raise _Unreadable(text)
    lower_inc = text[i] == "["
    lower, i = _bound(text, i + 1, ",")
    upper, i = _bound(text, i + 1, ")]")
    return (lower, upper, lower_inc, text[i] == "]", False), i + 1


def _range(value: Any, subtype: Shape, lake: bool) -> dict[str, Any]:
    """A range as its bounds (read by the subtype) and flags: the lake's object
    (docs/types.md), the source's text."""
    if lake:
        if not isinstance(value, dict) or tuple(sorted(value)) != tuple(sorted(_RANGE_KEYS)) \
                or not all(isinstance(value[k], bool) for k in _RANGE_KEYS[2:]):
            raise _Unreadable(value)
        parts = tuple(value[k] for k in _RANGE_KEYS)
    else:
        parts, end = _range_text(_text(value), 0)
        if end != len(value):
            raise _Unreadable(value)
    return _range_parts(parts, subtype, lake)


def _range_parts(parts: tuple[Any, ...], subtype: Shape, lake: bool) -> dict[str, Any]:
    lower, upper, lower_inc, upper_inc, empty = parts
    return {"lower": None if lower is None else _read(lower, subtype, lake),
            "upper": None if upper is None else _read(upper, subtype, lake),
            "lower_inc": lower_inc, "upper_inc": upper_inc, "empty": empty}


def _multirange_text(text: str) -> list[tuple[str | None, str | None, bool, bool, bool]]:
    """The ranges of a multirange PostgreSQL printed (``{}``, ``{[1,3),[7,9)}``)."""
    if not text.startswith("{"):
        raise _Unreadable(text)
    out: list[tuple[str | None, str | None, bool, bool, bool]] = []
    i = 1
    while text[i:i + 1] != "}":
        if out:
            if text[i:i + 1] != ",":
                raise _Unreadable(text)
            i += 1
        found, i = _range_text(text, i)
        out.append(found)
    if i + 1 != len(text):
        raise _Unreadable(text)
    return out


def _ranges(value: Any, shape: Shape, lake: bool) -> list[dict[str, Any]]:
    """A multirange: the lake's list of range objects, the source's text."""
    if lake:
        if not isinstance(value, list):
            raise _Unreadable(value)
        return [_range(r, shape.parts[0], lake) for r in value]
    subtype = shape.parts[0]
    return [_range_parts(parts, subtype, lake) for parts in _multirange_text(_text(value))]


def _is_multirange(value: Any) -> bool:
    """Whether a list in an array of multiranges is one (in the lake, a list of range
    objects) rather than a nested dimension (a list of those lists or NULLs)."""
    return all(isinstance(v, dict) for v in value)


def _read(value: Any, shape: Shape, lake: bool) -> Any:
    """``value``, parsed from one side's JSON, in the canonical form of its ``shape``."""
    if value is None:
        return None
    kind = shape.kind
    if kind == "array":
        (element,) = shape.parts
        if not isinstance(value, list):
            raise _Unreadable(value)
        return [_read(v, shape, lake) if isinstance(v, list) and not (
                    lake and element.kind == "multirange" and _is_multirange(v))
                else _read(v, element, lake) for v in value]
    if kind == "composite":
        if not isinstance(value, dict):
            raise _Unreadable(value)
        parts = dict(zip(shape.names, shape.parts, strict=True))
        return {k: _read(v, parts[k], lake) if k in parts else _generic(v)
                for k, v in value.items()}
    if kind == "range":
        return _range(value, shape.parts[0], lake)
    if kind == "multirange":
        return _ranges(value, shape.parts[0], lake)
    scalar = _SCALARS.get(kind)
    return _generic(value) if scalar is None else scalar(value, lake)


def _dump(value: Any) -> str:
    """A canonical value as JSON text: keys sorted, no spaces, decimals exact."""
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + _dump(value[k])
                              for k in sorted(value)) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_dump(v) for v in value) + "]"
    if isinstance(value, Decimal):
        return str(Decimal(value))
    return json.dumps(value, ensure_ascii=False)


def canonical_json(text: str, shape: Shape, *, lake: bool) -> str:
    """One side's JSON text of a value of ``shape`` in the canonical spelling both sides
    share: the lake's (``lake``, docs/types.md's *JSON* column) or ``to_json``'s of the
    source.  Equal values give equal texts; a part its side's spelling does not read gives
    a marker naming the side, equal to nothing the other side gives."""
    try:
        return _dump(_read(_load(text), shape, lake))
    except (ValueError, ArithmeticError, struct.error, IndexError) as e:
        side = "lake" if lake else "source"
        return f"\0unreadable in the {side}: {text} ({type(e).__name__}: {e})"


def canonical_timetz(text: str) -> str:
    """A time with its offset in one spelling: PostgreSQL prints ``13:14:15.5+02``, the
    lake holds Python's ``13:14:15.500000+02:00``; any other text stays as it is."""
    try:
        return _time(text, True)
    except _Unreadable:
        return text
