"""Fault injection against a running ``pgcdc run`` process (TESTING.md T5-T8).

T5 PostgreSQL crashes (``pg_ctl stop -m immediate``), T6 the walsender is killed while Kafka
holds a delivery, T7 the network between pgcdc and PostgreSQL, and between pgcdc and Kafka,
resets, blackholes or slows down (tests/tcp_proxy.py), T8 pgcdc is frozen past
``wal_sender_timeout``.  Each test checks the consistent-clone oracle (tests/oracle.py: no loss,
per-key order, the topic folded by key equals the source), that every duplicate is a replay
(same position, same content), and that the slot's ``confirmed_flush_lsn``, sampled all along,
never passed what Kafka had made durable: every sample is paired with the topic's end offset
read after it, and every transaction that commits below the sample must lie below that offset.

The module runs its own PostgreSQL cluster (T5 crashes it, T8 lowers ``wal_sender_timeout``) and
its own Kafka broker, whose advertised listener is a proxy in front of it (T7).
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from kafka import KafkaConsumer, TopicPartition
from psycopg import sql

from core.wire import topic_name
from decoder.progress import ProgressStore
from decoder.slot import current_wal_lsn, slot_info
from pgcdc.services.kafka import KafkaBroker
from pgcdc.services.ports import free_port
from pgcdc.services.postgres import PostgresServer
from tests.oracle import PgcdcProcess, Verdict, Writer, raw_records, read_topic, verify
from tests.tcp_proxy import BLACKHOLE, PASS, RESET, SLOW, TcpProxy

Conn = psycopg.Connection[tuple[object, ...]]

SLOT = "pgcdc"
_databases = itertools.count()


# --- the module's services ----------------------------------------------------------------

@pytest.fixture(scope="module")
def pg_proxy(own_pg_server: PostgresServer) -> Iterator[TcpProxy]:
    with TcpProxy(own_pg_server.port) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def kafka() -> Iterator[tuple[KafkaBroker, TcpProxy]]:
    """A broker whose clients all go through a proxy: it advertises the proxy's port."""
    port = free_port()
    with TcpProxy(port) as proxy:
        broker = KafkaBroker(port=port, advertised_port=proxy.port, heap="512m")
        try:
            broker.start()
            yield broker, proxy
        finally:
            broker.cleanup()


# --- one test's source, sink, samples and checks ------------------------------------------

@dataclass
class Sample:
    lsn: int  # the slot's confirmed_flush_lsn
    at: float  # time.monotonic() when it was read
    ends: dict[int, int] | None = None  # the topic's end offsets, read after the sample


@dataclass
class SlotSampler:
    """Samples ``confirmed_flush_lsn`` every ``interval`` seconds over its own connection,
    and after each the table topic's end offsets (kafka-python, a short time-out): a sample
    taken while Kafka is unreachable is paired with the next end offsets read."""

    dsn: str
    servers: str
    topic: str
    interval: float = 0.2
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> SlotSampler:
        self._thread = threading.Thread(target=self._run, daemon=True, name="slot-sampler")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(30)

    def between(self, start: float, end: float) -> list[int]:
        return [s.lsn for s in self.samples if start <= s.at <= end]

    def _run(self) -> None:
        conn: Conn | None = None
        consumer: KafkaConsumer | None = None
        partitions: list[TopicPartition] = []
        pending: list[Sample] = []
        while not self._stop.wait(self.interval):
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=2)
                info = slot_info(conn, SLOT)
            except psycopg.Error:  # PostgreSQL is down (T5): no sample
                conn = None
                continue
            if info is not None and info.confirmed_flush_lsn is not None:
                sample = Sample(info.confirmed_flush_lsn, time.monotonic())
                self.samples.append(sample)
                pending.append(sample)
            try:
                if consumer is None:
                    consumer = KafkaConsumer(bootstrap_servers=self.servers,
                                             enable_auto_commit=False)
                if not partitions:
                    found = consumer.partitions_for_topic(self.topic)
                    partitions = [TopicPartition(self.topic, p) for p in sorted(found or [])]
                if partitions:
                    ends = consumer.end_offsets(partitions, timeout_ms=2000)
                    for waiting in pending:
                        waiting.ends = {tp.partition: off for tp, off in ends.items()}
                    pending.clear()
            except Exception:  # Kafka is unreachable (T6, T7): pair these samples later
                pass
        if consumer is not None:
            consumer.close()
        if conn is not None:
            conn.close()


