"""Progress of the initial load: rows per table against the catalog's estimate, an ETA, a summary.

The estimate is ``pg_class.reltuples`` at the snapshot (``-1`` when the table was
never vacuumed or analyzed: then the table's progress counts chunks).  Rows
are counted when the writer hands them to the sink, not when they are durable.

Statistics can be stale (a table filled since its last ANALYZE): once the rows read pass
``reltuples``, the estimate is replaced by the rows per byte read so far times the table's
size at the snapshot (by chunks when the size is unknown), shown as re-estimated, or as
unknown (``?``) before anything is durable; the percentage then follows the pages read.
No count is shown above its estimate, no percentage above 100 %.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class TableProgress:
    name: str
    estimated_rows: int  # -1: unknown
    chunks: int  # chunks to read in this run
    rows: int = 0
    chunks_done: int = 0
    size: int = 0  # bytes of the table at the snapshot (pg_relation_size); 0: unknown
    bytes_done: int = 0  # bytes of the page ranges whose chunks are durable
    started: float | None = None
    finished: float | None = None

    @property
    def stale(self) -> bool:
        """The catalog's estimate is known to be wrong: more rows were read than it says."""
        return self.rows > self.estimated_rows >= 0

    @property
    def expected_rows(self) -> int | None:
        """The rows the table is expected to hold: the catalog's estimate while the count
        is within it, else extrapolated from what was read (at least the rows counted);
        ``None`` when nothing says."""
        if self.finished is not None:
            return self.rows
        if self.estimated_rows >= 0 and not self.stale:
            return self.estimated_rows
        if self.size and self.bytes_done:
            return max(self.rows, round(self.rows * self.size / self.bytes_done))
        if self.chunks and self.chunks_done:
            return max(self.rows, round(self.rows * self.chunks / self.chunks_done))
        return None

    @property
    def fraction(self) -> float:
        if self.finished is not None:
            return 1.0
        by_chunks = min(self.chunks_done / self.chunks, 1.0) if self.chunks else 1.0
        if self.size and self.bytes_done:
            by_chunks = max(by_chunks, min(self.bytes_done / self.size, 1.0))
        by_chunks = min(by_chunks, 0.99)  # not finished: not 100 %
        if self.estimated_rows > 0 and not self.stale:
            return max(min(self.rows / self.estimated_rows, 0.99), by_chunks)
        return by_chunks

    @property
    def seconds(self) -> float:
        if self.started is None:
            return 0.0
        return (self.finished or time.monotonic()) - self.started


@dataclass
class LoadProgress:
    tables: dict[int, TableProgress] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    attempt: int = 0
    worker_rss: list[int] = field(default_factory=list)  # each worker process's peak RSS, KiB

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables.values())

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def eta(self) -> float | None:
        """Seconds left, from the rows still expected and the rate so far."""
        rate = self.rate
        if rate <= 0:
            return None
        left = 0.0
        for table in self.tables.values():
            if table.finished is not None:
                continue
            expected = table.expected_rows
            if expected is not None:
                left += max(expected - table.rows, 0)
        return left / rate

    def lines(self) -> list[str]:
        """One line per table still loading, then a total with the ETA."""
        out = []
        for table in self.tables.values():
            if table.started is None or table.finished is not None:
                continue
            expected = table.expected_rows
            estimate = "?" if expected is None else f"~{expected:,}"
            note = ""
            if table.stale:  # reltuples was stale: say so, with what it said
                note = (f" ({'' if expected is None else 're-estimated; '}the statistics "
                        f"said {table.estimated_rows:,})")
            size = _bytes(table.size) if table.size else "?"
            out.append(f"  {table.name}: {table.rows:,} / {estimate} rows{note}, "
                       f"{_bytes(table.bytes_done)} / {size} "
                       f"({table.fraction:.0%}, chunk {table.chunks_done}/{table.chunks})")
        eta = self.eta()
        done = sum(1 for t in self.tables.values() if t.finished is not None)
        out.append(f"load: {self.rows:,} rows in {self.seconds:.1f} s ({self.rate:,.0f} rows/s), "
                   f"{done}/{len(self.tables)} tables done, "
                   f"ETA {_duration(eta) if eta is not None else 'unknown'}")
        return out

    def summary(self) -> list[str]:
        """The final report: every table with its rows, time and rate."""
        out = [f"initial load (attempt {self.attempt}): {self.rows:,} rows from "
               f"{len(self.tables)} tables in {self.seconds:.1f} s ({self.rate:,.0f} rows/s)"]
        if self.worker_rss:
            out.append(f"  {len(self.worker_rss)} worker processes, peak RSS "
                       f"{max(self.worker_rss) / 1024:,.0f} MiB (the largest)")
        for table in self.tables.values():
            rate = table.rows / table.seconds if table.seconds > 0 else 0.0
            state = "done" if table.finished is not None else "not finished"
            out.append(f"  {table.name}: {table.rows:,} rows, {_bytes(table.bytes_done)}, "
                       f"{table.chunks_done}/{table.chunks} chunks, {table.seconds:.1f} s "
                       f"({rate:,.0f} rows/s), {state}")
        return out


def _bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "kB", "MB"):
        if value < 1024:
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{value:,.1f} GB"


def _duration(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"
