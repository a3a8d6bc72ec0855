"""Table definitions as immutable versions, identified by OID.

A :class:`TableVersion` is one definition of one table.  Its version has two
parts, as in the object-versions seed: ``layout`` changes when the columns,
their types or their order change; ``meta`` changes for anything else (name,
schema, replica identity, and where DDL capture knows them NOT NULL, defaults,
comment, partition parent and the columns' attnums: a column dropped and added
again under the same name and type is another column, so another version).
Both are fingerprints of the definition, so identical definitions get identical
versions, on every run and every machine, and a dropped-and-recreated table is
a new object because its OID differs.

:class:`RelationCatalog` keeps the definition the stream itself proves: the
pgoutput Relation messages.  The time-travel catalog, the definitions at any LSN
built from the DDL captured in the WAL, is :mod:`snapshot_builder.history`
(``CatalogHistory.catalog_at``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Final

from core import wire
from decoder import text_parsers, values
from decoder.pgoutput import Relation, Type


class VersionMismatchError(ValueError):
    """A stored version that its definition does not give: an edited or damaged file."""


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_oid: int
    type_name: str
    typmod: int
    is_key: bool
    not_null: bool | None = None  # None: not known (a Relation message does not say)
    default: str | None = None
    # pg_attribute.attnum: the column's identity, kept across a rename (captured DDL only);
    # part of ``meta`` where known: a column dropped and added again is another column
    attnum: int | None = None
    # a domain column: its built-in base type (through domains over domains) and that
    # type's typmod (the domain's), for consumers that type values by it (the Spark lake);
    # derived from ``type_oid``, which a domain never changes, so not part of the version
    base_type: str | None = field(default=None, compare=False)
    base_typmod: int = field(default=-1, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """A column of the catalog record (core/wire.py ``COLUMN_*``) and the history."""
        out: dict[str, Any] = {wire.COLUMN_NAME: self.name, wire.COLUMN_TYPE_OID: self.type_oid,
                               wire.COLUMN_TYPE_NAME: self.type_name,
                               wire.COLUMN_TYPMOD: self.typmod, wire.COLUMN_KEY: self.is_key}
        if self.not_null is not None:
            out[wire.COLUMN_NOT_NULL] = self.not_null
        if self.default is not None:
            out[wire.COLUMN_DEFAULT] = self.default
        if self.attnum is not None:
            out[wire.COLUMN_ATTNUM] = self.attnum
        if self.base_type is not None:
            out[wire.COLUMN_BASE_TYPE] = self.base_type
            out[wire.COLUMN_BASE_TYPMOD] = self.base_typmod
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Column:
        """The inverse of :meth:`to_dict`; equal columns come back as one shared object
        (a long history repeats the same columns in thousands of versions)."""
        key = tuple(data.items())
        column = _COLUMNS.get(key)
        if column is None:
            attnum = data.get(wire.COLUMN_ATTNUM)
            column = cls(data[wire.COLUMN_NAME], int(data[wire.COLUMN_TYPE_OID]),
                         data[wire.COLUMN_TYPE_NAME], int(data[wire.COLUMN_TYPMOD]),
                         bool(data[wire.COLUMN_KEY]), data.get(wire.COLUMN_NOT_NULL),
                         data.get(wire.COLUMN_DEFAULT), int(attnum) if attnum is not None else None,
                         data.get(wire.COLUMN_BASE_TYPE),
                         int(data.get(wire.COLUMN_BASE_TYPMOD, -1)))
            if len(_COLUMNS) >= _COLUMNS_MAX:
                _COLUMNS.clear()
            _COLUMNS[key] = column
        return column


# Column.from_dict's shared objects (columns are immutable, so sharing is safe), bounded
_COLUMNS: dict[tuple[Any, ...], Column] = {}
_COLUMNS_MAX: Final = 100_000


@dataclass(frozen=True, slots=True)
class TableVersion:
    oid: int
    schema: str
    name: str
    replica_identity: str
    columns: tuple[Column, ...]
    comment: str | None = None
    partition_parent: int | None = None
    # False: the table is not in pgcdc's publication (the DDL trigger said so); its rows
    # are not sent as its own (a partition attached under a publication that publishes
    # via the root, a table dropped from the publication), so the lake retires its table
    published: bool = True
    # set when a composite type (or an enum's labels) a column holds changed since the table
    # was described: a fingerprint of those changes, so that the table gets a new version
    # (its typed Avro schema names the composite's attributes); carried over afterwards
    types: str | None = None
    layout: str = field(init=False)
    meta: str = field(init=False)
    # derived from ``columns`` once, since every encoded event asks for it
    key_columns: tuple[Column, ...] = field(init=False, repr=False, compare=False)
    qualified_name: str = field(init=False, repr=False, compare=False)  # ``schema.name``

    def __post_init__(self) -> None:
        layout, meta = self._fingerprints()
        object.__setattr__(self, "layout", layout)
        object.__setattr__(self, "meta", meta)
        object.__setattr__(self, "key_columns", tuple(c for c in self.columns if c.is_key))
        object.__setattr__(self, "qualified_name", f"{self.schema}.{self.name}")

    def _fingerprints(self, *, legacy: bool = False) -> tuple[str, str]:
        """``legacy``: as pgcdc computed them before attnums counted (such stored versions
        stay valid; a new capture of the same table gets the new version)."""
        layout = [(c.name, c.type_oid, c.typmod) for c in self.columns]
        meta: list[Any] = [self.schema, self.name, self.replica_identity,
                           [c.name for c in self.columns if c.is_key]]
        # what a Relation message cannot tell counts only where it is known (captured DDL)
        extras = [[c.not_null, c.default] for c in self.columns]
        if any(v is not None for pair in extras for v in pair) or self.comment is not None \
                or self.partition_parent is not None:
            meta += [extras, self.comment, self.partition_parent]
        if not legacy and any(c.attnum is not None for c in self.columns):
            meta.append([c.attnum for c in self.columns])
        if not self.published:
            meta.append("unpublished")
        if self.types is not None:
            meta.append(["types", self.types])
        return fingerprint(layout), fingerprint(meta)

    @classmethod
    def _restore(cls, oid: int, schema: str, name: str, replica_identity: str,
                 columns: tuple[Column, ...], comment: str | None, partition_parent: int | None,
                 layout: str, meta: str, *, published: bool = True,
                 types: str | None = None) -> TableVersion:
        """A stored version as it was written, fingerprints not recomputed (see
        :meth:`verify`): loading a long history is dominated by them otherwise."""
        table = object.__new__(cls)
        put = object.__setattr__
        put(table, "oid", oid)
        put(table, "schema", schema)
        put(table, "name", name)
        put(table, "replica_identity", replica_identity)
        put(table, "columns", columns)
        put(table, "comment", comment)
        put(table, "partition_parent", partition_parent)
        put(table, "published", published)
        put(table, "types", types)
        put(table, "layout", layout)
        put(table, "meta", meta)
        put(table, "key_columns", tuple(c for c in columns if c.is_key))
        put(table, "qualified_name", f"{schema}.{name}")
        return table

    def verify(self) -> None:
        """Raise :class:`VersionMismatchError` unless the stored fingerprints are the ones
        this definition gives (a restored version is checked here, on demand)."""
        layout, meta = self._fingerprints()
        if (layout, meta) != (self.layout, self.meta) and \
                self._fingerprints(legacy=True) != (self.layout, self.meta):
            msg = (f"table {self.qualified_name} (oid {self.oid}) was stored as version "
                   f"{self.version} but its definition gives {layout}.{meta}: the catalog "
                   "history was edited or damaged; restore it, or remove the folder to "
                   "rebuild the catalog")
            raise VersionMismatchError(msg)

    @property
    def version(self) -> str:
        """``<layout>.<meta>``: equal exactly for identical definitions."""
        return f"{self.layout}.{self.meta}"

    @property
    def keyless(self) -> bool:
        """Whether its rows are a multiset downstream: REPLICA IDENTITY FULL (every column
        is sent as the key), or no key column (streaming/multiset.py)."""
        return self.replica_identity == "f" or not self.key_columns

    @property
    def identity_index(self) -> Index:
        """What identifies this table's rows in the stream (derived from the replica
        identity and the key columns; the index's own OID and name are not captured)."""
        return Index(_IDENTITY_KINDS.get(self.replica_identity, self.replica_identity),
                     self.key_columns)

    def to_dict(self) -> dict[str, Any]:
        """The catalog record's table version (core/wire.py ``CATALOG_*``), and the
        history's."""
        return {
            wire.CATALOG_RECORD_FORMAT: 1,
            wire.CATALOG_OID: self.oid,
            wire.CATALOG_SCHEMA: self.schema,
            wire.CATALOG_NAME: self.name,
            wire.CATALOG_VERSION: self.version,
            wire.CATALOG_LAYOUT: self.layout,
            wire.CATALOG_REPLICA_IDENTITY: self.replica_identity,
            wire.CATALOG_COLUMNS: [c.to_dict() for c in self.columns],
            **({wire.CATALOG_COMMENT: self.comment} if self.comment is not None else {}),
            **({wire.CATALOG_PARTITION_PARENT: self.partition_parent}
               if self.partition_parent is not None else {}),
            **({} if self.published else {wire.CATALOG_PUBLISHED: False}),
            **({} if self.types is None else {wire.CATALOG_TYPES: self.types}),
        }

    def retyped(self, type_oid: int, type_version: str) -> TableVersion:
        """This table after a change of a type it holds (``type_version``: the type's new
        version): a new version, whose :attr:`types` records the change on top of earlier
        ones."""
        return replace(self, types=fingerprint([self.types, type_oid, type_version]))

    def same_layout(self, other: TableVersion) -> bool:
        """Equal columns, types, order, key and replica identity: what pgoutput describes."""
        return (self.layout == other.layout and self.replica_identity == other.replica_identity
                and [c.name for c in self.key_columns] == [c.name for c in other.key_columns])


