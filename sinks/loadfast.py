"""The initial load's fast path: COPY rows straight to Kafka as read events.

A load worker (loads/load_worker.py) writing to a plain :class:`~sinks.kafka.
KafkaSink` in Avro or in JSON (either encoding) hands each COPY text line to
:mod:`sinks._loadfast` (compiled), which writes the read event's key and value, the same
bytes the sink's encoder (:class:`~sinks.avro.AvroEncoder`,
:class:`~sinks.envelope.JsonEncoder`) gives for the event the slow path builds
(tests/unit/test_loadfast.py, tests/unit/test_loadfast_json.py), and produces it
through a librdkafka producer of its own, configured like the sink's producer (same
partitioner, idempotent, ``acks=all``) with the same topic and headers, batching more
(``linger.ms`` at least 50, ``batch.num.messages`` at least 100,000).  Values the
compiled code does not write exactly go through each column's Python fallback: the
stream's decoder, then the Avro writer of sinks/avro.py, or the JSON encoder.

In JSON the envelope's constant texts are cut from the encoder's own output for a read
of the table whose columns are all null (at two ordinals and two processing times, to
find where those go), and the compiled plan checks itself against the encoder when it is
built; a fallback gives the value the encoder writes (the stream's decoder, the column's
converter), which the compiled code writes as the envelope's JSON does.  In pgcdc's own
JSON (``--json-mode pgcdc``) a value is written as the decoded value's JSON, whose text is
the one Avro's string columns hold: its columns are compiled where Avro's are (:func:`_kind`).

Durability is the sink's: :meth:`FastLoad.durable` flushes the producer and raises
:class:`~sinks.acks.DeliveryError` for any message that failed; the worker reports a chunk
done only after that.  Not used (the worker keeps the slow path) when the compiled module
is not built, ``PGCDC_PURE_PYTHON=1`` or ``PGCDC_LOAD_FAST=0``, the format is typed Avro
(``--avro-types logical``: the Python encoder only), the sink is transactional or writes
a transaction topic, or librdkafka's library cannot be found.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from decoder.change import READ, ChangeEvent, RowDecoder
from decoder.values import (
    BOOL,
    BYTEA,
    DATE,
    FLOAT4,
    FLOAT8,
    NUMERIC,
    TIME,
    TIMESTAMP,
    TIMESTAMPTZ,
    UUID,
)
from sinks import debezium_json as dj
from sinks.acks import DeliveryError
from sinks.avro import AvroEncoder, field_writer, text_avro_type
from sinks.envelope import JsonEncoder, text_of
from sinks.kafka import KafkaSink
from sinks.snapshot_marks import MARKS, mark
from snapshot_builder.catalog import Column, TableVersion

log = logging.getLogger(__name__)

try:
    from sinks import _loadfast
except ImportError:  # not built: the load takes the slow path
    _loadfast = None  # type: ignore[assignment]

_LOAD_BATCHING = {"linger.ms": 50, "batch.num.messages": 100_000}  # at least these, for a load
_INT_ARRAYS = {1005, 1007, 1016}  # _int2, _int4, _int8
_INTS = {21, 23}  # int2, int4 -> Avro int
_LONGS = {20, 26}  # int8, oid -> Avro long


def _kind(column: Column, decode: Callable[[str], Any] | None) -> int:
    """The compiled writer of a column (``_loadfast.FALLBACK``: its Python fallback)."""
    assert _loadfast is not None
    avro = text_avro_type(column)
    oid = column.type_oid
    if avro == "string":
        if decode is None:  # the row keeps COPY's text, which text_of leaves as it is
            return _loadfast.TEXT
        return {NUMERIC: _loadfast.NUMERIC, DATE: _loadfast.DATE, TIMESTAMP: _loadfast.TIMESTAMP,
                TIMESTAMPTZ: _loadfast.TIMESTAMP,
                **dict.fromkeys(_INT_ARRAYS, _loadfast.INT_ARRAY)}.get(oid, _loadfast.FALLBACK)
    compiled = {("boolean", 16): _loadfast.BOOLEAN, ("float", 700): _loadfast.FLOAT,
                ("double", 701): _loadfast.DOUBLE,
                **{("int", o): _loadfast.INT for o in _INTS},
                **{("long", o): _loadfast.LONG for o in _LONGS}}
    return compiled.get((avro, oid), _loadfast.FALLBACK)


def _fallback(column: Column, decode: Callable[[str], Any] | None) -> Callable[[str], bytes]:
    """A non-null COPY value (its text) as its Avro field, as the slow path writes it."""
    write = field_writer(text_avro_type(column))

    def field(text: str) -> bytes:
        out = bytearray()
        write(out, text if decode is None else decode(text))
        return bytes(out)

    return field


def compile_table(producer: Any, table: TableVersion, decoder: RowDecoder,
                  encoder: AvroEncoder, server_name: str, topic: str,
                  headers: list[tuple[str, str | bytes | None]], lsn: int,
                  commit_time: int, snapshot: str = "true") -> Any:
    """A table version's :class:`sinks._loadfast.Table`: its read events (``lsn`` the load's
    LSN, ``source.snapshot`` ``snapshot``) into ``topic`` with ``headers`` through
    ``producer``."""
    assert _loadfast is not None
    decoders = {column[0]: column[1] for column in decoder.columns}
    positions = {c.name: i for i, c in enumerate(table.columns)}
    middle, tail = encoder.read_frame(table, server_name, lsn, commit_time, snapshot)
    heads = encoder.heads(table)  # the schema ids of the Confluent wire format, if any
    return _loadfast.Table(
        producer, topic, [(k, v.encode() if isinstance(v, str) else v or b"") for k, v in headers],
        tuple(_kind(c, decoders[c.name]) for c in table.columns),
        tuple(_fallback(c, decoders[c.name]) for c in table.columns),
        tuple(positions[c.name] for c in table.key_columns), middle, tail,
        *(heads if any(heads) else ()))


def _json_kind(column: Column, decode: Callable[[str], Any] | None,
               options: dj.JsonOptions) -> tuple[int, int]:
    """The compiled JSON writer of a column and its argument (``_loadfast.JSON_FALLBACK``:
    its Python fallback): by the column's own type (a domain's values take the fallback)
    and what the encoder makes of its values (:func:`~sinks.debezium_json.fast_kind`,
    :func:`~sinks.debezium_json.column_converter`); in pgcdc's own JSON, where Avro's
    writer is compiled (:func:`_kind`: the same text, as a JSON string or number)."""
    assert _loadfast is not None
    lf = _loadfast
    if options.mode == "pgcdc":
        return {lf.TEXT: lf.JSON_STRING, lf.INT: lf.JSON_INTEGER, lf.LONG: lf.JSON_INTEGER,
                lf.BOOLEAN: lf.JSON_BOOLEAN, lf.FLOAT: lf.JSON_FLOAT_BARE,
                lf.DOUBLE: lf.JSON_FLOAT_BARE, lf.NUMERIC: lf.JSON_TEXT_NUMERIC,
                lf.DATE: lf.JSON_ISO_DATE, lf.TIMESTAMP: lf.JSON_ISO_TIMESTAMP,
                lf.INT_ARRAY: lf.JSON_INT_ARRAY}.get(_kind(column, decode), lf.JSON_FALLBACK), 0
    oid = column.type_oid
    convert = dj.column_converter(column, options)
    if convert is None:  # the decoded value as it is
        if decode is None:  # COPY's text, a string
            return lf.JSON_STRING, 0
        return {BOOL: lf.JSON_BOOLEAN, UUID: lf.JSON_UUID,
                **dict.fromkeys(_INTS | _LONGS, lf.JSON_INTEGER),
                **dict.fromkeys(_INT_ARRAYS, lf.JSON_INT_ARRAY)}.get(oid, lf.JSON_FALLBACK), 0
    if oid == NUMERIC and convert is dj.variable_scale:
        return lf.JSON_NUMERIC_VARIABLE, 0
    kind, argument = dj.fast_kind(column, options)
    compiled = {(NUMERIC, dj.K_NUMERIC): lf.JSON_NUMERIC, (TIMESTAMPTZ, dj.K_TSTZ): lf.JSON_TSTZ,
                (FLOAT4, dj.K_FLOAT): lf.JSON_FLOAT, (FLOAT8, dj.K_FLOAT): lf.JSON_FLOAT,
                (BYTEA, dj.K_BASE64): lf.JSON_BASE64, (DATE, dj.K_DATE_DAYS): lf.JSON_DATE_DAYS,
                (TIME, dj.K_TIME_MICROS): lf.JSON_TIME_MICROS,
                (TIME, dj.K_TIME_MILLIS): lf.JSON_TIME_MILLIS,
                (TIMESTAMP, dj.K_TS_MICROS): lf.JSON_TS_MICROS,
                (TIMESTAMP, dj.K_TS_MILLIS): lf.JSON_TS_MILLIS}.get((oid, kind))
    return (lf.JSON_FALLBACK, 0) if compiled is None else (compiled, argument)


def _json_text(value: Any) -> str:
    """A value's JSON as the envelope writes it (``text_of`` of a list is the list's JSON:
    the value's, in brackets)."""
    return text_of([value])[1:-1]


