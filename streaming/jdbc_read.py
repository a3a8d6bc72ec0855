"""The lake load's chunks read on the JVM: Spark's JDBC source (PostgreSQL's JDBC driver),
one partition per chunk, inside the load's exported snapshot, for the tables whose every
column PostgreSQL itself can give in its lake type (:func:`column_read`).

The Python tasks of streaming/bulk_load.py (COPY, the stream's decoders, Arrow batches) cost
most of a lake load; here no row passes through Python, and the values arrive typed: each
column is read as the lake holds it, or as a number the lake value is made of in one step,
never as a text Spark must parse.  What each column gives (:func:`column_read`) lands as the
same lake value as the Python tasks' read, which is the stream's (:func:`lake_value`):

* ``bool``, ``int2``, ``int4``, ``int8``, ``float8``, ``bytea``: the value itself; ``oid``
  as ``int8``; ``float4`` read as a double (the driver parses PostgreSQL's text of it as a
  double) and rounded to a float, as the stream does (its decoder parses the text as a
  Python float, a double, which the Avro sink rounds to a float): read as a float, the text
  would be rounded once, which in rare cases gives the float next to it;
* ``numeric(p,s)`` of a Spark decimal: the decimal, read as ``decimal(p,s)``; a ``NaN``
  (which no Spark decimal holds) NULL, with the text ``NaN`` beside it (the row's
  ``_pgcdc_text`` entry, as the stream gives it); any other ``numeric`` (a string in the
  lake): its text as Python spells the decimal (:func:`_decimal_text`);
* ``date``: its days since 1970-01-01 (``date_from_unix_date``, the typed Avro read's way:
  streaming/decode.py); ``infinity`` and ``-infinity`` the greatest and least int, which
  are the stream's greatest and least dates;
* ``timestamptz`` and ``timestamp``: their microseconds since 1970-01-01 00:00 UTC (for
  ``timestamp``, its nominal time as if in UTC) exactly (``EXTRACT(epoch ...)`` is a
  numeric), through ``timestamp_micros``; the infinities the greatest and least long; a
  value past Spark's greatest timestamp (PostgreSQL goes 30 years further) NULL, with the
  server's text beside it, as the stream keeps it;
* ``text`` and ``varchar`` as they are; the types whose stream decoder keeps PostgreSQL's
  text (``bpchar`` with its padding, ``name``, ``"char"``, ``json``, ``jsonb``, ``xml``,
  ``macaddr``, ``macaddr8``, ``bit``, ``varbit``, ``tsvector``, ``tsquery``, enums) and
  ``uuid`` (whose decoded value prints as PostgreSQL prints it): the type's output text
  (``format('%s', c)``, which keeps ``bpchar``'s padding where a cast to text drops it);
* ``int2[]``, ``int4[]``, ``int8[]``: ``array_to_json``, the JSON of the stream's lists
  (``[[1,null],[3,4]]``: nested arrays nested, NULL elements ``null``, lower bounds dropped).

A table with any other column (domains, composites, other arrays, intervals, ...), or
published with a row filter holding a ``?`` (which the driver reads as a parameter), is read
by the Python tasks.
``tests/integration/test_spark_bulk_load.py`` loads a table of every type above, edge values
included, both ways and compares the lake tables value by value.

The tasks' sessions: ``sessionInitStatement`` opens a read-only repeatable-read transaction,
imports the load's snapshot (``SET TRANSACTION SNAPSHOT``) and sets pgcdc's session settings
and the load's lock timeout for it (``SET LOCAL``: the driver's own startup parameters would
override ``options``); the driver then reads inside that transaction (it sends no ``BEGIN``
of its own in a transaction already open).  A row's ordinal is the Python tasks' own
(:func:`loads.load_state.ordinal`: the attempt, the chunk, the row's place in its chunk).

The JDBC URL and properties come from the load's live connection (its host, port, database,
user, password however libpq found it, TLS mode and root certificate); where the driver could
not connect as libpq did (a Unix socket, a client certificate, a service file) or a first
query through Spark fails, the load says why and reads in Python.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote as url_quote

import psycopg

from decoder.names import quoted_table_name
from decoder.replication import SESSION_SETTINGS
from decoder.values import FIRST_NORMAL_OID
from loads.load_state import CHUNK_BITS, MAX_CHUNK_ROWS, ROW_BITS, ordinal
from snapshot_builder.catalog import Column, TableVersion
from streaming import sql_text
from streaming.schema import ColumnSpec, TableSpec

# PostgreSQL's JDBC driver (in streaming/session.py's packages)
DRIVER = "org.postgresql.Driver"
DISABLE_ENV = "PGCDC_LAKE_LOAD_JDBC"  # =0: every table read by the Python tasks
FETCH_ROWS = 10_000  # rows per round trip of a task's cursor

# the types JDBC reads as the lake holds them, and their Spark types
_NATIVE = {"bool": "boolean", "int2": "smallint", "int4": "int", "int8": "bigint",
           "float8": "double", "bytea": "binary"}
_OUTPUT_TEXT = frozenset({"bpchar", "name", "char", "json", "jsonb", "xml", "macaddr",
                          "macaddr8", "bit", "varbit", "tsvector", "tsquery", "uuid"})
# per timestamp type: its name, the offset of a literal of it, the read's lake conversion
_TIMESTAMPS = {"timestamptz": ("timestamptz", "+00", "micros"),
               "timestamp": ("timestamp", "", "micros_ntz")}
_INT_ARRAYS = frozenset({"_int2", "_int4", "_int8"})
# libpq parameters the driver is given as properties, by the same name
_TLS = ("sslmode", "sslrootcert")
# libpq parameters of a connection the driver would not make as libpq did (client
# certificates, revocation lists, Kerberos, peer checks), and values that require such
_REFUSED = frozenset({"sslcert", "sslkey", "sslpassword", "sslcrl", "sslcrldir", "requirepeer",
                      "krbsrvname", "gsslib", "require_auth"})
_REQUIRED = {"sslcertmode": "require", "gssencmode": "require", "channel_binding": "require",
             "sslnegotiation": "direct"}


@dataclass(frozen=True)
class JdbcSource:
    """Where Spark's JDBC source reads the load's tables (the URL and the driver's
    properties; the password among them)."""

    url: str
    properties: dict[str, str]


def jdbc_source(conn: psycopg.Connection[Any]) -> tuple[JdbcSource | None, str]:
    """The JDBC source that reaches the server ``conn`` is connected to as ``conn`` did, or
    None and why not."""
    if os.environ.get(DISABLE_ENV) == "0":
        return None, f"{DISABLE_ENV}=0"
    info = conn.info
    params = info.get_parameters()
    refused = sorted(set(params) & _REFUSED) + sorted(
        f"{name}={value}" for name, value in _REQUIRED.items() if params.get(name) == value)
    if refused:
        return None, f"the connection's {refused} have no JDBC equivalent here"
    host = params.get("hostaddr") or info.host
    if not host or host.startswith("/") or "," in host:
        return None, f"the server is reached at {host!r} (a Unix socket or several hosts)"
    if ":" in host:
        host = f"[{host}]"
    url = f"jdbc:postgresql://{host}:{info.port}/{url_quote(info.dbname, safe='')}"
    properties = {"driver": DRIVER, "user": info.user, "ApplicationName": "pgcdc lake load"}
    if info.password:
        properties["password"] = info.password
    for name in _TLS:
        if params.get(name):
            properties[name] = params[name]
    if "sslmode" not in properties:  # libpq's default; the driver's is the same
        properties["sslmode"] = "prefer"
    if params.get("connect_timeout"):
        properties["connectTimeout"] = params["connect_timeout"]
    return JdbcSource(url, properties), ""


def probe(spark: Any, source: JdbcSource) -> str:
    """Empty if a Spark query through the driver reaches the server, else why not."""
    from py4j.protocol import Py4JJavaError

    try:
        spark.read.jdbc(source.url, "(SELECT 1 AS one) AS pgcdc_probe",
                        properties=source.properties).collect()
    except Py4JJavaError as exc:
        cause = str(exc.java_exception).strip().splitlines()
        return cause[0] if cause else str(exc)
    return ""


@dataclass(frozen=True)
class ColumnRead:
    """One column as the JVM reads it: what PostgreSQL sends (``sql``, read as the Spark type
    ``kind``), how that becomes the column's lake value (``lake``: ``cast`` to the lake type,
    ``micros`` or ``micros_ntz`` through ``timestamp_micros``, ``days`` through
    ``date_from_unix_date``), and, for a value the lake type may not hold, PostgreSQL's text
    of it sent beside (``text_sql``, NULL for every other value)."""

    sql: str
    kind: str
    lake: str = "cast"
    text_sql: str | None = None


# Spark's greatest timestamp (the greatest long of microseconds): PostgreSQL's go further
_SPARK_GREATEST = "294247-01-10 04:00:54.775807"
_LONG_MAX, _LONG_MIN = "9223372036854775807", "(-9223372036854775807 - 1)"
_INT_MAX, _INT_MIN = "2147483647", "(-2147483647 - 1)"


def column_read(column: Column, enums: frozenset[int]) -> ColumnRead | None:
    """How the JVM reads ``column`` (module docstring), or None where it does not."""
    ident = _ident(column.name)
    builtin = column.type_name if column.type_oid < FIRST_NORMAL_OID else None
    if builtin in _NATIVE:
        return ColumnRead(ident, _NATIVE[builtin])
    if builtin == "oid":
        return ColumnRead(f"{ident}::pg_catalog.int8", "bigint")
    if builtin == "float4":
        return ColumnRead(ident, "double")
    if builtin in ("text", "varchar"):
        return ColumnRead(ident, "string")
    if builtin in _OUTPUT_TEXT or column.type_oid in enums:
        # the type's output text (format's %s); format gives '' for NULL
        return ColumnRead(
            f"CASE WHEN {ident} IS NOT NULL THEN pg_catalog.format('%s', {ident}) END", "string")
    if builtin == "numeric":
        spark_type = ColumnSpec(column).spark_type
        if not spark_type.startswith("decimal"):
            return ColumnRead(_decimal_text(ident), "string")
        nan = f"{ident} = 'NaN'::pg_catalog.numeric"
        return ColumnRead(f"CASE WHEN {nan} THEN NULL ELSE {ident} END", spark_type,
                          text_sql=f"CASE WHEN {nan} THEN 'NaN' END")
    if builtin == "date":
        return ColumnRead(
            f"CASE WHEN pg_catalog.isfinite({ident}) "
            f"THEN {ident} - '1970-01-01'::pg_catalog.date "
            f"WHEN {ident} > '1970-01-01'::pg_catalog.date THEN {_INT_MAX} "
            f"WHEN {ident} IS NOT NULL THEN {_INT_MIN} END", "int", "days")
    if builtin in _TIMESTAMPS:
        kind, offset, lake = _TIMESTAMPS[builtin]
        greatest = f"'{_SPARK_GREATEST}{offset}'::pg_catalog.{kind}"
        finite = f"pg_catalog.isfinite({ident})"
        return ColumnRead(
            f"CASE WHEN {finite} AND {ident} <= {greatest} "
            f"THEN (EXTRACT(epoch FROM {ident}) * 1000000)::pg_catalog.int8 "
            f"WHEN {finite} THEN NULL "
            f"WHEN {ident} > {greatest} THEN {_LONG_MAX} "
            f"WHEN {ident} IS NOT NULL THEN {_LONG_MIN} END", "bigint", lake,
            text_sql=f"CASE WHEN {finite} AND {ident} > {greatest} "
                     f"THEN {ident}::pg_catalog.text END")
    if builtin in _INT_ARRAYS:
        return ColumnRead(f"pg_catalog.array_to_json({ident})::pg_catalog.text", "string")
    return None


def _decimal_text(ident: str) -> str:
    """SQL of a ``numeric``'s text as Python's ``str(Decimal(text))`` spells it, the
    stream's text of it: PostgreSQL's text, except where the leading digit stands 7 or more
    places after the point, which Python writes in scientific notation (``1.230E-7`` for
    ``0.0000001230``, ``0E-8`` for ``0.00000000``)."""
    text = f"{ident}::pg_catalog.text"
    # the coefficient's digits (no sign, point or leading zeros; '0' for a zero)
    digits = (f"coalesce(nullif(pg_catalog.ltrim(pg_catalog.replace(pg_catalog.ltrim("
              f"{text}, '-'), '.', ''), '0'), ''), '0')")
    # Python's adjusted exponent: the leading digit's place, 0 for the units
    adjusted = f"(pg_catalog.length({digits}) - pg_catalog.scale({ident}) - 1)"
    special = ", ".join(f"'{v}'::pg_catalog.numeric" for v in ("NaN", "Infinity", "-Infinity"))
    return (f"CASE WHEN {ident} IN ({special}) OR {adjusted} >= -6 THEN {text} "
            f"ELSE CASE WHEN {ident} < 0 THEN '-' ELSE '' END || pg_catalog.left({digits}, 1) "
            f"|| CASE WHEN pg_catalog.length({digits}) > 1 "
            f"THEN '.' || pg_catalog.substr({digits}, 2) ELSE '' END "
            f"|| 'E' || {adjusted}::pg_catalog.text END")


def lake_value(read: ColumnRead, value: str, text: str, column: ColumnSpec) -> tuple[str, str]:
    """The Spark SQL of a read column's lake value and untyped text (streaming/decode.py
    :func:`~streaming.decode.untyped`), from the read's fields ``value`` and ``text``."""
    lake = {"cast": f"CAST({value} AS {column.spark_type})",
            "micros": f"timestamp_micros({value})",
            # (the load's session zone is UTC: streaming/bulk_load.py)
            "micros_ntz": f"CAST(timestamp_micros({value}) AS TIMESTAMP_NTZ)",
            "days": f"date_from_unix_date({value})"}[read.lake]
    return lake, text if read.text_sql is not None else "CAST(NULL AS STRING)"