@dataclass(frozen=True, slots=True)
class Index:
    """The index a table's replica identity uses: ``primary_key`` (REPLICA IDENTITY
    DEFAULT), ``replica_identity_index`` (USING INDEX), ``full`` (every column) or
    ``nothing``; ``columns`` are the key columns pgoutput sends for it."""

    kind: str
    columns: tuple[Column, ...]


_IDENTITY_KINDS: Final = {"d": "primary_key", "i": "replica_identity_index", "f": "full",
                          "n": "nothing"}


def table_from_dict(data: dict[str, Any], *, verify: bool = True) -> TableVersion:
    """The inverse of :meth:`TableVersion.to_dict`.

    With ``verify`` (the default) the version is recomputed and must equal the stored
    one; without, a stored ``layout`` and ``version`` are taken as written and checked
    later by :meth:`TableVersion.verify` (how a persisted history loads).
    """
    shared = _COLUMNS.get
    columns = tuple([shared(tuple(c.items())) or Column.from_dict(c)
                     for c in data[wire.CATALOG_COLUMNS]])
    stored = data.get(wire.CATALOG_VERSION)
    layout = data.get(wire.CATALOG_LAYOUT)
    oid, schema, name = int(data[wire.CATALOG_OID]), data[wire.CATALOG_SCHEMA], \
        data[wire.CATALOG_NAME]
    identity = data[wire.CATALOG_REPLICA_IDENTITY]
    comment, parent = data.get(wire.CATALOG_COMMENT), data.get(wire.CATALOG_PARTITION_PARENT)
    published = data.get(wire.CATALOG_PUBLISHED, True) is not False
    types = data.get(wire.CATALOG_TYPES)
    if not verify and isinstance(stored, str) and isinstance(layout, str):
        head, dot, meta = stored.partition(".")
        if dot and head == layout:
            return TableVersion._restore(oid, schema, name, identity, columns, comment, parent,
                                         layout, meta, published=published, types=types)
    table = TableVersion(oid, schema, name, identity, columns, comment, parent, published,
                         types)
    if stored is not None and stored != table.version:
        layout, meta = table._fingerprints(legacy=True)
        if stored == f"{layout}.{meta}":  # written before attnums counted: kept as written
            return TableVersion._restore(table.oid, table.schema, table.name,
                                         table.replica_identity, columns, table.comment,
                                         table.partition_parent, layout, meta,
                                         published=published, types=types)
        msg = (f"table {schema}.{name} was stored as version {stored} "
               f"but its definition gives {table.version}")
        raise VersionMismatchError(msg)
    return table


