"""Every type of the decoder's round-trip test, source -> Kafka -> Spark -> Delta, compared
value by value with a SELECT from PostgreSQL.

One table holds a column per case of tests/integration/test_values_roundtrip.py (scalars,
ranges and multiranges, arrays) plus an enum, a domain, a composite and arrays of them;
row ``i`` holds each case's ``i``-th literal (NULL where a case has fewer).  The rows are
captured by the pipeline into Kafka (Avro, and JSON), applied by the Spark job in one
micro-batch, and each lake value is compared with what PostgreSQL returns for it, through
the lake representation of its type (streaming/schema.py, docs in its module docstring):

* ``bool``, integers, ``oid``: Spark boolean / smallint / int / bigint, equal text;
* ``float4``/``float8``: float / double, equal numbers (NaN and infinities included);
* ``numeric(p,s)`` (p <= 38): decimal(p,s), equal text; any other ``numeric`` and
  ``money``: a string holding the exact decimal (equal as decimals, ``NaN`` and
  infinities spelled);
* ``bytea``: binary, equal bytes;
* ``date``: date, the same day (``infinity`` -> Spark's greatest date, ``-infinity`` ->
  its least); ``timestamp``/``timestamptz``: timestamp_ntz / timestamp, the same
  microsecond since the epoch (UTC), infinities as for date, a value past Spark's
  greatest timestamp (+294247-01-10, PostgreSQL allows 294276) NULL;
* ``interval``: the ISO 8601 string, equal to PostgreSQL's with ``intervalstyle =
  iso_8601``; ``time``/``timetz``: the same time of day (and offset); ``pg_lsn``: the
  position as a number;
* ranges and multiranges: JSON ``{lower, upper, lower_inc, upper_inc, empty}`` (a list of
  those), equal bounds and flags to ``lower()``/``upper()``/... of the value;
* geometric types: JSON of their fields, equal to the server's text;
* composites: JSON of their fields, equal to ``to_jsonb(v)``;
* arrays: JSON lists, equal element by element to ``to_jsonb(v)`` (arrays of types
  whose element JSON differs from ``to_jsonb``: each element through its own rule);
* everything else (text types, uuid, json/jsonb, xml, bit strings, MAC addresses, text
  search types, inet/cidr, enum labels, domains): a string equal to PostgreSQL's text.
"""

from __future__ import annotations

import base64
import json
import math
import re
import struct
from datetime import UTC, datetime
from decimal import Decimal
from ipaddress import ip_interface, ip_network
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from core.wire import table_topic_pattern
from decoder.slot import current_wal_lsn
from loads.published import fetch_published_tables
from pgcdc.clone import compare
from pgcdc.pipeline import Pipeline, PipelineConfig
from sinks.kafka import KafkaSink
from streaming import job
from streaming.apply import apply_batch
from streaming.evolution import quote
from streaming.schema import TEXT, ColumnSpec, TableSpec
from tests.integration.test_values_roundtrip import ARRAYS, RANGES, SCALARS
from tests.recording_sink import NoSink

pytestmark = pytest.mark.spark

Conn = psycopg.Connection[tuple[object, ...]]

CUSTOM = {
    "mood": ("mood", ("'sad'", "'ok'", "'it''s, \"odd\"'")),
    "posint": ("posint", ("1", "2147483647")),
    "pair": ("pair", ("ROW(1, 'a b')::pair", "ROW(NULL, '\"{}\"')::pair", "ROW(-2, NULL)::pair")),
    "mood_arr": ("mood[]", ("ARRAY['sad', 'it''s, \"odd\"', NULL]::mood[]",)),
    "pair_arr": ("pair[]", ("ARRAY[ROW(1, 'x')::pair, NULL, ROW(NULL, 'y,z')::pair]",)),
    "label": ("label", ("'plain'", "''")),
}

SPARK_MAX_MICROS = 2**63 - 1


