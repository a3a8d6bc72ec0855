"""Applying one micro-batch of change events to Delta tables.

For each source table in the batch (by OID):

1. every event's table version must be in the catalog log, or the batch fails
   (a missing version is never guessed);
2. its events are decoded into the table's newest shape, typed (streaming/decode.py);
   columns an older version did not have are NULL;
3. the latest change per key wins, by ``(commit_lsn, ordinal)``;
4. a truncate removes every older row, and earlier events of the batch; its position is
   kept as a table-level tombstone (the table property ``pgcdc.truncatedAt``), so a change
   older than the truncate that arrives later (a replay, late data) is left out too;
5. a change older than its key's recorded delete is left out (streaming/tombstones.py),
   so a late or replayed change never resurrects a deleted row;
6. one MERGE applies the rest, guarded so that an older change never overwrites
   a newer one: replaying a batch, or an event that arrives twice, leaves the
   table as it was.  Unchanged TOASTed columns keep their stored value;
7. optionally, every event is appended to ``<table>__changelog``.

Each MERGE runs with Delta's idempotent-write options (an application id tied to
the query and the batch id), so a batch retried after a driver crash is skipped
by tables that already committed it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from core.errors import TerminalError
from core.wire import table_name
from streaming import ownership, sql_text, toast
from streaming.catalog import CatalogLog, LakeCatalog
from streaming.decode import (
    CATALOG_FORMAT,
    KEYS,
    OLD_KEYS,
    TOASTED,
    CatalogMismatchError,
    batch_versions,
    content,
    header_rows,
    narrow,
    parse_envelopes,
    parse_parts,
    table_events,
    union,
    untyped,
)
from streaming.evolution import (
    TRUNCATED_PROPERTY,
    cached_property,
    evolve,
    forget,
    quote,
    table_exists,
    table_properties,
)
from streaming.schema import (
    COMMIT_LSN,
    ORDINAL,
    TEXT,
    TEXT_TYPE,
    ColumnSpec,
    TableSpec,
    renamed_names,
    retyped_versions,
)
from streaming.tombstones import drop_superseded, record_deletes, tombstone_path

log = logging.getLogger(__name__)

META_COLUMNS = (COMMIT_LSN, ORDINAL)

def table_path(lake: str, spec: TableSpec) -> str:
    """The lake table of a source table, one folder per name (``core.wire.table_name``,
    as its topic): ``<lake>/<schema>.<table>``, with a digest part when a name holds more
    than ``A-Z a-z 0-9 _ -``, so that no two names share a folder."""
    return f"{lake.rstrip('/')}/{table_name(spec.schema, spec.name)}"


@dataclass(frozen=True)
class TableBatch:
    """What :func:`summarize` found about one table's events in a micro-batch."""

    truncate: tuple[int, int] | None  # the position of the newest truncate, if any
    ops: frozenset[str]  # the operations present: c, r, u, d, t
    versions: frozenset[str] = frozenset()  # the table versions of its events
    newest: tuple[int, int] | None = None  # the position of its newest event
    # the (format, table version) pairs of its events (streaming/decode.py table_events)
    encodings: frozenset[tuple[str, str]] = frozenset()
    # whether an update may have moved its row to another key (:data:`MAY_MOVE`)
    may_move: bool = True
    # whether an update left TOASTed columns unchanged (streaming/toast.py)
    toasted: bool = True


# An update that may have moved its row to another key (:func:`moved_keys`): one
# with an old image.  PostgreSQL sends the old image of an update only when the key changed
# or under REPLICA IDENTITY FULL; without it, the old key's text is NULL in every key column
# of the event's version.  A version without key columns (a key added since) counts as
# moving: its old image is not looked at here.
MAY_MOVE = (f"op = 'u' AND NOT coalesce(size({OLD_KEYS}) > 0 "
            f"AND forall({OLD_KEYS}, k -> k IS NULL), false)")


def summarize(events: Any, catalog: CatalogLog) -> dict[int, TableBatch]:
    """Per table OID of the batch, its operations and the position of its newest truncate,
    in one pass; raise if an event's version is unknown or disagrees with its header."""
    from pyspark.sql import functions as F

    summary = events.groupBy("source.table_oid").agg(
        F.expr("collect_set(source.table_version)").alias("versions"),
        F.expr("collect_set(op)").alias("ops"),
        F.expr("collect_set(struct(_format, source.table_version))").alias("encodings"),
        F.expr("max(CASE WHEN op = 't' THEN struct(source.commit_lsn, source.ordinal) END)")
        .alias("trunc"),
        F.expr("max(struct(source.commit_lsn, source.ordinal))").alias("newest"),
        F.expr("max(_version IS NOT NULL AND _version != source.table_version)")
        .alias("mismatch"),
        F.expr(f"max({MAY_MOVE})").alias("may_move"),
        F.expr(f"max(op = 'u' AND {TOASTED})").alias("toasted"),
    ).collect()
    if any(r["mismatch"] for r in summary):
        msg = "an event's pgcdc.table_version header disagrees with its source.table_version"
        raise CatalogMismatchError(msg)
    missing = [(r["table_oid"], v) for r in summary for v in r["versions"]
               if catalog.version(int(r["table_oid"]), str(v)) is None]
    if missing:
        msg = (f"events name table versions missing from the catalog log: {missing}; "
               "the catalog topic is incomplete or belongs to another topic prefix")
        raise CatalogMismatchError(msg)
    return {int(r["table_oid"]): TableBatch(
        None if r["trunc"] is None else (int(r["trunc"][0]), int(r["trunc"][1])),
        frozenset(str(op) for op in r["ops"]), frozenset(str(v) for v in r["versions"]),
        None if r["newest"] is None else (int(r["newest"][0]), int(r["newest"][1])),
        frozenset((str(f), str(v)) for f, v in r["encodings"]), bool(r["may_move"]),
        bool(r["toasted"]))
        for r in summary}


def check_versions(events: Any, catalog: CatalogLog) -> list[int]:
    """The table OIDs of the batch; raise if any event's version is unknown."""
    return sorted(summarize(events, catalog))


def _present(image: str, i: int, column: ColumnSpec) -> str:
    """Whether the ``i``-th column has a value in the image (typed, or kept as text)."""
    found = f"{image}.{content(i)} IS NOT NULL"
    return f"({found} OR {image}.{untyped(i)} IS NOT NULL)" if narrow(column) else found


