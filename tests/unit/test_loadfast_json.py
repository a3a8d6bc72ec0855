"""The initial load's compiled path writes JSON as the slow path does.

The oracle is the slow path itself: a COPY text line parsed into its fields, built into a
row (loads/chunk_reader.row_builder), made a read event and encoded by the sink's
:class:`~sinks.envelope.JsonEncoder` (``encoder_for``, what ``KafkaSink.write`` calls).
Lines are generated as PostgreSQL prints values with the replication session's settings,
edge values included, under Debezium's default settings, under others (where most
columns take the Python fallback) and in pgcdc's own JSON, with every snapshot mark;
tests/integration/test_loadfast_json.py does the same with lines from a real server.  No
broker: the producer is never asked to send.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decoder.change import READ, ChangeEvent, RowDecoder
from decoder.type_registry import TypeRegistry
from loads.chunk_reader import row_builder
from sinks.debezium_json import JsonOptions, UnrepresentableValueError
from sinks.envelope import JsonEncoder
from sinks.snapshot_marks import MARKS, mark
from snapshot_builder.catalog import Column, TableVersion
from tests.unit.test_loadfast import (
    DATES,
    INTS,
    NO_NUL,
    NUMERIC,
    TIMESTAMP,
    TIMESTAMPTZ,
    _array,
    _line,
    _nullable,
    _pg_float,
)

# The compiled module is optional (setup.py builds it only where a C compiler exists; the
# load then takes the Python path these tests compare against), and it needs the librdkafka
# confluent_kafka ships. `make setup` and CI have both, so there these skips never fire;
# tests/integration/test_loadfast_json.py asserts the compiled path is taken.
loadfast = pytest.importorskip("sinks.loadfast")
if loadfast._loadfast is None:  # noqa: SLF001
    pytest.skip("sinks._loadfast is not built (no C compiler)", allow_module_level=True)
if loadfast.librdkafka_path() is None:
    pytest.skip("librdkafka's library not found", allow_module_level=True)


def _typmod(precision: int, scale: int) -> int:
    return (precision << 16 | scale) + 4


TABLE = TableVersion(43, "shop", "every \"json\" kind", "v7", (
    Column("name", 25, "text", -1, True),
    Column("id", 20, "int8", -1, True),
    Column("small", 21, "int2", -1, False),
    Column("n", 23, "int4", -1, False),
    Column("amount", 1700, "numeric", -1, False),
    Column("price", 1700, "numeric", _typmod(12, 2), False),
    Column("at", 1184, "timestamptz", -1, False),
    Column("at0", 1184, "timestamptz", 0, False),
    Column("at3", 1184, "timestamptz", 3, False),
    Column("local", 1114, "timestamp", -1, False),
    Column("local3", 1114, "timestamp", 3, False),
    Column("day", 1082, "date", -1, False),
    Column("clock", 1083, "time", -1, False),
    Column("clock3", 1083, "time", 3, False),
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
    Column("cash", 790, "money", -1, False),
    Column("ñame \"q\"", 25, "text", -1, False),
    Column("r", 3904, "int4range", -1, False),
    Column("pt", 600, "point", -1, False),
))
LSN, COMMIT_TIME, NOW_MS = 0x16B3748, 785_000_000_123_456, 1_795_000_000_000
OPTIONS = {
    "default": JsonOptions(database="shop"),
    "strings": JsonOptions(decimal="string", time="isostring", interval="string",
                           binary="hex", database="d\u00e9j\u00e0"),
    "connect": JsonOptions(decimal="double", time="connect", binary="base64-url-safe"),
    "pgcdc": JsonOptions(mode="pgcdc", database="shop"),
}


@pytest.fixture(scope="module")
def producer() -> Any:
    made = loadfast._loadfast.Producer(  # noqa: SLF001
        loadfast.librdkafka_path(), [("bootstrap.servers", "127.0.0.1:9"),
                                     ("enable.idempotence", "true"), ("acks", "all"),
                                     ("log_level", "0")])
    yield made
    made.close()


def _plan(producer: Any, options: JsonOptions, snapshot: str = "true",
          table: TableVersion = TABLE) -> tuple[Any, RowDecoder, JsonEncoder]:
    decoder = RowDecoder(table, TypeRegistry().decoder_for)
    encoder = JsonEncoder(options)
    plan = loadfast.compile_json_table(producer, table, decoder, encoder, "app", "t",
                                       [("pgcdc.table_version", b"v")], LSN, COMMIT_TIME,
                                       snapshot)
    return plan, decoder, encoder


def _outcome(work: Any) -> Any:
    """What ``work()`` gives, or the type and message of the error it raises."""
    try:
        return work()
    except (ValueError, TypeError) as exc:
        return type(exc), str(exc)


def _both(producer: Any, fields: list[str | None], ordinal: int, options: JsonOptions,
          snapshot: str = "true", table: TableVersion = TABLE) -> tuple[Any, Any]:
    """The compiled plan's key and value of a line, and the slow path's (or their errors)."""
    assert len(fields) == len(table.columns)
    plan, decoder, encoder = _plan(producer, options, snapshot, table)

    def slow() -> tuple[bytes, bytes]:
        row = row_builder(decoder)(fields)
        event = ChangeEvent(READ, table, None, row, (), LSN, LSN, ordinal, 0, COMMIT_TIME)
        if snapshot != "true":
            event = mark(event, MARKS[snapshot])
        return encoder.encoder_for(table, "app")(event, NOW_MS)

    return _outcome(lambda: plan.encode(_line(fields), ordinal, NOW_MS)), _outcome(slow)


def _time(value: Any) -> str:
    text = value.strftime("%H:%M:%S")
    return text + (f".{value.microsecond:06d}".rstrip("0") if value.microsecond else "")


FIXED = st.one_of(st.decimals(min_value=-10**10, max_value=10**10, places=2,
                              allow_nan=False, allow_infinity=False).map(lambda d: f"{d:f}"),
                  st.sampled_from(["0.00", "-0.00", "9999999999.99", "-0.01", "1.5", "7"]))
ROWS = st.tuples(
    NO_NUL, st.integers(-2**63, 2**63 - 1).map(str),
    _nullable(st.integers(-2**15, 2**15 - 1).map(str)),
    _nullable(st.integers(-2**31, 2**31 - 1).map(str)),
    _nullable(NUMERIC.filter(lambda t: t not in ("NaN", "Infinity", "-Infinity"))),
    _nullable(FIXED),
    _nullable(TIMESTAMPTZ), _nullable(TIMESTAMPTZ), _nullable(TIMESTAMPTZ),
    _nullable(TIMESTAMP), _nullable(TIMESTAMP), _nullable(DATES),
    _nullable(st.one_of(st.times().map(_time), st.just("24:00:00"))),
    _nullable(st.times().map(_time)),
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
    _nullable(st.sampled_from(["$1,234.56", "-$0.01", "$0.00"])),
    _nullable(NO_NUL),
    _nullable(st.sampled_from(["[1,5)", "empty", "(,3]", "[-2147483648,)"])),
    _nullable(st.sampled_from(["(1.5,-2)", "(0,0)", "(1e+300,NaN)", "(-Infinity,-0)"])),
)


@settings(max_examples=300, deadline=None)
@given(ROWS, st.integers(0, 2**62), st.sampled_from(sorted(OPTIONS)),
       st.sampled_from(["true", *sorted(MARKS)]))
def test_compiled_rows_match_the_slow_path(producer: Any, fields: tuple[str | None, ...],
                                           ordinal: int, options: str, snapshot: str) -> None:
    fast, slow = _both(producer, list(fields), ordinal, OPTIONS[options], snapshot)
    assert fast == slow


EDGES = [
    ["a\tb\\c\nd\"\x01\x7f", "1", None, None, "0.0000001", "-0.00", "2024-01-01 00:00:01.5+00",
     "2024-01-01 00:00:00+00:00", "2024-01-01 00:00:01.123456+00", "2024-01-01 00:00:01",
     "1969-12-31 23:59:59.9999", "2024-01-01", "24:00:00", "00:00:00.000001", "1.5", "0.1",
     "t", '{"a": 1}', "{1,NULL,-3}", "{}", "\\x00ff", "PT1S", '{"x","y"}',
     "7f2c9a3e-2b1f-4e6a-9d55-0a1b2c3d4e5f", "4294967295", "$1.00", "\u00e9\u2028", "[1,5)",
     "(1.5,-2)"],
    ["", "-9223372036854775808", "-32768", "2147483647", "1e5", "100", "infinity", "infinity",
     "0044-03-15 12:00:00+00 BC", "infinity", "10000-01-01 00:00:00", "infinity",
     "23:59:59.999999", "12:00:00", "-Infinity", "NaN", "f", "null", "{-0,0}", "{NULL}",
     "\\x", "-P1D", "{}", "7F2C9A3E-2B1F-4E6A-9D55-0A1B2C3D4E5F", "0", None, "", "empty",
     "(1e+300,NaN)"],
    ["x", "0", "0", "0", "-0", "0.5", "2024-02-29 23:59:59+05:30", "0001-01-01 00:00:00+00",
     "9999-12-31 23:59:59.999999+00", "0001-01-01 00:00:00", "1970-01-01 00:00:00.0005",
     "0044-03-15 BC", "00:00:00", "23:59:59.9995", "1e400", "-0", "x", "[]", "{1,+2}",
     "{9223372036854775807,-9223372036854775808}", "\\xDEADbeef", None, None,
     "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}", "7", None, None, "(,3]", "(-Infinity,-0)"],
    ["nul", "5", None, None, "12345678901234567890123456789012345678.5", "0.010", "2024-02-30 "
     "00:00:00+00", None, None, "2024-02-29 12:00:00", None, "2023-02-29", None, None,
     "1.7976931348623157e+308", "1e-45", None, None, None, None, None, None, None, None, None,
     None, None, None, None],
]


@pytest.mark.parametrize("options", sorted(OPTIONS))
@pytest.mark.parametrize("fields", EDGES)
def test_edge_rows(producer: Any, fields: list[str | None], options: str) -> None:
    fast, slow = _both(producer, fields, 12, OPTIONS[options])
    assert fast == slow


def test_a_refused_value_is_the_slow_paths_error(producer: Any) -> None:
    """A numeric the settings cannot write stops the load as it stops the stream, and a
    value the decoder refuses fails as it fails there (same error, same message)."""
    plan, _, _ = _plan(producer, OPTIONS["default"])
    for column, text in ((4, "NaN"), (5, "0.001"), (5, "Infinity"), (20, "\\xZZ")):
        fields: list[str | None] = ["a", "1"] + [None] * 27
        fields[column] = text
        fast, slow = _both(producer, fields, 0, OPTIONS["default"])
        assert fast == slow
        assert fast[0] is (ValueError if column == 20 else UnrepresentableValueError)


def test_kinds_follow_the_column_types_and_settings() -> None:
    decoder = RowDecoder(TABLE, TypeRegistry().decoder_for)
    compiled = loadfast._loadfast  # noqa: SLF001

    def kinds(options: JsonOptions) -> dict[str, int]:
        return {c.name: loadfast._json_kind(c, d[1], options)[0]  # noqa: SLF001
                for c, d in zip(TABLE.columns, decoder.columns, strict=True)}

    default = kinds(OPTIONS["default"])
    assert default["name"] == default["doc"] == compiled.JSON_STRING
    assert default["id"] == default["o"] == default["small"] == compiled.JSON_INTEGER
    assert default["price"] == compiled.JSON_NUMERIC
    assert default["amount"] == compiled.JSON_NUMERIC_VARIABLE
    assert default["at"] == compiled.JSON_TSTZ
    assert default["local"] == compiled.JSON_TS_MICROS
    assert default["local3"] == compiled.JSON_TS_MILLIS
    assert default["clock"] == compiled.JSON_TIME_MICROS
    assert default["clock3"] == compiled.JSON_TIME_MILLIS
    assert default["items"] == default["bigs"] == compiled.JSON_INT_ARRAY
    assert default["raw"] == compiled.JSON_BASE64
    assert default["u"] == compiled.JSON_UUID
    assert default["span"] == default["tags"] == default["cash"] == compiled.JSON_FALLBACK
    strings = kinds(OPTIONS["strings"])
    for name in ("price", "amount", "local", "day", "clock", "raw"):
        assert strings[name] == compiled.JSON_FALLBACK, name
    assert strings["at"] == compiled.JSON_TSTZ  # whatever the mode
    pgcdc = kinds(OPTIONS["pgcdc"])
    assert pgcdc["name"] == pgcdc["doc"] == compiled.JSON_STRING
    assert pgcdc["id"] == pgcdc["o"] == pgcdc["small"] == compiled.JSON_INTEGER
    assert pgcdc["price"] == pgcdc["amount"] == compiled.JSON_TEXT_NUMERIC
    assert pgcdc["at"] == pgcdc["local3"] == compiled.JSON_ISO_TIMESTAMP
    assert pgcdc["day"] == compiled.JSON_ISO_DATE
    assert pgcdc["ratio"] == pgcdc["f4"] == compiled.JSON_FLOAT_BARE
    assert pgcdc["items"] == compiled.JSON_INT_ARRAY
    assert pgcdc["clock"] == pgcdc["raw"] == pgcdc["u"] == compiled.JSON_FALLBACK
    domain = TableVersion(44, "s", "t", "v", (
        Column("id", 90_000, "positive", -1, True, base_type="int4"),))
    for options in OPTIONS.values():
        assert loadfast._json_kind(domain.columns[0], int,  # noqa: SLF001
                                   options) == (compiled.JSON_FALLBACK, 0)


@pytest.mark.parametrize("options", ["default", "pgcdc"])
def test_a_table_without_columns_or_key(producer: Any, options: str) -> None:
    empty = TableVersion(45, "s", "nothing", "v", ())
    keyless = TableVersion(46, "s", "log", "v", (Column("line", 25, "text", -1, False),))
    fast, slow = _both(producer, [], 3, OPTIONS[options], "first", empty)
    assert fast == slow
    assert fast[1].startswith(b'{"before":null,"after":{},')
    fast, slow = _both(producer, ["a\\b"], 3, OPTIONS[options], "last", keyless)
    assert fast == slow
    assert fast[0] == b"{}"


@pytest.mark.parametrize("options", ["default", "pgcdc"])
def test_common_values_are_written_without_python(producer: Any, options: str) -> None:
    """The compiled kinds write these values themselves: with every column's decoder (what
    a fallback calls) made to fail, the plan still writes the slow path's bytes."""
    fields: list[str | None] = [
        "n\u00e4me", "42", "-7", "123456", "3.14159", "-12.50", "2024-02-29 13:14:15.5+00",
        "2024-02-29 13:14:15+00", "2024-02-29 13:14:15.123456+00", "1969-12-31 23:59:59.9995",
        "2024-02-29 13:14:15.123", "2024-02-29", "13:14:15.5", "13:14:15.123", "-1.5e-07",
        "0.1", "t", '{"a": [1, "b"]}', "{1,NULL,3}", "{-9223372036854775808}", "\\x00ff10",
        None, None, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "4294967295", None, "x\ty", None,
        None]
    if options == "pgcdc":  # columns pgcdc's JSON leaves to Python: no value
        for position in (12, 13, 20, 23):  # time, bytea, uuid
            fields[position] = None
    plan, decoder, _ = _plan(producer, OPTIONS[options])
    fast = plan.encode(_line(fields), 5, NOW_MS)
    _, slow = _both(producer, fields, 5, OPTIONS[options])
    assert fast == slow

    def refuse(text: str) -> Any:
        raise AssertionError(text)

    decoder.columns = tuple((name, None if decode is None else refuse)
                            for name, decode, *_ in decoder.columns)
    poisoned = loadfast.compile_json_table(
        producer, TABLE, decoder, JsonEncoder(OPTIONS[options]), "app", "t",
        [("pgcdc.table_version", b"v")], LSN, COMMIT_TIME)
    assert poisoned.encode(_line(fields), 5, NOW_MS) == slow