def _columns() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Column name -> (SQL type, literals)."""
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for prefix, cases in (("s", SCALARS), ("r", RANGES), ("a", ARRAYS)):
        for name, case in cases.items():
            out[f"{prefix}_{name}"] = (case.sql_type, case.literals)
    for name, (sql_type, literals) in CUSTOM.items():
        out[f"c_{name}"] = (sql_type, literals)
    return out


def _create(conn: Conn) -> int:
    """The table, its types and rows; returns the number of rows."""
    conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'it''s, \"odd\"')")
    conn.execute("CREATE DOMAIN posint AS int4 CHECK (VALUE > 0)")
    conn.execute("CREATE DOMAIN label AS text")
    conn.execute("CREATE TYPE pair AS (n int, t text)")
    columns = _columns()
    conn.execute(sql.SQL("CREATE TABLE everything (id int PRIMARY KEY, {})").format(
        sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(sql_type))
                           for name, (sql_type, _) in columns.items())))
    rows = max(len(literals) for _, literals in columns.values()) + 1  # the last: all NULL
    return rows


def _insert(conn: Conn, rows: int) -> None:
    columns = _columns()
    for i in range(rows):
        values = [sql.SQL(literals[i] if i < len(literals) else "NULL")
                  for _, literals in columns.values()]
        conn.execute(sql.SQL("INSERT INTO everything (id, {}) VALUES ({}, {})").format(
            sql.SQL(", ").join(sql.Identifier(n) for n in columns), sql.Literal(i),
            sql.SQL(", ").join(values)))


# --- the two sides, as comparable text --------------------------------------------------------

_GEOMETRY = {"point", "line", "lseg", "box", "path", "polygon", "circle"}
_RANGE_SUFFIXES = ("range", "multirange")


def _base(type_name: str) -> str:
    return type_name.removeprefix("_").removeprefix("public.")


def _pg_expr(column: ColumnSpec) -> sql.Composable:
    """What PostgreSQL returns for the column, as text, in the form the lake is compared in."""
    v = sql.Identifier(column.name)
    kind, base = column.spark_type, _base(column.type_name)
    is_array = column.type_name.startswith("_") or column.type_name.startswith("public._")
    if kind == "binary":
        return sql.SQL("encode({}, 'hex')").format(v)
    if kind == "date":
        return sql.SQL("CASE WHEN {0} = 'infinity' THEN 'max' WHEN {0} = '-infinity' THEN 'min'"
                       " ELSE ({0} - date '1970-01-01')::text END").format(v)
    if kind in ("timestamp", "timestamp_ntz"):
        return sql.SQL("CASE WHEN {0} = 'infinity' THEN 'max' WHEN {0} = '-infinity' THEN 'min'"
                       " ELSE (extract(epoch from {0}) * 1000000)::numeric(30, 0)::text END"
                       ).format(v)
    if base == "money" and not is_array:
        return sql.SQL("{}::numeric::text").format(v)
    if base == "pg_lsn":
        return sql.SQL("({} - '0/0'::pg_lsn)::text").format(v)
    if is_array:
        return sql.SQL("to_jsonb({})::text").format(v) if not _by_element(base) \
            else sql.SQL("{}::text").format(v)
    if base.endswith("multirange"):
        return sql.SQL("(SELECT CASE WHEN {0} IS NOT NULL THEN coalesce(jsonb_agg("
                       "jsonb_build_array(lower(r)::text, "
                       "upper(r)::text, lower_inc(r), upper_inc(r), isempty(r))), '[]') END "
                       "FROM unnest({0}) r)::text").format(v)
    if base.endswith("range"):
        return sql.SQL("CASE WHEN {0} IS NOT NULL THEN jsonb_build_array(lower({0})::text, "
                       "upper({0})::text, lower_inc({0}), upper_inc({0}), isempty({0}))::text "
                       "END").format(v)
    if base == "pair":
        return sql.SQL("to_jsonb({})::text").format(v)
    if base == "bool":
        return sql.SQL("{}::text").format(v)
    # the type's output function (char(n) keeps its padding, which ::text drops)
    return sql.SQL("CASE WHEN {0} IS NOT NULL THEN format('%s', {0}) END").format(v)


_ELEMENTWISE = {"money", "interval", "box", "point", "bytea", "json", "jsonb", "inet", "cidr"}


def _by_element(base: str) -> bool:
    """Arrays of these are compared element by element: their element's JSON is not
    what ``to_jsonb`` gives."""
    return base in _ELEMENTWISE or base.endswith(_RANGE_SUFFIXES)


def _lake_expr(column: ColumnSpec) -> str:
    v = quote(column.name)
    kind = column.spark_type
    if kind == "binary":
        return f"lower(hex({v}))"
    if kind == "date":
        return (f"CASE WHEN {v} = date_from_unix_date(2147483647) THEN 'max' "
                f"WHEN {v} = date_from_unix_date(-2147483648) THEN 'min' "
                f"ELSE CAST(unix_date({v}) AS STRING) END")
    if kind in ("timestamp", "timestamp_ntz"):
        micros = f"unix_micros(CAST({v} AS TIMESTAMP))"
        return (f"CASE WHEN {micros} = 9223372036854775807 THEN 'max' "
                f"WHEN {micros} = -9223372036854775808 THEN 'min' "
                f"ELSE CAST({micros} AS STRING) END")
    return f"CAST({v} AS STRING)"


def _float(text: str, single: bool) -> float:
    x = float(text)
    return struct.unpack("<f", struct.pack("<f", x))[0] if single and math.isfinite(x) else x


def _same_float(a: str, b: str, single: bool) -> bool:
    x, y = _float(a, single), _float(b, single)
    return (math.isnan(x) and math.isnan(y)) or x == y


def _scalar(text: Any) -> Any:
    """A bound, element or field in a canonical form: numbers as Decimal, times parsed."""
    if text is None or isinstance(text, bool):
        return text
    if isinstance(text, float) and math.isnan(text) or text == "NaN":
        return "NaN"  # Decimal NaN is equal to nothing
    if isinstance(text, int | float):
        return Decimal(str(text))
    value = str(text)
    for parse in (Decimal, datetime.fromisoformat):
        try:
            parsed = parse(value)
        except (ValueError, ArithmeticError):
            continue
        if isinstance(parsed, datetime) and parsed.tzinfo is not None:
            return parsed.astimezone(UTC)
        return parsed
    return value


def _range(value: dict[str, Any] | None) -> list[Any] | None:
    if value is None:
        return None
    if value.get("empty"):
        return [None, None, False, False, True]
    return [_scalar(value["lower"]), _scalar(value["upper"]), value["lower_inc"],
            value["upper_inc"], False]


def _pg_range(bounds: list[Any]) -> list[Any]:
    return [_scalar(bounds[0]), _scalar(bounds[1]), *bounds[2:]]


def _num(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return str(int(x)) if x == int(x) and abs(x) < 1e15 else repr(x)


def _geometry_text(kind: str, v: dict[str, Any]) -> str:
    """The server's text of a geometric value from its JSON fields."""
    def p(point: dict[str, Any]) -> str:
        return f"({_num(float(point['x']))},{_num(float(point['y']))})"

    if kind == "point":
        return p(v)
    if kind == "line":
        return "{" + ",".join(_num(float(v[k])) for k in ("a", "b", "c")) + "}"
    if kind == "lseg":
        return f"[{p(v['start'])},{p(v['end'])}]"
    if kind == "box":
        return f"{p(v['high'])},{p(v['low'])}"
    if kind == "path":
        inner = ",".join(p(q) for q in v["points"])
        return f"({inner})" if v["closed"] else f"[{inner}]"
    if kind == "polygon":
        return "(" + ",".join(p(q) for q in v["points"]) + ")"
    return f"<{p(v['center'])},{_num(float(v['radius']))}>"


