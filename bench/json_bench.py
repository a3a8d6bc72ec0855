"""JSON against Avro, events/s: the encoders alone, the sink streaming, the initial load.

The decoder benchmark's row (``bench.decoder_bench``: bigint key, ``numeric(12,2)``,
``timestamptz``, ``text``, ``jsonb``, ``integer[]``, an enum), decoded from the server's
text by pgcdc's decoders, ``--events`` distinct rows as insert events (``c``, streaming) and
as read events (``r``, the initial load's slow path); each encoder's ``encoder_for`` (what
``KafkaSink`` calls per event) encodes them all, ``--rounds`` times, in this one process,
and the best round counts.  Reported: events/s of each encoder, and each JSON one as a
ratio of Avro's (the figures in docs/benchmarks.md, "JSON against Avro").  No Kafka, no
PostgreSQL: the encoders' own cost, which is what differs between the formats (the
initial load's compiled COPY-to-Kafka path, sinks/loadfast.py, is measured below).

With ``--kafka`` also, against a throwaway PostgreSQL and Kafka broker (pgcdc.services):

* streaming: the decoder benchmark's workload (``bench.decoder_bench``, ``--scale``)
  decoded once by a pipeline into memory (``bench.kafka_sink_bench.Recorder``), then given
  to a fresh ``KafkaSink`` per format and round, as the pipeline gives it, until the last
  transaction is durable; events/s by this process's CPU time (the Python thread and
  librdkafka's threads: what the format changes; the machine is shared, so wall time says
  little) and by wall time;
* initial load: ``bench.initial_load_bench``'s two tables (``--rows``) loaded into a
  ``KafkaSink`` per format (its default worker processes and readers); rows/s by wall
  time and by the CPU time of this process and its workers.  Every format takes the
  compiled COPY-to-Kafka path (sinks/loadfast.py; ``PGCDC_LOAD_FAST=0`` turns it off: the
  stream's decoders, then the format's encoder).

    python -m bench.json_bench                  # 50,000 events, 5 rounds, encoders only
    python -m bench.json_bench --kafka --scale 0.05 --rows 200000 --rounds 3
    python -m bench.json_bench --load-only --rows 100000 --rounds 3   # the initial load only
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

from decoder.change import ChangeEvent
from decoder.text_parsers import decoder_for
from sinks.avro import AvroEncoder
from sinks.debezium_json import PGCDC_JSON, JsonOptions
from sinks.envelope import JsonEncoder
from snapshot_builder.catalog import Column, TableVersion

_ENUM = 90_001
TABLE = TableVersion(16_500, "bench", "items", "d", (
    Column("id", 20, "int8", -1, True), Column("amount", 1700, "numeric", (12 << 16 | 2) + 4,
                                                False),
    Column("updated_at", 1184, "timestamptz", -1, False), Column("label", 25, "text", -1, False),
    Column("doc", 3802, "jsonb", -1, False), Column("tags", 1007, "_int4", -1, False),
    Column("mood", _ENUM, "mood", -1, False)))
_MOODS = ("sad", "meh", "ok", "good", "great")


def row(i: int) -> dict[str, Any]:
    """Row ``i`` as bench.decoder_bench's ``make_rows`` writes it, decoded from its text."""
    return {
        "id": i,
        "amount": Decimal(f"{(i % 100000) * 1.37 + 0.25:.2f}"),
        "updated_at": decoder_for(1184)(f"2024-01-01 00:00:{i % 60:02d}+00"),
        "label": f"item {i} {i * 2654435761 % 2**32:032x}",
        "doc": f'{{"id": {i}, "even": {str(i % 2 == 0).lower()}, "kind": "k{i % 17}", '
               f'"tags": ["a", "b"], "score": {(i % 1000) / 10.0}}}',
        "tags": decoder_for(1007)(f"{{{i % 100},{i % 1000},{i % 10000}}}"),
        "mood": _MOODS[i % 5],
    }


def events(n: int, op: str) -> list[ChangeEvent]:
    return [ChangeEvent(op, TABLE, None, row(i), (), 1000 + i, 1000 + i, i,
                        0 if op == "r" else 700 + i, 1_000_000 + i) for i in range(n)]


