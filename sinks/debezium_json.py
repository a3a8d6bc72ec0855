"""Column values as Debezium's PostgreSQL connector writes them to JSON (``--json-mode debezium``).

Debezium 3.6's connector with Kafka Connect's ``JsonConverter`` (``schemas.enable=false``)
encodes values by type and by four settings, mirrored by :class:`JsonOptions`:

``decimal.handling.mode`` (``numeric``, ``money``)
    ``precise`` (default): the unscaled value's two's complement bytes, big-endian and
    minimal (Java's ``BigInteger.toByteArray``), base64; ``numeric(p,s)`` at scale ``s``,
    an unconstrained ``numeric`` as ``{"scale": s, "value": base64}`` with trailing zeros
    stripped, ``money`` at scale 2.  ``NaN`` and infinities cannot be written: the event
    stops with :class:`UnrepresentableValueError` (Debezium stops too).
    ``double``: a JSON number (``"NaN"``, ``"Infinity"``, ``"-Infinity"`` as strings).
    ``string``: the plain decimal (``numeric(p,s)`` at scale ``s``); ``NAN``,
    ``POSITIVE_INFINITY``, ``NEGATIVE_INFINITY`` as Debezium spells them.
``time.precision.mode`` (``date``, ``time``, ``timestamp``)
    ``adaptive`` (default): ``date`` days since 1970-01-01; ``time(p)`` milliseconds past
    midnight for p <= 3, else microseconds; ``timestamp(p)`` milliseconds since the epoch
    for p <= 3, else microseconds (no precision counts as 6).
    ``adaptive_time_microseconds``: as adaptive, ``time`` always microseconds.
    ``connect``: days, milliseconds past midnight, milliseconds since the epoch.
    ``isostring``: ``"2024-02-29Z"``, ``"13:14:15.123456Z"``, ``"2024-02-29T13:14:15.5Z"``
    (fractions without trailing zeros).
    Whatever the mode: ``timestamptz`` is UTC ISO 8601 with as many fraction digits as
    the column's precision (6 without one, none for precision 0), ``"…Z"``; ``timetz``
    is the time in UTC, ``"11:14:15.5Z"``.
``interval.handling.mode``
    ``numeric`` (default): microseconds, a month counted as 365.25 / 12 days, computed
    in doubles as Debezium computes it; ``string``: ``"P1Y2M3DT4H5M6.789S"`` (every
    field, zeros included, seconds without trailing zeros).
``binary.handling.mode`` (``bytea``)
    ``bytes`` (default) and ``base64``: base64; ``base64-url-safe``: URL-safe base64
    with padding; ``hex``: lowercase hex.

Other values: integers, booleans, text, enum labels, ``json``/``jsonb`` (the server's
text), ``uuid``, ``inet``/``cidr`` and ``oid`` as Debezium writes them; a float NaN or
infinity as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (Jackson's default);
arrays element by element; a ``point`` as Debezium's Point, ``{"x", "y", "wkb", "srid"}``
(the WKB base64, ``srid`` null).  Types Debezium maps otherwise and pgcdc does not follow
yet (ranges, the other geometric types, bit strings, hstore, composites) keep pgcdc's JSON
form (sinks/envelope.py).  A value kept as the server's text (``infinity``, BC dates,
``24:00:00`` other than in ``time``) stays that text.  A column whose TOASTed value was
not resent is Debezium's placeholder ``__debezium_unavailable_value`` (its bytes for
``bytea``, in a one-element list for an array), and a column absent from an image (a
delete's key-only ``before``) is ``null``.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, Final, Literal

from core.wire import FORMAT_DEBEZIUM_JSON, FORMAT_JSON
from decoder.text_parsers import ARRAY_OIDS, BUILTIN_TYPE_NAMES
from decoder.values import Interval, Point
from snapshot_builder.catalog import Column, TableVersion

DecimalMode = Literal["precise", "double", "string"]
TimeMode = Literal["adaptive", "adaptive_time_microseconds", "connect", "isostring"]
IntervalMode = Literal["numeric", "string"]
BinaryMode = Literal["bytes", "base64", "base64-url-safe", "hex"]
JsonMode = Literal["debezium", "pgcdc"]

DECIMAL_MODES: Final = ("precise", "double", "string")
TIME_MODES: Final = ("adaptive", "adaptive_time_microseconds", "connect", "isostring")
INTERVAL_MODES: Final = ("numeric", "string")
BINARY_MODES: Final = ("bytes", "base64", "base64-url-safe", "hex")
JSON_MODES: Final = ("debezium", "pgcdc")

PLACEHOLDER: Final = "__debezium_unavailable_value"
DAYS_PER_MONTH_AVG: Final = 365.25 / 12.0
MONEY_SCALE: Final = 2  # Debezium's money.fraction.digits


@dataclass(frozen=True)
class JsonOptions:
    """How ``--format json`` writes values: Debezium's encodings under its four settings
    (``mode="debezium"``, the default) or pgcdc's own ISO strings (``mode="pgcdc"``, the
    settings unused).  ``database`` is ``source.db``."""

    mode: JsonMode = "debezium"
    decimal: DecimalMode = "precise"
    time: TimeMode = "adaptive"
    interval: IntervalMode = "numeric"
    binary: BinaryMode = "bytes"
    database: str = ""

    def __post_init__(self) -> None:
        for name, value, allowed in (("json mode", self.mode, JSON_MODES),
                                     ("decimal handling mode", self.decimal, DECIMAL_MODES),
                                     ("time precision mode", self.time, TIME_MODES),
                                     ("interval handling mode", self.interval, INTERVAL_MODES),
                                     ("binary handling mode", self.binary, BINARY_MODES)):
            if value not in allowed:
                msg = f"unknown {name} {value!r}: choose one of {', '.join(allowed)}"
                raise ValueError(msg)

    @property
    def header(self) -> str:
        """The ``pgcdc.format`` header of these records: ``json`` for pgcdc's own encoding
        (what pgcdc's Spark job reads), ``debezium-json`` for Debezium's."""
        return FORMAT_JSON if self.mode == "pgcdc" else FORMAT_DEBEZIUM_JSON


PGCDC_JSON: Final = JsonOptions(mode="pgcdc")


class UnrepresentableValueError(ValueError):
    """A value the chosen JSON settings cannot write (a numeric NaN in ``precise`` mode)."""


_Convert = Callable[[Any], Any]

# ---- numbers --------------------------------------------------------------------------------

_SPECIAL = {"NaN": "NAN", "Infinity": "POSITIVE_INFINITY", "-Infinity": "NEGATIVE_INFINITY"}
_FLOAT_SPECIAL = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def twos_complement_b64(unscaled: int) -> str:
    """Java's ``BigInteger.toByteArray`` (minimal big-endian two's complement), base64."""
    size = (unscaled.bit_length() if unscaled >= 0 else (~unscaled).bit_length()) // 8 + 1
    return binascii.b2a_base64(unscaled.to_bytes(size, "big", signed=True),
                               newline=False).decode("ascii")


def _unscaled(value: Decimal, scale: int, *, half_up: bool = False) -> int:
    """The integer ``value * 10**scale``: exactly (a value with more digits is refused), or
    rounded half up with ``half_up`` (Java's ``setScale(scale, HALF_UP)``)."""
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    number: int = int("".join(map(str, digits)) or "0")
    shift = exponent + scale
    if shift >= 0:
        number *= 10 ** shift
    else:
        number, rest = divmod(number, 10 ** -shift)
        if half_up:
            number += 1 if 2 * rest >= 10 ** -shift else 0
        elif rest:
            msg = f"numeric {value} has more than {scale} decimal places"
            raise UnrepresentableValueError(msg)
    return -number if sign else number


def plain(value: Decimal) -> str:
    """Java's ``BigDecimal.toPlainString``: no exponent, the value's own scale."""
    return format(value, "f")


def _special(value: Decimal) -> str | None:
    if value.is_finite():
        return None
    return "NaN" if value.is_nan() else ("-Infinity" if value.is_signed() else "Infinity")


def _stop_special(value: Decimal, what: str) -> UnrepresentableValueError:
    return UnrepresentableValueError(
        f"{what} value {value} cannot be written with --decimal-handling-mode precise "
        "(Debezium's decimal.handling.mode=precise has no NaN or infinity); run with "
        "--decimal-handling-mode string (or double)")


def numeric_converter(typmod: int, mode: DecimalMode) -> _Convert:
    """``numeric`` (``numeric(p,s)`` when ``typmod`` is not -1) under a decimal mode."""
    scale = None if typmod < 4 else (typmod - 4) & 0xFFFF
    if mode == "double":
        def double(value: Any) -> Any:
            if not isinstance(value, Decimal):
                return value
            special = _special(value)
            return special if special is not None else float(value)
        return double
    if mode == "string":
        def string(value: Any) -> Any:
            if not isinstance(value, Decimal):
                return value
            special = _special(value)
            if special is not None:
                return _SPECIAL[special]
            if scale is None:
                return plain(value)
            return plain(Decimal(_unscaled(value, scale)).scaleb(-scale))
        return string
    if scale is not None:
        fixed = scale

        def precise(value: Any) -> Any:
            if not isinstance(value, Decimal):
                return value
            if not value.is_finite():
                raise _stop_special(value, "numeric")
            return twos_complement_b64(_unscaled(value, fixed))
        return precise
    return variable_scale


def variable_scale(value: Any) -> Any:
    """An unconstrained ``numeric`` in ``precise`` mode: Debezium's VariableScaleDecimal,
    ``{"scale", "value"}`` with trailing zeros stripped (a scale below 0 made 0)."""
    if not isinstance(value, Decimal):
        return value
    if not value.is_finite():
        raise _stop_special(value, "numeric")
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    number: int = int("".join(map(str, digits)) or "0")
    scale = -exponent
    if number == 0:
        scale = 0
    while scale > 0 and number % 10 == 0:
        number //= 10
        scale -= 1
    if scale < 0:
        number *= 10 ** -scale
        scale = 0
    return {"scale": scale, "value": twos_complement_b64(-number if sign else number)}


def money_converter(mode: DecimalMode) -> _Convert:
    def convert(value: Any) -> Any:
        if not isinstance(value, Decimal):
            return value
        if mode == "double":
            return float(value)
        if mode == "string":
            return plain(value)
        return twos_complement_b64(_unscaled(value, MONEY_SCALE, half_up=True))
    return convert


def float_value(value: Any) -> Any:
    """A float, with NaN and infinities as the strings Jackson writes for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return _FLOAT_SPECIAL[repr(value)]
    return value


# ---- dates and times ------------------------------------------------------------------------

_EPOCH_ORDINAL: Final = date(1970, 1, 1).toordinal()
_DAY_US: Final = 86_400_000_000


def epoch_days(value: Any) -> Any:
    if isinstance(value, date):
        return value.toordinal() - _EPOCH_ORDINAL
    return value


def _micros_of_day(value: time) -> int:
    return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond


def micro_time(value: Any) -> Any:
    """Microseconds past midnight (``24:00:00`` is a whole day)."""
    if isinstance(value, time):
        return _micros_of_day(value)
    if value == "24:00:00":
        return _DAY_US
    return value


def milli_time(value: Any) -> Any:
    micros = micro_time(value)
    return micros // 1000 if isinstance(micros, int) else micros


def epoch_micros(value: Any) -> Any:
    """A timestamp without time zone as microseconds since 1970-01-01 00:00 (read as UTC)."""
    if isinstance(value, datetime):
        days = value.toordinal() - _EPOCH_ORDINAL
        return days * _DAY_US + _micros_of_day(value.time())
    return value


def epoch_millis(value: Any) -> Any:
    micros = epoch_micros(value)
    return micros // 1000 if isinstance(micros, int) else micros


def _fraction(microsecond: int) -> str:
    """Java's ISO_LOCAL_TIME fraction: none for 0, else without trailing zeros."""
    return f".{microsecond:06d}".rstrip("0") if microsecond else ""


def _hms(value: time | datetime) -> str:
    return f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}"