def shape(events: Any, spec: TableSpec, *, origin: bool = False) -> Any:
    """One table's typed events (streaming/decode.py :func:`table_events`) as lake rows,
    one per event: the new row's values, a key column's from the old row where the new row
    has none (a delete), ``_pgcdc_text``, the operation, the position, and the unchanged
    TOASTed columns; with ``origin``, also the old key of an update that moved its row
    (streaming/toast.py :data:`~streaming.toast.ORIGIN`)."""
    exprs = []
    entries: list[tuple[str, str]] = []  # (column, its text where its typed value is NULL)
    for i, column in enumerate(spec.columns):
        value, text = f"after.{content(i)}", f"after.{untyped(i)}"
        if column.is_key:
            present = _present("after", i, column)
            value = f"CASE WHEN {present} THEN {value} ELSE before.{content(i)} END"
            text = f"CASE WHEN {present} THEN {text} ELSE before.{untyped(i)} END"
        exprs.append(f"{value} AS {quote(column.name)}")
        if narrow(column):
            entries.append((column.name, text))
    exprs += [
        f"{sql_text.text_map(entries)} AS {TEXT}",
        "op AS _op",
        f"source.commit_lsn AS {COMMIT_LSN}",
        f"source.ordinal AS {ORDINAL}",
        "unchanged AS _unchanged",
    ]
    if origin:
        exprs.append(toast.origin(spec, _moved(spec)))
    return events.selectExpr(*exprs)


_EMPTY = f"CAST(map() AS {TEXT_TYPE})"


def moved_keys(events: Any, spec: TableSpec) -> Any:
    """A delete of the old key of every update that changed its table's key, in the shape
    of :func:`shape`, at the update's own position: the row leaves its old key, and a change
    of the old key older than the update (a replay, late data) finds its tombstone.

    PostgreSQL sends such an update with the old key in ``before`` (and the whole old row
    under ``REPLICA IDENTITY FULL``, whose key may not have changed: no delete then)."""
    exprs = [f"before.{content(i)} AS {quote(c.name)}" if c.is_key
             else f"CAST(NULL AS {c.spark_type}) AS {quote(c.name)}"
             for i, c in enumerate(spec.columns)]
    exprs += [f"CAST(NULL AS {TEXT_TYPE}) AS {TEXT}", "'d' AS _op",
              f"source.commit_lsn AS {COMMIT_LSN}", f"source.ordinal AS {ORDINAL}",
              "CAST(array() AS ARRAY<STRING>) AS _unchanged"]
    return events.where(f"op = 'u' AND before IS NOT NULL AND ({_moved(spec)})"
                        ).selectExpr(*exprs)


def _moved(spec: TableSpec) -> str:
    """Whether an update's old image (if any) holds another key than its new one."""
    def same(i: int, column: ColumnSpec) -> str:
        equal = f"before.{content(i)} <=> after.{content(i)}"
        return f"{equal} AND before.{untyped(i)} <=> after.{untyped(i)}" if narrow(column) \
            else equal

    return " OR ".join(f"({_present('before', i, c)} AND NOT ({same(i, c)}))"
                       for i, c in enumerate(spec.columns) if c.is_key) or "false"


def latest_per_key(rows: Any, spec: TableSpec) -> Any:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    order = Window.partitionBy(*[quote(c.name) for c in spec.key_columns]).orderBy(
        F.col(COMMIT_LSN).desc(), F.col(ORDINAL).desc())
    return rows.withColumn("_rank", F.row_number().over(order)).where("_rank = 1").drop("_rank")


def ensure_table(spark: Any, path: str, spec: TableSpec,
                 versions: list[TableSpec] | None = None, *, keep_dropped: bool = False) -> Any:
    """The Delta table at ``path``, created or evolved to ``spec``'s columns (the columns
    the source dropped dropped too, or kept with ``keep_dropped``)."""
    return evolve(spark, path, spec, META_COLUMNS, versions, keep_dropped=keep_dropped)


def truncated_at(spark: Any, path: str) -> tuple[int, int] | None:
    """The position of the newest truncate applied to the table, if any."""
    raw = table_properties(spark, path).get(TRUNCATED_PROPERTY)
    if raw is None:
        return None
    lsn, ordinal = raw.split("/")
    return int(lsn), int(ordinal)


def record_truncate(spark: Any, path: str, position: tuple[int, int]) -> None:
    """The table-level tombstone: no change older than this truncate is applied again."""
    spark.sql(f"ALTER TABLE delta.{quote(path)} SET TBLPROPERTIES "
              f"('{TRUNCATED_PROPERTY}' = '{position[0]}/{position[1]}')")
    forget(path)


_UNKNOWN = object()


