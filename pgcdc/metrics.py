"""Prometheus metrics and health checks of a running pipeline, over HTTP.

The metrics are a :mod:`prometheus_client` collector (:class:`PipelineCollector`) in a
registry of their own; ``prometheus_client``'s WSGI application serves them, with the health
checks beside it, from a threading WSGI server on a daemon thread:

* ``/metrics``: the Prometheus text format (or OpenMetrics, as the scraper asks);
* ``/health/live``: 200 while the process runs;
* ``/health/ready``: 200 once the pipeline streams and its last status update to
  PostgreSQL is recent, 503 otherwise, and 503 while the sink has acknowledged nothing for
  ``sink_stall_seconds`` or the slot's last sampled lag is past ``max_lag_bytes`` (the
  WAL-retention guard); the body says why.

The collector only reads: the streaming loop writes :class:`pgcdc.pipeline.Progress` and
the builder's state, the collector copies them at scrape time.  The lag gauge is the
slot's lag as the server reports it (``pg_current_wal_lsn()`` minus the slot's
``confirmed_flush_lsn``), sampled by the loop over a normal connection at most every
``PipelineConfig.lag_interval`` seconds; it has no sample until the first one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.metrics_core import Metric

from pgcdc import memory
from snapshot_builder.builder import BuilderState

if TYPE_CHECKING:
    from pgcdc.pipeline import Pipeline

log = logging.getLogger(__name__)


class _Family:
    """One metric family (a prometheus_client ``Metric``) and its samples; a counter's
    samples carry ``_total``, its family name does not (Prometheus' convention)."""

    def __init__(self, name: str, kind: str, help_text: str) -> None:
        self.sample = name
        self.metric = Metric(name.removesuffix("_total") if kind == "counter" else name,
                             help_text, kind)

    def add(self, value: float, **labels: str) -> _Family:
        self.metric.add_sample(self.sample, labels, float(value))
        return self


class PipelineCollector:
    """A prometheus_client collector of one pipeline's metrics, read at scrape time."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    def collect(self) -> Iterator[Metric]:
        for family in _families(self.pipeline):
            yield family.metric

    def describe(self) -> Iterable[Metric]:
        return ()  # nothing to check at registration: the families are read at scrape time


def registry_for(pipeline: Pipeline) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PipelineCollector(pipeline))
    return registry


def render(pipeline: Pipeline) -> str:
    """The pipeline's metrics in the Prometheus text format."""
    return generate_latest(registry_for(pipeline)).decode()


def _families(pipeline: Pipeline) -> list[_Family]:
    p = pipeline.progress
    families: list[_Family] = []

    events = _Family("pgcdc_events_total", "counter", "Change events written to the sink.")
    for (table, op), count in sorted(dict(p.by_table_op).items()):
        events.add(count, table=table, op=op)
    families.append(events)
    families.append(_Family("pgcdc_transactions_total", "counter",
                            "Transactions ended (committed or aborted).").add(p.transactions))
    families.append(_Family("pgcdc_received_lsn", "gauge",
                            "Highest WAL position received from the server.")
                    .add(p.received_lsn))
    families.append(_Family("pgcdc_flushed_lsn", "gauge",
                            "WAL position confirmed to the server (durable in the sink).")
                    .add(p.durable_lsn))
    lag = _Family("pgcdc_slot_lag_bytes", "gauge",
                  "Server WAL end minus the slot's confirmed_flush_lsn, sampled.")
    if p.lag_bytes is not None:
        lag.add(p.lag_bytes)
    families.append(lag)
    families.append(_Family("pgcdc_slot_lag_exceeded_total", "counter",
                            "Lag samples above --max-lag-bytes.").add(p.lag_exceeded))
    families.append(_Family("pgcdc_in_flight_events", "gauge",
                            "Events handed to the sink and not yet durable.").add(p.in_flight))
    families.append(_Family("pgcdc_pending_buffered_bytes", "gauge",
                            "Bytes of streamed and prepared transactions kept until commit.")
                    .add(p.buffered_bytes))
    state = _Family("pgcdc_builder_state", "gauge",
                    "The snapshot builder's state (1 for the current one).")
    current = pipeline.builder.state
    for member in BuilderState:
        state.add(1 if member is current else 0, state=member.value)
    families.append(state)
    families.append(_Family("pgcdc_catalog_generation", "gauge",
                            "Committed catalog changes so far.")
                    .add(pipeline.builder.generation))
    families.append(_Family("pgcdc_catalog_oldest_version", "gauge",
                            "Oldest catalog version held (rises when the history is compacted).")
                    .add(pipeline.builder.history.base.version))
    families.append(_Family("pgcdc_reconnects_total", "counter",
                            "Sessions restarted after a lost connection or failed delivery.")
                    .add(p.reconnects))
    errors = _Family("pgcdc_errors_total", "counter", "Errors by kind (exception class).")
    for kind, count in sorted(dict(p.errors).items()):
        errors.add(count, kind=kind)
    families.append(errors)
    families.append(_Family("pgcdc_heartbeats_total", "counter",
                            "Heartbeats written into the WAL, and received back through "
                            "the slot.")
                    .add(p.heartbeats_sent, stage="sent")
                    .add(p.heartbeats_received, stage="received"))
    rewrites = _Family("pgcdc_ddl_rewrites_total", "counter",
                       "Tables whose stored rows a DDL changed without row changes in the "
                       "WAL, by what pgcdc did: read_again (an incremental snapshot) or "
                       "not_followed (a warning; the table downstream differs).")
    for name, count in sorted(dict(p.rewrites).items()):
        table, _, action = name.rpartition(":")
        rewrites.add(count, table=table, action=action)
    families.append(rewrites)
    heap = memory.stats()
    families.append(_Family("pgcdc_memory_python_blocks", "gauge",
                            "Memory blocks the Python allocator holds (a Python leak grows "
                            "it).").add(heap["python_blocks"]))
    if "heap_in_use_bytes" in heap:
        families.append(_Family("pgcdc_memory_heap_bytes", "gauge",
                                "malloc's heap (glibc mallinfo2): in use (a native leak grows "
                                "it) and kept free by the allocator.")
                        .add(heap["heap_in_use_bytes"], state="in_use")
                        .add(heap["heap_free_bytes"], state="free"))
    waited = pipeline.watch.look() if pipeline.watch is not None else 0.0
    stall = pipeline.config.sink_stall_seconds
    families.append(_Family("pgcdc_sink_stalled", "gauge",
                            "1 while the sink has acknowledged nothing for "
                            "--sink-stall-seconds and holds messages (as /health/ready).")
                    .add(1 if stall > 0 and waited >= stall else 0))
    families.append(_Family("pgcdc_sink_stalls_total", "counter",
                            "Stalls of the sink so far (each warned once).").add(p.sink_stalls))
    families.append(_Family("pgcdc_sink_unacknowledged_seconds", "gauge",
                            "Seconds the sink has held messages without an acknowledgement.")
                    .add(round(waited, 3)))
    families.append(_Family("pgcdc_streaming", "gauge",
                            "1 while a replication session is streaming.")
                    .add(1 if p.streaming else 0))
    return families


def ready(pipeline: Pipeline, *, max_age: float) -> tuple[bool, str]:
    """Streaming, the last status update at most ``max_age`` seconds old, the sink not
    stalled and the slot's lag within the guard's limit; else every reason, joined by ``; ``."""
    p = pipeline.progress
    reasons = []
    if not p.streaming:
        reasons.append("not streaming")
    else:
        age = time.monotonic() - p.last_status_at
        if p.last_status_at == 0.0 or age > max_age:
            reasons.append(f"last status update {age:.1f} s ago")
    stall = pipeline.config.sink_stall_seconds
    waited = pipeline.watch.look() if pipeline.watch is not None else 0.0
    if stall > 0 and waited >= stall:
        reasons.append(f"the sink has acknowledged nothing for {waited:.0f} s "
                       f"({pipeline.sink.in_flight()} events waiting; --sink-stall-seconds "
                       f"{stall:g})")
    limit = pipeline.config.max_lag_bytes
    if limit is not None and p.lag_bytes is not None and p.lag_bytes > limit:
        reasons.append(f"the WAL-retention guard tripped: the slot is {p.lag_bytes} bytes "
                       f"behind, more than --max-lag-bytes {limit}")
    return not reasons, "; ".join(reasons) or "ready"


_Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib name)
        log.debug("metrics request: " + format, *args)


