"""The WAL-retention guard and heartbeats are on by default (issue 18), and 0 turns each off."""

from __future__ import annotations

import pytest

from pgcdc import cli
from pgcdc.config import ConfigError, load_settings


def _service(*argv: str, environ: dict[str, str] | None = None) -> tuple[int, float, str]:
    flags = vars(cli._parser().parse_args(["run", "--dsn", "host=db", *argv]))
    service = load_settings(flags, environ=environ or {}).service
    return service.max_lag_bytes, service.heartbeat_interval, service.on_lag


def test_guard_and_heartbeats_are_on_by_default() -> None:
    assert _service() == (10 * 1024**3, 60.0, "warn")


def test_zero_turns_each_off_and_the_values_are_checked() -> None:
    assert _service("--max-lag-bytes", "0", "--heartbeat-interval", "0") == (0, 0.0, "warn")
    assert _service(environ={"PGCDC_MAX_LAG_BYTES": "1048576",
                             "PGCDC_HEARTBEAT_INTERVAL": "15"}) == (1048576, 15.0, "warn")
    with pytest.raises(ConfigError, match="'service.max_lag_bytes' must be >= 0"):
        _service("--max-lag-bytes", "-1")
    with pytest.raises(ConfigError, match="'service.heartbeat_interval' must be >= 0"):
        _service("--heartbeat-interval", "-5")


def test_the_help_states_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli._parser().parse_args(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default 10737418240, 10 GiB; 0: off)" in text
    assert "(default 60; 0: off)" in text