def apply_table(spark: Any, events: Any, spec: TableSpec, lake: str, *,
                idempotence: tuple[str, int] | None = None, changelog: bool = False,
                versions: list[TableSpec] | None = None,
                truncate: tuple[int, int] | None | object = _UNKNOWN,
                ops: frozenset[str] | None = None, steps: Steps | None = None,
                bounds: tuple[str, str, str] | None | object = _UNKNOWN,
                keep_dropped: bool = False,
                encodings: frozenset[tuple[str, str]] | None = None,
                may_move: bool = True, toasted: bool = True) -> int:
    """MERGE one table's events of a batch; returns how many rows it inserted, updated or
    deleted.

    ``bounds``: the range of the table's first key column in the batch (or None), if the
    caller measured it for every table at once (:func:`batch_bounds`); the table's own
    statistics job is left out then.

    ``truncate`` and ``ops``: the position of the batch's newest truncate of this table and
    the operations present, if the caller knows them (:func:`summarize`); the truncate is
    otherwise looked up here, and without ``ops`` the full MERGE runs.  ``keep_dropped``:
    keep the lake columns of columns the source dropped (:func:`evolve`).  ``encodings``:
    the (format, table version) pairs of the table's events, if the caller knows them
    (:func:`summarize`); otherwise looked up here.  ``may_move``: False when the caller knows
    that no update of the table's events has an old image (:data:`MAY_MOVE`), so none moved
    its row to another key: no deletes of old keys are looked for, and with no delete in
    the batch either, no tombstones are written.  ``toasted``: False when the caller knows
    that no update left a TOASTed column unchanged: their values are not looked for
    (streaming/toast.py).

    ``events`` are the batch's (streaming/decode.py :func:`parse_envelopes`); the table's
    are decoded into its typed shape here (:func:`table_events`)."""
    step = steps if steps is not None else Steps(spark, -1 if idempotence is None
                                                 else idempotence[1])
    from streaming import multiset  # (it imports this module)

    if encodings is None:
        encodings = frozenset(
            (str(r[0]), str(r[1])) for r in events.where(f"source.table_oid = {spec.oid}")
            .selectExpr("_format", "source.table_version").distinct().collect())
    history = _history(spec, versions or [])
    batch = {v for _, v in encodings}
    runs = None if _uniform(spec, versions or [], history, [
        i for i, v in enumerate(history) if v.version in batch]) else _regime_runs(
        spec, versions or [], history, _occurring(events, spec, history, batch),
        batch - {v.version for v in history})
    if runs is not None:  # the batch's versions identify rows otherwise than ``spec``
        path = table_path(lake, spec)
        applied = 0
        for i, (run, run_spec) in enumerate(runs):
            written = events.where(run.where)
            gone = _kept_gone(spark, path, run_spec, spec)
            if gone:
                _check_replayed(spark, written, path, spec, gone)
                continue  # applied already, before an apply dropped the key's column
            applied += apply_table(
                spark, written, run_spec, lake, changelog=changelog, versions=versions,
                steps=step, keep_dropped=keep_dropped,
                encodings=frozenset(e for e in encodings if e[1] in run.versions),
                idempotence=None if idempotence is None  # one Delta write per run, each its own
                else (f"{idempotence[0]}/{i}" if len(runs) > 1 else idempotence[0],
                      idempotence[1]))
        return applied
    keyless = multiset.keyless(spec)
    events = table_events(events, spec, versions or [], sorted(encodings), lenient=not keyless)
    if keyless:  # rows without a key: a multiset, duplicates kept
        return multiset.apply_multiset(spark, events, spec, lake, idempotence=idempotence,
                                       changelog=changelog, versions=versions, steps=step,
                                       keep_dropped=keep_dropped)
    path = table_path(lake, spec)
    fresh = not table_exists(spark, path)  # created empty below: its rows are appended
    with step("table"):
        target = ensure_table(spark, path, spec, versions, keep_dropped=keep_dropped)
    rows = shape(events, spec)
    applied_rows = rows
    if toasted and (ops is None or "u" in ops):  # values the source did not send again
        with step("unchanged"):
            rows = toast.carry_unchanged(shape(events, spec, origin=True), spec,
                                         target.toDF)
    if truncate is _UNKNOWN:
        found = rows.where("_op = 't'").selectExpr(
            f"max(struct({COMMIT_LSN}, {ORDINAL})) AS p").collect()[0]["p"]
        truncate = None if found is None else (int(found[0]), int(found[1]))
    floor = cached_property(spark, path, TRUNCATED_PROPERTY)
    floor_at = None if floor is None else (int(floor.split("/")[0]), int(floor.split("/")[1]))
    if isinstance(truncate, tuple):
        position = (int(truncate[0]), int(truncate[1]))
        if floor_at is None or position > floor_at:
            # recorded first: should the delete or the MERGE fail, the replay still knows
            record_truncate(spark, path, position)
            floor_at = position
        target.delete(sql_text.position(*position, "<"))
    if floor_at is not None:  # a change older than the newest truncate never comes back
        rows = rows.where(sql_text.position(*floor_at, ">"))
    changes = rows.where("_op != 't'")
    if (ops is None or "u" in ops) and may_move:  # an update may have moved its row
        moved = moved_keys(events, spec)
        if floor_at is not None:
            moved = moved.where(sql_text.position(*floor_at, ">"))
        changes = changes.unionByName(moved)
    latest = latest_per_key(changes, spec).persist()
    try:
        if bounds is _UNKNOWN:
            with step("stats"):  # one pass: materializes the cache the MERGE then reads
                stats = _batch_stats(latest, spec)
        else:  # the MERGE materializes the cache; a delete only from a delete or an update
            stats = _Stats(-1, int(ops is None or "d" in ops or ("u" in ops and may_move)),
                           bounds if isinstance(bounds, tuple) else None)
        if stats.changes == 0:
            if changelog:
                with step("changelog"):
                    append_changelog(applied_rows, path, idempotence)
            return 0
        with step("tombstones read"):
            source = drop_superseded(spark, latest, spec, path, versions, stats.bounds)
        if fresh:
            with step("append"):
                affected = _append_new(spark, source, spec, path, idempotence)
        else:
            merge = _merge(target, source, spec, stats.bounds, insert_only=ops is not None
                           and ops <= INSERT_ONLY_OPS)
            with step("merge"), idempotent_write(spark, idempotence):
                metrics = merge.execute().collect()
            # rows the MERGE inserted, updated or deleted; none when Delta skipped the batch
            # as already committed (txnAppId / txnVersion)
            affected = int(metrics[0]["num_affected_rows"]) if metrics else 0
        if stats.deletes:
            with step("tombstones write"):
                record_deletes(spark, source, spec, path, idempotence)  # after the MERGE
        if changelog:
            with step("changelog"):
                append_changelog(applied_rows, path, idempotence)
        return affected
    finally:
        latest.unpersist()


def _identity(version: TableSpec, spec: TableSpec,
              versions: list[TableSpec]) -> tuple[str, ...] | None:
    """How ``version`` identified a row: None for a multiset (keyless:
    streaming/multiset.py), else its key columns by ``spec``'s names (a key column
    ``spec`` no longer has, dropped since, by its name in ``version``)."""
    if version.table.keyless:
        return None
    renames = renamed_names(spec, versions)
    then = {c.name for c in version.key_columns}
    keys = [c.name for c in spec.columns
            if renames.get(c.name, {}).get(version.version, c.name) in then]
    found = {renames.get(n, {}).get(version.version, n) for n in keys}
    return tuple(keys + sorted(then - found))


class KeyDroppedError(TerminalError):
    """Changes written under a key whose column the lake table no longer holds."""


def _kept_gone(spark: Any, path: str, run: TableSpec, spec: TableSpec) -> list[str]:
    """The key columns ``run`` keeps that ``spec`` dropped (:func:`_kept_keys`) and the lake
    table no longer holds (an apply of the changes after theirs dropped them there too)."""
    gone = {c.name for c in run.columns} - {c.name for c in spec.columns}
    if not gone or not table_exists(spark, path):
        return []
    return sorted(gone - set(spark.read.format("delta").load(path).columns))


def _newest_applied(spark: Any, path: str, oid: int) -> tuple[int, int] | None:
    """The newest change the lake table shows applied: its rows' and tombstones' positions,
    its multiset watermark, its newest truncate."""
    from streaming import multiset  # (it imports this module)

    found = [multiset.applied_through(spark, path, oid), truncated_at(spark, path)]
    for at in (path, tombstone_path(path)):
        if table_exists(spark, at):
            newest = spark.read.format("delta").load(at).selectExpr(
                f"max(struct({COMMIT_LSN}, {ORDINAL})) AS p").collect()[0]["p"]
            found.append(None if newest is None else (int(newest[0]), int(newest[1])))
    return max((p for p in found if p is not None), default=None)


