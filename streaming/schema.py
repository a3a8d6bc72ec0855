"""Table versions from the catalog log, and their Spark shapes.

The catalog log (the ``<prefix>._catalog`` topic) holds every table version
pgcdc published, each with the LSN where it took effect.  :class:`CatalogLog`
answers "which versions exist" and "what is the newest shape of this table",
from Kafka alone: no driver-local files.

Column values arrive as JSON (sinks/envelope.py) and are read as strings, then
cast to the Spark type of the column's PostgreSQL type here.  Types without an
exact Spark counterpart stay strings, exactly as PostgreSQL printed them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

NUMERIC_MAX_PRECISION = 38

# pgcdc's own columns in every lake table: the position of the change that wrote the row
COMMIT_LSN = "_pgcdc_commit_lsn"
ORDINAL = "_pgcdc_ordinal"


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    type_name: str
    typmod: int
    is_key: bool

    @property
    def spark_type(self) -> str:
        """The Spark SQL type name for this column."""
        simple = {
            "bool": "boolean", "int2": "smallint", "int4": "int", "int8": "bigint",
            "oid": "bigint", "float4": "float", "float8": "double", "date": "date",
            "timestamp": "timestamp_ntz", "timestamptz": "timestamp", "bytea": "binary",
        }
        if self.type_name in simple:
            return simple[self.type_name]
        if self.type_name == "numeric" and self.typmod >= 4:
            precision = ((self.typmod - 4) >> 16) & 0xFFFF
            scale = (self.typmod - 4) & 0xFFFF
            if 0 < precision <= NUMERIC_MAX_PRECISION and scale <= precision:
                return f"decimal({precision},{scale})"
        return "string"

    def cast(self, text_expr: str) -> str:
        """A Spark SQL expression turning the JSON text of a value into this column's type."""
        spark_type = self.spark_type
        if spark_type == "string":
            return text_expr
        if spark_type == "binary":
            return f"unbase64({text_expr})"
        return f"CAST({text_expr} AS {spark_type})"


@dataclass(frozen=True)
class TableSpec:
    oid: int
    schema: str
    name: str
    version: str
    lsn: int
    topic: str
    columns: tuple[ColumnSpec, ...]
    value_format: str = "json"
    value_schema: str | None = None  # the Avro writer schema (JSON), for value_format avro

    @property
    def key_columns(self) -> tuple[ColumnSpec, ...]:
        return tuple(c for c in self.columns if c.is_key)

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.name}"

    @classmethod
    def from_json(cls, raw: str | bytes) -> TableSpec:
        data: dict[str, Any] = json.loads(raw)
        columns = tuple(
            ColumnSpec(c["name"], c["type_name"], int(c["typmod"]), bool(c["key"]))
            for c in data["columns"]
        )
        return cls(int(data["oid"]), data["schema"], data["name"], data["version"],
                   int(data.get("lsn", 0)), data.get("topic", ""), columns,
                   data.get("value_format", "json"), data.get("value_schema"))


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

    def version(self, oid: int, version: str) -> TableSpec | None:
        return self._versions.get((oid, version))

    def by_version(self, version: str) -> TableSpec | None:
        """Any table's spec with this version: equal versions have equal writer schemas."""
        return next((s for (_, v), s in self._versions.items() if v == version), None)

    def latest(self, oid: int) -> TableSpec:
        return self._by_oid[oid][-1]

    def tables(self) -> list[TableSpec]:
        """The newest version of every table."""
        return [versions[-1] for versions in self._by_oid.values()]

    def __len__(self) -> int:
        return len(self._versions)
