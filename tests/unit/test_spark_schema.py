"""Catalog versions into Spark types (pure logic, no Spark session)."""

from __future__ import annotations

import json

import pytest

from decoder import values
from snapshot_builder.catalog import Column, TableVersion, table_from_dict, with_base_types
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


# --- domains: the base type a published column record names (issue 15, point 7) -------------

POSINT, PRICE, DEAR, MOOD, LABEL = 70001, 70002, 70003, 70004, 70005
_DOMAINS = {POSINT: (values.INT4, -1), PRICE: (values.NUMERIC, (10 << 16 | 2) + 4),
            DEAR: (PRICE, -1), LABEL: (values.TEXT, -1)}


def _published(columns: tuple[Column, ...]) -> TableSpec:
    """A table version as the catalog topic carries it, read back by the Spark side."""
    table = with_base_types(TableVersion(1, "s", "t", "d", columns), _DOMAINS.get)
    return TableSpec.from_json(json.dumps(dict(table.to_dict(), lsn=1, topic="x")))


def test_a_domain_lands_as_its_base_type() -> None:
    spec = _published((
        Column("id", values.INT4, "int4", -1, True),
        Column("p", POSINT, "public.posint", -1, False),
        Column("price", PRICE, "public.price", -1, False),
        Column("dear", DEAR, "public.dear_price", -1, False),  # a domain over a domain
        Column("label", LABEL, "public.label", -1, False),
        Column("mood", MOOD, "public.mood", -1, False),  # an enum: not a domain
    ))
    assert [(c.name, c.spark_type) for c in spec.columns] == [
        ("id", "int"), ("p", "int"), ("price", "decimal(10,2)"), ("dear", "decimal(10,2)"),
        ("label", "string"), ("mood", "string")]
    assert [c.base_type for c in spec.columns] == [None, "int4", "numeric", "numeric", "text",
                                                   None]


def test_old_records_without_base_types_still_read() -> None:
    raw = json.dumps({"oid": 1, "schema": "s", "name": "t", "version": "v", "lsn": 1,
                      "columns": [{"name": "p", "type_name": "public.posint", "typmod": -1,
                                   "key": True}]})
    (column,) = TableSpec.from_json(raw).columns
    assert (column.base_type, column.spark_type) == (None, "string")


def test_base_types_are_not_part_of_the_version() -> None:
    columns = (Column("p", POSINT, "public.posint", -1, True),)
    plain = TableVersion(1, "s", "t", "d", columns)
    described = with_base_types(plain, _DOMAINS.get)
    assert described.version == plain.version and described.columns[0].base_type == "int4"
    assert with_base_types(described, _DOMAINS.get) is described
    assert table_from_dict(described.to_dict()).columns[0].base_type == "int4"


@pytest.mark.parametrize(("type_name", "typmod", "lossy"), [
    ("numeric", (10 << 16 | 2) + 4, True),  # NaN
    ("timestamp", -1, True),  # past Spark's greatest
    ("timestamptz", -1, True),
    ("numeric", -1, False),  # a string: every value as its text
    ("int4", -1, False),
    ("float8", -1, False),  # NaN and infinities are floats
    ("date", -1, False),  # Spark's dates reach past PostgreSQL's
    ("text", -1, False),
])
def test_which_values_a_typed_column_cannot_hold(type_name: str, typmod: int,
                                                 lossy: bool) -> None:
    entry = ColumnSpec("c", type_name, typmod, False).untyped("t")
    assert (entry is not None) == lossy
    if entry is not None:
        assert entry.startswith("CASE WHEN t IS NOT NULL AND (") and entry.endswith("THEN t END")
