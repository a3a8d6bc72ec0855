"""What pgcdc tells PostgreSQL: the flush position, its status updates, the lag guard and
the heartbeats.

Order of acknowledgement (sinks/sink.py), in :meth:`Acknowledger.advance` and
:meth:`Acknowledger.confirm`:

1. the flush candidate is the sink's durable LSN and nothing else, except that a
   keepalive's ``wal_end`` or a heartbeat's LSN may move an idle slot forward (no
   transaction open, none pending, nothing in flight: the walsender only reports a
   position, or sends a message, after it sent everything before it), and it is
   capped below any prepared transaction still waiting for its COMMIT PREPARED;
2. the progress file stores the new position (fsynced);
3. the status update sends it to PostgreSQL as the flush position.

The lag guard samples the slot's lag (server WAL end minus ``confirmed_flush_lsn``)
over a normal connection of its own, at most every ``lag_interval`` seconds.  Each query on
it is waited for at most ``_answer_timeout`` seconds: a flow that died silently (a firewall
forgot it) never answers, and the streaming loop must go on to notice its own silence
(``receive_timeout``) and reconnect; the query is then abandoned with its connection (a
new one next time) and counts as a missed sample.

Heartbeats (``heartbeat_interval`` > 0): at most every interval, a
status update also writes ``pg_logical_emit_message(false, 'pgcdc.heartbeat', json)``
over that normal connection.  The message comes back through the slot like any
logical message of the database; pgcdc counts it, never hands it to the sink, and
takes its LSN as a position the walsender has passed.  Non-transactional, it stands
alone in the WAL, so confirming it only needs everything received before it to be
durable, the same rule as a keepalive's ``wal_end``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import psycopg

from core import failpoints
from core.errors import TerminalError
from decoder.progress import ProgressStore, StoredProgress
from sinks.sink import Sink

if TYPE_CHECKING:
    from decoder.replication import ReplicationConnection
    from pgcdc.pipeline import PipelineConfig, Progress

log = logging.getLogger(__name__)

Connection = psycopg.Connection[tuple[object, ...]]

HEARTBEAT_PREFIX = "pgcdc.heartbeat"


class LagLimitError(TerminalError):
    """The slot holds more WAL than ``max_lag_bytes`` and ``on_lag`` is ``stop``."""

    def __init__(self, slot: str, lag: int, limit: int) -> None:
        super().__init__(
            f'replication slot "{slot}" is {lag} bytes behind the server\'s WAL, more than '
            f"--max-lag-bytes {limit}: the sink is too slow or stuck and the server keeps "
            "the WAL for it; fix the sink, raise the limit, or use --on-lag warn")
        self.lag = lag
        self.limit = limit


class Acknowledger:
    """The flush position of one pipeline and the status updates that carry it.

    ``connect`` opens a normal (not replication) connection: the lag guard and the
    heartbeats use one of their own, opened on first use and again after it failed.
    """

    def __init__(self, config: PipelineConfig, sink: Sink, progress: Progress,
                 store: ProgressStore | None, connect: Callable[[], Connection]) -> None:
        self.config = config
        self.sink = sink
        self.progress = progress
        self.store = store
        self.connect = connect
        self._conn: Connection | None = None
        self._hung: threading.Thread | None = None  # a query abandoned without an answer
        self._answer_timeout = min(10.0, max(1.0, config.receive_timeout / 2))
        self.flushed = 0  # the flush position sent (or about to be sent) to PostgreSQL
        self.stored = -1  # the position in the progress file; -1: none
        self.identity: tuple[str, str] = ("", "")  # system identifier, database
        self._keepalive_end = 0
        self._heartbeat_lsn = 0  # the newest heartbeat received in this session
        self._last_status = 0.0
        self._last_lag_check = 0.0
        self._last_heartbeat = 0.0
        self._heartbeat_failing = False
        self._lag_sampling_failing = False
        self._lag_over = False  # the last sample was above the limit (warned once)

    def start(self, flushed: int) -> None:
        """Begin at the slot's confirmed flush position."""
        self.flushed = flushed
        self.progress.durable_lsn = flushed

    def keepalive(self, wal_end: int) -> None:
        """The walsender has sent everything before ``wal_end``."""
        self._keepalive_end = max(self._keepalive_end, wal_end)

    def heartbeat(self, lsn: int) -> None:
        """A heartbeat came back through the slot: the walsender has sent everything
        before ``lsn``."""
        self._heartbeat_lsn = max(self._heartbeat_lsn, lsn)
        self.progress.heartbeats_received += 1

    def reset(self) -> None:
        """Forget the old session's positions before a new session starts.

        A keepalive or a heartbeat of the old session may point past transactions that
        the new session has yet to resend: trusting it would confirm them unsent.
        """
        self._keepalive_end = 0
        self._heartbeat_lsn = 0

    def due(self) -> bool:
        """Whether ``status_interval`` has passed since the last status update."""
        return time.monotonic() - self._last_status >= self.config.status_interval

    def advance(self, *, idle: bool, hold: int | None) -> None:
        """Step 1: the flush position is what the sink made durable (raises its delivery
        error), or a keepalive's or heartbeat's position while ``idle``, never past
        ``hold``."""
        now = time.monotonic()
        candidate = self.flushed
        durable = self.sink.durable_lsn()
        if durable is not None:
            candidate = max(candidate, durable)
        if idle:
            candidate = max(candidate, self._keepalive_end, self._heartbeat_lsn)
        if hold is not None:
            candidate = min(candidate, hold)
        self.flushed = max(self.flushed, candidate)
        self._last_status = now
        self.progress.durable_lsn = self.flushed
        self.progress.in_flight = self.sink.in_flight()

    def confirm(self, stream: ReplicationConnection, *, idle: bool) -> None:
        """Steps 2 and 3: store the flush position, then send it to PostgreSQL (after the
        lag sample and the heartbeat, when they are due).

        While ``idle``, the update asks for a keepalive: its ``wal_end`` lets an idle slot
        advance at the next update.
        """
        now = self._last_status
        if ((self.config.max_lag_bytes is not None or self.config.sample_lag)
                and now - self._last_lag_check >= self.config.lag_interval):
            self._last_lag_check = now
            self._check_lag()
        interval = self.config.heartbeat_interval
        if interval > 0 and now - self._last_heartbeat >= interval:
            self._last_heartbeat = now
            self._emit_heartbeat()
        if self.store is not None and self.flushed > self.stored:
            failpoints.hit("before_progress_store")
            system_id, database = self.identity
            self.store.save(StoredProgress(self.config.slot, system_id, database, self.flushed))
            self.stored = self.flushed
            failpoints.hit("after_progress_store")
        stream.send_status(self.progress.received_lsn, self.flushed, self.flushed, reply=idle)
        self.progress.last_status_at = time.monotonic()
        failpoints.hit("after_status_update")

    def close(self) -> None:
        """Close the guard's connection (a session ended)."""
        conn, self._conn = self._conn, None
        if conn is not None and (self._hung is None or not self._hung.is_alive()):
            conn.close()

    def _ask(self, query: str, params: tuple[object, ...]) -> tuple[object, ...] | None:
        """One row of ``query`` over the guard's connection, waited for at most
        ``_answer_timeout`` seconds; no answer by then is a ``psycopg.OperationalError`` and
        the connection is left to its thread (a new one next time)."""
        if self._hung is not None and self._hung.is_alive():
            msg = "an earlier query has not been answered yet"
            raise psycopg.OperationalError(msg)
        answer: list[tuple[object, ...] | None | BaseException] = []

        def ask() -> None:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = self.connect()
                answer.append(self._conn.execute(query, params).fetchone())
            except BaseException as exc:
                answer.append(exc)

        thread = threading.Thread(target=ask, name="pgcdc-server-query", daemon=True)
        thread.start()
        thread.join(self._answer_timeout)
        if thread.is_alive():
            self._hung, self._conn = thread, None
            msg = (f"no answer within {self._answer_timeout:g} s (the connection's flow may "
                   "have died silently); a new connection next time")
            raise psycopg.OperationalError(msg)
        (result,) = answer
        if isinstance(result, BaseException):
            raise result
        return result

    def _check_lag(self) -> None:
        """The WAL-retention guard: the slot's lag, from the server over a normal connection."""
        try:
            row = self._ask(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
                "FROM pg_replication_slots WHERE slot_name = %s", (self.config.slot,))
        except psycopg.OperationalError as exc:  # a missed sample must not stop streaming
            if not self._lag_sampling_failing:  # once per run of failures, not every sample
                log.warning("cannot sample the lag of slot %s: %s (a standby cannot: "
                            "max_lag_bytes = 0 turns the guard off); streaming goes on",
                            self.config.slot, str(exc).strip())
            self._lag_sampling_failing = True
            return
        self._lag_sampling_failing = False
        if row is None or row[0] is None:
            return
        lag = int(str(row[0]))
        self.progress.lag_bytes = lag
        limit = self.config.max_lag_bytes
        if limit is None or lag <= limit:
            if self._lag_over and limit is not None:
                log.info('replication slot "%s" is back within --max-lag-bytes %d (%d bytes '
                         "behind)", self.config.slot, limit, lag)
            self._lag_over = False
            return
        self.progress.lag_exceeded += 1
        if self.config.on_lag == "stop":
            raise LagLimitError(self.config.slot, lag, limit)
        if not self._lag_over:  # once when the limit is crossed, not at every sample
            log.warning('replication slot "%s" is %d bytes behind the server\'s WAL '
                        "(--max-lag-bytes %d); the server keeps that WAL until pgcdc confirms "
                        "it; pgcdc says so again when it is back within the limit",
                        self.config.slot, lag, limit)
        self._lag_over = True

    def _emit_heartbeat(self) -> None:
        """Write a heartbeat into the WAL of the slot's database (a normal connection)."""
        content = json.dumps({"slot": self.config.slot, "ts_ms": int(time.time() * 1000)},
                             separators=(",", ":"))
        try:
            self._ask("SELECT pg_logical_emit_message(false, %s::text, %s::text)",
                      (HEARTBEAT_PREFIX, content))
        except psycopg.Error as exc:  # a missed heartbeat must not stop streaming
            kind = "HeartbeatError"
            self.progress.errors[kind] = self.progress.errors.get(kind, 0) + 1
            if not self._heartbeat_failing:  # once per run of failures, not every interval
                log.warning("cannot emit a heartbeat for slot %s: %s (it needs EXECUTE on "
                            "pg_logical_emit_message and a primary, not a standby; "
                            "heartbeat_interval = 0 turns heartbeats off); streaming goes on",
                            self.config.slot, str(exc).strip())
            self._heartbeat_failing = True
            return
        self._heartbeat_failing = False
        self.progress.heartbeats_sent += 1
