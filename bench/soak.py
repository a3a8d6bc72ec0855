"""Soak run: a steady write load for ``--minutes``, PostgreSQL and Kafka restarted in between.

One throwaway PostgreSQL (``pgcdc.services.postgres``) and one throwaway Kafka broker
(``pgcdc.services.kafka``); ``pgcdc run`` streams into Kafka as a real separate process
(``tests.oracle.PgcdcProcess``, with ``--metrics-port`` added).  The load is the oracle's
:class:`tests.oracle.Writer` (small random transactions of inserts, updates and deletes on a
``ledger`` table, recorded after commit), one writer per table: the tables are
``soak_a.ledger``, ``soak_b.ledger``, ... (each writer's connection has its schema first in
``search_path``).  One thread drives them round-robin at a fixed rate (``--rate``
transactions per second in all, paced against an absolute schedule) and, after each commit,
records ``pg_current_wal_lsn()`` with the time, so the lag can be told in seconds too.

The restarts (``--faults``, spread evenly over the run; by default these four, in order):

* ``pg-fast`` (20 %): ``pg_ctl restart -m fast``;
* ``kafka-stop`` (40 %): the broker stopped (SIGTERM, controlled shutdown) and started again
  on the same port and data folder; the load keeps writing meanwhile;
* ``pg-immediate`` (60 %): ``pg_ctl stop -m immediate`` (a crash, recovery at start), start;
* ``kafka-kill`` (80 %): the broker killed (SIGKILL) and started again.

The writer is held between two transactions while PostgreSQL restarts (a transaction cut by
the restart would leave the writer's ledger unsure of what committed), then resumes on a new
schedule; pgcdc is left alone: it has to notice and reconnect by itself.

Every ``--sample-seconds``: pgcdc's resident set (``VmRSS`` from ``/proc/<pid>/status``),
the slot's lag in bytes (``pg_current_wal_lsn() - confirmed_flush_lsn``) and in seconds (the
age of the oldest committed transaction whose WAL the slot has not confirmed, from the
writer's record), and the events pgcdc wrote (``pgcdc_events_total`` from its ``/metrics``).
The recovery time of a restart runs from the moment the fault begins until the slot has
confirmed every WAL position written up to the moment the service was back.

At the end the writer stops, pgcdc catches up and stops gracefully, every table topic is read
with kafka-python (``tests.oracle.read_topic``) and checked against each writer's ledger
(``tests.oracle.verify``: no loss, per-key order, the fold by key equals the table).

From the repository root::

    python -m bench.soak --minutes 10                 # 60 tx/s, the four restarts
    python -m bench.soak --minutes 2 --rate 30 --samples /tmp/soak.jsonl

It prints a JSON summary; the exit status is 1 if anything was lost, the lag did not come
back after a restart or at the end (or exceeded ``--max-lag-mib``), or pgcdc stopped by
itself; 0 otherwise.  The memory trend is reported (``rss_mib``: the slope over the second
half, and the slope between restarts), not judged by the exit status.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench.kafka_latency_bench import percentile
from core.wire import topic_name
from decoder.lsn import parse_lsn
from pgcdc.services.kafka import KafkaBroker
from pgcdc.services.ports import free_port
from pgcdc.services.postgres import PostgresServer
from tests.oracle import PgcdcProcess, Writer, read_topic, verify

log = logging.getLogger("bench.soak")

SLOT = "pgcdc"
PREFIX = "soak"
FAULTS = ("pg-fast", "kafka-stop", "pg-immediate", "kafka-kill")
HOLD_LIMIT = 600.0  # seconds the writer may be held while PostgreSQL restarts
TABLE_DDL = "CREATE TABLE {}.ledger (id int PRIMARY KEY, version int NOT NULL, payload text)"
LAG_SQL = """
SELECT pg_current_wal_lsn()::text, confirmed_flush_lsn::text, active_pid
FROM pg_replication_slots WHERE slot_name = %s
"""

Conn = psycopg.Connection[tuple[object, ...]]


def schema_dsn(dsn: str, schema: str) -> str:
    return f"{dsn} options='-csearch_path={schema}'"


class _Source:
    """A connection for sampling that survives PostgreSQL restarts: None while it is down."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: Conn | None = None

    def row(self, query: str, params: tuple[object, ...] = ()) -> tuple[object, ...] | None:
        for _ in range(2):  # a connection the last restart broke, then a new one
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=2)
                return self._conn.execute(query, params).fetchone()
            except psycopg.OperationalError:
                self.close()
        return None

    def slot(self) -> tuple[int, int | None, int | None] | None:
        """(server WAL position, the slot's confirmed_flush_lsn, its active pid)."""
        row = self.row(LAG_SQL, (SLOT,))
        if row is None:
            return None
        current, confirmed, pid = row
        return (parse_lsn(str(current)), parse_lsn(str(confirmed)) if confirmed else None,
                int(str(pid)) if pid is not None else None)

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None


