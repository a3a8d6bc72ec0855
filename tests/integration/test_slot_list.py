"""``pgcdc slot list`` (issue 18): every replication slot of the server, with its state."""

from __future__ import annotations

import subprocess
import sys

import psycopg

from decoder.slot import slot_info

Conn = psycopg.Connection[tuple[object, ...]]


def _pgcdc(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pgcdc", *argv], capture_output=True,
                          text=True, timeout=60, check=False)


def test_slot_list(pg_conn: Conn, pg_dsn: str) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pg_conn.execute("CREATE PUBLICATION pgcdc FOR TABLE t")
    for name in ("list_a", "list_b"):
        assert _pgcdc("slot", "create", "--dsn", pg_dsn, "--slot", name).returncode == 0
    done = _pgcdc("slot", "list", "--dsn", pg_dsn)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["slot", "type", "plugin", "database", "active_pid",
                                "confirmed_flush", "wal_status", "wal_held"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    database = pg_dsn.split("dbname=")[1].split()[0]
    for name in ("list_a", "list_b"):
        info = slot_info(pg_conn, name)
        assert info is not None
        row = rows[name]
        assert row[1:5] == ["logical", "pgoutput", database, "-"], row
        lsn = info.confirmed_flush_lsn or 0
        assert row[5] == f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}", row
        assert row[6] == "reserved", row
    for name in ("list_a", "list_b"):
        assert _pgcdc("slot", "drop", "--dsn", pg_dsn, "--slot", name, "--yes").returncode == 0
