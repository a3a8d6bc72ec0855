"""The lake through PostgreSQL crashes (issue 15's workload: ``pg_ctl stop -m immediate``):
DDL and DML before, around and after two crashes of the server while ``pgcdc run`` streams
(a transaction with DDL open at the first crash, a prepared one with DDL across it, a
rewrite and a keyless table's duplicates after it; the second crash right after a large
write), then the lake model's check: every lake table equals its source.

An immediate stop writes no shutdown checkpoint, so the slot may come back behind what pgcdc
had confirmed (test_faults.py's T5): the stream replays transactions whose DDL the catalog
history already holds.  test_faults.py checks Kafka through crashes; this checks the lake."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from decoder.slot import current_wal_lsn, slot_info
from pgcdc.services.postgres import PostgresServer
from tests.lake_model import Program, Rig, _tail

pytestmark = pytest.mark.spark


@pytest.fixture
def program(own_pg_server: PostgresServer, kafka_servers: str, spark: Any,
            tmp_path: Path) -> Iterator[Program]:
    program = Program(Rig(own_pg_server, kafka_servers, spark, tmp_path))
    yield program
    program.close()


def _caught_up(program: Program, process: Any, log: Path, timeout: float = 180) -> None:
    """Wait until ``pgcdc run`` confirmed everything written so far (it reconnected)."""
    target = current_wal_lsn(program.conn)
    deadline = time.monotonic() + timeout
    while (info := slot_info(program.conn, program.slot)) is None \
            or (info.confirmed_flush_lsn or 0) < target:
        assert process.poll() is None, f"pgcdc run exited {process.returncode}:\n{_tail(log)}"
        assert time.monotonic() < deadline, f"pgcdc run did not catch up:\n{_tail(log)}"
        time.sleep(0.2)


@pytest.mark.timeout(1800)
def test_the_lake_equals_the_source_through_postgres_crashes(program: Program) -> None:
    program.run(
        "CREATE TABLE t (id int PRIMARY KEY, a int, b text)",
        "INSERT INTO t SELECT g, g, 'b' || g FROM generate_series(1, 40) g",
        "CREATE TABLE k (n int, s text)", "ALTER TABLE k REPLICA IDENTITY FULL",
        "INSERT INTO k SELECT g % 4, 'x' FROM generate_series(1, 20) g")
    process, log = program.start_run()
    try:
        program.run(
            "ALTER TABLE t ADD COLUMN c numeric(10,2) DEFAULT 4",  # no row change in the WAL
            "UPDATE t SET a = -a WHERE id % 3 = 0",
            "ALTER TABLE t RENAME COLUMN b TO b2",
            "INSERT INTO t SELECT g, g, 'new', 1.5 FROM generate_series(41, 60) g",
            "INSERT INTO k VALUES (1, 'x'), (1, 'x')",
            "DELETE FROM t WHERE id BETWEEN 5 AND 9",
            "UPDATE k SET s = 'y' WHERE ctid = (SELECT min(ctid) FROM k WHERE n = 2)")
        _caught_up(program, process, log)
        # a prepared transaction with DDL, committed after the crash (k is locked till then)
        with psycopg.connect(program.dsn, autocommit=True) as prepared:
            prepared.execute("BEGIN")
            prepared.execute("ALTER TABLE k ADD COLUMN p int DEFAULT 9")
            prepared.execute("INSERT INTO k VALUES (7, 'prepared', 1)")
            prepared.execute("PREPARE TRANSACTION 'across'")
        program.run("INSERT INTO t SELECT g, g, 'mid', 3 FROM generate_series(61, 70) g")
        # a transaction with DDL, open at the crash (t is locked till then)
        open_ddl = psycopg.connect(program.dsn)
        open_ddl.execute("ALTER TABLE t ADD COLUMN lost int")
        open_ddl.execute("INSERT INTO t VALUES (1000, 1, 'lost', 1, 1)")
        time.sleep(2)  # pgcdc streams what committed meanwhile
        program.crash_server()
        with contextlib.suppress(psycopg.Error):
            open_ddl.close()
        program.run(
            "COMMIT PREPARED 'across'",
            "ALTER TABLE t DROP COLUMN a",
            "ALTER TABLE t ALTER COLUMN c TYPE numeric(12,3) USING c * 2",  # a rewrite
            "INSERT INTO t SELECT g, 'after', 2.25 FROM generate_series(71, 80) g",
            "DELETE FROM k WHERE ctid = (SELECT min(ctid) FROM k WHERE n = 1)",
            "INSERT INTO k VALUES (3, 'x', NULL), (3, 'x', NULL)")
        _caught_up(program, process, log)
        program.run("INSERT INTO t SELECT g, 'burst', 0 FROM generate_series(100, 1500) g",
                    "ALTER TABLE t ADD COLUMN d text DEFAULT 'd'")
        program.crash_server()  # while pgcdc streams the burst
        program.run("UPDATE t SET d = 'e' WHERE id % 7 = 0", "TRUNCATE k",
                    "INSERT INTO k VALUES (5, 'z', 5)")
        _caught_up(program, process, log)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        process.communicate(timeout=60)
    program.check()  # catches up in this process, applies, compares every lake table
