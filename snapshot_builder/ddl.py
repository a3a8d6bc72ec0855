"""DDL in the WAL: an event trigger that writes every changed table definition as a
transactional logical message, so catalog changes arrive in the stream at their exact place.

:func:`install` creates, idempotently, in the schema ``pgcdc``:

* ``pgcdc.table_definition(oid) -> jsonb``: a table's full definition, in the
  form of :meth:`TableVersion.to_dict` (columns with type, typmod, key flag as
  pgoutput sets it, NOT NULL, default; replica identity, comment, partition
  parent);
* ``pgcdc.type_definition(oid) -> jsonb``: a type's full definition, in the
  form of :meth:`TypeVersion.to_dict` (kind, enum labels, composite attributes,
  domain base type, typmod, NOT NULL, default and CHECK constraints, array
  element, range subtype, comment);
* an event trigger on ``ddl_command_end`` that emits
  ``pg_logical_emit_message(true, 'pgcdc.ddl', {"op": "put", "table": ...})``
  for every table a command created or altered (an index command: its table; a
  type command: every table with a column of that type; a partitioned table:
  its partitions too), and ``{"op": "put_type", "type": ...}`` for every type or
  domain a command created or altered (CREATE / ALTER TYPE and DOMAIN, ALTER
  TYPE ... ADD / RENAME VALUE, ADD ATTRIBUTE), with its array type, whether or
  not a table uses it yet;
* an event trigger on ``sql_drop`` that emits ``{"op": "drop", "oid": ...}`` for
  a table and ``{"op": "drop_type", "oid": ...}`` for a type or domain;
* ``pgcdc.follow(oid)``, called by the trigger for every table created or renamed:
  a table whose name a publication listed (``FOR TABLE``, remembered in
  ``pgcdc.followed`` by :func:`follow`) and that is no longer in it (PostgreSQL drops
  a dropped table from its publications) is added back in the same transaction;
* an event trigger on ``table_rewrite`` that emits ``{"op": "rewrite", "oid": ...}``
  for a table whose rows a command rewrites;
* a ``TRUNCATE`` trigger on every leaf partition (added as the trigger describes it) that
  emits ``{"op": "truncate_partition", "oid": ..., "ancestors": {oid: publications}}``:
  a publication that publishes via the root sends nothing for a partition truncated alone.

Rows a command changes without writing row changes to the WAL: a rewrite (a
volatile default, ``ALTER COLUMN ... TYPE``, ``USING``), and a column added with
a default (PostgreSQL gives existing rows the default without touching them).
:func:`rows_rewritten` tells them; the pipeline reads such a table again (an
incremental snapshot) so that the lake gets the values the stream never sends.

A table's own row type (and its array) is not a catalog type here: the table is.

Creating event triggers needs a superuser: run ``pgcdc`` once as one, or have
one run the SQL in :data:`INSTALL_SQL`.  Streaming itself then needs only
REPLICATION and SELECT.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

import psycopg
import psycopg.sql

from core.errors import TerminalError
from snapshot_builder.catalog import TableVersion, published_columns, table_from_dict
from snapshot_builder.datatype import TypeVersion, type_from_dict
from snapshot_builder.history import Change, DropTable, DropType, PutTable, PutType

log = logging.getLogger(__name__)

PREFIX: Final = "pgcdc.ddl"

INSTALL_SQL: Final = r"""
CREATE SCHEMA IF NOT EXISTS pgcdc;
-- the event triggers run as the role whose command fires them: every role must reach the
-- functions they call, or DDL capture makes every other role's DDL fail
GRANT USAGE ON SCHEMA pgcdc TO PUBLIC;

