"""Column values: the built-in types' OIDs and the Python values of PostgreSQL's types.

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
  its text, and :func:`~decoder.text_parsers.type_name` (or
  :meth:`~decoder.type_registry.TypeRegistry.type_name`) names it.

Arrays drop their lower bounds (``[0:1]={1,2}`` is ``[1, 2]``), as psycopg does.

This module holds the built-in types' OIDs and the value classes of the table
above; the text parsers are in :mod:`decoder.text_parsers`, the binary ones in
:mod:`decoder.binary`.  Built-in types have fixed OIDs and
:func:`decoder.text_parsers.decoder_for` knows them.  Enums, domains, composites and
arrays or ranges of custom types have OIDs of their database; a
:class:`~decoder.type_registry.TypeRegistry` filled from that database's catalog
(:func:`decoder.types.load_types`) decodes them too.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from ipaddress import IPv4Interface, IPv4Network, IPv6Interface, IPv6Network
from typing import Any, Final

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
