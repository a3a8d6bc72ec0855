"""The initial load: every published table read under one snapshot as ``read`` events.

Attempt 0 (the slot does not exist yet):

1. ``CREATE_REPLICATION_SLOT ... (SNAPSHOT 'export'[, TWO_PHASE])`` over a
   replication connection; the state file records the slot's consistent point;
2. a coordinator connection imports the snapshot (``BEGIN ISOLATION LEVEL
   REPEATABLE READ; SET TRANSACTION SNAPSHOT``) and reads the catalog baseline:
   every published table's version, storage and size, and the custom types;
3. the readers import it too and lock every table to load in ACCESS SHARE mode:
   ``workers`` processes (loads/load_worker.py), each with one
   connection and its own sink, or with ``workers=0`` ``readers`` connections read
   by threads of this process; only once every one of them imported the snapshot
   the replication connection closes (the export lives only while it is open);
4. a fresh connection checks that no table was altered, rewritten or renamed
   between the snapshot and the locks (else :class:`SnapshotChangedError`; run
   again and the load resumes);
5. every table version is published, and the readers COPY page ranges (``ctid``)
   of the tables in text format, decoded by the stream's own decoders
   (:class:`~snapshot_builder.row_decoders.RowDecoderFactory`, its types read under
   the snapshot, with the replication session's settings; see loads/chunk_reader.py); a worker
   writes its events to its own sink, reader threads hand theirs through a bounded
   queue to the calling thread, which writes them to the sink given;
6. after each chunk, the sink that wrote it is made durable (``end_transaction``
   with the load LSN, ``flush``, ``in_flight() == 0``) and only then this process
   records the chunk done.

Read events: op ``r``, ``before`` None, ``commit_lsn`` and ``lsn`` the consistent
point minus one (:attr:`LoadState.load_lsn`: a transaction committing exactly at
the consistent point is streamed with that commit LSN), ``xid`` 0 (a read
belongs to no transaction), ``commit_time`` the start of the attempt, and
an ordinal that packs attempt, chunk and row (:func:`load_state.ordinal`).
The load never flushes anything to PostgreSQL: the slot stays at its consistent
point and the sink's durable LSN never passes it, so streaming afterwards sends
every transaction the snapshot did not see.

Resume (a state file says a load of this slot is in progress, and the slot is
still at its consistent point).  The exported snapshot died with its
connection, so attempt g takes a new snapshot S_g (``pg_export_snapshot``)
and, for every table not yet complete, reads each chunk: in full if it was never
done, and if it was done at an earlier attempt k only the rows whose ``xmin``
is not older than S_k's xmin.  Why the result is still a consistent clone:

* The stream still replays every change committed after the consistent point,
  and every read sorts before all of them, so for each key the fold ends in
  the newest streamed change when there is one; otherwise the key did not
  change after the consistent point and any snapshot's read of it is exact.
* The base matters only where a streamed UPDATE leaves a TOASTed column out
  (unchanged).  Then the value kept is the last one a read or change set; a
  read from S_g holds the value the column had at S_g, and no change after the
  consistent point set it, so it is also the value at the end: still exact.
* No row may be missed: a row visible at S_g lies in some chunk's page range.  A
  chunk never done is read in full.  A chunk done at S_k is complete at S_k; a
  row in it at S_g either has an xmin visible to S_k (it was there at S_k,
  unchanged, and durable) or an xmin not visible to S_k, which is never older
  than S_k's xmin (``age(xmin) <= age(S_k.xmin)`` selects it, possibly with a few
  more).  This is what a row moved into a done chunk by an update after S_k
  needs; a rewrite that moves rows keeping their xmin (VACUUM FULL, CLUSTER) or
  empties the table (TRUNCATE, ALTER TABLE) changes ``relfilenode``, and then the
  whole table is read again.
* Reads of S_g carry a greater ordinal than every read of an earlier attempt,
  so a key read twice keeps the newer content; reads from rows deleted before S_g
  are undone by the streamed DELETE, which sorts after them.

What the resume does not do: it is not the watermark-based incremental snapshot
while streaming; streaming starts only once every table is complete.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from core import failpoints
from core.errors import TerminalError, TransientError
from decoder.change import ChangeEvent
from decoder.errors import SlotInUseError
from decoder.progress import DataLossError, ProgressStore, check_against_slot
from decoder.replication import (
    SESSION_OPTIONS,
    ReplicationConnection,
    identify_system,
    now_pg_micros,
)
from decoder.restart import StateFiles, start_over
from decoder.slot import (
    SlotInfo,
    check_identity,
    check_wal_level,
    create_slot_exporting_snapshot,
    drop_slot,
    ensure_publication,
    slot_info,
)
from loads import read_marks
from loads.chunk_reader import (
    Batch,
    ChunkTask,
    Failed,
    begin_in_snapshot,
    lock_tables,
    read_chunks,
)
from loads.load_progress import LoadProgress, TableProgress
from loads.load_state import (
    COMPLETE,
    MAX_ATTEMPTS,
    Attempt,
    LoadState,
    LoadStateError,
    LoadStateStore,
    TableState,
    extend_tail,
    max_chunk_pages,
    plan_chunks,
)
from loads.load_worker import SinkFactory, WorkerPool, WorkerSetup
from loads.published import PublishedTable, block_size, fetch_published_tables
from loads.read_marks import FirstClaims, HeldRead
from sinks.sink import Sink
from snapshot_builder import ddl
from snapshot_builder.builder import SnapshotBuilder
from snapshot_builder.history import HistoryFile
from snapshot_builder.row_decoders import RowDecoderFactory

log = logging.getLogger(__name__)

Conn = psycopg.Connection[tuple[object, ...]]


class SlotExistsError(TerminalError):
    def __init__(self, slot: str, path: Path) -> None:
        super().__init__(
            f'replication slot "{slot}" exists but {path} holds no initial load of it: an '
            "initial load needs the snapshot of a slot it creates; stream the slot with "
            f"'pgcdc run', or drop it (SELECT pg_drop_replication_slot('{slot}')) to load again"
        )


class SnapshotChangedError(TransientError):
    """A table changed between the snapshot and the readers' locks, or a lock is held."""


