"""The lake model (TESTING.md T18, issue 15): random programs of DDL and DML against a real
PostgreSQL, captured by pgcdc into Kafka, applied by Spark to Delta, and every lake table
compared with its source table through the consistent-clone oracle (pgcdc.clone.compare).

A program is one run of :class:`LakeModel`, a hypothesis state machine: tables created (keyed,
or keyless with REPLICA IDENTITY FULL and duplicate rows; one name holds a quote and a
semicolon), rows inserted, updated (a key too) and deleted, columns added (no default, a
constant, a volatile one), dropped, renamed and retyped (``USING``), tables truncated, renamed,
dropped, dropped and created again, savepoints rolled back with DDL inside, prepared
transactions committed and rolled back with DDL inside, tables moved to another schema
and back (``SET SCHEMA``), columns of the program's own types (an enum given new labels, one
of them renamed; a domain; a composite given new attributes, which
changes every stored value of it without a row change in the WAL), partitioned tables (range
partitions, key updates moving rows between them, tables attached with rows, partitions
detached, dropped and truncated alone; each program's publication via the root or not, the
setting flipped while partitioned tables are published); between steps pgcdc
captures what was written (a new pipeline each time, so every capture is a restart on the
persisted catalog history) and Spark applies it.  At the end the lake must hold exactly the
source's tables, each equal.

The source is the oracle, so the model keeps only what makes valid SQL (tables, columns and
their types).  Every statement is kept in :attr:`Program.statements`: a failure prints the
program as SQL, replayable by hand.  With a :class:`Rig` whose ``kills`` is set (the bench,
bench/lake_model.py), captures run ``pgcdc run`` as a process killed with -9 at a random
moment instead, and the final capture finishes from what the killed ones left; half the
applies first run ``pgcdc spark`` as a process killed with -9 at a random moment.
"""

from __future__ import annotations

import itertools
import os
import random
import shlex
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule
from psycopg import sql

from core import wire
from decoder.slot import current_wal_lsn, ensure_publication
from loads.incremental import IncrementalSnapshots
from loads.initial_load import LoadConfig
from pgcdc.clone import compare
from pgcdc.exit_codes import EXIT_TRANSIENT
from pgcdc.pipeline import Pipeline, PipelineConfig
from pgcdc.services.postgres import PostgresServer
from sinks.avro_logical import LogicalTypes
from sinks.debezium_json import PGCDC_JSON
from sinks.kafka import KafkaSink
from streaming import job
from streaming.apply import table_path
from streaming.bulk_load import LakeLoad
from tests.fixtures.fix_pg import _database
from tests.recording_sink import NoSink

Conn = psycopg.Connection[tuple[object, ...]]

NAMES = ("t", "u", 'we"ird;name')  # a quote and a semicolon: quoting and topic names
# each column type: the value of row g (an SQL expression of g), a constant default, a volatile
TYPES: dict[str, tuple[str, str, str]] = {
    "int": ("{g}", "7", "(random() * 1000)::int"),
    "bigint": ("({g})::bigint * 1000003", "7000000", "(random() * 1e9)::bigint"),
    "text": ("'t' || ({g})", "'d'", "md5(random()::text)"),
    "numeric(10,2)": ("({g})::numeric / 4", "4.25", "(random() * 100)::numeric(10,2)"),
    "boolean": ("({g}) % 2 = 0", "true", "random() < 0.5"),
    "date": ("date '2000-01-01' + ({g})", "'2020-02-02'", "current_date - (random() * 999)::int"),
    "timestamptz": ("timestamptz '2000-01-01 00:00:00+00' + ({g}) * interval '61.5 seconds'",
                    "'2020-02-02 10:00:00+00'", "now() - random() * interval '999 days'"),
    # read on the JVM by the lake load in a form of their own (streaming/jdbc_read.py): a
    # float4 as a double, an unconstrained numeric as Python's spelling of it (0E-8, 1.2E-7,
    # NaN), a timestamp as microseconds (infinity as the extreme long)
    "real": ("({g})::real / 3", "1.5", "random()::real"),
    "numeric": ("CASE WHEN ({g}) % 5 = 0 THEN 'NaN' ELSE ({g}) * 0.00000001 END::numeric",
                "'NaN'", "(random() * 1e-6)::numeric"),
    "timestamp": ("timestamp '1999-12-31 23:59:59.5' + ({g}) * interval '1 day 0.25 seconds'",
                  "'infinity'", "localtimestamp - random() * interval '999 days'"),
    # a text (a domain over it) TOASTed out of line (6,400 characters, incompressible): an
    # update that leaves it as it was does not send it again (streaming/toast.py)
    "big": ("(SELECT string_agg(md5(({g})::text || h::text), '') FROM generate_series(1, 200) h)",
            "'d'", "md5(random()::text)"),
    # strings in the lake: JSON kept as the server prints it, an array as JSON, bytes, an
    # interval as ISO 8601 (docs/types.md); {{ and }} are braces (the values are formatted)
    "jsonb": ("jsonb_build_object('g', {g}, 'l', jsonb_build_array({g}, NULL, 'x'))",
              "'{{\"d\": [1, 2]}}'", "jsonb_build_object('r', random())"),
    "int[]": ("ARRAY[{g}, NULL, ({g}) * 2]", "'{{7,8}}'", "ARRAY[(random() * 9)::int]"),
    "bytea": ("decode(md5(({g})::text), 'hex')", "'\\x00ff'",
              "decode(md5(random()::text), 'hex')"),
    "interval": ("({g}) * interval '1 day 3.5 seconds'", "'1 mon'",
                 "random() * interval '9 days'"),
    # the program's own types (:data:`USER_TYPES`): an enum that gains labels, a domain, a
    # composite that gains attributes ({extra}: a NULL for each one added)
    "mood": ("(enum_range(NULL::mood))[1 + abs({g}) % cardinality(enum_range(NULL::mood))]",
             "'calm'", "(enum_range(NULL::mood))[1 + floor(random() * 2)::int]"),
    "amount": ("({g})::numeric / 8", "2.5", "(random() * 100)::numeric(12,2)"),
    "pair": ("ROW({g}, 'p' || ({g}){extra})::pair", "ROW(1, 'd'{extra})::pair",
             "ROW((random() * 9)::int, md5(random()::text){extra})::pair"),
}
USER_TYPES = ("CREATE TYPE mood AS ENUM ('calm', 'busy')",
              "CREATE DOMAIN amount AS numeric(12,2)",
              "CREATE TYPE pair AS (a int, b text)",
              "CREATE DOMAIN big AS text",
              # tables move between two schemas (SET SCHEMA); the program names them
              # unqualified, through its search path (a name is unique across both)
              "CREATE SCHEMA side", "SET search_path TO public, side")