# --- the load -------------------------------------------------------------------------------


class Load:
    """The oracle's writers, one per table, driven round-robin at a fixed rate."""

    def __init__(self, dsn: str, schemas: list[str], rate: float, seed: int) -> None:
        self.dsns = [schema_dsn(dsn, s) for s in schemas]
        self.writers = [Writer(d, seed + i) for i, d in enumerate(self.dsns)]
        self.interval = 1.0 / rate
        self.times: list[float] = []  # monotonic time after each commit
        self.lsns: list[int] = []  # pg_current_wal_lsn() right after it
        self.schedule_resets = 0
        self.error: BaseException | None = None
        self._hold = threading.Event()
        self._held = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)

    @property
    def transactions(self) -> int:
        return sum(w.ledger.transactions for w in self.writers)

    def start(self) -> None:
        self._thread.start()

    def hold(self, timeout: float = 30) -> None:
        """Wait until the writer is between transactions and keep it there, disconnected."""
        self._hold.set()
        if not self._held.wait(timeout) and self.error is None:
            msg = f"the writer did not pause within {timeout:.0f} s"
            raise RuntimeError(msg)

    def resume(self) -> None:
        self._held.clear()
        self._hold.clear()

    def stop(self) -> None:
        self._stop.set()
        self._hold.clear()
        if self._thread.ident is not None:
            self._thread.join(60)

    def unconfirmed_since(self, confirmed: int) -> float | None:
        """Commit time of the oldest transaction whose WAL lies past ``confirmed``."""
        with self._lock:
            index = bisect.bisect_right(self.lsns, confirmed)
            return self.times[index] if index < len(self.times) else None

    def _connect(self, timeout: float = 60) -> list[Conn]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return [psycopg.connect(d, autocommit=True, connect_timeout=5) for d in self.dsns]
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _run(self) -> None:
        conns: list[Conn] = []
        try:
            conns = self._connect()
            due = time.monotonic()
            turn = 0
            while not self._stop.is_set():
                if self._hold.is_set():
                    for conn in conns:
                        conn.close()
                    self._held.set()
                    held_until = time.monotonic() + HOLD_LIMIT
                    while self._hold.is_set() and not self._stop.is_set():
                        if time.monotonic() > held_until:
                            msg = f"the writer was held for more than {HOLD_LIMIT:.0f} s"
                            raise RuntimeError(msg)
                        time.sleep(0.05)
                    if self._stop.is_set():
                        return
                    conns = self._connect()
                    due = time.monotonic()
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                elif wait < -1.0:  # more than a second behind: start a new schedule
                    self.schedule_resets += 1
                    due = time.monotonic()
                index = turn % len(self.writers)
                conn = conns[index]
                self.writers[index].write(conn, 1)
                row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
                assert row is not None
                with self._lock:
                    self.times.append(time.monotonic())
                    self.lsns.append(parse_lsn(str(row[0])))
                turn += 1
                due += self.interval
        except BaseException as exc:  # reported by the run
            self.error = exc
            self._held.set()
        finally:
            for conn in conns:
                conn.close()


