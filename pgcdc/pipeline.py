"""The streaming loop: replication slot -> reorder buffer -> typed events -> sink -> flush LSN.

The reorder buffer (decoder/reorder.py) hands over each transaction once it has
committed, whole (streamed and prepared ones kept until then); the pipeline turns
its messages into the catalog's versions and typed events (the builder, the row
decoders) and gives them to the sink.

The order of acknowledgement (sinks/sink.py) happens in
:meth:`Pipeline._send_status`, through :class:`pgcdc.acknowledgement.Acknowledger`:
the flush LSN sent to PostgreSQL is the sink's durable LSN and nothing else,
capped below any prepared transaction still waiting for its COMMIT PREPARED.  A
keepalive's ``wal_end`` may move an idle slot forward only when no transaction is
open, none is pending and nothing is in flight; while idle, each status update
asks the server for such a keepalive, so a slot whose publication sees no changes
still advances while other tables write WAL.

Protocol: the highest version the server speaks (1 on PostgreSQL 13, 2 on 14,
3 on 15, 4 on 16+), with ``streaming`` (``parallel`` on v4) and ``messages``;
``two_phase`` when the slot was created with it.  A lost connection is retried
with backoff from the durable position; what was in progress is dropped,
because the server sends it again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Set
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from core import failpoints
from core.errors import PgcdcError, TerminalError, TransientError
from decoder import pgoutput as pg
from decoder.change import (
    TRUNCATE,
    ChangeEvent,
    RowDecoder,
    decode_change,
)
from decoder.errors import ConnectionLostError, DecodeError
from decoder.lsn import format_lsn
from decoder.names import quoted_table_name
from decoder.progress import ProgressStore, check_against_slot
from decoder.reorder import ReorderBuffer, Transaction
from decoder.replication import ReplicationConnection, XLogData, identify_system
from decoder.restart import StateFiles, start_over
from decoder.slot import (
    check_wal_level,
    drop_slot,
    ensure_slot,
    slot_info,
)
from decoder.transfer import choose_binary
from loads.incremental import PREFIX as WATERMARK_PREFIX
from loads.incremental import IncrementalSnapshots
from loads.load_state import COMPLETE, LoadStateStore
from pgcdc.acknowledgement import HEARTBEAT_PREFIX, Acknowledger
from pgcdc.memory import Trimmer
from pgcdc.sink_watch import SinkWatch
from pgcdc.start_checks import checked_publication
from sinks.acks import DeliveryError
from sinks.sink import Sink
from snapshot_builder import ddl
from snapshot_builder.builder import BuilderState, Departure, SnapshotBuilder
from snapshot_builder.catalog import TableVersion
from snapshot_builder.history import CatalogError, CatalogHistory, HistoryFile
from snapshot_builder.row_decoders import RowDecoders

log = logging.getLogger(__name__)


@dataclass
class PipelineConfig:
    dsn: str
    slot: str = "pgcdc"
    publication: str = "pgcdc"
    tables: list[str] | None = None
    create_slot: bool = True
    create_publication: bool = True
    two_phase: bool = True  # for a slot pgcdc creates
    status_interval: float = 1.0
    protocol_version: int | None = None  # None: the highest the server supports
    streaming: bool = True
    spill_memory: int = 64 << 20  # bytes of pending transactions kept in memory
    spill_directory: str | None = None
    decoding_work_mem: str | None = None  # the walsender's logical_decoding_work_mem
    # failures in a row before run() gives up (a lost connection, a failed delivery); 0: never
    max_retries: int = 0
    retry_max_delay: float = 30.0  # the cap of the exponential backoff between attempts
    # seconds a stop (SIGTERM) waits for the sink to make what it holds durable; what is
    # still undelivered then is dropped (the slot stays at the durable position)
    shutdown_grace: float = 10.0
    # seconds without an acknowledgement while the sink holds messages: a stall (warned once,
    # counted, /health/ready 503; pgcdc/sink_watch.py); 0: not watched
    sink_stall_seconds: float = 30.0
    progress_file: Path | None = None  # where the durable position is stored; None: nowhere
    catalog_dir: Path | None = None  # the persisted catalog history; None: in memory only
    # the initial load's and incremental snapshots' state files, named with the progress file
    # and catalog folder when changes were lost (decoder/restart.py)
    load_state: Path | None = None
    incremental_state: Path | None = None
    capture_ddl: bool = True  # install the DDL event trigger when allowed (needs superuser)
    # the WAL-retention guard: the slot's lag (server WAL end minus confirmed_flush_lsn),
    # sampled over a normal connection at most every lag_interval seconds
    max_lag_bytes: int | None = None
    on_lag: str = "warn"  # "warn" (log and count) or "stop" (raise LagLimitError)
    lag_interval: float = 5.0
    memory_trim_interval: float = 60.0  # seconds between malloc_trim calls (pgcdc/memory.py)
    sample_lag: bool = False  # sample the lag even without a limit (for metrics)
    # seconds between heartbeats written into the WAL (pgcdc/acknowledgement.py); 0: off
    heartbeat_interval: float = 0.0
    # a replication connection silent this long is dead (PostgreSQL's wal_receiver_timeout);
    # after half of it, pgcdc asks the server for a keepalive; 0: never
    receive_timeout: float = 60.0
    # pgoutput's origin option (PostgreSQL 16+): "any" (the server's default) or "none"
    origin: str | None = None
    # pgoutput's binary option (PostgreSQL 14+): "auto", "on" or "off" (decoder/transfer.py)
    binary: str = "auto"


@dataclass
class Progress:
    events: int = 0
    transactions: int = 0
    received_lsn: int = 0
    durable_lsn: int = 0
    reconnects: int = 0
    streamed_transactions: int = 0
    aborted_transactions: int = 0
    by_table_op: dict[tuple[str, str], int] = field(default_factory=dict)
    # sampled at each status update (read by the metrics thread; written by the loop only)
    streaming: bool = False
    last_status_at: float = 0.0  # time.monotonic() of the last status update sent
    in_flight: int = 0
    buffered_bytes: int = 0
    lag_bytes: int | None = None  # the slot's lag, when sampled (PipelineConfig.sample_lag)
    lag_exceeded: int = 0  # lag samples above max_lag_bytes
    errors: dict[str, int] = field(default_factory=dict)  # by exception class name
    heartbeats_sent: int = 0
    heartbeats_received: int = 0  # back through the slot (any pgcdc's, of this database)
    undelivered_at_stop: int = 0  # events the sink still held when the grace period ended
    sink_stalled: bool = False  # no acknowledgement for sink_stall_seconds (pgcdc/sink_watch.py)
    sink_stalls: int = 0
    # tables whose rows a DDL changed without row changes in the WAL: read again
    # (an incremental snapshot was requested), or not followed (a warning said how)
    rewrites: dict[str, int] = field(default_factory=dict)

    def count_rewrite(self, table: TableVersion, action: str) -> None:
        """One more rewrite of ``table``, by what pgcdc did (``read_again`` or
        ``not_followed``), under the key ``<schema>.<table>:<action>`` the metrics split."""
        key = f"{table.qualified_name}:{action}"
        self.rewrites[key] = self.rewrites.get(key, 0) + 1

    @property
    def by_table(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for (table, _op), count in list(self.by_table_op.items()):
            out[table] = out.get(table, 0) + count
        return out


def _name(table: TableVersion) -> str:
    """The table's quoted, schema-qualified name."""
    return quoted_table_name(table.schema, table.name)


