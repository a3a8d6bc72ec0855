"""The ``pgcdc`` command.

Exit codes: 0 success; 1 the demo's lake differs from its source; 2 bad usage or
configuration; 3 a terminal error (act on the message); 4 a transient error
(retrying later may succeed).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import re
import signal
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import psycopg
from psycopg import conninfo

from core.errors import ConfigError, PgcdcError, TransientError
from pgcdc.config import Settings, load_settings, redact_dsn
from pgcdc.start_checks import PrivilegeError

if TYPE_CHECKING:
    from decoder.restart import StateFiles
    from loads.incremental import IncrementalSnapshots
    from pgcdc.pipeline import Pipeline
    from pgcdc.status_line import StatusLine
    from sinks.avro_logical import LogicalTypes
    from sinks.sink import Sink

EXIT_DIFFERS = 1
EXIT_USAGE = 2
EXIT_TERMINAL = 3
EXIT_TRANSIENT = 4

log = logging.getLogger(__name__)


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"PGCDC_{name}", default)


def _logging_options(parser: argparse.ArgumentParser, default: str | None) -> None:
    parser.add_argument("--log-level", default=default,
                        help="logging level (default WARNING)")
    parser.add_argument("--log-format", choices=["text", "json"], default=default,
                        help="log lines as text (default) or one JSON object per line")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pgcdc",
        description="Change data capture from PostgreSQL (pgoutput) through Kafka into Delta "
                    "tables. Every option also reads PGCDC_<OPTION> from the environment.",
    )
    _logging_options(parser, None)
    # the same options after the verb too (pgcdc run --log-format json); there, an option
    # left out keeps what was given before the verb
    common = argparse.ArgumentParser(add_help=False)
    _logging_options(common, argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)
    verb = functools.partial(sub.add_parser, parents=[common])

    demo = verb("demo", help="run the whole pipeline on a sample workload and compare "
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
    demo.add_argument("--schema-registry", action="store_true",
                      help="Avro in the Confluent wire format, the schemas registered in a "
                           "throwaway Apicurio Registry (built from Maven Central once)")

    run = verb("run", help="stream a slot into a sink until interrupted")
    _source_options(run)
    _sink_options(run)
    run.add_argument("--no-tombstones", action="store_true", default=None,
                     help="do not follow a delete with a tombstone (null value)")
    run.add_argument("--transaction-topic", action="store_true", default=None,
                     help="publish BEGIN/END transaction metadata to <prefix>._transactions")
    run.add_argument("--exactly-once", action="store_true", default=None,
                     help="Kafka transactions: exactly once for read_committed consumers "
                          "(docs/exactly-once.md)")
    run.add_argument("--transactional-id",
                     help="with --exactly-once (default pgcdc.<prefix>.<slot>)")
    run.add_argument("--commit-interval-ms", type=int,
                     help="with --exactly-once: commit a Kafka transaction this often "
                          "(default 1000)")
    run.add_argument("--progress-file", type=Path,
                     help="where the durable position is stored and checked against the slot "
                          "at start (default ~/.local/state/pgcdc/<slot>.json)")
    _catalog_option(run, default=None)
    run.add_argument("--initial-load", action="store_true", default=None,
                     help="if the slot does not exist yet, create it with an exported snapshot "
                          "and load every published table first (an interrupted load resumes)")
    _add_load_options(run)
    run.add_argument("--metrics-port", type=int,
                     help="serve /metrics, /health/live and /health/ready on this port "
                          "(default: off)")
    run.add_argument("--metrics-host",
                     help="address for --metrics-port (default 127.0.0.1)")
    run.add_argument("--max-lag-bytes", type=int,
                     help="WAL-retention guard: act when the slot holds more WAL than this "
                          "(default 10737418240, 10 GiB; 0: off)")
    run.add_argument("--on-lag", choices=["warn", "stop"],
                     help="past --max-lag-bytes: warn (log and count, default) or stop "
                          "(exit 3)")
    run.add_argument("--heartbeat-interval", type=float,
                     help="seconds between heartbeats written into the WAL "
                          "(pg_logical_emit_message) and read back through the slot "
                          "(default 60; 0: off)")
    run.add_argument("--shutdown-grace-seconds", type=float,
                     help="on SIGTERM/SIGINT, wait this long for Kafka to acknowledge what it "
                          "holds (default 10); what it has not then is dropped, the slot "
                          "stays at the durable position and pgcdc exits 4 saying so")
    run.add_argument("--max-retries", type=int,
                     help="failures in a row (PostgreSQL unreachable, a failed delivery) "
                          "before giving up with exit 4 (default 0: retry forever, with "
                          "exponential backoff)")
    run.add_argument("--retry-max-delay", type=float,
                     help="the longest wait between two attempts, seconds (default 30)")
    until = run.add_mutually_exclusive_group()
    until.add_argument("--until-lsn", metavar="X/Y",
                       help="stop (exit 0) once everything up to this LSN is durable in the "
                            "sink and confirmed to the slot, e.g. for a scripted catch-up")
    until.add_argument("--exit-when-caught-up", action="store_true",
                       help="stop (exit 0) once everything written before pgcdc started "
                            "(the server's WAL end then) is durable and confirmed")
    run.add_argument("--sink-stall-seconds", type=float,
                     help="no acknowledgement from Kafka for this long while it holds events: "
                          "one warning, pgcdc_sink_stalled 1 and /health/ready 503 until it "
                          "acknowledges again (default 30; 0: not watched)")
    run.add_argument("--receive-timeout", type=float,
                     help="seconds without a message from the server after which the "
                          "replication connection counts as dead and is reconnected (like "
                          "wal_receiver_timeout; default 60, 0: never)")
    run.add_argument("--origin", choices=["any", "none"],
                     help="PostgreSQL 16+: 'none' leaves out changes that another node "
                          "replicated here (loop-free two-way setups); default: the "
                          "server's, 'any'")
    run.add_argument("--binary", choices=["auto", "on", "off"],
                     help="PostgreSQL 14+: values in binary (each type's send format) or "
                          "text; default auto: binary when every published column type "
                          "has a binary decoder (docs/replication.md)")
    run.add_argument("--incremental-snapshots", action="store_true", default=None,
                     help="serve incremental snapshots while streaming: pgcdc snapshot-table "
                          "requests them (docs/incremental-snapshot.md)")
    run.add_argument("--incremental-chunk-rows", type=int,
                     help="rows per incremental snapshot chunk (default 1024)")
    run.add_argument("--incremental-state", type=Path,
                     help="the incremental snapshots' state (default "
                          "~/.local/state/pgcdc/<slot>.incremental.json)")

    table = verb("snapshot-table",
                           help="ask the running pgcdc (run --incremental-snapshots) to read "
                                "tables again while streaming, or pause, resume or cancel that")
    _source_options(table, tables=False)
    table.add_argument("snapshot_tables", nargs="*", metavar="TABLE",
                       help="schema.table to read (with --cancel: the ones to cancel; none: "
                            "all), written as for --tables: public.\"Mixed Case\"")
    action = table.add_mutually_exclusive_group()
    action.add_argument("--pause", dest="action", action="store_const", const="pause-snapshot")
    action.add_argument("--resume", dest="action", action="store_const",
                        const="resume-snapshot")
    action.add_argument("--cancel", dest="action", action="store_const", const="stop-snapshot")
    table.add_argument("--from-key", action="append", metavar="VALUE",
                       help="read keys from this one on (inclusive); repeat once per key column")
    table.add_argument("--to-key", action="append", metavar="VALUE",
                       help="read keys up to this one (inclusive); repeat once per key column")
    table.add_argument("--surrogate-key", metavar="COLUMNS",
                       help="for a table without a primary key: comma-separated unique, "
                            "NOT NULL columns to read it in order of")

    snapshot = verb("snapshot", help="create the slot with an exported snapshot, load "
                                               "every published table as read events, and exit "
                                               "(run it again to resume an interrupted load)")
    _source_options(snapshot)
    _sink_options(snapshot)
    snapshot.add_argument("--progress-file", type=Path,
                          help="the slot's streaming progress: a new slot refuses to replace "
                               "stored progress (default ~/.local/state/pgcdc/<slot>.json)")
    _catalog_option(snapshot, default=None)
    _add_load_options(snapshot)
    snapshot.add_argument("--lake", default=None,
                          help="load straight into the Delta tables under this URI with Spark "
                               "(no sink, no Kafka); then pgcdc run streams from the slot's "
                               "consistent point and pgcdc spark applies the rest")
    snapshot.add_argument("--master", default=_env("SPARK_MASTER", "local[2]"),
                          help="with --lake: the Spark master")

    status = verb("status", help="the slot, its lag, stored progress, the "
                                           "builder state, the catalog version and, with "
                                           "Kafka, the messages each topic holds")
    _source_options(status, publication=False)
    status.add_argument("--progress-file", type=Path)
    status.add_argument("--bootstrap-servers", help="Kafka, to count each topic's messages")
    status.add_argument("--topic-prefix", help="default pgcdc")
    status.add_argument("--json", action="store_true", help="print the report as JSON")
    _catalog_option(status, default=None)

    slot = verb("slot", help="create, drop or list replication slots")
    slot.add_argument("action", choices=["create", "drop", "list"])
    _source_options(slot, publication=False)
    slot.add_argument("--no-two-phase", action="store_true",
                      help="create: without two-phase decoding")
    slot.add_argument("--yes", action="store_true",
                      help="drop: do not ask for confirmation (needed without a terminal)")
    slot.add_argument("--all", action="store_true",
                      help="drop: also remove DDL capture (its event triggers and the pgcdc "
                           "schema) when no other slot of the database is left to use it")

    catalog = verb("catalog", help="the time-travel catalog: show | history | diff")
    catalog.add_argument("action", choices=["show", "history", "diff"])
    catalog.add_argument("--slot", default=_env("SLOT", "pgcdc"))
    catalog.add_argument("--at", help="an LSN as X/Y (show: that version; diff: from there)")
    catalog.add_argument("--to", help="diff: to this LSN (default: the latest version)")
    _catalog_option(catalog)

    spark = verb("spark", help="apply the change topics to Delta tables "
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
    spark.add_argument("--max-offsets-per-trigger", type=int, default=None, metavar="N",
                       help="Kafka offsets per micro-batch at most (default 200,000: what "
                            "the driver's default memory holds; 0: no bound)")
    spark.add_argument("--changelog", action="store_true",
                       help="also append every event to <table>__changelog (history, audit)")
    spark.add_argument("--optimize-every", type=int, default=None, metavar="N",
                       help="compact (OPTIMIZE) the tables written, every N micro-batches")
    spark.add_argument("--archive-dropped", action="store_true",
                       help="move the lake table of a dropped source table to "
                            "<lake>/_archive/<schema>.<table>.<oid> instead of dropping it, "
                            "and keep the lake column of a dropped column (NULL in newer "
                            "rows; <name>__dropped once a new column takes its name)")
    spark.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE",
                       help="a Kafka consumer property for Spark's Kafka source, e.g. "
                            "security.protocol=SASL_SSL (repeatable; docs/security.md)")
    spark.add_argument("--kafka-properties", type=Path, default=_env("SPARK_KAFKA_PROPERTIES"),
                       help="a file of KEY=VALUE Kafka consumer properties (for secrets such "
                            "as sasl.jaas.config, which --kafka-option would show in ps)")
    spark.add_argument("--master", default=_env("SPARK_MASTER", "local[2]"),
                       help="Spark master; 'none' when launched by spark-submit")
    spark.add_argument("--spark-log", type=Path, default=_env("SPARK_LOG"),
                       help="the file for Spark's own log lines (WARN and above), kept off "
                            "the terminal (default ~/.local/state/pgcdc/<topic-prefix>"
                            ".spark.log)")
    return parser


def _source_options(parser: argparse.ArgumentParser, *, publication: bool = True,
                    tables: bool = True) -> None:
    """Options read through :mod:`pgcdc.config`: their default is None (not given), so that
    the config file and PGCDC_* variables apply underneath them."""
    parser.add_argument("--config", type=Path, default=_env("CONFIG"),
                        help="a TOML config file (flags > PGCDC_* variables > the file)")
    parser.add_argument("--dsn", help="PostgreSQL connection string (a role with REPLICATION); "
                                      "the password may also come from PGCDC_PASSWORD")
    parser.add_argument("--slot", help="replication slot (default pgcdc)")
    if publication:
        parser.add_argument("--publication", help="publication (default pgcdc)")
    if publication and tables:
        parser.add_argument("--tables",
                            help="comma-separated schema.table list for a publication pgcdc "
                                 "creates; double-quote a part holding a comma, a dot or a "
                                 'double quote, an inner one doubled: public."my,table"')


def _sink_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sink", choices=["kafka", "jsonl", "null"], help="default kafka")
    parser.add_argument("--bootstrap-servers")
    parser.add_argument("--topic-prefix", help="default pgcdc")
    parser.add_argument("--format", choices=["avro", "json"],
                        help="Kafka value format: Avro with a writer schema per table version "
                             "(default), or Debezium-compatible JSON")
    parser.add_argument("--json-mode", choices=["debezium", "pgcdc"],
                        help="--format json's values: Debezium's encodings under the four "
                             "options below (default), or pgcdc's own ISO strings (the JSON "
                             "pgcdc's Spark job reads)")
    parser.add_argument("--avro-types", choices=["text", "logical"],
                        help="--format avro's column types: text (default: every type Avro "
                             "has no primitive for is a string) or logical (typed Avro: "
                             "decimal, date, timestamp-micros, uuid, arrays, records for "
                             "composites and ranges; docs/types.md)")
    parser.add_argument("--decimal-handling-mode", choices=["precise", "double", "string"],
                        help="numeric and money in JSON, as Debezium's decimal.handling.mode "
                             "(default precise)")
    parser.add_argument("--time-precision-mode",
                        choices=["adaptive", "adaptive_time_microseconds", "connect",
                                 "isostring"],
                        help="date, time and timestamp in JSON, as Debezium's "
                             "time.precision.mode (default adaptive)")
    parser.add_argument("--interval-handling-mode", choices=["numeric", "string"],
                        help="interval in JSON, as Debezium's interval.handling.mode "
                             "(default numeric)")
    parser.add_argument("--binary-handling-mode",
                        choices=["bytes", "base64", "base64-url-safe", "hex"],
                        help="bytea in JSON, as Debezium's binary.handling.mode "
                             "(default bytes)")
    parser.add_argument("--output", help="file for --sink jsonl (default stdout)")
    parser.add_argument("--schema-registry-url",
                        help="--format avro in the Confluent wire format, each table "
                             "version's schemas registered under <topic>-key/-value in this "
                             "registry (its Confluent-compatible API, e.g. "
                             "http://registry:8080/apis/ccompat/v7; user:password@ allowed)")
    parser.add_argument("--schema-registry-user", help="the registry's basic-auth user")
    parser.add_argument("--schema-registry-password",
                        help="the registry's basic-auth password (better: "
                             "PGCDC_SCHEMA_REGISTRY_PASSWORD or _FILE, not shown by ps)")
    parser.add_argument("--schema-registry-ca", type=Path,
                        help="the CA file of an https registry (default: the system's CAs)")


def _add_load_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--load-state", type=Path,
                        help="the initial load's state, for resuming it "
                             "(default ~/.local/state/pgcdc/<slot>.load.json)")
    parser.add_argument("--readers", type=int,
                        help="connections reading tables in parallel (default 4)")
    parser.add_argument("--workers", type=int,
                        help="worker processes reading and writing the load, each with one "
                             "connection and its own producer (default: one per CPU); 0: "
                             "--readers threads in this process")
    parser.add_argument("--chunk-pages", type=int,
                        help="pages per chunk, the unit of resuming (default 1024)")


def _catalog_option(parser: argparse.ArgumentParser, *,
                    default: str | None | Literal[False] = False) -> None:
    parser.add_argument("--catalog-dir", type=Path,
                        default=_env("CATALOG_DIR") if default is False else default,
                        help="the persisted catalog history "
                             "(default ~/.local/state/pgcdc/<slot>.catalog)")


def _state_paths(args: argparse.Namespace) -> tuple[Path, Path]:
    """Stored progress and the catalog history: where the options say, or per slot."""
    state = Path.home() / ".local" / "state" / "pgcdc"
    progress = Path(args.progress_file) if getattr(args, "progress_file", None) \
        else state / f"{args.slot}.json"
    catalog = Path(args.catalog_dir) if args.catalog_dir else state / f"{args.slot}.catalog"
    return progress, catalog


def _paths(settings: Settings) -> tuple[Path, Path, Path]:
    """Stored progress, the catalog history and the load state: configured, or per slot."""
    state = Path.home() / ".local" / "state" / "pgcdc"
    slot = settings.source.slot
    return (settings.state.progress_file or state / f"{slot}.json",
            settings.state.catalog_dir or state / f"{slot}.catalog",
            settings.state.load_state or state / f"{slot}.load.json")


def _state_files(settings: Settings) -> StateFiles:
    """Every state file of the slot: named together when a start over needs them gone."""
    from decoder.restart import StateFiles

    progress_file, catalog_dir, load_state = _paths(settings)
    incremental = settings.state.incremental_state or \
        progress_file.with_name(f"{settings.source.slot}.incremental.json")
    return StateFiles(progress_file, catalog_dir, load_state, incremental)


_CONFIGURED = ("run", "snapshot", "status", "slot", "snapshot-table")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = None
        if args.command in _CONFIGURED:
            settings = load_settings(vars(args), config_file=args.config)
            _configure_logging(settings.log.level, settings.log.format)
        else:
            _configure_logging((args.log_level or _env("LOG_LEVEL", "WARNING") or "").upper(),
                               args.log_format or _env("LOG_FORMAT", "text") or "text")
        if args.command == "demo":
            return _demo(args)
        if args.command == "catalog":
            return _catalog(args)
        if args.command == "spark":
            return _spark(args)
        assert settings is not None
        if args.command == "run":
            return _run(settings, args)
        if args.command == "status":
            return _status(settings, args)
        if args.command == "slot":
            return _slot(settings, args)
        if args.command == "snapshot-table":
            return _snapshot_table(settings, args)
        if args.lake:
            return _lake_snapshot(settings, args.lake, args.master)
        return _snapshot(settings)
    except ConfigError as exc:
        print(f"pgcdc: {redact_dsn(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except (PgcdcError, psycopg.OperationalError, psycopg.errors.InsufficientPrivilege) as exc:
        role = None
        if settings is not None:
            role = conninfo.conninfo_to_dict(settings.source.conninfo()).get("user")
        text = exc.diag.message_primary if isinstance(exc, psycopg.errors.InsufficientPrivilege) \
            else str(exc).strip()
        text = redact_dsn(text or str(exc))
        hint = None if isinstance(exc, PrivilegeError) else \
            _connection_hint(text, str(role or "<the role pgcdc connects as>"))
        if hint is not None:  # not worth a retry: a person has to fix the configuration
            print(f"pgcdc: {text}; {hint}", file=sys.stderr)
            return EXIT_TERMINAL
        print(f"pgcdc: {text}", file=sys.stderr)
        return EXIT_TRANSIENT if isinstance(exc, TransientError | psycopg.OperationalError) \
            else EXIT_TERMINAL


# libpq's own words for a connection that TLS or authentication refused (no SQLSTATE: the
# client decides), and what to do about each
_CONNECTION_HINTS = (
    ("certificate verify failed",
     "the server's certificate is not signed by the CA that sslrootcert names: set sslrootcert "
     "in the DSN to the CA that signed it (docs/security.md)"),
    ("does not match host name",
     "the server's certificate does not name the host in the DSN: connect with a host name it "
     "lists, or use sslmode=verify-ca (docs/security.md)"),
    ("root certificate file",
     "sslmode=verify-ca/verify-full needs the CA: add sslrootcert=<file> to the DSN "
     "(docs/security.md)"),
    ("server does not support SSL",
     "the server runs with ssl = off: turn TLS on in postgresql.conf (docs/security.md)"),
    ("no encryption",
     "the server accepts only TLS connections: add sslmode=verify-full sslrootcert=<CA file> "
     "to the DSN (docs/security.md)"),
    ("password authentication failed",
     "check the role's password (PGCDC_PASSWORD, source.password_file)"),
)
# what a missing privilege needs, by the object PostgreSQL names
_GRANTS = {"table": "GRANT SELECT ON TABLE {} TO {}", "relation": "GRANT SELECT ON TABLE {} TO {}",
           "schema": "GRANT USAGE ON SCHEMA {} TO {}",
           "function": "GRANT EXECUTE ON FUNCTION {} TO {}"}
_DENIED = re.compile(r"permission denied for (table|relation|schema|function) (\S+)")


def _connection_hint(text: str, role: str) -> str | None:
    if (denied := _DENIED.search(text)) is not None:
        grant = _GRANTS[denied[1]].format(denied[2], role)
        return f"as the owner or a superuser run {grant} (the least-privilege role: " \
               "docs/security.md)"
    if "replication role" in text or "start WAL sender" in text:
        return (f"the role needs the REPLICATION attribute: ALTER ROLE {role} REPLICATION "
                "(docs/security.md)")
    return next((hint for words, hint in _CONNECTION_HINTS if words in text), None)


class _TextFormatter(logging.Formatter):
    """The usual text line, with any connection-string password redacted."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_dsn(super().format(record))


