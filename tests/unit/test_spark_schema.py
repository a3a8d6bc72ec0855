"""Catalog versions into Spark types (pure logic, no Spark session)."""

from __future__ import annotations

import json

import pytest

from decoder import values
from snapshot_builder.catalog import Column, TableVersion, table_from_dict, with_base_types
from streaming.catalog import CatalogLog
from streaming.schema import ColumnSpec, TableSpec


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
    assert ColumnSpec.of_type(type_name, typmod).spark_type == spark


def _version(oid: int, *names: str, attnums: bool = False) -> TableVersion:
    return TableVersion(oid, "s", "t", "d", tuple(
        Column(n, values.INT4, "int4", -1, i == 0, attnum=i + 1 if attnums else None)
        for i, n in enumerate(names)))


def _record(table: TableVersion, lsn: int) -> str:
    """A ``_catalog`` record (sinks/kafka.py catalog_record)."""
    return json.dumps(dict(table.to_dict(), lsn=lsn, topic="x"))


def test_catalog_log_lookup_and_latest() -> None:
    a, b, x = _version(1, "id"), _version(1, "id", "b"), _version(2, "id")
    raw = [_record(b, 20), _record(a, 10), _record(a, 30), _record(x, 5)]
    log = CatalogLog([TableSpec.from_json(r) for r in raw])
    assert len(log) == 3
    assert log.latest(1).version == b.version  # by published LSN, not by topic order
    assert [(s.version, s.lsn) for s in log.versions(1)] == [(a.version, 10), (b.version, 20)]
    assert log.version(1, a.version) is not None and log.version(1, "zz") is None
    assert log.born(1) == 10 and log.born(2) == 5 and log.born(3) is None
    assert sorted(t.oid for t in log.tables()) == [1, 2]
    # the order is the records' own history's: one put_table per version, at its LSN
    assert [(e.lsn, e.change.table.version) for e in log.history.entries()  # type: ignore[union-attr]
            ] == [(5, x.version), (10, a.version), (20, b.version)]


def test_a_spec_is_the_builders_table_version() -> None:
    table = _version(1, "id", "b", attnums=True)
    spec = TableSpec.from_json(_record(table, 7))
    assert spec.table == table and spec.table.version == table.version
    assert (spec.oid, spec.schema, spec.name, spec.qualified_name, spec.replica_identity) \
        == (1, "s", "t", "s.t", "d")
    assert [c.column for c in spec.columns] == list(table.columns)
    assert [c.name for c in spec.key_columns] == ["id"] and [c.attnum for c in spec.columns] \
        == [1, 2]
    assert (spec.lsn, spec.topic) == (7, "x")


def test_relation_versions_borrow_the_identities_of_a_captured_layout() -> None:
    """A version a Relation message described (no attnums) takes the attnums of a captured
    version with the same columns; its own version is kept.  Another layout borrows none."""
    captured, described = _version(1, "id", "b", attnums=True), _version(1, "id", "b")
    other = _version(1, "id", "c")
    assert captured.layout == described.layout and captured.version != described.version
    log = CatalogLog([TableSpec.from_json(_record(t, lsn))
                      for t, lsn in ((captured, 10), (described, 20), (other, 30))])
    borrowed = log.version(1, described.version)
    assert borrowed is not None and borrowed.version == described.version
    assert [c.attnum for c in borrowed.columns] == [1, 2]
    assert borrowed.table == described  # the builder's version, unchanged
    assert [c.attnum for c in log.versions(1)[1].columns] == [1, 2]
    assert [c.attnum for c in log.latest(1).columns] == [None, None]


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
    # a record as pgcdc published it before it named base types (no base_type keys)
    raw = _record(TableVersion(1, "s", "t", "d", (Column("p", POSINT, "public.posint", -1,
                                                         True),)), 1)
    assert "base_type" not in raw
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
    entry = ColumnSpec.of_type(type_name, typmod).untyped("t")
    assert (entry is not None) == lossy
    if entry is not None:
        assert entry.startswith("CASE WHEN t IS NOT NULL AND (") and entry.endswith("THEN t END")
