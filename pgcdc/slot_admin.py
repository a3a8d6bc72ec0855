"""``pgcdc slot create|drop|list``: replication slot administration; ``drop --all`` also
removes DDL capture when no other slot of the database is left to use it."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import psycopg

from core.errors import ConfigError
from pgcdc.exit_codes import EXIT_USAGE
from pgcdc.state_paths import state_files

if TYPE_CHECKING:
    import argparse

    from pgcdc.config import Settings


def slot_command(settings: Settings, args: argparse.Namespace) -> int:
    """``pgcdc slot create|drop``: drop asks first (``--yes`` skips; no terminal, no drop)."""
    from decoder.errors import SlotInUseError, SlotMissingError
    from decoder.lsn import format_lsn
    from decoder.slot import drop_slot, ensure_slot, slot_info

    slot = settings.source.slot
    if args.action == "list":
        return _slot_list(settings)
    if args.action == "drop" and not args.yes:
        if not sys.stdin.isatty():
            msg = (f'refusing to drop replication slot "{slot}" without confirmation: '
                   "stdin is not a terminal; pass --yes to drop it")
            raise ConfigError(msg)
        answer = input(f'drop replication slot "{slot}"? The server discards the WAL it keeps '
                       "for it and pgcdc cannot resume from it. Type the slot name to confirm: ")
        if answer.strip() != slot:
            print("pgcdc: not dropped", file=sys.stderr)
            return EXIT_USAGE
    with psycopg.connect(settings.source.conninfo(), autocommit=True) as conn:
        info = slot_info(conn, slot)
        if args.action == "create":
            if info is not None:
                print(f'replication slot "{slot}" already exists '
                      f"(confirmed {format_lsn(info.confirmed_flush_lsn or 0)})")
                return 0
            info = ensure_slot(conn, slot, create=True, two_phase=not args.no_two_phase)
            print(f'created replication slot "{slot}" at '
                  f"{format_lsn(info.confirmed_flush_lsn or 0)}")
            return 0
        if info is None:
            raise SlotMissingError(slot)
        if info.active_pid is not None:
            raise SlotInUseError(slot, info.active_pid)
        drop_slot(conn, slot)
        print(f'dropped replication slot "{slot}"')
        if args.all:
            _uninstall(conn)
    from decoder.restart import start_over

    files = state_files(settings)
    if files.progress_file is not None and files.progress_file.exists():
        print(f"pgcdc: {files.progress_file} still holds the dropped slot's progress, so "
              "pgcdc run refuses to start from a new slot; "
              f"{start_over(slot, files, drop_slot=False)}", file=sys.stderr)
    return 0


def _slot_list(settings: Settings) -> int:
    """``pgcdc slot list``: every replication slot of the server, what it holds back."""
    rows = []
    with psycopg.connect(settings.source.conninfo(), autocommit=True) as conn:
        for r in conn.execute(
                "SELECT slot_name, slot_type, coalesce(plugin, '-'), coalesce(database, '-'), "
                "coalesce(active_pid::text, '-'), coalesce(confirmed_flush_lsn::text, '-'), "
                "coalesce(wal_status, '-'), coalesce(pg_size_pretty(pg_wal_lsn_diff("
                "pg_current_wal_lsn(), restart_lsn)), '-') "
                "FROM pg_replication_slots ORDER BY slot_name").fetchall():
            rows.append([str(v) for v in r])
    header = ["slot", "type", "plugin", "database", "active_pid", "confirmed_flush",
              "wal_status", "wal_held"]
    if not rows:
        print("no replication slots")
        return 0
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]
    for line in [header, *rows]:
        print("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip())
    return 0


def _uninstall(conn: psycopg.Connection[Any]) -> None:
    """What ``slot drop --all`` removes beyond the slot, and what it leaves, said."""
    from snapshot_builder import ddl

    others = [str(r[0]) for r in conn.execute(
        "SELECT slot_name FROM pg_replication_slots WHERE database = current_database() "
        "AND plugin = 'pgoutput' ORDER BY 1").fetchall()]
    if others:
        print(f"kept DDL capture: slot(s) {', '.join(others)} of this database may use it")
    else:
        for what in ddl.uninstall(conn):
            print(f"removed {what}")
    print("publications are kept (pgcdc may share one with others): DROP PUBLICATION <name> "
          "removes one pgcdc created")
