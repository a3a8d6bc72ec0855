"""Incremental snapshots while streaming: DBLog's watermarks, with PostgreSQL's visibility.

A table (or a key range of it) is read in chunks of ``chunk_size`` rows in primary-key order
by a background thread on its own connection, while the pipeline keeps streaming. For each
chunk the thread writes a LOW watermark (a non-transactional logical message, prefix
``pgcdc.watermark``), reads the chunk in a REPEATABLE READ transaction that also returns
its snapshot ``S`` (``pg_current_snapshot()``), and writes a HIGH watermark. No lock is
taken. When the stream reaches HIGH, the main loop (the only thread that touches the sink)
writes the chunk's rows as read events at ``(HIGH - 1, row)``, except the rows whose key a
streamed transaction *invisible to S* changed: the stream carries a newer state of those.

Why not DBLog's rule alone (drop the keys changed between LOW and HIGH): in PostgreSQL a
transaction's commit record is written before the transaction becomes visible (the flush,
then ``ProcArrayEndTransaction``), so a transaction committing *before* LOW in the WAL can
still be invisible to ``S``; its change streams before LOW, the chunk holds the older row,
and a read placed after it would bring the old row back. The main loop therefore records,
for the tables being read, the keys every streamed transaction changed (by xid) and drops a
chunk row when any recorded transaction invisible to ``S`` changed its key; records are
forgotten once a chunk's snapshot sees their transaction. docs/incremental-snapshot.md has
the whole argument.

A table without a primary key (REPLICA IDENTITY FULL: a multiset downstream) cannot be read
by key.  When a DDL changed its stored rows (:meth:`IncrementalSnapshots.read_again`), it is
read *whole*, in one step: a REPEATABLE READ transaction takes ``LOCK TABLE t IN SHARE
MODE`` (it waits for every writer of ``t`` to end, and no change of ``t`` commits until it
commits; readers go on), writes LOW, reads every row under its snapshot, writes HIGH and
commits.  At HIGH the main loop writes a TRUNCATE of the table at ``(HIGH - 1, 0)`` and
the rows as read events at ``(HIGH - 1, 1 + n)``: downstream the table's content is
replaced.  No streamed change of ``t`` can fall in the window, so no row is left out; the
main loop checks it anyway (the changes of ``t`` by xid, as for a keyed read) and reads the
table again if one did.  The rows are held in memory until HIGH.

Triggers are rows of ``pgcdc.signal (id, type, data)`` that the thread polls every
``poll_interval`` seconds: ``execute-snapshot`` (``{"tables": [...], "from_key": [...],
"to_key": [...], "surrogate_key": [...]}``), ``pause-snapshot``, ``resume-snapshot``,
``stop-snapshot`` (``{"tables": [...]}`` or every table); they and the state file (jobs, the
last key read durably, paused, the last signal applied) are in loads/signals.py. A
chunk counts as done only once the sink made its read events durable, so a restart continues
after the last durable chunk.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import psycopg
from psycopg import sql

from decoder.change import READ, TRUNCATE, ChangeEvent, Row, RowDecoder
from decoder.lsn import format_lsn
from decoder.names import quoted_table_name
from decoder.replication import SESSION_OPTIONS, now_pg_micros
from loads.published import PublishedTable, fetch_published_tables
from loads.signals import (
    SIGNALS,
    IncrementalSnapshotError,
    Job,
    State,
    StateStore,
    install_signal_table,
    send_signal,
)
from sinks.sink import Sink
from sinks.snapshot_marks import IncrementalRead
from snapshot_builder import ddl
from snapshot_builder.catalog import TableVersion
from snapshot_builder.row_decoders import RowDecoderFactory

__all__ = ["PREFIX", "SIGNALS", "ChangedKeys", "IncrementalSnapshotError", "IncrementalSnapshots",
           "Job", "State", "StateStore", "Visibility", "check_request", "install_signal_table",
           "send_signal"]

log = logging.getLogger(__name__)

Conn = psycopg.Connection[tuple[Any, ...]]

PREFIX: Final = "pgcdc.watermark"
_ALL: Final = ("\x00all",)  # a TRUNCATE: every key of the table


# --- what a chunk's snapshot sees ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Visibility:
    """A ``pg_snapshot`` (``xmin:xmax:xip,...``, 64-bit xids); tells whether a streamed
    transaction (a 32-bit xid from pgoutput) was visible to it."""

    xmin: int
    xmax: int
    xip: frozenset[int]

    @classmethod
    def parse(cls, text: str) -> Visibility:
        xmin, xmax, xip = text.split(":")
        return cls(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))

    def full_xid(self, xid: int) -> int:
        """The 64-bit xid of a 32-bit one: the nearest at or below ``xmax``'s epoch."""
        full = (self.xmax & ~0xFFFFFFFF) | (xid & 0xFFFFFFFF)
        return full - (1 << 32) if full > self.xmax and full >= 1 << 32 else full

    def sees(self, xid: int) -> bool:
        """Whether a *committed* transaction was visible to this snapshot."""
        full = self.full_xid(xid)
        return full < self.xmax and full not in self.xip


