"""Keyless tables as multisets: duplicates are kept, and a DELETE or UPDATE of one of
several identical rows changes exactly one.

Which tables: those whose replica identity is FULL, and any table whose events carry no
key column (:func:`keyless`).  pgoutput sends every column of a FULL table as its "key",
so the keyed MERGE of streaming/apply.py would fold identical rows into one.  The catalog
record does not say whether a FULL table also has a primary key (pgoutput marks every
column as a key column either way, and so does the captured definition), so a FULL table
with a primary key takes this path too: exact for it as well (a set is a multiset), at the
cost of reading the rows its batch touches.  A table keyed by its primary key (REPLICA
IDENTITY DEFAULT) or by a unique index (USING INDEX) takes the keyed path.

How a micro-batch is applied (:func:`apply_multiset`; :func:`net_changes` and
:func:`occurrence_plan` are the same rules on plain values, for the unit tests):

1. each lake row carries a hidden occurrence number (``_pgcdc_occurrence``): the rows of
   one content (every column equal, NULL equal to NULL) are occurrences 1..c;
2. the events after the table's watermark (the table property ``pgcdc.appliedThrough``,
   ``<commit_lsn>/<ordinal>`` of the newest change applied) and after its newest truncate
   (``pgcdc.truncatedAt``), each position once, are turned into steps on a content: an
   insert is +1 of its after image, a delete -1 of its before image (the whole old row
   under FULL), an update both; a read of the initial load +1, and so is a read of a table
   read whole (at the commit LSN of the newest truncate: pgcdc writes a truncate at
   ``(p, 0)`` and the rows at ``(p, 1..n)``); any other read (an incremental snapshot's)
   "at least one"; an unchanged TOASTed column of an update's after
   image takes the before image's value (PostgreSQL never leaves one out of a FULL before
   image);
3. a truncate in the batch is recorded, the rows older than it are deleted (as the keyed
   path does), and only the images after it count;
4. the steps of each content fold in position order into one function of its stored count
   c, n = max(c + add, least) (:class:`Count`; a delete of a row the lake does not hold,
   e.g. one older than the lake, changes nothing: the keyed path ignores it too); the
   stored occurrences of the contents changed are read;
5. ONE MERGE keyed on (every column null-safe equal, occurrence) deletes the occurrences
   above n and inserts c+1..n.  A content whose stored occurrences are not exactly 1..c
   (rows written before this module, or made identical by a dropped column) is rewritten
   whole: all its rows deleted, 1..n inserted;
6. the watermark is set after the MERGE, which runs with Delta's idempotent-write options:
   a batch retried after a crash is skipped by the MERGE and then sets the watermark, and an
   event at or below the watermark (Kafka duplicates after a pgcdc restart, the same offsets
   applied by another query) is left out.

The watermark needs a table's changes totally ordered in Kafka by (commit_lsn, ordinal):
one partition per table topic.  ``pgcdc run`` creates a keyless table's topic with one
partition whatever ``partitions`` says, and refuses a topic of more; the Spark job checks
every keyless table's topic when it reads the catalog and stops with
:class:`KeylessPartitionsError` rather than apply its changes out of order
(:func:`check_one_partition`).  Reads (op ``r``,
the initial load) arrive from several load workers in any order, so they do not advance it;
they all precede every streamed change, so a read at or below it is a duplicate too, and
the first reads of a table that no change precedes are the load's (their commit LSN is kept
as ``pgcdc.loadedAt``).  A
read above it is a duplicate if a lake row carries its position: each new occurrence
carries the position of the image that added it (each read's is unique), and until a
change is applied no row of a read has gone.

Not handled: an incremental snapshot's read of a keyless table not read whole says only that
its row is there, so a row the lake holds with other values stays beside it (pgcdc reads a
keyless table whose rows a DDL changed whole, truncate first); the reads of a resumed
initial load would count twice what it reads again (under new positions, no key tells them
apart), so pgcdc never resumes the load of a keyless table: it reads it whole while
streaming, a truncate first, or stops (loads/initial_load.py ``_check_no_keyless``).  Changes
written under a version of the table with a key (before REPLICA IDENTITY FULL, or a key
dropped) never reach this module: the apply gives them to the keyed path, in their own run
(streaming/apply.py ``_regime_runs``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

from core.errors import TerminalError
from core.wire import topic_name
from streaming import sql_text
from streaming.apply import (
    Steps,
    append_changelog,
    idempotent_write,
    key_range,
    record_truncate,
    shape,
    table_path,
)
from streaming.decode import content as _content
from streaming.decode import narrow
from streaming.decode import untyped as _untyped
from streaming.evolution import (
    TRUNCATED_PROPERTY,
    cached_property,
    evolve,
    quote,
    table_properties,
)
from streaming.schema import COMMIT_LSN, ORDINAL, TEXT, TableSpec

log = logging.getLogger(__name__)

OCCURRENCE = "_pgcdc_occurrence"
APPLIED_PROPERTY = "pgcdc.appliedThrough"  # "<commit_lsn>/<ordinal>" of the newest change
LOADED_PROPERTY = "pgcdc.loadedAt"  # the commit LSN of the initial load's reads
META_COLUMNS = (COMMIT_LSN, ORDINAL, OCCURRENCE)

Position = tuple[int, int]
Row = tuple[object, ...]


def keyless(spec: TableSpec) -> bool:
    """Whether a table's rows are a multiset: REPLICA IDENTITY FULL, or no key column."""
    return spec.table.keyless


