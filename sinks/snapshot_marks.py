"""Debezium's ``source.snapshot`` marks of an initial load's read events.

Debezium 3 marks the read events of a snapshot ``"first"`` (the snapshot's first record),
``"last"`` (its last record), ``"first_in_data_collection"`` (the first record of every
other table), ``"last_in_data_collection"`` (the last record of every table but the one
that ends the snapshot) and ``"true"`` (every other one); streamed events say ``"false"``.
A record with two marks keeps the first of ``last``, ``first``, ``last_in_data_collection``,
``first_in_data_collection`` (Debezium's precedence: the sole record of a middle table is
``last_in_data_collection``).  The initial load (loads/initial_load.py, read_marks.py)
hands its marked read events to the sink as a :class:`FirstRead`, :class:`LastRead`,
:class:`FirstInTable` or :class:`LastInTable`: the same event, of a subclass that says its
mark, so every other event costs nothing more (the compiled encoders leave an event of a
subclass of :class:`~decoder.change.ChangeEvent` to their Python path, which asks
:func:`snapshot_of`).  Avro's ``source.snapshot`` is a ``string``, so every mark fits.

An incremental snapshot's reads say ``"incremental"``, as Debezium's do
(:class:`IncrementalRead`).
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


class FirstInTable(MarkedRead):
    """The first read of a table other than the load's first."""

    __slots__ = ()
    snapshot: ClassVar[str] = "first_in_data_collection"


class LastInTable(MarkedRead):
    """The last read of a table other than the one whose last read ends the load."""

    __slots__ = ()
    snapshot: ClassVar[str] = "last_in_data_collection"


class IncrementalRead(MarkedRead):
    """A read of an incremental snapshot (loads/incremental.py), as Debezium marks
    the reads of its incremental snapshots."""

    __slots__ = ()
    snapshot: ClassVar[str] = "incremental"


def mark(event: ChangeEvent, kind: type[MarkedRead]) -> ChangeEvent:
    """``event`` marked as ``kind`` says (an event of any class: the mark replaces its own)."""
    return kind._make(event)


MARKS: dict[str, type[MarkedRead]] = {
    kind.snapshot: kind for kind in (FirstRead, LastRead, FirstInTable, LastInTable,
                                     IncrementalRead)}


def snapshot_of(event: ChangeEvent) -> str:
    """The ``source.snapshot`` of an event: ``"false"`` for a change, its mark for a read."""
    if event.op != "r":
        return "false"
    if isinstance(event, MarkedRead):
        return event.snapshot
    return "true"