class MetricsServer:
    """Serves a pipeline's metrics and health on ``host:port`` from a daemon thread.

    ``ready_age``: how old the last status update may be for ``/health/ready``.
    """

    def __init__(self, pipeline: Pipeline, *, host: str = "127.0.0.1", port: int,
                 ready_age: float = 10.0) -> None:
        self.pipeline = pipeline
        self.ready_age = ready_age
        self.registry = registry_for(pipeline)
        self._server = make_server(host, port, self._app(), ThreadingWSGIServer,
                                   handler_class=_QuietHandler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="pgcdc-metrics", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> MetricsServer:
        self._thread.start()
        log.info("metrics on http://%s:%d/metrics", *self.address)
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _app(self) -> _Wsgi:
        metrics = make_wsgi_app(self.registry)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if path == "/metrics":
                return metrics(environ, start_response)  # type: ignore[no-any-return]
            if path == "/health/live":
                code, body = 200, "live"
            elif path == "/health/ready":
                ok, body = ready(self.pipeline, max_age=self.ready_age)
                code = 200 if ok else 503
            else:
                code, body = 404, "not found: /metrics, /health/live, /health/ready"
            data = (body + "\n").encode()
            status = {200: "200 OK", 503: "503 Service Unavailable", 404: "404 Not Found"}
            start_response(status[code], [("Content-Type", "text/plain; charset=utf-8"),
                                          ("Content-Length", str(len(data)))])
            return [data]

        return app
