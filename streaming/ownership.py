"""Which source table a lake table belongs to, and what happens to it when that table goes.

A lake table's location is derived from its source table's name
(:func:`streaming.apply.table_path`), but a source table is identified by its OID: a table
dropped and created again under the same name is another table, whose lake table must
start empty.  So every lake table records the OID it holds (the table property
``pgcdc.oid``), and:

* events of a table are applied to the lake table at its location when that lake table
  holds the same OID, or none yet (a table from before the property: it is claimed);
* when another OID holds the location, the table born later (by the catalog history, or
  by the ``_catalog`` records without DDL capture) wins: the older lake table is retired
  first, and the older table's events that arrive after that (late data, a replay) are
  left out, since the table they belong to is gone;
* a table the history shows dropped is retired once its events of the batch are applied.

Retiring removes the lake table and its companions (``__tombstones``, ``__changelog``), or,
with ``archive``, moves them under ``<lake>/_archive/<name>.<oid>/`` (Delta tables hold
relative file paths, so a moved table stays readable there).  An archive keeps the table as
the lake had it when the drop was applied; events of the dropped table that arrive later
are not added to it.

A lake table also follows its source table's renames (``ALTER TABLE ... RENAME TO``,
``SET SCHEMA``): before a table's events are applied, :func:`follow` moves its lake table
and companions from the location of an earlier name (the catalog gives every name the
table had) to its newest one, and :func:`follow_renamed` does so after each batch for
renamed tables without events.  A move is a directory rename per companion, companions
first and the lake table last; whatever a killed driver left half done is recognised and
finished by the next one (:func:`plan_moves`), never a second, empty table.  Which of two
tables holds a location goes by when each took the name mapping there (a table renamed
into a dropped table's name replaces it, whichever was created first).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from snapshot_builder.history import CatalogError
from streaming.catalog import LakeCatalog
from streaming.compaction import companions
from streaming.evolution import (
    OID_PROPERTY,
    cached_property,
    forget,
    set_properties,
    table_exists,
)
from streaming.schema import TableSpec

log = logging.getLogger(__name__)


class LakeOwnerError(CatalogError):
    """Two source tables claim one lake table and neither is known to have replaced the
    other."""


# (path, oid, LSN of the drop) of the drops this driver retired or found gone: a table out
# of the publication, back in and out again is retired again
_RETIRED: set[tuple[str, int, int]] = set()


def owner(spark: Any, path: str) -> int | None:
    """The OID the lake table at ``path`` holds (None: no table, or none recorded)."""
    if not table_exists(spark, path):
        return None
    raw = cached_property(spark, path, OID_PROPERTY)
    return None if raw is None else int(raw)


def take(spark: Any, path: str, oid: int, name: str, catalog: LakeCatalog, *, lake: str,
         archive: bool = False) -> bool:
    """Whether the events of table ``oid`` may be applied to the lake table at ``path``:
    yes when it holds ``oid`` or does not exist (it is then created for ``oid``); when it
    holds an older table, that one is retired first; no when it holds a newer one."""
    if not table_exists(spark, path):
        return True
    held = owner(spark, path)
    if held is None:  # written before pgcdc recorded owners
        set_properties(spark, path, {OID_PROPERTY: str(oid)})
        return True
    if held == oid:
        return True
    if not replaces(oid, held, catalog, path=path, name=name):
        log.info("events of %s (oid %d) left out: the lake table %s holds its successor "
                 "under the same name (oid %d)", name, oid, path, held)
        return False
    if catalog.dropped(held) is None:
        log.warning("lake table %s held oid %d, which the catalog does not show dropped; "
                    "%s (oid %d), created after it, takes its place", path, held, name, oid)
    retire(spark, path, held, lake=lake, archive=archive)
    return True


def replaces(oid: int, held: int, catalog: LakeCatalog, *, path: str, name: str) -> bool:
    """Whether table ``oid`` replaces table ``held`` at the lake location ``path`` (it took
    a name mapping there later: created under it, or renamed into it), or is the older of
    the two there (False); an error when the catalog cannot tell.
    """
    mine, theirs = arrived(catalog, oid, path), arrived(catalog, held, path)
    if mine is None or theirs is None or mine == theirs:
        msg = (f"the lake table {path} holds the rows of table oid {held}, and {name} (oid "
               f"{oid}) maps to the same location, but the catalog does not say which of "
               "the two replaced the other (both existed at once, or one is unknown): two "
               "source tables whose names map to one lake location, or a lake shared by two "
               "sources; rename one of them, or move the lake table aside")
        raise LakeOwnerError(msg)
    return mine > theirs


def _leaf(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def arrived(catalog: LakeCatalog, oid: int, path: str) -> int | None:
    """When table ``oid`` last took a name whose lake location is ``path`` (its location in
    the lake ``path`` is in): the LSN of the first version of its latest run of versions
    named so; None when none of its versions is."""
    from streaming.apply import table_path  # (it imports this module)

    leaf, at, before = _leaf(path), None, False
    for spec in catalog.versions(oid):
        here = _leaf(table_path("", spec)) == leaf
        if here and not before:
            at = spec.lsn
        before = here
    return at


def retire_dropped(spark: Any, catalog: LakeCatalog, table_path: Callable[[str, TableSpec], str],
                   *, lake: str, archive: bool = False) -> list[str]:
    """Retire the lake table of every table the history shows dropped (once per driver and
    drop); returns their locations."""
    retired = []
    for spec, lsn in catalog.drops():
        # at the location of its last name, or of an earlier one (renamed, then dropped
        # before its lake table followed)
        for path in locations(catalog, spec.oid, table_path, lake):
            if (path, spec.oid, lsn) in _RETIRED:
                continue
            if owner(spark, path) == spec.oid:
                retire(spark, path, spec.oid, lake=lake, archive=archive)
                retired.append(path)
            _RETIRED.add((path, spec.oid, lsn))
    return retired


def archive_path(lake: str, path: str, oid: int) -> str:
    """Where ``archive`` moves the lake table at ``path`` (and its companions) for ``oid``."""
    return f"{lake.rstrip('/')}/_archive/{path.rstrip('/').rsplit('/', 1)[-1]}.{oid}"


def retire(spark: Any, path: str, oid: int, *, lake: str, archive: bool = False) -> None:
    """Remove the lake table at ``path`` and its companions, or move them to the archive:
    the companions first, the lake table last (a companion is never left without its
    table, for a table created at ``path`` next to find)."""
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    fs_path = jvm.org.apache.hadoop.fs.Path
    destination = archive_path(lake, path, oid) if archive else None
    for table in reversed(companions(path)):
        source = fs_path(table)
        fs = source.getFileSystem(conf)
        if fs.exists(source):
            moved = False
            if destination is not None:
                target = fs_path(f"{destination}/{table.rstrip('/').rsplit('/', 1)[-1]}")
                if not fs.exists(target):
                    fs.mkdirs(target.getParent())
                    moved = bool(fs.rename(source, target))
                    if not moved:
                        msg = f"could not move {table} to {target.toString()}"
                        raise OSError(msg)
            if not moved:
                fs.delete(source, True)
        forget(table)
    # Delta caches each table's log by location; a table created there next starts afresh
    jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    log.warning("lake table %s of table oid %d %s: the source table was dropped, replaced, "
                "or left the publication", path, oid,
                f"moved to {destination}" if destination else "dropped")


# --- renames -------------------------------------------------------------------------------

# oid -> the location this driver found the table's lake table at, or moved it to
_SETTLED: dict[int, str] = {}

# a companion's location is its table's plus one of these ("": the lake table itself)
_SUFFIXES = tuple(c[len("x"):] for c in companions("x"))


def locations(catalog: LakeCatalog, oid: int, table_path: Callable[[str, TableSpec], str],
              lake: str) -> list[str]:
    """The lake locations of every name table ``oid`` had, newest first, each once."""
    found: list[str] = []
    for spec in reversed(catalog.versions(oid)):
        path = table_path(lake, spec)
        if path not in found:
            found.append(path)
    return found


def parking_path(lake: str, oid: int) -> str:
    """Where a lake table waits while names are swapped in a cycle (``t`` -> ``tmp``,
    ``u`` -> ``t``, ``tmp`` -> ``u``): each table's location is the other's."""
    return f"{lake.rstrip('/')}/_renaming/{oid}"


@dataclass(frozen=True)
class Move:
    """One directory rename."""

    source: str
    target: str


def plan_moves(oid: int, target: str, earlier: Sequence[str],
               present: Mapping[str, int | None]) -> list[Move]:
    """The directory renames that bring table ``oid``'s lake table and its companions to
    ``target``: the companions first, the lake table last.

    ``earlier``: the other locations the table may be at (its earlier names', the parking
    place); ``present``: each of those locations' and ``target``'s directories (the lake
    table's and its companions') that exists, with the OID a lake table records (None for
    a companion, or for a lake table that records none).

    The table is where a lake table recording ``oid`` is (``target`` first).  Its
    companions are beside it, or at an earlier location that holds no lake table: a move
    cut short (companions already moved, or, by hand, the table alone) leaves them so, and
    nothing else does (pgcdc removes and moves a table's companions before the table), so
    planning again from what a killed driver left finishes the move.  Nothing to move
    when no lake table records ``oid``: the table was never applied.
    """
    def holds(path: str) -> bool:
        return path in present and present[path] == oid

    if target in present and not holds(target) and any(holds(p) for p in earlier):
        msg = (f"the lake table of table oid {oid} must move to {target}, where another "
               f"lake table is (oid {present[target]}); move one of them aside")
        raise LakeOwnerError(msg)
    home = target if holds(target) else next((p for p in earlier if holds(p)), None)
    if home is None:
        return []
    moves = []
    for suffix in _SUFFIXES[1:]:
        pieces = [p for p in earlier if p + suffix in present and (p == home or p not in present)]
        copies = [p + suffix for p in (target, *pieces) if p + suffix in present]
        if len(copies) > 1:
            msg = (f"{' and '.join(copies)} each hold {suffix.strip('_')} of the lake table "
                   f"of table oid {oid} (at {home}): keep the one that belongs to it, remove "
                   "the others, and run the job again")
            raise LakeOwnerError(msg)
        moves += [Move(p + suffix, target + suffix) for p in pieces]
    if home != target:
        moves.append(Move(home, target))
    return moves


def follow(spark: Any, oid: int, catalog: LakeCatalog,
           table_path: Callable[[str, TableSpec], str], *, lake: str,
           archive: bool = False) -> str:
    """Bring table ``oid``'s lake table (and companions) to the location of its newest name,
    from an earlier name's where it is; returns that location.  A lake table of another
    table there moves first when that table was renamed too, or is retired by the rules
    of :func:`take` (a dropped table's whose name this one took)."""
    return _follow(spark, oid, catalog, table_path, lake, archive, ())


def follow_renamed(spark: Any, catalog: LakeCatalog,
                   table_path: Callable[[str, TableSpec], str], *, lake: str,
                   archive: bool = False) -> list[str]:
    """:func:`follow` every renamed table the catalog holds (events in the batch or not,
    published by the stream or only loaded into the lake); returns the locations of those
    it looked for (not known to be at their place)."""
    moved = []
    for spec in catalog.known_tables():
        path = table_path(lake, spec)
        if _SETTLED.get(spec.oid) != path and len(locations(catalog, spec.oid, table_path,
                                                            lake)) > 1:
            _follow(spark, spec.oid, catalog, table_path, lake, archive, ())
            moved.append(path)
    return moved


def _follow(spark: Any, oid: int, catalog: LakeCatalog,
            table_path: Callable[[str, TableSpec], str], lake: str, archive: bool,
            chain: tuple[int, ...]) -> str:
    spec = catalog.latest(oid)
    target = table_path(lake, spec)
    if _SETTLED.get(oid) == target:
        return target
    earlier = [p for p in locations(catalog, oid, table_path, lake) if p != target]
    if not earlier:  # never renamed
        _SETTLED[oid] = target
        return target
    earlier.append(parking_path(lake, oid))
    held = owner(spark, target)
    if held is not None and held != oid and catalog.dropped(held) is None \
            and catalog.versions(held):
        if table_path(lake, catalog.latest(held)) != target:  # renamed away: it moves first
            if held in chain:  # names swapped in a cycle: this one waits aside
                _move(spark, held, parking_path(lake, held), [target])
            else:
                _follow(spark, held, catalog, table_path, lake, archive, (*chain, oid))
    present = _survey(spark, [target, *earlier])
    held = present.get(target)
    if target in present and held != oid and any(present.get(p) == oid for p in earlier):
        if held is None:
            msg = (f"the lake table of {spec.qualified_name} (oid {oid}) must move to "
                   f"{target}, where a lake table records no source table; move it aside")
            raise LakeOwnerError(msg)
        if not take(spark, target, oid, spec.qualified_name, catalog, lake=lake,
                    archive=archive):
            return target  # the newer table there keeps the location
    _move(spark, oid, target, earlier)
    _SETTLED[oid] = target
    return target


def _survey(spark: Any, paths: Sequence[str]) -> dict[str, int | None]:
    """What :func:`plan_moves` reads: which of the locations' directories exist, and the
    OID each lake table among them records."""
    fs_path = spark._jvm.org.apache.hadoop.fs.Path
    conf = spark._jsc.hadoopConfiguration()
    present: dict[str, int | None] = {}
    for path in paths:
        for table in companions(path):
            location = fs_path(table)
            forget(table)  # what the lake holds, not what this driver last saw
            if location.getFileSystem(conf).exists(location):
                present[table] = owner(spark, table) if table == path else None
    return present


def _move(spark: Any, oid: int, target: str, earlier: Sequence[str]) -> None:
    """Carry out :func:`plan_moves` for ``oid`` from what the lake holds now."""
    moves = plan_moves(oid, target, earlier, _survey(spark, [target, *earlier]))
    if not moves:
        return
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    for move in moves:
        source, destination = jvm.org.apache.hadoop.fs.Path(move.source), \
            jvm.org.apache.hadoop.fs.Path(move.target)
        fs = source.getFileSystem(conf)
        fs.mkdirs(destination.getParent())
        # a rename onto an existing directory would move the source into it
        if fs.exists(destination) or not fs.rename(source, destination):
            msg = f"could not move {move.source} to {move.target}"
            raise OSError(msg)
        forget(move.source)
        forget(move.target)
    # Delta caches each table's log by location
    jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    log.warning("lake table of table oid %d moved to %s (%s): the source table was renamed",
                oid, target, ", ".join(f"{m.source} -> {m.target}" for m in moves))
