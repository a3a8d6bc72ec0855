"""The initial load's first and last read events, marked exactly with parallel readers.

Debezium marks a snapshot's read events ``source.snapshot`` ``"first"``, ``"true"``, ...,
``"last"`` (sinks/snapshot_marks.py).  The load reads chunks in parallel (reader threads
or worker processes, each worker with its own sink), so which event is first or last is
decided as they are written:

* **last**: one read event is held back, by the process that records chunks done (this
  one).  Reader threads hand their batches to it; it holds the final event of the latest
  chunk that ended with one and writes the event it held before.  A worker holds the
  first row of each chunk (the head), writes the rest and sends the head with its
  :class:`~loads.load_worker.Done`; this process writes the head it held
  before into its own sink.  A chunk whose event is held is not recorded done until
  that event is durable.  When every chunk of the load is done and nothing failed or
  stopped, the held event is written ``last`` and made durable: every other read of the
  load was durable before it.  A stopped or failed load writes no ``last``; the held
  event's chunk is read again when the load resumes.
* **first**: in an attempt where no chunk is done yet (a resumed load whose first
  attempt made a chunk durable wrote its ``first`` then), the first event written is
  marked ``first`` and made durable before any other read is handed to a sink.  Reader
  threads: the writing thread marks the first one it writes.  Workers (and this process,
  writing heads) claim it through :class:`FirstClaim`, a value in shared memory: whoever
  claims it writes its event ``first`` and makes it durable; the others wait for that
  before their first write (only at the start: once done, a check is one read).

An event that is both the load's first and its last (a load of one row) is ``last``, as
in Debezium.  The marks are exact under at-least-once delivery: a crash before a chunk is
recorded done re-reads it, so a ``first`` (or a ``last``) may then arrive twice, as any
other read may.
"""

from __future__ import annotations

import re
import time
from typing import Any

from decoder.change import ChangeEvent
from loads.chunk_reader import Halted
from sinks.snapshot_marks import FirstRead, LastRead, mark

DUE, CLAIMED, DONE = 0, 1, 2  # the states of FirstClaim


class FirstClaim:
    """Who writes the load's ``first`` read, across processes (a ``multiprocessing.Value``
    of type ``"i"``, whose lock guards the claim)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def reset(self, due: bool) -> None:
        with self.value.get_lock():
            self.value.value = DUE if due else DONE

    def claim(self, halt: Any) -> bool:
        """True: the caller writes its next event ``first``, makes it durable, then calls
        :meth:`done`.  False: the first is written and durable (waits while another writer
        holds the claim, until ``halt`` is set)."""
        while True:
            mine = self.try_claim()
            if mine is not None:
                return mine
            if halt.is_set():
                raise Halted
            time.sleep(0.001)

    def try_claim(self) -> bool | None:
        """Without waiting: True as :meth:`claim`, False when the first is durable, None while
        another writer holds the claim."""
        if self.value.value == DONE:
            return False
        with self.value.get_lock():
            if self.value.value == DUE:
                self.value.value = CLAIMED
                return True
            return None if self.value.value == CLAIMED else False

    def release(self) -> None:
        """The claimer had nothing to write after all: the first is due again."""
        with self.value.get_lock():
            self.value.value = DUE

    def done(self) -> None:
        with self.value.get_lock():
            self.value.value = DONE


def first(event: ChangeEvent) -> ChangeEvent:
    return mark(event, FirstRead)


def last(event: ChangeEvent) -> ChangeEvent:
    return mark(event, LastRead)


class HeldRead:
    """The one read event held back for ``last``, with what its chunk waits for."""

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
