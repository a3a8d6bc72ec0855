"""Tracking which transactions are durable, in commit order.

Each transaction gets an :class:`_Pending` entry holding how many of its
messages are not yet acknowledged.  Acknowledgements arrive in any order
(several partitions, several topics); the durable LSN only moves past a
transaction once it and every transaction before it have no message pending.
The first delivery error is kept and raised on the next call, and from then on
nothing more becomes durable.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Protocol, runtime_checkable

from core.errors import TransientError


@runtime_checkable
class AcknowledgementClock(Protocol):
    """A sink whose acknowledgements arrive later than its writes (Kafka) says how long it has
    been waiting for one: what the pipeline's stall watch reads (pgcdc/sink_watch.py)."""

    def unacknowledged_for(self) -> float:
        """Seconds since the sink last acknowledged something while it holds unacknowledged
        messages (since the oldest of them was written, if none was acknowledged since); 0
        when it holds none.  Safe to call from another thread."""


class DeliveryError(TransientError):
    """A message could not be made durable; the pipeline resets the sink and restarts from
    the durable LSN, so everything after it is sent again."""


class _Pending:
    __slots__ = ("count", "end_lsn")

    def __init__(self) -> None:
        self.count = 0
        self.end_lsn: int | None = None  # None while the transaction is still open


class AckTracker:
    def __init__(self) -> None:
        self._queue: deque[_Pending] = deque()
        self._open: _Pending | None = None
        self._durable: int | None = None
        self._error: BaseException | None = None
        self._in_flight = 0
        # time.monotonic() of the last acknowledgement, or of the first message written
        # after the sink held none (the start of a wait for an acknowledgement)
        self._last_ack = time.monotonic()

    def sent(self) -> _Pending:
        """Count one more message of the open transaction; returns the handle to ack."""
        if self._open is None:
            self._open = _Pending()
            self._queue.append(self._open)
        self._open.count += 1
        if not self._in_flight:
            self._last_ack = time.monotonic()
        self._in_flight += 1
        return self._open

    def acked(self, handle: _Pending) -> None:
        handle.count -= 1
        self._in_flight -= 1
        self._last_ack = time.monotonic()

    def failed(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error

    def end_transaction(self, end_lsn: int) -> None:
        if self._open is None:  # a transaction with nothing to deliver
            self._open = _Pending()
            self._queue.append(self._open)
        self._open.end_lsn = end_lsn
        self._open = None

    def durable_lsn(self) -> int | None:
        if self._error is not None:
            msg = f"delivery failed: {self._error}; restart resumes from the durable position"
            raise DeliveryError(msg) from self._error
        queue = self._queue
        while queue and queue[0].count == 0 and queue[0].end_lsn is not None:
            self._durable = queue.popleft().end_lsn
        return self._durable

    def in_flight(self) -> int:
        return self._in_flight

    def unacknowledged_for(self) -> float:
        """See :meth:`AcknowledgementClock.unacknowledged_for`."""
        if not self._in_flight:
            return 0.0
        return max(0.0, time.monotonic() - self._last_ack)
