"""The text format of PostgreSQL's values: a parser per built-in type, chosen by type OID.

pgoutput sends a value as the text its type's output function prints, with the
session settings :mod:`decoder.values` lists; the parsers here turn it into the values
described there.  Text a parser cannot read stays the server's text (:func:`or_text`).
Arrays, records (composites), ranges and multiranges are parsed by structure, their
elements, fields and bounds by the parser of their type; :func:`array_decoder`,
:func:`composite_decoder`, :func:`range_decoder` and :func:`multirange_decoder` build
those parsers, for the built-in types here and for a database's own types in
:class:`~decoder.type_registry.TypeRegistry`.  :func:`decoder_for` and :func:`type_name`
answer for the built-in types.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import date, datetime, time
from decimal import Decimal
from functools import cache
from ipaddress import IPv4Interface, IPv4Network, IPv6Interface, IPv6Network
from typing import Any, Final
from uuid import UUID as _UUID

from decoder import values as v
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
)

TextDecoder = Callable[[str], Any]


# --- scalar decoders ---------------------------------------------------------------------

def or_text(parse: TextDecoder) -> TextDecoder:
    """Text the parser cannot read (infinity, BC, year > 9999, not its literal form) stays text."""

    def decode(text: str) -> Any:
        try:
            return parse(text)
        except (ValueError, IndexError):
            return text

    return decode


def _bool(text: str) -> bool:
    return text == "t"


def _bytea(text: str) -> bytes:
    if text.startswith("\\x"):
        return bytes.fromhex(text[2:])
    return _bytea_escape(text)


def _bytea_escape(text: str) -> bytes:
    out = bytearray()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            if text[i + 1] == "\\":
                out.append(0x5C)
                i += 2
            else:
                out.append(int(text[i + 1 : i + 4], 8))
                i += 4
        else:
            out += ch.encode()
            i += 1
    return bytes(out)


_MONEY: Final = re.compile(r"(-?)\$([0-9,]+(?:\.[0-9]+)?)")


def _money(text: str) -> Decimal | str:
    """``lc_monetary=C`` prints ``$1,234.56`` and ``-$1.00``; another locale's text stays text."""
    match = _MONEY.fullmatch(text)
    if match is None:
        return text
    sign, digits = match.groups()
    return Decimal(sign + digits.replace(",", ""))


_ISO_INTERVAL: Final = re.compile(
    r"P(?:(-?[0-9]+)Y)?(?:(-?[0-9]+)M)?(?:(-?[0-9]+)D)?"
    r"(?:T(?:(-?[0-9]+)H)?(?:(-?[0-9]+)M)?(?:(-?)([0-9]+)(?:\.([0-9]{1,6}))?S)?)?"
)


def _interval(text: str) -> Interval | str:
    """``P1Y2M3DT4H5M6.5S``; each part has its own sign, seconds carry it before the digits."""
    match = _ISO_INTERVAL.fullmatch(text)
    if match is None:
        return text  # another IntervalStyle
    years, months, days, hours, minutes, minus, seconds, fraction = match.groups()
    micros = 0
    if seconds is not None:
        micros = int(seconds) * 1_000_000 + (int(fraction.ljust(6, "0")) if fraction else 0)
        if minus:
            micros = -micros
    micros += (int(hours or 0) * 60 + int(minutes or 0)) * 60_000_000
    return Interval(int(years or 0) * 12 + int(months or 0), int(days or 0), micros)


def _inet(text: str) -> IPv4Interface | IPv6Interface:
    return IPv6Interface(text) if ":" in text else IPv4Interface(text)


def _cidr(text: str) -> IPv4Network | IPv6Network:
    return IPv6Network(text) if ":" in text else IPv4Network(text)


def _pg_lsn(text: str) -> int:
    high, _, low = text.partition("/")
    return int(high, 16) << 32 | int(low, 16)


_NUMBER: Final = re.compile(r"[^\s()\[\]<>{},]+")


def _points(text: str) -> tuple[Point, ...]:
    numbers = [float(n) for n in _NUMBER.findall(text)]
    if len(numbers) % 2:
        msg = f"odd number of coordinates in {text!r}"
        raise ValueError(msg)
    return tuple(Point(x, y) for x, y in zip(numbers[::2], numbers[1::2], strict=True))


def _point(text: str) -> Point:
    x, y = text[1:-1].split(",")
    return Point(float(x), float(y))


def _line(text: str) -> Line:
    a, b, c = text[1:-1].split(",")
    return Line(float(a), float(b), float(c))


def _lseg(text: str) -> LineSegment:
    start, end = _points(text)
    return LineSegment(start, end)


def _box(text: str) -> Box:
    high, low = _points(text)
    return Box(high, low)


