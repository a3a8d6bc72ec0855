"""The Spark apply: catch-up throughput by micro-batch size, and commit -> lake latency.

One throwaway PostgreSQL and one throwaway Kafka broker (``pgcdc.services``); pgcdc's
:class:`Pipeline` streams into :class:`KafkaSink` (Avro by default); the Spark job
(``streaming.job``, local[2], the same code as ``pgcdc spark``) applies the topic to Delta.

**Catch-up** (``--catchup``).  A reference workload is captured into the topic first:
``--rows`` inserts into ``bench.orders`` (bigint key, int, numeric(12,2), text, text,
timestamptz), then updates of 30 % of the rows and deletes of 5 %, in transactions of 1,000
rows.  Then, for each ``--batch-sizes`` value, a fresh query (new lake and checkpoint) runs
with ``maxOffsetsPerTrigger`` = that value and the ``availableNow`` trigger until it has
applied everything; events/s = change events in the topic / wall time from ``start()`` to
the query's end (the Delta table's creation and every batch's MERGE included; the Spark
session and its JVM are up before, and one unmeasured run of the largest size warms them).
Each run's lake table is checked against the source (row count and sum of ids).

**Latency** (``--latency``).  A writer in a child process inserts ``--rate`` rows/s into
``bench.latency`` (``--rows-per-txn`` rows per transaction, on an absolute schedule) for
``--seconds``, while the pipeline streams (its own process) and the query runs with a
``--trigger`` second processing-time trigger.  Per transaction: from the moment its COMMIT returned
(``CLOCK_REALTIME`` read by the writer right after ``execute``) to the moment the Delta
commit that first holds its rows became visible, i.e. the modification time of that
commit's ``_delta_log/<version>.json`` (a Delta reader sees a version once that file
exists).  Which commit first holds a row is read from the log alone, after the run, so the
measurement does not load the machine while it runs: ids only grow (inserts only), and each
commit's ``add`` actions carry the maximum ``id`` of the files they add (Delta's per-file
statistics, under the column's physical name: column mapping).  The first ``--warmup``
seconds are left out.  With ``--latency-tables N`` the transactions go to ``N`` tables in turn
(``bench.latency_0`` ... ``bench.latency_<N-1>``, the same columns), so each micro-batch
touches many tables; each transaction is matched to the commits of its own table's lake table.

**Tables** (``--tables``).  The same ``--events`` change events (four fifths inserts, then
updates of a quarter of the rows, one transaction per table and step) spread over each of
``--table-counts`` tables (``tbl<N>.t0`` ... ``tbl<N>.t<N-1>``, bigint key, int, text,
numeric, each count in its own schema, slot and topic prefix), all captured first.  Then, per
table count, a fresh query (new lake and checkpoint, the ``availableNow`` trigger and
``pgcdc spark``'s default ``maxOffsetsPerTrigger``) drains its prefix: the wall time from
``start()`` to the query's end, its ratio to the time for 1 table, and events/s; once per
``--threads`` value (tables applied at once; 1 is the one-after-the-other apply of before).
Each lake table is checked against its source (row count and sum of ids and values).  An
unmeasured run of the smallest count warms the JVM first.

Targets (2-core machine): catch-up >= 25,000 events/s; latency p50 <= 5 s, p99 <= 15 s;
tables: drain time with 100 tables <= 2x that with 1 table, with 500 tables <= 4x.

From the repository root::

    python -m bench.spark_bench                      # both parts, defaults below
    python -m bench.spark_bench --catchup --rows 200000 --batch-sizes 10000 50000 200000
    python -m bench.spark_bench --latency --seconds 120 --rate 1000
    python -m bench.spark_bench --latency --rate 1000 --rows-per-txn 1 --latency-tables 100
    python -m bench.spark_bench --tables --events 20000 --table-counts 1 10 100
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

# the same latency table and publication, and the same percentile
from bench.kafka_latency_bench import DDL as LATENCY_DDL
from bench.kafka_latency_bench import percentile
from core import wire
from decoder.slot import current_wal_lsn
from pgcdc.pipeline import Pipeline, PipelineConfig
from pgcdc.services.kafka import KafkaBroker
from pgcdc.services.postgres import PostgresServer
from sinks.avro_logical import LogicalTypes
from sinks.kafka import KafkaSink
from streaming import job
from streaming.apply import APPLY_THREADS

log = logging.getLogger("bench.spark_bench")

REPO = Path(__file__).resolve().parent.parent
TARGET_EVENTS_PER_S = 25_000
TARGET_P50_S = 5.0
TARGET_P99_S = 15.0
TARGET_TABLE_RATIOS = {100: 2.0, 500: 4.0}  # drain time at N tables / at 1 table, at most

ORDERS_DDL = """
CREATE SCHEMA IF NOT EXISTS bench;
CREATE TABLE bench.orders (
    id bigint PRIMARY KEY,
    customer int NOT NULL,
    amount numeric(12, 2) NOT NULL,
    status text NOT NULL,
    note text,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE PUBLICATION orders_pub FOR TABLE bench.orders;
"""


def _machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "load_average": [round(v, 2) for v in os.getloadavg()]}


def _event_log(args: argparse.Namespace) -> dict[str, str]:
    if args.event_log is None:
        return {}
    args.event_log.mkdir(parents=True, exist_ok=True)
    return {"spark.eventLog.enabled": "true", "spark.eventLog.dir": args.event_log.as_uri(),
            "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false"}


# --- catch-up ---------------------------------------------------------------------------------


def _fill(dsn: str, rows: int) -> None:
    """The reference workload: inserts, then updates of 30 % and deletes of 5 % of the rows."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for low in range(1, rows + 1, 1000):
            high = min(rows, low + 999)
            conn.execute("INSERT INTO bench.orders (id, customer, amount, status, note) "
                         "SELECT g, g %% 997, (g %% 100000) / 100.0, 'new', 'order ' || g "
                         "FROM generate_series(%s::bigint, %s::bigint) g", (low, high))
        for low in range(1, rows + 1, 1000 * 10 // 3):  # 1,000 of every 3,333 ids
            conn.execute("UPDATE bench.orders SET status = 'paid', amount = amount + 1, "
                         "updated_at = clock_timestamp() WHERE id BETWEEN %s AND %s",
                         (low, low + 999))
        for low in range(1, rows + 1, 20_000):  # 1,000 of every 20,000 ids
            conn.execute("DELETE FROM bench.orders WHERE id BETWEEN %s AND %s",
                         (low + 500, low + 1499))


def _topic_events(spark: Any, servers: str, topic: str) -> tuple[int, int]:
    """(change events, records including Kafka tombstones) in a topic."""
    frame = (spark.read.format("kafka").option("kafka.bootstrap.servers", servers)
             .option("subscribe", topic).option("startingOffsets", "earliest").load())
    row = frame.selectExpr("count(value) AS events", "count(*) AS records").collect()[0]
    return int(row["events"]), int(row["records"])


def jobs_by_step(event_log: Path) -> list[dict[str, Any]]:
    """Per Spark job of an event log (``spark.eventLog.enabled``): its description (the
    apply's step, :class:`streaming.apply.Steps`, or Delta's own), wall time, stages, tasks."""
    jobs: dict[int, dict[str, Any]] = {}
    stages: dict[int, int] = {}
    for path in sorted(p for p in event_log.rglob("*") if p.is_file()
                       and not p.name.startswith((".", "appstatus"))):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            kind = event.get("Event")
            if kind == "SparkListenerJobStart":
                properties = event.get("Properties") or {}
                jobs[event["Job ID"]] = {
                    "job": event["Job ID"],
                    "description": properties.get("spark.job.description")
                    or properties.get("callSite.short", "?"),
                    "start_ms": event["Submission Time"],
                    "stage_ids": [s["Stage ID"] for s in event["Stage Infos"]],
                }
            elif kind == "SparkListenerJobEnd" and event["Job ID"] in jobs:
                jobs[event["Job ID"]]["end_ms"] = event["Completion Time"]
            elif kind == "SparkListenerStageCompleted":
                info = event["Stage Info"]
                if "Submission Time" in info:  # skipped stages never ran
                    stages[info["Stage ID"]] = info["Number of Tasks"]
    out = []
    for job_ in sorted(jobs.values(), key=lambda j: int(j["job"])):
        ran = [stages[s] for s in job_.pop("stage_ids") if s in stages]
        job_.update(stages=len(ran), tasks=sum(ran),
                    seconds=round((job_.get("end_ms", job_["start_ms"]) - job_["start_ms"])
                                  / 1000, 3))
        out.append(job_)
    return out


def _run_catchup(spark: Any, servers: str, prefix: str, batch_size: int,
                 root: Path) -> dict[str, Any]:
    lake, checkpoint = root / "lake", root / "cp"
    config = job.JobConfig(servers, lake.as_uri(), checkpoint.as_uri(), topic_prefix=prefix,
                           trigger_seconds=None, max_offsets_per_trigger=batch_size)
    batches: list[tuple[int, float, int]] = []

    def on_batch(batch_id: int, applied: dict[str, int]) -> None:
        batches.append((batch_id, time.monotonic(), sum(applied.values())))

    start = time.monotonic()
    query = job.start(spark, config, on_batch)
    query.awaitTermination(3600)
    elapsed = time.monotonic() - start
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    frame = spark.read.format("delta").load(f"{lake.as_uri()}/bench.orders")
    row = frame.selectExpr("count(*) AS n", "sum(id) AS s").collect()[0]
    return {"batch_size": batch_size, "batches": len(batches), "seconds": round(elapsed, 1),
            "lake_rows": int(row["n"]), "lake_id_sum": int(row["s"] or 0), **_jvm_memory(spark)}


def _jvm_memory(spark: Any) -> dict[str, int]:
    """The driver JVM's peak resident memory so far (``VmHWM``: with ``--no-warm`` and one
    batch size, the run's) and its heap bound (``spark.driver.memory``), MiB."""
    jvm = spark.sparkContext._jvm  # noqa: SLF001 - py4j's gateway, pyspark's only handle
    pid = int(jvm.java.lang.ProcessHandle.current().pid())
    status = Path(f"/proc/{pid}/status").read_text()
    peak = next(int(line.split()[1]) for line in status.splitlines()
                if line.startswith("VmHWM:"))
    heap = int(jvm.java.lang.Runtime.getRuntime().maxMemory())
    return {"jvm_peak_rss_mib": peak // 1024, "jvm_max_heap_mib": heap // (1024 * 1024)}


def catchup(args: argparse.Namespace) -> dict[str, Any]:
    from streaming.session import build_session

    with PostgresServer(settings={"fsync": "off"}) as server, KafkaBroker() as broker, \
            tempfile.TemporaryDirectory() as tmp:
        dsn = server.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(ORDERS_DDL)
        prefix = "bench"
        sink = _sink(broker.bootstrap_servers, prefix, dsn, args.avro_types)
        pipeline = Pipeline(PipelineConfig(dsn, slot="orders", publication="orders_pub",
                                           tables=["bench.orders"], create_publication=False),
                            sink)
        pipeline.prepare()  # the slot first, so that the workload is in it
        started = time.monotonic()
        _fill(dsn, args.rows)
        with psycopg.connect(dsn, autocommit=True) as conn:
            until = current_wal_lsn(conn)
        pipeline.run(until_lsn=until)
        sink.close()
        log.info("workload captured in %.1f s", time.monotonic() - started)
        with psycopg.connect(dsn, autocommit=True) as conn:
            source = conn.execute("SELECT count(*), sum(id) FROM bench.orders").fetchone()
        assert source is not None
        spark = build_session("pgcdc-bench", extra_config=_event_log(args))
        try:
            events, records = _topic_events(spark, broker.bootstrap_servers, "bench.bench.orders")
            runs = []
            if args.warm:
                log.info("warm-up run (not measured)")
                _run_catchup(spark, broker.bootstrap_servers, prefix, max(args.batch_sizes),
                             Path(tmp) / "warm")
            for i, size in enumerate(args.batch_sizes):  # a size may repeat: own folders
                load_before = os.getloadavg()[0]
                run = _run_catchup(spark, broker.bootstrap_servers, prefix, size,
                                   Path(tmp) / f"run{i}-{size}")
                run["events_per_s"] = round(events / run["seconds"])
                run["equal_to_source"] = (run["lake_rows"], run["lake_id_sum"]) == (
                    int(source[0]), int(source[1] or 0))
                run["load_average_1m_before"] = round(load_before, 2)
                log.info("catch-up %s", run)
                runs.append(run)
        finally:
            spark.stop()
    return {"rows": args.rows, "events": events, "kafka_records": records, "runs": runs,
            **_machine()}


# --- tables -----------------------------------------------------------------------------------


def _fill_tables(dsn: str, schema: str, tables: int, events: int) -> tuple[int, int]:
    """``events`` changes over ``tables`` tables: 4/5 inserts, then updates of a quarter of
    the rows; returns (rows, changes)."""
    rows = max(1, events * 4 // 5 // tables)
    updated = max(1, rows // 4)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(tables):
            conn.execute(f"INSERT INTO {schema}.t{i} (id, n, label, amount) "
                         "SELECT g, g, 'row ' || g, g / 100.0 "
                         "FROM generate_series(1, %s::bigint) g", (rows,))
        for i in range(tables):
            conn.execute(f"UPDATE {schema}.t{i} SET n = n + 1, label = 'updated' "
                         "WHERE id <= %s", (updated,))
    return rows * tables, (rows + updated) * tables


def _sink(servers: str, prefix: str, dsn: str, avro_types: str) -> KafkaSink:
    """The Avro sink, with typed values (``--avro-types logical``) or text ones."""
    logical = LogicalTypes.reading(dsn) if avro_types == wire.AVRO_TYPES_LOGICAL else None
    return KafkaSink(servers, topic_prefix=prefix, logical=logical)


def _prepare_tables(dsn: str, servers: str, count: int, events: int,
                    avro_types: str = wire.AVRO_TYPES_TEXT) -> dict[str, Any]:
    """Schema ``tbl<count>`` with ``count`` tables, its workload captured under the topic
    prefix ``tbl<count>``."""
    schema = f"tbl{count}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        for i in range(count):
            conn.execute(f"CREATE TABLE {schema}.t{i} (id bigint PRIMARY KEY, n int NOT NULL, "
                         "label text, amount numeric(12, 2))")
        conn.execute(f"CREATE PUBLICATION {schema}_pub FOR TABLES IN SCHEMA {schema}")
    sink = _sink(servers, schema, dsn, avro_types)
    pipeline = Pipeline(PipelineConfig(dsn, slot=schema, publication=f"{schema}_pub",
                                       create_publication=False), sink)
    pipeline.prepare()
    rows, changes = _fill_tables(dsn, schema, count, events)
    with psycopg.connect(dsn, autocommit=True) as conn:
        until = current_wal_lsn(conn)
        source = conn.execute(
            "SELECT count(*), sum(id + n), sum(amount) FROM (" + " UNION ALL ".join(
                f"SELECT id, n, amount FROM {schema}.t{i}" for i in range(count))
            + ") s").fetchone()
    pipeline.run(until_lsn=until)
    sink.close()
    assert source is not None
    return {"tables": count, "schema": schema, "rows": rows, "events": changes,
            "source": (int(source[0]), int(source[1]), str(source[2]))}


def _run_tables(spark: Any, servers: str, setup: dict[str, Any], root: Path,
                max_offsets: int | None, threads: int) -> dict[str, Any]:
    lake, checkpoint = root / "lake", root / "cp"
    config = job.JobConfig(servers, lake.as_uri(), checkpoint.as_uri(),
                           topic_prefix=setup["schema"], trigger_seconds=None,
                           max_offsets_per_trigger=max_offsets, apply_threads=threads)
    batches: list[int] = []
    start = time.monotonic()
    query = job.start(spark, config, lambda batch_id, applied: batches.append(batch_id))
    query.awaitTermination(7200)
    elapsed = time.monotonic() - start
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    frames = [spark.read.format("delta").load(f"{lake.as_uri()}/{setup['schema']}.t{i}")
              for i in range(setup["tables"])]
    whole = frames[0]
    for frame in frames[1:]:
        whole = whole.unionByName(frame)
    row = whole.selectExpr("count(*) AS c", "sum(id + n) AS s",
                           "CAST(sum(amount) AS STRING) AS a").collect()[0]
    lake_sums = (int(row["c"]), int(row["s"] or 0), str(row["a"]))
    return {"tables": setup["tables"], "threads": threads, "events": setup["events"],
            "batches": len(batches),
            "seconds": round(elapsed, 1),
            "events_per_s": round(setup["events"] / elapsed),
            "equal_to_source": lake_sums == setup["source"]}


def tables(args: argparse.Namespace) -> dict[str, Any]:
    from streaming.session import build_session

    with PostgresServer(settings={"fsync": "off", "max_replication_slots": "20",
                                  "max_wal_senders": "20"}) as server, \
            KafkaBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        dsn = server.dsn()
        counts = sorted(set(args.table_counts))
        setups = {}
        for count in counts:
            started = time.monotonic()
            setups[count] = _prepare_tables(dsn, broker.bootstrap_servers, count, args.events,
                                            args.avro_types)
            log.info("%d tables: %d events captured in %.1f s", count,
                     setups[count]["events"], time.monotonic() - started)
        spark = build_session("pgcdc-bench", extra_config=_event_log(args))
        max_offsets = args.max_offsets if args.max_offsets else job.DEFAULT_MAX_OFFSETS
        try:
            if args.warm:
                log.info("warm-up run (not measured)")
                _run_tables(spark, broker.bootstrap_servers, setups[counts[0]],
                            Path(tmp) / "warm", max_offsets, args.threads[-1])
            runs = []
            for threads in args.threads:
                for count in counts:
                    load_before = os.getloadavg()[0]
                    run = _run_tables(spark, broker.bootstrap_servers, setups[count],
                                      Path(tmp) / f"tables{count}-{threads}", max_offsets,
                                      threads)
                    run["load_average_1m_before"] = round(load_before, 2)
                    log.info("tables %s", run)
                    runs.append(run)
        finally:
            spark.stop()
    for run in runs:
        base = next((r["seconds"] for r in runs if r["tables"] == 1
                     and r["threads"] == run["threads"]), runs[0]["seconds"])
        run["ratio_to_1_table"] = round(run["seconds"] / base, 2)
    return {"events": args.events, "max_offsets_per_trigger": max_offsets, "runs": runs,
            **_machine()}


# --- latency ----------------------------------------------------------------------------------


def latency_tables(count: int) -> list[str]:
    """The latency run's tables in schema ``bench``: one, or ``count`` written in turn."""
    return ["latency"] if count <= 1 else [f"latency_{i}" for i in range(count)]


def run_writer(dsn: str, rate: float, rows_per_txn: int, seconds: float, out: Path,
               tables: int = 1) -> int:
    """Insert ``rate`` rows/s in transactions of ``rows_per_txn``, the transactions going to
    the ``tables`` tables in turn; write (table index, last id, ns) triples."""
    names = latency_tables(tables)
    per_second = rate / rows_per_txn
    total = round(per_second * seconds)
    interval_ns = round(1e9 / per_second)
    commits: list[tuple[int, int, int]] = []
    late = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT 1")
        start = time.monotonic_ns() + 50_000_000
        for i in range(total):
            due = start + i * interval_ns
            wait = due - time.monotonic_ns()
            if wait > 0:
                time.sleep(wait / 1e9)
            elif wait < -interval_ns:
                late += 1
            low, high = i * rows_per_txn + 1, (i + 1) * rows_per_txn
            table = i % len(names)
            conn.execute(f"INSERT INTO bench.{names[table]} (id, amount, label) "
                         "SELECT g, g * 1.25, 'row ' || g "
                         "FROM generate_series(%s::bigint, %s::bigint) g", (low, high),
                         prepare=True)
            commits.append((table, high, time.time_ns()))
        elapsed = (time.monotonic_ns() - start) / 1e9
    with out.open("w") as fh:
        json.dump({"commits": commits, "elapsed": elapsed, "late": late}, fh)
    return 0


def visible_times(table: Path) -> list[tuple[int, int]]:
    """Per Delta commit that added rows, in version order: (max id added, file mtime ns)."""
    physical = "id"
    out: list[tuple[int, int]] = []
    logs = sorted((table / "_delta_log").glob("*.json"), key=lambda p: int(p.stem))
    for path in logs:
        newest = -1
        for line in path.read_text().splitlines():
            action = json.loads(line)
            if "metaData" in action:
                for field in json.loads(action["metaData"]["schemaString"])["fields"]:
                    if field["name"] == "id":
                        physical = field.get("metadata", {}).get(
                            "delta.columnMapping.physicalName", "id")
            if "add" in action and action["add"].get("stats"):
                stats = json.loads(action["add"]["stats"])
                value = stats.get("maxValues", {}).get(physical)
                if value is not None:
                    newest = max(newest, int(value))
        if newest >= 0:
            out.append((newest, path.stat().st_mtime_ns))
    return out


def _stream(dsn: str, servers: str, stop: Any, ready: Any, tables: list[str]) -> None:
    """The pipeline process of the latency run: stream until ``stop`` is set."""
    sink = KafkaSink(servers, topic_prefix="lat")
    pipeline = Pipeline(PipelineConfig(dsn, slot="latency", publication="latency_pub",
                                       tables=[f"bench.{t}" for t in tables],
                                       create_publication=False), sink)
    pipeline.prepare()
    ready.set()
    pipeline.run(stop=stop)
    sink.close()


def latency(args: argparse.Namespace) -> dict[str, Any]:
    from streaming.session import build_session

    with PostgresServer(settings={"fsync": "off"}) as server, KafkaBroker() as broker, \
            tempfile.TemporaryDirectory() as tmp:
        dsn = server.dsn()
        names = latency_tables(args.latency_tables)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(LATENCY_DDL)
            for name in names if len(names) > 1 else []:
                conn.execute(f"CREATE TABLE bench.{name} (LIKE bench.latency INCLUDING ALL)")
                conn.execute(f"ALTER PUBLICATION latency_pub ADD TABLE bench.{name}")
        # the pipeline in its own process: the driver's Python (foreachBatch) has the GIL here
        context = multiprocessing.get_context("spawn")
        stop, ready = context.Event(), context.Event()
        runner = context.Process(target=_stream, name="pipeline", daemon=True,
                                 args=(dsn, broker.bootstrap_servers, stop, ready, names))
        runner.start()
        if not ready.wait(120):
            msg = "the pipeline process did not create its slot within 120 s"
            raise RuntimeError(msg)
        failure: list[BaseException] = []
        # the catalog and the topics exist before the query starts
        with psycopg.connect(dsn, autocommit=True) as conn:
            for name in names:
                conn.execute(f"INSERT INTO bench.{name} (id, amount, label) "
                             "VALUES (0, 0, 'first')")
        spark = build_session("pgcdc-bench", extra_config=_event_log(args))
        lake = Path(tmp) / "lake"
        config = job.JobConfig(broker.bootstrap_servers, lake.as_uri(),
                               (Path(tmp) / "cp").as_uri(), topic_prefix="lat",
                               trigger_seconds=args.trigger, optimize_every=args.optimize_every)
        query = job.start(spark, config)
        paths = [lake / f"bench.{name}" for name in names]
        try:
            deadline = time.monotonic() + 300 + 10 * len(names)
            while not all((p / "_delta_log").exists() for p in paths) \
                    and time.monotonic() < deadline:
                time.sleep(0.5)  # the first rows are in the lake: the query is warm
            out = Path(tmp) / "commits.json"
            argv = [sys.executable, "-m", "bench.spark_bench", "--writer", str(out),
                    "--dsn", dsn, "--rate", str(args.rate), "--rows-per-txn",
                    str(args.rows_per_txn), "--seconds", str(args.seconds),
                    "--latency-tables", str(len(names))]
            load_before = os.getloadavg()
            subprocess.run(argv, cwd=REPO, check=True)
            written = json.loads(out.read_text())
            # per table not visible to its end yet, its last id (a table's log is read
            # again only until its last transaction is in it)
            pending = {t: h for t, h, _ in written["commits"]}
            deadline = time.monotonic() + 120 + 10 * len(names)
            while pending and time.monotonic() < deadline and runner.is_alive():
                pending = {t: high for t, high in pending.items()
                           if not (seen := visible_times(paths[t])) or seen[-1][0] < high}
                if pending:
                    time.sleep(1.0)
            load_after = os.getloadavg()
        finally:
            query.stop()
            spark.stop()
            stop.set()
            runner.join(30)
        if runner.exitcode not in (0, None):
            failure.append(RuntimeError(f"the pipeline process exited with {runner.exitcode}"))
        if failure:
            raise failure[0]
        seen = [visible_times(p) for p in paths]
    commits = [(int(t), int(i), int(ns)) for t, i, ns in written["commits"]]
    warm = commits[0][2] + int(args.warmup * 1e9)
    latencies: list[float] = []
    missing = 0
    positions = [0] * len(paths)  # per table, its first commit not before the transaction
    for table, high, committed in commits:
        log_, position = seen[table], positions[table]
        while position < len(log_) and log_[position][0] < high:
            position += 1
        positions[table] = position
        if position == len(log_):
            missing += 1
            continue
        if committed >= warm:
            latencies.append((log_[position][1] - committed) / 1e9)
    latencies.sort()
    if not latencies:
        msg = "no transaction became visible in the lake"
        raise RuntimeError(msg)
    return {
        "rate_rows_per_s": args.rate, "rows_per_txn": args.rows_per_txn,
        "tables": len(paths),
        "trigger_s": args.trigger, "seconds": args.seconds,
        "optimize_every": args.optimize_every,
        "achieved_rows_per_s": round(len(commits) * args.rows_per_txn / written["elapsed"], 1),
        "late_commits": written["late"], "transactions": len(commits),
        "measured": len(latencies), "never_visible": missing,
        "delta_commits": sum(len(log_) for log_ in seen),
        "p50_s": round(percentile(latencies, 50), 2), "p90_s": round(percentile(latencies, 90), 2),
        "p99_s": round(percentile(latencies, 99), 2), "max_s": round(latencies[-1], 2),
        "mean_s": round(statistics.fmean(latencies), 2),
        "load_average_before": [round(v, 2) for v in load_before],
        "load_average_after": [round(v, 2) for v in load_after], **_machine(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--catchup", action="store_true", help="only the catch-up part")
    parser.add_argument("--latency", action="store_true", help="only the latency part")
    parser.add_argument("--tables", action="store_true",
                        help="only the tables part: one drain per table count")
    parser.add_argument("--events", type=int, default=20_000,
                        help="tables: change events, spread over each table count")
    parser.add_argument("--table-counts", type=int, nargs="+", default=[1, 10, 100],
                        help="tables: the table counts")
    parser.add_argument("--max-offsets", type=int, default=None,
                        help="tables: maxOffsetsPerTrigger (default: pgcdc spark's)")
    parser.add_argument("--threads", type=int, nargs="+", default=[APPLY_THREADS],
                        help="tables: tables applied at once (1: one after the other), each "
                             "value a series of runs")
    parser.add_argument("--avro-types", choices=(wire.AVRO_TYPES_TEXT, wire.AVRO_TYPES_LOGICAL),
                        default=wire.AVRO_TYPES_TEXT,
                        help="catch-up and tables: the Avro values' types (pgcdc run "
                             "--avro-types): text (the default) or logical")
    parser.add_argument("--rows", type=int, default=200_000, help="catch-up: rows inserted")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[10_000, 50_000, 200_000],
                        help="catch-up: maxOffsetsPerTrigger values")
    parser.add_argument("--no-warm", dest="warm", action="store_false",
                        help="catch-up: no unmeasured warm-up run")
    parser.add_argument("--rate", type=float, default=1000.0, help="latency: rows per second")
    parser.add_argument("--rows-per-txn", type=int, default=10, help="latency: rows per commit")
    parser.add_argument("--seconds", type=float, default=120.0, help="latency: how long to write")
    parser.add_argument("--warmup", type=float, default=15.0,
                        help="latency: seconds at the start left out of the percentiles")
    parser.add_argument("--trigger", type=float, default=1.0, help="latency: trigger, seconds")
    parser.add_argument("--latency-tables", type=int, default=1,
                        help="latency: tables the transactions go to in turn")
    parser.add_argument("--optimize-every", type=int, default=None,
                        help="latency: compact the table every N micro-batches")
    parser.add_argument("--event-log", type=Path,
                        help="write Spark's event log here and print the jobs per step")
    parser.add_argument("--writer", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--dsn", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("py4j", "kafka", "streaming"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.event_log is not None:  # the per-batch step times too
        logging.getLogger("streaming.job").setLevel(logging.INFO)
    if args.writer is not None:
        return run_writer(args.dsn, args.rate, args.rows_per_txn, args.seconds, args.writer,
                          args.latency_tables)
    if args.tables:
        report = tables(args)
        for run in report["runs"]:
            target = TARGET_TABLE_RATIOS.get(run["tables"])
            met = target is not None and run["ratio_to_1_table"] <= target
            verdict = "" if target is None else (
                f"; target <= {target}x {'met' if met else 'NOT met'}")
            print(f"{run['events']:,} events over {run['tables']} table(s), {run['threads']} "
                  f"thread(s): {run['seconds']} s "
                  f"({run['batches']} batches) = {run['events_per_s']:,} events/s, "
                  f"{run['ratio_to_1_table']}x the time for 1 table, lake equal: "
                  f"{run['equal_to_source']}{verdict}")
        print(json.dumps({"tables": report}))
        if args.event_log is not None:
            for job_ in jobs_by_step(args.event_log):
                print(json.dumps(job_))
        return 0
    both = not args.catchup and not args.latency
    if args.catchup or both:
        report = catchup(args)
        for run in report["runs"]:
            verdict = "met" if run["events_per_s"] >= TARGET_EVENTS_PER_S else "NOT met"
            print(f"catch-up maxOffsetsPerTrigger={run['batch_size']:,}: {report['events']:,} "
                  f"events in {run['seconds']} s ({run['batches']} batches) = "
                  f"{run['events_per_s']:,} events/s, lake equal: {run['equal_to_source']}; "
                  f"target >= {TARGET_EVENTS_PER_S:,} {verdict}")
        print(json.dumps({"catchup": report}))
    if args.latency or both:
        report = latency(args)
        verdict = ("met" if report["p50_s"] <= TARGET_P50_S and report["p99_s"] <= TARGET_P99_S
                   else "NOT met")
        print(f"commit -> lake at {report['achieved_rows_per_s']:,} rows/s over "
              f"{report['tables']} table(s), trigger "
              f"{report['trigger_s']} s: p50 {report['p50_s']} s, p90 {report['p90_s']} s, "
              f"p99 {report['p99_s']} s, max {report['max_s']} s ({report['measured']} "
              f"transactions); target p50 <= {TARGET_P50_S} s, p99 <= {TARGET_P99_S} s "
              f"{verdict}")
        print(json.dumps({"latency": report}))
    if args.event_log is not None:
        for job_ in jobs_by_step(args.event_log):
            print(json.dumps(job_))
    return 0


if __name__ == "__main__":
    sys.exit(main())
