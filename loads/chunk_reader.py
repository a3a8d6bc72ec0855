"""Reading chunks: one reader thread COPYs page ranges of tables into batches of read events.

A chunk is ``COPY (SELECT <published columns> FROM t WHERE ctid >= '(a,0)' AND
ctid < '(b,0)' [AND <delta>] [AND <row filter>]) TO STDOUT`` in text format:
psycopg's :meth:`~psycopg.Copy.rows` gives each row as a tuple of ``str`` or
``None`` (no types set), exactly the text pgoutput sends for the same value,
and the stream's own :class:`~decoder.change.RowDecoder` turns it into typed
values.  The reader's connection runs with the replication connection's
session settings (``SESSION_OPTIONS``), so dates, intervals, floats and money
print alike.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import psycopg
from psycopg import sql

from decoder.change import READ, ChangeEvent, RowDecoder
from loads.load_state import MAX_CHUNK_ROWS, ChunkState, ordinal
from loads.published import PublishedTable

Conn = psycopg.Connection[tuple[object, ...]]


@dataclass(frozen=True, slots=True)
class ChunkTask:
    table: PublishedTable
    decoder: RowDecoder | None  # None for a worker process, which builds its own
    index: int  # the chunk's index in its table's plan
    chunk: ChunkState
    since: str | None  # a delta read: only rows whose xmin is not older than this xid


@dataclass(slots=True)
class Batch:
    task: ChunkTask
    events: list[ChangeEvent]
    last: bool = False
    rows: int = 0  # on the last batch: the chunk's rows


@dataclass(slots=True)
class Failed:
    error: BaseException


def copy_query(task: ChunkTask) -> sql.Composed:
    """``COPY (SELECT <published columns> FROM t WHERE <chunk>) TO STDOUT`` in text format."""
    table = task.table.table
    where = [sql.SQL("ctid >= {}::pg_catalog.tid").format(sql.Literal(f"({task.chunk.start},0)"))]
    if task.chunk.end is not None:
        where.append(sql.SQL("ctid < {}::pg_catalog.tid").format(
            sql.Literal(f"({task.chunk.end},0)")))
    if task.since is not None:
        where.append(sql.SQL("pg_catalog.age(xmin) <= pg_catalog.age({}::pg_catalog.xid)").format(
            sql.Literal(task.since)))
    if task.table.row_filter is not None:  # the publication's row filter, as the server prints it
        where.append(sql.SQL("({})").format(sql.SQL(task.table.row_filter)))
    return sql.SQL("COPY (SELECT {} FROM {} WHERE {}) TO STDOUT").format(
        sql.SQL(", ").join(sql.Identifier(c.name) for c in table.columns),
        sql.Identifier(table.schema, table.name), sql.SQL(" AND ").join(where))


def chunk_batches(conn: Conn, task: ChunkTask, decoder_of: Callable[[], RowDecoder],
                  batch_rows: int, load_lsn: int, attempt: int,
                  commit_time: int) -> Iterator[list[ChangeEvent]]:
    """The read events of one chunk, in COPY's order, in batches of ``batch_rows``.

    ``decoder_of()`` is asked for the row decoder at the start of each batch: a worker
    process checks the catalog generation there (and may stop the chunk by raising).
    The last batch may be empty.  Memory: one batch, whatever the chunk's size.
    """
    table = task.table.table
    base = ordinal(attempt, task.index, 0)
    rows = 0
    batch: list[ChangeEvent] = []
    decode = row_builder(decoder_of())
    with conn.cursor() as cur, cur.copy(copy_query(task)) as copy:
        for raw in copy.rows():
            if rows >= MAX_CHUNK_ROWS:
                raise chunk_too_large(task)
            batch.append(ChangeEvent(READ, table, None, decode(raw), (), load_lsn, load_lsn,
                                     base + rows, 0, commit_time))
            rows += 1
            if len(batch) >= batch_rows:
                yield batch
                batch = []
                decode = row_builder(decoder_of())
    yield batch


def chunk_too_large(task: ChunkTask) -> ValueError:
    """A chunk with more rows than an ordinal can number (load_state.MAX_CHUNK_ROWS)."""
    return ValueError(f"chunk {task.index} of {task.table.table.qualified_name} holds more "
                      f"than {MAX_CHUNK_ROWS} rows; use fewer pages per chunk")


def row_builder(decoder: RowDecoder) -> Callable[[Sequence[str | None]], dict[str, Any]]:
    """``decoder.decode(raw)[0]`` for a COPY row (``str`` or ``None`` per column, never an
    unchanged TOAST marker), with fewer steps per row: the row is zipped whole, and only
    the columns whose type has a decoder are visited (text, enums, JSON stay as they came).
    """
    names = tuple(column[0] for column in decoder.columns)
    typed = tuple((column[0], column[1]) for column in decoder.columns
                  if column[1] is not None)  # (a third item decodes binary values: not COPY's)

    def build(raw: Sequence[str | None]) -> dict[str, Any]:
        if len(raw) != len(names):
            msg = f"a COPY row has {len(raw)} columns, the table version {len(names)}"
            raise ValueError(msg)
        row = dict(zip(names, raw, strict=True))
        for name, decode in typed:
            value = row[name]
            if value is not None:
                row[name] = decode(value)
        return row

    return build


def read_chunks(conn: Conn, todo: queue.Queue[ChunkTask], out: queue.Queue[Batch | Failed],
                halt: threading.Event, batch_rows: int, load_lsn: int, attempt: int,
                commit_time: int) -> None:
    """One reader thread: chunks from ``todo`` as batches of read events into ``out``."""

    def put(item: Batch | Failed) -> bool:
        while not halt.is_set():
            try:
                out.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    try:
        while not halt.is_set():
            try:
                task = todo.get_nowait()
            except queue.Empty:
                break
            decoder = task.decoder
            assert decoder is not None
            rows = 0
            previous: list[ChangeEvent] | None = None
            for events in chunk_batches(conn, task, repeat(decoder).__next__, batch_rows,
                                        load_lsn, attempt, commit_time):
                if previous is not None and not put(Batch(task, previous)):
                    raise Halted
                previous = events
                rows += len(events)
            if not put(Batch(task, previous or [], last=True, rows=rows)):
                break
    except Halted:
        pass
    except BaseException as exc:  # handed to the writer thread, which raises it
        put(Failed(exc))


def begin_in_snapshot(conn: Conn, snapshot_name: str) -> None:
    """Start a read-only repeatable-read transaction in an exported snapshot."""
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))


def lock_tables(conn: Conn, tables: list[tuple[str, str]]) -> None:
    """ACCESS SHARE locks on every table to load, all at once (see initial_load._lock)."""
    if tables:
        names = sql.SQL(", ").join(sql.Identifier(schema, name) for schema, name in tables)
        conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(names))


class Halted(Exception):
    """The writer stopped: a reader leaves its chunk unfinished."""
