"""A sink that drops every event: for measuring the decoder alone.  Everything is "durable"."""

from __future__ import annotations

from decoder.change import ChangeEvent
from decoder.pgoutput import LogicalMessage
from sinks.sink import SynchronousSink
from snapshot_builder.catalog import TableVersion


class NullSink(SynchronousSink):
    def __init__(self) -> None:
        self.events = 0
        self.messages = 0

    def publish_table(self, table: TableVersion, lsn: int) -> None:
        return None

    def publish_catalog(self, version: int, lsn: int, entry: str) -> None:
        return None

    def write(self, event: ChangeEvent) -> None:
        self.events += 1

    def write_message(self, message: LogicalMessage, *, lsn: int, commit_lsn: int | None,
                      xid: int | None) -> None:
        self.messages += 1
