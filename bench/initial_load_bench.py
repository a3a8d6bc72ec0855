"""The initial-load benchmark: ``pgcdc snapshot`` into Kafka against ``COPY ... TO STDOUT``.

One throwaway PostgreSQL and one throwaway Kafka broker (``pgcdc.services``), or
existing ones (``--dsn``, ``--bootstrap-servers``).  Two tables, generated
server-side (``--rows`` in all, three quarters in the first):

* ``bench_orders``: bigint key, numeric, timestamptz, text, jsonb, int[] and an
  enum column (the decoder benchmark's shape);
* ``bench_customers``: int key, two text columns, a date and a boolean.

Then, in the same run, one after the other:

(a) the ceiling: ``COPY <table> TO STDOUT`` (text format) of each table through
    psycopg, the blocks read and dropped, one connection per table in turn;
(b) the same ``COPY`` split into ctid chunks over ``--readers`` connections in
    parallel, the blocks dropped (what the load's readers could fetch at most);
(c) the initial load into :class:`~sinks.null.NullSink`: COPY, parse and decode
    to typed read events, nothing encoded (where the decoding alone stands);
(d) the initial load into Kafka (:class:`~sinks.kafka.KafkaSink`, ``--format``),
    from slot creation until every event is acknowledged (``acks=all``).

(c) and (d) run with ``--workers`` worker processes (default: the number of
CPUs; each one connection and its own sink), or with ``--workers 0`` as reader
threads in this process (``--readers`` connections) writing to one sink;
(e) is (d) again with reader threads, for a comparison in the same conditions.

Each load creates its own slot with an exported snapshot.  Rates are rows per
second of wall time, worker start-up included.  CPU is this process's and its
workers' (user + system; PostgreSQL and Kafka not counted); peak RSS is this
process's and the largest worker's.  The target is (d) >= 0.5 x (a).  Nothing
is asserted: the script measures, prints a table and says whether the target is
met.

From the repository root::

    python -m bench.initial_load_bench                 # 1,000,000 rows
    python -m bench.initial_load_bench --rows 200000   # a quick run
    python -m bench.initial_load_bench --workers 0     # threads in one process
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import platform
import resource
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from loads.initial_load import InitialLoad, LoadConfig
from pgcdc.services.kafka import KafkaBroker
from pgcdc.services.postgres import PostgresServer
from sinks.kafka import KafkaSink
from sinks.null import NullSink
from sinks.sink import Sink

log = logging.getLogger("bench.initial_load_bench")

TABLES = ("bench_orders", "bench_customers")


@dataclass
class Measure:
    name: str
    rows: int
    seconds: float
    cpu: float  # user + system seconds of this process and its waited-for children
    worker_rss: int = 0  # the largest worker's peak RSS, KiB (0: no worker processes)
    servers: tuple[float, float] = (0.0, 0.0)  # CPU s of PostgreSQL and Kafka (throwaway ones)
    machine: float = 0.0  # CPU s the whole machine was busy (every process, every core)

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


def _cpu() -> float:
    """This process and its children that ended (the load's workers; the servers run on)."""
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def _process_cpu(pid: int | None) -> float:
    """User + system CPU s of a process, its threads, its children that ended and those still
    running (for the postmaster: every backend, whether reaped yet or not), from /proc."""
    if pid is None:
        return 0.0
    ticks = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile: its time moves to the parent's children fields
            continue
        if entry.name == str(pid) or fields[1] == str(pid):
            ticks += sum(int(v) for v in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def _machine_cpu() -> float:
    """CPU s the machine has been busy since boot (all cores, /proc/stat: not idle, iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


_SERVERS: list[int | None] = [None, None]  # pids of the throwaway PostgreSQL and Kafka


def _servers_cpu() -> tuple[float, float]:
    return _process_cpu(_SERVERS[0]), _process_cpu(_SERVERS[1])


def _timed(name: str, rows: int, work: Callable[[], object]) -> Measure:
    cpu, servers, machine, start = _cpu(), _servers_cpu(), _machine_cpu(), time.perf_counter()
    result = work()
    seconds = time.perf_counter() - start
    after = _servers_cpu()
    measure = Measure(name, rows, seconds, _cpu() - cpu, result if isinstance(result, int) else 0,
                      (after[0] - servers[0], after[1] - servers[1]), _machine_cpu() - machine)
    log.info("%s: %d rows in %.2f s (%.0f rows/s)", name, rows, measure.seconds, measure.rate)
    return measure


def create_tables(dsn: str, rows: int) -> dict[str, int]:
    orders, customers = rows * 3 // 4, rows - rows * 3 // 4
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TYPE bench_state AS ENUM ('new', 'paid', 'shipped')")
        conn.execute("""CREATE TABLE bench_orders (id bigint PRIMARY KEY, amount numeric(12,2),
                        at timestamptz, note text, doc jsonb, items int[], state bench_state)""")
        conn.execute("""INSERT INTO bench_orders
                        SELECT g, g * 1.25, '2024-01-01'::timestamptz + g * interval '1 s',
                               'order ' || g || repeat(' x', g %% 20),
                               jsonb_build_object('n', g, 'tag', 't' || g %% 7),
                               ARRAY[g %% 10, g %% 100, g %% 1000],
                               (ARRAY['new', 'paid', 'shipped'])[g %% 3 + 1]::bench_state
                          FROM generate_series(1, %s) g""", (orders,))
        conn.execute("""CREATE TABLE bench_customers (id int PRIMARY KEY, name text,
                        email text, since date, active bool)""")
        conn.execute("""INSERT INTO bench_customers
                        SELECT g, 'customer ' || g, 'c' || g || '@example.com',
                               '2020-01-01'::date + g %% 1500, g %% 2 = 0
                          FROM generate_series(1, %s) g""", (customers,))
        conn.execute("CREATE PUBLICATION bench FOR TABLE bench_orders, bench_customers")
        conn.execute("VACUUM ANALYZE bench_orders, bench_customers")
    return {"bench_orders": orders, "bench_customers": customers}


def copy_sequential(dsn: str) -> None:
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        for table in TABLES:
            with cur.copy(sql.SQL("COPY {} TO STDOUT").format(sql.Identifier(table))) as copy:
                for _block in copy:
                    pass


def copy_parallel(dsn: str, readers: int, chunk_pages: int) -> None:
    chunks: list[tuple[str, int, int | None]] = []
    with psycopg.connect(dsn) as conn:
        for table in TABLES:
            row = conn.execute("SELECT pg_relation_size(%s::regclass) / "
                               "current_setting('block_size')::int", (table,)).fetchone()
            assert row is not None
            pages = int(row[0])
            starts = list(range(0, pages, chunk_pages)) or [0]
            chunks += [(table, s, s + chunk_pages) for s in starts[:-1]] + [(table, starts[-1],
                                                                             None)]
    lock = threading.Lock()

    def work() -> None:
        with psycopg.connect(dsn) as conn, conn.cursor() as cur:
            while True:
                with lock:
                    if not chunks:
                        return
                    table, start, end = chunks.pop()
                where = f"ctid >= '({start},0)'" + (f" AND ctid < '({end},0)'" if end else "")
                query = sql.SQL("COPY (SELECT * FROM {} WHERE {}) TO STDOUT").format(
                    sql.Identifier(table), sql.SQL(where))
                with cur.copy(query) as copy:
                    for _block in copy:
                        pass

    threads = [threading.Thread(target=work) for _ in range(readers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def initial_load(dsn: str, factory: Callable[[], Sink], slot: str, state: Path, readers: int,
                 chunk_pages: int, workers: int) -> int:
    """One load; returns the largest worker's peak RSS (KiB)."""
    sink = factory()
    load = InitialLoad(LoadConfig(dsn, state, slot=slot, publication="bench", readers=readers,
                                  chunk_pages=chunk_pages, capture_ddl=False, workers=workers,
                                  sink_factory=factory if workers else None), sink)
    summary = load.run()
    sink.close()
    assert summary.complete
    return max(summary.progress.worker_rss, default=0)


def stages(dsn: str, sink: Sink) -> list[tuple[str, float]]:
    """Where a worker's time goes, one thread, one table after the other: CPU us per row of
    (1) COPY rows as psycopg gives them, (2) + rows built and read events made, (3) + the
    events written to ``sink`` and flushed (librdkafka's threads included: process CPU)."""
    from decoder.change import READ, ChangeEvent
    from decoder.replication import SESSION_OPTIONS
    from loads.chunk_reader import ChunkTask, copy_query, row_builder
    from loads.load_state import ChunkState
    from loads.published import fetch_published_tables
    from snapshot_builder.row_decoders import RowDecoderFactory

    with psycopg.connect(dsn, autocommit=True, options=SESSION_OPTIONS) as conn:
        catalog = fetch_published_tables(conn, "bench", captured=False)
        decoders = RowDecoderFactory(lambda: conn)
        tasks = []
        for published in catalog.values():
            sink.publish_table(published.table, 1)
            tasks.append(ChunkTask(published, decoders.decoder(published.table),
                                   0, ChunkState(0, None), None))

        def run(level: int) -> int:
            rows = 0
            for task in tasks:
                assert task.decoder is not None
                table, build = task.table.table, row_builder(task.decoder)
                with conn.cursor() as cur, cur.copy(copy_query(task)) as copy:
                    for raw in copy.rows():
                        if level >= 2:
                            event = ChangeEvent(READ, table, None, build(raw), (), 1, 1, rows, 0,
                                                0)
                            if level >= 3:
                                sink.write(event)
                        rows += 1
            sink.end_transaction(1)
            sink.flush(120)
            return rows

        out = []
        for level, name in ((1, "COPY rows (psycopg)"), (2, "+ rows built, read events made"),
                            (3, f"+ written to {type(sink).__name__} and flushed")):
            cpu = time.process_time()
            rows = run(level)
            out.append((name, (time.process_time() - cpu) / rows * 1e6))
    return out


def kafka_floor(dsn: str, sink: KafkaSink) -> tuple[int, float, float, float]:
    """(f): the load's Avro read events produced from memory, no PostgreSQL: every COPY line
    of both tables read into a list first (not measured), then the compiled path's encoding
    and producer (sinks/loadfast.py) in this process, flushed.  Returns the rows and CPU us
    per row: of the calling thread (encoding, librdkafka's producev), of this whole process
    (librdkafka's threads included) and of the broker."""
    from decoder.replication import SESSION_OPTIONS
    from loads.chunk_reader import ChunkTask, copy_query
    from loads.load_state import ChunkState
    from loads.published import fetch_published_tables
    from sinks.loadfast import FastLoad
    from snapshot_builder.row_decoders import RowDecoderFactory

    fast = FastLoad.for_sink(sink)
    if fast is None:
        msg = "the compiled load path is not available (sinks/loadfast.py): no (f)"
        raise RuntimeError(msg)
    plans, lines = [], []
    with psycopg.connect(dsn, autocommit=True, options=SESSION_OPTIONS) as conn:
        catalog = fetch_published_tables(conn, "bench", captured=False)
        decoders = RowDecoderFactory(lambda: conn)
        for published in catalog.values():
            table = published.table
            sink.publish_table(table, 1)
            plans.append(fast.plan(table, decoders.decoder(table), 1, 0))
            task = ChunkTask(published, None, 0, ChunkState(0, None), None)
            with conn.cursor() as cur, cur.copy(copy_query(task)) as copy:
                lines.append([bytes(line) for line in copy])
    rows = sum(len(table_lines) for table_lines in lines)
    main, cpu, kafka = time.thread_time(), time.process_time(), _servers_cpu()[1]
    for plan, table_lines in zip(plans, lines, strict=True):
        plan.rows(iter(table_lines), len(table_lines), 0, int(time.time() * 1000))
    main = time.thread_time() - main  # encoding and handing over (producev); not the flush
    if not fast.durable(120):
        msg = "(f): the events were not all acknowledged within 120 s"
        raise RuntimeError(msg)
    cpu, kafka = time.process_time() - cpu, _servers_cpu()[1] - kafka
    fast.close()
    return rows, main / rows * 1e6, cpu / rows * 1e6, kafka / rows * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--readers", type=int, default=4,
                        help="connections of (b), and of (c), (d) with --workers 0")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)),
                        help="worker processes of (c) and (d); 0: threads (default: CPUs)")
    parser.add_argument("--chunk-pages", type=int, default=1024)
    parser.add_argument("--format", choices=["avro", "json"], default="avro")
    parser.add_argument("--dsn", help="an existing database (default: a throwaway server)")
    parser.add_argument("--bootstrap-servers", help="an existing Kafka (default: a throwaway one)")
    parser.add_argument("--producer", action="append", default=[], metavar="KEY=VALUE",
                        help="a librdkafka producer property for (d) and (e), e.g. linger.ms=50")
    parser.add_argument("--only", default="a,b,c,d,e,f", help="which measurements, e.g. a,d")
    parser.add_argument("--stages", action="store_true",
                        help="also: one thread's CPU per row by stage, into Kafka")
    parser.add_argument("--warm-up", type=int, default=200_000, metavar="ROWS",
                        help="a throwaway broker's JIT warm-up before (d): a load of this many "
                             "rows into other topics, not measured (0: none)")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run that only shows the benchmark still works (CI): "
                             "2,000 rows, 1 worker, 2 readers, chunks of 8 pages, no warm-up; "
                             "its figures mean nothing")
    args = parser.parse_args()
    if args.smoke:
        args.rows, args.workers, args.readers, args.chunk_pages, args.warm_up = 2000, 1, 2, 8, 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    only = set(args.only.split(","))
    producer_config = dict(item.split("=", 1) for item in args.producer)
    server = broker = None
    work = Path(tempfile.mkdtemp(prefix="pgcdc-bench-"))
    try:
        dsn = args.dsn
        if dsn is None:
            server = PostgresServer(settings={"shared_buffers": "512MB"}).start()
            dsn = server.dsn()
            _SERVERS[0] = int((server.datadir / "postmaster.pid").read_text().split()[0])
        servers = args.bootstrap_servers
        if servers is None and only & {"d", "e", "f"}:
            broker = KafkaBroker().start()
            servers = broker.bootstrap_servers
            _SERVERS[1] = broker._proc.pid if broker._proc is not None else None  # noqa: SLF001
        rows = create_tables(dsn, args.rows)
        total = sum(rows.values())
        copy_sequential(dsn)  # warm the cache: every measurement reads from memory
        if broker is not None and args.warm_up:
            warm_up(dsn, servers, args, work)
        results: dict[str, Measure] = {}
        how = (f"{args.workers} worker processes" if args.workers
               else f"{args.readers} reader threads")
        if "a" in only:
            results["a"] = _timed("(a) COPY TO STDOUT, one connection", total,
                                  lambda: copy_sequential(dsn))
        if "b" in only:
            results["b"] = _timed(f"(b) COPY TO STDOUT, {args.readers} connections, ctid chunks",
                                  total, lambda: copy_parallel(dsn, args.readers, args.chunk_pages))
        if "c" in only:
            results["c"] = _timed(f"(c) initial load into NullSink (decode only), {how}", total,
                                  lambda: initial_load(dsn, NullSink, "bench_null",
                                                       work / "null.json", args.readers,
                                                       args.chunk_pages, args.workers))
        if "d" in only:
            assert servers is not None
            factory = functools.partial(KafkaSink, servers, topic_prefix="bench",
                                        value_format=args.format,
                                        producer_config=producer_config)
            results["d"] = _timed(f"(d) initial load into Kafka ({args.format}), {how}", total,
                                  lambda: initial_load(dsn, factory, "bench_kafka",
                                                       work / "kafka.json", args.readers,
                                                       args.chunk_pages, args.workers))
        if "e" in only and args.workers:
            assert servers is not None
            factory = functools.partial(KafkaSink, servers, topic_prefix="bench_threads",
                                        value_format=args.format,
                                        producer_config=producer_config)
            results["e"] = _timed(f"(e) initial load into Kafka ({args.format}), "
                                  f"{args.readers} reader threads", total,
                                  lambda: initial_load(dsn, factory, "bench_threads",
                                                       work / "threads.json", args.readers,
                                                       args.chunk_pages, 0))
        report(results, args, total)
        if "f" in only and servers is not None and "a" in results:
            floor(dsn, servers, args, results["a"])
        if args.stages and servers is not None:
            kafka = KafkaSink(servers, topic_prefix="bench_stages", value_format=args.format)
            print("\none thread, CPU us per row (this process, librdkafka's threads included):")
            for name, cost in stages(dsn, kafka):
                print(f"  {name}: {cost:.2f}")
            kafka.close()
    finally:
        if broker is not None:
            broker.cleanup()
        if server is not None:
            server.cleanup()
        shutil.rmtree(work, ignore_errors=True)


