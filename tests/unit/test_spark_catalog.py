"""The Spark job's catalog: the builder's history replayed from its topic records, and tables
resolved through it (pure logic, no Spark session)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from core.wire import table_name, topic_name
from snapshot_builder.catalog import Column, TableVersion, table_from_dict
from snapshot_builder.datatype import TypeVersion
from snapshot_builder.history import (
    CatalogHistory,
    Change,
    DropTable,
    Entry,
    HistoryFile,
    PutTable,
    PutType,
)
from streaming.apply import TableBatch, _lives
from streaming.catalog import CatalogLog, LakeCatalog, replay
from streaming.ownership import LakeOwnerError, replaces
from streaming.schema import TableSpec

GOLDEN = Path(__file__).parent.parent / "golden"
TOPIC_GOLDEN = GOLDEN / "catalog_topic" / "catalog_history.jsonl"

NAME = 'we"ird;name'  # a quote and a semicolon


def _table(oid: int, name: str, *extra: str) -> TableVersion:
    columns = [Column("id", 23, "int4", -1, True, True, None, 1),
               Column("a", 25, "text", -1, False, False, None, 2)]
    columns += [Column(n, 23, "int4", -1, False, False, None, 3 + i) for i, n in enumerate(extra)]
    return TableVersion(oid, "public", name, "d", tuple(columns))


def _entries() -> list[Entry]:
    """A history with what the lake must follow: a column added, a table dropped and created
    again under its name (the same definition, so the same version), a type."""
    changes: list[tuple[int, Change]] = [
        (100, PutTable(_table(16400, "ev"))),
        (100, PutTable(_table(16410, NAME))),
        (200, PutTable(_table(16400, "ev", "b"))),
        (300, PutType(TypeVersion(16500, "public", "mood", "enum", ("sad", "ok")))),
        (400, DropTable(16410)),
        (500, PutTable(_table(16420, NAME))),
    ]
    return [Entry(version, lsn, 817_000_000_000_000 + version, change)
            for version, (lsn, change) in enumerate(changes, 1)]


def _record(table: TableVersion, lsn: int, prefix: str = "pg") -> str:
    """A ``<prefix>._catalog`` record as sinks/kafka.py KafkaSink.publish_table writes it."""
    return json.dumps(dict(table.to_dict(), lsn=lsn, topic=f"{prefix}.public.{table.name}",
                           value_format="json"))


def test_golden_topic_records_are_the_history_serialization() -> None:
    """Both sides of the wire: the records the pipeline publishes (Entry.to_json) are these
    bytes, and the job's replay of them is the builder's history."""
    lines = TOPIC_GOLDEN.read_text().splitlines()
    assert [e.to_json() for e in _entries()] == lines  # the producer's serialization
    history = replay(lines)
    reference = CatalogHistory()
    for entry in _entries():
        reference.append(entry.change, lsn=entry.lsn, commit_time=entry.commit_time)
    assert list(history.entries()) == list(reference.entries())
    for lsn in (100, 150, 200, 399, 400, 499, 500, 10_000):
        assert history.catalog_at(lsn).tables == reference.catalog_at(lsn).tables
        assert history.catalog_at(lsn).types == reference.catalog_at(lsn).types


def test_replay_reads_a_persisted_history_log() -> None:
    """The history file's log lines (format 1 and 2) replay to the entries the file loads."""
    for folder in ("catalog_v1", "catalog_v2"):
        lines = (GOLDEN / folder / "catalog.log").read_text().splitlines()
        loaded = HistoryFile(GOLDEN / folder).load(read_only=True)
        replayed = replay(lines)
        assert list(replayed.entries())[-len(list(loaded.entries())):] == list(loaded.entries())
        assert replayed.latest.version == loaded.latest.version


def test_replay_repeats_supersession_and_gaps() -> None:
    lines = [e.to_json() for e in _entries()]
    # every run publishes its entries again; order within the topic is the producer's
    assert list(replay(lines[:4] + lines + lines[2:]).entries()) == _entries()
    # a version not published yet: the history ends before it
    assert replay(lines[:3] + lines[4:]).latest.version == 3
    # a history built anew (another slot) replaces the versions from the first that differs
    other = Entry(2, 900, 0, PutTable(_table(16999, "fresh"))).to_json()
    rebuilt = replay([*lines, other])
    assert rebuilt.latest.version == 2 and rebuilt.latest.table(16999) is not None
    assert replay([]).latest.version == 0


def _catalog(history_lines: list[str], records: list[str]) -> LakeCatalog:
    return LakeCatalog(CatalogLog([TableSpec.from_json(r) for r in records]),
                       replay(history_lines), prefix="pg")


