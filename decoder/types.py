"""The custom types of one database, read from its catalog into a :class:`TypeRegistry`.

Enums, domains, composites, ranges, multiranges and the arrays of all of them
have OIDs that only their database knows.  :func:`load_types` reads
``pg_type`` (with ``pg_range`` for ranges and multiranges and ``pg_attribute``
for the fields of composites) for the OIDs a table uses, then for every type
those are built from, until it reaches built-in types, and registers each by
its kind.  ``hstore`` and PostGIS's ``geometry`` and ``geography`` are decoded
into structures (decoder/extensions.py); another base type that is not built in
(an extension's, such as ``citext``) is registered by name only: its values stay
text.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Final

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow, tuple_row

from decoder.extensions import BY_NAME
from decoder.type_registry import TypeRegistry

log = logging.getLogger(__name__)

_TYPES: Final = sql.SQL("""
    SELECT t.oid, n.nspname, t.typname, t.typtype, t.typbasetype, t.typtypmod, t.typrelid,
           t.typtype = 'b' AND t.typoutput = 'pg_catalog.array_out'::pg_catalog.regproc
               AS is_array,  -- a domain over an array prints with array_out too
           t.typelem, e.typdelim, r.rngsubtype, {multirange_subtype}
      FROM pg_catalog.pg_type t
      JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
      LEFT JOIN pg_catalog.pg_type e ON e.oid = t.typelem
      LEFT JOIN pg_catalog.pg_range r ON r.rngtypid = t.oid
      {multirange_join}
     WHERE t.oid = ANY(%s::pg_catalog.oid[])
""")
_TYPES_14: Final = _TYPES.format(  # multiranges exist since PostgreSQL 14
    multirange_subtype=sql.SQL("m.rngsubtype"),
    multirange_join=sql.SQL("LEFT JOIN pg_catalog.pg_range m ON m.rngmultitypid = t.oid"))
_TYPES_13: Final = _TYPES.format(multirange_subtype=sql.SQL("NULL::pg_catalog.oid"),
                                 multirange_join=sql.SQL(""))

_FIELDS: Final = sql.SQL("""
    SELECT a.attrelid, a.attname, a.atttypid
      FROM pg_catalog.pg_attribute a
     WHERE a.attrelid = ANY(%s::pg_catalog.oid[]) AND a.attnum > 0 AND NOT a.attisdropped
     ORDER BY a.attrelid, a.attnum
""")


def load_types(conn: psycopg.Connection[Any], oids: Iterable[int],
               registry: TypeRegistry | None = None) -> TypeRegistry:
    """Register the types ``oids`` and everything they are built from; returns the registry.

    Built-in types and types the registry already knows are not read again.
    An OID the catalog does not have (a type dropped meanwhile) is left out:
    its values stay text.
    """
    registry = registry if registry is not None else TypeRegistry()
    query = _TYPES_14 if conn.info.server_version >= 140000 else _TYPES_13
    seen: set[int] = set()
    wanted = {oid for oid in oids if oid not in registry}
    with conn.cursor(row_factory=tuple_row) as cur:
        while wanted:
            seen |= wanted
            rows = cur.execute(query, (sorted(wanted),)).fetchall()
            needed = _register(cur, rows, registry)
            missing = wanted - {row[0] for row in rows}
            if missing:
                log.warning("types %s are not in the catalog; their values stay text",
                            sorted(missing))
            wanted = {oid for oid in needed if oid not in seen and oid not in registry}
    return registry


def _register(cur: psycopg.Cursor[TupleRow], rows: list[TupleRow],
              registry: TypeRegistry) -> set[int]:
    """Register one batch of pg_type rows; returns the OIDs they are built from."""
    needed: set[int] = set()
    composites: dict[int, tuple[int, str]] = {}  # typrelid -> (type OID, name)
    for (oid, schema, typname, kind, base, typmod, relid, is_array, element, delimiter,
         subtype, multirange_subtype) in rows:
        name = typname if schema == "pg_catalog" else f"{schema}.{typname}"
        if is_array:
            registry.register_array(oid, element, delimiter=delimiter or ",", name=name)
            needed.add(element)
        elif kind == "d":
            registry.register_domain(oid, base, name=name, typmod=typmod)
            needed.add(base)
        elif kind == "e":
            registry.register_enum(oid, name=name)
        elif kind == "r":
            registry.register_range(oid, subtype, name=name)
            needed.add(subtype)
        elif kind == "m" and multirange_subtype is not None:
            registry.register_multirange(oid, multirange_subtype, name=name)
            needed.add(multirange_subtype)
        elif kind == "c":
            composites[relid] = (oid, name)
        elif kind == "b" and typname in BY_NAME:  # hstore, PostGIS: structured
            registry.register_base(oid, BY_NAME[typname], name=name)
        else:  # a base or pseudo type without a decoder: its text, with its name
            registry.register_text(oid, name=name)
    if composites:
        fields: dict[int, list[tuple[str, int]]] = {relid: [] for relid in composites}
        for relid, attname, atttype in cur.execute(_FIELDS, (sorted(composites),)):
            fields[relid].append((attname, atttype))
            needed.add(atttype)
        for relid, (oid, name) in composites.items():
            registry.register_composite(oid, fields[relid], name=name)
    return needed
