"""Catalog versions into Spark types (pure logic, no Spark session)."""

from __future__ import annotations

import json

import pytest

from streaming.schema import CatalogLog, ColumnSpec, TableSpec


@pytest.mark.parametrize(("type_name", "typmod", "spark"), [
    ("int4", -1, "int"),
    ("int8", -1, "bigint"),
    ("numeric", (12 << 16 | 2) + 4, "decimal(12,2)"),
    ("numeric", -1, "string"),  # unconstrained numeric: exact text
    ("numeric", (60 << 16 | 2) + 4, "string"),  # wider than Spark's 38 digits
    ("timestamptz", -1, "timestamp"),
    ("timestamp", -1, "timestamp_ntz"),
    ("bytea", -1, "binary"),
    ("jsonb", -1, "string"),
    ("public.mood", -1, "string"),
])
def test_spark_types(type_name: str, typmod: int, spark: str) -> None:
    assert ColumnSpec("c", type_name, typmod, False).spark_type == spark


def _spec(oid: int, version: str, lsn: int) -> str:
    return json.dumps({"oid": oid, "schema": "s", "name": "t", "version": version, "lsn": lsn,
                       "columns": [{"name": "id", "type_name": "int4", "typmod": -1,
                                    "key": True}]})


def test_catalog_log_lookup_and_latest() -> None:
    raw = [_spec(1, "b", 20), _spec(1, "a", 10), _spec(1, "a", 30), _spec(2, "x", 5)]
    log = CatalogLog([TableSpec.from_json(r) for r in raw])
    assert len(log) == 3
    assert log.latest(1).version == "b"
    assert log.version(1, "a") is not None and log.version(1, "zz") is None
    assert sorted(t.oid for t in log.tables()) == [1, 2]