class Rig:
    """A database with the ``ledger`` table, its publication and slot, a topic prefix, and
    the paths pgcdc keeps its state in; pgcdc reaches PostgreSQL through ``pg_proxy`` and Kafka
    through the broker's proxy."""

    def __init__(self, server: PostgresServer, pg_proxy: TcpProxy, broker: KafkaBroker,
                 kafka_proxy: TcpProxy, tmp: Path) -> None:
        self.server = server
        self.pg_proxy = pg_proxy
        self.broker = broker
        self.kafka_proxy = kafka_proxy
        self.name = f"faults{next(_databases)}"
        self.prefix = self.name
        self.servers = f"127.0.0.1:{kafka_proxy.port}"
        self.topic = topic_name(self.prefix, "public", "ledger")
        self.progress = tmp / "progress.json"
        self.dsn = server.dsn(self.name)
        self.proxied_dsn = f"host=127.0.0.1 port={pg_proxy.port} dbname={self.name} user=postgres"
        self._conn: Conn | None = None
        self.processes: list[PgcdcProcess] = []

    @property
    def conn(self) -> Conn:
        """A connection to the test's database, reopened after a crash."""
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = psycopg.connect(self.dsn, autocommit=True)
        return self._conn

    def crash_server(self) -> None:
        """``pg_ctl stop -m immediate`` (no shutdown checkpoint), then start it again."""
        self.server.stop("immediate")
        if self._conn is not None:
            self._conn.close()
        self.server.start()

    def create(self) -> None:
        with psycopg.connect(self.server.dsn(), autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
        conn = self.conn
        conn.execute("CREATE TABLE ledger (id int PRIMARY KEY, version int NOT NULL, "
                     "payload text)")
        conn.execute("CREATE PUBLICATION pgcdc FOR TABLE ledger")
        conn.execute("SELECT pg_create_logical_replication_slot('pgcdc', 'pgoutput', false, "
                     "true)")

    def drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
        with psycopg.connect(self.server.dsn(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                          "WHERE database = %s AND active_pid IS NOT NULL", (self.name,))
            admin.execute("SELECT pg_drop_replication_slot(slot_name) FROM "
                          "pg_replication_slots WHERE database = %s", (self.name,))
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)")
                          .format(sql.Identifier(self.name)))

    def pgcdc(self, *, through_proxy: bool = True) -> PgcdcProcess:
        process = PgcdcProcess(self.proxied_dsn if through_proxy else self.dsn, self.servers,
                               self.prefix, self.progress)
        process.argv += ["--format", "json"]  # the safety check reads positions from raw records
        self.processes.append(process)
        return process

    def sampler(self) -> SlotSampler:
        return SlotSampler(self.dsn, self.servers, self.topic)

    # --- waiting (bounded) ----------------------------------------------------------------

    def wait_for(self, what: str, ready: Callable[[], bool], timeout: float = 90,
                 process: PgcdcProcess | None = None) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if process is not None and process.proc is not None \
                    and process.proc.poll() is not None:
                code, err = process.proc.returncode, _stderr(process)
                raise AssertionError(f"pgcdc exited ({code}) while waiting for {what}:\n{err}")
            if time.monotonic() > deadline:
                err = ""
                if process is not None and process.proc is not None:  # what pgcdc said
                    process.proc.kill()
                    process.proc.wait(30)
                    err = _stderr(process)[-6000:]
                raise AssertionError(f"no {what} within {timeout:.0f} s; pgcdc logged:\n{err}")
            time.sleep(0.1)

    def confirmed(self) -> int:
        info = slot_info(self.conn, SLOT)
        assert info is not None and info.confirmed_flush_lsn is not None
        return info.confirmed_flush_lsn

    def active_pid(self) -> int | None:
        info = slot_info(self.conn, SLOT)
        assert info is not None
        return info.active_pid

    def sent_lsn(self) -> int:
        """How far the slot's walsender has sent (0 without one)."""
        row = self.conn.execute(
            "SELECT coalesce(pg_wal_lsn_diff(r.sent_lsn, '0/0'), 0)::bigint "
            "FROM pg_replication_slots s LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid"
            " WHERE s.slot_name = %s", (SLOT,)).fetchone()
        return int(str(row[0])) if row else 0

    def caught_up(self, process: PgcdcProcess, timeout: float = 90) -> None:
        """Wait until the slot confirmed everything written so far (pgcdc keeps running)."""
        target = current_wal_lsn(self.conn)
        self.wait_for("catch-up", lambda: self.confirmed() >= target, timeout, process)

    def received(self, process: PgcdcProcess, timeout: float = 60) -> None:
        """Wait until the walsender sent pgcdc everything written so far."""
        target = current_wal_lsn(self.conn)
        self.wait_for("stream up to the WAL end", lambda: self.sent_lsn() >= target, timeout,
                      process)

    def finish(self, process: PgcdcProcess) -> str:
        """Catch up, stop gracefully (SIGTERM), and return what pgcdc logged."""
        self.caught_up(process, timeout=120)
        assert process.proc is not None
        process.proc.send_signal(signal.SIGTERM)
        code, err = process.wait(60)
        assert code == 0, f"graceful stop failed ({code}):\n{err}"
        return err

    # --- the checks -----------------------------------------------------------------------

    def check(self, writer: Writer, sampler: SlotSampler) -> Verdict:
        """The oracle, replays identical to the first delivery, and the slot never ahead of
        the topic."""
        events = read_topic(self.servers, self.topic)
        verdict = verify(events, writer.ledger, self.conn)
        _replays_identical(events)
        records = [r for r in raw_records(self.servers, self.topic, 60) if r.value is not None]
        checked = _slot_never_ahead(records, sampler.samples)
        assert checked > 0, "no sample could be paired with the topic's end offsets"
        return verdict

    def commits_of(self, versions: set[tuple[int, int]]) -> list[int]:
        """The commit LSNs of the transactions that wrote these (id, version) pairs."""
        found = {e["source"]["commit_lsn"] for e in read_topic(self.servers, self.topic)
                 if e["op"] != "d" and (e["key"]["id"], e["after"]["version"]) in versions}
        return sorted(found)