class LoadNotDurableError(TransientError):
    """The sink did not make the load's events durable in time."""


# pages per chunk, the unit of resuming, by default (8 MB with 8 kB blocks)
CHUNK_PAGES = 1024


@dataclass
class LoadConfig:
    dsn: str
    state_file: Path
    slot: str = "pgcdc"
    publication: str = "pgcdc"
    tables: list[str] | None = None
    create_publication: bool = True
    two_phase: bool = True  # for the slot the load creates
    capture_ddl: bool = True  # install the DDL capture first, as the pipeline would
    readers: int = 4  # connections reading chunks in parallel (with workers=0)
    # worker processes, each with one connection and its own sink from sink_factory;
    # 0: reader threads in this process, writing to the sink given to InitialLoad
    workers: int = 0
    sink_factory: SinkFactory | None = None
    chunk_pages: int = CHUNK_PAGES  # pages per chunk (8 MB with 8 kB blocks)
    batch_rows: int = 1000  # events per batch handed from a reader to the writer
    lock_timeout: float = 10.0  # seconds a reader waits for a table lock before giving up
    flush_timeout: float = 120.0
    progress_interval: float = 2.0
    progress_file: Path | None = None  # streaming progress that must not exist for a new slot
    # where the stream keeps its catalog history: the load starts it with the catalog as
    # of the consistent point, so DDL between the load and the stream is decoded right
    catalog_dir: Path | None = None


@dataclass
class LoadSummary:
    state: LoadState
    progress: LoadProgress
    resumed: bool  # this run continued a load a crash or a stop had interrupted
    complete: bool  # every table is loaded: streaming may start

    def lines(self) -> list[str]:
        if self.progress.tables or not self.complete:
            return self.progress.summary()
        return [f'initial load of slot "{self.state.slot}" was already complete']


@dataclass
class ExportedSnapshot:
    """The coordinator (catalog, types) and the readers, all in one snapshot."""

    name: str
    coordinator: Conn
    export: ReplicationConnection | None = None  # attempt 0: the slot's exporting connection
    readers: list[Conn] = field(default_factory=list)  # reader threads' connections
    pool: WorkerPool | None = None  # or worker processes

    def release_export(self) -> None:
        """Every reader imported the snapshot: the export may end."""
        if self.export is not None:
            self.export.close()
            self.export = None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.stop()
        self.release_export()
        for conn in [*self.readers, self.coordinator]:
            conn.close()