CREATE OR REPLACE FUNCTION pgcdc.table_definition(rel oid) RETURNS jsonb
LANGUAGE sql STABLE AS $$
SELECT jsonb_build_object(
    'oid', c.oid::bigint,
    'schema', n.nspname,
    'name', c.relname,
    'replica_identity', c.relreplident::text,
    'comment', obj_description(c.oid, 'pg_class'),
    'partition_parent', (SELECT i.inhparent::bigint FROM pg_inherits i
                         WHERE i.inhrelid = c.oid AND c.relispartition),
    'columns', coalesce((
        SELECT jsonb_agg(jsonb_build_object(
            'name', a.attname,
            'attnum', a.attnum,
            'type_oid', a.atttypid::bigint,
            'type_name', CASE WHEN t.oid < 16384 THEN t.typname::text
                              ELSE format('%s.%s', tn.nspname, t.typname) END,
            'typmod', a.atttypmod,
            'key', CASE c.relreplident
                       WHEN 'f' THEN true
                       WHEN 'n' THEN false
                       WHEN 'd' THEN EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid
                                             AND i.indisprimary AND a.attnum = ANY (i.indkey))
                       ELSE EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid
                                    AND i.indisreplident AND a.attnum = ANY (i.indkey))
                   END,
            'not_null', a.attnotnull,
            'default', pg_get_expr(d.adbin, d.adrelid))
            ORDER BY a.attnum)
        FROM pg_attribute a
        JOIN pg_type t ON t.oid = a.atttypid
        JOIN pg_namespace tn ON tn.oid = t.typnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
          AND a.attgenerated = ''), '[]'::jsonb))
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = rel AND c.relkind IN ('r', 'p')
  AND c.relpersistence <> 't'  -- a temporary table is no one else's business
$$;

CREATE OR REPLACE FUNCTION pgcdc.type_definition(typ oid) RETURNS jsonb
LANGUAGE sql STABLE AS $$
SELECT jsonb_build_object(
    'oid', t.oid::bigint,
    'schema', n.nspname,
    'name', t.typname,
    'kind', CASE WHEN t.typtype = 'e' THEN 'enum'
                 WHEN t.typtype = 'c' THEN 'composite'
                 WHEN t.typtype = 'd' THEN 'domain'
                 WHEN t.typtype = 'r' THEN 'range'
                 WHEN t.typtype = 'm' THEN 'multirange'
                 WHEN t.typtype = 'p' THEN 'pseudo'
                 WHEN t.typcategory = 'A' AND t.typelem <> 0 THEN 'array'
                 ELSE 'base' END,
    'labels', CASE WHEN t.typtype = 'e' THEN (
        SELECT jsonb_agg(e.enumlabel::text ORDER BY e.enumsortorder)
        FROM pg_enum e WHERE e.enumtypid = t.oid) END,
    'attributes', CASE WHEN t.typtype = 'c' THEN (
        SELECT jsonb_agg(jsonb_build_object('name', a.attname, 'type_oid', a.atttypid::bigint,
                                            'typmod', a.atttypmod) ORDER BY a.attnum)
        FROM pg_attribute a
        WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped) END,
    'base_oid', CASE WHEN t.typtype = 'd' THEN t.typbasetype::bigint
                     WHEN t.typtype = 'r' THEN (SELECT r.rngsubtype::bigint FROM pg_range r
                                                WHERE r.rngtypid = t.oid)
                     WHEN t.typtype = 'm' THEN (SELECT r.rngtypid::bigint FROM pg_range r
                                                WHERE r.rngmultitypid = t.oid)
                     WHEN t.typcategory = 'A' AND t.typelem <> 0 THEN t.typelem::bigint END,
    'typmod', t.typtypmod,
    'not_null', CASE WHEN t.typtype = 'd' THEN t.typnotnull END,
    'default', t.typdefault,
    'constraints', CASE WHEN t.typtype = 'd' THEN (
        SELECT jsonb_agg(pg_get_constraintdef(c.oid) ORDER BY c.conname)
        FROM pg_constraint c WHERE c.contypid = t.oid) END,
    'comment', obj_description(t.oid, 'pg_type'))
FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
WHERE t.oid = typ
  -- a table's row type is the table, and so is the array of it
  AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = t.typrelid AND c.relkind <> 'c')
  AND NOT EXISTS (SELECT 1 FROM pg_type e JOIN pg_class c ON c.oid = e.typrelid
                  WHERE t.typcategory = 'A' AND e.oid = t.typelem AND c.relkind <> 'c')
$$;

CREATE OR REPLACE FUNCTION pgcdc.emit_type(typ oid) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    definition jsonb := pgcdc.type_definition(typ);
    arr oid;
BEGIN
    IF definition IS NULL THEN
        RETURN;
    END IF;
    PERFORM pg_logical_emit_message(true, 'pgcdc.ddl',
        jsonb_build_object('op', 'put_type', 'type', definition)::text);
    SELECT typarray INTO arr FROM pg_type WHERE oid = typ;
    IF arr IS NOT NULL AND arr <> 0 THEN
        definition := pgcdc.type_definition(arr);
        IF definition IS NOT NULL THEN
            PERFORM pg_logical_emit_message(true, 'pgcdc.ddl',
                jsonb_build_object('op', 'put_type', 'type', definition)::text);
        END IF;
    END IF;
END $$;

-- {publication: [column names]} for every publication of the table, as
-- pg_publication_tables lists them (its column list, or every column); NULL before
-- PostgreSQL 15, which has no column lists; {} for a table in no publication
CREATE OR REPLACE FUNCTION pgcdc.column_lists(rel oid) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    lists jsonb;
BEGIN
    IF current_setting('server_version_num')::int < 150000 THEN
        RETURN NULL;
    END IF;
    EXECUTE 'SELECT coalesce(jsonb_object_agg(pt.pubname, to_jsonb(pt.attnames)), ''{}'')
               FROM pg_publication_tables pt
               JOIN pg_namespace n ON n.nspname = pt.schemaname
               JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
              WHERE c.oid = $1' INTO lists USING rel;
    RETURN lists;
END $$;

-- TRUNCATE of a partition alone: a publication that publishes via the root sends nothing
-- (pgoutput skips a partition's truncate then), so its rows leave the root unseen.  A
-- statement trigger on every leaf partition says so, with the publications of each of its
-- ancestors; pgcdc reads a published root again whole
CREATE OR REPLACE FUNCTION pgcdc.on_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_logical_emit_message(true, 'pgcdc.ddl',
        jsonb_build_object('op', 'truncate_partition', 'oid', TG_RELID::bigint,
                           'ancestors', (SELECT coalesce(jsonb_object_agg(
                                                     a.relid::bigint::text,
                                                     pgcdc.column_lists(a.relid)), '{}')
                                           FROM pg_partition_ancestors(TG_RELID) a
                                          WHERE a.relid <> TG_RELID))::text);
    RETURN NULL;
END $$;

-- as the installing superuser: the command that describes a partition (ALTER TYPE,
-- ALTER PUBLICATION) may come from a role that does not own it; and never fails that
-- command (a warning says what is not followed)
CREATE OR REPLACE FUNCTION pgcdc.watch_truncate(rel oid) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_class WHERE oid = rel AND relispartition AND relkind = 'r')
       AND NOT EXISTS (SELECT 1 FROM pg_trigger
                       WHERE tgrelid = rel AND tgname = 'pgcdc_truncate') THEN
        EXECUTE format('CREATE TRIGGER pgcdc_truncate AFTER TRUNCATE ON %s '
                       'FOR EACH STATEMENT EXECUTE FUNCTION pgcdc.on_truncate()',
                       rel::regclass);
    END IF;
EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'pgcdc: no TRUNCATE trigger on partition % (%): a TRUNCATE of it alone '
                  'is not seen under a publication that publishes via the root',
                  rel::regclass, SQLERRM;
END $$;

CREATE OR REPLACE FUNCTION pgcdc.emit_table(rel oid) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    definition jsonb := pgcdc.table_definition(rel);
    part oid;