class ChangedKeys:
    """Keys changed by streamed transactions, by xid: pure bookkeeping of the main loop."""

    def __init__(self) -> None:
        # xid -> key -> whether an update left a TOASTed column out
        self._by_xid: dict[int, dict[tuple[Any, ...], bool]] = {}

    def __len__(self) -> int:
        return len(self._by_xid)

    def record(self, xid: int, key: tuple[Any, ...], partial: bool = False) -> None:
        keys = self._by_xid.get(xid)
        if keys is None:
            keys = self._by_xid[xid] = {}
        keys[key] = partial or keys.get(key, False)

    def superseded(self, snapshot: Visibility) -> dict[tuple[Any, ...], bool]:
        """Keys changed by a recorded transaction the snapshot did not see, each with
        whether one of those changes was an update without a TOASTed value."""
        out: dict[tuple[Any, ...], bool] = {}
        for xid, keys in self._by_xid.items():
            if not snapshot.sees(xid):
                for key, partial in keys.items():
                    out[key] = partial or out.get(key, False)
        return out

    def forget_seen(self, snapshot: Visibility) -> None:
        """Every later snapshot sees what this one saw: those records can go."""
        for xid in [x for x in self._by_xid if snapshot.sees(x)]:
            del self._by_xid[xid]

    def clear(self) -> None:
        self._by_xid.clear()


# --- the table being read ------------------------------------------------------------------


@dataclass
class _Target:
    """A job resolved against the catalog: version, key columns, decoder."""

    published: PublishedTable
    key: tuple[str, ...]
    key_index: tuple[int, ...]
    decoder: RowDecoder

    @property
    def table(self) -> TableVersion:
        return self.published.table


@dataclass
class Chunk:
    number: int
    target: _Target
    rows: list[Row]
    keys: list[tuple[Any, ...]]
    texts: list[list[str]]  # the key of each row as text (for reading it again)
    last: list[str]  # the text of the last row's key: where the next chunk starts
    snapshot: Visibility
    low: int
    commit_time: int
    high: int = 0
    emitted: bool = False
    whole: bool = False  # a keyless table read whole: a truncate, then every row
    retry: bool = False  # a whole read that a streamed change of the table overlapped
    durable: threading.Event = field(default_factory=threading.Event)


class NotPublishedError(IncrementalSnapshotError):
    """The table is not in the publication."""


def resolve(conn: Conn, publication: str, job: Job, *, whole: bool = False) -> _Target:
    """The job's table, its version and key; a clear error when it cannot be read.  With
    ``whole``, a table without a key resolves with none (``key == ()``: read whole)."""
    try:
        row = conn.execute("SELECT %s::regclass::oid", (job.table,)).fetchone()
    except psycopg.errors.UndefinedTable:
        msg = f"table {job.table!r} does not exist; name it as schema.table"
        raise IncrementalSnapshotError(msg) from None
    except psycopg.errors.InvalidName:
        msg = f"{job.table!r} is not a table name; name it as schema.table"
        raise IncrementalSnapshotError(msg) from None
    assert row is not None
    tables = fetch_published_tables(conn, publication, sizes=False,
                                    captured=ddl.installed(conn))
    published = tables.get(int(row[0]))
    if published is None:
        msg = (f"table {job.table} is not in publication {publication!r}; add it "
               f"(ALTER PUBLICATION {publication} ADD TABLE ...) before snapshotting it")
        raise NotPublishedError(msg)
    table = published.table
    names = [c.name for c in table.columns]
    if job.surrogate_key:
        missing = [k for k in job.surrogate_key if k not in names]
        if missing:
            msg = (f"surrogate key column(s) {', '.join(missing)} not in {table.qualified_name}"
                   f" (published columns: {', '.join(names)})")
            raise IncrementalSnapshotError(msg)
        key = tuple(job.surrogate_key)
    elif whole and job.whole:
        key = ()
    elif table.replica_identity in ("d", "i") and table.key_columns:
        key = tuple(c.name for c in table.key_columns)
    elif whole:
        key = ()
    else:
        msg = (f"table {table.qualified_name} has no primary key (replica identity "
               f"{table.replica_identity!r}); an incremental snapshot reads in key order: add "
               "a primary key, or name unique, NOT NULL columns with --surrogate-key")
        raise IncrementalSnapshotError(msg)
    for bound in (job.from_key, job.to_key):
        if bound is not None and len(bound) != len(key):
            msg = (f"a key bound of {table.qualified_name} needs {len(key)} value(s), one per "
                   f"key column ({', '.join(key)}); got {len(bound)}")
            raise IncrementalSnapshotError(msg)
    return _Target(published, key, tuple(names.index(k) for k in key),
                   RowDecoderFactory(lambda: conn).decoder(table))


