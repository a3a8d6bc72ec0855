"""A live status line for ``pgcdc run`` on a terminal.

When stderr is a terminal (and the log is text, not ``--log-format json``), one line is
rewritten in place every second::

    pgcdc: 1,234 events/s | durable 0/16B3748 | lag 1.2 MiB, 0.4 s | streaming

* events/s: changes decoded per second since the previous line;
* durable: the position confirmed to the slot (what the sink made durable), as ``X/Y``;
* lag: the slot's lag as the server reports it (its WAL end minus ``confirmed_flush_lsn``,
  sampled every ``--lag-interval`` seconds; ``?`` until the first sample), and for how long
  pgcdc has held the oldest change it received that is not durable yet (0 s when nothing
  waits);
* state: ``streaming``, ``sink stalled`` or ``connecting``.

Nothing is written when stderr is not a terminal.  Log records are not garbled: while the
line is shown, each handler of the root logger that writes to the same stream is wrapped
(:class:`_Guarded`) so that the line is cleared before a record is written and drawn again
after it.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from decoder.lsn import format_lsn

if TYPE_CHECKING:
    from pgcdc.pipeline import Progress

_CLEAR = "\r\x1b[K"  # to the line's start, erase to its end


def format_bytes(count: int | None) -> str:
    """``1.2 MiB``: binary units, one decimal from KiB on; ``?`` for unknown."""
    if count is None:
        return "?"
    value = float(max(count, 0))
    if value < 1024:
        return f"{int(value)} B"
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024:
            return f"{value:.1f} {unit}"
    return f"{value / 1024:.1f} TiB"


def format_status(events_per_second: float, durable_lsn: int, lag_bytes: int | None,
                  lag_seconds: float, state: str) -> str:
    """The line's text (without terminal controls)."""
    return (f"pgcdc: {events_per_second:,.0f} events/s | durable {format_lsn(durable_lsn)} | "
            f"lag {format_bytes(lag_bytes)}, {lag_seconds:.1f} s | {state}")


class StatusSampler:
    """Turns successive looks at the pipeline's :class:`~pgcdc.pipeline.Progress` into the
    line's figures: the event rate between two looks, and how long the oldest received
    change not yet durable has waited (from the times each received position was first
    seen)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: tuple[float, int] | None = None  # (time, events) of the previous look
        self._received: deque[tuple[float, int]] = deque()  # (first seen, received LSN)

    def sample(self, progress: Progress) -> str:
        now = self._clock()
        events, durable, received = progress.events, progress.durable_lsn, progress.received_lsn
        rate = 0.0
        if self._last is not None and now > self._last[0]:
            rate = (events - self._last[1]) / (now - self._last[0])
        self._last = (now, events)
        if not self._received or received > self._received[-1][1]:
            self._received.append((now, received))
        # the oldest position received that is not durable: the first past ``durable``
        while len(self._received) > 1 and self._received[1][1] <= durable:
            self._received.popleft()
        waiting = [t for t, lsn in self._received if lsn > durable]
        lag_seconds = now - waiting[0] if waiting else 0.0
        if progress.sink_stalled:
            state = "sink stalled"
        elif progress.streaming:
            state = "streaming"
        else:
            state = "connecting"
        return format_status(rate, durable, progress.lag_bytes, lag_seconds, state)


class StatusLine:
    """The line on ``stream`` (a terminal), redrawn every ``interval`` seconds by a thread."""

    def __init__(self, progress: Progress, stream: TextIO, *, interval: float = 1.0,
                 sampler: StatusSampler | None = None) -> None:
        self.progress = progress
        self.stream = stream
        self.interval = interval
        self.sampler = sampler or StatusSampler()
        self.lock = threading.RLock()  # the stream: the line and log records, one at a time
        self._text = ""  # what is shown now ("" : nothing)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pgcdc-status-line",
                                        daemon=True)
        self._guarded: list[tuple[logging.Handler, _Guarded]] = []

    def start(self) -> StatusLine:
        root = logging.getLogger()
        self._guarded = [(handler, _Guarded(handler, self)) for handler in root.handlers
                         if getattr(handler, "stream", None) is self.stream]
        wrapped = {id(handler): guarded for handler, guarded in self._guarded}
        root.handlers = [wrapped.get(id(h), h) for h in root.handlers]  # in their order
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop redrawing and clear the line; the log handlers are as before."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(5)
        with self.lock:
            self.clear()
        root = logging.getLogger()
        inner = {id(guarded): handler for handler, guarded in self._guarded}
        root.handlers = [inner.get(id(h), h) for h in root.handlers]  # added since: kept
        self._guarded.clear()

    def _run(self) -> None:
        while not self._done.wait(self.interval):
            text = self.sampler.sample(self.progress)
            with self.lock:
                self._text = text
                self.draw()

    def draw(self) -> None:
        """Write the line (the caller holds ``lock``), cut to the terminal's width: a line
        that wrapped could not be rewritten in place."""
        if not self._text:
            return
        width = shutil.get_terminal_size((120, 24)).columns
        self._write(_CLEAR + self._text[:max(width - 1, 10)])

    def clear(self) -> None:
        """Erase the line (the caller holds ``lock``); drawn again by :meth:`draw`."""
        if self._text:
            self._write(_CLEAR)

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: no more line
            self._text = ""
            self._done.set()


class _Guarded(logging.Handler):
    """A log handler wrapped so that a record is written on a line of its own: the status
    line is cleared first and drawn again after it."""

    def __init__(self, inner: logging.Handler, status: StatusLine) -> None:
        super().__init__(inner.level)
        self.inner = inner
        self.status = status

    def handle(self, record: logging.LogRecord) -> bool:
        with self.status.lock:
            self.status.clear()
            try:
                return bool(self.inner.handle(record))
            finally:
                self.status.draw()

    def emit(self, record: logging.LogRecord) -> None:  # handle() does it all
        self.inner.emit(record)

    def flush(self) -> None:
        self.inner.flush()

    def close(self) -> None:
        self.inner.close()
        super().close()


def start_status_line(progress: Progress, stream: TextIO, log_format: str) -> StatusLine | None:
    """The line, when ``stream`` is a terminal and the log is text; None otherwise."""
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):
        terminal = False
    if not terminal or log_format == "json":
        return None
    return StatusLine(progress, stream).start()