BEGIN
    IF definition IS NULL THEN
        RETURN;
    END IF;
    PERFORM pgcdc.watch_truncate(rel);
    PERFORM pg_logical_emit_message(true, 'pgcdc.ddl',
        jsonb_build_object('op', 'put', 'table', definition,
                           'publications', pgcdc.column_lists(rel),
                           'entered', current_setting('pgcdc.entering', true) = 'on')::text);
    FOR part IN SELECT inhrelid FROM pg_inherits WHERE inhparent = rel LOOP
        PERFORM pgcdc.emit_table(part);
    END LOOP;
END $$;

-- the tables a publication lists by name (FOR TABLE): PostgreSQL removes a dropped table
-- from the publication, so a table created again under that name would never be
-- published; pgcdc.follow adds it back in the transaction that creates it (or renames a
-- table to that name), so none of its rows is missed
CREATE TABLE IF NOT EXISTS pgcdc.followed (
    pubname name NOT NULL,
    schemaname name NOT NULL,
    tablename name NOT NULL,
    PRIMARY KEY (pubname, schemaname, tablename)
);

CREATE OR REPLACE FUNCTION pgcdc.follow(rel oid) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    pub name;
BEGIN
    FOR pub IN SELECT f.pubname FROM pgcdc.followed f
               JOIN pg_namespace n ON n.nspname = f.schemaname
               JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = f.tablename
               JOIN pg_publication p ON p.pubname = f.pubname
               WHERE c.oid = rel AND c.relkind IN ('r', 'p') AND NOT p.puballtables
                 AND NOT EXISTS (SELECT 1 FROM pg_publication_tables pt
                                 WHERE pt.pubname = f.pubname AND pt.schemaname = f.schemaname
                                   AND pt.tablename = f.tablename) LOOP
        EXECUTE format('ALTER PUBLICATION %I ADD TABLE %s', pub, rel::regclass);
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION pgcdc.on_ddl() RETURNS event_trigger
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    rel oid;
BEGIN
    FOR r IN SELECT DISTINCT classid, objid FROM pg_event_trigger_ddl_commands() LOOP
        IF r.classid = 'pg_class'::regclass THEN
            SELECT CASE WHEN c.relkind IN ('r', 'p') THEN c.oid
                        WHEN c.relkind = 'i' THEN (SELECT indrelid FROM pg_index
                                                   WHERE indexrelid = c.oid) END
              INTO rel FROM pg_class c WHERE c.oid = r.objid;
            IF rel IS NOT NULL THEN
                PERFORM pgcdc.follow(rel);
                PERFORM pgcdc.emit_table(rel);
            END IF;
            -- a composite type's attributes live in pg_class / pg_attribute
            PERFORM pgcdc.emit_type(c.reltype) FROM pg_class c
             WHERE c.oid = r.objid AND c.relkind = 'c';
        ELSIF r.classid = 'pg_publication_rel'::regclass THEN
            -- a table added to a publication, or its column list changed: its rows (or
            -- the columns) enter it with no row change (``entered``: pgcdc reads it again)
            PERFORM set_config('pgcdc.entering', 'on', true);
            PERFORM pgcdc.emit_table(pr.prrelid) FROM pg_publication_rel pr
             WHERE pr.oid = r.objid;
            PERFORM set_config('pgcdc.entering', 'off', true);
        ELSIF r.classid = 'pg_publication'::regclass THEN
            PERFORM pgcdc.emit_table(pr.prrelid) FROM pg_publication_rel pr
             WHERE pr.prpubid = r.objid;
            -- publish_via_partition_root set or reset: every partition tree changes hands;
            -- a publication of all tables (created, say): every table is in it
            PERFORM pgcdc.emit_table(c.oid) FROM pg_class c, pg_publication p
             WHERE p.oid = r.objid AND NOT c.relispartition
               AND (c.relkind = 'p' OR c.relkind = 'r' AND p.puballtables)
               AND c.relpersistence = 'p'
               AND c.relnamespace::regnamespace::text
                   NOT IN ('pg_catalog', 'information_schema', 'pgcdc');
        ELSIF r.classid = 'pg_publication_namespace'::regclass THEN
            -- ADD TABLES IN SCHEMA: each of its tables enters the publication
            PERFORM set_config('pgcdc.entering', 'on', true);
            PERFORM pgcdc.emit_table(c.oid) FROM pg_publication_namespace pn
              JOIN pg_class c ON c.relnamespace = pn.pnnspid
             WHERE pn.oid = r.objid AND c.relkind IN ('r', 'p');
            PERFORM set_config('pgcdc.entering', 'off', true);
        ELSIF r.classid = 'pg_type'::regclass THEN
            PERFORM pgcdc.emit_type(r.objid);
            FOR rel IN SELECT DISTINCT a.attrelid FROM pg_attribute a
                       JOIN pg_class c ON c.oid = a.attrelid
                       WHERE a.atttypid = r.objid AND c.relkind IN ('r', 'p')
                         AND NOT a.attisdropped LOOP
                PERFORM pgcdc.emit_table(rel);
            END LOOP;
        END IF;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION pgcdc.on_drop() RETURNS event_trigger
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT objid FROM pg_event_trigger_dropped_objects()
             WHERE classid = 'pg_class'::regclass AND object_type = 'table' LOOP
        PERFORM pg_logical_emit_message(true, 'pgcdc.ddl',
            jsonb_build_object('op', 'drop', 'oid', r.objid::bigint)::text);
    END LOOP;
    -- a table (or a schema's tables) dropped from a publication (ALTER PUBLICATION ... DROP,
    -- SET): described again, with the publications it is in now (none left: DROP TABLE)
    FOR r IN SELECT address_names FROM pg_event_trigger_dropped_objects()
             WHERE classid = 'pg_publication_rel'::regclass LOOP
        PERFORM pgcdc.emit_table(to_regclass(format('%I.%I', r.address_names[1],
                                                    r.address_names[2])));
    END LOOP;
    FOR r IN SELECT address_names FROM pg_event_trigger_dropped_objects()
             WHERE classid = 'pg_publication_namespace'::regclass LOOP
        PERFORM pgcdc.emit_table(c.oid) FROM pg_class c
         WHERE c.relnamespace = to_regnamespace(quote_ident(r.address_names[1]))
           AND c.relkind IN ('r', 'p');
    END LOOP;
    -- every dropped type; pgcdc ignores those it never captured (tables' row types)
    FOR r IN SELECT objid FROM pg_event_trigger_dropped_objects()
             WHERE classid = 'pg_type'::regclass AND object_type IN ('type', 'domain') LOOP
        PERFORM pg_logical_emit_message(true, 'pgcdc.ddl',
            jsonb_build_object('op', 'drop_type', 'oid', r.objid::bigint)::text);
    END LOOP;
END $$;

-- a command that rewrites a table's rows (a volatile default, ALTER COLUMN ... TYPE,
-- USING): the rewrite writes no row changes to the WAL, so the stream never sees the new
-- values; pgcdc reads the table again (snapshot_builder/ddl.py rows_rewritten)
CREATE OR REPLACE FUNCTION pgcdc.on_rewrite() RETURNS event_trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_logical_emit_message(true, 'pgcdc.ddl',
        jsonb_build_object('op', 'rewrite', 'oid', pg_event_trigger_table_rewrite_oid()::bigint,
                           'reason', pg_event_trigger_table_rewrite_reason())::text);