def whole_query(target: _Target) -> sql.Composed:
    """``COPY (SELECT <columns> FROM t [WHERE <row filter>]) TO STDOUT``: every row, in no
    order (a table read whole)."""
    table = target.table
    condition: sql.Composable = sql.SQL("true")
    if target.published.row_filter is not None:
        condition = sql.SQL("({})").format(sql.SQL(target.published.row_filter))
    return sql.SQL("COPY (SELECT {} FROM {} WHERE {}) TO STDOUT").format(
        sql.SQL(", ").join(sql.Identifier(c.name) for c in table.columns),
        sql.Identifier(table.schema, table.name), condition)


def chunk_query(target: _Target, job: Job, size: int) -> sql.Composed:
    """``COPY (SELECT <columns> FROM t WHERE key > last [AND key <= to] ORDER BY key LIMIT
    n) TO STDOUT``; the bounds are quoted literals (COPY takes no parameters), typed by the
    key columns they are compared with."""
    table = target.table
    key, values = _key_expr(target.key), _values
    where: list[sql.Composable] = []
    if job.after is not None:
        where.append(sql.SQL("{} > {}").format(key, values(job.after)))
    elif job.from_key is not None:
        where.append(sql.SQL("{} >= {}").format(key, values(job.from_key)))
    if job.to_key is not None:
        where.append(sql.SQL("{} <= {}").format(key, values(job.to_key)))
    if target.published.row_filter is not None:
        where.append(sql.SQL("({})").format(sql.SQL(target.published.row_filter)))
    condition = sql.SQL(" AND ").join(where) if where else sql.SQL("true")
    return sql.SQL("COPY (SELECT {} FROM {} WHERE {} ORDER BY {} LIMIT {}) TO STDOUT").format(
        sql.SQL(", ").join(sql.Identifier(c.name) for c in table.columns),
        sql.Identifier(table.schema, table.name), condition,
        sql.SQL(", ").join(sql.Identifier(k) for k in target.key), sql.Literal(size))


# --- the coordinator -----------------------------------------------------------------------


