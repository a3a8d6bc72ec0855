"""Delta table schemas driven by catalog versions, never by inference.

A table is created with the columns of its newest version plus pgcdc's
position columns, with Delta's type widening enabled.  A later version:

* adds columns (``ALTER TABLE ... ADD COLUMNS``), null in older rows;
* widens a column's type where Delta can do it in place (``smallint`` ->
  ``int`` -> ``bigint``, ``float`` -> ``double``, a decimal that keeps its
  integer digits and scale; ``ALTER COLUMN ... TYPE``);
* drops the columns a version dropped (``ALTER TABLE ... DROP COLUMNS``: column
  mapping makes it a change of metadata; earlier table versions still hold them,
  for time travel), or, with ``keep_dropped`` (``pgcdc spark --archive-dropped``),
  keeps them, NULL in newer rows, moved aside to ``<name>__dropped`` when a new
  column takes the name.  A column is known by its identity (its attnum), so a
  column dropped and added again under its name is a new, empty column.

Any other type change (``int`` to ``string``, ``string`` to ``int``, ...) rewrites
the Delta table in one commit with the column cast to the new type; PostgreSQL
rewrote its table too, and pgcdc reads it again, so the source's own values
replace the cast ones.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from core.errors import TerminalError
from streaming.schema import TEXT, TEXT_TYPE, TableSpec
from streaming.sql_text import literal

log = logging.getLogger(__name__)

_INTEGERS = ["smallint", "int", "bigint"]
_DECIMAL = re.compile(r"^decimal\((\d+),(\d+)\)$")


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def widens(old: str, new: str) -> bool:
    """Whether Delta can change a column from ``old`` to ``new`` in place, losslessly."""
    if old == new:
        return True
    if old in _INTEGERS and new in _INTEGERS:
        return _INTEGERS.index(new) > _INTEGERS.index(old)
    if (old, new) == ("float", "double"):
        return True
    a, b = _DECIMAL.match(old), _DECIMAL.match(new)
    if a and b:
        (p1, s1), (p2, s2) = (int(a[1]), int(a[2])), (int(b[1]), int(b[2]))
        return s2 >= s1 and p2 - s2 >= p1 - s1
    return old in _INTEGERS and b is not None and int(b[1]) - int(b[2]) >= (5, 10, 20)[
        _INTEGERS.index(old)]


COLUMNS_PROPERTY = "pgcdc.columns"  # {attnum: the Delta column's name}, as JSON
TRUNCATED_PROPERTY = "pgcdc.truncatedAt"  # "<commit_lsn>/<ordinal>" of the newest truncate
# the OID of the source table whose rows the lake table holds: a table dropped and created
# again under the same name has another OID, and its lake table starts empty
OID_PROPERTY = "pgcdc.oid"

_CREATE_PROPERTIES = {
    "delta.enableTypeWidening": "true",
    "delta.enableDeletionVectors": "true",  # a MERGE marks replaced rows, no file rewrite
    "delta.columnMapping.mode": "name",
    "delta.minReaderVersion": "3",
    "delta.minWriterVersion": "7",
}


def _properties_sql(properties: dict[str, str]) -> str:
    return ", ".join(f"{literal(k)} = {literal(v)}" for k, v in properties.items())


def _identities(spec: TableSpec) -> dict[str, str]:
    return {str(c.attnum): c.name for c in spec.columns if c.attnum is not None}


# what SHOW TBLPROPERTIES adds to a Delta table's own properties: its protocol
_PROTOCOL_KEYS = ("delta.minReaderVersion", "delta.minWriterVersion")
_PROTOCOL_PREFIX = "delta.feature."


def table_properties(spark: Any, path: str) -> dict[str, str]:
    """The table's properties (its metadata's configuration).

    Read with SHOW TBLPROPERTIES, which takes them from the log's metadata (no Spark job),
    not with DESCRIBE DETAIL, which also counts the table's files: a job that reconstructs
    the table's state, about 1 s a table per micro-batch on 2 cores."""
    rows = spark.sql(f"SHOW TBLPROPERTIES delta.{quote(path)}").collect()
    return {str(key): str(value) for key, value in rows
            if key not in _PROTOCOL_KEYS and not str(key).startswith(_PROTOCOL_PREFIX)}


# What this driver last did to each table: the table version it evolved it to and its
# properties then, so that a micro-batch of an unchanged table version reads no metadata.
# pgcdc is the only writer of its lake tables; a restarted driver starts empty.
_STATE: dict[str, tuple[str | None, dict[str, str]]] = {}


