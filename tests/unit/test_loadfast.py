"""The initial load's compiled fast path (sinks/_loadfast.c) writes the bytes of the slow path.

The oracle is the slow path itself: a COPY text line parsed into its fields, built into a
row (loads/chunk_reader.row_builder), made a read event and encoded by
sinks/avro.py's AvroEncoder.  Lines are generated as PostgreSQL prints values (with the
replication session's settings), edge values included; tests/integration/test_loadfast.py
does the same with lines from a real server.  No broker: the producer is never asked to
send.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decoder.change import READ, ChangeEvent, RowDecoder
from decoder.type_registry import TypeRegistry
from loads.chunk_reader import row_builder
from sinks.avro import AvroEncoder
from snapshot_builder.catalog import Column, TableVersion

# The compiled module is optional (setup.py builds it only where a C compiler exists; pgcdc
# then loads through the Python path, which these tests compare against), and it needs the
# librdkafka confluent_kafka ships.  `make setup` and CI build and have both, so there these
# skips never fire; tests/integration/test_loadfast.py asserts the compiled path is taken.
loadfast = pytest.importorskip("sinks.loadfast")
if loadfast._loadfast is None:  # noqa: SLF001
    pytest.skip("sinks._loadfast is not built (no C compiler)", allow_module_level=True)
if loadfast.librdkafka_path() is None:
    pytest.skip("librdkafka's library not found", allow_module_level=True)

TABLE = TableVersion(42, "shop", "every kind", "d", (
    Column("name", 25, "text", -1, True),
    Column("id", 20, "int8", -1, True),
    Column("small", 21, "int2", -1, False),
    Column("n", 23, "int4", -1, False),
    Column("amount", 1700, "numeric", -1, False),
    Column("at", 1184, "timestamptz", -1, False),
    Column("local", 1114, "timestamp", -1, False),
    Column("day", 1082, "date", -1, False),
    Column("ratio", 701, "float8", -1, False),
    Column("f4", 700, "float4", -1, False),
    Column("ok", 16, "bool", -1, False),
    Column("doc", 3802, "jsonb", -1, False),
    Column("items", 1007, "_int4", -1, False),
    Column("bigs", 1016, "_int8", -1, False),
    Column("raw", 17, "bytea", -1, False),
    Column("span", 1186, "interval", -1, False),
    Column("tags", 1009, "_text", -1, False),
    Column("u", 2950, "uuid", -1, False),
    Column("o", 26, "oid", -1, False),
))
LSN, COMMIT_TIME, NOW_MS = 0x16B3748, 785_000_000_123_456, 1_795_000_000_000


def _escape(value: str | None) -> str:
    if value is None:
        return "\\N"
    return (value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
            .replace("\r", "\\r"))


def _line(fields: list[str | None]) -> bytes:
    return ("\t".join(_escape(f) for f in fields) + "\n").encode()


@pytest.fixture(scope="module")
def producer() -> Any:
    made = loadfast._loadfast.Producer(  # noqa: SLF001
        loadfast.librdkafka_path(), [("bootstrap.servers", "127.0.0.1:9"),
                                     ("enable.idempotence", "true"), ("acks", "all"),
                                     ("log_level", "0")])
    yield made
    made.close()


def _both(producer: Any, fields: list[str | None], ordinal: int) -> tuple[Any, Any]:
    decoder = RowDecoder(TABLE, TypeRegistry().decoder_for)
    encoder = AvroEncoder()
    plan = loadfast.compile_table(producer, TABLE, decoder, encoder, "app", "t",
                                  [("pgcdc.table_version", b"v")], LSN, COMMIT_TIME)
    fast = plan.encode(_line(fields), ordinal, NOW_MS)
    row = row_builder(decoder)(fields)
    event = ChangeEvent(READ, TABLE, None, row, (), LSN, LSN, ordinal, 0, COMMIT_TIME)
    return fast, encoder.encode(event, server_name="app", now_ms=NOW_MS)


def _pg_number(value: Decimal) -> str:
    return str(value) if not value.is_finite() else format(value, "f")


def _pg_timestamp(value: datetime, zone: str) -> str:
    text = value.strftime("%Y-%m-%d %H:%M:%S")
    if value.microsecond:
        text += f".{value.microsecond:06d}".rstrip("0")
    return text + zone


def _pg_float(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)


def _array(items: list[int | None]) -> str:
    return "{" + ",".join("NULL" if i is None else str(i) for i in items) + "}"


NO_NUL = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
NUMERIC = st.one_of(st.decimals(allow_nan=False, allow_infinity=False).map(_pg_number),
                    st.sampled_from(["NaN", "Infinity", "-Infinity", "0.0000001", "0.000001",
                                     "0.0000000", "-0.00001234", "100.000", "0", "-0"]))
TIMES = st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31))  # noqa: DTZ001
ZONES = st.sampled_from(["+00", "+05:30", "-03", "-00:25:21", "+14"])
TIMESTAMPTZ = st.one_of(st.builds(_pg_timestamp, TIMES, ZONES),
                        st.sampled_from(["infinity", "-infinity", "0044-03-15 12:00:00+00 BC",
                                         "10000-01-01 00:00:00+00", "2024-02-30 00:00:00+00"]))
TIMESTAMP = st.one_of(st.builds(_pg_timestamp, TIMES, st.just("")),
                      st.sampled_from(["infinity", "0001-01-01 00:00:00 BC"]))
DATES = st.one_of(st.dates().map(lambda d: d.isoformat()),
                  st.sampled_from(["infinity", "-infinity", "0044-03-15 BC", "10000-01-01"]))
INTS = st.lists(st.one_of(st.none(), st.integers(-2**31, 2**31 - 1)), max_size=6)


def _nullable(strategy: st.SearchStrategy[str]) -> st.SearchStrategy[str | None]:
    return st.one_of(st.none(), strategy)


ROWS = st.tuples(
    NO_NUL, st.integers(-2**63, 2**63 - 1).map(str),
    _nullable(st.integers(-2**15, 2**15 - 1).map(str)),
    _nullable(st.integers(-2**31, 2**31 - 1).map(str)),
    _nullable(NUMERIC), _nullable(TIMESTAMPTZ), _nullable(TIMESTAMP), _nullable(DATES),
    _nullable(st.floats().map(_pg_float)),
    _nullable(st.floats(width=32).map(_pg_float) | st.sampled_from(["3.4028235e+38", "1e-45"])),
    _nullable(st.sampled_from(["t", "f"])),
    _nullable(NO_NUL.map(lambda t: '{"k": ' + repr(t) + "}")),
    _nullable(st.one_of(INTS.map(_array), st.sampled_from(["{{1,2},{3,4}}", "{}", "[0:1]={1,2}"]))),
    _nullable(st.lists(st.one_of(st.none(), st.integers(-2**63, 2**63 - 1)),
                       max_size=4).map(_array)),
    _nullable(st.binary(max_size=8).map(lambda b: "\\x" + b.hex())),
    _nullable(st.sampled_from(["P1Y2M3DT4H5M6.5S", "PT0S", "-P1D"])),
    _nullable(st.lists(st.one_of(st.none(), NO_NUL.filter(lambda t: t.isalnum())),
                       max_size=3).map(lambda items: "{" + ",".join(
                           "NULL" if i is None else f'"{i}"' for i in items) + "}")),
    _nullable(st.uuids().map(str)),
    _nullable(st.integers(0, 2**32 - 1).map(str)),
)


@settings(max_examples=400, deadline=None)
@given(ROWS, st.integers(0, 2**62))
def test_compiled_rows_match_the_slow_path(producer: Any, fields: tuple[str | None, ...],
                                           ordinal: int) -> None:
    fast, slow = _both(producer, list(fields), ordinal)
    assert fast == slow


@pytest.mark.parametrize("fields", [
    ["a\tb\\c\nd", "1", None, None, "0.0000001", "2024-01-01 00:00:01.5+00",
     "2024-01-01 00:00:01", "2024-01-01", "1.5", "0.1", "t", '{"a": 1}', "{1,NULL,-3}",
     "{}", "\\x00ff", "PT1S", '{"x","y"}', "7f2c9a3e-2b1f-4e6a-9d55-0a1b2c3d4e5f", "4294967295"],
    ["", "-9223372036854775808", "-32768", "2147483647", "NaN", "infinity", "infinity",
     "infinity", "-Infinity", "NaN", "f", None, None, None, None, None, None, None, None],
])
def test_edge_rows(producer: Any, fields: list[str | None]) -> None:
    fast, slow = _both(producer, fields, 12)
    assert fast == slow


def test_wrong_column_count_is_an_error(producer: Any) -> None:
    decoder = RowDecoder(TABLE, TypeRegistry().decoder_for)
    plan = loadfast.compile_table(producer, TABLE, decoder, AvroEncoder(), "app", "t", [],
                                  LSN, COMMIT_TIME)
    with pytest.raises(ValueError, match="COPY row has 2 columns"):
        plan.encode(b"a\t1\n", 0, NOW_MS)
    with pytest.raises(ValueError, match="more columns"):
        plan.encode(_line(["a", "1"] + [None] * 17 + ["x"]), 0, NOW_MS)


def test_a_fallback_error_is_raised(producer: Any) -> None:
    """A value the Python path refuses (an int column holding text) fails the same way."""
    with pytest.raises(ValueError):
        _both(producer, ["a", "not a number"] + [None] * 17, 0)


def test_kinds_follow_the_column_types() -> None:
    decoder = RowDecoder(TABLE, TypeRegistry().decoder_for)
    kinds = {c.name: loadfast._kind(c, d[1])  # noqa: SLF001
             for c, d in zip(TABLE.columns, decoder.columns, strict=True)}
    compiled = loadfast._loadfast  # noqa: SLF001
    assert kinds["name"] == kinds["doc"] == compiled.TEXT
    assert kinds["id"] == kinds["o"] == compiled.LONG
    assert kinds["at"] == kinds["local"] == compiled.TIMESTAMP
    assert kinds["items"] == kinds["bigs"] == compiled.INT_ARRAY
    assert kinds["raw"] == kinds["span"] == kinds["tags"] == kinds["u"] == compiled.FALLBACK


def test_timestamps_as_datetime_gives_them() -> None:
    """The rewrite the C code does by hand, checked against datetime once more."""
    value = datetime(2024, 5, 6, 7, 8, 9, 120000, tzinfo=UTC) + timedelta(0)
    text = _pg_timestamp(value, "+00")
    assert datetime.fromisoformat(text).isoformat() == "2024-05-06T07:08:09.120000+00:00"


def test_a_refused_message_is_a_delivery_error() -> None:
    """librdkafka refuses a record over message.max.bytes at once: the load's error is the
    sink's DeliveryError, naming the cause (nothing is skipped)."""
    from sinks.acks import DeliveryError

    small = loadfast._loadfast.Producer(  # noqa: SLF001
        loadfast.librdkafka_path(), [("bootstrap.servers", "127.0.0.1:9"), ("log_level", "0"),
                                     ("message.max.bytes", "1000")])
    try:
        decoder = RowDecoder(TABLE, TypeRegistry().decoder_for)
        plan = loadfast.compile_table(small, TABLE, decoder, AvroEncoder(), "app", "t", [],
                                      LSN, COMMIT_TIME)
        line = _line(["x" * 5000, "1"] + [None] * 17)
        with pytest.raises(DeliveryError, match="refused a message: .*too large"):
            loadfast.FastLoad.rows(plan, iter([line]), 1, 0)
    finally:
        small.close()


def test_a_bad_producer_property_names_it() -> None:
    with pytest.raises(ValueError, match="producer property no.such.property"):
        loadfast._loadfast.Producer(loadfast.librdkafka_path(),  # noqa: SLF001
                                    [("no.such.property", "1")])