# --- the rules on plain values -------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """One change as the rules see it: ``unchanged`` holds the indexes of the after image's
    unchanged TOASTed columns."""

    op: str
    position: Position
    before: Row | None = None
    after: Row | None = None
    unchanged: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Count:
    """What a batch does to one content's count: ``stored -> max(stored + add, least)``.
    Every step has this form (+1; -1 never below 0; a read that is not a load's, "at least
    one") and so has any sequence of them, folded in position order."""

    add: int = 0
    least: int = 0

    def then(self, step: int) -> Count:
        if step == 1:
            return Count(self.add + 1, self.least + 1)
        if step == -1:
            return Count(self.add - 1, max(self.least - 1, 0))
        return Count(self.add, max(self.least, 1))  # ENSURE

    def of(self, stored: int) -> int:
        return max(stored + self.add, self.least)


ENSURE = 0  # the step of a read outside the initial load: the row is there, at least once


@dataclass(frozen=True)
class NetChanges:
    truncate: Position | None  # the newest truncate applied: older rows go first
    counts: dict[Row, Count]  # per content changed (identities left out)
    applied: Position | None  # the new watermark
    loaded: int | None  # the commit LSN of the initial load's reads


def images(event: Event, *, loaded: int | None = None,
           whole: int | None = None) -> list[tuple[Row, int]]:
    """The steps of one event: (after, +1) for c and u, (before, -1) for u and d; a read is
    +1 if it is the initial load's (at ``loaded``) or a whole read's (at ``whole``, the
    newest truncate's commit LSN), else :data:`ENSURE`."""
    out: list[tuple[Row, int]] = []
    if event.op in ("u", "d"):
        if event.before is None:
            msg = f"a {event.op} of a keyless table without its old row at {event.position}"
            raise MultisetError(msg)
        out.append((event.before, -1))
    if event.op in ("c", "r", "u"):
        assert event.after is not None
        after = event.after
        if event.unchanged and event.before is not None:
            after = tuple(event.before[i] if i in event.unchanged else v
                          for i, v in enumerate(after))
        counted = event.position[0] in (loaded, whole)
        out.append((after, ENSURE if event.op == "r" and not counted else 1))
    return out


def net_changes(events: Iterable[Event], applied: Position | None,
                truncated: Position | None = None, loaded: int | None = None) -> NetChanges:
    """What one batch changes, given the table's watermark, newest truncate and load.

    The initial load's reads all carry its LSN and precede every change: the first reads of
    a table that no change precedes are the load's."""
    floor = max((p for p in (applied, truncated) if p is not None), default=None)
    unique = {e.position: e for e in events}  # an event sent twice within the batch
    fresh = sorted((e for e in unique.values() if floor is None or e.position > floor),
                   key=lambda e: e.position)
    truncate = max((e.position for e in fresh if e.op == "t"), default=None)
    first_read = min((e.position for e in fresh if e.op == "r"), default=None)
    first_change = min((e.position for e in fresh if e.op != "r"), default=None)
    if loaded is None and applied is None and first_read is not None and (
            first_change is None or first_read < first_change):
        loaded = first_read[0]
    newest_truncate = truncate or truncated
    whole = None if newest_truncate is None else newest_truncate[0]
    counts: dict[Row, Count] = {}
    for event in fresh:
        if truncate is None or event.position > truncate:
            for row, step in images(event, loaded=loaded, whole=whole):
                counts[row] = counts.get(row, Count()).then(step)
    newest = max((e.position for e in fresh if e.op != "r"), default=None)
    return NetChanges(truncate, {r: c for r, c in counts.items() if c != Count()},
                      applied if newest is None or (applied is not None and applied > newest)
                      else newest, loaded)


def occurrence_plan(stored: Sequence[int | None],
                    wanted: int) -> tuple[list[int | None], list[int]]:
    """The occurrences of one content to delete (``[None]``: every stored row) and to insert,
    for stored occurrences ``stored`` and ``wanted`` rows."""
    count = len(stored)
    clean = sorted(o for o in stored if o is not None) == list(range(1, count + 1))
    if not clean:
        return [None], list(range(1, wanted + 1))
    return list(range(wanted + 1, count + 1)), list(range(count + 1, wanted + 1))


class MultisetError(Exception):
    """An event of a keyless table that does not say which row it changed."""


class KeylessPartitionsError(TerminalError):
    """A keyless table's topic has more than one partition: its changes are not ordered."""


def check_one_partition(tables: Iterable[TableSpec], partitions: Mapping[str, int],
                        prefix: str) -> None:
    """Raise :class:`KeylessPartitionsError` naming every keyless table whose topic (under
    ``prefix``) has more than one partition, as ``partitions`` (topic -> count) says."""
    wrong = sorted((topic, spec.qualified_name, partitions[topic]) for spec in tables
                   if keyless(spec)
                   and partitions.get(topic := topic_name(prefix, spec.schema, spec.name), 1) > 1)
    if not wrong:
        return
    named = "; ".join(f"topic {topic} of table {table} has {count} partitions"
                      for topic, table, count in wrong)
    msg = (f"{named}: a keyless table (REPLICA IDENTITY FULL or no key) is applied as a "
           "multiset, which needs its changes in one partition, in order; nothing of it was "
           "applied. Fix: give the table a primary key (ALTER TABLE ... ADD PRIMARY KEY; "
           "REPLICA IDENTITY DEFAULT), or delete the topic and let pgcdc run create it again "
           "with one partition, reloading the table (docs/types.md, Keyless tables)")
    raise KeylessPartitionsError(msg)


# --- the same on Spark ---------------------------------------------------------------

# per lake path and table OID (a table dropped and created again under its name is another
# table there), the watermark and load LSN this driver read or wrote (the only writer)
_APPLIED: dict[tuple[str, int], tuple[Position | None, int | None]] = {}


def _parse(raw: str | None) -> Position | None:
    if raw is None:
        return None
    lsn, ordinal = raw.split("/")
    return int(lsn), int(ordinal)


def applied_through(spark: Any, path: str, oid: int) -> Position | None:
    """The newest change applied to table ``oid``'s lake table at ``path`` (its watermark);
    None when none was."""
    cached = _APPLIED.get((path, oid))
    return cached[0] if cached is not None else _stored_watermark(spark, path)[0]


def _stored_watermark(spark: Any, path: str) -> tuple[Position | None, int | None]:
    """The table's watermark and load LSN; for a table written before this module (no
    occurrence column), the newest position among its rows, which the keyed path wrote."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return None, None
    properties = table_properties(spark, path)
    applied = _parse(properties.get(APPLIED_PROPERTY))
    loaded = properties.get(LOADED_PROPERTY)
    if applied is not None or loaded is not None:
        return applied, None if loaded is None else int(loaded)
    frame = spark.read.format("delta").load(path)
    if OCCURRENCE in frame.columns:
        return None, None
    newest = frame.selectExpr(f"max(struct({COMMIT_LSN}, {ORDINAL})) AS p").collect()[0]["p"]
    return None if newest is None else (int(newest[0]), int(newest[1])), None


def _contents(spec: TableSpec) -> list[tuple[str, str, str]]:
    """What makes a row's content: per column, the internal name of its typed value, the
    lake's expression of it (target alias ``t``) and its name; and for a column whose typed
    value may be NULL though the value is not (a NaN in a decimal), the text kept in
    ``_pgcdc_text`` too (a NaN row is not a NULL row)."""
    out = []
    for i, column in enumerate(spec.columns):
        out.append((_content(i), quote(column.name), column.name))
        if narrow(column):
            out.append((_untyped(i), f"{TEXT}[{sql_text.literal(column.name)}]", column.name))
    return out


def _signed_images(events: Any, spec: TableSpec) -> Any:
    """One table's typed events (streaming/decode.py ``table_events``) as ``_op``,
    position, ``_blind`` (an update or delete without its old row) and the before and after
    images as structs of the content (:func:`_contents`): the after image's unchanged
    TOASTed columns take the before image's values."""
    contents = _contents(spec)
    before = ", ".join(f"'{f}', before.{f}" for f, _, _ in contents)
    after = ", ".join(f"'{f}', CASE WHEN array_contains(unchanged, {sql_text.literal(name)}) "
                      f"THEN before.{f} ELSE after.{f} END" for f, _, name in contents)
    return events.selectExpr(
        "op AS _op", f"source.commit_lsn AS {COMMIT_LSN}", f"source.ordinal AS {ORDINAL}",
        "(op IN ('u', 'd') AND before IS NULL) AS _blind",
        f"named_struct({before}) AS _before",
        f"named_struct({after}) AS _after")


def _null_safe(left: Any, right: Any, names: list[str]) -> Any:
    from pyspark.sql import functions as F

    return reduce(lambda a, b: a & b, [left[n].eqNullSafe(right[n]) for n in names],
                  F.lit(True))


def _merge_source(spark: Any, path: str, rows: Any, spec: TableSpec,
                  bounds: tuple[str, str, str] | None = None, loaded: int | None = None,
                  whole: int | None = None) -> Any:
    """Rows to delete (``_kind`` 'd': one occurrence, or with ``_whole`` every row of the
    content) and to insert ('i'), from the batch's events ``rows`` (in the shape of
    :func:`_signed_images`, already left out what the watermark and a truncate cover):
    :func:`net_changes` and :func:`occurrence_plan` on Spark."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    contents = [name for name, _, _ in _contents(spec)]
    counted = [f"{COMMIT_LSN} = {lsn}" for lsn in (loaded, whole) if lsn is not None]
    load = " OR ".join(counted) or "false"  # reads of the load or of a whole read: +1
    plus = rows.where("_op IN ('c', 'r', 'u')").selectExpr(
        "_after.*", f"CASE WHEN _op = 'r' AND NOT ({load}) THEN {ENSURE} ELSE 1 END AS _step",
        "1 AS _side", COMMIT_LSN, ORDINAL)
    minus = rows.where("_op IN ('u', 'd')").selectExpr(
        "_before.*", "-1 AS _step", "0 AS _side", COMMIT_LSN, ORDINAL)
    # Count.then folded in position order (an update's old row before its new one)
    zero = "CAST(0 AS BIGINT)"
    fold = (f"aggregate(array_sort(collect_list(struct({COMMIT_LSN}, {ORDINAL}, _side, "
            f"_step))), named_struct('add', {zero}, 'least', {zero}), (acc, e) -> "
            "CASE WHEN e._step = 1 THEN named_struct('add', acc.add + 1, 'least', acc.least + 1)"
            " WHEN e._step = -1 THEN named_struct('add', acc.add - 1, "
            f"'least', greatest(acc.least - 1, {zero})) "
            f"ELSE named_struct('add', acc.add, 'least', greatest(acc.least, {zero} + 1)) END)")
    changes = plus.unionByName(minus).groupBy(*contents).agg(
        F.expr(fold).alias("_fold"),
        F.max(F.struct(COMMIT_LSN, ORDINAL)).alias("_at")).where(
        "_fold.add != 0 OR _fold.least != 0")
    stored = spark.read.format("delta").load(path).where(key_range(bounds) or "true").selectExpr(
        *[f"{lake} AS {name}" for name, lake, _ in _contents(spec)],
        f"{OCCURRENCE} AS _occurrence")
    counted = stored.join(changes.select(*contents), _null_safe(stored, changes, contents),
                          "left_semi").groupBy(*contents).agg(
        F.count(F.lit(1)).alias("_count"), F.count("_occurrence").alias("_numbered"),
        F.countDistinct("_occurrence").alias("_distinct"),
        F.min("_occurrence").alias("_lo"), F.max("_occurrence").alias("_hi"))
    c, s = changes.alias("c"), counted.alias("s")
    plan = c.join(s, _null_safe(c, s, contents), "left").select(
        *[F.col(f"c.{n}") for n in contents], "c._at",
        F.coalesce(F.col("s._count"), F.lit(0)).alias("_count"),
        F.expr("greatest(coalesce(s._count, 0) + c._fold.add, c._fold.least)").alias("_wanted"),
        F.expr("coalesce(s._count, 0) = 0 OR (s._numbered = s._count AND "
               "s._distinct = s._count AND s._lo = 1 AND s._hi = s._count)").alias("_clean"))
    at = [f"_at.{COMMIT_LSN} AS {COMMIT_LSN}", f"_at.{ORDINAL} AS {ORDINAL}"]
    delete_one = plan.where("_clean AND _wanted < _count").selectExpr(
        *contents, "explode(sequence(_wanted + 1, _count)) AS _occurrence", "'d' AS _kind",
        "false AS _whole", *at)
    delete_all = plan.where("NOT _clean").selectExpr(
        *contents, "CAST(NULL AS BIGINT) AS _occurrence", "'d' AS _kind", "true AS _whole", *at)
    numbered = plan.selectExpr("*", "CASE WHEN _clean THEN _count + 1 ELSE 1 END AS _from")\
        .where("_from <= _wanted").selectExpr(
            *contents, "explode(sequence(_from, _wanted)) AS _occurrence", "_wanted", "_at")\
        .selectExpr("*", "_wanted - _occurrence + 1 AS _rank").alias("i")
    # a new occurrence carries the position of the image that added it: the newest to the
    # highest occurrence (so that a read's position names its row, see apply_multiset)
    order = Window.partitionBy(*contents).orderBy(F.col(COMMIT_LSN).desc(),
                                                  F.col(ORDINAL).desc())
    added = plus.select(*contents, COMMIT_LSN, ORDINAL,
                        F.row_number().over(order).alias("_rank")).alias("a")
    insert = numbered.join(
        added, _null_safe(numbered, added, contents) & (F.col("i._rank") == F.col("a._rank")),
        "left").select(
        *[F.col(f"i.{n}") for n in contents], F.col("i._occurrence"),
        F.lit("i").alias("_kind"), F.lit(False).alias("_whole"),
        F.coalesce(F.col(f"a.{COMMIT_LSN}"), F.col(f"i._at.{COMMIT_LSN}")).alias(COMMIT_LSN),
        F.coalesce(F.col(f"a.{ORDINAL}"), F.col(f"i._at.{ORDINAL}")).alias(ORDINAL))
    return delete_one.unionByName(delete_all).unionByName(insert)


def _merge(target: Any, source: Any, spec: TableSpec,
           bounds: tuple[str, str, str] | None = None) -> Any:
    """Delete the planned occurrences, insert the missing ones: one MERGE."""
    same = [f"t.{lake} <=> s.{name}" for name, lake, _ in _contents(spec)]
    in_range = key_range(bounds, "t")  # a target-only condition: data skipping
    on = " AND ".join([*same, *([in_range] if in_range else []), "s._kind = 'd'",
                       f"(s._whole OR t.{OCCURRENCE} = s._occurrence)"])
    values = {quote(c.name): f"s.{_content(i)}" for i, c in enumerate(spec.columns)}
    values.update({COMMIT_LSN: f"s.{COMMIT_LSN}", ORDINAL: f"s.{ORDINAL}",
                   OCCURRENCE: "s._occurrence",
                   TEXT: sql_text.text_map([(column, f"s.{name}")
                                             for name, _, column in _contents(spec)
                                             if name.startswith("_u")])})
    return target.alias("t").merge(source.alias("s"), on).whenMatchedDelete()\
        .whenNotMatchedInsert(condition="s._kind = 'i'", values=values)


# (not dates: a BC date has no Python value to collect)
_RANGE_TYPES = ("smallint", "int", "bigint", "string")


def _range_stats(spec: TableSpec) -> list[str]:
    """The least and greatest value of the first column among the batch's images, and how
    many of them are NULL, if its type has simple literals (as the keyed path's range)."""
    if not spec.columns or not (spec.columns[0].spark_type in _RANGE_TYPES
                                or spec.columns[0].spark_type.startswith("decimal")):
        return []
    old, new = "CASE WHEN _op IN ('u', 'd') THEN _before._c0 END", \
        "CASE WHEN _op IN ('c', 'r', 'u') THEN _after._c0 END"
    return [f"min(least({old}, {new})) AS lo", f"max(greatest({old}, {new})) AS hi",
            "count_if(_op IN ('u', 'd') AND _before._c0 IS NULL "
            "OR _op IN ('c', 'r', 'u') AND _after._c0 IS NULL) AS nulls"]


def _bounds(spec: TableSpec, found: Any) -> tuple[str, str, str] | None:
    """The range of the first column that every content the batch changes lies in: a
    target-only condition lets Delta skip every file outside it (none if a value is NULL,
    which a range never matches)."""
    if "lo" not in found.asDict() or found["lo"] is None or found["nulls"]:
        return None
    column = spec.columns[0]
    return (column.name, sql_text.sql_value(found["lo"], column.spark_type),
            sql_text.sql_value(found["hi"], column.spark_type))


def apply_multiset(spark: Any, events: Any, spec: TableSpec, lake: str, *,
                   idempotence: tuple[str, int] | None = None, changelog: bool = False,
                   versions: list[TableSpec] | None = None, steps: Steps | None = None,
                   keep_dropped: bool = False) -> int:
    """Apply one keyless table's events of a batch (see the module docstring); returns how
    many rows the MERGE inserted or deleted (0 when Delta skipped it as already committed)."""
    step = steps if steps is not None else Steps(spark, -1 if idempotence is None
                                                 else idempotence[1])
    path = table_path(lake, spec)
    with step("table"):
        if (path, spec.oid) not in _APPLIED:  # read before the column is added
            _APPLIED[path, spec.oid] = _stored_watermark(spark, path)
        target = evolve(spark, path, spec, META_COLUMNS, versions, keep_dropped=keep_dropped)
    applied, loaded = _APPLIED[path, spec.oid]
    truncated = _parse(cached_property(spark, path, TRUNCATED_PROPERTY))
    floor = max((p for p in (applied, truncated) if p is not None), default=None)
    rows = _signed_images(events, spec)
    if floor is not None:
        rows = rows.where(sql_text.position(*floor, ">"))
    # an event sent twice within the batch counts once
    cached = rows = rows.dropDuplicates([COMMIT_LSN, ORDINAL]).persist()
    try:
        with step("stats"):
            found = rows.selectExpr(
                f"max(CASE WHEN _op = 't' THEN struct({COMMIT_LSN}, {ORDINAL}) END) AS t",
                f"max(CASE WHEN _op != 'r' THEN struct({COMMIT_LSN}, {ORDINAL}) END) AS newest",
                "count_if(_blind) AS blind", "count_if(_op != 't') AS changes",
                f"min(CASE WHEN _op = 'r' THEN {COMMIT_LSN} END) AS reads_from",
                f"max(CASE WHEN _op = 'r' THEN {COMMIT_LSN} END) AS reads_to",
                f"min(CASE WHEN _op = 'r' THEN struct({COMMIT_LSN}, {ORDINAL}) END) AS read",
                f"min(CASE WHEN _op != 'r' THEN struct({COMMIT_LSN}, {ORDINAL}) END) AS change",
                *_range_stats(spec)).collect()[0]
        if found["blind"]:
            msg = (f"{found['blind']} update(s) or delete(s) of the keyless table "
                   f"{spec.qualified_name} without the old row: which of identical rows "
                   "they changed is unknown; set REPLICA IDENTITY FULL before changing rows")
            raise MultisetError(msg)
        newest_truncate = truncated
        if found["t"] is not None:
            truncate = newest_truncate = (int(found["t"][0]), int(found["t"][1]))
            if truncated is None or truncate > truncated:
                record_truncate(spark, path, truncate)  # first: a retry still knows
            target.delete(sql_text.position(*truncate, "<"))
            rows = rows.where(sql_text.position(*truncate, ">"))
        if found["reads_from"] is not None:  # a read the lake holds already: a replay
            held = spark.read.format("delta").load(path).where(
                f"{COMMIT_LSN} BETWEEN {found['reads_from']} AND {found['reads_to']}")\
                .select(COMMIT_LSN, ORDINAL)
            rows = rows.where("_op != 'r'").unionByName(
                rows.where("_op = 'r'").join(held, [COMMIT_LSN, ORDINAL], "left_anti"))
        # the first reads of a table that no change precedes are the initial load's
        newly_loaded = loaded is None and applied is None and found["read"] is not None and (
            found["change"] is None or tuple(found["read"]) < tuple(found["change"]))
        if newly_loaded:
            loaded = int(found["read"][0])
        affected = 0
        if found["changes"]:
            bounds = _bounds(spec, found)
            source = _merge_source(spark, path, rows, spec, bounds, loaded,
                                   None if newest_truncate is None else newest_truncate[0])
            with step("merge"), idempotent_write(spark, idempotence):
                metrics = _merge(target, source, spec, bounds).execute().collect()
            if metrics:
                affected = int(metrics[0]["num_affected_rows"])
        newest = None if found["newest"] is None else (int(found["newest"][0]),
                                                       int(found["newest"][1]))
        advanced = newest is not None and (applied is None or newest > applied)
        if advanced or newly_loaded:
            if advanced:
                assert newest is not None
                applied = newest
            properties = ([f"'{APPLIED_PROPERTY}' = '{applied[0]}/{applied[1]}'"]
                          if applied is not None else []) + (
                [f"'{LOADED_PROPERTY}' = '{loaded}'"] if loaded is not None else [])
            spark.sql(f"ALTER TABLE delta.{quote(path)} SET TBLPROPERTIES "
                      f"({', '.join(properties)})")
            _APPLIED[path, spec.oid] = (applied, loaded)
        if changelog:
            with step("changelog"):
                append_changelog(shape(events, spec), path, idempotence)
        return affected
    finally:
        cached.unpersist()
