"""Debezium's source.snapshot marks of the initial load's reads (sinks/snapshot_marks.py):
every encoder, compiled or not, writes ``first``/``last``/``first_in_data_collection``/
``last_in_data_collection`` for a marked read, ``true`` for any other read and ``false``
for a change; who claims a first read (loads/read_marks.FirstClaims)."""

from __future__ import annotations

import io
import json
import threading
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from decoder.change import READ, ChangeEvent
from loads import read_marks
from loads.chunk_reader import ChunkTask, Halted
from loads.initial_load import InitialLoad, LoadConfig
from loads.load_state import LoadState
from loads.read_marks import FirstClaims, copy_fields
from sinks.avro import AvroEncoder, value_schema
from sinks.debezium_json import JsonOptions
from sinks.envelope import JsonEncoder
from sinks.snapshot_marks import (
    FirstInTable,
    FirstRead,
    IncrementalRead,
    LastInTable,
    LastRead,
    MarkedRead,
    mark,
    snapshot_of,
)
from tests.recording_sink import RecordingSink
from tests.unit.test_debezium_json import ROW, TABLE

READ_EVENT = ChangeEvent(READ, TABLE, None, ROW, (), 90, 90, 7, 0, 700_000_000)
CASES = [(READ_EVENT, "true"), (mark(READ_EVENT, FirstRead), "first"),
         (mark(READ_EVENT, LastRead), "last"), (mark(READ_EVENT, IncrementalRead), "incremental"),
         (mark(READ_EVENT, FirstInTable), "first_in_data_collection"),
         (mark(READ_EVENT, LastInTable), "last_in_data_collection"),
         (READ_EVENT._replace(op="c", xid=725), "false")]


def test_marks() -> None:
    for event, want in CASES:
        assert snapshot_of(event) == want
    marked = mark(mark(READ_EVENT, FirstRead), LastRead)
    assert type(marked) is LastRead and tuple(marked) == tuple(READ_EVENT)
    assert isinstance(marked, ChangeEvent) and isinstance(marked, MarkedRead)


@pytest.mark.parametrize("mode", ["debezium", "pgcdc"])
def test_json_source_snapshot(mode: str) -> None:
    encoder = JsonEncoder(JsonOptions(mode=mode, database="app"))  # type: ignore[arg-type]
    fast = encoder.encoder_for(TABLE, "s")  # compiled in Debezium's mode, when built
    for event, want in CASES:
        _, value = fast(event, 5)
        assert json.loads(value)["source"]["snapshot"] == want
        # the compiled path and the Python one agree, byte for byte
        assert value == encoder.value(event, server_name="s", now_ms=5)
    first, plain = fast(CASES[1][0], 5)[1], fast(READ_EVENT, 5)[1]
    assert first.replace(b'"snapshot":"first"', b'"snapshot":"true"') == plain


@pytest.mark.parametrize("compiled", [True, False])
def test_avro_source_snapshot(compiled: bool) -> None:
    encoder = AvroEncoder(compiled=compiled)
    schema = fastavro.parse_schema(value_schema(TABLE))
    for event, want in CASES:
        _, value = encoder.encode(event, server_name="s", now_ms=5)
        record: Any = fastavro.schemaless_reader(io.BytesIO(value), schema, None)
        assert record["source"]["snapshot"] == want


def test_read_frame_carries_the_mark() -> None:
    """The compiled load's frame (sinks/loadfast.py) for a marked row equals the encoder's."""
    encoder = AvroEncoder(compiled=False)
    first = encoder.read_frame(TABLE, "s", 90, 700_000_000, "first")
    true = encoder.read_frame(TABLE, "s", 90, 700_000_000)
    value = encoder.encode(mark(READ_EVENT, FirstRead), server_name="s", now_ms=5)[1]
    assert first[0] in value and true[0] not in value


@given(st.lists(st.one_of(st.none(), st.text()), min_size=1, max_size=5))
def test_copy_fields_reads_copy_text(fields: list[str | None]) -> None:
    """The worker's head row (read_marks.copy_fields) reads COPY's text as Copy.rows does."""
    line = ("\t".join("\\N" if f is None else f.replace("\\", "\\\\").replace("\t", "\\t")
                      .replace("\n", "\\n").replace("\r", "\\r").replace("\b", "\\b")
                      .replace("\f", "\\f").replace("\v", "\\v") for f in fields) + "\n")
    assert copy_fields(line.encode()) == fields