def iso_date(value: Any) -> Any:
    return f"{value.isoformat()}Z" if isinstance(value, date) else value


def iso_time(value: Any) -> Any:
    if isinstance(value, time):
        return f"{_hms(value)}{_fraction(value.microsecond)}Z"
    if value == "24:00:00":  # Debezium adds the day to midnight
        return "00:00:00Z"
    return value


def iso_timestamp(value: Any) -> Any:
    if isinstance(value, datetime):
        return f"{value.date().isoformat()}T{_hms(value)}{_fraction(value.microsecond)}Z"
    return value


def zoned_timestamp_converter(typmod: int) -> _Convert:
    """``timestamptz``: UTC, ``width`` fraction digits (the precision, 6 without one; a
    precision of 0 prints a fraction only when there is one, without trailing zeros)."""
    width = 6 if typmod < 0 else typmod

    def convert(value: Any) -> Any:
        if not isinstance(value, datetime):
            return value
        if value.tzinfo is not None:
            try:
                value = value.astimezone(UTC)
            except OverflowError:
                return _utc_text_beyond_python(value)
        if width == 0:
            fraction = _fraction(value.microsecond)
        else:
            fraction = "." + f"{value.microsecond:06d}{'0' * 3}"[:width]
        return f"{value.date().isoformat()}T{_hms(value)}{fraction}Z"
    return convert


