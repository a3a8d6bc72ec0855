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
"""

from __future__ import annotations

import logging
from collections.abc import Callable
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


# (path, oid) of the dropped tables this driver retired or found gone
_RETIRED: set[tuple[str, int]] = set()


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
    """Whether table ``oid`` replaces table ``held`` at the lake location ``path`` (it was
    born later), or is the older of the two (False); an error when the catalog cannot tell.
    """
    mine, theirs = catalog.born(oid), catalog.born(held)
    if mine is None or theirs is None or mine == theirs:
        msg = (f"the lake table {path} holds the rows of table oid {held}, and {name} (oid "
               f"{oid}) maps to the same location, but the catalog does not say which of "
               "the two replaced the other (both existed at once, or one is unknown): two "
               "source tables whose names map to one lake location, or a lake shared by two "
               "sources; rename one of them, or move the lake table aside")
        raise LakeOwnerError(msg)
    return mine > theirs


def retire_dropped(spark: Any, catalog: LakeCatalog, table_path: Callable[[str, TableSpec], str],
                   *, lake: str, archive: bool = False) -> list[str]:
    """Retire the lake table of every table the history shows dropped (once per driver and
    table); returns their locations."""
    retired = []
    for spec, _lsn in catalog.drops():
        path = table_path(lake, spec)
        if (path, spec.oid) in _RETIRED:
            continue
        if owner(spark, path) == spec.oid:
            retire(spark, path, spec.oid, lake=lake, archive=archive)
            retired.append(path)
        _RETIRED.add((path, spec.oid))
    return retired


def archive_path(lake: str, path: str, oid: int) -> str:
    """Where ``archive`` moves the lake table at ``path`` (and its companions) for ``oid``."""
    return f"{lake.rstrip('/')}/_archive/{path.rstrip('/').rsplit('/', 1)[-1]}.{oid}"


def retire(spark: Any, path: str, oid: int, *, lake: str, archive: bool = False) -> None:
    """Remove the lake table at ``path`` and its companions, or move them to the archive."""
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    fs_path = jvm.org.apache.hadoop.fs.Path
    destination = archive_path(lake, path, oid) if archive else None
    for table in companions(path):
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
    _RETIRED.add((path, oid))
    log.warning("lake table %s of table oid %d %s: the source table was dropped or replaced",
                path, oid, f"moved to {destination}" if destination else "dropped")