def _path(text: str) -> Path:
    return Path(_points(text), closed=text.startswith("("))


def _polygon(text: str) -> Polygon:
    return Polygon(_points(text))


def _circle(text: str) -> Circle:
    x, y, radius = (float(n) for n in _NUMBER.findall(text))
    return Circle(Point(x, y), radius)


# --- arrays, composites, ranges --------------------------------------------------------------

_BACKSLASHED: Final = re.compile(r"\\(.)", re.DOTALL)
_QUOTE_ESCAPES: Final = re.compile(r'\\(.)|""', re.DOTALL)
_NESTED_OR_QUOTED: Final = re.compile(r'["{}\\]')


@cache
def _array_tokens(delimiter: str) -> re.Pattern[str]:
    """Quoted element | brace | delimiter | bare element (1 | 2 | 3 | 4)."""
    d = re.escape(delimiter)
    return re.compile(rf'"((?:[^"\\]|\\.)*)"|([{{}}])|({d})|((?:[^"{{}}{d}\\]|\\.)+)', re.DOTALL)


def parse_array(text: str, element: TextDecoder = str, delimiter: str = ",") -> list[Any]:
    """An array literal as nested lists: ``{{1,NULL},{3,4}}`` -> ``[[1, None], [3, 4]]``.

    Elements are quoted when they hold the delimiter, braces, quotes,
    backslashes or blanks, are empty or spell NULL; inside quotes a backslash
    escapes the next character.  Only a bare ``NULL`` is NULL.  Raises
    ``ValueError`` on text that is not an array literal.
    """
    if text.startswith("["):  # explicit lower bounds, "[0:1]={1,2}"
        text = text[text.index("=") + 1 :]
    if not (text.startswith("{") and text.endswith("}")):
        msg = f"not an array literal: {text[:40]!r}"
        raise ValueError(msg)
    body = text[1:-1]
    if not body:
        return []
    if _NESTED_OR_QUOTED.search(body) is None:  # one dimension, no quoting: split
        items = body.split(delimiter)
        if "NULL" not in body:
            return list(map(element, items))
        return [None if item == "NULL" else element(item) for item in items]
    root: list[Any] = []
    stack = [root]
    pos = 1
    for match in _array_tokens(delimiter).finditer(text, 1, len(text) - 1):
        if match.start() != pos:
            msg = f"unexpected character at {pos} in array literal {text[:40]!r}"
            raise ValueError(msg)
        pos = match.end()
        kind = match.lastindex
        if kind == 1:
            quoted = match.group(1)
            if "\\" in quoted:
                quoted = _BACKSLASHED.sub(r"\1", quoted)
            stack[-1].append(element(quoted))
        elif kind == 2:
            if match.group(2) == "{":
                nested: list[Any] = []
                stack[-1].append(nested)
                stack.append(nested)
            elif len(stack) > 1:
                stack.pop()
            else:
                msg = f"unbalanced braces in array literal {text[:40]!r}"
                raise ValueError(msg)
        elif kind == 4:
            bare = match.group(4)
            if bare == "NULL":
                stack[-1].append(None)
                continue
            if "\\" in bare:
                bare = _BACKSLASHED.sub(r"\1", bare)
            stack[-1].append(element(bare))
    if pos != len(text) - 1 or len(stack) != 1:
        msg = f"unbalanced array literal {text[:40]!r}"
        raise ValueError(msg)
    return root


_FLAT_ARRAY: Final = re.compile(r'\{([^"{}\\]*)\}')


def array_decoder(element: TextDecoder, delimiter: str = ",") -> TextDecoder:
    """``parse_array`` with :func:`or_text`'s fallback, and the common case (one
    dimension, nothing quoted) in one regular expression: arrays are in every row of
    some tables, so this is on the decoder's hot path."""
    flat = _FLAT_ARRAY.fullmatch

    def decode(text: str) -> Any:
        try:
            match = flat(text)
            if match is None:
                return parse_array(text, element, delimiter)
            body = match.group(1)
            if not body:
                return []
            items = body.split(delimiter)
            if "NULL" not in body:
                return list(map(element, items))
            return [None if item == "NULL" else element(item) for item in items]
        except (ValueError, IndexError):
            return text

    return decode


def _unquote(quoted: str) -> str:
    """Inside quotes of a record or range, ``\\x`` is ``x`` and ``""`` is ``"``."""
    if "\\" not in quoted and '""' not in quoted:
        return quoted
    return _QUOTE_ESCAPES.sub(lambda m: m.group(1) or '"', quoted)


