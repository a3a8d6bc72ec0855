"""The initial load's marked read events, exact with parallel readers.

Debezium 3 marks a snapshot's read events ``source.snapshot`` ``"first"`` (the load's
first read), ``"first_in_data_collection"`` (the first read of every other table),
``"true"``, ``"last_in_data_collection"`` (the last read of every table but the one that
ends the load) and ``"last"`` (sinks/snapshot_marks.py).  The load reads chunks in
parallel (reader threads or worker processes, each worker with its own sink), so which
event is a table's first or last is decided as they are written:

* **a table's last**: per table, one read event is held back, by the process that
  records chunks done (this one).  Reader threads hand their batches to it; it holds the
  final event of the table's latest chunk that ended with one and writes the event it
  held before.  A worker holds the first row of each chunk (the head), writes the rest
  and sends the head with its :class:`~loads.load_worker.Done`; this process holds the
  table's newest head and writes the one it held before into its own sink.  A chunk whose
  event is held is not recorded done until that event is durable.  Once every chunk of a
  table ended and every other read of it is durable, its held event becomes the load's
  *candidate* (:class:`HeldRead`): the candidate it replaces, a table that ended before,
  is written ``last_in_data_collection`` (every other read of that table was durable
  before).  When every chunk of the load is done and nothing failed or stopped, the
  candidate is written ``last`` once every other read of the load is durable.  So an
  empty table (no reads) ends no one's run early, and a stopped or failed load writes no
  ``last`` and no last mark of a table whose chunks are not all done; the held event's
  chunk is read again when the load resumes.
* **a table's first**: :class:`FirstClaims` says, per table of the attempt and for the
  load, whether the first read is due, claimed or durable.  A table's first is due when
  none of its rows was recorded durable (``TableState.rows``: a resumed load whose first
  attempt made a chunk of rows durable wrote that table's first mark then); the load's
  ``first`` is due while no table's was.  The first event written of a table whose first
  is due is marked ``first`` if the load's is due too, else ``first_in_data_collection``,
  and is durable before any other read of that table (and, for ``first``, any read at
  all) is handed to a sink.  Reader threads: the one writing thread marks them in order.
  Workers (and this process, writing heads) claim them through shared memory: whoever
  claims a first writes its event marked and makes it durable; the others wait for that
  before their next write of that table (only at the start of each table: once done, a
  check is two reads).

A record that is both a table's first and its last is marked as Debezium marks it:
``last`` for the load's last, else ``first`` for the load's first, else
``last_in_data_collection``.  The marks are exact under at-least-once delivery: a crash
before a chunk is recorded done re-reads it, so a mark may then arrive twice, as any other
read may.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from multiprocessing import shared_memory
from typing import Any

from decoder.change import ChangeEvent
from loads.chunk_reader import Halted
from sinks.snapshot_marks import MARKS, FirstInTable, FirstRead, LastInTable, LastRead, mark

DUE, CLAIMED, DONE = 0, 1, 2  # the states of a first read (FirstClaims)


class FirstClaims:
    """Who writes the load's ``first`` read and each table's first, across processes: one
    state a first (index 0 the load's, ``1 + i`` the attempt's ``i``-th table's) in
    shared memory (or a ``bytearray`` within one process), guarded by one lock."""

    def __init__(self, lock: Any, states: Any, memory: shared_memory.SharedMemory | None = None
                 ) -> None:
        self.lock, self.states, self.memory = lock, states, memory

    @classmethod
    def create(cls, lock: Any, load_due: bool, tables_due: Sequence[bool],
               shared: bool = True) -> FirstClaims:
        """The states of an attempt; ``shared``: in shared memory, for :meth:`attach`."""
        states = bytes([DUE if load_due else DONE]
                       + [DUE if due else DONE for due in tables_due])
        if not shared:
            return cls(lock, bytearray(states))
        memory = shared_memory.SharedMemory(create=True, size=len(states))
        buffer = memory.buf
        assert buffer is not None
        buffer[:len(states)] = states
        return cls(lock, buffer, memory)

    @classmethod
    def attach(cls, lock: Any, name: str) -> FirstClaims:
        """In a worker process: the states the parent created (:attr:`name`)."""
        memory = shared_memory.SharedMemory(name=name)
        return cls(lock, memory.buf, memory)

    @property
    def name(self) -> str:
        assert self.memory is not None
        return self.memory.name

    def close(self, unlink: bool = False) -> None:
        if self.memory is not None:
            self.states = b""
            self.memory.close()
            if unlink:
                self.memory.unlink()
            self.memory = None

    def claim(self, table: int, halt: Any) -> str:
        """Before writing a read of table ``table`` (its index): the mark to write it with,
        ``""`` for none.  A mark is claimed: the caller writes its event with it, makes it
        durable, then calls :meth:`done` (or :meth:`release` if it had nothing to write).
        Waits while another writer holds the load's claim or this table's, until ``halt``
        is set."""
        while True:
            mine = self.try_claim(table)
            if mine is not None:
                return mine
            if halt.is_set():
                raise Halted
            time.sleep(0.001)

    def try_claim(self, table: int) -> str | None:
        """Without waiting: as :meth:`claim`, None while another writer holds a claim."""
        states = self.states
        if states[0] == DONE and states[1 + table] == DONE:
            return ""
        with self.lock:
            load, own = states[0], states[1 + table]
            if load == CLAIMED or own == CLAIMED:
                return None
            if own == DONE:
                return ""
            states[1 + table] = CLAIMED
            if load == DUE:
                states[0] = CLAIMED
                return FirstRead.snapshot
            return FirstInTable.snapshot

    def release(self, table: int, claimed: str) -> None:
        """The claimer of ``claimed`` had nothing to write after all: the first is due again."""
        with self.lock:
            self.states[1 + table] = DUE
            if claimed == FirstRead.snapshot:
                self.states[0] = DUE

    def done(self, table: int) -> None:
        """The table's first (and so the load's) is durable, or no longer due."""
        with self.lock:
            self.states[0] = self.states[1 + table] = DONE


def marked(event: ChangeEvent, snapshot: str) -> ChangeEvent:
    """``event`` with the mark ``snapshot`` (a mark :meth:`FirstClaims.claim` gave)."""
    return mark(event, MARKS[snapshot])


def last(event: ChangeEvent) -> ChangeEvent:
    return mark(event, LastRead)


def table_last(event: ChangeEvent, first: str) -> ChangeEvent:
    """A table's last read but not the load's, ``first`` the mark claimed for it (it is
    also the table's first): ``first`` wins over ``last_in_data_collection`` (Debezium's
    precedence), ``first_in_data_collection`` does not."""
    return mark(event, FirstRead if first == FirstRead.snapshot else LastInTable)


class HeldRead:
    """One read event held back for a last mark, with what its chunk waits for."""

    def __init__(self) -> None:
        self.event: ChangeEvent | None = None
        self.chunk: Any = None  # the chunk (a batch or a task) recorded done once it is written

    def swap(self, event: ChangeEvent, chunk: Any) -> tuple[ChangeEvent | None, Any]:
        """Hold ``event``; the event held before and its chunk, to write now."""
        previous = self.event, self.chunk
        self.event, self.chunk = event, chunk
        return previous

    def take(self) -> tuple[ChangeEvent | None, Any]:
        previous = self.event, self.chunk
        self.event = self.chunk = None
        return previous


_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_ESCAPED = re.compile(r"\\(.)", re.DOTALL)


def _unescape(match: re.Match[str]) -> str:
    return _ESCAPES.get(match[1], match[1])


def copy_fields(line: bytes) -> list[str | None]:
    """The fields of one line of ``COPY ... TO STDOUT`` in text format (tab-separated,
    ``\\N`` for NULL, backslash escapes), as psycopg's ``Copy.rows`` gives them."""
    text = line.decode()
    if text.endswith("\n"):
        text = text[:-1]
    return [None if field == "\\N" else _ESCAPED.sub(_unescape, field) if "\\" in field
            else field for field in text.split("\t")]