class OriginUnsupportedError(TerminalError):
    """The origin option was asked of a server older than PostgreSQL 16."""


class LoadUnfinishedError(TerminalError):
    """The slot's initial load began and did not finish: streaming would move the slot on."""


class ShutdownIncompleteError(TransientError):
    """Stopping, the sink did not make everything durable within the grace period: what it
    held was dropped, and the slot stays at the durable position (nothing is lost; the next
    start sends it again)."""

    def __init__(self, undelivered: int, grace: float, durable_lsn: int,
                 cause: str | None = None) -> None:
        why = f" ({cause})" if cause else ""
        super().__init__(
            f"stopped with {undelivered} events not acknowledged by the sink within the "
            f"{grace:g} s grace period{why}; the slot stays at {format_lsn(durable_lsn)}, "
            "the durable position, and the next start sends them again (nothing is lost); "
            "check the sink, or raise --shutdown-grace-seconds")
        self.undelivered = undelivered


def retry_delay(attempt: int, cap: float) -> float:
    """Seconds to wait before retry ``attempt`` (1, 2, ...): 0.5 s doubling, at most ``cap``."""
    return min(cap, 0.5 * 2.0 ** min(attempt - 1, 30))


@dataclass
class Backoff:
    """Failures in a row of something pgcdc tries again (a connection, its start, a session)
    and the wait before the next try: :func:`retry_delay`, up to ``max_retries`` failures in
    a row (``--max-retries``; 0: no limit)."""

    max_retries: int
    max_delay: float
    failures: int = 0

    def failed(self) -> float | None:
        """One more failure: the seconds to wait before the next try, or None (logged) when
        it is one too many and the caller gives up."""
        self.failures += 1
        if self.max_retries and self.failures > self.max_retries:
            log.error("giving up after %d failures in a row (--max-retries %d)", self.failures,
                      self.max_retries)
            return None
        return retry_delay(self.failures, self.max_delay)

    @property
    def attempt(self) -> str:
        """``attempt 3 of 5``, or ``attempt 3, retrying until stopped``: for the log."""
        limit = f" of {self.max_retries}" if self.max_retries else ", retrying until stopped"
        return f"attempt {self.failures}{limit}"


def protocol_for(server_version: int) -> int:
    """The highest pgoutput protocol version a server supports."""
    if server_version >= 160000:
        return 4
    if server_version >= 150000:
        return 3
    if server_version >= 140000:
        return 2
    return 1


