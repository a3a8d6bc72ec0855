"""The Structured Streaming query: change topics in Kafka -> MERGE into Delta tables.

Subscribes to every table topic of a prefix by pattern (new tables are picked
up as their topics appear), reads the catalog from Kafka (the catalog history and the
table versions, streaming/catalog.py; again whenever a micro-batch names a table version
it has not seen, and every ``catalog_refresh`` seconds), and applies the batch
with :func:`streaming.apply.apply_batch`; every ``optimize_every`` batches, the tables
written since are compacted (:mod:`streaming.compaction`).
Checkpoint and table locations are URIs; nothing assumes local mode.

Batches are bounded by default (``maxOffsetsPerTrigger`` = :data:`DEFAULT_MAX_OFFSETS`), so
that a backlog of any size is applied in batches the driver's default memory holds.  A bound
binds only the batches Spark plans: on restart, Spark runs a batch its checkpoint planned but
did not commit again with exactly the planned offsets (``MicroBatchExecution.
populateStartOffsets``), whatever ``maxOffsetsPerTrigger`` says now.  So the first batch of
a run is measured (per partition, its offset range, from its plan: no read), and one larger
than the bound is applied in pieces of at most about the bound (:func:`pieces`), each read
from Kafka by its own offset ranges, in offset order, each with Delta idempotent-write ids of
its own (the query's id plus the piece: a retried piece is skipped by the tables that
committed it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.errors import ConfigError, TerminalError
from core.wire import catalog_history_topic, catalog_topic, table_topic_pattern
from streaming import multiset, typed_avro
from streaming.apply import APPLY_THREADS, Steps, apply_batch
from streaming.catalog import CatalogLog, LakeCatalog, replay
from streaming.compaction import compact
from streaming.schema import TableSpec

log = logging.getLogger(__name__)

# offsets per micro-batch unless told otherwise: what the driver's default memory holds
# (docs/benchmarks.md, the Spark section: a 2.57 million-offset batch did not fit)
DEFAULT_MAX_OFFSETS = 200_000


@dataclass
class JobConfig:
    bootstrap_servers: str
    lake: str
    checkpoint: str
    topic_prefix: str = "pgcdc"
    trigger_seconds: float | None = 1.0  # None: availableNow (process what is there, stop)
    # offsets per micro-batch at most; None or 0: no bound
    max_offsets_per_trigger: int | None = DEFAULT_MAX_OFFSETS
    kafka_options: dict[str, str] | None = None
    changelog: bool = False  # also append every event to <table>__changelog
    optimize_every: int | None = None  # compact the touched tables every N batches
    # a dropped table's lake table is moved to <lake>/_archive/<name>.<oid> instead of dropped
    archive_dropped: bool = False
    catalog_refresh: float = 30.0  # seconds between reads of the catalog topics, at most
    # tables of a micro-batch applied at once (streaming/apply.py); 1: one after the other
    apply_threads: int = APPLY_THREADS

    def __post_init__(self) -> None:
        if self.optimize_every is not None and self.optimize_every < 1:
            msg = (f"optimize_every is {self.optimize_every}: give the number of micro-batches "
                   "between compactions (1 or more), or leave it out to never compact")
            raise ConfigError(msg)
        if self.max_offsets_per_trigger is not None and self.max_offsets_per_trigger < 0:
            msg = (f"max_offsets_per_trigger is {self.max_offsets_per_trigger}: give the most "
                   "offsets a micro-batch may read (1 or more), or 0 for no bound")
            raise ConfigError(msg)


# (topic, partition) -> (first offset, last offset + 1) of a batch
Ranges = dict[tuple[str, int], tuple[int, int]]


def planned_ranges(batch: Any) -> Ranges | None:
    """The offsets a micro-batch holds, per topic partition, as its plan gives them (the
    offset ranges of the Kafka scan's input partitions, Spark's ``KafkaBatchInputPartition``,
    found in the lineage of the RDD ``foreachBatch`` hands over), with no read of the records;
    None where there is no such scan (another source, another Spark): the batch is then
    measured (:func:`batch_ranges`)."""
    try:
        partitions = []
        rdds = [batch._jdf.queryExecution().toRdd()]  # noqa: SLF001
        while rdds:
            rdd = rdds.pop()
            if rdd.getClass().getSimpleName() == "DataSourceRDD":
                for partition in rdd.partitions():
                    inputs = partition.inputPartitions()
                    partitions += [inputs.apply(i) for i in range(inputs.size())]
                continue
            dependencies = rdd.dependencies()
            rdds += [dependencies.apply(i).rdd() for i in range(dependencies.size())]
        out: Ranges = {}
        for partition in partitions:
            offsets = partition.offsetRange()
            where = offsets.topicPartition()
            low, high = int(offsets.fromOffset()), int(offsets.untilOffset())
            key = (str(where.topic()), int(where.partition()))
            if high > low:
                before = out.get(key, (low, high))
                out[key] = (min(before[0], low), max(before[1], high))
        return out if partitions else None
    except Exception:  # noqa: BLE001 - a plan of another shape: measured instead
        log.debug("the batch's offsets are not in its plan; measured", exc_info=True)
        return None


def batch_ranges(batch: Any) -> Ranges:
    """The offsets a micro-batch holds, per topic partition (one pass, nothing cached)."""
    from pyspark.sql import functions as F

    rows = batch.groupBy("topic", "partition").agg(
        F.min("offset").alias("low"), F.max("offset").alias("high")).collect()
    return {(str(r["topic"]), int(r["partition"])): (int(r["low"]), int(r["high"]) + 1)
            for r in rows}


def pieces(ranges: Ranges, bound: int) -> list[Ranges]:
    """``ranges`` cut into as many pieces as a bound of ``bound`` offsets needs, each
    partition's range in consecutive slices of about equal length, one slice per piece:
    piece ``k`` follows piece ``k - 1`` in every partition.  The same ranges and bound always
    give the same pieces."""
    total = sum(high - low for low, high in ranges.values())
    count = max(1, math.ceil(total / bound))
    out: list[Ranges] = []
    for k in range(count):
        piece: Ranges = {}
        for where, (low, high) in sorted(ranges.items()):
            start = low + (high - low) * k // count
            end = low + (high - low) * (k + 1) // count
            if end > start:
                piece[where] = (start, end)
        out.append(piece)
    return out


# Kafka consumer properties of every read of the job, under the user's --kafka-option.
# fetch.max.wait.ms: how long the broker holds a fetch that finds fewer bytes than
# fetch.min.bytes (Kafka's default: 500 ms).  Spark reads each topic partition of a batch to
# an offset it planned, and the end of a partition's range is where the data ends: each
# partition's read ended waiting there.  With one topic per table, that was most of a
# batch over many tables (100 partitions of 200 records: 26-33 s, against 2-3.5 s with
# 10 ms; docs/benchmarks.md, "Tables per micro-batch").
_CONSUMER_DEFAULTS = {"fetch.max.wait.ms": "10"}


def consumer_options(config: JobConfig) -> dict[str, str]:
    """The Kafka consumer properties of the job's reads: its defaults, then the user's."""
    return {**_CONSUMER_DEFAULTS, **(config.kafka_options or {})}


def _kafka_batch(spark: Any, config: JobConfig, options: dict[str, str]) -> Any:
    """A bounded batch read of Kafka with ``options`` (which topics, from and to where),
    with the job's servers and its Kafka options."""
    reader = spark.read.format("kafka").option("kafka.bootstrap.servers",
                                               config.bootstrap_servers)
    for key, value in options.items():
        reader = reader.option(key, value)
    for key, value in consumer_options(config).items():
        reader = reader.option(f"kafka.{key}", value)
    return reader.load()