class InitialLoad:
    def __init__(self, config: LoadConfig, sink: Sink) -> None:
        if config.readers < 1 or config.chunk_pages < 1 or config.workers < 0:
            msg = "an initial load needs at least one reader and one page per chunk"
            raise ValueError(msg)
        if config.workers and config.sink_factory is None:
            msg = "worker processes need a sink factory (LoadConfig.sink_factory)"
            raise ValueError(msg)
        self.config = config
        self.sink = sink
        self.store = LoadStateStore(config.state_file)
        self.progress = LoadProgress()
        self._written: list[Batch] = []
        # the marked reads (read_marks.py): whose first read is due, by table (its index)
        self._claims = FirstClaims.create(threading.Lock(), False, (), shared=False)
        self._index: dict[int, int] = {}  # a table's oid -> its index in the claims
        self._load_due = False  # this attempt writes the load's first read
        self._tables_due: tuple[bool, ...] = ()  # ... and these tables' (in _index's order)
        self._held_in: dict[int, HeldRead] = {}  # per table, the read held back for its last
        self._held = HeldRead()  # the load's candidate for last: of a table that ended
        self._left: dict[int, int] = {}  # per table, the attempt's chunks not ended yet
        # worker processes: the heads they held back, not written yet, with their chunks
        self._heads: list[tuple[ChangeEvent, tuple[ChunkTask, int]]] = []
        self._block_size = 8192  # the server's, read with the plan
        self._pool: WorkerPool | None = None  # the worker processes of a run

    # --- what to do ---------------------------------------------------------------------------

    def pending(self) -> bool:
        """Whether :meth:`run` has work: the slot does not exist yet, or its load is unfinished."""
        state = self.store.load()
        with psycopg.connect(self.config.dsn, autocommit=True) as conn:
            missing = slot_info(conn, self.config.slot) is None
        if state is not None and state.slot == self.config.slot:
            return state.status != COMPLETE or missing  # a lost slot: run() says so
        return missing

    def run(self, *, stop: threading.Event | None = None,
            on_progress: Callable[[LoadProgress], None] | None = None) -> LoadSummary:
        """Load, or resume an interrupted load; returns when done, stopped or failed."""
        stop = stop or threading.Event()
        cfg = self.config
        state = self.store.load()
        with psycopg.connect(cfg.dsn, autocommit=True) as conn:
            check_wal_level(conn)
            slot = slot_info(conn, cfg.slot)
            if state is not None:
                self._check_resumable(state, slot)
                if not state.attempts and self._history_missing(conn):
                    # killed between the slot and its history: nothing was read or written
                    # (the plan is stored before any read), and the definitions at the slot's
                    # consistent point are gone with any DDL since: a slot made afresh
                    log.warning("the initial load of slot %s was stopped before it started "
                                "its catalog history; nothing was loaded: the slot is made "
                                "again", cfg.slot)
                    drop_slot(conn, cfg.slot)
                    state = slot = None
            if state is None:
                if slot is not None:
                    raise SlotExistsError(cfg.slot, self.store.path)
                created = ensure_publication(conn, cfg.publication, cfg.tables,
                                             create=cfg.create_publication)
                check_identity(conn, cfg.publication, created=created)
                self._install_ddl_capture(conn)
        if state is not None and state.status == COMPLETE:
            return LoadSummary(state, self.progress, resumed=False, complete=True)
        # worker processes start now: they import pgcdc and open their sinks while the slot
        # and its snapshot are made, then wait for the snapshot (WorkerPool.configure)
        self._pool = WorkerPool(cfg.workers, cfg.sink_factory).start() \
            if cfg.workers and cfg.sink_factory is not None else None
        try:
            if state is None:
                state, snapshot = self._create_slot()
            else:
                if identify_system(cfg.dsn) != (state.system_identifier, state.database):
                    msg = (f"{self.store.path} holds a load from database {state.database!r} "
                           f"of system {state.system_identifier}, not this one: choose another "
                           "state file")
                    raise LoadStateError(msg)
                snapshot = self._export_snapshot(state)
            try:
                return self._load(state, snapshot, stop, on_progress)
            finally:
                snapshot.close()
        finally:
            if self._pool is not None:
                self._pool.stop()  # if no snapshot took it over (nothing to load, an error)

    def _check_resumable(self, state: LoadState, info: SlotInfo | None) -> None:
        cfg = self.config
        if state.slot != cfg.slot or state.publication != cfg.publication:
            msg = (f"{self.store.path} holds the load of slot {state.slot!r} (publication "
                   f"{state.publication!r}), not {cfg.slot!r} ({cfg.publication!r}): choose "
                   "another state file")
            raise LoadStateError(msg)
        files = StateFiles(cfg.progress_file, cfg.catalog_dir, self.store.path)
        if info is None:
            when = "after" if state.status == COMPLETE else "during"
            msg = (f'replication slot "{cfg.slot}" disappeared {when} its initial load: the '
                   "changes since are lost; "
                   f"{start_over(cfg.slot, files, drop_slot=False, topics=True)}")
            raise DataLossError(msg)
        fix = start_over(cfg.slot, files, drop_slot=True, topics=True)
        if state.status == COMPLETE:
            return
        if info.confirmed_flush_lsn != state.consistent_point:
            msg = (f'replication slot "{cfg.slot}" moved during its initial load (from '
                   f"{state.consistent_point:#x} to {info.confirmed_flush_lsn or 0:#x}): the "
                   f"changes in between are lost; {fix}")
            raise DataLossError(msg)
        if info.active_pid is not None:
            raise SlotInUseError(cfg.slot, info.active_pid)

    def _keeps_history(self, conn: Conn) -> bool:
        """Whether the load starts the stream's catalog history (:meth:`_start_history`)."""
        cfg = self.config
        return cfg.catalog_dir is not None and cfg.capture_ddl and ddl.installed(conn)

    def _history_missing(self, conn: Conn) -> bool:
        """The stream's catalog history should begin at the slot's consistent point
        (:meth:`_start_history`) and does not."""
        cfg = self.config
        if cfg.catalog_dir is None or not self._keeps_history(conn):
            return False
        folder = HistoryFile(cfg.catalog_dir)
        if not folder.holds_history():
            return True
        history = folder.load(read_only=True)
        history.close()
        return history.latest.version == 0

    def _check_no_keyless(self, tables: list[PublishedTable], *, planned: bool) -> None:
        """A resumed load cannot finish a table without a key exactly: it reads under a
        snapshot newer than the consistent point, so rows written in between come both as
        reads and as streamed changes, and reads an earlier attempt made durable (not yet
        recorded done) come again under new positions; a key folds each pair into one row,
        a keyless table (a multiset downstream) keeps both.  Raise, naming the tables and
        the ways on (``planned``: the killed load stored its plan, which the hand-over to
        incremental snapshots needs)."""
        keyless = [t.table.qualified_name for t in tables if t.table.keyless]
        if not keyless:
            return
        cfg = self.config
        files = StateFiles(cfg.progress_file, cfg.catalog_dir, self.store.path)
        msg = (f"the interrupted initial load of slot {cfg.slot!r} cannot be resumed "
               f"exactly: {', '.join(keyless)} has no key (or REPLICA IDENTITY FULL), and a "
               "resumed read of it under a newer snapshot would bring rows twice downstream. "
               + ("Finish it with `pgcdc run --initial-load --incremental-snapshots` (the "
                  "rest of the load is handed to incremental snapshots while streaming, and a "
                  "keyless table is read whole, a truncate first, under a SHARE lock); or, "
                  if planned else
                  "It was stopped before it stored its plan (which a hand-over to incremental "
                  "snapshots needs); ")
               + start_over(cfg.slot, files, drop_slot=True, topics=True))
        raise LoadStateError(msg)

    def _install_ddl_capture(self, conn: Conn) -> None:
        """Before the slot exists, so that the definitions read under its snapshot are the
        captured ones the stream will decode with (the pipeline installs it as well)."""
        if not self.config.capture_ddl or ddl.installed(conn):
            return
        try:
            ddl.install(conn)
        except ddl.DdlCaptureError as exc:
            log.warning("%s", exc)

    # --- snapshots ----------------------------------------------------------------------------

    def _create_slot(self) -> tuple[LoadState, ExportedSnapshot]:
        """Attempt 0: the slot's exported snapshot, imported by every connection."""
        cfg = self.config
        stream = ReplicationConnection(cfg.dsn)
        stream.connect()
        try:
            system_id, _timeline, _lsn, database = stream.command("IDENTIFY_SYSTEM")[0]
            if cfg.progress_file is not None:
                check_against_slot(ProgressStore(cfg.progress_file).load(), None,
                                   slot_name=cfg.slot, system_identifier=str(system_id),
                                   database=str(database), path=cfg.progress_file,
                                   files=StateFiles(cfg.progress_file, cfg.catalog_dir,
                                                    cfg.state_file))
            exported = create_slot_exporting_snapshot(stream, cfg.slot, two_phase=cfg.two_phase)
            state = LoadState(cfg.slot, str(system_id), str(database), cfg.publication,
                              exported.consistent_point)
            self.store.save(state)
            snapshot = ExportedSnapshot(exported.snapshot_name, self._connect(), export=stream)
        except BaseException:
            stream.close()
            raise
        try:  # the export lives until every reader imported it (ExportedSnapshot.release_export)
            begin_in_snapshot(snapshot.coordinator, exported.snapshot_name)
            failpoints.hit("before_load_history")
            self._start_history(snapshot.coordinator, exported.consistent_point)
        except BaseException:
            snapshot.close()
            raise
        return state, snapshot

    def _start_history(self, coordinator: Conn, consistent_point: int) -> None:
        """The catalog history's first version: the published tables and the types as the
        exported snapshot sees them, i.e. at the slot's consistent point.  Streaming later
        resumes this history; a DDL committed after the snapshot then arrives through the
        slot as a change of it, not as a surprise against today's definitions."""
        cfg = self.config
        if cfg.catalog_dir is None or not self._keeps_history(coordinator):
            return
        history = HistoryFile(cfg.catalog_dir).load()
        if history.latest.version == 0:
            SnapshotBuilder(history).start_consistent(
                ddl.baseline(coordinator, cfg.publication), consistent_point)
        history.close()

    def _catalog_generation(self) -> int:
        """The catalog history's generation, which the workers' caches check per batch."""
        directory = self.config.catalog_dir
        if directory is None or not directory.exists():
            return 0
        history = HistoryFile(directory).load(read_only=True)
        history.close()
        return history.generation

    def _export_snapshot(self, state: LoadState) -> ExportedSnapshot:
        """A resumed attempt: a new snapshot from the coordinator's own transaction."""
        coordinator = self._connect()
        try:
            coordinator.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            row = coordinator.execute("SELECT pg_catalog.pg_export_snapshot()").fetchone()
            assert row is not None
        except BaseException:
            coordinator.close()
            raise
        return ExportedSnapshot(str(row[0]), coordinator)  # exported while its transaction lasts

    def _options(self) -> str:
        return f"{SESSION_OPTIONS} -c lock_timeout={int(self.config.lock_timeout * 1000)}"

    def _connect(self) -> Conn:
        return psycopg.connect(self.config.dsn, autocommit=True, options=self._options(),
                               application_name="pgcdc initial load")

    def _start_readers(self, snapshot: ExportedSnapshot, tables: list[PublishedTable],
                       load_lsn: int, attempt: int, started: int) -> None:
        """Reader connections (threads) or worker processes import the snapshot and lock
        every table; only then the exporting connection may close."""
        cfg = self.config
        if self._pool is not None:
            setup = WorkerSetup(cfg.dsn, self._options(), snapshot.name,
                                tuple((t.table.schema, t.table.name) for t in tables),
                                load_lsn, attempt, started, cfg.batch_rows, cfg.flush_timeout,
                                tuple(t.oid for t in tables))
            snapshot.pool = self._pool
            self._claims = snapshot.pool.configure(setup, self._catalog_generation(),
                                                   self._load_due, self._tables_due)
            try:
                snapshot.pool.wait_ready(timeout=60 + cfg.lock_timeout)
            except (psycopg.errors.LockNotAvailable, psycopg.errors.UndefinedTable) as exc:
                raise lock_error(exc) from exc
        else:
            self._claims = FirstClaims.create(threading.Lock(), self._load_due,
                                              self._tables_due, shared=False)
            for _ in range(cfg.readers):
                conn = self._connect()
                snapshot.readers.append(conn)
                begin_in_snapshot(conn, snapshot.name)
            self._lock(snapshot, tables)

    # --- the load -----------------------------------------------------------------------------

    def _load(self, state: LoadState, snapshot: ExportedSnapshot, stop: threading.Event,
              on_progress: Callable[[LoadProgress], None] | None) -> LoadSummary:
        cfg = self.config
        coordinator = snapshot.coordinator
        captured = ddl.installed(coordinator)
        try:
            catalog = fetch_published_tables(coordinator, cfg.publication, captured=captured)
        except psycopg.errors.LockNotAvailable as exc:
            raise lock_error(exc) from exc
        if not state.tables and not state.attempts:
            state.tables = {oid: TableState(oid, t.table.schema, t.table.name, t.relfilenode, [])
                            for oid, t in catalog.items()}
        loading = [t for t in state.tables.values() if not t.complete]
        for table in loading:
            if table.oid not in catalog:
                log.warning("table %s was dropped or left the publication during its initial "
                            "load; it is skipped", table.qualified_name)
                table.complete = True
        loading = [t for t in loading if not t.complete]

        resumed = bool(state.attempts)
        if snapshot.export is None:  # not the slot's snapshot: killed before any attempt, too
            self._check_no_keyless([catalog[t.oid] for t in loading],
                                   planned=resumed)
        attempt = len(state.attempts)
        if attempt >= MAX_ATTEMPTS:
            msg = (f"the initial load of slot {cfg.slot!r} was resumed {attempt} times; "
                   f"drop the slot, remove {self.store.path} and the topics, and load again")
            raise LoadStateError(msg)
        row = coordinator.execute(
            "SELECT (pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot())::text::int8"
            " % 4294967296)::text").fetchone()
        assert row is not None
        started = Attempt(str(row[0]), now_pg_micros())
        tables = [catalog[t.oid] for t in loading]
        # no row of a table durable yet: this attempt writes its first read, and the load's
        # while no table's is durable (read_marks.py)
        self._index = {t.oid: index for index, t in enumerate(loading)}
        self._tables_due = tuple(t.rows == 0 for t in loading)
        self._load_due = all(t.rows == 0 for t in state.tables.values())
        if tables:
            self._start_readers(snapshot, tables, state.load_lsn, attempt, started.started)
        snapshot.release_export()
        _check_unchanged(cfg.dsn, cfg.publication, tables, captured)
        state.attempts.append(started)
        tasks = self._plan(state, catalog, loading, coordinator)
        self._left = {t.oid: 0 for t in loading}
        for task in tasks:
            self._left[task.table.oid] += 1
        if not any(not t.complete for t in state.tables.values()):
            state.status = COMPLETE
        self.store.save(state)  # the attempt is taken before any of its events exist
        failpoints.hit("after_load_plan")
        log.info("initial load attempt %d of slot %s: %d chunks of %d tables", attempt,
                 cfg.slot, len(tasks), len(loading))
        self.progress = LoadProgress(attempt=attempt)
        for table in loading:
            published = catalog[table.oid]
            self.progress.tables[table.oid] = TableProgress(
                table.qualified_name, published.estimated_rows,
                sum(1 for t in tasks if t.table.oid == table.oid),
                size=published.pages * self._block_size)
            self.sink.publish_table(published.table, state.load_lsn)
        if snapshot.pool is not None:
            self._read_in_workers(state, snapshot.pool, tasks, stop, on_progress)
        elif tasks:
            self._read(state, snapshot, tasks, stop, on_progress)
        complete = state.status == COMPLETE
        if complete:
            log.info("initial load of slot %s complete: %d rows in this run", cfg.slot,
                     self.progress.rows)
        return LoadSummary(state, self.progress, resumed=resumed, complete=complete)

    def _lock(self, snapshot: ExportedSnapshot, tables: list[PublishedTable]) -> None:
        """Every reader locks every table first: a later lock request of one reader would
        queue behind a DDL that waits for another reader, and nobody would wake up."""
        names = [(t.table.schema, t.table.name) for t in tables]
        try:
            for conn in snapshot.readers:
                lock_tables(conn, names)
        except (psycopg.errors.LockNotAvailable, psycopg.errors.UndefinedTable) as exc:
            raise lock_error(exc) from exc

    def _chunk_pages(self, pages: int, chunk_pages: int) -> int:
        """The pages per chunk of a table of ``pages`` pages (at most ``chunk_pages``)."""
        return chunk_pages

    def _plan(self, state: LoadState, catalog: dict[int, PublishedTable],
              loading: list[TableState], coordinator: Conn) -> list[ChunkTask]:
        """This attempt's tasks: every chunk of every table not complete (module docstring).

        Custom types are read under the snapshot.
        """
        self._block_size = block_size(coordinator)
        chunk_pages = min(self.config.chunk_pages, max_chunk_pages(self._block_size))
        decoders = RowDecoderFactory(lambda: coordinator)
        tasks: list[ChunkTask] = []
        for table in loading:
            published = catalog[table.oid]
            whole = published.relkind == "p"
            if not table.chunks or table.relfilenode != published.relfilenode:
                if table.chunks:
                    log.warning("table %s was rewritten during its initial load; it is read "
                                "again in full", table.qualified_name)
                table.chunks = plan_chunks(published.pages,
                                           self._chunk_pages(published.pages, chunk_pages),
                                           whole=whole)
                table.relfilenode = published.relfilenode
            elif not whole:
                extend_tail(table, published.pages,
                            self._chunk_pages(published.pages, chunk_pages))
            table.schema, table.name = published.table.schema, published.table.name
            decoder = decoders.decoder(published.table)
            for index, chunk in enumerate(table.chunks):
                since = None if chunk.done is None else state.attempts[chunk.done].xmin
                tasks.append(ChunkTask(published, decoder, index, chunk, since))
        return tasks

    def _read(self, state: LoadState, snapshot: ExportedSnapshot, tasks: list[ChunkTask],
              stop: threading.Event, on_progress: Callable[[LoadProgress], None] | None) -> None:
        """Reader threads fill a bounded queue; this thread writes, checkpoints and reports."""
        cfg = self.config
        todo: queue.Queue[ChunkTask] = queue.Queue()
        for task in tasks:
            todo.put(task)
        out: queue.Queue[Batch | Failed] = queue.Queue(maxsize=2 * cfg.readers)
        halt = threading.Event()
        attempt = state.attempt
        readers = [threading.Thread(target=read_chunks, name=f"pgcdc-load-{i}", daemon=True,
                                    args=(conn, todo, out, halt, cfg.batch_rows, state.load_lsn,
                                          attempt, state.attempts[attempt].started))
                   for i, conn in enumerate(snapshot.readers)]
        for thread in readers:
            thread.start()
        error: BaseException | None = None
        last_report = time.monotonic()
        ended = 0  # chunks whose last batch was written
        try:
            while any(t.is_alive() for t in readers) or not out.empty():
                if stop.is_set():
                    halt.set()
                try:
                    item = out.get(timeout=0.2)
                except queue.Empty:
                    item = None
                if isinstance(item, Failed):
                    error = error or item.error
                    halt.set()
                elif item is not None and error is None:
                    self._write(item)
                    if item.last:
                        ended += 1
                        self._checkpoint(state)
                        oid = item.task.table.oid
                        self._left[oid] -= 1
                        if not self._left[oid]:
                            self._table_ended(state, oid)
                self.sink.poll(0)
                now = time.monotonic()
                if on_progress is not None and now - last_report >= cfg.progress_interval:
                    on_progress(self.progress)
                    last_report = now
        finally:
            halt.set()
            for thread in readers:
                thread.join(30)
        if error is not None:
            if isinstance(error, psycopg.errors.LockNotAvailable):
                raise lock_error(error) from error
            raise error
        if ended == len(tasks):
            self._write_last(state)

    def _write(self, batch: Batch) -> None:
        """A batch into the sink; of the last batch of a chunk, its final event is held back
        for its table's last (read_marks.py) and the event held before is written: a chunk
        is in ``_written`` (done at the next checkpoint) once every one of its events was
        written.  The first event written of a table whose first is due is marked."""
        events = batch.events
        self._count(batch.task, len(events))
        write = self.sink.write
        oid = batch.task.table.oid
        held: ChangeEvent | None = None
        if batch.last and events:
            held = events[-1]
            events = events[:-1]
        if events:
            write(self._first_of(events[0], oid))
            for event in events[1:]:
                write(event)
        if not batch.last:
            return
        batch.events = []
        if held is None:
            self._written.append(batch)
            return
        previous, chunk = self._held_in.setdefault(oid, HeldRead()).swap(held, batch)
        if previous is not None:
            write(self._first_of(previous, oid))
            self._written.append(chunk)

    def _first_of(self, event: ChangeEvent, oid: int) -> ChangeEvent:
        """``event`` as the one writing thread writes it: marked if its table's first is due
        (in order in the one sink, which is what makes it first)."""
        index = self._index[oid]
        mark = self._claims.try_claim(index)
        if not mark:
            return event
        self._claims.done(index)
        return read_marks.marked(event, mark)

    def _table_ended(self, state: LoadState, oid: int) -> None:
        """Every chunk of a table ended and every other read of it is durable: its held read
        is the load's candidate for last, and the candidate before, of a table that ended
        before, is written as that table's last (read_marks.py)."""
        held = self._held_in.pop(oid, None)
        if held is None:
            return  # an empty table: no reads, no marks
        event, chunk = held.take()
        assert event is not None
        previous, before = self._held.swap(event, chunk)
        if previous is not None:
            self.sink.write(self._table_last(previous))
            self._claims.done(self._index[previous.table.oid])
            self._written.append(before)
            self._checkpoint(state)

    def _table_last(self, event: ChangeEvent) -> ChangeEvent:
        """A table's last read, not the load's: ``last_in_data_collection``, or ``first`` if
        it is the load's first as well (read_marks.table_last); the caller makes it durable
        (for ``first``, before any other write), then calls the claims' ``done``."""
        mark = self._claims.try_claim(self._index[event.table.oid])
        assert mark is not None, "a table that ended has no claim in progress"
        return read_marks.table_last(event, mark)

    def _write_last(self, state: LoadState) -> None:
        """Every chunk ended and every other event is durable: the candidate, ``last``."""
        event, chunk = self._held.take()
        if event is None:
            return
        self._claims.done(self._index[event.table.oid])
        self.sink.write(read_marks.last(event))
        self._written.append(chunk)
        self._checkpoint(state)

    def _checkpoint(self, state: LoadState) -> None:
        """Sink durable -> chunk recorded done (the state file); never an LSN to PostgreSQL."""
        self._make_durable(state)
        for batch in self._written:
            self._record_done(state, batch.task, batch.rows)
        self._written.clear()

    def _make_durable(self, state: LoadState) -> None:
        self.sink.end_transaction(state.load_lsn)
        self.sink.flush(self.config.flush_timeout)
        durable = self.sink.durable_lsn()  # raises the first delivery error
        if self.sink.in_flight() or durable is None or durable < state.load_lsn:
            msg = (f"the sink did not make the initial load's events durable within "
                   f"{self.config.flush_timeout:.0f} s; run again: the load resumes")
            raise LoadNotDurableError(msg)

    def _record_done(self, state: LoadState, task: ChunkTask, rows: int) -> None:
        """A chunk whose every event is durable: done at this attempt, in the state file."""
        attempt = state.attempt
        task.chunk.done = attempt
        table = state.tables[task.table.oid]
        table.rows += rows
        progress = self.progress.tables[table.oid]
        progress.chunks_done += 1
        end = task.table.pages if task.chunk.end is None else task.chunk.end
        progress.bytes_done += max(end - task.chunk.start, 0) * self._block_size
        if all(c.done == attempt for c in table.chunks):
            table.complete = True
            progress.finished = time.monotonic()
        if all(t.complete for t in state.tables.values()):
            state.status = COMPLETE
        self.store.save(state)
        failpoints.hit("after_snapshot_chunk")

    def _read_in_workers(self, state: LoadState, pool: WorkerPool, tasks: list[ChunkTask],
                         stop: threading.Event,
                         on_progress: Callable[[LoadProgress], None] | None) -> None:
        """Worker processes read and write; this process records what they made durable
        (a worker reports a chunk done only once its own sink made it durable)."""
        last_report = time.monotonic()

        def tick() -> None:
            nonlocal last_report
            now = time.monotonic()
            if on_progress is not None and now - last_report >= self.config.progress_interval:
                on_progress(self.progress)
                last_report = now

        done = 0

        def on_done(task: ChunkTask, rows: int, head: ChangeEvent | None) -> None:
            nonlocal done
            done += 1
            self._chunk_done(state, task, rows, head)

        def on_tick() -> None:
            self._write_heads(state)
            tick()

        try:
            pool.run(tasks, stop, on_rows=self._count, on_done=on_done, on_tick=on_tick)
        except psycopg.errors.LockNotAvailable as exc:
            raise lock_error(exc) from exc
        finally:
            self.progress.worker_rss = list(pool.peak_rss)
        if done == len(tasks):
            self._heads_end(state)

    def _chunk_done(self, state: LoadState, task: ChunkTask, rows: int,
                    head: ChangeEvent | None) -> None:
        """A worker made a chunk durable but its head: the table's newest head is held back
        for its last, the one held before is written (:meth:`_write_heads`)."""
        oid = task.table.oid
        self._left[oid] -= 1
        if head is None:
            self._record_done(state, task, rows)
        else:
            previous, chunk = self._held_in.setdefault(oid, HeldRead()).swap(head, (task, rows))
            if previous is not None:
                self._heads.append((previous, chunk))
        self._write_heads(state)

    def _heads_end(self, state: LoadState) -> None:
        """Every worker ended, every chunk done: nobody holds a claim but this process (a
        head after a first claimed here waits one round); then the load's ``last``."""
        while self._heads or self._held_in:
            before = len(self._heads) + len(self._held_in)
            self._write_heads(state)
            assert len(self._heads) + len(self._held_in) < before, "no head was written"
        self._write_heads(state, end=True)

    def _write_heads(self, state: LoadState, end: bool = False) -> None:
        """The heads workers held back (read_marks.py) into this process's sink, each
        marked if it is its table's first (not while a worker writes that first, nor while
        one writes the load's), and made durable; then, for each table whose every chunk is
        done and every other read durable, its held head becomes the load's candidate for
        last and the candidate before is written as its table's last.  With ``end`` (every
        chunk done, every other head written), the candidate is written ``last`` once every
        other read is durable.  Each chunk is recorded done once its head is durable."""
        claims = self._claims
        waiting: list[tuple[ChangeEvent, tuple[ChunkTask, int]]] = []
        written: list[tuple[ChunkTask, int]] = []
        claimed: list[int] = []
        for event, chunk in self._heads:
            index = self._index[chunk[0].table.oid]
            mark = claims.try_claim(index)
            if mark is None:
                waiting.append((event, chunk))  # a worker writes a first: after it
                continue
            if mark:
                event = read_marks.marked(event, mark)
                claimed.append(index)
            self.sink.write(event)
            written.append(chunk)
        self._heads = waiting
        busy = {chunk[0].table.oid for _, chunk in waiting}
        lasts: list[tuple[ChangeEvent, tuple[ChunkTask, int]]] = []
        for oid in [oid for oid in self._held_in if not self._left[oid] and oid not in busy]:
            ending, chunk = self._held_in.pop(oid).take()
            assert ending is not None
            previous, before = self._held.swap(ending, chunk)
            if previous is not None:
                lasts.append((previous, before))
        if written:  # before any table's last: every other read of it is durable
            self._make_durable(state)
        for index in claimed:
            claims.done(index)
        claimed = []
        for table_last, chunk in lasts:
            self.sink.write(self._table_last(table_last))
            claimed.append(self._index[table_last.table.oid])
            written.append(chunk)
        if lasts:
            self._make_durable(state)
        for index in claimed:
            claims.done(index)
        if end and not self._heads and not self._held_in:
            load_last, chunk = self._held.take()
            if load_last is not None:
                claims.done(self._index[load_last.table.oid])
                self.sink.write(read_marks.last(load_last))
                written.append(chunk)
                self._make_durable(state)
        for task, rows in written:
            self._record_done(state, task, rows)

    def _count(self, task: ChunkTask, rows: int) -> None:
        """Rows handed to a sink (not yet durable), for the progress report."""
        progress = self.progress.tables[task.table.oid]
        if progress.started is None:
            progress.started = time.monotonic()
        progress.rows += rows


