"""The Structured Streaming query: change topics in Kafka -> MERGE into Delta tables.

Subscribes to every table topic of a prefix by pattern (new tables are picked
up as their topics appear), reads the catalog log from Kafka (again whenever
a micro-batch names a table version it has not seen), and applies the batch
with :func:`streaming.apply.apply_batch`; every ``optimize_every`` batches, the tables
written since are compacted (:mod:`streaming.compaction`).
Checkpoint and table locations are URIs; nothing assumes local mode.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pgcdc.errors import ConfigError
from sinks.kafka import catalog_topic, table_topic_pattern
from streaming.apply import Steps, apply_batch
from streaming.compaction import compact
from streaming.schema import CatalogLog, TableSpec

log = logging.getLogger(__name__)


@dataclass
class JobConfig:
    bootstrap_servers: str
    lake: str
    checkpoint: str
    topic_prefix: str = "pgcdc"
    trigger_seconds: float | None = 1.0  # None: availableNow (process what is there, stop)
    max_offsets_per_trigger: int | None = None
    kafka_options: dict[str, str] | None = None
    changelog: bool = False  # also append every event to <table>__changelog
    optimize_every: int | None = None  # compact the touched tables every N batches

    def __post_init__(self) -> None:
        if self.optimize_every is not None and self.optimize_every < 1:
            msg = (f"optimize_every is {self.optimize_every}: give the number of micro-batches "
                   "between compactions (1 or more), or leave it out to never compact")
            raise ConfigError(msg)


def read_catalog(spark: Any, config: JobConfig) -> CatalogLog:
    """Every table version in the catalog topic (a bounded batch read)."""
    reader = (spark.read.format("kafka")
              .option("kafka.bootstrap.servers", config.bootstrap_servers)
              .option("subscribe", catalog_topic(config.topic_prefix))
              .option("startingOffsets", "earliest")
              .option("endingOffsets", "latest"))
    for key, value in (config.kafka_options or {}).items():
        reader = reader.option(f"kafka.{key}", value)
    rows = reader.load().selectExpr("CAST(value AS STRING) AS v").collect()
    return CatalogLog([TableSpec.from_json(r["v"]) for r in rows])


def app_id(config: JobConfig) -> str:
    """The Delta idempotent-write application id: stable for one checkpoint."""
    return "pgcdc-" + hashlib.sha256(config.checkpoint.encode()).hexdigest()[:16]


def start(spark: Any, config: JobConfig,
          on_batch: Callable[[int, dict[str, int]], None] | None = None) -> Any:
    """Start the query and return its StreamingQuery handle."""
    reader = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", config.bootstrap_servers)
              .option("subscribePattern", table_topic_pattern(config.topic_prefix))
              .option("startingOffsets", "earliest")
              .option("failOnDataLoss", "true")
              .option("includeHeaders", "true")
              .option("kafka.metadata.max.age.ms", "2000"))
    if config.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(config.max_offsets_per_trigger))
    for key, value in (config.kafka_options or {}).items():
        reader = reader.option(f"kafka.{key}", value)
    identity = app_id(config)
    cached: list[CatalogLog] = []
    touched: set[str] = set()  # tables written since the last compaction

    def catalog_for(versions: set[str]) -> CatalogLog:
        """The catalog log, read again from Kafka only when a batch names a version it lacks
        (or events without a version header)."""
        if not cached or not versions or any(cached[0].by_version(v) is None
                                             for v in versions):
            cached[:] = [read_catalog(spark, config)]
        return cached[0]

    def each_batch(batch: Any, batch_id: int) -> None:
        steps = Steps(spark, batch_id)
        applied = apply_batch(spark, batch, batch_id, catalog=catalog_for, lake=config.lake,
                              app_id=identity, changelog=config.changelog, steps=steps,
                              touched=touched)
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
