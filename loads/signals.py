"""Signals for incremental snapshots and their state file.

``pgcdc.signal (id, type, data)`` holds requests with Debezium's types: ``execute-snapshot``
(``{"tables": [...], "from_key": [...], "to_key": [...], "surrogate_key": [...]}``),
``pause-snapshot``, ``resume-snapshot``, ``stop-snapshot`` (``{"tables": [...]}``, none: all).
The running pgcdc polls it (loads/incremental.py) and keeps, in a JSON file replaced
atomically, the requests, how far each got (the last key whose chunk is durable), whether it is
paused and the last signal applied.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import psycopg
from psycopg.types.json import Jsonb

from core.errors import TerminalError

log = logging.getLogger(__name__)

Conn = psycopg.Connection[tuple[Any, ...]]

SIGNALS: Final = ("execute-snapshot", "pause-snapshot", "resume-snapshot", "stop-snapshot")
_SIGNAL_TABLE: Final = """
CREATE SCHEMA IF NOT EXISTS pgcdc;
CREATE TABLE IF NOT EXISTS pgcdc.signal (
    id bigserial PRIMARY KEY,
    type text NOT NULL,
    data jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT now()
)"""


class IncrementalSnapshotError(TerminalError):
    """A snapshot request that cannot be served (no such table, no usable key, ...)."""


def install_signal_table(conn: Conn) -> None:
    """Create ``pgcdc.signal`` unless it exists (two creators at once: one wins)."""
    row = conn.execute("SELECT pg_catalog.to_regclass('pgcdc.signal') IS NOT NULL").fetchone()
    if row is not None and row[0]:
        return
    try:
        with conn.transaction():
            conn.execute(_SIGNAL_TABLE)
    except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateObject,
            psycopg.errors.DuplicateTable, psycopg.errors.DuplicateSchema):
        pass  # created by someone else meanwhile


def send_signal(conn: Conn, kind: str, data: dict[str, Any]) -> int:
    """Insert a signal row for the running pgcdc; returns its id."""
    if kind not in SIGNALS:
        msg = f"unknown signal {kind!r}; use one of {', '.join(SIGNALS)}"
        raise IncrementalSnapshotError(msg)
    install_signal_table(conn)
    row = conn.execute("INSERT INTO pgcdc.signal (type, data) VALUES (%s, %s) RETURNING id",
                       (kind, Jsonb(data))).fetchone()
    assert row is not None
    return int(row[0])


@dataclass
class Job:
    """One table to read: its key (a surrogate one when named), the range, how far it got."""

    table: str  # as requested; resolved with ::regclass
    surrogate_key: list[str] | None = None
    from_key: list[str] | None = None  # inclusive lower bound, one text value per key column
    to_key: list[str] | None = None  # inclusive upper bound
    after: list[str] | None = None  # the last key whose chunk is durable (text values)
    chunks: int = 0
    rows: int = 0
    again: list[list[str]] = field(default_factory=list)  # keys to read again (TOAST)
    # the table the request meant (pgcdc's own, after a DDL rewrote it): read under the
    # name it has when read (renamed or moved since), not read if dropped
    oid: int | None = None
    # read whole even with a key (a truncate, then every row): rows left the table with no
    # row change in the WAL (a partition detached from a table published via its root)
    whole: bool = False


@dataclass
class State:
    jobs: list[Job] = field(default_factory=list)
    paused: bool = False
    signal_id: int = 0
    done: list[dict[str, Any]] = field(default_factory=list)  # finished or failed jobs

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> State:
        return cls([Job(**j) for j in data.get("jobs", [])], bool(data.get("paused")),
                   int(data.get("signal_id", 0)), list(data.get("done", [])))

    def apply(self, kind: str, data: dict[str, Any]) -> None:
        """One signal row."""
        tables = [str(t) for t in data.get("tables") or []]
        if kind == "execute-snapshot":
            for table in tables:
                self.jobs.append(Job(table, _texts(data.get("surrogate_key")),
                                      _texts(data.get("from_key")), _texts(data.get("to_key"))))
            log.info("incremental snapshot requested: %s", ", ".join(tables))
        elif kind == "pause-snapshot":
            self.paused = True
        elif kind == "resume-snapshot":
            self.paused = False
        elif kind == "stop-snapshot":
            for job in [j for j in self.jobs if not tables or j.table in tables]:
                self.jobs.remove(job)
                self.done.append({"table": job.table, "status": "cancelled", "error": None,
                                   "chunks": job.chunks, "rows": job.rows})
        else:
            log.warning("unknown signal %r ignored; known: %s", kind, ", ".join(SIGNALS))


class StateStore:
    """The state file, replaced atomically (write, fsync, rename)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def load(self) -> State:
        if self.path is None or not self.path.exists():
            return State()
        try:
            return State.from_dict(json.loads(self.path.read_text()))
        except (ValueError, TypeError) as exc:
            msg = (f"incremental snapshot state {self.path} is unreadable ({exc}); remove it "
                   "and trigger the snapshot again")
            raise IncrementalSnapshotError(msg) from None

    def save(self, state: State) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w") as fh:
            json.dump(asdict(state), fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)


def _texts(value: object) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, list):
        return [str(v) for v in value]
    return [str(value)]