# --- pgcdc as a process ---------------------------------------------------------------------


class SoakPgcdc:
    """``pgcdc run`` (the oracle's :class:`PgcdcProcess`) with metrics and a drained stderr."""

    def __init__(self, dsn: str, servers: str, workdir: Path) -> None:
        self.process = PgcdcProcess(dsn, servers, PREFIX, workdir / "progress.json")
        self.metrics_port = free_port()
        self.process.argv += ["--metrics-port", str(self.metrics_port)]
        self.logfile = workdir / "pgcdc.log"
        self.starts = 0
        self.unexpected_exits: list[dict[str, Any]] = []
        self._drain: threading.Thread | None = None
        self._lock = threading.Lock()  # the sampler and the fault loop both check

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        assert self.process.proc is not None
        return self.process.proc

    def start(self) -> None:
        self.process.start()
        self.starts += 1
        stderr = self.proc.stderr
        assert stderr is not None

        def drain() -> None:  # a full stderr pipe would block pgcdc
            with self.logfile.open("ab") as out:
                for line in stderr:
                    out.write(line)
                    out.flush()

        self._drain = threading.Thread(target=drain, name="pgcdc-stderr", daemon=True)
        self._drain.start()

    def check_alive(self) -> None:
        """Record an exit pgcdc was not asked for, and start it again."""
        with self._lock:
            code = self.proc.poll()
            if code is None:
                return
            if self._drain is not None:
                self._drain.join(5)
            self.unexpected_exits.append({"exit_code": code, "log_tail": self.log_tail(12)})
            log.error("pgcdc exited by itself (%s); starting it again", code)
            self.start()

    def rss_mib(self) -> float | None:
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return None
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return None

    def cpu_seconds(self) -> float | None:
        """User and system CPU time of the running pgcdc process (``/proc/<pid>/stat``)."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def metrics(self) -> dict[str, float]:
        """Events written to the sink and reconnects, from ``/metrics``; {} if unreachable."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - local
                text = response.read().decode()
        except OSError:
            return {}
        out = {"events": 0.0, "reconnects": 0.0}
        for line in text.splitlines():
            name, _, value = line.rpartition(" ")
            if name.startswith("pgcdc_events_total"):
                out["events"] += float(value)
            elif name == "pgcdc_reconnects_total":
                out["reconnects"] = float(value)
            elif name == "pgcdc_memory_python_blocks":
                out["python_blocks"] = float(value)
            elif name.startswith("pgcdc_memory_heap_bytes"):
                state = "in_use" if 'state="in_use"' in name else "free"
                out[f"heap_{state}_mib"] = float(value) / 2**20
        return out

    def stop(self, timeout: float = 60) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(10)
        if self._drain is not None:
            self._drain.join(5)
        return code

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


# --- sampling -------------------------------------------------------------------------------


@dataclass
class Sample:
    t: float  # seconds since the load started
    rss_mib: float | None
    lag_bytes: int | None
    lag_seconds: float | None
    events: float | None
    reconnects: float | None
    transactions: int
    fault: str | None  # the fault being handled at that moment, if any
    # pgcdc/memory.py's figures from /metrics: the Python allocator's blocks, and malloc's
    # heap in use (a native leak grows it) and kept free (the allocator's high-water mark)
    python_blocks: float | None = None
    heap_in_use_mib: float | None = None
    heap_free_mib: float | None = None


