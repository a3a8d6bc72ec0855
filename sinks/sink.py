"""What a sink promises.

Order of acknowledgement, everywhere in pgcdc:

1. the sink makes every event of a transaction (and every catalog version it
   needs) durable: for Kafka, acknowledged by all in-sync replicas;
2. the sink reports the transaction's end LSN through :meth:`Sink.durable_lsn`,
   only once every transaction before it is durable as well;
3. the pipeline sends that LSN to PostgreSQL as the flush position.

Nothing is acknowledged before it is durable (DESIGN.md invariant 1).
"""

from __future__ import annotations

from typing import Protocol

from decoder.change import ChangeEvent
from decoder.pgoutput import LogicalMessage
from snapshot_builder.catalog import TableVersion


class Sink(Protocol):
    """A destination for change events.

    Guarantee: at-least-once.  After a restart the pipeline resends every
    transaction whose end LSN :meth:`durable_lsn` had not reported; a consumer
    de-duplicates on ``(commit_lsn, ordinal)``, which every event carries.
    """

    def publish_table(self, table: TableVersion, lsn: int) -> None:
        """Make a table definition durable before any event that uses it is written."""

    def publish_catalog(self, version: int, lsn: int, entry: str) -> None:
        """Publish one entry of the catalog history (JSON, snapshot_builder.history.Entry),
        so that consumers can rebuild ``catalog_at(lsn)`` from the sink alone; queued like an
        event of the transaction that made it, so durable before that commit is."""

    def write(self, event: ChangeEvent) -> None:
        """Queue one event of the open transaction; may block when buffers are full."""

    def write_message(self, message: LogicalMessage, *, lsn: int, commit_lsn: int | None,
                      xid: int | None) -> None:
        """Queue a logical decoding message; a transactional one belongs to the open
        transaction (``commit_lsn`` and ``xid`` set), the others stand alone."""

    def end_transaction(self, end_lsn: int) -> None:
        """Mark the end of the transaction whose events were just written."""

    def durable_lsn(self) -> int | None:
        """The end LSN of the newest transaction that is durable with all before it.

        ``None`` while nothing written has become durable yet.  Raises the first
        delivery error, if any: after that, nothing more becomes durable.
        """

    def in_flight(self) -> int:
        """How many written events are not durable yet."""

    def poll(self, timeout: float = 0.0) -> None:
        """Serve delivery reports; blocks up to ``timeout`` seconds."""

    def flush(self, timeout: float) -> None:
        """Wait until every written event is durable or ``timeout`` passes."""

    def reset(self) -> None:
        """Forget everything not yet durable (after a delivery error): the pipeline sends it
        again from the durable LSN.  A Kafka sink recreates its producer here."""

    def close(self) -> None:
        """Flush what can be flushed and release resources."""


class SynchronousSink:
    """What every sink shares whose writes are durable once :meth:`end_transaction` returns
    (a file, nothing at all): nothing is ever in flight or waiting for a delivery report, so
    there is nothing to flush or forget, and the durable LSN is the end of the last
    transaction."""

    _durable: int | None = None

    def end_transaction(self, end_lsn: int) -> None:
        self._durable = end_lsn

    def durable_lsn(self) -> int | None:
        return self._durable

    def in_flight(self) -> int:
        return 0

    def poll(self, timeout: float = 0.0) -> None:
        return None

    def flush(self, timeout: float) -> None:
        return None

    def reset(self) -> None:
        return None

    def close(self) -> None:
        return None
