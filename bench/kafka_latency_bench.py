"""Commit -> Kafka acknowledgement latency at a steady rate of single-row transactions.

One throwaway PostgreSQL (``pgcdc.services.postgres``) and one throwaway Kafka broker
(``pgcdc.services.kafka``); pgcdc's :class:`Pipeline` streams into :class:`KafkaSink`
(Avro by default) in this process.  A writer in a child process (``--writer``, so it
does not share the pipeline's GIL) inserts one row per transaction at a fixed rate
(1,000/s by default, each transaction an autocommitted ``INSERT``, paced against an
absolute schedule so a late one does not shift the others) for ``--seconds``.

What is measured, per transaction: from the moment the client's COMMIT returns (the
writer reads ``CLOCK_MONOTONIC`` right after ``execute`` returns) to the moment the
delivery callback of its change event runs in the pipeline's process (the same clock,
which is system-wide on Linux).  The two are joined on the row's ``id``: the writer
records ``id -> commit time``, the sink reads ``id`` from the event's after-image when it
produces the message and stamps the delivery time in the callback.  Delivery callbacks run
when the pipeline polls the producer, so the figure is the latency the pipeline itself
observes, what it could flush to the slot at the earliest.  The first ``--warmup``
seconds are left out of the percentiles.

The throwaway server runs with ``fsync=off`` (as bench/decoder_bench.py) so that the
writer's 1,000 commits/s do not wait on this machine's disk; logical decoding and the
walsender behave the same.

From the repository root::

    python -m bench.kafka_latency_bench                        # 1,000 tx/s for 30 s, Avro
    python -m bench.kafka_latency_bench --rate 500 --seconds 10 --format json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from decoder.change import ChangeEvent
from pgcdc.pipeline import Pipeline, PipelineConfig
from pgcdc.services.kafka import KafkaBroker
from pgcdc.services.postgres import PostgresServer
from sinks.kafka import KafkaSink

log = logging.getLogger("bench.kafka_latency_bench")

REPO = Path(__file__).resolve().parent.parent
TARGET_P99_MS = 100.0
DDL = """
CREATE SCHEMA bench;
CREATE TABLE bench.latency (
    id bigint PRIMARY KEY,
    amount numeric(12, 2) NOT NULL,
    label text NOT NULL,
    written_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE PUBLICATION latency_pub FOR TABLE bench.latency;
"""
INSERT = "INSERT INTO bench.latency (id, amount, label) VALUES (%s, %s, %s)"


def now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


# --- the writer (child process) -------------------------------------------------------------


def run_writer(dsn: str, rate: float, seconds: float, out: Path) -> int:
    """Insert ``rate * seconds`` single-row transactions on schedule; write ``id ns`` lines."""
    total = round(rate * seconds)
    interval_ns = round(1e9 / rate)
    commits: list[tuple[int, int]] = []
    late = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT 1")
        start = now_ns() + 50_000_000
        for i in range(1, total + 1):
            due = start + (i - 1) * interval_ns
            wait = due - now_ns()
            if wait > 0:
                time.sleep(wait / 1e9)
            elif wait < -interval_ns:
                late += 1
            conn.execute(INSERT, (i, i * 1.25, f"row {i}"), prepare=True)
            commits.append((i, now_ns()))
        elapsed = (now_ns() - start) / 1e9
    with out.open("w") as fh:
        json.dump({"commits": commits, "elapsed": elapsed, "late": late}, fh)
    return 0


# --- the sink that stamps delivery times ----------------------------------------------------


class _TimedProducer:
    """Wraps the sink's producer: each delivery callback first records when it ran.

    ``produce`` takes what confluent-kafka's ``Producer.produce`` takes, positionally (topic,
    value, key, partition, callback, on_delivery, timestamp, headers: how the sink calls it)
    or by keyword (how it publishes table versions)."""

    def __init__(self, inner: Any, acks: dict[int, int]) -> None:
        self._inner = inner
        self._acks = acks
        self.current: int | None = None  # the id of the row whose messages are being produced

    def produce(self, topic: str, value: Any = None, key: Any = None, partition: int = -1,
                callback: Any = None, on_delivery: Any = None, timestamp: int = 0,
                headers: Any = None) -> None:
        ident, acks = self.current, self._acks
        report = on_delivery if on_delivery is not None else callback

        def delivered(err: Any, msg: Any) -> None:
            if err is None and ident is not None and value is not None:
                acks.setdefault(ident, now_ns())
            if report is not None:
                report(err, msg)

        self._inner.produce(topic, value, key, partition, delivered, None, timestamp,
                            headers if headers is not None else [])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class TimedKafkaSink(KafkaSink):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.acks: dict[int, int] = {}
        self._timed = _TimedProducer(self._producer, self.acks)
        self._producer = self._timed  # type: ignore[assignment]

    def write(self, event: ChangeEvent) -> None:
        row = event.after
        self._timed.current = int(row["id"]) if row is not None and "id" in row else None
        super().write(event)

    def reset(self) -> None:  # a recreated producer would not be timed
        msg = "the producer was reset during the measurement"
        raise RuntimeError(msg)


# --- the measurement ------------------------------------------------------------------------


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    index = max(0, min(len(sorted_values) - 1, round(q / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[index]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(PostgresServer(settings={"fsync": "off"}))
        servers = args.bootstrap_servers or \
            stack.enter_context(KafkaBroker()).bootstrap_servers
        return _measure(args, server.dsn(), servers)


def _measure(args: argparse.Namespace, dsn: str, servers: str) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(DDL)
    sink = TimedKafkaSink(servers, topic_prefix=f"latency{os.getpid()}",
                          value_format=args.format)
    pipeline = Pipeline(PipelineConfig(dsn, slot="latency", publication="latency_pub",
                                       tables=["bench.latency"], create_publication=False),
                        sink)
    pipeline.prepare()
    stop = threading.Event()
    failure: list[BaseException] = []

    def stream() -> None:
        try:
            pipeline.run(stop=stop)
        except BaseException as exc:  # reported below
            failure.append(exc)

    runner = threading.Thread(target=stream, name="pipeline", daemon=True)
    runner.start()
    time.sleep(0.5 if args.smoke else 2.0)  # the session is up and idle before the first
    # commit
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "commits.json"
        argv = [sys.executable, "-m", "bench.kafka_latency_bench", "--writer", str(out),
                "--dsn", dsn, "--rate", str(args.rate), "--seconds", str(args.seconds)]
        log.info("writer: %s", " ".join(argv))
        cpu_before = os.times()
        subprocess.run(argv, cwd=REPO, check=True)
        written = json.loads(out.read_text())
    commits: dict[int, int] = dict(written["commits"])
    deadline = time.monotonic() + 60
    while len(sink.acks) < len(commits) and time.monotonic() < deadline and not failure:
        time.sleep(0.1)
    cpu_after = os.times()
    stop.set()
    runner.join(30)
    sink.close()
    if failure:
        raise failure[0]
    first = min(commits.values())
    warm = first + int(args.warmup * 1e9)
    latencies = sorted((sink.acks[i] - t) / 1e6 for i, t in commits.items()
                       if i in sink.acks and t >= warm)
    missing = sum(1 for i in commits if i not in sink.acks)
    if not latencies:
        msg = "no transaction was acknowledged"
        raise RuntimeError(msg)
    return {
        "format": args.format,
        "target_rate": args.rate,
        "achieved_rate": round(len(commits) / written["elapsed"], 1),
        "transactions": len(commits),
        "late_commits": written["late"],
        "measured": len(latencies),
        "unacknowledged": missing,
        "p50_ms": round(percentile(latencies, 50), 2),
        "p90_ms": round(percentile(latencies, 90), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
        "p999_ms": round(percentile(latencies, 99.9), 2),
        "max_ms": round(latencies[-1], 2),
        "mean_ms": round(statistics.fmean(latencies), 2),
        "pipeline_process_cpu_s": round((cpu_after.user - cpu_before.user)
                                        + (cpu_after.system - cpu_before.system), 1),
        "cpus": os.cpu_count(),
        "load_average": [round(v, 2) for v in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="transactions per second")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to write")
    parser.add_argument("--warmup", type=float, default=2.0,
                        help="seconds at the start left out of the percentiles")
    parser.add_argument("--format", choices=["avro", "json"], default="avro")
    parser.add_argument("--bootstrap-servers",
                        help="an existing Kafka (default: a throwaway broker)")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run that only shows the benchmark still works (CI): "
                             "50 tx/s for 2 s, no warm-up; its figures mean nothing")
    parser.add_argument("--writer", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--dsn", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.rate, args.seconds, args.warmup = 50.0, 2.0, 0.0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.writer is not None:
        return run_writer(args.dsn, args.rate, args.seconds, args.writer)
    report = measure(args)
    verdict = "met" if report["p99_ms"] <= TARGET_P99_MS else "NOT met"
    print(f"{report['transactions']:,} transactions at {report['achieved_rate']:,}/s "
          f"(target {report['target_rate']:,.0f}/s), {report['format']}: "
          f"p50 {report['p50_ms']} ms, p90 {report['p90_ms']} ms, p99 {report['p99_ms']} ms, "
          f"p99.9 {report['p999_ms']} ms, max {report['max_ms']} ms; "
          f"target p99 <= {TARGET_P99_MS:.0f} ms {verdict}")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
