"""Row decoders of table versions: one factory, and the stream's cache of them (seed 000).

A row decoder is derived from a table version and from the types of its columns: an
enum, a domain, an array, a range or a composite type is registered in a
:class:`~decoder.type_registry.TypeRegistry` (read from ``pg_type`` once), and a composite's
decoder splits a value into its attributes.  :class:`RowDecoderFactory` builds them, for
the stream, the initial load (its coordinator and its worker processes) and the
incremental snapshots alike; where the catalog knows a composite's attributes (captured
DDL), it takes them from there: the type as the stream sees it at its position.

A table's version does not change when one of its column types does (``ALTER TYPE pair
ADD ATTRIBUTE c bool``), so a decoder built before would go on splitting values into the
old attributes.  Hence the seed's generation counter: every holder of row decoders keeps
them in a :class:`~decoder.generation.GenerationCache` checked against the catalog
generation.  The stream's (:class:`RowDecoders`) checks at the start of every batch and
after every captured DDL message of the open transaction, with the builder's generation
and its count of in-transaction changes; when either moved, every row decoder is built
again on its next use, each composite type with its attributes from the catalog as the
stream sees it (the open transaction's own DDL included).  Without DDL capture the
catalog does not know types, and the registry keeps what ``pg_type`` said.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg

from decoder.binary import BinaryDecoders
from decoder.change import RowDecoder
from decoder.generation import GenerationCache
from decoder.type_registry import TypeRegistry
from decoder.types import load_types
from decoder.values import FIRST_NORMAL_OID
from snapshot_builder.catalog import TableVersion, with_base_types
from snapshot_builder.datatype import TypeVersion

if TYPE_CHECKING:
    from snapshot_builder.builder import SnapshotBuilder

Connect = Callable[[], psycopg.Connection[Any]]
Captured = Callable[[int], TypeVersion | None]


class RowDecoderFactory:
    """Builds the row decoder of a table version, with the types of one database.

    ``connect`` gives the connection that reads ``pg_type`` (under the load's snapshot for
    a load), called only when a table has a type the registry does not know yet;
    ``captured`` the type as the catalog knows it (the builder's :meth:`~snapshot_builder.
    builder.SnapshotBuilder.type`), None where the catalog is not at hand (a load worker);
    ``binary``: the decoders read values the server sends in binary too (the stream).
    """

    __slots__ = ("_connect", "_captured", "_binary", "types", "binary")

    def __init__(self, connect: Connect, captured: Captured | None = None, *,
                 binary: bool = False) -> None:
        self._connect = connect
        self._captured = captured
        self._binary = binary
        self.types = TypeRegistry()
        self.binary = BinaryDecoders(self.types)

    def build(self, table: TableVersion) -> tuple[TableVersion, RowDecoder]:
        """The decoder of ``table``, and ``table`` with its domain columns' base types named
        (what the sink publishes)."""
        custom = [c.type_oid for c in table.columns if c.type_oid >= FIRST_NORMAL_OID]
        if custom:
            self._register(custom)
            table = with_base_types(table, self.types.domain_base)
        binary = self.binary.decoder_for if self._binary else None
        return table, RowDecoder(table, self.types.decoder_for, binary)

    def decoder(self, table: TableVersion) -> RowDecoder:
        """The row decoder of ``table`` alone."""
        return self.build(table)[1]

    def _register(self, oids: list[int]) -> None:
        """Register ``oids`` and what they are built from: from ``pg_type`` once, each
        composite's attributes from the catalog at the stream's position when it has them."""
        wanted = [oid for oid in oids if oid not in self.types]
        tried: set[int] = set()
        while True:
            if wanted:
                load_types(self._connect(), wanted, self.types)
                tried.update(wanted)
            wanted = []
            if self._captured is None:
                return
            for oid in _reachable(self.types, oids):
                shape = self.types.shape(oid)
                captured = self._captured(oid)
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


class RowDecoders:
    """The table version and row decoder the next change of each table uses (the stream's).

    ``builder`` gives the pipeline's snapshot builder (it replaces its builder in
    ``prepare()``); ``connect`` its connection for ``pg_type``.
    """

    def __init__(self, builder: Callable[[], SnapshotBuilder], connect: Connect) -> None:
        self._builder = builder
        self._factory = RowDecoderFactory(connect, lambda oid: builder().type(oid),
                                          binary=True)
        self.types = self._factory.types
        self.binary = self._factory.binary
        self._tables: dict[int, TableVersion] = {}  # the version each table is described by
        self._decoders: GenerationCache[int, tuple[TableVersion, RowDecoder]] = \
            GenerationCache(self._build)
        self._built = self._decoders.entries  # the hit of get(), once per change: no call

    @property
    def rebuilds(self) -> int:
        """How many times a catalog change dropped the decoders built before."""
        return self._decoders.purges

    def get(self, oid: int) -> tuple[TableVersion, RowDecoder] | None:
        built = self._built.get(oid)
        if built is not None or oid not in self._tables:
            return built
        return self._decoders.get(oid)

    def __contains__(self, oid: object) -> bool:
        return oid in self._tables

    def describe(self, table: TableVersion) -> bool:
        """Decode ``table``'s next changes with this version; True if it is a new one."""
        current = self._tables.get(table.oid)
        if current is not None and current.version == table.version:
            return False
        self._tables[table.oid] = table
        self._decoders.discard(table.oid)
        return True

    def check(self) -> bool:
        """Drop every decoder if the catalog moved since they were built; True if so (each
        is built again when its table's next change needs it)."""
        builder = self._builder()
        return self._decoders.check(builder.generation, builder.changes_in_transaction)

    def _build(self, oid: int) -> tuple[TableVersion, RowDecoder]:
        return self._factory.build(self._tables[oid])
