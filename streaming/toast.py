"""Unchanged TOASTed values carried from where they were last sent (a keyed table's batch).

PostgreSQL does not resend a TOASTed value that an update left as it was: the event names
the column in ``unchanged`` and holds no value for it.  The MERGE keeps such a column's
stored value (streaming/apply.py :func:`_merge`), which is right only when the row the
update changed is the lake row at the update's own key, as it was before the batch.  Two
cases are not:

* the value was sent earlier in the same batch: a row inserted, then updated; the lake
  holds nothing yet (or an older row) at that key;
* the update moved the row to another key (PostgreSQL then sends the old key): the value is
  that of the row at the old key, in the batch or in the lake, and the new key holds nothing.

So, before the latest change per key is chosen, every change gets the values of its row's
*lineage*: the changes of one row in position order, across the keys it moved between.

1. A key's changes fall into segments: a segment starts at an insert (or a snapshot read),
   at an update that moved a row in from another key, or at the key's first change of the
   batch (the row was in the lake then: the segment is *rooted in the lake* at that key).
2. A segment moved in continues the segment its old key had just before the move (found by
   position: the old key's newest change before it), or, with none in the batch, the lake
   row at the old key.  Following these links (a few rounds of pointer jumping: rarely
   more than one) gives each change its lineage's root segment.
3. Over a lineage in position order, each unchanged column takes the newest value a change
   before it sent (a window).  What no change of the batch sent comes from the root's lake
   row: the MERGE's own lookup where that row is at the change's key, a join with the lake
   table where the row moved from another key.

Only a table whose batch has an update with unchanged columns goes through this
(``summarize``'s ``unchanged``); the rounds and the lake join only with rows moved in.
"""

from __future__ import annotations

from typing import Any

from streaming import sql_text
from streaming.decode import content
from streaming.evolution import quote
from streaming.schema import COMMIT_LSN, ORDINAL, TEXT, TEXT_TYPE, ColumnSpec, TableSpec

# lake types whose values PostgreSQL never TOASTs (fixed length)
_FIXED = frozenset({"boolean", "smallint", "int", "bigint", "float", "double", "date",
                    "timestamp", "timestamp_ntz"})
ORIGIN = "_origin"  # the old key of an update that moved its row (else NULL)
_POS = f"struct({COMMIT_LSN}, {ORDINAL})"
_NO_POS = f"CAST(NULL AS STRUCT<{COMMIT_LSN}: BIGINT, {ORDINAL}: BIGINT>)"
_NO_TEXT = f"CAST(map() AS {TEXT_TYPE})"
_MAX_ROUNDS = 64  # pointer jumping: 2^64 moves of one row in a batch will not happen


def toastable(spec: TableSpec) -> list[ColumnSpec]:
    """The columns an update may leave unchanged: not keys, of a variable-length type."""
    return [c for c in spec.columns if not c.is_key and c.spark_type not in _FIXED]


def origin(spec: TableSpec, moved: str) -> str:
    """The ``_origin`` of an event of :func:`streaming.apply.shape`: its old key as a
    struct where ``moved`` (the condition of an update that changed its key) holds."""
    fields = ", ".join(f"{sql_text.literal(c.name)}, before.{content(i)}"
                       for i, c in enumerate(spec.columns) if c.is_key)
    return f"CASE WHEN op = 'u' AND before IS NOT NULL AND ({moved}) " \
           f"THEN named_struct({fields}) END AS {ORIGIN}"


def _key(spec: TableSpec) -> str:
    """A struct of the key columns."""
    return _struct([(c.name, quote(c.name)) for c in spec.key_columns])


def _struct(fields: list[tuple[str, str]]) -> str:
    return f"named_struct({', '.join(f'{sql_text.literal(n)}, {e}' for n, e in fields)})"