class IncrementalSnapshots:
    """Signals, the chunk thread and the main loop's side of the watermarks.

    Threads: :meth:`start` runs the chunk thread (its own connection); the pipeline's loop
    calls :meth:`on_change` for every event and :meth:`on_watermark` for every message with
    the prefix ``pgcdc.watermark``; only those two write to the sink.
    """

    def __init__(self, dsn: str, sink: Sink, *, slot: str = "pgcdc", publication: str = "pgcdc",
                 state_file: Path | None = None, chunk_size: int = 1024,
                 poll_interval: float = 1.0) -> None:
        if chunk_size < 1:
            msg = f"the incremental snapshot chunk size must be >= 1 (got {chunk_size})"
            raise IncrementalSnapshotError(msg)
        self.dsn = dsn
        self.sink = sink
        self.slot = slot
        self.publication = publication
        self.chunk_size = chunk_size
        self.poll_interval = poll_interval
        self.store = StateStore(state_file)
        self.state = self.store.load()
        self._run = uuid.uuid4().hex  # watermarks of an earlier process are not ours
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        # the main loop's side
        self._keys: dict[int, tuple[str, ...]] = {}  # table OID -> key columns being read
        self._changed = ChangedKeys()
        self._chunk: Chunk | None = None  # the chunk whose HIGH the stream has not passed
        self._published: set[tuple[int, str]] = set()
        # the pipeline's committed catalog (its table versions by OID), which the rows go
        # out with when it holds the version read (see :meth:`_as_streamed`)
        self.catalog: Callable[[int], TableVersion | None] | None = None
        self.chunks_emitted = 0
        self.rows_emitted = 0
        self.rows_superseded = 0
        self.rows_retried = 0
        self.whole_retried = 0  # whole reads a streamed change of their table overlapped
        self.keys_given_up: list[list[str]] = []  # superseded too often (each one a warning)
        # keys to read again: a streamed update that superseded their row left a TOASTed
        # column out, and the stream alone would never give its value
        self._again: list[list[str]] = []
        self._attempts: dict[tuple[str, ...], int] = {}

    # --- life cycle ---------------------------------------------------------------------------

    def start(self) -> IncrementalSnapshots:
        self._stop.clear()
        self._thread = threading.Thread(target=self._main, name="pgcdc-incremental",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None

    def __enter__(self) -> IncrementalSnapshots:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def request(self, tables: list[str]) -> None:
        """Queue tables (``schema.table``, quoted where needed) as if signalled; those already
        queued are left as they are."""
        with self._lock:
            queued = {j.table for j in self.state.jobs}
            self.state.jobs.extend(Job(t) for t in tables if t not in queued)
            self.store.save(self.state)

    def read_again(self, table: str, oid: int, *, whole: bool = False) -> None:
        """Queue table ``oid`` (named ``table``), whose rows a DDL changed without row changes
        in the WAL.  Its rows changed since any read of it began, so one being read now (the
        first job, maybe halfway) is queued once more, to be read whole after; one still
        waiting its turn reads the new rows anyway.  When its turn comes, the table is found
        by OID (renamed or moved to another schema since: read under its new name); a
        dropped one ends the job as ``gone``.  ``whole``: read whole even with a key (rows
        left it unseen), a truncate first."""
        with self._lock:
            waiting = [j for j in self.state.jobs[1:] if j.table == table and j.oid in (None, oid)]
            if not waiting:
                self.state.jobs.append(Job(table, oid=oid, whole=whole))
            elif whole and not any(j.whole for j in waiting):
                waiting[0].whole = True
            else:
                return
            self.store.save(self.state)

    @property
    def idle(self) -> bool:
        """No job left (every requested table read, failed or cancelled)."""
        with self._lock:
            return not self.state.jobs

    # --- the main loop's side -----------------------------------------------------------------

    def on_change(self, event: ChangeEvent) -> None:
        """Every streamed event: remember the keys changed in tables being read."""
        names = self._keys.get(event.table.oid)
        if names is None:
            return
        if event.op == "t":
            self._changed.record(event.xid, _ALL)
            return
        partial = bool(event.unchanged)
        for row in (event.before, event.after):
            if row is not None:
                self._changed.record(event.xid, tuple(row.get(n) for n in names), partial)

    def on_watermark(self, content: bytes, lsn: int) -> None:
        """A watermark came through the slot: at HIGH, the chunk's rows go to the sink."""
        try:
            mark = json.loads(content)
        except ValueError:
            return
        if mark.get("slot") != self.slot or mark.get("run") != self._run:
            return  # another slot's, or an earlier process's
        chunk = self._chunk
        if chunk is not None and mark.get("kind") == "high" and mark.get("chunk") == chunk.number:
            if chunk.high == 0:
                chunk.high = lsn
            self._emit(chunk)  # again after a reconnect that lost it: same positions
        self._check_durable()

    def _emit(self, chunk: Chunk) -> None:
        table = self._as_streamed(chunk.target.table)
        if (table.oid, table.version) not in self._published:
            self.sink.publish_table(table, chunk.high - 1)
            self._published.add((table.oid, table.version))
        superseded = self._changed.superseded(chunk.snapshot)
        if chunk.whole:
            self._emit_whole(chunk, table, bool(superseded))
            return
        everything = _ALL in superseded
        position = chunk.high - 1  # after every commit before HIGH, before every one after
        written = 0
        again: list[list[str]] = []
        for row_number, (key, row) in enumerate(zip(chunk.keys, chunk.rows, strict=True)):
            if everything or key in superseded:
                if superseded.get(key):  # the stream's update lacks a TOASTed value
                    again.append(chunk.texts[row_number])
                continue
            self.sink.write(IncrementalRead(READ, table, None, row, (), position, position,
                                            row_number, 0, chunk.commit_time))
            written += 1
        self.sink.end_transaction(chunk.high)
        self._changed.forget_seen(chunk.snapshot)
        if not chunk.emitted:
            chunk.emitted = True
            with self._lock:
                self._again.extend(again)
            self.chunks_emitted += 1
            self.rows_emitted += written
            self.rows_superseded += len(chunk.rows) - written

    def _as_streamed(self, table: TableVersion) -> TableVersion:
        """``table`` (as the catalog query read it, its domains' base types named) with
        the type changes the stream's version at HIGH records, where the rows go.  A table
        holding a composite or an enum that changed since the table's last DDL has a
        version recording the change (:attr:`TableVersion.types`, history no catalog query
        can know); without it, the rows went out under the version the table had before
        the change, whose schema was built then: each version has one schema, and that one
        names the type as it was (bench seed 44000137: a composite's attributes, written
        under a schema that lacks some).  With it, the version is the stream's (the same
        fingerprints), or one the sink has not published yet (its definition differs
        otherwise), whose schema is built now."""
        current = self.catalog(table.oid) if self.catalog is not None else None
        if current is not None and current.same_layout(table) \
                and current.qualified_name == table.qualified_name:
            return replace(table, types=current.types)
        return table

    def _emit_whole(self, chunk: Chunk, table: TableVersion, overlapped: bool) -> None:
        """A table read whole: a TRUNCATE at ``(HIGH - 1, 0)``, then every row at ``(HIGH -
        1, 1 + n)``, which replace its content downstream.  A streamed change of the table
        that the snapshot did not see (the SHARE lock should make it impossible) leaves the
        content as it is and has the table read again."""
        position = chunk.high - 1
        if overlapped:
            if not chunk.emitted:
                log.error("a change of %s that the read of it did not see streamed before "
                          "its HIGH watermark at %s; reading it again", table.qualified_name,
                          format_lsn(chunk.high))
        else:
            self.sink.write(ChangeEvent(TRUNCATE, table, None, None, (), position, position,
                                        0, 0, chunk.commit_time))
            for row_number, row in enumerate(chunk.rows, 1):
                self.sink.write(IncrementalRead(READ, table, None, row, (), position,
                                                position, row_number, 0, chunk.commit_time))
        self.sink.end_transaction(chunk.high)
        self._changed.forget_seen(chunk.snapshot)
        if not chunk.emitted:
            chunk.emitted = True
            chunk.retry = overlapped
            if overlapped:
                self.whole_retried += 1
            else:
                self.chunks_emitted += 1
                self.rows_emitted += len(chunk.rows)

    def _check_durable(self) -> None:
        chunk = self._chunk
        if chunk is None or not chunk.emitted:
            return
        durable = self.sink.durable_lsn()
        if durable is not None and durable >= chunk.high:
            self._chunk = None
            chunk.durable.set()

    # --- the chunk thread ---------------------------------------------------------------------

    def _main(self) -> None:
        """The chunk thread: a lost connection is opened again; anything else stops it."""
        while not self._stop.is_set():
            try:
                # the watermarks' commits wait for no standby: the slot reads flushed WAL
                with psycopg.connect(self.dsn, autocommit=True, options=SESSION_OPTIONS
                                     + " -c synchronous_commit=local") as conn:
                    install_signal_table(conn)
                    self._loop(conn)
                return
            except psycopg.OperationalError as exc:
                log.warning("incremental snapshot connection lost (%s); reconnecting in 5 s",
                            str(exc).strip())
                self._stop.wait(5)
            except BaseException as exc:
                self.error = exc
                log.exception("incremental snapshots stopped; streaming goes on")
                return

    def _loop(self, conn: Conn) -> None:
        target: _Target | None = None
        target_job: Job | None = None
        next_poll = 0.0
        while not self._stop.is_set():
            if time.monotonic() >= next_poll:
                self._poll_signals(conn)
                next_poll = time.monotonic() + self.poll_interval
            with self._lock:
                paused = self.state.paused
                job = self.state.jobs[0] if self.state.jobs else None
            if job is None or paused:
                if job is not target_job:  # nothing to read (paused: keep recording)
                    self._keys.clear()
                    target = target_job = None
                self._stop.wait(min(self.poll_interval, 0.2))
                continue
            if job is not target_job:
                target_job, target = job, self._activate(conn, job)
                if target is None:
                    continue
            assert target is not None
            try:
                read = self._read_whole if not target.key else self._read_chunk
                finished, target = read(conn, job, target)
            except (IncrementalSnapshotError, psycopg.errors.UndefinedTable,
                    psycopg.errors.UndefinedColumn, psycopg.errors.DataError,
                    psycopg.errors.InsufficientPrivilege) as exc:
                moved = job.table
                if job.oid is not None and not self._follow(conn, job):  # dropped while read
                    self._finish(job, "gone", f"table oid {job.oid} dropped while read")
                elif job.table != moved:  # renamed while read: on from its last chunk
                    target = target_job = None
                    continue
                else:
                    log.error("incremental snapshot of %s failed: %s", job.table, exc)
                    self._finish(job, "failed", str(exc).strip())
                finished = False
                target = target_job = None
            if finished:
                self._finish(job, "complete")
                target = target_job = None

    def _follow(self, conn: Conn, job: Job) -> bool:
        """Whether pgcdc's own job's table (``job.oid``) still exists; a table renamed or
        moved to another schema since the request (or during the read) is read under its
        new name (the request named it when the DDL that asked for the read committed;
        the stream may be far behind the database)."""
        assert job.oid is not None
        name = _current_name(conn, job.oid)
        if name is None:
            return False
        if name != job.table:
            log.info("incremental snapshot of %s: the table (oid %d) is %s now: reading it "
                     "under that name", job.table, job.oid, name)
            with self._lock:
                job.table = name
                self.store.save(self.state)
        return True

    def _activate(self, conn: Conn, job: Job) -> _Target | None:
        if job.oid is not None and not self._follow(conn, job):
            log.info("incremental snapshot of %s not read: the table (oid %d) was dropped "
                     "since it was requested", job.table, job.oid)
            self._finish(job, "gone", f"table oid {job.oid} dropped since the request")
            return None
        try:
            target = resolve(conn, self.publication, job, whole=_whole(job))
        except IncrementalSnapshotError as exc:
            if isinstance(exc, NotPublishedError) and job.oid is not None:
                # pgcdc's own request (a partition detached, published or not): nothing to read
                log.info("incremental snapshot of %s not read: not in publication %s",
                         job.table, self.publication)
                self._finish(job, "unpublished", None)
            else:
                log.error("incremental snapshot of %s: %s", job.table, exc)
                self._finish(job, "failed", str(exc))
            return None
        self._keys.clear()
        self._changed.clear()  # not under the main loop's feet: nothing recorded is kept
        with self._lock:
            self._again[:] = job.again  # kept across a restart
        self._attempts.clear()
        self._keys[target.table.oid] = target.key
        self._wait_commit_tails(conn)
        if target.key:
            log.info("incremental snapshot of %s by (%s) from %s", target.table.qualified_name,
                     ", ".join(target.key), job.after or job.from_key or "the start")
        else:
            log.info("incremental snapshot of %s: no key, read whole under a SHARE lock",
                     target.table.qualified_name)
        return target

    def _wait_commit_tails(self, conn: Conn, warn_after: float = 60.0) -> None:
        """Changes streamed before the keys were recorded are safe only if every chunk's
        snapshot sees them: wait while a transaction is committed (clog) but not yet
        visible (a synchronous-replication wait, or the instant after the flush)."""
        warn_at = time.monotonic() + warn_after
        while not self._stop.is_set():
            row = conn.execute(
                "SELECT count(*) FROM pg_catalog.pg_snapshot_xip(pg_catalog.pg_current_snapshot())"
                " x WHERE pg_catalog.pg_xact_status(x) = 'committed'").fetchone()
            if row is None or row[0] == 0:
                return
            if time.monotonic() > warn_at:
                log.warning("%d transaction(s) committed but not visible for %.0f s (a "
                            "synchronous standby that does not answer?); the incremental "
                            "snapshot waits for them", row[0], warn_after)
                warn_at = time.monotonic() + warn_after
            self._stop.wait(0.01)

    def _emit_mark(self, conn: Conn, kind: str, chunk: int) -> int:
        """A non-transactional logical message, flushed at once (the transaction that writes
        it gets an xid, so its commit flushes the WAL up to it)."""
        content = json.dumps({"slot": self.slot, "run": self._run, "kind": kind,
                              "chunk": chunk})
        with conn.transaction():
            row = conn.execute("SELECT pg_catalog.pg_logical_emit_message(false, %s, %s)::text",
                               (PREFIX, content)).fetchone()
            conn.execute("SELECT pg_catalog.pg_current_xact_id()")
        assert row is not None
        return _lsn(str(row[0]))

    def _read_chunk(self, conn: Conn, job: Job, target: _Target) -> tuple[bool, _Target]:
        """One chunk: LOW, the rows under a snapshot, HIGH; then wait until they are durable.
        True when the range is exhausted; and the table as this chunk read it."""
        number = job.chunks
        again = self._take_again()
        low = self._emit_mark(conn, "low", number)
        rows: list[Row] = []
        keys: list[tuple[Any, ...]] = []
        texts: list[list[str]] = []
        last: list[str] = []
        ranged = 0
        chunk: Chunk | None = None
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        try:
            with conn.transaction():
                # The lock first (LOCK takes no snapshot; ACCESS SHARE is what any SELECT
                # takes): no DDL on the table commits between the snapshot and HIGH, so the
                # rows, the version they are read with and the stream at HIGH agree.
                conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(
                    sql.Identifier(target.table.schema, target.table.name)))
                row = conn.execute("SELECT pg_catalog.pg_current_snapshot()::text").fetchone()
                assert row is not None
                snapshot = Visibility.parse(str(row[0]))
                commit_time = now_pg_micros()
                target = self._again_resolved(conn, job, target)
                decode, index = target.decoder.decode, target.key_index
                queries = [chunk_query(target, job, self.chunk_size)]
                if again:
                    queries.append(again_query(target, again))
                for n, query in enumerate(queries):
                    with conn.cursor() as cur, cur.copy(query) as copy:
                        for raw in copy.rows():
                            after = decode(raw)[0]
                            rows.append(after)
                            keys.append(tuple(after.get(k) for k in target.key))
                            texts.append([raw[i] for i in index])
                    if n == 0:  # the range: where the next chunk starts
                        ranged, last = len(texts), texts[-1] if texts else []
                if any(v is None for v in last):
                    msg = (f"a key column of {target.table.qualified_name} is NULL; a "
                           "surrogate key must be unique and NOT NULL")
                    raise IncrementalSnapshotError(msg)
                if rows:
                    chunk = Chunk(number, target, rows, keys, texts, last, snapshot, low,
                                  commit_time)
                    self._chunk = chunk  # before HIGH exists: the main loop always finds it
                    self._emit_mark(conn, "high", number)  # still holding the lock
        finally:
            conn.isolation_level = None
        self.rows_retried += len(rows) - ranged
        if chunk is None:
            return not again, target
        # wait for the main loop to write the rows and the sink to make them durable; a tick
        # gives the loop a chance to look (it only looks when a watermark passes)
        while not chunk.durable.wait(0.2):
            if self._stop.is_set():
                return False, target
            self._emit_mark(conn, "tick", number)
        with self._lock:
            if last:
                job.after = last
            job.again = list(self._again)
            job.chunks += 1
            job.rows += len(rows)
            cancelled = job not in self.state.jobs
            if not cancelled:
                self.store.save(self.state)
            pending = bool(self._again)
        return cancelled or (ranged < self.chunk_size and not pending), target

    def _read_whole(self, conn: Conn, job: Job, target: _Target) -> tuple[bool, _Target]:
        """A table without a key, read whole in one transaction: the SHARE lock (every
        writer of the table has ended, none can commit until this transaction does), LOW
        (the first query: the snapshot), every row, HIGH; then wait until the main loop
        wrote them (a truncate first) and they are durable.  True when done; False when a
        streamed change overlapped the read (the next call reads it again) or on stop."""
        number = job.chunks
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        try:
            with conn.transaction():
                conn.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(
                    sql.Identifier(target.table.schema, target.table.name)))
                low = self._emit_mark(conn, "low", number)
                row = conn.execute("SELECT pg_catalog.pg_current_snapshot()::text").fetchone()
                assert row is not None
                snapshot = Visibility.parse(str(row[0]))
                commit_time = now_pg_micros()
                target = self._again_resolved(conn, job, target)
                decode = target.decoder.decode
                rows: list[Row] = []
                with conn.cursor() as cur, cur.copy(whole_query(target)) as copy:
                    for raw in copy.rows():
                        rows.append(decode(raw)[0])
                chunk = Chunk(number, target, rows, [], [], [], snapshot, low, commit_time,
                              whole=True)
                self._chunk = chunk  # before HIGH exists: the main loop always finds it
                self._emit_mark(conn, "high", number)  # still holding the lock
        finally:
            conn.isolation_level = None
        while not chunk.durable.wait(0.2):
            if self._stop.is_set():
                return False, target
            self._emit_mark(conn, "tick", number)
        if chunk.retry:
            return False, target
        with self._lock:
            job.chunks += 1
            job.rows += len(rows)
            if job in self.state.jobs:
                self.store.save(self.state)
        return True, target

    def _again_resolved(self, conn: Conn, job: Job, target: _Target) -> _Target:
        """The table as the chunk's snapshot sees it: a new version after DDL (the key must
        stay the same: the keys recorded so far are in its terms)."""
        current = resolve(conn, self.publication, job, whole=_whole(job))
        if current.table.version == target.table.version:
            return target
        if current.key != target.key or current.table.oid != target.table.oid:
            msg = (f"the key of {target.table.qualified_name} changed during its incremental "
                   f"snapshot ({', '.join(target.key)} -> {', '.join(current.key)}); request "
                   "the snapshot again")
            raise IncrementalSnapshotError(msg)
        log.info("incremental snapshot of %s goes on with table version %s",
                 current.table.qualified_name, current.table.version)
        return current

    def _take_again(self, limit: int = 1000, attempts: int = 5) -> list[list[str]]:
        """Keys to read again in the next chunk; one superseded that way too often is left
        (a warning says so: its TOASTed value stays unknown until it is changed in full)."""
        with self._lock:
            taken, self._again = self._again[:limit], self._again[limit:]
        out: list[list[str]] = []
        for key in taken:
            seen = self._attempts[tuple(key)] = self._attempts.get(tuple(key), 0) + 1
            if seen > attempts:
                self.keys_given_up.append(key)
                log.warning("key %s superseded %d times by updates without its TOASTed value; "
                            "it is not read again (run snapshot-table for it later)", key, attempts)
            else:
                out.append(key)
        return out

    def _finish(self, job: Job, status: str, error: str | None = None) -> None:
        with self._lock:
            if job in self.state.jobs:
                self.state.jobs.remove(job)
                self.state.done.append({"table": job.table, "status": status, "error": error,
                                        "chunks": job.chunks, "rows": job.rows})
                self.store.save(self.state)
        if status == "complete":
            log.info("incremental snapshot of %s complete: %d rows in %d chunks", job.table,
                     job.rows, job.chunks)

    def _poll_signals(self, conn: Conn) -> None:
        rows = conn.execute("SELECT id, type, data FROM pgcdc.signal WHERE id > %s ORDER BY id",
                            (self.state.signal_id,)).fetchall()
        if not rows:
            return
        with self._lock:
            for signal_id, kind, data in rows:
                self.state.apply(str(kind), data if isinstance(data, dict) else {})
                self.state.signal_id = int(signal_id)
            self.store.save(self.state)