def forget(path: str) -> None:
    """The table changed behind the cache (a property was set): read it again next time."""
    _STATE.pop(path, None)


def set_properties(spark: Any, path: str, properties: dict[str, str]) -> None:
    """Set table properties (and read the table's metadata again next time)."""
    spark.sql(f"ALTER TABLE delta.{quote(path)} SET TBLPROPERTIES "
              f"({_properties_sql(properties)})")
    forget(path)


def table_exists(spark: Any, path: str) -> bool:
    """A Delta table is at ``path`` (known without a look once this driver used it)."""
    if path in _STATE:
        return True
    from delta.tables import DeltaTable

    return bool(DeltaTable.isDeltaTable(spark, path))


def cached_property(spark: Any, path: str, key: str) -> str | None:
    if path not in _STATE:
        _STATE[path] = (None, table_properties(spark, path))
    return _STATE[path][1].get(key)


class NotADeltaTableError(TerminalError):
    """The path of a lake table holds files, but no Delta table."""


# what a Delta log holds once a version is committed: a commit, a checkpoint, its pointer
_COMMITTED = re.compile(r"^(\d{20}\.json|\d{20}\.checkpoint.*|_last_checkpoint)$")


def clear_interrupted_create(spark: Any, path: str) -> None:
    """Remove what an interrupted creation of the Delta table at ``path`` left (a driver
    killed inside ``CREATE TABLE``: a ``_delta_log`` folder without a committed version, at
    most temporary files in it), before the table is created.  Delta takes such a folder for
    a table: ``CREATE TABLE IF NOT EXISTS`` does nothing and every later statement fails
    with DELTA_MISSING_DELTA_TABLE, so the job could never start again.  Anything else at
    the path (files beside the log, a committed version) is not pgcdc's to remove:
    :class:`NotADeltaTableError`, naming the path."""
    jvm = spark.sparkContext._jvm
    folder = jvm.org.apache.hadoop.fs.Path(path)
    fs = folder.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.exists(folder):
        return
    entries = [status.getPath().getName() for status in fs.listStatus(folder)]
    log_folder = jvm.org.apache.hadoop.fs.Path(folder, "_delta_log")
    logged = [status.getPath().getName() for status in fs.listStatus(log_folder)] \
        if "_delta_log" in entries else []
    if set(entries) - {"_delta_log"} or any(_COMMITTED.match(name) for name in logged):
        msg = (f"the lake table's path {path} holds {sorted(entries)[:5]} but no Delta table "
               "pgcdc can read: not a table pgcdc created (or its log was damaged); move it "
               "aside and start the job again")
        raise NotADeltaTableError(msg)
    log.warning("the lake table %s was being created when its driver stopped (%s left): "
                "creating it again", path, ", ".join(sorted(logged)) or "an empty log")
    if not fs.delete(folder, True):
        msg = f"could not remove the unfinished lake table at {path}; remove it by hand"
        raise NotADeltaTableError(msg)


