"""Table versions from the catalog log, and their Spark shapes.

The catalog log (the ``<prefix>._catalog`` topic) holds every table version
pgcdc published, each with the LSN it counts from, its topic and its Avro writer
schema.  :class:`CatalogLog` answers "which versions exist" and, ordered by those
LSNs, "what is the newest shape of this table", from Kafka alone: no driver-local
files.  The job resolves tables through the catalog history (streaming/catalog.py)
and falls back on this order only for a table the history does not hold (no DDL
capture).

Column values arrive as text (the JSON envelope's, or an Avro string; sinks/envelope.py)
and are cast to the Spark type of the column's PostgreSQL type here.  The lake
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

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from core import wire

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


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    type_name: str
    typmod: int
    is_key: bool
    attnum: int | None = None  # the column's identity across renames (captured DDL only)
    # a domain column: its built-in base type and typmod (the catalog record's
    # ``base_type``/``base_typmod``, sinks publish them); None in records from before
    base_type: str | None = None
    base_typmod: int = -1

    @classmethod
    def from_record(cls, c: dict[str, Any]) -> ColumnSpec:
        """A column of a ``_catalog`` record (``Column.to_dict`` of snapshot_builder/catalog.py)."""
        attnum = c.get(wire.COLUMN_ATTNUM)
        return cls(c[wire.COLUMN_NAME], c[wire.COLUMN_TYPE_NAME], int(c[wire.COLUMN_TYPMOD]),
                   bool(c[wire.COLUMN_KEY]), int(attnum) if attnum is not None else None,
                   c.get(wire.COLUMN_BASE_TYPE), int(c.get(wire.COLUMN_BASE_TYPMOD, -1)))

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
    oid: int
    schema: str
    name: str
    version: str
    lsn: int
    topic: str
    columns: tuple[ColumnSpec, ...]
    value_format: str = wire.FORMAT_JSON
    value_schema: str | None = None  # the Avro writer schema (JSON), for value_format avro
    # pg_class.relreplident ('d', 'i', 'f', 'n'); None in records from before it was read
    replica_identity: str | None = None
    # the Avro writer schema's column types: text (strings where Avro has no primitive) or
    # logical (typed Avro, pgcdc run --avro-types logical, sinks/avro_logical.py)
    avro_types: str = wire.AVRO_TYPES_TEXT

    @property
    def key_columns(self) -> tuple[ColumnSpec, ...]:
        return tuple(c for c in self.columns if c.is_key)

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.name}"

    @classmethod
    def from_json(cls, raw: str | bytes) -> TableSpec:
        """A ``<prefix>._catalog`` record."""
        data: dict[str, Any] = json.loads(raw)
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TableSpec:
        """A ``_catalog`` record as a dict, or a catalog history's table (its ``to_dict``,
        which the record extends with ``lsn``, ``topic`` and the writer schema)."""
        columns = tuple(ColumnSpec.from_record(c) for c in data[wire.CATALOG_COLUMNS])
        return cls(int(data[wire.CATALOG_OID]), data[wire.CATALOG_SCHEMA],
                   data[wire.CATALOG_NAME], data[wire.CATALOG_VERSION],
                   int(data.get(wire.CATALOG_LSN, 0)), data.get(wire.CATALOG_TOPIC, ""), columns,
                   data.get(wire.CATALOG_VALUE_FORMAT, wire.FORMAT_JSON),
                   data.get(wire.CATALOG_VALUE_SCHEMA),
                   data.get(wire.CATALOG_REPLICA_IDENTITY),
                   data.get(wire.CATALOG_AVRO_TYPES, wire.AVRO_TYPES_TEXT))


class CatalogLog:
    """Every published table version, by OID and version."""

    def __init__(self, specs: list[TableSpec]) -> None:
        self._versions: dict[tuple[int, str], TableSpec] = {}
        self._by_oid: dict[int, list[TableSpec]] = {}
        for spec in specs:
            if (spec.oid, spec.version) not in self._versions:
                self._versions[(spec.oid, spec.version)] = spec
                self._by_oid.setdefault(spec.oid, []).append(spec)
        for versions in self._by_oid.values():
            versions.sort(key=lambda s: s.lsn)
            _borrow_identities(versions)
        for oid, version in list(self._versions):
            self._versions[(oid, version)] = next(
                s for s in self._by_oid[oid] if s.version == version)

    def version(self, oid: int, version: str) -> TableSpec | None:
        return self._versions.get((oid, version))

    def by_version(self, version: str) -> TableSpec | None:
        """Any table's spec with this version: equal versions have equal writer schemas."""
        return next((s for (_, v), s in self._versions.items() if v == version), None)

    def latest(self, oid: int) -> TableSpec:
        return self._by_oid[oid][-1]

    def versions(self, oid: int) -> list[TableSpec]:
        """Every version of one table, oldest first."""
        return list(self._by_oid.get(oid, []))

    def tables(self) -> list[TableSpec]:
        """The newest version of every table."""
        return [versions[-1] for versions in self._by_oid.values()]

    def __len__(self) -> int:
        return len(self._versions)


def _borrow_identities(versions: list[TableSpec]) -> None:
    """A version described by a Relation message (no attnums) takes the attnums of a
    captured version with the same layout (the part of the version before the dot):
    same columns, types and order, so the same columns."""
    captured = {v.version.split(".")[0]: v for v in versions
                if all(c.attnum is not None for c in v.columns) and v.columns}
    for i, spec in enumerate(versions):
        donor = captured.get(spec.version.split(".")[0])
        if donor is None or any(c.attnum is not None for c in spec.columns) \
                or [c.name for c in donor.columns] != [c.name for c in spec.columns]:
            continue
        columns = tuple(dataclasses.replace(c, attnum=d.attnum)
                        for c, d in zip(spec.columns, donor.columns, strict=True))
        versions[i] = dataclasses.replace(spec, columns=columns)


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
