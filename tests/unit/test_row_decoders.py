"""The stream's row decoders live for one catalog generation (seed 000): reused while it
stands, built again after a committed change or the open transaction's own DDL, from the
types as the catalog says then; the one factory builds them for every holder."""

from __future__ import annotations

from typing import Any, cast

import pytest

from snapshot_builder.builder import SnapshotBuilder
from snapshot_builder.catalog import Column, TableVersion
from snapshot_builder.datatype import Attribute, TypeVersion
from snapshot_builder.row_decoders import RowDecoderFactory, RowDecoders

PAIR = 50_000  # a composite type's OID
TABLE = TableVersion(7, "public", "t", "d", (Column("id", 23, "int4", -1, True),
                                           Column("p", PAIR, "pair", -1, False)))


class _Builder:
    """What RowDecoders reads of the snapshot builder."""

    def __init__(self) -> None:
        self.generation = 3
        self.changes_in_transaction = 0
        self.types: dict[int, TypeVersion] = {}

    def type(self, oid: int) -> TypeVersion | None:
        return self.types.get(oid)


def _pair(*names: str) -> TypeVersion:
    return TypeVersion(PAIR, "public", "pair", "composite",
                       attributes=tuple(Attribute(n, 23) for n in names))


def _no_server() -> Any:
    raise AssertionError("pg_type was read for a type the registry knows")


def _decoders() -> tuple[RowDecoders, _Builder]:
    builder = _Builder()
    builder.types[PAIR] = _pair("a", "b")
    decoders = RowDecoders(lambda: cast(SnapshotBuilder, builder), _no_server)
    decoders.types.register_composite(PAIR, [("a", 23), ("b", 23)], name="public.pair")
    decoders.check()
    return decoders, builder


def _decode(decoders: RowDecoders, text: str) -> Any:
    entry = decoders.get(TABLE.oid)
    assert entry is not None
    return entry[1].decode(("1", text))[0]["p"]


def test_an_unchanged_generation_reuses_the_decoders() -> None:
    decoders, _ = _decoders()
    assert decoders.get(TABLE.oid) is None and TABLE.oid not in decoders
    assert decoders.describe(TABLE) and not decoders.describe(TABLE)
    first = decoders.get(TABLE.oid)
    assert first is not None and first[0] == TABLE
    assert not decoders.check()
    assert decoders.get(TABLE.oid) is first and decoders.rebuilds == 0


def test_a_new_generation_rebuilds_with_the_types_as_the_catalog_says_now() -> None:
    decoders, builder = _decoders()
    decoders.describe(TABLE)
    first = decoders.get(TABLE.oid)
    assert _decode(decoders, "(1,2)") == {"a": 1, "b": 2}
    builder.types[PAIR] = _pair("a", "b", "c")  # ALTER TYPE pair ADD ATTRIBUTE c, committed
    builder.generation = 4
    assert decoders.check() and decoders.rebuilds == 1
    assert decoders.get(TABLE.oid) is not first
    assert _decode(decoders, "(1,2,3)") == {"a": 1, "b": 2, "c": 3}
    assert not decoders.check()  # the same generation again: kept


def test_the_open_transactions_own_ddl_rebuilds_at_once() -> None:
    decoders, builder = _decoders()
    decoders.describe(TABLE)
    assert _decode(decoders, "(1,2)") == {"a": 1, "b": 2}
    builder.types[PAIR] = _pair("a", "label")  # RENAME ATTRIBUTE b TO label, not committed
    builder.changes_in_transaction = 1
    assert decoders.check()
    assert _decode(decoders, "(1,2)") == {"a": 1, "label": 2}


def test_a_new_version_of_the_table_replaces_its_decoder_alone() -> None:
    decoders, _ = _decoders()
    other = TableVersion(8, "public", "u", "d", (Column("id", 23, "int4", -1, True),))
    decoders.describe(TABLE)
    decoders.describe(other)
    first, kept = decoders.get(TABLE.oid), decoders.get(other.oid)
    renamed = TableVersion(7, "public", "t", "d", (Column("id", 23, "int4", -1, True),
                                                   Column("q", PAIR, "pair", -1, False)))
    assert decoders.describe(renamed)
    now = decoders.get(TABLE.oid)
    assert now is not None and now is not first and now[0] == renamed
    assert decoders.get(other.oid) is kept and decoders.rebuilds == 0


def test_the_factory_reads_pg_type_once_per_type() -> None:
    asked: list[int] = []

    def connect() -> Any:
        asked.append(1)
        raise LookupError("no server here")

    factory = RowDecoderFactory(connect)
    factory.types.register_composite(PAIR, [("a", 23)], name="public.pair")
    table, decoder = factory.build(TABLE)
    assert table == TABLE and asked == []  # known already: no query
    assert decoder.decode(("1", "(5)"))[0] == {"id": 1, "p": {"a": 5}}
    with pytest.raises(LookupError):  # an unknown type: read from pg_type
        factory.build(TableVersion(9, "public", "v", "d", (Column("x", PAIR + 1, "e", -1,
                                                                   False),)))
    assert asked == [1]
