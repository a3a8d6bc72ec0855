"""streaming/jdbc_read.py's pure parts: which columns the JVM reads and how, the tasks' first
statement, and the JDBC source of a connection (tests/integration/test_spark_bulk_load.py
reads through it against a real server and compares with the Python tasks' rows)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from snapshot_builder.catalog import Column, TableVersion
from streaming import jdbc_read

ENUM = 16500


def _column(type_name: str, type_oid: int, typmod: int = -1) -> Column:
    return Column("c", type_oid, type_name, typmod, False)


_FORMAT = """CASE WHEN "c" IS NOT NULL THEN pg_catalog.format('%s', "c") END"""


@pytest.mark.parametrize(("type_name", "type_oid", "typmod", "expected"), [
    ("int4", 23, -1, ('"c"', "int", "cast")),
    ("int2", 21, -1, ('"c"', "smallint", "cast")),
    ("bytea", 17, -1, ('"c"', "binary", "cast")),
    ("oid", 26, -1, ('"c"::pg_catalog.int8', "bigint", "cast")),
    ("text", 25, -1, ('"c"', "string", "cast")),
    ("bpchar", 1042, 9, (_FORMAT, "string", "cast")),
    ("mood", ENUM, -1, (_FORMAT, "string", "cast")),
    ("_int8", 1016, -1, ('pg_catalog.array_to_json("c")::pg_catalog.text', "string", "cast")),
    # not read on the JVM: a string lake column whose text Python spells otherwise, types
    # the stream decodes into other texts, a domain
    ("float4", 700, -1, ('"c"', "double", "cast")),
    ("interval", 1186, -1, None),
    ("_text", 1009, -1, None),
    ("inet", 869, -1, None),
    ("money", 790, -1, None),
    ("positive", 16600, -1, None),
])
def test_column_read(type_name: str, type_oid: int, typmod: int,
                     expected: tuple[str, str, str] | None) -> None:
    read = jdbc_read.column_read(_column(type_name, type_oid, typmod), frozenset({ENUM}))
    assert (read if read is None else (read.sql, read.kind, read.lake)) == expected
    assert read is None or read.text_sql is None


def test_a_decimal_is_read_typed_and_its_nan_as_text() -> None:
    read = jdbc_read.column_read(_column("numeric", 1700, (10 << 16 | 2) + 4), frozenset())
    assert read is not None and read.kind == "decimal(10,2)"
    assert read.sql == """CASE WHEN "c" = 'NaN'::pg_catalog.numeric THEN NULL ELSE "c" END"""
    assert read.text_sql == """CASE WHEN "c" = 'NaN'::pg_catalog.numeric THEN 'NaN' END"""
    # an unconstrained numeric is a string in the lake: Python's text of the decimal
    # (test_spark_bulk_load.py compares it with the Python read's, 0E-8 and 1.230E-7 included)
    read = jdbc_read.column_read(_column("numeric", 1700), frozenset())
    assert read is not None and (read.kind, read.lake, read.text_sql) == ("string", "cast", None)
    assert "|| 'E' ||" in read.sql and "pg_catalog.scale(\"c\")" in read.sql


def test_dates_and_timestamps_are_read_as_numbers() -> None:
    date = jdbc_read.column_read(_column("date", 1082), frozenset())
    assert date is not None and (date.kind, date.lake, date.text_sql) == ("int", "days", None)
    assert """THEN "c" - '1970-01-01'::pg_catalog.date""" in date.sql
    tz = jdbc_read.column_read(_column("timestamptz", 1184), frozenset())
    assert tz is not None and (tz.kind, tz.lake) == ("bigint", "micros")
    assert "EXTRACT(epoch FROM \"c\") * 1000000" in tz.sql
    # past Spark's greatest timestamp: NULL, the server's text beside it
    greatest = "'294247-01-10 04:00:54.775807+00'::pg_catalog.timestamptz"
    assert f"\"c\" <= {greatest}" in tz.sql
    assert tz.text_sql is not None and f"\"c\" > {greatest}" in tz.text_sql
    ts = jdbc_read.column_read(_column("timestamp", 1114), frozenset())
    assert ts is not None and ts.lake == "micros_ntz" and "+00" not in ts.sql


def test_readable_needs_every_column() -> None:
    def table(*columns: Column) -> TableVersion:
        return TableVersion(1, "public", "t", "d", columns)

    assert jdbc_read.readable(table(_column("int4", 23), _column("text", 25)), frozenset())
    assert not jdbc_read.readable(table(_column("int4", 23), _column("interval", 1186)),
                                  frozenset())
    assert jdbc_read.readable(table(_column("int4", 23)), frozenset(), "(c > 3)")
    assert not jdbc_read.readable(table(_column("int4", 23)), frozenset(), "(doc ? 'k'::text)")


def test_session_init_imports_the_snapshot_first() -> None:
    init = jdbc_read.session_init("00000004-0000000A-1", 2500)
    statements = [s.strip() for s in init.split(";")]
    assert statements[:2] == ["BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
                              "SET TRANSACTION SNAPSHOT '00000004-0000000A-1'"]
    assert "SET LOCAL lock_timeout = '2500'" in statements
    assert "SET LOCAL TimeZone = 'UTC'" in statements
    assert "SET LOCAL DateStyle = 'ISO'" in statements


@dataclass
class _Info:
    host: str = "db.example"
    port: int = 5433
    dbname: str = "app db"
    user: str = "loader"
    password: str | None = "s3cret"
    parameters: dict[str, str] = field(default_factory=dict)

    def get_parameters(self) -> dict[str, str]:
        return self.parameters


@dataclass
class _Conn:
    info: _Info


def test_jdbc_source_of_a_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(jdbc_read.DISABLE_ENV, raising=False)
    conn: Any = _Conn(_Info(parameters={"sslmode": "verify-full", "sslrootcert": "/ca.pem",
                                        "connect_timeout": "7", "application_name": "x"}))
    source, why = jdbc_read.jdbc_source(conn)
    assert source is not None and why == ""
    assert source.url == "jdbc:postgresql://db.example:5433/app%20db"
    assert source.properties == {
        "driver": jdbc_read.DRIVER, "user": "loader", "password": "s3cret",
        "ApplicationName": "pgcdc lake load", "sslmode": "verify-full",
        "sslrootcert": "/ca.pem", "connectTimeout": "7"}
    source, _ = jdbc_read.jdbc_source(_Conn(_Info(host="::1", password=None)))  # type: ignore[arg-type]
    assert source is not None and source.url.startswith("jdbc:postgresql://[::1]:5433/")
    assert "password" not in source.properties and source.properties["sslmode"] == "prefer"


@pytest.mark.parametrize(("info", "reason"), [
    (_Info(host="/var/run/postgresql"), "Unix socket"),
    (_Info(host="a,b"), "several hosts"),
    (_Info(parameters={"sslcert": "/c.pem", "sslkey": "/k.pem"}), "'sslcert'"),
    (_Info(parameters={"channel_binding": "require"}), "channel_binding=require"),
])
def test_jdbc_source_refuses_what_the_driver_would_not_do_as_libpq(
        info: _Info, reason: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(jdbc_read.DISABLE_ENV, raising=False)
    source, why = jdbc_read.jdbc_source(_Conn(info))  # type: ignore[arg-type]
    assert source is None and reason in why


def test_jdbc_source_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(jdbc_read.DISABLE_ENV, "0")
    assert jdbc_read.jdbc_source(_Conn(_Info()))[0] is None  # type: ignore[arg-type]
