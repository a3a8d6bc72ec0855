"""A real in-memory sink for tests: it records events and can hold acknowledgements back."""

from __future__ import annotations

import threading
from typing import Any

from decoder.change import ChangeEvent
from decoder.pgoutput import LogicalMessage
from sinks.sink import SynchronousSink
from snapshot_builder.catalog import TableVersion


class RecordingSink(SynchronousSink):
    """Durable means "recorded", unless ``hold`` is set: then nothing is durable until release()."""

    def __init__(self, *, hold: bool = False) -> None:
        self.events: list[ChangeEvent] = []
        self.tables: list[TableVersion] = []
        self.catalog_entries: list[str] = []
        self.ends: list[int] = []
        self.messages: list[tuple[LogicalMessage, int | None]] = []
        self._hold = hold
        self._pending: list[int] = []
        self.received = threading.Event()

    def publish_table(self, table: TableVersion, lsn: int) -> None:
        self.tables.append(table)

    def publish_catalog(self, version: int, lsn: int, entry: str) -> None:
        self.catalog_entries.append(entry)

    def write(self, event: ChangeEvent) -> None:
        self.events.append(event)
        self.received.set()

    def write_message(self, message: LogicalMessage, *, lsn: int, commit_lsn: int | None,
                      xid: int | None) -> None:
        self.messages.append((message, commit_lsn))

    def end_transaction(self, end_lsn: int) -> None:
        self.ends.append(end_lsn)
        if self._hold:
            self._pending.append(end_lsn)
        else:
            self._durable = end_lsn

    def release(self) -> None:
        self._hold = False
        if self._pending:
            self._durable = self._pending[-1]
            self._pending.clear()

    def in_flight(self) -> int:
        return len(self._pending)


class NoSink:
    """A sink for a pipeline whose ``prepare()`` alone is tested: any use of it fails."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"prepare() must not use the sink ({name})")