def warm_up(dsn: str, servers: str | None, args: Any, work: Path) -> None:
    """A fresh broker compiles its hot paths during its first seconds of load (about a second
    of CPU at 1,000,000 events): a production broker is warm, so is the measured one."""
    assert servers is not None
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE warm_up AS SELECT * FROM bench_orders LIMIT %s",
                     (args.warm_up,))
        conn.execute("ALTER TABLE warm_up ADD PRIMARY KEY (id)")
        conn.execute("CREATE PUBLICATION bench_warm_up FOR TABLE warm_up")
    factory = functools.partial(KafkaSink, servers, topic_prefix="bench_warm_up")
    sink = factory()
    load = InitialLoad(LoadConfig(dsn, work / "warm_up.json", slot="bench_warm_up",
                                  publication="bench_warm_up", capture_ddl=False,
                                  workers=args.workers, sink_factory=factory), sink)
    load.run()
    sink.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot('bench_warm_up')")
    log.info("broker warmed up: %d rows loaded into other topics", args.warm_up)


def floor(dsn: str, servers: str, args: Any, ceiling: Measure) -> None:
    """(f) and the rate it bounds: no loader through librdkafka into this broker can be faster
    than the machine's cores over the CPU a row costs PostgreSQL's COPY (from (a)), the
    producer and the broker."""
    sink = KafkaSink(servers, topic_prefix="bench_floor", value_format=args.format)
    rows, main, producer, broker = kafka_floor(dsn, sink)
    sink.close()
    pg = ceiling.servers[0] / ceiling.rows * 1e6
    cores = len(os.sched_getaffinity(0))
    bound = cores / (pg + producer + broker) * 1e6
    print(f"\n(f) the {rows:,} events from memory through the compiled producer (no PostgreSQL):"
          f" producer {producer:.2f} (of which encoding and producev {main:.2f}, librdkafka's "
          f"threads {producer - main:.2f}) + broker {broker:.2f} CPU us per row; with COPY's "
          f"{pg:.2f} us of PostgreSQL, {cores} cores bound any load into this broker to "
          f"{bound:,.0f} rows/s = {bound / ceiling.rate:.3f} x (a)")


