"""Running as a service: metrics and health over HTTP, the WAL-retention guard, slot commands."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from decoder.slot import current_wal_lsn, slot_info
from pgcdc.acknowledgement import LagLimitError
from pgcdc.metrics import MetricsServer
from pgcdc.pipeline import Pipeline, PipelineConfig
from pgcdc.services.ports import free_port
from tests.health import get
from tests.recording_sink import RecordingSink

Conn = psycopg.Connection[tuple[object, ...]]


def _samples(text: str) -> dict[str, float]:
    """Each sample line of the Prometheus text format: 'name{labels}' -> value."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _wait(predicate: object, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _pgcdc(*argv: str, env: dict[str, str] | None = None,
           **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pgcdc", *argv], capture_output=True,
                          text=True, timeout=30, check=False, env=env or dict(os.environ),
                          **kwargs)  # type: ignore[call-overload]


def test_metrics_and_health_of_a_running_pipeline(pg_conn: Conn, pg_dsn: str) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pg_conn.execute("CREATE TABLE u (id int PRIMARY KEY)")
    sink = RecordingSink()
    pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.t", "public.u"],
                                       status_interval=0.2, sample_lag=True, lag_interval=0.2),
                        sink)
    pipeline.prepare()
    stop = threading.Event()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with MetricsServer(pipeline, port=port, ready_age=30):
        assert get(f"{base}/health/live") == (200, "live\n")
        assert get(f"{base}/health/ready")[0] == 503  # not streaming yet
        assert get(f"{base}/nothing")[0] == 404
        thread = threading.Thread(target=pipeline.run, kwargs={"stop": stop})
        thread.start()
        try:
            with pg_conn.transaction():
                pg_conn.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c')")
                pg_conn.execute("INSERT INTO u VALUES (1)")
            pg_conn.execute("UPDATE t SET v = 'x' WHERE id = 1")
            pg_conn.execute("DELETE FROM t WHERE id = 2")
            end = current_wal_lsn(pg_conn)
            _wait(lambda: pipeline.progress.durable_lsn >= end, "the pipeline did not catch up")
            _wait(lambda: get(f"{base}/health/ready")[0] == 200, "never ready")
            _wait(lambda: "pgcdc_slot_lag_bytes " in get(f"{base}/metrics")[1],
                  "no lag sample")
            code, text = get(f"{base}/metrics")
        finally:
            stop.set()
            thread.join(30)
        assert code == 200
        m = _samples(text)
        assert m['pgcdc_events_total{op="c",table="public.t"}'] == 3
        assert m['pgcdc_events_total{op="u",table="public.t"}'] == 1
        assert m['pgcdc_events_total{op="d",table="public.t"}'] == 1
        assert m['pgcdc_events_total{op="c",table="public.u"}'] == 1
        assert m["pgcdc_transactions_total"] == 3
        assert m["pgcdc_flushed_lsn"] >= end
        assert m["pgcdc_received_lsn"] >= end
        assert m["pgcdc_slot_lag_bytes"] >= 0
        assert m["pgcdc_in_flight_events"] == 0
        assert m["pgcdc_pending_buffered_bytes"] == 0
        assert m['pgcdc_builder_state{state="consistent"}'] == 1
        assert m['pgcdc_builder_state{state="start"}'] == 0
        assert m['pgcdc_builder_state{state="full_snapshot"}'] == 0
        assert m["pgcdc_catalog_generation"] == pipeline.builder.generation
        assert m["pgcdc_reconnects_total"] == 0
        assert m["pgcdc_streaming"] == 1
        assert m["pgcdc_memory_python_blocks"] > 10_000
        assert m['pgcdc_memory_heap_bytes{state="in_use"}'] > 2**20
        assert m['pgcdc_memory_heap_bytes{state="free"}'] >= 0
        assert "# TYPE pgcdc_errors_total counter" in text
        assert pipeline.progress.by_table == {"public.t": 5, "public.u": 1}
        # stopped: no longer ready, still live
        assert get(f"{base}/health/ready")[0] == 503
        assert get(f"{base}/health/live")[0] == 200


def test_lag_guard_stops_with_a_typed_error(pg_conn: Conn, pg_dsn: str) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.t"], max_lag_bytes=1,
                                       on_lag="stop"), RecordingSink())
    pipeline.prepare()
    pg_conn.execute("INSERT INTO t SELECT generate_series(1, 100)")
    with pytest.raises(LagLimitError, match='slot "pgcdc" is [0-9]+ bytes behind') as exc:
        pipeline.run(stop=threading.Event())
    assert exc.value.lag > 1
    assert pipeline.progress.errors == {"LagLimitError": 1}
    assert pipeline.progress.lag_exceeded == 1


