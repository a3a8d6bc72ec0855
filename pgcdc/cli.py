"""The ``pgcdc`` command: its verbs and options, and what each error ends as (a message and
an exit code, :mod:`pgcdc.exit_codes`; for a connection or privilege error, what to fix).

Each verb runs in its own module: ``run`` :mod:`pgcdc.run`, ``snapshot``
:mod:`pgcdc.snapshot`, ``snapshot-table`` :mod:`pgcdc.snapshot_table`, ``status``
:mod:`pgcdc.status`, ``slot`` :mod:`pgcdc.slot_admin`, ``catalog`` :mod:`pgcdc.catalog_view`,
``spark`` :mod:`pgcdc.spark_apply`, ``demo`` :mod:`pgcdc.demo`.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
from pathlib import Path
from typing import Literal

import psycopg
from psycopg import conninfo

from core.errors import ConfigError, PgcdcError, TransientError
from pgcdc.config import load_settings, redact_dsn
from pgcdc.exit_codes import EXIT_DIFFERS, EXIT_TERMINAL, EXIT_TRANSIENT, EXIT_USAGE
from pgcdc.log_format import configure_logging
from pgcdc.start_checks import PrivilegeError


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
                        help="pages per chunk, the unit of resuming (default 1024); with "
                             "--lake a Spark task's read (default 16384, 128 MB)")


def _catalog_option(parser: argparse.ArgumentParser, *,
                    default: str | None | Literal[False] = False) -> None:
    parser.add_argument("--catalog-dir", type=Path,
                        default=_env("CATALOG_DIR") if default is False else default,
                        help="the persisted catalog history "
                             "(default ~/.local/state/pgcdc/<slot>.catalog)")


_CONFIGURED = ("run", "snapshot", "status", "slot", "snapshot-table")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = None
        if args.command in _CONFIGURED:
            settings = load_settings(vars(args), config_file=args.config)
            configure_logging(settings.log.level, settings.log.format)
        else:
            configure_logging((args.log_level or _env("LOG_LEVEL", "WARNING") or "").upper(),
                              args.log_format or _env("LOG_FORMAT", "text") or "text")
        if args.command == "demo":
            return _demo(args)
        if args.command == "catalog":
            from pgcdc.catalog_view import catalog_command

            return catalog_command(args)
        if args.command == "spark":
            from pgcdc.spark_apply import spark_command

            return spark_command(args)
        assert settings is not None
        if args.command == "run":
            from pgcdc.run import run_command

            return run_command(settings, args)
        if args.command == "status":
            from pgcdc.status import status_command

            return status_command(settings, as_json=args.json)
        if args.command == "slot":
            from pgcdc.slot_admin import slot_command

            return slot_command(settings, args)
        if args.command == "snapshot-table":
            from pgcdc.snapshot_table import snapshot_table_command

            return snapshot_table_command(settings, args)
        from pgcdc.snapshot import lake_snapshot_command, snapshot_command

        if args.lake:
            return lake_snapshot_command(settings, args.lake, args.master)
        return snapshot_command(settings)
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


def _demo(args: argparse.Namespace) -> int:
    from pgcdc.demo import DemoOptions, print_report, run_demo

    results = run_demo(DemoOptions(dsn=args.dsn, bootstrap_servers=args.bootstrap_servers,
                                   output=args.output, transactions=args.transactions,
                                   seed=args.seed, value_format=args.format,
                                   schema_registry=args.schema_registry))
    return 0 if print_report(results) else EXIT_DIFFERS


if __name__ == "__main__":
    sys.exit(main())
