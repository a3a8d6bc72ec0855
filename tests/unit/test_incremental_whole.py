"""A keyless table read whole (loads/incremental.py): what the main loop writes at
HIGH, and how the keyless path of the lake counts it (streaming/multiset.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from decoder.change import READ, TRUNCATE, ChangeEvent, RowDecoder
from loads.incremental import (
    Chunk,
    IncrementalSnapshots,
    Visibility,
    _Target,
    _whole,
    whole_query,
)
from loads.published import PublishedTable
from loads.signals import Job
from snapshot_builder.catalog import Column, TableVersion
from streaming.multiset import Count, Event, net_changes
from tests.recording_sink import RecordingSink

TABLE = TableVersion(7, "public", "t", "f", (
    Column("k", 23, "int4", -1, True, False, None, 1),
    Column("a", 25, "text", -1, True, False, None, 2)))
ROWS: list[dict[str, Any]] = [{"k": 1, "a": "x"}, {"k": 1, "a": "x"}, {"k": None, "a": None}]


def _published(row_filter: str | None) -> PublishedTable:
    return PublishedTable(TABLE, "r", 1, 0, -1, row_filter)


def _whole_chunk(snapshot: str = "100:100:") -> Chunk:
    target = _Target(_published(None), (), (), RowDecoder(TABLE))
    return Chunk(0, target, list(ROWS), [], [], [], Visibility.parse(snapshot), 500, 123,
                 whole=True)


def _snapshots(sink: RecordingSink) -> IncrementalSnapshots:
    snapshots = IncrementalSnapshots("dbname=unused", sink)
    snapshots._keys[TABLE.oid] = ()  # the table being read, as _activate records it
    return snapshots


def _at_high(snapshots: IncrementalSnapshots, chunk: Chunk, high: int = 900) -> None:
    snapshots._chunk = chunk
    snapshots.on_watermark(
        json.dumps({"slot": "pgcdc", "run": snapshots._run, "kind": "high", "chunk": 0})
        .encode(), high)


def test_a_whole_read_is_a_truncate_then_every_row() -> None:
    sink = RecordingSink()
    snapshots = _snapshots(sink)
    chunk = _whole_chunk()
    _at_high(snapshots, chunk)
    assert [(e.op, e.commit_lsn, e.ordinal) for e in sink.events] == [
        (TRUNCATE, 899, 0), (READ, 899, 1), (READ, 899, 2), (READ, 899, 3)]
    assert [e.after for e in sink.events[1:]] == ROWS  # duplicates and NULLs as read
    assert sink.ends == [900] and chunk.emitted and not chunk.retry
    assert chunk.durable.is_set() and snapshots.rows_emitted == 3
    # the HIGH seen again (a reconnect): the same events at the same positions
    _at_high(snapshots, chunk)
    assert [(e.op, e.ordinal) for e in sink.events[4:]] == [
        (TRUNCATE, 0), (READ, 1), (READ, 2), (READ, 3)]
    assert snapshots.rows_emitted == 3


def _change(xid: int) -> ChangeEvent:
    return ChangeEvent("c", TABLE, None, {"k": 2, "a": "y"}, (), 700, 690, 0, xid, 1)


def test_a_change_the_snapshot_saw_leaves_the_read_as_it_is() -> None:
    sink = RecordingSink()
    snapshots = _snapshots(sink)
    snapshots.on_change(_change(50))  # committed before the lock: visible to the read
    chunk = _whole_chunk("100:100:")
    _at_high(snapshots, chunk)
    assert len(sink.events) == 4 and not chunk.retry and snapshots.whole_retried == 0


def test_a_change_the_snapshot_did_not_see_has_the_table_read_again() -> None:
    """What the SHARE lock rules out, checked anyway: a change of the table the read did not
    see streamed before HIGH; nothing is written, and the chunk thread reads it again."""
    sink = RecordingSink()
    snapshots = _snapshots(sink)
    snapshots.on_change(_change(100))  # not visible to 100:100:
    chunk = _whole_chunk("100:100:")
    _at_high(snapshots, chunk)
    assert sink.events == [] and sink.ends == [900]
    assert chunk.retry and chunk.durable.is_set() and snapshots.whole_retried == 1
    assert snapshots.rows_emitted == 0


def test_only_a_table_read_again_after_ddl_is_read_whole() -> None:
    assert _whole(Job("public.t", oid=7))
    assert not _whole(Job("public.t"))  # signalled by an operator: no lock unasked
    assert not _whole(Job("public.t", surrogate_key=["k"], oid=7))


def test_the_whole_query_reads_every_row_in_no_order() -> None:
    target = _Target(_published("(k > 0)"), (), (), RowDecoder(TABLE))
    text = whole_query(target).as_string(None)
    assert text == ('COPY (SELECT "k", "a" FROM "public"."t" WHERE ((k > 0))) TO STDOUT')
    plain = _Target(_published(None), (), (), RowDecoder(TABLE))
    assert "ORDER BY" not in whole_query(plain).as_string(None)


def test_the_lake_counts_each_read_after_the_truncate_once() -> None:
    """Multiset: reads at the truncate's commit LSN are +1 each (duplicates kept), in the
    truncate's batch or in a later one; the rows before the truncate are gone."""
    row, null = (1, "x"), (None, None)
    before = [Event("c", (10, 0), after=row), Event("c", (10, 1), after=(1, "old"))]
    whole = [Event("t", (20, 0)), Event("r", (20, 1), after=row),
             Event("r", (20, 2), after=row), Event("r", (20, 3), after=null)]
    one = net_changes(before + whole, None)
    assert one.truncate == (20, 0) and one.applied == (20, 0)
    assert one.counts == {row: Count(2, 2), null: Count(1, 1)}
    # the truncate in one batch, the reads in the next (the stored truncate says so)
    first = net_changes(before + whole[:1], None)
    second = net_changes(whole[1:], first.applied, truncated=first.truncate, loaded=3)
    assert second.counts == {row: Count(2, 2), null: Count(1, 1)}
    # a read of an incremental snapshot elsewhere is still "at least one"
    other = net_changes([Event("r", (30, 1), after=row)], (20, 0), truncated=(20, 0))
    assert other.counts == {row: Count(0, 1)}


def test_rows_go_out_under_the_streams_version() -> None:
    """bench seed 44000137: the catalog query cannot know the change of a type a table holds
    (``TableVersion.types``); the rows go out with the stream's record of it, so under the
    stream's version (the same fingerprints), the version read keeping its domains' base
    types; a table the stream decodes otherwise keeps the version read."""
    retyped = replace(TABLE, types="t1")
    read = replace(TABLE, columns=(replace(TABLE.columns[0], base_type="integer"),
                                   TABLE.columns[1]))
    for stream, expected in ((retyped, retyped.version), (TABLE, TABLE.version),
                             (None, TABLE.version),
                             (replace(TABLE, columns=TABLE.columns[:1]), TABLE.version)):
        sink = RecordingSink()
        snapshots = _snapshots(sink)
        snapshots.catalog = lambda oid, stream=stream: stream if oid == TABLE.oid else None
        chunk = _whole_chunk()
        chunk.target = _Target(PublishedTable(read, "r", 1, 0, -1, None), (), (),
                               RowDecoder(read))
        _at_high(snapshots, chunk)
        (version,) = {e.table.version for e in sink.events}
        assert version == expected
        assert all(e.table.columns[0].base_type == "integer" for e in sink.events)