def _stderr(process: PgcdcProcess) -> str:
    if process.proc is None or process.proc.stderr is None:
        return ""
    return process.proc.stderr.read().decode(errors="replace")


def _replays_identical(events: list[dict[str, Any]]) -> None:
    """A duplicate is a replay: the same position carries the same change, so consumers may
    de-duplicate on ``(commit_lsn, ordinal)``."""
    first: dict[tuple[int, int], tuple[Any, ...]] = {}
    for event in events:
        source = event["source"]
        position = (source["commit_lsn"], source["ordinal"])
        content = (event["op"], event["key"], event["before"], event["after"], source["lsn"])
        assert first.setdefault(position, content) == content, \
            f"position {position} delivered with different contents"


def _slot_never_ahead(records: list[Any], samples: list[Sample]) -> int:
    """Every transaction committed below a sample was on the topic when the sample's end
    offsets were read (read after the sample: what was durable then still is).  Returns how
    many samples were checked."""
    first: dict[tuple[int, int], tuple[int, int]] = {}  # position -> (partition, offset)
    for record in records:
        source = json.loads(record.value)["source"]
        first.setdefault((source["commit_lsn"], source["ordinal"]),
                         (record.partition, record.offset))
    needs: dict[int, dict[int, int]] = {}  # commit_lsn -> partition -> end offset it needs
    for (commit_lsn, _), (partition, offset) in first.items():
        need = needs.setdefault(commit_lsn, {})
        need[partition] = max(need.get(partition, 0), offset + 1)
    commits = sorted(needs)
    running: dict[int, int] = {}
    prefix: list[dict[int, int]] = []  # what every transaction up to this one needs
    for commit_lsn in commits:
        for partition, end in needs[commit_lsn].items():
            running[partition] = max(running.get(partition, 0), end)
        prefix.append(dict(running))
    checked = 0
    for sample in samples:
        if sample.ends is None:
            continue
        checked += 1
        below = bisect.bisect_left(commits, sample.lsn)  # commit_lsn < confirmed_flush_lsn
        if below == 0:
            continue
        for partition, end in prefix[below - 1].items():
            assert end <= sample.ends.get(partition, 0), (
                f"the slot confirmed {sample.lsn:X} while partition {partition} of the topic "
                f"ended at offset {sample.ends.get(partition, 0)}, below the {end} that the "
                "transactions committed before it need: confirmed before durable")
    return checked


@contextlib.contextmanager
def wal_sender_timeout(conn: Conn, value: str) -> Iterator[None]:
    conn.execute(sql.SQL("ALTER SYSTEM SET wal_sender_timeout = {}").format(sql.Literal(value)))
    conn.execute("SELECT pg_reload_conf()")
    try:
        yield
    finally:
        conn.execute("ALTER SYSTEM RESET wal_sender_timeout")
        conn.execute("SELECT pg_reload_conf()")