SCHEMAS = ("public", "side")
_programs = itertools.count()
AUXILIARY = ("__tombstones", "__changelog")  # the apply's own tables beside a lake table
# a program's listing: where it captured (pgcdc run, killed with -9 in the bench) and applied
CAPTURE = "-- capture"
APPLY = "-- apply"
# how a program's captures encode values (its listing's first line names any but Avro's text):
# Avro with text for the types Avro has no primitive for (the default), typed Avro
# (--avro-types logical), pgcdc's JSON (--format json --json-mode pgcdc)
ENCODINGS = ("avro", "logical", "json")
ENCODING = "-- encoding "
# a program that loads its first table into the lake (``pgcdc snapshot --lake``: the load
# creates the slot at its snapshot, and the stream goes on from there): its listing's line
# :data:`LOADED` before any statement, :data:`LAKE_LOAD` where it loaded
LOADED = "-- loaded"
LAKE_LOAD = "-- lake load"
_ENCODING_FLAGS = {"avro": [], "logical": ["--avro-types", "logical"],
                   "json": ["--format", "json", "--json-mode", "pgcdc"]}
_ENCODED = {"avro": (wire.FORMAT_AVRO, wire.AVRO_TYPES_TEXT),  # what the catalog records
            "logical": (wire.FORMAT_AVRO, wire.AVRO_TYPES_LOGICAL),
            "json": (wire.FORMAT_JSON, "")}


@dataclass
class Rig:
    """What every program runs on: one PostgreSQL cluster, Kafka, a Spark session."""

    server: PostgresServer
    kafka: str
    spark: Any
    root: Path
    kills: random.Random | None = None  # the bench: kill -9 ``pgcdc run`` at each capture
    driver_kill_rate: float = 0.5  # with kills: the share of applies that kill a driver first
    timeout: float = 300.0
    encoding: str = "avro"  # the next programs' (:data:`ENCODINGS`)
    killed: int = 0  # ``pgcdc run`` processes killed
    load_kills: int = 0  # ``pgcdc snapshot --lake`` processes killed
    driver_kills: int = 0  # ``pgcdc spark`` processes killed
    # with kills: the share of ``pgcdc run`` processes during which PostgreSQL crashes, and of
    # the lake loads it crashes under instead of a kill (the bench's own server: a crash
    # ends every session of the cluster)
    crash_rate: float = 0.0
    crashes: int = 0  # PostgreSQL crashes


@dataclass
class Table:
    name: str
    keyed: bool  # a primary key ``id``; else REPLICA IDENTITY FULL, ``k`` and duplicates
    columns: dict[str, str] = field(default_factory=dict)  # name -> type, but the key
    schema: str = "public"
    # a partitioned table (keyed, by range of ``r``, a column of its primary key besides
    # ``id``): each partition's name -> i, for the range [10 i, 10 i + 10); None: a table
    partitions: dict[str, int] | None = None
    pk: str = ""  # the name of its primary key constraint

    @property
    def key(self) -> str:
        return "id" if self.keyed else "k"