def read_range(spark: Any, config: JobConfig, ranges: Ranges) -> Any:
    """The records of ``ranges`` (a piece of a micro-batch), as the stream reads them."""
    topics: dict[str, list[int]] = {}
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    for (topic, partition), (low, high) in ranges.items():
        topics.setdefault(topic, []).append(partition)
        starting.setdefault(topic, {})[str(partition)] = low
        ending.setdefault(topic, {})[str(partition)] = high
    return _kafka_batch(spark, config, {
        "assign": json.dumps(topics), "startingOffsets": json.dumps(starting),
        "endingOffsets": json.dumps(ending), "failOnDataLoss": "true",
        "includeHeaders": "true"})


def read_topics(spark: Any, config: JobConfig, topics: list[str]) -> Any:
    """Every record of ``topics`` now (a bounded batch read), as the stream reads them; a
    topic that does not exist has none (a name no change was sent under: a table renamed
    after the lake load, which writes no Kafka record, before any change)."""
    return _kafka_batch(spark, config, {
        "subscribePattern": "|".join(f"^{re.escape(t)}$" for t in topics),
        "startingOffsets": "earliest",
        "endingOffsets": "latest", "failOnDataLoss": "true", "includeHeaders": "true"})


def read_catalog(spark: Any, config: JobConfig) -> LakeCatalog:
    """The catalog history and every table version, from the catalog topics (one bounded
    batch read of both; the history's topic may not exist yet)."""
    history_topic = catalog_history_topic(config.topic_prefix)
    topics = [catalog_topic(config.topic_prefix), history_topic]
    records = _kafka_batch(spark, config, {
        "subscribePattern": "|".join(f"^{re.escape(t)}$" for t in topics),
        "startingOffsets": "earliest", "endingOffsets": "latest"})
    rows = sorted(records.selectExpr("topic", "offset", "CAST(value AS STRING) AS v")
                  .where("v IS NOT NULL").collect(), key=lambda r: (r["topic"], r["offset"]))
    specs = [TableSpec.from_json(r["v"]) for r in rows if r["topic"] != history_topic]
    history = replay(r["v"] for r in rows if r["topic"] == history_topic)
    return LakeCatalog(CatalogLog(specs), history, prefix=config.topic_prefix)


