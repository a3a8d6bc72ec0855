"""Spark SQL text the apply builds its statements from: literals, positions, and a row's
:data:`~streaming.schema.TEXT` map.  Shared by the keyed apply (streaming/apply.py), the
multiset apply of keyless tables (streaming/multiset.py) and the lake's initial load
(streaming/bulk_load.py)."""

from __future__ import annotations

from typing import Any

from streaming.schema import COMMIT_LSN, ORDINAL, TEXT_TYPE


def literal(text: str) -> str:
    """A Spark SQL string literal of ``text``."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def position(lsn: int, ordinal: int, op: str,
             columns: tuple[str, str] = (COMMIT_LSN, ORDINAL)) -> str:
    """A predicate: the row's (commit_lsn, ordinal), or the two ``columns``, compares ``op``
    (strictly: ``<`` or ``>``) to the given one."""
    at, number = columns
    return f"{at} {op} {lsn} OR ({at} = {lsn} AND {number} {op} {ordinal})"


def text_map(entries: list[tuple[str, str]]) -> str:
    """The :data:`~streaming.schema.TEXT` map of a row: each column whose entry is not NULL;
    NULL when there is none."""
    if not entries:
        return f"CAST(NULL AS {TEXT_TYPE})"
    pairs = ", ".join(f"{literal(name)}, {entry}" for name, entry in entries)
    return (f"CASE WHEN coalesce({', '.join(e for _, e in entries)}) IS NULL THEN NULL "
            f"ELSE map_filter(map({pairs}), (k, v) -> v IS NOT NULL) END")


def sql_value(value: Any, spark_type: str) -> str:
    """A literal of ``value`` collected from a column of ``spark_type``; a date is collected
    as its days since 1970 (``unix_date``): Python's dates end at year 9999 and begin at 1,
    PostgreSQL's and Spark's do not."""
    if spark_type == "string":
        return literal(str(value))
    if spark_type == "date":
        return f"date_from_unix_date({int(value)})"
    if spark_type.startswith("decimal"):
        return f"CAST('{value}' AS {spark_type})"
    return str(int(value))
