"""Tracking which transactions are durable, in commit order.

Each transaction gets an :class:`_Pending` entry holding how many of its
messages are not yet acknowledged.  Acknowledgements arrive in any order
(several partitions, several topics); the durable LSN only moves past a
transaction once it and every transaction before it have no message pending.
The first delivery error is kept and raised on the next call, and from then on
nothing more becomes durable.
"""

from __future__ import annotations

from collections import deque

from pgcdc.errors import TransientError


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

    def sent(self) -> _Pending:
        """Count one more message of the open transaction; returns the handle to ack."""
        if self._open is None:
            self._open = _Pending()
            self._queue.append(self._open)
        self._open.count += 1
        self._in_flight += 1
        return self._open

    def acked(self, handle: _Pending) -> None:
        handle.count -= 1
        self._in_flight -= 1

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
