"""The decoder benchmark: pg_recvlogical against pgcdc, on the identical WAL.

One throwaway PostgreSQL (``pgcdc.services.postgres``) and, for (c), one
throwaway Kafka broker (``pgcdc.services.kafka``).  Before the workload is
written, one pgoutput slot per measurement is created at the same starting
point (the first with ``pg_create_logical_replication_slot``, the others with
``pg_copy_logical_replication_slot``), so every consumer decodes exactly the
same WAL.  The workload, generated server-side (ids are contiguous):

1. one transaction inserting 1,000,000 rows (one ``INSERT ... SELECT`` over
   ``generate_series``);
2. 250,000 updates as ONE ``UPDATE`` statement (one transaction);
3. 100,000 transactions of two inserted rows each: a PL/pgSQL procedure that
   COMMITs inside its loop.

That is 1,450,000 change events on one table with numeric, timestamptz, text,
jsonb, int[] and enum columns.  Then, one after the other:

(a) ``pg_recvlogical`` with pgoutput (``proto_version=1``, the publication) to
    /dev/null, stopping by itself at ``--endpos``: the ceiling;
(b) pgcdc decoding to typed values into :class:`NullSink`
    (``Pipeline.run(until_lsn=end)``);
(c) pgcdc into Kafka (:class:`KafkaSink`) until everything is durable.

Every consumer asks for the same pgoutput options, so the walsender does the
same work for each: ``--protocol 1`` (the default) is ``proto_version=1`` and
the publication, what (a) is given, and pgcdc is configured to
match (``protocol_version=1``, no streaming); ``--protocol native`` gives all
three what pgcdc negotiates by itself (the highest version the server speaks,
``streaming`` and ``messages``).

(b) and (c) each run in a child process (``--worker``) that reports its own
peak RSS (``VmHWM``, see :func:`peak_rss_kb`), CPU time (``getrusage``) and the
wall time of ``Pipeline.run``; (a) is timed from process start to exit.  The
CPU time of the server's walsender is sampled from /proc for each measurement.
Nothing is asserted about timings: the script measures, prints a table and a
Markdown snippet, and says which of the targets (:data:`RATIO_TARGETS`,
:data:`RSS_TARGET_MB`) are met.

From the repository root::

    python -m bench.decoder_bench                  # full scale: 1,450,000 events
    python -m bench.decoder_bench --scale 0.1      # a quick run
    python -m bench.decoder_bench --only a,b       # without Kafka
    python -m bench.decoder_bench --protocol native   # pgcdc's own protocol choice
    python -m bench.decoder_bench --binary on      # every consumer with pgoutput's binary option
    python -m bench.decoder_bench --only b --scale 0.2 --profile /tmp/b.prof   # cProfile (b)
    python -m bench.decoder_bench --only b --scale 0.2 --profile /tmp/b.txt --profiler pyinstrument
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import hashlib
import inspect
import json
import logging
import os
import platform
import pstats
import resource
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from decoder.lsn import format_lsn, parse_lsn
from pgcdc.pipeline import Pipeline, PipelineConfig
from pgcdc.services.postgres import PostgresServer
from sinks.null import NullSink

log = logging.getLogger("bench.decoder_bench")

REPO = Path(__file__).resolve().parent.parent
SOURCE_DIRS = ("core", "decoder", "pgcdc", "sinks", "snapshot_builder", "loads")

SCHEMA = "bench"
TABLE = f"{SCHEMA}.items"
PUBLICATION = "bench_pub"
TOPIC_PREFIX = "bench"
SLOTS = {"a": "bench_a", "b": "bench_b", "c": "bench_c"}
LABELS = {
    "a": "(a) pg_recvlogical -> /dev/null",
    "b": "(b) pgcdc -> NullSink",
    "c": "(c) pgcdc -> Kafka (durable)",
}
RATIO_TARGETS = {"b": 0.9, "c": 0.6}
RSS_TARGET_MB = 300

FULL_BIG_TXN = 1_000_000
FULL_UPDATES = 250_000
FULL_SMALL_TXNS = 100_000

# Only for the throwaway server: no fsync (100,000 commits would wait on the disk), no
# autovacuum and no checkpoint during the run, so nothing but the workload writes WAL.
# None of them changes what logical decoding does.
SERVER_SETTINGS = {
    "fsync": "off",
    "autovacuum": "off",
    "max_wal_size": "16GB",
    "checkpoint_timeout": "1h",
}

DDL = """
CREATE SCHEMA bench;
CREATE TYPE bench.mood AS ENUM ('sad', 'meh', 'ok', 'good', 'great');
CREATE TABLE bench.items (
    id bigint PRIMARY KEY,
    amount numeric(12, 2) NOT NULL,
    updated_at timestamptz NOT NULL,
    label text NOT NULL,
    doc jsonb NOT NULL,
    tags integer[] NOT NULL,
    mood bench.mood NOT NULL
);
CREATE FUNCTION bench.make_rows(lo bigint, hi bigint) RETURNS SETOF bench.items
LANGUAGE sql STABLE AS $$
    SELECT i,
           round((i % 100000) * 1.37 + 0.25, 2),
           timestamptz '2024-01-01 00:00:00+00' + i * interval '1 second',
           'item ' || i || ' ' || md5(i::text),
           jsonb_build_object('id', i, 'kind', 'k' || (i % 17), 'even', i % 2 = 0,
                              'score', (i % 1000) / 10.0, 'tags', jsonb_build_array('a', 'b')),
           ARRAY[(i % 100)::int, (i % 1000)::int, (i % 10000)::int],
           (ARRAY['sad', 'meh', 'ok', 'good', 'great'])[1 + (i % 5)::int]::bench.mood
    FROM generate_series(lo, hi) AS i
