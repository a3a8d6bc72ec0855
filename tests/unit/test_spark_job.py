"""The Spark job's configuration, checked before anything starts."""

from __future__ import annotations

import pytest

from pgcdc.errors import ConfigError
from streaming.compaction import companions
from streaming.job import JobConfig


@pytest.mark.parametrize("every", [0, -3])
def test_optimize_every_must_be_positive(every: int) -> None:
    with pytest.raises(ConfigError, match=f"optimize_every is {every}: give the number"):
        JobConfig("localhost:9092", "file:///lake", "file:///cp", optimize_every=every)


def test_optimize_every_accepted() -> None:
    assert JobConfig("k:9092", "file:///l", "file:///c", optimize_every=5).optimize_every == 5
    assert JobConfig("k:9092", "file:///l", "file:///c").optimize_every is None


def test_compaction_covers_the_companion_tables() -> None:
    assert companions("s3://lake/public.t") == [
        "s3://lake/public.t", "s3://lake/public.t__tombstones", "s3://lake/public.t__changelog"]
