"""Worker processes of the initial load: each reads chunks into a sink of its own.

Decoding a row and encoding its event cost far more than the server's COPY of it
(docs/initial-load.md), and both run on Python's one interpreter lock, so the
load spreads them over processes (``multiprocessing``, ``spawn``: the parent
holds librdkafka threads, which ``fork`` would copy in a broken state).  Each
worker:

1. starts while the parent creates the slot (or exports a snapshot): imports pgcdc,
   opens its own sink with the parent's factory (for Kafka: its own producer) and waits
   for the load's setup (:meth:`WorkerPool.configure`);
2. connects with the replication session's settings, imports the load's snapshot (``SET
   TRANSACTION SNAPSHOT``), locks every table to load in ACCESS SHARE mode and reports
   :class:`Ready`; the parent keeps the exporting connection open until every worker did;
   it publishes each table version it writes (idempotent: the parent published it first);
3. takes chunks from the shared task queue; per batch of rows it checks the
   catalog generation in shared memory (:class:`~decoder.generation.SharedGeneration`)
   against its :class:`~decoder.generation.GenerationCache` of row decoders (built by a
   :class:`~snapshot_builder.row_decoders.RowDecoderFactory`), stops if the parent
   halted or died, writes the events and reports :class:`Rows` (before its first write
   of a chunk it claims its table's first read when that is due, through shared memory:
   loads/read_marks.py, :class:`~loads.read_marks.FirstClaims`); into a Kafka sink in
   Avro the rows go from libpq to librdkafka through compiled code (sinks/loadfast.py),
   the same records without a Python object per row;
4. at the end of a chunk: ``end_transaction(load LSN)``, ``flush``, nothing in
   flight and the durable LSN at the load LSN (which raises a delivery error), and the
   compiled path's producer flushed with no failed delivery; only then :class:`Done`,
   on which the parent records the chunk done.

Memory per worker is bounded: one batch of events plus the producer's queue.
Errors travel to the parent as :class:`WorkerFailed`; a worker that dies without a word
(killed) is noticed by the parent (:meth:`WorkerPool.messages`).  Either way the
chunks already recorded stay done and the next run resumes.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import queue
import resource
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from multiprocessing.context import SpawnProcess
from typing import Any

import psycopg

from core.errors import TerminalError, TransientError
from decoder.change import READ, ChangeEvent, RowDecoder
from decoder.generation import GenerationCache, SharedGeneration
from loads import read_marks
from loads.chunk_reader import (
    ChunkTask,
    Halted,
    begin_in_snapshot,
    chunk_batches,
    chunk_too_large,
    copy_query,
    lock_tables,
    row_builder,
)
from loads.load_state import MAX_CHUNK_ROWS, ordinal
from loads.read_marks import FirstClaims
from sinks.loadfast import FastLoad, copy_lines
from sinks.sink import Sink
from snapshot_builder.catalog import TableVersion
from snapshot_builder.row_decoders import RowDecoderFactory

log = logging.getLogger(__name__)

SinkFactory = Callable[[], Sink]
"""Builds a sink in a worker process: picklable (a class or a module-level function,
possibly in a :func:`functools.partial`) and without state shared with the parent."""


class WorkerDiedError(TransientError):
    """A worker process ended without reporting (killed, or crashed in C code)."""


class WorkerError(TransientError):
    """A worker's exception that could not travel to the parent as itself."""


class TerminalWorkerError(TerminalError):
    """A worker's terminal exception that could not travel to the parent as itself."""


class NotDurableError(TransientError):
    """A worker's sink did not make a chunk durable in time."""


@dataclass(frozen=True, slots=True)
class WorkerSetup:
    """What every worker gets at its start (pickled once per process)."""

    dsn: str
    options: str  # libpq options: the replication session's settings and lock_timeout
    snapshot: str  # the exported snapshot to import
    lock: tuple[tuple[str, str], ...]  # (schema, name) of every table to load
    load_lsn: int
    attempt: int  # the load's attempt (read positions)
    commit_time: int
    batch_rows: int
    flush_timeout: float
    # the oid of each table to load, in the order of the first reads' claims (read_marks.py)
    oids: tuple[int, ...] = ()
    claims: str = ""  # the shared memory of those claims (FirstClaims.name)


