"""Typed Avro (``--avro-types logical``, sinks/avro_logical.py): fastavro reads back every
type as its typed Python value, from values the text decoder gives for PostgreSQL's text."""

from __future__ import annotations

import io
import json
import math
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any
from uuid import UUID

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decoder.change import ChangeEvent
from decoder.type_registry import TypeRegistry
from sinks.avro import COMPILED_ENCODER, AvroEncoder, decode_value, key_schema, value_schema
from sinks.avro_logical import AvroTypeError, LogicalTypes, numeric_precision_scale
from snapshot_builder.catalog import Column, TableVersion

ENUM, POINT2, POINT2_ARRAY, MONEY2, FLOATRANGE, FLOATMULTI = \
    90001, 90002, 90003, 90004, 90005, 90006


def _registry() -> TypeRegistry:
    types = TypeRegistry()
    types.register_enum(ENUM, name="public.mood")
    types.register_composite(POINT2, [("x", 23), ("label", 25), ("tags", 1007)],
                             name="public.pt")
    types.register_array(POINT2_ARRAY, POINT2, name="public._pt")
    types.register_domain(MONEY2, 1700, name="public.amount", typmod=(10 << 16 | 2) + 4)
    types.register_range(FLOATRANGE, 701, name="public.floatrange")
    types.register_multirange(FLOATMULTI, 701, name="public.floatmultirange")  # as load_types
    return types


def _numeric(precision: int, scale: int) -> int:
    return (precision << 16 | scale) + 4


COLUMNS = (
    ("id", 23, "int4", -1),
    ("n", 1700, "numeric", _numeric(12, 3)),
    ("n_free", 1700, "numeric", -1),
    ("n_wide", 1700, "numeric", _numeric(50, 2)),
    ("d", 1082, "date", -1),
    ("t", 1083, "time", -1),
    ("ts", 1114, "timestamp", -1),
    ("tstz", 1184, "timestamptz", -1),
    ("u", 2950, "uuid", -1),
    ("j", 3802, "jsonb", -1),
    ("b", 17, "bytea", -1),
    ("f4", 700, "float4", -1),
    ("f8", 701, "float8", -1),
    ("ok", 16, "bool", -1),
    ("big", 20, "int8", -1),
    ("ints", 1007, "_int4", -1),
    ("texts", 1009, "_text", -1),
    ("nums", 1231, "_numeric", _numeric(5, 2)),
    ("mood", ENUM, "public.mood", -1),
    ("pt", POINT2, "public.pt", -1),
    ("pts", POINT2_ARRAY, "public._pt", -1),
    ("r", 3904, "int4range", -1),
    ("tr", 3910, "tstzrange", -1),
    ("fr", FLOATRANGE, "public.floatrange", -1),
    ("mr", 4451, "int4multirange", -1),
    ("fmr", FLOATMULTI, "public.floatmultirange", -1),
    ("amount", MONEY2, "public.amount", -1),
    ("iv", 1186, "interval", -1),
    ("addr", 869, "inet", -1),
    ("txt", 25, "text", -1),
    ("Row", 25, "text", -1),
)
TABLE = TableVersion(42, "public", "many", "d", tuple(
    Column(name, oid, type_name, typmod, name == "id",
           base_type="numeric" if oid == MONEY2 else None,
           base_typmod=_numeric(10, 2) if oid == MONEY2 else -1)
    for name, oid, type_name, typmod in COLUMNS))

# PostgreSQL's text of each value (the replication session's settings), decoded as pgcdc does
TEXTS = {
    "id": "1", "n": "12345.678", "n_free": "3.14159265358979323846264338327950288419716939",
    "n_wide": "-123456789012345678901234567890123456789012345.25",
    "d": "2024-02-29", "t": "13:14:15.123456", "ts": "2024-02-29 13:14:15.123456",
    "tstz": "2024-02-29 13:14:15.123456+00", "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
    "j": '{"a": 1, "b": [1, 2]}', "b": "\\xdeadbeef", "f4": "1.5", "f8": "NaN", "ok": "t",
    "big": "9007199254740993", "ints": "{{1,NULL},{3,4}}", "texts": '{"x","y z",NULL}',
    "nums": "{1.50,NULL,-2.25}", "mood": "happy", "pt": '(7,"a b","{1,2}")',
    "pts": '{"(1,x,{})",NULL,"(2,,{3})"}', "r": "[1,10)", "tr": '["2024-01-01 00:00:00+00",)',
    "fr": "(,2.5]", "mr": "{[1,3),[7,9)}", "fmr": "{[1.5,2),(3,)}", "amount": "-1234.50",
    "iv": "P1Y2M3DT4H5M6.5S", "addr": "192.168.1.10/24", "txt": "héllo",
    "Row": "named like the record",
}