_RECORD_FIELD: Final = re.compile(r'"((?:[^"\\]|\\.|"")*)"|([^,()"\\]*)', re.DOTALL)
_RANGE_BOUND: Final = re.compile(r'"((?:[^"\\]|\\.|"")*)"|([^,()\[\]"\\]*)', re.DOTALL)


def parse_record(text: str) -> list[str | None]:
    """The fields of a composite's text ``(1,"a b",,"")``: an empty field is NULL, ``""`` is ''."""
    if not (text.startswith("(") and text.endswith(")")):
        msg = f"not a record literal: {text[:40]!r}"
        raise ValueError(msg)
    fields: list[str | None] = []
    pos, end = 1, len(text) - 1
    while True:
        match = _RECORD_FIELD.match(text, pos)
        assert match is not None  # the second alternative matches the empty string
        quoted, bare = match.groups()
        fields.append(_unquote(quoted) if quoted is not None else bare or None)
        pos = match.end()
        if pos == end:
            return fields
        if text[pos] != ",":
            msg = f"unexpected character at {pos} in record literal {text[:40]!r}"
            raise ValueError(msg)
        pos += 1


def composite_decoder(fields: tuple[tuple[str, TextDecoder], ...]) -> TextDecoder:
    def parse(text: str) -> dict[str, Any]:
        raw = parse_record(text)
        if not fields and raw == [None]:  # "()" of a type without attributes
            return {}
        if len(raw) != len(fields):
            msg = f"{len(raw)} fields in {text[:40]!r}, the type has {len(fields)}"
            raise ValueError(msg)
        return {name: None if value is None else decode(value)
                for (name, decode), value in zip(fields, raw, strict=True)}

    return or_text(parse)


def _range_bound(text: str, pos: int, bound: TextDecoder) -> tuple[Any, int]:
    match = _RANGE_BOUND.match(text, pos)
    assert match is not None  # the second alternative matches the empty string
    quoted, bare = match.groups()
    if quoted is not None:
        return bound(_unquote(quoted)), match.end()
    return (bound(bare) if bare else None), match.end()


def _parse_range_at(text: str, pos: int, bound: TextDecoder) -> tuple[Range, int]:
    if text.startswith("empty", pos):
        return EMPTY_RANGE, pos + 5
    opening = text[pos]
    if opening not in "[(":
        msg = f"unexpected {opening!r} at {pos} in range literal {text[:40]!r}"
        raise ValueError(msg)
    lower, pos = _range_bound(text, pos + 1, bound)
    if text[pos] != ",":
        msg = f"missing ',' at {pos} in range literal {text[:40]!r}"
        raise ValueError(msg)
    upper, pos = _range_bound(text, pos + 1, bound)
    closing = text[pos]
    if closing not in "])":
        msg = f"unexpected {closing!r} at {pos} in range literal {text[:40]!r}"
        raise ValueError(msg)
    return Range(lower, upper, opening == "[", closing == "]"), pos + 1


def parse_range(text: str, bound: TextDecoder = str) -> Range:
    """``[1,10)``, ``(,5]``, ``empty``, ``["2024-01-01 00:00:00",)``; no bound is unbounded."""
    value, pos = _parse_range_at(text, 0, bound)
    if pos != len(text):
        msg = f"trailing text in range literal {text[:40]!r}"
        raise ValueError(msg)
    return value


def parse_multirange(text: str, bound: TextDecoder = str) -> tuple[Range, ...]:
    """``{[1,3),[5,7)}`` -> two ranges; ``{}`` -> none."""
    if text == "{}":
        return ()
    if not text.startswith("{"):
        msg = f"not a multirange literal: {text[:40]!r}"
        raise ValueError(msg)
    ranges: list[Range] = []
    pos = 1
    while True:
        value, pos = _parse_range_at(text, pos, bound)
        ranges.append(value)
        if text[pos] == "}" and pos == len(text) - 1:
            return tuple(ranges)
        if text[pos] != ",":
            msg = f"unexpected {text[pos]!r} at {pos} in multirange literal {text[:40]!r}"
            raise ValueError(msg)
        pos += 1


def range_decoder(bound: TextDecoder) -> TextDecoder:
    def parse(text: str) -> Range:
        return parse_range(text, bound)

    return or_text(parse)


def multirange_decoder(bound: TextDecoder) -> TextDecoder:
    def parse(text: str) -> tuple[Range, ...]:
        return parse_multirange(text, bound)

    return or_text(parse)


# --- the built-in types ----------------------------------------------------------------------

_date = or_text(date.fromisoformat)
_timestamp = or_text(datetime.fromisoformat)
_time = or_text(time.fromisoformat)