def _tree(value: Any) -> Any:
    if isinstance(value, list):
        return [_tree(x) for x in value]
    if isinstance(value, dict):
        return {k: _tree(x) for k, x in value.items()}
    return _scalar(value)


def same(column: ColumnSpec, source: str | None, lake: str | None) -> bool:
    """Whether the lake value is PostgreSQL's value in the column's lake representation."""
    kind, base = column.spark_type, _base(column.type_name)
    is_array = column.type_name.startswith("_") or column.type_name.startswith("public._")
    if source is None or lake is None:
        if kind in ("timestamp", "timestamp_ntz") and source is not None \
                and source not in ("max", "min") and int(source) > SPARK_MAX_MICROS:
            return lake is None  # past Spark's greatest timestamp
        return source is lake
    if kind in ("float", "double"):
        return _same_float(source, lake, kind == "float")
    if kind.startswith("decimal") or base in ("numeric", "money") and not is_array:
        return (source in ("NaN", "Infinity", "-Infinity") and source == lake) or (
            Decimal(source) == Decimal(lake))
    if base == "pg_lsn":
        return int(source) == int(lake)
    if base in ("time", "timetz"):
        return source == lake or _time(source) == _time(lake)
    if base == "interval" and not is_array:
        return source == lake
    if base in _GEOMETRY and not is_array:
        return _geometry_text(base, json.loads(lake)) == source
    if base.endswith("multirange") and not is_array:
        return [_range(r) for r in json.loads(lake)] == [_pg_range(b) for b in json.loads(source)]
    if base.endswith("range") and not is_array:
        return _range(json.loads(lake)) == _pg_range(json.loads(source))
    if base in ("inet", "cidr") and not is_array:
        parse = ip_network if base == "cidr" else ip_interface
        return parse(source) == parse(lake)
    if is_array and source.startswith("["):  # to_jsonb of the array
        return _tree(json.loads(source)) == _tree(json.loads(lake))
    if is_array:
        return _array_elements(column.name, base, json.loads(lake))
    if base == "pair":
        return _tree(json.loads(source)) == _tree(json.loads(lake))
    if base in ("json", "jsonb"):
        return json.loads(source) == json.loads(lake)
    return source == lake