def _row(texts: dict[str, str | None]) -> dict[str, Any]:
    types = _registry()
    return {c.name: None if texts.get(c.name) is None
            else types.decoder_for(c.type_oid)(texts[c.name])  # type: ignore[arg-type]
            for c in TABLE.columns}


def _event(after: dict[str, Any], before: dict[str, Any] | None = None,
           table: TableVersion = TABLE) -> ChangeEvent:
    return ChangeEvent("u" if before else "c", table, before, after, (), 100, 90, 0, 5,
                       1_000_000)


def _encoder() -> tuple[AvroEncoder, LogicalTypes]:
    logical = LogicalTypes(_registry().shape)
    return AvroEncoder(logical=logical), logical


def test_every_type_reads_back_typed() -> None:
    encoder, logical = _encoder()
    row = _row(TEXTS)
    value = decode_value(TABLE, encoder.value(_event(row), server_name="s", now_ms=1), logical)
    after = value["after"]
    assert after["id"] == 1
    assert after["n"] == Decimal("12345.678")
    assert after["n_free"] == "3.14159265358979323846264338327950288419716939"
    assert after["n_wide"] == "-123456789012345678901234567890123456789012345.25"
    assert after["d"] == date(2024, 2, 29)
    assert after["t"] == time(13, 14, 15, 123456)
    assert after["ts"] == datetime(2024, 2, 29, 13, 14, 15, 123456)  # noqa: DTZ001
    assert after["tstz"] == datetime(2024, 2, 29, 13, 14, 15, 123456, tzinfo=UTC)
    assert after["u"] == UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
    assert json.loads(after["j"]) == {"a": 1, "b": [1, 2]}
    assert after["b"] == b"\xde\xad\xbe\xef"
    assert after["f4"] == 1.5 and math.isnan(after["f8"])
    assert after["ok"] is True and after["big"] == 9007199254740993
    assert after["ints"] == [[1, None], [3, 4]]  # a two-dimensional value
    assert after["texts"] == ["x", "y z", None]
    assert after["nums"] == [Decimal("1.50"), None, Decimal("-2.25")]
    assert after["mood"] == "happy"
    assert after["pt"] == {"x": 7, "label": "a b", "tags": [1, 2]}
    assert after["pts"] == [{"x": 1, "label": "x", "tags": []}, None,
                            {"x": 2, "label": None, "tags": [3]}]
    assert after["r"] == {"lower": 1, "upper": 10, "lower_inc": True, "upper_inc": False,
                          "empty": False}
    assert after["tr"] == {"lower": datetime(2024, 1, 1, tzinfo=UTC), "upper": None,
                           "lower_inc": True, "upper_inc": False, "empty": False}
    assert after["fr"] == {"lower": None, "upper": 2.5, "lower_inc": False, "upper_inc": True,
                           "empty": False}
    assert [(r["lower"], r["upper"]) for r in after["mr"]] == [(1, 3), (7, 9)]
    assert [(r["lower"], r["upper"], r["lower_inc"]) for r in after["fmr"]] == \
        [(1.5, 2.0, True), (3.0, None, False)]
    assert after["amount"] == Decimal("-1234.50")  # the domain's numeric(10,2)
    assert after["iv"] == "P1Y2M3DT4H5M6.5S" and after["addr"] == "192.168.1.10/24"
    assert after["txt"] == "héllo" and after["Row"] == "named like the record"
    assert value["op"] == "c" and value["before"] is None
    assert value["source"]["table_version"] == TABLE.version


def test_nulls_everywhere() -> None:
    encoder, logical = _encoder()
    row = _row({"id": "2"})
    value = decode_value(TABLE, encoder.value(_event(row, row), server_name="s", now_ms=1),
                         logical)
    assert value["after"] == {**dict.fromkeys(TEXTS), "id": 2}
    assert value["before"] == value["after"]