def run_until_signalled(load: InitialLoad) -> bool:
    """Run ``load`` from a terminal: progress and the summary go to stderr, SIGINT or SIGTERM
    stop it (between chunks; what is durable stays); True when every table is loaded."""
    import signal
    import sys

    stop = threading.Event()
    handlers = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        summary = load.run(stop=stop, on_progress=lambda p: print(
            "\n".join(p.lines()), file=sys.stderr, flush=True))
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    print("\n".join(summary.lines()), file=sys.stderr, flush=True)
    return summary.complete


def lock_error(exc: psycopg.Error) -> SnapshotChangedError:
    msg = (f"could not lock the tables to load ({exc.diag.message_primary}): another session "
           "holds or awaits a conflicting lock (DDL?) or a table changed; run again later: the "
           "load resumes")
    return SnapshotChangedError(msg)


def _check_unchanged(dsn: str, publication: str, tables: Iterable[PublishedTable],
                     captured: bool) -> None:
    """Fail if a table changed (definition, rewrite, rename) between the snapshot and the locks.

    Its rows would not be what the snapshot's catalog describes: a rewrite committed
    after the snapshot even hides every row from it.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        now = fetch_published_tables(conn, publication, sizes=False, captured=captured)
    changed = sorted(t.table.qualified_name for t in tables
                     if t.oid not in now or now[t.oid].identity() != t.identity())
    if changed:
        msg = (f"table(s) {', '.join(changed)} changed while the initial load started (DDL or a "
               "rewrite between the snapshot and its locks); run again: the load resumes with a "
               "new snapshot")
        raise SnapshotChangedError(msg)