@pytest.mark.parametrize("shared", [True, False])
def test_first_claims(shared: bool) -> None:
    """The load's first goes to whoever writes first; every other table's first is
    ``first_in_data_collection``; a claimed first blocks the others until done, a released
    one is due again; a table whose rows were durable (not due) gets no mark."""
    claims = FirstClaims.create(threading.Lock(), True, (True, True, False), shared=shared)
    try:
        assert claims.try_claim(1) == "first"
        assert claims.try_claim(0) is None and claims.try_claim(1) is None  # until durable
        claims.release(1, "first")
        assert claims.try_claim(0) == "first"
        claims.done(0)
        assert claims.try_claim(0) == "" and claims.try_claim(2) == ""
        assert claims.try_claim(1) == "first_in_data_collection"
        assert claims.try_claim(1) is None and claims.try_claim(0) == ""  # only that table waits
        halt = threading.Event()
        halt.set()
        with pytest.raises(Halted):
            claims.claim(1, halt)
        claims.done(1)
        assert claims.claim(1, halt) == ""
    finally:
        claims.close(unlink=True)
    # a resumed load: the load's first durable, one table's not
    resumed = FirstClaims.create(threading.Lock(), False, (False, True), shared=False)
    assert resumed.try_claim(0) == "" and resumed.try_claim(1) == "first_in_data_collection"


def test_a_tables_sole_read() -> None:
    """Both a table's first and last: ``first`` wins over ``last_in_data_collection``, which
    wins over ``first_in_data_collection`` (Debezium's precedence)."""
    assert snapshot_of(read_marks.table_last(READ_EVENT, "first")) == "first"
    for claimed in ("first_in_data_collection", ""):
        assert snapshot_of(read_marks.table_last(READ_EVENT, claimed)) == \
            "last_in_data_collection"
    assert snapshot_of(read_marks.marked(READ_EVENT, "first_in_data_collection")) == \
        "first_in_data_collection"


class _Heads(InitialLoad):
    """The coordinating process's side of a load in worker processes (loads/initial_load.py:
    the heads workers hand over), with a recording sink and the state file left out."""

    def __init__(self, tables: int) -> None:
        super().__init__(LoadConfig("", Path("unused.json")), RecordingSink())
        self._claims = FirstClaims.create(threading.Lock(), True, (True,) * tables, shared=False)
        self._index = {oid: oid for oid in range(tables)}
        self.done: list[tuple[int, int]] = []

    def _record_done(self, state: LoadState, task: ChunkTask, rows: int) -> None:
        self.done.append((task.table.oid, task.index))

    def chunks(self, oid: int, count: int) -> list[ChunkTask]:
        self._left[oid] = count
        table = SimpleNamespace(oid=oid)
        return [SimpleNamespace(table=table, index=i) for i in range(count)]  # type: ignore[misc]

    def marks(self) -> list[tuple[int, int, str]]:
        """(table, head's chunk, mark) of each event written, in order."""
        assert isinstance(self.sink, RecordingSink)
        return [(e.table.oid, e.ordinal, snapshot_of(e)) for e in self.sink.events]


_STATE: Any = SimpleNamespace(load_lsn=90)  # all that making the sink durable reads


def _head(oid: int, chunk: int) -> ChangeEvent:
    return READ_EVENT._replace(table=replace(TABLE, oid=oid), ordinal=chunk)


def test_heads_are_marked_per_table() -> None:
    """Debezium's pattern per table from the heads alone: the load's first table first ...
    last_in_data_collection, the one that ends it first_in_data_collection ... last; a head
    waits while a worker writes its table's first; a chunk is done once its head is."""
    load, state = _Heads(2), _STATE
    x, y = load.chunks(0, 2), load.chunks(1, 2)
    load._chunk_done(state, x[0], 10, _head(0, 0))
    assert load._claims.try_claim(1) == "first"  # a worker writes y's first (the load's)
    load._chunk_done(state, y[0], 10, _head(1, 0))
    load._chunk_done(state, x[1], 10, _head(0, 1))  # x ends; its head 0 waits for the first
    assert load.marks() == [] and load.done == []
    load._claims.done(1)  # the worker's first is durable
    load._chunk_done(state, y[1], 10, _head(1, 1))  # y ends: x is written as a table's last
    assert load.marks() == [(0, 0, "first_in_data_collection"), (1, 0, "true"),
                            (0, 1, "last_in_data_collection")]
    assert sorted(load.done) == [(0, 0), (0, 1), (1, 0)]
    load._heads_end(state)
    assert load.marks()[-1] == (1, 1, "last") and sorted(load.done)[-1] == (1, 1)


def test_a_sole_read_ending_its_table_after_the_first() -> None:
    """A one-row table that ended before anything was written waits as the candidate; the
    next table's head takes the load's first, then the one-row table is written
    last_in_data_collection (not first: the first was written before it)."""
    load, state = _Heads(2), _STATE
    x, y = load.chunks(0, 1), load.chunks(1, 2)
    load._chunk_done(state, x[0], 1, _head(0, 0))
    load._chunk_done(state, y[0], 10, _head(1, 0))
    load._chunk_done(state, y[1], 10, _head(1, 1))
    assert load.marks() == [(1, 0, "first"), (0, 0, "last_in_data_collection")]
    load._heads_end(state)
    assert load.marks()[-1] == (1, 1, "last") and len(load.done) == 3