def _whole(job: Job) -> bool:
    """Whether the job may read a table without a key whole (under a SHARE lock): only a
    table pgcdc reads again after a DDL changed its rows (the job names its OID), never one
    an operator signalled (no lock is taken unasked)."""
    return job.oid is not None and not job.surrogate_key


def _current_name(conn: Conn, oid: int) -> str | None:
    """The name table ``oid`` has now, spelled as pgcdc names its own requests
    (:func:`~decoder.names.quoted_table_name`); None if there is none."""
    row = conn.execute("SELECT n.nspname, c.relname FROM pg_class c "
                       "JOIN pg_namespace n ON n.oid = c.relnamespace "
                       "WHERE c.oid = %s AND c.relkind IN ('r', 'p')", (oid,)).fetchone()
    if row is None:
        return None
    return quoted_table_name(str(row[0]), str(row[1]))


def again_query(target: _Target, keys: list[list[str]]) -> sql.Composed:
    """``COPY (SELECT <columns> FROM t WHERE key IN (...)) TO STDOUT``: keys read again."""
    table = target.table
    where: list[sql.Composable] = [sql.SQL("{} IN ({})").format(
        _key_expr(target.key), sql.SQL(", ").join(_values(k) for k in keys))]
    if target.published.row_filter is not None:
        where.append(sql.SQL("({})").format(sql.SQL(target.published.row_filter)))
    return sql.SQL("COPY (SELECT {} FROM {} WHERE {}) TO STDOUT").format(
        sql.SQL(", ").join(sql.Identifier(c.name) for c in table.columns),
        sql.Identifier(table.schema, table.name), sql.SQL(" AND ").join(where))