def _utc_text_beyond_python(value: datetime) -> str:
    """An instant whose UTC date Python cannot hold (0001-01-01 at an offset east of UTC is
    in 1 BC; 9999-12-31 west of it, in 10000): PostgreSQL's text in UTC, the form pgcdc keeps
    for every timestamp Python cannot hold."""
    offset = value.utcoffset() or timedelta()
    local = value.replace(tzinfo=None)
    if local.year == 1:
        shifted = local + timedelta(days=1) - offset  # the same time of day, a day later
        return f"0001-12-31 {_hms(shifted)}{_fraction(shifted.microsecond)}+00 BC"
    shifted = local - timedelta(days=1) - offset
    return f"10000-01-01 {_hms(shifted)}{_fraction(shifted.microsecond)}+00"


def zoned_time(value: Any) -> Any:
    """``timetz``: the time in UTC (wrapping around midnight), ``"11:14:15.5Z"``."""
    if not isinstance(value, time):
        return value
    offset = value.utcoffset()
    micros = _micros_of_day(value)
    if offset is not None:
        micros = (micros - (offset.days * 86_400 + offset.seconds) * 1_000_000
                  - offset.microseconds) % _DAY_US
    seconds, microsecond = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return f"{hour:02d}:{minute:02d}:{second:02d}{_fraction(microsecond)}Z"