def _check_replayed(spark: Any, events: Any, path: str, spec: TableSpec,
                    gone: list[str]) -> None:
    """Changes written under a key whose column the lake table no longer holds: they were
    applied before the apply that dropped the column (a batch applied again after a crash,
    changes sent again after ``pgcdc run`` restarted), or :class:`KeyDroppedError`.

    A change reaches a table's topic after every change written before it, or again, sent a
    second time; the drop was applied with changes written after the key's, so every change
    written under the key that was in the topic by then was applied too.  What the lake
    shows applied bounds them: a change newer than that is pending, and its row cannot be
    found."""
    newest = _newest_applied(spark, path, spec.oid)
    events = events.where(f"source.table_oid = {spec.oid}")
    pending = events if newest is None else events.where(sql_text.position(
        *newest, ">", columns=("source.commit_lsn", "source.ordinal")))
    count = pending.count()
    if count:
        msg = (f"{count} change(s) of {spec.qualified_name} written under its key {gone} are "
               f"pending, but the lake table {path} no longer has the column(s) {gone}, so "
               "their rows cannot be found; load the table into the lake again (pgcdc "
               "snapshot --lake) or start the job with --archive-dropped before dropping a "
               "key column")
        raise KeyDroppedError(msg)
    log.info("%s: changes written under its dropped key %s were applied already (the lake "
             "shows changes through %s applied); left out", spec.qualified_name, gone, newest)


def _listed(names: set[str]) -> str:
    return ", ".join(sql_text.literal(n) for n in sorted(names))


@dataclass(frozen=True)
class _Run:
    """Table versions of a batch applied alike (:func:`_regime_runs`): their version
    strings, and the SQL condition that picks their events."""

    versions: frozenset[str]
    where: str


def _history(spec: TableSpec, versions: list[TableSpec]) -> list[TableSpec]:
    """The table's versions in the order they took effect, each time one did: a definition
    that came back (a key dropped, the table as it was before the key was added) has one
    version string for each of its times (identical definitions, identical versions)."""
    history = sorted(versions, key=lambda v: v.lsn)  # (stable: the catalog's order at a tie)
    if not history or history[-1].version != spec.version:
        history.append(spec)
    return history


def _span(history: list[TableSpec], i: int) -> str:
    """The condition on an event of ``history[i]``'s version string that it was written in
    that version's time, not in another time of the same definition (by commit LSN)."""
    same = [j for j, v in enumerate(history) if v.version == history[i].version]
    at = same.index(i)
    bounds = ([f"source.commit_lsn >= {history[i].lsn}"] if at > 0 else []) + (
        [f"source.commit_lsn < {history[same[at + 1]].lsn}"] if at + 1 < len(same) else [])
    return " AND ".join([f"source.table_version = {sql_text.literal(history[i].version)}",
                         *bounds])


def _occurring(events: Any, spec: TableSpec, history: list[TableSpec],
               batch: set[str]) -> list[int]:
    """The times of ``history`` (indexes) that the batch's events of ``spec``'s table were
    written in; a version string with several times is told apart by the events' commit
    LSNs (one Spark job, only then)."""
    times: dict[str, list[int]] = {}
    for i, version in enumerate(history):
        times.setdefault(version.version, []).append(i)
    found = {times[v][0] for v in batch if len(times.get(v, [])) == 1}
    several = sorted(v for v in batch if len(times.get(v, [])) > 1)
    if several:
        cases = " ".join(f"WHEN {_span(history, i)} THEN {i}" for v in several
                         for i in times[v])
        found |= {int(r[0]) for r in events.where(f"source.table_oid = {spec.oid}")
                  .selectExpr(f"CASE {cases} END").distinct().collect() if r[0] is not None}
    return sorted(found)


def _regime_runs(spec: TableSpec, versions: list[TableSpec], history: list[TableSpec],
                 occurring: list[int], unknown: set[str]
                 ) -> list[tuple[_Run, TableSpec]] | None:
    """The batch's table versions (the times of ``history`` it holds events of,
    ``occurring``) in runs that identify rows alike, each with ``spec`` as it applies them
    (its key columns, or keyless), in the order they were written; None when every
    version identifies rows as ``spec`` does and no key column is kept (the usual case).

    A key added to a keyless table or dropped from a keyed one (REPLICA IDENTITY changed,
    the key's column dropped) makes the events before it a multiset's and those after a
    keyed table's, or the other way round: an update written under a key carries no old
    row, which a multiset needs, and a multiset's duplicates fold under a key.  Each run is
    applied as it was written, one after the other.

    A column that a version from the run's on is keyed by, and that ``spec`` no longer has
    (dropped since), stays in the run's spec (:func:`_kept_keys`): the lake keeps it, with
    its values, until the changes written under that key are applied, and the run after
    the last of them drops it.  Where the lake no longer holds it, those changes were
    applied already, and are left out (:func:`_check_replayed`)."""
    if _uniform(spec, versions, history, occurring):
        return None
    found = [(i, _identity(history[i], spec, versions)) for i in occurring]
    runs: list[tuple[list[int], tuple[str, ...] | None]] = []
    for i, identity in found:
        if runs and runs[-1][1] == identity:
            runs[-1][0].append(i)
        else:
            runs.append(([i], identity))
    out = []
    for n, (members, identity) in enumerate(runs):
        version = history[members[0]]
        keys = set(identity or ())
        kept = _kept_keys(spec, history[members[0]:])
        columns = spec.table.columns if identity is None else tuple(
            replace(c, is_key=c.name in keys) for c in spec.table.columns)
        then = {c.attnum for c in version.key_columns} - {None}  # (renamed before the drop)
        columns += tuple(replace(c.column, is_key=identity is not None and (
            c.name in keys or c.attnum in then)) for c in kept)
        attnums = spec.attnums
        if kept and attnums is not None:
            attnums = (*attnums, *(c.attnum for c in kept))
        strings = {history[i].version for i in members}
        where = [f"({_span(history, i)})" for i in members]
        if n == len(runs) - 1 and unknown:  # a version unknown here fails in the run
            strings |= unknown
            where.append(f"source.table_version IN ({_listed(unknown)})")
        run = _Run(frozenset(strings), " OR ".join(where))
        out.append((run, replace(spec, attnums=attnums, table=replace(
            spec.table, replica_identity="d" if identity is not None else "f",
            columns=columns))))
    return out


def _uniform(spec: TableSpec, versions: list[TableSpec], history: list[TableSpec],
             times: list[int]) -> bool:
    """Whether the ``times`` of ``history`` (indexes, oldest first) all identify rows as
    ``spec`` does and no key column is kept from the first of them on: one run, as
    ``spec``.  Asked first of every time of the batch's version strings, so that the usual
    batch (and one of a definition that came back alike) needs no job to tell its times
    apart (:func:`_occurring`)."""
    own = _identity(spec, spec, versions)
    return all(_identity(history[i], spec, versions) == own for i in times) and not (
        times and _kept_keys(spec, history[times[0]:]))