_TIME = re.compile(r"^(\d\d:\d\d:\d\d)(\.\d+)?([+-][\d:]+)?$")


def _time(text: str) -> tuple[str, str, str]:
    """A time of day and its offset from PostgreSQL's or ISO 8601 text: seconds, fraction
    without trailing zeros, offset as sign and six digits."""
    match = _TIME.match(text)
    assert match is not None, text
    fraction = (match[2] or "").rstrip("0").rstrip(".")
    offset = match[3] or ""
    if offset:
        offset = offset[0] + offset[1:].replace(":", "").ljust(6, "0")
    return match[1], fraction, offset


def _array_elements(name: str, base: str, lake: list[Any]) -> bool:
    """Arrays whose elements have their own JSON form: compared with PostgreSQL element by
    element, in storage order (``unnest``)."""
    elements = _PG_ELEMENTS[name]
    if len(elements) != len(_flat(lake, base)):
        return False
    for pg_value, lake_value in zip(elements, _flat(lake, base), strict=True):
        if pg_value is None or lake_value is None:
            if pg_value is not lake_value:
                return False
            continue
        element = ColumnSpec.of_type(base, name="e")
        lake_text = lake_value if isinstance(lake_value, str) else json.dumps(lake_value)
        if base == "bytea":  # base64 in JSON, hex from PostgreSQL
            lake_text = base64.b64decode(lake_text).hex()
        if not same(element, pg_value, lake_text):
            return False
    return True


def _flat(value: Any, base: str) -> list[Any]:
    """The elements of a JSON array of any dimension; a multirange element is itself a list
    (of range objects, or empty)."""
    multirange = base.endswith("multirange")
    if isinstance(value, list) and not (multirange and all(isinstance(x, dict) for x in value)):
        return [x for item in value for x in _flat(item, base)]
    return [value]


_PG_ELEMENTS: dict[str, list[str | None]] = {}


def _load_elements(conn: Conn, spec_columns: list[ColumnSpec], row_id: int) -> None:
    """The element texts of the structured arrays of row ``row_id``, each in its element's
    comparison form (the ``_pg_expr`` of the element type)."""
    _PG_ELEMENTS.clear()
    for column in spec_columns:
        base = _base(column.type_name)
        is_array = column.type_name.startswith("_") or column.type_name.startswith("public._")
        if not is_array or not _by_element(base):
            continue
        element = ColumnSpec.of_type(base, name="e")
        query = sql.SQL("SELECT {} FROM (SELECT unnest({}) AS e FROM everything WHERE id = {}) x"
                        ).format(_pg_expr(element), sql.Identifier(column.name),
                                 sql.Literal(row_id))
        with conn.transaction():
            conn.execute("SET LOCAL intervalstyle = iso_8601")
            _PG_ELEMENTS[f"{column.name}"] = [r[0] for r in conn.execute(query).fetchall()]