def carry_unchanged(rows: Any, spec: TableSpec, lake: Any) -> Any:
    """``rows`` (:func:`streaming.apply.shape`'s, with :data:`ORIGIN`) without
    :data:`ORIGIN`, each unchanged column filled from its lineage where a change sent its
    value, left unchanged where the MERGE's lookup of the change's own key finds it;
    ``lake``: a function giving the lake table's rows (called only when a row moved in)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    columns = toastable(spec)
    if not columns:
        return rows.drop(ORIGIN)
    by_key = Window.partitionBy("_key").orderBy("_pos").rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
    # 1. each change's segment: its key and where the segment started (NULL: in the lake)
    changes = rows.where("_op != 't'").selectExpr(
        "*", f"{_key(spec)} AS _key", f"{_POS} AS _pos",
        f"_op IN ('c', 'r') OR {ORIGIN} IS NOT NULL AS _starts")
    changes = changes.withColumn(
        "_start", F.max(F.when(F.col("_starts"), F.col("_pos"))).over(by_key)).selectExpr(
        "*", "named_struct('k', _key, 'at', _start) AS _seg").persist()
    try:
        moved = changes.where(f"{ORIGIN} IS NOT NULL")
        roots = _roots(changes, moved) if moved.limit(1).count() else None
        if roots is None:  # 2. no row moved in: a segment is its own lineage
            resolved = changes.withColumn("_root", F.col("_seg"))
        else:
            resolved = changes.join(roots, "_seg", "left").withColumn(
                "_root", F.coalesce(F.col("_root"), F.col("_seg")))
        # 3. each unchanged column's newest value sent before, over the lineage
        lineage = Window.partitionBy("_root").orderBy("_pos").rowsBetween(
            Window.unboundedPreceding, Window.currentRow)
        for i, c in enumerate(columns):
            name = sql_text.literal(c.name)
            sent = F.expr(f"CASE WHEN _op != 'd' AND NOT array_contains(_unchanged, {name}) "
                          f"THEN named_struct('v', {quote(c.name)}, 't', "
                          f"element_at(coalesce({TEXT}, {_NO_TEXT}), {name})) END")
            resolved = resolved.withColumn(f"_sent{i}", F.last(sent, ignorenulls=True)
                                           .over(lineage))
        if roots is not None:
            resolved = _from_lake(resolved, spec, columns, lake)
        filled = _filled(resolved, spec, columns, lake_joined=roots is not None)
        return filled.unionByName(rows.where("_op = 't'").drop(ORIGIN)).localCheckpoint()
    finally:
        changes.unpersist()


def _roots(changes: Any, moved: Any) -> Any:
    """Per segment moved in, the root segment of its lineage (``_seg``, ``_root``)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    # the old key's segment just before each move: the segment of its newest change before
    # (a move sorts before a change of the old key at its own position: there is none)
    no_seg = f"CAST(NULL AS {changes.schema['_seg'].dataType.simpleString()})"
    both = moved.selectExpr(f"{ORIGIN} AS _key", "_pos", "0 AS _tag", "_seg AS _mover",
                            f"{no_seg} AS _found").unionByName(
        changes.selectExpr("_key", "_pos", "1 AS _tag", f"{no_seg} AS _mover", "_seg AS _found"))
    before = Window.partitionBy("_key").orderBy("_pos", "_tag").rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
    links = both.withColumn("_prev", F.last("_found", ignorenulls=True).over(before)) \
        .where("_tag = 0").selectExpr(
            "_mover AS _seg",
            f"coalesce(_prev, named_struct('k', _key, 'at', {_NO_POS})) AS _root") \
        .dropDuplicates(["_seg"]).localCheckpoint()  # a move delivered twice: one link
    for _ in range(_MAX_ROUNDS):  # pointer jumping: a link to a segment moved in goes on
        step = links.alias("a").join(links.alias("b"), F.expr("a._root <=> b._seg"), "left") \
            .selectExpr("a._seg AS _seg", "coalesce(b._root, a._root) AS _root",
                        "b._seg IS NOT NULL AS _went").localCheckpoint()
        if step.where("_went").limit(1).count() == 0:
            return links
        links = step.drop("_went")
    msg = f"a row moved between keys more than 2^{_MAX_ROUNDS} times in one batch"
    raise AssertionError(msg)


def _from_lake(resolved: Any, spec: TableSpec, columns: list[ColumnSpec], lake: Any) -> Any:
    """``resolved`` with the lake row (``_lake``, ``_lake_text``) of the root of each
    change whose lineage is rooted in the lake at another key than its own."""
    from pyspark.sql import functions as F

    wanted = resolved.where("_root.at IS NULL AND NOT (_root.k <=> _key) AND _op != 'd' "
                            "AND size(_unchanged) > 0").select("_root").distinct()
    stored = lake().selectExpr(f"{_key(spec)} AS _lake_key",
                               f"{_struct([(c.name, quote(c.name)) for c in columns])} AS _lake",
                               f"{TEXT} AS _lake_text")
    found = wanted.join(stored, F.expr("_root.k <=> _lake_key")).drop("_lake_key")
    return resolved.join(found, "_root", "left")


def _filled(resolved: Any, spec: TableSpec, columns: list[ColumnSpec], *,
            lake_joined: bool) -> Any:
    """The changes in :func:`streaming.apply.shape`'s columns, their unchanged columns
    filled from their lineage (and the lake), still unchanged where neither holds them:
    the MERGE's lookup of their own key does."""
    exprs, filled = [], []  # filled: (column, the condition it is filled on, its text)
    for c in spec.columns:
        name = quote(c.name)
        if c not in columns:
            exprs.append(name)
            continue
        literal, sent = sql_text.literal(c.name), f"_sent{columns.index(c)}"
        fills = f"array_contains(_unchanged, {literal}) AND ({sent} IS NOT NULL"
        value, text = f"{sent}.v", f"{sent}.t"
        if lake_joined:
            fills += " OR _lake IS NOT NULL"
            value = f"CASE WHEN {sent} IS NOT NULL THEN {sent}.v ELSE _lake.{name} END"
            text = (f"CASE WHEN {sent} IS NOT NULL THEN {sent}.t "
                    f"ELSE element_at(coalesce(_lake_text, {_NO_TEXT}), {literal}) END")
        fills += ")"
        exprs.append(f"CASE WHEN {fills} THEN {value} ELSE {name} END AS {name}")
        filled.append((c.name, fills, text))
    names = ", ".join(f"CASE WHEN {fills} THEN {sql_text.literal(n)} END"
                      for n, fills, _ in filled)
    entries = ", ".join(f"CASE WHEN {fills} AND {text} IS NOT NULL THEN named_struct("
                        f"'key', {sql_text.literal(n)}, 'value', {text}) END"
                        for n, fills, text in filled)
    text_map = (f"CASE WHEN size(_names) = 0 THEN {TEXT} ELSE map_concat(map_filter("
                f"coalesce({TEXT}, {_NO_TEXT}), (k, v) -> NOT array_contains(_names, k)), "
                f"map_from_entries(_entries)) END")
    return resolved.selectExpr(
        "*", f"filter(array({names}), n -> n IS NOT NULL) AS _names",
        f"filter(array({entries}), e -> e IS NOT NULL) AS _entries").selectExpr(
        *exprs, f"{text_map} AS {TEXT}", "_op", COMMIT_LSN, ORDINAL,
        "filter(_unchanged, n -> NOT array_contains(_names, n)) AS _unchanged")