class Sampler:
    def __init__(self, dsn: str, pgcdc: SoakPgcdc, load: Load, interval: float) -> None:
        self.source = _Source(dsn)
        self.pgcdc = pgcdc
        self.load = load
        self.interval = interval
        self.samples: list[Sample] = []
        self.fault: str | None = None
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def start(self) -> None:
        self.t0 = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(30)
        self.source.close()

    def take(self) -> Sample:
        self.pgcdc.check_alive()
        now = time.monotonic()
        lag_bytes = lag_seconds = None
        slot = self.source.slot()
        if slot is not None and slot[1] is not None:
            current, confirmed = slot[0], slot[1]
            lag_bytes = max(0, current - confirmed)
            since = self.load.unconfirmed_since(confirmed)
            lag_seconds = 0.0 if since is None else max(0.0, now - since)
        metrics = self.pgcdc.metrics()
        return Sample(round(now - self.t0, 2), self.pgcdc.rss_mib(), lag_bytes,
                      None if lag_seconds is None else round(lag_seconds, 3),
                      metrics.get("events"), metrics.get("reconnects"),
                      self.load.transactions, self.fault, metrics.get("python_blocks"),
                      metrics.get("heap_in_use_mib"), metrics.get("heap_free_mib"))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.samples.append(self.take())
            except Exception:  # a sample must not end the run; the gap shows
                log.exception("sampling failed")


# --- faults ---------------------------------------------------------------------------------


@dataclass
class Recovery:
    fault: str
    at_s: float  # since the load started
    down_s: float  # the fault itself: stop .. service accepting connections again
    catch_up_s: float | None  # service back .. slot confirmed everything written until then
    recover_s: float | None  # fault began .. slot confirmed (None: not within the timeout)
    lag_bytes_at_up: int | None = None  # the slot's lag when the service was back
    rss_before_mib: float | None = None  # pgcdc's resident set as the fault began
    rss_after_mib: float | None = None  # ... and once it had caught up


def inject(kind: str, server: PostgresServer, broker: KafkaBroker, load: Load) -> None:
    if kind in ("pg-fast", "pg-immediate"):
        load.hold()
        try:
            server.restart("fast" if kind == "pg-fast" else "immediate")
        finally:
            load.resume()
    elif kind == "kafka-stop":
        broker.stop()
        broker.start()
    elif kind == "kafka-kill":
        broker.kill()
        broker.start()
    else:
        msg = f"unknown fault {kind!r}; choose from {', '.join(FAULTS)}"
        raise ValueError(msg)


