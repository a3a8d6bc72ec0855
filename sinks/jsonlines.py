"""JSON lines to stdout or a file: one envelope per line (sinks/envelope.py), its values
encoded as ``options`` says (sinks/debezium_json.py; pgcdc's own encoding by default).

Durable means written and flushed to the operating system (and fsynced for a
file) at the end of each transaction.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import IO

from decoder.change import ChangeEvent
from decoder.pgoutput import LogicalMessage
from sinks.debezium_json import PGCDC_JSON, JsonOptions
from sinks.envelope import encode_value
from sinks.sink import SynchronousSink
from snapshot_builder.catalog import TableVersion


class JsonLinesSink(SynchronousSink):
    def __init__(self, path: str | None = None, *, server_name: str = "pgcdc",
                 options: JsonOptions = PGCDC_JSON) -> None:
        self._own = path not in (None, "-")
        self._out: IO[bytes] = open(path, "ab") if path not in (None, "-") else sys.stdout.buffer  # noqa: SIM115
        self._server_name = server_name
        self._options = options

    def publish_table(self, table: TableVersion, lsn: int) -> None:
        line = json.dumps({"table_version": table.to_dict(), "lsn": lsn}, separators=(",", ":"))
        self._out.write(line.encode() + b"\n")

    def publish_catalog(self, version: int, lsn: int, entry: str) -> None:
        self._out.write(b'{"catalog_entry":' + entry.encode() + b"}\n")

    def write(self, event: ChangeEvent) -> None:
        now_ms = int(time.time() * 1000)
        self._out.write(encode_value(event, server_name=self._server_name, now_ms=now_ms,
                                     options=self._options) + b"\n")

    def write_message(self, message: LogicalMessage, *, lsn: int, commit_lsn: int | None,
                      xid: int | None) -> None:
        line = json.dumps({"message": {"prefix": message.prefix, "lsn": lsn,
                                       "transactional": message.transactional,
                                       "content": message.content.hex(), "commit_lsn": commit_lsn,
                                       "xid": xid}}, separators=(",", ":"))
        self._out.write(line.encode() + b"\n")

    def end_transaction(self, end_lsn: int) -> None:
        self._out.flush()
        if self._own:
            os.fsync(self._out.fileno())
        super().end_transaction(end_lsn)

    def flush(self, timeout: float) -> None:
        self._out.flush()

    def close(self) -> None:
        self._out.flush()
        if self._own:
            self._out.close()
