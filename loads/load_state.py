"""The initial load's state on disk: the chunk plan, which chunks are durable, at which snapshot.

One JSON file per slot, replaced atomically (write, fsync, rename, fsync the
folder, as :mod:`decoder.progress` does).  Order of acknowledgement during the load:
the chunk's events are durable in the sink -> the chunk is recorded done here.
Nothing is ever flushed to PostgreSQL during the load: the slot stays at its
consistent point until streaming starts.

An **attempt** is one snapshot the load reads under: attempt 0 is the
slot's exported snapshot; each resume after a crash starts the next attempt
with a new snapshot (the exported one died with its connection).  A chunk is
*done at attempt g* when every row visible in its page range under
attempt g's snapshot is durable in the sink with its content at that snapshot.
A table is complete when all its chunks are done at the same attempt: then the
union of its chunks is that snapshot of the table.

Read events are addressed ``(consistent_point - 1, ordinal)``; the ordinal
packs the attempt, the chunk and the row (:func:`ordinal`), so re-reads of a
later attempt sort after everything an earlier one wrote, and no two reads
of a table share a position.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from core.errors import TerminalError

FORMAT: Final = 1

ATTEMPT_BITS: Final = 8
CHUNK_BITS: Final = 31
ROW_BITS: Final = 24
MAX_ATTEMPTS: Final = 1 << ATTEMPT_BITS
MAX_CHUNK_ROWS: Final = 1 << ROW_BITS

LOADING: Final = "loading"
COMPLETE: Final = "complete"


class LoadStateError(TerminalError):
    """The state file does not fit this slot or this server, or cannot be read."""


def ordinal(attempt: int, chunk: int, row: int) -> int:
    """``attempt | chunk | row`` in 8 + 31 + 24 bits: a non-negative BIGINT.

    Unique per table (every chunk index of a table is used once per attempt) and
    ordered by attempt first, so a later snapshot's read of a key wins over an
    earlier one's when a consumer keeps the greatest ``(commit_lsn, ordinal)``.
    """
    if not (0 <= attempt < MAX_ATTEMPTS and 0 <= chunk < 1 << CHUNK_BITS
            and 0 <= row < MAX_CHUNK_ROWS):
        msg = f"read position out of range: attempt {attempt}, chunk {chunk}, row {row}"
        raise ValueError(msg)
    return attempt << (CHUNK_BITS + ROW_BITS) | chunk << ROW_BITS | row


def max_chunk_pages(block_size: int) -> int:
    """The most pages a chunk may span so that its rows fit the ordinal's row field.

    MaxHeapTuplesPerPage: (block size - page header) / (tuple header + line pointer).
    """
    return MAX_CHUNK_ROWS // ((block_size - 24) // 28)


@dataclass
class ChunkState:
    """Pages ``[start, end)`` of one table; ``end`` None: to the end of the table."""

    start: int
    end: int | None
    done: int | None = None  # the attempt it is done at; None: never done


@dataclass
class TableState:
    oid: int
    schema: str
    name: str
    relfilenode: int
    chunks: list[ChunkState]
    complete: bool = False
    rows: int = 0  # read events made durable for this table, over all attempts

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.name}"


@dataclass
class Attempt:
    xmin: str  # the snapshot's xmin as a 32-bit xid: rows with an older xmin were visible to it
    started: int  # microseconds since 2000-01-01 UTC: the commit_time of its read events


@dataclass
class LoadState:
    slot: str
    system_identifier: str
    database: str
    publication: str
    consistent_point: int
    status: str = LOADING
    attempts: list[Attempt] = field(default_factory=list)
    tables: dict[int, TableState] = field(default_factory=dict)
    format: int = FORMAT

    @property
    def load_lsn(self) -> int:
        """The commit LSN of every read event: just below the consistent point.

        A transaction whose commit record starts exactly at the consistent point is
        not in the exported snapshot and is streamed with ``commit_lsn`` equal to it
        (the walsender skips only commits that start *before* ``start_decoding_at``),
        so reads must sort strictly below it.
        """
        return self.consistent_point - 1

    @property
    def attempt(self) -> int:
        """The current attempt (the last one started)."""
        return len(self.attempts) - 1

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["tables"] = {str(oid): asdict(t) for oid, t in self.tables.items()}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LoadState:
        if data.get("format") != FORMAT:
            msg = f"load state format {data.get('format')!r} is not {FORMAT}"
            raise LoadStateError(msg)
        tables = {
            int(oid): TableState(**{**t, "chunks": [ChunkState(**c) for c in t["chunks"]]})
            for oid, t in data["tables"].items()
        }
        # files written before the load's attempts had their name say "generations"
        attempts = data["attempts"] if "attempts" in data else data["generations"]
        return cls(data["slot"], data["system_identifier"], data["database"],
                   data["publication"], data["consistent_point"], data["status"],
                   [Attempt(**a) for a in attempts], tables, data["format"])


class LoadStateStore:
    """One JSON file, replaced atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> LoadState | None:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        try:
            return LoadState.from_json(json.loads(text))
        except (ValueError, KeyError, TypeError) as exc:
            msg = (f"cannot read the initial-load state {self.path}: {exc}; restore it, or drop "
                   "the slot, remove the file and the loaded topics, and load again")
            raise LoadStateError(msg) from exc

    def save(self, state: LoadState) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".load-")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(state.to_json(), fh, separators=(",", ":"))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def plan_chunks(pages: int, chunk_pages: int, *, whole: bool = False) -> list[ChunkState]:
    """Page ranges of ``chunk_pages`` covering ``pages``; the last one is open-ended.

    Pages added after the snapshot hold only rows the snapshot cannot see, so the
    open end reads nothing more at attempt 0, and at a later attempt it reads
    what the table grew by.  ``whole``: one open chunk (a partitioned table).
    """
    if whole or pages <= chunk_pages:
        return [ChunkState(0, None)]
    starts = range(0, pages, chunk_pages)
    return [ChunkState(s, s + chunk_pages) for s in starts[:-1]] + [ChunkState(starts[-1], None)]


def extend_tail(table: TableState, pages: int, chunk_pages: int) -> None:
    """Split the open last chunk when the table has grown; the parts keep its state.

    A chunk done at attempt g is done at g for every sub-range, so the new parts
    inherit ``done``; they are appended, so no chunk index is reused.
    """
    tail = next((c for c in table.chunks if c.end is None), None)
    if tail is None or pages <= tail.start + chunk_pages:
        return
    tail.end = tail.start + chunk_pages
    for part in plan_chunks(pages - tail.end, chunk_pages):
        table.chunks.append(ChunkState(tail.end + part.start,
                                       None if part.end is None else tail.end + part.end,
                                       tail.done))