def test_newest_shape_is_the_historys_not_the_published_order() -> None:
    """Issue 15 point 4: an initial load publishes version 1 at its LSN, the stream then
    published version 2 with LSN 0 (a Relation message's); the history knows 2 is newer."""
    v1, v2 = _table(16400, "ev"), _table(16400, "ev", "b")
    records = [_record(v1, 150), _record(v2, 0)]
    assert CatalogLog([TableSpec.from_json(r) for r in records]).latest(16400).version \
        == v1.version  # what the records alone say
    catalog = _catalog([e.to_json() for e in _entries()], records)
    latest = catalog.latest(16400)
    assert latest.version == v2.version and [c.name for c in latest.columns] == ["id", "a", "b"]
    assert latest.lsn == 200 and latest.topic == "pg.public.ev"
    assert [s.version for s in catalog.versions(16400)] == [v1.version, v2.version]
    assert catalog.resolve(16400, 199) is not None
    assert catalog.resolve(16400, 199).version == v1.version  # type: ignore[union-attr]
    assert catalog.resolve(16400, 200).version == v2.version  # type: ignore[union-attr]


def test_a_version_the_history_has_not_published_yet_counts_by_its_record() -> None:
    v1, v2, v3 = _table(16400, "ev"), _table(16400, "ev", "b"), _table(16400, "ev", "b", "c")
    catalog = _catalog([e.to_json() for e in _entries()],
                       [_record(v1, 150), _record(v2, 250), _record(v3, 700)])
    assert catalog.latest(16400).version == v3.version
    assert [s.lsn for s in catalog.versions(16400)] == [100, 200, 700]


def test_without_captured_ddl_the_records_decide() -> None:
    """No event trigger: the history holds no tables; the records' LSNs order the versions."""
    v1, v2 = _table(16400, "ev"), _table(16400, "ev", "b")
    catalog = _catalog([], [_record(v2, 900), _record(v1, 150)])
    assert not catalog.knows(16400)
    assert catalog.latest(16400).version == v2.version
    assert catalog.born(16400) == 150 and catalog.dropped(16400) is None
    assert catalog.resolve(16400, 1000) is None
    assert [t.oid for t in catalog.tables()] == [16400] and catalog.drops() == []


def test_a_table_dropped_and_created_again_is_two_lives() -> None:
    old, new = _table(16410, NAME), _table(16420, NAME)
    assert old.version == new.version  # the same definition: the same version header
    catalog = _catalog([e.to_json() for e in _entries()],
                       [_record(old, 100), _record(new, 500), _record(_table(16400, "ev"), 100)])
    assert catalog.dropped(16410) == 400 and catalog.dropped(16420) is None
    assert catalog.born(16410) == 100 and catalog.born(16420) == 500
    assert catalog.latest(16410).oid == 16410 and catalog.latest(16420).oid == 16420
    assert catalog.resolve(16410, 399) is not None and catalog.resolve(16410, 400) is None
    assert catalog.resolve(16420, 499) is None and catalog.resolve(16420, 500) is not None
    assert [(s.oid, lsn) for s, lsn in catalog.drops()] == [(16410, 400)]
    assert sorted(t.oid for t in catalog.tables()) == [16400, 16420]
    # the batch applies the old life (and its drop) before the new one, whatever the OIDs
    summary = {oid: TableBatch(None, frozenset({"c"})) for oid in (16420, 16410, 16400)}
    assert _lives(summary, catalog) == [16400, 16410, 16420]


def test_a_version_only_the_history_holds_gets_its_topic() -> None:
    catalog = _catalog([e.to_json() for e in _entries()], [])
    spec = catalog.latest(16420)
    assert spec.name == NAME and spec.topic == topic_name("pg", "public", NAME)
    assert [c.attnum for c in spec.columns] == [1, 2]


@pytest.mark.parametrize("lsn", [0, 150])
def test_catalog_log_interface(lsn: int) -> None:
    v1 = _table(16400, "ev")
    catalog = _catalog([], [_record(v1, lsn)])
    assert catalog.version(16400, v1.version) is not None
    assert catalog.by_version(v1.version) is not None and len(catalog) == 1


def test_which_table_holds_a_lake_location() -> None:
    """A table created again under a name replaces the older one at its lake location; the
    older one's late events are left out; two tables the catalog cannot order are an error."""
    old, new = _table(16410, NAME), _table(16420, NAME)
    catalog = _catalog([e.to_json() for e in _entries()], [_record(old, 100), _record(new, 500)])
    where = {"path": f"lake/{table_name('public', NAME)}", "name": f"public.{NAME}"}
    assert replaces(16420, 16410, catalog, **where)
    assert not replaces(16410, 16420, catalog, **where)
    # without DDL capture, by the LSNs the records were published with
    records = _catalog([], [_record(old, 100), _record(new, 500)])
    assert replaces(16420, 16410, records, **where)
    assert not replaces(16410, 16420, records, **where)
    # two tables of the baseline (both existed at once), or one the catalog does not know
    twins = _catalog([e.to_json() for e in _entries()], [])
    with pytest.raises(LakeOwnerError, match="rename one of them"):
        replaces(16400, 16410, twins, **where)
    with pytest.raises(LakeOwnerError):
        replaces(16420, 99999, twins, **where)


