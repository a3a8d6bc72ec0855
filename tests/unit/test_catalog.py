"""Table versions: identical definitions, identical versions; layout and meta change apart."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from decoder.pgoutput import Relation, RelationColumn, Type
from pgcdc import catalog_view
from snapshot_builder.catalog import (
    Column,
    RelationCatalog,
    TableVersion,
    VersionMismatchError,
    table_from_dict,
)
from snapshot_builder.datatype import TypeDefinitionError, TypeVersion, builtin_type, type_from_dict
from snapshot_builder.history import HistoryFile

COLS = (RelationColumn(1, "id", 23, -1), RelationColumn(0, "v", 25, -1))


def _rel(oid: int = 1, name: str = "t", cols: tuple[RelationColumn, ...] = COLS,
         identity: str = "d") -> Relation:
    return Relation(None, oid, "public", name, identity, cols)


def test_identical_definitions_identical_versions() -> None:
    a, _ = RelationCatalog().observe(_rel())
    b, _ = RelationCatalog().observe(_rel())
    assert a.version == b.version


def test_repeated_relation_is_not_new() -> None:
    catalog = RelationCatalog()
    first, new1 = catalog.observe(_rel())
    second, new2 = catalog.observe(_rel())
    assert (new1, new2) == (True, False)
    assert second is first


def test_layout_changes_with_columns_meta_with_name() -> None:
    base, _ = RelationCatalog().observe(_rel())
    renamed, _ = RelationCatalog().observe(_rel(name="t2"))
    assert renamed.layout == base.layout and renamed.meta != base.meta
    widened, _ = RelationCatalog().observe(
        _rel(cols=(COLS[0], RelationColumn(0, "v", 1043, 14))))
    assert widened.layout != base.layout
    reordered, _ = RelationCatalog().observe(_rel(cols=(COLS[1], COLS[0])))
    assert reordered.layout != base.layout
    full, _ = RelationCatalog().observe(_rel(identity="f"))
    assert full.layout == base.layout and full.meta != base.meta


def test_identity_is_the_oid() -> None:
    catalog = RelationCatalog()
    catalog.observe(_rel(oid=1))
    recreated, new = catalog.observe(_rel(oid=2))
    assert new and recreated.oid == 2
    table = catalog.table(1)
    assert table is not None and table.oid == 1


def test_type_messages_name_custom_types() -> None:
    catalog = RelationCatalog()
    catalog.observe_type(Type(None, 90001, "public", "mood"))
    table, _ = catalog.observe(_rel(cols=(COLS[0], RelationColumn(0, "m", 90001, -1))))
    assert [c.type_name for c in table.columns] == ["int4", "public.mood"]
    assert [c.name for c in table.key_columns] == ["id"]


def test_catalog_view_shows_types(tmp_path: Path) -> None:
    shutil.copytree(Path(__file__).parent.parent / "golden" / "catalog_v2", tmp_path / "g")
    history = HistoryFile(tmp_path / "g").load(read_only=True)
    lines = catalog_view.history_lines(history).splitlines()
    assert lines[1].endswith("put type public.mood (oid 16500, enum) version 42c496ac1191")
    assert lines[-1].endswith("drop type oid 16520")
    shown = catalog_view.show(history.latest)
    assert "enum ('sad', 'ok', 'happy')" in shown and "point2" not in shown
    changed = catalog_view.diff(history.base, history.latest).splitlines()
    assert "    + label 'happy'" in changed
    assert "+ type public.positive (oid 16510) created" in changed


def test_type_versions_follow_the_definition() -> None:
    mood = TypeVersion(16500, "public", "mood", "enum", ("a", "b"))
    assert mood.version == TypeVersion(16500, "public", "mood", "enum", ("a", "b")).version
    assert mood.version != TypeVersion(16500, "public", "mood", "enum", ("a", "c")).version
    assert type_from_dict(mood.to_dict()) == mood
    with pytest.raises(TypeDefinitionError, match="unknown kind"):
        TypeVersion(1, "public", "x", "table")
    with pytest.raises(TypeDefinitionError, match="edited or damaged"):
        type_from_dict({**mood.to_dict(), "labels": ["a"]})
    array = builtin_type(1007)
    assert array is not None and (array.kind, array.base_oid, array.name) == ("array", 23, "_int4")
    assert builtin_type(16500) is None


def test_the_identity_index_follows_the_replica_identity() -> None:
    table, _ = RelationCatalog().observe(_rel())
    assert table.identity_index.kind == "primary_key"
    assert [c.name for c in table.identity_index.columns] == ["id"]
    full, _ = RelationCatalog().observe(_rel(identity="f", cols=(
        RelationColumn(1, "id", 23, -1), RelationColumn(1, "v", 25, -1))))
    assert full.identity_index.kind == "full" and len(full.identity_index.columns) == 2


def _captured(attnums: tuple[int, int]) -> TableVersion:
    return TableVersion(7, "public", "t", "d", (
        Column("id", 23, "int4", -1, True, True, None, attnums[0]),
        Column("v", 25, "text", -1, False, False, None, attnums[1])))


def test_a_column_dropped_and_added_again_is_another_version() -> None:
    """Same names, types and order, but ``v`` is attnum 3 after DROP and ADD COLUMN v: the
    old values are gone at the source, so the version must say it is another column."""
    before, after = _captured((1, 2)), _captured((1, 3))
    assert before.layout == after.layout and before.same_layout(after)
    assert before.version != after.version
    assert _captured((1, 2)).version == before.version  # still identical for identical ones
    # golden: versions are persisted and published, so the scheme must not drift
    assert (before.version, after.version) == ("6012e6033f37.e2a33dfea28d",
                                               "6012e6033f37.1aa32a876177")


def test_versions_stored_before_attnums_counted_stay_readable() -> None:
    table = _captured((1, 2))
    layout, meta = table._fingerprints(legacy=True)
    assert f"{layout}.{meta}" != table.version
    old = {**table.to_dict(), "version": f"{layout}.{meta}", "layout": layout}
    restored = table_from_dict(old)  # verified: a legacy version is accepted as written
    assert restored.version == f"{layout}.{meta}" and restored.columns == table.columns
    table_from_dict(old, verify=False).verify()
    damaged = {**old, "version": f"{layout}.000000000000"}
    with pytest.raises(VersionMismatchError):
        table_from_dict(damaged)
    with pytest.raises(VersionMismatchError):
        table_from_dict(damaged, verify=False).verify()


def test_catalog_history_prints_lsns_that_show_accepts(tmp_path: Path) -> None:
    """One LSN format everywhere (PostgreSQL's X/Y); the bare 64-bit form is read too."""
    from core.errors import ConfigError
    from decoder.lsn import format_lsn, parse_lsn

    shutil.copytree(Path(__file__).parent.parent / "golden" / "catalog_v2", tmp_path / "g")
    history = HistoryFile(tmp_path / "g").load(read_only=True)
    entry = list(history.entries())[-1]
    printed = catalog_view.history_lines(history).splitlines()[-1].split()[2]
    assert printed == format_lsn(entry.lsn) and "/" in printed
    assert parse_lsn(printed) == entry.lsn
    assert f"effective at LSN {printed})" in catalog_view.show(history.latest)
    assert parse_lsn("13FF15E0") == parse_lsn("0/13FF15E0") == 0x13FF15E0
    assert parse_lsn(" 1/0 ") == 1 << 32
    for bad in ("", "x/1", "1/100000000", "10000000000000000", "-1"):
        with pytest.raises(ConfigError, match="invalid LSN"):
            parse_lsn(bad)