# the ordinals and processing times of the template reads the JSON plan is cut from
_ORDINALS = (7_364_019_283_746_501_928, 5_182_736_450_918_273_645)
_NOW_MS = (4_096_123_456_789, 3_141_592_653_589)


def compile_json_table(producer: Any, table: TableVersion, decoder: RowDecoder,
                       encoder: JsonEncoder, server_name: str, topic: str,
                       headers: list[tuple[str, str | bytes | None]], lsn: int,
                       commit_time: int, snapshot: str = "true") -> Any:
    """As :func:`compile_table`, for JSON: a :class:`sinks._loadfast.JsonTable` whose texts
    are cut from ``encoder``'s own (the module's docstring)."""
    assert _loadfast is not None
    encode = encoder.encoder_for(table, server_name)
    kind = MARKS.get(snapshot)

    def read(after: dict[str, Any], ordinal: int, now_ms: int) -> tuple[bytes, bytes]:
        event = ChangeEvent(READ, table, None, after, (), lsn, lsn, ordinal, 0, commit_time)
        return encode(event if kind is None else mark(event, kind), now_ms)

    names = [json.dumps(c.name, ensure_ascii=False).encode() for c in table.columns]
    prefixes = tuple((b"," if i else b"{") + name + b":" for i, name in enumerate(names))
    positions = {c.name: i for i, c in enumerate(table.columns)}
    keys = tuple(positions[c.name] for c in table.key_columns)
    nulls = b"".join(prefix + b"null" for prefix in prefixes) + b"}" if prefixes else b"{}"
    row: dict[str, Any] = dict.fromkeys(c.name for c in table.columns)  # every column null
    _, value = read(row, _ORDINALS[0], _NOW_MS[0])
    head = value[:value.index(nulls)]
    middle, _, rest = value[len(head) + len(nulls):].partition(str(_ORDINALS[0]).encode())
    pieces = tuple(rest.split(str(_NOW_MS[0]).encode()))

    def fallback(column: Column, decode: Callable[[str], Any] | None) -> Callable[[str], Any]:
        """The value the encoder writes for a column's text: the stream's decoder's, then
        the column's converter's in Debezium's encoding (sinks/debezium_json.py); the
        compiled code writes it as the envelope's JSON does (through _json_text if it is
        not a plain JSON value)."""
        convert = dj.column_converter(column, encoder.options) \
            if encoder.options.mode == "debezium" else None
        if convert is None:
            return (lambda text: text) if decode is None else decode

        def field(text: str) -> Any:
            value = text if decode is None else decode(text)
            return None if value is None else convert(value)
        return field

    decoders = {column[0]: column[1] for column in decoder.columns}
    kinds = [_json_kind(c, decoders[c.name], encoder.options) for c in table.columns]
    plan = _loadfast.JsonTable(
        producer, topic, [(k, v.encode() if isinstance(v, str) else v or b"") for k, v in headers],
        tuple(k for k, _ in kinds), tuple(a for _, a in kinds),
        tuple(fallback(c, decoders[c.name]) for c in table.columns),
        keys, prefixes, tuple((b"," if k else b"{") + names[i] + b":" for k, i in enumerate(keys)),
        head, middle, pieces, _json_text)
    # the plan's read of an all-null row is the encoder's, at other numbers too
    empty = "\t".join(["\\N"] * len(prefixes)).encode() + b"\n"
    for ordinal, now_ms in zip(_ORDINALS, _NOW_MS, strict=True):
        if plan.encode(empty, ordinal, now_ms) != read(row, ordinal, now_ms):
            msg = (f"the initial load's compiled JSON plan of {table.qualified_name} does not "
                   "write what the JSON encoder writes; run with PGCDC_LOAD_FAST=0 and report "
                   "it")
            raise RuntimeError(msg)
    return plan


