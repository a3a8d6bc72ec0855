"""The published tables as a snapshot sees them: definitions, storage and size.

:func:`fetch_published_tables` reads ``pg_catalog`` in the caller's transaction, so
inside a transaction that imported the slot's exported snapshot it returns the
catalog exactly as it was at the slot's consistent point: the baseline of the
initial load.

Each :class:`~snapshot_builder.catalog.TableVersion` is built from the same
fields pgoutput puts in a Relation message (``logicalrep_write_rel`` and
``logicalrep_write_attrs`` in PostgreSQL 15), so a table read here and the same
definition streamed later get the same ``version``:

* the namespace and relation name, and ``relreplident`` as the identity char;
* the columns in ``attnum`` order, without dropped and generated columns (PostgreSQL
  15 never publishes generated columns) and, for a publication with a column list,
  only the listed ones (``pg_publication_tables.attnames``);
* per column its name, ``atttypid`` (a domain's own OID, not its base type's) and
  ``atttypmod``;
* the key flag: every column for ``REPLICA IDENTITY FULL``, else the columns of the
  replica identity index (the primary key for ``DEFAULT``, the chosen index for
  ``USING INDEX``), none for ``NOTHING``.

With DDL capture installed the stream decodes with the captured definition, which
says more (NOT NULL, defaults, comment): then that definition, read under the
snapshot through ``pgcdc.table_definition``, is the version (see
:func:`fetch_published_tables`).

Type names are not part of the version; they follow what the stream's catalog
records: the built-in name for OIDs below 10000 (pgoutput sends no Type message
for those), ``schema.name`` for others (``name`` alone in ``pg_catalog``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

from decoder import text_parsers, values
from snapshot_builder.catalog import (
    Column,
    TableVersion,
    published_columns,
    table_from_dict,
    with_base_types,
)

# pgoutput sends a Type message for types with OIDs from here on (FirstGenbkiObjectId)
_FIRST_GENBKI_OID: Final = 10000

_TABLES: Final = """
    SELECT c.oid, n.nspname, c.relname, c.relreplident, c.relkind, c.relfilenode,
           CASE WHEN c.relkind = 'p' OR NOT %(sizes)s THEN 0
                ELSE pg_catalog.pg_relation_size(c.oid) END AS size,
           c.reltuples::pg_catalog.int8, pt.attnames, pt.rowfilter, {definition}
      FROM pg_catalog.pg_publication_tables pt
      JOIN pg_catalog.pg_namespace n ON n.nspname = pt.schemaname
      JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
     WHERE pt.pubname = %(publication)s
     ORDER BY n.nspname, c.relname
"""

_COLUMNS: Final = """
    SELECT a.attrelid, a.attname, a.atttypid, a.atttypmod, t.typname, tn.nspname,
           c.relreplident = 'f' OR COALESCE(a.attnum = ANY(i.indkey::pg_catalog.int2[]), false)
      FROM pg_catalog.pg_attribute a
      JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
      JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
      JOIN pg_catalog.pg_namespace tn ON tn.oid = t.typnamespace
      LEFT JOIN pg_catalog.pg_index i ON i.indrelid = c.oid AND CASE c.relreplident
               WHEN 'd' THEN i.indisprimary WHEN 'i' THEN i.indisreplident ELSE false END
     WHERE a.attrelid = ANY(%s::pg_catalog.oid[]) AND a.attnum > 0 AND NOT a.attisdropped
       AND a.attgenerated = ''
     ORDER BY a.attrelid, a.attnum