def _kept_keys(spec: TableSpec, later: list[TableSpec]) -> list[ColumnSpec]:
    """The key columns of the ``later`` versions with a key that ``spec`` no longer has (by
    attnum, else by name), each by the name it last had.  (A keyless version's columns are
    all "key" under REPLICA IDENTITY FULL, but a multiset finds rows by the content of the
    columns the table still has: a column dropped since is not needed for that.)"""
    held = {c.attnum if c.attnum is not None else c.name for c in spec.columns}
    taken = {c.name for c in spec.columns}  # (a column added again under its name: as before)
    kept: dict[int | str, ColumnSpec] = {}
    for version in later:
        if version.table.keyless:
            continue
        for column in version.key_columns:
            identity = column.attnum if column.attnum is not None else column.name
            if identity not in held and column.name not in taken:
                kept[identity] = column
    return list(kept.values())


def _append_new(spark: Any, source: Any, spec: TableSpec, path: str,
                idempotence: tuple[str, int] | None) -> int:
    """The MERGE of :func:`_merge` into a lake table created empty by this very apply, as an
    append: with no row to match, the MERGE inserts every latest change but the deletes and
    does nothing else, and an append does so in one write, without the MERGE's join
    against the target and its pass to find touched files.  The append commits the batch's
    idempotent-write ids (as writer options: the session's are for Delta's DML only), so a
    retried batch finds the table and MERGEs, and Delta skips that MERGE.  The rows
    written."""
    from delta.tables import DeltaTable

    columns = [quote(c.name) for c in spec.columns] + list(META_COLUMNS) + [TEXT]
    writer = source.where("_op != 'd'").select(*columns).write.format("delta").mode("append")
    if idempotence is not None:
        writer = writer.option("txnAppId", idempotence[0]).option("txnVersion", idempotence[1])
    writer.save(path)
    found = DeltaTable.forPath(spark, path).history(1).select("operation",
                                                             "operationMetrics").collect()
    if not found or found[0]["operation"] != "WRITE":  # skipped as already committed
        return 0
    return int((found[0]["operationMetrics"] or {}).get("numOutputRows", 0))


# A micro-batch whose events of a table are all inserts is applied with an insert-only MERGE
# (one join, no pass to find touched files).  It leaves a key already in the table as it is,
# which is what the full MERGE does too: PostgreSQL inserts a key only when no row holds it,
# so a row the lake still holds for it is a newer one (a replay) -- the delete that freed
# the key is older than the insert, in the same partition, hence in this batch (which then
# is not insert-only) or in one applied before.
INSERT_ONLY_OPS = frozenset({"c"})

_RANGE_TYPES = ("smallint", "int", "bigint", "string", "date")


@dataclass(frozen=True)
class _Stats:
    changes: int  # keys with a change (the latest per key)
    deletes: int  # of which deletes
    bounds: tuple[str, str, str] | None  # a key column and its least and greatest literal


def _batch_stats(latest: Any, spec: TableSpec) -> _Stats:
    """Count, deletes, and the range of the first key column, in one job.

    The range becomes a target-only condition of the MERGE (and of the tombstone read),
    so that Delta's data skipping leaves out every file whose keys lie outside it: the
    usual case of new keys, which no existing file holds.  Only for a column of a type
    whose literals are simple, and none of whose values in the batch is NULL (a NULL key
    matches by ``<=>``, never by a range)."""
    column = spec.key_columns[0] if spec.key_columns else None
    ranged = column is not None and (column.spark_type in _RANGE_TYPES
                                      or column.spark_type.startswith("decimal"))
    exprs = ["count(*) AS n", "count_if(_op = 'd') AS d"]
    if ranged:
        assert column is not None
        name = quote(column.name)
        value = f"unix_date({name})" if column.spark_type == "date" else name  # see _sql_value
        exprs += [f"count({name}) AS k", f"min({value}) AS lo", f"max({value}) AS hi"]
    row = latest.selectExpr(*exprs).collect()[0]
    bounds = None
    if ranged and row["k"] == row["n"] and row["n"] > 0:
        assert column is not None
        bounds = (column.name, sql_text.sql_value(row["lo"], column.spark_type),
                  sql_text.sql_value(row["hi"], column.spark_type))
    return _Stats(int(row["n"]), int(row["d"]), bounds)


def batch_bounds(events: Any, tables: Sequence[tuple[TableSpec, list[TableSpec]]]
                 ) -> dict[int, tuple[str, str, str] | None]:
    """Per table OID (with its versions), the range of its first key column over the
    batch's events, as :func:`_batch_stats` gives it, for all tables in one small job: a
    range that holds every key the table's changes hold (new and, of a moved row, old),
    before the latest per key is chosen, so maybe wider than :func:`_batch_stats`'s.  None
    where the column is not an integer, text or date, or a key is NULL or does not convert.

    The plan does not grow with the tables: each event carries the text of its version's
    key columns (streaming/decode.py ``_keys``, ``_old_keys``); which of them is the table's
    first key column is looked up per event in a literal map by table and version (none for
    a version without it, or whose type differs: a retype since), and its text is cast to
    each kind; the table's kind is picked here."""
    from pyspark.sql import functions as F

    kinds = {"smallint": "i", "int": "i", "bigint": "i", "string": "s", "date": "d"}
    index: dict[str, int] = {}  # "<oid>/<version>" -> the key's place in that version's keys
    chosen: dict[int, tuple[str, ColumnSpec]] = {}
    for spec, versions in tables:
        column = spec.key_columns[0] if spec.key_columns else None
        if column is None or column.spark_type not in kinds:
            continue
        chosen[spec.oid] = (kinds[column.spark_type], column)
        renames = renamed_names(spec, versions).get(column.name, {})
        stale = set(retyped_versions(spec, versions).get(column.name, []))
        for version in {v.version: v for v in [*versions, spec]}.values():
            name = renames.get(version.version, column.name)
            keys = [c.name for c in version.key_columns]
            if name in keys and version.version not in stale:
                index[f"{spec.oid}/{version.version}"] = keys.index(name)
    found: dict[int, tuple[str, str, str] | None] = {spec.oid: None for spec, _ in tables}
    if not chosen or not index:
        return found
    lookup = ", ".join(f"{sql_text.literal(k)}, {i + 1}" for k, i in sorted(index.items()))
    oids = ", ".join(str(oid) for oid in sorted(chosen))
    keyed = events.where(f"op != 't' AND source.table_oid IN ({oids})").selectExpr(
        "source.table_oid AS oid", KEYS, OLD_KEYS,
        f"element_at(map({lookup}), concat(CAST(source.table_oid AS STRING), '/', "
        "source.table_version)) AS _at").selectExpr(
        "oid", f"try_element_at({KEYS}, _at) AS k", f"try_element_at({OLD_KEYS}, _at) AS b")
    aggregates = ["count(*) AS n"]
    # a date key as the apply reads it (a BC date, a year past 9999: ColumnSpec.cast), in
    # days since 1970 (see sql_text.sql_value); only for tables keyed by a date, where it converts
    dated = ", ".join(str(oid) for oid, (kind, _) in chosen.items() if kind == "d") or "NULL"
    as_date = ColumnSpec.of_type("date")
    for kind, spark_type in (("i", "bigint"), ("s", "string"), ("d", "date")):
        key, old = f"try_cast(k AS {spark_type})", f"try_cast(b AS {spark_type})"
        if kind == "d":
            key, old = (f"CASE WHEN oid IN ({dated}) THEN unix_date({as_date.cast(t)}) END"
                        for t in ("k", "b"))
        aggregates += [f"count_if({key} IS NULL) AS z{kind}",
                       f"min(least({key}, {old})) AS lo{kind}",
                       f"max(greatest({key}, {old})) AS hi{kind}"]
    for row in keyed.groupBy("oid").agg(*[F.expr(a) for a in aggregates]).collect():
        kind, column = chosen[int(row["oid"])]
        if row["n"] > 0 and row[f"z{kind}"] == 0:
            found[int(row["oid"])] = (column.name,
                                      sql_text.sql_value(row[f"lo{kind}"], column.spark_type),
                                      sql_text.sql_value(row[f"hi{kind}"], column.spark_type))
    return found


