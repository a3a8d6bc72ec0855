"""The service options of ``pgcdc run``: retries, their backoff, the shutdown grace period,
the sink stall time (issue 18)."""

from __future__ import annotations

import pytest

from pgcdc.config import ConfigError, load_settings
from pgcdc.pipeline import Backoff, retry_delay


def test_backoff_doubles_from_half_a_second_up_to_the_cap() -> None:
    assert [retry_delay(n, 30.0) for n in range(1, 9)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert retry_delay(10_000, 30.0) == 30.0  # no overflow after days of retrying
    assert retry_delay(1, 0.2) == 0.2


def test_backoff_counts_failures_in_a_row_up_to_the_limit() -> None:
    backoff = Backoff(max_retries=3, max_delay=1.5)
    assert [backoff.failed() for _ in range(3)] == [0.5, 1.0, 1.5]
    assert backoff.attempt == "attempt 3 of 3"
    assert backoff.failed() is None  # the fourth in a row: give up
    forever = Backoff(max_retries=0, max_delay=30.0)
    assert all(forever.failed() is not None for _ in range(100))
    assert forever.attempt == "attempt 100, retrying until stopped"


def test_defaults_retry_forever_and_stop_within_ten_seconds() -> None:
    service = load_settings({"dsn": "host=db"}, environ={}).service
    assert service.max_retries == 0
    assert service.shutdown_grace_seconds == 10.0
    assert service.retry_max_delay == 30.0


def test_flags_and_variables() -> None:
    service = load_settings({"dsn": "host=db", "max_retries": 5, "shutdown_grace_seconds": 2.5},
                            environ={"PGCDC_RETRY_MAX_DELAY": "4"}).service
    assert (service.max_retries, service.shutdown_grace_seconds, service.retry_max_delay) == \
        (5, 2.5, 4.0)


def test_negative_values_are_refused_with_the_key() -> None:
    with pytest.raises(ConfigError, match=r"'service.max_retries' must be >= 0 \(got -1\) "
                                          r"from --max-retries"):
        load_settings({"dsn": "host=db", "max_retries": -1}, environ={})
    with pytest.raises(ConfigError, match="'service.shutdown_grace_seconds' must be >= 0"):
        load_settings({"dsn": "host=db"}, environ={"PGCDC_SHUTDOWN_GRACE_SECONDS": "-3"})
