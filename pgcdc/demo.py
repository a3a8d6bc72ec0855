"""``pgcdc demo``: the whole pipeline on a sample schema, from source to lake, then a comparison.

Without a DSN or bootstrap servers it starts a throwaway PostgreSQL and Kafka
(pgcdc.services).  It creates the ``pgcdc_demo`` schema, streams a mixed
workload of inserts, updates and deletes through Kafka into Delta tables under
the output folder, and prints each table's row count and checksum on both
sides.  Exit status 0 means the lake equals the source.
"""

from __future__ import annotations

import contextlib
import logging
import random
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import psycopg

from decoder.lsn import format_lsn
from decoder.slot import current_wal_lsn
from pgcdc.clone import TableComparison, compare
from pgcdc.pipeline import Pipeline, PipelineConfig, Progress
from sinks.kafka import KafkaSink
from sinks.registry import SchemaRegistry

log = logging.getLogger(__name__)

SCHEMA = "pgcdc_demo"
TABLES = [f"{SCHEMA}.customers", f"{SCHEMA}.orders", f"{SCHEMA}.order_items"]

DDL = f"""
CREATE SCHEMA IF NOT EXISTS {SCHEMA};
DROP TABLE IF EXISTS {SCHEMA}.order_items, {SCHEMA}.orders, {SCHEMA}.customers;
CREATE TABLE {SCHEMA}.customers (
    id bigint PRIMARY KEY,
    name text NOT NULL,
    email text,
    vip boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE {SCHEMA}.orders (
    id bigint PRIMARY KEY,
    customer_id bigint NOT NULL,
    amount numeric(12,2) NOT NULL,
    status text NOT NULL,
    placed_at timestamptz NOT NULL,
    details jsonb
);
CREATE TABLE {SCHEMA}.order_items (
    order_id bigint NOT NULL,
    line int NOT NULL,
    sku text NOT NULL,
    qty int NOT NULL,
    PRIMARY KEY (order_id, line)
);
"""


@dataclass
class DemoOptions:
    dsn: str | None = None
    bootstrap_servers: str | None = None
    output: Path = Path("pgcdc-output")
    transactions: int = 2000
    seed: int = 42
    slot: str = "pgcdc_demo"
    topic_prefix: str = "pgcdc_demo"
    value_format: str = "avro"
    schema_registry: bool = False  # a throwaway Apicurio Registry, the Confluent wire format


class Workload:
    """A seeded mix of inserts, updates and deletes over the demo tables."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)  # noqa: S311 - a reproducible workload
        self.customers: list[int] = []
        self.orders: dict[int, int] = {}  # order id -> item lines
        self.next_id = 1

    def transaction(self, conn: psycopg.Connection[Any]) -> None:
        rng = self.rng
        with conn.transaction():
            roll = rng.random()
            if roll < 0.25 or len(self.customers) < 5:
                cid = self._new_id()
                conn.execute(
                    f"INSERT INTO {SCHEMA}.customers (id, name, email, vip) "
                    "VALUES (%s, %s, %s, %s)",
                    (cid, f"customer {cid} 'ü'", f"c{cid}@example.com" if cid % 3 else None,
                     rng.random() < 0.1))
                self.customers.append(cid)
            elif roll < 0.6:
                oid = self._new_id()
                conn.execute(
                    f"INSERT INTO {SCHEMA}.orders VALUES (%s, %s, %s, 'new', now(), %s::jsonb)",
                    (oid, rng.choice(self.customers), f"{rng.randint(1, 99999) / 100:.2f}",
                     '{"channel": "web", "tags": ["a", "b"]}' if oid % 2 else None))
                lines = rng.randint(1, 4)
                for line in range(1, lines + 1):
                    conn.execute(f"INSERT INTO {SCHEMA}.order_items VALUES (%s, %s, %s, %s)",
                                 (oid, line, f"SKU-{rng.randint(1, 500)}", rng.randint(1, 9)))
                self.orders[oid] = lines
            elif roll < 0.85 and self.orders:
                oid = rng.choice(list(self.orders))
                conn.execute(f"UPDATE {SCHEMA}.orders SET status = %s, amount = amount + 1 "
                             "WHERE id = %s", (rng.choice(["paid", "shipped", "returned"]), oid))
                conn.execute(f"UPDATE {SCHEMA}.order_items SET qty = qty + 1 WHERE order_id = %s",
                             (oid,))
            elif roll < 0.95 and self.orders:
                oid = rng.choice(list(self.orders))
                conn.execute(f"DELETE FROM {SCHEMA}.order_items WHERE order_id = %s", (oid,))
                conn.execute(f"DELETE FROM {SCHEMA}.orders WHERE id = %s", (oid,))
                del self.orders[oid]
            else:
                cid = rng.choice(self.customers)
                conn.execute(f"UPDATE {SCHEMA}.customers SET vip = NOT vip, email = NULL "
                             "WHERE id = %s", (cid,))

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id


class _Status:
    """One line of progress on stderr."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.parts: dict[str, str] = {}
        self._last = 0.0
        self._lock = threading.Lock()

    def set(self, name: str, text: str, *, force: bool = False) -> None:
        with self._lock:
            self.parts[name] = text
            now = time.monotonic()
            if not force and now - self._last < (0.5 if self.tty else 5.0):
                return
            self._last = now
            line = " | ".join(f"{k}: {v}" for k, v in self.parts.items())
            self.out.write(("\r" + line + "\x1b[K") if self.tty else line + "\n")
            self.out.flush()

    def done(self) -> None:
        if self.tty:
            self.out.write("\n")