def evolve(spark: Any, path: str, spec: TableSpec, meta_columns: tuple[str, ...],
           versions: list[TableSpec] | None = None, *, keep_dropped: bool = False) -> Any:
    """The Delta table at ``path``, created or brought to ``spec``'s shape.

    A column renamed in ``spec`` is renamed in Delta (column mapping by name, so no data
    is rewritten): the table property ``pgcdc.columns`` remembers which Delta column holds
    which PostgreSQL column (by attnum); a table without it (created before) falls back on
    the names the column had in ``versions``.
    """
    from delta.tables import DeltaTable

    if _STATE.get(path, (None, {}))[0] == spec.version:
        return DeltaTable.forPath(spark, path)
    target = f"delta.{quote(path)}"
    columns = [(c.name, c.spark_type) for c in spec.columns] + [(m, "bigint")
                                                                for m in meta_columns]
    columns.append((TEXT, TEXT_TYPE))  # what a typed column cannot hold (added to old tables)
    if not DeltaTable.isDeltaTable(spark, path):
        clear_interrupted_create(spark, path)
        ddl = ", ".join(f"{quote(n)} {t}" for n, t in columns)
        properties = dict(_CREATE_PROPERTIES)
        properties[COLUMNS_PROPERTY] = json.dumps(_identities(spec), sort_keys=True)
        properties[OID_PROPERTY] = str(spec.oid)
        spark.sql(f"CREATE TABLE IF NOT EXISTS {target} ({ddl}) USING DELTA "
                  f"TBLPROPERTIES ({_properties_sql(properties)})")
        _STATE[path] = (spec.version, table_properties(spark, path))
        return DeltaTable.forPath(spark, path)
    table = DeltaTable.forPath(spark, path)
    present = {f.name: f.dataType.simpleString() for f in table.toDF().schema.fields}
    changed = False
    identities = _identities(spec)
    properties = table_properties(spark, path)
    stored = json.loads(properties.get(COLUMNS_PROPERTY, "{}"))
    known = dict(stored)
    gone = _dropped(spec, present, known, {n for n, _ in columns})
    if gone:
        present = _drop(spark, target, present, gone, properties, keep=keep_dropped,
                        reused={c.name for c in spec.columns})
        changed = True
        known = {a: n for a, n in known.items() if n not in gone or a in identities}
    if identities:
        renamed = _rename(spark, target, spec, present, known, versions or [], properties)
        changed = changed or renamed != present
        present = renamed
        merged = dict(known, **identities)
        if merged != stored:
            update = {COLUMNS_PROPERTY: json.dumps(merged, sort_keys=True)}
            spark.sql(f"ALTER TABLE {target} SET TBLPROPERTIES ({_properties_sql(update)})")
            properties.update(update)
    added = [(n, t) for n, t in columns if n not in present]
    _support_types(spark, target, present, [t for n, t in columns if present.get(n) != t])
    if added:
        ddl = ", ".join(f"{quote(n)} {t}" for n, t in added)
        spark.sql(f"ALTER TABLE {target} ADD COLUMNS ({ddl})")
        changed = True
        log.info("added columns %s to %s", [n for n, _ in added], path)
    for name, wanted in columns:
        have = present.get(name)
        if have is None or have == wanted:
            continue
        if not widens(have, wanted):
            _retype(spark, path, name, wanted)
            changed = True
            log.info("retyped %s.%s from %s to %s (the table rewritten)", path, name, have,
                     wanted)
            continue
        spark.sql(f"ALTER TABLE {target} SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')")
        spark.sql(f"ALTER TABLE {target} ALTER COLUMN {quote(name)} TYPE {wanted}")
        changed = True
        log.info("widened %s.%s from %s to %s", path, name, have, wanted)
    _STATE[path] = (spec.version, properties)
    return DeltaTable.forPath(spark, path) if changed else table


# the table features a column type needs: Delta enables one by itself when a table is
# created with such a column, but not when one is added or retyped (ALTER TABLE fails with
# DELTA_FEATURES_REQUIRE_MANUAL_ENABLEMENT)
_TYPE_FEATURES = {"timestamp_ntz": "timestampNtz"}


def _support_types(spark: Any, target: str, present: dict[str, str], wanted: list[str]) -> None:
    """Enable the table features that the ``wanted`` column types need and no ``present``
    column needed so far (a ``timestamp`` column added to a table that had none)."""
    features = sorted({feature for kind, feature in _TYPE_FEATURES.items()
                       if kind in wanted and kind not in present.values()})
    if features:
        enabled = ", ".join(f"'delta.feature.{f}' = 'supported'" for f in features)
        spark.sql(f"ALTER TABLE {target} SET TBLPROPERTIES ({enabled})")


def _dropped(spec: TableSpec, present: dict[str, str], known: dict[str, str],
             wanted: set[str]) -> set[str]:
    """The Delta columns whose PostgreSQL column ``spec`` no longer has: by identity (a
    known attnum ``spec`` lacks, though a new column may have taken its name), else by
    name (a table without identities: no DDL capture)."""
    identities = _identities(spec)
    if identities and known:
        return {name for attnum, name in known.items()
                if attnum not in identities and name in present}
    return {name for name in present if name not in wanted} if not identities else set()