# ---- intervals ------------------------------------------------------------------------------

def _toward_zero(value: int, unit: int) -> tuple[int, int]:
    quotient = abs(value) // unit
    quotient = -quotient if value < 0 else quotient
    return quotient, value - quotient * unit


def _interval_fields(value: Interval) -> tuple[int, int, int, int, int, float]:
    """As the JDBC driver's PGInterval holds an interval: each field with its own sign,
    seconds a double (whole seconds + microseconds / 1e6)."""
    years, months = _toward_zero(value.months, 12)
    hours, rest = _toward_zero(value.microseconds, 3_600_000_000)
    minutes, rest = _toward_zero(rest, 60_000_000)
    seconds, micros = _toward_zero(rest, 1_000_000)
    return years, months, value.days, hours, minutes, seconds + micros / 1_000_000


def interval_micros(value: Any) -> Any:
    """Debezium's MicroDuration: in doubles, months of 365.25 / 12 days, truncated."""
    if not isinstance(value, Interval):
        return value
    years, months, days, hours, minutes, seconds = _interval_fields(value)
    number_of_days = (years * 12 + months) * DAYS_PER_MONTH_AVG + days
    number_of_seconds = ((number_of_days * 24 + hours) * 60 + minutes) * 60 + seconds
    return int(number_of_seconds * 1e6)


