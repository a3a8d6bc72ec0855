"""Table definitions as immutable versions, identified by OID.

A :class:`TableVersion` is one definition of one table.  Its version has two
parts, as in the object-versions seed: ``layout`` changes when the columns,
their types or their order change; ``meta`` changes for anything else (name,
schema, replica identity).  Both are fingerprints of the definition, so
identical definitions get identical versions, on every run and every machine,
and a dropped-and-recreated table is a new object because its OID differs.

:class:`RelationCatalog` keeps the definition the stream itself proves: the
pgoutput Relation messages.  (The time-travel history built from DDL in the
WAL extends this; see the snapshot_builder issue.)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from decoder import values
from decoder.pgoutput import Relation, Type


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_oid: int
    type_name: str
    typmod: int
    is_key: bool

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "type_oid": self.type_oid, "type_name": self.type_name,
                "typmod": self.typmod, "key": self.is_key}


@dataclass(frozen=True, slots=True)
class TableVersion:
    oid: int
    schema: str
    name: str
    replica_identity: str
    columns: tuple[Column, ...]
    layout: str = field(init=False)
    meta: str = field(init=False)

    def __post_init__(self) -> None:
        layout = [(c.name, c.type_oid, c.typmod) for c in self.columns]
        meta = [self.schema, self.name, self.replica_identity,
                [c.name for c in self.columns if c.is_key]]
        object.__setattr__(self, "layout", _fingerprint(layout))
        object.__setattr__(self, "meta", _fingerprint(meta))

    @property
    def version(self) -> str:
        """``<layout>.<meta>``: equal exactly for identical definitions."""
        return f"{self.layout}.{self.meta}"

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def key_columns(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.is_key)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": 1,
            "oid": self.oid,
            "schema": self.schema,
            "name": self.name,
            "version": self.version,
            "layout": self.layout,
            "replica_identity": self.replica_identity,
            "columns": [c.to_dict() for c in self.columns],
        }


def _fingerprint(obj: object) -> str:
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
        return self._type_names.get(type_oid) or values.type_name(type_oid)