# --- messages, worker -> parent ---------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Ready:
    worker: int


@dataclass(frozen=True, slots=True)
class Rows:
    worker: int
    task: int
    rows: int  # written since the last report (not durable yet)


@dataclass(frozen=True, slots=True)
class Done:
    worker: int
    task: int
    rows: int  # the chunk's rows, all durable in the worker's sink but the head
    # the chunk's first row, held back: the parent writes it (read_marks.py); None: empty
    head: ChangeEvent | None = None


@dataclass(frozen=True, slots=True)
class WorkerFailed:
    worker: int
    error: BaseException


@dataclass(frozen=True, slots=True)
class Exited:
    worker: int
    peak_rss: int  # the worker's peak resident set, KiB (getrusage ru_maxrss on Linux)


Message = Ready | Rows | Done | WorkerFailed | Exited


# --- the worker process -----------------------------------------------------------------------

class _Reader:
    """One worker's state: its connection, its sink, its caches of derived objects."""

    def __init__(self, worker: int, setup: WorkerSetup, conn: psycopg.Connection[Any],
                 sink: Sink, results: Any, halt: Any, catalog: SharedGeneration,
                 fast: FastLoad | None = None, first: FirstClaims | None = None) -> None:
        self.worker, self.setup, self.conn, self.sink = worker, setup, conn, sink
        self.first = first  # who writes the load's and each table's first read (read_marks.py)
        self.claim_index = {oid: index for index, oid in enumerate(setup.oids)}
        self.fast = fast  # COPY lines straight to Kafka (sinks/loadfast.py), where it serves
        self.results, self.halt, self.catalog = results, halt, catalog
        self.parent = os.getppid()
        self.factory = self._factory()
        self.decoders: GenerationCache[tuple[int, str], RowDecoder] = \
            GenerationCache(self._decoder)
        self._tables: dict[tuple[int, str], TableVersion] = {}

    def _factory(self) -> RowDecoderFactory:
        """Types read under the load's snapshot, like the parent's."""
        return RowDecoderFactory(lambda: self.conn)

    def _decoder(self, key: tuple[int, str]) -> RowDecoder:
        table = self._tables[key]
        decoder = self.factory.decoder(table)
        self.sink.publish_table(table, self.setup.load_lsn)
        return decoder

    def decoder_for(self, table: TableVersion) -> RowDecoder:
        """At the start of each batch: stop if asked to, drop what a newer catalog made stale."""
        if self.halt.is_set() or os.getppid() != self.parent:
            raise Halted
        if self.decoders.check(self.catalog.value):
            self.factory = self._factory()  # the types may have changed as well
        key = (table.oid, table.version)
        self._tables[key] = table
        return self.decoders.get(key)

    def run(self, tasks: Any) -> None:
        setup = self.setup
        while True:
            item = self._next(tasks)
            if item is None:
                return
            number, task = item
            if self.fast is not None:
                self._fast_chunk(number, task, self.fast)
                continue
            table = task.table.table
            rows = 0
            head: ChangeEvent | None = None
            checked = False  # whether the table's first read was claimed or written before
            for events in chunk_batches(self.conn, task, partial(self.decoder_for, table),
                                        setup.batch_rows, setup.load_lsn, setup.attempt,
                                        setup.commit_time):
                write = self.sink.write
                count = len(events)
                rows += count
                if head is None and events:  # held back (read_marks.py)
                    head, events = events[0], events[1:]
                if events and not checked:
                    checked = True
                    mark = self._claim_first(table.oid)
                    if mark:
                        write(read_marks.marked(events[0], mark))
                        events = events[1:]
                        self._first_written(table.oid)
                for event in events:
                    write(event)
                self.sink.poll(0)
                if count:
                    self.results.put(Rows(self.worker, number, count))
            self._durable()
            self.results.put(Done(self.worker, number, rows, head))

    def _fast_chunk(self, number: int, task: ChunkTask, fast: FastLoad) -> None:
        """One chunk through the compiled path: the same events, checks and reports as
        :func:`chunk_batches` and the loop in :meth:`run`, per batch of rows."""
        setup, table = self.setup, task.table.table
        base = ordinal(setup.attempt, task.index, 0)
        rows = 0
        decoder = self.decoder_for(table)  # before the COPY: building one may query types
        head: ChangeEvent | None = None
        with copy_lines(self.conn, copy_query(task)) as lines:
            line = next(lines, None)  # the head: held back (read_marks.py)
            if line is not None:
                head = ChangeEvent(READ, table, None,
                                   row_builder(decoder)(read_marks.copy_fields(bytes(line))),
                                   (), setup.load_lsn, setup.load_lsn, base, 0,
                                   setup.commit_time)
                rows = 1
                mark = self._claim_first(table.oid)  # the next row may be the table's first
                if mark:
                    plan = fast.plan(table, decoder, setup.load_lsn, setup.commit_time,
                                     snapshot=mark)
                    if fast.rows(plan, lines, 1, base + rows):
                        rows += 1
                        self._first_written(table.oid)
                    else:
                        self._first_missing(table.oid, mark)
                self.results.put(Rows(self.worker, number, rows))
            while line is not None:
                plan = fast.plan(table, decoder, setup.load_lsn, setup.commit_time)
                limit = min(setup.batch_rows, MAX_CHUNK_ROWS - rows)
                taken = fast.rows(plan, lines, limit, base + rows)
                rows += taken
                if taken:
                    self.results.put(Rows(self.worker, number, taken))
                if taken < limit:
                    break
                decoder = self.decoder_for(table)
                if rows >= MAX_CHUNK_ROWS:
                    if next(lines, None) is not None:
                        raise chunk_too_large(task)
                    break
        self._durable()
        self.results.put(Done(self.worker, number, rows, head))

    def _claim_first(self, oid: int) -> str:
        """Before the first write of a chunk of table ``oid``: the mark this worker writes its
        next read with (``first`` or ``first_in_data_collection``), or ``""`` when that
        table's first is durable already."""
        if self.first is None:
            return ""
        return self.first.claim(self.claim_index[oid], self.halt)

    def _first_written(self, oid: int) -> None:
        """A first read written: durable before any other read of its table (and, for the
        load's, any read at all) is written (read_marks.py)."""
        assert self.first is not None
        self._durable()
        self.first.done(self.claim_index[oid])

    def _first_missing(self, oid: int, mark: str) -> None:
        assert self.first is not None
        self.first.release(self.claim_index[oid], mark)

    def _next(self, tasks: Any) -> tuple[int, ChunkTask] | None:
        item: tuple[int, ChunkTask] | None = _wait_for(tasks, self.halt, self.parent)
        return item

    def _durable(self) -> None:
        """The chunk's events durable in this worker's sink (the order of sinks/sink.py), and
        in the compiled path's producer if it wrote them."""
        lsn, timeout = self.setup.load_lsn, self.setup.flush_timeout
        self.sink.end_transaction(lsn)
        self.sink.flush(timeout)
        durable = self.sink.durable_lsn()  # raises the first delivery error
        fast_left = self.fast is not None and not self.fast.durable(timeout)  # raises as well
        if self.sink.in_flight() or durable is None or durable < lsn or fast_left:
            msg = (f"a load worker's sink did not make its chunk durable within {timeout:.0f} s; "
                   "run again: the load resumes")
            raise NotDurableError(msg)


