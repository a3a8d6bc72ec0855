"""Source -> Kafka -> Spark -> Delta on real services: the lake is a consistent clone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from core.wire import table_topic_pattern
from pgcdc.clone import compare
from pgcdc.demo import DemoOptions, run_demo
from streaming import job
from streaming.apply import apply_batch

pytestmark = pytest.mark.spark


def test_demo_workload_lake_equals_source(pg_dsn: str, kafka_servers: str, topic_prefix: str,
                                          spark: Any, tmp_path: Path) -> None:
    options = DemoOptions(dsn=pg_dsn, bootstrap_servers=kafka_servers, output=tmp_path,
                          transactions=400, seed=7, topic_prefix=topic_prefix)
    results = run_demo(options)
    assert [r.table for r in results] == [
        "pgcdc_demo.customers", "pgcdc_demo.orders", "pgcdc_demo.order_items"]
    for result in results:
        assert result.source.rows > 0
        assert result.equal, result

    # Exactly-once effect: replaying everything in Kafka again, as new batches and as the
    # same batch, leaves every table equal to the source.
    lake = (tmp_path / "lake").as_uri()
    config = job.JobConfig(kafka_servers, lake, (tmp_path / "cp").as_uri(),
                           topic_prefix=topic_prefix)
    everything = (spark.read.format("kafka")
                  .option("kafka.bootstrap.servers", kafka_servers)
                  .option("subscribePattern", table_topic_pattern(topic_prefix))
                  .option("startingOffsets", "earliest")
                  .option("includeHeaders", "true").load())
    catalog = job.read_catalog(spark, config)
    for batch_id in (1000, 1000, 1001):
        apply_batch(spark, everything, batch_id, catalog=catalog, lake=lake, app_id="replay")
    with psycopg.connect(pg_dsn) as conn:
        again = compare(conn, spark, lake, catalog.tables())
    assert [(r.table, r.source, r.lake) for r in again] == [
        (r.table, r.source, r.lake) for r in results]