def key_range(bounds: tuple[str, str, str] | None, alias: str | None = None) -> str | None:
    """``bounds`` as a predicate on a table's key column (of ``alias`` if given)."""
    if bounds is None:
        return None
    name, low, high = bounds
    column = quote(name) if alias is None else f"{alias}.{quote(name)}"
    return f"{column} >= {low} AND {column} <= {high}"


def _merge(target: Any, source: Any, spec: TableSpec, bounds: tuple[str, str, str] | None,
           *, insert_only: bool) -> Any:
    """The MERGE of a table's latest changes, guarded so an older one never wins."""
    names = [c.name for c in spec.columns]
    keys = [c.name for c in spec.key_columns]
    on = " AND ".join(f"t.{quote(k)} <=> s.{quote(k)}" for k in keys)
    in_range = key_range(bounds, "t")
    if in_range is not None:  # a target-only condition: data skipping by the key's range
        on = f"{on} AND {in_range}"
    newer = (f"(s.{COMMIT_LSN} > t.{COMMIT_LSN} OR (s.{COMMIT_LSN} = t.{COMMIT_LSN} "
             f"AND s.{ORDINAL} > t.{ORDINAL}))")
    insert = {quote(n): f"s.{quote(n)}" for n in names}
    insert.update({m: f"s.{m}" for m in META_COLUMNS})
    insert[TEXT] = f"s.{TEXT}"
    merge = target.alias("t").merge(source.alias("s"), on)
    if not insert_only:
        update = {
            quote(n): f"CASE WHEN array_contains(s._unchanged, {sql_text.literal(n)}) "
                      f"THEN t.{quote(n)} ELSE s.{quote(n)} END"
            for n in names
        }
        update.update({m: f"s.{m}" for m in META_COLUMNS})
        # an unchanged TOASTed column keeps its entry, as it keeps its value
        update[TEXT] = (
            f"CASE WHEN size(s._unchanged) = 0 THEN s.{TEXT} ELSE map_concat("
            f"map_filter(coalesce(t.{TEXT}, {_EMPTY}), (k, v) -> array_contains(s._unchanged, k)), "
            f"map_filter(coalesce(s.{TEXT}, {_EMPTY}), "
            f"(k, v) -> NOT array_contains(s._unchanged, k))) END")
        merge = merge.whenMatchedDelete(condition=f"s._op = 'd' AND {newer}")\
            .whenMatchedUpdate(condition=f"s._op != 'd' AND {newer}", set=update)
    return merge.whenNotMatchedInsert(condition="s._op != 'd'", values=insert)


def append_changelog(rows: Any, path: str, idempotence: tuple[str, int] | None) -> None:
    """Every event of the batch, in order, appended to ``<table>__changelog`` (history, audit)."""
    writer = rows.withColumnRenamed("_op", "_pgcdc_op").write.format("delta").mode("append")\
        .option("mergeSchema", "true")
    if idempotence is not None:
        writer = writer.option("txnAppId", idempotence[0]).option("txnVersion", idempotence[1])
    writer.save(f"{path}__changelog")


@contextmanager
def idempotent_write(spark: Any, idempotence: tuple[str, int] | None) -> Iterator[None]:
    """Delta skips a write whose (txnAppId, txnVersion) the table already committed."""
    if idempotence is None:
        yield
        return
    app_id, version = idempotence
    spark.conf.set("spark.databricks.delta.write.txnAppId", app_id)
    spark.conf.set("spark.databricks.delta.write.txnVersion", str(version))
    try:
        yield
    finally:
        spark.conf.unset("spark.databricks.delta.write.txnAppId")
        spark.conf.unset("spark.databricks.delta.write.txnVersion")


class Steps:
    """Wall time per step of one micro-batch (logged by the job), and a Spark job
    description per step, so that the Spark UI and event log say which step ran a job."""

    def __init__(self, spark: Any, batch_id: int) -> None:
        self._context = spark.sparkContext
        self._batch_id = batch_id
        self.seconds: dict[str, float] = {}  # summed over the threads that ran the step
        self._lock = threading.Lock()

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self._context.setJobDescription(f"pgcdc batch {self._batch_id}: {name}")
        start = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - start
            with self._lock:
                self.seconds[name] = self.seconds.get(name, 0.0) + spent
            self._context.setJobDescription(None)

    def summary(self) -> str:
        return ", ".join(f"{name} {spent:.2f} s" for name, spent in self.seconds.items())


Catalogue = CatalogLog | LakeCatalog
CatalogSource = Catalogue | Callable[[set[str]], Catalogue]


def _resolved(catalog: CatalogSource, versions: set[str]) -> LakeCatalog:
    found = catalog(versions) if callable(catalog) else catalog
    return found if isinstance(found, LakeCatalog) else LakeCatalog(found)


@dataclass(frozen=True)
class Pull:
    """What a keyless table's batch reads again (:func:`earlier_topics`): the ``topics`` of
    its earlier names, and of their changes those at or before ``through``, the position
    of the batch's newest change of the table."""

    topics: list[str]
    through: tuple[int, int]