def rate(encode: Callable[[ChangeEvent, int], tuple[bytes, bytes]],
         batch: list[ChangeEvent], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for event in batch:
            encode(event, 1_700_000_000_000)
        best = min(best, time.perf_counter() - start)
    return len(batch) / best


FORMATS: dict[str, tuple[str, JsonOptions | None]] = {
    "avro": ("avro", None),
    "json (debezium)": ("json", JsonOptions(database="bench")),
    "json (pgcdc)": ("json", PGCDC_JSON),
}


def _ratios(rates: dict[str, float], unit: str) -> None:
    for name, per_second in rates.items():
        print(f"  {name:16} {per_second:>10,.0f} {unit}/s  {per_second / rates['avro']:.2f} x avro")


def streaming(args: argparse.Namespace) -> None:
    from bench import decoder_bench as db
    from bench.kafka_sink_bench import capture, librdkafka_cpu
    from pgcdc.services.kafka import KafkaBroker
    from pgcdc.services.postgres import PostgresServer
    from sinks.kafka import KafkaSink

    workload = db.Workload.scaled(args.scale)
    with PostgresServer(settings=db.SERVER_SETTINGS) as server, KafkaBroker() as kafka:
        recorder, decoding = capture(server.dsn(), workload)
        calls = recorder.calls
        events = sum(kind == "event" for kind, _, _ in calls)
        last = max(lsn for kind, _, lsn in calls if kind == "end")
        print(f"streaming: {events:,} events of the decoder benchmark into KafkaSink, "
              f"best of {args.rounds} rounds")
        by_cpu: dict[str, float] = {}
        by_wall: dict[str, float] = {}
        for round_ in range(args.rounds):
            for index, (name, (value_format, options)) in enumerate(FORMATS.items()):
                sink = KafkaSink(kafka.bootstrap_servers, topic_prefix=f"r{round_}_{index}",
                                 value_format=value_format, json_options=options)
                rdk, cpu, wall = librdkafka_cpu(), time.thread_time(), time.perf_counter()
                written = 0
                for kind, item, lsn in calls:
                    if kind == "event":
                        sink.write(item)
                        written += 1
                        if written % 200 == 0:
                            sink.poll(0)
                            sink.durable_lsn()
                    elif kind == "end":
                        sink.end_transaction(lsn)
                    else:
                        sink.publish_table(item, lsn)
                while sink.durable_lsn() != last:
                    sink.poll(0.01)
                cpu = time.thread_time() - cpu + librdkafka_cpu() - rdk
                wall = time.perf_counter() - wall
                sink.close()
                by_cpu[name] = max(by_cpu.get(name, 0.0), events / cpu)
                by_wall[name] = max(by_wall.get(name, 0.0), events / wall)
        print(" by CPU time (Python thread + librdkafka):")
        _ratios(by_cpu, "events")
        print(" by wall time:")
        _ratios(by_wall, "events")
        per_event = decoding / events
        print(f" with the pipeline's decoding (its thread's CPU, measured once: "
              f"{per_event * 1e6:.1f} us/event), by CPU time:")
        _ratios({name: 1 / (per_event + 1 / rate) for name, rate in by_cpu.items()}, "events")


def initial_load(args: argparse.Namespace) -> None:
    from bench import initial_load_bench as ilb
    from pgcdc.services.kafka import KafkaBroker
    from pgcdc.services.postgres import PostgresServer
    from sinks.kafka import KafkaSink

    work = Path(tempfile.mkdtemp(prefix="pgcdc-json-bench-"))
    try:
        with PostgresServer(settings={"shared_buffers": "512MB"}) as server, \
                KafkaBroker() as kafka:
            dsn = server.dsn()
            total = sum(ilb.create_tables(dsn, args.rows).values())
            ilb.copy_sequential(dsn)
            workers = len(os.sched_getaffinity(0))
            print(f"initial load: {total:,} rows of bench.initial_load_bench's tables, "
                  f"{workers} workers, 4 readers, best of {args.rounds} rounds")
            by_wall: dict[str, float] = {}
            by_cpu: dict[str, float] = {}
            for round_ in range(args.rounds):
                for index, (name, (value_format, options)) in enumerate(FORMATS.items()):
                    run = f"l{round_}_{index}"
                    factory = functools.partial(KafkaSink, kafka.bootstrap_servers,
                                                topic_prefix=run, value_format=value_format,
                                                json_options=options)
                    measure = ilb._timed(name, total, functools.partial(  # noqa: SLF001
                        ilb.initial_load, dsn, factory, run, work / f"{run}.json", 4, 1024,
                        workers))
                    by_wall[name] = max(by_wall.get(name, 0.0), measure.rate)
                    by_cpu[name] = max(by_cpu.get(name, 0.0), total / measure.cpu)
            print(" by wall time:")
            _ratios(by_wall, "rows")
            print(" by CPU time (this process and its workers):")
            _ratios(by_cpu, "rows")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kafka", action="store_true",
                        help="also streaming into Kafka and the initial load")
    parser.add_argument("--scale", type=float, default=0.05,
                        help="the decoder benchmark's workload size, streaming (default 0.05)")
    parser.add_argument("--rows", type=int, default=200_000, help="rows of the initial load")
    parser.add_argument("--load-only", action="store_true",
                        help="only the initial load into Kafka (the encoders and streaming not)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.load_only:
        initial_load(args)
        return
    encoders = {name: AvroEncoder() if options is None else JsonEncoder(options)
                for name, (_, options) in FORMATS.items()}
    print(f"{args.events:,} events, best of {args.rounds} rounds")
    for op, what in (("c", "inserts (streaming)"), ("r", "reads (initial load, slow path)")):
        batch = events(args.events, op)
        rates = {name: rate(encoder.encoder_for(TABLE, "bench"), batch, args.rounds)
                 for name, encoder in encoders.items()}
        print(f"encoders alone, {what}:")
        _ratios(rates, "events")
    if args.kafka:
        streaming(args)
        initial_load(args)


if __name__ == "__main__":
    main()
