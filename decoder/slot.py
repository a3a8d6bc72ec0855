"""Publications, slots and the server checks that come before streaming.

All SQL is built with :mod:`psycopg.sql`; names are never formatted into strings.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psycopg
from psycopg import sql

from decoder.errors import (
    MissingIdentityError,
    PublicationMissingError,
    PublishedTableMissingError,
    ReplicationError,
    SlotInUseError,
    SlotInvalidatedError,
    SlotMissingError,
    WalLevelError,
)
from decoder.lsn import parse_lsn
from decoder.names import TableNameError, parse_table_name
from decoder.replication import ReplicationConnection

log = logging.getLogger(__name__)

Conn = psycopg.Connection[tuple[object, ...]]


@dataclass(frozen=True, slots=True)
class SlotInfo:
    name: str
    plugin: str
    active_pid: int | None
    confirmed_flush_lsn: int | None
    restart_lsn: int | None
    wal_status: str | None
    two_phase: bool


def check_wal_level(conn: Conn) -> None:
    row = conn.execute("SELECT current_setting('wal_level')").fetchone()
    level = str(row[0]) if row else "unknown"
    if level != "logical":
        raise WalLevelError(level)


def publication_exists(conn: Conn, name: str) -> bool:
    row = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,)).fetchone()
    return row is not None


def ensure_publication(conn: Conn, name: str, tables: list[str] | None, *, create: bool) -> bool:
    """Make sure the publication exists; create it for ``tables`` (``schema.table``) if allowed.
    Whether it was created here.

    With ``tables=None`` a created publication covers ``ALL TABLES`` (needs superuser).
    """
    if publication_exists(conn, name):
        return False
    if not create:
        raise PublicationMissingError(name)
    if tables:
        try:
            parts = [parse_table_name(t) for t in tables]
        except TableNameError as exc:
            raise PublishedTableMissingError(name, tables, str(exc)) from None
        targets = sql.SQL(", ").join(sql.Identifier(*p) for p in parts)
        query = sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(sql.Identifier(name), targets)
    else:
        query = sql.SQL("CREATE PUBLICATION {} FOR ALL TABLES").format(sql.Identifier(name))
    try:
        conn.execute(query)
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName) as exc:
        raise PublishedTableMissingError(name, tables or [],
                                         exc.diag.message_primary or str(exc)) from None
    log.info("created publication %s", name)
    return True


def check_identity(conn: Conn, publication: str, *, created: bool = True) -> None:
    """Every published table must be keyable: a primary key or a replica identity index/full.

    A publication that publishes updates and deletes makes PostgreSQL refuse them on a
    table without either, so a publication ``created`` here with such a table is refused
    (:class:`MissingIdentityError`: the application's updates would fail).  In a
    publication that exists (a table created since without a key: ``CREATE TABLE ... AS``)
    such a table can only gain rows, which are captured and applied as a multiset: a
    warning names it, and a restart is not refused."""
    rows = conn.execute(
        """
        SELECT format('%%I.%%I', n.nspname, c.relname)
        FROM pg_publication_tables pt
        JOIN pg_namespace n ON n.nspname = pt.schemaname
        JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
        WHERE pt.pubname = %s
          AND c.relreplident IN ('d', 'n')
          AND (c.relreplident = 'n' OR NOT EXISTS (
                SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary))
        ORDER BY 1
        """,
        (publication,),
    ).fetchall()
    if rows and created:
        raise MissingIdentityError([str(r[0]) for r in rows])
    if rows:
        log.warning("table(s) %s of publication %s have neither a primary key nor a replica "
                    "identity: PostgreSQL refuses their updates and deletes while the "
                    "publication publishes them, so only their inserts (and truncates) are "
                    "captured, applied to the lake as a multiset; to change their rows, add "
                    "a primary key or set REPLICA IDENTITY FULL",
                    ", ".join(str(r[0]) for r in rows), publication)


def slot_info(conn: Conn, slot: str) -> SlotInfo | None:
    row = conn.execute(
        """SELECT slot_name, plugin, active_pid, confirmed_flush_lsn::text, restart_lsn::text,
                  wal_status, two_phase
           FROM pg_replication_slots WHERE slot_name = %s""",
        (slot,),
    ).fetchone()
    if row is None:
        return None
    name, plugin, pid, confirmed, restart, wal_status, two_phase = row
    return SlotInfo(
        str(name), str(plugin), int(pid) if isinstance(pid, int) else None,
        parse_lsn(str(confirmed)) if confirmed else None,
        parse_lsn(str(restart)) if restart else None,
        str(wal_status) if wal_status else None,
        bool(two_phase),
    )


def ensure_slot(conn: Conn, slot: str, *, create: bool, two_phase: bool = True) -> SlotInfo:
    """The slot's state; create it (with two-phase decoding if asked) when allowed."""
    info = slot_info(conn, slot)
    if info is None:
        if not create:
            raise SlotMissingError(slot)
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, %s)",
                     (slot, two_phase))
        log.info("created replication slot %s", slot)
        info = slot_info(conn, slot)
        assert info is not None
    if info.plugin != "pgoutput":
        msg = (f'replication slot "{slot}" uses plugin {info.plugin}, pgcdc needs pgoutput: '
               "choose another slot name with --slot")
        raise ReplicationError(msg)
    if info.wal_status == "lost":
        raise SlotInvalidatedError(slot)
    if info.active_pid is not None:
        raise SlotInUseError(slot, info.active_pid)
    return info