def librdkafka_path() -> str | None:
    """The librdkafka confluent_kafka loaded (its wheel's copy), else the system's."""
    import ctypes.util

    import confluent_kafka

    package = Path(confluent_kafka.__file__).resolve().parent
    for folder in (package.parent / "confluent_kafka.libs", package / ".libs", package):
        found = sorted(folder.glob("librdkafka*.so*"))
        if found:
            return str(found[0])
    return ctypes.util.find_library("rdkafka")


@functools.cache
def libpq_path() -> str | None:
    """The libpq this process loaded (psycopg's), from /proc/self/maps; None if not found.
    Read once: a process keeps the library it loaded."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(None, 1)[-1]
                if "/libpq" in path and ".so" in path:
                    return path
    except OSError:
        return None
    return None


@contextmanager
def copy_lines(conn: psycopg.Connection[Any], query: sql.Composed) -> Iterator[Iterator[Any]]:
    """The lines of ``COPY ... TO STDOUT`` on ``conn``: from libpq itself (sinks/_loadfast.c's
    CopyOut) where its library is found, else through psycopg.  Leaving the block ends the
    COPY (the rows left are read and dropped).  A failed COPY is a psycopg.OperationalError
    with the server's or libpq's message, as through psycopg (transient: the load resumes)."""
    library = libpq_path() if _loadfast is not None else None
    if library is None:
        with conn.cursor() as cur, cur.copy(query) as copy:
            yield iter(copy)
        return
    assert _loadfast is not None
    pointer: int = getattr(conn.pgconn, "pgconn_ptr")  # noqa: B009 - not in the stubs
    try:
        lines = _loadfast.CopyOut(library, pointer, query.as_bytes(conn))
        try:
            yield lines
        finally:
            lines.close()
    except _loadfast.CopyError as exc:
        raise psycopg.OperationalError(str(exc)) from exc


def _config_text(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    return None  # a Python callback: not a librdkafka property


class FastLoad:
    """One worker's fast path into one Kafka sink: its producer and its table plans."""

    def __init__(self, sink: KafkaSink, library: str) -> None:
        assert _loadfast is not None
        self.sink = sink
        settings = sink.producer_config
        # larger batches: a chunk ends in flush(), which sends at once whatever the linger, so
        # only the CPU per message changes (librdkafka's and the broker's: docs/initial-load.md)
        for name, least in _LOAD_BATCHING.items():
            settings[name] = max(least, int(settings.get(name, least)))
        config = [(k, text) for k, v in settings.items()
                  if (text := _config_text(v)) is not None]
        # a delivery report for each failed message only: the successes are what flush()
        # waits for, and a report per message costs more than producing it
        config.append(("delivery.report.only.error", "true"))
        self.producer = _loadfast.Producer(library, config)
        self._plans: dict[tuple[int, str], tuple[RowDecoder, Any]] = {}

    @classmethod
    def for_sink(cls, sink: object) -> FastLoad | None:
        """The fast path for ``sink``, or None where the slow path must serve (module doc)."""
        if _loadfast is None or os.environ.get("PGCDC_PURE_PYTHON") == "1" \
                or os.environ.get("PGCDC_LOAD_FAST") == "0":
            return None
        if type(sink) is not KafkaSink or sink.transaction_topic is not None:
            return None
        encoder = sink.encoder
        if not (isinstance(encoder, JsonEncoder)
                or (isinstance(encoder, AvroEncoder) and encoder.logical is None)):
            return None
        library = librdkafka_path()
        if library is None:
            log.info("initial load: librdkafka's library not found; the slow path serves")
            return None
        return cls(sink, library)

    def plan(self, table: TableVersion, decoder: RowDecoder, lsn: int, commit_time: int,
             snapshot: str = "true") -> Any:
        """The compiled plan of a table version's rows (rebuilt when the decoder changed:
        a new catalog generation), their ``source.snapshot`` ``snapshot``
        (sinks/snapshot_marks.py).  The table version is published already."""
        cached = self._plans.get((table.oid, snapshot))
        if cached is not None and cached[0] is decoder:
            return cached[1]
        sink = self.sink
        topic, headers = sink.route(table)
        if isinstance(sink.encoder, JsonEncoder):
            plan = compile_json_table(self.producer, table, decoder, sink.encoder, sink.prefix,
                                      topic, headers, lsn, commit_time, snapshot)
        else:
            assert isinstance(sink.encoder, AvroEncoder)
            plan = compile_table(self.producer, table, decoder, sink.encoder, sink.prefix,
                                 topic, headers, lsn, commit_time, snapshot)
        self._plans[(table.oid, snapshot)] = (decoder, plan)
        return plan

    @staticmethod
    def rows(plan: Any, lines: Iterator[Any], limit: int, ordinal: int) -> int:
        """``plan.rows(...)`` (sinks/_loadfast.c): up to ``limit`` lines produced, their
        ordinals from ``ordinal``; Kafka's refusal is a DeliveryError, as in the sink."""
        assert _loadfast is not None
        try:
            taken: int = plan.rows(lines, limit, ordinal, int(time.time() * 1000))
        except _loadfast.ProduceError as exc:
            raise DeliveryError(str(exc)) from exc
        return taken

    def durable(self, timeout: float) -> bool:
        """Flush; True when every message produced is acknowledged.  Raises DeliveryError for
        a failed one."""
        assert _loadfast is not None
        try:
            left = self.producer.flush(int(timeout * 1000))
        except _loadfast.ProduceError as exc:
            raise DeliveryError(str(exc)) from exc
        return left == 0

    def close(self) -> None:
        self._plans.clear()
        self.producer.close()
