"""Text values into Python values, by type OID."""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from uuid import UUID

import pytest

from decoder import text_parsers, values


@pytest.mark.parametrize(("oid", "text", "expected"), [
    (values.BOOL, "t", True),
    (values.BOOL, "f", False),
    (values.INT2, "-32768", -32768),
    (values.INT8, "9223372036854775807", 9223372036854775807),
    (values.NUMERIC, "123456789012345678901234567890.000000001",
     Decimal("123456789012345678901234567890.000000001")),
    (values.FLOAT8, "Infinity", math.inf),
    (values.FLOAT8, "-Infinity", -math.inf),
    (values.BYTEA, "\\x00ff10", b"\x00\xff\x10"),
    (values.BYTEA, "a\\\\b\\001", b"a\\b\x01"),
    (values.UUID, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
     UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")),
    (values.DATE, "2024-02-29", date(2024, 2, 29)),
    (values.TIME, "23:59:59.999999", time(23, 59, 59, 999999)),
    (values.TIMESTAMPTZ, "2024-01-01 00:00:00.5+00", datetime(2024, 1, 1, 0, 0, 0, 500000,
                                                               tzinfo=UTC)),
    (values.TIMESTAMPTZ, "2024-01-01 05:30:00+05:30",
     datetime(2024, 1, 1, 5, 30, tzinfo=timezone(timedelta(hours=5, minutes=30)))),
    (values.TIMESTAMP, "1999-12-31 23:59:59",
     datetime(1999, 12, 31, 23, 59, 59)),  # noqa: DTZ001 - timestamp without time zone
    # outside Python's range: the server's text is kept, never a crash
    (values.TIMESTAMPTZ, "infinity", "infinity"),
    (values.DATE, "4713-01-01 BC", "4713-01-01 BC"),
    (values.JSONB, '{"a": [1, 2]}', '{"a": [1, 2]}'),
    (987654, "(1,2)", "(1,2)"),  # an unknown type keeps its text
])
def test_decode(oid: int, text: str, expected: object) -> None:
    decoded = text_parsers.decoder_for(oid)(text)
    assert decoded == expected
    assert type(decoded) is type(expected)


def test_nan() -> None:
    assert math.isnan(text_parsers.decoder_for(values.FLOAT4)("NaN"))
    assert text_parsers.decoder_for(values.NUMERIC)("NaN").is_nan()


def test_type_names() -> None:
    assert text_parsers.type_name(values.TIMESTAMPTZ) == "timestamptz"
    assert text_parsers.type_name(987654) == "oid:987654"