def earlier_topics(spark: Any, summary: dict[int, TableBatch], catalog: LakeCatalog,
                   lake: str) -> dict[int, Pull]:
    """Per keyless table of the batch that holds events written under a newer name (its
    topic follows its name) while the lake has applied nothing of that name yet: the topics
    of its earlier names, up to the batch's newest change of the table.  Its changes
    under an earlier name may not all be in the batch (a batch is bounded, and each topic
    is cut at its own offset), and a keyless table applies its changes in order behind one
    watermark (streaming/multiset.py): applying the newer ones first would leave the
    earlier ones behind the watermark, never applied.  And none after: a table moved back
    to a name it held has a later run of changes in that topic too, and applying those
    now would leave the rest of the batch's own run behind the watermark (a version's
    string is its definition's, so the two runs under one name are told apart by
    position, not by version)."""
    from streaming import multiset  # (it imports this module)

    out = {}
    for oid, found in summary.items():
        spec = catalog.latest(oid)
        if not multiset.keyless(spec):
            continue
        versions = catalog.versions(oid)  # oldest first
        held = [s for s in versions if s.version in found.versions]
        if not held or found.newest is None:
            continue
        # the version its newest change was written under: a definition that came back
        # (a table moved back to a name) has one version string for its two runs
        newest = max([s for s in held if s.lsn <= found.newest[0]] or held,
                     key=lambda s: s.lsn)
        began = newest.lsn  # where the name of the newest topic in the batch began
        for earlier in reversed([s for s in versions if s.lsn <= newest.lsn]):
            if earlier.topic != newest.topic:
                break
            began = earlier.lsn
        topics = sorted({s.topic for s in versions if s.lsn < began} - {newest.topic})
        if not topics:
            continue
        applied = [multiset.applied_through(spark, path, oid)
                   for path in ownership.locations(catalog, oid, table_path, lake)
                   if ownership.owner(spark, path) == oid]
        watermark = max((a for a in applied if a is not None), default=None)
        if watermark is None or watermark[0] <= began:
            out[oid] = Pull(topics, found.newest)
    return out


def _lives(summary: dict[int, TableBatch], catalog: LakeCatalog) -> list[int]:
    """The batch's tables, each table's life before the next one's: a table dropped and
    created again under the same name is applied (and retired) before its successor."""
    def born(oid: int) -> tuple[int, int]:
        at = catalog.born(oid)
        return (-1 if at is None else at, oid)

    return sorted(summary, key=born)


# tables of a micro-batch applied at once (each in a Spark session of its own, in a FAIR
# scheduler pool of its own: streaming/session.py); 1: one after the other
APPLY_THREADS = 4


def _workers(spark: Any, count: int) -> queue.SimpleQueue[Any]:
    """``count`` sessions of ``spark``'s context, kept for the next batches.  Each table is
    applied in one of them: the session conf that carries Delta's idempotent-write ids
    (:func:`idempotent_write`) is per session, so a MERGE never commits with another
    thread's ids, and a table created meanwhile never records them."""
    pool: queue.SimpleQueue[Any] | None = getattr(spark, "_pgcdc_workers", None)
    if pool is None:
        pool = queue.SimpleQueue()
        spark._pgcdc_workers = pool
        spark._pgcdc_worker_count = 0
    while spark._pgcdc_worker_count < count:
        pool.put(spark.newSession())
        spark._pgcdc_worker_count += 1
    return pool


def _apply_tables(spark: Any, events: Any, tables: Sequence[tuple[TableSpec, TableBatch]],
                  lake: str, catalog: LakeCatalog, *, idempotence: tuple[str, int],
                  changelog: bool, steps: Steps, threads: int,
                  keep_dropped: bool = False) -> list[int]:
    """:func:`apply_table` for each of ``tables`` (distinct lake locations whose ownership
    is settled), ``threads`` at a time; the changes applied to each, in order.  Every table
    is attempted; the first failure is raised after all have ended."""
    bounds: dict[int, tuple[str, str, str] | None] | None = None
    if threads > 1 and len(tables) > 1:  # one statistics job for all tables, not one each
        with steps("stats"):
            bounds = batch_bounds(events, [(spec, catalog.versions(spec.oid))
                                           for spec, _ in tables])

    def one(session: Any, spec: TableSpec, found: TableBatch) -> int:
        return apply_table(session, events, spec, lake, idempotence=idempotence,
                           changelog=changelog, versions=catalog.versions(spec.oid),
                           truncate=found.truncate, ops=found.ops, steps=steps,
                           bounds=_UNKNOWN if bounds is None else bounds[spec.oid],
                           keep_dropped=keep_dropped, encodings=found.encodings,
                           may_move=found.may_move, toasted=found.toasted)

    if threads <= 1 or len(tables) <= 1:
        return [one(spark, spec, found) for spec, found in tables]
    sessions = _workers(spark, min(threads, len(tables)))
    context = spark.sparkContext

    def run(index: int, spec: TableSpec, found: TableBatch) -> int:
        session = sessions.get()
        try:
            context.setLocalProperty("spark.scheduler.pool", f"pgcdc-{index % threads}")
            return one(session, spec, found)
        finally:
            context.setLocalProperty("spark.scheduler.pool", None)
            sessions.put(session)

    with ThreadPoolExecutor(max_workers=min(threads, len(tables)),
                            thread_name_prefix="pgcdc-apply") as pool:
        futures = [pool.submit(run, i, spec, found) for i, (spec, found) in enumerate(tables)]
        errors = [f.exception() for f in futures]
    failed = next((e for e in errors if e is not None), None)
    if failed is not None:
        raise failed
    return [f.result() for f in futures]


# table versions whose records one job decodes when a batch's events are kept: each
# version's decode is a branch of the job's plan, which Spark ships to every task with its
# writer schema (1.2 MiB over 100 versions, past the 1 MiB Spark warns about)
KEEP_VERSIONS = 25


@dataclass
class _Kept:
    """A batch's parsed events, kept for the passes over them (:func:`_kept`): the frame,
    and the pieces kept (one per :data:`KEEP_VERSIONS` versions), released at the end."""

    events: Any
    pieces: list[Any]


def _kept(spark: Any, parts: Sequence[Any], parallelism: int) -> _Kept:
    """A batch's parsed events (the parts of :func:`parse_envelopes`), kept for the passes
    over them: in local mode checkpointed on the spot (``localCheckpoint``), which cuts their
    lineage, so that the many small jobs of the tables' applies ship a small task binary
    instead of the whole decode.  A local checkpoint cannot be computed again if an executor
    holding it is lost, so on a cluster the events are cached (``persist``) and keep their
    lineage; in local mode the driver is the executor.  Up to :data:`KEEP_VERSIONS` parts are
    kept by one job."""
    local = str(spark.sparkContext.master).startswith("local")
    pieces = []
    for start in range(0, len(parts), KEEP_VERSIONS):
        piece = union(parts[start:start + KEEP_VERSIONS]).coalesce(parallelism)
        pieces.append(piece.localCheckpoint(eager=True) if local else piece.persist())
    return _Kept(union(pieces).coalesce(parallelism), pieces)


def _release(kept: _Kept) -> None:
    """Drop what :func:`_kept` kept: the caches, or the local checkpoints' blocks (their
    RDDs', which no cache manager knows; left alone, they would stay until the driver's
    garbage collector found them)."""
    for piece in kept.pieces:
        plan = piece._jdf.queryExecution().analyzed()  # noqa: SLF001 - the checkpoint's RDD
        if plan.getClass().getSimpleName() == "LogicalRDD":
            plan.rdd().unpersist(False)
        else:
            piece.unpersist()


