"""``pgcdc status``: the slot, its lag, stored progress and the catalog, as one report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg

from decoder.lsn import format_lsn
from decoder.slot import slot_info
from pgcdc.progress import ProgressStore
from snapshot_builder.history import HistoryFile


def status_report(dsn: str, slot: str, progress_file: Path, catalog_dir: Path) -> dict[str, Any]:
    report: dict[str, Any] = {"slot": slot}
    with psycopg.connect(dsn, autocommit=True) as conn:
        info = slot_info(conn, slot)
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        current = str(row[0]) if row else None
        report["server_wal_lsn"] = current
        if info is None:
            report["exists"] = False
        else:
            lag = conn.execute(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, "
                "(SELECT extract(epoch FROM replay_lag)::float FROM pg_stat_replication "
                " WHERE pid = s.active_pid) FROM pg_replication_slots s WHERE slot_name = %s",
                (slot,)).fetchone()
            report.update({
                "exists": True,
                "active": info.active_pid is not None,
                "active_pid": info.active_pid,
                "wal_status": info.wal_status,
                "confirmed_flush_lsn": format_lsn(info.confirmed_flush_lsn or 0),
                "restart_lsn": format_lsn(info.restart_lsn or 0),
                "lag_bytes": int(lag[0]) if lag and lag[0] is not None else None,
                "lag_seconds": float(lag[1]) if lag and lag[1] is not None else None,
                "two_phase": info.two_phase,
            })
    stored = ProgressStore(progress_file).load()
    report["stored_progress"] = format_lsn(stored.durable_lsn) if stored else None
    if stored and info and info.confirmed_flush_lsn is not None:
        report["progress_check"] = ("ok" if stored.durable_lsn >= info.confirmed_flush_lsn
                                    else "DATA LOSS: the slot is ahead of stored progress")
    if (catalog_dir / "catalog.log").exists() or (catalog_dir / "catalog.snapshot").exists():
        history = HistoryFile(catalog_dir).load()
        report["catalog_version"] = history.latest.version
        report["catalog_lsn"] = format_lsn(history.latest.lsn)
        report["catalog_tables"] = len(history.latest.tables)
        report["catalog_oldest_version"] = history.base.version
    else:
        report["catalog_version"] = None
    return report


def render(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2)
