"""Column values: pgoutput text into Python values, chosen by type OID.

The replication connection runs with ``DateStyle=ISO``, ``TimeZone=UTC``,
``IntervalStyle=iso_8601`` and ``extra_float_digits=3`` so that the text the
server sends is unambiguous and round-trips exactly.

========================================  ==========================================
PostgreSQL                                Python
========================================  ==========================================
bool                                      ``bool``
int2, int4, int8, oid, xid, xid8, cid     ``int``
float4, float8                            ``float`` (``nan``, ``inf``, ``-inf``)
numeric                                   ``Decimal`` (``NaN``, ``Infinity``; exact)
money                                     ``Decimal`` (``lc_monetary=C``: ``-$1,234.56``)
text, varchar, bpchar, name, "char"       ``str`` (bpchar keeps its padding; a "char"
                                          byte over 127 keeps its ``\\ooo`` escape)
json, jsonb, xml, tsvector, tsquery       ``str``: the server's text, unparsed
bit, varbit                               ``str`` of ``0`` and ``1``
macaddr, macaddr8                         ``str``, as the server normalises it
bytea                                     ``bytes``
uuid                                      ``uuid.UUID``
date, time, timetz                        ``date``, ``time``, aware ``time``
timestamp, timestamptz                    naive ``datetime``, aware ``datetime``
interval                                  :class:`Interval` (months, days, microseconds)
inet, cidr                                ``IPv4Interface``/``IPv6Interface``,
                                          ``IPv4Network``/``IPv6Network``
point, line, lseg, box, path,             :class:`Point`, :class:`Line`,
polygon, circle                           :class:`LineSegment`, :class:`Box`,
                                          :class:`Path`, :class:`Polygon`, :class:`Circle`
pg_lsn                                    ``int``
ranges                                    :class:`Range`, bounds decoded by the subtype
multiranges                               ``tuple`` of :class:`Range`
arrays                                    nested ``list``, ``None`` for NULL elements
enums / domains / composites              label ``str`` / the base type's value / ``dict``
========================================  ==========================================

What stays the server's text, never a guess and never a crash:

* values a Python type cannot hold: ``infinity`` and ``-infinity`` dates and
  timestamps, BC dates, years past 9999, the time ``24:00:00``;
* text in a format other than the one the session settings above produce (an
  interval in another ``IntervalStyle``, money under another ``lc_monetary``);
* every value of a type without a decoder (an extension type, say): it keeps
  its text, and :func:`type_name` (or :meth:`TypeRegistry.type_name`) names it.

Arrays drop their lower bounds (``[0:1]={1,2}`` is ``[1, 2]``), as psycopg does.

Built-in types have fixed OIDs and :func:`decoder_for` knows them.  Enums,
domains, composites and arrays or ranges of custom types have OIDs of their
database; a :class:`TypeRegistry` filled from that database's catalog
(:func:`decoder.types.load_types`) decodes them too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from functools import cache
from ipaddress import IPv4Interface, IPv4Network, IPv6Interface, IPv6Network
from typing import Any, Final, TypeVar
from uuid import UUID as _UUID

from decoder.generation import GenerationCache

TextDecoder = Callable[[str], Any]

# OIDs below this are assigned at initdb (built-in); user types start here.
FIRST_NORMAL_OID: Final = 16384

# Built-in type OIDs (pg_type.dat); stable across PostgreSQL versions.
BOOL: Final = 16
BYTEA: Final = 17
CHAR: Final = 18
NAME: Final = 19
INT8: Final = 20
INT2: Final = 21
INT4: Final = 23
TEXT: Final = 25
OID: Final = 26
XID: Final = 28
CID: Final = 29
JSON: Final = 114
XML: Final = 142
POINT: Final = 600
LSEG: Final = 601
PATH: Final = 602
BOX: Final = 603
POLYGON: Final = 604
LINE: Final = 628
CIDR: Final = 650
FLOAT4: Final = 700
FLOAT8: Final = 701
CIRCLE: Final = 718
MACADDR8: Final = 774
MONEY: Final = 790
MACADDR: Final = 829
INET: Final = 869
BPCHAR: Final = 1042
VARCHAR: Final = 1043
DATE: Final = 1082
TIME: Final = 1083
TIMESTAMP: Final = 1114
TIMESTAMPTZ: Final = 1184
INTERVAL: Final = 1186
TIMETZ: Final = 1266
BIT: Final = 1560
VARBIT: Final = 1562
NUMERIC: Final = 1700
UUID: Final = 2950
PG_LSN: Final = 3220
TSVECTOR: Final = 3614
TSQUERY: Final = 3615
JSONB: Final = 3802
INT4RANGE: Final = 3904
NUMRANGE: Final = 3906
TSRANGE: Final = 3908
TSTZRANGE: Final = 3910
DATERANGE: Final = 3912
INT8RANGE: Final = 3926
INT4MULTIRANGE: Final = 4451
NUMMULTIRANGE: Final = 4532
TSMULTIRANGE: Final = 4533
TSTZMULTIRANGE: Final = 4534
DATEMULTIRANGE: Final = 4535
INT8MULTIRANGE: Final = 4536
XID8: Final = 5069


# --- value types ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Interval:
    """An interval as PostgreSQL stores it: three fields that never convert into each other.

    A month is not a fixed number of days and a day is not always 24 hours
    (across a DST change), so no ``timedelta`` holds every interval;
    :meth:`to_timedelta` converts those without months.
    """

    months: int
    days: int
    microseconds: int

    def to_timedelta(self) -> timedelta:
        """The interval as a ``timedelta``, days counted as 24 hours; ``ValueError`` with months."""
        if self.months:
            msg = f"interval {self.isoformat()} has months, which have no fixed length"
            raise ValueError(msg)
        return timedelta(days=self.days, microseconds=self.microseconds)

    def isoformat(self) -> str:
        """ISO 8601, exactly as PostgreSQL prints it with ``IntervalStyle=iso_8601``."""
        years, months = _divmod_toward_zero(self.months, 12)
        hours, rest = _divmod_toward_zero(self.microseconds, 3_600_000_000)
        minutes, rest = _divmod_toward_zero(rest, 60_000_000)
        seconds, fraction = _divmod_toward_zero(rest, 1_000_000)
        if not (years or months or self.days or hours or minutes or seconds or fraction):
            return "PT0S"
        out = ["P"]
        out += [f"{n}{unit}" for n, unit in ((years, "Y"), (months, "M"), (self.days, "D")) if n]
        if hours or minutes or seconds or fraction:
            out.append("T")
            out += [f"{n}{unit}" for n, unit in ((hours, "H"), (minutes, "M")) if n]
            if seconds or fraction:
                sign = "-" if seconds < 0 or fraction < 0 else ""
                digits = f".{abs(fraction):06d}".rstrip("0") if fraction else ""
                out.append(f"{sign}{abs(seconds)}{digits}S")
        return "".join(out)


def _divmod_toward_zero(value: int, unit: int) -> tuple[int, int]:
    """C integer division, as PostgreSQL splits intervals: the remainder keeps the sign."""
    quotient = abs(value) // unit
    if value < 0:
        quotient = -quotient
    return quotient, value - quotient * unit


@dataclass(frozen=True, slots=True)
class Range:
    """A range value.  A bound of ``None`` is unbounded; ``empty`` ranges have neither bound."""

    lower: Any
    upper: Any
    lower_inc: bool
    upper_inc: bool
    empty: bool = False


EMPTY_RANGE: Final = Range(None, None, False, False, True)


@dataclass(frozen=True, slots=True)
class Point:
    x: float
    y: float


@dataclass(frozen=True, slots=True)
class Line:
    """The infinite line ``a*x + b*y + c = 0``."""

    a: float
    b: float
    c: float


@dataclass(frozen=True, slots=True)
class LineSegment:
    start: Point
    end: Point


@dataclass(frozen=True, slots=True)
class Box:
    """Two opposite corners, as PostgreSQL keeps them: upper right, then lower left."""

    high: Point
    low: Point


@dataclass(frozen=True, slots=True)
class Path:
    points: tuple[Point, ...]
    closed: bool


@dataclass(frozen=True, slots=True)
class Polygon:
    points: tuple[Point, ...]


@dataclass(frozen=True, slots=True)
class Circle:
    center: Point
    radius: float


# --- scalar decoders ---------------------------------------------------------------------

def _or_text(parse: TextDecoder) -> TextDecoder:
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


def inet_text(value: IPv4Interface | IPv6Interface | IPv4Network | IPv6Network) -> str:
    """PostgreSQL's text of an ``inet`` or ``cidr`` value (``inet_out``, ``cidr_out``).

    ``/bits`` always for a cidr, for an inet only when it is not the whole address (so
    ``192.168.1.5``, ``192.168.1.5/24``).  An IPv6 address prints as ``inet_net_ntop``
    prints it: Python's form (the longest run of two or more zero groups, the first of
    equal ones, as ``::``), except that an IPv4-mapped address and an IPv4-compatible one whose
    seventh group is not zero end in dotted IPv4 (``::ffff:1.2.3.4``, ``::1.2.3.4``).
    """
    if isinstance(value, IPv4Network | IPv6Network):
        address, bits, always = value.network_address, value.prefixlen, True
    else:
        address, bits, always = value.ip, value.network.prefixlen, False
    text = str(address)
    if address.version == 6:
        raw = address.packed
        words = [raw[i] << 8 | raw[i + 1] for i in range(0, 16, 2)]
        if not any(words[:5]) and (words[5] == 0xFFFF or words[5] == 0 and words[6]):
            text = ("::ffff:" if words[5] else "::") + ".".join(str(b) for b in raw[12:])
    return text if not always and bits == address.max_prefixlen else f"{text}/{bits}"


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


def _array(element: TextDecoder, delimiter: str = ",") -> TextDecoder:
    """``parse_array`` with :func:`_or_text`'s fallback, and the common case (one
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