@pytest.mark.parametrize("value_format", ["avro", "json"])
def test_every_type_reaches_the_lake(pg_conn: Conn, pg_dsn: str, kafka_servers: str,
                                     topic_prefix: str, spark: Any, tmp_path: Path,
                                     value_format: str) -> None:
    rows = _create(pg_conn)
    history = tmp_path / "catalog"
    sink = KafkaSink(kafka_servers, topic_prefix=topic_prefix, value_format=value_format)
    pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.everything"],
                                       catalog_dir=history), sink)
    pipeline.prepare()
    _insert(pg_conn, rows)
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    sink.close()

    lake = (tmp_path / "lake").as_uri()
    config = job.JobConfig(kafka_servers, lake, (tmp_path / "cp").as_uri(),
                           topic_prefix=topic_prefix)
    catalog = job.read_catalog(spark, config)
    topic = (spark.read.format("kafka").option("kafka.bootstrap.servers", kafka_servers)
             .option("subscribePattern", table_topic_pattern(topic_prefix))
             .option("startingOffsets", "earliest").option("includeHeaders", "true").load())
    assert apply_batch(spark, topic, 0, catalog=catalog, lake=lake,
                       app_id="types") == {"public.everything": rows}
    (spec,) = catalog.tables()
    columns = [c for c in spec.columns if c.name != "id"]
    assert len(columns) == len(_columns())

    delta = spark.read.format("delta").load(f"{lake}/public.everything")
    lake_rows = {r["id"]: r for r in delta.selectExpr(
        "id", *[f"{_lake_expr(c)} AS {quote(c.name)}" for c in columns]).collect()}
    with pg_conn.transaction():
        pg_conn.execute("SET LOCAL intervalstyle = iso_8601")
        pg_conn.execute("SET LOCAL timezone = 'UTC'")
        source_rows = {r[0]: r[1:] for r in pg_conn.execute(sql.SQL(
            "SELECT id, {} FROM everything").format(
                sql.SQL(", ").join(_pg_expr(c) for c in columns))).fetchall()}
    assert sorted(lake_rows) == sorted(source_rows) == list(range(rows))
    mismatches = []
    for row_id in range(rows):
        _load_elements(pg_conn, columns, row_id)
        for column, source in zip(columns, source_rows[row_id], strict=True):
            lake_value = lake_rows[row_id][column.name]
            if not same(column, None if source is None else str(source), lake_value):
                mismatches.append((column.name, column.spark_type, row_id, source, lake_value))
    assert not mismatches, "\n".join(repr(m)[:300] for m in mismatches[:40])
    types = dict(delta.dtypes)
    assert (types["s_int8"], types["s_numeric_10_2"], types["s_timestamptz"],
            types["s_bytea"], types["s_date"]) == ("bigint", "decimal(10,2)", "timestamp",
                                                   "binary", "date")


# --- values a typed column cannot hold, domains, network addresses (issue 15, point 7) --------

_LOSSY = {  # column -> (SQL type, literals of rows 1.., then updates of row 1 and row 2)
    "d_posint": ("posint", ("1", "2147483647")),
    "d_price": ("price", ("12.5", "-99999999.99", "'NaN'")),
    "d_dear": ("dear_price", ("0.01", "'NaN'")),
    "d_label": ("label", ("'plain'", "''")),
    "d_at": ("stamp", ("'2024-02-29 10:11:12.5+02'", "'294276-12-31 23:59:59.999999+00'")),
    "n": ("numeric(10,2)", ("'NaN'", "12.5", "-0.01")),
    "ts": ("timestamp", ("'294276-12-31 23:59:59.999999'", "'2024-01-01 00:00:00'",
                         "'294247-01-10 04:00:54.775808'", "'294276-01-01 00:00:00'",
                         "'infinity'", "'-infinity'", "'4714-11-24 00:00:00 BC'")),
    "tstz": ("timestamptz", ("'294276-12-31 23:59:59.5+00'", "'2024-01-01 00:00:00+00'",
                             "'-infinity'", "'0001-01-01 00:00:00+01'",
                             "'10000-01-01 00:00:00.25+00'")),
    "dt": ("date", ("'infinity'", "'-infinity'", "'4713-01-01 BC'", "'10000-01-01'",
                    "'2024-02-29'")),
    "ip": ("inet", ("'192.168.1.5'", "'::ffff:1.2.3.4'", "'192.168.1.5/24'", "'::1.2.3.4'",
                    "'2001:db8::1/64'", "'::ffff:1.2.3.4/120'", "'10.0.0.1/32'")),
    "net": ("cidr", ("'10/8'", "'::ffff:1.2.3.0/120'", "'2001:db8::/32'", "'::/0'",
                     "'192.168.0.0/24'")),
    # TOASTed: row 0's update below leaves it unchanged (the MERGE keeps the other entries)
    "big": ("text", ("(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 500) g)",)),
}


