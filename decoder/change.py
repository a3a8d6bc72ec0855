"""A decoded change: one row event with everything needed to address and apply it.

``(commit_lsn, ordinal)`` orders and de-duplicates events (DESIGN.md invariant
2); ``lsn`` alone does not, because it is not monotonic across interleaved
transactions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from decoder.pgoutput import PG_EPOCH_OFFSET_US, UNCHANGED_TOAST, TupleData
from decoder.values import decoder_for
from snapshot_builder.catalog import TableVersion

Row = dict[str, Any]

CREATE: Final = "c"
UPDATE: Final = "u"
DELETE: Final = "d"
TRUNCATE: Final = "t"
READ: Final = "r"



def unix_millis(pg_microseconds: int) -> int:
    return (pg_microseconds + PG_EPOCH_OFFSET_US) // 1000


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    op: str
    table: TableVersion
    before: Row | None
    after: Row | None
    unchanged: tuple[str, ...]  # columns whose TOASTed value the server did not resend
    commit_lsn: int
    lsn: int
    ordinal: int
    xid: int
    commit_time: int  # microseconds since 2000-01-01 UTC

    @property
    def key(self) -> Row:
        """The primary key (replica identity key) values of the row."""
        row = self.after if self.after is not None else self.before
        if row is None:
            return {}
        return {c.name: row.get(c.name) for c in self.table.key_columns}


class RowDecoder:
    """Turns tuple data of one table version into a dict of typed values."""

    __slots__ = ("_columns",)

    def __init__(self, table: TableVersion,
                 lookup: Callable[[int], Callable[[str], Any]] = decoder_for) -> None:
        self._columns: tuple[tuple[str, Callable[[str], Any]], ...] = tuple(
            (c.name, lookup(c.type_oid)) for c in table.columns
        )

    def decode(self, data: TupleData) -> tuple[Row, tuple[str, ...]]:
        row: Row = {}
        unchanged: list[str] = []
        for (name, decode), raw in zip(self._columns, data, strict=True):
            if raw is None:
                row[name] = None
            elif raw is UNCHANGED_TOAST:
                unchanged.append(name)
            elif isinstance(raw, str):
                row[name] = decode(raw)
            else:
                row[name] = raw
        return row, tuple(unchanged)
