"""The WAL-retention guard warns once when the limit is crossed and once when the lag is back
within it, not at every sample (it is on by default, so a lagging slot must not flood the log)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import psycopg
import pytest

from pgcdc.acknowledgement import Acknowledger, LagLimitError
from pgcdc.pipeline import PipelineConfig, Progress
from tests.recording_sink import RecordingSink


class _Server:
    """Answers the guard's lag query with the next sample (an exception is raised)."""

    closed = False

    def __init__(self, samples: list[Any]) -> None:
        self.samples = samples

    def execute(self, query: str, params: object = None) -> _Server:
        return self

    def fetchone(self) -> tuple[object, ...]:
        sample = self.samples.pop(0)
        if isinstance(sample, BaseException):
            raise sample
        return (sample,)


def _guard(samples: list[Any], on_lag: str = "warn") -> tuple[Acknowledger, Progress]:
    server = _Server(samples)
    config = PipelineConfig("dbname=x", tables=["public.t"], max_lag_bytes=100, on_lag=on_lag)
    progress = Progress()
    return Acknowledger(config, RecordingSink(), progress, None, lambda: server), progress  # type: ignore[arg-type, return-value]


def test_one_warning_per_crossing(caplog: pytest.LogCaptureFixture) -> None:
    guard, progress = _guard([50, 150, 200, 300, 80, 90, 400])
    with caplog.at_level(logging.INFO, logger="pgcdc.acknowledgement"):
        for _ in range(7):
            guard._check_lag()
    behind = [r for r in caplog.records if "bytes behind the server's WAL" in r.getMessage()]
    back = [r for r in caplog.records if "back within --max-lag-bytes" in r.getMessage()]
    assert [r.levelno for r in behind] == [logging.WARNING, logging.WARNING]  # 150, then 400
    assert len(back) == 1 and "80 bytes" in back[0].getMessage()
    assert progress.lag_exceeded == 4 and progress.lag_bytes == 400


def test_a_failing_sample_is_said_once_per_run_of_failures(
        caplog: pytest.LogCaptureFixture) -> None:
    standby = psycopg.OperationalError("recovery is in progress")
    guard, _ = _guard([standby, standby, standby, 10, standby])
    with caplog.at_level(logging.WARNING, logger="pgcdc.acknowledgement"):
        for _ in range(5):
            guard._check_lag()
    said = [r for r in caplog.records if "cannot sample the lag" in r.getMessage()]
    assert len(said) == 2 and "recovery is in progress" in said[0].getMessage()


def test_stop_still_stops() -> None:
    guard, _ = _guard([150], on_lag="stop")
    with pytest.raises(LagLimitError):
        guard._check_lag()


class _Silent(_Server):
    """A connection whose flow died silently: a query never comes back (until released)."""

    def __init__(self) -> None:
        super().__init__([])
        self.release = threading.Event()

    def execute(self, query: str, params: object = None) -> _Server:
        self.release.wait(30)
        return _Server([1])


def test_a_query_without_answer_is_abandoned(caplog: pytest.LogCaptureFixture) -> None:
    """The guard's query over a dead flow must not hold the streaming loop: it is given up
    after the answer timeout (a missed sample), and the next one does not wait again."""
    silent = _Silent()
    config = PipelineConfig("dbname=x", tables=["public.t"], max_lag_bytes=100,
                            receive_timeout=2.0)
    guard = Acknowledger(config, RecordingSink(), Progress(), None, lambda: silent)  # type: ignore[arg-type, return-value]
    try:
        with caplog.at_level(logging.WARNING, logger="pgcdc.acknowledgement"):
            guard._check_lag()  # returns after about 1 s
            guard._check_lag()  # the first still hangs: at once
        said = [r.getMessage() for r in caplog.records if "cannot sample the lag" in r.getMessage()]
        assert len(said) == 1 and "no answer within 1 s" in said[0]
    finally:
        silent.release.set()