def topic_partitions(spark: Any, config: JobConfig) -> dict[str, int]:
    """Every topic's number of partitions, from Kafka's metadata, through the Kafka client
    of Spark's connector (on the driver, with the query's own Kafka options)."""
    jvm = spark.sparkContext._jvm  # noqa: SLF001 - the connector's Kafka client
    properties = jvm.java.util.Properties()
    properties.setProperty("bootstrap.servers", config.bootstrap_servers)
    for key, value in (config.kafka_options or {}).items():
        properties.setProperty(key, value)
    bytes_ = jvm.org.apache.kafka.common.serialization.ByteArrayDeserializer
    consumer = jvm.org.apache.kafka.clients.consumer.KafkaConsumer(properties, bytes_(),
                                                                   bytes_())
    try:
        listing = consumer.listTopics(jvm.java.time.Duration.ofSeconds(60))
        return {str(topic): int(listing.get(topic).size()) for topic in listing.keySet()}
    finally:
        consumer.close()


def check_keyless_topics(spark: Any, config: JobConfig, catalog: LakeCatalog) -> None:
    """Stop before applying anything of a keyless table whose topic has more than one
    partition (streaming/multiset.py :func:`~streaming.multiset.check_one_partition`)."""
    keyless = [spec for spec in catalog.tables() if multiset.keyless(spec)]
    if keyless:
        multiset.check_one_partition(keyless, topic_partitions(spark, config),
                                     config.topic_prefix)


class TypedAvroError(TerminalError):
    """Typed Avro (``pgcdc run --avro-types logical``) of a logical type this job does not
    know."""


def check_avro_types(catalog: LakeCatalog) -> None:
    """Stop before applying anything if a typed Avro table version (its ``_catalog`` record
    says ``avro_types: logical``) has a column whose typed Avro is a logical type this job
    does not know (streaming/typed_avro.py); streaming/apply.py refuses such events again,
    batch by batch.  Every type pgcdc run writes is applied."""
    refusals = [refusal for oid in sorted({s.oid for s in catalog.log.tables()})
                for spec in catalog.log.versions(oid)
                if (refusal := typed_avro.refusal(spec)) is not None]
    if refusals:
        raise TypedAvroError("; ".join(refusals))


def app_id(config: JobConfig) -> str:
    """The Delta idempotent-write application id: stable for one checkpoint."""
    return "pgcdc-" + hashlib.sha256(config.checkpoint.encode()).hexdigest()[:16]


def subscribe_pattern(prefix: str) -> str:
    """The topics the query reads: every table topic of ``prefix``, and its catalog history
    topic, so that a DDL with no row change after it (a table dropped or renamed last)
    makes a micro-batch too, which follows it (streaming/apply.py ``CATALOG_FORMAT``)."""
    return f"{table_topic_pattern(prefix)}|^{re.escape(catalog_history_topic(prefix))}$"