def test_golden_records_from_a_real_server(tmp_path: Path) -> None:
    """Records a real pipeline published (tests/golden/capture_catalog.py): the producer
    writes each entry back byte for byte (fingerprints checked), the replay equals the
    history file the builder loads from the same lines, and the lives are the workload's."""
    golden = GOLDEN / "catalog_topic" / "catalog_history_pg.jsonl"
    lines = golden.read_text().splitlines()
    assert [Entry.from_json(line, verify=True).to_json() for line in lines] == lines
    (tmp_path / "catalog.log").write_bytes(golden.read_bytes())
    loaded = HistoryFile(tmp_path).load(read_only=True)
    replayed = replay(lines)
    assert list(replayed.entries()) == list(loaded.entries())
    assert replayed.latest == loaded.latest
    catalog = LakeCatalog(CatalogLog([]), replayed)
    lives = sorted((t.oid, t.name, catalog.dropped(t.oid) is not None)
                   for lsn_table in (e.change for e in replayed.entries()
                                     if isinstance(e.change, PutTable))
                   for t in [lsn_table.table] if t.schema == "public")
    weird = sorted({(oid, dropped) for oid, name, dropped in lives if name == NAME})
    assert [dropped for _, dropped in weird] == [True, False]  # two lives, the first dropped
    assert {dropped for _, name, dropped in lives if name == "gone"} == {True}
    (old, _), (new, _) = weird
    # created again as it was first created: the same version, another OID
    assert catalog.versions(old)[0].version == catalog.latest(new).version
    assert [c.name for c in catalog.latest(old).columns] == ["id", "v", "n"]
    assert catalog.born(new) > catalog.dropped(old)  # type: ignore[operator]


def test_lives_are_ordered_by_birth_not_by_oid() -> None:
    """OIDs wrap around: a table created again may get a lower OID than the one it replaces."""
    first, second = _table(40000, NAME), _table(16384, NAME)
    lines = [Entry(1, 100, 0, PutTable(first)).to_json(), Entry(2, 200, 0, DropTable(40000))
             .to_json(), Entry(3, 300, 0, PutTable(second)).to_json()]
    catalog = _catalog(lines, [_record(first, 100), _record(second, 300)])
    summary = {oid: TableBatch(None, frozenset({"c"})) for oid in (16384, 40000)}
    assert _lives(summary, catalog) == [40000, 16384]
    where = {"path": f"lake/{table_name('public', NAME)}", "name": f"public.{NAME}"}
    assert replaces(16384, 40000, catalog, **where)


def test_a_table_out_of_the_publication_is_gone_for_the_lake_until_it_is_back() -> None:
    """Issue 15: a table attached under a publication via the root (or dropped from the
    publication) is described ``published: false``; the lake retires its table where it
    left, as for a drop, and keeps it when it is back in (read again then)."""
    t = _table(16400, "ev")
    out, back = dataclasses.replace(t, published=False), dataclasses.replace(t, published=True)
    assert out.version != t.version == back.version
    assert out.to_dict()["published"] is False and "published" not in t.to_dict()
    assert table_from_dict(out.to_dict()) == out
    assert table_from_dict(out.to_dict(), verify=False) == out
    entries = [Entry(1, 100, 0, PutTable(t)), Entry(2, 300, 0, PutTable(out)),
               Entry(3, 400, 0, PutTable(dataclasses.replace(out, comment="x")))]
    left = _catalog([e.to_json() for e in entries], [_record(t, 100)])
    assert left.dropped(16400) == 300 and [s.oid for s, _ in left.drops()] == [16400]
    assert left.resolve(16400, 299) is not None and left.tables() == []
    entries.append(Entry(4, 500, 0, PutTable(back)))
    returned = _catalog([e.to_json() for e in entries], [_record(t, 100)])
    assert returned.dropped(16400) is None and returned.drops() == []
    assert [s.oid for s in returned.tables()] == [16400]
    never = _catalog([Entry(1, 100, 0, PutTable(out)).to_json()], [])
    # never in the publication: no lake table
    assert never.drops() == [] and never.tables() == [] and never.known_tables() == []
    # in it, no events ever, then dropped: a lake load may have written its lake table
    # (retire_dropped retires it if it is there)
    loaded = _catalog([e.to_json() for e in entries[:2]], [])
    assert [s.oid for s, _ in loaded.drops()] == [16400] and loaded.tables() == []
