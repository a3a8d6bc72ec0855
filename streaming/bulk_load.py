"""The initial load straight into the lake: Spark tasks read the published tables under the
slot's exported snapshot and write Delta, without passing through Kafka.

``pgcdc snapshot --lake URI`` runs it; ``pgcdc run`` then streams from the slot's consistent
point and ``pgcdc spark`` applies only the changes after it.  Everything around the reading
is the initial load's (loads/initial_load.py, which :class:`LakeLoad` extends):
the slot created with an exported snapshot, the catalog history started at its consistent
point (as ``pgcdc run --initial-load`` starts it), the checks that no table changed between
the snapshot and the locks, the chunk plan (page ranges by ``ctid``) and the state file.
What differs:

1. the coordinator connection, which holds the snapshot, locks every table to load in
   ACCESS SHARE mode and exports the snapshot again (``pg_export_snapshot``); its
   transaction stays open until the last table is written, so each Spark task imports it
   on a connection of its own (``SET TRANSACTION SNAPSHOT``) whenever it runs;
2. per table, one Spark job (``readers`` tables at once, from threads of the driver): one
   task per chunk (:data:`LAKE_CHUNK_PAGES`) reads its page range.  On the JVM
   (streaming/jdbc_read.py: PostgreSQL's JDBC driver, each value typed as the lake holds it
   or as the number it is made of, landing as the stream's value) for a table of the types
   that module names, unless it cannot connect as libpq did; otherwise the
   task COPYs its page range in text, decodes each
   row with the stream's own decoders (chunk_reader.row_builder over a registry of the
   custom types read under the snapshot) and hands it on as the Avro sink would encode it
   (bool, int, long, float, double and bytes typed, every other value as
   :func:`sinks.envelope.text_of` writes it), in Arrow record batches (``mapInArrow``:
   columnar batches cross to the JVM whole, not row by row); the driver turns the rows
   into the typed events the stream's apply reads (streaming/decode.py ``table_events``:
   the typed values cast to their lake types, the others cast from their text as the
   stream casts JSON's and text-mode Avro's) and makes lake rows of them with the stream's
   own :func:`~streaming.apply.shape`, so a value loaded in bulk lands as the same Spark
   value as one streamed through Kafka;
3. the table is written in ONE Delta commit (an append), marked with the commit's
   ``userMetadata`` ``pgcdc load <slot> <consistent point> <oid>`` and Delta's idempotent
   write options; only after it the table's chunks are recorded done in the state file.

Positions: every loaded row carries the initial load's read position, ``commit_lsn`` the
consistent point minus one and the ordinal of (attempt, chunk, row)
(:func:`loads.load_state.ordinal`), so every streamed change sorts after it and
wins in the apply's guarded MERGE.  A keyless table (streaming/multiset.py) gets its rows
numbered by occurrence (1..c per content) and the table property ``pgcdc.loadedAt``; the
stream then counts only its changes.  The lake table is created as the stream creates it
(:func:`streaming.evolution.evolve`: its columns, the metadata columns, ``pgcdc.oid``).

Resume: a load cut short (killed, stopped, an error) continues table by table.  A table
whose commit exists (found by its ``userMetadata`` in the Delta history) is complete, even
if the state file did not record it yet; the others are read again, in full, under a new
snapshot (the exported one died with the load): for a table with a key that is exact, for
the reasons loads/initial_load.py gives (every streamed change sorts after every
read).  A keyless table needs more: a row inserted after the consistent point and visible to
the new snapshot would be counted by the read and again by the stream (no key folds the
two).  So a resumed load reads a keyless table at a cut of its own (:meth:`LakeLoad._cut`):
a transaction locks the table in SHARE mode (writers wait; none is in progress once it is
granted), then takes its snapshot and the WAL insert position ``L``, and exports the
snapshot to the table's tasks.  Every change of the table committed before ``L`` is in
that snapshot and every later one commits after ``L``, so the rows are written at position
``L - 1`` with the table's multiset watermark (``pgcdc.appliedThrough``) there: the apply
leaves out the stream's changes of the table committed before ``L`` (the read holds them)
and counts every later one.  The lock is held until the table's Delta commit (its writers
wait that long).  Keyless tables are loaded first, under the slot's own snapshot when the
load is not cut short.

The lake must not already hold rows for the tables loaded (:class:`LakeNotEmptyError`):
this is the first load of a lake; later ones go through ``pgcdc snapshot-table``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any

import psycopg
from psycopg import sql

from core import failpoints
from core.errors import TerminalError, TransientError
from core.wire import topic_name
from decoder.lsn import parse_lsn
from loads.chunk_reader import (
    ChunkTask,
    begin_in_snapshot,
    chunk_too_large,
    copy_query,
    lock_tables,
    row_builder,
)
from loads.initial_load import (
    ExportedSnapshot,
    InitialLoad,
    LoadConfig,
    lock_error,
    run_until_signalled,
)
from loads.load_progress import LoadProgress
from loads.load_state import MAX_CHUNK_ROWS, ChunkState, LoadState, ordinal
from loads.published import PublishedTable
from sinks.avro import field_name
from sinks.envelope import text_of
from sinks.null import NullSink
from snapshot_builder.catalog import TableVersion
from snapshot_builder.row_decoders import RowDecoderFactory
from streaming import jdbc_read, multiset, sql_text
from streaming.apply import META_COLUMNS, shape, table_path
from streaming.decode import from_text, row_image
from streaming.evolution import evolve, quote, set_properties, table_exists
from streaming.ownership import owner
from streaming.schema import COMMIT_LSN, ORDINAL, TEXT, TableSpec

log = logging.getLogger(__name__)

# the Avro sink's type per column (sinks/avro.py _PRIMITIVE) as Spark types; others: string
_AVRO_SPARK = {"bool": "boolean", "int2": "int", "int4": "int", "int8": "bigint",
               "oid": "bigint", "float4": "float", "float8": "double", "bytea": "binary"}
# the lake types such a read's values are cast to besides their own (int2 is read as int)
_WIDER = {"int": ("smallint",)}


class LakeLoadError(TransientError):
    """A Spark job of the load failed (a task's connection, a lock timeout, the lake)."""


class LakeNotEmptyError(TerminalError):
    """A lake table the load would write already holds rows it did not write."""


def marker(state: LoadState, oid: int) -> str:
    """The ``userMetadata`` of the Delta commit that loaded table ``oid``."""
    return f"pgcdc load {state.slot} {state.consistent_point:X} {oid}"


def spec_of(table: TableVersion, lsn: int, prefix: str = "pgcdc") -> TableSpec:
    """The table version as the stream's catalog record gives it (sinks/kafka.py
    publish_table: the version's dict, its LSN and its topic)."""
    return TableSpec(table, lsn, topic_name(prefix, table.schema, table.name))


@dataclass(frozen=True)
class _Setup:
    """What a Spark task needs to read its chunk (pickled to the executors)."""

    dsn: str
    options: str
    snapshot: str
    table: PublishedTable
    load_lsn: int
    attempt: int
    lock_timeout_ms: int = 0


# the ordinal of a watermark past every change committed at its LSN
_LAST_ORDINAL = 2**63 - 1


@dataclass(frozen=True)
class _Jvm:
    """How the load reads on the JVM (streaming/jdbc_read.py): the driver's source and the
    enum types of the tables' columns."""

    source: jdbc_read.JdbcSource
    enums: frozenset[int]


def _plain(kind: str) -> Callable[[Any], Any]:
    """A decoded value as the Avro sink writes it (sinks/avro.py's writers)."""
    if kind == "boolean":
        return bool
    if kind in ("int", "bigint"):
        return int
    if kind in ("float", "double"):
        return float
    if kind == "binary":
        return bytes
    return lambda value: value if type(value) is str else text_of(value)


def avro_row(table: TableVersion) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """A decoded row as the values of the Avro sink's ``Row`` record, in column order."""
    plain = [(c.name, _plain(_AVRO_SPARK.get(c.type_name, "string"))) for c in table.columns]

    def values(row: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(None if (v := row[name]) is None else convert(v) for name, convert in plain)

    return values


# the Arrow type of each of the Avro sink's Spark types (_AVRO_SPARK), by name
_ARROW = {"boolean": "bool_", "int": "int32", "bigint": "int64", "float": "float32",
          "double": "float64", "binary": "binary", "string": "string"}

# Spark's own settings for compiled expressions (streaming/session.py turns them off)
COMPILED = {"spark.sql.codegen.wholeStage": "true", "spark.sql.codegen.factoryMode": "FALLBACK"}

# Parquet's dictionary of a column chunk at most 64 KiB (Parquet's default: 1 MiB): a column of
# few values still gets one, and a column of many distinct values (a key, a timestamp, a
# text) gives it up after 64 KiB instead of hashing its first 1 MiB of values into it; the
# load writes a fifth faster, files as large (docs/benchmarks.md, "The lake load")
PARQUET = {"parquet.dictionary.page.size": str(64 * 1024)}

# pages per chunk of a lake load (128 MB with 8 kB blocks, Spark's own partition size): a
# chunk is a Spark task and a Parquet file, and a table is read again whole when a load
# resumes, so chunks are not the unit of resuming here.  Each task opens a connection,
# imports the snapshot and writes a file with its statistics; 16384 pages load 1.5 x faster
# than 1024 (docs/benchmarks.md, "The lake load")
LAKE_CHUNK_PAGES = 16384
# but a table gets as many chunks as Spark runs tasks at once, down to chunks of this many
# pages: a table of one chunk would be read by one core while the others wait for it
MIN_TASK_PAGES = 1024

# rows per Arrow batch a task hands to the JVM
ARROW_BATCH_ROWS = 8192


def arrow_batches(setup: _Setup, chunks: list[tuple[int, int, int | None]], names: list[str],
                  kinds: list[str], batches: Iterator[Any]) -> Iterator[Any]:
    """One Spark task (``mapInArrow``): the chunks whose numbers its input batches hold,
    read by :func:`read_chunk`, as Arrow record batches of :data:`ARROW_BATCH_ROWS` rows:
    the Avro sink's values in column order (``names``, of Spark types ``kinds``), then the
    row's ordinal.  Columnar batches cross to the JVM in one piece each, where rows
    pickled one by one cost most of the load."""
    import pyarrow as pa

    types = [getattr(pa, _ARROW[kind])() for kind in kinds] + [pa.int64()]
    names = [*names, "_ordinal"]
    for batch in batches:
        wanted = [chunks[i] for i in batch.column(0).to_pylist()]
        rows: list[tuple[Any, ...]] = []
        for row in read_chunk(setup, iter(wanted)):
            rows.append(row)
            if len(rows) == ARROW_BATCH_ROWS:
                yield _batch(pa, rows, types, names)
                rows = []
        if rows:
            yield _batch(pa, rows, types, names)


def _batch(pa: Any, rows: list[tuple[Any, ...]], types: list[Any], names: list[str]) -> Any:
    columns = zip(*rows, strict=True)
    return pa.RecordBatch.from_arrays(
        [pa.array(values, type=kind) for values, kind in zip(columns, types, strict=True)],
        names=names)


def read_chunk(setup: _Setup, chunks: Iterator[tuple[int, int, int | None]]
               ) -> Iterator[tuple[Any, ...]]:
    """The rows of a task's chunks, each as the Avro sink's values then the row's ordinal;
    on its own connection, inside the load's snapshot."""
    table = setup.table.table
    values = avro_row(table)
    with psycopg.connect(setup.dsn, autocommit=True, options=setup.options,
                         application_name="pgcdc lake load") as conn:
        begin_in_snapshot(conn, setup.snapshot)
        decode = row_builder(RowDecoderFactory(lambda: conn).decoder(table))
        for index, start, end in chunks:
            task = ChunkTask(setup.table, None, index, ChunkState(start, end), None)
            base = ordinal(setup.attempt, index, 0)
            rows = 0
            with conn.cursor() as cur, cur.copy(copy_query(task)) as copy:
                for raw in copy.rows():
                    if rows >= MAX_CHUNK_ROWS:
                        raise chunk_too_large(task)
                    yield (*values(decode(raw)), base + rows)
                    rows += 1


def envelopes(spark: Any, setup: _Setup, tasks: list[ChunkTask], spec: TableSpec,
              jvm: _Jvm | None = None) -> Any:
    """The chunks' rows as the stream's typed events (streaming/decode.py
    ``table_events``' shape): op ``r``, ``after`` the row (a value Spark reads typed cast
    to its lake type, any other from its text as the stream casts it), and ``source`` with
    the read's position.  Read on the JVM (``jvm``,
    streaming/jdbc_read.py) where every column of the table can be, else by Python tasks."""
    table = setup.table.table
    # every chunk in full: a table is written in one commit, so a chunk recorded done at an
    # earlier attempt (whose delta read ChunkTask.since would ask for) has its commit, and
    # a table read again has none (its lake table was removed since): nothing of it is kept
    chunks = [(t.index, t.chunk.start, t.chunk.end) for t in tasks]
    if jvm is not None and jdbc_read.readable(table, jvm.enums, setup.table.row_filter):
        log.info("reading %s with the JDBC driver", spec.qualified_name)
        rows, values = jdbc_read.chunk_rows(
            spark, jvm.source, spec=spec, row_filter=setup.table.row_filter,
            snapshot=setup.snapshot, lock_timeout_ms=setup.lock_timeout_ms, chunks=chunks,
            attempt=setup.attempt, enums=jvm.enums)
    else:  # one task per chunk: a range of chunk numbers, each partition reading its own
        log.info("reading %s in Python tasks", spec.qualified_name)
        rows, values = _python_rows(spark, setup, chunks, spec)
    return rows.selectExpr(
        "'r' AS op",
        f"named_struct('commit_lsn', CAST({setup.load_lsn} AS BIGINT), 'ordinal', _ordinal, "
        f"'table_oid', CAST({spec.oid} AS BIGINT), "
        f"'table_version', {sql_text.literal(spec.version)}, "
        f"'schema', {sql_text.literal(spec.schema)}, "
        f"'table', {sql_text.literal(spec.name)}) AS source",
        "CAST(array() AS ARRAY<STRING>) AS unchanged",
        f"{row_image(spec, values)} AS after").selectExpr(
        "op", "source", "unchanged", "CASE WHEN false THEN after END AS before", "after")


def _python_rows(spark: Any, setup: _Setup, chunks: list[tuple[int, int, int | None]],
                 spec: TableSpec) -> tuple[Any, dict[str, tuple[str, str]]]:
    """The chunks' rows read by Python tasks (:func:`arrow_batches`, one per chunk): the
    Avro sink's values in column order, then ``_ordinal``; and per column name the Spark
    SQL of its lake value and untyped text from them (a typed value cast, any other from
    its text as the stream casts it)."""
    from pyspark.sql.types import StructField, StructType, _parse_datatype_string

    table = setup.table.table
    fields = [field_name(c, i) for i, c in enumerate(table.columns)]
    kinds = [_AVRO_SPARK.get(c.type_name, "string") for c in table.columns]
    schema = StructType([StructField(f, _parse_datatype_string(k)) for f, k in
                         zip(fields, kinds, strict=True)]
                        + [StructField("_ordinal", _parse_datatype_string("bigint"), False)])
    rows = spark.range(0, len(chunks), 1, max(len(chunks), 1)).mapInArrow(
        partial(arrow_batches, setup, chunks, fields, kinds), schema)
    values = {}
    for column, name, kind in zip(spec.columns, fields, kinds, strict=True):
        if kind != "string" and column.spark_type in (kind, *_WIDER.get(kind, ())):
            values[column.name] = (f"CAST({quote(name)} AS {column.spark_type})",
                                   "CAST(NULL AS STRING)")
        else:
            text = f"base64({quote(name)})" if kind == "binary" else \
                f"CAST({quote(name)} AS STRING)"
            values[column.name] = from_text(column, text, stale=False)
    return rows, values


def lake_rows(events: Any, spec: TableSpec) -> Any:
    """The envelopes typed by the stream's :func:`~streaming.apply.shape`, as lake rows:
    the columns, the position and ``_pgcdc_text``; for a keyless table also the occurrence
    of each row among the rows of the same content (streaming/multiset.py)."""
    columns = [quote(c.name) for c in spec.columns]
    rows = shape(events, spec).select(*columns, COMMIT_LSN, ORDINAL, TEXT)
    if not multiset.keyless(spec):
        return rows
    content = columns + [f"{TEXT}[{sql_text.literal(c.name)}]" for c in spec.columns
                         if c.untyped("x") is not None]
    return rows.selectExpr(
        "*", f"CAST(row_number() OVER (PARTITION BY {', '.join(content)} ORDER BY {ORDINAL}) "
        f"AS BIGINT) AS {multiset.OCCURRENCE}")


class LakeLoad(InitialLoad):
    """The initial load (loads/initial_load.py) with Spark reading the chunks and
    writing Delta (module docstring)."""

    def __init__(self, config: LoadConfig, spark: Any, lake: str, *,
                 topic_prefix: str = "pgcdc") -> None:
        if config.workers:
            msg = "the lake load reads in Spark tasks: LoadConfig.workers must be 0"
            raise ValueError(msg)
        super().__init__(config, NullSink())
        # a few large plans: compiled expressions pay for themselves here (the stream's
        # session interprets them, for its many small per-table plans: streaming/session.py);
        # a session of its own, so the caller's keeps its settings
        self.spark = spark.newSession()
        for name, value in {**COMPILED, **PARQUET}.items():
            self.spark.conf.set(name, value)
        # the JVM's reads make timestamps without a zone from microseconds through UTC
        # (streaming/jdbc_read.py), as the stream does (streaming/session.py)
        self.spark.conf.set("spark.sql.session.timeZone", "UTC")
        self.lake = lake
        self.topic_prefix = topic_prefix
        self.tables_at_once = config.readers  # tables loaded at once (their tasks: Spark's)
        self._task_snapshot: str | None = None
        self._slot_snapshot = False  # the tasks read under the slot's exported snapshot
        self._jvm: _Jvm | None = None

    def _chunk_pages(self, pages: int, chunk_pages: int) -> int:
        """Chunks of at most ``chunk_pages``, at least as many as Spark's parallelism
        down to :data:`MIN_TASK_PAGES` pages (module docstring)."""
        parallelism = max(1, int(self.spark.sparkContext.defaultParallelism))
        return min(chunk_pages, max(MIN_TASK_PAGES, -(-pages // parallelism)))

    def _check_no_keyless(self, tables: list[PublishedTable], *, planned: bool) -> None:
        """A resumed lake load reads each keyless table at a cut of its own (:meth:`_cut`)."""

    def _start_readers(self, snapshot: ExportedSnapshot, tables: list[PublishedTable],
                       load_lsn: int, attempt: int, started: int) -> None:
        """The coordinator locks the tables and exports its snapshot for the Spark tasks:
        its transaction lasts until the last table is written."""
        names = [(t.table.schema, t.table.name) for t in tables]
        try:
            lock_tables(snapshot.coordinator, names)
        except (psycopg.errors.LockNotAvailable, psycopg.errors.UndefinedTable) as exc:
            raise lock_error(exc) from exc
        row = snapshot.coordinator.execute("SELECT pg_catalog.pg_export_snapshot()").fetchone()
        assert row is not None
        self._task_snapshot = str(row[0])
        self._slot_snapshot = snapshot.export is not None
        source, why = jdbc_read.jdbc_source(snapshot.coordinator)
        if source is not None:
            why = jdbc_read.probe(self.spark, source)
        if why:
            log.warning("the lake load reads every table in Python tasks (slower), not "
                        "with the JDBC driver: %s", why)
            self._jvm = None
        else:
            assert source is not None
            self._jvm = _Jvm(source, jdbc_read.enum_types(snapshot.coordinator,
                                                          [t.table for t in tables]))

    def _read(self, state: LoadState, snapshot: ExportedSnapshot, tasks: list[ChunkTask],
              stop: threading.Event, on_progress: Callable[[LoadProgress], None] | None) -> None:
        by_table: dict[int, list[ChunkTask]] = {}
        for task in tasks:
            by_table.setdefault(task.table.oid, []).append(task)
        specs = {oid: spec_of(t[0].table.table, state.load_lsn, self.topic_prefix)
                 for oid, t in by_table.items()}
        # keyless tables first: only the slot's own snapshot loads them exactly
        order = sorted(by_table, key=lambda oid: (not multiset.keyless(specs[oid]),
                                                  specs[oid].qualified_name))
        # a few tables at once: a small table's time is mostly the driver's (Delta's log,
        # planning), which overlaps another table's tasks; chunks recorded by this thread
        with ThreadPoolExecutor(self.tables_at_once, "pgcdc-lake-load") as pool:
            running: dict[Future[int], int] = {}
            pending = list(order)
            error: BaseException | None = None
            while pending or running:
                while pending and len(running) < self.tables_at_once and error is None \
                        and not stop.is_set():
                    oid = pending.pop(0)
                    running[pool.submit(self._load_table, state, by_table[oid],
                                        specs[oid])] = oid
                if not running:
                    break
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    oid = running.pop(future)
                    try:
                        rows = future.result()
                    except BaseException as exc:  # the others finish; the first is raised
                        error = error or exc
                        continue
                    table_tasks = by_table[oid]
                    for i, task in enumerate(table_tasks):
                        self._record_done(state, task, rows if i == len(table_tasks) - 1 else 0)
                    if on_progress is not None:
                        on_progress(self.progress)
            if error is not None:
                raise error

    def _load_table(self, state: LoadState, tasks: list[ChunkTask], spec: TableSpec) -> int:
        """Write one table's rows in one Delta commit (or find it written); its row count."""
        spark, path = self.spark, table_path(self.lake, spec)
        mark = marker(state, spec.oid)
        if table_exists(spark, path):
            written = _written(spark, path, mark)
            if written is not None:
                log.info("table %s was loaded into %s before the load was cut short",
                         spec.qualified_name, path)
                return written
            held = owner(spark, path)
            if (held is not None and held != spec.oid) or \
                    spark.read.format("delta").load(path).limit(1).count():
                msg = (f"the lake table {path} already holds rows (of table oid {held}), not "
                       f"written by this load of {spec.qualified_name}: the lake load writes "
                       "tables that do not exist yet; move it aside, or load through Kafka "
                       "(pgcdc run --initial-load)")
                raise LakeNotEmptyError(msg)
        # a keyless table of a resumed load: at a cut of its own, its lock held until written
        own_cut = multiset.keyless(spec) and not self._slot_snapshot
        with self._cut(spec) if own_cut else nullcontext() as cut:
            return self._write_table(state, tasks, spec, path, mark, cut)

    def _write_table(self, state: LoadState, tasks: list[ChunkTask], spec: TableSpec,
                     path: str, mark: str, cut: tuple[str, int] | None) -> int:
        """The rows of one table, read and written in one Delta commit (marked ``mark``):
        under the load's snapshot, or a keyless table's own ``cut`` (:meth:`_cut`)."""
        spark = self.spark
        assert self._task_snapshot is not None
        snapshot, load_lsn = self._task_snapshot, state.load_lsn
        keyless = multiset.keyless(spec)
        if keyless:
            properties = {}
            if cut is not None:
                snapshot, load_lsn = cut[0], cut[1] - 1
                properties[multiset.APPLIED_PROPERTY] = f"{load_lsn}/{_LAST_ORDINAL}"
            properties[multiset.LOADED_PROPERTY] = str(load_lsn)
            evolve(spark, path, spec, multiset.META_COLUMNS)
            set_properties(spark, path, properties)  # before the rows: a retry sets its own
        else:
            evolve(spark, path, spec, META_COLUMNS)
        # the load's session settings and lock timeout: a task that queues for its table
        # behind a DDL (which waits for the coordinator's lock) fails instead of waiting
        setup = _Setup(self.config.dsn, self._options(), snapshot, tasks[0].table,
                       load_lsn, state.attempt, int(self.config.lock_timeout * 1000))
        started = time.monotonic()
        self.progress.tables[spec.oid].started = started
        spark.sparkContext.setJobDescription(f"pgcdc lake load: {spec.qualified_name}")
        from py4j.protocol import Py4JJavaError
        from pyspark.errors.exceptions.captured import PythonException

        failpoints.hit("before_lake_write")
        try:
            rows = lake_rows(envelopes(spark, setup, tasks, spec, self._jvm), spec)
            rows.write.format("delta").mode("append").option("userMetadata", mark)\
                .option("txnAppId", mark).option("txnVersion", 0).save(path)
        except (Py4JJavaError, PythonException) as exc:  # a task failed
            # a JDBC task's error is the Java exception's first line; a Python task's, the
            # last line of its traceback (a lost connection, the snapshot gone with a crash)
            cause = [line for line in str(getattr(exc, "java_exception", exc)).splitlines()
                     if line.strip()]
            found = (cause[-1] if isinstance(exc, PythonException) else cause[0]).strip() \
                if cause else str(exc)
            msg = (f"loading {spec.qualified_name} into {path} failed: {found}; run the same "
                   "command again: the load resumes with the tables not loaded yet")
            raise LakeLoadError(msg) from exc
        finally:
            spark.sparkContext.setJobDescription(None)
        written = _written(spark, path, mark) or 0
        self.progress.tables[spec.oid].rows += written
        log.info("loaded %s into %s: %d rows in %.1f s", spec.qualified_name, path, written,
                 time.monotonic() - started)
        return written

    @contextmanager
    def _cut(self, spec: TableSpec) -> Iterator[tuple[str, int]]:
        """A keyless table's own cut (module docstring): the name of a snapshot taken under
        a SHARE lock on it and the WAL insert position then; the lock lasts the block."""
        conn = self._connect()
        try:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")  # LOCK takes no snapshot
            try:
                conn.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(
                    sql.Identifier(spec.schema, spec.name)))
            except (psycopg.errors.LockNotAvailable, psycopg.errors.UndefinedTable) as exc:
                raise lock_error(exc) from exc
            row = conn.execute("SELECT pg_catalog.pg_export_snapshot(), "
                               "pg_catalog.pg_current_wal_insert_lsn()::text").fetchone()
            assert row is not None
            log.info("reading the keyless table %s again under a SHARE lock, at %s",
                     spec.qualified_name, row[1])
            yield str(row[0]), parse_lsn(str(row[1]))
        finally:
            conn.close()


def _written(spark: Any, path: str, mark: str) -> int | None:
    """The rows the commit marked ``mark`` wrote, or None if the table has no such commit."""
    from delta.tables import DeltaTable

    found = DeltaTable.forPath(spark, path).history().where(
        f"userMetadata = {sql_text.literal(mark)}").select("operationMetrics").collect()
    if not found:
        return None
    return int((found[0]["operationMetrics"] or {}).get("numOutputRows", 0))


def load_lake(config: LoadConfig, lake: str, *, master: str | None = "local[2]",
              topic_prefix: str = "pgcdc", spark: Any = None) -> bool:
    """Load (or resume loading) the slot's tables into ``lake``; progress and a summary go
    to stderr; SIGINT or SIGTERM stop it between tables.  True when every table is loaded."""
    if spark is None:
        from streaming.session import build_session

        spark = build_session("pgcdc-lake-load", master=master)
    return run_until_signalled(LakeLoad(config, spark, lake, topic_prefix=topic_prefix))