def start(spark: Any, config: JobConfig,
          on_batch: Callable[[int, dict[str, int]], None] | None = None) -> Any:
    """Start the query and return its StreamingQuery handle."""
    reader = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", config.bootstrap_servers)
              .option("subscribePattern", subscribe_pattern(config.topic_prefix))
              .option("startingOffsets", "earliest")
              .option("failOnDataLoss", "true")
              .option("includeHeaders", "true")
              .option("kafka.metadata.max.age.ms", "2000"))
    if config.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(config.max_offsets_per_trigger))
    for key, value in consumer_options(config).items():
        reader = reader.option(f"kafka.{key}", value)
    identity = app_id(config)
    catalog = read_catalog(spark, config)
    check_keyless_topics(spark, config, catalog)  # at the start: a clear error, no query
    check_avro_types(catalog)
    cached: list[tuple[float, LakeCatalog]] = [(time.monotonic(), catalog)]
    first = [True]  # the first batch of this run may be one a checkpoint planned
    touched: set[str] = set()  # tables written since the last compaction

    def catalog_for(versions: set[str]) -> LakeCatalog:
        """The catalog, read again from Kafka when a batch names a version it lacks (or
        events without a version header, or the batch asks again), and at least every
        ``catalog_refresh`` seconds, so that a table dropped without further events is
        retired too."""
        now = time.monotonic()
        if not cached or not versions or now - cached[0][0] >= config.catalog_refresh \
                or any(cached[0][1].by_version(v) is None for v in versions):
            catalog = read_catalog(spark, config)
            check_keyless_topics(spark, config, catalog)  # before any of their changes
            check_avro_types(catalog)
            cached[:] = [(now, catalog)]
        return cached[0][1]

    def earlier(topics: list[str]) -> Any:
        return read_topics(spark, config, topics)

    def each_batch(batch: Any, batch_id: int) -> None:
        steps = Steps(spark, batch_id)
        bound = config.max_offsets_per_trigger
        split: list[Ranges] = []
        if first[0] and bound:
            with steps("measure"):
                ranges = planned_ranges(batch)
                if ranges is None:
                    ranges = batch_ranges(batch)
            size = sum(high - low for low, high in ranges.values())
            if size > bound:
                split = pieces(ranges, bound)
                log.warning(
                    "batch %d holds %d offsets, more than max_offsets_per_trigger (%d): "
                    "planned so by an earlier run (its checkpoint replays it as planned); "
                    "applied in %d pieces of at most about %d offsets", batch_id, size, bound,
                    len(split), math.ceil(size / len(split)))
        first[0] = False
        applied: dict[str, int] = {}
        for k, piece in enumerate(split):
            done = apply_batch(spark, read_range(spark, config, piece), batch_id,
                               catalog=catalog_for, lake=config.lake,
                               app_id=f"{identity}-piece{k + 1}of{len(split)}",
                               changelog=config.changelog, steps=steps, touched=touched,
                               archive=config.archive_dropped, threads=config.apply_threads,
                               earlier=earlier)
            for name, count in done.items():
                applied[name] = applied.get(name, 0) + count
            log.info("batch %d: piece %d of %d applied %s", batch_id, k + 1, len(split), done)
        if not split:
            applied = apply_batch(spark, batch, batch_id, catalog=catalog_for,
                                  lake=config.lake, app_id=identity,
                                  changelog=config.changelog, steps=steps, touched=touched,
                                  archive=config.archive_dropped,
                                  threads=config.apply_threads, earlier=earlier)
        every = config.optimize_every
        if every and touched and (batch_id + 1) % every == 0:  # after the batch committed
            with steps("optimize"):
                compact(spark, sorted(touched))
            touched.clear()
        if not applied:
            return
        log.info("batch %d applied %s (%s)", batch_id, applied, steps.summary())
        if on_batch is not None:
            on_batch(batch_id, applied)

    writer = (reader.load().writeStream.foreachBatch(each_batch)
              .option("checkpointLocation", config.checkpoint)
              .queryName("pgcdc-apply"))
    if config.trigger_seconds is None:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{config.trigger_seconds} seconds")
    return writer.start()
