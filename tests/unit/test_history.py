"""T2: the time-travel catalog against a simple reference model, persistence and golden files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from snapshot_builder.catalog import Column, TableVersion
from snapshot_builder.history import (
    CatalogError,
    CatalogGapError,
    CatalogHistory,
    DropTable,
    HistoryFile,
    PutTable,
)

GOLDEN = Path(__file__).parent.parent / "golden" / "catalog_v1"


def _table(oid: int, name: str, ncols: int, typ: int = 23) -> TableVersion:
    cols = tuple(Column(f"c{i}", typ, "int4" if typ == 23 else "text", -1, i == 0)
                 for i in range(ncols))
    return TableVersion(oid, "public", name, "d", cols)


class HistoryMachine(RuleBasedStateMachine):
    """Every lookup equals a reference that simply stores every full catalog."""

    def __init__(self) -> None:
        super().__init__()
        self.history = CatalogHistory(checkpoint_every=3)
        self.reference: list[tuple[int, dict[int, TableVersion]]] = [(0, {})]
        self.lsn = 0

    def _record(self, change: PutTable | DropTable, gap: int) -> None:
        self.lsn += gap
        tables = dict(self.reference[-1][1])
        if isinstance(change, PutTable):
            tables[change.table.oid] = change.table
        else:
            tables.pop(change.oid, None)
        self.history.append(change, lsn=self.lsn, expected_version=len(self.reference) - 1)
        self.reference.append((self.lsn, tables))

    @rule(oid=st.integers(1, 5), ncols=st.integers(1, 4), text=st.booleans(),
          gap=st.integers(0, 3))
    def put(self, oid: int, ncols: int, text: bool, gap: int) -> None:
        self._record(PutTable(_table(oid, f"t{oid}", ncols, 25 if text else 23)), gap)

    @rule(oid=st.integers(1, 5), gap=st.integers(0, 3))
    def drop(self, oid: int, gap: int) -> None:
        self._record(DropTable(oid), gap)

    @precondition(lambda self: len(self.reference) > 2)
    @rule(data=st.data())
    def compact(self, data: st.DataObject) -> None:
        lsn = data.draw(st.integers(self.history.base.lsn, self.lsn))
        self.history.compact(lsn)

    @invariant()
    def versions_and_lsns_match(self) -> None:
        base = self.history.base.version
        for version in range(base, len(self.reference)):
            assert dict(self.history.catalog(version).tables) == self.reference[version][1]
        for lsn in range(self.history.base.lsn, self.lsn + 2):
            expected = max(v for v in range(base, len(self.reference))
                           if self.reference[v][0] <= lsn)
            got = self.history.catalog_at(lsn)
            assert got.version == expected
            assert dict(got.tables) == self.reference[expected][1]

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