def published_columns(table: TableVersion, names: list[str] | None) -> TableVersion:
    """``table`` as a publication with a column list publishes it: only the listed columns,
    which is what its Relation messages and tuples carry (``names`` None: every column)."""
    if names is None:
        return table
    listed = set(names)
    if all(c.name in listed for c in table.columns):
        return table
    return replace(table, columns=tuple(c for c in table.columns if c.name in listed))


# a type OID -> the base type OID and typmod of that type if it is a domain, else None
DomainBase = Callable[[int], tuple[int, int] | None]


def with_base_types(table: TableVersion, domain_base: DomainBase) -> TableVersion:
    """``table`` with each domain column's built-in base type named (``Column.base_type``):
    ``domain_base`` says what each domain is built on, a domain over a domain is followed to
    the end (the innermost typmod that is set is the one, as in ``getBaseTypeAndTypmod``).
    A domain over a type that is not built in (an enum, a composite, ...) is left as it is;
    so is ``table`` when it has no domain column."""
    columns = []
    for column in table.columns:
        oid, typmod, seen = column.type_oid, -1, 0
        base = domain_base(oid) if oid >= values.FIRST_NORMAL_OID else None
        while base is not None and seen < 64:  # a cycle the catalog cannot have, bounded
            oid, typmod, seen = base[0], base[1] if base[1] != -1 else typmod, seen + 1
            base = domain_base(oid) if oid >= values.FIRST_NORMAL_OID else None
        name = text_parsers.type_name(oid)
        if seen and not name.startswith("oid:") and (column.base_type, column.base_typmod) \
                != (name, typmod):
            column = replace(column, base_type=name, base_typmod=typmod)
        columns.append(column)
    if all(a is b for a, b in zip(columns, table.columns, strict=True)):
        return table
    return replace(table, columns=tuple(columns))


