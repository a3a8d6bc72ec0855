"""The live status line's text, its figures, and log records on lines of their own
(pgcdc/status_line.py)."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from pgcdc.pipeline import Progress
from pgcdc.status_line import (
    StatusLine,
    StatusSampler,
    _Guarded,
    format_bytes,
    format_status,
    start_status_line,
)


def test_format_bytes() -> None:
    assert format_bytes(None) == "?"
    assert format_bytes(0) == "0 B"
    assert format_bytes(1023) == "1023 B"
    assert format_bytes(1024) == "1.0 KiB"
    assert format_bytes(1536 * 1024) == "1.5 MiB"
    assert format_bytes(10 << 30) == "10.0 GiB"
    assert format_bytes(3 << 40) == "3.0 TiB"


def test_format_status() -> None:
    assert format_status(1234.4, 0x16B3748, 1536 * 1024, 0.42, "streaming") == (
        "pgcdc: 1,234 events/s | durable 0/16B3748 | lag 1.5 MiB, 0.4 s | streaming")
    assert format_status(0, (5 << 32) + 0xA, None, 0, "connecting") == (
        "pgcdc: 0 events/s | durable 5/A | lag ?, 0.0 s | connecting")


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_sampler_rate_lag_and_state() -> None:
    clock = _Clock()
    sampler = StatusSampler(clock)
    progress = Progress(events=0, received_lsn=100, durable_lsn=100, streaming=True,
                        lag_bytes=0)
    assert sampler.sample(progress).startswith("pgcdc: 0 events/s | durable 0/64 | lag 0 B, "
                                               "0.0 s | streaming")
    clock.now += 2
    progress.events, progress.received_lsn = 500, 200  # received, not durable yet
    assert "250 events/s" in sampler.sample(progress)
    clock.now += 3
    progress.events, progress.received_lsn = 500, 300
    line = sampler.sample(progress)
    assert "0 events/s" in line and "3.0 s" in line  # 200 was received 3 s ago
    clock.now += 1
    progress.durable_lsn = 200  # the first wait is over; 300 was received 1 s ago
    assert "1.0 s" in sampler.sample(progress)
    clock.now += 1
    progress.durable_lsn = 300
    assert ", 0.0 s | streaming" in sampler.sample(progress)
    progress.sink_stalled = True
    assert sampler.sample(progress).endswith("| sink stalled")
    progress.sink_stalled, progress.streaming = False, False
    assert sampler.sample(progress).endswith("| connecting")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def root_handler() -> Iterator[logging.Handler]:
    """The root logger with one handler writing to a terminal (a StringIO), as pgcdc's."""
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    for handler in saved:
        root.removeHandler(handler)
    handler = logging.StreamHandler(_Terminal())
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    yield handler
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in saved:
        root.addHandler(handler)
    root.setLevel(level)


def test_a_log_record_clears_the_line_first(root_handler: logging.StreamHandler[_Terminal]
                                            ) -> None:
    terminal = root_handler.stream
    status = StatusLine(Progress(durable_lsn=0x10), terminal, interval=3600).start()
    try:
        assert root_handler not in logging.getLogger().handlers  # wrapped
        with status.lock:  # as the thread does each second
            status._text = status.sampler.sample(status.progress)  # noqa: SLF001
            status.draw()
        logging.getLogger("pgcdc.test").warning("a record")
    finally:
        status.close()
    assert root_handler in logging.getLogger().handlers  # as before
    assert not any(isinstance(h, _Guarded) for h in logging.getLogger().handlers)
    out = terminal.getvalue()
    line = "pgcdc: 0 events/s | durable 0/10 | lag ?, 0.0 s | connecting"
    # drawn, erased before the record, the record on a line of its own, drawn again, erased
    assert out == (f"\r\x1b[K{line}" "\r\x1b[K" "WARNING a record\n" f"\r\x1b[K{line}"
                   "\r\x1b[K")


def test_only_on_a_terminal_with_a_text_log() -> None:
    assert start_status_line(Progress(), io.StringIO(), "text") is None
    assert start_status_line(Progress(), _Terminal(), "json") is None
    status = start_status_line(Progress(), _Terminal(), "text")
    assert status is not None
    status.close()
