"""``pgcdc run`` shows a live status line on a terminal, and nothing extra without one
(issue 18; pgcdc/status_line.py).  The terminal is a pseudo-terminal (``pty.openpty``)."""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg

from decoder.slot import current_wal_lsn, slot_info

Conn = psycopg.Connection[tuple[object, ...]]
BOUND = 90  # seconds a wait lasts at most (not a timing assertion)
_LINE = re.compile(r"\r\x1b\[Kpgcdc: [0-9,]+ events/s \| durable [0-9A-F]+/[0-9A-F]+ \| "
                   r"lag [^|]+, [0-9.]+ s \| (streaming|connecting|sink stalled)")


def _argv(dsn: str, tmp: Path) -> list[str]:
    return [sys.executable, "-m", "pgcdc", "run", "--dsn", dsn, "--sink", "null", "--tables",
            "public.t", "--progress-file", str(tmp / "p.json"), "--catalog-dir",
            str(tmp / "catalog")]


def _caught_up(conn: Conn, proc: subprocess.Popen[bytes]) -> int:
    """Wait until the slot confirmed everything written so far, and for a few status lines'
    worth of time (a wait, not an assertion); the WAL position waited for."""
    target = current_wal_lsn(conn)
    deadline = time.monotonic() + BOUND
    while True:
        info = slot_info(conn, "pgcdc")
        if info and info.confirmed_flush_lsn and info.confirmed_flush_lsn >= target:
            break
        assert proc.poll() is None, f"pgcdc exited {proc.returncode}"
        assert time.monotonic() < deadline, "pgcdc did not catch up"
        time.sleep(0.2)
    time.sleep(3)
    return target


def test_a_status_line_on_a_terminal(pg_conn: Conn, pg_dsn: str, tmp_path: Path) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pg_conn.execute("INSERT INTO t SELECT generate_series(1, 100)")
    master, slave = pty.openpty()
    proc = subprocess.Popen(_argv(pg_dsn, tmp_path), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: every writer closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        _caught_up(pg_conn, proc)
        pg_conn.execute("INSERT INTO t SELECT generate_series(101, 200)")
        written = _caught_up(pg_conn, proc)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        reader.join(10)
        os.close(master)
    out = b"".join(chunks).decode(errors="replace")
    assert code == 0, out
    lines = [m[0] for m in _LINE.finditer(out)]
    assert len(lines) >= 2, f"no status line rewritten in place:\n{out!r}"
    assert any(line.endswith("| streaming") for line in lines), out
    info = slot_info(pg_conn, "pgcdc")
    assert info is not None and info.confirmed_flush_lsn is not None
    durable = [(int(hi, 16) << 32) + int(lo, 16)
               for hi, lo in re.findall(r"durable ([0-9A-F]+)/([0-9A-F]+)", out)]
    # what was written and confirmed is shown durable; nothing beyond what the slot confirmed
    # at exit (keepalives may move the slot on after the last line: the cluster is shared)
    assert durable[-1] >= written, f"the rows confirmed are never shown durable:\n{out!r}"
    assert max(durable) <= info.confirmed_flush_lsn, \
        f"a durable LSN shown beyond the slot's ({info.confirmed_flush_lsn}):\n{out!r}"
    assert out.endswith("\r\x1b[K"), "the line was not cleared at exit"
    print(f"\n{len(lines)} status lines, the last: {lines[-1].strip()}")


def test_no_status_line_without_a_terminal(pg_conn: Conn, pg_dsn: str, tmp_path: Path) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pg_conn.execute("INSERT INTO t SELECT generate_series(1, 100)")
    proc = subprocess.Popen(_argv(pg_dsn, tmp_path), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _caught_up(pg_conn, proc)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == 0, err
    assert b"events/s" not in err + out and b"\x1b[" not in err + out, err
