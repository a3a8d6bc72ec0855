"""Where a streaming pgcdc's Python memory goes over time: a tracemalloc diff.

    python -m bench.memory_probe --seconds 300 --rate 60

A throwaway PostgreSQL and Kafka, the pipeline streaming ``ledger`` into Kafka (Avro) in
a thread, the soak's writer (tests/oracle.py) at ``--rate`` transactions per second.
tracemalloc starts after ``--warm-up`` seconds; snapshots are taken a minute later and at
the end, and the allocations that grew most between them are printed with their
tracebacks (the writer's own ledger left out).  A leak in pgcdc's Python code shows as a
line that grows with the run; ``bench/soak.py`` gives the process's RSS and malloc heap.
"""

from __future__ import annotations

import argparse
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
    args = parser.parse_args()
    with PostgresServer() as server:
        broker = KafkaBroker()
        broker.start()
        try:
            _probe(server.dsn(), broker.bootstrap_servers, args)
        finally:
            broker.cleanup()


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
            if elapsed > args.warm_up + 60 and first is None:
                gc.collect()
                first = tracemalloc.take_snapshot()
            time.sleep(max(0.0, count / args.rate - (time.monotonic() - start)))
    gc.collect()
    last = tracemalloc.take_snapshot()
    stop.set()
    thread.join(60)
    if first is None:
        raise SystemExit("--seconds must exceed --warm-up by more than a minute")
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