"""


@dataclass(frozen=True, slots=True)
class PublishedTable:
    """One published table: its version, its storage and its size when it was read."""

    table: TableVersion
    relkind: str  # 'r' a table, 'p' a partitioned table (published through its root)
    relfilenode: int  # changes when the table is rewritten (TRUNCATE, VACUUM FULL, ALTER TYPE)
    pages: int  # pg_relation_size in blocks
    estimated_rows: int  # pg_class.reltuples; -1 if never vacuumed or analyzed
    row_filter: str | None  # the publication's WHERE clause for this table, as SQL text

    @property
    def oid(self) -> int:
        return self.table.oid

    def identity(self) -> tuple[str, int]:
        """What must not change between two reads of the catalog: definition and storage."""
        return self.table.version, self.relfilenode


def type_name(type_oid: int, typname: str, namespace: str) -> str:
    """A column's type name as the stream's catalog names it (see the module docstring)."""
    if type_oid < _FIRST_GENBKI_OID:
        return text_parsers.type_name(type_oid)
    return typname if namespace in ("", "pg_catalog") else f"{namespace}.{typname}"


_DOMAINS: Final = """
    SELECT oid, typbasetype, typtypmod FROM pg_catalog.pg_type
     WHERE typtype = 'd' AND oid = ANY(%s::pg_catalog.oid[])
"""


def _domains(cur: psycopg.Cursor[Any], oids: set[int]) -> dict[int, tuple[int, int]]:
    """Every domain among ``oids`` and the domains they are built on: base type OID and
    typmod (for :func:`~snapshot_builder.catalog.with_base_types`)."""
    found: dict[int, tuple[int, int]] = {}
    wanted = {oid for oid in oids if oid >= values.FIRST_NORMAL_OID}
    while wanted:
        rows = cur.execute(_DOMAINS, (sorted(wanted),)).fetchall()
        found.update({int(oid): (int(base), int(typmod)) for oid, base, typmod in rows})
        wanted = {int(base) for _, base, _ in rows
                  if int(base) >= values.FIRST_NORMAL_OID and int(base) not in found}
    return found


def block_size(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT current_setting('block_size')::int").fetchone()
    assert row is not None
    return int(row[0])


def fetch_published_tables(conn: psycopg.Connection[Any], publication: str, *,
                           sizes: bool = True,
                           captured: bool = False) -> dict[int, PublishedTable]:
    """Every table of ``publication``, by OID, as the transaction's snapshot sees it.

    ``sizes=False`` leaves ``pages`` at 0 and takes no lock on the tables
    (``pg_relation_size`` takes a brief ACCESS SHARE lock, which queues behind a
    waiting DDL).  ``captured``: DDL capture is installed (snapshot_builder/ddl.py), so
    the stream decodes with the captured definition (NOT NULL, defaults, comment,
    partition parent as well), restricted to the publication's column list if it has one.
    """
    blocks = block_size(conn)
    definition = sql.SQL("pgcdc.table_definition(c.oid)" if captured else "NULL::jsonb")
    query = sql.SQL(_TABLES).format(definition=definition)
    with conn.cursor(row_factory=tuple_row) as cur:
        tables = cur.execute(query, {"publication": publication, "sizes": sizes}).fetchall()
        columns: dict[int, list[Column]] = {int(row[0]): [] for row in tables}
        listed = {int(row[0]): set(row[8]) if row[8] is not None else None for row in tables}
        for relid, attname, atttypid, atttypmod, typname, typnamespace, is_key in cur.execute(
                _COLUMNS, (sorted(columns),)):
            names = listed[relid]
            if names is not None and attname not in names:
                continue  # not in the publication's column list
            columns[relid].append(Column(attname, atttypid, type_name(atttypid, typname,
                                                                       typnamespace),
                                         atttypmod, bool(is_key)))
        domains = _domains(cur, {c.type_oid for cs in columns.values() for c in cs})
    out: dict[int, PublishedTable] = {}
    for (oid, schema, name, replident, relkind, relfilenode, size, reltuples, names,
         row_filter, definition) in tables:
        version = TableVersion(int(oid), str(schema), str(name), str(replident),
                               tuple(columns[int(oid)]))
        if definition is not None:
            full = published_columns(table_from_dict(definition), names)
            if full.same_layout(version) and full.qualified_name == version.qualified_name:
                version = full
        version = with_base_types(version, domains.get)
        out[int(oid)] = PublishedTable(version, str(relkind), int(relfilenode),
                                       -(-int(size) // blocks), int(reltuples),
                                       str(row_filter) if row_filter is not None else None)
    return out
