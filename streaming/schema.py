"""Table versions as the lake applies them, and their Spark shapes.

A :class:`TableSpec` is the builder's own table version
(:class:`snapshot_builder.catalog.TableVersion`, read back from its catalog record by the
builder's :func:`~snapshot_builder.catalog.table_from_dict`) beside what its publication
adds (the ``<prefix>._catalog`` record's LSN, topic, value format and Avro writer schema);
a :class:`ColumnSpec` is a column of it as the lake holds it: its Spark type and the casts
into it.  Which versions exist and in which order they took effect is the catalog's
business (streaming/catalog.py: the builder's history, replayed).

Column values arrive as text (the JSON envelope's, or a text-mode Avro string;
sinks/envelope.py) and are cast to the Spark type of the column's PostgreSQL type here; a
typed Avro value goes straight into that type (streaming/decode.py).  The lake
representation per type (tests/integration/test_spark_types.py checks each against
PostgreSQL):

* ``bool`` boolean; ``int2``/``int4``/``int8`` smallint/int/bigint; ``oid`` bigint;
* ``float4``/``float8`` float/double, NaN and infinities kept;
* ``numeric(p,s)`` with p <= 38: decimal(p,s), a NaN there is NULL in the column and
  ``NaN`` in the row's ``_pgcdc_text`` (Spark decimals have none); any other ``numeric``
  (unconstrained, or wider than 38 digits): string, the exact decimal (``NaN``,
  ``Infinity`` spelled); ``money``: string, the exact amount;
* ``bytea`` binary;
* ``date`` date; ``timestamp`` timestamp_ntz; ``timestamptz`` timestamp (UTC).  BC dates
  and years past 9999 are kept (Spark's range is wider); ``infinity``/``-infinity`` are
  Spark's greatest/least value of the type; a timestamp past Spark's greatest
  (+294247-01-10 04:00:54.775807; PostgreSQL allows up to 294276) is NULL, its text in
  the row's ``_pgcdc_text``;
* a domain: as its base type (a domain over ``numeric(10,2)`` is decimal(10,2));
* every other type: string, as the envelope writes it: ``time``/``timetz`` and
  ``interval`` ISO 8601, ``pg_lsn`` a number, ranges/multiranges, geometric types,
  composites and arrays JSON, everything else (text types, uuid, json/jsonb, xml, bit
  strings, MAC and network addresses, text search types, enum labels, domains over
  those) PostgreSQL's text.

Whatever a typed column cannot hold is never silently NULL: every lake table has the
column ``_pgcdc_text`` (:data:`TEXT`), a map from column name to PostgreSQL's text of
each value of the row whose typed column is NULL though the value is not.  docs/types.md
has the whole table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from core import wire
from snapshot_builder.catalog import Column, TableVersion, table_from_dict

NUMERIC_MAX_PRECISION = 38

# pgcdc's own columns in every lake table: the position of the change that wrote the row
COMMIT_LSN = "_pgcdc_commit_lsn"
ORDINAL = "_pgcdc_ordinal"
# and, per row, PostgreSQL's text of each value its typed column cannot hold (that column
# NULL there: a NaN in a decimal, a timestamp past Spark's); NULL or empty when none
TEXT = "_pgcdc_text"
TEXT_TYPE = "map<string,string>"

_SIMPLE = {
    "bool": "boolean", "int2": "smallint", "int4": "int", "int8": "bigint",
    "oid": "bigint", "float4": "float", "float8": "double", "date": "date",
    "timestamp": "timestamp_ntz", "timestamptz": "timestamp", "bytea": "binary",
}
# Spark types some of whose PostgreSQL values they cannot hold (see :meth:`ColumnSpec.untyped`)
_NARROWER = ("timestamp", "timestamp_ntz")


@dataclass(frozen=True, slots=True)
class ColumnSpec:
    """A catalog column (the builder's :class:`~snapshot_builder.catalog.Column`) as the
    lake holds it: its Spark type and the casts into it.  ``identity``: the column's attnum
    where the column itself has none (a version a Relation message described), borrowed
    from a captured version of the same layout (:class:`streaming.catalog.CatalogLog`)."""

    column: Column
    identity: int | None = None

    @classmethod
    def of_type(cls, type_name: str, typmod: int = -1, *, name: str = "",
                is_key: bool = False) -> ColumnSpec:
        """The Spark mapping of a type known by its name alone (an array's element, a
        literal of a key), not a column of a table version: its type OID is not known (0)."""
        return cls(Column(name, 0, type_name, typmod, is_key))

    @property
    def name(self) -> str:
        return self.column.name

    @property
    def type_name(self) -> str:
        return self.column.type_name

    @property
    def typmod(self) -> int:
        return self.column.typmod

    @property
    def is_key(self) -> bool:
        return self.column.is_key

    @property
    def attnum(self) -> int | None:
        """The column's identity across renames (captured DDL only, or borrowed)."""
        return self.column.attnum if self.column.attnum is not None else self.identity

    @property
    def base_type(self) -> str | None:
        """A domain column's built-in base type (records from before name none)."""
        return self.column.base_type

    @property
    def base_typmod(self) -> int:
        return self.column.base_typmod

    @property
    def pg_type(self) -> str:
        """The type whose values the column holds: a domain's base type, else its own."""
        return self.base_type if self.base_type is not None else self.type_name

    @property
    def pg_typmod(self) -> int:
        return self.base_typmod if self.base_type is not None else self.typmod

    @property
    def spark_type(self) -> str:
        """The Spark SQL type name for this column (a domain's: its base type's)."""
        type_name, typmod = self.pg_type, self.pg_typmod
        if type_name in _SIMPLE:
            return _SIMPLE[type_name]
        if type_name == "numeric" and typmod >= 4:
            precision = ((typmod - 4) >> 16) & 0xFFFF
            scale = (typmod - 4) & 0xFFFF
            if 0 < precision <= NUMERIC_MAX_PRECISION and scale <= precision:
                return f"decimal({precision},{scale})"
        return "string"

    def untyped(self, text_expr: str) -> str | None:
        """A Spark SQL expression: the text of the value when :meth:`cast` gives NULL for it
        though it is not NULL (a NaN in a decimal, a timestamp past Spark's greatest), else
        NULL; the value's entry in :data:`TEXT`.  None for a type that holds every value."""
        spark_type = self.spark_type
        if not (spark_type in _NARROWER or spark_type.startswith("decimal")):
            return None
        return (f"CASE WHEN {text_expr} IS NOT NULL AND ({self.cast(text_expr)}) IS NULL "
                f"THEN {text_expr} END")

    def cast(self, text_expr: str) -> str:
        """A Spark SQL expression turning the JSON text of a value into this column's type."""
        spark_type = self.spark_type
        if spark_type == "string":
            return text_expr
        if spark_type == "binary":
            return f"unbase64({text_expr})"
        if spark_type in _EXTREMES:
            return _temporal(text_expr, spark_type)
        if spark_type in ("float", "double"):  # NaN and infinities may arrive quoted (JSON)
            return f"CAST(btrim({text_expr}, '\"') AS {spark_type})"
        if spark_type.startswith("decimal"):  # a constrained numeric may hold NaN
            return (f"CASE WHEN {text_expr} = 'NaN' THEN NULL "
                    f"ELSE CAST({text_expr} AS {spark_type}) END")
        return f"CAST({text_expr} AS {spark_type})"


# PostgreSQL's infinities become the type's greatest and least Spark values
_EXTREMES = {
    "date": ("date_from_unix_date(2147483647)", "date_from_unix_date(-2147483648)"),
    "timestamp": ("timestamp_micros(9223372036854775807)",
                  "timestamp_micros(-9223372036854775808)"),
    "timestamp_ntz": ("CAST(timestamp_micros(9223372036854775807) AS TIMESTAMP_NTZ)",
                      "CAST(timestamp_micros(-9223372036854775808) AS TIMESTAMP_NTZ)"),
}


def _temporal(t: str, spark_type: str) -> str:
    """Dates and timestamps: ISO 8601 text, or the server's text where Python could not
    hold the value (``infinity``, BC, a year past 9999).  A BC year ``y`` is the ISO year
    ``1 - y``; a timestamp past Spark's greatest (+294247-01-10) is NULL."""
    greatest, least = _EXTREMES[spark_type]
    year = f"CAST(regexp_extract({t}, '^([0-9]+)', 1) AS INT)"
    signed = (f"concat(CASE WHEN {year} = 1 THEN '' ELSE '-' END, "
              f"lpad(CAST({year} - 1 AS STRING), 4, '0'), "
              f"regexp_replace(substr({t}, 1, length({t}) - 3), '^[0-9]+', ''))")
    return (f"CASE WHEN {t} = 'infinity' THEN {greatest} WHEN {t} = '-infinity' THEN {least} "
            f"WHEN {t} LIKE '% BC' THEN CAST({signed} AS {spark_type}) "
            f"WHEN {t} RLIKE '^[0-9]{{6}}' THEN try_cast({t} AS {spark_type}) "
            f"ELSE CAST({t} AS {spark_type}) END")


@dataclass(frozen=True)
class TableSpec:
    """A table version as the lake applies it: the builder's own
    :class:`~snapshot_builder.catalog.TableVersion` (``table``: its OID, names, version,
    replica identity and columns), and what its ``<prefix>._catalog`` record adds: the LSN
    it was published at (or took effect at, in the catalog history), its events' topic and
    format, the Avro writer schema and its column types."""

    table: TableVersion
    lsn: int = 0
    topic: str = ""
    value_format: str = wire.FORMAT_JSON
    value_schema: str | None = None  # the Avro writer schema (JSON), for value_format avro
    # the Avro writer schema's column types: text (strings where Avro has no primitive) or
    # logical (typed Avro, pgcdc run --avro-types logical, sinks/avro_logical.py)
    avro_types: str = wire.AVRO_TYPES_TEXT
    # the columns' attnums where ``table`` has none (a version a Relation message
    # described), borrowed from a captured version of the same layout; None: its own
    attnums: tuple[int | None, ...] | None = None
    # the lake table of the key columns alone (a table's tombstones, streaming/tombstones.py)
    only_keys: bool = False
    columns: tuple[ColumnSpec, ...] = field(init=False, repr=False, compare=False)
    key_columns: tuple[ColumnSpec, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        attnums = self.attnums if self.attnums is not None else (None,) * len(self.table.columns)
        columns = tuple(ColumnSpec(c, a)
                        for c, a in zip(self.table.columns, attnums, strict=True))
        keys = tuple(c for c in columns if c.is_key)
        object.__setattr__(self, "columns", keys if self.only_keys else columns)
        object.__setattr__(self, "key_columns", keys)

    @property
    def oid(self) -> int:
        return self.table.oid

    @property
    def schema(self) -> str:
        return self.table.schema

    @property
    def name(self) -> str:
        return self.table.name

    @property
    def version(self) -> str:
        return self.table.version

    @property
    def replica_identity(self) -> str:
        """pg_class.relreplident: ``d``, ``i``, ``f`` or ``n``."""
        return self.table.replica_identity

    @property
    def qualified_name(self) -> str:
        return self.table.qualified_name

    @classmethod
    def from_json(cls, raw: str | bytes) -> TableSpec:
        """A ``<prefix>._catalog`` record."""
        data: dict[str, Any] = json.loads(raw)
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TableSpec:
        """A ``_catalog`` record as a dict: a table version's ``to_dict``, read back by the
        builder's own :func:`~snapshot_builder.catalog.table_from_dict` (its version taken
        as published, as the history's replay takes it), extended with ``lsn``, ``topic``
        and the writer schema (core/wire.py)."""
        return cls(table_from_dict(data, verify=False), int(data.get(wire.CATALOG_LSN, 0)),
                   data.get(wire.CATALOG_TOPIC, ""),
                   data.get(wire.CATALOG_VALUE_FORMAT, wire.FORMAT_JSON),
                   data.get(wire.CATALOG_VALUE_SCHEMA),
                   data.get(wire.CATALOG_AVRO_TYPES, wire.AVRO_TYPES_TEXT))


def retyped_versions(spec: TableSpec, versions: list[TableSpec]) -> dict[str, list[str]]:
    """Per column of ``spec``, the versions in which the same column (by ``attnum``, else by
    name) had another Spark type: their values are the old type's text (an ``ALTER COLUMN
    ... TYPE`` since, which PostgreSQL applied by rewriting the table, and pgcdc by reading
    it again).  Only columns with such versions are returned."""
    out: dict[str, list[str]] = {}
    for column in spec.columns:
        for version in versions:
            if version.version == spec.version:
                continue
            same = next((c for c in version.columns
                         if (c.attnum == column.attnum if column.attnum is not None
                             and c.attnum is not None else c.name == column.name)), None)
            if same is not None and same.spark_type != column.spark_type:
                out.setdefault(column.name, []).append(version.version)
    return out


def renamed_names(spec: TableSpec, versions: list[TableSpec]) -> dict[str, dict[str, str | None]]:
    """Per column of ``spec``, the versions that call it by another name (or do not have it).

    A column is identified by its ``attnum``, which PostgreSQL keeps across a rename: in an
    older version, the column with the same attnum is the same column whatever its name,
    and a column of the same name but another attnum (dropped and added again) is not.
    Columns without an attnum (no captured DDL) are matched by name.  Only differences are
    returned: ``{name in spec: {version: name in that version, or None}}``.
    """
    out: dict[str, dict[str, str | None]] = {}
    for column in spec.columns:
        if column.attnum is None:
            continue
        for version in versions:
            if version.version == spec.version:
                continue
            by_attnum = {c.attnum: c.name for c in version.columns if c.attnum is not None}
            if not by_attnum:
                continue  # an old version without attnums: by name
            old = by_attnum.get(column.attnum)
            if old != column.name and (old is not None
                                       or any(c.name == column.name for c in version.columns)):
                out.setdefault(column.name, {})[version.version] = old
    return out