def wait_confirmed(source: _Source, target: int, timeout: float,
                   tick: Callable[[], None]) -> float | None:
    """Seconds until the slot's confirmed_flush_lsn reaches ``target``; None on time-out."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        slot = source.slot()
        if slot is not None and slot[1] is not None and slot[1] >= target:
            return time.monotonic() - began
        tick()
        time.sleep(0.25)
    return None


def run_fault(kind: str, server: PostgresServer, broker: KafkaBroker, load: Load,
              sampler: Sampler, pgcdc: SoakPgcdc, timeout: float) -> Recovery:
    log.info("fault %s", kind)
    sampler.fault = kind
    source = _Source(server.dsn())
    rss_before = pgcdc.rss_mib()
    try:
        began = time.monotonic()
        inject(kind, server, broker, load)
        up = time.monotonic()
        slot = None
        for _ in range(40):  # the server was just started; a connection may need a moment
            slot = source.slot()
            if slot is not None:
                break
            time.sleep(0.25)
        if slot is None:
            return Recovery(kind, round(began - sampler.t0, 1), round(up - began, 2), None, None,
                            rss_before_mib=rss_before)
        target = slot[0]
        lag_at_up = None if slot[1] is None else max(0, slot[0] - slot[1])
        catch_up = wait_confirmed(source, target, timeout, pgcdc.check_alive)
        done = time.monotonic()
        log.info("fault %s: down %.1f s, caught up after %s s", kind, up - began,
                 "NOT within the timeout" if catch_up is None else f"{catch_up:.1f}")
        return Recovery(kind, round(began - sampler.t0, 1), round(up - began, 2),
                        None if catch_up is None else round(catch_up, 2),
                        None if catch_up is None else round(done - began, 2), lag_at_up,
                        _round(rss_before), _round(pgcdc.rss_mib()))
    finally:
        sampler.fault = None
        source.close()


# --- the run --------------------------------------------------------------------------------


def prepare(dsn: str, schemas: list[str]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for schema in schemas:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
            conn.execute(sql.SQL(TABLE_DDL).format(sql.Identifier(schema)))
        tables = sql.SQL(", ").join(sql.Identifier(s, "ledger") for s in schemas)
        # the publication and the slot exist before the first write, as after a deployment
        conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
            sql.Identifier(SLOT), tables))
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, true)",
                     (SLOT,))


def wait_streaming(pgcdc: SoakPgcdc, source: _Source, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        slot = source.slot()
        if slot is not None and slot[2] is not None and pgcdc.metrics():
            return
        if pgcdc.proc.poll() is not None:
            break
        time.sleep(0.5)
    msg = f"pgcdc did not start streaming within {timeout:.0f} s:\n{pgcdc.log_tail()}"
    raise RuntimeError(msg)


def soak(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    schemas = [f"soak_{chr(ord('a') + i)}" for i in range(args.tables)]
    faults = [f for f in args.faults.split(",") if f]
    with PostgresServer() as server, KafkaBroker() as broker:
        dsn = server.dsn()
        prepare(dsn, schemas)
        pgcdc = SoakPgcdc(dsn, broker.bootstrap_servers, workdir)
        source = _Source(dsn)
        load = Load(dsn, schemas, args.rate, args.seed)
        sampler = Sampler(dsn, pgcdc, load, args.sample_seconds)
        try:
            pgcdc.start()
            wait_streaming(pgcdc, source)
            load.start()
            sampler.start()
            recoveries, written = drive(args, faults, server, broker, load, sampler, pgcdc)
            # the end: everything written confirmed, then a graceful stop
            slot = source.slot()
            assert slot is not None, "PostgreSQL is not reachable at the end"
            final_catch_up = wait_confirmed(source, slot[0], args.recover_timeout,
                                            pgcdc.check_alive)
            sampler.stop()
            final_metrics = pgcdc.metrics()
            final_metrics["cpu_s"] = pgcdc.cpu_seconds() or 0.0
            exit_code = pgcdc.stop()
        finally:
            load.stop()
            sampler.stop()
            source.close()
            if pgcdc.process.proc is not None and pgcdc.proc.poll() is None:
                pgcdc.proc.kill()
                pgcdc.proc.wait(10)
        verdicts = check(dsn, broker.bootstrap_servers, schemas, load)
    if args.samples:
        with Path(args.samples).open("w") as out:
            for sample in sampler.samples:
                out.write(json.dumps(asdict(sample)) + "\n")
    return summarize(args, sampler.samples, recoveries, load, pgcdc, verdicts,
                     written=written, final_catch_up=final_catch_up,
                     final_metrics=final_metrics, exit_code=exit_code)


def drive(args: argparse.Namespace, faults: list[str], server: PostgresServer,
          broker: KafkaBroker, load: Load, sampler: Sampler,
          pgcdc: SoakPgcdc) -> tuple[list[Recovery], float]:
    """The steady load for the whole duration, each fault at its time; seconds written."""
    duration = args.minutes * 60
    recoveries: list[Recovery] = []
    started = time.monotonic()
    try:
        for number, kind in enumerate(faults, 1):  # evenly spread: at k / (n + 1) of the run
            due = started + number / (len(faults) + 1) * duration
            while time.monotonic() < due and load.error is None:
                time.sleep(min(1.0, max(0.0, due - time.monotonic())))
            if load.error is not None:
                break
            recoveries.append(run_fault(kind, server, broker, load, sampler, pgcdc,
                                        args.recover_timeout))
        end = started + duration
        while time.monotonic() < end and load.error is None:
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
            pgcdc.check_alive()
    finally:
        load.stop()
    if load.error is not None:
        msg = f"the writer failed: {load.error!r}"
        raise RuntimeError(msg) from load.error
    return recoveries, time.monotonic() - started


def check(dsn: str, servers: str, schemas: list[str], load: Load) -> dict[str, Any]:
    """Each table's topic read back and checked against its writer's ledger."""
    out: dict[str, Any] = {"events": 0, "distinct": 0, "loss": []}
    for schema, writer in zip(schemas, load.writers, strict=True):
        events = read_topic(servers, topic_name(PREFIX, schema, "ledger"), timeout=300)
        with psycopg.connect(schema_dsn(dsn, schema), autocommit=True) as conn:
            try:
                verdict = verify(events, writer.ledger, conn)
            except AssertionError as exc:
                out["loss"].append(f"{schema}.ledger: {exc}")
                out["events"] += len(events)
                continue
        out["events"] += verdict.events
        out["distinct"] += verdict.distinct
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """The least-squares slope of (seconds, MiB) points, in MiB per hour."""
    if len(points) < 3:
        return None
    xs, ys = zip(*points, strict=True)
    return statistics.linear_regression([x / 3600 for x in xs], ys).slope


def _slope_between_restarts(samples: list[Sample], field: str = "rss_mib") -> float | None:
    """One least-squares slope (per hour) of ``field`` fitted to every stretch between two
    restarts, each stretch with its own level: the trend without the steps a restart makes."""
    segments: list[list[tuple[float, float]]] = [[]]
    for sample in samples:
        value = getattr(sample, field)
        if sample.fault is not None:
            segments.append([])
        elif value is not None:
            segments[-1].append((sample.t / 3600, value))
    sxx = sxy = 0.0
    for segment in segments:
        if len(segment) < 5:
            continue
        mx = statistics.fmean(x for x, _ in segment)
        my = statistics.fmean(y for _, y in segment)
        sxx += sum((x - mx) ** 2 for x, _ in segment)
        sxy += sum((x - mx) * (y - my) for x, y in segment)
    return sxy / sxx if sxx else None


def _trend(samples: list[Sample], field: str, half: float) -> dict[str, float | None]:
    """First, last and max of one of pgcdc's memory figures, its slope per hour over the
    second half and between restarts."""
    points = [(s.t, v) for s in samples if (v := getattr(s, field)) is not None]
    if not points:
        return {}
    slope = _slope_per_hour([p for p in points if p[0] >= half])
    between = _slope_between_restarts(samples, field)
    return {"first": round(points[0][1], 2), "last": round(points[-1][1], 2),
            "max": round(max(v for _, v in points), 2),
            "second_half_slope_per_hour": None if slope is None else round(slope, 2),
            "slope_between_restarts_per_hour": None if between is None else round(between, 2)}


def _distribution(values: list[float], steady: list[float]) -> dict[str, float | None]:
    """Max, p99 and p50 of all samples; p99 and max of those taken outside a restart."""
    values, steady = sorted(values), sorted(steady)
    return {"max": values[-1] if values else None,
            "p99": percentile(values, 99) if values else None,
            "p50": percentile(values, 50) if values else None,
            "steady_p99": percentile(steady, 99) if steady else None,
            "steady_max": steady[-1] if steady else None}


def summarize(args: argparse.Namespace, samples: list[Sample], recoveries: list[Recovery],
              load: Load, pgcdc: SoakPgcdc, verdicts: dict[str, Any], *, written: float,
              final_catch_up: float | None, final_metrics: dict[str, float],
              exit_code: int) -> dict[str, Any]:
    rss = [(s.t, s.rss_mib) for s in samples if s.rss_mib is not None]
    half = written / 2
    steady = [s for s in samples if s.fault is None]
    lag_b = [float(s.lag_bytes) for s in samples if s.lag_bytes is not None]
    slope = _slope_per_hour([p for p in rss if p[0] >= half])
    slope_between = _slope_between_restarts(samples)
    lag_max_mib = max(lag_b, default=0.0) / 2**20
    unrecovered = [r.fault for r in recoveries if r.recover_s is None]
    lag_bounded = (not unrecovered and final_catch_up is not None
                   and lag_max_mib <= args.max_lag_mib)
    loss = bool(verdicts["loss"])
    ok = not loss and lag_bounded and not pgcdc.unexpected_exits and exit_code == 0
    transactions = load.transactions
    return {
        "ok": ok,
        "zero_loss": not loss,
        "lag_bounded": lag_bounded,
        "minutes": args.minutes,
        "written_s": round(written, 1),
        "target_rate": args.rate,
        "achieved_rate": round(transactions / written, 1),
        "tables": args.tables,
        "transactions": transactions,
        "committed_changes": sum(len(w.ledger.versions) + len(w.ledger.deletes)
                                 for w in load.writers),
        "events_read": verdicts["events"],
        "events_distinct": verdicts["distinct"],
        "duplicates": verdicts["events"] - verdicts["distinct"],
        "events_written_by_pgcdc": final_metrics.get("events"),
        "reconnects": final_metrics.get("reconnects"),
        "pgcdc_cpu_s": round(final_metrics["cpu_s"], 1),
        "loss": verdicts["loss"],
        "rss_mib": {
            "first": round(rss[0][1], 1) if rss else None,
            "last": round(rss[-1][1], 1) if rss else None,
            "max": round(max(v for _, v in rss), 1) if rss else None,
            "second_half_slope_mib_per_hour": None if slope is None else round(slope, 2),
            "slope_between_restarts_mib_per_hour":
                None if slope_between is None else round(slope_between, 2),
        },
        "memory": {field: _trend(samples, field, half)
                   for field in ("python_blocks", "heap_in_use_mib", "heap_free_mib")},
        "lag_bytes": _distribution(lag_b, [float(s.lag_bytes) for s in steady
                                           if s.lag_bytes is not None]),
        "lag_seconds": _distribution([s.lag_seconds for s in samples if s.lag_seconds is not None],
                                     [s.lag_seconds for s in steady if s.lag_seconds is not None]),
        "recoveries": [asdict(r) for r in recoveries],
        "final_catch_up_s": None if final_catch_up is None else round(final_catch_up, 2),
        "pgcdc_exit_code": exit_code,
        "pgcdc_unexpected_exits": pgcdc.unexpected_exits,
        "writer_schedule_resets": load.schedule_resets,
        "samples": len(samples),
        "sample_seconds": args.sample_seconds,
        "cpus": os.cpu_count(),
        "load_average_end": [round(v, 2) for v in os.getloadavg()],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to write")
    parser.add_argument("--rate", type=float, default=60.0,
                        help="transactions per second, all tables together (default 60)")
    parser.add_argument("--tables", type=int, default=3, help="tables written (default 3)")
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help=f"comma-separated, from {', '.join(FAULTS)}, repeats allowed, "
                             "spread evenly over the run (default: each once, at 20/40/60/80 "
                             "%% of the run); empty for none")
    parser.add_argument("--sample-seconds", type=float, default=2.0)
    parser.add_argument("--recover-timeout", type=float, default=300.0,
                        help="seconds a restart may take to be caught up before it counts "
                             "as unbounded lag")
    parser.add_argument("--max-lag-mib", type=float, default=256.0,
                        help="the largest slot lag still called bounded (default 256 MiB)")
    parser.add_argument("--seed", type=int, default=20261122)
    parser.add_argument("--samples", help="also write every sample as JSON lines here")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work folder (pgcdc's log, progress and catalog)")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.rate <= 0 or not 1 <= args.tables <= 26:
        parser.error("--minutes and --rate must be positive and --tables between 1 and 26")
    unknown = [f for f in args.faults.split(",") if f and f not in FAULTS]
    if unknown:
        parser.error(f"--faults: unknown {', '.join(unknown)}; choose from {', '.join(FAULTS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)  # kafka-python, reading the topics
    workdir = Path(tempfile.mkdtemp(prefix="pgcdc-soak-"))
    try:
        report = soak(args, workdir)
    finally:
        if args.keep:
            log.info("work folder kept: %s", workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
