"""Debezium's JSON encodings (sinks/debezium_json.py), each converter on its own and the
whole envelope against Debezium 3.6.1's recorded records (tests/golden/debezium-3.6.1, a
copy of ../shared/reference)."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from decoder.change import ChangeEvent
from decoder.text_parsers import decoder_for
from decoder.values import Interval
from sinks import debezium_json as dz
from sinks.debezium_json import JsonOptions, UnrepresentableValueError
from sinks.envelope import JsonEncoder, _dumps, encode_value, envelope
from snapshot_builder.catalog import Column, TableVersion

REFERENCE = Path(__file__).resolve().parents[1] / "golden" / "debezium-3.6.1"
# (name, type OID, typmod, the server's text of the inserted value in pgcdc's session)
_ENUM_OID = 99_999
COLUMNS = (
    ("id", 23, -1, "1"), ("c_int2", 21, -1, "-32768"), ("c_int4", 23, -1, "2147483647"),
    ("c_int8", 20, -1, "9007199254740993"), ("c_numeric", 1700, (12 << 16 | 3) + 4, "12345.678"),
    ("c_numeric_free", 1700, -1, "3.14159265358979323846"), ("c_float4", 700, -1, "1.5"),
    ("c_float8", 701, -1, "2.718281828459045"), ("c_text", 25, -1, 'héllo "q"'),
    ("c_varchar", 1043, 24, "v"), ("c_bytea", 17, -1, "\\xdeadbeef"), ("c_bool", 16, -1, "t"),
    ("c_date", 1082, -1, "2024-02-29"), ("c_time", 1083, -1, "13:14:15.123456"),
    ("c_timetz", 1266, -1, "13:14:15.5+02"),
    ("c_timestamp", 1114, -1, "2024-02-29 13:14:15.123456"),
    ("c_timestamptz", 1184, -1, "2024-02-29 13:14:15.123456+00"),
    ("c_interval", 1186, -1, "P1Y2M3DT4H5M6.789S"),
    ("c_uuid", 2950, -1, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    ("c_json", 114, -1, '{"a": 1, "b": [1, 2]}'), ("c_jsonb", 3802, -1, '{"a": 1, "b": [1, 2]}'),
    ("c_int_array", 1007, -1, "{1,2,NULL}"), ("c_text_array", 1009, -1, '{x,"y z"}'),
    ("c_enum", _ENUM_OID, -1, "green"), ("c_inet", 869, -1, "192.168.1.10/24"),
    ("c_money", 790, -1, "$1,234.56"),
)
TABLE = TableVersion(oid=16_400, schema="env", name="t", replica_identity="d", columns=tuple(
    Column(name, oid, "color" if oid == _ENUM_OID else "x", typmod, name == "id")
    for name, oid, typmod, _ in COLUMNS))
ROW = {name: decoder_for(oid)(text) for name, oid, _, text in COLUMNS}
SETTINGS = {
    "defaults.json": JsonOptions(database="postgres"),
    "decimal-interval-string.json": JsonOptions(decimal="string", interval="string",
                                                database="postgres"),
    "string-modes-isostring.json": JsonOptions(decimal="string", interval="string",
                                               time="isostring", database="postgres"),
}
# what varies from run to run or names the producer (the reference's README)
VARYING = {"ts_ms", "ts_us", "ts_ns", "txId", "lsn", "sequence", "name", "version", "connector"}


def _naive(*fields: int) -> datetime:
    return datetime(*fields, tzinfo=UTC).replace(tzinfo=None)  # type: ignore[misc]


def _events() -> list[ChangeEvent]:
    updated = dict(ROW, c_text="changed", c_int4=7, c_numeric=Decimal("-0.500"))
    key_only = {name: (1 if name == "id" else None) for name, *_ in COLUMNS}
    return [ChangeEvent("c", TABLE, None, ROW, (), 100, 90, 0, 725, 1),
            ChangeEvent("u", TABLE, None, updated, (), 200, 190, 0, 726, 2),
            ChangeEvent("d", TABLE, key_only, None, (), 300, 290, 0, 727, 3)]


def comparable(value: dict[str, Any]) -> dict[str, Any]:
    """``before``, ``after``, ``op`` and ``source`` without what varies or pgcdc adds."""
    source = {k: v for k, v in value["source"].items() if k not in VARYING}
    for extra in ("commit_lsn", "ordinal", "table_oid", "table_version"):
        source.pop(extra, None)
    return {"before": value["before"], "after": value["after"], "op": value["op"],
            "source": source}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_envelope_matches_debezium_record(name: str) -> None:
    recorded = json.loads((REFERENCE / name).read_text())
    encoder = JsonEncoder(SETTINGS[name])
    changes = [r for r in recorded if r["value"] is not None]
    assert len(changes) == len(_events()) == 3
    for event, record in zip(_events(), changes, strict=True):
        key, value = encoder.encode(event, server_name="envd", now_ms=5)
        assert json.loads(key) == record["key"]
        got = json.loads(value)
        assert comparable(got) == comparable(record["value"])
        # every field Debezium writes is there (values of the varying ones aside)
        assert set(record["value"]) <= set(got)
        assert set(record["value"]["source"]) - {"version", "connector"} <= set(got["source"])
        # the text fast path and the dict agree
        assert got == json.loads(_dumps(envelope(event, server_name="envd", now_ms=5,
                                                     options=SETTINGS[name])))


def test_key_and_source_fields() -> None:
    event = _events()[0]
    got = json.loads(encode_value(event, server_name="s", now_ms=7,
                                  options=JsonOptions(database="app")))
    source = got["source"]
    assert (source["db"], source["snapshot"], source["txId"], source["lsn"]) == (
        "app", "false", 725, 90)
    assert json.loads(source["sequence"]) == ["100", "90"]
    assert (got["ts_ms"], got["ts_us"], got["ts_ns"]) == (7, 7000, 7_000_000)
    assert got["transaction"] is None
    read = event._replace(op="r", xid=0)
    source = json.loads(encode_value(read, server_name="s", now_ms=7,
                                     options=JsonOptions(database="app")))["source"]
    assert (source["snapshot"], source["txId"]) == ("true", None)
    pgcdc = json.loads(encode_value(event, server_name="s", now_ms=7,
                                    options=JsonOptions(mode="pgcdc", database="app")))
    assert pgcdc["source"]["db"] == "app"
    assert pgcdc["after"]["c_date"] == "2024-02-29"


def test_headers_tell_the_encodings_apart() -> None:
    assert JsonEncoder().format == "json"  # pgcdc's own: what the Spark job reads
    assert JsonEncoder(JsonOptions()).format == "debezium-json"


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown decimal handling mode 'exact'"):
        JsonOptions(decimal="exact")  # type: ignore[arg-type]


def test_unchanged_toast_and_missing_columns() -> None:
    row = {name: value for name, value in ROW.items() if name not in ("c_text", "c_bytea",
                                                                     "c_text_array")}
    event = ChangeEvent("u", TABLE, None, row, ("c_text", "c_bytea", "c_text_array"), 1, 1, 0,
                        1, 1)
    after = json.loads(encode_value(event, server_name="s", now_ms=0,
                                    options=JsonOptions()))["after"]
    assert after["c_text"] == dz.PLACEHOLDER
    assert after["c_text_array"] == [dz.PLACEHOLDER]
    assert after["c_bytea"] == "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="
    assert list(after) == [name for name, *_ in COLUMNS]


# ---- each converter -------------------------------------------------------------------------

@pytest.mark.parametrize(("unscaled", "text"), [
    (12345678, "ALxhTg=="), (-500, "/gw="), (0, "AA=="), (127, "fw=="), (128, "AIA="),
    (-128, "gA=="), (-129, "/38="), (123456, "AeJA")])
def test_twos_complement(unscaled: int, text: str) -> None:
    assert dz.twos_complement_b64(unscaled) == text


def test_numeric_modes() -> None:
    fixed = (12 << 16 | 3) + 4
    assert dz.numeric_converter(fixed, "precise")(Decimal("-0.5")) == "/gw="
    assert dz.numeric_converter(fixed, "string")(Decimal("-0.5")) == "-0.500"
    assert dz.numeric_converter(fixed, "double")(Decimal("-0.5")) == -0.5
    assert dz.numeric_converter(-1, "string")(Decimal("1.50")) == "1.50"
    assert dz.numeric_converter(-1, "string")(Decimal("NaN")) == "NAN"
    assert dz.numeric_converter(-1, "string")(Decimal("-Infinity")) == "NEGATIVE_INFINITY"
    assert dz.numeric_converter(-1, "double")(Decimal("Infinity")) == "Infinity"
    assert dz.variable_scale(Decimal("3.14159265358979323846")) == {
        "scale": 20, "value": "EQfV61tbpNfG"}
    assert dz.variable_scale(Decimal("1.500")) == {"scale": 1, "value": "Dw=="}
    assert dz.variable_scale(Decimal("1E+2")) == {"scale": 0, "value": "ZA=="}
    assert dz.variable_scale(Decimal("0.000")) == {"scale": 0, "value": "AA=="}
    # more digits than a decimal context holds, exactly
    big = Decimal("1234567890123456789012345678901234567890.5")
    assert dz.variable_scale(big)["scale"] == 1
    with pytest.raises(UnrepresentableValueError, match="--decimal-handling-mode string"):
        dz.numeric_converter(fixed, "precise")(Decimal("NaN"))
    with pytest.raises(UnrepresentableValueError, match="string"):
        dz.variable_scale(Decimal("Infinity"))


def test_money_modes() -> None:
    assert dz.money_converter("precise")(Decimal("1234.56")) == "AeJA"
    assert dz.money_converter("precise")(Decimal("-0.005")) == dz.twos_complement_b64(-1)
    assert dz.money_converter("string")(Decimal("-1234.5")) == "-1234.5"
    assert dz.money_converter("double")(Decimal("1234.56")) == 1234.56


def test_floats() -> None:
    assert dz.float_value(1.5) == 1.5
    assert [dz.float_value(v) for v in (float("nan"), float("inf"), float("-inf"))] == [
        "NaN", "Infinity", "-Infinity"]


def test_dates_and_times() -> None:
    assert dz.epoch_days(date(2024, 2, 29)) == 19782
    assert dz.epoch_days(date(1969, 12, 31)) == -1
    assert dz.micro_time(time(13, 14, 15, 123456)) == 47655123456
    assert dz.micro_time("24:00:00") == 86_400_000_000
    assert dz.milli_time(time(13, 14, 15, 123999)) == 47655123
    assert dz.epoch_micros(_naive(2024, 2, 29, 13, 14, 15, 123456)) == 1709212455123456
    assert dz.epoch_micros(_naive(1969, 12, 31, 23, 59, 59, 999999)) == -1
    assert dz.epoch_millis(_naive(1969, 12, 31, 23, 59, 59, 999999)) == -1
    assert dz.iso_date(date(2024, 2, 29)) == "2024-02-29Z"
    assert dz.iso_time(time(13, 14, 15)) == "13:14:15Z"
    assert dz.iso_time(time(13, 14, 15, 500000)) == "13:14:15.5Z"
    assert dz.iso_timestamp(_naive(2024, 2, 29, 13, 14, 15, 120)) == \
        "2024-02-29T13:14:15.00012Z"
    assert dz.iso_date("infinity") == "infinity"


def test_zoned() -> None:
    six = dz.zoned_timestamp_converter(-1)
    plus2 = timezone(timedelta(hours=2))
    assert six(datetime(2024, 2, 29, 13, 14, 15, 500000, tzinfo=plus2)) == \
        "2024-02-29T11:14:15.500000Z"
    assert six(datetime(2024, 2, 29, 13, 14, 15, tzinfo=UTC)) == "2024-02-29T13:14:15.000000Z"
    assert dz.zoned_timestamp_converter(3)(datetime(2024, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)) \
        == "2024-01-01T00:00:00.123Z"
    zero = dz.zoned_timestamp_converter(0)
    assert zero(datetime(2024, 1, 1, tzinfo=UTC)) == "2024-01-01T00:00:00Z"
    # an instant whose UTC date Python cannot hold: PostgreSQL's text in UTC (CI once failed
    # with OverflowError on the first)
    assert six(datetime(1, 1, 1, tzinfo=plus2)) == "0001-12-31 22:00:00+00 BC"
    assert six(datetime(9999, 12, 31, 23, 0, 0, 5, tzinfo=timezone(-timedelta(hours=2)))) \
        == "10000-01-01 01:00:00.000005+00"
    assert dz.zoned_time(time(13, 14, 15, 500000, tzinfo=plus2)) == "11:14:15.5Z"
    assert dz.zoned_time(time(1, 0, tzinfo=plus2)) == "23:00:00Z"
    assert dz.zoned_time(time(23, 30, tzinfo=timezone(-timedelta(hours=1)))) == "00:30:00Z"


def test_intervals() -> None:
    value = Interval(14, 3, ((4 * 60 + 5) * 60 + 6) * 1_000_000 + 789_000)
    assert dz.interval_micros(value) == 37091106789000
    assert dz.interval_string(value) == "P1Y2M3DT4H5M6.789S"
    assert dz.interval_string(Interval(0, 0, 0)) == "P0Y0M0DT0H0M0S"
    assert dz.interval_string(Interval(-13, -1, -1_500_000)) == "P-1Y-1M-1DT0H0M-1.5S"
    assert dz.interval_string(Interval(0, 0, 1)) == "P0Y0M0DT0H0M0.000001S"
    assert dz.interval_micros(Interval(0, 1, -3_600_000_000)) == 82_800_000_000
    assert dz.interval_micros(Interval(1, 0, 0)) == 2_629_800_000_000


def test_binary_modes() -> None:
    data = b"\xde\xad\xbe\xef\xfb\xff"
    assert dz.binary_converter("bytes")(data) == "3q2+7/v/"
    assert dz.binary_converter("base64")(data) == "3q2+7/v/"
    assert dz.binary_converter("base64-url-safe")(data) == "3q2-7_v_"
    assert dz.binary_converter("base64-url-safe")(b"\xff") == "_w=="
    assert dz.binary_converter("hex")(data) == "deadbeeffbff"


def test_arrays_convert_element_by_element() -> None:
    convert = dz.type_converter(1182, -1, JsonOptions())  # date[]
    assert convert is not None
    assert convert([[date(1970, 1, 2), None], [None, date(1970, 1, 1)]]) == [[1, None], [None, 0]]
    assert dz.type_converter(1007, -1, JsonOptions()) is None  # int4[]: as it is


def test_time_precision_modes() -> None:
    def kind(oid: int, typmod: int, mode: str) -> Any:
        convert = dz.type_converter(oid, typmod, JsonOptions(time=mode))  # type: ignore[arg-type]
        return convert(time(0, 0, 1, 2000) if oid == 1083 else _naive(1970, 1, 1, 0, 0, 1, 2000))
    assert kind(1083, -1, "adaptive") == 1_002_000
    assert kind(1083, 3, "adaptive") == 1002
    assert kind(1083, 3, "adaptive_time_microseconds") == 1_002_000
    assert kind(1083, -1, "connect") == 1002
    assert kind(1114, 3, "adaptive") == 1002
    assert kind(1114, 3, "adaptive_time_microseconds") == 1002
    assert kind(1114, -1, "adaptive") == 1_002_000
    assert kind(1114, -1, "connect") == 1002
    assert kind(1114, -1, "isostring") == "1970-01-01T00:00:01.002Z"


def test_cli_options_and_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from core.errors import ConfigError
    from pgcdc.cli import _parser
    from pgcdc.config import load_settings

    args = _parser().parse_args(["run", "--dsn", "host=db dbname=app", "--format", "json",
                                 "--decimal-handling-mode", "string",
                                 "--time-precision-mode", "connect",
                                 "--interval-handling-mode", "string",
                                 "--binary-handling-mode", "base64-url-safe"])
    settings = load_settings(vars(args))
    assert settings.sink.json_options(settings.source.database()) == JsonOptions(
        decimal="string", time="connect", interval="string", binary="base64-url-safe",
        database="app")
    defaults = load_settings(vars(_parser().parse_args(["run", "--dsn", "dbname=x"])))
    assert defaults.sink.json_options("x") == JsonOptions(database="x")
    config = tmp_path / "pgcdc.toml"
    config.write_text('[source]\ndsn = "dbname=app"\n[sink]\nformat = "json"\n'
                      'json_mode = "pgcdc"\nbinary_handling_mode = "hex"\n')
    with pytest.raises(ConfigError, match="sink.binary_handling_mode.*json_mode pgcdc"):
        load_settings({}, config_file=config)
    monkeypatch.setenv("PGCDC_BINARY_HANDLING_MODE", "bytes")
    assert load_settings({}, config_file=config).sink.json_options("app").mode == "pgcdc"


def test_the_spark_job_refuses_debezium_s_encoding_with_the_fix() -> None:
    from streaming.apply import CatalogMismatchError, parse_envelopes

    with pytest.raises(CatalogMismatchError, match=r"--json-mode pgcdc.*--format avro"):
        parse_envelopes(None, None, rows=object(),  # type: ignore[arg-type]
                        versions=[("json", None), ("debezium-json", None)])


def test_point_as_debezium_s() -> None:
    from decoder.values import Point

    convert = dz.type_converter(600, -1, JsonOptions())
    assert convert is not None
    # WKB: byte order 1, type 1 (little-endian), x, y as little-endian doubles
    assert convert(Point(1.0, 2.5)) == {"x": 1.0, "y": 2.5,
                                        "wkb": "AQEAAAAAAAAAAADwPwAAAAAAAARA", "srid": None}
    assert dz.type_converter(1017, -1, JsonOptions()) is None  # point[]: as pgcdc writes it
