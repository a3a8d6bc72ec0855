"""The rules of a keyless table's apply (streaming/multiset.py) on plain values: signed
images, the watermark, truncates and the occurrence plan, against a model of the source."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapshot_builder.catalog import Column, TableVersion
from streaming.multiset import (
    ENSURE,
    Count,
    Event,
    MultisetError,
    Position,
    Row,
    images,
    keyless,
    net_changes,
    occurrence_plan,
)
from streaming.schema import TableSpec


def _spec(identity: str, keys: tuple[bool, ...]) -> TableSpec:
    columns = tuple(Column(f"c{i}", 23, "int4", -1, k) for i, k in enumerate(keys))
    return TableSpec(TableVersion(1, "public", "t", identity, columns), 0, "t")


def test_only_tables_without_a_key_are_multisets() -> None:
    assert keyless(_spec("f", (True, True)))  # FULL: every column is sent as the key
    assert keyless(_spec("d", (False, False)))  # no primary key: inserts only
    assert keyless(_spec("n", (False, False)))
    assert not keyless(_spec("d", (True, False)))  # the primary key
    assert not keyless(_spec("i", (False, True)))  # REPLICA IDENTITY USING INDEX


def test_images_of_each_operation() -> None:
    old, new = (1, "a"), (1, "b")
    assert images(Event("c", (1, 0), after=new)) == [(new, 1)]
    assert images(Event("r", (1, 0), after=new), loaded=1) == [(new, 1)]  # the load's
    assert images(Event("r", (1, 0), after=new)) == [(new, ENSURE)]  # a snapshot's
    assert images(Event("d", (1, 0), before=old)) == [(old, -1)]
    assert images(Event("u", (1, 0), before=old, after=new)) == [(old, -1), (new, 1)]
    assert images(Event("t", (1, 0))) == []


def test_unchanged_toast_takes_the_old_value() -> None:
    event = Event("u", (1, 0), before=(1, "long", None), after=(2, None, None),
                  unchanged=frozenset({1}))
    assert images(event) == [((1, "long", None), -1), ((2, "long", None), 1)]


def test_a_delete_without_its_old_row_is_an_error() -> None:
    with pytest.raises(MultisetError, match="without its old row"):
        images(Event("d", (5, 1)))


def test_watermark_leaves_out_duplicates_and_reads_do_not_advance_it() -> None:
    row = (1,)
    events = [Event("c", (10, 0), after=row), Event("c", (10, 1), after=row),
              Event("d", (11, 0), before=row)]
    first = net_changes(events[:2], None)
    assert first.counts == {row: Count(2, 2)} and first.applied == (10, 1)
    again = net_changes(events, first.applied)  # the first two sent again, then a delete
    assert again.counts == {row: Count(-1, 0)} and again.applied == (11, 0)
    assert net_changes(events, again.applied).counts == {}
    reads = net_changes([Event("r", (5, 7), after=row), Event("r", (5, 3), after=row)], None)
    assert reads.counts == {row: Count(2, 2)} and reads.applied is None and reads.loaded == 5


def test_truncate_drops_what_came_before_it() -> None:
    row = (1,)
    changes = net_changes([Event("c", (1, 0), after=row), Event("t", (2, 0)),
                           Event("c", (3, 0), after=row), Event("c", (3, 1), after=(2,))],
                          None)
    assert changes.truncate == (2, 0) and changes.counts == {row: Count(1, 1),
                                                             (2,): Count(1, 1)}
    assert net_changes([Event("c", (1, 5), after=row)], None, truncated=(2, 0)).counts == {}


def test_reads_after_a_change_say_the_row_is_there() -> None:
    """An incremental snapshot's read (not the initial load's) of a row the lake holds adds
    none; of one it lacks, one."""
    row, other = (1,), (2,)
    changes = net_changes([Event("r", (9, 0), after=row), Event("r", (9, 1), after=other)],
                          (8, 0), loaded=3)
    assert changes.counts == {row: Count(0, 1), other: Count(0, 1)}
    assert changes.counts[row].of(2) == 2 and changes.counts[other].of(0) == 1
    # a change first in the batch: its reads are no load's either
    mixed = net_changes([Event("c", (4, 0), after=row), Event("r", (6, 0), after=row)], None)
    assert mixed.loaded is None and mixed.counts[row].of(0) == 1


def test_count_folds_in_order() -> None:
    assert Count().then(-1).then(1).of(0) == 1  # a delete the lake never held, then insert
    assert Count().then(1).then(-1).of(0) == 0
    assert Count().then(-1).then(ENSURE).of(3) == 2
    assert Count().then(-1).then(-1).then(ENSURE).of(1) == 1


@pytest.mark.parametrize(("stored", "wanted", "deleted", "inserted"), [
    ([1, 2, 3], 2, [3], []),
    ([1, 2, 3], 0, [1, 2, 3], []),
    ([2, 1], 4, [], [3, 4]),
    ([], 1, [], [1]),
    ([None, None], 1, [None], [1]),  # rows from before occurrences: rewritten whole
    ([1, 1], 3, [None], [1, 2, 3]),  # made identical by a dropped column
    ([1, 3], 2, [None], [1, 2]),
])
def test_occurrence_plan(stored: list[int | None], wanted: int, deleted: list[int | None],
                         inserted: list[int]) -> None:
    assert occurrence_plan(stored, wanted) == (deleted, inserted)


_VALUES = st.sampled_from([None, 0, 1])
_ROWS = st.tuples(_VALUES, _VALUES)
_OPS = st.one_of(
    st.tuples(st.just("insert"), _ROWS, st.integers(1, 3)),
    st.tuples(st.just("delete"), st.integers(0, 50)),
    st.tuples(st.just("update"), st.integers(0, 50), _ROWS, st.booleans()),
    st.tuples(st.just("truncate")),
    st.tuples(st.just("snapshot")),  # an incremental snapshot reads every row again
)


def _source_program(ops: list[tuple[object, ...]],
                    loaded: list[Row]) -> tuple[list[Row], list[Event]]:
    """Run ``ops`` on a model table (a list of rows, ``loaded`` at first: the initial load's
    reads, in reverse order); the events pgcdc would send."""
    table: list[Row] = list(loaded)
    events = [Event("r", (0, i), after=row) for i, row in reversed(list(enumerate(loaded)))]
    for lsn, op in enumerate(ops, start=1):
        kind = op[0]
        if kind == "insert":
            row, times = op[1], op[2]
            assert isinstance(row, tuple) and isinstance(times, int)
            for ordinal in range(times):
                table.append(row)
                events.append(Event("c", (lsn, ordinal), after=row))
        elif kind == "delete" and table:
            assert isinstance(op[1], int)
            row = table.pop(op[1] % len(table))
            events.append(Event("d", (lsn, 0), before=row))
        elif kind == "update" and table:
            index, new, toast = op[1], op[2], op[3]
            assert isinstance(index, int) and isinstance(new, tuple)
            old = table[index % len(table)]
            stored = (new[0], old[1]) if toast else new  # column 1 unchanged TOASTed
            table[index % len(table)] = stored
            after = (new[0], None) if toast else new
            events.append(Event("u", (lsn, 0), before=old, after=after,
                                unchanged=frozenset({1}) if toast else frozenset()))
        elif kind == "truncate":
            table.clear()
            events.append(Event("t", (lsn, 0)))
        elif kind == "snapshot":
            events += [Event("r", (lsn, i), after=row) for i, row in enumerate(table)]
    return table, events


class _Lake:
    """The lake side of the rules: occurrences per content, the watermark, the truncate."""

    def __init__(self) -> None:
        self.rows: dict[Row, list[int | None]] = {}
        self.applied: Position | None = None
        self.truncated: Position | None = None
        self.loaded: int | None = None
        self.held: set[Position] = set()  # reads whose row the lake holds (by position)

    def apply(self, batch: list[Event]) -> None:
        fresh = [e for e in batch if e.op != "r" or e.position not in self.held]
        self.held |= {e.position for e in batch if e.op == "r"}
        changes = net_changes(fresh, self.applied, self.truncated, self.loaded)
        if changes.truncate is not None:
            self.rows.clear()
            self.truncated = changes.truncate
        for row, count in changes.counts.items():
            stored = self.rows.get(row, [])
            deleted, inserted = occurrence_plan(stored, count.of(len(stored)))
            kept = [] if deleted == [None] else [o for o in stored if o not in deleted]
            self.rows[row] = kept + list(inserted)
        self.applied = changes.applied
        self.loaded = changes.loaded

    def multiset(self) -> Counter[Row]:
        return Counter({r: len(o) for r, o in self.rows.items() if o})


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(_OPS, max_size=30), loaded=st.lists(_ROWS, max_size=6), data=st.data())
def test_lake_equals_source_through_duplicated_and_replayed_batches(
        ops: list[tuple[object, ...]], loaded: list[Row], data: st.DataObject) -> None:
    table, events = _source_program(ops, loaded)
    # a pgcdc restart sends a range again: events[:k] then events[j:] with j <= k
    k = data.draw(st.integers(0, len(events)))
    j = data.draw(st.integers(0, k))
    stream = events[:k] + events[j:]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=5)))
    batches = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    replayed = data.draw(st.integers(0, len(batches)))
    lake = _Lake()
    for n, batch in enumerate(batches):
        lake.apply(batch)
        if n == replayed:  # the same offsets again (another query over the same lake)
            lake.apply(batch)
    assert lake.multiset() == Counter(table)
    for occurrences in lake.rows.values():  # every content numbered 1..c
        assert sorted(o for o in occurrences if o is not None) == list(
            range(1, len(occurrences) + 1))
