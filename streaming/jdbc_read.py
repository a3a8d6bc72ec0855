"""The lake load's chunks read on the JVM: Spark's JDBC source (PostgreSQL's JDBC driver),
one partition per chunk, inside the load's exported snapshot, for the tables whose every
column PostgreSQL itself can give as the Avro sink's value (:func:`column_sql`).

The Python tasks of streaming/bulk_load.py (COPY, the stream's decoders, Arrow batches) cost
most of a lake load; here no row passes through Python.  What each column must give is
what :func:`streaming.bulk_load.avro_row` gives for it, or a text the stream's casts
(:meth:`streaming.schema.ColumnSpec.cast`) turn into the same lake value:

* ``bool``, ``int2``, ``int4``, ``int8``, ``float8``, ``bytea``: the value itself (JDBC's
  types are the Avro sink's); ``oid`` as ``int8``;
* the types whose stream decoder keeps PostgreSQL's text (``text``, ``varchar``,
  ``bpchar`` with its padding, ``name``, ``"char"``, ``json``, ``jsonb``, ``xml``,
  ``macaddr``, ``macaddr8``, ``bit``, ``varbit``, ``tsvector``, ``tsquery``, enums), and
  ``uuid`` (whose decoded value prints as PostgreSQL prints it) and ``date`` (ISO 8601 is
  PostgreSQL's ``DateStyle`` ISO; ``infinity``, BC and years past 9999 are the server's text
  in both): the type's output text (``format('%s', c)``, which keeps ``bpchar``'s padding
  where a cast to text drops it);
* ``numeric(p,s)`` of a Spark decimal: its text (the same decimal; ``NaN`` and the
  infinities spelled as Python's ``Decimal`` spells them);
* ``timestamptz`` and ``timestamp``: ISO 8601 in UTC (``2024-02-29T13:14:15.500000Z``) for
  a year from 1 to 9999, which Python holds, else the server's text (``infinity``, BC, a
  year past 9999), which the stream's decoder keeps too;
* ``int2[]``, ``int4[]``, ``int8[]``: ``array_to_json``, the JSON of the stream's lists
  (``[[1,null],[3,4]]``: nested arrays nested, NULL elements ``null``, lower bounds dropped).

A table with any other column (``float4``: the stream parses its text as a double and rounds
that to a float, which the float itself need not equal; domains, composites, other arrays,
intervals, ...), or published with a row filter holding a ``?`` (which the driver reads as a
parameter), is read by the Python tasks.
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
from streaming.evolution import quote
from streaming.schema import ColumnSpec

# PostgreSQL's JDBC driver (in streaming/session.py's packages)
DRIVER = "org.postgresql.Driver"
DISABLE_ENV = "PGCDC_LAKE_LOAD_JDBC"  # =0: every table read by the Python tasks
FETCH_ROWS = 10_000  # rows per round trip of a task's cursor

_NATIVE = frozenset({"bool", "int2", "int4", "int8", "float8", "bytea"})
_OUTPUT_TEXT = frozenset({"text", "varchar", "bpchar", "name", "char", "json", "jsonb", "xml",
                          "macaddr", "macaddr8", "bit", "varbit", "tsvector", "tsquery", "uuid",
                          "date"})
_TIMESTAMPS = {"timestamptz": ("AT TIME ZONE 'UTC'", "timestamptz", "+00"),
               "timestamp": ("", "timestamp", "")}
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


def column_sql(column: Column, enums: frozenset[int]) -> str | None:
    """The SQL of a column's value as the Avro sink's (module docstring), or None."""
    ident = _ident(column.name)
    builtin = column.type_name if column.type_oid < FIRST_NORMAL_OID else None
    if builtin in _NATIVE:
        return ident
    if builtin == "oid":
        return f"{ident}::pg_catalog.int8"
    if builtin in _OUTPUT_TEXT or column.type_oid in enums:
        # the type's output text (format's %s); format gives '' for NULL
        return f"CASE WHEN {ident} IS NOT NULL THEN pg_catalog.format('%s', {ident}) END"
    if builtin == "numeric":
        spark_type = ColumnSpec(column).spark_type
        return f"{ident}::pg_catalog.text" if spark_type.startswith("decimal") else None
    if builtin in _TIMESTAMPS:
        zone, kind, offset = _TIMESTAMPS[builtin]
        iso = (f"pg_catalog.to_char({ident} {zone}, "
               "'YYYY-MM-DD\"T\"HH24:MI:SS.US')"
               + (" || 'Z'" if offset else ""))
        return (f"CASE WHEN {ident} >= '0001-01-01 00:00:00{offset}'::pg_catalog.{kind} "
                f"AND {ident} < '10000-01-01 00:00:00{offset}'::pg_catalog.{kind} "
                f"THEN {iso} ELSE {ident}::pg_catalog.text END")
    if builtin in _INT_ARRAYS:
        return f"pg_catalog.array_to_json({ident})::pg_catalog.text"
    return None


def readable(table: TableVersion, enums: frozenset[int], row_filter: str | None = None) -> bool:
    """Whether every column of ``table`` has a :func:`column_sql`, and the publication's row
    filter has no ``?`` (an operator of jsonb's, which the driver would take for a parameter
    of the statement)."""
    return all(column_sql(c, enums) is not None for c in table.columns) and \
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


def chunk_rows(spark: Any, source: JdbcSource, *,
               table: TableVersion, row_filter: str | None, snapshot: str, lock_timeout_ms: int,
               chunks: list[tuple[int, int, int | None]], attempt: int, fields: list[str],
               kinds: list[str], enums: frozenset[int]) -> Any:
    """The rows of ``chunks`` (index, first page, end page or None) of ``table``: a column
    per field of Spark type ``kinds`` (streaming/bulk_load.py's), then ``_ordinal``; one
    Spark partition per chunk."""
    exprs = []
    for column, field in zip(table.columns, fields, strict=True):
        expr = column_sql(column, enums)
        assert expr is not None, column
        exprs.append(f"{expr} AS {_ident(field)}")
    where = f"WHERE ({row_filter})" if row_filter is not None else ""
    query = (f"(SELECT {', '.join([*exprs, 'ctid AS pgcdc_ctid'])} "
             f"FROM {quoted_table_name(table.schema, table.name)} {where}) AS pgcdc_chunk")
    predicates = []
    for _, start, end in chunks:
        bound = f"pgcdc_ctid >= '({start},0)'::pg_catalog.tid"
        if end is not None:
            bound += f" AND pgcdc_ctid < '({end},0)'::pg_catalog.tid"
        predicates.append(bound)
    properties = {**source.properties, "fetchsize": str(FETCH_ROWS),
                  "sessionInitStatement": session_init(snapshot, lock_timeout_ms)}
    rows = spark.read.jdbc(source.url, query, predicates=predicates, properties=properties)
    # the row's place in its partition (= chunk): the low bits of monotonically_increasing_id
    place = "(monotonically_increasing_id() & 8589934591)"
    bases = ", ".join(f"CAST({ordinal(attempt, index, 0)} AS BIGINT)" for index, _, _ in chunks)
    too_large = sql_text.literal(
        f"a chunk of {table.schema}.{table.name} holds more than {MAX_CHUNK_ROWS} rows: "
        "load again with a smaller chunk size (chunk_pages)")
    position = (f"CASE WHEN {place} >= {MAX_CHUNK_ROWS} THEN raise_error({too_large}) "
                f"ELSE element_at(array({bases}), spark_partition_id() + 1) + {place} END")
    assert CHUNK_BITS + ROW_BITS < 63
    columns = [f"CAST({quote(f)} AS {k}) AS {quote(f)}"
               for f, k in zip(fields, kinds, strict=True)]
    return rows.selectExpr(*columns, f"CAST({position} AS BIGINT) AS _ordinal")