def report(results: dict[str, Measure], args: Any, total: int) -> None:
    load = os.getloadavg()
    print(f"\n{total:,} rows, {args.workers} workers, {args.readers} readers, "
          f"{args.chunk_pages} pages per chunk, {os.cpu_count()} CPUs, "
          f"{platform.python_implementation()} {platform.python_version()}, "
          f"load average {load[0]:.1f}")
    print("| measurement | rows/s | x (a) | seconds | CPU s: pgcdc / PostgreSQL / Kafka / "
          "rest of the machine | CPU us per row (pgcdc + servers) | peak RSS of a worker |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    ceiling = results["a"].rate if "a" in results else 0.0
    for m in results.values():
        ratio = f"{m.rate / ceiling:.3f}" if ceiling else "-"
        rss = f"{m.worker_rss / 1024:.0f} MiB" if m.worker_rss else "-"
        pg, kafka = m.servers
        rest = max(0.0, m.machine - m.cpu - pg - kafka)
        per_row = (m.cpu + pg + kafka) / m.rows * 1e6
        print(f"| {m.name} | {m.rate:,.0f} | {ratio} | {m.seconds:.2f} | {m.cpu:.2f} / {pg:.2f} "
              f"/ {kafka:.2f} / {rest:.2f} | {per_row:.1f} | {rss} |")
    self_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak RSS of this process (coordinator, sinks of (c)/(d) with --workers 0): "
          f"{self_rss:.0f} MiB")
    if "a" in results and "d" in results:
        ratio = results["d"].rate / results["a"].rate
        print(f"\n(d) / (a) = {ratio:.3f}: target >= 0.5 {'met' if ratio >= 0.5 else 'NOT met'}")
    if "a" in results and "c" in results:
        print(f"(c) / (a) = {results['c'].rate / results['a'].rate:.3f}")


if __name__ == "__main__":
    main()