def test_the_schema_says_each_type() -> None:
    _, logical = _encoder()
    fields = {f["name"]: f["type"] for f in value_schema(TABLE, logical)["fields"][0]["type"][1]
              ["fields"]}
    assert fields["n"][1] == {"type": "bytes", "logicalType": "decimal", "precision": 12,
                              "scale": 3}
    assert fields["n"][2] == {"type": "string", "pgcdc.type": "numeric"}  # NaN's branch
    assert fields["n_free"] == ["null", {"type": "string", "pgcdc.type": "numeric"}]
    assert fields["d"][1]["logicalType"] == "date"
    assert fields["ts"][1]["logicalType"] == "local-timestamp-micros"
    assert fields["tstz"][1]["logicalType"] == "timestamp-micros"
    assert fields["u"][1]["logicalType"] == "uuid"
    assert fields["j"][1]["connect.name"] == "io.debezium.data.Json"
    assert fields["mood"][1] == {"type": "string", "pgcdc.type": "public.mood"}
    assert fields["pt"][1]["type"] == "record" and fields["pt"][1]["pgcdc.type"] == "public.pt"
    assert fields["Row"] == ["null", "string"]  # a column named Row: its own field, no clash
    assert fields["fmr"][1]["type"] == "array" and \
        fields["fmr"][1]["items"]["pgcdc.type"] == "range"
    assert fields["mr"][1]["items"]["pgcdc.type"] == "int4range"
    schema = key_schema(TABLE, logical)
    assert [f["name"] for f in schema["fields"]] == ["id"]


def test_numeric_nan_is_never_null() -> None:
    encoder, logical = _encoder()
    row = _row({"id": "3", "n": "NaN", "nums": "{NaN,1.00}", "amount": "NaN",
                "n_free": "-Infinity"})
    after = decode_value(TABLE, encoder.value(_event(row), server_name="s", now_ms=1),
                         logical)["after"]
    assert after["n"] == "NaN" and after["amount"] == "NaN"
    assert after["nums"] == ["NaN", Decimal("1.00")]
    assert after["n_free"] == "-Infinity"


def test_dates_and_timestamps_python_cannot_hold() -> None:
    """infinity, BC and years past 9999 (kept as text by the decoder) as their numbers:
    read with the logical types left out, as a reader that cannot hold them sees them."""
    table = TableVersion(43, "public", "edges", "d", (
        Column("id", 23, "int4", -1, True), Column("d", 1082, "date", -1, False),
        Column("ts", 1114, "timestamp", -1, False),
        Column("tstz", 1184, "timestamptz", -1, False), Column("t", 1083, "time", -1, False)))
    logical = LogicalTypes()
    encoder = AvroEncoder(logical=logical)
    plain = json.loads(json.dumps(value_schema(table, logical)).replace('"logicalType"',
                                                                        '"was"'))
    cases = [
        ({"d": "infinity", "ts": "infinity", "tstz": "-infinity", "t": "24:00:00"},
         {"d": 2**31 - 1, "ts": 2**63 - 1, "tstz": -(2**63), "t": 86_400_000_000}),
        # 0001-01-01 BC is the astronomical year 0; 1 AD day 0 is -719162 days from 1970
        ({"d": "0001-12-31 BC", "ts": "0044-03-15 12:00:00 BC",
          "tstz": "0001-01-01 00:00:00+00 BC"},
         {"d": -719163, "ts": _days(-43, 3, 15) * 86_400_000_000 + 12 * 3_600_000_000,
          "tstz": _days(0, 1, 1) * 86_400_000_000}),
        ({"d": "10000-01-01", "ts": "294247-01-10 04:00:54.775807",
          "tstz": "12345-06-07 08:09:10.5+00"},
         {"d": _days(10000, 1, 1), "ts": 2**63 - 1,
          "tstz": _days(12345, 6, 7) * 86_400_000_000 + 29_350_500_000}),
    ]
    types = TypeRegistry()
    for texts, numbers in cases:
        row = {c.name: types.decoder_for(c.type_oid)(texts[c.name]) if c.name in texts
               else 1 if c.name == "id" else None for c in table.columns}
        raw = encoder.value(_event(row, table=table), server_name="s", now_ms=1)
        after = fastavro.schemaless_reader(io.BytesIO(raw), fastavro.parse_schema(plain), None)
        assert isinstance(after, dict)
        assert {k: after["after"][k] for k in numbers} == numbers
    beyond = {"id": 1, "ts": types.decoder_for(1114)("294276-12-31 23:59:59")}
    with pytest.raises(AvroTypeError, match="beyond Avro's timestamp-micros"):
        encoder.value(_event(beyond, table=table), server_name="s", now_ms=1)


