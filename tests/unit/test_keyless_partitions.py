"""A keyless table's topic must have one partition (streaming/multiset.py
check_one_partition): the error names every such topic, its table and the fix."""

from __future__ import annotations

import pytest

from core.wire import topic_name
from snapshot_builder.catalog import Column, TableVersion
from streaming.multiset import KeylessPartitionsError, check_one_partition
from streaming.schema import TableSpec


def _spec(oid: int, name: str, identity: str, key: bool) -> TableSpec:
    return TableSpec(TableVersion(oid, "public", name, identity,
                                  (Column("a", 23, "int4", -1, key),)), 0, "t")


def test_only_keyless_tables_of_several_partitions_are_refused() -> None:
    keyed, full, bare = _spec(1, "keyed", "d", True), _spec(2, "full", "f", True), \
        _spec(3, "bare", "d", False)
    topics = {topic_name("p", "public", n): 4 for n in ("keyed", "full", "bare")}
    check_one_partition([keyed], topics, "p")  # a keyed table may have many
    check_one_partition([full, bare], {}, "p")  # a topic not made yet: nothing to refuse
    check_one_partition([full, bare], dict.fromkeys(topics, 1), "p")
    with pytest.raises(KeylessPartitionsError) as refused:
        check_one_partition([keyed, full, bare], topics, "p")
    text = str(refused.value)
    assert "topic p.public.bare of table public.bare has 4 partitions" in text
    assert "topic p.public.full of table public.full has 4 partitions" in text
    assert "keyed" not in text and "ADD PRIMARY KEY" in text
