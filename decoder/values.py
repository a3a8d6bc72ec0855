"""Column values: pgoutput text into Python values, chosen by type OID.

The replication connection runs with ``DateStyle=ISO``, ``TimeZone=UTC``,
``IntervalStyle=iso_8601`` and ``extra_float_digits=3`` so that the text the
server sends is unambiguous and round-trips exactly.

A type without a decoder here (an extension type, say) keeps its text value,
and :func:`type_name` names it; a value that a Python type cannot hold
(``infinity`` timestamps, BC dates, years past 9999) also stays text.  Nothing
is guessed and nothing crashes.  ``json`` and ``jsonb`` keep the server's text,
exactly as PostgreSQL prints it (Debezium does the same).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any, Final

TextDecoder = Callable[[str], Any]

# Built-in type OIDs (pg_type.h); stable across PostgreSQL versions.
BOOL: Final = 16
BYTEA: Final = 17
CHAR: Final = 18
NAME: Final = 19
INT8: Final = 20
INT2: Final = 21
INT4: Final = 23
TEXT: Final = 25
OID: Final = 26
JSON: Final = 114
XML: Final = 142
FLOAT4: Final = 700
FLOAT8: Final = 701
MONEY: Final = 790
BPCHAR: Final = 1042
VARCHAR: Final = 1043
DATE: Final = 1082
TIME: Final = 1083
TIMESTAMP: Final = 1114
TIMESTAMPTZ: Final = 1184
INTERVAL: Final = 1186
TIMETZ: Final = 1266
NUMERIC: Final = 1700
UUID: Final = 2950
PG_LSN: Final = 3220
JSONB: Final = 3802

BUILTIN_TYPE_NAMES: Final[dict[int, str]] = {
    BOOL: "bool", BYTEA: "bytea", CHAR: "char", NAME: "name", INT8: "int8", INT2: "int2",
    INT4: "int4", TEXT: "text", OID: "oid", JSON: "json", XML: "xml", FLOAT4: "float4",
    FLOAT8: "float8", MONEY: "money", BPCHAR: "bpchar", VARCHAR: "varchar", DATE: "date",
    TIME: "time", TIMESTAMP: "timestamp", TIMESTAMPTZ: "timestamptz", INTERVAL: "interval",
    TIMETZ: "timetz", NUMERIC: "numeric", UUID: "uuid", PG_LSN: "pg_lsn", JSONB: "jsonb",
}


def _bool(text: str) -> bool:
    return text == "t"


def _float(text: str) -> float:
    return float(text)  # handles NaN, Infinity, -Infinity


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


def _or_text(parse: Callable[[str], Any]) -> TextDecoder:
    """Values outside Python's range (infinity, BC, year > 9999) stay text."""

    def decode(text: str) -> Any:
        try:
            return parse(text)
        except ValueError:
            return text

    return decode


def _timestamp(text: str) -> datetime:
    return datetime.fromisoformat(text)


_DECODERS: dict[int, TextDecoder] = {
    BOOL: _bool,
    BYTEA: _bytea,
    INT2: int,
    INT4: int,
    INT8: int,
    OID: int,
    FLOAT4: _float,
    FLOAT8: _float,
    NUMERIC: Decimal,
    UUID: uuid.UUID,
    DATE: _or_text(date.fromisoformat),
    TIME: _or_text(time.fromisoformat),
    TIMETZ: _or_text(time.fromisoformat),
    TIMESTAMP: _or_text(_timestamp),
    TIMESTAMPTZ: _or_text(_timestamp),
}


def decoder_for(type_oid: int) -> TextDecoder:
    """The text decoder for a type; ``str`` for types without one (the text is kept)."""
    return _DECODERS.get(type_oid, str)


def type_name(type_oid: int) -> str:
    return BUILTIN_TYPE_NAMES.get(type_oid, f"oid:{type_oid}")