class Program:
    """One program's database, topics, catalog, lake and the SQL it ran."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        number = next(_programs)
        self.slot = f"model{os.getpid()}_{number}"
        self.prefix = self.slot
        self.home = rig.root / self.slot
        self.home.mkdir(parents=True)
        self._exit = ExitStack()
        self.dsn = self._exit.enter_context(_database(rig.server))
        self.conn: Conn = psycopg.connect(self.dsn, autocommit=True)
        self._exit.callback(self.conn.close)
        self.statements: list[str] = []
        self.encoding = rig.encoding
        if self.encoding != "avro":
            self.statements.append(f"{ENCODING}{self.encoding}")
        self.lake = (self.home / "lake").as_uri()
        self.checkpoint = (self.home / "cp").as_uri()
        self.loaded = False  # the lake load creates the slot (:data:`LOADED`)
        self._started = False
        self._spawned = 0  # pgcdc processes run (their logs' numbers)

    def _start(self) -> None:
        """Before the first write: the publication (FOR ALL TABLES), and the slot unless
        the program's lake load creates it."""
        if self._started:
            return
        self._started = True
        if self.loaded:
            ensure_publication(self.conn, "pgcdc", None, create=True)
        else:
            Pipeline(self._config(), NoSink()).prepare()

    def close(self) -> None:
        self._exit.close()

    def _config(self) -> PipelineConfig:
        return PipelineConfig(self.dsn, slot=self.slot, tables=None, status_interval=0.2,
                              catalog_dir=self.home / "catalog",
                              progress_file=self.home / "progress.json")

    def run(self, *statements: sql.Composable | str) -> None:
        """Execute in one implicit transaction each (autocommit), as written; the lines
        :data:`CAPTURE`, :data:`APPLY` and :data:`LAKE_LOAD` capture, apply and load
        instead (a program's listing holds them where its steps did, so that it replays as
        it ran), a line :data:`ENCODING` ``<encoding>`` sets how the captures encode
        values, and :data:`LOADED`, before any other step, that the lake load creates the
        slot."""
        for statement in statements:
            text = statement if isinstance(statement, str) else statement.as_string(self.conn)
            if text.startswith(ENCODING):
                self.encoding = text.removeprefix(ENCODING).rstrip(";").strip()
                assert self.encoding in ENCODINGS, text
                self.statements.append(f"{ENCODING}{self.encoding}")
            elif text == LOADED:
                assert not self._started, "a program is loaded from its start"
                self.loaded = True
                self.statements.append(LOADED)
            elif text == CAPTURE:
                self.capture()
            elif text == APPLY:
                self.apply()
            elif text == LAKE_LOAD:
                self.lake_load()
            else:
                self._start()
                self.statements.append(text)
                self.conn.execute(text.encode())

    # --- capture and apply --------------------------------------------------------------

    def capture(self) -> None:
        """pgcdc until everything written so far is durable in Kafka and every table a DDL
        asked to read again was read (incremental snapshots)."""
        self._start()
        assert not self.loaded or (self.home / "load.json").exists(), \
            "a loaded program captures after its lake load"
        self.statements.append(CAPTURE)
        if self.rig.kills is not None:
            self._capture_killed()
        sink = self._sink()
        snapshots = IncrementalSnapshots(self.dsn, sink, slot=self.slot,
                                         state_file=self.home / "incremental.json",
                                         chunk_size=50, poll_interval=0.1)
        pipeline = Pipeline(self._config(), sink, incremental=snapshots)
        pipeline.prepare()
        stop = threading.Event()
        failure: list[BaseException] = []

        def stream() -> None:
            try:
                pipeline.run(stop=stop)
            except BaseException as exc:
                failure.append(exc)

        thread = threading.Thread(target=stream, daemon=True)
        thread.start()
        snapshots.start()
        try:
            def durable() -> bool:
                return pipeline.progress.durable_lsn >= target

            target = current_wal_lsn(self.conn)
            self._until(durable, failure, "the stream")
            self._until(lambda: snapshots.idle, failure, "the tables read again")
            target = current_wal_lsn(self.conn)
            self._until(durable, failure, "the stream after the tables read again")
        finally:
            snapshots.stop()
            stop.set()
            thread.join(60)
            sink.close()
        assert not failure, failure
        assert snapshots.error is None, snapshots.error
        # "gone": a table pgcdc asked to read again was dropped before its turn;
        # "unpublished": one it asked for is not in the publication (a partition moved)
        assert all(d["status"] in ("complete", "gone", "unpublished")
                   for d in snapshots.state.done), \
            snapshots.state.done

    def _sink(self) -> KafkaSink:
        """The sink of a capture, writing the program's encoding."""
        if self.encoding == "json":
            return KafkaSink(self.rig.kafka, topic_prefix=self.prefix, value_format="json",
                             json_options=PGCDC_JSON)
        logical = LogicalTypes.reading(self.dsn) if self.encoding == "logical" else None
        return KafkaSink(self.rig.kafka, topic_prefix=self.prefix, logical=logical)

    def _until(self, condition: Any, failure: list[BaseException], what: str) -> None:
        deadline = time.monotonic() + self.rig.timeout
        while not condition():
            assert not failure, f"pgcdc failed waiting for {what}: {failure[0]!r}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)

    def _capture_killed(self) -> None:
        """``pgcdc run`` as a process, killed with -9 after a random while."""
        rng = self.rig.kills
        assert rng is not None
        process, log = self.start_run()
        time.sleep(rng.uniform(0.3, 4.0))
        if self.rig.crash_rate and rng.random() < self.rig.crash_rate:
            self.crash_server()  # while pgcdc streams: it reconnects once the server is back
            time.sleep(rng.uniform(0.5, 4.0))
        if process.poll() is not None:
            msg = f"pgcdc run exited {process.returncode} before the kill:\n{_tail(log)}"
            raise AssertionError(msg)
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=30)
        self.rig.killed += 1

    def crash_server(self) -> None:
        """``pg_ctl stop -m immediate`` (no shutdown checkpoint: the slot may come back
        behind what pgcdc confirmed), started again; the program's connection made again."""
        self.rig.server.stop("immediate")
        self.rig.server.start()
        self.rig.crashes += 1
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        self._exit.callback(self.conn.close)
        for statement in self.statements:  # the session's settings (the search path) again
            if statement.upper().startswith("SET "):
                self.conn.execute(statement.encode())

    def start_run(self) -> tuple[subprocess.Popen[bytes], Path]:
        """``pgcdc run`` as a process of its own, streaming the program's slot into its
        topics in its encoding; its stderr's file."""
        argv = [sys.executable, "-m", "pgcdc", "run", "--dsn", self.dsn, "--slot", self.slot,
                "--sink", "kafka", "--bootstrap-servers", self.rig.kafka,
                "--topic-prefix", self.prefix, "--progress-file",
                str(self.home / "progress.json"), "--catalog-dir", str(self.home / "catalog"),
                "--incremental-snapshots", "--incremental-state",
                str(self.home / "incremental.json"), *_ENCODING_FLAGS[self.encoding]]
        return self._spawn(argv)

    def apply(self) -> None:
        """``pgcdc spark --available-now``, in this process's Spark session (in the bench,
        by default half the time after a ``pgcdc spark`` process killed with -9 mid-way)."""
        self._start()
        self.statements.append(APPLY)
        if self.rig.kills is not None and self.rig.kills.random() < self.rig.driver_kill_rate:
            self._apply_killed()
        config = job.JobConfig(self.rig.kafka, self.lake, self.checkpoint,
                               topic_prefix=self.prefix, trigger_seconds=None)
        job.start(self.rig.spark, config).awaitTermination()

    def lake_load(self) -> None:
        """``pgcdc snapshot --lake``: every published table into the lake under the slot's
        exported snapshot, without Kafka (streaming/bulk_load.py; in the bench, first as a
        process killed with -9 at a random moment, which the load here resumes)."""
        assert self.loaded and self._started, "a lake load is the loaded program's first"
        self.statements.append(LAKE_LOAD)
        state = self.home / "load.json"
        paths = ["--load-state", str(state), "--progress-file", str(self.home / "progress.json"),
                 "--catalog-dir", str(self.home / "catalog")]
        if self.rig.kills is not None:
            argv = [sys.executable, "-m", "pgcdc", "snapshot", "--dsn", self.dsn, "--slot",
                    self.slot, "--lake", self.lake, "--topic-prefix", self.prefix,
                    "--chunk-pages", "1", "--readers", "1", *paths]
            after = self.rig.kills.uniform(3.0, 40.0)
            if self.rig.crash_rate and self.rig.kills.random() < self.rig.crash_rate:
                self._crashed_under(argv, after, "pgcdc snapshot --lake")
            elif self._killed(argv, after, "pgcdc snapshot --lake"):
                self.rig.load_kills += 1
        config = LoadConfig(self.dsn, state, slot=self.slot, chunk_pages=1, readers=2,
                            progress_file=self.home / "progress.json",
                            catalog_dir=self.home / "catalog")
        summary = LakeLoad(config, self.rig.spark, self.lake, topic_prefix=self.prefix).run()
        assert summary.complete, "\n".join(summary.lines())

    def _killed(self, argv: list[str], after: float, what: str) -> bool:
        """Run ``argv``, killed with -9 after ``after`` seconds unless it ended first
        (successfully: anything else fails the program); True when killed."""
        process, log = self._spawn(argv)
        try:
            process.communicate(timeout=after)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
            process.communicate(timeout=60)
            return True
        if process.returncode != 0:
            msg = f"{what} exited {process.returncode} before the kill:\n{_tail(log)}"
            raise AssertionError(msg)
        return False

    def _crashed_under(self, argv: list[str], after: float, what: str) -> None:
        """Run ``argv``, and crash PostgreSQL under it after ``after`` seconds unless it ended
        first; it must then end by itself, with a transient error (the exit code that says
        to run it again) or having finished."""
        process, log = self._spawn(argv)
        try:
            process.communicate(timeout=after)
        except subprocess.TimeoutExpired:
            self.crash_server()
            try:
                process.communicate(timeout=self.rig.timeout)
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGKILL)
                process.communicate(timeout=60)
                msg = f"{what} did not end after PostgreSQL crashed under it:\n{_tail(log)}"
                raise AssertionError(msg) from None
        if process.returncode not in (0, EXIT_TRANSIENT):
            msg = f"{what} exited {process.returncode}:\n{_tail(log)}"
            raise AssertionError(msg)

    def _spawn(self, argv: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
        """A pgcdc process; its stderr goes to a file of the program's folder (numbered in
        the order the processes ran: a failing program's folder, which the bench can keep,
        says what each did before its kill)."""
        self._spawned += 1
        log = self.home / f"{self._spawned:02d}-pgcdc-{argv[3]}.log"
        with log.open("wb") as err:
            err.write(f"{shlex.join(argv)}\n".encode())
            err.flush()
            return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err), log

    def _apply_killed(self) -> None:
        """``pgcdc spark`` as a process (a driver of its own, small micro-batches), killed
        with -9 after a random while: before its first batch, between two, or inside one."""
        rng = self.rig.kills
        assert rng is not None
        argv = [sys.executable, "-m", "pgcdc", "spark", "--bootstrap-servers", self.rig.kafka,
                "--topic-prefix", self.prefix, "--lake", self.lake, "--checkpoint",
                self.checkpoint, "--available-now", "--max-offsets-per-trigger", "40",
                "--spark-log", str(self.home / "spark.log")]
        if self._killed(argv, rng.uniform(8.0, 45.0), "pgcdc spark"):
            self.rig.driver_kills += 1

    def check(self) -> None:
        """The lake holds exactly the source's tables, each equal to its source."""
        self.capture()
        self.apply()
        config = job.JobConfig(self.rig.kafka, self.lake, self.checkpoint,
                               topic_prefix=self.prefix)
        catalog = job.read_catalog(self.rig.spark, config)
        # every table a lake table may exist for (a lake load writes tables the stream may
        # never have published)
        tables = [s for s in catalog.known_tables() if s.schema in SCHEMAS]  # not pgcdc's
        listing = "\n".join(self.statements)
        # as streamed: the stream's records (a version only the history holds, one no event
        # was written under since the stream last described the table, has no format)
        encoded = {(s.value_format, s.avro_types if s.value_format == wire.FORMAT_AVRO else "")
                   for s in catalog.log.tables() if s.schema in SCHEMAS}
        assert encoded <= {_ENCODED[self.encoding]}, \
            f"the catalog's tables are encoded {encoded}, not as {self.encoding}"
        source = {(str(r[0]), str(r[1])): int(str(r[2])) for r in self.conn.execute(
            "SELECT schemaname::text, tablename::text, (xpath('/row/c/text()', query_to_xml("
            "format('SELECT count(*) AS c FROM %%I.%%I', schemaname, tablename), false, true, "
            "'')))[1]::text::bigint FROM pg_publication_tables "
            "WHERE pubname = 'pgcdc' AND schemaname = ANY(%s)", [list(SCHEMAS)]).fetchall()}
        folder = self.home / "lake"
        # (a lake load also loads pgcdc's own tables, published FOR ALL TABLES as well)
        held = sorted(p.name for p in folder.iterdir() if not p.name.startswith("_")
                      and not p.name.startswith("pgcdc.")
                      and not p.name.endswith(AUXILIARY)) if folder.exists() else []
        # the catalog also names tables no event ever reached (under a publication via the
        # root, its partitions): they have no lake table
        tables = [s for s in tables if Path(table_path(self.lake, s)).name in held]
        assert held == sorted(Path(table_path(self.lake, s)).name for s in tables), \
            f"the lake holds {held}, tables the catalog does not name; program:\n{listing}"
        lake = {(s.schema, s.name) for s in tables}
        assert lake <= set(source), \
            f"the lake holds tables the source has not: {lake - set(source)}; program:\n{listing}"
        # a table no event ever reached has no lake table yet: it must be empty
        assert all(source[name] == 0 for name in set(source) - lake), \
            f"tables missing from the lake: {set(source) - lake}; program:\n{listing}"
        with psycopg.connect(self.dsn) as conn:
            results = compare(conn, self.rig.spark, self.lake, tables)
        unequal = [r for r in results if not r.equal]
        assert not unequal, f"lake differs from source: {unequal}; program:\n{listing}"
        # and no column more (compare reads the source's columns only): a dropped column
        # left behind is a lake that is no clone
        for spec in tables:
            frame = self.rig.spark.read.format("delta").load(table_path(self.lake, spec))
            extra = sorted(set(frame.columns) - {c.name for c in spec.columns}
                           - {c for c in frame.columns if c.startswith("_pgcdc_")})
            assert not extra, (f"the lake table of {spec.qualified_name} has columns the source "
                               f"has not: {extra}; program:\n{listing}")
        if os.environ.get("PGCDC_MODEL_VERBOSE"):
            rows = ", ".join(f"{r.table} {r.source.rows} rows" for r in results)
            print(f"\n-- program {self.slot}: equal ({rows})\n{listing}")


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


