"""The consistent-clone oracle: does a lake table equal its source table?

Both sides are read as canonical text, column by column, chosen by the
column's PostgreSQL type (a domain's: its base type's): dates and timestamps as
days and microseconds since 1970 (UTC) or ``infinity``/``-infinity``, booleans as
``true``/``false``, bytea as lowercase hex, everything else as PostgreSQL prints
it under the replication session's settings (money as its amount); floats and times are
compared in one spelling.  Where the lake's typed column cannot hold a value
(docs/types.md), the lake side reads PostgreSQL's text from ``_pgcdc_text``.  The digest is
a row count and a SHA-256 over the sorted rows, so a single differing value changes it.

Arrays, composites, ranges, multiranges and geometric values are JSON text in the
lake; both sides are read into one canonical JSON text by pgcdc/clone_json.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from decoder.replication import SESSION_SETTINGS
from pgcdc.clone_json import Shape, canonical_json, canonical_timetz, json_shapes
from streaming import sql_text
from streaming.apply import table_path
from streaming.evolution import quote
from streaming.schema import TEXT, ColumnSpec, TableSpec

CanonicalRow = tuple[str | None, ...]


@dataclass(frozen=True)
class Digest:
    rows: int
    checksum: str


@dataclass(frozen=True)
class TableComparison:
    table: str
    source: Digest
    lake: Digest

    @property
    def equal(self) -> bool:
        return self.source == self.lake


def digest(rows: list[CanonicalRow]) -> Digest:
    h = hashlib.sha256()
    for row in sorted(rows, key=lambda r: tuple("\0" if v is None else "\1" + v for v in r)):
        for value in row:
            h.update(b"\0N" if value is None else b"\1" + value.encode() + b"\0")
        h.update(b"\n")
    return Digest(len(rows), h.hexdigest()[:16])


# Spark's greatest timestamp; a later one is PostgreSQL's text in the lake's _pgcdc_text
_SPARK_MAX = {"timestamptz": "'294247-01-10 04:00:54.775807+00'::timestamptz",
              "timestamp": "'294247-01-10 04:00:54.775807'::timestamp"}
# the text pgcdc writes for a timestamp Python cannot hold (DateStyle ISO, TimeZone UTC)
_PAST_SPARK = {"timestamptz": "regexp_replace(to_char({0} AT TIME ZONE 'UTC', "
                              "'YYYY-MM-DD HH24:MI:SS.US'), '\\.?0+$', '') || '+00'",
               "timestamp": "regexp_replace(to_char({0}, 'YYYY-MM-DD HH24:MI:SS.US'), "
                            "'\\.?0+$', '')"}
_INFINITIES = "WHEN {0} = 'infinity' THEN 'infinity' WHEN {0} = '-infinity' THEN '-infinity' "


def _source_expr(column: ColumnSpec, json_valued: bool = False) -> sql.Composable:
    ident = sql.Identifier(column.name)
    if json_valued:  # a composite or an array: the lake holds its JSON (docs/types.md)
        return sql.SQL("to_json({})::text").format(ident)
    pg_type = column.pg_type  # a domain's base type
    if pg_type in _SPARK_MAX:  # microseconds since 1970 (UTC), or the text the lake keeps
        return sql.SQL("CASE " + _INFINITIES + "WHEN {0} > " + _SPARK_MAX[pg_type] + " THEN "
                       + _PAST_SPARK[pg_type] + " ELSE (extract(epoch FROM {0}) * 1000000)"
                       "::numeric(30, 0)::text END").format(ident)
    if pg_type == "date":  # days since 1970
        return sql.SQL("CASE " + _INFINITIES + "ELSE ({0} - date '1970-01-01')::text END"
                       ).format(ident)
    if pg_type == "bool":
        return sql.SQL("CASE WHEN {0} THEN 'true' WHEN NOT {0} THEN 'false' END").format(ident)
    if pg_type == "bytea":
        return sql.SQL("encode({}, 'hex')").format(ident)
    if pg_type == "money":  # the amount as a decimal, no currency sign (docs/types.md)
        return sql.SQL("{}::numeric::text").format(ident)
    # the type's output function, as pgcdc writes it (::text differs for inet: '1.2.3.4/32')
    return sql.SQL("CASE WHEN {0} IS NOT NULL THEN format('%s', {0}) END").format(ident)


def _lake_expr(column: ColumnSpec) -> str:
    """The lake's canonical text of a column: its typed value's (dates and timestamps as
    days and microseconds since 1970, whatever their year or era; PostgreSQL's infinities
    are Spark's extremes), or where that is NULL, PostgreSQL's text kept in ``_pgcdc_text``."""
    name = quote(column.name)
    spark_type = column.spark_type
    if spark_type in ("timestamp", "timestamp_ntz"):
        micros = f"unix_micros(CAST({name} AS TIMESTAMP))"  # the session is in UTC
        typed = (f"CASE WHEN {micros} = 9223372036854775807 THEN 'infinity' "
                 f"WHEN {micros} = -9223372036854775808 THEN '-infinity' "
                 f"ELSE CAST({micros} AS STRING) END")
    elif spark_type == "date":
        typed = (f"CASE WHEN {name} = date_from_unix_date(2147483647) THEN 'infinity' "
                 f"WHEN {name} = date_from_unix_date(-2147483648) THEN '-infinity' "
                 f"ELSE CAST(unix_date({name}) AS STRING) END")
    elif spark_type == "binary":
        typed = f"lower(hex({name}))"
    else:
        typed = f"CAST({name} AS STRING)"
    if column.untyped(name) is None:
        return typed
    return f"coalesce({typed}, {TEXT}[{sql_text.literal(column.name)}])"


def _canonical_float(text: str) -> str:
    """A float in one spelling: PostgreSQL prints ``3.4e+38``, Spark ``3.4E38``."""
    return repr(float(text))


def _canonical_time(text: str) -> str:
    """A time of day without trailing zeros in its fraction: PostgreSQL prints a
    ``time(1)`` as ``13:14:15.5``, the binary decoder as ``13:14:15.500000``."""
    return text.rstrip("0").rstrip(".") if "." in text else text


# how a value's text is brought to one spelling, by the column's PostgreSQL type
_SPELLINGS: dict[str, Callable[[str], str]] = {
    "float4": _canonical_float, "float8": _canonical_float, "time": _canonical_time,
    "timetz": canonical_timetz}
Spelling = Callable[[str], str] | None


def _spellings(specs: Sequence[ColumnSpec], json_valued: Mapping[str, Shape],
               lake: bool) -> list[Spelling]:
    def spelling(shape: Shape) -> Spelling:
        return lambda text: canonical_json(text, shape, lake=lake)
    return [spelling(json_valued[c.name]) if c.name in json_valued
            else _SPELLINGS.get(c.pg_type) for c in specs]


def _canonical(row: tuple[Any, ...], spellings: list[Spelling]) -> CanonicalRow:
    return tuple(None if v is None else str(v) if spell is None else spell(str(v))
                 for v, spell in zip(row, spellings, strict=True))


def source_rows(conn: psycopg.Connection[Any], spec: TableSpec,
                json_valued: Mapping[str, Shape] | None = None) -> list[CanonicalRow]:
    """The source table's rows; ``json_valued``: the shapes of its columns the lake holds
    as JSON (:func:`json_shapes`), if the caller looked them up already."""
    if json_valued is None:
        json_valued = json_shapes(conn, spec)
    query = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(_source_expr(c, c.name in json_valued) for c in spec.columns),
        sql.Identifier(spec.schema, spec.name),
    )
    spellings = _spellings(spec.columns, json_valued, lake=False)
    with conn.transaction():  # PostgreSQL's text as pgcdc's replication session prints it
        for name, value in SESSION_SETTINGS.items():
            conn.execute("SELECT set_config(%s, %s, true)", (name, value))
        return [_canonical(row, spellings) for row in conn.execute(query).fetchall()]


def lake_rows(spark: Any, lake: str, spec: TableSpec,
              json_valued: Mapping[str, Shape] | None = None) -> list[CanonicalRow]:
    """The lake table's rows; the columns in ``json_valued`` (:func:`json_shapes`) in the
    canonical JSON spelling :func:`source_rows` gives them (without it: their text)."""
    from delta.tables import DeltaTable

    path = table_path(lake, spec)
    if not DeltaTable.isDeltaTable(spark, path):
        return []
    spellings = _spellings(spec.columns, json_valued or {}, lake=True)
    frame = spark.read.format("delta").load(path).selectExpr(*[_lake_expr(c) for c in spec.columns])
    return [_canonical(tuple(row), spellings) for row in frame.collect()]


def compare(conn: psycopg.Connection[Any], spark: Any, lake: str,
            specs: list[TableSpec]) -> list[TableComparison]:
    results = []
    for spec in specs:
        json_valued = json_shapes(conn, spec)  # one look-up for both sides
        results.append(TableComparison(
            spec.qualified_name, digest(source_rows(conn, spec, json_valued)),
            digest(lake_rows(spark, lake, spec, json_valued))))
    return results