@pytest.fixture
def rig(own_pg_server: PostgresServer, pg_proxy: TcpProxy,
        kafka: tuple[KafkaBroker, TcpProxy], tmp_path: Path) -> Iterator[Rig]:
    broker, kafka_proxy = kafka
    pg_proxy.set_mode(PASS)
    kafka_proxy.set_mode(PASS)
    rig = Rig(own_pg_server, pg_proxy, broker, kafka_proxy, tmp_path)
    rig.create()
    try:
        yield rig
    finally:
        for process in rig.processes:
            if process.proc is not None and process.proc.poll() is None:
                process.kill()
        broker.resume()
        pg_proxy.set_mode(PASS)
        kafka_proxy.set_mode(PASS)
        if not (own_pg_server.datadir / "postmaster.pid").exists():
            own_pg_server.start()
        rig.drop()


# --- T7: the network --------------------------------------------------------------------------

OUTAGE = 5.0  # seconds a reset or blackhole lasts
SLOW_RATE = 5000  # bytes per second, each direction


@pytest.mark.parametrize("mode", [RESET, BLACKHOLE, SLOW])
@pytest.mark.parametrize("side", ["postgres", "kafka"])
def test_network_fault(side: str, mode: str, rig: Rig) -> None:
    """T7: a reset, a blackhole (then healed) or a slow link between pgcdc and PostgreSQL or
    Kafka.  pgcdc recovers on its own, nothing is lost, and during the outage the slot stays
    below every transaction written meanwhile."""
    proxy = rig.pg_proxy if side == "postgres" else rig.kafka_proxy
    writer = Writer(rig.dsn, seed=sum(map(ord, side + mode)))
    pgcdc = rig.pgcdc()
    # a blackhole longer than wal_sender_timeout: the server ends the walsender meanwhile
    timeout = wal_sender_timeout(rig.conn, "2s") if (side, mode) == ("postgres", BLACKHOLE) \
        else contextlib.nullcontext()
    with timeout, rig.sampler() as sampler:
        writer.write(rig.conn, 20)
        pgcdc.start()
        rig.caught_up(pgcdc)
        connections, before = proxy.connections, set(writer.ledger.versions)
        durable_before = current_wal_lsn(rig.conn)
        started = time.monotonic()
        proxy.set_mode(mode, rate=SLOW_RATE)
        writer.write(rig.conn, 20)
        written = writer.ledger.versions - before
        if mode == SLOW:
            rig.caught_up(pgcdc, timeout=100)  # progress over the slow link
        else:
            time.sleep(OUTAGE)
        ended = time.monotonic()
        proxy.set_mode(PASS)
        writer.write(rig.conn, 10)
        err = rig.finish(pgcdc)
    verdict = rig.check(writer, sampler)
    print(f"\nT7 {side} {mode}: {verdict.events} events, {verdict.distinct} distinct, "
          f"{proxy.connections - connections} new connections through the proxy")
    if mode == SLOW:
        return
    commits = rig.commits_of(written)
    window = sampler.between(started, ended)
    assert len(window) >= 3, "the slot was not sampled during the outage"
    assert max(window) <= durable_before, "the slot advanced during the outage"
    assert max(window) < commits[0], "the slot passed a transaction Kafka did not have"
    if side == "postgres":
        assert "reconnecting" in err, f"pgcdc did not reconnect:\n{err}"
    # on the Kafka side librdkafka reconnects by itself: after a reset (every connection was
    # reset) the outage batch on the topic (verify) is the proof


def test_silently_dead_replication_connection(rig: Rig) -> None:
    """T7: the replication connection's flow dies without a reset (a firewall or NAT forgot
    it); new connections work.  pgcdc notices the silence (``--receive-timeout``: after half of
    it a keepalive is asked for, after all of it the connection counts as dead) and
    reconnects."""
    writer = Writer(rig.dsn, seed=77)
    pgcdc = rig.pgcdc()
    pgcdc.argv += ["--receive-timeout", "6"]
    with wal_sender_timeout(rig.conn, "2s"), rig.sampler() as sampler:
        writer.write(rig.conn, 10)
        pgcdc.start()
        rig.caught_up(pgcdc)
        assert rig.pg_proxy.sever() >= 1
        # the server ends its side after wal_sender_timeout; the slot is free again
        rig.wait_for("the walsender to time out", lambda: rig.active_pid() is None, 30)
        writer.write(rig.conn, 10)
        rig.caught_up(pgcdc, timeout=60)
        err = rig.finish(pgcdc)
    rig.check(writer, sampler)
    assert "receive_timeout" in err, f"pgcdc did not notice the silence:\n{err}"


