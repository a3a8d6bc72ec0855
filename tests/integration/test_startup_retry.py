"""PostgreSQL unreachable when ``pgcdc run`` starts is waited for, as during a run (issue 18).

``pgcdc run`` starts while its server is stopped: it logs each attempt with the backoff of a
lost connection and, once the server is started, streams and delivers.  ``--max-retries``
gives up with exit 4; a DSN pgcdc cannot read exits 2 at once, without a retry.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import psycopg

from pgcdc.services.postgres import PostgresServer

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
