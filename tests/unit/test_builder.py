"""The snapshot builder without a server: its saved state, types through the overlay, and
compaction driven by the slot's horizon."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decoder.pgoutput import Relation, RelationColumn
from pgcdc.status import catalog_report
from snapshot_builder.builder import (
    BuilderState,
    CatalogMismatchError,
    RetentionPolicy,
    SnapshotBuilder,
)
from snapshot_builder.catalog import Column, TableVersion
from snapshot_builder.datatype import TypeVersion
from snapshot_builder.history import CatalogError, CatalogHistory, HistoryFile, PutTable, PutType


def _table(oid: int, ncols: int) -> TableVersion:
    return TableVersion(oid, "public", f"t{oid}", "d",
                        tuple(Column(f"c{i}", 23, "int4", -1, i == 0) for i in range(ncols)))


def _ddl(op: str, **body: object) -> bytes:
    return json.dumps({"op": op, **body}).encode()


def _type_def(oid: int, labels: tuple[str, ...]) -> dict[str, object]:
    return {"oid": oid, "schema": "public", "name": "mood", "kind": "enum",
            "labels": list(labels), "base_oid": None, "typmod": -1, "not_null": None,
            "default": None, "constraints": None, "comment": None, "attributes": None}


def test_the_state_is_saved_and_a_restart_resumes_it(tmp_path: Path) -> None:
    builder = SnapshotBuilder(HistoryFile(tmp_path).load())
    builder.attach([PutTable(_table(1, 1))], 100, frozenset({700, 701}), xmax=(1 << 32) + 701)
    assert builder.state is BuilderState.FULL_SNAPSHOT
    report = catalog_report(tmp_path)  # what `pgcdc status` shows from another process
    assert report["builder_state"] == "full_snapshot"
    assert report["builder_waiting_for"] == [700, 701] and report["catalog_version"] == 1

    restarted = SnapshotBuilder(HistoryFile(tmp_path).load())
    restarted.resume()
    assert restarted.state is BuilderState.FULL_SNAPSHOT
    assert restarted.running_at_attach == frozenset({700, 701})
    assert restarted.attach_xmax == (1 << 32) + 701
    restarted.running_finished()
    assert catalog_report(tmp_path)["builder_state"] == "consistent"

    again = SnapshotBuilder(HistoryFile(tmp_path).load())
    again.resume()
    assert again.state is BuilderState.CONSISTENT and again.running_at_attach == frozenset()


def test_no_saved_state_reads_as_none(tmp_path: Path) -> None:
    report = catalog_report(tmp_path / "nothing")
    assert report == {"catalog_version": None, "builder_state": None}
    assert not (tmp_path / "nothing").exists()  # status creates nothing


def test_a_type_change_is_visible_to_its_transaction_then_versioned_at_commit() -> None:
    builder = SnapshotBuilder()
    builder.start_consistent([PutType(TypeVersion(16500, "public", "mood", "enum",
                                                  ("sad", "ok")))], 10)
    before = builder.history.latest.version
    assert builder.on_ddl(_ddl("put_type", type=_type_def(16500, ("sad", "ok", "happy")))) \
        is None
    seen = builder.type(16500)
    assert seen is not None and seen.labels == ("sad", "ok", "happy")
    committed = builder.history.latest.type(16500)
    assert committed is not None and committed.labels == ("sad", "ok")
    builder.commit(50, 0)
    assert builder.history.latest.version == before + 1
    assert builder.history.type_at(16500, 49) == committed
    grown = builder.history.type_at(16500, 50)
    assert grown is not None and grown.labels == ("sad", "ok", "happy")


def test_rolled_back_and_uncaptured_type_drops_make_no_version() -> None:
    builder = SnapshotBuilder()
    builder.start_consistent([], 10)
    builder.on_ddl(_ddl("put_type", type=_type_def(16600, ("a",))))
    builder.rollback()
    assert builder.type(16600) is None and builder.history.latest.version == 0
    builder.on_ddl(_ddl("drop_type", oid=16700))  # a table's row type: never captured
    builder.on_ddl(_ddl("drop", oid=16701))  # nor this table
    builder.commit(20, 0)
    assert builder.history.latest.version == 0
    builder.on_ddl(_ddl("put_type", type=_type_def(16600, ("a",))))
    builder.on_ddl(_ddl("drop_type", oid=16600))  # created and dropped in one transaction
    assert builder.type(16600) is None
    builder.commit(30, 0)
    assert builder.history.latest.version == 2 and builder.history.latest.type(16600) is None


def test_a_repeated_baseline_makes_no_new_version() -> None:
    builder = SnapshotBuilder()
    baseline: list[PutTable | PutType] = [
        PutType(TypeVersion(16500, "public", "mood", "enum", ("a",))), PutTable(_table(1, 2))]
    builder.start_consistent(baseline, 10)
    builder.attach(baseline, 20, frozenset())
    assert builder.history.latest.version == 2 and builder.state is BuilderState.CONSISTENT


def _long_history(directory: Path, versions: int) -> SnapshotBuilder:
    builder = SnapshotBuilder(HistoryFile(directory).load())
    builder.start_consistent([], 0)
    for i in range(1, versions + 1):  # version i at LSN 10 * i, committed at second i
        builder.history.append(PutTable(_table(1 + i % 3, 1 + i % 5)), lsn=10 * i,
                               commit_time=i * 1_000_000)
    return builder


def test_compaction_keeps_what_the_slot_may_replay_and_the_policy(tmp_path: Path) -> None:
    builder = _long_history(tmp_path, 300)
    everything = {lsn: builder.history.catalog_at(lsn) for lsn in range(1995, 3011, 5)}
    policy = RetentionPolicy(keep_versions=50, min_drop=10)
    assert builder.compact_below(2005, policy) == 200  # version 200 took effect at 2000
    history = builder.history
    assert history.base.version == 200 and history.latest.version == 300
    for lsn, catalog in everything.items():  # every LSN at or above the horizon answers
        if lsn >= 2000:
            assert history.catalog_at(lsn) == catalog
    with pytest.raises(CatalogError, match="compacted"):
        history.catalog(199)
    reloaded = HistoryFile(tmp_path).load()
    assert (reloaded.base.version, reloaded.latest.version) == (200, 300)
    assert json.loads((tmp_path / "builder.state").read_text())["catalog_version"] == 300


def test_the_policy_keeps_more_than_the_horizon(tmp_path: Path) -> None:
    builder = _long_history(tmp_path, 300)
    assert builder.compact_below(2005, RetentionPolicy(keep_versions=150, min_drop=1)) == 151
    assert builder.history.base.version == 151  # the newest 150 stay: 151 to 300
    assert builder.compact_below(2005, RetentionPolicy(keep_versions=0, keep_bytes=200,
                                                       min_drop=1)) == 29
    assert builder.history.base.version == 180  # effective at 2005 - 200
    assert builder.compact_below(3000, RetentionPolicy(keep_versions=0, keep_seconds=100,
                                                       min_drop=1), now=946_684_800 + 300) == 20
    assert builder.history.base.version == 200  # committed in the last 100 s: 200 on


def test_compaction_waits_for_enough_to_drop_and_never_passes_the_horizon(
        tmp_path: Path) -> None:
    builder = _long_history(tmp_path, 300)
    log_size = (tmp_path / "catalog.log").stat().st_size
    assert builder.compact_below(2005, RetentionPolicy(keep_versions=0, min_drop=500)) == 0
    assert builder.compact_below(5, RetentionPolicy(keep_versions=0, min_drop=1)) == 0
    assert (tmp_path / "catalog.log").stat().st_size == log_size  # nothing rewritten
    assert builder.history.base.version == 0
    huge = builder.compact_below(10 ** 9, RetentionPolicy(keep_versions=0, min_drop=1))
    assert huge == 300 and builder.history.base.version == 300  # the latest always stays
    assert builder.history.latest.table(1) is not None


def test_no_compaction_before_the_builder_started() -> None:
    builder = SnapshotBuilder(CatalogHistory())
    builder.history.append(PutTable(_table(1, 1)), lsn=10)
    builder.history.append(PutTable(_table(1, 2)), lsn=20)
    assert builder.compact_below(100, RetentionPolicy(keep_versions=0, min_drop=1)) == 0
    assert builder.history.base.version == 0


def test_a_negative_retention_names_the_fix() -> None:
    with pytest.raises(ValueError, match="use 0 to keep nothing more"):
        RetentionPolicy(keep_versions=-1)


def _put(oid: int, ncols: int) -> bytes:
    return _ddl("put", table=_table(oid, ncols).to_dict())


def test_a_transaction_sent_again_after_a_restart_is_not_recorded_twice(
        tmp_path: Path) -> None:
    builder = SnapshotBuilder(HistoryFile(tmp_path).load())
    builder.start_consistent([], 10)
    builder.on_ddl(_put(1, 1))
    builder.on_ddl(_put(1, 2))
    builder.commit(100, 0)
    builder.on_ddl(_put(2, 1))
    builder.commit(200, 0)
    assert builder.history.latest.version == 3
    # a crash after the history was persisted, before the flush: the slot sends both again
    restarted = SnapshotBuilder(HistoryFile(tmp_path).load())
    restarted.resume()
    restarted.on_ddl(_put(1, 1))
    restarted.on_ddl(_put(1, 2))
    restarted.commit(100, 0)
    restarted.on_ddl(_put(2, 1))
    restarted.commit(200, 0)
    assert restarted.history.latest.version == 3
    restarted.on_ddl(_put(3, 1))
    restarted.commit(300, 0)  # then new ones as usual
    assert restarted.history.latest.version == 4


def test_a_crash_between_two_appends_completes_the_transaction(tmp_path: Path) -> None:
    builder = SnapshotBuilder(HistoryFile(tmp_path).load())
    builder.start_consistent([], 10)
    builder.history.append(PutTable(_table(1, 1)), lsn=100)  # the first of two, then a crash
    restarted = SnapshotBuilder(HistoryFile(tmp_path).load())
    restarted.resume()
    restarted.on_ddl(_put(1, 1))
    restarted.on_ddl(_put(1, 2))
    restarted.commit(100, 0)
    assert restarted.history.latest.version == 2
    assert restarted.history.table_at(1, 100) == _table(1, 2)


def test_a_history_of_another_slot_is_an_error() -> None:
    builder = SnapshotBuilder()
    builder.start_consistent([], 10)
    builder.on_ddl(_put(1, 1))
    builder.commit(100, 0)
    builder.on_ddl(_put(1, 3))
    with pytest.raises(CatalogMismatchError, match="not written from this slot.s stream"):
        builder.commit(100, 0)


def test_resuming_below_the_latest_version_decodes_with_the_catalog_of_that_place(
        tmp_path: Path) -> None:
    builder = SnapshotBuilder(HistoryFile(tmp_path).load())
    builder.start_consistent([PutTable(_table(1, 1))], 10)
    for lsn, ncols in ((100, 2), (200, 3)):
        builder.on_ddl(_put(1, ncols))
        builder.commit(lsn, 0)
    restarted = SnapshotBuilder(HistoryFile(tmp_path).load())
    restarted.resume(50)  # the slot's position: both DDL transactions come again
    assert restarted.table(1) == _table(1, 1)
    restarted.commit(60, 0)  # a transaction without DDL
    assert restarted.table(1) == _table(1, 1)
    restarted.on_ddl(_put(1, 2))
    restarted.commit(100, 0)
    assert restarted.table(1) == _table(1, 2) and restarted.catalog.version == 2
    restarted.on_ddl(_put(1, 3))
    restarted.commit(200, 0)
    assert restarted.catalog is restarted.history.latest and restarted.catalog.version == 3


def test_a_repeated_definition_makes_no_version() -> None:
    builder = SnapshotBuilder()
    builder.start_consistent([PutTable(_table(1, 1))], 10)
    builder.on_ddl(_put(1, 2))
    builder.on_ddl(_put(1, 2))  # the trigger repeats a table for its index
    builder.on_ddl(_ddl("put_type", type=_type_def(16500, ("a",))))
    builder.on_ddl(_ddl("put_type", type=_type_def(16500, ("a",))))
    builder.commit(100, 0)
    assert builder.history.latest.version == 3
    builder.on_ddl(_put(1, 2))  # nothing changed (a comment set to what it was, say)
    builder.commit(200, 0)
    assert builder.history.latest.version == 3 and builder.history.latest.lsn == 100


def test_a_transaction_without_a_version_sent_again_below_later_ones(tmp_path: Path) -> None:
    """Issue 15.5: a transaction whose DDL changed nothing (ADD COLUMN IF NOT EXISTS of a
    column that exists) made no version; sent again after a restart below later versions,
    it is nothing to record, not a history of another slot."""
    builder = SnapshotBuilder(HistoryFile(tmp_path).load())
    builder.start_consistent([PutTable(_table(1, 2))], 10)
    builder.on_ddl(_put(1, 2))  # the same definition: no version
    builder.commit(100, 0)
    builder.on_ddl(_put(1, 3))
    builder.commit(200, 0)
    assert [e.lsn for e in builder.history.entries()] == [10, 200]
    restarted = SnapshotBuilder(HistoryFile(tmp_path).load())
    restarted.resume(50)  # a kill -9 before the flush passed 100
    restarted.on_ddl(_put(1, 2))
    assert restarted.table(1) == _table(1, 2)
    restarted.commit(100, 0)
    assert restarted.table(1) == _table(1, 2)  # still the catalog of that place
    restarted.on_ddl(_put(1, 3))
    restarted.commit(200, 0)
    assert [e.lsn for e in restarted.history.entries()] == [10, 200]
    assert restarted.catalog is restarted.history.latest


def test_a_missing_catalog_change_below_later_versions_names_it(tmp_path: Path) -> None:
    """A transaction sent again that would change the catalog, with no version at its LSN
    and later ones: a mismatch, and the message says what the transaction changes and
    what the history holds."""
    builder = SnapshotBuilder(HistoryFile(tmp_path).load())
    builder.start_consistent([PutTable(_table(1, 2))], 10)
    builder.on_ddl(_put(1, 3))
    builder.commit(200, 0)
    restarted = SnapshotBuilder(HistoryFile(tmp_path).load())
    restarted.resume(50)
    restarted.on_ddl(_put(2, 1))  # a table the history never had at 100
    with pytest.raises(CatalogMismatchError) as caught:
        restarted.commit(100, 0)
    message = str(caught.value)
    assert "LSN 0/64 changes the catalog" in message
    assert "table public.t2 (oid 2) with columns c0" in message
    assert "has no version at that LSN" in message and "up to 2 at LSN 0/C8" in message
    assert str(tmp_path) in message and "re-snapshot" in message


def test_recorded_changes_that_differ_by_no_ops_are_the_same(tmp_path: Path) -> None:
    """An older pgcdc recorded repeated definitions (no-ops) and crashed between two
    appends: the replay appends exactly what is missing."""
    builder = SnapshotBuilder(HistoryFile(tmp_path).load())
    builder.start_consistent([PutTable(_table(1, 1))], 10)
    builder.history.append(PutTable(_table(1, 1)), lsn=100)  # a no-op, as written then
    builder.history.append(PutTable(_table(1, 2)), lsn=100)  # then the crash
    restarted = SnapshotBuilder(HistoryFile(tmp_path).load())
    restarted.resume(50)
    for change in (_put(1, 1), _put(1, 2), _put(1, 2), _put(2, 1)):
        restarted.on_ddl(change)
    restarted.commit(100, 0)
    assert [e.change for e in restarted.history.entries_at(100)][2:] == [
        PutTable(_table(2, 1))]
    assert restarted.history.catalog_at(100).tables == {1: _table(1, 2), 2: _table(2, 1)}
    again = SnapshotBuilder(HistoryFile(tmp_path).load())  # and once more: all there now
    again.resume(50)
    for change in (_put(1, 1), _put(1, 2), _put(2, 1)):
        again.on_ddl(change)
    again.commit(100, 0)
    assert again.history.latest.version == restarted.history.latest.version


def test_part_of_a_transaction_below_later_versions_is_no_crash(tmp_path: Path) -> None:
    """Versions at the LSN hold only part of the transaction, and later versions exist:
    no crash between two appends leaves that, so it is a mismatch, never an append."""
    builder = SnapshotBuilder(HistoryFile(tmp_path).load())
    builder.start_consistent([], 10)
    builder.history.append(PutTable(_table(1, 1)), lsn=100)
    builder.history.append(PutTable(_table(3, 1)), lsn=200)
    restarted = SnapshotBuilder(HistoryFile(tmp_path).load())
    restarted.resume(50)
    restarted.on_ddl(_put(1, 1))
    restarted.on_ddl(_put(2, 1))
    with pytest.raises(CatalogMismatchError, match="make a different catalog"):
        restarted.commit(100, 0)
    assert restarted.history.latest.version == 2


def _relation(oid: int, ncols: int) -> Relation:
    return Relation(None, oid, "public", f"t{oid}", "d", tuple(
        RelationColumn(1 if i == 0 else 0, f"c{i}", 23, -1) for i in range(ncols)))


def test_a_relation_inside_a_prepared_transaction_waits_for_its_commit() -> None:
    """At PREPARE, a prepared transaction's Relation may show its own DDL, which comes with
    it at COMMIT PREPARED: the catalog's definition until then, no mismatch; outside a
    prepared transaction the same Relation is DDL without the trigger."""
    builder = SnapshotBuilder()
    builder.start_consistent([PutTable(_table(1, 1))], 10)
    assert builder.on_relation(_relation(1, 2), prepared=True) == _table(1, 1)
    with pytest.raises(CatalogMismatchError, match="without the pgcdc event trigger"):
        builder.on_relation(_relation(1, 2))
    builder.on_ddl(_put(1, 2))  # COMMIT PREPARED replays the transaction: its DDL, then
    assert builder.on_relation(_relation(1, 2)) == _table(1, 2)  # its Relation again


def _part(oid: int, parent: int | None, published: bool) -> bytes:
    """A ``put`` as the trigger writes it; ``published``: the publication lists the table."""
    table = TableVersion(oid, "public", f"t{oid}", "d", (Column("id", 23, "int4", -1, True),),
                         partition_parent=parent)
    return _ddl("put", table=table.to_dict(), publications={"pgcdc": None} if published else {})


def test_partitions_attached_and_detached_under_a_root_published_table(
        tmp_path: Path) -> None:
    """ATTACH marks the root (published via the root) to be read again; DETACH (the
    trigger no longer describes the partition after its root) gives the partition a
    version without a parent and names it with its root; leaf publication: neither."""
    builder = SnapshotBuilder(HistoryFile(tmp_path).load(), publication="pgcdc")
    builder.start_consistent([], 10)
    builder.on_ddl(_part(1, None, True))  # the root p, published via the root
    builder.on_ddl(_part(2, 1, False))  # its partition
    builder.on_ddl(_part(3, None, True))  # a table of its own
    builder.commit(100, 0)
    builder.on_ddl(_part(1, None, True))  # ATTACH PARTITION t3: the root, then both
    builder.on_ddl(_part(2, 1, False))
    builder.on_ddl(_part(3, 1, False))
    assert set(builder.rewritten) == {1} and builder.detach_partitions() == []
    builder.commit(200, 0)
    builder.on_ddl(_part(1, None, True))  # DETACH PARTITION t2: t2 no longer described
    builder.on_ddl(_part(3, 1, False))
    detached = builder.detach_partitions()
    assert [(r.oid, p.oid, p.partition_parent, h) for r, p, h in detached] == \
        [(1, 2, None, "detached")]
    assert builder.rewritten == {}
    builder.commit(300, 0)
    alone = builder.history.latest.table(2)
    assert alone is not None and alone.partition_parent is None
    builder.on_ddl(_part(1, None, True))  # a later ALTER of the root: nothing detached
    builder.on_ddl(_part(3, 1, False))
    assert builder.detach_partitions() == []
    builder.commit(400, 0)
    versions = builder.history.latest.version

    # the slot sends the detach again after a restart: recorded once
    restarted = SnapshotBuilder(HistoryFile(tmp_path).load(), publication="pgcdc")
    restarted.resume(250)
    for commit_lsn in (300, 400):
        restarted.on_ddl(_part(1, None, True))
        restarted.on_ddl(_part(3, 1, False))
        assert len(restarted.detach_partitions()) == (commit_lsn == 300)
        restarted.commit(commit_lsn, 0)
    assert restarted.history.latest.version == versions

    leaf = SnapshotBuilder(publication="pgcdc")  # leaf partitions published: no root
    leaf.start_consistent([], 10)
    leaf.on_ddl(_part(1, None, False))
    leaf.on_ddl(_part(2, 1, True))
    leaf.on_ddl(_part(3, None, True))
    leaf.commit(100, 0)
    leaf.on_ddl(_part(1, None, False))
    leaf.on_ddl(_part(3, 1, True))
    assert leaf.rewritten == {} and leaf.detach_partitions() == []
    leaf.commit(200, 0)
    leaf.on_ddl(_ddl("drop", oid=3))  # DROP TABLE t3: the root, known unpublished, no read
    assert leaf.detach_partitions() == []


def test_a_partition_moved_to_another_root_or_dropped_leaves_its_root(tmp_path: Path) -> None:
    """Detached from one root and attached to another in one transaction: the new root is
    read again, the old one whole; a partition dropped or truncated alone: its root read
    whole (truncated: the ancestors its trigger says are published), the partition not
    read; a root never described since the start counts as published."""
    builder = SnapshotBuilder(HistoryFile(tmp_path).load(), publication="pgcdc")
    builder.start_consistent([], 10)
    for oid, parent in ((1, None), (2, 1), (4, None), (5, 1)):  # roots p (1), q (4)
        builder.on_ddl(_part(oid, parent, parent is None))
    builder.commit(100, 0)
    builder.on_ddl(_part(1, None, True))  # DETACH t2 from p: p described without it
    builder.on_ddl(_part(5, 1, False))
    builder.on_ddl(_part(4, None, True))  # ATTACH t2 to q
    builder.on_ddl(_part(2, 4, False))
    assert set(builder.rewritten) == {4}
    assert [(r.oid, p.oid, p.partition_parent, d) for r, p, d in
            builder.detach_partitions()] == [(1, 2, 4, "detached")]
    builder.commit(200, 0)
    builder.on_ddl(_ddl("drop", oid=5))  # DROP TABLE t5: p (not described) read whole
    assert [(r.oid, p.oid, h) for r, p, h in builder.detach_partitions()] == \
        [(1, 5, "dropped")]
    builder.commit(300, 0)
    builder.on_ddl(_ddl("truncate_partition", oid=2, ancestors={"4": {"pgcdc": None}}))
    assert [(r.oid, p.oid, h) for r, p, h in builder.detach_partitions()] == \
        [(4, 2, "truncated")]
    builder.rollback()
    builder.on_ddl(_ddl("truncate_partition", oid=2, ancestors={"4": {"other": None}}))
    assert builder.detach_partitions() == []  # q not in this publication
    builder.rollback()

    restarted = SnapshotBuilder(HistoryFile(tmp_path).load(), publication="pgcdc")
    restarted.resume(300)  # membership unknown after a restart: q counts as published
    restarted.on_ddl(_ddl("drop", oid=2))
    assert [(r.oid, p.oid, h) for r, p, h in restarted.detach_partitions()] == \
        [(4, 2, "dropped")]


def test_publication_membership_is_recorded_and_entries_are_read_again(
        tmp_path: Path) -> None:
    """Issue 15: a table the trigger describes outside the publication gets a version
    ``published=False`` (attached under a root published via the root: the lake retires
    its own table); one put back in it, or added to it (``entered``), is read again."""
    builder = SnapshotBuilder(HistoryFile(tmp_path).load(), publication="pgcdc")
    builder.start_consistent([], 10)
    builder.on_ddl(_part(1, None, True))  # the root, published via the root
    builder.on_ddl(_part(2, 1, False))
    builder.on_ddl(_part(3, None, True))  # a table of its own, with rows
    assert builder.entered == set()
    builder.commit(100, 0)
    builder.on_ddl(_part(1, None, True))  # ATTACH PARTITION t3
    builder.on_ddl(_part(3, 1, False))
    assert set(builder.rewritten) == {1} and builder.entered == set()
    builder.commit(200, 0)
    attached = builder.history.latest.table(3)
    assert attached is not None and not attached.published
    assert builder.history.latest.table(1).published  # type: ignore[union-attr]
    builder.on_ddl(_part(1, None, True))  # DETACH PARTITION t3: not described after it
    builder.on_ddl(_part(2, 1, False))
    assert [(r.oid, p.oid, p.published) for r, p, _ in builder.detach_partitions()] == \
        [(1, 3, True)]  # published on its own again, as far as the stream can tell
    builder.commit(300, 0)
    assert builder.history.latest.table(3).published  # type: ignore[union-attr]
    builder.on_ddl(_part(3, None, False))  # ALTER PUBLICATION ... DROP TABLE t3
    assert builder.entered == set()
    builder.commit(400, 0)
    builder.on_ddl(_part(3, None, True))  # back in, described without ``entered``
    assert builder.entered == {3}
    builder.commit(500, 0)
    entering = json.loads(_part(4, None, True))
    builder.on_ddl(json.dumps({**entering, "entered": True}).encode())  # ADD TABLE t4
    assert builder.entered == {4}
    builder.rollback()
    builder.on_ddl(json.dumps({**json.loads(_part(4, None, False)), "entered": True}).encode())
    assert builder.entered == set()  # added to another publication


def test_a_composite_changed_gives_the_tables_holding_it_a_version() -> None:
    """Issue 17: a composite's attributes changed: each table with a column of it gets a
    new version (``types`` set), its values read differently (a typed Avro schema names the
    attributes); a later description of the table keeps it; other tables stay."""
    pair = {"oid": 16600, "schema": "public", "name": "pair", "kind": "composite",
            "labels": None, "base_oid": None, "typmod": -1, "not_null": None,
            "default": None, "constraints": None, "comment": None,
            "attributes": [{"name": "a", "type_oid": 23, "typmod": -1}]}
    holds = TableVersion(1, "public", "holds", "d", (Column("id", 23, "int4", -1, True),
                                                     Column("p", 16600, "pair", -1, False)))
    builder = SnapshotBuilder()
    builder.start_consistent([], 10)
    builder.on_ddl(_ddl("put_type", type=pair))
    builder.on_ddl(_ddl("put", table=holds.to_dict()))
    builder.on_ddl(_put(2, 1))
    builder.commit(20, 0)
    assert builder.take_retyped() == []
    grown = dict(pair, attributes=[*pair["attributes"],  # type: ignore[misc]
                                   {"name": "b", "type_oid": 25, "typmod": -1}])
    builder.on_ddl(_ddl("put_type", type=grown))
    (retyped,) = builder.take_retyped()
    assert retyped.oid == 1 and retyped.types is not None and builder.take_retyped() == []
    assert retyped.version != holds.version and builder.table(1) == retyped
    builder.on_ddl(_ddl("put", table=holds.to_dict()))  # the trigger describes it again
    assert builder.table(1) == retyped
    builder.commit(30, 0)
    assert builder.history.table_at(1, 29) == holds
    assert builder.history.table_at(1, 30) == retyped
    assert builder.history.table_at(2, 30) == _table(2, 1)


def test_a_transaction_an_older_pgcdc_recorded_is_sent_again_after_an_upgrade(
        tmp_path: Path) -> None:
    """An older pgcdc recorded a transaction without publication membership (a table
    described outside the publication) or a type change's table versions; sent again after
    the upgrade (a crash before the flush), it is the same transaction, not another
    slot's history: nothing is appended, and the next one is recorded as usual."""
    old = SnapshotBuilder(HistoryFile(tmp_path).load(), publication="pgcdc")
    old.start_consistent([], 10)
    old.history.append(PutTable(_table(1, 1)), lsn=100)  # as an older pgcdc wrote it
    old.history.append(PutTable(_table(2, 1)), lsn=200)
    restarted = SnapshotBuilder(HistoryFile(tmp_path).load(), publication="pgcdc")
    restarted.resume()
    restarted.on_ddl(_ddl("put", table=_table(1, 1).to_dict(), publications={}))
    restarted.commit(100, 0)  # outside the publication, as the trigger says now
    restarted.on_ddl(_put(2, 1))
    restarted.commit(200, 0)
    assert restarted.history.latest.version == 2
    restarted.on_ddl(_ddl("put", table=_table(3, 1).to_dict(), publications={}))
    restarted.commit(300, 0)
    latest = restarted.history.latest.table(3)
    assert latest is not None and not latest.published
