"""Tombstones: a deleted key remembers the position of its delete.

Delivery is at-least-once, so a change can reach the lake again after the
delete that superseded it (a replay split across micro-batches, late data).
Without a record of the delete, that older change would insert the row again.
Each Delta table ``<table>`` therefore has a companion ``<table>__tombstones``
holding the ``(commit_lsn, ordinal)`` of deletes, appended batch by batch (an
append costs no join, a MERGE would); a change older than its key's newest
tombstone is left out of the MERGE.  A newer
change (a re-insert) passes, so the tombstone never needs removing; keeping
the table small is a matter of vacuuming keys whose tombstones are older than
anything that can still be replayed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from streaming.evolution import evolve, quote
from streaming.schema import COMMIT_LSN, ORDINAL, TableSpec


def tombstone_path(path: str) -> str:
    return f"{path}__tombstones"


def _on(spec: TableSpec, left: str, right: str) -> str:
    return " AND ".join(f"{left}.{quote(c.name)} <=> {right}.{quote(c.name)}"
                        for c in spec.key_columns)


def _newer(left: str, right: str) -> str:
    return (f"({left}.{COMMIT_LSN} > {right}.{COMMIT_LSN} OR ({left}.{COMMIT_LSN} = "
            f"{right}.{COMMIT_LSN} AND {left}.{ORDINAL} > {right}.{ORDINAL}))")


def _keys_only(spec: TableSpec) -> TableSpec:
    return dataclasses.replace(spec, only_keys=True)


def drop_superseded(spark: Any, latest: Any, spec: TableSpec, path: str,
                    versions: list[TableSpec] | None = None,
                    bounds: tuple[str, str, str] | None = None) -> Any:
    """The batch's latest changes without those older than their key's recorded delete.

    ``bounds``: a key column and the least and greatest value the batch holds in it
    (``streaming.apply``), so that only tombstone files overlapping that range are read."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    tombstones_at = tombstone_path(path)
    if not DeltaTable.isDeltaTable(spark, tombstones_at):
        return latest
    # key columns renamed or widened like the table's own
    evolve(spark, tombstones_at, _keys_only(spec), (COMMIT_LSN, ORDINAL),
           [_keys_only(v) for v in versions or []], keep_dropped=True)
    keys = [quote(c.name) for c in spec.key_columns]
    recorded = spark.read.format("delta").load(tombstones_at)
    if bounds is not None:
        name, low, high = bounds
        recorded = recorded.where(f"{quote(name)} >= {low} AND {quote(name)} <= {high}")
    newest = recorded.groupBy(*keys).agg(
        F.expr(f"max(struct({COMMIT_LSN}, {ORDINAL}))").alias("_p"))
    tombstones = newest.selectExpr(*keys, f"_p.{COMMIT_LSN} AS {COMMIT_LSN}",
                                   f"_p.{ORDINAL} AS {ORDINAL}")
    joined = latest.alias("s").join(tombstones.alias("d"), F.expr(_on(spec, "s", "d")), "left")
    kept = joined.where(F.expr(f"d.{COMMIT_LSN} IS NULL OR {_newer('s', 'd')}"))
    return kept.select("s.*")


def record_deletes(spark: Any, latest: Any, spec: TableSpec, path: str,
                   idempotence: tuple[str, int] | None = None) -> None:
    """Remember the position of every delete among the batch's latest changes."""
    keys = [quote(c.name) for c in spec.key_columns]
    deletes = latest.where("_op = 'd'").select(*keys, COMMIT_LSN, ORDINAL)
    if deletes.isEmpty():
        return
    tombstones_at = tombstone_path(path)
    evolve(spark, tombstones_at, _keys_only(spec), (COMMIT_LSN, ORDINAL),
           keep_dropped=True)
    writer = deletes.write.format("delta").mode("append")
    if idempotence is not None:  # a retried batch appends nothing twice
        writer = writer.option("txnAppId", idempotence[0]).option("txnVersion", idempotence[1])
    writer.save(tombstones_at)
