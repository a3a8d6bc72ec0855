"""Small-file compaction of the lake tables (``OPTIMIZE``), and what ``VACUUM`` may remove.

Every micro-batch adds a few small files to each table it touches (the MERGE's new rows,
deletion vectors), to its ``__tombstones`` companion when it deletes, and to its
``__changelog`` when that is kept.  Each MERGE joins the batch with the files whose key
range overlaps it and Delta rebuilds its file list after every commit, so both grow with
the number of files.  :func:`compact` bin-packs them (Delta's ``OPTIMIZE``, which also
drops the rows deletion vectors mark): the job runs it on the tables touched since the
last compaction, every ``optimize_every`` batches (``pgcdc spark --optimize-every N``).

Compaction changes no row and commits with ``dataChange = false``, so a crash during it
loses nothing and the next batch carries on; it runs between batches, in the driver's
thread, so it never races the MERGE of the same table.

``VACUUM`` is left to the operator: it deletes the files that compaction and MERGE
replaced once they are older than the retention (``delta.deletedFileRetentionDuration``,
7 days by default; ``VACUUM delta.`<uri>` RETAIN 168 HOURS``).  Keep the retention longer
than the longest time travel or streaming read of the lake anyone needs; the idempotent
writes (``txnAppId``/``txnVersion``) live in the Delta log, not in data files, and are
not affected.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from streaming.tombstones import tombstone_path

log = logging.getLogger(__name__)


def companions(path: str) -> list[str]:
    """A lake table and the tables pgcdc keeps beside it."""
    return [path, tombstone_path(path), f"{path}__changelog"]


def compact(spark: Any, paths: Iterable[str]) -> dict[str, int]:
    """``OPTIMIZE`` each table at ``paths`` and its companions; the files each removed."""
    from delta.tables import DeltaTable

    removed: dict[str, int] = {}
    for path in paths:
        for table in companions(path):
            if not DeltaTable.isDeltaTable(spark, table):
                continue
            metrics = DeltaTable.forPath(spark, table).optimize().executeCompaction()
            row = metrics.select("metrics.numFilesRemoved", "metrics.numFilesAdded").collect()
            removed[table] = int(row[0][0]) if row else 0
            log.info("compacted %s: %d files into %d", table, removed[table],
                     int(row[0][1]) if row else 0)
    return removed
