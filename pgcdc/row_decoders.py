"""The row decoders of the tables the stream has described, kept in step with the catalog.

A row decoder is derived from a table version and from the types of its columns: an
enum, a domain, an array, a range or a composite type is registered in a
:class:`~decoder.values.TypeRegistry` (read from ``pg_type`` once), and a composite's
decoder splits a value into its attributes.  A table's version does not change when one
of its column types does (``ALTER TYPE pair ADD ATTRIBUTE c bool``), so a decoder built
before would go on splitting values into the old attributes.

Hence the seed's generation counter (000): :meth:`RowDecoders.check`, at the start of
every batch and after every captured DDL message of the open transaction, compares the
builder's catalog generation and its count of in-transaction changes with the ones the
decoders were built at; when either moved, every composite type takes its attributes from
the catalog as the stream sees it (captured DDL, at the stream's position, the open
transaction's own DDL included) and every row decoder is built again.  Without DDL capture
the catalog does not know types, and the registry keeps what ``pg_type`` said.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from decoder.binary import BinaryDecoders
from decoder.change import RowDecoder
from decoder.types import load_types
from decoder.values import FIRST_NORMAL_OID, TypeRegistry
from snapshot_builder.builder import SnapshotBuilder
from snapshot_builder.catalog import TableVersion, with_base_types

Connect = Callable[[], psycopg.Connection[Any]]


class RowDecoders:
    """The table version and row decoder the next change of each table uses."""

    def __init__(self, builder: Callable[[], SnapshotBuilder], connect: Connect) -> None:
        self._builder = builder  # the pipeline replaces its builder in prepare()
        self._connect = connect
        self.types = TypeRegistry()
        self.binary = BinaryDecoders(self.types)
        self._tables: dict[int, tuple[TableVersion, RowDecoder]] = {}
        self._at: tuple[int, int] | None = None  # (generation, in-transaction changes)
        self.rebuilds = 0

    def get(self, oid: int) -> tuple[TableVersion, RowDecoder] | None:
        return self._tables.get(oid)

    def __contains__(self, oid: object) -> bool:
        return oid in self._tables

    def describe(self, table: TableVersion) -> bool:
        """Decode ``table``'s next changes with this version; True if it is a new one."""
        current = self._tables.get(table.oid)
        if current is not None and current[0].version == table.version:
            return False
        self._tables[table.oid] = self._build(table)
        return True

    def check(self) -> bool:
        """Rebuild every decoder if the catalog moved since they were built; True if so."""
        builder = self._builder()
        at = (builder.generation, builder.changes_in_transaction)
        if at == self._at:
            return False
        self._at = at
        if not self._tables:
            return False
        self._tables = {oid: self._build(table) for oid, (table, _) in self._tables.items()}
        self.rebuilds += 1
        return True

    def _build(self, table: TableVersion) -> tuple[TableVersion, RowDecoder]:
        """The decoder of ``table``, and ``table`` with its domain columns' base types named
        (what the sink publishes)."""
        custom = [c.type_oid for c in table.columns if c.type_oid >= FIRST_NORMAL_OID]
        if custom:
            self._register(custom)
            table = with_base_types(table, self.types.domain_base)
        return table, RowDecoder(table, self.types.decoder_for, self.binary.decoder_for)

    def _register(self, oids: list[int]) -> None:
        """Register ``oids`` and what they are built from: from ``pg_type`` once, each
        composite's attributes from the catalog at the stream's position when it has them."""
        builder = self._builder()
        wanted = [oid for oid in oids if oid not in self.types]
        tried: set[int] = set()
        while True:
            if wanted:
                load_types(self._connect(), wanted, self.types)
                tried.update(wanted)
            wanted = []
            for oid in _reachable(self.types, oids):
                shape = self.types.shape(oid)
                captured = builder.type(oid)
                if shape is None or shape.kind != "composite" or captured is None \
                        or captured.kind != "composite":
                    continue
                fields = tuple((a.name, a.type_oid) for a in captured.attributes)
                if fields != shape.fields:
                    self.types.register_composite(oid, fields, name=shape.name)
                    wanted += [f for _, f in fields if f >= FIRST_NORMAL_OID
                               and f not in self.types and f not in tried]
            if not wanted:
                return

def _reachable(types: TypeRegistry, oids: list[int]) -> list[int]:
    """``oids`` and every registered type they are built from."""
    seen: list[int] = []
    stack = list(oids)
    while stack:
        oid = stack.pop()
        shape = types.shape(oid)
        if oid in seen or shape is None:
            continue
        seen.append(oid)
        stack += [shape.of] if shape.of else []
        stack += [f for _, f in shape.fields]
    return seen