def worker_main(worker: int, sink_factory: SinkFactory, setups: Any, tasks: Any, results: Any,
                halt: Any, catalog: SharedGeneration, claims_lock: Any = None) -> None:
    """The entry point of a worker process (module level, so ``spawn`` can import it).

    The process starts while the parent creates the slot: it imports pgcdc and opens its
    sink meanwhile, then waits for the snapshot to import (:meth:`WorkerPool.configure`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the load through ``halt``
    sink: Sink | None = None
    fast: FastLoad | None = None
    first: FirstClaims | None = None
    try:
        sink = sink_factory()
        fast = FastLoad.for_sink(sink)
        setup: WorkerSetup | None = _wait_for(setups, halt, os.getppid())  # after the snapshot
        if setup is not None:
            with psycopg.connect(setup.dsn, autocommit=True, options=setup.options,
                                 application_name=f"pgcdc initial load worker {worker}") as conn:
                begin_in_snapshot(conn, setup.snapshot)
                lock_tables(conn, list(setup.lock))
                results.put(Ready(worker))
                if claims_lock is not None and setup.claims:
                    first = FirstClaims.attach(claims_lock, setup.claims)
                try:
                    _Reader(worker, setup, conn, sink, results, halt, catalog, fast,
                            first).run(tasks)
                except Halted:
                    pass
        results.put(Exited(worker, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
    except BaseException as exc:
        results.put(WorkerFailed(worker, _portable(exc)))
    finally:
        if first is not None:
            first.close()
        if fast is not None:
            fast.close()
        if sink is not None:
            try:
                sink.close()
            except Exception:  # the error that matters was reported above
                log.exception("load worker %d: closing its sink failed", worker)
        results.close()
        results.join_thread()  # every message is in the pipe before the process ends


def _wait_for(source: Any, halt: Any, parent: int) -> Any:
    """The next item of a multiprocessing queue; None once the parent halted or died."""
    while not halt.is_set() and os.getppid() == parent:
        try:
            return source.get(timeout=0.2)
        except queue.Empty:
            continue
    return None


def _portable(exc: BaseException) -> BaseException:
    """``exc`` itself if it survives pickling, else an error that carries its text."""
    try:
        pickle.loads(pickle.dumps(exc))  # noqa: S301 - our own bytes, just made
    except Exception:
        kind = TerminalWorkerError if isinstance(exc, TerminalError) else WorkerError
        return kind(f"{type(exc).__name__}: {exc}")
    return exc


# --- the parent's side ------------------------------------------------------------------------

class WorkerPool:
    """``count`` worker processes, the task queue they share and the messages they send."""

    def __init__(self, count: int, sink_factory: SinkFactory) -> None:
        context = multiprocessing.get_context("spawn")
        self.setups: Any = context.Queue()
        self.tasks: Any = context.Queue()
        self.results: Any = context.Queue()
        self.halt: Any = context.Event()
        self.catalog = SharedGeneration(context, 0)
        self.claims_lock: Any = context.Lock()  # guards the first reads' claims (read_marks.py)
        self.first: FirstClaims | None = None  # those claims, from configure()
        self.processes: list[SpawnProcess] = [
            context.Process(target=worker_main, name=f"pgcdc-load-{i}", daemon=True,
                            args=(i, sink_factory, self.setups, self.tasks, self.results,
                                  self.halt, self.catalog, self.claims_lock))
            for i in range(count)]
        self._stopped = False
        self.exited: set[int] = set()  # workers that reported their end (Exited or WorkerFailed)
        self.peak_rss: list[int] = []  # KiB, of each worker that exited normally
        self._pending: deque[Message] = deque()  # read while checking for dead workers
        self._checked = 0.0

    def start(self) -> WorkerPool:
        for process in self.processes:
            process.start()
        return self

    def configure(self, setup: WorkerSetup, catalog_generation: int,
                  first_due: bool = False, tables_due: tuple[bool, ...] | None = None
                  ) -> FirstClaims:
        """The snapshot to import and the rest of the load's setup, to every worker;
        ``first_due``: this attempt writes the load's first read, ``tables_due``: the
        first read of each table of ``setup.oids`` (read_marks.py).  The claims of those
        first reads, shared with the workers."""
        self.catalog.bump_to(catalog_generation)
        if self.first is not None:
            self.first.close(unlink=True)
        due = tables_due if tables_due is not None else (False,) * len(setup.oids)
        self.first = FirstClaims.create(self.claims_lock, first_due, due)
        setup = replace(setup, claims=self.first.name)
        for _ in self.processes:
            self.setups.put(setup)
        return self.first

    def wait_ready(self, timeout: float) -> None:
        """Until every worker imported the snapshot and locked the tables; raises its error."""
        ready: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(ready) < len(self.processes):
            for message in self.messages(0.2):
                if isinstance(message, WorkerFailed):
                    raise message.error
                if isinstance(message, Ready):
                    ready.add(message.worker)
            if time.monotonic() > deadline:
                msg = (f"{len(self.processes) - len(ready)} load workers did not import the "
                       f"snapshot within {timeout:.0f} s; run again: the load resumes")
                raise WorkerDiedError(msg)

    def submit(self, tasks: list[ChunkTask]) -> None:
        """Every task (without its decoder: a worker builds its own), then one end mark per
        worker."""
        for number, task in enumerate(tasks):
            self.tasks.put((number, replace(task, decoder=None)))
        for _ in self.processes:
            self.tasks.put(None)

    def run(self, tasks: list[ChunkTask], stop: threading.Event, *,
            on_rows: Callable[[ChunkTask, int], None],
            on_done: Callable[[ChunkTask, int, ChangeEvent | None], None],
            on_tick: Callable[[], None]) -> None:
        """Every task through the workers, until each one ended; then the first error.

        ``on_done(task, rows, head)`` for each chunk a worker made durable but its head
        (read_marks.py), also after an error
        (the other workers are halted; what they still report done is durable);
        ``on_rows`` as rows are written; ``on_tick`` about five times a second.
        """
        self.submit(tasks)
        error: BaseException | None = None
        while self.running:
            if stop.is_set():
                self.halt.set()
            try:
                for message in self.messages(0.2):
                    if isinstance(message, Rows):
                        on_rows(tasks[message.task], message.rows)
                    elif isinstance(message, Done):
                        on_done(tasks[message.task], message.rows, message.head)
                    elif isinstance(message, Exited):
                        self.peak_rss.append(message.peak_rss)
                    elif isinstance(message, WorkerFailed):
                        error = error or message.error
                        self.halt.set()
            except WorkerDiedError as exc:
                error = error or exc
                self.halt.set()
            on_tick()
        if error is not None:
            raise error

    @property
    def running(self) -> bool:
        return len(self.exited) < len(self.processes)

    def messages(self, timeout: float) -> Iterator[Message]:
        """What arrived within ``timeout`` seconds (at least one wait).  Between messages (at
        most every 0.2 s) and at the end, a check that every worker that ended said so:
        :class:`WorkerDiedError` for one that did not (killed, or a crash in C)."""
        message = self._next(timeout)
        while message is not None:
            if isinstance(message, Exited | WorkerFailed):
                self.exited.add(message.worker)
            yield message
            if time.monotonic() - self._checked >= 0.2:
                self._check_alive()
            message = self._next(0)
        self._check_alive()

    def _next(self, timeout: float) -> Message | None:
        if self._pending:
            return self._pending.popleft()
        try:
            message: Message = (self.results.get(timeout=timeout) if timeout > 0
                                else self.results.get_nowait())
        except queue.Empty:
            return None
        return message

    def _check_alive(self) -> None:
        """A worker writes its last message before it ends, and a message is one atomic pipe
        write: once its exit code is known, everything it said is in the pipe.  Read what is
        there (kept for :meth:`messages`), and whoever ended without a word died."""
        self._checked = time.monotonic()
        ended = [n for n, p in enumerate(self.processes)
                 if n not in self.exited and p.exitcode is not None]
        if not ended:
            return
        while True:
            try:
                self._pending.append(self.results.get_nowait())
            except queue.Empty:
                break
        said = {m.worker for m in self._pending if isinstance(m, Exited | WorkerFailed)}
        for number in ended:
            if number not in said:
                self.exited.add(number)
                process = self.processes[number]
                msg = (f"load worker {number} (pid {process.pid}) ended with exit code "
                       f"{process.exitcode} before reporting; the chunks it did not report are "
                       "not done: run again, the load resumes")
                raise WorkerDiedError(msg)

    def stop(self, timeout: float = 30.0) -> None:
        """Halt every worker, wait for them, end what does not end (once)."""
        if self._stopped:
            return
        self._stopped = True
        self.halt.set()
        deadline = time.monotonic() + timeout
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:
                log.warning("load worker %s did not stop within %.0f s; terminated",
                            process.name, timeout)
                process.terminate()
                process.join(5)
        if self.first is not None:
            self.first.close(unlink=True)
            self.first = None
        self.setups.cancel_join_thread()
        self.tasks.cancel_join_thread()
        self.results.cancel_join_thread()