def apply_batch(spark: Any, batch: Any, batch_id: int, *, catalog: CatalogSource, lake: str,
                app_id: str, changelog: bool = False, steps: Steps | None = None,
                touched: set[str] | None = None, archive: bool = False,
                threads: int = APPLY_THREADS,
                earlier: Callable[[list[str]], Any] | None = None) -> dict[str, int]:
    """Apply one micro-batch; returns the changes applied per table.

    ``catalog``: the catalog (streaming/catalog.py: the catalog history replayed, with the
    ``_catalog`` records), or only the ``_catalog`` records, or a function giving one that
    holds the given versions (the job's cache, which reads the catalog topics again for a
    version it lacks, and when called with none).  Each table is brought to the newest
    shape the catalog gives it; the tables of the batch are applied one life after the
    other (streaming/ownership.py): a table the history shows dropped is retired (dropped,
    or moved aside with ``archive``, which also keeps the lake columns of dropped columns)
    once its events are applied, before a table created
    under its name takes the location; a renamed table's lake table moves to its new name's
    location first (and after the batch, for renamed tables without events).
    ``touched``: if given, the location of every table the batch wrote is added to it.
    ``earlier``: a bounded read of whole topics (the job's); a keyless table whose batch
    holds changes under a newer name than changes of its the lake may lack
    (:func:`earlier_topics`) gets those too, from the topics of its earlier names, before
    the newer ones (the ones the lake held already are left out by its watermark).

    Tables whose lake tables are settled (not renamed, not dropped, no other table of the
    batch at their location) are applied ``threads`` at a time (:func:`_apply_tables`),
    so that the time a batch takes grows little with the number of tables it touches;
    moves and retirements happen before and after, never while a table is applied.
    """
    step = steps if steps is not None else Steps(spark, batch_id)
    # Kafka is read once per batch, into as many partitions as there are cores: the batch
    # has one per topic partition (one topic per table), and each table version's decode
    # and each table's apply would otherwise run a task per table per table
    parallelism = max(1, int(spark.sparkContext.defaultParallelism))
    rows = header_rows(batch).coalesce(parallelism).persist()
    kept: _Kept | None = None
    try:
        with step("read"):
            versions = batch_versions(rows)
        # catalog history records: the catalog changed (it is read again), maybe with no
        # row change after (a table dropped or renamed last: followed below all the same)
        ddl = (CATALOG_FORMAT, None) in versions
        versions = [v for v in versions if v[0] != CATALOG_FORMAT]
        if not versions:
            if ddl:
                resolved = _resolved(catalog, set())
                with step("drop"):
                    ownership.retire_dropped(spark, resolved, table_path, lake=lake,
                                             archive=archive)
                with step("rename"):
                    ownership.follow_renamed(spark, resolved, table_path, lake=lake,
                                             archive=archive)
            return {}
        with step("catalog"):
            resolved = _resolved(catalog, set() if ddl else
                                 {v for _, v in versions if v is not None})
        kept = _kept(spark, parse_parts(batch, resolved.log, rows=rows, versions=versions),
                     parallelism)
        events = kept.events
        with step("decode"):
            try:
                summary = summarize(events, resolved.log)
            except CatalogMismatchError:
                if not callable(catalog):
                    raise
                # a table the cached catalog does not know (one created again under its
                # name may carry a version the cache holds for the old one): read again
                resolved = _resolved(catalog, set())
                summary = summarize(events, resolved.log)
        pulls = {} if earlier is None else earlier_topics(spark, summary, resolved, lake)
        if pulls:
            assert earlier is not None
            topics = sorted({t for pull in pulls.values() for t in pull.topics})
            source = ("source.commit_lsn", "source.ordinal")
            wanted = " OR ".join(
                f"source.table_oid = {oid} AND NOT "
                f"({sql_text.position(*pull.through, '>', columns=source)})"
                for oid, pull in sorted(pulls.items()))
            with step("earlier"):
                # decoded and cached before the filter: a filter over decoded fields pushed
                # into the decode is one predicate with each branch's version test, whose
                # shared subexpression Spark evaluates first, for every row, decoding other
                # versions' records with one version's schema ("Malformed data")
                pulled = parse_envelopes(earlier(topics), resolved.log).persist()
                more = pulled.where(wanted)
                merged = _kept(spark, [events.unionByName(more)], parallelism)
                _release(kept)
                kept, events = merged, merged.events
                summary = summarize(events, resolved.log)
                pulled.unpersist()
            log.info("batch %d: changes of %s under their earlier names read again from %s, "
                     "to be applied before the newer ones", batch_id,
                     ", ".join(resolved.latest(oid).qualified_name for oid in sorted(pulls)),
                     ", ".join(topics))
        applied: dict[str, int] = {}
        # tables whose ownership is settled, applied together when the next table needs
        # an earlier one applied first (same location, a rename, a drop) and at the end
        pending: list[tuple[TableSpec, TableBatch]] = []

        def flush() -> None:
            counts = _apply_tables(spark, events, pending, lake, resolved,
                                   idempotence=(app_id, batch_id), changelog=changelog,
                                   steps=step, threads=threads, keep_dropped=archive)
            for (spec, _), count in zip(pending, counts, strict=True):
                applied[spec.qualified_name] = applied.get(spec.qualified_name, 0) + count
            pending.clear()

        for oid in _lives(summary, resolved):
            found = summary[oid]
            spec = resolved.latest(oid)
            path = table_path(lake, spec)
            waiting = {table_path(lake, s) for s, _ in pending}
            names = ownership.locations(resolved, oid, table_path, lake)
            if len(names) > 1 or waiting.intersection(names):  # renamed, or a location reused
                flush()
            with step("table"):  # a renamed table's lake table first moves to its name
                ownership.follow(spark, oid, resolved, table_path, lake=lake, archive=archive)
                if not ownership.take(spark, path, oid, spec.qualified_name, resolved,
                                      lake=lake, archive=archive):
                    continue
            if touched is not None:
                touched.add(path)
            pending.append((spec, found))
            if resolved.dropped(oid) is not None:  # retired once its events are applied
                flush()
                with step("drop"):
                    ownership.retire(spark, path, oid, lake=lake, archive=archive)
        flush()
        with step("drop"):
            ownership.retire_dropped(spark, resolved, table_path, lake=lake, archive=archive)
        with step("rename"):  # renamed tables without events in the batch
            ownership.follow_renamed(spark, resolved, table_path, lake=lake, archive=archive)
        return applied
    finally:
        if kept is not None:
            _release(kept)
        rows.unpersist()