def test_silently_dead_kafka_connection(rig: Rig) -> None:
    """T7: the producer's connections to the broker die silently; librdkafka's request
    time-out notices, it reconnects, and the held deliveries arrive once."""
    writer = Writer(rig.dsn, seed=78)
    pgcdc = rig.pgcdc()
    with rig.sampler() as sampler:
        writer.write(rig.conn, 10)
        pgcdc.start()
        rig.caught_up(pgcdc)
        connections = rig.kafka_proxy.connections
        assert rig.kafka_proxy.sever() >= 1
        writer.write(rig.conn, 10)
        rig.caught_up(pgcdc, timeout=110)
        rig.finish(pgcdc)
    verdict = rig.check(writer, sampler)
    # the severed connections forward nothing, ever: the batch written after the cut is on
    # the topic (verify), so the producer reconnected
    print(f"\nT7 kafka severed: {verdict.events} events, {verdict.distinct} distinct, "
          f"{rig.kafka_proxy.connections - connections} new connections")


# --- T5: PostgreSQL crashes ---------------------------------------------------------------

def test_postgres_crash_mid_stream(rig: Rig) -> None:
    """T5: PostgreSQL crashes (``pg_ctl stop -m immediate``) while pgcdc holds a stream of
    transactions Kafka has not acknowledged (the broker is frozen, so the crash is
    deterministically mid-stream); pgcdc reconnects once the server is back, nothing is lost,
    and only the transactions past the durable point are resent, as identical replays."""
    writer = Writer(rig.dsn, seed=5)
    pgcdc = rig.pgcdc(through_proxy=False)
    with rig.sampler() as sampler:
        writer.write(rig.conn, 20)
        pgcdc.start()
        rig.caught_up(pgcdc)
        before = set(writer.ledger.versions)
        rig.broker.pause()
        try:
            writer.write(rig.conn, 30)
            rig.received(pgcdc)
            durable_at_crash = rig.confirmed()
            rig.crash_server()
        finally:
            rig.broker.resume()
        held = writer.ledger.versions - before
        writer.write(rig.conn, 20)
        err = rig.finish(pgcdc)
    verdict = rig.check(writer, sampler)
    assert "reconnecting" in err, f"pgcdc did not reconnect after the crash:\n{err}"
    assert durable_at_crash < rig.commits_of(held)[0], \
        "the slot passed a transaction Kafka did not have"
    resent = _resent_commits(read_topic(rig.servers, rig.topic))
    print(f"\nT5 mid-stream: {verdict.events} events, {verdict.distinct} distinct (duplicate "
          f"ratio {verdict.duplicate_ratio:.3f}), {len(resent)} transactions resent")
    assert resent, "the transactions held at the crash were not resent"
    assert min(resent) > durable_at_crash, "a transaction durable before the crash was resent"


def test_postgres_crash_moves_the_slot_back(rig: Rig) -> None:
    """T5: a crash right after pgcdc stopped gracefully.  Crash recovery restores the slot as
    the last checkpoint saved it, behind what pgcdc confirmed and stored; a new pgcdc starts
    (stored progress ahead of the slot is no data loss), loses nothing, and does not resend
    what was durable before the crash (TESTING.md: a duplicate only past the durable point)."""
    writer = Writer(rig.dsn, seed=55)
    rig.conn.execute("CHECKPOINT")  # the slot's state on disk: before everything below
    with rig.sampler() as sampler:
        writer.write(rig.conn, 20)
        rig.finish(_started(rig.pgcdc(through_proxy=False)))
        progress = ProgressStore(rig.progress).load()
        assert progress is not None
        stored = progress.durable_lsn
        rig.crash_server()
        recovered = rig.confirmed()
        assert recovered < stored, "crash recovery did not move the slot back"
        writer.write(rig.conn, 20)
        rig.finish(_started(rig.pgcdc(through_proxy=False)))
    verdict = rig.check(writer, sampler)
    resent = _resent_commits(read_topic(rig.servers, rig.topic))
    print(f"\nT5 slot moved back from {stored:X} to {recovered:X}: {verdict.events} events, "
          f"{verdict.distinct} distinct, {len(resent)} transactions resent")
    assert not [c for c in resent if c < stored], \
        f"{len(resent)} transactions durable before the crash were resent"