def test_lag_guard_warns_and_keeps_streaming(pg_conn: Conn, pg_dsn: str,
                                             caplog: pytest.LogCaptureFixture) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    sink = RecordingSink()
    pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.t"], max_lag_bytes=1),
                        sink)
    pipeline.prepare()
    pg_conn.execute("INSERT INTO t SELECT generate_series(1, 100)")
    end = current_wal_lsn(pg_conn)
    with caplog.at_level("WARNING", logger="pgcdc.pipeline"):
        pipeline.run(until_lsn=end)
    assert len(sink.events) == 100
    assert pipeline.progress.lag_exceeded >= 1
    assert any("--max-lag-bytes 1" in r.getMessage() for r in caplog.records)


def test_cli_slot_create_then_run_stops_on_lag(pg_conn: Conn, pg_dsn: str,
                                               tmp_path: Path) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pg_conn.execute("CREATE PUBLICATION pgcdc FOR TABLE t")
    created = _pgcdc("slot", "create", "--dsn", pg_dsn)
    assert created.returncode == 0, created.stderr
    assert created.stdout.startswith('created replication slot "pgcdc" at ')
    assert slot_info(pg_conn, "pgcdc") is not None
    pg_conn.execute("INSERT INTO t SELECT generate_series(1, 100)")
    run = _pgcdc("run", "--dsn", pg_dsn, "--sink", "null", "--max-lag-bytes", "1",
                 "--on-lag", "stop", "--progress-file", str(tmp_path / "p.json"),
                 "--catalog-dir", str(tmp_path / "catalog"))
    assert run.returncode == 3, run.stderr
    assert "more than --max-lag-bytes 1" in run.stderr


def test_cli_slot_drop_needs_confirmation(pg_conn: Conn, pg_dsn: str) -> None:
    assert _pgcdc("slot", "create", "--dsn", pg_dsn, "--slot", "s1").returncode == 0
    refused = _pgcdc("slot", "drop", "--dsn", pg_dsn, "--slot", "s1", stdin=subprocess.DEVNULL)
    assert refused.returncode == 2
    assert "stdin is not a terminal; pass --yes" in refused.stderr
    assert slot_info(pg_conn, "s1") is not None
    dropped = _pgcdc("slot", "drop", "--dsn", pg_dsn, "--slot", "s1", "--yes")
    assert dropped.returncode == 0, dropped.stderr
    assert slot_info(pg_conn, "s1") is None
    missing = _pgcdc("slot", "drop", "--dsn", pg_dsn, "--slot", "s1", "--yes")
    assert missing.returncode == 3
    assert "s1" in missing.stderr


def test_cli_run_from_config_file_serves_health(pg_conn: Conn, pg_dsn: str,
                                                tmp_path: Path) -> None:
    """The config file with a password from the environment; the log line shows the DSN
    redacted; /health/ready turns 200; SIGTERM stops with status 0."""
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    port = free_port()
    config = tmp_path / "pgcdc.toml"
    config.write_text(f"""
[source]
dsn = "{pg_dsn}"
tables = ["public.t"]

[sink]
kind = "null"

[state]
progress_file = "{tmp_path / 'p.json'}"
catalog_dir = "{tmp_path / 'catalog'}"

[service]
metrics_port = {port}

[log]
level = "info"
format = "json"
""")
    env = {**os.environ, "PGCDC_PASSWORD": "hunter2"}  # the test server trusts local users
    proc = subprocess.Popen([sys.executable, "-m", "pgcdc", "run", "--config", str(config)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        def ready() -> bool:
            assert proc.poll() is None, proc.communicate(timeout=5)[1]
            return get(f"http://127.0.0.1:{port}/health/ready")[0] == 200
        _wait(ready, "pgcdc run never became ready", timeout=30)
        pg_conn.execute("INSERT INTO t VALUES (1)")
        _wait(lambda: 'pgcdc_events_total{op="c",table="public.t"} 1.0'
              in get(f"http://127.0.0.1:{port}/metrics")[1], "the insert was not counted")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "hunter2" not in err
    assert '"message": "streaming slot pgcdc from' in err
    assert "password=***" in err
