"""``pgcdc run``: stream a slot into a sink until stopped: the initial load first when asked
(or its hand-over to incremental snapshots), the signals, the bound on a stop, the metrics
server and the status line around :class:`pgcdc.pipeline.Pipeline`."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING

import psycopg

from core.errors import ConfigError
from pgcdc.config import redact_dsn
from pgcdc.exit_codes import EXIT_TRANSIENT
from pgcdc.sink_factory import build_sink
from pgcdc.snapshot import initial_load, preflight
from pgcdc.startup import unreachable
from pgcdc.state_paths import slot_paths, state_files

if TYPE_CHECKING:
    import argparse

    from loads.incremental import IncrementalSnapshots
    from pgcdc.config import Settings
    from pgcdc.pipeline import Pipeline
    from pgcdc.status_line import StatusLine
    from sinks.sink import Sink

log = logging.getLogger(__name__)


def run_command(settings: Settings, args: argparse.Namespace) -> int:
    from decoder.lsn import format_lsn, parse_lsn
    from decoder.slot import current_wal_lsn
    from pgcdc.metrics import MetricsServer
    from pgcdc.pipeline import Pipeline, PipelineConfig

    log.info("streaming slot %s from %s", settings.source.slot,
             redact_dsn(settings.source.conninfo()))
    until_lsn = parse_lsn(args.until_lsn) if args.until_lsn else None  # checked before starting
    while True:
        if not _reach_server(settings):
            return 0  # stopped before the server could be reached: nothing was read
        try:
            preflight(settings)
            break
        except psycopg.OperationalError as exc:  # gone again (a crash, a restart): wait
            if not unreachable(exc):
                raise
            log.warning("PostgreSQL went away while pgcdc started: %s; waiting for it",
                        " ".join(str(exc).split()))
    sink = build_sink(settings)
    progress_file, catalog_dir, _ = slot_paths(settings)
    incremental = _incremental(settings, sink)
    if settings.load.initial and not (incremental is not None and _hand_over_load(
            settings, incremental)) and not initial_load(settings, sink, only_pending=True):
        sink.close()  # stopped during the load: nothing to stream yet
        return 0
    service = settings.service
    files = state_files(settings)
    pipeline = Pipeline(PipelineConfig(
        settings.source.conninfo(), slot=settings.source.slot,
        publication=settings.source.publication, tables=settings.source.tables,
        progress_file=progress_file, catalog_dir=catalog_dir,
        load_state=files.load_state, incremental_state=files.incremental_state,
        status_interval=service.status_interval, max_lag_bytes=service.max_lag_bytes or None,
        on_lag=service.on_lag, lag_interval=service.lag_interval,
        sample_lag=service.metrics_port is not None,
        heartbeat_interval=service.heartbeat_interval,
        shutdown_grace=service.shutdown_grace_seconds, max_retries=service.max_retries,
        retry_max_delay=service.retry_max_delay, sink_stall_seconds=service.sink_stall_seconds,
        receive_timeout=settings.source.receive_timeout, origin=settings.source.origin,
        binary=settings.source.binary),
        sink, incremental=incremental)
    metrics = None
    if service.metrics_port is not None:
        try:
            metrics = MetricsServer(pipeline, host=service.metrics_host,
                                    port=service.metrics_port,
                                    ready_age=max(10.0, 3 * service.status_interval)).start()
        except OSError as exc:
            sink.close()
            msg = (f"cannot serve metrics on {service.metrics_host}:{service.metrics_port}: "
                   f"{exc.strerror}; choose another --metrics-port")
            raise ConfigError(msg) from None
    stop = threading.Event()
    stop_waiting_on = getattr(sink, "stop_waiting_on", None)
    if stop_waiting_on is not None:  # a Kafka sink waiting for a table version gives up
        stop_waiting_on(stop)  # at the stop, not after its request timeout

    def stopping(*_: object) -> None:
        if not stop.is_set():
            stop.set()
            _exit_after(service.shutdown_grace_seconds + _CLOSE_SECONDS, pipeline)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stopping)
    status_line = None
    try:
        if not _prepare(pipeline, settings, stop):
            return 0  # stopped while PostgreSQL was away: nothing was read
        status_line = _status_line(pipeline, settings.log.format)
        if args.exit_when_caught_up:
            with psycopg.connect(settings.source.conninfo(), autocommit=True) as conn:
                until_lsn = current_wal_lsn(conn)
            log.info("streaming until %s, the WAL end at start, is durable", format_lsn(until_lsn))
        if incremental is not None:
            incremental.start()
        pipeline.run(stop=stop, until_lsn=until_lsn)
    finally:
        if status_line is not None:
            status_line.close()
        if incremental is not None:
            incremental.stop()
        sink.close()
        if metrics is not None:
            metrics.close()
    return 0


def _prepare(pipeline: Pipeline, settings: Settings, stop: threading.Event) -> bool:
    """``pipeline.prepare()``, started again while PostgreSQL goes away under it (a crash or
    a restart between the first connection and the stream), with the backoff of a lost
    connection and up to ``--max-retries`` failures in a row; False when stopped meanwhile.
    What a person has to fix (:func:`pgcdc.startup.unreachable` says which) is raised."""
    from decoder.errors import ConnectionLostError
    from pgcdc.pipeline import Backoff

    backoff = Backoff(settings.service.max_retries, settings.service.retry_max_delay)
    while True:
        try:
            pipeline.prepare()
            return True
        except (psycopg.OperationalError, ConnectionLostError) as exc:
            cause = exc.__cause__ if isinstance(exc, ConnectionLostError) else exc
            if not (isinstance(cause, psycopg.OperationalError) and unreachable(cause)):
                raise
            delay = backoff.failed()
            if delay is None:
                raise
            log.warning("PostgreSQL went away while pgcdc started: %s; starting again in "
                        "%.1f s (%s)", " ".join(str(exc).split()), delay, backoff.attempt)
            if stop.wait(delay):
                return False


def _status_line(pipeline: Pipeline, log_format: str) -> StatusLine | None:
    """On a terminal (and a text log), a line rewritten every second: events/s, the
    durable LSN, the lag, the state (pgcdc/status_line.py); nothing otherwise."""
    from pgcdc.status_line import start_status_line

    return start_status_line(pipeline.progress, sys.stderr, log_format)


_CLOSE_SECONDS = 5.0  # after the grace period: closing the sink and the connections


def _exit_after(seconds: float, pipeline: Pipeline) -> None:
    """The bound on a stop: if the process still runs ``seconds`` after the signal (a call into
    the sink or the server blocks: a frozen broker, a blackholed link), it exits 4 from a
    timer thread, saying so.  Progress stays consistent: it is stored (atomically) only
    after the sink made it durable, so the slot is at the durable position."""
    from decoder.lsn import format_lsn

    def expire() -> None:
        log.error("stopping took longer than %.0f s (blocked in the sink or the server); "
                  "exiting now: what the sink had not acknowledged (%d events, and any table "
                  "version being published) is dropped, the slot stays at %s, the durable "
                  "position, and the next start sends it again", seconds,
                  pipeline.sink.in_flight(), format_lsn(pipeline.progress.durable_lsn))
        logging.shutdown()
        os._exit(EXIT_TRANSIENT)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()


def _incremental(settings: Settings, sink: Sink) -> IncrementalSnapshots | None:
    from loads.incremental import IncrementalSnapshots

    if not settings.load.incremental:
        return None
    path = settings.state.incremental_state or \
        slot_paths(settings)[0].with_name(f"{settings.source.slot}.incremental.json")
    return IncrementalSnapshots(settings.source.conninfo(), sink, slot=settings.source.slot,
                                publication=settings.source.publication, state_file=path,
                                chunk_size=settings.load.incremental_chunk_rows)


def _hand_over_load(settings: Settings, incremental: IncrementalSnapshots) -> bool:
    """An interrupted initial load, with incremental snapshots on: the tables it did not finish
    are queued as incremental snapshots and streaming starts at once from the slot's consistent
    point (docs/incremental-snapshot.md). False (the load resumes as usual) when there is no
    such load, or when its plan or its slot is not as the load left it."""
    from psycopg import sql

    from decoder.names import quoted_table_name
    from decoder.slot import slot_info
    from loads.load_state import COMPLETE, LoadStateStore
    from loads.published import fetch_published_tables

    store = LoadStateStore(slot_paths(settings)[2])
    state = store.load()
    if state is None or state.status == COMPLETE or not state.tables \
            or state.slot != settings.source.slot:
        return False
    with psycopg.connect(settings.source.conninfo(), autocommit=True) as conn:
        info = slot_info(conn, settings.source.slot)
        if info is None or info.confirmed_flush_lsn != state.consistent_point:
            return False  # the load's own checks name the data loss
        published = fetch_published_tables(conn, settings.source.publication, sizes=False)
        left = [t for t in state.tables.values() if not t.complete]
        # a table without a key is read whole, a truncate first: its reads so far (and any
        # made durable twice) are replaced, and rows written since the consistent point
        # come once (loads/incremental.py)
        keyless = {t.oid for t in left if t.oid in published and published[t.oid].table.keyless}
        tables = [sql.Identifier(t.schema, t.name).as_string(conn)
                  for t in left if t.oid not in keyless]
    incremental.request(tables)  # stored before the load is marked done
    for table in left:
        if table.oid in keyless:
            incremental.read_again(quoted_table_name(table.schema, table.name), table.oid,
                                   whole=True)
            tables.append(f"{table.qualified_name} (whole)")
    state.status = COMPLETE
    store.save(state)
    log.warning("the interrupted initial load of slot %s is completed by incremental snapshots "
                "while streaming: %s", settings.source.slot, ", ".join(tables) or "nothing left")
    return True


def _reach_server(settings: Settings) -> bool:
    """PostgreSQL not reachable yet at start: retried as during a run (pgcdc/startup.py)."""
    from pgcdc.startup import wait_for_server

    service = settings.service
    return wait_for_server(settings.source.conninfo(), max_retries=service.max_retries,
                           retry_max_delay=service.retry_max_delay)
