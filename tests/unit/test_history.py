"""T2: the time-travel catalog against a simple reference model, persistence and golden files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from snapshot_builder.catalog import Column, TableVersion
from snapshot_builder.datatype import TypeVersion
from snapshot_builder.history import (
    CatalogError,
    CatalogGapError,
    CatalogHistory,
    DropTable,
    DropType,
    Entry,
    HistoryFile,
    PutTable,
    PutType,
)

GOLDEN = Path(__file__).parent.parent / "golden" / "catalog_v1"
GOLDEN_V2 = Path(__file__).parent.parent / "golden" / "catalog_v2"


def _table(oid: int, name: str, ncols: int, typ: int = 23) -> TableVersion:
    cols = tuple(Column(f"c{i}", typ, "int4" if typ == 23 else "text", -1, i == 0)
                 for i in range(ncols))
    return TableVersion(oid, "public", name, "d", cols)


def _enum(oid: int, labels: int) -> TypeVersion:
    return TypeVersion(oid, "public", f"e{oid}", "enum", tuple(f"l{i}" for i in range(labels)))


Objects = dict[tuple[str, int], object]  # ("table" | "type", oid) -> definition


class HistoryMachine(RuleBasedStateMachine):
    """Every lookup equals a reference that simply stores every full catalog."""

    def __init__(self) -> None:
        super().__init__()
        self.history = CatalogHistory(checkpoint_every=3)
        self.reference: list[tuple[int, Objects]] = [(0, {})]
        self.lsn = 0

    def _record(self, change: PutTable | DropTable | PutType | DropType, gap: int) -> None:
        self.lsn += gap
        objects = dict(self.reference[-1][1])
        if isinstance(change, PutTable):
            objects["table", change.table.oid] = change.table
        elif isinstance(change, PutType):
            objects["type", change.type.oid] = change.type
        else:
            objects.pop(("table" if isinstance(change, DropTable) else "type", change.oid),
                        None)
        self.history.append(change, lsn=self.lsn, expected_version=len(self.reference) - 1)
        self.reference.append((self.lsn, objects))

    @staticmethod
    def _split(objects: Objects) -> tuple[dict[int, object], dict[int, object]]:
        return ({oid: o for (kind, oid), o in objects.items() if kind == "table"},
                {oid: o for (kind, oid), o in objects.items() if kind == "type"})

    @rule(oid=st.integers(1, 5), ncols=st.integers(1, 4), text=st.booleans(),
          gap=st.integers(0, 3))
    def put(self, oid: int, ncols: int, text: bool, gap: int) -> None:
        self._record(PutTable(_table(oid, f"t{oid}", ncols, 25 if text else 23)), gap)

    @rule(oid=st.integers(1, 5), gap=st.integers(0, 3))
    def drop(self, oid: int, gap: int) -> None:
        self._record(DropTable(oid), gap)

    @rule(oid=st.integers(20000, 20003), labels=st.integers(1, 3), gap=st.integers(0, 3))
    def put_type(self, oid: int, labels: int, gap: int) -> None:
        self._record(PutType(_enum(oid, labels)), gap)

    @rule(oid=st.integers(20000, 20003), gap=st.integers(0, 3))
    def drop_type(self, oid: int, gap: int) -> None:
        self._record(DropType(oid), gap)

    @precondition(lambda self: len(self.reference) > 2)
    @rule(data=st.data())
    def compact(self, data: st.DataObject) -> None:
        lsn = data.draw(st.integers(self.history.base.lsn, self.lsn))
        self.history.compact(lsn)

    @invariant()
    def versions_and_lsns_match(self) -> None:
        base = self.history.base.version
        for version in range(base, len(self.reference)):
            got = self.history.catalog(version)
            assert (dict(got.tables), dict(got.types)) == self._split(self.reference[version][1])
        for lsn in range(self.history.base.lsn, self.lsn + 2):
            expected = max(v for v in range(base, len(self.reference))
                           if self.reference[v][0] <= lsn)
            got = self.history.catalog_at(lsn)
            assert got.version == expected
            tables, types = self._split(self.reference[expected][1])
            assert (dict(got.tables), dict(got.types)) == (tables, types)
            for oid in range(1, 7):  # the per-table index answers as the catalog does
                assert self.history.table_at(oid, lsn) == tables.get(oid)

    @invariant()
    def older_versions_are_gone_after_compaction(self) -> None:
        if self.history.base.version > 0:
            with pytest.raises(CatalogError):
                self.history.catalog(self.history.base.version - 1)


TestHistoryMachine = HistoryMachine.TestCase
TestHistoryMachine.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)


def test_append_checks_the_expected_version() -> None:
    history = CatalogHistory()
    history.append(PutTable(_table(1, "a", 1)), lsn=10, expected_version=0)
    with pytest.raises(CatalogGapError, match="expected version 0"):
        history.append(PutTable(_table(1, "a", 2)), lsn=11, expected_version=0)
    with pytest.raises(CatalogGapError, match="older"):
        history.append(DropTable(1), lsn=5)


def test_extend_equals_appends_and_checks_each_entry(tmp_path: Path) -> None:
    changes = [PutTable(_table(1, "a", 1)), PutTable(_table(2, "b", 2)),
               PutTable(_table(1, "a", 3)), DropTable(2), PutType(_enum(9, 2))]
    one_by_one = CatalogHistory(checkpoint_every=2)
    for i, change in enumerate(changes):
        one_by_one.append(change, lsn=10 + i // 2, commit_time=i)
    at_once = CatalogHistory(checkpoint_every=2, file=HistoryFile(tmp_path))
    assert at_once.extend(list(one_by_one.entries())) == one_by_one.latest
    assert list(at_once.entries()) == list(one_by_one.entries())
    for lsn in range(9, 13):
        assert at_once.catalog_at(lsn) == one_by_one.catalog_at(lsn)
    assert list(HistoryFile(tmp_path).load().entries()) == list(one_by_one.entries())
    gap = Entry(7, 20, 0, DropTable(1))
    with pytest.raises(CatalogGapError, match="version 7 follows version 5"):
        at_once.extend([gap])
    with pytest.raises(CatalogGapError, match="older"):
        at_once.extend([Entry(6, 11, 0, DropTable(1))])
    assert at_once.latest.version == 5  # nothing of a refused batch recorded


def test_persisted_history_survives_restart_and_a_torn_write(tmp_path: Path) -> None:
    history = HistoryFile(tmp_path).load()
    history.append(PutTable(_table(1, "a", 1)), lsn=10)
    history.append(PutTable(_table(1, "a", 2)), lsn=20)
    history.append(PutTable(_table(2, "b", 1)), lsn=20)
    with (tmp_path / "catalog.log").open("ab") as fh:  # a crash in the middle of an append
        fh.write(b'{"format":1,"version":4,"ls')
    again = HistoryFile(tmp_path).load()
    assert again.latest.version == 3
    assert again.table_at(1, 15) == _table(1, "a", 1)
    assert sorted(again.catalog_at(20).tables) == [1, 2]
    again.append(DropTable(2), lsn=30)  # appends cleanly after the torn line was cut
    assert HistoryFile(tmp_path).load().latest.version == 4


def test_compaction_keeps_what_readers_need(tmp_path: Path) -> None:
    history = HistoryFile(tmp_path).load()
    for i in range(1, 11):
        history.append(PutTable(_table(1, "a", i)), lsn=i * 10)
    history.compact(55)
    assert history.base.version == 5
    assert history.catalog_at(55).table(1) == _table(1, "a", 5)
    reloaded = HistoryFile(tmp_path).load()
    assert reloaded.base.version == 5 and reloaded.latest.version == 10
    assert reloaded.catalog_at(99).table(1) == _table(1, "a", 9)
    with pytest.raises(CatalogError, match="compacted"):
        reloaded.catalog(4)


def test_damaged_middle_line_is_an_error(tmp_path: Path) -> None:
    history = HistoryFile(tmp_path).load()
    history.append(PutTable(_table(1, "a", 1)), lsn=10)
    history.append(PutTable(_table(1, "a", 2)), lsn=20)
    lines = (tmp_path / "catalog.log").read_bytes().split(b"\n")
    (tmp_path / "catalog.log").write_bytes(b"\n".join([b"garbage", *lines[1:]]))
    with pytest.raises(CatalogError, match="damaged"):
        HistoryFile(tmp_path).load()


def test_golden_catalog_files_stay_readable(tmp_path: Path) -> None:
    """Files written by format 1; a later format must keep reading them."""
    shutil.copytree(GOLDEN, tmp_path / "golden")
    history = HistoryFile(tmp_path / "golden").load()
    assert (history.base.version, history.latest.version) == (2, 5)
    orders = history.table_at(16400, 0x3000)
    assert orders is not None
    assert [c.name for c in orders.columns] == ["id", "amount", "note"]
    assert orders.columns[2].not_null is False and orders.comment == "orders placed"
    assert history.table_at(16401, 0x5000) is None  # dropped
    renamed = history.catalog_at(0x6000).table(16400)
    assert renamed is not None and renamed.name == "purchases"
    assert renamed.layout == orders.layout and renamed.meta != orders.meta


def test_golden_v2_files_with_types_stay_readable(tmp_path: Path) -> None:
    """Format 2 (types as catalog objects) beside format 1 table entries."""
    shutil.copytree(GOLDEN_V2, tmp_path / "golden")
    history = HistoryFile(tmp_path / "golden").load()
    assert (history.base.version, history.latest.version) == (3, 8)
    assert history.verify() == 2  # orders in the snapshot and in version 7
    at_base = history.catalog_at(0x1000)
    mood = at_base.type(16500)
    assert mood is not None and mood.kind == "enum" and mood.labels == ("sad", "ok")
    array = at_base.type(16499)
    assert array is not None and array.kind == "array" and array.base_oid == 16500
    grown = history.type_at(16500, 0x2000)
    assert grown is not None and grown.labels == ("sad", "ok", "happy")
    assert grown.version != mood.version
    positive = history.type_at(16510, 0x3000)
    assert positive is not None and positive.kind == "domain" and positive.base_oid == 23
    assert positive.constraints == ("CHECK ((VALUE > 0))",) and positive.not_null is True
    point = history.type_at(16520, 0x4000)
    assert point is not None and [(a.name, a.type_oid) for a in point.attributes] == \
        [("x", 701), ("y", 701)]
    assert history.type_at(16520, 0x6000) is None  # dropped
    orders = history.table_at(16400, 0x5000)
    assert orders is not None and history.catalog_at(0x5000).column_type(
        orders.columns[1]) == grown
    schema = history.latest.schema("public")
    assert schema is not None and [t.name for t in schema.tables] == ["orders"]
    assert {t.name for t in schema.types} == {"mood", "_mood", "positive"}
    int4 = history.latest.type(23)
    assert int4 is not None and int4.kind == "base" and int4.name == "int4"


def test_table_versions_load_as_stored_and_verify_finds_an_edit(tmp_path: Path) -> None:
    history = HistoryFile(tmp_path).load()
    history.append(PutTable(_table(1, "a", 1)), lsn=10)
    history.append(PutTable(_table(1, "a", 2)), lsn=20)
    history.close()
    log = tmp_path / "catalog.log"
    first, second, _ = log.read_bytes().split(b"\n")
    log.write_bytes(b"\n".join([first.replace(b'"name":"a"', b'"name":"z"'), second, b""]))
    edited = HistoryFile(tmp_path).load()  # the older version is taken as stored
    with pytest.raises(CatalogError, match="edited or damaged"):
        edited.verify()
    log.write_bytes(b"\n".join([first, second.replace(b'"name":"a"', b'"name":"z"'), b""]))
    with pytest.raises(CatalogError, match="edited or damaged"):  # the latest: at load
        HistoryFile(tmp_path).load()


def test_loaded_versions_equal_fresh_ones_and_share_columns(tmp_path: Path) -> None:
    history = HistoryFile(tmp_path).load()
    for i in range(1, 6):
        history.append(PutTable(_table(1, "a", i)), lsn=i)
    loaded = HistoryFile(tmp_path).load()
    for i in range(1, 6):
        table = loaded.table_at(1, i)
        assert table == _table(1, "a", i) and table is not None
        assert table.version == _table(1, "a", i).version
    last, before = loaded.table_at(1, 5), loaded.table_at(1, 4)
    assert last is not None and before is not None
    assert last.columns[0] is before.columns[0]  # one object for an unchanged column


def test_read_only_load_leaves_a_torn_line_alone(tmp_path: Path) -> None:
    history = HistoryFile(tmp_path).load()
    history.append(PutTable(_table(1, "a", 1)), lsn=10)
    torn = b'{"format":1,"version":2,"ls'
    with (tmp_path / "catalog.log").open("ab") as fh:
        fh.write(torn)
    seen = HistoryFile(tmp_path).load(read_only=True)
    assert seen.latest.version == 1 and seen.file is None
    assert (tmp_path / "catalog.log").read_bytes().endswith(torn)


def test_unknown_future_format_names_the_fix(tmp_path: Path) -> None:
    (tmp_path / "catalog.log").write_text('{"format":3,"version":1,"lsn":1,"commit_time":0,'
                                          '"type":"drop_table","oid":1}\n')
    with pytest.raises(CatalogError, match="upgrade pgcdc"):
        HistoryFile(tmp_path).load()