def _drop(spark: Any, target: str, present: dict[str, str], gone: set[str],
          properties: dict[str, str], *, keep: bool, reused: set[str]) -> dict[str, str]:
    """Drop the ``gone`` columns (or keep them, moved aside where ``reused`` takes the
    name); the new ``present``."""
    if properties.get("delta.columnMapping.mode", "none") == "none":
        spark.sql(f"ALTER TABLE {target} SET TBLPROPERTIES ("
                  f"{_properties_sql(_CREATE_PROPERTIES)})")
        properties.update(_CREATE_PROPERTIES)
    remaining = dict(present)
    if not keep:
        names = ", ".join(quote(n) for n in sorted(gone))
        spark.sql(f"ALTER TABLE {target} DROP COLUMNS ({names})")
        log.info("dropped columns %s of %s (dropped at the source)", sorted(gone), target)
        for name in gone:
            del remaining[name]
        return remaining
    for name in sorted(gone & reused):
        aside = f"{name}__dropped"
        while aside in remaining:
            aside += "_"
        spark.sql(f"ALTER TABLE {target} RENAME COLUMN {quote(name)} TO {quote(aside)}")
        remaining[aside] = remaining.pop(name)
    return remaining


def _retype(spark: Any, path: str, name: str, wanted: str) -> None:
    """A type change Delta cannot make in place (``int`` to ``string``, ``string`` to
    ``int``, a narrower decimal, ...): the table is rewritten in one commit with the column
    cast to the new type (NULL where a value does not convert).  PostgreSQL rewrote the
    table too (``ALTER COLUMN ... TYPE``, maybe ``USING``) and pgcdc reads it again, so the
    stored values are replaced by the source's own (``pgcdc.pipeline`` ``_read_again``)."""
    frame = spark.read.format("delta").load(path)
    columns = [f"try_cast({quote(c)} AS {wanted}) AS {quote(c)}" if c == name else quote(c)
               for c in frame.columns]
    frame.selectExpr(*columns).write.format("delta").mode("overwrite")\
        .option("overwriteSchema", "true").save(path)


def _rename(spark: Any, target: str, spec: TableSpec, present: dict[str, str],
            known: dict[str, str], versions: list[TableSpec],
            properties: dict[str, str]) -> dict[str, str]:
    """Rename the Delta columns whose PostgreSQL column was renamed; the new ``present``."""
    moves: list[tuple[str, str]] = []
    for column in spec.columns:
        if column.attnum is None or column.name in present and str(column.attnum) in known \
                and known[str(column.attnum)] == column.name:
            continue
        old = known.get(str(column.attnum))
        if old is None and not known:  # a table from before pgcdc.columns: by history
            old = next((c.name for v in reversed(versions) for c in v.columns
                        if c.attnum == column.attnum and c.name != column.name
                        and c.name in present
                        and c.name not in {x.name for x in spec.columns}), None)
        if old is not None and old != column.name and old in present:
            moves.append((old, column.name))
    if not moves:
        return present
    if properties.get("delta.columnMapping.mode", "none") == "none":
        spark.sql(f"ALTER TABLE {target} SET TBLPROPERTIES ("
                  f"{_properties_sql(_CREATE_PROPERTIES)})")
    renamed = dict(present)
    olds = {o for o, _ in moves}
    # swapped names (a -> b, b -> a) go through temporary names first
    via = {old: f"_pgcdc_renaming_{step}" if any(n in olds for _, n in moves) else old
           for step, (old, _) in enumerate(moves)}
    for old, _ in moves:
        if via[old] != old:
            spark.sql(f"ALTER TABLE {target} RENAME COLUMN {quote(old)} TO {quote(via[old])}")
    keys: dict[str, str] = {}  # the _pgcdc_text keys to rename with their columns
    for old, new in moves:
        if new in renamed and new not in olds:
            # a kept (dropped) column of the same name makes way for the renamed one
            aside = f"{new}__dropped"
            spark.sql(f"ALTER TABLE {target} RENAME COLUMN {quote(new)} TO {quote(aside)}")
            renamed[aside] = renamed.pop(new)
            keys[new] = aside
        spark.sql(f"ALTER TABLE {target} RENAME COLUMN {quote(via[old])} TO {quote(new)}")
        log.info("renamed %s.%s to %s (column identity)", target, old, new)
        keys[old] = new
    if TEXT in present and any(c.untyped(quote(c.name)) is not None for c in spec.columns
                               if c.name in keys.values()):
        cases = " ".join(f"WHEN {literal(o)} THEN {literal(n)}" for o, n in keys.items())
        spark.sql(f"UPDATE {target} SET {TEXT} = transform_keys({TEXT}, (k, v) -> CASE k "
                  f"{cases} ELSE k END) WHERE {TEXT} IS NOT NULL")
    types = {old: renamed.pop(old) for old, _ in moves}
    for old, new in moves:
        renamed[new] = types[old]
    return renamed
