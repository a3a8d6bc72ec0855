"""Exactly-once through Kafka transactions (``pgcdc run --exactly-once``, issue #5).

pgcdc runs as a real separate process; it is crashed at named fail points and with
kill -9 under write load, restarted, and the table topic is read back by an independent
kafka-python consumer with ``isolation_level="read_committed"``: no committed change
missing, and no ``(commit_lsn, ordinal)`` twice.  What a read_uncommitted reader sees
is printed, not asserted (it may include aborted transactions).
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Producer

from core import failpoints
from core.wire import topic_name
from decoder.slot import current_wal_lsn, slot_info
from loads.initial_load import InitialLoad, LoadConfig
from pgcdc.pipeline import Pipeline, PipelineConfig
from sinks.kafka_txn import (
    TransactionalKafkaSink,
    default_transactional_id,
    offsets_topic,
    read_committed_lsn,
)
from tests.oracle import PgcdcProcess, Verdict, Writer, read_topic, verify

Conn = psycopg.Connection[tuple[object, ...]]

KILL_CYCLES = int(os.environ.get("PGCDC_EOS_KILL_CYCLES", "12"))
EXACTLY_ONCE = ("--exactly-once", "--commit-interval-ms", "300")


@pytest.fixture
def ledger(pg_conn: Conn) -> None:
    pg_conn.execute("CREATE TABLE ledger (id int PRIMARY KEY, version int NOT NULL, payload text)")
    pg_conn.execute("CREATE PUBLICATION pgcdc FOR TABLE ledger")
    pg_conn.execute("SELECT pg_create_logical_replication_slot('pgcdc', 'pgoutput', false, true)")


def _wait_for_a_commit(servers: str, prefix: str) -> None:
    deadline = time.monotonic() + 90
    while read_committed_lsn({"bootstrap.servers": servers}, offsets_topic(prefix),
                             "pgcdc") is None:
        assert time.monotonic() < deadline, "pgcdc committed no Kafka transaction in 90 s"
        time.sleep(0.5)


def _check_exactly_once(servers: str, prefix: str, writer: Writer, conn: Conn) -> Verdict:
    topic = topic_name(prefix, "public", "ledger")
    events = read_topic(servers, topic, isolation_level="read_committed")
    verdict = verify(events, writer.ledger, conn)  # no loss, order, fold equals the source
    positions = [(e["source"]["commit_lsn"], e["source"]["ordinal"]) for e in events]
    duplicates = len(positions) - len(set(positions))
    assert duplicates == 0, f"{duplicates} duplicate events for a read_committed consumer"
    uncommitted = read_topic(servers, topic, isolation_level="read_uncommitted")
    print(f"\nread_committed: {verdict.events} events, {verdict.distinct} distinct; "
          f"read_uncommitted: {len(uncommitted)} events (aborted transactions included)")
    return verdict


@pytest.mark.usefixtures("ledger")
@pytest.mark.parametrize("point", ["after_produce:5", "after_delivery_ack:30",
                                   "before_progress_store:2", "after_status_update:3"])
def test_crash_at_fail_point_exactly_once(point: str, pg_conn: Conn, pg_dsn: str,
                                          kafka_servers: str, topic_prefix: str,
                                          tmp_path: Path) -> None:
    """``before_progress_store:2`` is the crash between a Kafka commit and the slot hearing
    of it: the slot resends transactions that are in Kafka already, and they are dropped."""
    writer = Writer(pg_dsn, seed=len(point))
    writer.write(pg_conn, 20)
    pgcdc = PgcdcProcess(pg_dsn, kafka_servers, topic_prefix, tmp_path / "progress.json",
                         extra_args=EXACTLY_ONCE)
    pgcdc.start(fail_point=point)
    code, err = pgcdc.wait(timeout=120)
    assert code == failpoints.EXIT_CODE, f"the fail point was not reached ({code}):\n{err}"
    if point.startswith("before_progress_store"):
        committed = read_committed_lsn({"bootstrap.servers": kafka_servers},
                                       offsets_topic(topic_prefix), "pgcdc")
        info = slot_info(pg_conn, "pgcdc")
        assert committed is not None and info is not None
        assert committed > (info.confirmed_flush_lsn or 0), "Kafka committed nothing past the slot"
    writer.write(pg_conn, 20)
    pgcdc.catch_up(pg_conn)
    verdict = _check_exactly_once(kafka_servers, topic_prefix, writer, pg_conn)
    assert verdict.distinct >= 40


@pytest.mark.usefixtures("ledger")
def test_kill_9_loop_exactly_once(pg_conn: Conn, pg_dsn: str, kafka_servers: str,
                                  topic_prefix: str, tmp_path: Path) -> None:
    seed = int(os.environ.get("PGCDC_SEED", "20261122"))
    rng = random.Random(seed)
    writer = Writer(pg_dsn, seed=seed)
    pgcdc = PgcdcProcess(pg_dsn, kafka_servers, topic_prefix, tmp_path / "progress.json",
                         extra_args=EXACTLY_ONCE)
    writer.start()
    try:
        for _ in range(KILL_CYCLES):
            pgcdc.start()
            time.sleep(rng.uniform(2.0, 4.0))  # past start-up, into commits
            pgcdc.kill()
    finally:
        writer.stop()
    pgcdc.catch_up(pg_conn)
    verdict = _check_exactly_once(kafka_servers, topic_prefix, writer, pg_conn)
    committed = read_committed_lsn({"bootstrap.servers": kafka_servers},
                                   offsets_topic(topic_prefix), "pgcdc")
    print(f"exactly-once kill -9: {KILL_CYCLES} cycles, seed {seed}, "
          f"{writer.ledger.transactions} transactions, {verdict.distinct} distinct events, "
          f"last committed end LSN {committed}")
    assert writer.ledger.transactions > KILL_CYCLES
    assert committed is not None


@pytest.mark.usefixtures("ledger")
def test_second_producer_fences_the_first(pg_conn: Conn, pg_dsn: str, kafka_servers: str,
                                          topic_prefix: str, tmp_path: Path) -> None:
    """Another producer with the same transactional.id: the running pgcdc stops with a
    terminal error naming the fencing, and a restart still delivers exactly once."""
    writer = Writer(pg_dsn, seed=5)
    writer.write(pg_conn, 10)
    pgcdc = PgcdcProcess(pg_dsn, kafka_servers, topic_prefix, tmp_path / "progress.json",
                         extra_args=EXACTLY_ONCE)
    pgcdc.start()
    _wait_for_a_commit(kafka_servers, topic_prefix)
    zombie_killer = Producer({"bootstrap.servers": kafka_servers,
                              "transactional.id": default_transactional_id(topic_prefix,
                                                                           "pgcdc")})
    zombie_killer.init_transactions(60)
    writer.start()
    try:
        code, err = pgcdc.wait(timeout=120)
    finally:
        writer.stop()
    assert code == 3, f"pgcdc was not stopped by the fencing ({code}):\n{err}"
    assert "fenced" in err and "transactional.id" in err, err
    del zombie_killer
    pgcdc.catch_up(pg_conn)
    _check_exactly_once(kafka_servers, topic_prefix, writer, pg_conn)


@pytest.mark.usefixtures("ledger")
def test_transaction_timed_out_by_the_broker_is_resent(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """pgcdc paused (SIGSTOP) past transaction.timeout.ms with a Kafka transaction open: the
    coordinator aborts it; on SIGCONT pgcdc recreates its producer and resends, and does not
    mistake the timeout for another instance fencing it."""
    monkeypatch.setenv("PGCDC_KAFKA_TRANSACTION_TIMEOUT_MS", "3000")
    writer = Writer(pg_dsn, seed=7)
    pgcdc = PgcdcProcess(pg_dsn, kafka_servers, topic_prefix, tmp_path / "progress.json",
                         extra_args=("--exactly-once", "--commit-interval-ms", "1000"))
    pgcdc.start()
    assert pgcdc.proc is not None
    writer.start()
    try:
        _wait_for_a_commit(kafka_servers, topic_prefix)
        time.sleep(1)  # writing: a Kafka transaction is open nearly all the time
        # the broker checks for timed-out transactions every second
        # (transaction.abort.timed.out.transaction.cleanup.interval.ms, set by KafkaBroker):
        # stopped past the 3 s timeout and a check after it, with room to spare
        pgcdc.proc.send_signal(signal.SIGSTOP)
        time.sleep(8)
        pgcdc.proc.send_signal(signal.SIGCONT)
        time.sleep(8)
    finally:
        writer.stop()
    err = pgcdc.stop_after_catch_up(pg_conn, current_wal_lsn(pg_conn))
    # the first error seen varies: the timeout itself, or messages that timed out with it
    assert "resending from the durable position" in err, err
    assert "fenced this pgcdc" not in err, err
    _check_exactly_once(kafka_servers, topic_prefix, writer, pg_conn)


def test_initial_load_then_stream_exactly_once(pg_conn: Conn, pg_dsn: str, kafka_servers: str,
                                               topic_prefix: str, tmp_path: Path) -> None:
    """The initial load's read events and the stream after it, through Kafka transactions:
    every row read once, every change once, the fold equals the source."""
    rows = 5000
    pg_conn.execute("CREATE TABLE ledger (id int PRIMARY KEY, version int NOT NULL, payload text)")
    pg_conn.execute("INSERT INTO ledger SELECT g, 1, repeat('s', g %% 100) "
                    "FROM generate_series(1, %s) g", (rows,))
    writer = Writer(pg_dsn, seed=rows)
    writer.rows = dict.fromkeys(range(1, rows + 1), 1)
    writer.next_id = rows + 1
    sink = TransactionalKafkaSink(kafka_servers, slot="pgcdc", topic_prefix=topic_prefix,
                                  commit_interval_ms=200)
    try:
        load = InitialLoad(LoadConfig(pg_dsn, tmp_path / "load.json", tables=["public.ledger"],
                                      readers=2, chunk_pages=16), sink)
        writer.start()
        try:
            summary = load.run()
        finally:
            writer.stop()
        assert summary.complete
        pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.ledger"],
                                           status_interval=0.2), sink)
        pipeline.prepare()
        pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    finally:
        sink.close()
    events = read_topic(kafka_servers, topic_name(topic_prefix, "public", "ledger"),
                        isolation_level="read_committed")
    positions = [(e["source"]["commit_lsn"], e["source"]["ordinal"]) for e in events]
    assert len(positions) == len(set(positions)), "a read_committed consumer saw a duplicate"
    reads = [e for e in events if e["op"] == "r"]
    assert len(reads) == next(iter(summary.state.tables.values())).rows
    assert writer.ledger.transactions > 5 and len(events) > len(reads)
    folded: dict[int, int] = {}
    for event in sorted(events, key=lambda e: (e["source"]["commit_lsn"],
                                               e["source"]["ordinal"])):
        if event["op"] == "d":
            folded.pop(event["key"]["id"], None)
        else:
            folded[event["after"]["id"]] = event["after"]["version"]
    assert folded == dict(pg_conn.execute("SELECT id, version FROM ledger").fetchall())


@pytest.mark.usefixtures("ledger")
def test_walsender_killed_mid_transaction_exactly_once(pg_conn: Conn, pg_dsn: str,
                                                       kafka_servers: str, topic_prefix: str,
                                                       tmp_path: Path) -> None:
    """The replication connection dies while a Kafka transaction is open (the pipeline
    reconnects without resetting the sink): what the new session resends of that open
    transaction must not be written twice."""
    writer = Writer(pg_dsn, seed=6)
    pgcdc = PgcdcProcess(pg_dsn, kafka_servers, topic_prefix, tmp_path / "progress.json",
                         extra_args=("--exactly-once", "--commit-interval-ms", "2000"))
    pgcdc.start()
    assert pgcdc.proc is not None
    writer.start()
    kills = 0
    try:
        _wait_for_a_commit(kafka_servers, topic_prefix)
        for _ in range(4):
            time.sleep(1.5)  # inside a 2 s Kafka transaction
            row = pg_conn.execute("SELECT pg_terminate_backend(active_pid) FROM "
                                  "pg_replication_slots WHERE slot_name = 'pgcdc' "
                                  "AND active_pid IS NOT NULL").fetchone()
            kills += row is not None and bool(row[0])
    finally:
        writer.stop()
    assert kills >= 2, "the walsender was not running to be killed"
    err = pgcdc.stop_after_catch_up(pg_conn, current_wal_lsn(pg_conn))
    assert "restarted inside an open Kafka transaction" in err, err
    _check_exactly_once(kafka_servers, topic_prefix, writer, pg_conn)
