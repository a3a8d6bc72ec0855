"""Watching the sink from a thread of its own: a stall said once, counted, and acted on.

The streaming loop cannot be relied on to notice a stuck sink: a call into the Kafka client
may block (a table version waits for the broker, a full queue waits for room).  So a daemon
thread reads the sink's :class:`~sinks.acks.AcknowledgementClock` once a second:

* after ``stall_seconds`` without an acknowledgement while the sink holds messages, it logs
  one warning (the slot stays at the durable position), sets ``Progress.sink_stalled`` and
  counts ``Progress.sink_stalls``; once acknowledgements come again and the durable position
  has moved (a sink reset that dropped what it held is no recovery), one warning says so;
* while stalled, with the WAL-retention guard set to stop (``on_lag = "stop"``), it samples
  the slot's lag itself, over a connection of its own, every ``lag_interval`` seconds; past
  ``max_lag_bytes`` it keeps the :class:`~pgcdc.acknowledgement.LagLimitError` as
  :attr:`SinkWatch.failure` and sets the pipeline's stop event, so the pipeline stops
  (within its shutdown grace period) and raises it.

A sink without acknowledgements of its own (jsonl, null: durable once written) is never
stalled.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

import psycopg

from decoder.lsn import format_lsn
from pgcdc.acknowledgement import LagLimitError
from sinks.acks import AcknowledgementClock

if TYPE_CHECKING:
    from pgcdc.pipeline import PipelineConfig, Progress
    from sinks.sink import Sink

log = logging.getLogger("pgcdc.pipeline")  # the pipeline's lines, as operators filter them

_TICK = 1.0  # seconds between two looks at the sink


class SinkWatch:
    def __init__(self, config: PipelineConfig, sink: Sink, progress: Progress,
                 stop: threading.Event) -> None:
        self.config = config
        self.sink = sink
        self.progress = progress
        self.stop = stop  # the pipeline's: set when the guard trips
        self.failure: LagLimitError | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pgcdc-sink-watch", daemon=True)
        self._stalled_since = 0.0
        self._durable_at_stall = 0  # recovered: nothing waits long and this has advanced
        self._last_lag_check = 0.0
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._looking = threading.Lock()  # one look at a time (the thread, /metrics, ready)

    def start(self) -> SinkWatch:
        if isinstance(self.sink, AcknowledgementClock) and self.config.sink_stall_seconds > 0:
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop watching; a stall that ended since the last look is still said to have ended."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(10)
            self.tick(guard=False)

    def unacknowledged_for(self) -> float:
        """Seconds the sink has waited for an acknowledgement (0 for a sink without them)."""
        sink = self.sink
        return sink.unacknowledged_for() if isinstance(sink, AcknowledgementClock) else 0.0

    def _run(self) -> None:
        try:
            while not self._done.wait(_TICK):
                self.tick()
        finally:
            if self._conn is not None:
                self._conn.close()

    def look(self) -> float:
        """The seconds the sink has waited (as :meth:`unacknowledged_for`), after a look that
        records a stall it shows: what /metrics and /health/ready report is counted even
        when it fell between two of the thread's looks."""
        if self._thread.is_alive():
            self.tick(guard=False)
        return self.unacknowledged_for()

    def tick(self, *, guard: bool = True) -> None:
        with self._looking:
            self._tick(guard=guard)

    def _tick(self, *, guard: bool) -> None:
        waited = self.unacknowledged_for()
        progress = self.progress
        if waited >= self.config.sink_stall_seconds:
            if not progress.sink_stalled:
                progress.sink_stalled = True
                progress.sink_stalls += 1
                self._stalled_since = time.monotonic() - waited
                self._durable_at_stall = progress.durable_lsn
                log.warning("the sink has acknowledged nothing for %.0f s (%d events waiting); "
                            "the slot stays at %s, the durable position, until it does",
                            waited, self.sink.in_flight(), format_lsn(progress.durable_lsn))
            if guard:
                self._guard()
        elif progress.sink_stalled and progress.durable_lsn > self._durable_at_stall:
            # acknowledged again (not merely reset: the durable position moved)
            progress.sink_stalled = False
            log.warning("the sink acknowledges again, after a stall of %.0f s",
                        time.monotonic() - self._stalled_since)

    def _guard(self) -> None:
        """The WAL-retention guard while the sink is stuck (the streaming loop may be blocked
        in the sink and not sample the lag)."""
        cfg = self.config
        limit = cfg.max_lag_bytes
        if limit is None or cfg.on_lag != "stop" or self.failure is not None:
            return
        now = time.monotonic()
        if now - self._last_lag_check < cfg.lag_interval:
            return
        self._last_lag_check = now
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(cfg.dsn, autocommit=True, connect_timeout=5)
            row = self._conn.execute(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
                "FROM pg_replication_slots WHERE slot_name = %s", (cfg.slot,)).fetchone()
        except psycopg.Error as exc:
            log.info("cannot sample the lag of slot %s: %s", cfg.slot, str(exc).strip())
            return
        if row is None or row[0] is None:
            return
        lag = int(str(row[0]))
        self.progress.lag_bytes = lag
        if lag > limit:
            self.progress.lag_exceeded += 1
            self.failure = LagLimitError(cfg.slot, lag, limit)
            log.error("%s", self.failure)
            self.stop.set()
