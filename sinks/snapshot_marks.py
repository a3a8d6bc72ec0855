"""Debezium's ``source.snapshot`` marks of an initial load's read events.

Debezium marks the read events of a snapshot ``"first"`` (the snapshot's first record),
``"last"`` (its last record: Debezium holds one record back and marks it when the snapshot
ends, whatever table it came from) and ``"true"`` (every other one); streamed events say
``"false"``.  The initial load (loads/initial_load.py, read_marks.py) hands its
first and last read events to the sink as a :class:`FirstRead` or a :class:`LastRead`: the
same event, of a subclass that says its mark, so every other event costs nothing more (the
compiled encoders leave an event of a subclass of :class:`~decoder.change.ChangeEvent` to
their Python path, which asks :func:`snapshot_of`).

An incremental snapshot's reads say ``"incremental"``, as Debezium's do
(:class:`IncrementalRead`).

Debezium 3 also marks each table's first and last record ``first_in_data_collection`` and
``last_in_data_collection``; pgcdc does not (docs/types.md): those records say ``"true"``.
"""

from __future__ import annotations

from typing import ClassVar

from decoder.change import ChangeEvent


class MarkedRead(ChangeEvent):
    """A read event with a mark other than ``"true"``."""

    __slots__ = ()
    snapshot: ClassVar[str] = "true"


class FirstRead(MarkedRead):
    __slots__ = ()
    snapshot: ClassVar[str] = "first"


class LastRead(MarkedRead):
    __slots__ = ()
    snapshot: ClassVar[str] = "last"


class IncrementalRead(MarkedRead):
    """A read of an incremental snapshot (loads/incremental.py), as Debezium marks
    the reads of its incremental snapshots."""

    __slots__ = ()
    snapshot: ClassVar[str] = "incremental"


def mark(event: ChangeEvent, kind: type[MarkedRead]) -> ChangeEvent:
    """``event`` marked as ``kind`` says (an event of any class: the mark replaces its own)."""
    return kind._make(event)


def snapshot_of(event: ChangeEvent) -> str:
    """The ``source.snapshot`` of an event: ``"false"`` for a change, its mark for a read."""
    if event.op != "r":
        return "false"
    if isinstance(event, MarkedRead):
        return event.snapshot
    return "true"