def drop_slot(conn: Conn, slot: str) -> None:
    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def current_wal_lsn(conn: Conn) -> int:
    """The end of the WAL written so far (the insert position: a record that is not flushed
    yet, e.g. a non-transactional logical message, is included; the WAL writer flushes it)."""
    row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return parse_lsn(str(row[0]))


@dataclass(frozen=True, slots=True)
class ExportedSlot:
    """A slot created by ``CREATE_REPLICATION_SLOT ... (SNAPSHOT 'export')``.

    ``snapshot_name`` can be imported (``SET TRANSACTION SNAPSHOT``) only while the
    replication connection that created the slot stays open and runs no other command.
    ``consistent_point`` is the slot's ``confirmed_flush_lsn``: the snapshot sees every
    transaction whose commit record starts before it, streaming from it sends every
    transaction whose commit record starts at or after it.
    """

    name: str
    consistent_point: int
    snapshot_name: str
    plugin: str


def create_slot_exporting_snapshot(stream: ReplicationConnection, slot: str, *,
                                   two_phase: bool = True) -> ExportedSlot:
    """Create a pgoutput slot over a replication connection and export its snapshot.

    PostgreSQL 15 syntax: ``CREATE_REPLICATION_SLOT "slot" LOGICAL pgoutput
    (SNAPSHOT 'export'[, TWO_PHASE])``; PostgreSQL 15 accepts ``TWO_PHASE`` there and the
    slot shows ``two_phase = true``.  Keep ``stream`` open and idle until every reader has
    imported the snapshot.
    """
    options = [sql.SQL("SNAPSHOT 'export'")]
    if two_phase:
        options.append(sql.SQL("TWO_PHASE"))
    query = sql.SQL("CREATE_REPLICATION_SLOT {} LOGICAL pgoutput ({})").format(
        sql.Identifier(slot), sql.SQL(", ").join(options))
    rows = stream.command(query)
    if len(rows) != 1 or len(rows[0]) < 4 or None in rows[0][:4]:
        msg = f'CREATE_REPLICATION_SLOT "{slot}" returned {rows!r}, expected one row of four'
        raise ReplicationError(msg)
    name, consistent_point, snapshot_name, plugin = (str(v) for v in rows[0][:4])
    log.info("created replication slot %s at %s with exported snapshot %s", name,
             consistent_point, snapshot_name)
    return ExportedSlot(name, parse_lsn(consistent_point), snapshot_name, plugin)
