"""Where a streaming pgcdc's Python memory goes over time: a tracemalloc diff.

    python -m bench.memory_probe --seconds 300 --rate 60

A throwaway PostgreSQL and Kafka, the pipeline streaming ``ledger`` into Kafka (Avro) in
a thread, the soak's writer (tests/oracle.py) at ``--rate`` transactions per second.
tracemalloc starts after ``--warm-up`` seconds; snapshots are taken ``--interval`` seconds
(a minute) later and at the end, and the allocations that grew most between them are
printed with their tracebacks (the writer's own ledger left out).  A leak in pgcdc's
Python code shows as a line that grows with the run; ``bench/soak.py`` gives the process's
RSS and malloc heap.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import threading
import time
import tracemalloc

import psycopg

from pgcdc.pipeline import Pipeline, PipelineConfig
from pgcdc.services.kafka import KafkaBroker
from pgcdc.services.postgres import PostgresServer
from sinks.kafka import KafkaSink
from tests.oracle import Writer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--rate", type=float, default=60.0, help="transactions per second")
    parser.add_argument("--warm-up", type=float, default=30.0)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--interval", type=float, default=60.0,
                        help="seconds after tracemalloc starts to the first snapshot")
    parser.add_argument("--bootstrap-servers",
                        help="an existing Kafka (default: a throwaway broker)")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run that only shows the probe still works (CI): 4 s at "
                             "20 tx/s, snapshots after 1 s and 2 s; its figures mean nothing")
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.rate, args.warm_up, args.interval = 4.0, 20.0, 1.0, 1.0
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(PostgresServer())
        servers = args.bootstrap_servers or \
            stack.enter_context(KafkaBroker()).bootstrap_servers
        _probe(server.dsn(), servers, args)


def _probe(dsn: str, servers: str, args: argparse.Namespace) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE ledger (id int PRIMARY KEY, version int, payload text)")
    pipeline = Pipeline(PipelineConfig(dsn, tables=["public.ledger"]),
                        KafkaSink(servers, topic_prefix="probe"))
    pipeline.prepare()
    stop = threading.Event()
    thread = threading.Thread(target=lambda: pipeline.run(stop=stop))
    thread.start()
    writer = Writer(dsn, 1)
    first: tracemalloc.Snapshot | None = None
    with psycopg.connect(dsn, autocommit=True) as conn:
        start, count = time.monotonic(), 0
        while (elapsed := time.monotonic() - start) < args.seconds:
            writer.write(conn, 1)
            count += 1
            if elapsed > args.warm_up and not tracemalloc.is_tracing():
                tracemalloc.start(15)
            if elapsed > args.warm_up + args.interval and first is None:
                gc.collect()
                first = tracemalloc.take_snapshot()
            time.sleep(max(0.0, count / args.rate - (time.monotonic() - start)))
    gc.collect()
    last = tracemalloc.take_snapshot()
    stop.set()
    thread.join(60)
    if first is None:
        raise SystemExit("--seconds must exceed --warm-up by more than --interval")
    leave_out = [tracemalloc.Filter(False, "*/tests/oracle.py"),
                 tracemalloc.Filter(False, tracemalloc.__file__)]
    diff = last.filter_traces(leave_out).compare_to(first.filter_traces(leave_out), "traceback")
    total = sum(s.size_diff for s in diff)
    print(f"{count} transactions; Python allocations of pgcdc between the snapshots: "
          f"{total:+,} bytes")
    for stat in sorted(diff, key=lambda s: s.size_diff, reverse=True)[:args.top]:
        print(f"{stat.size_diff:+,} bytes in {stat.count_diff:+,} blocks")
        for line in stat.traceback.format()[-6:]:
            print("   ", line)


if __name__ == "__main__":
    main()