class _JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, thread and,
    when there is one, the exception; passwords in connection strings are redacted."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": redact_dsn(record.getMessage()),
            "thread": record.threadName,
        }
        if record.exc_info:
            entry["exception"] = redact_dsn(self.formatException(record.exc_info))
        return json.dumps(entry, default=str)


def _configure_logging(level: str, log_format: str) -> None:
    """The only place that installs a handler: the library code just logs."""
    handler = logging.StreamHandler()
    handler.setFormatter(_JsonFormatter() if log_format == "json" else _TextFormatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)


def _demo(args: argparse.Namespace) -> int:
    from pgcdc.demo import DemoOptions, print_report, run_demo

    results = run_demo(DemoOptions(dsn=args.dsn, bootstrap_servers=args.bootstrap_servers,
                                   output=args.output, transactions=args.transactions,
                                   seed=args.seed, value_format=args.format,
                                   schema_registry=args.schema_registry))
    return 0 if print_report(results) else EXIT_DIFFERS


def _run(settings: Settings, args: argparse.Namespace) -> int:
    from decoder.lsn import format_lsn, parse_lsn
    from decoder.slot import current_wal_lsn
    from pgcdc.metrics import MetricsServer
    from pgcdc.pipeline import Pipeline, PipelineConfig

    log.info("streaming slot %s from %s", settings.source.slot,
             redact_dsn(settings.source.conninfo()))
    until_lsn = parse_lsn(args.until_lsn) if args.until_lsn else None  # checked before starting
    if not _reach_server(settings):
        return 0  # stopped before the server could be reached: nothing was read
    _preflight(settings)
    sink = _sink(settings)
    progress_file, catalog_dir, _ = _paths(settings)
    incremental = _incremental(settings, sink)
    if settings.load.initial and not (incremental is not None and _hand_over_load(
            settings, incremental)) and not _initial_load(settings, sink, only_pending=True):
        sink.close()  # stopped during the load: nothing to stream yet
        return 0
    service = settings.service
    state_files = _state_files(settings)
    pipeline = Pipeline(PipelineConfig(
        settings.source.conninfo(), slot=settings.source.slot,
        publication=settings.source.publication, tables=settings.source.tables,
        progress_file=progress_file, catalog_dir=catalog_dir,
        load_state=state_files.load_state, incremental_state=state_files.incremental_state,
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
        pipeline.prepare()
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
        _paths(settings)[0].with_name(f"{settings.source.slot}.incremental.json")
    return IncrementalSnapshots(settings.source.conninfo(), sink, slot=settings.source.slot,
                                publication=settings.source.publication, state_file=path,
                                chunk_size=settings.load.incremental_chunk_rows)


def _hand_over_load(settings: Settings, incremental: IncrementalSnapshots) -> bool:
    """An interrupted initial load, with incremental snapshots on: the tables it did not finish
    are queued as incremental snapshots and streaming starts at once from the slot's consistent
    point (docs/incremental-snapshot.md). False (the load resumes as usual) when there is no
    such load, or when its plan or its slot is not as the load left it."""
    from psycopg import sql

    from decoder.slot import slot_info
    from loads.load_state import COMPLETE, LoadStateStore

    store = LoadStateStore(_paths(settings)[2])
    state = store.load()
    if state is None or state.status == COMPLETE or not state.tables \
            or state.slot != settings.source.slot:
        return False
    with psycopg.connect(settings.source.conninfo(), autocommit=True) as conn:
        info = slot_info(conn, settings.source.slot)
        if info is None or info.confirmed_flush_lsn != state.consistent_point:
            return False  # the load's own checks name the data loss
        tables = [sql.Identifier(t.schema, t.name).as_string(conn)
                  for t in state.tables.values() if not t.complete]
    incremental.request(tables)  # stored before the load is marked done
    state.status = COMPLETE
    store.save(state)
    log.warning("the interrupted initial load of slot %s is completed by incremental snapshots "
                "while streaming: %s", settings.source.slot, ", ".join(tables) or "nothing left")
    return True


def _snapshot_table(settings: Settings, args: argparse.Namespace) -> int:
    """Write a signal row; the running pgcdc (run --incremental-snapshots) acts on it."""
    from loads.incremental import check_request, install_signal_table, send_signal

    dsn, publication = settings.source.conninfo(), settings.source.publication
    kind = args.action or "execute-snapshot"
    tables = [_sql_table_name(name) for name in args.snapshot_tables]
    data: dict[str, object] = {"tables": tables}
    if kind == "execute-snapshot":
        if not tables:
            msg = "snapshot-table needs at least one TABLE (schema.table) to read"
            raise ConfigError(msg)
        surrogate = [c.strip() for c in args.surrogate_key.split(",")] \
            if args.surrogate_key else None
        check_request(dsn, publication, tables, surrogate, args.from_key, args.to_key)
        data.update(surrogate_key=surrogate, from_key=args.from_key, to_key=args.to_key)
    elif args.from_key or args.to_key or args.surrogate_key:
        msg = "--from-key, --to-key and --surrogate-key go with a new snapshot, not --" + \
            kind.removesuffix("-snapshot").replace("stop", "cancel")
        raise ConfigError(msg)
    with psycopg.connect(dsn, autocommit=True) as conn:
        install_signal_table(conn)
        signal_id = send_signal(conn, kind, data)
    print(f"signal {signal_id} ({kind}) written to pgcdc.signal; the running pgcdc applies it "
          "within a second")
    return 0


def _sql_table_name(name: str) -> str:
    """A TABLE of snapshot-table read as ``--tables`` reads a name (decoder/names.py: a part
    double-quoted as in SQL, an unquoted one taken as written, case kept), written as SQL
    names it: a part that is not a plain lower-case name double-quoted."""
    from decoder.names import TableNameError, parse_table_name

    try:
        parts = parse_table_name(name)
    except TableNameError as exc:
        raise ConfigError(str(exc)) from None
    return ".".join(part if re.fullmatch(r"[a-z_][a-z0-9_$]*", part)
                    else '"' + part.replace('"', '""') + '"' for part in parts)


def _logical_types(settings: Settings) -> LogicalTypes | None:
    """Typed Avro's types (``--avro-types logical``); None for ``--avro-types text``."""
    if settings.sink.avro_types != "logical":
        return None
    from sinks.avro_logical import LogicalTypes

    return LogicalTypes.reading(settings.source.conninfo())


def _sink(settings: Settings) -> Sink:
    sink: Sink
    cfg = settings.sink
    json_options = cfg.json_options(settings.source.database())
    if cfg.kind == "kafka":
        if not cfg.bootstrap_servers:
            msg = ("--sink kafka needs --bootstrap-servers (or PGCDC_BOOTSTRAP_SERVERS, or "
                   "sink.bootstrap_servers in the config file)")
            raise ConfigError(msg)
        from confluent_kafka import KafkaException

        from sinks.kafka import KafkaSink

        if cfg.exactly_once:
            from sinks.kafka_txn import TransactionalKafkaSink

            try:
                return TransactionalKafkaSink(
                    cfg.bootstrap_servers, slot=settings.source.slot,
                    topic_prefix=cfg.topic_prefix, transactional_id=cfg.transactional_id,
                    commit_interval_ms=cfg.commit_interval_ms, commit_events=cfg.commit_events,
                    value_format=cfg.format, tombstones=cfg.tombstones,
                    transaction_topic=cfg.transaction_topic, client_config=cfg.kafka_config(),
                    json_options=json_options, schema_registry=cfg.schema_registry(),
                    logical=_logical_types(settings))
            except KafkaException as exc:  # librdkafka refused a property of sink.kafka
                msg = (f"config key 'sink.kafka' is not accepted by librdkafka: "
                       f"{exc.args[0].str()}; fix the property (CONFIGURATION.md of librdkafka "
                       "lists them)")
                raise ConfigError(msg) from None
        try:
            sink = KafkaSink(cfg.bootstrap_servers, topic_prefix=cfg.topic_prefix,
                             value_format=cfg.format, tombstones=cfg.tombstones,
                             transaction_topic=cfg.transaction_topic,
                             client_config=cfg.kafka_config(), json_options=json_options,
                             schema_registry=cfg.schema_registry(),
                             logical=_logical_types(settings))
        except KafkaException as exc:  # librdkafka refused a property of sink.kafka
            msg = (f"config key 'sink.kafka' is not accepted by librdkafka: {exc.args[0].str()}; "
                   "fix the property (CONFIGURATION.md of librdkafka lists them)")
            raise ConfigError(msg) from None
    elif cfg.exactly_once:
        msg = f"--exactly-once needs --sink kafka (got --sink {cfg.kind})"
        raise ConfigError(msg)
    elif cfg.kind == "jsonl":
        from sinks.jsonlines import JsonLinesSink

        sink = JsonLinesSink(cfg.output, options=json_options)
    else:
        from sinks.null import NullSink

        sink = NullSink()
    return sink


def _lake_snapshot(settings: Settings, lake: str, master: str) -> int:
    """``pgcdc snapshot --lake``: the initial load straight into Delta (streaming/bulk_load.py)."""
    from loads.initial_load import LoadConfig
    from streaming.bulk_load import load_lake

    _preflight(settings)
    progress_file, catalog_dir, state_file = _paths(settings)
    source = settings.source
    config = LoadConfig(source.conninfo(), state_file, slot=source.slot,
                        publication=source.publication, tables=source.tables,
                        readers=settings.load.readers,  # tables written at once
                        chunk_pages=settings.load.chunk_pages, progress_file=progress_file,
                        catalog_dir=catalog_dir)
    if load_lake(config, lake, master=None if master == "none" else master,
                 topic_prefix=settings.sink.topic_prefix):
        return 0
    print("pgcdc: the lake load was interrupted; run the same command again to resume it",
          file=sys.stderr)
    return EXIT_TRANSIENT


def _reach_server(settings: Settings) -> bool:
    """PostgreSQL not reachable yet at start: retried as during a run (pgcdc/startup.py)."""
    from pgcdc.startup import wait_for_server

    service = settings.service
    return wait_for_server(settings.source.conninfo(), max_retries=service.max_retries,
                           retry_max_delay=service.retry_max_delay)


def _preflight(settings: Settings) -> None:
    """Every check of a start before anything is created: a start that fails one leaves no
    publication or slot behind (the initial load creates the slot before it reads)."""
    from pgcdc.start_checks import preflight

    source = settings.source
    preflight(source.conninfo(), source.publication, source.tables, create=True)


def _snapshot(settings: Settings) -> int:
    _preflight(settings)
    sink = _sink(settings)
    try:
        complete = _initial_load(settings, sink, only_pending=False)
    finally:
        sink.close()
    if not complete:
        print("pgcdc: the initial load was interrupted; run the same command again to resume it",
              file=sys.stderr)
        return EXIT_TRANSIENT
    return 0


def _initial_load(settings: Settings, sink: Sink, *, only_pending: bool) -> bool:
    """Load (or resume loading) the slot's tables; progress and a summary go to stderr.
    With ``only_pending`` (for ``run``), only when the slot does not exist yet or its load
    is unfinished."""
    from functools import partial

    from loads.initial_load import InitialLoad, LoadConfig, run_until_signalled

    progress_file, catalog_dir, state_file = _paths(settings)
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
                                  sink_factory=partial(_sink, settings),
                                  chunk_pages=settings.load.chunk_pages,
                                  progress_file=progress_file, catalog_dir=catalog_dir), sink)
    if only_pending and not load.pending():
        return True
    return run_until_signalled(load)