def _days(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date, astronomical years, by Python
    where it can (years 1-9999) and by whole 400-year cycles of 146,097 days elsewhere."""
    cycles, year = divmod(year - 1, 400)
    return cycles * 146_097 + date(year + 1, month, day).toordinal() - 719_163


def test_altered_column_type_gives_a_new_schema() -> None:
    _, logical = _encoder()
    before = TableVersion(44, "public", "t", "d", (Column("id", 23, "int4", -1, True),
                                                    Column("v", 23, "int4", -1, False)))
    after = TableVersion(44, "public", "t", "d", (Column("id", 23, "int4", -1, True),
                                                   Column("v", 1700, "numeric",
                                                          _numeric(8, 2), False)))
    assert before.version != after.version
    old, new = value_schema(before, logical), value_schema(after, logical)
    assert old != new
    encoder = AvroEncoder(logical=logical)
    raw = encoder.value(_event({"id": 1, "v": Decimal("1.25")}, table=after), server_name="s",
                        now_ms=1)
    assert decode_value(after, raw, logical)["after"]["v"] == Decimal("1.25")
    assert json.loads(encoder.schemas(after)["value_schema"]) == new
    assert encoder.schemas(after)["avro_types"] == "logical"
    assert "avro_types" not in AvroEncoder().schemas(after)  # text mode's records unchanged


def test_a_composite_altered_under_a_version_is_refused() -> None:
    encoder, _ = _encoder()
    row = _row(TEXTS)
    row["pt"] = {"x": 1, "label": "a", "tags": [], "added": True}  # ALTER TYPE ADD ATTRIBUTE
    with pytest.raises(AvroTypeError, match=r"column pt of public\.many: .* --avro-types text"):
        encoder.value(_event(row), server_name="s", now_ms=1)


def test_numeric_typmods() -> None:
    assert numeric_precision_scale(_numeric(12, 3)) == (12, 3)
    assert numeric_precision_scale(-1) is None
    assert numeric_precision_scale(_numeric(39, 0)) is None
    assert numeric_precision_scale(_numeric(5, 0x7FE)) is None  # numeric(5,-2): PostgreSQL 15
    assert numeric_precision_scale(_numeric(2, 4)) is None  # a scale above the precision


@pytest.mark.skipif(not COMPILED_ENCODER, reason="an optional compiled path: not built")
def test_the_compiled_encoder_gives_the_same_bytes() -> None:
    """sinks/_fastavro.c writes typed Avro's primitive columns and calls the Python writers
    of the others: the bytes of the Python encoder, keys included, for every type."""
    logical = LogicalTypes(_registry().shape)
    compiled, python = AvroEncoder(logical=logical, compiled=True), \
        AvroEncoder(logical=logical, compiled=False)
    rows = [_row(TEXTS), _row({"id": "2"}), _row({"id": "3", "n": "NaN", "f8": "-Infinity",
                                                  "ints": "{}", "b": "\\x"})]
    for before, after in [(None, rows[0]), (rows[0], rows[1]), (rows[1], rows[2])]:
        event = _event(after, before)
        assert compiled.encode(event, server_name="s", now_ms=7) == \
            python.encode(event, server_name="s", now_ms=7)
    row = _row(TEXTS)
    row["pt"] = {"x": 1}
    with pytest.raises(AvroTypeError, match="composite type public.pt"):
        compiled.encode(_event(row), server_name="s", now_ms=7)


def test_the_spark_job_refuses_an_unknown_logical_type_before_applying_it() -> None:
    """pgcdc spark applies every typed Avro column pgcdc run writes; a logical type it does
    not know (a writer schema from another producer) stops the job with the cause and the
    fix.  The catalog record says which mode a version's schema uses."""
    from core.wire import catalog_topic
    from streaming.apply import CatalogMismatchError, parse_envelopes
    from streaming.catalog import CatalogLog
    from streaming.schema import TableSpec
    from streaming.typed_avro import refusal

    _, logical = _encoder()
    schemas = AvroEncoder(logical=logical).schemas(TABLE)
    known = TableSpec.from_dict(dict(TABLE.to_dict(), value_format="avro", **schemas))
    assert known.avro_types == "logical" and refusal(known) is None
    schemas["value_schema"] = schemas["value_schema"].replace(
        '"logicalType":"date"', '"logicalType":"x-unknown"')
    record = dict(TABLE.to_dict(), lsn=1, topic=catalog_topic("p"), value_format="avro",
                  **schemas)
    spec = TableSpec.from_dict(json.loads(json.dumps(record)))
    assert spec.avro_types == "logical"
    text = TableSpec.from_dict(dict(TABLE.to_dict(), **AvroEncoder().schemas(TABLE)))
    assert text.avro_types == "text"
    with pytest.raises(CatalogMismatchError, match=r"public\.many .* --avro-types text"):
        parse_envelopes(None, CatalogLog([spec]), rows=object(),
                        versions=[("avro", TABLE.version)])


def test_the_setting() -> None:
    """``--avro-types`` (sink.avro_types, PGCDC_AVRO_TYPES): text by default; logical goes
    with format avro only."""
    from pgcdc import cli
    from pgcdc.config import load_settings

    def settings(*argv: str, environ: dict[str, str] | None = None) -> Any:
        flags = vars(cli._parser().parse_args(["run", "--dsn", "host=db", *argv]))
        return load_settings(flags, environ=environ or {})

    assert settings().sink.avro_types == "text"
    assert settings("--avro-types", "logical").sink.avro_types == "logical"
    assert settings(environ={"PGCDC_AVRO_TYPES": "logical"}).sink.avro_types == "logical"
    with pytest.raises(Exception, match=r"sink\.avro_types.*goes with format avro"):  # noqa: B017
        settings("--avro-types", "logical", "--format", "json")


_TYPED = TableVersion(45, "public", "typed", "d", (
    Column("id", 23, "int4", -1, True),
    Column("n18", 1700, "numeric", _numeric(18, 4), False),
    Column("n38", 1700, "numeric", _numeric(38, 10), False),
    Column("n5", 1700, "numeric", _numeric(5, 0), False),
    Column("d", 1082, "date", -1, False), Column("ts", 1114, "timestamp", -1, False),
    Column("tstz", 1184, "timestamptz", -1, False), Column("t", 1083, "time", -1, False),
    Column("i4", 1007, "_int4", -1, False), Column("i8", 1016, "_int8", -1, False)))


def _decimals(precision: int, scale: int) -> st.SearchStrategy[Decimal]:
    bound = Decimal(10) ** (precision - scale) - Decimal(1).scaleb(-scale)
    limit = Decimal(10) ** (precision - scale)
    return st.decimals(min_value=-bound, max_value=bound, places=scale, allow_nan=False) \
        .filter(lambda value: abs(value) < limit) | st.just(Decimal("NaN"))


_ZONES = st.sampled_from([UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-9))])
# a timestamptz whose instant Python can hold in UTC, as the decoder gives it (a wall time of
# 0001-01-01 00:00 at +02 is 0000-12-31 in UTC: the decoder spells such a value as text, and
# fastavro cannot read it back as a datetime)
# (hypothesis takes the bounds as naive wall times)
_ZONED = st.datetimes(min_value=datetime(1, 1, 2),  # noqa: DTZ001
                      max_value=datetime(9999, 12, 30),  # noqa: DTZ001
                      timezones=_ZONES)
