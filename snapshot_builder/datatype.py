"""Data types as immutable catalog objects, identified by OID.

A :class:`TypeVersion` is one definition of one type: a base type, an enum (its
labels in sort order), a composite (its attributes), a domain (its base type,
typmod, NOT NULL, default and CHECK constraints), an array (its element type), a
range (its subtype) or a multirange (its range type).  As for tables, the OID is
the identity and the name an attribute: ``ALTER TYPE ... RENAME`` keeps the
object, ``DROP`` and ``CREATE`` make a new one.  ``version`` is a fingerprint of
the whole definition, so identical definitions get identical versions.

Captured user types come from ``pgcdc.type_definition`` (snapshot_builder/ddl.py),
in the form of :meth:`TypeVersion.to_dict`.  Built-in types (OIDs below 16384)
are never captured: :func:`builtin_type` describes them from the decoder's table
of names, as kind ``base`` (or ``array`` for the ``_name`` ones).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Final

from decoder import text_parsers
from snapshot_builder.catalog import fingerprint

KINDS: Final = ("base", "enum", "composite", "domain", "array", "range", "multirange",
                "pseudo")

FIRST_USER_OID: Final = 16384


class TypeDefinitionError(ValueError):
    """A type definition that is malformed or does not match its stored version."""


@dataclass(frozen=True, slots=True)
class Attribute:
    """One attribute of a composite type."""

    name: str
    type_oid: int
    typmod: int = -1

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "type_oid": self.type_oid, "typmod": self.typmod}


@dataclass(frozen=True, slots=True)
class TypeVersion:
    oid: int
    schema: str
    name: str
    kind: str
    labels: tuple[str, ...] = ()  # enum: in sort order
    attributes: tuple[Attribute, ...] = ()  # composite
    # domain: its base type; array: its element; range: its subtype; multirange: its range
    base_oid: int | None = None
    typmod: int = -1  # domain: the base type's typmod
    not_null: bool | None = None  # domain
    default: str | None = None  # domain
    constraints: tuple[str, ...] = ()  # domain: CHECK constraints (pg_get_constraintdef)
    comment: str | None = None
    version: str = field(init=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            msg = f"type {self.qualified_name} (oid {self.oid}) has unknown kind {self.kind!r}"
            raise TypeDefinitionError(msg)
        object.__setattr__(self, "version", fingerprint(self._content()))

    def _content(self) -> list[Any]:
        return [self.schema, self.name, self.kind, list(self.labels),
                [[a.name, a.type_oid, a.typmod] for a in self.attributes], self.base_oid,
                self.typmod, self.not_null, self.default, list(self.constraints), self.comment]

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.name}" if self.schema else self.name

    @property
    def is_builtin(self) -> bool:
        return self.oid < FIRST_USER_OID

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": 1, "oid": self.oid, "schema": self.schema,
                               "name": self.name, "kind": self.kind, "version": self.version}
        if self.labels:
            out["labels"] = list(self.labels)
        if self.attributes:
            out["attributes"] = [a.to_dict() for a in self.attributes]
        if self.base_oid is not None:
            out["base_oid"] = self.base_oid
        if self.typmod != -1:
            out["typmod"] = self.typmod
        if self.not_null is not None:
            out["not_null"] = self.not_null
        if self.default is not None:
            out["default"] = self.default
        if self.constraints:
            out["constraints"] = list(self.constraints)
        if self.comment is not None:
            out["comment"] = self.comment
        return out


def type_from_dict(data: dict[str, Any]) -> TypeVersion:
    """The inverse of :meth:`TypeVersion.to_dict` (and the form ``pgcdc.type_definition``
    returns, where absent parts are JSON nulls); a stored version must match."""
    try:
        base = data.get("base_oid")
        typmod = data.get("typmod")
        kind = data["kind"]
        dtype = TypeVersion(
            int(data["oid"]), str(data["schema"]), str(data["name"]), kind,
            tuple(str(label) for label in data.get("labels") or ()),
            tuple(Attribute(str(a["name"]), int(a["type_oid"]), int(a.get("typmod", -1)))
                  for a in data.get("attributes") or ()),
            int(base) if base is not None and int(base) != 0 else None,
            int(typmod) if typmod is not None else -1,
            data.get("not_null") if kind == "domain" else None,
            data.get("default"),
            tuple(str(c) for c in data.get("constraints") or ()),
            data.get("comment"))
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, TypeDefinitionError):
            raise
        msg = f"malformed type definition ({exc!r}): {str(data)[:200]}"
        raise TypeDefinitionError(msg) from exc
    stored = data.get("version")
    if stored is not None and stored != dtype.version:
        msg = (f"type {dtype.qualified_name} (oid {dtype.oid}) was stored as version {stored} "
               f"but its definition gives {dtype.version}: the catalog history was edited "
               "or damaged; restore it, or remove the folder to rebuild the catalog")
        raise TypeDefinitionError(msg)
    return dtype


@functools.lru_cache(maxsize=1024)
def builtin_type(oid: int) -> TypeVersion | None:
    """A built-in type as a catalog object, or None for an OID the decoder does not name."""
    if oid >= FIRST_USER_OID:
        return None
    name = text_parsers.type_name(oid)
    if name.startswith("oid:"):
        return None
    if name.startswith("_") and len(name) > 1:
        element = next((o for o, n in text_parsers.BUILTIN_TYPE_NAMES.items()
                        if n == name[1:]), None)
        return TypeVersion(oid, "pg_catalog", name, "array", base_oid=element)
    return TypeVersion(oid, "pg_catalog", name, "base")