def _status(settings: Settings, args: argparse.Namespace) -> int:
    """The report; exit 3 when the progress check finds changes lost."""
    from pgcdc.status import LOST, render, status_report

    progress_file, catalog_dir, _ = _paths(settings)
    report = status_report(settings.source.conninfo(), settings.source.slot, progress_file,
                           catalog_dir, files=_state_files(settings))
    sink = settings.sink
    if sink.kind == "kafka" and sink.bootstrap_servers:
        from confluent_kafka import KafkaException

        from pgcdc.status import topic_counts

        try:
            report["topics"] = topic_counts(sink.bootstrap_servers, sink.topic_prefix,
                                            sink.kafka_config())
        except KafkaException as exc:
            report["topics"] = f"unavailable: {exc.args[0]}"
    print(render(report, as_json=args.json))
    if str(report.get("progress_check", "")).startswith(LOST):
        print(f"pgcdc: {report['progress_check']}", file=sys.stderr)
        return EXIT_TERMINAL
    return 0


def _slot(settings: Settings, args: argparse.Namespace) -> int:
    """``pgcdc slot create|drop``: drop asks first (``--yes`` skips; no terminal, no drop)."""
    import psycopg

    from decoder.errors import SlotInUseError, SlotMissingError
    from decoder.lsn import format_lsn
    from decoder.slot import drop_slot, ensure_slot, slot_info

    slot = settings.source.slot
    if args.action == "list":
        return _slot_list(settings)
    if args.action == "drop" and not args.yes:
        if not sys.stdin.isatty():
            msg = (f'refusing to drop replication slot "{slot}" without confirmation: '
                   "stdin is not a terminal; pass --yes to drop it")
            raise ConfigError(msg)
        answer = input(f'drop replication slot "{slot}"? The server discards the WAL it keeps '
                       "for it and pgcdc cannot resume from it. Type the slot name to confirm: ")
        if answer.strip() != slot:
            print("pgcdc: not dropped", file=sys.stderr)
            return EXIT_USAGE
    with psycopg.connect(settings.source.conninfo(), autocommit=True) as conn:
        info = slot_info(conn, slot)
        if args.action == "create":
            if info is not None:
                print(f'replication slot "{slot}" already exists '
                      f"(confirmed {format_lsn(info.confirmed_flush_lsn or 0)})")
                return 0
            info = ensure_slot(conn, slot, create=True, two_phase=not args.no_two_phase)
            print(f'created replication slot "{slot}" at '
                  f"{format_lsn(info.confirmed_flush_lsn or 0)}")
            return 0
        if info is None:
            raise SlotMissingError(slot)
        if info.active_pid is not None:
            raise SlotInUseError(slot, info.active_pid)
        drop_slot(conn, slot)
        print(f'dropped replication slot "{slot}"')
        if args.all:
            _uninstall(conn)
    from decoder.restart import start_over

    files = _state_files(settings)
    if files.progress_file is not None and files.progress_file.exists():
        print(f"pgcdc: {files.progress_file} still holds the dropped slot's progress, so "
              "pgcdc run refuses to start from a new slot; "
              f"{start_over(slot, files, drop_slot=False)}", file=sys.stderr)
    return 0


