"""DDL in the WAL: an event trigger that writes every changed table definition as a
transactional logical message, so catalog changes arrive in the stream at their exact place.

:func:`install` creates, idempotently, in the schema ``pgcdc``:

* ``pgcdc.table_definition(oid) -> jsonb``: a table's full definition, in the
  form of :meth:`TableVersion.to_dict` (columns with type, typmod, key flag as
  pgoutput sets it, NOT NULL, default; replica identity, comment, partition
  parent);
* an event trigger on ``ddl_command_end`` that emits
  ``pg_logical_emit_message(true, 'pgcdc.ddl', {"op": "put", "table": ...})``
  for every table a command created or altered (an index command: its table; a
  type command: every table with a column of that type; a partitioned table:
  its partitions too);
* an event trigger on ``sql_drop`` that emits ``{"op": "drop", "oid": ...}``.

Creating event triggers needs a superuser: run ``pgcdc`` once as one, or have
one run the SQL in :data:`INSTALL_SQL`.  Streaming itself then needs only
REPLICATION and SELECT.
"""

from __future__ import annotations

import json
from typing import Any, Final

import psycopg

from pgcdc.errors import TerminalError
from snapshot_builder.catalog import table_from_dict
from snapshot_builder.history import Change, DropTable, PutTable

PREFIX: Final = "pgcdc.ddl"

INSTALL_SQL: Final = r"""
CREATE SCHEMA IF NOT EXISTS pgcdc;

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
$$;

CREATE OR REPLACE FUNCTION pgcdc.emit_table(rel oid) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    definition jsonb := pgcdc.table_definition(rel);
    part oid;
BEGIN
    IF definition IS NULL THEN
        RETURN;
    END IF;
    PERFORM pg_logical_emit_message(true, 'pgcdc.ddl',
        jsonb_build_object('op', 'put', 'table', definition)::text);
    FOR part IN SELECT inhrelid FROM pg_inherits WHERE inhparent = rel LOOP
        PERFORM pgcdc.emit_table(part);
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
                PERFORM pgcdc.emit_table(rel);
            END IF;
        ELSIF r.classid = 'pg_type'::regclass THEN
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
END $$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'pgcdc_ddl') THEN
        CREATE EVENT TRIGGER pgcdc_ddl ON ddl_command_end EXECUTE FUNCTION pgcdc.on_ddl();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'pgcdc_drop') THEN
        CREATE EVENT TRIGGER pgcdc_drop ON sql_drop EXECUTE FUNCTION pgcdc.on_drop();
    END IF;
END $$;
"""


class DdlCaptureError(TerminalError):
    pass


def installed(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT count(*) FROM pg_event_trigger "
                       "WHERE evtname IN ('pgcdc_ddl', 'pgcdc_drop')").fetchone()
    return row is not None and row[0] == 2


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


def baseline(conn: psycopg.Connection[Any], publication: str) -> list[PutTable]:
    """The current definition of every published table (the history's starting point)."""
    rows = conn.execute(
        "SELECT pgcdc.table_definition(format('%%I.%%I', schemaname, tablename)::regclass) "
        "FROM pg_publication_tables WHERE pubname = %s ORDER BY 1", (publication,)).fetchall()
    return [PutTable(table_from_dict(row[0])) for row in rows if row[0] is not None]


def parse_message(content: bytes) -> Change:
    """The catalog change one ``pgcdc.ddl`` message describes."""
    try:
        data = json.loads(content)
        if data["op"] == "put":
            return PutTable(table_from_dict(data["table"]))
        if data["op"] == "drop":
            return DropTable(int(data["oid"]))
    except (ValueError, KeyError, TypeError) as exc:
        msg = f"malformed {PREFIX} message ({exc}): {content[:200]!r}"
        raise DdlCaptureError(msg) from exc
    msg = f"unknown {PREFIX} operation {data.get('op')!r}"
    raise DdlCaptureError(msg)