def _composite(fields: tuple[tuple[str, TextDecoder], ...]) -> TextDecoder:
    def parse(text: str) -> dict[str, Any]:
        raw = parse_record(text)
        if not fields and raw == [None]:  # "()" of a type without attributes
            return {}
        if len(raw) != len(fields):
            msg = f"{len(raw)} fields in {text[:40]!r}, the type has {len(fields)}"
            raise ValueError(msg)
        return {name: None if value is None else decode(value)
                for (name, decode), value in zip(fields, raw, strict=True)}

    return _or_text(parse)


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


def _range(bound: TextDecoder) -> TextDecoder:
    def parse(text: str) -> Range:
        return parse_range(text, bound)

    return _or_text(parse)


def _multirange(bound: TextDecoder) -> TextDecoder:
    def parse(text: str) -> tuple[Range, ...]:
        return parse_multirange(text, bound)

    return _or_text(parse)


# --- the built-in types ----------------------------------------------------------------------

_date = _or_text(date.fromisoformat)
_timestamp = _or_text(datetime.fromisoformat)
_time = _or_text(time.fromisoformat)

# name, OID, OID of its array type, decoder
_BUILTINS: Final[tuple[tuple[str, int, int, TextDecoder], ...]] = (
    ("bool", BOOL, 1000, _bool),
    ("bytea", BYTEA, 1001, _bytea),
    ("char", CHAR, 1002, str),
    ("name", NAME, 1003, str),
    ("int8", INT8, 1016, int),
    ("int2", INT2, 1005, int),
    ("int4", INT4, 1007, int),
    ("text", TEXT, 1009, str),
    ("oid", OID, 1028, int),
    ("xid", XID, 1011, int),
    ("cid", CID, 1012, int),
    ("json", JSON, 199, str),
    ("xml", XML, 143, str),
    ("point", POINT, 1017, _or_text(_point)),
    ("lseg", LSEG, 1018, _or_text(_lseg)),
    ("path", PATH, 1019, _or_text(_path)),
    ("box", BOX, 1020, _or_text(_box)),
    ("polygon", POLYGON, 1027, _or_text(_polygon)),
    ("line", LINE, 629, _or_text(_line)),
    ("cidr", CIDR, 651, _cidr),
    ("float4", FLOAT4, 1021, float),
    ("float8", FLOAT8, 1022, float),
    ("circle", CIRCLE, 719, _or_text(_circle)),
    ("macaddr8", MACADDR8, 775, str),
    ("money", MONEY, 791, _money),
    ("macaddr", MACADDR, 1040, str),
    ("inet", INET, 1041, _inet),
    ("bpchar", BPCHAR, 1014, str),
    ("varchar", VARCHAR, 1015, str),
    ("date", DATE, 1182, _date),
    ("time", TIME, 1183, _time),
    ("timestamp", TIMESTAMP, 1115, _timestamp),
    ("timestamptz", TIMESTAMPTZ, 1185, _timestamp),
    ("interval", INTERVAL, 1187, _interval),
    ("timetz", TIMETZ, 1270, _time),
    ("bit", BIT, 1561, str),
    ("varbit", VARBIT, 1563, str),
    ("numeric", NUMERIC, 1231, Decimal),
    ("uuid", UUID, 2951, _UUID),
    ("pg_lsn", PG_LSN, 3221, _pg_lsn),
    ("tsvector", TSVECTOR, 3643, str),
    ("tsquery", TSQUERY, 3645, str),
    ("jsonb", JSONB, 3807, str),
    ("int4range", INT4RANGE, 3905, _range(int)),
    ("numrange", NUMRANGE, 3907, _range(Decimal)),
    ("tsrange", TSRANGE, 3909, _range(_timestamp)),
    ("tstzrange", TSTZRANGE, 3911, _range(_timestamp)),
    ("daterange", DATERANGE, 3913, _range(_date)),
    ("int8range", INT8RANGE, 3927, _range(int)),
    ("int4multirange", INT4MULTIRANGE, 6150, _multirange(int)),
    ("nummultirange", NUMMULTIRANGE, 6151, _multirange(Decimal)),
    ("tsmultirange", TSMULTIRANGE, 6152, _multirange(_timestamp)),
    ("tstzmultirange", TSTZMULTIRANGE, 6153, _multirange(_timestamp)),
    ("datemultirange", DATEMULTIRANGE, 6155, _multirange(_date)),
    ("int8multirange", INT8MULTIRANGE, 6157, _multirange(int)),
    ("xid8", XID8, 271, int),
)