@contextlib.contextmanager
def _services(options: DemoOptions) -> Iterator[tuple[str, str]]:
    with contextlib.ExitStack() as stack:
        dsn = options.dsn
        servers = options.bootstrap_servers
        if dsn is None:
            from pgcdc.services.postgres import PostgresServer

            print("starting a throwaway PostgreSQL ...", file=sys.stderr)
            dsn = stack.enter_context(PostgresServer()).dsn()
        if servers is None:
            from pgcdc.services.kafka import KafkaBroker

            print("starting a throwaway Kafka broker (first run resolves its jars) ...",
                  file=sys.stderr)
            servers = stack.enter_context(KafkaBroker()).bootstrap_servers
        yield dsn, servers


@contextlib.contextmanager
def _registry(options: DemoOptions) -> Iterator[SchemaRegistry | None]:
    if not options.schema_registry:
        yield None
        return
    from pgcdc.services.registry import SchemaRegistryServer

    print("starting a throwaway schema registry (Apicurio; the first run builds it) ...",
          file=sys.stderr)
    with SchemaRegistryServer() as server:
        yield SchemaRegistry(server.url)


def run_demo(options: DemoOptions) -> list[TableComparison]:
    from streaming import job
    from streaming.session import build_session

    output = options.output.resolve()
    shutil.rmtree(output, ignore_errors=True)
    lake, checkpoint = output / "lake", output / "checkpoints" / "apply"
    status = _Status(sys.stderr)
    with _services(options) as (dsn, servers), _registry(options) as registry:
        with psycopg.connect(dsn, autocommit=True) as conn:
            _reset(conn, options.slot)
            conn.execute(DDL)
        sink = KafkaSink(servers, topic_prefix=options.topic_prefix,
                         value_format=options.value_format, schema_registry=registry)
        pipeline = Pipeline(
            PipelineConfig(dsn, slot=options.slot, publication=options.slot, tables=TABLES), sink)
        pipeline.prepare()
        stop = threading.Event()
        failure: list[BaseException] = []

        def capture() -> None:
            try:
                pipeline.run(stop=stop, on_progress=lambda p: status.set("capture", _fmt(p)))
            except BaseException as exc:  # reported by the main thread
                failure.append(exc)
                stop.set()

        capture_thread = threading.Thread(target=capture, name="pgcdc-capture", daemon=True)
        capture_thread.start()

        spark_log = output / "spark.log"
        print("starting Spark (first run resolves the Kafka and Delta jars; Spark's own log: "
              f"{spark_log}) ...", file=sys.stderr)
        spark = build_session("pgcdc-demo", spark_log=spark_log)
        config = job.JobConfig(servers, lake.as_uri(), checkpoint.as_uri(),
                               topic_prefix=options.topic_prefix, trigger_seconds=2.0)
        applied = {"batches": 0, "changes": 0}

        def on_batch(batch_id: int, counts: dict[str, int]) -> None:
            applied["batches"] += 1
            applied["changes"] += sum(counts.values())
            status.set("lake", f"{applied['batches']} batches, {applied['changes']} changes")

        query = job.start(spark, config, on_batch=on_batch)
        workload = Workload(options.seed)
        with psycopg.connect(dsn) as conn:
            for i in range(options.transactions):
                if stop.is_set():
                    break
                workload.transaction(conn)
                status.set("source", f"{i + 1}/{options.transactions} transactions")
            end_lsn = current_wal_lsn(conn)
        status.set("source", f"done, WAL at {format_lsn(end_lsn)}", force=True)

        deadline = time.monotonic() + 300
        while pipeline.progress.durable_lsn < end_lsn and not stop.is_set():
            if time.monotonic() > deadline:
                msg = "capture did not reach the end of the workload within 300 s"
                raise TimeoutError(msg)
            time.sleep(0.2)
        stop.set()
        capture_thread.join(timeout=60)
        sink.close()
        if failure:
            query.stop()
            raise failure[0]
        status.set("capture", _fmt(pipeline.progress), force=True)
        query.processAllAvailable()
        query.stop()
        status.done()
        specs = job.read_catalog(spark, config).tables()
        with psycopg.connect(dsn) as conn:
            return compare(conn, spark, lake.as_uri(), specs)


def _reset(conn: psycopg.Connection[Any], slot: str) -> None:
    """Drop what an earlier demo left in a user-supplied database."""
    conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                 "WHERE slot_name = %s AND NOT active", (slot,))
    conn.execute(psycopg.sql.SQL("DROP PUBLICATION IF EXISTS {}").format(
        psycopg.sql.Identifier(slot)))


def _fmt(progress: Progress) -> str:
    return (f"{progress.events} events in {progress.transactions} txns, "
            f"durable {format_lsn(progress.durable_lsn)}")


def print_report(results: list[TableComparison], out: TextIO = sys.stdout) -> bool:
    out.write(f"{'table':<28} {'source rows':>11} {'lake rows':>10} {'source sum':>17} "
              f"{'lake sum':>17}  equal\n")
    for r in results:
        out.write(f"{r.table:<28} {r.source.rows:>11} {r.lake.rows:>10} {r.source.checksum:>17} "
                  f"{r.lake.checksum:>17}  {'yes' if r.equal else 'NO'}\n")
    ok = bool(results) and all(r.equal for r in results)
    out.write("the lake equals the source\n" if ok else "the lake DIFFERS from the source\n")
    return ok
