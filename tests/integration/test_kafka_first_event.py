"""Kafka unreachable when a table's first event needs its topic and table version (issue 18).

The topic's creation and the table version's flush wait for Kafka at most
``KafkaSink.request_timeout`` seconds, then fail as a delivery does (DeliveryError): the
pipeline logs it, resets the sink and retries from the durable position, and once Kafka is
back every change arrives with its table version in the catalog topic.  A stop (SIGTERM)
while such a wait blocks ends it at once: exit 4 within the grace period, saying what was
left undelivered, not a traceback nor the hard exit after the grace period.

The services (a PostgreSQL cluster, a broker behind a proxy) and the rig are test_faults.py's.
"""

# ruff: noqa: F811 (the tests take the fixtures imported from test_faults as arguments)
from __future__ import annotations

import logging
import signal
import threading
import time

import pytest

from decoder.slot import current_wal_lsn
from pgcdc.pipeline import Pipeline, PipelineConfig
from pgcdc.services.ports import free_port
from sinks.kafka import KafkaSink
from tests.health import get, sample
from tests.integration.test_faults import (  # noqa: F401 (fixtures)
    Rig,
    kafka,
    pg_proxy,
    rig,
)
from tests.oracle import Writer, read_topic, verify
from tests.tcp_proxy import BLACKHOLE, PASS

BOUND = 90  # seconds a wait lasts at most (not a timing assertion)


def _until(what: str, ready: object, thread: threading.Thread | None = None) -> None:
    assert callable(ready)
    deadline = time.monotonic() + BOUND
    while not ready():
        assert thread is None or thread.is_alive(), f"the pipeline ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {BOUND} s"
        time.sleep(0.1)


def test_kafka_unreachable_at_a_tables_first_event_is_retried(
        rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    writer = Writer(rig.dsn, seed=191)
    sink = KafkaSink(rig.servers, topic_prefix=rig.prefix)  # Avro: read through _catalog
    sink.request_timeout = 3.0
    pipeline = Pipeline(PipelineConfig(rig.dsn, progress_file=rig.progress,
                                       status_interval=0.1, retry_max_delay=0.5,
                                       shutdown_grace=3.0), sink)
    pipeline.prepare()
    stop = threading.Event()
    failures: list[BaseException] = []

    def run() -> None:
        try:
            pipeline.run(stop=stop)
        except BaseException as exc:  # noqa: BLE001 (said by the test)
            failures.append(exc)

    thread = threading.Thread(target=run, name="pipeline")
    rig.kafka_proxy.set_mode(BLACKHOLE)
    try:
        thread.start()
        writer.write(rig.conn, 5)  # the table's first events: its topic and version first
        _until("two failed attempts", lambda: pipeline.progress.errors.get(
            "DeliveryError", 0) >= 2, thread)
    finally:
        rig.kafka_proxy.set_mode(PASS)
    try:
        writer.write(rig.conn, 5)
        target = current_wal_lsn(rig.conn)
        _until("catch-up", lambda: rig.confirmed() >= target, thread)
    finally:
        stop.set()
        thread.join(60)
        sink.close()
    assert not failures, failures
    said = caplog.text
    assert f"Kafka at {rig.servers} did not answer within 3 s" in said, said
    assert "reconnecting in" in said and "retrying until stopped" in said, said
    verify(read_topic(rig.servers, rig.topic), writer.ledger, rig.conn)


def test_stop_while_waiting_for_a_table_version(rig: Rig) -> None:
    """SIGTERM while the first event of a table waits for a blackholed Kafka (its topic):
    exit 4 with the undelivered count and the durable position, before the hard exit that
    bounds a blocked stop, and the slot stays below the undelivered changes."""
    pgcdc = rig.pgcdc()
    port = free_port()
    metrics = f"http://127.0.0.1:{port}/metrics"
    pgcdc.argv += ["--shutdown-grace-seconds", "2", "--metrics-port", str(port)]
    pgcdc.start()
    writer = Writer(rig.dsn, seed=192)
    rig.wait_for("streaming", lambda: rig.active_pid() is not None, BOUND, pgcdc)
    rig.kafka_proxy.set_mode(BLACKHOLE)
    try:
        before = current_wal_lsn(rig.conn)  # the writes commit after it
        writer.write(rig.conn, 3)
        # the first event came and pgcdc waits for Kafka (the walsender having sent it is
        # not enough: pgcdc may not have read it yet, and a stop then leaves nothing behind)
        rig.wait_for("pgcdc waiting for Kafka", lambda: (sample(
            get(metrics)[1], "pgcdc_sink_unacknowledged_seconds") or 0) > 0, BOUND, pgcdc)
        assert pgcdc.proc is not None
        pgcdc.proc.send_signal(signal.SIGTERM)
        code, err = pgcdc.wait(BOUND)
    finally:
        rig.kafka_proxy.set_mode(PASS)
    assert code == 4, f"exit {code}, not 4:\n{err}"
    assert "stopping took longer than" not in err, err
    assert "not acknowledged by the sink within the 2 s grace period" in err, err
    assert "stopping while waiting for Kafka" in err, err
    assert "Traceback" not in err, err
    assert rig.confirmed() <= before, "the slot passed what Kafka did not have"


def test_on_lag_stop_while_waiting_for_a_table_version(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--on-lag stop`` while the first event of a table waits for a blackholed Kafka: the
    wait counts as a stall, so the stall watch samples the lag and, past the limit, stops
    pgcdc (exit 3) at once, not after the wait's own time-out; the slot stays put."""
    pgcdc = rig.pgcdc()
    pgcdc.argv += ["--max-lag-bytes", "200000", "--on-lag", "stop", "--sink-stall-seconds",
                   "1", "--shutdown-grace-seconds", "2"]
    monkeypatch.setenv("PGCDC_LAG_INTERVAL", "0.5")
    pgcdc.start()
    writer = Writer(rig.dsn, seed=193)
    rig.wait_for("streaming", lambda: rig.active_pid() is not None, BOUND, pgcdc)
    rig.caught_up(pgcdc)  # no event yet: the idle slot confirmed the WAL end
    rig.kafka_proxy.set_mode(BLACKHOLE)
    assert pgcdc.proc is not None
    try:
        before = current_wal_lsn(rig.conn)
        deadline = time.monotonic() + BOUND
        while pgcdc.proc.poll() is None and time.monotonic() < deadline:
            writer.write(rig.conn, 5)  # the WAL the slot holds grows past the limit
            time.sleep(0.2)
        code, err = pgcdc.wait(BOUND)
    finally:
        rig.kafka_proxy.set_mode(PASS)
    assert code == 3, f"exit {code}, not 3:\n{err}"
    assert "more than --max-lag-bytes 200000" in err, err
    assert "the sink has acknowledged nothing for" in err, err
    assert "did not answer within" not in err, err  # ended by the guard, not its time-out
    assert "Traceback" not in err, err
    assert rig.confirmed() <= before, "the slot passed what Kafka did not have"