def interval_string(value: Any) -> Any:
    """Debezium's Interval: ``P<y>Y<m>M<d>DT<h>H<m>M<s>S``, every field written."""
    if not isinstance(value, Interval):
        return value
    years, months, days, hours, minutes, seconds = _interval_fields(value)
    text = plain(Decimal(repr(seconds)))  # BigDecimal.valueOf(double): the double's shortest text
    if "." in text:  # stripTrailingZeros().toPlainString()
        text = text.rstrip("0").rstrip(".")
    if text in ("", "-0"):
        text = "0"
    return f"P{years}Y{months}M{days}DT{hours}H{minutes}M{text}S"


# ---- binary ---------------------------------------------------------------------------------

def _as_bytes(value: Any) -> bytes | None:
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return None


def binary_converter(mode: BinaryMode) -> _Convert:
    def b64(value: Any) -> Any:
        data = _as_bytes(value)
        return value if data is None else binascii.b2a_base64(data, newline=False).decode()

    def url_safe(value: Any) -> Any:
        data = _as_bytes(value)
        return value if data is None else base64.urlsafe_b64encode(data).decode()

    def hexadecimal(value: Any) -> Any:
        data = _as_bytes(value)
        return value if data is None else data.hex()

    return {"bytes": b64, "base64": b64, "base64-url-safe": url_safe,
            "hex": hexadecimal}[mode]


# ---- geometry -------------------------------------------------------------------------------

_WKB_POINT: Final = struct.Struct("<Idd")


def point_value(value: Any) -> Any:
    """Debezium's Point: ``{"x", "y", "wkb", "srid"}``, the WKB little-endian, no SRID."""
    if not isinstance(value, Point):
        return value
    wkb = b"\x01" + _WKB_POINT.pack(1, value.x, value.y)
    return {"x": float_value(value.x), "y": float_value(value.y),
            "wkb": binascii.b2a_base64(wkb, newline=False).decode(), "srid": None}


# ---- columns --------------------------------------------------------------------------------

_OID_OF_NAME: Final = {name: oid for oid, name in BUILTIN_TYPE_NAMES.items()}
_ELEMENT_OF: Final = {array: element for element, array in ARRAY_OIDS.items()}

NUMERIC, MONEY, FLOAT4, FLOAT8, BYTEA, POINT = 1700, 790, 700, 701, 17, 600
DATE, TIME, TIMETZ, TIMESTAMP, TIMESTAMPTZ, INTERVAL = 1082, 1083, 1266, 1114, 1184, 1186


def _time_precision(typmod: int) -> int:
    return 6 if typmod < 0 else typmod


def type_converter(oid: int, typmod: int, options: JsonOptions) -> _Convert | None:
    """The converter of one built-in type (``None``: the value is written as it is)."""
    if oid == NUMERIC:
        return numeric_converter(typmod, options.decimal)
    if oid == MONEY:
        return money_converter(options.decimal)
    if oid in (FLOAT4, FLOAT8):
        return float_value
    if oid == BYTEA:
        return binary_converter(options.binary)
    if oid == TIMESTAMPTZ:
        return zoned_timestamp_converter(typmod)
    if oid == TIMETZ:
        return zoned_time
    if oid == POINT:
        return point_value
    if oid == INTERVAL:
        return interval_micros if options.interval == "numeric" else interval_string
    mode = options.time
    if oid == DATE:
        return iso_date if mode == "isostring" else epoch_days
    if oid == TIME:
        if mode == "isostring":
            return iso_time
        if mode == "connect" or (mode == "adaptive" and _time_precision(typmod) <= 3):
            return milli_time
        return micro_time
    if oid == TIMESTAMP:
        if mode == "isostring":
            return iso_timestamp
        if mode == "connect" or _time_precision(typmod) <= 3:
            return epoch_millis
        return epoch_micros
    element = _ELEMENT_OF.get(oid)
    if element is not None and element != POINT:  # Debezium has no point[] converter
        convert = type_converter(element, typmod, options)
        return None if convert is None else _each(convert)
    return None


