"""The Kafka sink alone: the decoder benchmark's events, captured once, written into KafkaSink.

Separates the sink's cost from the decoder's and from the walsender's: one throwaway
PostgreSQL and Kafka broker (``pgcdc.services``); the decoder benchmark's schema and
workload (``bench.decoder_bench``) at ``--scale``; a pipeline into a sink that keeps every
event, table version and transaction end in memory; then, per round and per producer
setting, a fresh ``KafkaSink`` (its own topic prefix) is given the same calls the pipeline
makes (``publish_table``, ``write``, ``end_transaction``, ``poll(0)`` and ``durable_lsn()``
every ``--batch`` events) until the last transaction is durable.

Reported per run: CPU time of the Python thread in all and in ``poll`` (serving delivery
reports), of librdkafka's threads, and of the broker's process, per event; wall time too,
which on a shared machine says little.  Nothing is asserted.

    python -m bench.kafka_sink_bench                       # scale 0.1, 3 rounds
    python -m bench.kafka_sink_bench --config linger.ms=50 --config compression.type=none
    python -m bench.kafka_sink_bench --schema-registry     # and the Confluent wire format

``--schema-registry`` starts a throwaway Apicurio Registry (pgcdc/services/registry.py) and
adds a run per round whose sink registers each table version's schemas there and frames
every record (sinks/registry.py), beside the same run without.  ``--avro-types-logical``
adds a run per round in typed Avro (``pgcdc run --avro-types logical``, sinks/avro_logical.py)
beside the default text-typed Avro.

    python -m bench.kafka_sink_bench --avro-types-logical  # typed Avro against text Avro
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench import decoder_bench as db
from decoder.change import ChangeEvent
from pgcdc.pipeline import Pipeline, PipelineConfig
from pgcdc.services.kafka import KafkaBroker
from pgcdc.services.postgres import PostgresServer
from sinks.avro_logical import LogicalTypes
from sinks.kafka import KafkaSink
from sinks.null import NullSink
from sinks.registry import SchemaRegistry
from snapshot_builder.catalog import TableVersion

Call = tuple[str, Any, int]


class Recorder(NullSink):
    """Keeps the pipeline's calls: ``("table", version, lsn)``, ``("event", event, 0)``,
    ``("end", None, lsn)``."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Call] = []

    def publish_table(self, table: TableVersion, lsn: int) -> None:
        self.calls.append(("table", table, lsn))

    def write(self, event: ChangeEvent) -> None:
        self.calls.append(("event", event, 0))

    def end_transaction(self, end_lsn: int) -> None:
        self.calls.append(("end", None, end_lsn))
        super().end_transaction(end_lsn)


def capture(dsn: str, workload: db.Workload) -> tuple[Recorder, float]:
    """The decoder benchmark's workload (slot b) decoded by pgcdc into a :class:`Recorder`,
    and the thread CPU seconds ``Pipeline.run`` took."""
    setup = db.prepare_and_load(dsn, ["b"], workload)
    recorder = Recorder()
    pipeline = Pipeline(PipelineConfig(
        dsn, slot=db.SLOTS["b"], publication=db.PUBLICATION, tables=[db.TABLE],
        create_slot=False, create_publication=False, protocol_version=1, streaming=False),
        recorder)
    pipeline.prepare()
    decoding = time.thread_time()
    pipeline.run(until_lsn=setup.end_lsn)
    return recorder, time.thread_time() - decoding


def _proc_cpu(path: str) -> float:
    stat = Path(path).read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def librdkafka_cpu() -> float:
    total = 0.0
    for tid in os.listdir("/proc/self/task"):
        try:
            if Path(f"/proc/self/task/{tid}/comm").read_text().startswith("rdk:"):
                total += _proc_cpu(f"/proc/self/task/{tid}/stat")
        except OSError:
            continue
    return total


