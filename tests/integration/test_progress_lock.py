"""One pgcdc per progress file (issue 18): a second ``pgcdc run`` with the same progress file is
refused (exit 3) naming the first one's pid, before it touches the slot; the first streams on,
and once it stopped the file is free again."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from decoder.slot import slot_info

Conn = psycopg.Connection[tuple[object, ...]]


def _argv(dsn: str, tmp: Path, slot: str) -> list[str]:
    return [sys.executable, "-m", "pgcdc", "run", "--dsn", dsn, "--sink", "null",
            "--tables", "public.t", "--slot", slot, "--progress-file", str(tmp / "p.json"),
            "--catalog-dir", str(tmp / f"{slot}.catalog")]


def test_second_instance_is_refused(pg_conn: Conn, pg_dsn: str, tmp_path: Path) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    first = subprocess.Popen(_argv(pg_dsn, tmp_path, "pgcdc"), stderr=subprocess.PIPE,
                             text=True)
    try:
        deadline = time.monotonic() + 60
        while (info := slot_info(pg_conn, "pgcdc")) is None or info.active_pid is None:
            assert first.poll() is None, first.communicate()[1]
            assert time.monotonic() < deadline, "the first pgcdc did not start streaming"
            time.sleep(0.2)
        # another slot, so that only the progress file is shared
        second = subprocess.run(_argv(pg_dsn, tmp_path, "other"), capture_output=True,
                                text=True, timeout=60, check=False)
        assert second.returncode == 3, second.stderr
        assert f"is in use by another pgcdc (pid {first.pid}," in second.stderr, second.stderr
        assert slot_info(pg_conn, "other") is None, "the refused instance created a slot"
        assert first.poll() is None, "the first pgcdc stopped"
    finally:
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    again = subprocess.Popen(_argv(pg_dsn, tmp_path, "pgcdc"), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while (info := slot_info(pg_conn, "pgcdc")) is None or info.active_pid is None:
            assert again.poll() is None, again.communicate()[1]
            assert time.monotonic() < deadline, "pgcdc did not start again"
            time.sleep(0.2)
    finally:
        again.send_signal(signal.SIGTERM)
        again.communicate(timeout=60)
    assert again.returncode == 0
