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


def test_a_pipeline_only_prepared_holds_no_lock(pg_conn: Conn, pg_dsn: str,
                                                tmp_path: Path) -> None:
    """prepare() alone (to create the slot) releases the lock when it is done; run() takes it
    for as long as it streams."""
    from decoder.progress import ProgressLockedError
    from decoder.slot import current_wal_lsn
    from pgcdc.pipeline import Pipeline, PipelineConfig
    from tests.recording_sink import RecordingSink

    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    config = PipelineConfig(pg_dsn, tables=["public.t"], progress_file=tmp_path / "p.json")
    prepared = Pipeline(config, RecordingSink())
    prepared.prepare()  # kept alive: its lock, were it held, would stay
    pg_conn.execute("INSERT INTO t VALUES (1)")
    streaming = Pipeline(PipelineConfig(pg_dsn, tables=["public.t"],
                                        progress_file=tmp_path / "p.json"), RecordingSink())
    streaming.prepare()
    streaming.run(until_lsn=current_wal_lsn(pg_conn))
    assert [e.key for e in streaming.sink.events] == [{"id": 1}]  # type: ignore[attr-defined]
    assert prepared._store is not None
    prepared._store.lock()  # free again once run() ended
    try:
        other = Pipeline(PipelineConfig(pg_dsn, tables=["public.t"],
                                        progress_file=tmp_path / "p.json"), RecordingSink())
        try:
            other.prepare()
        except ProgressLockedError:
            pass
        else:
            raise AssertionError("a prepare while another holds the lock must be refused")
    finally:
        prepared._store.unlock()
