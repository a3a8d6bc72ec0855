"""Scripted runs (issue 18): ``pgcdc run --exit-when-caught-up`` and ``--until-lsn`` stop by
themselves, exit 0, with everything up to the target delivered and confirmed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg

from decoder.lsn import format_lsn
from decoder.slot import current_wal_lsn, slot_info

Conn = psycopg.Connection[tuple[object, ...]]


def _run(dsn: str, tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgcdc", "run", "--dsn", dsn, "--sink", "jsonl",
         "--output", str(tmp / "events.jsonl"), "--tables", "public.t",
         "--progress-file", str(tmp / "p.json"), "--catalog-dir", str(tmp / "catalog"),
         *extra], capture_output=True, text=True, timeout=120, check=False)


def _ids(tmp: Path) -> list[int]:
    lines = (tmp / "events.jsonl").read_text().splitlines()
    return [json.loads(line)["after"]["id"] for line in lines if '"after"' in line
            and json.loads(line).get("after")]


def test_exit_when_caught_up(pg_conn: Conn, pg_dsn: str, tmp_path: Path) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    assert _run(pg_dsn, tmp_path, "--exit-when-caught-up").returncode == 0  # creates the slot
    for i in range(1, 6):
        pg_conn.execute("INSERT INTO t VALUES (%s)", (i,))
    target = current_wal_lsn(pg_conn)
    done = _run(pg_dsn, tmp_path, "--exit-when-caught-up")
    assert done.returncode == 0, done.stderr
    assert _ids(tmp_path) == [1, 2, 3, 4, 5]
    info = slot_info(pg_conn, "pgcdc")
    assert info is not None and (info.confirmed_flush_lsn or 0) >= target


def test_until_lsn(pg_conn: Conn, pg_dsn: str, tmp_path: Path) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    assert _run(pg_dsn, tmp_path, "--exit-when-caught-up").returncode == 0
    pg_conn.execute("INSERT INTO t VALUES (1), (2)")
    target = current_wal_lsn(pg_conn)
    pg_conn.execute("INSERT INTO t VALUES (3)")
    done = _run(pg_dsn, tmp_path, "--until-lsn", format_lsn(target))
    assert done.returncode == 0, done.stderr
    assert _ids(tmp_path)[:2] == [1, 2]
    info = slot_info(pg_conn, "pgcdc")
    assert info is not None and (info.confirmed_flush_lsn or 0) >= target
    bad = _run(pg_dsn, tmp_path, "--until-lsn", "nonsense")
    assert bad.returncode == 2 and "invalid LSN 'nonsense'" in bad.stderr, bad.stderr