def _create_lossy(conn: Conn) -> int:
    conn.execute("CREATE DOMAIN posint AS integer CHECK (VALUE > 0)")
    conn.execute("CREATE DOMAIN price AS numeric(10,2)")
    conn.execute("CREATE DOMAIN dear_price AS price CHECK (VALUE IS NULL OR VALUE <> 0)")
    conn.execute("CREATE DOMAIN label AS text")
    conn.execute("CREATE DOMAIN stamp AS timestamptz")
    conn.execute(sql.SQL("CREATE TABLE lossy (id int PRIMARY KEY, {})").format(
        sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t))
                           for n, (t, _) in _LOSSY.items())))
    return max(len(literals) for _, literals in _LOSSY.values()) + 1  # the last: all NULL


def _insert_lossy(conn: Conn, rows: int) -> None:
    for i in range(rows):
        conn.execute(sql.SQL("INSERT INTO lossy VALUES ({}, {})").format(
            sql.Literal(i), sql.SQL(", ").join(
                sql.SQL(literals[i] if i < len(literals) else "NULL")
                for _, literals in _LOSSY.values())))


@pytest.mark.parametrize("value_format", ["avro", "json"])
def test_values_a_typed_column_cannot_hold(pg_conn: Conn, pg_dsn: str, kafka_servers: str,
                                           topic_prefix: str, spark: Any, tmp_path: Path,
                                           value_format: str) -> None:
    """A domain lands as its base type; a NaN in numeric(10,2) and a timestamp past Spark's
    greatest are NULL in their typed column and PostgreSQL's text in ``_pgcdc_text`` (kept
    through updates of other columns, gone when the value changes, renamed with its
    column); inet/cidr are PostgreSQL's text; the lake equals the source through
    pgcdc.clone.compare (infinities, BC and years past 9999 included)."""
    history = tmp_path / "catalog"
    lake = (tmp_path / "lake").as_uri()
    config = job.JobConfig(kafka_servers, lake, (tmp_path / "cp").as_uri(),
                           topic_prefix=topic_prefix)

    def capture_and_apply(batch_id: int) -> Any:
        sink = KafkaSink(kafka_servers, topic_prefix=topic_prefix, value_format=value_format)
        pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.lossy"],
                                           catalog_dir=history), sink)
        pipeline.prepare()
        pipeline.run(until_lsn=current_wal_lsn(pg_conn))
        sink.close()
        catalog = job.read_catalog(spark, config)
        topic = (spark.read.format("kafka").option("kafka.bootstrap.servers", kafka_servers)
                 .option("subscribePattern", table_topic_pattern(topic_prefix))
                 .option("startingOffsets", "earliest").option("includeHeaders", "true")
                 .load())
        apply_batch(spark, topic, batch_id, catalog=catalog, lake=lake, app_id="lossy")
        with psycopg.connect(pg_dsn) as conn:
            (result,) = compare(conn, spark, lake, catalog.tables())
        assert result.equal, result
        return catalog

    rows = _create_lossy(pg_conn)
    Pipeline(PipelineConfig(pg_dsn, tables=["public.lossy"], catalog_dir=history),
             NoSink()).prepare()
    _insert_lossy(pg_conn, rows)
    catalog = capture_and_apply(0)
    (spec,) = catalog.tables()
    base = {c.name: (c.base_type, c.spark_type) for c in spec.columns}
    assert base["d_posint"] == ("int4", "int")
    assert base["d_price"] == base["d_dear"] == ("numeric", "decimal(10,2)")
    assert base["d_label"] == ("text", "string") and base["d_at"] == ("timestamptz", "timestamp")

    delta = spark.read.format("delta").load(f"{lake}/public.lossy")
    types = dict(delta.dtypes)
    assert (types["d_posint"], types["d_price"], types["d_dear"], types["d_label"],
            types["d_at"], types["n"], types["ts"], types["ip"], types[TEXT]) == (
        "int", "decimal(10,2)", "decimal(10,2)", "string", "timestamp", "decimal(10,2)",
        "timestamp_ntz", "string", "map<string,string>")
    got = _lossy_lake(spark, lake)  # (Python has no date for Spark's extremes)
    assert len(got) == rows
    assert got[0]["n"] is None and got[0][TEXT]["n"] == "NaN"
    assert got[0]["ts"] is None and got[0][TEXT]["ts"] == "294276-12-31 23:59:59.999999"
    assert got[0]["tstz"] is None and got[0][TEXT]["tstz"] == "294276-12-31 23:59:59.5+00"
    assert got[1][TEXT] == {"d_dear": "NaN", "d_at": "294276-12-31 23:59:59.999999+00"}
    assert got[2]["ts"] is None and got[2][TEXT] == {"d_price": "NaN",
                                                     "ts": "294247-01-10 04:00:54.775808"}
    assert got[rows - 1][TEXT] is None  # all NULL: nothing kept
    with pg_conn.transaction():
        source_ip = {int(str(r[0])): r[1] for r in pg_conn.execute(
            "SELECT id, format('%s', ip) FROM lossy WHERE ip IS NOT NULL").fetchall()}
    assert {i: got[i]["ip"] for i in source_ip} == source_ip
    assert got[1]["ip"] == "::ffff:1.2.3.4" and got[0]["ip"] == "192.168.1.5"

    # updates: the kept text follows the value (another column changed: kept; the value
    # changed: replaced or gone)
    pg_conn.execute("UPDATE lossy SET d_label = 'touched' WHERE id = 0")  # big unchanged
    pg_conn.execute("UPDATE lossy SET n = 'NaN', ts = '2024-05-05 05:05:05' WHERE id = 1")
    pg_conn.execute("UPDATE lossy SET d_price = 3, ts = '294276-01-01 00:00:00' WHERE id = 2")
    capture_and_apply(1)
    got = _lossy_lake(spark, lake)
    assert got[0][TEXT] == {"n": "NaN", "ts": "294276-12-31 23:59:59.999999",
                            "tstz": "294276-12-31 23:59:59.5+00"}
    assert got[0]["d_label"] == "touched" and len(got[0]["big"]) == 16000
    assert got[1][TEXT] == {"d_dear": "NaN", "d_at": "294276-12-31 23:59:59.999999+00",
                            "n": "NaN"}
    assert got[2][TEXT] == {"ts": "294276-01-01 00:00:00"} and got[2]["d_price"] == Decimal(3)

    # a renamed column's kept texts are renamed with it
    pg_conn.execute("ALTER TABLE lossy RENAME COLUMN n TO amount")
    pg_conn.execute("INSERT INTO lossy (id, amount) VALUES (100, 'NaN')")
    capture_and_apply(2)
    got = _lossy_lake(spark, lake)
    assert got[0][TEXT] == {"amount": "NaN", "ts": "294276-12-31 23:59:59.999999",
                            "tstz": "294276-12-31 23:59:59.5+00"}
    assert got[100][TEXT] == {"amount": "NaN"}