class Pipeline:
    def __init__(self, config: PipelineConfig, sink: Sink, *,
                 incremental: IncrementalSnapshots | None = None) -> None:
        self.config = config
        self.sink = sink
        # incremental snapshots (loads/incremental.py): sees every event and watermark
        self._incremental = incremental
        self.builder = SnapshotBuilder()
        if incremental is not None:  # its rows go out with the stream's versions
            incremental.catalog = lambda oid: self.builder.catalog.table(oid)
        self.progress = Progress()
        # hands over each transaction once committed, whole (streamed, prepared, spilled)
        self.reorder = ReorderBuffer(self, memory_limit=config.spill_memory,
                                     directory=config.spill_directory)
        self._ordinal = 0  # of the current transaction's next event
        # the table version and row decoder the next change of each table uses
        self._decoders = RowDecoders(lambda: self.builder, self._connection)
        self._two_phase = False
        self._store = ProgressStore(config.progress_file) if config.progress_file else None
        self._binary_on = False  # chosen by prepare() from config.binary
        self._catalog_conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._attach_xmax = 0
        self._catalog_published = -1  # every history entry goes to the sink once per run
        self._live: ReplicationConnection | None = None  # the session's stream
        self._last_ping = 0.0  # the last keepalive request of a silent connection
        self._trimmer = Trimmer(config.memory_trim_interval)
        # the flush position and the status updates that carry it
        self._acks = Acknowledger(config, sink, self.progress, self._store,
                                  lambda: psycopg.connect(config.dsn, autocommit=True))
        self.watch: SinkWatch | None = None  # the sink's stall watch, while run() runs

    # --- set-up ---------------------------------------------------------------------------

    def prepare(self) -> None:
        """Check the server and create the publication and slot as configured, holding the
        progress file's lock (ProgressStore.lock) meanwhile; run() takes it again until it
        ends.  A pipeline only prepared (to create the slot) holds nothing after."""
        try:
            self._prepare()
        finally:
            if self._store is not None:
                self._store.unlock()

    def _prepare(self) -> None:
        cfg = self.config
        identity = self._acks.identity = identify_system(cfg.dsn)
        if self._store is not None:
            self._store.lock()  # one pgcdc per progress file while it checks and creates
        with psycopg.connect(cfg.dsn, autocommit=True) as conn:
            check_wal_level(conn)
            if self._store is not None:
                stored = self._store.load()
                files = StateFiles(self._store.path, cfg.catalog_dir, cfg.load_state,
                                   cfg.incremental_state)
                check_against_slot(stored, slot_info(conn, cfg.slot), slot_name=cfg.slot,
                                   system_identifier=identity[0],
                                   database=identity[1], path=self._store.path, files=files)
                self._acks.stored = stored.durable_lsn if stored else -1
            # every check before anything is created: a failed one rolls the publication
            # back, and the slot comes after them (pgcdc/start_checks.py)
            checked_publication(conn, cfg.publication, cfg.tables,
                                create=cfg.create_publication, capture_ddl=cfg.capture_ddl)
            existed = slot_info(conn, cfg.slot) is not None
            if existed:
                self._check_load_finished(identity)
            self._check_catalog_folder(existed)
            info = ensure_slot(conn, cfg.slot, create=cfg.create_slot, two_phase=cfg.two_phase)
            try:
                self._start_builder(conn, existed, info.confirmed_flush_lsn or 0)
                self._binary_on = choose_binary(cfg.binary, conn, cfg.publication,
                                                self._decoders.binary)
            except BaseException:
                if not existed:
                    self._drop_created_slot()
                raise
        self._two_phase = info.two_phase
        # Crash recovery restores a slot as its last checkpoint saved it, so the slot may
        # be behind what pgcdc stored (never ahead: check_against_slot); streaming starts
        # from the stored position, and the server skips what committed before it.
        self._acks.start(max(info.confirmed_flush_lsn or 0, self._acks.stored))

    def _drop_created_slot(self) -> None:
        """This start created the slot and then failed: drop it, so that it holds no WAL,
        unless the catalog history it began is already stored (the next start resumes
        both)."""
        cfg = self.config
        if cfg.catalog_dir is not None and HistoryFile(cfg.catalog_dir).holds_history():
            return
        try:
            with psycopg.connect(cfg.dsn, autocommit=True) as conn:
                drop_slot(conn, cfg.slot)
            log.info("dropped replication slot %s, created by this failed start", cfg.slot)
        except psycopg.Error as exc:
            log.warning("could not drop replication slot %s, created by this failed start "
                        "(%s): drop it with pgcdc slot drop", cfg.slot, exc)

    @property
    def binary(self) -> bool:
        """Whether the stream asks for binary values (``config.binary``, chosen by prepare())."""
        return self._binary_on

    def _check_catalog_folder(self, slot_exists: bool) -> None:
        """The catalog folder holds this slot's history, or none yet (checked before a slot
        is created, so a refusal leaves nothing behind)."""
        cfg = self.config
        if not cfg.catalog_dir:
            return
        folder = HistoryFile(cfg.catalog_dir)
        folder.claim(system_identifier=self._acks.identity[0],
                     database=self._acks.identity[1], slot=cfg.slot)
        if not slot_exists and folder.holds_history():
            msg = (f"the catalog folder {cfg.catalog_dir} holds the history of an earlier "
                   f'slot "{cfg.slot}", which is gone: its catalog may miss DDL made since, '
                   "so a new slot's catalog must be read afresh; "
                   + start_over(cfg.slot, StateFiles(cfg.progress_file, cfg.catalog_dir,
                                                     cfg.load_state, cfg.incremental_state),
                                drop_slot=False))
            raise CatalogError(msg)

    def _check_load_finished(self, identity: tuple[str, str]) -> None:
        """The slot's initial load, if its state file says one began, is complete (or was
        handed to incremental snapshots): streaming would otherwise move the slot past the
        snapshot the load reads under, and the rows of the tables it has not read would
        never come."""
        cfg = self.config
        if cfg.load_state is None:
            return
        state = LoadStateStore(cfg.load_state).load()
        if state is None or state.status == COMPLETE or state.slot != cfg.slot \
                or (state.system_identifier, state.database) != identity:
            return
        done = sum(t.complete for t in state.tables.values())
        msg = (f"the initial load of slot {cfg.slot!r} is unfinished ({cfg.load_state}: "
               f"{done} of {len(state.tables)} tables complete): streaming now would move the "
               "slot past the snapshot the load reads under, and the tables it has not read "
               "would never be whole downstream. Finish the load first, as it was started "
               "(`pgcdc snapshot`, `pgcdc snapshot --lake`, or `pgcdc run --initial-load`: "
               "each resumes it), or hand the rest to incremental snapshots while streaming "
               "(`pgcdc run --initial-load --incremental-snapshots`)")
        raise LoadUnfinishedError(msg)

    def _start_builder(self, conn: psycopg.Connection[tuple[object, ...]], slot_existed: bool,
                       lsn: int) -> None:
        """Load or begin the catalog history and choose the builder's starting state."""
        cfg = self.config
        capture = False
        if cfg.capture_ddl:
            if not ddl.current(conn):  # an older installation captures tables only: upgrade
                try:
                    ddl.install(conn)
                except ddl.DdlCaptureError as exc:
                    log.warning("%s", exc)
            capture = ddl.installed(conn)
            if capture:
                ddl.follow(conn, cfg.publication)
        history = HistoryFile(cfg.catalog_dir).load() if cfg.catalog_dir else CatalogHistory()
        self.builder = SnapshotBuilder(history, publication=cfg.publication)
        if history.latest.version > 0:
            # a DDL transaction stored but not confirmed before a crash is recognised
            self.builder.resume(max(lsn, self._acks.stored))
            self._attach_xmax = self.builder.attach_xmax
            return
        baseline = ddl.baseline(conn, cfg.publication) if capture else []
        if not slot_existed:
            self.builder.start_consistent(baseline, lsn)
            return
        row = conn.execute("SELECT pg_snapshot_xip(pg_current_snapshot())::text::bigint")\
            .fetchall()
        running = [int(str(r[0])) for r in row]
        self._attach_xmax = max(running, default=0)
        self.builder.attach(baseline, lsn, frozenset(x & 0xFFFFFFFF for x in running),
                            xmax=self._attach_xmax)

    def _check_running_finished(self) -> None:
        """FULL_SNAPSHOT ends once every transaction running at attach has finished."""
        if self._catalog_conn is None or self._catalog_conn.closed:
            self._catalog_conn = psycopg.connect(self.config.dsn, autocommit=True)
        row = self._catalog_conn.execute(
            "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint").fetchone()
        if row is not None and int(str(row[0])) > self._attach_xmax:
            self.builder.running_finished()

    def _options(self, server_version: int) -> dict[str, str]:
        version = self.config.protocol_version or protocol_for(server_version)
        options = {"proto_version": str(version), "publication_names": self.config.publication}
        if version >= 2:
            options["messages"] = "true"
            if self.config.streaming:
                options["streaming"] = "parallel" if version >= 4 else "on"
        if version >= 3 and self._two_phase:
            options["two_phase"] = "on"
        if self._binary_on:
            options["binary"] = "true"
        if self.config.origin is not None:
            if server_version < 160000:
                msg = (f"origin = {self.config.origin!r} needs PostgreSQL 16 or later (the "
                       f"server is {server_version // 10000}); remove the origin setting, or "
                       "filter on the Origin messages downstream")
                raise OriginUnsupportedError(msg)
            options["origin"] = self.config.origin  # "none": only changes made here, not
            # those a replication apply worker wrote (two-way replication without loops)
        return options

    # --- the loop -------------------------------------------------------------------------

    def run(self, *, stop: threading.Event | None = None, until_lsn: int | None = None,
            on_progress: Callable[[Progress], None] | None = None) -> Progress:
        """Stream until ``stop`` is set or everything up to ``until_lsn`` is durable.

        A lost connection (PostgreSQL unreachable included) or a failed delivery is retried
        with capped exponential backoff (:func:`retry_delay`), from the durable position,
        forever or up to ``max_retries`` failures in a row; after a failed delivery the sink
        is reset first (a Kafka sink recreates its producer).  Each attempt is logged.

        Stopping waits at most ``shutdown_grace`` seconds for the sink; what is not durable
        then is dropped and :class:`ShutdownIncompleteError` says how much.  A stuck sink is
        watched from a thread (pgcdc/sink_watch.py); the WAL-retention guard it trips while
        the sink is stuck is raised here.
        """
        stop = stop or threading.Event()
        if self._store is not None:
            self._store.lock()  # one pgcdc per progress file, until run() ends
        watch = self.watch = SinkWatch(self.config, self.sink, self.progress, stop).start()
        try:
            progress = self._run(stop, until_lsn, on_progress)
        except PgcdcError as exc:
            if not isinstance(exc, ConnectionLostError | DeliveryError):  # counted when retried
                self._count_error(exc)
            self._drop_undelivered()
            if watch.failure is not None and exc is not watch.failure:
                raise watch.failure from exc
            raise
        finally:
            watch.close()
            if self._store is not None:
                self._store.unlock()
        if watch.failure is not None:
            self._count_error(watch.failure)
            raise watch.failure
        return progress

    def _run(self, stop: threading.Event, until_lsn: int | None,
             on_progress: Callable[[Progress], None] | None) -> Progress:
        backoff = Backoff(self.config.max_retries, self.config.retry_max_delay)
        durable_at_failure = -1
        while True:
            try:
                self._session(stop, until_lsn, on_progress)
                return self.progress
            except (ConnectionLostError, DeliveryError, psycopg.OperationalError) as exc:
                self._count_error(exc)
                failed = 0  # events a failed delivery drops (at least the one that failed)
                if isinstance(exc, DeliveryError):
                    failed = max(1, self.sink.in_flight())
                    self.sink.reset()
                # count failures in a row: progress since the last one starts over
                if self._acks.flushed > durable_at_failure:
                    backoff.failures = 0
                durable_at_failure = self._acks.flushed
                delay = backoff.failed()
                if delay is None:
                    raise
                if not stop.is_set():
                    log.warning("%s; reconnecting in %.1f s (%s)", str(exc).strip(), delay,
                                backoff.attempt)
                if stop.is_set() or stop.wait(delay):
                    self._settle(str(exc).strip(), dropped=failed)
                    return self.progress
                self._reset_in_progress()
                self.progress.reconnects += 1

    def _settle(self, cause: str, *, dropped: int) -> None:
        """Stopping without a session (it failed): the sink gets ``shutdown_grace`` seconds to
        deliver what it still holds from the failed one; what it cannot is dropped, as are the
        ``dropped`` events of a failed delivery."""
        grace = self.config.shutdown_grace
        deadline = time.monotonic() + grace
        while self.sink.in_flight() and (remaining := deadline - time.monotonic()) > 0:
            self.sink.flush(min(remaining, 0.5))
        undelivered = self.sink.in_flight() + dropped
        if undelivered:
            self.progress.undelivered_at_stop = undelivered
            self.sink.reset()  # closing the sink must not wait for it again
            raise ShutdownIncompleteError(undelivered, grace, self._acks.flushed, cause)

    def _drop_undelivered(self) -> None:
        """Stopping on an error: the sink gets ``shutdown_grace`` seconds to make durable what
        it holds, then the rest is dropped (the slot stays at the durable position), so that
        closing it does not wait again."""
        deadline = time.monotonic() + self.config.shutdown_grace
        while self.sink.in_flight() and (remaining := deadline - time.monotonic()) > 0:
            self.sink.flush(min(remaining, 0.5))
        if self.sink.in_flight():
            log.warning("stopping: %d events the sink did not acknowledge are dropped; the "
                        "slot stays at %s, the durable position", self.sink.in_flight(),
                        format_lsn(self._acks.flushed))
            self.sink.reset()

    def _count_error(self, exc: Exception) -> None:
        kind = type(exc).__name__
        self.progress.errors[kind] = self.progress.errors.get(kind, 0) + 1

    def _session(self, stop: threading.Event, until_lsn: int | None,
                 on_progress: Callable[[Progress], None] | None) -> None:
        stream = ReplicationConnection(self.config.dsn, extra_options=self._session_settings())
        stream.connect()
        self._live = stream
        try:
            stream.start(self.config.slot, self._acks.flushed,
                         self._options(stream.server_version))
            self.progress.streaming = True
            last_report = 0.0
            heard = time.monotonic()
            feed = self.reorder.feed  # slot -> reorder buffer -> on_change / on_message ...
            while not stop.is_set():
                # A batch at a time: polling the sink and the status clock once per batch.
                received = self.progress.received_lsn
                batch = stream.read_batch(timeout=0.1)
                if batch:
                    heard = time.monotonic()
                    self._decoders.check()  # the catalog generation, once per batch
                else:
                    self._check_silence(stream, heard)
                for message in batch:
                    received = max(received, message.wal_end)
                    if isinstance(message, XLogData):
                        feed(message.payload, message.wal_start)
                    else:
                        self._acks.keepalive(message.wal_end)
                        if message.reply_requested:
                            self.progress.received_lsn = received
                            self._send_status(stream, force=True)
                self.progress.received_lsn = received
                self.sink.poll(0)
                self._send_status(stream)
                now = time.monotonic()
                self._trimmer.tick(now)
                if on_progress is not None and now - last_report >= 1.0:
                    on_progress(self.progress)
                    last_report = now
                if until_lsn is not None and self._acks.flushed >= until_lsn:
                    break
            self._drain(stream, stopping=stop.is_set())
            stream.finish()
        finally:
            self.progress.streaming = False
            stream.close()
            self._acks.close()
            if self._catalog_conn is not None:
                self._catalog_conn.close()
                self._catalog_conn = None

    def _drain(self, stream: ReplicationConnection, *, stopping: bool) -> None:
        """The end of a session: wait for the sink to make what it holds durable, confirming
        as it goes, for at most ``shutdown_grace`` seconds when ``stopping`` (30 s once
        ``until_lsn`` is durable).  What is not durable then is dropped: the sink is reset, so
        that closing it does not wait again, and the slot stays at the durable position.
        Stopping, that raises :class:`ShutdownIncompleteError`; past ``until_lsn`` it is only
        what came after the target."""
        grace = self.config.shutdown_grace if stopping else 30.0
        deadline = time.monotonic() + grace
        cause = None
        while True:
            try:
                self._send_status(stream, force=True)  # raises the sink's delivery error
            except DeliveryError as exc:
                cause = str(exc.__cause__ or exc)
                break
            remaining = deadline - time.monotonic()
            if self.sink.in_flight() == 0 or remaining <= 0:
                break
            self.sink.flush(min(remaining, 0.5))
        undelivered = self.sink.in_flight()
        if undelivered == 0 and cause is None:
            return
        durable = self._acks.flushed
        self.sink.reset()
        if not stopping:
            log.info("until_lsn is durable; %d events after it are dropped", undelivered)
            return
        self.progress.undelivered_at_stop = undelivered
        raise ShutdownIncompleteError(undelivered, grace, durable, cause)

    def _check_silence(self, stream: ReplicationConnection, heard: float) -> None:
        """Notice a replication connection that died without a reset (a firewall or NAT
        forgot the flow): after half of ``receive_timeout`` without a message, ask for a
        keepalive; after all of it, the connection is lost (and reconnected)."""
        timeout = self.config.receive_timeout
        silent = time.monotonic() - heard
        if timeout <= 0 or silent < timeout / 2:
            return
        if silent >= timeout:
            msg = (f"no message from the server for {silent:.0f} s (receive_timeout); "
                   "the connection is considered dead")
            raise ConnectionLostError(msg)
        now = time.monotonic()
        if now - self._last_ping >= 1.0:
            self._last_ping = now
            flushed = self._acks.flushed  # already confirmed: a ping claims nothing new
            stream.send_status(self.progress.received_lsn, flushed, flushed, reply=True)

    def _session_settings(self) -> dict[str, str]:
        if self.config.decoding_work_mem:
            return {"logical_decoding_work_mem": self.config.decoding_work_mem}
        return {}

    def _reset_in_progress(self) -> None:
        """Before a reconnect: the next session starts at the durable position, so what was
        decoded past it comes again, DDL the history already holds included."""
        self._acks.reset()
        self.builder.rollback()
        self.builder.replay_from(self._acks.flushed)
        self.reorder.reset()

    # --- messages -------------------------------------------------------------------------

    # What the reorder buffer (decoder/reorder.py) hands over: committed transactions, one
    # at a time, whole; the messages outside any transaction in between.

    def on_begin(self, transaction: Transaction) -> None:
        self._ordinal = 0
        if transaction.streamed:
            self.progress.streamed_transactions += 1

    def on_abort(self) -> None:
        self.progress.aborted_transactions += 1

    def on_replay_tick(self) -> None:
        """A long replay still answers the server (wal_sender_timeout)."""
        if self._live is not None:
            self.sink.poll(0)
            self._send_status(self._live)

    def on_prepared_schema(self, message: pg.Relation | pg.Type, lsn: int) -> None:
        """A Relation or Type inside a prepared transaction, at its PREPARE: pgoutput counts
        a schema sent there as sent for every later transaction, so it describes the table
        from here on; a table the transaction's own DDL changed stays as the catalog has it
        until COMMIT PREPARED replays the transaction (SnapshotBuilder.on_relation)."""
        if isinstance(message, pg.Relation):
            self._describe(self.builder.on_relation(message, prepared=True), lsn)
        else:
            self.on_message(message, lsn)

    def on_message(self, message: pg.Message, lsn: int) -> None:
        """Relation, Type, Truncate, Origin and logical messages, streamed or not."""
        txn = self.reorder.current
        if isinstance(message, pg.Relation):
            self._describe(self.builder.on_relation(
                message, xid=txn.xid if txn else None), lsn)
        elif isinstance(message, pg.Truncate):
            for oid in message.relation_oids:
                self._emit(TRUNCATE, self._table(oid), None, None, (), lsn)
        elif isinstance(message, pg.Type):
            self.builder.on_type(message)
        elif isinstance(message, pg.LogicalMessage) and message.prefix == ddl.PREFIX:
            if message.transactional and txn is not None:
                self._on_ddl(message, lsn)
        elif isinstance(message, pg.LogicalMessage) and message.prefix == WATERMARK_PREFIX:
            if self._incremental is not None and not message.transactional:
                self._incremental.on_watermark(message.content, lsn)
        elif isinstance(message, pg.LogicalMessage):
            if message.prefix != HEARTBEAT_PREFIX:
                if not message.transactional:
                    txn = None
                self.sink.write_message(message, lsn=lsn,
                                        commit_lsn=txn.commit_lsn if txn else None,
                                        xid=txn.xid if txn else None)
            elif not message.transactional:  # not for the sink; a position for the slot
                self._acks.heartbeat(lsn)
        elif isinstance(message, pg.Origin):
            log.debug("origin %s at %s", message.name, format_lsn(lsn))
        else:
            msg = f"unexpected {type(message).__name__} inside a transaction"
            raise DecodeError(msg, tag=None, offset=0)

    def _describe(self, table: TableVersion, lsn: int) -> None:
        """From here on, changes of this table decode with this version, published with the
        LSN it counts from.  A Relation message carries none (PostgreSQL writes it with an
        invalid LSN, 0, as every message but a transaction's last): its version counts from
        the commit of the transaction it describes (from the stream's position for one being
        prepared), never from 0, which would order it before every version published
        earlier (an initial load's, say)."""
        if not lsn:
            txn = self.reorder.current
            lsn = txn.commit_lsn if txn is not None else self.progress.received_lsn
        if self._decoders.describe(table):
            described = self._decoders.get(table.oid)  # its domain columns' base types named
            logical = getattr(self.sink, "logical", None)  # typed Avro (not in prepare())
            if logical is not None:  # a composite's attributes as the stream decodes them
                logical.catalog = self.builder.type
            self.sink.publish_table(described[0] if described is not None else table, lsn)

    def _on_ddl(self, message: pg.LogicalMessage, lsn: int) -> None:
        """Captured DDL: the open transaction's next changes use the new definition."""
        changed = self.builder.on_ddl(message.content)
        self._decoders.check()  # its own DDL: at the change that made it
        for table in [*self.builder.take_retyped(), *([changed] if changed else [])]:
            if table.oid in self._decoders:  # a published table the stream already uses
                self._describe(table, lsn)

    def on_commit(self, end_lsn: int) -> None:
        txn = self.reorder.current
        if txn is not None:
            rewritten = self.builder.rewritten
            entered = self.builder.entered
            detached = self.builder.detach_partitions()
            before = {oid: self.builder.catalog.table(oid) for oid in rewritten}
            # persisted before the sink sees the commit: no event is acknowledged before
            # the catalog version it needs is durable
            self.builder.commit(txn.commit_lsn, txn.commit_time)
            if rewritten or entered:  # requested before the commit can be acknowledged
                self._read_again({**dict.fromkeys(entered, "entered the publication"),
                                  **rewritten}, txn.commit_lsn,
                                 whole={*entered, *self._rekeyed(before)})
            for departure in detached:
                self._detached(departure, txn.commit_lsn)
        for entry in self.builder.history.entries(after_version=self._catalog_published):
            self.sink.publish_catalog(entry.version, entry.lsn, entry.to_json())
            self._catalog_published = entry.version  # consumers rebuild catalog_at(lsn)
        self.sink.end_transaction(end_lsn)
        self.progress.transactions += 1

    def _rekeyed(self, before: dict[int, TableVersion | None]) -> set[int]:
        """The tables of ``before`` (their versions before the transaction) that had no key
        then or have none now, or whose key columns changed: their lake rows are not all
        found by the key they are read again by (a multiset's rows, an identity column
        added as the key), so they are read whole."""
        out = set()
        for oid, old in before.items():
            new = self.builder.table(oid)
            if old is None or new is None:
                continue
            if old.keyless or new.keyless or _key_of(old) != _key_of(new):
                out.add(oid)
        return out

    def _read_again(self, rewritten: dict[int, str], commit_lsn: int, *,
                    whole: Set[int] = frozenset()) -> None:
        """Tables whose stored rows a committed DDL changed with no row change in the WAL
        (a default given to existing rows, a rewrite): the stream alone would leave their
        old values downstream, so each published one is read again by an incremental
        snapshot (its read events carry the new values).  Requested before the commit is
        acknowledged, so a crash in between requests it again.  A table without a key is
        read whole (a truncate, then every row; see loads/incremental.py), and so is one in
        ``whole`` (a table put into the publication: its lake table, left from before it
        left the publication, may hold rows deleted since)."""
        for oid, reason in sorted(rewritten.items()):
            table = self.builder.table(oid)
            if table is None:
                continue  # dropped since
            name = _name(table)
            keyed = table.replica_identity in ("d", "i") and bool(table.key_columns)
            why = "" if keyed and oid not in whole else \
                " whole (" + ("no key" if not keyed else "rows may have left it") + ")"
            if self._incremental is not None:
                self._incremental.read_again(name, oid, whole=oid in whole)
                action = "read_again"
                log.info("DDL at %s changed the stored rows of %s (%s): reading it again%s",
                         format_lsn(commit_lsn), table.qualified_name, reason,
                         why and f"{why[:-1]}: its writers wait on a SHARE lock)")
            else:
                action = "not_followed"
                fix = ("run pgcdc with --incremental-snapshots to have it read again "
                       f"automatically{why}, or re-load the table")
                log.warning("DDL at %s changed the stored rows of %s (%s) without row "
                            "changes in the WAL: the stream does not carry the new values "
                            "and the table downstream differs from the source; %s",
                            format_lsn(commit_lsn), table.qualified_name, reason, fix)
            self.progress.count_rewrite(table, action)

    def _detached(self, departure: Departure, commit_lsn: int) -> None:
        """A partition detached from a table published via its root, dropped or truncated:
        its rows left the root with no row change in the WAL.  With incremental snapshots
        the root is read again whole (a truncate, then every row: a read by key would leave
        the rows that left) and a detached partition read again (published on its own now,
        it holds rows the stream never sent as its own).  A table the publication leaves out (a
        partition, or a root its publication does not publish via the root) ends its read
        quietly."""
        root, partition = departure.root, departure.partition
        what = (f"{departure.how} partition {partition.qualified_name} "
                f"{'from' if departure.how == 'detached' else 'of'} {root.qualified_name}")
        again = departure.how == "detached"  # a dropped or truncated one holds no rows
        if self._incremental is not None:
            self._incremental.read_again(_name(root), root.oid, whole=True)
            if again:  # whole: its lake table may hold rows deleted while it was attached
                self._incremental.read_again(_name(partition), partition.oid, whole=True)
            action = "read_again"
            log.info("DDL at %s: %s: reading %s again whole if published via its root%s",
                     format_lsn(commit_lsn), what, root.qualified_name,
                     f", and {partition.qualified_name}" if again else "")
        else:
            action = "not_followed"
            log.warning("DDL at %s: %s: if publication %s publishes %s via its root, the "
                        "partition's rows left it without row changes in the WAL, so "
                        "downstream %s keeps them%s; run pgcdc with --incremental-snapshots "
                        "to have them read again automatically, or re-load %s",
                        format_lsn(commit_lsn), what, self.config.publication,
                        root.qualified_name, root.qualified_name,
                        f" (and {partition.qualified_name}, if published on its own, lacks "
                        "its earlier rows)" if again else "", root.qualified_name)
        self.progress.count_rewrite(root, action)

    def _table(self, oid: int) -> TableVersion:
        return self._current(oid)[0]

    def _current(self, oid: int) -> tuple[TableVersion, RowDecoder]:
        current = self._decoders.get(oid)
        if current is None:
            msg = f"change for relation {oid} before its Relation message"
            raise DecodeError(msg, tag=None, offset=0)
        return current

    def on_change(self, payload: bytes, lsn: int, streaming: bool) -> None:
        """An Insert, Update or Delete: bytes straight to rows (no message object)."""
        op, table, before, after, unchanged = decode_change(payload, self._current,
                                                            streaming=streaming)
        failpoints.hit("after_decode")
        self._emit(op, table, before, after, unchanged, lsn)

    def _emit(self, op: str, table: TableVersion, before: dict[str, object] | None,
              after: dict[str, object] | None, unchanged: tuple[str, ...], lsn: int) -> None:
        txn = self.reorder.current
        if txn is None:
            msg = f"{op!r} change outside a transaction"
            raise DecodeError(msg, tag=None, offset=0)
        event = ChangeEvent(op, table, before, after, unchanged, txn.commit_lsn, lsn,
                            self._ordinal, txn.xid, txn.commit_time)
        self.sink.write(event)
        if self._incremental is not None:
            self._incremental.on_change(event)
        self._ordinal += 1
        self.progress.events += 1
        key = (table.qualified_name, op)
        self.progress.by_table_op[key] = self.progress.by_table_op.get(key, 0) + 1

    # --- acknowledgement ------------------------------------------------------------------

    def _send_status(self, stream: ReplicationConnection, *, force: bool = False) -> None:
        """Step 3 of the acknowledgement order: flush only what the sink made durable."""
        acks = self._acks
        if not force and not acks.due():
            return
        idle = self.reorder.idle and self.sink.in_flight() == 0
        acks.advance(idle=idle, hold=self.reorder.hold_lsn())
        self.progress.buffered_bytes = self.reorder.buffered_bytes
        if self.builder.state is BuilderState.FULL_SNAPSHOT:
            self._check_running_finished()
        acks.confirm(stream, idle=idle)
        if self.config.catalog_dir is not None:  # below the slot's restart_lsn, once a minute
            self.builder.compact_for_slot(self._connection, self.config.slot,
                                          stored_lsn=self._acks.stored)

    def _connection(self) -> psycopg.Connection[tuple[object, ...]]:
        """The normal (not replication) connection of the session, opened on first use."""
        if self._catalog_conn is None or self._catalog_conn.closed:
            self._catalog_conn = psycopg.connect(self.config.dsn, autocommit=True)
        return self._catalog_conn


def _key_of(table: TableVersion) -> tuple[int | str, ...]:
    """A table version's key columns, by attnum where known."""
    return tuple(c.attnum if c.attnum is not None else c.name for c in table.key_columns)