def _started(process: PgcdcProcess) -> PgcdcProcess:
    process.start()
    return process


def _resent_commits(events: list[dict[str, Any]]) -> list[int]:
    """The commit LSNs of the transactions with an event delivered more than once."""
    seen: set[tuple[int, int]] = set()
    resent: set[int] = set()
    for event in events:
        position = (event["source"]["commit_lsn"], event["source"]["ordinal"])
        if position in seen:
            resent.add(position[0])
        seen.add(position)
    return sorted(resent)


# --- T6: the walsender is killed while Kafka holds a delivery -----------------------------

def test_walsender_killed_while_delivery_held(rig: Rig) -> None:
    """T6: the broker is frozen (SIGSTOP) so deliveries are held; the walsender is killed
    (``pg_terminate_backend``); pgcdc reconnects and receives the held transactions again.
    At the kill the slot was below their commits; each arrives at most twice."""
    writer = Writer(rig.dsn, seed=6)
    pgcdc = rig.pgcdc(through_proxy=False)
    with rig.sampler() as sampler:
        writer.write(rig.conn, 10)
        pgcdc.start()
        rig.caught_up(pgcdc)
        before = set(writer.ledger.versions)
        rig.broker.pause()
        try:
            writer.write(rig.conn, 5)
            rig.received(pgcdc)
            walsender = rig.active_pid()
            at_kill = rig.confirmed()
            assert rig.conn.execute("SELECT pg_terminate_backend(%s)",
                                    (walsender,)).fetchone() == (True,)
            rig.wait_for("a new walsender", lambda: rig.active_pid() not in (None, walsender),
                         60, pgcdc)
            rig.received(pgcdc)  # the held transactions were sent again
        finally:
            rig.broker.resume()
        held = writer.ledger.versions - before
        writer.write(rig.conn, 10)
        err = rig.finish(pgcdc)
    verdict = rig.check(writer, sampler)
    assert "reconnecting" in err, f"pgcdc did not reconnect:\n{err}"
    commits = rig.commits_of(held)
    assert at_kill < commits[0], "at the kill the slot had passed an undelivered transaction"
    copies: dict[tuple[int, int], int] = {}
    for event in read_topic(rig.servers, rig.topic):
        source = event["source"]
        if source["commit_lsn"] in commits:
            position = (source["commit_lsn"], source["ordinal"])
            copies[position] = copies.get(position, 0) + 1
    print(f"\nT6: {len(copies)} held events, copies {sorted(set(copies.values()))}; "
          f"{verdict.events} events, {verdict.distinct} distinct")
    assert copies and max(copies.values()) <= 2, f"a held event arrived more than twice: {copies}"


# --- T8: pgcdc frozen past wal_sender_timeout ---------------------------------------------

def test_pgcdc_paused_past_wal_sender_timeout(rig: Rig) -> None:
    """T8: pgcdc is frozen (SIGSTOP) longer than ``wal_sender_timeout`` while the source keeps
    writing; the server ends the walsender; once thawed (SIGCONT) pgcdc reconnects from its
    durable position and nothing is lost."""
    writer = Writer(rig.dsn, seed=8)
    pgcdc = rig.pgcdc()
    with wal_sender_timeout(rig.conn, "2s"), rig.sampler() as sampler:
        writer.write(rig.conn, 20)
        pgcdc.start()
        rig.caught_up(pgcdc)
        walsender = rig.active_pid()
        assert pgcdc.proc is not None
        pgcdc.proc.send_signal(signal.SIGSTOP)
        try:
            frozen_at = rig.confirmed()
            writer.write(rig.conn, 20)
            rig.wait_for("the walsender to time out", lambda: rig.active_pid() is None, 30)
            assert rig.confirmed() == frozen_at
        finally:
            pgcdc.proc.send_signal(signal.SIGCONT)
        rig.wait_for("a new walsender", lambda: rig.active_pid() not in (None, walsender),
                     60, pgcdc)
        writer.write(rig.conn, 20)
        err = rig.finish(pgcdc)
    verdict = rig.check(writer, sampler)
    assert "reconnecting" in err, f"pgcdc did not reconnect:\n{err}"
    print(f"\nT8: {verdict.events} events, {verdict.distinct} distinct")
