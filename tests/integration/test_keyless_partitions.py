"""Issue 15: a keyless table's changes need one partition, in order.

The lake applies a keyless (REPLICA IDENTITY FULL) table as a multiset, with a watermark
that needs its changes totally ordered (streaming/multiset.py): ``pgcdc run`` creates such
a table's topic with one partition whatever ``partitions`` says and refuses a topic of
more; ``pgcdc spark`` stops with an error naming the topic and the fix before applying
anything of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from core.wire import topic_name
from decoder.slot import current_wal_lsn
from pgcdc.pipeline import Pipeline, PipelineConfig
from sinks.kafka import KafkaSink, KafkaSinkError
from snapshot_builder.catalog import Column, TableVersion
from streaming import job
from streaming.multiset import KeylessPartitionsError

Conn = psycopg.Connection[tuple[object, ...]]


def _partitions(admin: AdminClient, topic: str) -> int:
    return len(admin.list_topics(topic, timeout=30).topics[topic].partitions)


def _table(oid: int, name: str, identity: str) -> TableVersion:
    return TableVersion(oid, "public", name, identity,
                        (Column("a", 23, "int4", -1, True), Column("b", 25, "text", -1,
                                                                    identity == "f")))


def test_run_gives_a_keyless_table_one_partition(kafka_servers: str, topic_prefix: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_servers})
    sink = KafkaSink(kafka_servers, topic_prefix=topic_prefix, partitions=3)
    try:
        sink.publish_table(_table(16_500, "keyed", "d"), 100)
        sink.publish_table(_table(16_501, "full", "f"), 100)
        assert _partitions(admin, topic_name(topic_prefix, "public", "keyed")) == 3
        assert _partitions(admin, topic_name(topic_prefix, "public", "full")) == 1

        # a topic made by hand with two partitions: refused, naming it and the fix
        topic = topic_name(topic_prefix, "public", "by_hand")
        admin.create_topics([NewTopic(topic, num_partitions=2,
                                      replication_factor=1)])[topic].result(30)
        with pytest.raises(KafkaSinkError, match="has 2 partitions") as refused:
            sink.publish_table(_table(16_502, "by_hand", "f"), 100)
        assert topic in str(refused.value) and "primary key" in str(refused.value)
    finally:
        sink.close()


@pytest.mark.spark
def test_spark_stops_on_a_keyless_topic_of_two_partitions(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, spark: Any,
        tmp_path: Path) -> None:
    pg_conn.execute("CREATE TABLE dup (a int, b text)")
    pg_conn.execute("ALTER TABLE dup REPLICA IDENTITY FULL")
    sink = KafkaSink(kafka_servers, topic_prefix=topic_prefix)
    pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.dup"]), sink)
    pipeline.prepare()
    for _ in range(3):
        pg_conn.execute("INSERT INTO dup VALUES (1, 'same')")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    sink.close()
    topic = topic_name(topic_prefix, "public", "dup")
    admin = AdminClient({"bootstrap.servers": kafka_servers})
    assert _partitions(admin, topic) == 1
    # by hand, after pgcdc made it: a second partition, where later changes could go
    admin.create_partitions([NewPartitions(topic, 2)])[topic].result(30)

    lake = tmp_path / "lake"
    # a job started before pgcdc made any topic: the start's check finds nothing to refuse
    nothing = job.JobConfig(kafka_servers, lake.as_uri(), (tmp_path / "cp0").as_uri(),
                            topic_prefix=f"{topic_prefix}_none", trigger_seconds=None)
    assert job.read_catalog(spark, nothing).tables() == []
    job.check_keyless_topics(spark, nothing, job.read_catalog(spark, nothing))
    config = job.JobConfig(kafka_servers, lake.as_uri(), (tmp_path / "cp").as_uri(),
                           topic_prefix=topic_prefix, trigger_seconds=None)
    with pytest.raises(KeylessPartitionsError, match="has 2 partitions") as stopped:
        job.start(spark, config).awaitTermination()
    assert topic in str(stopped.value) and "public.dup" in str(stopped.value)
    assert not lake.exists()  # nothing applied