def readable(table: TableVersion, enums: frozenset[int], row_filter: str | None = None) -> bool:
    """Whether every column of ``table`` has a :func:`column_read`, and the publication's row
    filter has no ``?`` (an operator of jsonb's, which the driver would take for a parameter
    of the statement)."""
    return all(column_read(c, enums) is not None for c in table.columns) and \
        "?" not in (row_filter or "")


def enum_types(conn: psycopg.Connection[Any], tables: list[TableVersion]) -> frozenset[int]:
    """The enum types among the tables' column types."""
    oids = sorted({c.type_oid for t in tables for c in t.columns
                   if c.type_oid >= FIRST_NORMAL_OID})
    if not oids:
        return frozenset()
    rows = conn.execute("SELECT oid FROM pg_catalog.pg_type WHERE typtype = 'e' "
                        "AND oid = ANY(%s)", (oids,)).fetchall()
    return frozenset(int(r[0]) for r in rows)


def session_init(snapshot: str, lock_timeout_ms: int) -> str:
    """The statement each task's connection runs first (module docstring)."""
    settings = {**SESSION_SETTINGS, "lock_timeout": str(lock_timeout_ms)}
    sets = "; ".join(f"SET LOCAL {name} = {_literal(value)}" for name, value in settings.items())
    return (f"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; "
            f"SET TRANSACTION SNAPSHOT {_literal(snapshot)}; {sets}")


