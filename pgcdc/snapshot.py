"""``pgcdc snapshot``: create the slot with an exported snapshot and load every published table
as read events, into the sink or (``--lake``) straight into Delta; ``pgcdc run
--initial-load`` loads through :func:`initial_load` too."""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING

from pgcdc.exit_codes import EXIT_TRANSIENT
from pgcdc.sink_factory import build_sink
from pgcdc.state_paths import slot_paths

if TYPE_CHECKING:
    from pgcdc.config import Settings
    from sinks.sink import Sink

log = logging.getLogger(__name__)


def snapshot_command(settings: Settings) -> int:
    """Load (or resume loading) every published table into the sink, then exit."""
    preflight(settings)
    sink = build_sink(settings)
    try:
        complete = initial_load(settings, sink, only_pending=False)
    finally:
        sink.close()
    if not complete:
        print("pgcdc: the initial load was interrupted; run the same command again to resume it",
              file=sys.stderr)
        return EXIT_TRANSIENT
    return 0


def initial_load(settings: Settings, sink: Sink, *, only_pending: bool) -> bool:
    """Load (or resume loading) the slot's tables; progress and a summary go to stderr.
    With ``only_pending`` (for ``run``), only when the slot does not exist yet or its load
    is unfinished."""
    from functools import partial

    from loads.initial_load import CHUNK_PAGES, InitialLoad, LoadConfig, run_until_signalled

    progress_file, catalog_dir, state_file = slot_paths(settings)
    source = settings.source
    workers = settings.load.workers
    workers = len(os.sched_getaffinity(0)) if workers is None else workers
    # a worker opens its own sink: Kafka (not transactional) or null; jsonl stays in-process
    separate = settings.sink.kind in ("kafka", "null") and not settings.sink.exactly_once
    if workers and not separate:
        log.info("the %s sink is written by this process: the load uses %d reader threads",
                 settings.sink.kind, settings.load.readers)
    load = InitialLoad(LoadConfig(source.conninfo(), state_file, slot=source.slot,
                                  publication=source.publication, tables=source.tables,
                                  readers=settings.load.readers,
                                  workers=workers if separate else 0,
                                  sink_factory=partial(build_sink, settings),
                                  chunk_pages=settings.load.chunk_pages or CHUNK_PAGES,
                                  progress_file=progress_file, catalog_dir=catalog_dir), sink)
    if only_pending and not load.pending():
        return True
    return run_until_signalled(load)


def lake_snapshot_command(settings: Settings, lake: str, master: str) -> int:
    """``pgcdc snapshot --lake``: the initial load straight into Delta (streaming/bulk_load.py)."""
    from loads.initial_load import LoadConfig
    from streaming.bulk_load import LAKE_CHUNK_PAGES, load_lake

    preflight(settings)
    progress_file, catalog_dir, state_file = slot_paths(settings)
    source = settings.source
    config = LoadConfig(source.conninfo(), state_file, slot=source.slot,
                        publication=source.publication, tables=source.tables,
                        readers=settings.load.readers,  # tables written at once
                        chunk_pages=settings.load.chunk_pages or LAKE_CHUNK_PAGES,
                        progress_file=progress_file,
                        catalog_dir=catalog_dir)
    if load_lake(config, lake, master=None if master == "none" else master,
                 topic_prefix=settings.sink.topic_prefix):
        return 0
    print("pgcdc: the lake load was interrupted; run the same command again to resume it",
          file=sys.stderr)
    return EXIT_TRANSIENT


def preflight(settings: Settings) -> None:
    """Every check of a start before anything is created: a start that fails one leaves no
    publication or slot behind (the initial load creates the slot before it reads)."""
    from pgcdc import start_checks

    source = settings.source
    start_checks.preflight(source.conninfo(), source.publication, source.tables, create=True)
