"""The Spark job's configuration, checked before anything starts."""

from __future__ import annotations

import pytest

from core.errors import ConfigError
from streaming.compaction import companions
from streaming.job import JobConfig, consumer_options


@pytest.mark.parametrize("every", [0, -3])
def test_optimize_every_must_be_positive(every: int) -> None:
    with pytest.raises(ConfigError, match=f"optimize_every is {every}: give the number"):
        JobConfig("localhost:9092", "file:///lake", "file:///cp", optimize_every=every)


def test_optimize_every_accepted() -> None:
    assert JobConfig("k:9092", "file:///l", "file:///c", optimize_every=5).optimize_every == 5
    assert JobConfig("k:9092", "file:///l", "file:///c").optimize_every is None


def test_reads_do_not_wait_at_the_end_of_a_partition_unless_told() -> None:
    """Kafka's 500 ms fetch wait at the end of each partition's range was most of a batch
    over many tables; the user's --kafka-option still wins."""
    assert consumer_options(JobConfig("k:9092", "file:///l", "file:///c")) == {
        "fetch.max.wait.ms": "10"}
    told = JobConfig("k:9092", "file:///l", "file:///c",
                     kafka_options={"fetch.max.wait.ms": "200", "security.protocol": "SSL"})
    assert consumer_options(told) == {"fetch.max.wait.ms": "200", "security.protocol": "SSL"}


def test_compaction_covers_the_companion_tables() -> None:
    assert companions("s3://lake/public.t") == [
        "s3://lake/public.t", "s3://lake/public.t__tombstones", "s3://lake/public.t__changelog"]


def test_the_query_reads_the_table_topics_and_the_catalog_history() -> None:
    """The catalog history topic too: a DDL with no row change after it (a table dropped
    last) must make a micro-batch, or the lake would keep the dropped table."""
    import re

    from core.wire import catalog_history_topic, catalog_topic, topic_name
    from streaming.job import subscribe_pattern

    pattern = subscribe_pattern("app.cdc")
    for topic in (topic_name("app.cdc", "public", "t"), topic_name("app.cdc", "s", 'we"ird;'),
                  catalog_history_topic("app.cdc")):
        assert re.fullmatch(pattern, topic), topic
    for topic in (catalog_topic("app.cdc"), "app.cdc._messages", "app.cdc._transactions",
                  catalog_history_topic("app"), catalog_history_topic("other"),
                  "app.cdc._catalog_historyx"):
        assert not re.fullmatch(pattern, topic), topic
