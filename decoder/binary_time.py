"""Binary column values of the date and time types (``date_send``, ``timestamp_send``, ...).

Dates are Int32 days and timestamps Int64 microseconds since 2000-01-01, with ``INT_MAX``/
``INT64_MAX`` (and the minimums) for +-infinity; ``time`` is Int64 microseconds,
``timetz`` adds Int32 seconds west of UTC, ``interval`` is microseconds, days, months.
What Python cannot hold (infinity, BC, years past 9999, ``24:00:00``) is the text the
replication session prints (``DateStyle=ISO``, ``TimeZone=UTC``), as in text mode.
"""

from __future__ import annotations

import struct
from datetime import UTC, date, datetime, time, timedelta, timezone
from typing import Final

from decoder import values as v
from decoder.binary_scalars import BinaryDecoder
from decoder.values import Interval

_DAYS = struct.Struct("!i").unpack
_MICROS = struct.Struct("!q").unpack
_INTERVAL = struct.Struct("!qii").unpack
_TIMETZ = struct.Struct("!qi").unpack


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
    (days,) = _DAYS(raw)
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
    (micros,) = _MICROS(raw)
    try:
        return _EPOCH + timedelta(microseconds=micros)
    except OverflowError:  # outside years 1 to 9999
        return _timestamp_text(micros, "")


def _timestamptz(raw: bytes) -> datetime | str:
    (micros,) = _MICROS(raw)
    try:
        return _EPOCH_UTC + timedelta(microseconds=micros)
    except OverflowError:
        return _timestamp_text(micros, "+00")


def _time(raw: bytes) -> time | str:
    (micros,) = _MICROS(raw)
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


TIMES: Final[dict[int, BinaryDecoder]] = {
    v.DATE: _date, v.TIME: _time, v.TIMESTAMP: _timestamp, v.TIMESTAMPTZ: _timestamptz,
    v.INTERVAL: _interval, v.TIMETZ: _timetz,
}
"""The decoders of this module by type OID."""