def _each(convert: _Convert) -> _Convert:
    def array(value: Any) -> Any:
        if not isinstance(value, list):
            return value
        return [None if v is None else array(v) if isinstance(v, list) else convert(v)
                for v in value]
    return array


def column_converter(column: Column, options: JsonOptions) -> _Convert | None:
    """The converter of a column's values (a domain's: its base type's)."""
    if column.base_type is not None and column.base_type in _OID_OF_NAME:
        return type_converter(_OID_OF_NAME[column.base_type], column.base_typmod, options)
    return type_converter(column.type_oid, column.typmod, options)


# what sinks/_fastjson.c writes itself, by column (its K_* kinds), with an argument
K_PLAIN, K_NUMERIC, K_DATE_DAYS, K_TIME_MICROS, K_TIME_MILLIS, K_TS_MICROS, K_TS_MILLIS, \
    K_TSTZ, K_FLOAT, K_BASE64 = range(10)
_KINDS: Final[dict[_Convert, int]] = {
    epoch_days: K_DATE_DAYS, micro_time: K_TIME_MICROS, milli_time: K_TIME_MILLIS,
    epoch_micros: K_TS_MICROS, epoch_millis: K_TS_MILLIS, float_value: K_FLOAT}


def fast_kind(column: Column, options: JsonOptions) -> tuple[int, int]:
    """How sinks/_fastjson.c writes the column's common values (the same text as
    :func:`column_converter`'s converter and json): its kind and argument."""
    oid, typmod = column.type_oid, column.typmod
    if column.base_type is not None and column.base_type in _OID_OF_NAME:
        oid, typmod = _OID_OF_NAME[column.base_type], column.base_typmod
    if oid == NUMERIC and options.decimal == "precise" and typmod >= 4:
        return K_NUMERIC, (typmod - 4) & 0xFFFF
    if oid == TIMESTAMPTZ:
        return K_TSTZ, 6 if typmod < 0 else typmod
    if oid == BYTEA and options.binary in ("bytes", "base64"):
        return K_BASE64, 0
    convert = type_converter(oid, typmod, options)
    return _KINDS.get(convert, K_PLAIN) if convert is not None else K_PLAIN, 0


def _placeholder(column: Column, options: JsonOptions) -> Any:
    oid = _OID_OF_NAME.get(column.base_type or "", column.type_oid)
    if oid == BYTEA:
        if options.binary == "hex":
            return PLACEHOLDER
        return binary_converter(options.binary)(PLACEHOLDER.encode())
    if oid in _ELEMENT_OF or column.type_name.startswith("_"):
        return [PLACEHOLDER]
    return PLACEHOLDER


class RowConverter:
    """The images of one table version's events as Debezium writes them: every column in
    table order, converted; ``None`` for a column absent from the image, the placeholder
    for an unchanged TOASTed one."""

    __slots__ = ("columns", "placeholders", "trivial")

    def __init__(self, table: TableVersion, options: JsonOptions) -> None:
        self.columns = tuple((c.name, column_converter(c, options)) for c in table.columns)
        self.placeholders = {c.name: _placeholder(c, options) for c in table.columns}
        self.trivial = all(convert is None for _, convert in self.columns)

    def convert(self, row: dict[str, Any], unchanged: tuple[str, ...] = ()) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, convert in self.columns:
            value = row.get(name)
            if value is None:
                out[name] = self.placeholders[name] if unchanged and name in unchanged \
                    and name not in row else None
            else:
                out[name] = value if convert is None else convert(value)
        return out