$$;
CREATE PROCEDURE bench.small_transactions(first_id bigint, n integer)
LANGUAGE plpgsql AS $$
BEGIN
    FOR k IN 0 .. n - 1 LOOP
        INSERT INTO bench.items
        SELECT * FROM bench.make_rows(first_id + 2 * k, first_id + 2 * k + 1);
        COMMIT;
    END LOOP;
END
$$;
CREATE PUBLICATION bench_pub FOR TABLE bench.items;
"""


@dataclass(frozen=True)
class Workload:
    big_txn: int  # rows inserted by the one big transaction
    updates: int  # rows changed by the one UPDATE
    small_txns: int  # transactions of two inserted rows

    @classmethod
    def scaled(cls, scale: float) -> Workload:
        return cls(max(1, round(FULL_BIG_TXN * scale)), max(1, round(FULL_UPDATES * scale)),
                   max(1, round(FULL_SMALL_TXNS * scale)))

    @property
    def events(self) -> int:
        return self.big_txn + self.updates + 2 * self.small_txns


@dataclass
class Result:
    key: str
    seconds: float
    events: int
    cpu_seconds: float  # user + system of the consumer process
    peak_rss_mb: float  # of the consumer process
    walsender_cpu_seconds: float = 0.0  # user + system of the server's walsender
    machine_cpu_seconds: float = 0.0  # busy CPU time of the whole machine meanwhile
    first_event_seconds: float | None = None  # when pgcdc saw its first event
    decoded_mb: float = 0.0  # pg_stat_replication_slots.total_bytes of the slot
    spilled_mb: float = 0.0  # pg_stat_replication_slots.spill_bytes of the slot
    streamed_mb: float = 0.0  # pg_stat_replication_slots.stream_bytes of the slot
    value_format: str | None = None  # of the Kafka sink's messages
    reconnects: int = 0  # of the replication connection, during the measurement
    resent: int = 0  # events received twice because of a reconnect
    profiled: bool = False
    # (b), (c): CPU seconds of the consumer's threads by kind (main: the Python loop,
    # librdkafka: its rdk:* threads); (c): of the Kafka broker's process
    thread_cpu_seconds: dict[str, float] = field(default_factory=dict)
    broker_cpu_seconds: float | None = None
    kafka_config: list[str] = field(default_factory=list)  # --kafka-config, for (c)

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    @property
    def other_cpu_seconds(self) -> float:
        """Busy CPU time of everything else: this script, Kafka for (c), other processes."""
        return max(0.0, self.machine_cpu_seconds - self.cpu_seconds - self.walsender_cpu_seconds)


@dataclass
class Setup:
    start_lsn: int
    end_lsn: int
    load_seconds: dict[str, float]
    options: dict[str, str] = field(default_factory=dict)  # pgoutput options of every consumer

    @property
    def wal_mb(self) -> float:
        return (self.end_lsn - self.start_lsn) / 2**20


# --- the workload ---------------------------------------------------------------------------


def prepare_and_load(dsn: str, keys: list[str], workload: Workload) -> Setup:
    """Schema, publication, one slot per measurement at one starting point, then the workload."""
    timings: dict[str, float] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(DDL)
        first = SLOTS[keys[0]]
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (first,))
        for key in keys[1:]:
            conn.execute("SELECT pg_copy_logical_replication_slot(%s, %s)", (first, SLOTS[key]))
        rows = conn.execute(
            "SELECT slot_name, confirmed_flush_lsn::text FROM pg_replication_slots "
            "WHERE slot_name = ANY(%s)", ([SLOTS[k] for k in keys],)).fetchall()
        starts = {parse_lsn(str(lsn)) for _, lsn in rows}
        if len(rows) != len(keys) or len(starts) != 1:
            msg = f"slots do not share one starting point: {rows}"
            raise RuntimeError(msg)
        start_lsn = starts.pop()
        log.info("slots %s at %s", ", ".join(SLOTS[k] for k in keys), format_lsn(start_lsn))

        def timed(name: str, statement: sql.Composable) -> None:
            began = time.perf_counter()
            conn.execute(statement)
            timings[name] = time.perf_counter() - began
            log.info("workload: %s in %.1f s", name, timings[name])

        n, u, t = workload.big_txn, workload.updates, workload.small_txns
        timed(f"{n:,}-row transaction", sql.SQL(
            "INSERT INTO bench.items SELECT * FROM bench.make_rows(1, {})").format(sql.Literal(n)))
        timed(f"{u:,} updates (one UPDATE)", sql.SQL(
            "UPDATE bench.items SET amount = amount + 1,"
            " updated_at = updated_at + interval '1 day', label = label || ' v2',"
            " doc = doc || '{{\"v\": 2}}', tags = tags || 0, mood = 'great'"
            " WHERE id <= {}").format(sql.Literal(u)))
        timed(f"{t:,} two-row transactions", sql.SQL(
            "CALL bench.small_transactions({}, {})").format(sql.Literal(n + 1), sql.Literal(t)))
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        end_lsn = parse_lsn(str(row[0]))
    log.info("workload written: %s .. %s", format_lsn(start_lsn), format_lsn(end_lsn))
    return Setup(start_lsn, end_lsn, timings)


def consumer_options(protocol: str, server_version: int) -> dict[str, str]:
    """The pgoutput options all three consumers send.

    ``native`` asks the pipeline itself which options it would send to this server, so
    (a) gets exactly what (b) and (c) negotiate.
    """
    binary = {"binary": "true"} if os.environ.get(_BINARY_ENV) == "on" else {}
    if protocol != "native":
        return {"proto_version": protocol, "publication_names": PUBLICATION, **binary}
    pipeline = Pipeline(PipelineConfig("", publication=PUBLICATION), NullSink())
    options = getattr(pipeline, "_options", None)  # absent from pgcdc versions speaking only v1
    if options is None:
        return {"proto_version": "1", "publication_names": PUBLICATION}
    return {**options(server_version), **binary}


_BINARY_ENV = "PGCDC_BENCH_BINARY"  # --binary, for the workers too (they inherit it)


# --- the server's side ----------------------------------------------------------------------


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (all cores, /proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _cpu_of(stat: str, ticks: int) -> float:
    """user + system seconds from a /proc/<pid>/stat or /proc/<pid>/task/<tid>/stat line."""
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / ticks


def thread_cpu_seconds() -> dict[str, float]:
    """This process's CPU seconds by kind of thread: ``main`` (the Python loop; the only
    thread Python runs here), ``librdkafka`` (``rdk:*``, the Kafka client's own threads) and
    ``other`` (e.g. psycopg's, the hang guard)."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {"main": 0.0, "librdkafka": 0.0, "other": 0.0}
    for tid in os.listdir("/proc/self/task"):
        try:
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            cpu = _cpu_of(Path(f"/proc/self/task/{tid}/stat").read_text(), ticks)
        except OSError:
            continue  # ended meanwhile
        kind = ("main" if int(tid) == os.getpid()
                else "librdkafka" if name.startswith("rdk:") else "other")
        out[kind] += cpu
    return out


class ProcessCpu:
    """CPU seconds a process (found by a string in its command line) spent meanwhile: the
    Kafka broker in (c), which competes with the walsender and pgcdc for the cores."""

    def __init__(self, marker: str) -> None:
        self._pid = next((int(e) for e in os.listdir("/proc") if e.isdigit()
                          and marker.encode() in _cmdline(e)), None)
        self._start = self.cpu_seconds()
        self.seconds: float | None = None

    def cpu_seconds(self) -> float | None:
        """The process's CPU seconds so far (None: not found, or gone)."""
        if self._pid is None:
            return None
        try:
            return _cpu_of(Path(f"/proc/{self._pid}/stat").read_text(), os.sysconf("SC_CLK_TCK"))
        except OSError:
            return None

    def stop(self) -> float | None:
        end = self.cpu_seconds()
        if end is not None and self._start is not None:
            self.seconds = end - self._start
        return self.seconds


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


class WalsenderCpu:
    """CPU seconds of the walsenders that run during a measurement, sampled from /proc.

    Also counts what the whole machine was busy with meanwhile (:attr:`machine_seconds`),
    so that load from other processes shows in the report instead of hiding in the figures.
    """

    def __init__(self, server: PostgresServer, interval: float = 0.2) -> None:
        pid_file = server.datadir / "postmaster.pid"
        self._postmaster = int(pid_file.read_text().split()[0])
        self._interval = interval
        self._ticks = os.sysconf("SC_CLK_TCK")
        self._seen: dict[int, float] = {}
        self._before: set[int] = set()
        self._busy = 0.0
        self.machine_seconds = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @property
    def seconds(self) -> float:
        return sum(self._seen.values())

    def __enter__(self) -> WalsenderCpu:
        self._before = set(self._sample())
        self._busy = busy_cpu_seconds()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.machine_seconds = busy_cpu_seconds() - self._busy

    def _loop(self) -> None:
        while True:
            for pid, cpu in self._sample().items():
                if pid not in self._before:
                    self._seen[pid] = max(cpu, self._seen.get(pid, 0.0))
            if self._stop.wait(self._interval):
                return

    def _sample(self) -> dict[int, float]:
        found: dict[int, float] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                fields = stat[stat.rindex(")") + 2:].split()
                if int(fields[1]) != self._postmaster:
                    continue
                if b"walsender" not in Path(f"/proc/{entry}/cmdline").read_bytes():
                    continue
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
            found[int(entry)] = (int(fields[11]) + int(fields[12])) / self._ticks
        return found


def slot_stats(dsn: str, slot: str) -> tuple[float, float, float]:
    """(decoded, spilled, streamed) MiB of a slot: equal for every slot doing the same work."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT total_bytes, spill_bytes, stream_bytes "
                           "FROM pg_stat_replication_slots WHERE slot_name = %s",
                           (slot,)).fetchone()
    if row is None:
        return 0.0, 0.0, 0.0
    decoded, spilled, streamed = (int(str(v)) / 2**20 for v in row)
    return decoded, spilled, streamed


# --- the measurements -----------------------------------------------------------------------


def recvlogical_binary(server: PostgresServer) -> str:
    candidate = server.bindir / "pg_recvlogical"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("pg_recvlogical")
    if found is None:
        msg = f"pg_recvlogical is neither in {server.bindir} nor on PATH"
        raise RuntimeError(msg)
    return found


def measure_recvlogical(server: PostgresServer, setup: Setup, workload: Workload) -> Result:
    argv = [recvlogical_binary(server), "--dbname", server.dsn(), "--slot", SLOTS["a"],
            "--start", "--no-loop", "--endpos", format_lsn(setup.end_lsn),
            "--file", "/dev/null", "--fsync-interval", "0"]
    for name, value in setup.options.items():
        argv += ["--option", f"{name}={value}"]
    log.info("(a) %s", " ".join(argv))
    with WalsenderCpu(server) as walsender:
        began = time.perf_counter()
        proc = subprocess.Popen(argv)
        peak_kb = 0
        while True:  # poll the child's VmHWM until it exits, then reap it with its rusage
            peak_kb = max(peak_kb, peak_rss_kb(proc.pid) or 0)
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                break
            time.sleep(0.02)
        seconds = time.perf_counter() - began
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        msg = f"pg_recvlogical exited with {proc.returncode}"
        raise RuntimeError(msg)
    return Result("a", seconds, workload.events, usage.ru_utime + usage.ru_stime, peak_kb / 1024,
                  walsender.seconds, walsender.machine_seconds)


def peak_rss_kb(pid: int | str = "self") -> int | None:
    """The peak resident set of a process since its exec (``VmHWM``), in KiB.

    ``getrusage().ru_maxrss`` would do for a process started from a shell, but a child of
    this script inherits the parent's high-water mark across fork + exec, so it is read
    from /proc instead.
    """
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return None


def measure_pgcdc(key: str, server: PostgresServer, setup: Setup, workload: Workload, *,
                  protocol: str, bootstrap_servers: str | None, kafka_format: str | None,
                  kafka_config: list[str] | None = None,
                  profile: str | None, profiler: str, timeout: float,
                  broker_marker: str | None = None) -> Result:
    argv = [sys.executable, "-m", "bench.decoder_bench", "--worker", key, "--dsn", server.dsn(),
            "--slot", SLOTS[key], "--until", format_lsn(setup.end_lsn), "--protocol", protocol,
            "--expect-events", str(workload.events), "--timeout", str(timeout)]
    if bootstrap_servers:
        argv += ["--bootstrap-servers", bootstrap_servers]
    if kafka_format:
        argv += ["--kafka-format", kafka_format]
    for setting in kafka_config or ():
        argv += ["--kafka-config", setting]
    if profile:
        argv += ["--profile", profile, "--profiler", profiler]
    log.info("(%s) %s", key, " ".join(argv))
    broker = ProcessCpu(broker_marker) if key == "c" and broker_marker else None
    with WalsenderCpu(server) as walsender:
        done = subprocess.run(argv, cwd=REPO, stdout=subprocess.PIPE, text=True, check=False)
    broker_seconds = broker.stop() if broker is not None else None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        msg = f"worker ({key}) failed with exit status {done.returncode}: {done.stdout[-2000:]}"
        raise RuntimeError(msg)
    report = json.loads(lines[-1])
    # rows/s counts the workload's change events; a reconnect resends some (at-least-once)
    return Result(key, report["seconds"], workload.events, report["cpu_seconds"],
                  report["peak_rss_mb"], walsender.seconds, walsender.machine_seconds,
                  report["first_event_seconds"],
                  value_format=report.get("value_format"),
                  resent=report["events"] - workload.events,
                  reconnects=report.get("reconnects", 0), profiled=bool(profile),
                  thread_cpu_seconds=report.get("thread_cpu_seconds", {}),
                  broker_cpu_seconds=broker_seconds,
                  kafka_config=list(kafka_config or ()) if key == "c" else [])


# --- the worker (one child process per pgcdc measurement) -----------------------------------


def worker_config(args: argparse.Namespace) -> PipelineConfig:
    wanted: dict[str, Any] = {"slot": args.slot, "publication": PUBLICATION, "tables": [TABLE],
                              "create_slot": False, "create_publication": False,
                              "binary": os.environ.get(_BINARY_ENV, "off")}
    if args.protocol != "native":
        wanted.update(protocol_version=int(args.protocol), streaming=False)
    known = {f.name for f in dataclasses.fields(PipelineConfig)}
    missing = sorted(set(wanted) - known)
    if missing:
        log.warning("PipelineConfig has no %s: left to pgcdc", ", ".join(missing))
    return PipelineConfig(args.dsn, **{k: v for k, v in wanted.items() if k in known})


def run_worker(args: argparse.Namespace) -> int:
    until = parse_lsn(args.until)
    if args.worker == "c":
        from sinks.kafka import KafkaSink

        options: dict[str, Any] = {"topic_prefix": TOPIC_PREFIX}
        if args.kafka_format:
            if "value_format" not in inspect.signature(KafkaSink).parameters:
                print("this KafkaSink has no value_format option", file=sys.stderr)
                return 2
            options["value_format"] = args.kafka_format
            if args.kafka_format == "debezium-json":  # --format json's default encoding
                from sinks.debezium_json import JsonOptions

                options.update(value_format="json", json_options=JsonOptions())
        if args.kafka_config:  # librdkafka properties over the sink's own (strings)
            options["producer_config"] = dict(kv.split("=", 1) for kv in args.kafka_config)
        sink: Any = KafkaSink(args.bootstrap_servers, **options)
        value_format = str(getattr(getattr(sink, "encoder", None), "format", "json"))
    else:
        sink = NullSink()
        value_format = None
    pipeline = Pipeline(worker_config(args), sink)
    pipeline.prepare()
    stop = threading.Event()
    guard = threading.Timer(args.timeout, stop.set)  # a hang guard, not a timing assertion
    guard.daemon = True
    guard.start()
    profiler = Profiling(args.profiler, args.profile) if args.profile else None
    began = time.perf_counter()
    first_event = watch_first_event(pipeline, began)
    if profiler is not None:
        profiler.start()
    try:
        progress = pipeline.run(stop=stop, until_lsn=until)
    finally:
        if profiler is not None:
            profiler.stop()
    seconds = time.perf_counter() - began
    guard.cancel()
    threads = thread_cpu_seconds()  # before close() ends librdkafka's threads
    sink.close()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    if profiler is not None:
        print(profiler.save(seconds), file=sys.stderr)
    report = {
        "seconds": seconds,
        "events": progress.events,
        "transactions": progress.transactions,
        "durable_lsn": format_lsn(progress.durable_lsn),
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "thread_cpu_seconds": threads,
        "peak_rss_mb": (peak_rss_kb() or usage.ru_maxrss) / 1024,
        "first_event_seconds": first_event.get("seconds"),
        "value_format": value_format,
        "reconnects": getattr(progress, "reconnects", 0),
    }
    print(json.dumps(report))
    if progress.durable_lsn < until:
        print(f"stopped before {args.until} was durable (hang guard of {args.timeout:.0f} s)",
              file=sys.stderr)
        return 1
    if progress.events < args.expect_events:
        print(f"decoded {progress.events} events, expected {args.expect_events}",
              file=sys.stderr)
        return 1
    return 0


def watch_first_event(pipeline: Pipeline, began: float) -> dict[str, float]:
    """When the first event arrives, from a thread that polls the counter (the loop is untouched).

    With protocol 1 the server sends a transaction only once it has decoded all of it, so
    this is how long the consumer waited for the 1,000,000-row transaction.
    """
    seen: dict[str, float] = {}

    def poll() -> None:
        while pipeline.progress.events == 0:
            time.sleep(0.005)
        seen["seconds"] = time.perf_counter() - began

    threading.Thread(target=poll, daemon=True).start()
    return seen


class Profiling:
    """cProfile (deterministic) or pyinstrument (sampling, if installed).

    Both hook every call, so both slow pgcdc's call-heavy loop several times; for an
    undisturbed view, sample the worker from outside (``py-spy record --nonblocking``).
    """

    def __init__(self, kind: str, path: str) -> None:
        self.kind = kind
        self.path = path
        self._profiler: Any
        if kind == "pyinstrument":
            from pyinstrument import Profiler

            self._profiler = Profiler(interval=0.0005)
        else:
            self._profiler = cProfile.Profile()

    def start(self) -> None:
        if self.kind == "pyinstrument":
            self._profiler.start()
        else:
            self._profiler.enable()

    def stop(self) -> None:
        if self.kind == "pyinstrument":
            self._profiler.stop()
        else:
            self._profiler.disable()

    def save(self, seconds: float) -> str:
        """Write the profile to ``path`` and return a summary."""
        if self.kind == "pyinstrument":
            tree = self._profiler.output_text(time="percent_of_total", short_mode=False)
            flat = self._profiler.output_text(flat=True, time="percent_of_total")
            Path(self.path).write_text(f"{tree}\n{flat}")
            return f"{tree}\ntop by own time (pyinstrument, flat)\n{flat}"
        self._profiler.dump_stats(self.path)
        return profile_summary(pstats.Stats(self._profiler), seconds)


def profile_summary(stats: pstats.Stats, total: float, *, top: int = 30) -> str:
    """The top functions by cumulative and by own time, as a share of ``total`` seconds."""
    entries = stats.stats  # type: ignore[attr-defined]
    prefixes = sorted({str(REPO) + os.sep, *(p + os.sep for p in sys.path if p)},
                      key=len, reverse=True)

    def name(func: tuple[str, int, str]) -> str:
        path, line, function = func
        if path == "~":
            return function
        for prefix in prefixes:
            if path.startswith(prefix):
                path = path[len(prefix):]
                break
        return f"{path}:{line}({function})"

    rows = [(name(func), calls, own, cum) for func, (_, calls, own, cum, _) in entries.items()]
    out = [f"profile: {total:.2f} s in Pipeline.run (cProfile adds overhead to every call)",
           f"{'cum %':>6} {'own %':>6} {'calls':>10}  function"]
    for label, calls, own, cum in sorted(rows, key=lambda r: r[3], reverse=True)[:top]:
        out.append(f"{100 * cum / total:6.1f} {100 * own / total:6.1f} {calls:10d}  {label}")
    out.append(f"\ntop by own time\n{'own %':>6} {'calls':>10}  function")
    for label, calls, own, _ in sorted(rows, key=lambda r: r[2], reverse=True)[:top]:
        out.append(f"{100 * own / total:6.1f} {calls:10d}  {label}")
    return "\n".join(out)


# --- reporting ------------------------------------------------------------------------------


def source_digest() -> str:
    """A digest of pgcdc's sources, to tell which code a figure belongs to."""
    digest = hashlib.sha256()
    for folder in SOURCE_DIRS:
        for path in sorted((REPO / folder).rglob("*.py")):
            digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def machine() -> dict[str, str]:
    info = {"cores": str(os.cpu_count()), "python": platform.python_version()}
    with contextlib.suppress(OSError, IndexError, ValueError):
        meminfo = Path("/proc/meminfo").read_text()
        kb = int(meminfo.split("MemTotal:")[1].split()[0])
        info["memory"] = f"{kb / 2**20:.1f} GiB"
    with contextlib.suppress(OSError, IndexError):
        cpuinfo = Path("/proc/cpuinfo").read_text()
        info["cpu"] = cpuinfo.split("model name")[1].split(":", 1)[1].splitlines()[0].strip()
    info["kernel"] = platform.release()
    info["load average at start"] = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    info["psycopg"] = f"{psycopg.__version__} (libpq {psycopg.pq.version()})"
    return info


def ratio(result: Result, ceiling: Result | None) -> float | None:
    if ceiling is None or ceiling.rate == 0:
        return None
    return result.rate / ceiling.rate


def verdicts(result: Result, ceiling: Result | None) -> tuple[str, str]:
    """(throughput verdict, RSS verdict) against the targets."""
    if result.key == "a":
        return "ceiling", "-"
    r = ratio(result, ceiling)
    target = RATIO_TARGETS[result.key]
    if r is None:
        speed = f">= {target} x (a): (a) not measured"
    else:
        speed = f">= {target} x (a): {'met' if r >= target else 'NOT met'} ({r:.2f} x)"
    rss = (f"<= {RSS_TARGET_MB} MB: {'met' if result.peak_rss_mb <= RSS_TARGET_MB else 'NOT met'}"
           f" ({result.peak_rss_mb:.0f} MiB)")
    return speed, rss


def label(result: Result) -> str:
    text = LABELS[result.key]
    if result.value_format:
        text = text.replace("Kafka", f"Kafka {result.value_format}")
    if result.kafka_config:
        text += f" [{', '.join(result.kafka_config)}]"
    return text + (" [profiled]" if result.profiled else "")


def text_table(results: list[Result]) -> str:
    ceiling = next((r for r in results if r.key == "a"), None)
    out = [f"{'measurement':34} {'seconds':>8} {'rows/s':>10} {'x (a)':>6} {'CPU s':>7} "
           f"{'peak RSS':>9} {'walsender CPU s':>16} {'other CPU s':>12} "
           f"{'decoded/spilled/streamed MiB':>29}"]
    for r in results:
        rel = ratio(r, ceiling)
        out.append(f"{label(r):34} "
                   f"{r.seconds:8.2f} {r.rate:10,.0f} {'-' if rel is None else f'{rel:.2f}':>6} "
                   f"{r.cpu_seconds:7.1f} {r.peak_rss_mb:5.0f} MiB {r.walsender_cpu_seconds:16.1f} "
                   f"{r.other_cpu_seconds:12.1f} "
                   f"{f'{r.decoded_mb:.0f}/{r.spilled_mb:.0f}/{r.streamed_mb:.0f}':>29}")
    for r in results:
        if r.key != "a":
            speed, rss = verdicts(r, ceiling)
            first = ("" if r.first_event_seconds is None
                     else f"; first event after {r.first_event_seconds:.1f} s")
            if r.reconnects:
                first += f"; {r.reconnects} reconnect(s), {r.resent:,} events resent"
            out.append(f"{label(r)}: throughput {speed}; peak RSS {rss}{first}")
    out.extend(cpu_breakdown(r) for r in results if r.thread_cpu_seconds)
    return "\n".join(out)


def cpu_breakdown(r: Result) -> str:
    """Where a pgcdc measurement's CPU went: the Python thread, librdkafka's, the broker."""
    threads = r.thread_cpu_seconds
    per_event = 1e6 / r.events if r.events else 0.0
    text = (f"{label(r)}: CPU main thread {threads.get('main', 0.0):.1f} s "
            f"({threads.get('main', 0.0) * per_event:.1f} us/event), librdkafka threads "
            f"{threads.get('librdkafka', 0.0):.1f} s, other threads "
            f"{threads.get('other', 0.0):.1f} s")
    if r.broker_cpu_seconds is not None:
        text += (f"; Kafka broker {r.broker_cpu_seconds:.1f} s "
                 f"({r.broker_cpu_seconds * per_event:.1f} us/event)")
    return text


def markdown(results: list[Result], workload: Workload, setup: Setup,
             info: dict[str, str], scale: float) -> str:
    ceiling = next((r for r in results if r.key == "a"), None)
    options = ", ".join(f"{k}={v}" for k, v in setup.options.items())
    lines = [
        f"Scale {scale:g}: {workload.events:,} change events ({workload.big_txn:,}-row "
        f"transaction, {workload.updates:,} updates in one UPDATE, {workload.small_txns:,} "
        f"two-row transactions); {setup.wal_mb:,.0f} MiB of WAL; pgoutput options "
        f"`{options}`; {info.get('cores')} cores, {info.get('memory')}, {info.get('cpu', '?')}, "
        f"PostgreSQL {info.get('postgresql', '?')}, Python {info.get('python')}, "
        f"pgcdc sources {info.get('sources')}.",
        "",
        "| measurement | seconds | rows/s | × (a) | consumer CPU s | walsender CPU s "
        "| other CPU s | peak RSS | throughput target | RSS target |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for r in results:
        rel = ratio(r, ceiling)
        speed, rss = verdicts(r, ceiling)
        lines.append(
            f"| {label(r)} | {r.seconds:.2f} | "
            f"{r.rate:,.0f} | {'–' if rel is None else f'{rel:.2f}'} | {r.cpu_seconds:.1f} | "
            f"{r.walsender_cpu_seconds:.1f} | {r.other_cpu_seconds:.1f} | {r.peak_rss_mb:.0f} MiB "
            f"| {speed} | {rss} |")
    breakdown = [cpu_breakdown(r) for r in results if r.thread_cpu_seconds]
    if breakdown:
        lines.append("")
        lines.extend(f"* {line}" for line in breakdown)
    for r in results:
        if r.reconnects:
            lines.append(f"\n{label(r)}: the replication connection was lost {r.reconnects} "
                         f"time(s) and {r.resent:,} events were received twice.")
    return "\n".join(lines)


# --- main -----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.decoder_bench",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--scale", type=float, default=1.0,
                        help="workload size relative to the reference (default 1.0)")
    parser.add_argument("--only", default="a,b,c",
                        help="comma-separated measurements to run, of a, b, c (default all)")
    parser.add_argument("--binary", choices=["off", "on"], default="off",
                        help="pgoutput's binary option for every consumer (default off)")
    parser.add_argument("--protocol", choices=["1", "native"], default="1",
                        help="pgoutput options of every consumer: proto_version=1 (default) "
                             "or what pgcdc negotiates by itself")
    parser.add_argument("--kafka-format", choices=["avro", "json", "debezium-json"],
                        help="value format of the Kafka sink in (c) (default: the sink's own); "
                             "json is pgcdc's own JSON (what pgcdc spark reads), "
                             "debezium-json Debezium's (pgcdc run --format json's default)")
    parser.add_argument("--kafka-config", action="append", metavar="KEY=VALUE",
                        help="a librdkafka producer property for (c) over the sink's own, "
                             "e.g. linger.ms=20 (repeatable)")
    parser.add_argument("--profile", metavar="PATH",  # (b), or (c) when (b) is not run
                        help="profile (b), save the profile to PATH and print a summary")
    parser.add_argument("--profiler", choices=["cprofile", "pyinstrument"], default="cprofile",
                        help="for --profile: cProfile (default) or pyinstrument (pip install "
                             "pyinstrument); both slow this call-heavy code 2.5-4x")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="hang guard per measurement, in seconds (default 3600)")
    # the worker side: one pgcdc measurement in this (child) process
    parser.add_argument("--worker", choices=["b", "c"], help=argparse.SUPPRESS)
    parser.add_argument("--dsn", help=argparse.SUPPRESS)
    parser.add_argument("--slot", help=argparse.SUPPRESS)
    parser.add_argument("--until", help=argparse.SUPPRESS)
    parser.add_argument("--expect-events", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap-servers",
                        help="an existing Kafka for (c) (default: a throwaway broker, whose "
                             "CPU time is then reported too)")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run that only shows the benchmark still works (CI): "
                             "--scale 0.001; its figures mean nothing")
    parser.add_argument("--ceiling-last", action="store_true",
                        help="measure (a) after the others instead of first (the first "
                             "consumer's walsender reads the WAL from disk)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.scale = 0.001
    if args.worker is None:
        os.environ[_BINARY_ENV] = args.binary
    keys = [k.strip() for k in args.only.split(",") if k.strip()]
    if not keys or any(k not in SLOTS for k in keys):
        parser.error("--only takes a comma-separated subset of a, b, c")
    args.keys = sorted(set(keys))
    if args.ceiling_last and "a" in args.keys:  # the first consumer reads the WAL cold
        args.keys = [*(k for k in args.keys if k != "a"), "a"]
    if args.scale <= 0:
        parser.error("--scale must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.worker else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    if args.worker:
        return run_worker(args)

    workload = Workload.scaled(args.scale)
    info = machine()
    info["sources"] = source_digest()
    log.info("workload at scale %g: %s = %s events", args.scale, workload, f"{workload.events:,}")
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(PostgresServer(settings=SERVER_SETTINGS))
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            info["postgresql"] = str(row[0]) if row else "?"
            server_version = conn.info.server_version
        bootstrap, broker_marker = args.bootstrap_servers, None
        if "c" in args.keys and bootstrap is None:
            from pgcdc.services.kafka import KAFKA_VERSION, KafkaBroker

            broker = stack.enter_context(KafkaBroker())
            bootstrap = broker.bootstrap_servers
            broker_marker = str(broker.base)  # in the broker's command line (its config)
            info["kafka"] = KAFKA_VERSION
        setup = prepare_and_load(server.dsn(), args.keys, workload)
        setup.options = consumer_options(args.protocol, server_version)
        log.info("pgoutput options of every consumer: %s", setup.options)
        results: list[Result] = []
        profiled = "b" if "b" in args.keys else "c"
        for key in args.keys:
            if key == "a":
                result = measure_recvlogical(server, setup, workload)
            else:
                result = measure_pgcdc(
                    key, server, setup, workload, protocol=args.protocol,
                    bootstrap_servers=bootstrap, kafka_format=args.kafka_format,
                    kafka_config=args.kafka_config,
                    profile=args.profile if key == profiled else None, profiler=args.profiler,
                    timeout=args.timeout, broker_marker=broker_marker)
            result.decoded_mb, result.spilled_mb, result.streamed_mb = slot_stats(
                server.dsn(), SLOTS[key])
            log.info("%s: %.2f s, %s rows/s, peak RSS %.0f MiB", label(result), result.seconds,
                     f"{result.rate:,.0f}", result.peak_rss_mb)
            results.append(result)

    print()
    print("machine: " + ", ".join(f"{k} {v}" for k, v in info.items()))
    print(f"workload: {workload.events:,} events, WAL {setup.wal_mb:,.0f} MiB, written in "
          + ", ".join(f"{name} {s:.1f} s" for name, s in setup.load_seconds.items()))
    print(f"pgoutput options: {setup.options}")
    print()
    print(text_table(results))
    print()
    print(markdown(results, workload, setup, info, args.scale))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "scale": args.scale, "workload": asdict(workload), "events": workload.events,
            "wal_mb": setup.wal_mb, "load_seconds": setup.load_seconds,
            "options": setup.options, "machine": info,
            "results": [dict(asdict(r), rate=r.rate) for r in results],
        }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
