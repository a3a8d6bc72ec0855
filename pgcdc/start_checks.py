"""What a start checks before it creates anything.

A start that fails a check (a published table the role may not read, a schema it may not
use, a table without a key) must leave no publication or slot behind.  The publication is
created in the same transaction as the checks run in, so a failed check rolls it back
(:func:`checked_publication`); the slot is created only after every check passed.
:func:`preflight` runs the same checks and always rolls back, for the starts that create
the slot elsewhere (the initial load).
"""

from __future__ import annotations

import logging

import psycopg
from psycopg import sql

from core.errors import TerminalError
from decoder.slot import check_identity, check_wal_level, ensure_publication
from snapshot_builder import ddl

Conn = psycopg.Connection[tuple[object, ...]]
log = logging.getLogger(__name__)

_SECURITY = "(the least-privilege role: docs/security.md)"


_FIXES = {"replication": "ALTER ROLE {role} REPLICATION",
          "schema": "GRANT USAGE ON SCHEMA {name} TO {role}",
          "table": "GRANT SELECT ON TABLE {name} TO {role}"}


class PrivilegeError(TerminalError):
    """The role may not read what pgcdc streams; the message names every ``GRANT`` needed."""

    def __init__(self, role: str, denied: list[tuple[str, str]]) -> None:
        # denied: (kind, name), kind "replication" (the role's attribute), "schema" or
        # "table", name quoted as SQL writes it
        what = ", ".join(f"replication (role {role} lacks the REPLICATION attribute)"
                         if kind == "replication" else f"{kind} {name}" for kind, name in denied)
        grants = "; ".join(_FIXES[kind].format(name=name, role=role) for kind, name in denied)
        super().__init__(f"permission denied for {what}; as the owner or a superuser run "
                         f"{grants} {_SECURITY}")
        self.denied = denied


def check_privileges(conn: Conn, publication: str, *, capture_ddl: bool = True) -> None:
    """The connected role may replicate (``REPLICATION``) and read every table the
    publication publishes: ``USAGE`` on its schema and ``SELECT`` on it (pgoutput itself
    needs neither, so without this check a role would stream what it may not read); with
    DDL capture installed, ``USAGE`` on the schema ``pgcdc`` (its catalog functions)."""
    row = conn.execute("SELECT quote_ident(current_user)").fetchone()
    role = str(row[0]) if row else "<the role pgcdc connects as>"
    rows = conn.execute(
        """
        SELECT quote_ident(n.nspname), format('%%I.%%I', n.nspname, c.relname),
               has_schema_privilege(n.oid, 'USAGE'), has_table_privilege(c.oid, 'SELECT')
        FROM pg_publication_tables pt
        JOIN pg_namespace n ON n.nspname = pt.schemaname
        JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
        WHERE pt.pubname = %s
        ORDER BY 2
        """, (publication,)).fetchall()
    denied: list[tuple[str, str]] = []
    replication = conn.execute("SELECT rolreplication OR rolsuper FROM pg_roles "
                               "WHERE rolname = current_user").fetchone()
    if replication is not None and not replication[0]:
        denied.append(("replication", role))
    if capture_ddl and ddl.installed(conn):
        own = conn.execute("SELECT has_schema_privilege('pgcdc', 'USAGE')").fetchone()
        if own is not None and not own[0]:
            denied.append(("schema", "pgcdc"))
    for schema, _, usage, _ in rows:
        if not usage and ("schema", str(schema)) not in denied:
            denied.append(("schema", str(schema)))
    denied += [("table", str(table)) for _, table, _, select in rows if not select]
    if denied:
        raise PrivilegeError(role, denied)


def checked_publication(conn: Conn, publication: str, tables: list[str] | None, *,
                        create: bool, capture_ddl: bool = True) -> None:
    """Create the publication if it is missing (and allowed), and check it: keys or replica
    identities, and the role's privileges.  One transaction: a failed check leaves no
    publication behind."""
    with conn.transaction():
        created = ensure_publication(conn, publication, tables, create=create)
        check_identity(conn, publication, created=created)
        check_privileges(conn, publication, capture_ddl=capture_ddl)
        warn_generated_columns(conn, publication)
        warn_unpublished_operations(conn, publication)


def warn_unpublished_operations(conn: Conn, publication: str) -> list[str]:
    """Say which operations the publication leaves out (``WITH (publish = ...)``): their
    changes never reach Kafka, so a deleted row (say) stays in the lake, which is then no
    clone of the source.  Returns them (none: every operation is published)."""
    row = conn.execute("SELECT pubinsert, pubupdate, pubdelete, pubtruncate "
                       "FROM pg_publication WHERE pubname = %s", (publication,)).fetchone()
    if row is None:
        return []
    missing = [op for op, published in zip(("insert", "update", "delete", "truncate"), row,
                                           strict=True) if not published]
    if missing:
        log.warning("publication %s does not publish %s: those changes never reach Kafka, and "
                    "the lake keeps what they changed (no clone of the source); publish them: "
                    "ALTER PUBLICATION %s SET (publish = 'insert, update, delete, truncate')",
                    publication, ", ".join(missing), sql.Identifier(publication).as_string(conn))
    return missing


_GENERATED = """
SELECT format('%%I.%%I', n.nspname, c.relname),
       string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum)
FROM pg_publication_tables pt
JOIN pg_namespace n ON n.nspname = pt.schemaname
JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE pt.pubname = %s AND a.attgenerated <> ''
GROUP BY 1 ORDER BY 1
"""
_warned_generated: set[str] = set()


def warn_generated_columns(conn: Conn, publication: str) -> list[str]:
    """Say which published tables have generated columns: PostgreSQL 15 to 17 never
    publishes them (pgoutput leaves them out of its Relation and row messages), so they are
    not in Kafka and the lake tables have no such columns.  Each table is named once per
    process; returns the tables named now."""
    named = []
    for table, columns in conn.execute(_GENERATED, (publication,)).fetchall():
        if str(table) in _warned_generated:
            continue
        _warned_generated.add(str(table))
        named.append(str(table))
        log.warning("table %s has generated column(s) %s, which PostgreSQL does not publish "
                    "to logical replication (before version 18): they are not in Kafka and "
                    "its lake table has no such column; compute them downstream from the "
                    "published columns (docs/lake-ddl.md)", table, columns)
    return named


class _RolledBack(logging.Filter):
    """Leaves out the log line of a publication created by the dry run (rolled back)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("created publication")


def preflight(dsn: str, publication: str, tables: list[str] | None, *, create: bool,
              capture_ddl: bool = True) -> None:
    """Every check of a start, creating nothing: the publication, if missing, is created
    in a transaction that is rolled back whatever the checks find."""
    quiet = _RolledBack()
    slot_log = logging.getLogger("decoder.slot")
    slot_log.addFilter(quiet)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            check_wal_level(conn)
            with conn.transaction():
                checked_publication(conn, publication, tables, create=create,
                                    capture_ddl=capture_ddl)
                raise psycopg.Rollback
    finally:
        slot_log.removeFilter(quiet)