ARRAY_OIDS: Final[Mapping[int, int]] = {oid: array for _, oid, array, _ in _BUILTINS}
"""Built-in element type OID -> the OID of its array type."""

BUILTIN_TYPE_NAMES: Final[Mapping[int, str]] = {
    **{oid: name for name, oid, _, _ in _BUILTINS},
    **{array: f"_{name}" for name, _, array, _ in _BUILTINS},
}

_DECODERS: Final[Mapping[int, TextDecoder]] = {
    **{oid: decode for _, oid, _, decode in _BUILTINS},
    **{array: _array(decode, ";" if oid == BOX else ",") for _, oid, array, decode in _BUILTINS},
}


def decoder_for(type_oid: int) -> TextDecoder:
    """The text decoder of a built-in type; ``str`` for other types (the text is kept)."""
    return _DECODERS.get(type_oid, str)


def type_name(type_oid: int) -> str:
    return BUILTIN_TYPE_NAMES.get(type_oid, f"oid:{type_oid}")


# --- types of one database -------------------------------------------------------------------

_Build = Callable[[Callable[[int], TextDecoder]], TextDecoder]
_Derived = TypeVar("_Derived")


@dataclass(frozen=True, slots=True)
class TypeShape:
    """How a registered type is built from others, for decoders of other formats
    (decoder/binary.py builds the binary ones from it).

    ``kind`` is ``enum``, ``domain``, ``array``, ``composite``, ``range``,
    ``multirange``, ``base`` (an extension's type with a decoder of its own) or
    ``text`` (no decoder); ``of`` is the base, element or subtype OID; ``fields``
    the composite's (name, type OID) pairs; ``name`` the type's name; ``typmod`` a
    domain's (its base type's modifier: ``numeric(10,2)``).
    """

    kind: str
    of: int = 0
    fields: tuple[tuple[str, int], ...] = ()
    name: str | None = None
    typmod: int = -1


