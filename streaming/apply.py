"""Applying one micro-batch of change events to Delta tables.

For each source table in the batch (by OID):

1. every event's table version must be in the catalog log, or the batch fails
   (a missing version is never guessed);
2. values are cast to the table's newest shape; columns an older version did not
   have are NULL;
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

import json
import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from streaming.evolution import (
    TRUNCATED_PROPERTY,
    cached_property,
    evolve,
    forget,
    quote,
    table_properties,
)
from streaming.schema import COMMIT_LSN, ORDINAL, CatalogLog, TableSpec, renamed_names
from streaming.tombstones import drop_superseded, record_deletes

log = logging.getLogger(__name__)

META_COLUMNS = (COMMIT_LSN, ORDINAL)

ENVELOPE_SCHEMA = (
    "op STRING, before MAP<STRING, STRING>, after MAP<STRING, STRING>, "
    "unchanged ARRAY<STRING>, "
    "source STRUCT<commit_lsn: BIGINT, ordinal: BIGINT, table_oid: BIGINT, "
    "table_version: STRING, schema: STRING, table: STRING>"
)

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


class CatalogMismatchError(Exception):
    """An event names a table version the catalog log does not hold."""


def table_path(lake: str, spec: TableSpec) -> str:
    return f"{lake.rstrip('/')}/{_SAFE.sub('_', spec.schema)}.{_SAFE.sub('_', spec.name)}"


_HEADER = "CAST(element_at(filter(headers, h -> h.key = '{0}'), 1).value AS STRING)"


def header_rows(batch: Any) -> Any:
    """A batch's change records (Kafka tombstones left out) with their format and version."""
    return batch.where("value IS NOT NULL").selectExpr(
        "value", f"coalesce({_HEADER.format('pgcdc.format')}, 'json') AS _format",
        f"{_HEADER.format('pgcdc.table_version')} AS _version")


def batch_versions(rows: Any) -> list[tuple[str, str | None]]:
    """The distinct (format, header version) pairs of :func:`header_rows`."""
    return [(str(r[0]), None if r[1] is None else str(r[1]))
            for r in rows.select("_format", "_version").distinct().collect()]


def parse_envelopes(batch: Any, catalog: CatalogLog, *, rows: Any = None,
                    versions: list[tuple[str, str | None]] | None = None) -> Any:
    """Every change of a batch as ``op, before, after, unchanged, source``, whatever its
    format; ``before`` and ``after`` are maps of column name to the value's text.

    Avro values are decoded with the writer schema of the version their
    ``pgcdc.table_version`` header names, one version at a time; the decoded
    ``source.table_version`` must agree with the header (checked by
    :func:`summarize`).  Tombstones are skipped.
    """
    from pyspark.sql import functions as F

    if rows is None:
        rows = header_rows(batch)
    if versions is None:
        versions = batch_versions(rows)
    parts = [rows.where("_format = 'json'").select(
        F.from_json(F.col("value").cast("string"), ENVELOPE_SCHEMA).alias("e"), "_version")
        .select("e.*", "_version")]
    for version in sorted({v for f, v in versions if f == "avro"}, key=str):
        spec = catalog.by_version(str(version))
        if spec is None or spec.value_schema is None:
            msg = (f"Avro events of table version {version} but the catalog log holds no "
                   "writer schema for it; the catalog topic is incomplete")
            raise CatalogMismatchError(msg)
        parts.append(_from_avro(rows.where(F.col("_version") == version), spec))
    events = parts[0]
    for part in parts[1:]:
        events = events.unionByName(part)
    return events


def _from_avro(rows: Any, spec: TableSpec) -> Any:
    from pyspark.sql.avro.functions import from_avro

    schema = spec.value_schema
    assert schema is not None
    fields = json.loads(schema)["fields"][0]["type"][1]["fields"]
    names = ", ".join(_literal(f["pgcdc.column"]) for f in fields)

    def as_map(side: str) -> str:
        texts = []
        for field in fields:
            ref = f"e.{side}.{quote(field['name'])}"
            kind = field["type"][1]
            texts.append(f"base64({ref})" if kind == "bytes" else f"CAST({ref} AS STRING)")
        return (f"CASE WHEN e.{side} IS NULL THEN NULL ELSE "
                f"map_from_arrays(array({names}), array({', '.join(texts)})) END AS {side}")

    decoded = rows.select(from_avro("value", schema).alias("e"), "_version")
    return decoded.selectExpr("e.op AS op", as_map("before"), as_map("after"),
                              "e.unchanged AS unchanged",
                              "named_struct('commit_lsn', e.source.commit_lsn, "
                              "'ordinal', e.source.ordinal, 'table_oid', e.source.table_oid, "
                              "'table_version', e.source.table_version, "
                              "'schema', e.source.schema, 'table', e.source.table) AS source",
                              "_version")