END $$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'pgcdc_rewrite') THEN
        CREATE EVENT TRIGGER pgcdc_rewrite ON table_rewrite EXECUTE FUNCTION pgcdc.on_rewrite();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'pgcdc_ddl') THEN
        CREATE EVENT TRIGGER pgcdc_ddl ON ddl_command_end EXECUTE FUNCTION pgcdc.on_ddl();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'pgcdc_drop') THEN
        CREATE EVENT TRIGGER pgcdc_drop ON sql_drop EXECUTE FUNCTION pgcdc.on_drop();
    END IF;
END $$;

-- the partitions that exist already
SELECT pgcdc.watch_truncate(c.oid) FROM pg_class c WHERE c.relispartition AND c.relkind = 'r';

COMMENT ON FUNCTION pgcdc.on_ddl() IS 'pgcdc DDL capture 5';
"""

# what current() looks for: an installation of an older pgcdc is upgraded in place
CAPTURE_VERSION: Final = "pgcdc DDL capture 5"


class DdlCaptureError(TerminalError):
    pass


# pg_event_trigger_table_rewrite_reason(): AT_REWRITE_* bits (src/include/nodes/parsenodes.h)
_REWRITE_REASONS: Final = {1: "persistence changed", 2: "a volatile default",
                           4: "a column's type changed", 8: "the access method changed"}


def installed(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT count(*) FROM pg_event_trigger "
                       "WHERE evtname IN ('pgcdc_ddl', 'pgcdc_drop')").fetchone()
    return row is not None and row[0] == 2


def current(conn: psycopg.Connection[Any]) -> bool:
    """Installed by this pgcdc: every trigger, and the functions as this release writes
    them (the comment :data:`CAPTURE_VERSION` on ``pgcdc.on_ddl``).  An older installation
    lacks one of them; :func:`install` upgrades it in place."""
    row = conn.execute("SELECT obj_description(to_regprocedure('pgcdc.on_ddl()'), 'pg_proc') "
                       "= %s AND to_regprocedure('pgcdc.type_definition(oid)') IS NOT NULL "
                       "AND to_regprocedure('pgcdc.column_lists(oid)') IS NOT NULL "
                       "AND to_regprocedure('pgcdc.follow(oid)') IS NOT NULL "
                       "AND EXISTS (SELECT 1 FROM pg_event_trigger "
                       "WHERE evtname = 'pgcdc_rewrite')", (CAPTURE_VERSION,)).fetchone()
    return installed(conn) and row is not None and bool(row[0])


def install(conn: psycopg.Connection[Any]) -> None:
    """Install (or update) the DDL capture; needs a superuser."""
    try:
        with conn.transaction():
            conn.execute(INSTALL_SQL)
    except psycopg.errors.InsufficientPrivilege as exc:
        msg = ("installing DDL capture needs a superuser (event triggers): run pgcdc once as "
               "one, have an owner run snapshot_builder/ddl.py's INSTALL_SQL, or turn DDL "
               f"capture off (the stream's Relation messages then describe tables): {exc}")
        raise DdlCaptureError(msg) from exc


def uninstall(conn: psycopg.Connection[Any]) -> list[str]:
    """Remove DDL capture: its event triggers and the ``pgcdc`` schema with everything in it
    (functions, ``pgcdc.followed``, the incremental snapshots' ``pgcdc.signal``); returns
    what was there to remove.  Needs a superuser (or the owner of what it drops)."""
    removed = [f"event trigger {r[0]}" for r in conn.execute(
        "SELECT evtname FROM pg_event_trigger WHERE evtname IN "
        "('pgcdc_ddl', 'pgcdc_drop', 'pgcdc_rewrite') ORDER BY 1").fetchall()]
    row = conn.execute("SELECT to_regnamespace('pgcdc') IS NOT NULL").fetchone()
    if row is not None and row[0]:
        removed.append("schema pgcdc (DDL capture's functions, pgcdc.followed, pgcdc.signal)")
    with conn.transaction():
        for name in ("pgcdc_ddl", "pgcdc_drop", "pgcdc_rewrite"):
            conn.execute(psycopg.sql.SQL("DROP EVENT TRIGGER IF EXISTS {}").format(
                psycopg.sql.Identifier(name)))
        conn.execute("DROP SCHEMA IF EXISTS pgcdc CASCADE")
    return removed


def follow(conn: psycopg.Connection[Any], publication: str) -> None:
    """Remember the tables ``publication`` lists by name, so that a table dropped and created
    again under one of those names is published again from its creation (``pgcdc.follow``,
    called by the DDL trigger).  A publication of all tables needs none of it."""
    try:
        with conn.transaction():
            conn.execute(
                "INSERT INTO pgcdc.followed SELECT pt.pubname, pt.schemaname, pt.tablename "
                "FROM pg_publication_tables pt JOIN pg_publication p ON p.pubname = pt.pubname "
                "WHERE pt.pubname = %s AND NOT p.puballtables ON CONFLICT DO NOTHING",
                (publication,))
    except psycopg.errors.InsufficientPrivilege as exc:
        log.warning("cannot record the tables of publication %s in pgcdc.followed (%s): a "
                    "table dropped and created again under one of their names will not be "
                    "published; grant INSERT on pgcdc.followed, or add such a table with "
                    "ALTER PUBLICATION ... ADD TABLE and re-load it", publication, exc)


def baseline(conn: psycopg.Connection[Any], publication: str) -> list[PutTable | PutType]:
    """The history's starting point: every user type (enums, composites, domains, ranges,
    their arrays) and the current definition of every published table.  A capture
    installed by an older pgcdc has no ``pgcdc.type_definition``: then tables only."""
    changes: list[PutTable | PutType] = []
    row = conn.execute("SELECT to_regprocedure('pgcdc.type_definition(oid)') IS NOT NULL")\
        .fetchone()
    if row is not None and row[0]:
        types = conn.execute(
            "SELECT d FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace, "
            "LATERAL pgcdc.type_definition(t.oid) d "
            "WHERE t.oid >= 16384 AND d IS NOT NULL AND n.nspname <> ALL "
            "(ARRAY['pg_catalog', 'information_schema', 'pgcdc']) "
            "AND n.nspname NOT LIKE 'pg\\_toast%%' AND n.nspname NOT LIKE 'pg\\_temp\\_%%' "
            "ORDER BY t.oid").fetchall()
        changes += [PutType(type_from_dict(r[0])) for r in types]
    rows = conn.execute(
        "SELECT pgcdc.table_definition(format('%%I.%%I', schemaname, tablename)::regclass), "
        f"{'attnames' if conn.info.server_version >= 150000 else 'NULL'} "
        "FROM pg_publication_tables WHERE pubname = %s ORDER BY 1", (publication,)).fetchall()
    changes += [PutTable(published_columns(table_from_dict(row[0]), row[1]))
                for row in rows if row[0] is not None]
    # the rest of each published table's partition tree, unpublished: a partitioned table
    # and its partitions trade places in the publication when publish_via_partition_root
    # changes, and the ones entering it must be known as out of it before (read again then)
    others = conn.execute(
        "WITH published AS (SELECT format('%%I.%%I', schemaname, tablename)::regclass AS rel "
        "FROM pg_publication_tables WHERE pubname = %s) "
        "SELECT pgcdc.table_definition(t.relid) FROM (SELECT DISTINCT tree.relid "
        "FROM published, LATERAL pg_partition_tree(pg_partition_root(published.rel)) tree) t "
        "WHERE t.relid NOT IN (SELECT rel FROM published) ORDER BY 1", (publication,)).fetchall()
    changes += [PutTable(replace(table_from_dict(row[0]), published=False))
                for row in others if row[0] is not None]
    return changes


@dataclass(frozen=True, slots=True)
class TruncatedPartition:
    """A partition was truncated: its rows left its ancestors with no change a publication
    that publishes via the root sends.  Not a catalog change."""

    oid: int
    ancestors: dict[int, bool | None]  # ancestor OID -> in the publication (None: unknown)


@dataclass(frozen=True, slots=True)
class RewriteTable:
    """A command rewrote the table's rows (no row change reaches the WAL): not a catalog
    change, a note that the stored rows changed."""

    oid: int
    reason: str


def rows_rewritten(before: TableVersion | None, after: TableVersion) -> str | None:
    """Why ``after`` changed the stored rows of ``before`` without row changes in the WAL,
    or None: a column added with a default (every existing row takes it, a constant one
    without a rewrite).  Rewrites proper come as :class:`RewriteTable`."""
    if before is None:
        return None  # a new table (or one newly published): it has no rows the stream missed
    old = {c.attnum if c.attnum is not None else c.name for c in before.columns}
    added = [c.name for c in after.columns
             if (c.attnum if c.attnum is not None else c.name) not in old
             and c.default is not None and not c.default.upper().startswith("NULL")]
    if added:
        return f"column(s) {', '.join(added)} added with a default"
    return None


def values_changed(before: TypeVersion | None, after: TypeVersion) -> str | None:
    """Why ``after`` changed the stored values of type ``before`` without row changes in
    the WAL, or None: a composite's attributes added, dropped, renamed or retyped (every
    value of it reads differently: a field more, less or renamed), an enum label renamed
    (every value holding it reads as the new label).  Adding an enum label, and any change
    of a domain (its constraints, default, name), changes no stored value."""
    if before is None or before.kind != after.kind:
        return None
    if after.kind == "composite" and before.attributes != after.attributes:
        return f"the attributes of type {after.qualified_name} changed"
    if after.kind == "enum" and not set(before.labels) <= set(after.labels):
        return f"a label of type {after.qualified_name} was renamed"
    return None


def tables_using(tables: Iterable[TableVersion], types: Mapping[int, TypeVersion | None],
                 changed: int) -> list[TableVersion]:
    """The ``tables`` with a column whose values hold type ``changed``: of it, or of an
    array, domain, range or composite over it (at any depth), by the user ``types``."""
    every = dict(types)
    holding = {changed}
    grown = True
    while grown:
        grown = False
        for oid, dtype in every.items():
            if dtype is None or oid in holding:
                continue
            if dtype.base_oid in holding or any(a.type_oid in holding
                                                for a in dtype.attributes):
                holding.add(oid)
                grown = True
    return [t for t in tables if any(c.type_oid in holding for c in t.columns)]


def entered(content: bytes, publication: str | None) -> bool:
    """Whether a ``put`` message describes a table added to ``publication`` (or its column
    list changed) by this command: its rows entered the publication unseen."""
    data = json.loads(content)
    return bool(data.get("entered")) and publication is not None \
        and publication in (data.get("publications") or {})


def parse_message(content: bytes, publication: str | None = None) \
        -> Change | RewriteTable | TruncatedPartition:
    """The catalog change one ``pgcdc.ddl`` message describes; a table as ``publication``
    publishes it (its column list, if it has one)."""
    try:
        data = json.loads(content)
        if data["op"] == "put":
            table = table_from_dict(data["table"])
            lists = data.get("publications") or {}
            if publication is not None and data.get("publications") is not None \
                    and publication not in lists:  # left out (an attached partition, say)
                return PutTable(replace(table, published=False))
            return PutTable(published_columns(table, lists.get(publication)))
        if data["op"] == "drop":
            return DropTable(int(data["oid"]))
        if data["op"] == "put_type":
            return PutType(type_from_dict(data["type"]))
        if data["op"] == "drop_type":
            return DropType(int(data["oid"]))
        if data["op"] == "rewrite":
            bits = int(data.get("reason") or 0)
            reasons = [text for bit, text in _REWRITE_REASONS.items() if bits & bit]
            return RewriteTable(int(data["oid"]), ", ".join(reasons) or "rows rewritten")
        if data["op"] == "truncate_partition":
            return TruncatedPartition(int(data["oid"]), {
                int(oid): None if publication is None else publication in lists
                for oid, lists in data["ancestors"].items()})
    except (ValueError, KeyError, TypeError) as exc:
        msg = f"malformed {PREFIX} message ({exc}): {content[:200]!r}"
        raise DdlCaptureError(msg) from exc
    msg = f"unknown {PREFIX} operation {data.get('op')!r}"
    raise DdlCaptureError(msg)