class TypeRegistry:
    """Decoders for the built-in types and for the types registered from one database.

    Custom OIDs belong to one database, so a registry serves one database;
    :func:`decoder.types.load_types` fills one from its catalog.  A registered
    type refers to others by OID; they may be registered in any order, and a
    reference to an OID the registry does not know decodes as text.  Decoders
    are built by :meth:`decoder_for` (once per OID, not per value) and do no
    lookups when they run.

    What is built from the registered types (its text decoders, the binary ones of
    decoder/binary.py) is kept in caches of :meth:`derived`, which every registration
    drops: a new type may complete an object built before it.
    """

    __slots__ = ("_builds", "_names", "_shapes", "_derived", "_decoders", "_building")

    def __init__(self) -> None:
        self._builds: dict[int, _Build] = {}
        self._names: dict[int, str] = {}
        self._shapes: dict[int, TypeShape] = {}
        self._derived: list[GenerationCache[int, Any]] = []
        self._building: set[int] = set()  # the types being built: a cycle decodes as text
        self._decoders = self.derived(self._build_decoder)

    def derived(self, build: Callable[[int], _Derived]) -> GenerationCache[int, _Derived]:
        """A cache of objects ``build(type OID)`` makes from the registered types, dropped
        whenever a type is registered."""
        cache: GenerationCache[int, _Derived] = GenerationCache(build)
        self._derived.append(cache)
        return cache

    def register_enum(self, oid: int, *, name: str | None = None) -> None:
        """An enum: its value is its label."""
        self._register(oid, name, lambda resolve: str, TypeShape("enum", name=name))

    def register_domain(self, oid: int, base_oid: int, *, name: str | None = None,
                        typmod: int = -1) -> None:
        """A domain: a value of its base type (itself perhaps a domain), with ``typmod``."""
        self._register(oid, name, lambda resolve: resolve(base_oid),
                       TypeShape("domain", base_oid, name=name, typmod=typmod))

    def register_array(self, oid: int, element_oid: int, *, delimiter: str = ",",
                       name: str | None = None) -> None:
        """An array: nested lists of its element type (``delimiter`` is the element's typdelim)."""
        self._register(oid, name, lambda resolve: _array(resolve(element_oid), delimiter),
                       TypeShape("array", element_oid, name=name))

    def register_composite(self, oid: int, fields: Iterable[tuple[str, int]], *,
                           name: str | None = None) -> None:
        """A composite: a dict of its fields (name, type OID), in attribute order."""
        fields = tuple(fields)
        self._register(oid, name, lambda resolve: _composite(
            tuple((field, resolve(field_oid)) for field, field_oid in fields)),
            TypeShape("composite", fields=fields, name=name))

    def register_range(self, oid: int, subtype_oid: int, *, name: str | None = None) -> None:
        """A range: a :class:`Range` whose bounds are values of its subtype."""
        self._register(oid, name, lambda resolve: _range(resolve(subtype_oid)),
                       TypeShape("range", subtype_oid, name=name))

    def register_multirange(self, oid: int, subtype_oid: int, *, name: str | None = None) -> None:
        """A multirange: a tuple of ranges over ``subtype_oid`` (the subtype of its range)."""
        self._register(oid, name, lambda resolve: _multirange(resolve(subtype_oid)),
                       TypeShape("multirange", subtype_oid, name=name))

    def register_base(self, oid: int, decode: TextDecoder, *, name: str | None = None) -> None:
        """A base type of an extension with a decoder of its own (decoder/extensions.py)."""
        self._register(oid, name, lambda resolve: decode, TypeShape("base", name=name))

    def register_text(self, oid: int, *, name: str | None = None) -> None:
        """A type whose value stays its text (an extension's base type, say), with its name."""
        self._register(oid, name, lambda resolve: str, TypeShape("text", name=name))

    def _register(self, oid: int, name: str | None, build: _Build, shape: TypeShape) -> None:
        self._builds[oid] = build
        self._shapes[oid] = shape
        if name is not None:
            self._names[oid] = name
        for built in self._derived:  # a new type may complete an object built before
            built.invalidate()

    def shape(self, oid: int) -> TypeShape | None:
        """How a registered type is built; ``None`` for built-in and unknown types."""
        return self._shapes.get(oid)

    def domain_base(self, oid: int) -> tuple[int, int] | None:
        """The base type OID and typmod of a registered domain; None for any other type."""
        shape = self._shapes.get(oid)
        return (shape.of, shape.typmod) if shape is not None and shape.kind == "domain" \
            else None

    def __contains__(self, oid: object) -> bool:
        return oid in _DECODERS or oid in self._builds

    def decoder_for(self, type_oid: int) -> TextDecoder:
        """The text decoder of a type; ``str`` for a type the registry does not know."""
        decode = _DECODERS.get(type_oid)
        if decode is not None:
            return decode
        if type_oid not in self._builds or type_oid in self._building:
            return str  # unknown, or a cycle the catalog cannot have
        return self._decoders.get(type_oid)

    def _build_decoder(self, oid: int) -> TextDecoder:
        self._building.add(oid)
        try:
            return self._builds[oid](self.decoder_for)
        finally:
            self._building.discard(oid)

    def type_name(self, type_oid: int) -> str:
        return self._names.get(type_oid) or type_name(type_oid)
