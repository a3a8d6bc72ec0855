"""Which DDL changes stored rows without row changes in the WAL (snapshot_builder/ddl.py
``rows_rewritten``, the ``rewrite`` message) and how the builder keeps them per transaction."""

from __future__ import annotations

import dataclasses
import json

from snapshot_builder.builder import SnapshotBuilder
from snapshot_builder.catalog import Column, TableVersion
from snapshot_builder.datatype import Attribute, TypeVersion
from snapshot_builder.ddl import (
    RewriteTable,
    parse_message,
    rows_rewritten,
    tables_using,
    values_changed,
)
from snapshot_builder.history import PutTable, PutType


def _table(*columns: Column, oid: int = 1) -> TableVersion:
    return TableVersion(oid, "public", "t", "d", columns)


ID = Column("id", 23, "int4", -1, True, True, None, 1)


def test_a_column_added_with_a_default_changes_the_rows() -> None:
    before = _table(ID)
    added = Column("c", 1700, "numeric", 655366, False, False, "4", 2)
    assert rows_rewritten(before, _table(ID, added)) == "column(s) c added with a default"
    volatile = Column("r", 701, "float8", -1, False, False, "random()", 3)
    assert rows_rewritten(before, _table(ID, added, volatile)) == \
        "column(s) c, r added with a default"


def test_what_leaves_the_rows_alone() -> None:
    before = _table(ID)
    no_default = Column("c", 23, "int4", -1, False, False, None, 2)
    null_default = Column("c", 23, "int4", -1, False, False, "NULL::integer", 2)
    assert rows_rewritten(before, _table(ID, no_default)) is None
    assert rows_rewritten(before, _table(ID, null_default)) is None
    assert rows_rewritten(None, _table(ID, Column("c", 23, "int4", -1, False, False, "1", 2))) \
        is None  # a new table: the stream has every row it holds
    with_default = _table(ID, Column("c", 23, "int4", -1, False, False, "1", 2))
    # a default set on an existing column changes no row
    assert rows_rewritten(_table(ID, no_default), with_default) is None
    # the same column dropped and added again (another attnum) with a default: changed
    again = _table(ID, Column("c", 23, "int4", -1, False, False, "1", 3))
    assert rows_rewritten(with_default, again) == "column(s) c added with a default"


def test_the_rewrite_message() -> None:
    change = parse_message(json.dumps({"op": "rewrite", "oid": 42, "reason": 6}).encode())
    assert change == RewriteTable(42, "a volatile default, a column's type changed")


def test_the_builder_keeps_the_rewritten_tables_of_the_open_transaction() -> None:
    builder = SnapshotBuilder()
    builder.start_consistent([PutTable(_table(ID))], 10)
    added = _table(ID, Column("c", 23, "int4", -1, False, False, "7", 2))
    builder.on_ddl(json.dumps({"op": "put", "table": added.to_dict()}).encode())
    builder.on_ddl(json.dumps({"op": "rewrite", "oid": 9, "reason": 4}).encode())
    assert builder.rewritten == {1: "column(s) c added with a default",
                                 9: "a column's type changed"}
    builder.commit(20, 0)
    assert builder.rewritten == {}
    builder.on_ddl(json.dumps({"op": "rewrite", "oid": 9, "reason": 2}).encode())
    builder.rollback()  # a transaction that rolled back rewrote nothing
    assert builder.rewritten == {}
    assert builder.catalog.table(1) == added


def test_a_table_outside_the_publication_is_left_alone() -> None:
    builder = SnapshotBuilder(publication="pub")
    builder.start_consistent([PutTable(_table(ID))], 10)
    added = _table(ID, Column("c", 23, "int4", -1, False, False, "7", 2))
    builder.on_ddl(json.dumps({"op": "put", "table": added.to_dict(),
                               "publications": {"other": ["id", "c"]}}).encode())
    builder.on_ddl(json.dumps({"op": "rewrite", "oid": 1, "reason": 2}).encode())
    assert builder.rewritten == {}
    builder.rollback()
    builder.on_ddl(json.dumps({"op": "put", "table": added.to_dict(),
                               "publications": {"pub": ["id", "c"]}}).encode())
    assert builder.rewritten == {1: "column(s) c added with a default"}


def test_a_partition_rewritten_has_its_root_read_again() -> None:
    """PostgreSQL rewrites a partitioned table's partitions, not the table (bench seed
    71000214000008): a root published via the root is read again; the partition, which that
    publication leaves out, is not."""
    builder = SnapshotBuilder(publication="pub")
    root = dataclasses.replace(_table(ID, oid=1), name="r")
    middle = dataclasses.replace(_table(ID, oid=2), name="m", partition_parent=1)
    leaf = dataclasses.replace(_table(ID, oid=3), name="l", partition_parent=2)
    builder.start_consistent([PutTable(root), PutTable(middle), PutTable(leaf)], 10)
    builder.on_ddl(json.dumps({"op": "put", "table": leaf.to_dict(),
                               "publications": {"other": None}}).encode())  # left out
    builder.on_ddl(json.dumps({"op": "rewrite", "oid": 3, "reason": 4}).encode())
    assert builder.rewritten == {1: "its partition public.l rewritten (a column's type changed)",
                                 2: "its partition public.l rewritten (a column's type changed)"}