def fingerprint(obj: object) -> str:
    """12 hex digits of the SHA-256 of ``obj`` as compact JSON: the versions of table and
    type definitions."""
    raw = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    return hashlib.sha256(raw).hexdigest()[:12]


class RelationCatalog:
    """The current definition of every relation the stream has described."""

    def __init__(self) -> None:
        self._tables: dict[int, TableVersion] = {}
        self._type_names: dict[int, str] = {}

    def observe_type(self, message: Type) -> None:
        # pgoutput names built-in (pg_catalog) types with an empty namespace
        namespace = "" if message.namespace in ("", "pg_catalog") else message.namespace
        self._type_names[message.oid] = (f"{namespace}.{message.name}" if namespace
                                         else message.name)

    def observe(self, message: Relation) -> tuple[TableVersion, bool]:
        """Record a Relation message; returns its version and whether it is new."""
        columns = tuple(
            Column(c.name, c.type_oid, self.type_name(c.type_oid), c.typmod, c.is_key)
            for c in message.columns
        )
        table = TableVersion(message.oid, message.namespace, message.name,
                             message.replica_identity, columns)
        previous = self._tables.get(message.oid)
        if previous is not None and previous.version == table.version:
            return previous, False
        self._tables[message.oid] = table
        return table, True

    def table(self, oid: int) -> TableVersion | None:
        return self._tables.get(oid)

    def type_name(self, type_oid: int) -> str:
        return self._type_names.get(type_oid) or text_parsers.type_name(type_oid)