def _lossy_lake(spark: Any, lake: str) -> dict[int, Any]:
    """The lake's rows by id, the columns the test reads."""
    delta = spark.read.format("delta").load(f"{lake}/public.lossy")
    return {r["id"]: r for r in delta.selectExpr(
        "id", TEXT, "n" if "n" in delta.columns else "amount", "CAST(ts AS STRING) AS ts",
        "CAST(tstz AS STRING) AS tstz", "ip", "d_label", "big", "d_price").collect()}


def test_an_initial_load_names_domain_base_types(pg_conn: Conn) -> None:
    """The initial load and incremental snapshots publish the tables the snapshot's catalog
    describes (loads/published.py): their domain columns name their base types
    too, so the load's catalog record types them as the stream's does."""
    _create_lossy(pg_conn)
    pg_conn.execute("CREATE PUBLICATION lossy_pub FOR TABLE lossy")
    (published,) = fetch_published_tables(pg_conn, "lossy_pub", sizes=False).values()
    spec = TableSpec.from_json(json.dumps(dict(published.table.to_dict(), lsn=1)))
    assert {c.name: (c.base_type, c.spark_type) for c in spec.columns
            if c.name.startswith("d_")} == {
        "d_posint": ("int4", "int"), "d_price": ("numeric", "decimal(10,2)"),
        "d_dear": ("numeric", "decimal(10,2)"), "d_label": ("text", "string"),
        "d_at": ("timestamptz", "timestamp")}