def replay(calls: list[Call], servers: str, prefix: str, broker: db.ProcessCpu | _Unmeasured,
           config: dict[str, str], batch: int,
           registry: SchemaRegistry | None = None,
           logical: LogicalTypes | None = None) -> dict[str, float]:
    sink = KafkaSink(servers, topic_prefix=prefix, producer_config=config,
                     schema_registry=registry, logical=logical)
    last = max(lsn for kind, _, lsn in calls if kind == "end")
    broker_before, rdk_before = broker.cpu_seconds() or 0.0, librdkafka_cpu()
    began_cpu, began = time.thread_time(), time.perf_counter()
    events, polling = 0, 0.0
    for kind, item, lsn in calls:
        if kind == "event":
            sink.write(item)
            events += 1
            if events % batch == 0:
                at = time.thread_time()
                sink.poll(0)
                sink.durable_lsn()
                polling += time.thread_time() - at
        elif kind == "end":
            sink.end_transaction(lsn)
        else:
            sink.publish_table(item, lsn)
    at = time.thread_time()
    while sink.durable_lsn() != last:
        sink.poll(0.01)
    polling += time.thread_time() - at
    main = time.thread_time() - began_cpu
    wall = time.perf_counter() - began
    rdk = librdkafka_cpu() - rdk_before
    broker_cpu = (broker.cpu_seconds() or 0.0) - broker_before
    sink.close()
    per = 1e6 / events
    return {"events": events, "wall s": wall, "events/s": events / wall,
            "main us/event": main * per,
            "of which poll us/event": polling * per, "librdkafka us/event": rdk * per,
            "broker us/event": broker_cpu * per}


class _Unmeasured:
    """The CPU time of a broker this benchmark did not start: unknown (counted as 0)."""

    def cpu_seconds(self) -> float | None:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kafka_sink_bench",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--scale", type=float, default=0.1, help="workload size (default 0.1)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every setting")
    parser.add_argument("--batch", type=int, default=200,
                        help="events between poll(0) calls, as the pipeline's read batches")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="a producer setting to compare with the sink's defaults "
                             "(repeatable; each is its own run)")
    parser.add_argument("--bootstrap-servers",
                        help="an existing Kafka (default: a throwaway broker, whose CPU time "
                             "is then reported too)")
    parser.add_argument("--schema-registry", action="store_true",
                        help="also a run per round in the Confluent wire format, against a "
                             "throwaway Apicurio Registry")
    parser.add_argument("--avro-types-logical", action="store_true",
                        help="also a run per round in typed Avro (--avro-types logical)")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run that only shows the benchmark still works (CI): "
                             "--scale 0.001, one round; its figures mean nothing")
    args = parser.parse_args(argv)
    if args.smoke:
        args.scale, args.rounds = 0.001, 1
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    settings: dict[str, dict[str, str]] = {"defaults": {}}
    for item in args.config:
        key, _, value = item.partition("=")
        settings[item] = {key: value}
    workload = db.Workload.scaled(args.scale)
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(PostgresServer(settings=db.SERVER_SETTINGS))
        kafka = None if args.bootstrap_servers else stack.enter_context(KafkaBroker())
        servers = args.bootstrap_servers or (kafka.bootstrap_servers if kafka else "")
        recorder, _ = capture(server.dsn(), workload)
        print(f"captured {sum(k == 'event' for k, _, _ in recorder.calls):,} events")
        broker = db.ProcessCpu(str(kafka.base)) if kafka else _Unmeasured()
        registry = None
        if args.schema_registry:
            from pgcdc.services.registry import SchemaRegistryServer

            registry = SchemaRegistry(stack.enter_context(SchemaRegistryServer()).url)
        runs: list[tuple[str, dict[str, str], SchemaRegistry | None, LogicalTypes | None]] = \
            [(name, config, None, None) for name, config in settings.items()]
        if registry is not None:
            runs.append(("schema registry", {}, registry, None))
        if args.avro_types_logical:
            runs.append(("avro-types logical", {}, None, LogicalTypes.reading(server.dsn())))
        run = 0
        for round_ in range(1, args.rounds + 1):
            for name, config, registered, logical in runs:
                run += 1
                result = replay(recorder.calls, servers, f"run{os.getpid()}.{run}", broker,
                                config, args.batch, registered, logical)
                figures = ", ".join(f"{k} {v:,.2f}" if isinstance(v, float) else f"{k} {v:,}"
                                    for k, v in result.items())
                print(f"round {round_} {name}: {figures}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