def _ident(name: str) -> sql.Identifier:
    return sql.Identifier(name)


class LakeModel(RuleBasedStateMachine):
    """One program; :func:`machine` binds it to a :class:`Rig`."""

    rig: Rig

    def __init__(self) -> None:
        super().__init__()
        self.program = Program(self.rig)
        self.tables: dict[str, Table] = {}
        self.serial = 0  # column names, row numbers, transaction ids
        self.pair_added = 0  # attributes added to the composite ``pair``
        self.labels: list[str] = []  # labels added to the enum ``mood``
        self.via_root = False  # the publication publishes partitioned tables via the root
        # each table's primary key named apart: a key index keeps its name through renames
        # and moves, so "t_pkey" of a table renamed and moved back would collide with the
        # index of a new "t" (PostgreSQL refuses the move: the program, not pgcdc, failed)
        self.keys_named = 0

    def _next(self) -> int:
        self.serial += 1
        return self.serial

    def _expr(self, kind: str, which: int, g: str = "g") -> str:
        """Column type ``kind``'s value (0), constant default (1) or volatile default (2)."""
        return TYPES[kind][which].format(g=g, extra=", NULL" * self.pair_added)

    def _key_name(self) -> str:
        self.keys_named += 1
        return f"pk{self.keys_named}"

    def _pick(self, pick: int) -> Table:
        return self.tables[sorted(self.tables)[pick % len(self.tables)]]

    def _create(self, name: str, keyed: bool, kinds: list[str], rows: int = 0,
                partitioned: bool = False) -> None:
        table = Table(name, keyed, {f"c{self._next()}": kind for kind in kinds})
        table.pk = self._key_name()
        key = sql.SQL("CONSTRAINT {} PRIMARY KEY").format(_ident(table.pk))
        columns: list[sql.Composable] = [sql.SQL("id int {}").format(key) if keyed
                                         else sql.SQL("k int")]
        if partitioned:
            columns = [sql.SQL("id int"), sql.SQL("r int")]
        columns += [sql.SQL("{} {}").format(_ident(c), sql.SQL(kind))
                    for c, kind in table.columns.items()]
        if partitioned:
            columns.append(sql.SQL("{} (id, r)").format(key))
        self.program.run(sql.SQL("CREATE TABLE {} ({}){}").format(
            _ident(name), sql.SQL(", ").join(columns),
            sql.SQL(" PARTITION BY RANGE (r)" if partitioned else "")))
        if partitioned:
            table.partitions = {}
            for i in (0, 1):
                self._partition_of(table, i)
        if not keyed:
            self.program.run(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL")
                             .format(_ident(name)))
        self.tables[name] = table
        if rows:
            self.program.run(self._rows(table, rows, 2))

    def _rows(self, table: Table, count: int, copies: int = 1,
              into: str | None = None) -> sql.Composed:
        """Rows for ``table`` (inserted into ``into``: a table to attach as its partition)."""
        first = self._next() * 1000
        self.serial += count
        names = [table.key, *table.columns]
        values = ["g" if table.keyed else "g % 3"]
        if table.partitions is not None:
            names.insert(1, "r")
            values.append(self._range_value(table, "g", only=table.partitions.get(into or "")))
        values += [self._expr(kind, 0) for kind in table.columns.values()]
        return sql.SQL("INSERT INTO {} ({}) SELECT {} FROM generate_series({}, {}) g, "
                       "generate_series(1, {}) n").format(
            _ident(into or table.name), sql.SQL(", ").join(map(_ident, names)),
            sql.SQL(", ").join(map(sql.SQL, values)), first, first + count - 1,
            1 if table.keyed else copies)

    @staticmethod
    def _range_value(table: Table, g: str, only: int | None = None) -> str:
        """A value of ``r`` for row ``g`` in one of the table's partitions (or in ``only``)."""
        assert table.partitions
        ranges = [only] if only is not None else sorted(table.partitions.values())
        array = ", ".join(map(str, ranges))
        return f"(ARRAY[{array}])[1 + abs({g}) % {len(ranges)}] * 10 + abs({g}) % 10"

    def _partition_of(self, table: Table, i: int) -> str:
        name = f"part{self._next()}"
        self.program.run(sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})")
                         .format(_ident(name), _ident(table.name), i * 10, i * 10 + 10))
        assert table.partitions is not None
        table.partitions[name] = i
        return name

    def _partitioned(self, pick: int) -> Table | None:
        roots = [t for _, t in sorted(self.tables.items()) if t.partitions]
        return roots[pick % len(roots)] if roots else None

    def _one(self, table: Table, residue: int) -> sql.Composable:
        """Rows of a keyed table by residue; exactly one row of a keyless one."""
        if table.keyed:
            return sql.SQL("{} % 3 = {}").format(_ident(table.key), residue)
        return sql.SQL("ctid IN (SELECT ctid FROM {} WHERE k = {} LIMIT 1)").format(
            _ident(table.name), residue)

    # --- rules ----------------------------------------------------------------------------

    @initialize(keyed=st.booleans(), kinds=st.lists(st.sampled_from(sorted(TYPES)),
                                                    min_size=1, max_size=3),
                rows=st.integers(0, 20), via_root=st.booleans(), loaded=st.booleans(),
                partitioned=st.booleans())
    def first_table(self, keyed: bool, kinds: list[str], rows: int, via_root: bool,
                    loaded: bool, partitioned: bool) -> None:
        """The program's types and first table; ``loaded``: the table loaded into the lake
        (``pgcdc snapshot --lake``), the slot created at the load's snapshot (a partition
        tree then older than the slot)."""
        if loaded:
            self.program.run(LOADED)
        self.program.run(*USER_TYPES)
        if via_root:  # partitioned tables published as their root, else as their partitions
            self.program.run("ALTER PUBLICATION pgcdc SET (publish_via_partition_root = true)")
        self.via_root = via_root
        self._create("t", keyed or partitioned, kinds, rows, partitioned)
        if loaded:
            self.program.run(LAKE_LOAD)

    @precondition(lambda self: len(self.tables) < len(NAMES))
    @rule(name=st.sampled_from(NAMES), keyed=st.booleans(),
          kinds=st.lists(st.sampled_from(sorted(TYPES)), max_size=3), rows=st.integers(0, 20),
          partitioned=st.booleans())
    def create_table(self, name: str, keyed: bool, kinds: list[str], rows: int,
                     partitioned: bool) -> None:
        if name not in self.tables:  # a partitioned table has a key
            self._create(name, keyed or partitioned, kinds, rows, partitioned)

    @precondition(lambda self: self.tables)
    @rule(pick=st.integers(0, 99), count=st.integers(1, 30), copies=st.integers(1, 3))
    def insert(self, pick: int, count: int, copies: int) -> None:
        table = self._pick(pick)
        self.program.run(self._rows(table, count, copies))

    @precondition(lambda self: self.tables)
    @rule(pick=st.integers(0, 99), residue=st.integers(0, 2))
    def update(self, pick: int, residue: int) -> None:
        table = self._pick(pick)
        if table.columns:
            column, kind = sorted(table.columns.items())[residue % len(table.columns)]
            value = sql.SQL(self._expr(kind, 0, f"{table.key} + {self._next()}"))
        elif table.keyed:
            return  # update_key changes keys
        else:
            column, value = table.key, sql.SQL("k + 3")
        self.program.run(sql.SQL("UPDATE {} SET {} = {} WHERE {}").format(
            _ident(table.name), _ident(column), value, self._one(table, residue)))

    @precondition(lambda self: any(t.keyed for t in self.tables.values()))
    @rule(pick=st.integers(0, 99), residue=st.integers(0, 2))
    def update_key(self, pick: int, residue: int) -> None:
        """Keys negated; in a partitioned table, rows moved to another partition too."""
        table = self._pick(pick)
        if table.keyed:
            moved = sql.SQL("")
            if table.partitions:
                moved = sql.SQL(", r = " + self._range_value(table, f"id + {self._next()}"))
            self.program.run(sql.SQL("UPDATE {} SET id = -id{} WHERE id % 3 = {} AND id > 0")
                             .format(_ident(table.name), moved, residue))

    @precondition(lambda self: self.tables)
    @rule(pick=st.integers(0, 99), residue=st.integers(0, 2))
    def delete(self, pick: int, residue: int) -> None:
        table = self._pick(pick)
        self.program.run(sql.SQL("DELETE FROM {} WHERE {}").format(
            _ident(table.name), self._one(table, residue)))

    @precondition(lambda self: self.tables)
    @rule(pick=st.integers(0, 99), kind=st.sampled_from(sorted(TYPES)),
          default=st.sampled_from(["none", "constant", "volatile"]))
    def add_column(self, pick: int, kind: str, default: str) -> None:
        table = self._pick(pick)
        column = f"c{self._next()}"
        clause = {"none": "", "constant": f" DEFAULT {self._expr(kind, 1)}",
                  "volatile": f" DEFAULT {self._expr(kind, 2)}"}[default]
        self.program.run(sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(
            _ident(table.name), _ident(column), sql.SQL(kind + clause)))
        table.columns[column] = kind
        self.program.run(self._rows(table, 3))

    @precondition(lambda self: any(t.columns for t in self.tables.values()))
    @rule(pick=st.integers(0, 99), which=st.integers(0, 9))
    def drop_column(self, pick: int, which: int) -> None:
        table = self._pick(pick)
        if table.columns:
            column = sorted(table.columns)[which % len(table.columns)]
            self.program.run(sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(
                _ident(table.name), _ident(column)))
            del table.columns[column]
            self.program.run(self._rows(table, 3))

    @precondition(lambda self: any(t.columns for t in self.tables.values()))
    @rule(pick=st.integers(0, 99), which=st.integers(0, 9))
    def rename_column(self, pick: int, which: int) -> None:
        table = self._pick(pick)
        if table.columns:
            column = sorted(table.columns)[which % len(table.columns)]
            new = f"c{self._next()}"
            self.program.run(sql.SQL("ALTER TABLE {} RENAME COLUMN {} TO {}").format(
                _ident(table.name), _ident(column), _ident(new)))
            table.columns[new] = table.columns.pop(column)
            self.program.run(self._rows(table, 3))

    @precondition(lambda self: any(t.columns for t in self.tables.values()))
    @rule(pick=st.integers(0, 99), which=st.integers(0, 9))
    def retype_column(self, pick: int, which: int) -> None:
        """int -> bigint (USING a new value), anything else -> text (USING a cast)."""
        table = self._pick(pick)
        if not table.columns:
            return
        column = sorted(table.columns)[which % len(table.columns)]
        kind = "bigint" if table.columns[column] == "int" else "text"
        using = sql.SQL("{} * 10" if kind == "bigint" else "{}::text").format(_ident(column))
        self.program.run(sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE {} USING {}").format(
            _ident(table.name), _ident(column), sql.SQL(kind), using))
        table.columns[column] = kind
        self.program.run(self._rows(table, 3))

    @precondition(lambda self: self.tables and len(self.tables) < len(NAMES))
    @rule(pick=st.integers(0, 99), to=st.sampled_from(NAMES))
    def rename_table(self, pick: int, to: str) -> None:
        table = self._pick(pick)
        if to in self.tables:
            return
        self.program.run(sql.SQL("ALTER TABLE {} RENAME TO {}").format(
            _ident(table.name), _ident(to)))
        del self.tables[table.name]
        table.name = to
        self.tables[to] = table
        self.program.run(self._rows(table, 2))

    @precondition(lambda self: self.tables)
    @rule(pick=st.integers(0, 99))
    def move_schema(self, pick: int) -> None:
        """``SET SCHEMA`` to the other schema (the publication is FOR ALL TABLES)."""
        table = self._pick(pick)
        to = SCHEMAS[1 - SCHEMAS.index(table.schema)]
        self.program.run(sql.SQL("ALTER TABLE {} SET SCHEMA {}").format(
            _ident(table.name), _ident(to)))
        table.schema = to
        self.program.run(self._rows(table, 2))

    @rule(residue=st.integers(0, 2))
    def enum_label_added(self, residue: int) -> None:
        """A label added to ``mood`` and given to rows that have a ``mood`` column."""
        label = f"m{self._next()}"
        self.program.run(f"ALTER TYPE mood ADD VALUE '{label}'")
        self.labels.append(label)
        for table in self.tables.values():
            for column in (c for c, kind in table.columns.items() if kind == "mood"):
                self.program.run(sql.SQL("UPDATE {} SET {} = {} WHERE {}").format(
                    _ident(table.name), _ident(column), sql.Literal(label),
                    self._one(table, residue)))

    @precondition(lambda self: self.labels)
    @rule()
    def enum_label_renamed(self) -> None:
        """The newest label added to ``mood`` renamed: every value holding it reads anew."""
        label = f"m{self._next()}"
        self.program.run(f"ALTER TYPE mood RENAME VALUE '{self.labels[-1]}' TO '{label}'")
        self.labels[-1] = label

    @rule()
    def composite_attribute_added(self) -> None:
        """An attribute added to ``pair``: every value of it gains a NULL field, in place."""
        self.program.run(f"ALTER TYPE pair ADD ATTRIBUTE x{self._next()} int")
        self.pair_added += 1
        for table in self.tables.values():
            if "pair" in table.columns.values():
                self.program.run(self._rows(table, 2))

    @precondition(lambda self: any(t.partitions for t in self.tables.values()))
    @rule(pick=st.integers(0, 99), rows=st.integers(0, 8))
    def attach_partition(self, pick: int, rows: int) -> None:
        """A table of the root's columns (``LIKE``: its own column order where the root
        has dropped columns), with rows, attached as a new partition: its rows join the root
        with no row change in the WAL; then rows written into the partition itself.
        Published via the root, the table leaves the publication when attached (its rows
        published on their own before): the lake retires its own table."""
        table = self._partitioned(pick)
        assert table is not None and table.partitions is not None
        i = max(table.partitions.values()) + 1
        name = f"part{self._next()}"
        self.program.run(sql.SQL("CREATE TABLE {} (LIKE {})").format(
            _ident(name), _ident(table.name)))
        table.partitions[name] = i
        if rows:
            self.program.run(self._rows(table, rows, into=name))
        self.program.run(sql.SQL("ALTER TABLE {} ATTACH PARTITION {} FOR VALUES FROM ({}) TO ({})")
                         .format(_ident(table.name), _ident(name), i * 10, i * 10 + 10))
        if rows:
            self.program.run(self._rows(table, rows, into=name))

    @precondition(lambda self: any(t.partitions for t in self.tables.values()))
    @rule()
    def toggle_via_root(self) -> None:
        """``publish_via_partition_root`` changed with partitioned tables published: each
        root and its partitions change places in the publication (the root's rows published
        as its own, or its partitions' as theirs), with no row change in the WAL."""
        self.via_root = not self.via_root
        self.program.run("ALTER PUBLICATION pgcdc SET (publish_via_partition_root = "
                         f"{str(self.via_root).lower()})")

    @precondition(lambda self: any(t.partitions and len(t.partitions) > 1
                                   for t in self.tables.values()))
    @rule(pick=st.integers(0, 99), which=st.integers(0, 9),
          how=st.sampled_from(["detach", "drop", "truncate"]))
    def partition_leaves(self, pick: int, which: int, how: str) -> None:
        """A partition detached (a table of its own from then on, no longer the model's:
        the check still compares it), dropped, or truncated alone: its rows leave the root
        with no row change in the WAL under a publication via the root."""
        table = self._partitioned(pick)
        assert table is not None and table.partitions is not None
        if len(table.partitions) < 2:  # the root always has a partition to insert into
            return
        name = sorted(table.partitions)[which % len(table.partitions)]
        statement = {"detach": "ALTER TABLE {root} DETACH PARTITION {part}",
                     "drop": "DROP TABLE {part}", "truncate": "TRUNCATE {part}"}[how]
        self.program.run(sql.SQL(statement).format(root=_ident(table.name),
                                                   part=_ident(name)))
        if how != "truncate":
            del table.partitions[name]
        self.program.run(self._rows(table, 2))

    @precondition(lambda self: self.tables)
    @rule(pick=st.integers(0, 99))
    def truncate(self, pick: int) -> None:
        self.program.run(sql.SQL("TRUNCATE {}").format(_ident(self._pick(pick).name)))

    @precondition(lambda self: self.tables)
    @rule(pick=st.integers(0, 99), again=st.booleans(), keyed=st.booleans(),
          kinds=st.lists(st.sampled_from(sorted(TYPES)), max_size=2))
    def drop_table(self, pick: int, again: bool, keyed: bool, kinds: list[str]) -> None:
        """Dropped for good, or created again under its name (a new table)."""
        table = self._pick(pick)
        self.program.run(sql.SQL("DROP TABLE {}").format(_ident(table.name)))
        del self.tables[table.name]
        if again:
            self._create(table.name, keyed, kinds, rows=5)

    @precondition(lambda self: any(t.partitions is None for t in self.tables.values()))
    @rule(pick=st.integers(0, 99), drop=st.booleans())
    def rekey(self, pick: int, drop: bool) -> None:
        """A keyed table loses its key (``id`` becomes a keyless table's ``k``, REPLICA
        IDENTITY FULL, every row updated; or with ``drop``, ``id`` dropped and ``k`` added
        with a default); a keyless one gains one (an identity column ``id``: the table
        rewritten, ``k`` a column like the others)."""
        table = self._pick(pick)
        if table.partitions is not None:
            return
        name = _ident(table.name)
        if table.keyed:
            if "k" in table.columns:  # the name the key takes (a key gained before)
                aside = f"c{self._next()}"
                self.program.run(sql.SQL("ALTER TABLE {} RENAME COLUMN k TO {}").format(
                    name, _ident(aside)))
                table.columns[aside] = table.columns.pop("k")
            if drop:  # the key's column itself
                self.program.run(
                    sql.SQL("ALTER TABLE {} DROP COLUMN id").format(name),
                    sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(name),
                    sql.SQL("ALTER TABLE {} ADD COLUMN k int DEFAULT 1").format(name))
                table.keyed, table.pk = False, ""
                return
            self.program.run(
                sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(name, _ident(table.pk)),
                sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(name),
                sql.SQL("ALTER TABLE {} RENAME COLUMN id TO k").format(name),
                sql.SQL("UPDATE {} SET k = abs(k) % 3").format(name))
            table.keyed, table.pk = False, ""
            return
        table.pk = self._key_name()
        self.program.run(
            sql.SQL("ALTER TABLE {} ADD COLUMN id int GENERATED BY DEFAULT AS IDENTITY "
                    "CONSTRAINT {} PRIMARY KEY").format(name, _ident(table.pk)),
            sql.SQL("ALTER TABLE {} REPLICA IDENTITY DEFAULT").format(name))
        table.keyed = True
        table.columns["k"] = "int"

    @precondition(lambda self: self.tables)
    @rule(pick=st.integers(0, 99), count=st.integers(1, 5))
    def savepoint_rolled_back(self, pick: int, count: int) -> None:
        """DDL and rows in a savepoint rolled back, rows before and after it kept."""
        table = self._pick(pick)
        column = f"c{self._next()}"
        kept = self._rows(table, count)
        lost = self._rows(table, count)
        self.program.run(
            "BEGIN", kept, "SAVEPOINT s",
            sql.SQL("ALTER TABLE {} ADD COLUMN {} int DEFAULT 5").format(
                _ident(table.name), _ident(column)),
            lost, sql.SQL("UPDATE {} SET {} = 6").format(_ident(table.name), _ident(column)),
            "ROLLBACK TO SAVEPOINT s", self._rows(table, count), "COMMIT")

    @precondition(lambda self: self.tables)
    @rule(pick=st.integers(0, 99), count=st.integers(1, 5), commit=st.booleans(),
          ddl=st.booleans())
    def prepared(self, pick: int, count: int, commit: bool, ddl: bool) -> None:
        """A prepared transaction (rows, and a column added), committed or rolled back."""
        table = self._pick(pick)
        gid = f"g{self._next()}"
        column = f"c{self._next()}"
        statements: list[sql.Composable | str] = ["BEGIN", self._rows(table, count)]
        if ddl:
            statements.append(sql.SQL("ALTER TABLE {} ADD COLUMN {} text").format(
                _ident(table.name), _ident(column)))
            statements.append(sql.SQL("UPDATE {} SET {} = 'p'").format(
                _ident(table.name), _ident(column)))
        statements += [f"PREPARE TRANSACTION '{gid}'",
                       f"{'COMMIT' if commit else 'ROLLBACK'} PREPARED '{gid}'"]
        self.program.run(*statements)
        if commit and ddl:
            table.columns[column] = "text"

    @rule()
    def capture(self) -> None:
        self.program.capture()

    @rule()
    def apply(self) -> None:
        self.program.apply()

    def teardown(self) -> None:
        """Check the lake, unless a step failed: hypothesis tears down in a ``finally``, and
        the check's error would hide the step's (bench seed 55: a refused lake load resume
        reported as a lake table left empty)."""
        try:
            if sys.exc_info()[0] is None:
                self.program.check()
        finally:
            self.program.close()


def machine(rig: Rig) -> type[LakeModel]:
    """The state machine bound to ``rig``."""
    return type("BoundLakeModel", (LakeModel,), {"rig": rig})