# name, OID, OID of its array type, decoder
_BUILTINS: Final[tuple[tuple[str, int, int, TextDecoder], ...]] = (
    ("bool", v.BOOL, 1000, _bool),
    ("bytea", v.BYTEA, 1001, _bytea),
    ("char", v.CHAR, 1002, str),
    ("name", v.NAME, 1003, str),
    ("int8", v.INT8, 1016, int),
    ("int2", v.INT2, 1005, int),
    ("int4", v.INT4, 1007, int),
    ("text", v.TEXT, 1009, str),
    ("oid", v.OID, 1028, int),
    ("xid", v.XID, 1011, int),
    ("cid", v.CID, 1012, int),
    ("json", v.JSON, 199, str),
    ("xml", v.XML, 143, str),
    ("point", v.POINT, 1017, or_text(_point)),
    ("lseg", v.LSEG, 1018, or_text(_lseg)),
    ("path", v.PATH, 1019, or_text(_path)),
    ("box", v.BOX, 1020, or_text(_box)),
    ("polygon", v.POLYGON, 1027, or_text(_polygon)),
    ("line", v.LINE, 629, or_text(_line)),
    ("cidr", v.CIDR, 651, _cidr),
    ("float4", v.FLOAT4, 1021, float),
    ("float8", v.FLOAT8, 1022, float),
    ("circle", v.CIRCLE, 719, or_text(_circle)),
    ("macaddr8", v.MACADDR8, 775, str),
    ("money", v.MONEY, 791, _money),
    ("macaddr", v.MACADDR, 1040, str),
    ("inet", v.INET, 1041, _inet),
    ("bpchar", v.BPCHAR, 1014, str),
    ("varchar", v.VARCHAR, 1015, str),
    ("date", v.DATE, 1182, _date),
    ("time", v.TIME, 1183, _time),
    ("timestamp", v.TIMESTAMP, 1115, _timestamp),
    ("timestamptz", v.TIMESTAMPTZ, 1185, _timestamp),
    ("interval", v.INTERVAL, 1187, _interval),
    ("timetz", v.TIMETZ, 1270, _time),
    ("bit", v.BIT, 1561, str),
    ("varbit", v.VARBIT, 1563, str),
    ("numeric", v.NUMERIC, 1231, Decimal),
    ("uuid", v.UUID, 2951, _UUID),
    ("pg_lsn", v.PG_LSN, 3221, _pg_lsn),
    ("tsvector", v.TSVECTOR, 3643, str),
    ("tsquery", v.TSQUERY, 3645, str),
    ("jsonb", v.JSONB, 3807, str),
    ("int4range", v.INT4RANGE, 3905, range_decoder(int)),
    ("numrange", v.NUMRANGE, 3907, range_decoder(Decimal)),
    ("tsrange", v.TSRANGE, 3909, range_decoder(_timestamp)),
    ("tstzrange", v.TSTZRANGE, 3911, range_decoder(_timestamp)),
    ("daterange", v.DATERANGE, 3913, range_decoder(_date)),
    ("int8range", v.INT8RANGE, 3927, range_decoder(int)),
    ("int4multirange", v.INT4MULTIRANGE, 6150, multirange_decoder(int)),
    ("nummultirange", v.NUMMULTIRANGE, 6151, multirange_decoder(Decimal)),
    ("tsmultirange", v.TSMULTIRANGE, 6152, multirange_decoder(_timestamp)),
    ("tstzmultirange", v.TSTZMULTIRANGE, 6153, multirange_decoder(_timestamp)),
    ("datemultirange", v.DATEMULTIRANGE, 6155, multirange_decoder(_date)),
    ("int8multirange", v.INT8MULTIRANGE, 6157, multirange_decoder(int)),
    ("xid8", v.XID8, 271, int),
)

ARRAY_OIDS: Final[Mapping[int, int]] = {oid: array for _, oid, array, _ in _BUILTINS}
"""Built-in element type v.OID -> the v.OID of its array type."""

BUILTIN_TYPE_NAMES: Final[Mapping[int, str]] = {
    **{oid: name for name, oid, _, _ in _BUILTINS},
    **{array: f"_{name}" for name, _, array, _ in _BUILTINS},
}

BUILTIN_DECODERS: Final[Mapping[int, TextDecoder]] = {
    **{oid: decode for _, oid, _, decode in _BUILTINS},
    **{array: array_decoder(decode, ";" if oid == v.BOX else ",")
       for _, oid, array, decode in _BUILTINS},
}


def decoder_for(type_oid: int) -> TextDecoder:
    """The text decoder of a built-in type; ``str`` for other types (the text is kept)."""
    return BUILTIN_DECODERS.get(type_oid, str)


def type_name(type_oid: int) -> str:
    return BUILTIN_TYPE_NAMES.get(type_oid, f"oid:{type_oid}")