_INTS = st.lists(st.none() | st.integers(-(2**31), 2**31 - 1), max_size=5)


@pytest.mark.skipif(not COMPILED_ENCODER, reason="an optional compiled path: not built")
@settings(max_examples=300, deadline=None)
@given(n18=st.none() | _decimals(18, 4), n38=st.none() | _decimals(38, 10),
       n5=st.none() | _decimals(5, 0), d=st.none() | st.dates(),
       ts=st.none() | st.datetimes(), tstz=st.none() | _ZONED,
       t=st.none() | st.times(), i4=st.none() | _INTS | st.lists(_INTS, max_size=3),
       i8=st.none() | st.lists(st.none() | st.integers(-(2**63), 2**63 - 1), max_size=5))
def test_compiled_typed_values_are_the_python_bytes(**row: Any) -> None:
    """sinks/_fastavro.c's typed kinds (decimals up to 18 digits, dates, timestamps, times,
    arrays of integers) give the Python writers' bytes, and leave them what they do not
    take (NaN, 19 digits and more, a zone other than UTC, nested arrays)."""
    logical = LogicalTypes()
    compiled, python = AvroEncoder(logical=logical, compiled=True), \
        AvroEncoder(logical=logical, compiled=False)
    event = _event({"id": 1, **row}, table=_TYPED)
    raw = compiled.encode(event, server_name="s", now_ms=7)
    assert raw == python.encode(event, server_name="s", now_ms=7)
    after = decode_value(_TYPED, raw[1], logical)["after"]
    for name in ("n18", "n38", "n5"):
        value = row[name]
        assert after[name] == (None if value is None else "NaN" if value.is_nan() else value)
    assert (after["d"], after["ts"], after["t"]) == (row["d"], row["ts"], row["t"])
    assert after["tstz"] == row["tstz"] and after["i4"] == row["i4"] and \
        after["i8"] == row["i8"]