def test_a_table_rewritten_while_it_is_read_is_read_again_after() -> None:
    from loads.incremental import IncrementalSnapshots
    from tests.recording_sink import RecordingSink

    snapshots = IncrementalSnapshots("dbname=none", RecordingSink())  # never started
    snapshots.request(['"public"."t"', '"public"."u"'])
    snapshots.request(['"public"."t"'])  # a plain request of a queued table: nothing new
    assert [j.table for j in snapshots.state.jobs] == ['"public"."t"', '"public"."u"']
    # t is being read (the first job, maybe halfway through) when a DDL rewrites it
    snapshots.read_again('"public"."t"', 41)
    snapshots.read_again('"public"."u"', 42)  # waiting its turn: it reads the new rows
    assert [(j.table, j.oid) for j in snapshots.state.jobs] == [
        ('"public"."t"', None), ('"public"."u"', None), ('"public"."t"', 41)]
    snapshots.read_again('"public"."t"', 41)  # already waiting its turn
    snapshots.read_again('"public"."t"', 43)  # another table under the name: read it too
    assert [(j.table, j.oid) for j in snapshots.state.jobs][2:] == [
        ('"public"."t"', 41), ('"public"."t"', 43)]


PAIR = TypeVersion(16500, "public", "pair", "composite",
                   attributes=(Attribute("a", 23), Attribute("b", 25)))
MOOD = TypeVersion(16510, "public", "mood", "enum", labels=("calm", "busy"))


def test_type_changes_that_change_stored_values() -> None:
    grown = dataclasses.replace(PAIR, attributes=(*PAIR.attributes, Attribute("x", 23)))
    assert values_changed(PAIR, grown) == "the attributes of type public.pair changed"
    renamed = dataclasses.replace(PAIR, attributes=(Attribute("a", 23), Attribute("c", 25)))
    assert values_changed(PAIR, renamed) == "the attributes of type public.pair changed"
    relabelled = dataclasses.replace(MOOD, labels=("calm", "rushed"))
    assert values_changed(MOOD, relabelled) == "a label of type public.mood was renamed"


def test_type_changes_that_leave_stored_values_alone() -> None:
    assert values_changed(None, PAIR) is None  # a new type
    assert values_changed(MOOD, dataclasses.replace(MOOD, labels=("calm", "ok", "busy"))) \
        is None  # a label added
    assert values_changed(PAIR, dataclasses.replace(PAIR, name="pair2")) is None  # renamed
    domain = TypeVersion(16520, "public", "amount", "domain", base_oid=1700)
    assert values_changed(domain, dataclasses.replace(domain, constraints=("CHECK (VALUE > 0)",))
                          ) is None


def test_the_tables_holding_a_type_at_any_depth() -> None:
    array = TypeVersion(16501, "public", "_pair", "array", base_oid=PAIR.oid)
    domain = TypeVersion(16530, "public", "pairs", "domain", base_oid=array.oid)
    outer = TypeVersion(16540, "public", "outer", "composite",
                        attributes=(Attribute("p", domain.oid),))
    types = {t.oid: t for t in (PAIR, array, domain, outer, MOOD)}
    direct = _table(ID, Column("p", PAIR.oid, "pair", -1, False, False, None, 2), oid=1)
    nested = _table(ID, Column("o", outer.oid, "outer", -1, False, False, None, 2), oid=2)
    other = _table(ID, Column("m", MOOD.oid, "mood", -1, False, False, None, 2), oid=3)
    assert [t.oid for t in tables_using([direct, nested, other], types, PAIR.oid)] == [1, 2]
    assert [t.oid for t in tables_using([direct, nested, other], types, MOOD.oid)] == [3]


def test_the_builder_reads_again_the_tables_of_a_changed_composite() -> None:
    builder = SnapshotBuilder()
    holder = _table(ID, Column("p", PAIR.oid, "pair", -1, False, False, None, 2))
    builder.start_consistent([PutType(PAIR), PutTable(holder),
                              PutTable(_table(ID, oid=2))], 10)
    grown = dataclasses.replace(PAIR, attributes=(*PAIR.attributes, Attribute("x", 23)))
    builder.on_ddl(json.dumps({"op": "put_type", "type": grown.to_dict()}).encode())
    assert builder.rewritten == {1: "the attributes of type public.pair changed"}
    builder.commit(20, 0)
    assert builder.catalog.type(PAIR.oid) == grown