def summarize(events: Any, catalog: CatalogLog) -> dict[int, tuple[int, int] | None]:
    """Per table OID of the batch, the position of its newest truncate (or None), in one
    pass; raise if an event's version is unknown or disagrees with its header."""
    from pyspark.sql import functions as F

    summary = events.groupBy("source.table_oid").agg(
        F.expr("collect_set(source.table_version)").alias("versions"),
        F.expr("max(CASE WHEN op = 't' THEN struct(source.commit_lsn, source.ordinal) END)")
        .alias("trunc"),
        F.expr("max(_version IS NOT NULL AND _version != source.table_version)")
        .alias("mismatch"),
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
    return {int(r["table_oid"]): None if r["trunc"] is None
            else (int(r["trunc"][0]), int(r["trunc"][1])) for r in summary}


def check_versions(events: Any, catalog: CatalogLog) -> list[int]:
    """The table OIDs of the batch; raise if any event's version is unknown."""
    return sorted(summarize(events, catalog))


def shape(events: Any, spec: TableSpec, versions: list[TableSpec] | None = None) -> Any:
    """Events of one table, cast to its newest shape, one row per event.

    A column renamed since an event's version is read under the name that version gave
    it (matched by column identity, see :func:`streaming.schema.renamed_names`), so old
    and new events land in the same column.
    """
    renames = renamed_names(spec, versions or [])
    keys = {c.name for c in spec.key_columns}

    def value(side: str, name: str) -> str:
        current = f"{side}[{_literal(name)}]"
        if name not in renames:
            return current
        cases = " ".join(
            f"WHEN {_literal(version)} THEN "
            + (f"{side}[{_literal(old)}]" if old is not None else "CAST(NULL AS STRING)")
            for version, old in renames[name].items())
        return f"CASE source.table_version {cases} ELSE {current} END"

    exprs = []
    for column in spec.columns:
        text = value("after", column.name)
        if column.name in keys:
            text = f"coalesce({text}, {value('before', column.name)})"
        exprs.append(f"{column.cast(text)} AS {quote(column.name)}")
    unchanged = "coalesce(unchanged, array())"
    if renames:  # an unchanged TOASTed column is named as its event's version names it
        cases = " ".join(
            f"WHEN source.table_version = {_literal(version)} AND u = {_literal(old)} "
            f"THEN {_literal(name)}"
            for name, by_version in renames.items() for version, old in by_version.items()
            if old is not None)
        if cases:
            unchanged = f"transform({unchanged}, u -> CASE {cases} ELSE u END)"
    exprs += [
        "op AS _op",
        f"source.commit_lsn AS {COMMIT_LSN}",
        f"source.ordinal AS {ORDINAL}",
        f"{unchanged} AS _unchanged",
    ]
    return events.where(f"source.table_oid = {spec.oid}").selectExpr(*exprs)


def _position(lsn: int, ordinal: int, op: str) -> str:
    """A predicate: the row's (commit_lsn, ordinal) compares ``op`` to the given one."""
    return f"{COMMIT_LSN} {op} {lsn} OR ({COMMIT_LSN} = {lsn} AND {ORDINAL} {op} {ordinal})"


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def latest_per_key(rows: Any, spec: TableSpec) -> Any:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    order = Window.partitionBy(*[quote(c.name) for c in spec.key_columns]).orderBy(
        F.col(COMMIT_LSN).desc(), F.col(ORDINAL).desc())
    return rows.withColumn("_rank", F.row_number().over(order)).where("_rank = 1").drop("_rank")


def ensure_table(spark: Any, path: str, spec: TableSpec,
                 versions: list[TableSpec] | None = None) -> Any:
    """The Delta table at ``path``, created or evolved to ``spec``'s columns."""
    return evolve(spark, path, spec, META_COLUMNS, versions)


def truncated_at(spark: Any, path: str) -> tuple[int, int] | None:
    """The position of the newest truncate applied to the table, if any."""
    raw = table_properties(spark, path).get(TRUNCATED_PROPERTY)
    if raw is None:
        return None
    lsn, ordinal = raw.split("/")
    return int(lsn), int(ordinal)


def _record_truncate(spark: Any, path: str, position: tuple[int, int]) -> None:
    """The table-level tombstone: no change older than this truncate is applied again."""
    spark.sql(f"ALTER TABLE delta.{quote(path)} SET TBLPROPERTIES "
              f"('{TRUNCATED_PROPERTY}' = '{position[0]}/{position[1]}')")
    forget(path)


_UNKNOWN = object()


def apply_table(spark: Any, events: Any, spec: TableSpec, lake: str, *,
                idempotence: tuple[str, int] | None = None, changelog: bool = False,
                versions: list[TableSpec] | None = None,
                truncate: tuple[int, int] | None | object = _UNKNOWN) -> int:
    """MERGE one table's events of a batch; returns how many changes were applied.

    ``truncate``: the position of the batch's newest truncate of this table, if the caller
    knows it (:func:`summarize`), else it is looked up here."""
    path = table_path(lake, spec)
    target = ensure_table(spark, path, spec, versions)
    rows = shape(events, spec, versions)
    applied_rows = rows
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
            _record_truncate(spark, path, position)
            floor_at = position
        target.delete(_position(*position, "<"))
    if floor_at is not None:  # a change older than the newest truncate never comes back
        rows = rows.where(_position(*floor_at, ">"))
    latest = drop_superseded(spark, latest_per_key(rows.where("_op != 't'"), spec), spec,
                             path, versions).persist()
    names = [c.name for c in spec.columns]
    keys = [c.name for c in spec.key_columns]
    on = " AND ".join(f"t.{quote(k)} <=> s.{quote(k)}" for k in keys)
    newer = (f"(s.{COMMIT_LSN} > t.{COMMIT_LSN} OR (s.{COMMIT_LSN} = t.{COMMIT_LSN} "
             f"AND s.{ORDINAL} > t.{ORDINAL}))")
    update = {
        quote(n): f"CASE WHEN array_contains(s._unchanged, {_literal(n)}) THEN t.{quote(n)} "
                  f"ELSE s.{quote(n)} END"
        for n in names
    }
    update.update({m: f"s.{m}" for m in META_COLUMNS})
    insert = {quote(n): f"s.{quote(n)}" for n in names}
    insert.update({m: f"s.{m}" for m in META_COLUMNS})
    merge = (
        target.alias("t")
        .merge(latest.alias("s"), on)
        .whenMatchedDelete(condition=f"s._op = 'd' AND {newer}")
        .whenMatchedUpdate(condition=f"s._op != 'd' AND {newer}", set=update)
        .whenNotMatchedInsert(condition="s._op != 'd'", values=insert)
    )
    try:
        with _idempotent_write(spark, idempotence):
            merge.execute()
        record_deletes(spark, latest, spec, path, idempotence)  # after the MERGE
        if changelog:
            _append_changelog(applied_rows, path, idempotence)
        return int(latest.count())
    finally:
        latest.unpersist()


def _append_changelog(rows: Any, path: str, idempotence: tuple[str, int] | None) -> None:
    """Every event of the batch, in order, appended to ``<table>__changelog`` (history, audit)."""
    writer = rows.withColumnRenamed("_op", "_pgcdc_op").write.format("delta").mode("append")\
        .option("mergeSchema", "true")
    if idempotence is not None:
        writer = writer.option("txnAppId", idempotence[0]).option("txnVersion", idempotence[1])
    writer.save(f"{path}__changelog")


@contextmanager
def _idempotent_write(spark: Any, idempotence: tuple[str, int] | None) -> Iterator[None]:
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


CatalogSource = CatalogLog | Callable[[set[str]], CatalogLog]


def apply_batch(spark: Any, batch: Any, batch_id: int, *, catalog: CatalogSource, lake: str,
                app_id: str, changelog: bool = False) -> dict[str, int]:
    """Apply one micro-batch; returns the changes applied per table.

    ``catalog``: the catalog log, or a function giving one that holds the given versions
    (the job's cache, which reads the catalog topic again only for a version it lacks).
    """
    rows = header_rows(batch).persist()  # Kafka is read once per batch
    events = None
    try:
        versions = batch_versions(rows)
        if not versions:
            return {}
        log_ = catalog if isinstance(catalog, CatalogLog) else catalog(
            {v for _, v in versions if v is not None})
        events = parse_envelopes(batch, log_, rows=rows, versions=versions).persist()
        applied: dict[str, int] = {}
        for oid, truncate in sorted(summarize(events, log_).items()):
            spec = log_.latest(oid)
            applied[spec.qualified_name] = apply_table(
                spark, events, spec, lake, idempotence=(app_id, batch_id), changelog=changelog,
                versions=log_.versions(oid), truncate=truncate)
        return applied
    finally:
        if events is not None:
            events.unpersist()
        rows.unpersist()
