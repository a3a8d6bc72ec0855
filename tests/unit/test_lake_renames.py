"""A renamed table's lake table follows its name (streaming/ownership.py): the locations of a
table's names, which table holds a location, and the directory moves, planned again from
whatever a killed driver left (pure logic, no Spark session)."""

from __future__ import annotations

import itertools

import pytest

from snapshot_builder.catalog import Column, TableVersion
from snapshot_builder.history import Change, DropTable, Entry, PutTable
from streaming.apply import table_path
from streaming.catalog import CatalogLog, LakeCatalog, replay
from streaming.ownership import (
    LakeOwnerError,
    Move,
    arrived,
    locations,
    parking_path,
    plan_moves,
    replaces,
)

LAKE = "file:/lake"
OID, OTHER = 16400, 16500
SUFFIXES = ("", "__tombstones", "__changelog")


def _table(oid: int, name: str, schema: str = "public") -> TableVersion:
    columns = (Column("id", 23, "int4", -1, True, True, None, 1),
               Column("v", 25, "text", -1, False, False, None, 2))
    return TableVersion(oid, schema, name, "d", columns)


def _catalog(*changes: tuple[int, Change]) -> LakeCatalog:
    entries = [Entry(version, lsn, 0, change).to_json()
               for version, (lsn, change) in enumerate(changes, 1)]
    return LakeCatalog(CatalogLog([]), replay(entries), prefix="pg")


def _at(leaf: str) -> str:
    return f"{LAKE}/{leaf}"


def test_locations_are_every_name_newest_first() -> None:
    catalog = _catalog((100, PutTable(_table(OID, "t"))), (200, PutTable(_table(OID, "t2"))),
                       (300, PutTable(_table(OID, "t", "s2"))),
                       (400, PutTable(_table(OID, "t"))))
    assert locations(catalog, OID, table_path, LAKE) == [
        _at("public.t"), _at("s2.t"), _at("public.t2")]
    assert locations(catalog, 99999, table_path, LAKE) == []


def test_a_table_renamed_into_a_dropped_tables_name_replaces_it() -> None:
    """``u`` created before ``d``; ``d`` dropped, ``u`` renamed to ``d``: ``u`` holds the
    location from the rename on, though born first; a rename back counts from its own
    LSN."""
    catalog = _catalog((100, PutTable(_table(OID, "u"))), (150, PutTable(_table(OTHER, "d"))),
                       (400, DropTable(OTHER)), (500, PutTable(_table(OID, "d"))))
    where = {"path": _at("public.d"), "name": "public.d"}
    assert arrived(catalog, OID, _at("public.d")) == 500
    assert arrived(catalog, OTHER, _at("public.d")) == 150
    assert replaces(OID, OTHER, catalog, **where)
    assert not replaces(OTHER, OID, catalog, **where)
    back = _catalog((100, PutTable(_table(OID, "t"))), (200, PutTable(_table(OID, "t2"))),
                    (300, PutTable(_table(OID, "t"))))
    assert arrived(back, OID, _at("public.t")) == 300
    assert arrived(back, OID, _at("public.t2")) == 200
    assert arrived(back, OID, _at("public.x")) is None


def _pieces(path: str) -> list[str]:
    return [path + s for s in SUFFIXES]


def _run(state: dict[str, int | None], moves: list[Move]) -> None:
    for move in moves:  # a rename moves a directory that exists to one that does not
        assert move.source in state and move.target not in state, move
        state[move.target] = state.pop(move.source)


def _table_at(path: str, oid: int) -> dict[str, int | None]:
    return {path: oid, path + "__tombstones": None, path + "__changelog": None}


def test_a_move_takes_the_companions_first_and_the_table_last() -> None:
    old, new = _at("public.t"), _at("public.t2")
    moves = plan_moves(OID, new, [old], _table_at(old, OID))
    assert moves == [Move(old + "__tombstones", new + "__tombstones"),
                     Move(old + "__changelog", new + "__changelog"), Move(old, new)]
    # at its place already, or never applied: nothing
    assert plan_moves(OID, new, [old], _table_at(new, OID)) == []
    assert plan_moves(OID, new, [old], {}) == []
    # a companion it does not have (no delete yet) is not invented
    assert plan_moves(OID, new, [old], {old: OID}) == [Move(old, new)]


@pytest.mark.parametrize("earlier", [["public.t"], ["public.t2", "public.t"]])
def test_a_move_cut_short_anywhere_is_finished_by_the_next_driver(earlier: list[str]) -> None:
    """Every subset of the directories already at the new location (a driver killed between
    two of its renames, or the table moved by hand alone), and, with two earlier names, a
    first move cut short before the second rename: planned again, everything ends at the
    new location and nothing stays behind."""
    new = _at("public.t3")
    paths = [_at(p) for p in earlier]
    done = _table_at(new, OID)
    source, destination = paths[-1], (paths[0] if len(paths) > 1 else new)
    for moved in itertools.chain.from_iterable(
            itertools.combinations(SUFFIXES, n) for n in range(4)):
        state = {(destination if s in moved else source) + s: (OID if s == "" else None)
                 for s in SUFFIXES}
        _run(state, plan_moves(OID, new, [*paths, parking_path(LAKE, OID)], state))
        assert state == done, moved
    # and each step of a full plan, cut short there and planned again
    start = _table_at(paths[0], OID)
    full = plan_moves(OID, new, paths, start)
    for cut in range(len(full) + 1):
        state = dict(start)
        _run(state, full[:cut])
        _run(state, plan_moves(OID, new, paths, state))
        assert state == done, cut


def test_another_tables_directories_are_never_taken() -> None:
    """A table created under the old name since holds its location and companions; a table
    holding the new location is an error (the caller moves or retires it first)."""
    old, new = _at("public.t"), _at("public.t2")
    state = {**_table_at(old, OTHER), new: OID}
    assert plan_moves(OID, new, [old], state) == []
    state = {**_table_at(old, OTHER), **_table_at(_at("public.t0"), OID)}
    moves = plan_moves(OID, new, [old, _at("public.t0")], state)
    _run(state, moves)
    assert state == {**_table_at(old, OTHER), **_table_at(new, OID)}
    with pytest.raises(LakeOwnerError, match="move one of them aside"):
        plan_moves(OID, new, [old], {**_table_at(old, OID), new: OTHER})
    with pytest.raises(LakeOwnerError, match="move one of them aside"):
        plan_moves(OID, new, [old], {**_table_at(old, OID), new: None})


def test_two_copies_of_a_companion_are_an_error() -> None:
    """The table moved by hand alone, then written at its new place (new tombstones): two
    tombstone tables, which no rule can merge; the error names both."""
    old, new = _at("public.t"), _at("public.t2")
    state = {old + "__tombstones": None, **_table_at(new, OID)}
    with pytest.raises(LakeOwnerError, match="__tombstones and .*__tombstones"):
        plan_moves(OID, new, [old], state)


def test_a_parked_table_is_found() -> None:
    """Names swapped in a cycle: the table waits at its parking place, and moves on from
    there to its new location."""
    parked, new = parking_path(LAKE, OID), _at("public.b")
    state = _table_at(parked, OID)
    _run(state, plan_moves(OID, new, [_at("public.a"), parked], state))
    assert state == _table_at(new, OID)
    assert parked == f"{LAKE}/_renaming/{OID}"