def _key_expr(names: tuple[str, ...]) -> sql.Composable:
    """The key as a row, or the one column (a parenthesized single column is no row)."""
    columns = sql.SQL(", ").join(sql.Identifier(k) for k in names)
    return sql.SQL("({})").format(columns) if len(names) > 1 else columns


def _values(bound: list[str]) -> sql.Composable:
    """Key values as untyped literals: each takes the type of the column it meets."""
    values = sql.SQL(", ").join(sql.Literal(v) for v in bound)
    return sql.SQL("({})").format(values) if len(bound) > 1 else values


def _lsn(text: str) -> int:
    high, low = text.split("/")
    return int(high, 16) << 32 | int(low, 16)


def check_request(dsn: str, publication: str, tables: Iterable[str],
                  surrogate_key: list[str] | None, from_key: list[str] | None,
                  to_key: list[str] | None) -> None:
    """What the running pgcdc would refuse, refused now (the CLI calls this first)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in tables:
            target = resolve(conn, publication, Job(table, surrogate_key, from_key, to_key))
            for bound in (from_key, to_key):
                if bound is None:
                    continue
                try:  # the values must parse as the key columns' types
                    conn.execute(sql.SQL("SELECT {} >= {} FROM {} LIMIT 0").format(
                        _key_expr(target.key), _values(bound),
                        sql.Identifier(target.table.schema, target.table.name)))
                except psycopg.errors.DataError as exc:
                    msg = (f"key bound {bound} does not fit the key ({', '.join(target.key)}) "
                           f"of {target.table.qualified_name}: {exc.diag.message_primary}")
                    raise IncrementalSnapshotError(msg) from None
