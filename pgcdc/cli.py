"""The ``pgcdc`` command.

Exit codes: 0 success; 1 the demo's lake differs from its source; 2 bad usage or
configuration; 3 a terminal error (act on the message); 4 a transient error
(retrying later may succeed).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from pgcdc.errors import ConfigError, PgcdcError, TransientError

if TYPE_CHECKING:
    from sinks.sink import Sink

EXIT_DIFFERS = 1
EXIT_USAGE = 2
EXIT_TERMINAL = 3
EXIT_TRANSIENT = 4


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"PGCDC_{name}", default)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pgcdc",
        description="Change data capture from PostgreSQL (pgoutput) through Kafka into Delta "
                    "tables. Every option also reads PGCDC_<OPTION> from the environment.",
    )
    parser.add_argument("--log-level", default=_env("LOG_LEVEL", "WARNING"),
                        help="logging level (default WARNING)")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run the whole pipeline on a sample workload and compare "
                                       "the lake with the source")
    demo.add_argument("--dsn", default=_env("DSN"),
                      help="PostgreSQL to use (default: start a throwaway server)")
    demo.add_argument("--bootstrap-servers", default=_env("BOOTSTRAP_SERVERS"),
                      help="Kafka to use (default: start a throwaway broker)")
    demo.add_argument("--output", type=Path, default=Path(_env("OUTPUT", "pgcdc-output") or "."),
                      help="folder for the Delta tables and checkpoints (default ./pgcdc-output)")
    demo.add_argument("--transactions", type=int, default=2000,
                      help="how many workload transactions (default 2000)")
    demo.add_argument("--seed", type=int, default=42)
    demo.add_argument("--format", choices=["avro", "json"], default="avro",
                      help="Kafka value format (default avro)")

    run = sub.add_parser("run", help="stream a slot into a sink until interrupted")
    run.add_argument("--dsn", default=_env("DSN"), required=_env("DSN") is None,
                     help="PostgreSQL connection string (a role with REPLICATION)")
    run.add_argument("--slot", default=_env("SLOT", "pgcdc"))
    run.add_argument("--publication", default=_env("PUBLICATION", "pgcdc"))
    run.add_argument("--tables", default=_env("TABLES"),
                     help="comma-separated schema.table list for a publication pgcdc creates")
    run.add_argument("--sink", choices=["kafka", "jsonl", "null"], default=_env("SINK", "kafka"))
    run.add_argument("--bootstrap-servers", default=_env("BOOTSTRAP_SERVERS"))
    run.add_argument("--topic-prefix", default=_env("TOPIC_PREFIX", "pgcdc"))
    run.add_argument("--format", choices=["avro", "json"], default=_env("FORMAT", "avro"),
                     help="Kafka value format: Avro with a writer schema per table version "
                          "(default), or Debezium-compatible JSON")
    run.add_argument("--no-tombstones", action="store_true",
                     help="do not follow a delete with a tombstone (null value)")
    run.add_argument("--transaction-topic", action="store_true",
                     help="publish BEGIN/END transaction metadata to <prefix>._transactions")
    run.add_argument("--output", default=_env("OUTPUT", "-"),
                     help="file for --sink jsonl (default stdout)")
    run.add_argument("--progress-file", type=Path, default=_env("PROGRESS_FILE"),
                     help="where the durable position is stored and checked against the slot "
                          "at start (default ~/.local/state/pgcdc/<slot>.json)")

    _catalog_option(run)
    run.add_argument("--initial-load", action="store_true",
                     help="if the slot does not exist yet, create it with an exported snapshot "
                          "and load every published table first (an interrupted load resumes)")
    _add_load_options(run)

    snapshot = sub.add_parser("snapshot", help="create the slot with an exported snapshot, load "
                                               "every published table as read events, and exit "
                                               "(run it again to resume an interrupted load)")
    snapshot.add_argument("--dsn", default=_env("DSN"), required=_env("DSN") is None,
                          help="PostgreSQL connection string (a role with REPLICATION)")
    snapshot.add_argument("--slot", default=_env("SLOT", "pgcdc"))
    snapshot.add_argument("--publication", default=_env("PUBLICATION", "pgcdc"))
    snapshot.add_argument("--tables", default=_env("TABLES"),
                          help="comma-separated schema.table list for a publication pgcdc "
                               "creates")
    snapshot.add_argument("--sink", choices=["kafka", "jsonl", "null"],
                          default=_env("SINK", "kafka"))
    snapshot.add_argument("--bootstrap-servers", default=_env("BOOTSTRAP_SERVERS"))
    snapshot.add_argument("--topic-prefix", default=_env("TOPIC_PREFIX", "pgcdc"))
    snapshot.add_argument("--format", choices=["avro", "json"], default=_env("FORMAT", "avro"),
                          help="Kafka value format (default avro)")
    snapshot.add_argument("--output", default=_env("OUTPUT", "-"),
                          help="file for --sink jsonl (default stdout)")
    snapshot.add_argument("--progress-file", type=Path, default=_env("PROGRESS_FILE"),
                          help="the slot's streaming progress: a new slot refuses to replace "
                               "stored progress (default ~/.local/state/pgcdc/<slot>.json)")
    _catalog_option(snapshot)
    snapshot.set_defaults(no_tombstones=False, transaction_topic=False)
    _add_load_options(snapshot)

    status = sub.add_parser("status", help="the slot, its lag, stored progress and the "
                                           "catalog version")
    status.add_argument("--dsn", default=_env("DSN"), required=_env("DSN") is None)
    status.add_argument("--slot", default=_env("SLOT", "pgcdc"))
    status.add_argument("--progress-file", type=Path, default=_env("PROGRESS_FILE"))
    _catalog_option(status)

    catalog = sub.add_parser("catalog", help="the time-travel catalog: show | history | diff")
    catalog.add_argument("action", choices=["show", "history", "diff"])
    catalog.add_argument("--slot", default=_env("SLOT", "pgcdc"))
    catalog.add_argument("--at", help="an LSN as X/Y (show: that version; diff: from there)")
    catalog.add_argument("--to", help="diff: to this LSN (default: the latest version)")
    _catalog_option(catalog)

    spark = sub.add_parser("spark", help="apply the change topics to Delta tables "
                                         "(Spark Structured Streaming)")
    spark.add_argument("--bootstrap-servers", default=_env("BOOTSTRAP_SERVERS"),
                       required=_env("BOOTSTRAP_SERVERS") is None)
    spark.add_argument("--topic-prefix", default=_env("TOPIC_PREFIX", "pgcdc"))
    spark.add_argument("--lake", default=_env("LAKE"), required=_env("LAKE") is None,
                       help="URI of the folder holding one Delta table per source table")
    spark.add_argument("--checkpoint", default=_env("CHECKPOINT"),
                       required=_env("CHECKPOINT") is None, help="checkpoint URI")
    spark.add_argument("--trigger-seconds", type=float, default=5.0)
    spark.add_argument("--available-now", action="store_true",
                       help="process what is in Kafka now, then stop (backfill)")
    spark.add_argument("--max-offsets-per-trigger", type=int, default=None)
    spark.add_argument("--master", default=_env("SPARK_MASTER", "local[2]"),
                       help="Spark master; 'none' when launched by spark-submit")
    return parser


def _add_load_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--load-state", type=Path, default=_env("LOAD_STATE"),
                        help="the initial load's state, for resuming it "
                             "(default ~/.local/state/pgcdc/<slot>.load.json)")
    parser.add_argument("--readers", type=int, default=int(_env("READERS", "4") or 4),
                        help="connections reading tables in parallel (default 4)")
    parser.add_argument("--chunk-pages", type=int, default=int(_env("CHUNK_PAGES", "1024") or 1024),
                        help="pages per chunk, the unit of resuming (default 1024)")


def _catalog_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--catalog-dir", type=Path, default=_env("CATALOG_DIR"),
                        help="the persisted catalog history "
                             "(default ~/.local/state/pgcdc/<slot>.catalog)")


def _state_paths(args: argparse.Namespace) -> tuple[Path, Path]:
    """Stored progress and the catalog history: where the options say, or per slot."""
    state = Path.home() / ".local" / "state" / "pgcdc"
    progress = Path(args.progress_file) if getattr(args, "progress_file", None) \
        else state / f"{args.slot}.json"
    catalog = Path(args.catalog_dir) if args.catalog_dir else state / f"{args.slot}.catalog"
    return progress, catalog


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "demo":
            return _demo(args)
        if args.command == "run":
            return _run(args)
        if args.command == "status":
            return _status(args)
        if args.command == "catalog":
            return _catalog(args)
        if args.command == "snapshot":
            return _snapshot(args)
        return _spark(args)
    except ConfigError as exc:
        print(f"pgcdc: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except TransientError as exc:
        print(f"pgcdc: {exc}", file=sys.stderr)
        return EXIT_TRANSIENT
    except PgcdcError as exc:
        print(f"pgcdc: {exc}", file=sys.stderr)
        return EXIT_TERMINAL


def _demo(args: argparse.Namespace) -> int:
    from pgcdc.demo import DemoOptions, print_report, run_demo

    results = run_demo(DemoOptions(dsn=args.dsn, bootstrap_servers=args.bootstrap_servers,
                                   output=args.output, transactions=args.transactions,
                                   seed=args.seed, value_format=args.format))
    return 0 if print_report(results) else EXIT_DIFFERS


def _run(args: argparse.Namespace) -> int:
    from pgcdc.pipeline import Pipeline, PipelineConfig

    sink = _sink(args)
    tables = [t.strip() for t in args.tables.split(",")] if args.tables else None
    progress_file = args.progress_file or (
        Path.home() / ".local" / "state" / "pgcdc" / f"{args.slot}.json")
    if args.initial_load and not _initial_load(args, sink, tables, Path(progress_file)):
        sink.close()  # stopped during the load: nothing to stream yet
        return 0
    _, catalog_dir = _state_paths(args)
    pipeline = Pipeline(PipelineConfig(args.dsn, slot=args.slot, publication=args.publication,
                                       tables=tables, progress_file=Path(progress_file),
                                       catalog_dir=catalog_dir), sink)
    pipeline.prepare()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        pipeline.run(stop=stop)
    finally:
        sink.close()
    return 0


def _sink(args: argparse.Namespace) -> Sink:
    sink: Sink
    if args.sink == "kafka":
        if not args.bootstrap_servers:
            msg = "--sink kafka needs --bootstrap-servers (or PGCDC_BOOTSTRAP_SERVERS)"
            raise ConfigError(msg)
        from sinks.kafka import KafkaSink

        sink = KafkaSink(args.bootstrap_servers, topic_prefix=args.topic_prefix,
                         value_format=args.format, tombstones=not args.no_tombstones,
                         transaction_topic=args.transaction_topic)
    elif args.sink == "jsonl":
        from sinks.jsonlines import JsonLinesSink

        sink = JsonLinesSink(args.output)
    else:
        from sinks.null import NullSink

        sink = NullSink()
    return sink


def _snapshot(args: argparse.Namespace) -> int:
    sink = _sink(args)
    tables = [t.strip() for t in args.tables.split(",")] if args.tables else None
    progress_file = args.progress_file or (
        Path.home() / ".local" / "state" / "pgcdc" / f"{args.slot}.json")
    try:
        complete = _initial_load(args, sink, tables, Path(progress_file))
    finally:
        sink.close()
    if not complete:
        print("pgcdc: the initial load was interrupted; run the same command again to resume it",
              file=sys.stderr)
        return EXIT_TRANSIENT
    return 0


def _initial_load(args: argparse.Namespace, sink: Sink, tables: list[str] | None,
                  progress_file: Path) -> bool:
    """Load (or resume loading) the slot's tables; progress and a summary go to stderr.
    For ``run``, only when the slot does not exist yet or its load is unfinished."""
    from snapshot_builder.initial_load import InitialLoad, LoadConfig

    state_file = args.load_state or (
        Path.home() / ".local" / "state" / "pgcdc" / f"{args.slot}.load.json")
    load = InitialLoad(LoadConfig(args.dsn, Path(state_file), slot=args.slot,
                                  publication=args.publication, tables=tables,
                                  readers=args.readers, chunk_pages=args.chunk_pages,
                                  progress_file=progress_file), sink)
    if args.command == "run" and not load.pending():
        return True
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


def _status(args: argparse.Namespace) -> int:
    from pgcdc.status import render, status_report

    progress_file, catalog_dir = _state_paths(args)
    print(render(status_report(args.dsn, args.slot, progress_file, catalog_dir)))
    return 0


def _catalog(args: argparse.Namespace) -> int:
    from decoder.lsn import parse_lsn
    from pgcdc import catalog_view
    from snapshot_builder.history import HistoryFile

    _, catalog_dir = _state_paths(args)
    if not catalog_dir.exists():
        msg = f"no catalog history in {catalog_dir}: run pgcdc first, or pass --catalog-dir"
        raise ConfigError(msg)
    history = HistoryFile(catalog_dir).load()
    if args.action == "history":
        print(catalog_view.history_lines(history))
    elif args.action == "show":
        at = history.catalog_at(parse_lsn(args.at)) if args.at else history.latest
        print(catalog_view.show(at))
    else:
        if not args.at:
            msg = "catalog diff needs --at LSN (and optionally --to LSN)"
            raise ConfigError(msg)
        before = history.catalog_at(parse_lsn(args.at))
        after = history.catalog_at(parse_lsn(args.to)) if args.to else history.latest
        print(catalog_view.diff(before, after))
    return 0


def _spark(args: argparse.Namespace) -> int:
    from streaming import job
    from streaming.session import build_session

    master = None if args.master == "none" else args.master
    spark = build_session("pgcdc-apply", master=master)
    config = job.JobConfig(args.bootstrap_servers, args.lake, args.checkpoint,
                           topic_prefix=args.topic_prefix,
                           trigger_seconds=None if args.available_now else args.trigger_seconds,
                           max_offsets_per_trigger=args.max_offsets_per_trigger)
    query = job.start(spark, config)
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
