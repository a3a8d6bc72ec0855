"""PostgreSQL unreachable when ``pgcdc run`` starts is waited for, as during a run (issue 18).

``pgcdc run`` starts while its server is stopped: it logs each attempt with the backoff of a
lost connection and, once the server is started, streams and delivers.  ``--max-retries``
gives up with exit 4; a DSN pgcdc cannot read exits 2 at once, without a retry.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from decoder.errors import ConnectionLostError, ReplicationError
from decoder.replication import ReplicationConnection
from pgcdc.services.postgres import PostgresServer
from pgcdc.startup import unreachable

BOUND = 120  # seconds a wait lasts at most (not a timing assertion)


def _command(dsn: str, tmp: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pgcdc", "run", "--dsn", dsn, "--sink", "jsonl",
            "--output", str(tmp / "out.jsonl"), "--progress-file", str(tmp / "p.json"),
            "--catalog-dir", str(tmp / "catalog"), "--retry-max-delay", "0.5", *extra]


class _Stderr:
    """A process's stderr, read by a thread; waits for a line holding some text."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._seen = threading.Condition()
        assert proc.stderr is not None
        self._thread = threading.Thread(target=self._read, args=(proc.stderr,), daemon=True)
        self._thread.start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            with self._seen:
                self.lines.append(line)
                self._seen.notify_all()

    def wait_for(self, text: str) -> None:
        with self._seen:
            found = self._seen.wait_for(lambda: any(text in line for line in self.lines),
                                        timeout=BOUND)
        assert found, f"no line with {text!r} within {BOUND} s:\n{''.join(self.lines)}"

    def text(self) -> str:
        self._thread.join(BOUND)
        return "".join(self.lines)


def test_run_waits_for_postgres_at_start(own_pg_server: PostgresServer, tmp_path: Path) -> None:
    with psycopg.connect(own_pg_server.dsn(), autocommit=True) as conn:
        conn.execute("CREATE TABLE waited (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION pgcdc FOR TABLE waited")
        conn.execute("SELECT pg_create_logical_replication_slot('pgcdc', 'pgoutput')")
        conn.execute("INSERT INTO waited SELECT generate_series(1, 5)")
    own_pg_server.stop()
    proc = subprocess.Popen(_command(own_pg_server.dsn(), tmp_path, "--exit-when-caught-up"),
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        stderr = _Stderr(proc)
        stderr.wait_for("attempt 3, retrying until stopped")
        own_pg_server.start()
        code = proc.wait(BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    said = stderr.text()
    assert code == 0, said
    attempts = [line for line in said.splitlines() if "PostgreSQL is not reachable" in line]
    assert len(attempts) >= 3, said
    assert all("retrying in" in line for line in attempts), said
    assert "PostgreSQL is reachable, after" in said, said
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(r["after"]["id"] for r in rows if r.get("op") == "c") == [1, 2, 3, 4, 5]


def test_max_retries_gives_up_at_start(own_pg_server: PostgresServer, tmp_path: Path) -> None:
    own_pg_server.stop()
    try:
        done = subprocess.run(_command(own_pg_server.dsn(), tmp_path, "--max-retries", "2"),
                              capture_output=True, text=True, timeout=BOUND, check=False)
    finally:
        own_pg_server.start()
    assert done.returncode == 4, done.stderr
    assert "attempt 2 of 2" in done.stderr, done.stderr
    assert "giving up after 3 failures in a row (--max-retries 2)" in done.stderr, done.stderr


def test_a_dsn_pgcdc_cannot_read_is_not_retried(tmp_path: Path) -> None:
    done = subprocess.run(_command("hostt=foo", tmp_path), capture_output=True, text=True,
                          timeout=BOUND, check=False)
    assert done.returncode == 2, done.stderr
    assert "retrying" not in done.stderr, done.stderr


def test_run_starts_again_when_postgres_crashes_while_it_starts(
        own_pg_server: PostgresServer, tmp_path: Path) -> None:
    """PostgreSQL crashes after ``pgcdc run`` reached it, while it creates its slot (held by
    a transaction the slot's snapshot waits for): it starts again once the server is back, as
    a lost connection is retried, and streams (lake model with crashes, bench seed 63000219:
    it exited 4)."""
    dsn = own_pg_server.dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE held (id int PRIMARY KEY)")
    blocker = psycopg.connect(dsn)  # a transaction with an xid: the slot's creation waits
    blocker.execute("INSERT INTO held VALUES (0)")
    proc = subprocess.Popen(_command(dsn, tmp_path, "--slot", "started", "--publication", "started",
                                     "--tables", "public.held"),
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    out = tmp_path / "out.jsonl"

    def until(condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + BOUND
        while not condition():
            assert proc.poll() is None, f"pgcdc run exited {proc.returncode}: {stderr.text()}"
            assert time.monotonic() < deadline, f"no {what} within {BOUND} s"
            time.sleep(0.1)

    def slot_active() -> bool:
        with psycopg.connect(dsn, autocommit=True) as conn:
            return conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = 'started' "
                                "AND active_pid IS NOT NULL").fetchone() is not None

    try:
        stderr = _Stderr(proc)
        until(slot_active, "slot being created")
        own_pg_server.stop("immediate")
        own_pg_server.start()
        stderr.wait_for("PostgreSQL went away while pgcdc started")
        until(slot_active, "stream")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO held SELECT generate_series(1, 5)")

        def streamed() -> bool:
            return out.exists() and sum('"op":"c"' in line.replace(" ", "")
                                        for line in out.read_text().splitlines()) == 5

        until(streamed, "rows streamed")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        with contextlib.suppress(psycopg.Error):
            blocker.close()
    assert code == 0, stderr.text()


def test_a_replication_command_cut_by_a_crash_is_a_lost_connection(
        own_pg_server: PostgresServer) -> None:
    """A crash between pgcdc's replication connection and its command (IDENTIFY_SYSTEM,
    CREATE_REPLICATION_SLOT: the lake model, seed 64000197, where ``pgcdc run`` exited 3 on
    "'IDENTIFY_SYSTEM' failed []: server closed the connection unexpectedly") is a lost
    connection that ``pgcdc run`` waits out, not the command's error."""
    stream = ReplicationConnection(own_pg_server.dsn())
    stream.connect()
    try:
        own_pg_server.stop("immediate")
        own_pg_server.start()
        with pytest.raises(ConnectionLostError, match="IDENTIFY_SYSTEM") as caught:
            stream.command("IDENTIFY_SYSTEM")
    finally:
        stream.close()
    cause = caught.value.__cause__
    assert isinstance(cause, psycopg.OperationalError) and unreachable(cause), cause
    # a command the server refuses is still the command's error
    stream = ReplicationConnection(own_pg_server.dsn())
    stream.connect()
    try:
        with pytest.raises(ReplicationError, match="no_such_command") as refused:
            stream.command("no_such_command")
        assert not isinstance(refused.value, ConnectionLostError)
    finally:
        stream.close()