def _ident(name: str) -> str:
    """A PostgreSQL identifier, quoted."""
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    """A PostgreSQL string literal (``standard_conforming_strings``, the default)."""
    return "'" + text.replace("'", "''") + "'"


def chunk_rows(spark: Any, source: JdbcSource, *, spec: TableSpec, row_filter: str | None,
               snapshot: str, lock_timeout_ms: int, chunks: list[tuple[int, int, int | None]],
               attempt: int, enums: frozenset[int]) -> tuple[Any, dict[str, tuple[str, str]]]:
    """The rows of ``chunks`` (index, first page, end page or None) of ``spec``'s table, one
    Spark partition per chunk: the columns as read (``_v<i>``, and ``_t<i>`` beside where
    :attr:`ColumnRead.text_sql` is), then ``_ordinal``; and per column name the Spark SQL of
    its lake value and untyped text from them (:func:`lake_value`)."""
    selects, names, schema, values = [], [], [], {}
    for i, column in enumerate(spec.columns):
        read = column_read(column.column, enums)
        assert read is not None, column
        value, text = f"_v{i}", f"_t{i}"
        fields = [(value, read.sql, read.kind)]
        if read.text_sql is not None:
            fields.append((text, read.text_sql, "string"))
        for name, sql, kind in fields:
            selects.append(f"{sql} AS {name}")
            names.append(name)
            schema.append(f"{name} {kind}")
        values[column.name] = lake_value(read, value, text, column)
    where = f"WHERE ({row_filter})" if row_filter is not None else ""
    table = quoted_table_name(spec.schema, spec.name)
    query = (f"(SELECT {', '.join([*selects, 'ctid AS pgcdc_ctid'])} "
             f"FROM {table} {where}) AS pgcdc_chunk")
    predicates = []
    for _, start, end in chunks:
        bound = f"pgcdc_ctid >= '({start},0)'::pg_catalog.tid"
        if end is not None:
            bound += f" AND pgcdc_ctid < '({end},0)'::pg_catalog.tid"
        predicates.append(bound)
    properties = {**source.properties, "fetchsize": str(FETCH_ROWS),
                  "sessionInitStatement": session_init(snapshot, lock_timeout_ms),
                  # the read's own types (a decimal's precision and scale; no guess from the
                  # result's metadata)
                  "customSchema": ", ".join(schema)}
    rows = spark.read.jdbc(source.url, query, predicates=predicates, properties=properties)
    # the row's place in its partition (= chunk): the low bits of monotonically_increasing_id
    place = "(monotonically_increasing_id() & 8589934591)"
    bases = ", ".join(f"CAST({ordinal(attempt, index, 0)} AS BIGINT)" for index, _, _ in chunks)
    too_large = sql_text.literal(
        f"a chunk of {spec.qualified_name} holds more than {MAX_CHUNK_ROWS} rows: "
        "load again with a smaller chunk size (chunk_pages)")
    position = (f"CASE WHEN {place} >= {MAX_CHUNK_ROWS} THEN raise_error({too_large}) "
                f"ELSE element_at(array({bases}), spark_partition_id() + 1) + {place} END")
    assert CHUNK_BITS + ROW_BITS < 63
    return rows.selectExpr(*names,
                           f"CAST({position} AS BIGINT) AS _ordinal"), values