def _slot_list(settings: Settings) -> int:
    """``pgcdc slot list``: every replication slot of the server, what it holds back."""
    rows = []
    with psycopg.connect(settings.source.conninfo(), autocommit=True) as conn:
        for r in conn.execute(
                "SELECT slot_name, slot_type, coalesce(plugin, '-'), coalesce(database, '-'), "
                "coalesce(active_pid::text, '-'), coalesce(confirmed_flush_lsn::text, '-'), "
                "coalesce(wal_status, '-'), coalesce(pg_size_pretty(pg_wal_lsn_diff("
                "pg_current_wal_lsn(), restart_lsn)), '-') "
                "FROM pg_replication_slots ORDER BY slot_name").fetchall():
            rows.append([str(v) for v in r])
    header = ["slot", "type", "plugin", "database", "active_pid", "confirmed_flush",
              "wal_status", "wal_held"]
    if not rows:
        print("no replication slots")
        return 0
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]
    for line in [header, *rows]:
        print("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip())
    return 0


def _uninstall(conn: psycopg.Connection[Any]) -> None:
    """What ``slot drop --all`` removes beyond the slot, and what it leaves, said."""
    from snapshot_builder import ddl

    others = [str(r[0]) for r in conn.execute(
        "SELECT slot_name FROM pg_replication_slots WHERE database = current_database() "
        "AND plugin = 'pgoutput' ORDER BY 1").fetchall()]
    if others:
        print(f"kept DDL capture: slot(s) {', '.join(others)} of this database may use it")
    else:
        for what in ddl.uninstall(conn):
            print(f"removed {what}")
    print("publications are kept (pgcdc may share one with others): DROP PUBLICATION <name> "
          "removes one pgcdc created")


def _catalog(args: argparse.Namespace) -> int:
    from decoder.lsn import parse_lsn
    from pgcdc import catalog_view
    from snapshot_builder.history import HistoryFile

    _, catalog_dir = _state_paths(args)
    if not catalog_dir.exists():
        msg = f"no catalog history in {catalog_dir}: run pgcdc first, or pass --catalog-dir"
        raise ConfigError(msg)
    history = HistoryFile(catalog_dir).load(read_only=True)  # pgcdc may be writing it
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


def _spark_kafka_options(args: argparse.Namespace) -> dict[str, str]:
    """Kafka consumer properties for Spark (the Java client's names, without the ``kafka.``
    prefix Spark wants; it is added by the job): the file first, then each --kafka-option."""
    lines: list[tuple[str, str]] = []
    if args.kafka_properties is not None:
        try:
            text = Path(args.kafka_properties).read_text()
        except OSError as exc:
            msg = f"cannot read --kafka-properties {args.kafka_properties}: {exc.strerror}"
            raise ConfigError(msg) from None
        lines += [(line, f"line {n} of {args.kafka_properties}")
                  for n, line in enumerate(text.splitlines(), 1)
                  if line.strip() and not line.lstrip().startswith(("#", "!"))]
    lines += [(option, f"--kafka-option {option.partition('=')[0]}")
              for option in args.kafka_option]
    options: dict[str, str] = {}
    for line, where in lines:
        key, sep, value = line.partition("=")
        key = key.strip().removeprefix("kafka.")
        if not sep or not key:
            msg = f"{where}: expected KEY=VALUE, e.g. security.protocol=SASL_SSL"
            raise ConfigError(msg)
        options[key] = value.strip()
    return options


def _spark(args: argparse.Namespace) -> int:
    from streaming import job
    from streaming.session import build_session

    master = None if args.master == "none" else args.master
    spark_log = args.spark_log or (Path.home() / ".local" / "state" / "pgcdc"
                                   / f"{args.topic_prefix}.spark.log")
    log.info("spark's own log lines go to %s", spark_log)
    if not log.isEnabledFor(logging.DEBUG):  # py4j logs every callback at INFO
        logging.getLogger("py4j").setLevel(logging.WARNING)
    spark = build_session("pgcdc-apply", master=master, spark_log=spark_log)
    config = job.JobConfig(args.bootstrap_servers, args.lake, args.checkpoint,
                           topic_prefix=args.topic_prefix,
                           trigger_seconds=None if args.available_now else args.trigger_seconds,
                           max_offsets_per_trigger=job.DEFAULT_MAX_OFFSETS
                           if args.max_offsets_per_trigger is None
                           else args.max_offsets_per_trigger,
                           changelog=args.changelog, optimize_every=args.optimize_every,
                           archive_dropped=args.archive_dropped,
                           kafka_options=_spark_kafka_options(args))
    query = job.start(spark, config)
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
